"""Collective operations on ``torch.Tensor``, with Horovod's names and semantics.

Every operation has a blocking form (returns the result) and, where Horovod has one, an
``_async`` form that returns a handle at once; pass the handle to :func:`poll` or
:func:`synchronize`. Functions ending in ``_`` work in place on their argument.

Operations are matched across ranks by ``name``. Unnamed operations get generated names
that agree across ranks as long as every rank issues the same unnamed operations in the
same order.

Tensors: contiguous CPU tensors of uint8, int8, int32, int64, float16, bfloat16, float32
and float64 are handed to the engine without a copy. Anything else works too:

* non-contiguous tensors are copied to a contiguous buffer (in-place forms copy the
  result back into the original tensor);
* ``bool``, ``int16`` and complex tensors, and any other dtype, can be broadcast,
  allgathered and alltoall'ed (their bytes are moved as they are); reductions accept
  ``int16`` (computed in int32 and wrapped back, as 16-bit arithmetic wraps), ``bool`` with ``Min``/``Max`` (logical and/or) and
  complex tensors with ``Sum``/``Average``; other combinations raise ``TypeError``;
* CUDA tensors stay on their GPU: the collective runs with NCCL on hvdlite's own
  stream, ordered after the work queued so far on the current stream of the tensor's
  device; :func:`synchronize` orders the current stream after the collective without
  waiting on the host (``HOROVOD_GPU_OPERATIONS=MPI`` sends them through host memory
  and MPI instead). One GPU per process: pin it with ``torch.cuda.set_device``.

Input that one rank cannot use (a dtype the op cannot reduce, a sparse tensor, splits
that are not integers, an op only that rank asks for) fails the collective on every
rank, with a message naming that rank and the problem, instead of leaving the other
ranks waiting; on that rank the error is also the ``TypeError``, ``ValueError`` or
``NotImplementedError`` Horovod raises for such input.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from hvdlite.common import basics as _basics, codes as _codes, ops as _ops  # noqa: F401 (_basics: Horovod tests reach it)
from hvdlite.common.basics import rank, size
from hvdlite.common.codes import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 - Horovod's constants
from hvdlite.common.exceptions import HorovodInternalError, HvdliteError  # noqa: F401
from hvdlite.common.handles import Handle
from hvdlite.torch.compression import Compression, Compressor

# The torch dtypes the engine reduces, by the engine's name, and back.
_NATIVE: dict[torch.dtype, str] = _codes.framework_dtypes(torch)
_FROM_NAME: dict[str, torch.dtype] = {v: k for k, v in _NATIVE.items()}


# ---------------------------------------------------------------------------------------
# Staging: turning a user's tensor into engine memory and results back into tensors.


@dataclass
class _Stage:
    """A user's tensor as the engine sees it."""

    src: torch.Tensor              # the user's tensor
    eng: torch.Tensor              # contiguous tensor of a native dtype, on src's device
    dtype: str                     # engine dtype name of ``eng``
    shares: bool                   # ``eng`` aliases ``src``'s memory
    back: Callable[[torch.Tensor], torch.Tensor]  # engine-format tensor -> user's dtype/shape
    # The reduction the engine runs when it is not the caller's (op, prescale, postscale):
    # set for types reduced in a wider one, whose scaling ``back`` applies after narrowing.
    engine_reduction: tuple[int, float, float] | None = None

    def raw(self) -> _ops.RawTensor:
        return _raw(self.eng, self.dtype)

    def reduction(self, op: int, pre: float, post: float) -> tuple[int, float, float]:
        """The op and scale factors to hand the engine for this tensor."""
        return self.engine_reduction or (op, pre, post)

    def to_user_device(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.device == self.src.device else t.to(self.src.device)


def _request_name(kind: str, name: str | None) -> str:
    """The engine's name of a request: Horovod's PyTorch names, ``allreduce.NAME`` (the
    kind, a dot, the caller's name), which the timeline and error messages show; an
    unnamed request gets ``allreduce.noname.N``."""
    return f"{kind}.{name}" if name is not None else _ops.auto_name(kind)


# The current stream of a CUDA device as an int, read the way torch's compiled code
# reads it: without a torch.device and a torch.cuda.Stream object per call, which the
# public torch.cuda.current_stream() makes (absent from builds without CUDA).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(device: int) -> int:
    """The current stream of GPU `device` (a cudaStream_t)."""
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream


def _stream_of(t: torch.Tensor) -> int | None:
    """The current CUDA stream of `t`'s device; None for host memory."""
    return _current_stream(t.get_device()) if t.is_cuda else None


def _raw(t: torch.Tensor, dtype: str) -> _ops.RawTensor:
    """A contiguous tensor as the engine takes it. A CUDA tensor comes with the current
    stream of its device: the collective is ordered after the work queued there."""
    if t.is_cuda:
        device = t.get_device()
        return _ops.RawTensor(t.data_ptr(), dtype, tuple(t.shape), device, _current_stream(device))
    return _ops.RawTensor(t.data_ptr(), dtype, tuple(t.shape))


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A contiguous version of ``t`` on its own device (a view when it already is one).

    CUDA tensors stay on their GPU: a copy to make one contiguous is queued on the
    current stream, which the collective is ordered after."""
    if t.layout != torch.strided:
        raise TypeError(f"hvdlite collectives take dense tensors, got layout {t.layout}; for a "
                        f"sparse gradient use sparse_allreduce_async() or .to_dense()")
    return t.detach().contiguous()


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _modified(t: torch.Tensor) -> torch.Tensor:
    """Tell autograd that an in-place collective changed ``t`` (the engine wrote into its
    memory behind PyTorch's back), so that a backward pass that saved ``t`` before the
    change raises instead of silently using the new values."""
    torch.autograd.graph.increment_version(t)
    return t


def _stage_move(t: torch.Tensor) -> _Stage:
    """Stage for operations that only move data (broadcast, allgather, alltoall): any
    dtype works, since bytes are bytes. A 0-d tensor is treated as shape (1,)."""
    host = _to_host(t)
    shares = host.data_ptr() == t.data_ptr() and t.is_contiguous()
    if host.dim() == 0:
        host = host.reshape(1)
    if host.dtype in _NATIVE:
        return _Stage(t, host, _NATIVE[host.dtype], shares, _identity)
    dtype = host.dtype
    if dtype == torch.bool:
        eng = host.view(torch.uint8)
        return _Stage(t, eng, "uint8", shares, lambda r: r.view(torch.bool))
    if host.stride(-1) != 1:
        # Contiguous but with an odd stride on a dimension of size 0 or 1 (as from
        # NumPy): viewing it as bytes needs the canonical strides.
        host = torch.empty(host.shape, dtype=dtype, device=host.device).copy_(host)
        shares = False
    # Reinterpret as bytes: the last dimension grows by the element size, so dimension 0
    # (the rows that allgather and alltoall count) stays. A 1-D tensor gets a trailing
    # byte dimension, (rows,) -> (rows, itemsize), rather than becoming a row of bytes.
    if host.dim() == 1:
        eng = host.view(torch.uint8).reshape(host.shape[0], host.element_size())
        return _Stage(t, eng, "uint8", shares, lambda r: r.view(dtype).squeeze(-1))
    eng = host.view(torch.uint8)
    return _Stage(t, eng, "uint8", shares, lambda r: r.view(dtype))


def _scaled_int(t: torch.Tensor, factor: float) -> torch.Tensor:
    """An integer tensor times ``factor`` in double precision, truncated toward zero into
    its own dtype, as the engine scales integers."""
    return t if factor == 1.0 else (t.to(torch.float64) * factor).trunc().to(t.dtype)


def _stage_reduce(t: torch.Tensor, op: int, pre: float = 1.0, post: float = 1.0) -> _Stage:
    """Stage for reductions (allreduce, reducescatter). Raises TypeError for a tensor
    that cannot be reduced with `op` (the caller refuses it on every rank)."""
    host = _to_host(t)
    shares = host.data_ptr() == t.data_ptr() and t.is_contiguous()
    dtype = host.dtype
    if dtype in _NATIVE:
        return _Stage(t, host, _NATIVE[dtype], shares, _identity)
    if dtype == torch.bool:
        if op not in (Min, Max):
            raise TypeError(f"a bool tensor can only be reduced with Min (logical and) or Max "
                            f"(logical or), not {_ops.describe_op(op)}; convert it, e.g. "
                            f"tensor.to(torch.int32)")
        return _Stage(t, host.view(torch.uint8), "uint8", shares, lambda r: r.view(torch.bool))
    if dtype in (torch.int16, torch.uint16):
        # Reduced in int32, then narrowed, which wraps around as 16-bit arithmetic does.
        # Scaling (Average, the factors) applies to the 16-bit values, as for the engine's
        # own integer types: the input is prescaled here, the narrowed result scaled after.
        n = _ops.current_set_size()
        after = post / n if op == Average else post
        engine_op = Sum if op == Average else op
        return _Stage(t, _scaled_int(host, pre).to(torch.int32), "int32", False,
                      lambda r: _scaled_int(r.to(dtype), after), (engine_op, 1.0, 1.0))
    if dtype.is_complex:
        if op not in (Sum, Average):
            raise TypeError(f"complex tensors ({dtype}) can only be reduced with Sum or Average, "
                            f"not {_ops.describe_op(op)}")
        real = torch.view_as_real(host)
        return _Stage(t, real, _NATIVE[real.dtype], shares, lambda r: torch.view_as_complex(r))
    raise TypeError(f"dtype {dtype} cannot be reduced; supported dtypes: "
                    f"{', '.join(str(d) for d in _NATIVE)} (and int16, bool with Min/Max, "
                    f"complex with Sum/Average)")


def _engine_tensor(buf: Any, shape: Sequence[int], dtype_name: str) -> torch.Tensor:
    """Wrap engine-owned output bytes as a tensor without copying them: host bytes (a
    NumPy array), or GPU memory (the engine's DeviceResult, handed over by DLPack)."""
    if not isinstance(buf, np.ndarray):
        return torch.from_dlpack(buf.to_dlpack(list(shape), _codes.DTYPES[dtype_name]))
    if buf.size == 0:
        return torch.empty(tuple(shape), dtype=_FROM_NAME[dtype_name])
    with warnings.catch_warnings():
        # The bytes belong to this result alone, so writing to them is safe even when the
        # engine hands them over as a read-only buffer.
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(buf)
    return t.view(_FROM_NAME[dtype_name]).reshape(tuple(shape))


# ---------------------------------------------------------------------------------------
# Handles: hvdlite.common.handles.Handle. Where finishing does tensor arithmetic on the
# results (copies back, dtype conversions), it runs with autograd off.


class _TorchHandle(Handle):
    """A :class:`Handle` of the torch front end. Waiting for a collective on CUDA tensors
    orders the current stream of their device after it (as PyTorch's own collectives
    do with ``Work.wait()``): the host does not wait for the GPU, and the results may be
    used on that stream at once. The stream that was current when the collective was
    submitted is ordered too (so its later work cannot reuse the input's memory before
    hvdlite read it)."""

    __slots__ = ()

    def _complete(self) -> None:
        for part in self._parts:
            device = getattr(part, "device", _ops.CPU_DEVICE)
            if device != _ops.CPU_DEVICE:
                stream = _current_stream(device)
                part.reader = stream
                if stream not in part.consumers:
                    part.consumers = (*part.consumers, stream)
        super()._complete()


class _NoGradHandle(_TorchHandle):
    """A :class:`_TorchHandle` whose finish function runs under ``torch.no_grad()``."""

    __slots__ = ()

    def _run_finish(self) -> Any:
        with torch.no_grad():
            return super()._run_finish()


class _CallableHandle(_NoGradHandle):
    """Horovod's ``sparse_allreduce_async`` returns a function that finishes the
    reduction when called; this handle is such a function too (and a handle)."""

    __slots__ = ()

    def __call__(self) -> Any:
        return self.wait()


def poll(handle: Handle) -> bool:
    """True if the asynchronous operation behind ``handle`` has finished, so that
    :func:`synchronize` will return without blocking."""
    return handle.poll()


def synchronize(handle: Handle) -> Any:
    """Wait for an asynchronous operation and return its result: the output tensor (a
    list for grouped operations; ``(output, received_splits)`` for alltoall with splits).

    Raises :class:`HorovodInternalError` (``HvdliteError``) if the operation failed, for
    example because ranks submitted mismatching shapes under one name."""
    if not isinstance(handle, Handle):
        raise TypeError(f"synchronize() expects a handle returned by an hvdlite.torch "
                        f"_async function, got {type(handle).__name__}")
    return handle.wait()


# Horovod's rules for op= and the deprecated average=, as in every front end.
_resolve_op = _ops.resolve_op

# Staging a tensor may fail on this rank only (a dtype the op cannot reduce, a sparse
# tensor, bad splits). Every function below stages all tensors of a call through
# _ops.stage_or_refuse before it submits any: a failure refuses the whole call on every
# rank, and raises here an HvdliteError that is also the TypeError/ValueError the check
# raised, instead of leaving the other ranks waiting for this one.


# ---------------------------------------------------------------------------------------
# Allreduce


def _allreduce_submit(stages: list[_Stage], outputs: list[torch.Tensor], names: list[str], op: int,
                      prescale_factor: float, postscale_factor: float,
                      gid: int) -> list[_ops.Request]:
    parts = []
    gsize = len(stages) if gid >= 0 else 0
    for st, out, nm in zip(stages, outputs, names):
        sop, pre, post = st.reduction(op, prescale_factor, postscale_factor)
        parts.append(_ops.submit(
            _ops.ALLREDUCE, st.raw(), _raw(out, st.dtype),
            name=nm, op=sop, prescale_factor=pre, postscale_factor=post,
            group_id=gid, group_size=gsize, keepalive=(st, out)))
    return parts


def _allreduce_impl(tensors: list[torch.Tensor], name: str | None, op: int, prescale_factor: float,
                    postscale_factor: float, inplace: bool, grouped: bool,
                    group_id: int | None = None) -> Handle:
    kind = "grouped_allreduce" if grouped else "allreduce"
    base = _request_name(kind, name)
    if not grouped:
        t = tensors[0]
        dt = _NATIVE.get(t.dtype)
        if (dt is not None and (t.is_cpu or t.is_cuda) and t.layout == torch.strided and t.is_contiguous()
                and _ops.op_problem(op) is None):
            # Fast path: the engine reads (and for in-place ops writes) the tensor itself,
            # in host memory or on its GPU. Nothing here can fail on one rank alone, so
            # the staging that refuses a call on every rank is not needed.
            raw = _raw(t, dt)
            if inplace:
                out, out_raw = t, raw
            else:
                out = torch.empty_like(t, memory_format=torch.contiguous_format)
                out_raw = _ops.RawTensor(out.data_ptr(), dt, raw.shape, raw.device, raw.stream)
            part = _ops.submit(_ops.ALLREDUCE, raw, out_raw, name=base, op=op,
                               prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                               keepalive=(t, out))
            if inplace:
                return _TorchHandle([part], lambda _: _modified(out), base)
            return _TorchHandle([part], lambda _: out, base)
    names = [f"{base}.{i}" for i in range(len(tensors))] if grouped else [base]
    gid = -1
    if grouped:
        gid = _ops.new_group_id() if group_id is None else group_id
    stages = _ops.stage_or_refuse(_ops.ALLREDUCE, names, tensors,
                                  lambda t: _stage_reduce(t, op, prescale_factor, postscale_factor), gid, op)
    outputs = []
    for st in stages:
        if inplace:
            outputs.append(st.eng)  # reduce in the staged buffer (the tensor itself if shared)
        else:
            outputs.append(torch.empty_like(st.eng))
    parts = _allreduce_submit(stages, outputs, names, op, prescale_factor, postscale_factor, gid)

    def finish(_: list[_ops.Request]) -> Any:
        results = []
        for st, out in zip(stages, outputs):
            if inplace:
                if not st.shares:
                    st.src.copy_(st.to_user_device(st.back(out)))
                results.append(_modified(st.src))
            else:
                results.append(st.to_user_device(st.back(out)))
        return results if grouped else results[0]

    return _NoGradHandle(parts, finish, base)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: int | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set: Any = None) -> Handle:
    """Start reducing ``tensor`` over all ranks into a new tensor; ``tensor`` is not
    modified. ``op`` is ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``;
    ``prescale_factor``/``postscale_factor`` multiply the input before and the result after
    the reduction. Returns a handle for :func:`synchronize`."""
    with _ops.process_set_scope(process_set):
        return _allreduce_impl([tensor], name, _resolve_op(op, average), prescale_factor,
                               postscale_factor, inplace=False, grouped=False)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: int | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, process_set: Any = None) -> Handle:
    """In-place form of :func:`allreduce_async`: the result is written into ``tensor``."""
    with _ops.process_set_scope(process_set):
        return _allreduce_impl([tensor], name, _resolve_op(op, average), prescale_factor,
                               postscale_factor, inplace=True, grouped=False)


@_ops.blocking
def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: Any = None) -> torch.Tensor:
    """Reduce ``tensor`` over all ranks in place and return it (not differentiable)."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def _keeps_process_set(fn: type) -> type:
    """Class decorator for an autograd Function: its backward runs its collectives on
    the process set its forward ran on (backward runs later, outside the caller's
    :class:`~hvdlite.common.ops.process_set_scope`)."""
    forward, backward = fn.forward, fn.backward

    def forward_on_set(ctx: Any, *args: Any) -> Any:
        ctx.hvd_process_set = _ops.current_process_set()
        return forward(ctx, *args)

    def backward_on_set(ctx: Any, *grads: Any) -> Any:
        with _ops.process_set_scope(ctx.hvd_process_set):
            return backward(ctx, *grads)

    fn.forward = staticmethod(forward_on_set)
    fn.backward = staticmethod(backward_on_set)
    return fn


@_keeps_process_set
class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: int, pre: float,
                post: float) -> torch.Tensor:
        ctx.op, ctx.pre, ctx.post, ctx.name = op, pre, post, name
        out = synchronize(_allreduce_impl([tensor], name, op, pre, post, False, False))
        if op in (Min, Max, Product):
            ctx.save_for_backward(tensor, out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        gname = None if ctx.name is None else ctx.name + ".grad"
        if ctx.op in (Sum, Average):
            g = allreduce(grad, name=gname, op=ctx.op, prescale_factor=ctx.pre,
                          postscale_factor=ctx.post)
        else:
            x, out = ctx.saved_tensors
            total = allreduce(grad, name=gname, op=Sum)
            if ctx.op == Product:
                g = total * (out / x)
            else:
                g = total * ((x * ctx.pre * ctx.post) == out).to(grad.dtype) * ctx.pre * ctx.post
        return g, None, None, None, None


@_ops.blocking
def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: int | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = None) -> torch.Tensor:
    """Reduce ``tensor`` over all ranks and return the result as a new tensor.

    Differentiable: the gradient of ``Sum``/``Average`` is the same reduction of the
    incoming gradients (as in Horovod); for ``Min``/``Max`` the summed gradient flows to
    the ranks whose value is the extreme one, for ``Product`` it is scaled by
    ``result / input`` (so it is undefined where the input is zero)."""
    with _ops.process_set_scope(process_set):
        op = _resolve_op(op, average)
        compressed, cctx = compression.compress(tensor)
        out = _AllreduceFn.apply(compressed, name, op, float(prescale_factor), float(postscale_factor))
        return compression.decompress(out, cctx)


@_keeps_process_set
class _GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: int, pre: float, post: float,
                *tensors: torch.Tensor) -> Any:
        ctx.op, ctx.pre, ctx.post, ctx.name = op, pre, post, name
        if op not in (Sum, Average):
            ctx.save_for_backward(*tensors)
        return tuple(synchronize(_allreduce_impl(list(tensors), name, op, pre, post, False, True)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        if ctx.op not in (Sum, Average):
            raise NotImplementedError("grouped_allreduce is differentiable only for Sum and Average")
        gname = None if ctx.name is None else ctx.name + ".grad"
        g = grouped_allreduce(list(grads), name=gname, op=ctx.op, prescale_factor=ctx.pre,
                              postscale_factor=ctx.post)
        return (None, None, None, None, *g)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: int | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: Any = None) -> Handle:
    """Start reducing a list of tensors as one unit (negotiated and fused together).
    :func:`synchronize` returns the list of results; inputs are not modified."""
    with _ops.process_set_scope(process_set):
        return _allreduce_impl(list(tensors), name, _resolve_op(op, average), prescale_factor,
                               postscale_factor, inplace=False, grouped=True)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: int | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: Any = None) -> Handle:
    """In-place form of :func:`grouped_allreduce_async`."""
    with _ops.process_set_scope(process_set):
        return _allreduce_impl(list(tensors), name, _resolve_op(op, average), prescale_factor,
                               postscale_factor, inplace=True, grouped=True)


@_ops.blocking
def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: int | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = None) -> list[torch.Tensor]:
    """Reduce a list of tensors in place as one unit; returns the list."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


