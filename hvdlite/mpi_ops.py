"""Horovod's collectives over NumPy arrays (``import hvdlite as hvd``).

Anything NumPy can view without copying -- arrays, objects with the buffer protocol
or ``__dlpack__`` -- is accepted. Results are new NumPy arrays, except for the
in-place forms (``allreduce_``, ``broadcast_``) which write into the array given.
Unnamed calls get deterministic names, so ranks that issue the same sequence of
calls agree without naming anything.

GPU memory is accepted too: any object exposing ``__cuda_array_interface__`` (CuPy,
Numba, PyTorch) or ``__dlpack__`` on a CUDA device. Such a collective runs on the GPU
(NCCL), ordered after the producer's stream, and its result is a
:class:`hvdlite.DeviceArray` (exposing both interfaces) on the same device; the
in-place forms write into the object given, ordered before later work on its stream.
"""
from __future__ import annotations

from typing import Any, NoReturn, Sequence

import numpy as np

from hvdlite.common import basics as _basics, codes as _codes, device as _device, ops as _ops
from hvdlite.common.basics import _load_core
from hvdlite.common.device import DeviceArray, DeviceView
from hvdlite.common.codes import Average, Sum, Min, Max, Product, Adasum
from hvdlite.common.exceptions import HvdliteError, HvdliteValueError
from hvdlite.common.handles import Handle
from hvdlite.common.objects import allgather_object, broadcast_object
from hvdlite.common.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set

__all__ = [
    "Average", "Sum", "Min", "Max", "Product", "Adasum",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "barrier", "join", "poll", "synchronize", "broadcast_object", "allgather_object", "DeviceArray",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
]


# The request kind of each label's operation (a grouped allreduce's members are allreduces).
_KIND_OF = {**{v: k for k, v in _ops.KIND_NAMES.items()}, "grouped_allreduce": _ops.ALLREDUCE}


def _reject(what: "_label", problem: str) -> NoReturn:
    """Bad input on this rank: fail the collective on every rank (not only here, where
    the others would wait for it forever) and raise."""
    _ops.refuse(_KIND_OF[what.kind], what.name, problem)


def _dtype_name(arr: np.ndarray, what: Any) -> str:
    name = _ops.NAME_OF_NP_DTYPE.get(arr.dtype)
    if name is None:
        _reject(what, _unsupported(arr))
    return name


def _unsupported(arr: Any) -> str:
    return f"unsupported dtype {arr.dtype}; hvdlite supports {', '.join(_ops.DTYPES)}"


def _view(tensor: Any, in_place: bool) -> tuple[Any, str | None]:
    """``(array, None)``, or ``(None, problem)`` if `tensor` cannot be used. Out of
    place: a C-contiguous NumPy view (copied only if it is not contiguous; objects
    that only export DLPack are viewed through it). In place: `tensor` itself, which
    must be a writable C-contiguous NumPy array. GPU memory (see
    :mod:`hvdlite.common.device`) gives a :class:`DeviceView`, used where it lies."""
    if _device.is_device_array(tensor):
        return _device_view(tensor, in_place)
    if in_place:
        if not isinstance(tensor, np.ndarray):
            return None, f"the in-place form needs a NumPy array, got {type(tensor).__name__}"
        if tensor.dtype not in _ops.NAME_OF_NP_DTYPE:
            return None, _unsupported(tensor)
        flags = tensor.flags
        if not flags.c_contiguous or not flags.writeable:
            return None, ("the in-place form needs a writable C-contiguous array "
                          "(use the out-of-place form, or np.ascontiguousarray first)")
        return tensor, None
    try:
        arr = np.asarray(tensor)
        if arr.dtype == object and hasattr(tensor, "__dlpack__"):  # DLPack only
            arr = np.from_dlpack(tensor)
    except Exception as exc:
        return None, f"cannot view {type(tensor).__name__} as an array: {exc}"
    if arr.dtype not in _ops.NAME_OF_NP_DTYPE:
        return None, _unsupported(arr)
    # order="C" copies only when needed and, unlike ascontiguousarray, keeps 0-d shapes.
    return np.asarray(arr, order="C"), None


