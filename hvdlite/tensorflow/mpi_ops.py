"""Collectives on TensorFlow tensors: eagerly, inside ``tf.function`` (and Keras
``model.fit``), and in TensorFlow 1 graphs run by ``tf.compat.v1.Session``.

Eagerly a collective reaches the engine from Python: the tensor's host memory is handed
to the engine directly (no copy), and results land in buffers that TensorFlow takes over
without a copy (DLPack).

Inside a graph a collective is an op of hvdlite's own, ``HvdliteCollectives``, from a
small library that is compiled against the installed TensorFlow the first time a
process needs it and then cached (:mod:`hvdlite.tensorflow._kernels`; installing hvdlite
compiles nothing against TensorFlow). The op is asynchronous: it submits its requests
to the engine and returns, and it completes from a callback once the engine has
finished them, without ever blocking one of TensorFlow's threads. That matters because
TensorFlow runs independent ops in whatever order its executor picks, differently on
each rank: a graph of 20 independent allreduces run by a ``Session`` with one inter-op
thread used to deadlock at once on 2 ranks when each collective blocked its thread (each
rank waited in a different one). Now all of them are in flight together and the engine
matches them by name. Several collectives of one call (a grouped allreduce, the two
allgathers of an ``IndexedSlices``) share one op, so the engine sees them together and
fuses them. Allreduce results are written straight into the op's output (in place when
TensorFlow lets the input go); allgather, alltoall and reducescatter results, whose size
is known only after negotiation, are copied once into the output. The op fails with
TensorFlow's error codes, as Horovod's ops do (see :class:`_TFError`, :func:`_tf_code`).

``DistributedGradientTape`` and the Keras ``DistributedOptimizer`` can go one step
further inside graphs: gradients are submitted in buckets (``HVDLITE_TF_BUCKET_BYTES``; 0 =
one bucket), last layer first, each by a small ``HvdliteSubmit`` op that returns a ticket
at once, and a single asynchronous ``HvdliteWait`` op at the end collects all of them.
``hvdlite.tensorflow.overlap`` adds control edges that make TensorFlow run each submit as
soon as its bucket's gradients exist, before the rest of the backward pass, so that
communication overlaps it; by default only where a rank has a core to spare for
communication and TensorFlow several inter-op threads, elsewhere the whole step's
gradients go out in one batch after the backward pass (see ``gradients.bucket_bytes`` and
``overlap.enabled``).

Where the library cannot be built (no C++ compiler, no TensorFlow headers) or
``HVDLITE_TF_KERNEL=0`` is set, graphs fall back to the earlier design, with one warning:
the same Python code runs inside a blocking ``tf.py_function`` op. That works in
``tf.function`` (collectives run in program order there), but a ``Session`` graph with
several independent collectives can deadlock, and a failed collective arrives as
``tf.errors.UnknownError``.

Limits that follow from this design:

* XLA cannot compile hvdlite's ops (nor ``py_function``): do not use ``jit_compile=True`` on
  a function (or a Keras ``model.compile``) that contains hvdlite collectives. Keras 3's
  default ``jit_compile="auto"`` picks no XLA on CPU-only machines, and hvdlite makes it
  pick no XLA on GPU machines too when the optimizer is a ``DistributedOptimizer``.
* A graph containing hvdlite collectives can not be exported with ``tf.saved_model``
  for serving on a machine without hvdlite (its ops live in hvdlite's library); save
  the Keras model or its weights instead.
* Collectives inside one ``tf.function`` run in program order (they are stateful ops),
  so every rank must issue them in the same order, as with Horovod. Each is submitted
  when the one before it has completed; collectives that should travel together belong
  in one call (``grouped_allreduce``, ``grouped_allgather``, ...). In a ``Session`` graph
  no order is imposed, and none is needed.
* Tensors travel through host memory. hvdlite's ops have CPU kernels only: TensorFlow 2
  places them there by itself (soft placement), a TF1 ``Session`` that puts them on a
  GPU with ``tf.device`` needs ``ConfigProto(allow_soft_placement=True)``.
* A failed collective raises ``tf.errors.FailedPreconditionError`` (ranks disagreed, or
  another rank refused its input), ``InvalidArgumentError`` or ``UnimplementedError`` on
  the rank that refused its own input as a bad value or as something hvdlite lacks, and
  ``UnknownError`` once the engine has stopped; eagerly these are also
  :class:`HvdliteError` (and the TypeError, ValueError or NotImplementedError Horovod
  raises for such input), inside graphs they are TensorFlow's own classes. The message
  names the tensor and the ranks.
* Input that only this rank cannot use (a dtype that cannot be reduced, a 0-d tensor to
  gather, an op Horovod refuses, alltoall splits that do not fit) is refused on every
  rank, not raised here alone: the other ranks run the same batch and would wait for it
  (see :func:`_submit`, and ``RuntimeProblem`` in the graph op).
"""
from __future__ import annotations

import itertools
import re
import struct
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from hvdlite.common import basics as _basics
from hvdlite.common import codes as _codes
from hvdlite.common import ops as _ops
from hvdlite.common.codes import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 - Horovod's constants
from hvdlite.common.handles import Handle
from hvdlite.common import process_set_table as _process_set_table
from hvdlite.common.process_sets import global_process_set, resolve as _resolve_process_set  # noqa: F401 - re-exported
from hvdlite.common.exceptions import (HvdliteError, HvdliteNotImplementedError, HvdliteValueError,
                                       refusal_error_for)
from hvdlite.tensorflow.compression import Compression, Compressor

_no_autograph = tf.autograph.experimental.do_not_convert  # our ops are not user code

# NumPy's bfloat16 (from ml_dtypes, which TensorFlow ships), as results carry it.
_BF16 = _codes.NP_DTYPE_OF_NAME.get("bfloat16")


# ----------------------------------------------------------------------------
# Errors: TensorFlow's error codes, as Horovod's TF ops report them.
# ----------------------------------------------------------------------------

class _TFError:
    """An :class:`HvdliteError` that is also a ``tf.errors.OpError``.

    Horovod's TensorFlow ops fail with TensorFlow's errors: a collective whose ranks
    disagree with ``FailedPreconditionError``, one that meets a stopped engine with
    ``UnknownError``, input its own checks refuse (alltoall splits that do not fit) with
    ``InvalidArgumentError``. hvdlite's TF front end raises the same codes (see
    :func:`_tf_code`), so scripts written for Horovod catch what they expect, and
    ``except hvd.HvdliteError`` still works eagerly. Inside a graph hvdlite's ops (see
    :mod:`hvdlite.tensorflow._kernels`) fail with the same codes, but as TensorFlow's
    own error classes, which are not HvdliteErrors. Only the ``py_function`` fallback
    cannot choose the code: TensorFlow turns its Python exceptions into
    ``UnknownError`` (``InvalidArgumentError`` for a TypeError or ValueError,
    ``UnimplementedError`` for a NotImplementedError)."""

    _code: int  # TensorFlow's error code
    # Raised while AutoGraph traces a function (an op refused when the graph is built),
    # the error would be rebuilt by AutoGraph, which cannot rebuild this class and makes
    # it a StagingError: this attribute tells AutoGraph to let it through unchanged.
    ag_pass_through = True

    def __init__(self, message: str) -> None:
        tf.errors.OpError.__init__(self, None, None, message, self._code)
        self.args = (message,)

    def __reduce__(self):
        return type(self), (self.message,)


class HvdliteFailedPreconditionError(_TFError, HvdliteError, tf.errors.FailedPreconditionError):
    """A collective failed and hvdlite stays usable (ranks disagreed, input refused)."""
    _code = tf.errors.FAILED_PRECONDITION