@_ops.blocking
def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None,
                      name: str | None = None, compression: type[Compressor] = Compression.none,
                      op: int | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: Any = None) -> list[torch.Tensor]:
    """Reduce a list of tensors as one unit and return new tensors (differentiable for
    Sum and Average)."""
    with _ops.process_set_scope(process_set):
        op = _resolve_op(op, average)
        if not tensors:
            return []
        pairs = [compression.compress(t) for t in tensors]
        outs = _GroupedAllreduceFn.apply(name, op, float(prescale_factor), float(postscale_factor),
                                         *[p[0] for p in pairs])
        return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: int,
                           process_set: Any = None) -> Handle:
    """Reduce a sparse COO tensor by gathering every rank's indices and values; the result
    is an uncoalesced sparse tensor (divided by the number of ranks for ``Average``)."""
    with _ops.process_set_scope(process_set):
        parts = [f"{name}.indices", f"{name}.values"]  # the allgathers' names
        names = [_request_name("allgather", part) for part in parts]  # ... as the engine knows them

        def rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            if op not in (Sum, Average):
                raise NotImplementedError(f"sparse allreduce supports only Sum and Average, not "
                                          f"{_ops.describe_op(op)}")
            t = x.coalesce() if not x.is_coalesced() else x
            return t, t._indices().transpose(0, 1).contiguous(), t._values().contiguous()

        [(t, indices, values)] = _ops.stage_or_refuse(_ops.ALLGATHER, names, [tensor], rows)
        idx = allgather_async(indices, name=parts[0])
        val = allgather_async(values, name=parts[1])

        ranks = _ops.current_size()

        def finish(_: list[Handle]) -> torch.Tensor:
            values = synchronize(val)
            indices = synchronize(idx)
            if op == Average:
                values = values / ranks
            return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(),
                                           check_invariants=False)

        return _CallableHandle([idx, val], finish, name)