def _device_view(tensor: Any, in_place: bool) -> tuple[DeviceView | None, str | None]:
    view, problem = _device.view(tensor, _load_core())
    if problem is not None:
        return None, problem
    if view.dtype not in _ops.NAME_OF_NP_DTYPE:
        return None, _unsupported(view)
    if in_place and view.readonly:
        return None, "the in-place form needs writable memory (the device array is read-only)"
    return view, None


def _checked(tensor: Any, what: Any, in_place: bool = False) -> Any:
    """:func:`_view`, failing the collective on every rank if `tensor` cannot be used."""
    arr, problem = _view(tensor, in_place)
    if problem is not None:
        _reject(what, problem)
    return arr


def _raw(arr: Any) -> _ops.RawTensor:
    if type(arr) is DeviceView:
        return _ops.RawTensor(arr.ptr, _ops.NAME_OF_NP_DTYPE[arr.dtype], arr.shape, arr.device, arr.stream)
    # The engine reads the address through the buffer protocol: ~10x cheaper than
    # arr.ctypes.data or arr.__array_interface__.
    return _ops.RawTensor(_load_core().address(arr), _ops.NAME_OF_NP_DTYPE[arr.dtype], arr.shape)


def _output_like(arr: Any) -> tuple[Any, _ops.RawTensor]:
    """A new result of `arr`'s shape and type, where `arr` lives, and its raw form: a
    NumPy array, or a :class:`DeviceArray` on `arr`'s GPU."""
    if type(arr) is not DeviceView:
        out = np.empty_like(arr)
        return out, _raw(out)
    name = _ops.NAME_OF_NP_DTYPE[arr.dtype]
    nbytes = arr.dtype.itemsize * int(np.prod(arr.shape, dtype=np.int64))
    try:
        result = _load_core().allocate_device(arr.device, nbytes, list(arr.shape), _ops.DTYPES[name])
    except RuntimeError as exc:  # the engine stopped: raise why
        _ops.raise_engine_error(exc)
    out = DeviceArray(result, arr.shape, arr.dtype)
    # Written by hvdlite on its own stream, after the input's producer: nothing to wait for.
    return out, _ops.RawTensor(out.ptr, name, arr.shape, arr.device, None)


def _order_consumer(req: _ops.Request, arr: Any) -> None:
    """A GPU collective on the caller's device array, read or written in place: order
    the array's own stream after the collective (later work there, reuse of its memory
    included, waits for hvdlite), or wait on the host if the array named no stream."""
    if type(arr) is DeviceView and arr.stream is None:
        req.sync_host = True  # (a stream named is ordered by submit itself)


def _user_object(arr: Any) -> Any:
    """What an in-place call returns: the caller's own object."""
    return arr.owner if type(arr) is DeviceView else arr


_ALLREDUCE, _BROADCAST = _ops.ALLREDUCE, _ops.BROADCAST  # one lookup each on the direct path
_empty = np.empty  # a C-contiguous result, a global lookup (not two) and no layout to copy


