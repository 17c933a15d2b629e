"""Gradient buckets: how ``DistributedOptimizer`` sends dense gradients a bucket at a time.

A bucket is one flat tensor per run of parameters of one device and dtype, about
``bucket_cap_mb`` MiB each. Every parameter's ``.grad`` is a view into its bucket, so
autograd accumulates straight into the memory that is reduced: there is no copy into a
fusion buffer and none back. When the last gradient of a bucket is final for this
backward pass, the whole bucket goes to the engine as one in-place allreduce while
autograd goes on with the layers before it.

The first step's buckets follow the parameters in reverse order (backward computes
the last layers first). After it they are laid out again in the order the gradients
actually arrived on rank 0 (every rank takes rank 0's order), so that each bucket
fills as early as it can.

This module holds the layout and the per-step bookkeeping; the optimizer
(:mod:`hvdlite.torch.optimizer`) decides when a bucket is submitted and what happens
with its result.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from hvdlite.common import basics as _basics, ops as _ops
from hvdlite.torch.mpi_ops import _NATIVE, _stream_of

DEFAULT_CAP_MB = 25.0


def plan(params: Iterable[torch.Tensor], cap_bytes: int) -> list[list[torch.Tensor]]:
    """Split `params`, in their order, into buckets of one device and dtype each.

    A bucket is closed when the next parameter would take it over `cap_bytes`; a
    parameter larger than the cap gets a bucket of its own."""
    open_buckets: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[int]]] = {}
    buckets: list[list[torch.Tensor]] = []
    for p in params:
        key = (p.device, p.dtype)
        nbytes = p.numel() * p.element_size()
        current = open_buckets.get(key)
        if current is None or (current[0] and current[1][0] + nbytes > cap_bytes):
            current = ([], [0])
            open_buckets[key] = current
            buckets.append(current[0])
        current[0].append(p)
        current[1][0] += nbytes
    return buckets


class Started:
    """A bucket's allreduce in flight, as the optimizer waits for it: one object per
    bucket, used every step. Waiting orders the current CUDA stream after it."""

    __slots__ = ("request", "flat")

    def __init__(self, request: _ops.Persistent, flat: torch.Tensor) -> None:
        self.request, self.flat = request, flat

    def wait(self) -> torch.Tensor:
        flat = self.flat
        self.request.wait(_stream_of(flat))
        torch.autograd.graph.increment_version(flat)  # the engine wrote into it in place
        return flat


class Bucket:
    """One bucket: its flat tensor, its parameters' views into it, and this step's state."""

    __slots__ = ("name", "flat", "params", "views", "ready", "expected", "problem", "sparse", "started")

    def __init__(self, name: str, params: Sequence[torch.Tensor]) -> None:
        self.name = name
        self.params = tuple(params)
        first = self.params[0]
        total = sum(p.numel() for p in self.params)
        self.flat = torch.zeros(total, dtype=first.dtype, device=first.device)
        self.views: dict[torch.Tensor, torch.Tensor] = {}
        offset = 0
        for p in self.params:
            n = p.numel()
            self.views[p] = self.flat[offset:offset + n].view(p.shape)
            offset += n
        self.ready: set[torch.Tensor] = set()
        self.expected = -1          # members this step waits for (-1: not counted yet)
        self.problem: str | None = None   # why this rank cannot reduce it this step
        self.sparse: set[torch.Tensor] = set()  # members whose gradient came sparse
        self.started: Started | None = None   # its persistent allreduce, made at the first start

    def start(self, op: int, prescale: float, postscale: float) -> Started | None:
        """Start the bucket's in-place allreduce as one persistent request of the engine
        (built at the first start, then one call per step), after the work queued so far
        on the current CUDA stream. None for a dtype the engine does not reduce itself
        (complex): the caller then takes the general path."""
        flat = self.flat
        if self.started is None:
            dtype = _NATIVE.get(flat.dtype)
            if dtype is None:
                return None
            device = flat.device.index if flat.is_cuda else _ops.CPU_DEVICE
            raw = _ops.RawTensor(flat.data_ptr(), dtype, (flat.numel(),), device)
            request = _ops.Persistent(_ops.ALLREDUCE, raw, raw, name=f"allreduce.{self.name}", op=op,
                                      prescale_factor=prescale, postscale_factor=postscale, keepalive=flat)
            self.started = Started(request, flat)
        self.started.request.start(_stream_of(flat))
        return self.started

    def close(self) -> None:
        if self.started is not None:
            self.started.request.close()
            self.started = None

    def clear(self) -> None:
        self.ready.clear()
        self.expected = -1
        self.problem = None
        self.sparse.clear()

    def full(self) -> bool:
        """Every member that takes part in this backward pass has its final gradient."""
        if self.expected < 0:
            self.expected = sum(1 for p in self.params if p.requires_grad)
        return len(self.ready) >= self.expected

    def adopt(self, p: torch.Tensor, label: str) -> None:
        """Make ``p.grad`` its view into the bucket (copying it in if autograd made a new
        tensor), or note why it cannot be (``problem``). A sparse gradient is copied in
        densely and ``p.grad`` stays sparse."""
        view, grad = self.views[p], p.grad
        if grad is None:
            return
        if grad.shape != view.shape or grad.dtype != view.dtype or grad.device != view.device:
            if self.problem is None:
                self.problem = (
                    f"the gradient of '{label}' is {_describe(grad)}, but the bucket was laid "
                    f"out for {_describe(view)}: the parameter changed shape, dtype or device "
                    f"after DistributedOptimizer was built (build the optimizer after moving "
                    f"or changing the model)")
            return
        if grad.is_sparse:
            view.copy_(grad.to_dense())
            self.sparse.add(p)
            return
        if grad is not view:
            view.copy_(grad)
            p.grad = view

    def holds(self, p: torch.Tensor) -> bool:
        """``p``'s final gradient of this step is in the bucket: ``p.grad`` is still its
        view (or the sparse gradient copied in), not cleared or replaced since."""
        return p.grad is self.views[p] or (p in self.sparse and p.grad is not None)

    def fill_absent(self, present: set[torch.Tensor]) -> None:
        """Before submitting: members without a gradient here contribute zeros. Those that
        some rank has a gradient for (`present`) get the view as their gradient, so
        they receive the average; a frozen member's own ``.grad`` is left alone."""
        for p in self.params:
            if p in self.ready:
                continue
            view = self.views[p]
            grad = p.grad
            if not p.requires_grad:
                if grad is view:
                    p.grad = grad.clone()
                view.zero_()
            elif grad is None:
                view.zero_()
                if p in present:
                    p.grad = view
            else:
                self.adopt(p, "")


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} on {t.device}"