class HvdliteUnknownError(_TFError, HvdliteError, tf.errors.UnknownError):
    """A collective failed because the engine stopped (shut down, a peer failed)."""
    _code = tf.errors.UNKNOWN


class HvdliteInvalidArgumentError(_TFError, HvdliteError, tf.errors.InvalidArgumentError):
    """This rank refused its own input as a bad value or type (alltoall splits that do
    not fit, splits that are not integers, ...); the other ranks' collective failed
    with :class:`HvdliteFailedPreconditionError`."""
    _code = tf.errors.INVALID_ARGUMENT


class HvdliteUnimplementedError(_TFError, HvdliteError, tf.errors.UnimplementedError):
    """This rank asked for something hvdlite does not implement (Adasum, a reducescatter
    with Max, ...); the other ranks' collective failed with
    :class:`HvdliteFailedPreconditionError`."""
    _code = tf.errors.UNIMPLEMENTED


_PYTHON_TYPES = (NotImplementedError, TypeError, ValueError)
_tf_error_classes: dict[tuple[type, type], type] = {}
_tf_error_classes_lock = threading.Lock()


def _tf_error_class(code_class: type, python_type: type | None) -> type:
    """`code_class` (one of the two above), also a subclass of `python_type`: a
    collective refused because of input Horovod answers with a TypeError, ValueError or
    NotImplementedError stays catchable as that type. Each class is made once, and
    kept in this module under its name so that its errors can be pickled."""
    if python_type is None:
        return code_class
    with _tf_error_classes_lock:
        cls = _tf_error_classes.get((code_class, python_type))
        if cls is None:
            name = f"{code_class.__name__}_{python_type.__name__}"
            cls = type(name, (code_class, python_type), {
                "__module__": __name__,
                "__doc__": f"A {code_class.__name__} that is also a {python_type.__name__}."})
            globals()[name] = cls
            _tf_error_classes[(code_class, python_type)] = cls
    return cls


def _tf_code(error: type[BaseException] | None) -> int:
    """TensorFlow's error code for a collective this rank refused with `error` (an
    :class:`HvdliteError` class) while the engine runs: ``INVALID_ARGUMENT`` for a
    ValueError or TypeError (a bad value, as Horovod's checks of alltoall's splits
    report), ``UNIMPLEMENTED`` for a NotImplementedError, else ``FAILED_PRECONDITION``,
    the code of every collective whose ranks disagreed. The same rule serves eagerly
    (:func:`_as_tf_error`) and in graphs (the codes handed to hvdlite's ops)."""
    if error is not None and issubclass(error, (ValueError, TypeError)):
        return tf.errors.INVALID_ARGUMENT
    if error is not None and issubclass(error, NotImplementedError):
        return tf.errors.UNIMPLEMENTED
    return tf.errors.FAILED_PRECONDITION


_CLASS_OF_CODE = {tf.errors.INVALID_ARGUMENT: HvdliteInvalidArgumentError,
                  tf.errors.UNIMPLEMENTED: HvdliteUnimplementedError,
                  tf.errors.FAILED_PRECONDITION: HvdliteFailedPreconditionError}


def _as_tf_error(exc: BaseException) -> BaseException:
    """`exc` with TensorFlow's error code when it is a failed collective. The engine
    marks itself stopped before it fails what it still holds, so a stopped engine
    means the failure was the stop."""
    if not isinstance(exc, HvdliteError) or isinstance(exc, tf.errors.OpError):
        return exc
    python_type = next((t for t in _PYTHON_TYPES if isinstance(exc, t)), None)
    if _basics.is_initialized():
        cls = _CLASS_OF_CODE[_tf_code(python_type)]
    else:
        cls = HvdliteUnknownError
    cls = _tf_error_class(cls, python_type)
    converted = cls(str(exc))
    converted.__cause__ = exc.__cause__
    converted.__traceback__ = exc.__traceback__
    return converted


# ----------------------------------------------------------------------------
# NumPy level: submit a batch of requests, then wait for all of them.
# ----------------------------------------------------------------------------

_REDUCIBLE = frozenset(_ops.DTYPES)
_ALIGN = 64


def _aligned_empty(shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary
    (so TensorFlow can take it over without a copy)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    off = (-raw.ctypes.data) % _ALIGN
    return raw[off:off + nbytes].view(dtype).reshape(tuple(shape))


@dataclass
class _Spec:
    """One request of a batch. ``group`` is an index local to the batch: members with the
    same index >= 0 form one grouped allreduce. ``problem``: why this rank cannot make
    the request, found where it was described (in a graph, when it was traced); it is
    refused on every rank when it runs, raising ``error``."""
    kind: int
    name: str
    op: int = Sum
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = -1
    group: int = -1
    problem: str | None = None
    error: type[HvdliteError] = HvdliteError


def _raw(arr: np.ndarray, dtype_name: str) -> _ops.RawTensor:
    return _ops.RawTensor(_basics._load_core().address(arr), dtype_name, arr.shape)


def _dtype_name(arr: np.ndarray) -> str:
    """The engine's name of ``arr``'s dtype, else NumPy's (a dict lookup in the usual case)."""
    return _ops.NAME_OF_NP_DTYPE.get(arr.dtype) or arr.dtype.name


def _rows_as_bytes(arr: np.ndarray) -> np.ndarray:
    """View an array of a type the engine does not know as uint8 rows (dim 0 kept)."""
    if arr.ndim == 0:
        return arr.reshape(1).view(np.uint8)
    # The row width from the shape: an array with no rows keeps the others' width.
    return arr.reshape(arr.shape[0], int(np.prod(arr.shape[1:], dtype=np.int64))).view(np.uint8)


def _problem(spec: _Spec, arr: np.ndarray | None,
             splits: np.ndarray | None = None) -> tuple[str, type[HvdliteError]] | None:
    """Why this rank cannot make request `spec` on `arr` (with alltoall's `splits`), and
    the error to raise; None if it can. Only this rank may see the problem (its own
    tensor), so it is refused on every rank, not raised. hvdlite's graph ops make the
    same checks (``RuntimeProblem`` in ``kernels/hvdlite_tf_ops.cc``)."""
    if spec.problem is not None:
        return spec.problem, spec.error
    kind = spec.kind
    if kind in (_ops.BARRIER, _ops.JOIN):
        return None
    assert arr is not None
    if kind in (_ops.ALLREDUCE, _ops.REDUCESCATTER):
        dname = _dtype_name(arr)
        if dname not in _REDUCIBLE:
            return (f"dtype {dname} cannot be reduced; supported: {', '.join(_ops.DTYPES)}",
                    HvdliteError)
        why = _ops.op_problem(spec.op)
        if why is not None:
            return why
    if kind in (_ops.REDUCESCATTER, _ops.ALLGATHER, _ops.ALLTOALL) and arr.ndim == 0:
        return "needs a tensor of rank >= 1", HvdliteError
    if kind == _ops.ALLTOALL:
        return _alltoall_splits_problem(arr.shape[0], splits)
    return None


def _alltoall_splits_problem(rows: int, splits: np.ndarray | None
                             ) -> tuple[str, type[HvdliteError]] | None:
    """Whether alltoall's `splits` (None or empty: an even split) fit a first dimension
    of `rows`: Horovod checks this on each rank and raises InvalidArgumentError
    (a ValueError here, see :func:`_tf_code`)."""
    world = _ops.current_size()
    if splits is None or np.size(splits) == 0:
        if rows % world:
            return (f"first dimension {rows} does not divide evenly among {world} ranks; "
                    "pass splits", HvdliteValueError)
        return None
    values = [int(v) for v in np.asarray(splits).reshape(-1)]
    if len(values) != world or min(values) < 0 or sum(values) != rows:
        return (f"splits [{', '.join(map(str, values))}] must be {world} non-negative counts "
                f"summing to the first dimension {rows}", HvdliteValueError)
    return None


def _submit(specs: Sequence[_Spec], arrays: Sequence[np.ndarray | None],
            splits: Sequence[np.ndarray | None] | None = None) -> Handle:
    """Hand every request to the engine without waiting. The handle's result is the
    list of the requests' results (see :func:`_finish`).

    A request this rank cannot make (:func:`_problem`) is refused on every rank, and so
    is every other member of its group: the other ranks submit the whole batch and
    would wait for it. Its error is raised by :func:`_finish`, after the rest of the
    batch has completed; a failure to submit is kept and raised the same way."""
    _basics.core()  # raises NotInitializedError early
    group_members: dict[int, int] = {}
    position: list[int] = []  # of each request in its group
    for s in specs:
        position.append(group_members.get(s.group, 0))
        if s.group >= 0:
            group_members[s.group] = group_members.get(s.group, 0) + 1
    group_ids = {g: _ops.new_group_id() for g in sorted(group_members)}
    # Every problem is found before anything is submitted: one member's refuses its group.
    problems = [_problem(spec, arrays[i], None if splits is None else splits[i])
                for i, spec in enumerate(specs)]
    failed_groups: dict[int, tuple[str, type[HvdliteError]]] = {}
    for i, (spec, problem) in enumerate(zip(specs, problems)):
        if problem is not None and spec.group >= 0 and spec.group not in failed_groups:
            failed_groups[spec.group] = (f"member {position[i]} of its group: {problem[0]}",
                                         problem[1])
    parts: list[_ops.Request] = []
    finishers: list[Callable[[_ops.Request], Any]] = []
    error: BaseException | None = None
    try:
        for i, spec in enumerate(specs):
            problem = problems[i] or failed_groups.get(spec.group)
            if problem is not None:
                gid = group_ids.get(spec.group, -1)
                parts.append(_ops.refusal(spec.kind, spec.name, problem[0], gid,
                                          group_members[spec.group] if gid >= 0 else 0, problem[1]))
                finishers.append(_never_finished)
                continue
            arr = arrays[i]
            if arr is not None and not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr)  # a 0-d array is always contiguous
            try:
                request, finish = _submit_one(spec, arr, None if splits is None else splits[i],
                                              group_ids, group_members)
            except (ValueError, TypeError) as exc:
                if isinstance(exc, HvdliteError):
                    raise  # refused on every rank already
                # A local problem _problem did not foresee: the other ranks have submitted
                # this request, so it is refused on every rank rather than raised here.
                gid = group_ids.get(spec.group, -1)
                parts.append(_ops.refusal(spec.kind, spec.name, str(exc) or type(exc).__name__, gid,
                                          group_members[spec.group] if gid >= 0 else 0, refusal_error_for(exc)))
                finishers.append(_never_finished)
                continue
            parts.append(request)
            finishers.append(finish)
    except BaseException as exc:
        error = exc
    return Handle(parts, lambda done: [f(r) for r, f in zip(done, finishers)],
                  specs[0].name if specs else "batch", error)