# ---------------------------------------------------------------------------------------
# Allgather


def _allgather_impl(tensor: torch.Tensor, name: str | None) -> Handle:
    nm = _request_name("allgather", name)
    [st] = _ops.stage_or_refuse(_ops.ALLGATHER, [nm], [tensor], _stage_move)
    return _allgather_staged(st, nm)


def _allgather_staged(st: _Stage, nm: str) -> Handle:
    part = _ops.submit(_ops.ALLGATHER, st.raw(), name=nm, keepalive=st)

    def finish(parts: list[_ops.Request]) -> torch.Tensor:
        buf, shape, dt = parts[0].output()
        return st.to_user_device(st.back(_engine_tensor(buf, shape, dt)))

    return _NoGradHandle([part], finish, nm)


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: Any = None) -> Handle:
    """Start concatenating ``tensor`` from all ranks along dimension 0 (ranks may
    differ in the size of dimension 0 only). A 0-d tensor counts as shape ``(1,)``."""
    with _ops.process_set_scope(process_set):
        return _allgather_impl(tensor, name)


@_keeps_process_set
class _AllgatherFn(torch.autograd.Function):
    """Allgather of one tensor or of a group. Backward (Horovod's rule): each input's
    gradient is its own rows of the output's gradient averaged over ranks; the averages
    are one grouped allreduce, and every rank's row counts come from one allgather."""

    @staticmethod
    def forward(ctx: Any, name: str | None, *tensors: torch.Tensor) -> Any:
        ctx.dim0s = [t.shape[0] if t.dim() > 0 else 1 for t in tensors]
        ctx.name = name
        if len(tensors) == 1:
            return (synchronize(_allgather_impl(tensors[0], name)),)
        return tuple(synchronize(_grouped_allgather_impl(tensors, name)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        gname = None if ctx.name is None else ctx.name + ".grad"
        reduced = grouped_allreduce(list(grads), name=gname, op=Average)
        dims = allgather(torch.tensor([ctx.dim0s], dtype=torch.int64),
                         name=None if gname is None else gname + ".dims")
        offsets = dims[: _ops.current_rank()].sum(0).tolist()
        return (None, *[r.narrow(0, int(o), d) for r, o, d in zip(reduced, offsets, ctx.dim0s)])


@_ops.blocking
def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    """Concatenate ``tensor`` from all ranks along dimension 0 and return the result.

    Differentiable as in Horovod: the gradient is the average over ranks of the
    incoming gradients, sliced to this rank's rows."""
    with _ops.process_set_scope(process_set):
        return _AllgatherFn.apply(name, tensor)[0]


def _grouped_allgather_impl(tensors: Sequence[torch.Tensor], name: str | None) -> Handle:
    base = _request_name("grouped_allgather", name)
    names = [f"{base}.{i}" for i in range(len(tensors))]
    stages = _ops.stage_or_refuse(_ops.ALLGATHER, names, tensors, _stage_move)
    subs = [_allgather_staged(st, nm) for st, nm in zip(stages, names)]
    return _TorchHandle(subs, lambda _: [h.wait() for h in subs], base)


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: Any = None) -> Handle:
    """Start allgathering each tensor of a list; :func:`synchronize` returns a list."""
    with _ops.process_set_scope(process_set):
        return _grouped_allgather_impl(tensors, name)


@_ops.blocking
def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: Any = None) -> list[torch.Tensor]:
    """Allgather each tensor of a list; differentiable like :func:`allgather`."""
    with _ops.process_set_scope(process_set):
        if not tensors:
            return []
        return list(_AllgatherFn.apply(name, *tensors))