# Bumped whenever hvdlite's world starts or changes (init, shutdown, an elastic reset):
# every optimizer's buckets then go back to their first layout, as a worker that joins
# builds them, so that all ranks lay out the same buckets again.
_world_epoch = 0


def _next_world_epoch(*_: object) -> None:
    global _world_epoch
    _world_epoch += 1


_basics.add_lifecycle_hooks(after_init=_next_world_epoch, after_change=_next_world_epoch)


class Buckets:
    """The buckets of one optimizer: a layout (which can be laid out again once) and a
    lookup from parameter to bucket."""

    def __init__(self, params: Sequence[torch.Tensor], cap_bytes: int, prefix: str) -> None:
        self.cap_bytes = cap_bytes
        self.prefix = prefix
        self.generation = 0  # layouts made, for tests and diagnostics
        self.members = tuple(params)    # the parameters in buckets, in their first layout's order
        self.arrival: list[torch.Tensor] = []  # the first step's order of final gradients
        self.reordered = False
        self.sparse_seen: set[torch.Tensor] = set()  # members whose gradient came sparse
        self.buckets: list[Bucket] = []
        self.bucket_of: dict[torch.Tensor, Bucket] = {}
        self.epoch = _world_epoch
        self.layout(self.members)

    def follow_world(self) -> None:
        """After a change of hvdlite's world: back to the first layout, to be laid out
        again after the next step, as on a worker that has just joined. Bucket names are
        the layout's stage (0 first, 1 after the first step) and position, never a count
        of this rank's history, so that a joined worker's buckets are named alike."""
        if self.epoch == _world_epoch:
            return
        self.epoch = _world_epoch
        if self.reordered:
            self.reordered = False
            self.arrival.clear()
            self.layout(self.members)

    def reorder(self, arrived: Sequence[torch.Tensor], late: Sequence[torch.Tensor]) -> None:
        """The layout after the first step: `arrived` in the order the gradients came,
        then `late` (gradients that may not come, which would hold up a bucket until
        ``step()``) in buckets of their own. The buckets stay as they are if that is
        their layout already."""
        self.reordered = True
        self.arrival.clear()
        runs = plan(arrived, self.cap_bytes) + plan(late, self.cap_bytes)
        if [[id(p) for p in run] for run in runs] != [[id(p) for p in b.params] for b in self.buckets]:
            self.layout(self.members, runs)

    def layout(self, order: Sequence[torch.Tensor], runs: list[list[torch.Tensor]] | None = None) -> None:
        """Lay the buckets out in `order` (or as the given `runs`), keeping each gradient
        that is a view into an old bucket (same values, now in the new one)."""
        old = self.bucket_of
        for b in self.buckets:
            b.close()
        self.generation += 1
        stage = 1 if self.reordered else 0
        if runs is None:
            runs = plan(order, self.cap_bytes)
        self.buckets = [Bucket(f"{self.prefix}.{stage}.{i}", ps) for i, ps in enumerate(runs)]
        self.bucket_of = {p: b for b in self.buckets for p in b.params}
        for p, bucket in old.items():
            grad = p.grad
            if grad is bucket.views[p]:
                if p in self.bucket_of:
                    view = self.bucket_of[p].views[p]
                    view.copy_(grad)
                    p.grad = view
                else:
                    p.grad = grad.clone()

    def clear(self) -> None:
        for b in self.buckets:
            b.clear()

    def first_step_order(self) -> list[int]:
        """This rank's arrival order as indices into ``members``, then -1, then the
        members that did not arrive, in their first layout's order."""
        index = {p: i for i, p in enumerate(self.members)}
        order: list[int] = []
        seen: set[int] = set()
        for p in self.arrival:
            i = index.get(p)
            if i is not None and i not in seen:
                order.append(i)
                seen.add(i)
        return order + [-1] + [i for i in range(len(self.members)) if i not in seen]