def _never_finished(request: _ops.Request) -> Any:
    raise AssertionError("a refused request has no result")  # its wait() raised


def _finish(handle: Handle) -> list[Any]:
    """Wait for every request of a :func:`_submit`; return one result per request:
    an ndarray, ``(ndarray, received_splits)`` for alltoall, the last rank for join,
    ``None`` for barrier. Raises the first failure (with TensorFlow's error code) after
    every request has finished."""
    try:
        return handle.wait()
    except BaseException as exc:  # noqa: BLE001 - raised below with TensorFlow's code
        error = exc
    raise _as_tf_error(error)


@_ops.blocking
def _execute(specs: Sequence[_Spec], arrays: Sequence[np.ndarray | None],
             splits: Sequence[np.ndarray | None] | None = None) -> list[Any]:
    """Submit every request, then wait for all of them (see :func:`_finish`)."""
    return _finish(_submit(specs, arrays, splits))


# Allreduce results are written into buffers that are reused from step to step (a fresh
# 40 MB buffer costs ~10k page faults). A buffer is reused only when nothing but the
# pool refers to it any more: a TensorFlow tensor made from it through DLPack holds a
# reference until the tensor is freed.
# Only requests with stable names (named ones, graph ones, gradients) are pooled; the
# generated names of unnamed eager calls never repeat.
_out_pool: dict[str, np.ndarray] = {}
_out_pool_bytes = 0
_out_pool_lock = threading.Lock()
_POOL_MAX_BYTES = 1 << 31