# ---------------------------------------------------------------------------------------
# Broadcast


def _broadcast_impl(tensor: torch.Tensor, root_rank: int, name: str | None, inplace: bool) -> Handle:
    nm = _request_name("broadcast", name)
    [st] = _ops.stage_or_refuse(_ops.BROADCAST, [nm], [tensor], _stage_move)
    buf = st.eng if (inplace or not st.shares) else st.eng.clone()
    raw = _raw(buf, st.dtype)
    part = _ops.submit(_ops.BROADCAST, raw, name=nm, root_rank=int(root_rank), keepalive=(st, buf))

    def finish(_: list[_ops.Request]) -> torch.Tensor:
        result = st.back(buf).reshape(tensor.shape)
        if inplace:
            if not (st.shares and buf is st.eng):
                st.src.copy_(st.to_user_device(result))
            return _modified(st.src)
        return st.to_user_device(result)

    return _NoGradHandle([part], finish, nm)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: Any = None) -> Handle:
    """Start sending ``tensor`` from ``root_rank`` to all ranks; the result is a new
    tensor and ``tensor`` is not modified."""
    with _ops.process_set_scope(process_set):
        return _broadcast_impl(tensor, root_rank, name, inplace=False)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: Any = None) -> Handle:
    """In-place form of :func:`broadcast_async`: ``tensor`` receives root's value."""
    with _ops.process_set_scope(process_set):
        return _broadcast_impl(tensor, root_rank, name, inplace=True)