def _direct_run(kind: int, tensor: Any, output: Any, name: str | None, average: bool | None,
                op: int | None, prescale_factor: float, postscale_factor: float, root_rank: int) -> bool:
    """Run a blocking collective straight from the public function if it is the common
    case: a NumPy array of a supported dtype, a name, a supported op, no dropped handles
    to reap, the engine running, arrays usable as they are. False, having done nothing,
    otherwise; the caller then takes its full path, which copies, names, checks and
    raises.

    The engine's ``direct_run`` does all of it in C, and once the engine is loaded this
    module's ``_direct_run`` *is* that function: right after a large collective has
    flushed the CPU caches, every Python-level call and lookup between the user's call
    and the engine costs about a microsecond (docs/architecture.md, "One call for a
    blocking NumPy collective"). This stand-in
    binds the engine's function at the first call (the engine's module is loaded with
    this one, for its codes; a stand-in that finds it not loaded declines)."""
    global _direct_run
    core = _basics._core_module
    if core is None:
        return False
    core.set_direct_inputs(np.ndarray,
                           [(dt, _ops.DTYPES[n]) for dt, n in _ops.NAME_OF_NP_DTYPE.items()],
                           _ops._orphans)
    _direct_run = core.direct_run
    return _direct_run(kind, tensor, output, name, average, op, prescale_factor, postscale_factor, root_rank)


# Whether a collective runs on the global set: no process_set given and none set by an
# enclosing scope (``broadcast(..., process_set=ps)`` calls ``broadcast_`` inside one).
# Only then may it take _direct_run, which submits to the global set's engine. Written
# out at each call site, `process_set is None and _SCOPE.process_set is None`: a helper
# function cost 0.2 us a call, 4 % of a lone 4 KiB allreduce.
_SCOPE = _ops._scope


def _run(kind: int, arr: np.ndarray, out: np.ndarray | None, name: str | None, op: int = Sum,
         prescale_factor: float = 1.0, postscale_factor: float = 1.0, root_rank: int = -1) -> None:
    """The blocking path: one request on `arr` (result into `out`; in place if it is `arr`).
    The engine checks that the arrays are contiguous, and writable where written."""
    dtype = _ops.NAME_OF_NP_DTYPE.get(arr.dtype)
    if dtype is None:
        _dtype_name(arr, _label(_ops.KIND_NAMES[kind], name))  # raises, naming the dtype
    _ops.run(kind, arr, out, dtype, name=name, op=op, prescale_factor=prescale_factor,
             postscale_factor=postscale_factor, root_rank=root_rank)


def _engine_output(parts: Sequence[_ops.Request]) -> Any:
    data, shape, dtype = parts[0].output()
    if not isinstance(data, np.ndarray):  # a GPU result
        return DeviceArray(data, shape, _codes.np_dtype(dtype))
    return data.view(_codes.np_dtype(dtype)).reshape(shape)


def _returns(result: Any) -> Any:
    """A handle's finish function that returns `result`: the array the engine writes
    into (or the list of them, for a group)."""
    return lambda _parts: result


class _label:
    """What a message calls the operation; formatted only when an error is raised."""
    __slots__ = ("kind", "name")

    def __init__(self, kind: str, name: str | None) -> None:
        self.kind, self.name = kind, name

    def __str__(self) -> str:
        return f"{self.kind} '{self.name}'" if self.name else self.kind

    __format__ = lambda self, spec: format(str(self), spec)  # noqa: E731


# ---- allreduce ----------------------------------------------------------------------

def allreduce_async(tensor: Any, average: bool | None = None, name: str | None = None,
                    op: int | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set: Any = None) -> Handle:
    """Start reducing `tensor` across ranks; `synchronize(handle)` returns a new array.
    The default op is Average, as in Horovod."""
    with _ops.process_set_scope(process_set):
        op = _ops.resolve_op(op, average)
        inp = _checked(tensor, _label("allreduce", name))
        out, out_raw = _output_like(inp)
        req = _ops.submit(_ops.ALLREDUCE, _raw(inp), out_raw, name=name, op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          keepalive=(inp, out))
        _order_consumer(req, inp)
        return Handle([req], _returns(out), req.name)


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None, op: int | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = None) -> Any:
    """Reduce `tensor` across ranks (default: Average) and return the result."""
    if process_set is None and _SCOPE.process_set is None and type(tensor) is np.ndarray:
        out = _empty(tensor.shape, tensor.dtype)
        if _direct_run(_ALLREDUCE, tensor, out, name, average, op, prescale_factor, postscale_factor, -1):
            return out
    with _ops.process_set_scope(process_set):
        if _device.is_device_array(tensor):
            return _blocking_wait(allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor))
        op = _ops.resolve_op(op, average)
        inp = _checked(tensor, _label("allreduce", name))
        out = np.empty_like(inp)
        _run(_ops.ALLREDUCE, inp, out, name, op, prescale_factor, postscale_factor)
        return out