def _output_buffer(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    global _out_pool_bytes
    if ".noname." in name:
        return _aligned_empty(shape, dtype)
    with _out_pool_lock:
        buf = _out_pool.get(name)
        # references: the pool's, `buf`, and getrefcount's argument
        if (buf is not None and buf.shape == shape and buf.dtype == dtype
                and sys.getrefcount(buf) <= 3):
            return buf
        if buf is not None:
            _out_pool_bytes -= buf.nbytes
        buf = _aligned_empty(shape, dtype)
        if _out_pool_bytes + buf.nbytes > _POOL_MAX_BYTES:
            _out_pool.clear()
            _out_pool_bytes = 0
        _out_pool[name] = buf
        _out_pool_bytes += buf.nbytes
        return buf


def _submit_one(spec: _Spec, arr: np.ndarray | None, splits: np.ndarray | None,
                group_ids: dict[int, int], group_members: dict[int, int]):
    """Submit one request that :func:`_problem` found nothing wrong with."""
    kind = spec.kind
    if kind in (_ops.BARRIER, _ops.JOIN):
        h = _ops.submit(kind, _ops.EMPTY, name=spec.name)
        if kind == _ops.JOIN:
            return h, lambda handle: (handle.aux() or [-1])[0]
        return h, lambda handle: None

    assert arr is not None
    dname = _dtype_name(arr)
    if kind in (_ops.ALLREDUCE, _ops.REDUCESCATTER):
        if kind == _ops.ALLREDUCE:
            out = _output_buffer(spec.name, arr.shape, arr.dtype)
            gid = group_ids.get(spec.group, -1)
            h = _ops.submit(kind, _raw(arr, dname), _raw(out, dname), name=spec.name, op=spec.op,
                            prescale_factor=spec.prescale, postscale_factor=spec.postscale,
                            group_id=gid, group_size=group_members.get(spec.group, 0) if gid >= 0 else 0,
                            keepalive=(arr, out))
            return h, lambda handle: out
        h = _ops.submit(kind, _raw(arr, dname), name=spec.name, op=spec.op,
                        prescale_factor=spec.prescale, postscale_factor=spec.postscale,
                        keepalive=arr)
        return h, lambda handle: _engine_output(handle, arr.dtype, arr.shape[1:], as_bytes=False)

    if kind == _ops.BROADCAST:
        buf = _aligned_empty(arr.shape, arr.dtype)
        buf[...] = arr
        view = buf if dname in _REDUCIBLE else buf.reshape(-1).view(np.uint8)
        vname = _dtype_name(view)
        h = _ops.submit(kind, _raw(view, vname), name=spec.name, root_rank=spec.root, keepalive=buf)
        return h, lambda handle: buf

    if kind in (_ops.ALLGATHER, _ops.ALLTOALL):
        as_bytes = dname not in _REDUCIBLE
        view = _rows_as_bytes(arr) if as_bytes else arr
        vname = _dtype_name(view)
        split_list = None
        if kind == _ops.ALLTOALL and splits is not None and np.size(splits) > 0:
            split_list = [int(s) for s in np.asarray(splits).reshape(-1)]
        h = _ops.submit(kind, _raw(view, vname), name=spec.name, splits=split_list, keepalive=arr)
        if kind == _ops.ALLGATHER:
            return h, lambda handle: _engine_output(handle, arr.dtype, arr.shape[1:], as_bytes)
        return h, lambda handle: (_engine_output(handle, arr.dtype, arr.shape[1:], as_bytes),
                                  np.asarray(handle.aux(), dtype=np.int32))
    raise HvdliteError(f"unknown request kind {kind}")


def _engine_output(handle: _ops.Request, dtype: np.dtype, row_shape: tuple[int, ...],
                   as_bytes: bool) -> np.ndarray:
    buf, shape, dname = handle.output()
    rows = int(shape[0]) if len(shape) else 0
    if as_bytes:
        return buf.view(dtype).reshape((rows,) + tuple(row_shape))
    return buf.view(_codes.np_dtype(dname)).reshape(tuple(shape))


# ----------------------------------------------------------------------------
# TensorFlow level: tensors in, tensors out, eagerly or through one py_function.
# ----------------------------------------------------------------------------

def _to_numpy(t: Any) -> np.ndarray:
    """Host memory of an eager tensor as an ndarray, without a copy."""
    if isinstance(t, np.ndarray):
        return t
    return np.asarray(t)


_DLPACK_KINDS = frozenset("biuf")


def _np_to_tf(a: np.ndarray) -> tf.Tensor:
    """Wrap a result array as an eager tensor, without a copy when possible."""
    # TensorFlow kernels require 64-byte aligned data; anything else is copied.
    if a.flags.writeable and a.flags.c_contiguous and a.ctypes.data % _ALIGN == 0:
        try:
            if _BF16 is not None and a.dtype == _BF16:
                return tf.bitcast(tf.experimental.dlpack.from_dlpack(a.view(np.uint16).__dlpack__()),
                                  tf.bfloat16)
            if a.dtype.kind in _DLPACK_KINDS:
                return tf.experimental.dlpack.from_dlpack(a.__dlpack__())
        except Exception:
            pass
    return tf.convert_to_tensor(np.array(a, copy=True) if not a.flags.writeable else a)


def _executing_eagerly() -> bool:
    return tf.executing_eagerly()


def _check_not_xla() -> None:
    """hvdlite's graph ops are py_functions, which XLA cannot compile: say so clearly."""
    try:
        from tensorflow.python.ops import control_flow_util
        in_xla = control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
    except Exception:  # pragma: no cover - private API moved
        return
    if in_xla:
        raise HvdliteError("hvdlite collectives cannot run inside an XLA-compiled function: use "
                           "tf.function(jit_compile=False), or model.compile(jit_compile=False) "
                           "for Keras")


_name_lock = threading.Lock()
_graph_name_counts: "weakref.WeakKeyDictionary[Any, dict[str, int]]" = weakref.WeakKeyDictionary()
_UID_SUFFIX = re.compile(r"_\d+$")


def _op_name(kind_label: str, name: str | None, ignore_name_scope: bool = False) -> str:
    """The engine's name for a request; it must be the same on every rank.

    Eagerly: the user's name, or a generated one (the same on every rank that issues the
    same sequence of calls). In a graph: the function's name plus the user's name (or
    ``hvdlite_<kind>``), made unique by a counter of this graph. It is fixed for every run
    of the traced function, which lets the engine's response cache recognise it. Name
    scopes and TensorFlow's numeric suffixes are left out on purpose: they come from
    process-wide counters (Keras layer names, ``cond_true_1234``) that may differ between
    ranks. ``ignore_name_scope`` is accepted for compatibility."""
    if _executing_eagerly():
        return name if name is not None else _ops.auto_name(kind_label)
    graph = tf.compat.v1.get_default_graph()
    base = name if name is not None else f"hvdlite_{kind_label}"
    with _name_lock:
        counts = _graph_name_counts.setdefault(graph, {})
        n = counts.get(base, 0)
        counts[base] = n + 1
    unique = base if n == 0 else f"{base}_{n}"
    return f"{_UID_SUFFIX.sub('', getattr(graph, 'name', '') or 'graph')}/{unique}"


def _tensor_of(x: Any) -> tf.Tensor:
    if isinstance(x, tf.Tensor):
        return x
    return tf.convert_to_tensor(x)


# ----------------------------------------------------------------------------
# Graph level: hvdlite's own ops (see hvdlite.tensorflow._kernels).
# ----------------------------------------------------------------------------

# Element types hvdlite's graph ops take (the engine's, and others moved as bytes by
# allgather, alltoall and broadcast). Anything else goes through the py_function path.
_KERNEL_DTYPES = frozenset((tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.uint8,
                            tf.int16, tf.uint16, tf.int32, tf.uint32, tf.int64, tf.uint64,
                            tf.bool, tf.complex64, tf.complex128))


def _graph_ops(tensors: Sequence[tf.Tensor | None]) -> Any:
    """hvdlite's graph ops, if they can take `tensors`; None for the py_function path."""
    if any(t is not None and t.dtype not in _KERNEL_DTYPES for t in tensors):
        return None
    from hvdlite.tensorflow import _kernels
    return _kernels.library()


def _float_bits(x: float) -> int:
    """A float64 as the int64 with the same bits: TensorFlow's float attributes are
    float32, and a scale factor must reach the engine exactly as eagerly."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _static_problem(spec: _Spec, t: tf.Tensor | None) -> tuple[str, int]:
    """What :func:`_problem` finds when the graph is traced (the dtype, the op, a rank
    that is known), as the problem and TensorFlow's error code; ("", 0) if nothing. The
    graph op checks what only the running tensor shows (``RuntimeProblem``)."""
    if spec.problem is not None:
        return spec.problem, _tf_code(spec.error)
    kind = spec.kind
    if kind in (_ops.BARRIER, _ops.JOIN) or t is None:
        return "", 0
    if kind in (_ops.ALLREDUCE, _ops.REDUCESCATTER):
        dname = t.dtype.name
        if dname not in _REDUCIBLE:
            return (f"dtype {dname} cannot be reduced; supported: {', '.join(_ops.DTYPES)}",
                    _tf_code(HvdliteError))
        why = _ops.op_problem(spec.op)
        if why is not None:
            return why[0], _tf_code(why[1])
    if kind in (_ops.REDUCESCATTER, _ops.ALLGATHER, _ops.ALLTOALL) and t.shape.rank == 0:
        return "needs a tensor of rank >= 1", _tf_code(HvdliteError)
    return "", 0


def _batch_attrs(specs: Sequence[_Spec], tensors: Sequence[tf.Tensor | None]) -> dict[str, Any]:
    """The attributes that describe a batch of requests to hvdlite's graph ops."""
    problems = [_static_problem(spec, t) for spec, t in zip(specs, tensors)]
    process_set = _ops.current_process_set()
    pid = 0 if process_set is None else _resolve_process_set(process_set)[0]
    # Roots are world ranks (Horovod's); the engine of a set counts its own ranks.
    roots = [s.root if pid == 0 or s.root < 0 else _resolve_process_set(process_set, s.root)[1]
             for s in specs]
    return {
        "process_set": pid,
        "kinds": [s.kind for s in specs],
        "names": [s.name for s in specs],
        "reduce_ops": [int(s.op) if _ops.op_problem(s.op) is None else -1 for s in specs],
        "scale_bits": [b for s in specs for b in (_float_bits(s.prescale), _float_bits(s.postscale))],
        "roots": roots,
        "groups": [s.group for s in specs],
        "dtype_codes": [-1 if t is None else _ops.DTYPES.get(t.dtype.name, -1) for t in tensors],
        "problems": [p for p, _ in problems],
        "problem_codes": [c for _, c in problems],
    }


def _set_result_shapes(specs: Sequence[_Spec], tensors: Sequence[tf.Tensor | None],
                       outs: Sequence[tf.Tensor]) -> list[Any]:
    """The results of a batch from the graph op's outputs, with the shapes known when
    the graph is traced (see :func:`_run`)."""
    results: list[Any] = []
    k = 0
    for spec, t in zip(specs, tensors):
        if spec.kind in (_ops.BARRIER, _ops.JOIN):
            o = outs[k]
            o.set_shape([])
            results.append(o if spec.kind == _ops.JOIN else None)
            k += 1
        elif spec.kind == _ops.ALLTOALL:
            o, rs = outs[k], outs[k + 1]
            o.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]))
            rs.set_shape([None])
            results.append((o, rs))
            k += 2
        else:
            o = outs[k]
            if spec.kind in (_ops.ALLREDUCE, _ops.BROADCAST):
                o.set_shape(t.shape)
            else:
                o.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]))
            results.append(o)
            k += 1
    return results


