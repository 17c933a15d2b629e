"""Helpers built on the collectives: broadcasting variables and Python objects."""
from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from hvdlite.common import objects as _objects
from hvdlite.common.exceptions import HvdliteError
from hvdlite.tensorflow import mpi_ops as _mpi
from hvdlite.tensorflow.errors import _as_tf_error
from hvdlite.common import ops as _ops

_no_autograph = tf.autograph.experimental.do_not_convert  # our ops are not user code


@_no_autograph
def broadcast_variables(variables: Sequence[Any], root_rank: int,
                        process_set: Any = None, inplace: bool = False) -> Any:
    """Give every rank ``root_rank``'s values of ``variables`` (``tf.Variable`` or Keras
    variables, in the same order on every rank). All values travel in one batch.

    Eagerly the variables are assigned at once and ``None`` is returned; inside
    ``tf.function`` the assignments are ops of the graph (also returned, grouped).
    ``inplace`` is accepted for compatibility with Horovod.
    """
    variables = list(variables)
    if not variables:
        return None
    new = _mpi.broadcast_(variables, root_rank, name=None if tf.executing_eagerly() else "broadcast_variables",
                          process_set=process_set)
    if tf.executing_eagerly():
        return None
    return tf.group(*new)


def broadcast_global_variables(root_rank: int) -> Any:
    """Horovod's TensorFlow 1 call: while a TensorFlow 1 graph is being built (``with
    tf.Graph().as_default():``, run by ``tf.compat.v1.Session``), returns an op that
    assigns ``root_rank``'s values to every variable of the graph's global variables
    collection (one batch of broadcasts). Eagerly and inside ``tf.function`` TensorFlow 2
    keeps no such collection, so (as Horovod does under eager execution) this raises
    ``RuntimeError`` naming what to use instead: :func:`broadcast_variables` on the
    model's and the optimizer's variables, or, with Keras,
    ``hvd.callbacks.BroadcastGlobalVariablesCallback``."""
    graph = tf.compat.v1.get_default_graph()
    if not tf.executing_eagerly() and not getattr(graph, "building_function", False):
        variables = tf.compat.v1.global_variables()
        if not variables:
            return tf.no_op(name="broadcast_global_variables")
        return broadcast_variables(variables, root_rank)
    raise RuntimeError(
        f"hvd.broadcast_global_variables({root_rank!r}): TensorFlow 2 has no global variable "
        "collection to broadcast; call hvd.broadcast_variables(model.variables, root_rank) and "
        "hvd.broadcast_variables(optimizer.variables, root_rank) instead, or, with model.fit, "
        "use hvdlite.tensorflow.keras.callbacks.BroadcastGlobalVariablesCallback(root_rank)")


@_no_autograph
def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None,
                     name: str | None = None, process_set: Any = None) -> Any:
    """Return ``root_rank``'s ``obj`` on every rank (any picklable Python object;
    cloudpickle is used, so lambdas work; the root gets its own object back). Runs
    eagerly; call it outside ``tf.function``. ``session`` is accepted for compatibility."""
    try:
        with _ops.process_set_scope(process_set):
            return _objects.broadcast_object(obj, root_rank, name)
    except HvdliteError as exc:
        error = exc
    raise _as_tf_error(error)  # TensorFlow's error code, as the other collectives


@_no_autograph
def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: Any = None):
    """A function ``fn(obj)`` that broadcasts ``obj`` from ``root_rank`` (Horovod API)."""
    def fn(obj: Any) -> Any:
        return broadcast_object(obj, root_rank, session, name, process_set)
    return fn


@_no_autograph
def allgather_object(obj: Any, session: Any = None, name: str | None = None,
                     process_set: Any = None) -> list[Any]:
    """Return the list of every rank's ``obj`` in rank order (any picklable object).
    Runs eagerly; call it outside ``tf.function``."""
    try:
        with _ops.process_set_scope(process_set):
            return _objects.allgather_object(obj, name)
    except HvdliteError as exc:
        error = exc
    raise _as_tf_error(error)
