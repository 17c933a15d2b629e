"""``DistributedOptimizer``: averages gradients across ranks while backward still runs.

Each trainable parameter gets a hook (``Tensor.register_post_accumulate_grad_hook``)
that fires as soon as its gradient is final for this backward pass. Dense gradients
live in buckets (:mod:`hvdlite.torch.buckets`): a bucket whose gradients are all final
goes to the engine as one asynchronous in-place allreduce. Gradients the buckets cannot
take (explicit groups, sparse gradients, ``Compression.topk`` and other compressors
than ``none``/``fp16``/``bf16``, ``bucket_cap_mb=None``) go one allreduce per tensor (or
group) as soon as they are final. Either way the gradients of the last layers are on
the wire while autograd is still computing the first layers'. ``step()`` waits for
whatever is still outstanding, then runs the wrapped optimizer.
"""
from __future__ import annotations

import math
import warnings
import weakref
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch

from hvdlite.common import ops as _ops
from hvdlite.common.process_set_table import resolve as _process_set_id
from hvdlite.common.discovery import in_elastic_job
from hvdlite.torch import uneven
from hvdlite.torch import buckets as _buckets_module
from hvdlite.torch.buckets import DEFAULT_CAP_MB, Bucket, Buckets
from hvdlite.torch.compression import Compression, Compressor, TopKCompressor
from hvdlite.torch.mpi_ops import (Adasum, Average, Handle, _allreduce_impl, allgather,
                                   allgather_async, allreduce_async, allreduce_async_,
                                   sparse_allreduce_async, synchronize)

# Each DistributedOptimizer gets the next index at construction; every rank builds its
# optimizers in the same order, so the index (part of the default allreduce names) agrees
# across ranks and two optimizers' unnamed gradients never share a name.
_optimizer_count = 0


def _next_optimizer_index() -> int:
    global _optimizer_count
    index = _optimizer_count
    _optimizer_count += 1
    return index


class _Pending:
    """One submitted allreduce of the optimizer: a parameter or a group of them."""

    __slots__ = ("params", "handle", "ctxs", "sent", "kind", "grads", "bucket", "lost")

    def __init__(self, params: tuple[torch.Tensor, ...], handle: Handle, ctxs: list[Any],
                 sent: list[torch.Tensor], kind: str, bucket: Bucket | None = None,
                 lost: tuple[torch.Tensor, ...] = ()) -> None:
        self.params, self.handle, self.ctxs, self.sent, self.kind = params, handle, ctxs, sent, kind
        self.bucket = bucket
        self.lost = lost  # bucket members whose final gradient was cleared or replaced before it went
        # The gradient tensors as submitted: the result is written back into them, so a
        # parameter whose ``.grad`` was meanwhile cleared or replaced is detected.
        self.grads = [p.grad for p in params]


def _remove_hooks(hooks: dict[torch.Tensor, Any]) -> None:
    for handle in hooks.values():
        handle.remove()
    hooks.clear()


# Where state_dict() keeps Compression.topk's residuals (and this rank's number).
_TOPK_KEY = "hvdlite_topk"


def _outside(process_set: Any) -> bool:
    """This process is not a member of `process_set` (a registered set; None: global)."""
    return process_set is not None and getattr(process_set, "included", lambda: True)() is False


def _bucket_cap_bytes(cap_mb: Any) -> tuple[int, str | None]:
    """``bucket_cap_mb`` in bytes (0 for None: no buckets), or what is wrong with it."""
    if cap_mb is None:
        return 0, None
    try:
        value = float(cap_mb)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(cap_mb, bool) or not (value > 0 and math.isfinite(value)):
        return 0, repr(cap_mb)
    return max(1, int(value * 1024 * 1024)), None


def _bucket_cap_error(problem: str | None, ranks: list[int] | None = None) -> str:
    where = f"rank(s) {', '.join(map(str, ranks))} got another value" if ranks else "got"
    here = f" ({'here: ' if ranks else ''}{problem})" if problem else ""
    return (f"DistributedOptimizer: bucket_cap_mb must be a positive number of MiB, or None to "
            f"reduce each gradient on its own; {where}{here}")


class GradientsInFlightError(AssertionError, RuntimeError):
    """``zero_grad()`` was called while gradient allreduces were in flight. An
    ``AssertionError``, the type Horovod raises here, and a ``RuntimeError``."""