@_ops.blocking
def _blocking_wait(handle: Handle) -> Any:
    return handle.wait()


def allreduce_async_(tensor: Any, average: bool | None = None, name: str | None = None,
                     op: int | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, process_set: Any = None) -> Handle:
    """In-place form of :func:`allreduce_async`: the result overwrites `tensor`."""
    with _ops.process_set_scope(process_set):
        op = _ops.resolve_op(op, average)
        arr = _checked(tensor, _label("allreduce", name), in_place=True)
        raw = _raw(arr)
        req = _ops.submit(_ops.ALLREDUCE, raw, raw, name=name, op=op, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, keepalive=arr)
        _order_consumer(req, arr)
        return Handle([req], _returns(_user_object(arr)), req.name)


def allreduce_(tensor: Any, average: bool | None = None, name: str | None = None,
               op: int | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set: Any = None) -> Any:
    """Reduce `tensor` across ranks in place and return it."""
    if process_set is None and _SCOPE.process_set is None and _direct_run(
            _ALLREDUCE, tensor, tensor, name, average, op, prescale_factor, postscale_factor, -1):
        return tensor
    with _ops.process_set_scope(process_set):
        if _device.is_device_array(tensor):
            return _blocking_wait(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor))
        op = _ops.resolve_op(op, average)
        arr = tensor if type(tensor) is np.ndarray else _checked(tensor, _label("allreduce", name), in_place=True)
        _run(_ops.ALLREDUCE, arr, arr, name, op, prescale_factor, postscale_factor)
        return arr


def _grouped(tensors: Sequence[Any], inplace: bool, average: bool | None, name: str | None,
             op: int | None, prescale_factor: float, postscale_factor: float) -> Handle:
    op = _ops.resolve_op(op, average, stacklevel=4)
    gid = _ops.new_group_id()
    base = name if name is not None else _ops.auto_name("grouped_allreduce")
    names = [f"{base}.{i}" for i in range(len(tensors))]
    # The other ranks submit the whole group: a member this rank cannot use fails every
    # member everywhere.
    arrays = _ops.stage_or_refuse(_ops.ALLREDUCE, names, tensors,
                                  lambda t: _usable(t, inplace), group_id=gid, op=op)
    requests, outputs = [], []
    for label, arr in zip(names, arrays):
        if inplace:
            out, out_raw = _user_object(arr), _raw(arr)
        else:
            out, out_raw = _output_like(arr)
        req = _ops.submit(_ops.ALLREDUCE, _raw(arr), out_raw, name=label, op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          group_id=gid, group_size=len(tensors), keepalive=(arr, out))
        _order_consumer(req, arr)
        requests.append(req)
        outputs.append(out)
    return Handle(requests, _returns(outputs), base)


def _usable(tensor: Any, in_place: bool) -> np.ndarray:
    """:func:`_view`, raising the problem (for :func:`hvdlite.common.ops.stage_or_refuse`)."""
    arr, problem = _view(tensor, in_place)
    if problem is not None:
        raise HvdliteError(problem)
    return arr


def grouped_allreduce_async(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                            op: int | None = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set: Any = None) -> Handle:
    """Reduce a list of tensors as one unit: negotiated together and fused."""
    with _ops.process_set_scope(process_set):
        return _grouped(tensors, False, average, name, op, prescale_factor, postscale_factor)


@_ops.blocking
def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                      op: int | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: Any = None) -> list[np.ndarray]:
    """Reduce a list of tensors as one unit (negotiated together and fused) and return
    the results as new arrays, in the order given (default op: Average)."""
    with _ops.process_set_scope(process_set):
        return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor, postscale_factor))