def _run_in_graph_op(lib: Any, specs: Sequence[_Spec], tensors: Sequence[tf.Tensor | None],
                     splits: Sequence[tf.Tensor | None] | None) -> list[Any]:
    """A batch of requests as one ``HvdliteCollectives`` op (asynchronous: it submits
    every request and finishes when all have, without holding a TensorFlow thread)."""
    inputs: list[tf.Tensor] = []
    input_index: list[int] = []
    splits_index: list[int] = []
    for i, t in enumerate(tensors):
        input_index.append(-1 if t is None else len(inputs))
        if t is not None:
            inputs.append(t)
        s = None if splits is None else splits[i]
        splits_index.append(-1 if s is None else len(inputs))
        if s is not None:
            inputs.append(tf.cast(s, tf.int32))
    tout: list[tf.DType] = []
    for spec, t in zip(specs, tensors):
        if spec.kind in (_ops.BARRIER, _ops.JOIN):
            tout.append(tf.int32)
        elif spec.kind == _ops.ALLTOALL:
            tout.extend([t.dtype, tf.int32])
        else:
            tout.append(t.dtype)
    outs = lib.ops.hvdlite_collectives(inputs, Tout=tout, input_index=input_index,
                                       splits_index=splits_index, name="hvdlite_collectives",
                                       **_batch_attrs(specs, tensors))
    return _set_result_shapes(specs, tensors, list(outs))


@_no_autograph
def _run(specs: Sequence[_Spec], tensors: Sequence[tf.Tensor],
         splits: Sequence[tf.Tensor | None] | None = None) -> list[Any]:
    """Execute a batch of requests on TensorFlow tensors. Returns per request: a tensor,
    ``(tensor, received_splits)`` for alltoall, an int32 scalar tensor for join, None for
    barrier. Inside a graph the whole batch is one ``tf.py_function`` op."""
    n = len(specs)
    if _executing_eagerly():
        arrays = [None if t is None else _to_numpy(t) for t in tensors]
        split_arrays = None if splits is None else [None if s is None else _to_numpy(s) for s in splits]
        results = _execute(specs, arrays, split_arrays)
        return [_result_to_tf(spec, r) for spec, r in zip(specs, results)]

    _check_not_xla()
    lib = _graph_ops(tensors)
    if lib is not None:
        return _run_in_graph_op(lib, specs, tensors, splits)

    # Fallback: one py_function for the whole batch.
    inputs: list[tf.Tensor] = []
    input_index: list[int | None] = []
    split_index: list[int | None] = []
    for i in range(n):
        t = tensors[i]
        if t is None:
            input_index.append(None)
        else:
            input_index.append(len(inputs))
            inputs.append(t)
        s = None if splits is None else splits[i]
        if s is None:
            split_index.append(None)
        else:
            split_index.append(len(inputs))
            inputs.append(tf.cast(s, tf.int32))
    tout: list[tf.DType] = []
    for i, spec in enumerate(specs):
        if spec.kind == _ops.BARRIER:
            tout.append(tf.int32)
        elif spec.kind == _ops.JOIN:
            tout.append(tf.int32)
        elif spec.kind == _ops.ALLTOALL:
            tout.extend([tensors[i].dtype, tf.int32])
        else:
            tout.append(tensors[i].dtype)

    process_set = _ops.current_process_set()  # the py_function runs later, outside the scope

    def body(*ts):
        arrays = [None if k is None else _to_numpy(ts[k]) for k in input_index]
        split_arrays = [None if k is None else _to_numpy(ts[k]) for k in split_index]
        with _ops.process_set_scope(process_set):
            results = _execute(specs, arrays, split_arrays)
        flat: list[tf.Tensor] = []
        for spec, r in zip(specs, results):
            if spec.kind == _ops.BARRIER:
                flat.append(tf.constant(0, tf.int32))
            elif spec.kind == _ops.JOIN:
                flat.append(tf.constant(int(r), tf.int32))
            elif spec.kind == _ops.ALLTOALL:
                flat.extend([_np_to_tf(r[0]), tf.constant(r[1], tf.int32)])
            else:
                flat.append(_np_to_tf(r))
        return flat

    outs = tf.py_function(body, inputs, tout, name="hvdlite_collectives")
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    return _set_result_shapes(specs, tensors, list(outs))


# Requests submitted by one py_function and waited for by a later one (see _run_buckets).
_tickets: dict[int, Handle] = {}
_ticket_lock = threading.Lock()
_ticket_counter = itertools.count(1)


def _drain_tickets() -> None:
    """Wait for (and forget) every ticket still open: after a failed step nothing will."""
    with _ticket_lock:
        open_tickets = list(_tickets.values())
        _tickets.clear()
    for p in open_tickets:
        try:
            _finish(p)
        except Exception:
            pass


@_no_autograph
def _run_buckets(buckets: Sequence[tuple[Sequence[_Spec], Sequence[tf.Tensor]]],
                 order: Callable[[Sequence[Sequence[tf.Tensor]], Sequence[Any]], Any] | None = None
                 ) -> list[list[tf.Tensor]]:
    """Inside a graph: one small "submit" op per bucket and one "wait" op for all of them.

    A submit op needs only its own bucket's tensors, so TensorFlow may run it as soon as
    they exist, and the engine communicates them in the background; ``order`` (called
    with each bucket's tensors and the submit ops, e.g.
    :func:`hvdlite.tensorflow.overlap.submit_during_backward`) can make it do so before
    the rest of the backward pass. The wait op then collects every result. Only
    ALLREDUCE and ALLGATHER requests. Eagerly the buckets simply run one after the
    other, each submitted whole before any wait."""
    if _executing_eagerly():
        return [_run(specs, tensors) for specs, tensors in buckets]
    _check_not_xla()
    lib = _graph_ops([t for _, tensors in buckets for t in tensors])
    if lib is not None:
        return _run_buckets_in_graph_ops(lib, buckets, order)
    tickets = []
    process_set = _ops.current_process_set()  # the py_functions run later, outside the scope
    for specs, tensors in buckets:
        def submit_body(*ts, specs=specs):
            with _ops.process_set_scope(process_set):
                pending = _submit(specs, [_to_numpy(t) for t in ts])
            if pending.submit_error is not None:
                _drain_tickets()
                _finish(pending)  # raises the submit error after the rest completed
            pending.keepalive = ts  # the tensors' memory must outlive the requests
            ticket = next(_ticket_counter)
            with _ticket_lock:
                _tickets[ticket] = pending
            return np.int64(ticket)
        tickets.append(tf.py_function(submit_body, list(tensors), tf.int64, name="hvdlite_submit"))
    if order is not None:  # e.g. overlap.submit_during_backward
        order([tensors for _, tensors in buckets], [t.op for t in tickets])

    tout = [t.dtype for _, tensors in buckets for t in tensors]

    def wait_body(*ticket_values):
        first_error: BaseException | None = None
        flat: list[tf.Tensor] = []
        for tv in ticket_values:
            with _ticket_lock:
                pending = _tickets.pop(int(tv), None)
            if pending is None:
                raise _as_tf_error(HvdliteError("hvdlite: a collective's results were lost (step aborted?)"))
            try:
                flat.extend(_np_to_tf(r) for r in _finish(pending))
            except BaseException as exc:
                if first_error is None:
                    first_error = exc
        if first_error is not None:
            raise first_error
        return flat

    outs = tf.py_function(wait_body, tickets, tout, name="hvdlite_wait")
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    results: list[list[tf.Tensor]] = []
    k = 0
    for specs, tensors in buckets:
        part = []
        for spec, t in zip(specs, tensors):
            o = outs[k]
            k += 1
            if spec.kind == _ops.ALLREDUCE:
                o.set_shape(t.shape)
            else:
                o.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]))
            part.append(o)
        results.append(part)
    return results