@_ops.blocking
def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: Any = None) -> torch.Tensor:
    """Overwrite ``tensor`` with its value on ``root_rank`` and return it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


@_keeps_process_set
class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None) -> torch.Tensor:
        ctx.root_rank, ctx.name = root_rank, name
        return synchronize(_broadcast_impl(tensor, root_rank, name, inplace=False))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        gname = None if ctx.name is None else ctx.name + ".grad"
        reduced = allreduce(grad, name=gname, op=Average)
        if rank() != ctx.root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None


@_ops.blocking
def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: Any = None) -> torch.Tensor:
    """Return ``root_rank``'s value of ``tensor`` on every rank (a new tensor).

    Differentiable as in Horovod: the root receives the average over ranks of the
    incoming gradients, the other ranks a zero gradient."""
    with _ops.process_set_scope(process_set):
        return _BroadcastFn.apply(tensor, int(root_rank), name)


# ---------------------------------------------------------------------------------------
# Alltoall


def _splits_list(splits: Any) -> list[int] | None:
    """`splits` as a list of ints; ValueError if it is not a sequence of integers. (How
    many, whether negative, whether they add up: checked against the other ranks'.)"""
    if splits is None:
        return None
    try:
        if isinstance(splits, torch.Tensor):
            if splits.is_floating_point() or splits.is_complex() or splits.dtype == torch.bool:
                raise ValueError(f"splits must hold integers (int32 or int64), not {splits.dtype}")
            return [int(s) for s in splits.reshape(-1).tolist()]
        return [int(s) for s in splits]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"splits must be a sequence of integers, got {splits!r} ({exc})") from None