def grouped_allreduce_async_(tensors: Sequence[np.ndarray], average: bool | None = None,
                             name: str | None = None, op: int | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: Any = None) -> Handle:
    """Start reducing a list of arrays as one unit, each in place; ``synchronize(handle)``
    returns them."""
    with _ops.process_set_scope(process_set):
        return _grouped(tensors, True, average, name, op, prescale_factor, postscale_factor)


@_ops.blocking
def grouped_allreduce_(tensors: Sequence[np.ndarray], average: bool | None = None, name: str | None = None,
                       op: int | None = None, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0, process_set: Any = None) -> list[np.ndarray]:
    """Reduce a list of arrays as one unit, each in place, and return them."""
    with _ops.process_set_scope(process_set):
        return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor))


# ---- allgather, broadcast, alltoall, reducescatter ------------------------------------

def allgather_async(tensor: Any, name: str | None = None, process_set: Any = None) -> Handle:
    """Concatenate every rank's `tensor` along the first dimension (which may differ)."""
    with _ops.process_set_scope(process_set):
        inp = _checked(tensor, _label("allgather", name))
        req = _ops.submit(_ops.ALLGATHER, _raw(inp), name=name, keepalive=inp)
        _order_consumer(req, inp)
        return Handle([req], _engine_output, req.name)


@_ops.blocking
def allgather(tensor: Any, name: str | None = None, process_set: Any = None) -> np.ndarray:
    """Concatenate every rank's `tensor` along the first dimension (whose size may differ
    between ranks), in rank order, and return the result on every rank."""
    with _ops.process_set_scope(process_set):
        return synchronize(allgather_async(tensor, name))


def broadcast_async_(tensor: Any, root_rank: int, name: str | None = None, process_set: Any = None) -> Handle:
    """Overwrite `tensor` with root_rank's value, in place."""
    with _ops.process_set_scope(process_set):
        arr = _checked(tensor, _label("broadcast", name), in_place=True)
        req = _ops.submit(_ops.BROADCAST, _raw(arr), name=name, root_rank=int(root_rank), keepalive=arr)
        _order_consumer(req, arr)
        return Handle([req], _returns(_user_object(arr)), req.name)


def broadcast_(tensor: Any, root_rank: int, name: str | None = None, process_set: Any = None) -> Any:
    """Overwrite `tensor` with root_rank's value, in place, and return it."""
    if process_set is None and _SCOPE.process_set is None and _direct_run(
            _BROADCAST, tensor, tensor, name, None, Sum, 1.0, 1.0, root_rank):
        return tensor
    with _ops.process_set_scope(process_set):
        if _device.is_device_array(tensor):
            return _blocking_wait(broadcast_async_(tensor, root_rank, name))
        arr = tensor if type(tensor) is np.ndarray else _checked(tensor, _label("broadcast", name), in_place=True)
        _run(_ops.BROADCAST, arr, None, name, root_rank=int(root_rank))
        return arr


def broadcast_async(tensor: Any, root_rank: int, name: str | None = None, process_set: Any = None) -> Handle:
    """Return root_rank's value of `tensor` as a new array; `tensor` is not modified."""
    with _ops.process_set_scope(process_set):
        arr = _checked(tensor, _label("broadcast", name))
        if type(arr) is not DeviceView:
            return broadcast_async_(np.array(arr, copy=True), root_rank, name)
        # A copy on the GPU, on hvdlite's stream after the producer's work; the broadcast
        # follows on the same stream.
        out, raw = _output_like(arr)
        try:
            _load_core().copy_on_device(arr.device, out.ptr, arr.ptr, out.nbytes, arr.stream)
        except RuntimeError as exc:
            _ops.raise_engine_error(exc)
        req = _ops.submit(_ops.BROADCAST, raw, name=name, root_rank=int(root_rank), keepalive=(arr, out))
        _order_consumer(req, arr)  # the copy read `arr` on hvdlite's stream
        return Handle([req], _returns(out), req.name)


