"""Eagerly a collective reaches the engine from Python: the tensor's host memory is handed
to the engine directly (no copy), and results land in buffers that TensorFlow takes over
without a copy (DLPack).

This module is the path from TensorFlow tensors to the engine and back that needs none
of hvdlite's graph ops: NumPy arrays in, a batch of requests submitted together, results
out (:func:`_execute`); the conversions between tensors and arrays; and the names of the
requests. The graph path (:mod:`hvdlite.tensorflow.graph`) makes the same requests, and
its ``py_function`` fallback runs this module's code inside the graph.

Input that only this rank cannot use (a dtype that cannot be reduced, a 0-d tensor to
gather, an op Horovod refuses, alltoall splits that do not fit) is refused on every
rank, not raised here alone: the other ranks run the same batch and would wait for it
(see :func:`_submit`).
"""
from __future__ import annotations

import re
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
from hvdlite.common.codes import Sum
from hvdlite.common.exceptions import HvdliteError, HvdliteValueError, refusal_error_for
from hvdlite.common.handles import Handle
from hvdlite.tensorflow.errors import _as_tf_error

_no_autograph = tf.autograph.experimental.do_not_convert  # our ops are not user code

# NumPy's bfloat16 (from ml_dtypes, which TensorFlow ships), as results carry it.
_BF16 = _codes.NP_DTYPE_OF_NAME.get("bfloat16")


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