def _stage_alltoall(t: torch.Tensor, splits: Any) -> tuple[_Stage, list[int] | None]:
    """The tensor staged and its splits checked here, where Horovod checks them (a
    ValueError, refused on every rank): integers, one per rank, none negative, adding
    up to no more than the first dimension; without splits, a first dimension that the
    number of ranks divides."""
    sp = _splits_list(splits)
    n = _ops.current_size()
    rows = t.shape[0] if t.dim() > 0 else 1
    if sp is None:
        if rows % n:
            raise ValueError(f"alltoall without splits divides the first dimension evenly among the "
                             f"{n} ranks, but it is {rows}; pass splits")
    elif len(sp) != n or any(s < 0 for s in sp) or sum(sp) > rows:
        raise ValueError(f"splits {sp} must have one non-negative entry per rank ({n}) adding up to "
                         f"at most the first dimension ({rows})")
    return _stage_move(t), sp


def _alltoall_impl(tensor: torch.Tensor, splits: Any, name: str | None) -> Handle:
    nm = _request_name("alltoall", name)
    [(st, sp)] = _ops.stage_or_refuse(_ops.ALLTOALL, [nm], [tensor],
                                      lambda t: _stage_alltoall(t, splits))
    part = _ops.submit(_ops.ALLTOALL, st.raw(), name=nm, splits=sp, keepalive=st)

    def finish(parts: list[_ops.Request]) -> tuple[torch.Tensor, torch.Tensor]:
        buf, shape, dt = parts[0].output()
        out = st.to_user_device(st.back(_engine_tensor(buf, shape, dt)))
        received = torch.tensor(parts[0].aux(), dtype=torch.int32)
        return out, received

    return _NoGradHandle([part], finish, nm)


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: Any = None) -> Handle:
    """Start an alltoall: rows ``[sum(splits[:r]), sum(splits[:r+1]))`` of ``tensor``
    go to rank ``r`` (without ``splits``, dimension 0 is divided evenly and must be
    divisible by the number of ranks). :func:`synchronize` returns
    ``(output, received_splits)``."""
    with _ops.process_set_scope(process_set):
        return _alltoall_impl(tensor, splits, name)