def broadcast(tensor: Any, root_rank: int, name: str | None = None, process_set: Any = None) -> Any:
    """Return root_rank's value of `tensor` as a new array; `tensor` is not modified."""
    with _ops.process_set_scope(process_set):
        if _device.is_device_array(tensor):
            return _blocking_wait(broadcast_async(tensor, root_rank, name))
        return broadcast_(np.array(_checked(tensor, _label("broadcast", name)), copy=True), root_rank, name)


def alltoall_async(tensor: Any, splits: Sequence[int] | None = None, name: str | None = None,
                   process_set: Any = None) -> Handle:
    """Send rows of `tensor` to every rank: ``splits[r]`` rows to rank r (default: equal
    parts) and receive theirs, concatenated in rank order."""
    with _ops.process_set_scope(process_set):
        inp = _checked(tensor, _label("alltoall", name))
        sp = None
        if splits is not None:
            try:
                sp = [int(s) for s in np.asarray(splits).reshape(-1)]
            except (TypeError, ValueError) as exc:
                _ops.refuse(_ops.ALLTOALL, name, f"splits must be integers ({exc})",
                            HvdliteValueError)
        req = _ops.submit(_ops.ALLTOALL, _raw(inp), name=name, splits=sp, keepalive=inp)
        _order_consumer(req, inp)
        if splits is None:
            return Handle([req], _engine_output, req.name)
        return Handle([req], lambda parts: (_engine_output(parts),
                                            np.asarray(parts[0].aux(), dtype=np.int32)), req.name)


@_ops.blocking
def alltoall(tensor: Any, splits: Sequence[int] | None = None, name: str | None = None, process_set: Any = None) -> Any:
    """Returns the received rows; with `splits`, also how many came from each rank."""
    with _ops.process_set_scope(process_set):
        return synchronize(alltoall_async(tensor, splits, name))


def reducescatter_async(tensor: Any, op: int = Average, name: str | None = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None) -> Handle:
    """Reduce `tensor` across ranks and give each rank one slice of the first dimension:
    rank r gets dim0 // size rows, plus one if r < dim0 % size."""
    with _ops.process_set_scope(process_set):
        inp = _checked(tensor, _label("reducescatter", name))
        req = _ops.submit(_ops.REDUCESCATTER, _raw(inp), name=name, op=op, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, keepalive=inp)
        _order_consumer(req, inp)
        return Handle([req], _engine_output, req.name)


@_ops.blocking
def reducescatter(tensor: Any, op: int = Average, name: str | None = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None) -> np.ndarray:
    """Reduce `tensor` across ranks and return this rank's slice of the first dimension:
    rank r gets dim0 // size rows, plus one if r < dim0 % size (default op: Average)."""
    with _ops.process_set_scope(process_set):
        return synchronize(reducescatter_async(tensor, op, name, prescale_factor, postscale_factor))


# ---- synchronization ------------------------------------------------------------------

def barrier(process_set: Any = None) -> None:
    """Return once every rank has called barrier()."""
    with _ops.process_set_scope(process_set):
        _ops.run(_ops.BARRIER, None, None, "uint8")


@_ops.blocking
def join() -> int:
    """Declare that this rank has no more data. Until every rank has joined, the other
    ranks' allreduces go ahead with zeros from this one (Average still divides by
    ``size()``, as in Horovod). Returns the rank that joined last."""
    req = _ops.submit(_ops.JOIN, _ops.EMPTY, name="join")
    return int(req.aux()[0])


def poll(handle: Handle) -> bool:
    """True once the operation behind `handle` has finished."""
    return handle.poll()


def synchronize(handle: Handle) -> Any:
    """Wait for `handle` and return its result; raises HvdliteError if it failed."""
    return handle.wait()