def _run_buckets_in_graph_ops(lib: Any, buckets: Sequence[tuple[Sequence[_Spec], Sequence[tf.Tensor]]],
                              order: Callable[[Sequence[Sequence[tf.Tensor]], Sequence[Any]], Any] | None
                              ) -> list[list[tf.Tensor]]:
    """:func:`_run_buckets` with hvdlite's graph ops: an ``HvdliteSubmit`` op per bucket
    (it submits and returns a ticket at once) and one asynchronous ``HvdliteWait``."""
    tickets = [lib.ops.hvdlite_submit(list(tensors), name="hvdlite_submit", **_batch_attrs(specs, tensors))
               for specs, tensors in buckets]
    if order is not None:  # e.g. overlap.submit_during_backward
        order([tensors for _, tensors in buckets], [t.op for t in tickets])
    tout = [t.dtype for _, tensors in buckets for t in tensors]
    outs = list(lib.ops.hvdlite_wait(tickets, Tout=tout, name="hvdlite_wait"))
    results: list[list[tf.Tensor]] = []
    k = 0
    for specs, tensors in buckets:
        results.append(_set_result_shapes(specs, tensors, outs[k:k + len(specs)]))
        k += len(specs)
    return results


def _result_to_tf(spec: _Spec, r: Any) -> Any:
    if spec.kind == _ops.BARRIER:
        return None
    if spec.kind == _ops.JOIN:
        return tf.constant(int(r), tf.int32)
    if spec.kind == _ops.ALLTOALL:
        return _np_to_tf(r[0]), tf.constant(r[1], tf.int32)
    return _np_to_tf(r)


# ----------------------------------------------------------------------------
# Differentiable collectives.
# ----------------------------------------------------------------------------

_resolve_op = _ops.resolve_op  # Horovod's rules for op= and the deprecated average=


def _reducescatter_problem(op: Any) -> dict[str, Any]:
    """The :class:`_Spec` fields that refuse a reducescatter with an op other than Sum
    or Average (on every rank: the others may have passed a supported op)."""
    if op in (Sum, Average):
        return {}
    return {"problem": f"reducescatter supports only Sum and Average, not {_ops.describe_op(op)}",
            "error": HvdliteNotImplementedError}


def _allreduce_dense(tensors: Sequence[tf.Tensor], names: Sequence[str], op: int,
                     prescale: float, postscale: float, grouped: bool) -> list[tf.Tensor]:
    """Allreduce of dense tensors in one batch, differentiable: the gradient is the same
    allreduce (op and scale factors) of the incoming gradient."""
    tensors = [_tensor_of(t) for t in tensors]

    @tf.custom_gradient
    def fn(*xs):
        specs = [_Spec(_ops.ALLREDUCE, nm, op, prescale, postscale, group=0 if grouped else -1)
                 for nm in names]
        ys = _run(specs, list(xs))

        def grad(*dys):
            dys = [tf.zeros_like(x) if dy is None else dy for x, dy in zip(xs, dys)]
            gnames = [_op_name("allreduce", f"{_plain(nm)}_grad") for nm in names]
            return _allreduce_dense(dys, gnames, op, prescale, postscale, grouped)

        return ys, _keeps_process_set(grad)

    out = fn(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _set_scope(process_set: Any) -> _ops.process_set_scope:
    """``_ops.process_set_scope(process_set)`` for a public TensorFlow function, with
    Horovod's TensorFlow errors: a set this rank is not a member of raises
    ``tf.errors.InvalidArgumentError`` (Horovod's ops refuse it so, eagerly and in
    graphs; here when the call is made or traced), which is also a ``ValueError`` and
    an :class:`HvdliteError`; so does a set that is not registered (Horovod raises
    ``ValueError`` for it). Nothing is submitted, so no other rank waits."""
    try:
        pid = getattr(process_set, "process_set_id", None)
        if (pid not in (None, 0) and isinstance(pid, int)
                and _process_set_table.members(pid) is None):
            raise HvdliteValueError(f"process set id {pid} is not registered on rank {_basics.rank()}: "
                                    "pass the set to hvd.init(process_sets=[...]) or hvd.add_process_set()")
        return _ops.process_set_scope(process_set)
    except HvdliteError as exc:
        error = exc
    raise _as_tf_error(error)


def _keeps_process_set(grad: Callable[..., Any]) -> Callable[..., Any]:
    """A custom gradient's function, run on the process set its forward ran on (the
    gradient is built later, outside the caller's ``process_set_scope``)."""
    process_set = _ops.current_process_set()

    def on_set(*dys: Any) -> Any:
        with _ops.process_set_scope(process_set):
            return grad(*dys)
    return on_set


def _plain(name: str) -> str:
    """Last component of an engine name, usable as a base for derived names."""
    return name.rsplit("/", 1)[-1]


@_no_autograph
def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "",
              device_sparse: str = "", compression: type[Compressor] = Compression.none,
              op: int | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None,
              process_set: Any = None, ignore_name_scope: bool = False) -> Any:
    """Reduce ``tensor`` over all ranks; every rank gets the result.

    ``op`` is ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``;
    ``prescale_factor``/``postscale_factor`` multiply the input before and the result
    after the reduction. A ``tf.IndexedSlices`` is combined with two allgathers (values
    and indices) instead, its values divided by the number of ranks for ``Average`` (true
    division: integer values give floats, as in Horovod); other ops and scale factors are
    refused for it with ``NotImplementedError``, on every rank and, in a graph, when the
    graph is built (as Horovod).
    ``tensor`` must have the same shape and dtype on every rank. Works eagerly and inside
    ``tf.function``; differentiable (the gradient is the same allreduce of the gradient).
    ``device_*`` are accepted for compatibility; tensors travel through host memory.
    """
    with _set_scope(process_set):
        op = _resolve_op(op, average)
        if isinstance(tensor, tf.IndexedSlices):
            return _allreduce_indexed_slices(tensor, op, prescale_factor, postscale_factor, name,
                                             ignore_name_scope)
        t = _tensor_of(tensor)
        compressed, ctx = compression.compress(t)
        nm = _op_name("allreduce", name, ignore_name_scope)
        reduced = _allreduce_dense([compressed], [nm], op, prescale_factor, postscale_factor, False)[0]
        return compression.decompress(reduced, ctx)