@_keeps_process_set
class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None) -> Any:
        out, received = synchronize(_alltoall_impl(tensor, splits, name))
        ctx.received = received
        ctx.name = name
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *unused: Any) -> Any:
        gname = None if ctx.name is None else ctx.name + ".grad"
        g, _ = synchronize(_alltoall_impl(grad.contiguous(), ctx.received, gname))
        return g, None, None


@_ops.blocking
def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: Any = None) -> Any:
    """Scatter slices of ``tensor`` to all ranks and gather the slices they send here.

    Returns the gathered tensor, or ``(tensor, received_splits)`` when ``splits`` is given
    (as in Horovod). Differentiable: the gradient is sent back along the reverse route."""
    with _ops.process_set_scope(process_set):
        return _AlltoallFn.apply(tensor, splits, name)


# ---------------------------------------------------------------------------------------
# Reducescatter


def _stage_reducescatter(op: int, pre: float, post: float) -> Callable[[torch.Tensor], _Stage]:
    def stage(t: torch.Tensor) -> _Stage:
        if op not in (Sum, Average, Adasum):
            raise ValueError(f"reducescatter supports only Sum, Average and Adasum, not "
                             f"{_ops.describe_op(op)}")
        return _stage_reduce(t, op, pre, post)
    return stage


def _reducescatter_impl(tensor: torch.Tensor, name: str | None, op: int, pre: float,
                        post: float) -> Handle:
    nm = _request_name("reducescatter", name)
    [st] = _ops.stage_or_refuse(_ops.REDUCESCATTER, [nm], [tensor], _stage_reducescatter(op, pre, post))
    return _reducescatter_staged(st, nm, op, pre, post)


def _reducescatter_staged(st: _Stage, nm: str, op: int, pre: float, post: float) -> Handle:
    op, pre, post = st.reduction(op, pre, post)
    part = _ops.submit(_ops.REDUCESCATTER, st.raw(), name=nm, op=op, prescale_factor=pre,
                       postscale_factor=post, keepalive=st)

    def finish(parts: list[_ops.Request]) -> torch.Tensor:
        buf, shape, dt = parts[0].output()
        return st.to_user_device(st.back(_engine_tensor(buf, shape, dt)))

    return _NoGradHandle([part], finish, nm)


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: int = Average,
                        process_set: Any = None, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> Handle:
    """Start reducing ``tensor`` over all ranks and scattering the result along dimension
    0: rank ``r`` gets ``dim0 // size`` rows, plus one if ``r < dim0 % size``."""
    with _ops.process_set_scope(process_set):
        return _reducescatter_impl(tensor, name, op, float(prescale_factor), float(postscale_factor))