class _DistributedOptimizer:
    """Placed in front of the user's optimizer class by :func:`DistributedOptimizer`;
    everything not defined here is the wrapped optimizer's own behaviour."""

    # -- set-up ---------------------------------------------------------------------------

    def _hvd_setup(self, named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
                   compression: type[Compressor], backward_passes_per_step: int, op: int,
                   gradient_predivide_factor: float, groups: Any, sparse_as_dense: bool,
                   process_set: Any = None, bucket_cap_mb: Any = DEFAULT_CAP_MB) -> None:
        self._hvd_compression = compression
        self._hvd_process_set = process_set  # gradients are reduced over its ranks
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.sparse_as_dense = bool(sparse_as_dense)
        if op == Average:
            # The engine divides by the number of ranks for Average; splitting the divisor
            # into a pre- and a post-factor keeps float16 sums from overflowing.
            self._hvd_prescale = 1.0 / self.gradient_predivide_factor
            self._hvd_postscale = self.gradient_predivide_factor
        else:
            self._hvd_prescale = self._hvd_postscale = 1.0

        all_params = [p for g in self.param_groups for p in g["params"]]
        self._hvd_index = _next_optimizer_index()
        self._hvd_names: dict[torch.Tensor, str] = {}
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not (isinstance(x, tuple) and len(x) == 2) for x in named):
                raise ValueError("named_parameters should be a sequence of (name, parameter) "
                                 "tuples, usually model.named_parameters()")
            seen, dups = set(), set()
            for n, _ in named:
                (dups if n in seen else seen).add(n)
            if dups:
                raise ValueError(f"Parameter names in named_parameters must be unique; "
                                 f"duplicates: {', '.join(sorted(dups))}")
            by_id = {id(p): n for n, p in named}
            unnamed = [p for p in all_params if id(p) not in by_id]
            if unnamed:
                raise ValueError(f"named_parameters was given, but {len(unnamed)} parameter(s) of "
                                 f"the optimizer are not in it (shapes: "
                                 f"{', '.join(str(tuple(p.shape)) for p in unnamed[:5])})")
            for p in all_params:
                self._hvd_names[p] = by_id[id(p)]
        else:
            for gi, g in enumerate(self.param_groups):
                for j, p in enumerate(g["params"]):
                    self._hvd_names[p] = self._hvd_default_name(gi, j)

        self._hvd_delay: dict[torch.Tensor, int] = {p: self.backward_passes_per_step
                                                    for p in all_params}
        self._hvd_pending: dict[Any, _Pending] = {}      # unit -> submitted allreduce
        self._hvd_submitted: set[torch.Tensor] = set()   # params whose allreduce is in flight
        self._hvd_fired: set[torch.Tensor] = set()       # params whose hook fired this step
        self._hvd_hooks: dict[torch.Tensor, Any] = {}
        # When this optimizer is garbage-collected, its hooks leave the parameters too.
        weakref.finalize(self, _remove_hooks, self._hvd_hooks)
        self._hvd_synchronized = False
        self._hvd_should_sync = True
        if _outside(process_set):
            # As in Horovod: a rank outside the set trains locally, reducing nothing.
            self._hvd_active = False
        else:
            # One rank alone has nothing to average, except in an elastic job: there the
            # world may grow later, so the hooks stay (Horovod does the same).
            with _ops.process_set_scope(process_set):
                self._hvd_active = _ops.current_size() > 1 or in_elastic_job()

        # Groups: units of parameters reduced together as one grouped allreduce.
        self._hvd_unit_of: dict[torch.Tensor, tuple[torch.Tensor, ...]] = {}
        self._hvd_group_ids: dict[tuple[torch.Tensor, ...], int] = {}
        self._hvd_group_ready: dict[tuple[torch.Tensor, ...], set[torch.Tensor]] = {}
        self._hvd_groups_spec = groups
        if groups is not None:
            with _ops.process_set_scope(process_set):  # group ids count per process set
                self._hvd_make_groups(groups, [p for p in all_params if p.requires_grad])

        self._hvd_buckets: Buckets | None = None
        cap_bytes, cap_problem = _bucket_cap_bytes(bucket_cap_mb)
        if self._hvd_active and op != Adasum:
            self._hvd_setup_buckets(cap_bytes, cap_problem, all_params)
        elif cap_problem is not None:
            raise ValueError(_bucket_cap_error(cap_problem))

        if self._hvd_active:
            for p in all_params:
                self._hvd_hook(p)

    def _hvd_setup_buckets(self, cap_bytes: int, problem: str | None,
                           all_params: list[torch.Tensor]) -> None:
        """Lay out the gradient buckets, after every rank has shown its settings to the
        others: a bad ``bucket_cap_mb`` on one rank, or ranks that would lay out
        different buckets, fail on every rank here instead of leaving the others waiting
        for buckets that never come."""
        usable = (cap_bytes > 0 and self._hvd_groups_spec is None
                  and self._hvd_compression in (Compression.none, Compression.fp16, Compression.bf16))
        members = [p for p in reversed(all_params) if p.requires_grad] if usable else []
        if in_elastic_job():
            # A worker that joins builds its optimizer alone, while the others train: no
            # collective here. A bad setting fails on its own rank (the others go on
            # without it); the layouts agree since every rank starts from the first one.
            if problem is not None:
                raise ValueError(_bucket_cap_error(problem))
        else:
            self._hvd_agree_on_buckets(problem, cap_bytes, members, all_params)
        if members:
            self._hvd_buckets = Buckets(members, cap_bytes, f"bucket.{self._hvd_names[members[0]]}")

    def _hvd_agree_on_buckets(self, problem: str | None, cap_bytes: int, members: list[torch.Tensor],
                              all_params: list[torch.Tensor]) -> None:
        """Every rank's bucket settings, gathered: raises ValueError on every rank if one
        rank's are bad or the ranks' would lay out different buckets."""
        mine = torch.tensor([[1 if problem else 0, cap_bytes, len(members),
                              sum(p.numel() for p in members)]], dtype=torch.int64)
        first = self._hvd_names[all_params[0]] if all_params else "none"
        rows = allgather(mine, name=f"hvdlite.optimizer.buckets.{first}.{len(all_params)}",
                         process_set=self._hvd_process_set).tolist()
        bad = [r for r, row in enumerate(rows) if row[0]]
        if bad:
            raise ValueError(_bucket_cap_error(problem, bad))
        if any(row[1:] != rows[0][1:] for row in rows):
            said = "; ".join(f"rank {r}: {row[2]} parameter(s), {row[3]} elements, buckets of "
                             f"{row[1]} bytes" for r, row in enumerate(rows))
            raise ValueError(f"DistributedOptimizer: the ranks would lay out different gradient "
                             f"buckets ({said}); every rank must wrap the same parameters with "
                             f"the same bucket_cap_mb, groups and compression")

    @property
    def _parameter_names(self) -> dict[torch.Tensor, str]:
        """Each parameter's allreduce name (the attribute Horovod's optimizer has)."""
        return self._hvd_names

    def _hvd_default_name(self, gi: int, j: int) -> str:
        """Name of the allreduce of parameter ``j`` of group ``gi`` when no names were
        given; includes this optimizer's index so that several optimizers can have
        gradients in flight at once."""
        return f"allreduce.param.{self._hvd_index}.{gi}.{j}"

    def _hvd_make_groups(self, groups: Any, params: list[torch.Tensor]) -> None:
        units: list[tuple[torch.Tensor, ...]] = []
        if isinstance(groups, int) and not isinstance(groups, bool):
            if groups <= 0:
                raise ValueError("groups must be a positive integer or a list of lists of parameters")
            n = min(groups, len(params)) or 1
            k, extra = divmod(len(params), n)
            start = 0
            for i in range(n):
                stop = start + k + (1 if i < extra else 0)
                if stop > start:
                    units.append(tuple(params[start:stop]))
                start = stop
        elif isinstance(groups, (list, tuple)):
            grouped: set[int] = set()
            wanted = {id(p) for p in params}
            for grp in groups:
                unit = []
                for p in grp:
                    if not isinstance(p, torch.Tensor):
                        raise ValueError("groups must be lists of torch.Tensor (parameters)")
                    if id(p) in grouped:
                        raise ValueError("a parameter can appear in only one group")
                    grouped.add(id(p))
                    if id(p) in wanted:
                        unit.append(p)
                if unit:
                    units.append(tuple(unit))
            units.extend((p,) for p in params if id(p) not in grouped)
        else:
            raise ValueError("groups must be a positive integer or a list of lists of parameters")
        for unit in units:
            for p in unit:
                self._hvd_unit_of[p] = unit
            if len(unit) > 1:
                # One fixed id per group, allocated in the same order on every rank.
                self._hvd_group_ids[unit] = _ops.new_group_id()

    def _hvd_hook(self, p: torch.Tensor) -> None:
        if p in self._hvd_hooks or not p.requires_grad:
            return
        ref = weakref.ref(self)

        def hook(param: torch.Tensor) -> None:
            opt = ref()
            if opt is not None:
                opt._hvd_grad_ready(param)

        self._hvd_hooks[p] = p.register_post_accumulate_grad_hook(hook)

    # -- during backward --------------------------------------------------------------------

    def _hvd_grad_ready(self, p: torch.Tensor) -> None:
        if p not in self._hvd_delay:
            return
        if p in self._hvd_submitted or self._hvd_delay[p] <= 0:
            raise RuntimeError(
                f"hvdlite: the gradient of '{self._hvd_names.get(p)}' was computed more than "
                f"backward_passes_per_step={self.backward_passes_per_step} times before "
                f"optimizer.step(); increase backward_passes_per_step to accumulate more "
                f"backward passes locally")
        self._hvd_fired.add(p)
        buckets = self._hvd_buckets
        bucket = None
        if buckets is not None:
            if buckets.epoch != _buckets_module._world_epoch and not self._hvd_submitted:
                buckets.follow_world()
            bucket = buckets.bucket_of.get(p)
        if bucket is not None:
            # Every pass's gradient lands in the bucket: later passes accumulate into it.
            bucket.adopt(p, self._hvd_names[p])
            if p in bucket.sparse:
                buckets.sparse_seen.add(p)
        self._hvd_delay[p] -= 1
        if self._hvd_delay[p] > 0:
            return
        if bucket is not None:
            if not buckets.reordered:
                buckets.arrival.append(p)
            bucket.ready.add(p)
            if bucket.full():
                self._hvd_submit_bucket(bucket, frozenset())
            return
        unit = self._hvd_unit_of.get(p, (p,))
        if len(unit) == 1:
            self._hvd_submit(unit)
            return
        ready = self._hvd_group_ready.setdefault(unit, set())
        ready.add(p)
        if len(ready) == len(unit):
            self._hvd_submit(unit)

    def _hvd_submit(self, unit: tuple[torch.Tensor, ...]) -> None:
        with _ops.process_set_scope(self._hvd_process_set):
            self._hvd_submit_on_set(unit)

    def _hvd_submit_on_set(self, unit: tuple[torch.Tensor, ...]) -> None:
        grads = []
        for p in unit:
            if p.grad is None:
                # Another rank has a gradient for p in this step: contribute zeros.
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        scale = self._hvd_uneven_scale()
        if scale != 1.0:
            for g in grads:
                g.mul_(scale)
        name = self._hvd_names[unit[0]]
        pre, post = self._hvd_prescale, self._hvd_postscale
        if getattr(self._hvd_compression, "sparse", False):   # Compression.topk
            dense = grads[0].to_dense() if grads[0].is_sparse else grads[0]
            picked = self._hvd_compression.select(name, dense)
            handle = sparse_allreduce_async(picked, name=name, op=self.op)
            pending = _Pending(unit, handle, [None], [], "topk")
        elif len(unit) == 1 and grads[0].is_sparse:
            if self.sparse_as_dense:
                sent, ctx = self._hvd_compression.compress(grads[0].to_dense())
                handle = allreduce_async_(sent, name=name, op=self.op, prescale_factor=pre,
                                          postscale_factor=post)
                pending = _Pending(unit, handle, [ctx], [sent], "dense_from_sparse")
            else:
                handle = sparse_allreduce_async(grads[0], name=name, op=self.op)
                pending = _Pending(unit, handle, [None], [], "sparse")
        else:
            if any(g.is_sparse for g in grads):
                if not self.sparse_as_dense:
                    raise ValueError("sparse gradients cannot be reduced in a group; pass "
                                     "sparse_as_dense=True or leave that parameter ungrouped")
                grads = [g.to_dense() if g.is_sparse else g for g in grads]
            pairs = [self._hvd_compression.compress(g) for g in grads]
            sent = [s for s, _ in pairs]
            if len(unit) == 1:
                handle = allreduce_async_(sent[0], name=name, op=self.op, prescale_factor=pre,
                                          postscale_factor=post)
            else:
                handle = _allreduce_impl(sent, name, self.op, pre, post, inplace=True,
                                         grouped=True, group_id=self._hvd_group_ids[unit])
            pending = _Pending(unit, handle, [c for _, c in pairs], sent, "dense")
        self._hvd_pending[unit] = pending
        self._hvd_submitted.update(unit)

    def _hvd_submit_bucket(self, bucket: Bucket, present: Any) -> None:
        """Submit `bucket` as one in-place allreduce (members without a gradient here
        contribute zeros; see :meth:`Bucket.fill_absent`). A bucket this rank cannot
        reduce (a member changed shape, dtype or device) is refused, so that it fails on
        every rank."""
        # Gradients cleared or replaced between their hook and now (model.zero_grad()
        # before step()): the bucket still goes, so that no rank waits, and step() raises.
        lost = tuple(p for p in bucket.ready if not bucket.holds(p))
        ctx, sent = None, []
        with _ops.process_set_scope(self._hvd_process_set):
            bucket.fill_absent(present)
            if bucket.problem is not None:
                name = f"allreduce.{bucket.name}"
                handle = Handle([_ops.refusal(_ops.ALLREDUCE, name, bucket.problem)], lambda _: None, name)
            else:
                scale = self._hvd_uneven_scale()
                if scale != 1.0:
                    bucket.flat.mul_(scale)
                handle = None
                if self._hvd_compression is Compression.none:
                    # The steady state: one call into the engine, no handle objects.
                    handle = bucket.start(self.op, self._hvd_prescale, self._hvd_postscale)
                if handle is None:
                    compressed, ctx = self._hvd_compression.compress(bucket.flat)
                    sent = [compressed]
                    handle = allreduce_async_(compressed, name=bucket.name, op=self.op,
                                              prescale_factor=self._hvd_prescale,
                                              postscale_factor=self._hvd_postscale)
        self._hvd_pending[bucket] = _Pending(bucket.params, handle, [ctx], sent, "bucket", bucket, lost)
        self._hvd_submitted.update(bucket.params)

    def _hvd_uneven_scale(self) -> float:
        """What this rank's gradient is multiplied by in a step where only some ranks have
        data (an ``ElasticSampler``'s padding batch, :mod:`hvdlite.torch.uneven`): 0 on a
        padding rank, and with ``Average`` the engine's division by the number of ranks
        becomes a division by the ranks with data. 1 in every other step."""
        if _process_set_id(self._hvd_process_set)[0] != 0:
            return 1.0  # the sampler's shares are over the whole world
        w = uneven.weight()
        if w is None:
            return 1.0
        mine, with_data = w
        if self.op == Average and with_data > 0:
            return mine * _ops.current_size() / with_data
        return mine

    # -- step ------------------------------------------------------------------------------

    def _hvd_managed(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]
                if p.requires_grad and p in self._hvd_delay]

    def synchronize(self) -> None:
        """Wait until every gradient of this step is averaged across ranks.

        Gradients whose hooks have not fired (parameters unused in this step, or gradients
        accumulated fewer than ``backward_passes_per_step`` times) are reduced now; a
        parameter for which no rank has a gradient keeps ``grad is None``, exactly as in
        single-process training. Use it before gradient clipping, then call ``step()``
        inside :meth:`skip_synchronize`."""
        if not self._hvd_active:
            self._hvd_synchronized = True
            return
        managed = self._hvd_managed()
        buckets = self._hvd_buckets
        bucket_of = buckets.bucket_of if buckets is not None else {}
        units: list[tuple[torch.Tensor, ...]] = []
        seen: set[torch.Tensor] = set()
        for p in managed:
            if p in seen or p in bucket_of:
                continue
            unit = self._hvd_unit_of.get(p, (p,))
            seen.update(unit)
            units.append(unit)
        missing = [u for u in units if not any(q in self._hvd_submitted for q in u)]
        unsent = [b for b in buckets.buckets if b not in self._hvd_pending] if buckets is not None else []
        # Every rank tells the others which gradients it has, so a parameter is reduced
        # if some rank has a gradient for it, and left alone if none has. A rank alone
        # (an elastic job's only worker) has no one to tell.
        flags = torch.tensor([1 if (p in self._hvd_fired or p.grad is not None) else 0
                              for p in managed], dtype=torch.uint8)
        with _ops.process_set_scope(self._hvd_process_set):
            alone = _ops.current_size() == 1
        # (Named by size only, so ranks that built different numbers of optimizers agree;
        # it is always complete before synchronize() returns, so the name is free again.)
        flag_handle = None if alone else allreduce_async(
            flags, name=f"hvdlite.optimizer.has_grad.{len(managed)}", op=_ops.Max,
            process_set=self._hvd_process_set)
        absent: list[torch.Tensor] = []
        if missing or unsent:
            index = {p: i for i, p in enumerate(managed)}
            present = flags if flag_handle is None else synchronize(flag_handle)
            have = {p for p in managed if present[index[p]]}
            for bucket in unsent:
                if any(p in have for p in bucket.params):
                    self._hvd_submit_bucket(bucket, have)
            for unit in missing:
                have = [p in index and bool(present[index[p]]) for p in unit]
                if any(have):
                    self._hvd_submit(unit)
                    # Group members no rank has a gradient for ride along as zeros and
                    # get ``grad = None`` back afterwards.
                    absent.extend(p for p, h in zip(unit, have) if not h)
        try:
            error: BaseException | None = None
            for pending in self._hvd_pending.values():
                try:
                    self._hvd_finish(pending)
                except Exception as e:  # noqa: BLE001 - finish the others, then raise
                    if error is None:
                        error = e
            if flag_handle is not None:
                synchronize(flag_handle)
            if error is not None:
                raise error
        finally:
            self._hvd_reset()
        for p in absent:
            p.grad = None
        if buckets is not None and not buckets.reordered:
            self._hvd_reorder_buckets()
        self._hvd_synchronized = True
        for p in managed:
            self._hvd_hook(p)

    def _hvd_reorder_buckets(self) -> None:
        """After the first step: lay the buckets out again in the order the gradients
        arrived on rank 0 (every rank takes that order, so the buckets agree). Members
        whose gradient came sparse on any rank leave the buckets for the per-tensor path."""
        buckets = self._hvd_buckets
        assert buckets is not None
        order = torch.tensor(buckets.first_step_order(), dtype=torch.int64)  # rank 0's counts
        sparse = torch.tensor([1 if p in buckets.sparse_seen else 0 for p in buckets.members],
                              dtype=torch.uint8)
        tag = f"{buckets.prefix}.{len(buckets.members)}"
        with _ops.process_set_scope(self._hvd_process_set):
            # (Gathered rather than broadcast: the set's first rank need not be world rank 0.)
            sent_order = allgather_async(order.unsqueeze(0), name=f"hvdlite.optimizer.bucket_order.{tag}")
            sent_sparse = allreduce_async(sparse, name=f"hvdlite.optimizer.bucket_sparse.{tag}",
                                          op=_ops.Max)
            order = synchronize(sent_order)[0]
            sparse = synchronize(sent_sparse)
        indices = order.tolist()
        cut = indices.index(-1)
        arrived, late = ([buckets.members[i] for i in part if not sparse[i]]
                         for part in (indices[:cut], indices[cut + 1:]))
        buckets.reorder(arrived, late)

    def _hvd_finish(self, pending: _Pending) -> None:
        result = pending.handle.wait()  # a Handle, or a bucket's Started
        changed = [p for p, g in zip(pending.params, pending.grads) if p.grad is not g]
        for p in (*pending.lost, *changed):
            raise RuntimeError(
                f"hvdlite: the gradient of '{self._hvd_names.get(p)}' was "
                f"{'set to None' if p.grad is None else 'replaced'} (e.g. by "
                f"model.zero_grad()) after loss.backward() but before optimizer.step() or "
                f"optimizer.synchronize(), while the gradient allreduces are still in "
                f"flight; call optimizer.step() (or optimizer.synchronize()) before "
                f"zero_grad()")
        with torch.no_grad():
            if pending.kind == "bucket":
                bucket = pending.bucket
                assert bucket is not None
                value = self._hvd_compression.decompress(result, pending.ctxs[0])
                if value is not bucket.flat:
                    bucket.flat.copy_(value)
                for p in bucket.sparse:
                    p.grad = bucket.views[p].to_sparse()
                return
            if pending.kind == "sparse":
                pending.params[0].grad = result.coalesce()
                return
            if pending.kind == "topk":
                p = pending.params[0]
                dense = result.to_dense().view(p.shape)
                if p.grad.is_sparse:
                    p.grad = dense
                else:
                    p.grad.copy_(dense)
                return
            results = result if isinstance(result, list) else [result]
            for p, out, ctx in zip(pending.params, results, pending.ctxs):
                value = self._hvd_compression.decompress(out, ctx)
                if pending.kind == "dense_from_sparse" or p.grad.is_sparse:
                    p.grad = value.to_sparse()
                elif value is not p.grad:
                    p.grad.copy_(value)

    def _hvd_reset(self) -> None:
        self._hvd_pending.clear()
        self._hvd_submitted.clear()
        self._hvd_fired.clear()
        self._hvd_group_ready.clear()
        if self._hvd_buckets is not None:
            self._hvd_buckets.clear()
        for p in self._hvd_delay:
            self._hvd_delay[p] = self.backward_passes_per_step

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within this context ``step()`` does not synchronize; use it after an explicit
        :meth:`synchronize` (e.g. to clip the averaged gradients in between)."""
        self._hvd_should_sync = False
        try:
            yield
        finally:
            self._hvd_should_sync = True

    def step(self, closure: Any = None) -> Any:
        """Wait for the outstanding gradient allreduces, then take the wrapped optimizer's
        step.

        With a ``closure`` (which computes the loss and calls ``backward()``), the wrapped
        optimizer gets a closure that runs it and then waits for its gradients'
        allreduces, so every evaluation -- one for SGD or Adam, several per step for
        LBFGS -- sees gradients averaged across ranks."""
        if self._hvd_should_sync and self._hvd_synchronized:
            warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                          "optimizer.synchronize(): the gradients are reduced a second time, "
                          "which is slow. Wrap step() in `with optimizer.skip_synchronize():`.",
                          stacklevel=2)
        try:
            if closure is None:
                if self._hvd_should_sync:
                    self.synchronize()
                return super().step()  # type: ignore[misc]

            def averaged_closure() -> Any:
                with torch.enable_grad():
                    loss = closure()
                if self._hvd_should_sync:
                    self.synchronize()
                return loss
            return super().step(averaged_closure)  # type: ignore[misc]
        finally:
            self._hvd_synchronized = False
            uneven.step_taken()

    step.hooked = True  # type: ignore[attr-defined]  # torch wraps the wrapped class's step already

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients. Raises :class:`GradientsInFlightError` while gradient
        allreduces started by ``loss.backward()`` are still in flight (call ``step()`` or
        ``synchronize()`` first), since clearing them then would race with the reduction."""
        buckets = getattr(self, "_hvd_buckets", None)
        if getattr(self, "_hvd_pending", None) or (
                buckets is not None and any(b.ready for b in buckets.buckets)):
            raise GradientsInFlightError(
                "hvdlite: optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(), while the gradient allreduces "
                "are still in flight; call optimizer.step() (or optimizer.synchronize()) first")
        if getattr(self, "_hvd_delay", None) is not None:
            self._hvd_fired.clear()
            self._hvd_group_ready.clear()
            if self._hvd_buckets is not None:
                self._hvd_buckets.clear()
            for p in self._hvd_delay:
                self._hvd_delay[p] = self.backward_passes_per_step
        return super().zero_grad(set_to_none=set_to_none)  # type: ignore[misc]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group; its parameters are averaged like the others (every rank
        must add the same groups in the same order)."""
        super().add_param_group(param_group)  # type: ignore[misc]
        if getattr(self, "_hvd_names", None) is None:
            return  # called while the wrapped optimizer is being built
        gi = len(self.param_groups) - 1
        for j, p in enumerate(self.param_groups[gi]["params"]):
            if p not in self._hvd_names:
                self._hvd_names[p] = self._hvd_default_name(gi, j)
            self._hvd_delay.setdefault(p, self.backward_passes_per_step)
            if self._hvd_active:
                self._hvd_hook(p)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state; with ``Compression.topk`` also this rank's
        residuals, by parameter name (one checkpoint per rank resumes them exactly)."""
        sd = super().state_dict()  # type: ignore[misc]
        if isinstance(getattr(self, "_hvd_compression", None), TopKCompressor):
            sd[_TOPK_KEY] = {"rank": _ops.current_rank(), "residuals": self._hvd_compression.state_dict()}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load optimizer state; outstanding allreduces are waited for and dropped.
        ``Compression.topk`` residuals are taken only from this rank's own checkpoint:
        another rank's (one file loaded everywhere, ``broadcast_optimizer_state``) would
        send that rank's unsent gradients a second time, so this rank's start from zero."""
        state_dict = dict(state_dict)
        topk = state_dict.pop(_TOPK_KEY, None)
        comp = getattr(self, "_hvd_compression", None)
        if isinstance(comp, TopKCompressor):
            if topk is not None and topk["rank"] == _ops.current_rank():
                comp.load_state_dict(topk["residuals"])
            else:
                comp.load_state_dict({})
                if topk is not None and any(bool(r.any()) for r in topk["residuals"].values()):
                    warnings.warn(f"Compression.topk: rank {_ops.current_rank()} was given rank {topk['rank']}'s "
                                  f"residuals and starts its own from zero; save one checkpoint per rank to "
                                  f"resume them exactly", stacklevel=2)
        if getattr(self, "_hvd_pending", None):
            for pending in self._hvd_pending.values():
                try:
                    pending.handle.wait()
                except Exception:  # noqa: BLE001 - the results are being discarded
                    pass
        if getattr(self, "_hvd_delay", None) is not None:
            self._hvd_reset()
            self._hvd_synchronized = False
        super().load_state_dict(state_dict)  # type: ignore[misc]

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes are accumulated before each allreduce."""
        self.backward_passes_per_step = int(passes)
        for p in self._hvd_delay:
            self._hvd_delay[p] = self.backward_passes_per_step