def _allreduce_indexed_slices(slices: tf.IndexedSlices, op: int, prescale: float,
                              postscale: float, name: str | None,
                              ignore_name_scope: bool) -> tf.IndexedSlices:
    base = name or "indexed_slices"
    problem = None
    if op not in (Average, Sum):
        problem = f"allreduce of tf.IndexedSlices supports only Average and Sum, not {_ops.describe_op(op)}"
    elif prescale != 1.0 or postscale != 1.0:
        problem = "allreduce of tf.IndexedSlices takes no prescale_factor or postscale_factor"
    if problem is not None:
        # Refused as the first of the two allgathers the other ranks run, so that a rank
        # alone in passing this fails them too, and raised here, also while a graph is
        # built (Horovod raises NotImplementedError there): the refusal goes through the
        # engine at once, and a rank whose graph holds the allgather meets it when it runs.
        nm = _op_name("allgather", f"{base}.values" if name else None, ignore_name_scope)
        _execute([_Spec(_ops.ALLGATHER, nm, problem=problem, error=HvdliteNotImplementedError)], [None])
        raise AssertionError("a refused request returned")  # _execute raised
    values = allgather(slices.values, name=f"{base}.values" if name else None,
                       ignore_name_scope=ignore_name_scope)
    indices = allgather(slices.indices, name=f"{base}.indices" if name else None,
                        ignore_name_scope=ignore_name_scope)
    if op == Average:
        # True division, as Horovod: integer values average to floats (float32 for 8 and
        # 16 bits, float64 for 32 and 64), not to zeros.
        values = tf.math.truediv(values, _ops.current_size())
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


@_no_autograph
def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: type[Compressor] = Compression.none, op: int | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: Any = None, ignore_name_scope: bool = False,
                      name: str | None = None) -> list[Any]:
    """Allreduce a list of tensors as one group: the engine negotiates and fuses them
    together. Same arguments (in Horovod's order) and result per tensor as
    :func:`allreduce`."""
    with _set_scope(process_set):
        op = _resolve_op(op, average)
        tensors = list(tensors)
        if not tensors:
            return []
        results: list[Any] = [None] * len(tensors)
        dense_idx = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
        base = name or "grouped_allreduce"
        for i, t in enumerate(tensors):
            if isinstance(t, tf.IndexedSlices):
                results[i] = _allreduce_indexed_slices(t, op, prescale_factor, postscale_factor,
                                                       f"{base}.{i}" if name else None, ignore_name_scope)
        if dense_idx:
            comp = [compression.compress(_tensor_of(tensors[i])) for i in dense_idx]
            if _executing_eagerly():
                stem = name if name is not None else _ops.auto_name("grouped_allreduce")
                names = [f"{stem}.{k}" for k in range(len(dense_idx))]
            else:
                names = [_op_name("allreduce", f"{base}.{k}", ignore_name_scope)
                         for k in range(len(dense_idx))]
            reduced = _allreduce_dense([c for c, _ in comp], names, op, prescale_factor,
                                       postscale_factor, True)
            for k, i in enumerate(dense_idx):
                results[i] = compression.decompress(reduced[k], comp[k][1])
        return results


@_no_autograph
def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: Any = None) -> tf.Tensor:
    """Concatenate ``tensor`` from every rank along dimension 0 (rank order). The first
    dimension may differ between ranks, the others must agree. Differentiable: the
    gradient is the rank's own slice of the gradient averaged over ranks (Horovod's rule).
    Tensors of types the engine cannot reduce (bool, int16, complex...) are moved as bytes.
    """
    with _set_scope(process_set):
        t = _tensor_of(tensor)
        nm = _op_name("allgather", name, ignore_name_scope)

        @tf.custom_gradient
        def fn(x):
            y = _run([_Spec(_ops.ALLGATHER, nm)], [x])[0]

            def grad(dy):
                avg = allreduce(dy, op=Average, name=f"{_plain(nm)}_grad",
                                ignore_name_scope=True)
                d0 = tf.reshape(tf.shape(x, out_type=tf.int64)[0], [1])
                sizes = allgather(d0, name=f"{_plain(nm)}_grad_sizes",
                                  ignore_name_scope=True)
                n = _ops.current_size()
                return tf.split(avg, tf.reshape(sizes, [n]), num=n, axis=0)[_ops.current_rank()]

            return y, _keeps_process_set(grad)

        if not t.dtype.is_floating:
            return _run([_Spec(_ops.ALLGATHER, nm)], [t])[0]
        return fn(t)


@_no_autograph
def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      ignore_name_scope: bool = False,
                      process_set: Any = None) -> list[tf.Tensor]:
    """Allgather several tensors in one batch; differentiable like :func:`allgather` when
    every tensor is floating point (the gradients are averaged in one grouped allreduce)."""
    with _set_scope(process_set):
        ts = [_tensor_of(t) for t in tensors]
        if not ts:
            return []
        base = name or "grouped_allgather"
        names = [_op_name("allgather", f"{base}.{i}" if (name or not _executing_eagerly()) else None,
                          ignore_name_scope) for i in range(len(ts))]
        if not all(t.dtype.is_floating for t in ts):
            return _run([_Spec(_ops.ALLGATHER, n) for n in names], ts)

        @tf.custom_gradient
        def fn(*xs):
            ys = _run([_Spec(_ops.ALLGATHER, n) for n in names], list(xs))

            def grad(*dys):
                stem = _plain(names[0])
                avg = grouped_allreduce(list(dys), op=Average, name=f"{stem}_grad",
                                        ignore_name_scope=True)
                d0 = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in xs])
                sizes = allgather(tf.reshape(d0, [1, len(xs)]), name=f"{stem}_grad_sizes",
                                  ignore_name_scope=True)  # [ranks, tensors]
                n, r = _ops.current_size(), _ops.current_rank()
                return [tf.split(a, sizes[:, i], num=n, axis=0)[r] for i, a in enumerate(avg)]

            return ys, _keeps_process_set(grad)

        return fn(*ts)


@_no_autograph
def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              ignore_name_scope: bool = False, process_set: Any = None) -> tf.Tensor:
    """Return ``root_rank``'s value of ``tensor`` on every rank (shape and dtype must
    agree). Differentiable: the root's gradient is the average of all ranks' gradients,
    the others' is zero (Horovod's rule)."""
    with _set_scope(process_set):
        t = _tensor_of(tensor)
        nm = _op_name("broadcast", name, ignore_name_scope)
        root = int(root_rank)

        @tf.custom_gradient
        def fn(x):
            y = _run([_Spec(_ops.BROADCAST, nm, root=root)], [x])[0]

            def grad(dy):
                avg = allreduce(dy, op=Average, name=f"{_plain(nm)}_grad",
                                ignore_name_scope=True)
                return avg if _basics.rank() == root else avg * 0  # a world rank, as root is

            return y, _keeps_process_set(grad)

        if not t.dtype.is_floating:
            return _run([_Spec(_ops.BROADCAST, nm, root=root)], [t])[0]
        return fn(t)


@_no_autograph
def broadcast_(variables: Sequence[Any], root_rank: int, name: str | None = None,
               process_set: Any = None) -> list[tf.Tensor]:
    """Broadcast variables in place from ``root_rank``: one batch for all of them, then
    each variable is assigned the root's value. Returns the new values."""
    with _set_scope(process_set):
        variables = list(variables)
        if not variables:
            return []
        values = [_tensor_of(v) for v in variables]
        base = name or "broadcast_"
        if _executing_eagerly():
            names = [_op_name("broadcast", None) if name is None else f"{base}.{i}"
                     for i in range(len(values))]
        else:
            names = [_op_name("broadcast", f"{base}.{i}") for i in range(len(values))]
        new = _run([_Spec(_ops.BROADCAST, n, root=int(root_rank)) for n in names], values)
        assigned = [v.assign(x) for v, x in zip(variables, new)]
        if _executing_eagerly():
            return new
        # In a TF1 graph nothing runs an op that nothing needs: the values returned depend
        # on the assignments (inside tf.function they run anyway, as stateful ops).
        deps = [a if isinstance(a, tf.Operation) else a.op for a in assigned
                if isinstance(a, tf.Operation) or isinstance(getattr(a, "op", None), tf.Operation)]
        with tf.control_dependencies(deps):
            return [tf.identity(x) for x in new]