@_keeps_process_set
class _ReducescatterFn(torch.autograd.Function):
    """Reducescatter of one tensor or of a group: the backward pass gathers each output's
    gradient from every rank (all submitted before any is waited for) and scales it by
    Horovod's convention: the forward's pre- and postscale, times the number of ranks for
    Sum (so with Average, by the scales alone) -- the same factor Horovod's gradient has,
    in line with allreduce's gradient summing over the ranks."""

    @staticmethod
    def forward(ctx: Any, name: str | None, op: int, pre: float, post: float,
                *tensors: torch.Tensor) -> Any:
        ctx.op, ctx.pre, ctx.post = op, pre, post
        if len(tensors) == 1:
            ctx.grad_names = [None if name is None else f"{name}.grad"]
            return (synchronize(_reducescatter_impl(tensors[0], name, op, pre, post)),)
        ctx.grad_names = [None if name is None else f"{name}.{i}.grad" for i in range(len(tensors))]
        return tuple(synchronize(_grouped_reducescatter_impl(tensors, name, op, pre, post)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        handles = [allgather_async(g.contiguous(), name=n) for g, n in zip(grads, ctx.grad_names)]
        scale = ctx.pre * ctx.post * (1 if ctx.op == Average else _ops.current_size())
        gathered = [synchronize(h) for h in handles]
        return (None, None, None, None, *[g * scale if scale != 1.0 else g for g in gathered])


def _reducescatter_apply(tensors: Sequence[torch.Tensor], name: str | None,
                         compression: type[Compressor], op: int, pre: float,
                         post: float) -> list[torch.Tensor]:
    pairs = [compression.compress(t) for t in tensors]
    outs = _ReducescatterFn.apply(name, op, float(pre), float(post), *[p[0] for p in pairs])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


@_ops.blocking
def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: type[Compressor] = Compression.none, op: int = Average,
                  process_set: Any = None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` over all ranks (``Average`` or ``Sum``) and return this rank's
    share of rows (see :func:`reducescatter_async`).

    Differentiable: the gradient of every input row is the gradient of the output row it
    contributed to (gathered from its owner), scaled by ``1/size`` for ``Average``."""
    with _ops.process_set_scope(process_set):
        return _reducescatter_apply([tensor], name, compression, op, prescale_factor,
                                    postscale_factor)[0]


def _grouped_reducescatter_impl(tensors: Sequence[torch.Tensor], name: str | None, op: int,
                                pre: float, post: float) -> Handle:
    base = _request_name("grouped_reducescatter", name)
    names = [f"{base}.{i}" for i in range(len(tensors))]
    stages = _ops.stage_or_refuse(_ops.REDUCESCATTER, names, tensors, _stage_reducescatter(op, pre, post))
    subs = [_reducescatter_staged(st, nm, op, pre, post) for st, nm in zip(stages, names)]
    return _TorchHandle(subs, lambda _: [h.wait() for h in subs], base)


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: int = Average, process_set: Any = None,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Handle:
    """Start a reducescatter of each tensor of a list; :func:`synchronize` returns a list."""
    with _ops.process_set_scope(process_set):
        return _grouped_reducescatter_impl(tensors, name, op, float(prescale_factor),
                                           float(postscale_factor))


@_ops.blocking
def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none, op: int = Average,
                          process_set: Any = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Reducescatter each tensor of a list (see :func:`reducescatter`); differentiable like
    :func:`reducescatter`."""
    with _ops.process_set_scope(process_set):
        if not tensors:
            return []
        return _reducescatter_apply(list(tensors), name, compression, op, prescale_factor,
                                    postscale_factor)


# ---------------------------------------------------------------------------------------
# Barrier and join


@_ops.blocking
def barrier(process_set: Any = None) -> None:
    """Block until every rank has called ``barrier()``."""
    with _ops.process_set_scope(process_set):
        _ops.submit(_ops.BARRIER, _ops.EMPTY, name=_ops.auto_name("barrier")).wait()


@_ops.blocking
def join(device: int = -1) -> int:
    """Declare that this rank has no more data. Until every rank has joined, the other
    ranks' allreduces go on, with zeros standing in for this rank. Blocks until all ranks
    joined and returns the rank that joined last. (``device`` is accepted for Horovod
    compatibility.)"""
    h = _ops.submit(_ops.JOIN, _ops.EMPTY, name=_ops.auto_name("join"))
    h.wait()
    aux = h.aux()
    return int(aux[0]) if aux else -1