class _DistributedAdasumOptimizer(_DistributedOptimizer):
    """Placed in front of the user's optimizer class by ``DistributedOptimizer(op=Adasum)``
    (Horovod's Adasum mode). Gradients stay local: each rank takes its optimizer's step
    on its own gradients, then the changes that step made to the parameters are
    combined over the ranks with Adasum (per tensor), and every rank applies the combined
    change to the parameters it started the step from."""

    def _hvd_hook(self, p: torch.Tensor) -> None:
        pass  # nothing to reduce during backward

    def synchronize(self) -> None:
        """Nothing to wait for: in Adasum mode the parameter updates, not the
        gradients, are combined, in :meth:`step`."""
        self._hvd_synchronized = True

    def step(self, closure: Any = None) -> Any:
        """The wrapped optimizer's step on this rank's gradients, then the Adasum of every
        rank's parameter change applied from where the step started."""
        params = self._hvd_managed()
        start = [p.detach().clone() for p in params]
        loss = super(_DistributedOptimizer, self).step(closure)  # the wrapped optimizer's own
        if not self._hvd_active:
            return loss
        with torch.no_grad(), _ops.process_set_scope(self._hvd_process_set):
            sent = []
            scale = self._hvd_uneven_scale()  # 0 on a rank whose batch was padding
            for p, p0 in zip(params, start):
                delta, ctx = self._hvd_compression.compress((p.detach() - p0) * scale)
                handle = allreduce_async_(delta, name=f"adasum.{self._hvd_names[p]}", op=Adasum)
                sent.append((p, p0, handle, ctx))
            for p, p0, handle, ctx in sent:
                p.copy_(p0 + self._hvd_compression.decompress(synchronize(handle), ctx))
        uneven.step_taken()
        return loss

    step.hooked = True  # type: ignore[attr-defined]


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: type[Compressor] = Compression.none,
                         backward_passes_per_step: int = 1, op: int = Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Any = None, sparse_as_dense: bool = False,
                         process_set: Any = None,
                         bucket_cap_mb: float | None = DEFAULT_CAP_MB) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that gradients are averaged across all ranks before each step.

    The returned object is an instance of the optimizer's own class (``isinstance``
    checks and learning-rate schedulers keep working) sharing its parameter groups and
    state; use it instead of the original.

    Arguments:
        optimizer: any ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()``; names make the allreduces
            identifiable in the timeline and in error messages. Every parameter of the
            optimizer must be named.
        compression: ``Compression.none``, ``Compression.fp16`` or ``Compression.bf16``
            (hvdlite addition) for the gradients on the wire, or ``Compression.topk(ratio)``
            (hvdlite addition): each gradient's largest entries with error feedback
            (docs/zero.md).
        backward_passes_per_step: number of ``backward()`` calls whose gradients are
            accumulated locally (summed, as PyTorch does) before they are reduced; divide
            the loss by this number to get the gradient of the combined batch.
        op: ``Average`` (default) or ``Sum`` of the gradients, or ``Adasum``: each rank
            steps on its own gradients and the parameter updates are combined with
            Adasum (Horovod's Adasum mode; do not scale the learning rate by the number
            of ranks, see docs/adasum.md).
        gradient_predivide_factor: with ``Average``, divide gradients by this factor before
            the sum and by ``size / factor`` after it.
        num_groups: deprecated spelling of an integer ``groups``.
        groups: an int (split the parameters into that many groups) or a list of lists of
            parameters; each group is reduced as one grouped allreduce when all its
            gradients are ready.
        sparse_as_dense: reduce sparse gradients (e.g. of ``nn.Embedding(sparse=True)``)
            as dense tensors instead of gathering their indices and values.
        process_set: the :class:`~hvdlite.common.process_sets.ProcessSet` whose ranks
            average the gradients (default: all ranks). On a rank outside the set the
            optimizer reduces nothing and trains on its own gradients, as in Horovod.
        bucket_cap_mb: (hvdlite addition) size of the gradient buckets in MiB, as in
            ``DistributedDataParallel``: dense gradients become views into flat buckets
            of about this size, and each bucket is reduced as one allreduce once its
            gradients are final. ``None`` reduces each gradient on its own (Horovod's
            way, with the engine's tensor fusion). Explicit ``groups``, sparse
            gradients and compressors other than ``Compression.none``, ``fp16`` and
            ``bf16`` always go per tensor. Every rank must pass the same value; a value
            that is not positive fails on every rank.

    The arguments are in Horovod's order, so positional calls written for Horovod bind
    the same way.

    Call ``zero_grad()`` only after ``step()`` (or ``synchronize()``); calling it while
    gradient allreduces are still in flight raises :class:`GradientsInFlightError` (an
    ``AssertionError``, as in Horovod, and a ``RuntimeError``).
    """
    if process_set is not None and not _outside(process_set):
        _ops.process_set_scope(process_set)  # checks it: registered (a non-member trains locally)
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("this optimizer is already a DistributedOptimizer")
    if op not in (Average, _ops.Sum, Adasum):
        raise ValueError("DistributedOptimizer supports op=Average, op=Sum or op=Adasum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor is only supported with op=Average")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be at least 1")
    if getattr(compression, "sparse", False):
        if op not in (Average, _ops.Sum):
            raise ValueError("Compression.topk reduces gradients with op=Average or op=Sum")
        if groups is not None or num_groups:
            raise ValueError("Compression.topk sends each gradient on its own; it does not combine "
                             "with groups")
        if gradient_predivide_factor != 1.0:
            raise ValueError("Compression.topk does not take gradient_predivide_factor")
    if num_groups:
        warnings.warn("num_groups is deprecated; use groups=<int>", DeprecationWarning,
                      stacklevel=2)
        if groups is None:
            groups = num_groups
    base = type(optimizer)
    mixin = _DistributedAdasumOptimizer if op == Adasum else _DistributedOptimizer
    cls = type(base.__name__, (mixin, base),
               {"__module__": __name__, "__qualname__": base.__qualname__})
    dist = cls.__new__(cls)
    state = dict(optimizer.__dict__)
    # A learning-rate scheduler built before wrapping replaces ``step`` on the instance;
    # that bound method would bypass the gradient reduction, so it is not carried over.
    state.pop("step", None)
    dist.__dict__.update(state)
    dist._hvd_setup(named_parameters, compression, backward_passes_per_step, op,
                    gradient_predivide_factor, groups, sparse_as_dense, process_set, bucket_cap_mb)
    return dist