@_no_autograph
def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             ignore_name_scope: bool = False, process_set: Any = None) -> Any:
    """Send slice ``i`` of ``tensor`` (along dimension 0) to rank ``i`` and concatenate
    what every rank sent here. ``splits`` lists the rows for each rank; without it dim 0
    is divided evenly (it must be divisible by the number of ranks). Returns the tensor,
    and, when ``splits`` was given, also the received splits (as Horovod does).
    Differentiable: the gradient is the reverse alltoall."""
    with _set_scope(process_set):
        t = _tensor_of(tensor)
        nm = _op_name("alltoall", name, ignore_name_scope)
        split_t, refused = None, {}
        if splits is not None:
            try:
                split_t = tf.cast(_tensor_of(splits), tf.int32)
            except Exception as exc:  # noqa: BLE001 - refused on every rank, when it runs
                refused = {"problem": f"splits must be integers ({exc})", "error": HvdliteValueError}

        def run(x):
            return _run([_Spec(_ops.ALLTOALL, nm, **refused)], [x], [split_t])[0]

        if t.dtype.is_floating and not refused:
            @tf.custom_gradient
            def fn(x):
                y, recv = run(x)

                def grad(dy, *unused):
                    back, _ = alltoall(dy, splits=recv, name=f"{_plain(nm)}_grad",
                                       ignore_name_scope=True)
                    return back

                return (y, recv), _keeps_process_set(grad)

            y, recv = fn(t)
        else:
            y, recv = run(t)
        return (y, recv) if splits is not None else y


@_no_autograph
def reducescatter(tensor: Any, device_dense: str = "",
                  compression: type[Compressor] = Compression.none, op: int = Average,
                  name: str | None = None, process_set: Any = None,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce ``tensor`` over ranks (``Sum`` or ``Average``) and give each rank a block of
    rows of the result: rank ``r`` gets ``dim0 // size`` rows, plus one if
    ``r < dim0 % size``. Differentiable, with Horovod's convention: the gradient is the
    allgather of the gradient, times the number of ranks for ``Sum`` (in line with
    allreduce's gradient, which sums over the ranks), and times the scale factors."""
    with _set_scope(process_set):
        refused = _reducescatter_problem(op)
        t = _tensor_of(tensor)
        compressed, ctx = compression.compress(t)
        nm = _op_name("reducescatter", name, ignore_name_scope)

        def run(x):
            return _run([_Spec(_ops.REDUCESCATTER, nm, op, prescale_factor, postscale_factor,
                               **refused)], [x])[0]

        if compressed.dtype.is_floating and not refused:
            @tf.custom_gradient
            def fn(x):
                y = run(x)

                def grad(dy):
                    g = allgather(dy, name=f"{_plain(nm)}_grad",
                                  ignore_name_scope=True)
                    scale = prescale_factor * postscale_factor * (1 if op == Average else _ops.current_size())
                    return g * tf.cast(scale, g.dtype) if scale != 1.0 else g

                return y, _keeps_process_set(grad)

            out = fn(compressed)
        else:
            out = run(compressed)
        return compression.decompress(out, ctx)


@_no_autograph
def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: type[Compressor] = Compression.none, op: int = Average,
                          process_set: Any = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0, name: str | None = None,
                          ignore_name_scope: bool = False) -> list[tf.Tensor]:
    """Reducescatter several tensors in one batch; differentiable like :func:`reducescatter`
    when every tensor is floating point (the gradients are allgathered in one batch). The
    arguments up to ``postscale_factor`` are Horovod's, in its order; ``name`` is
    hvdlite's."""
    with _set_scope(process_set):
        refused = _reducescatter_problem(op)
        comp = [compression.compress(_tensor_of(t)) for t in tensors]
        if not comp:
            return []
        base = name or "grouped_reducescatter"
        names = [_op_name("reducescatter", f"{base}.{i}" if (name or not _executing_eagerly()) else None,
                          ignore_name_scope) for i in range(len(comp))]

        def run(xs):
            return _run([_Spec(_ops.REDUCESCATTER, n, op, prescale_factor, postscale_factor,
                               **refused) for n in names], list(xs))

        if all(c.dtype.is_floating for c, _ in comp) and not refused:
            @tf.custom_gradient
            def fn(*xs):
                ys = run(xs)

                def grad(*dys):
                    gs = grouped_allgather(list(dys), name=f"{_plain(names[0])}_grad",
                                           ignore_name_scope=True)
                    scale = prescale_factor * postscale_factor * (1 if op == Average else _ops.current_size())
                    return [g * tf.cast(scale, g.dtype) if scale != 1.0 else g for g in gs]

                return ys, _keeps_process_set(grad)

            outs = fn(*[c for c, _ in comp])
        else:
            outs = run([c for c, _ in comp])
        return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, comp)]


@_no_autograph
def barrier(process_set: Any = None) -> None:
    """Block until every rank has reached this barrier (inside ``tf.function`` the
    barrier is an op that runs in program order)."""
    with _set_scope(process_set):
        _run([_Spec(_ops.BARRIER, _op_name("barrier", None))], [None])


@_no_autograph
def join() -> tf.Tensor:
    """Declare that this rank has no more data. Until every rank has joined, collectives
    issued by the others proceed with this rank contributing nothing (zeros to
    allreduce). Returns (int32 scalar tensor) the rank that joined last."""
    return _run([_Spec(_ops.JOIN, _op_name("join", None))], [None])[0]


@_no_autograph
def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The number of ranks of process set ``process_set_id`` (0: the global set) as an
    int32 tensor."""
    return tf.constant(len(_set_members(process_set_id)), tf.int32, name=name)


@_no_autograph
def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 (int32) when this rank belongs to process set ``process_set_id``, else 0."""
    return tf.constant(int(_basics.rank() in _set_members(process_set_id)), tf.int32, name=name)


def _set_members(process_set_id: int) -> list[int]:
    """The world ranks of a registered process set (ValueError if there is none)."""
    if process_set_id == 0:
        return list(range(_basics.size()))  # raises NotInitializedError before init()
    ranks = _process_set_table.members(process_set_id)
    if ranks is None:
        raise ValueError(f"process set id {process_set_id} is not registered")
    return ranks


def check_process_set(process_set: Any, members_only: bool = True) -> None:
    """Raise unless this process can run collectives on `process_set` (a registered set
    it is a member of; None or the global set always), as :func:`_set_scope` does.
    With ``members_only=False`` a registered set this rank is not in passes too."""
    if not members_only and outside_of(process_set):
        return
    with _set_scope(process_set):
        pass


def outside_of(process_set: Any) -> bool:
    """True when `process_set` is a registered set (not the global one) that this rank
    is not a member of."""
    pid = getattr(process_set, "process_set_id", None)
    if not isinstance(process_set, _process_set_table.ProcessSet) or pid in (None, 0):
        return False
    ranks = _process_set_table.members(pid)
    return ranks is not None and _basics.rank() not in ranks


@_no_autograph
def rank_op(name: str | None = None) -> tf.Tensor:
    """This rank as an int32 tensor."""
    return tf.constant(_basics.rank(), tf.int32, name=name)


@_no_autograph
def local_size_op(name: str | None = None) -> tf.Tensor:
    """The number of ranks on this host as an int32 tensor."""
    return tf.constant(_basics.local_size(), tf.int32, name=name)


@_no_autograph
def local_rank_op(name: str | None = None) -> tf.Tensor:
    """This rank's index on its host as an int32 tensor."""
    return tf.constant(_basics.local_rank(), tf.int32, name=name)
