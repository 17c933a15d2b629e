"""Helpers built on the collectives: broadcasting variables and Python objects."""
from __future__ import annotations

import io
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from hvdlite.common import basics as _basics
from hvdlite.common import ops as _ops
from hvdlite.tensorflow import mpi_ops as _mpi
from hvdlite.tensorflow.mpi_ops import global_process_set

_no_autograph = tf.autograph.experimental.do_not_convert  # our ops are not user code

try:
    import cloudpickle as _pickle  # pickles lambdas and local classes too
except ImportError:  # pragma: no cover
    import pickle as _pickle  # type: ignore[no-redef]


@_no_autograph
def broadcast_variables(variables: Sequence[Any], root_rank: int,
                        process_set: Any = global_process_set, inplace: bool = False) -> Any:
    """Give every rank ``root_rank``'s values of ``variables`` (``tf.Variable`` or Keras
    variables, in the same order on every rank). All values travel in one batch.

    Eagerly the variables are assigned at once and ``None`` is returned; inside
    ``tf.function`` the assignments are ops of the graph (also returned, grouped).
    ``inplace`` is accepted for compatibility with Horovod.
    """
    _mpi.check_process_set(process_set)
    variables = list(variables)
    if not variables:
        return None
    new = _mpi.broadcast_(variables, root_rank, name=None if tf.executing_eagerly() else "broadcast_variables")
    if tf.executing_eagerly():
        return None
    return tf.group(*new)


def broadcast_global_variables(root_rank: int) -> None:
    """Horovod's TensorFlow 1 call. TensorFlow 2 keeps no collection of global variables
    to broadcast, so (as Horovod does under eager execution) this raises
    ``RuntimeError`` naming what to use instead: :func:`broadcast_variables` on the
    model's and the optimizer's variables, or, with Keras,
    ``hvd.callbacks.BroadcastGlobalVariablesCallback``."""
    raise RuntimeError(
        f"hvd.broadcast_global_variables({root_rank!r}): TensorFlow 2 has no global variable "
        "collection to broadcast; call hvd.broadcast_variables(model.variables, root_rank) and "
        "hvd.broadcast_variables(optimizer.variables, root_rank) instead, or, with model.fit, "
        "use hvdlite.tensorflow.keras.callbacks.BroadcastGlobalVariablesCallback(root_rank)")


def _broadcast_bytes(payload: bytes | None, root_rank: int, name: str) -> bytes:
    """Broadcast a byte string from root (two requests: the length, then the bytes)."""
    is_root = _basics.rank() == root_rank
    length = np.array([len(payload) if is_root and payload is not None else 0], np.int64)
    length = _mpi._execute([_mpi._Spec(_ops.BROADCAST, f"{name}.size", root=root_rank)], [length])[0]
    n = int(length[0])
    data = np.frombuffer(payload, np.uint8).copy() if is_root else np.zeros(n, np.uint8)
    if n == 0:
        return b""
    data = _mpi._execute([_mpi._Spec(_ops.BROADCAST, f"{name}.data", root=root_rank)], [data])[0]
    return data.tobytes()


@_no_autograph
def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None,
                     name: str | None = None, process_set: Any = global_process_set) -> Any:
    """Return ``root_rank``'s ``obj`` on every rank (any picklable Python object;
    cloudpickle is used, so lambdas work). Runs eagerly; call it outside ``tf.function``."""
    _mpi.check_process_set(process_set)
    name = name or _ops.auto_name("broadcast_object")
    payload = None
    if _basics.rank() == root_rank:
        buf = io.BytesIO()
        _pickle.dump(obj, buf)
        payload = buf.getvalue()
    data = _broadcast_bytes(payload, int(root_rank), name)
    if _basics.rank() == root_rank:
        return obj
    return _pickle.loads(data)


@_no_autograph
def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: Any = global_process_set):
    """A function ``fn(obj)`` that broadcasts ``obj`` from ``root_rank`` (Horovod API)."""
    def fn(obj: Any) -> Any:
        return broadcast_object(obj, root_rank, session, name, process_set)
    return fn


@_no_autograph
def allgather_object(obj: Any, session: Any = None, name: str | None = None,
                     process_set: Any = global_process_set) -> list[Any]:
    """Return the list of every rank's ``obj`` in rank order (any picklable object).
    Runs eagerly; call it outside ``tf.function``."""
    _mpi.check_process_set(process_set)
    name = name or _ops.auto_name("allgather_object")
    payload = np.frombuffer(_pickle.dumps(obj), np.uint8).copy()
    sizes = _mpi._execute([_mpi._Spec(_ops.ALLGATHER, f"{name}.sizes")],
                          [np.array([payload.size], np.int64)])[0]
    data = _mpi._execute([_mpi._Spec(_ops.ALLGATHER, f"{name}.data")], [payload])[0]
    out = []
    offset = 0
    for n in sizes.tolist():
        out.append(_pickle.loads(data[offset:offset + n].tobytes()))
        offset += n
    return out
