"""ZeRO stage 1 on hvdlite's collectives: each rank keeps the optimizer state of a share
of the parameters (DeepSpeed's optimizer-state sharding), under PyTorch's name and API::

    opt = hvd.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    loss.backward()
    opt.step()        # gradients reduced to their owners, owners step, parameters shared

It replaces ``DistributedOptimizer`` (it reduces the gradients itself); it is not wrapped
in one, and no DDP is needed.

How a step runs (``docs/zero.md``):

- *Ownership.* Every parameter belongs to one rank, assigned as PyTorch's
  ``ZeroRedundancyOptimizer`` does: largest first, each to the rank that owns the fewest
  elements so far. The local optimizer (:attr:`optim`) holds only the owned parameters,
  so each rank keeps about 1/N of the optimizer state.
- *Buckets.* The parameters are cut into buckets of about ``bucket_cap_mb`` (one dtype
  and device each) in reverse registration order, the order backward produces their
  gradients. A bucket's flat buffer is laid out by owner: rank 0's parameters, then rank
  1's, and so on.
- *Gradients.* When backward has produced every gradient of a bucket (a post-accumulate
  hook per parameter), the bucket is reduce-scattered to the owners with uneven shares:
  one alltoall sends each owner its part of the buffer, and the owner sums the N parts
  it receives (hvdlite's reducescatter, like Horovod's, divides the rows evenly, and
  owners' shares are not even). This overlaps the rest of backward.
- *Step.* ``step()`` waits for the buckets, gives the owned parameters their reduced
  gradients, steps :attr:`optim`, and allgathers each bucket's owned parameters so that
  every rank has every parameter again.
"""
from __future__ import annotations

import copy
import weakref
from collections import defaultdict
from typing import Any, Callable, Iterable

import torch

from hvdlite.common import ops as _ops
from hvdlite.common.process_set_table import ProcessSet, global_process_set
from hvdlite.torch.functions import allgather_object, broadcast_object
from hvdlite.torch.mpi_ops import (Average, Max, Sum, allgather_async, allreduce, allreduce_async,
                                   alltoall_async, synchronize)

DEFAULT_BUCKET_CAP_MB = 4.0
_instances: dict[int, int] = defaultdict(int)   # by process set id


def _next_index(process_set_id: int) -> int:
    """The number of this optimizer among those over its process set, which names its
    requests: counted per set, it agrees on every member however many optimizers of
    other sets each rank has built."""
    _instances[process_set_id] += 1
    return _instances[process_set_id]


class _Bucket:
    """Parameters whose gradients are reduced together, laid out by owner."""

    def __init__(self, params: list[torch.Tensor], owner: dict[torch.Tensor, int], size: int,
                 name: str) -> None:
        self.name = name
        by_rank: list[list[torch.Tensor]] = [[] for _ in range(size)]
        for p in params:
            by_rank[owner[p]].append(p)
        self.by_rank = by_rank
        self.order = [p for ps in by_rank for p in ps]           # the flat buffer's layout
        self.splits = [sum(p.numel() for p in ps) for ps in by_rank]
        self.numel = sum(self.splits)
        self.params = set(params)
        self.dtype, self.device = params[0].dtype, params[0].device
        self.passes: dict[torch.Tensor, int] = {}   # backward passes seen per parameter
        self.handle: Any = None


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """Optimizer-state sharding (ZeRO stage 1) with PyTorch's API.

    ``params`` and ``**defaults`` are what ``optimizer_class`` takes; every rank must pass
    the same parameters in the same order. :attr:`optim` is the local optimizer over this
    rank's share. ``op`` (hvdlite's addition) is ``hvd.Average`` (the default, as
    ``DistributedOptimizer``) or ``hvd.Sum``. ``bucket_cap_mb`` bounds a bucket's size.
    ``backward_passes_per_step`` (as ``DistributedOptimizer``'s): the number of backward
    passes whose gradients are summed locally before they are reduced; a bucket leaves
    once the last pass has produced its gradients.
    ``process_group`` (or ``process_set``, Horovod's name) is ``None`` for the whole world
    or an hvdlite :class:`~hvdlite.ProcessSet` registered on every rank: the optimizer
    then shards over the set's ranks only, and is built only on them; ``rank``,
    ``world_size`` and the ``to`` of :meth:`consolidate_state_dict` count within the set,
    as PyTorch's do within a process group. ``overlap_with_ddp`` is refused: without DDP
    the gradient reduction already overlaps backward.
    ``parameters_as_bucket_view`` is accepted and changes nothing."""

    def __init__(self, params: Iterable[Any], optimizer_class: type[torch.optim.Optimizer],
                 process_group: Any = None, parameters_as_bucket_view: bool = False,
                 overlap_with_ddp: bool = False, *, op: int = Average,
                 bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB, backward_passes_per_step: int = 1,
                 process_set: Any = None, **defaults: Any) -> None:
        if process_group is not None and process_set is not None:
            raise ValueError("pass the ranks to shard over as process_group or as process_set, not both")
        process_set = process_group if process_group is not None else process_set
        if process_set is global_process_set:
            process_set = None
        if process_set is not None and not isinstance(process_set, ProcessSet):
            raise ValueError("hvdlite's ZeroRedundancyOptimizer shards over hvdlite's ranks: pass "
                             "process_group=None (the world) or an hvdlite ProcessSet, not "
                             f"{type(process_set).__name__}")
        if process_set is not None and process_set.included() is False:
            raise ValueError(f"rank {_ops.current_rank()} is not in {process_set}: build the "
                             f"ZeroRedundancyOptimizer of a process set on its members only")
        if overlap_with_ddp:
            raise ValueError("overlap_with_ddp=True is for DDP's communication hook; hvdlite's "
                             "ZeroRedundancyOptimizer reduces the gradients itself and already "
                             "overlaps backward, so no DDP is needed")
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_class must be a torch.optim.Optimizer class, not {optimizer_class!r}")
        if op not in (Average, Sum):
            raise ValueError("ZeroRedundancyOptimizer reduces gradients with hvd.Average or hvd.Sum")
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be positive, not {bucket_cap_mb}")
        if int(backward_passes_per_step) != backward_passes_per_step or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be a positive integer, not {backward_passes_per_step!r}")
        super().__init__(params, defaults)
        self.optimizer_class = optimizer_class
        self.parameters_as_bucket_view = parameters_as_bucket_view
        self.op = op
        self.bucket_bytes = int(bucket_cap_mb * 1024 * 1024)
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.process_set = process_set
        with self._scope():             # checks that the set is registered
            self.rank, self.world_size = _ops.current_rank(), _ops.current_size()
        # World ranks of the ranks it shards over (roots of broadcasts are world ranks).
        self._world_ranks = list(process_set.ranks) if process_set is not None else list(range(self.world_size))
        self._index = _next_index(process_set.process_set_id if process_set is not None else 0)
        self._owner: dict[torch.Tensor, int] = {}
        self._loads = [0] * self.world_size       # elements owned per rank
        self._hooks: dict[torch.Tensor, Any] = {}
        weakref.finalize(self, lambda hooks: [h.remove() for h in hooks.values()], self._hooks)
        self._buckets: list[_Bucket] = []
        self._bucket_of: dict[torch.Tensor, _Bucket] = {}
        self._consolidated: dict[str, Any] | None = None
        self._reduced = False                     # this step's gradients are with their owners
        self.optim: torch.optim.Optimizer | None = None
        self._partition(self._all_params())
        self.optim = optimizer_class(self._local_groups(), **defaults)
        self._build_buckets()

    def _scope(self) -> Any:
        """Inside, ``_ops.current_rank()``/``current_size()`` count within this
        optimizer's ranks (its collectives take ``process_set=`` themselves)."""
        return _ops.process_set_scope(self.process_set)

    # -- partition and buckets -----------------------------------------------------------

    def _all_params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def _partition(self, params: list[torch.Tensor]) -> None:
        """Give each new parameter an owner: largest first, to the least-loaded rank (ties
        to the lower rank), as PyTorch's ZeroRedundancyOptimizer partitions."""
        for p in sorted((p for p in params if p not in self._owner), key=lambda p: -p.numel()):
            r = min(range(self.world_size), key=lambda k: (self._loads[k], k))
            self._owner[p] = r
            self._loads[r] += p.numel()

    def _local_groups(self) -> list[dict[str, Any]]:
        """Every group of :attr:`param_groups` with only this rank's parameters (a group
        may be empty here), so that group i of :attr:`optim` is group i of this one."""
        return [{**{k: v for k, v in g.items() if k != "params"},
                 "params": [p for p in g["params"] if self._owner[p] == self.rank]}
                for g in self.param_groups]

    def _build_buckets(self) -> None:
        """Buckets of trainable parameters in reverse registration order, one dtype and
        device each, of at most ``bucket_cap_mb`` (a larger parameter alone)."""
        for b in self._buckets:
            if b.handle is not None:
                raise RuntimeError("ZeroRedundancyOptimizer: parameter groups changed while gradients "
                                   "were in flight; call step() first")
        self._buckets, self._bucket_of = [], {}
        open_: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = defaultdict(list)
        sizes: dict[tuple[torch.dtype, torch.device], int] = defaultdict(int)

        def close(key: tuple[torch.dtype, torch.device]) -> None:
            if open_[key]:
                b = _Bucket(open_[key], self._owner, self.world_size,
                            f"zero.{self._index}.bucket.{len(self._buckets)}")
                self._buckets.append(b)
                for p in b.order:   # a list: the same order on every rank (not the set)
                    self._bucket_of[p] = b
            open_[key], sizes[key] = [], 0

        for p in reversed([p for p in self._all_params() if p.requires_grad]):
            key = (p.dtype, p.device)
            nbytes = p.numel() * p.element_size()
            if open_[key] and sizes[key] + nbytes > self.bucket_bytes:
                close(key)
            open_[key].append(p)
            sizes[key] += nbytes
        for key in list(open_):
            close(key)
        ref = weakref.ref(self)
        for p in self._bucket_of:
            if p not in self._hooks:
                def hook(param: torch.Tensor) -> None:
                    opt = ref()
                    if opt is not None:
                        opt._grad_ready(param)
                self._hooks[p] = p.register_post_accumulate_grad_hook(hook)

    # -- gradients -----------------------------------------------------------------------

    def _grad_ready(self, p: torch.Tensor) -> None:
        b = self._bucket_of.get(p)
        if b is None or self.world_size == 1:
            return
        seen = b.passes.get(p, 0) + 1
        if b.handle is not None or self._reduced or seen > self.backward_passes_per_step:
            raise RuntimeError(f"ZeroRedundancyOptimizer: a gradient was computed more than "
                               f"backward_passes_per_step={self.backward_passes_per_step} times before "
                               f"step() (bucket {b.name}); raise backward_passes_per_step to accumulate "
                               f"more backward passes locally")
        b.passes[p] = seen
        if len(b.passes) == len(b.params) and all(k == self.backward_passes_per_step for k in b.passes.values()):
            self._submit(b)

    def _submit(self, b: _Bucket) -> None:
        flat = torch.empty(b.numel, dtype=b.dtype, device=b.device)
        at = 0
        for p in b.order:
            n = p.numel()
            if p.grad is None:      # another rank may have a gradient for it: send zeros
                flat[at:at + n].zero_()
            else:
                flat[at:at + n].copy_(p.grad.reshape(-1))
            at += n
        b.handle = alltoall_async(flat, splits=b.splits, name=b.name, process_set=self.process_set)

    def reduce_gradients(self) -> None:
        """Finish the gradient reduction of this step: afterwards each parameter this rank
        owns has the average (or sum) over ranks of its gradient. ``step()`` calls it
        (once a step: after :meth:`clip_grad_norm_` it does nothing)."""
        if not self._fits_world():
            with self._scope():
                now = _ops.current_rank(), _ops.current_size()
            raise RuntimeError(f"ZeroRedundancyOptimizer was built for rank {self.rank} of {self.world_size}, "
                               f"but this is now rank {now[0]} of {now[1]} (an elastic reset?): its shards "
                               f"no longer fit; in an elastic job keep it in hvd.elastic.TorchState, which "
                               f"shards it again after a reset, or build it again")
        if self.world_size == 1 or self._reduced:
            return
        # As DistributedOptimizer: a parameter no rank has a gradient for keeps grad None
        # (so the optimizer leaves it alone); every rank says which gradients it has.
        params = list(self._bucket_of)
        flags = torch.tensor([p.grad is not None for p in params], dtype=torch.uint8)
        flag_handle = allreduce_async(flags, name=f"zero.{self._index}.has_grad.{len(params)}", op=Max,
                                      process_set=self.process_set)
        for b in self._buckets:
            if b.handle is None:    # some gradient never came (an unused parameter): the rest now
                self._submit(b)
        present = {p for p, f in zip(params, synchronize(flag_handle).tolist()) if f}
        mine = self.rank
        for b in self._buckets:
            out, _ = synchronize(b.handle)
            b.handle, b.passes = None, {}
            n = b.splits[mine]
            if n == 0:
                continue
            reduced = out.view(self.world_size, n).sum(0)
            if self.op == Average:
                reduced.div_(self.world_size)
            at = 0
            for p in b.by_rank[mine]:
                k = p.numel()
                p.grad = reduced[at:at + k].view_as(p) if p in present else None
                at += k
        self._reduced = True

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False) -> torch.Tensor:
        """Clip the gradients by their norm over the whole model, as
        ``torch.nn.utils.clip_grad_norm_(model.parameters(), ...)`` would on the averaged
        gradients (FairScale's sharded optimizer has the same method). Call it between
        backward and ``step()`` on every rank. It reduces the gradients to their owners
        first (``step()`` then does not again); each rank takes the norm of its own
        parameters' gradients, one allreduce combines the ranks' parts, and the owned
        gradients are scaled. Returns the total norm, the same on every rank.

        ``torch.nn.utils.clip_grad_norm_`` itself would see other owners' gradients
        unreduced: use this method instead."""
        self.reduce_gradients()
        norm_type = float(norm_type)
        grads = [p.grad for p in self._all_params() if self._owner[p] == self.rank and p.grad is not None]
        if norm_type == float("inf"):
            local = max((g.detach().abs().max().double() for g in grads), default=torch.zeros((), dtype=torch.float64))
            total = allreduce(local.reshape(1).cpu(), op=Max, name=f"zero.{self._index}.grad_norm",
                              process_set=self.process_set)[0]
        else:
            local = sum((torch.linalg.vector_norm(g.detach().double(), norm_type) ** norm_type for g in grads),
                        torch.zeros((), dtype=torch.float64))
            total = allreduce(local.reshape(1).cpu(), op=Sum, name=f"zero.{self._index}.grad_norm",
                              process_set=self.process_set)[0]
            total = total ** (1.0 / norm_type)
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(f"the total norm of order {norm_type} of the gradients is non-finite, so it "
                               f"cannot be clipped (error_if_nonfinite=False skips this check)")
        coef = min(1.0, float(max_norm) / (float(total) + 1e-6))
        for g in grads:
            g.detach().mul_(coef)
        return total.to(grads[0].dtype if grads else torch.float32)

    # -- step ----------------------------------------------------------------------------

    def _sync_groups(self, src: list[dict[str, Any]], dst: list[dict[str, Any]]) -> None:
        for s, d in zip(src, dst):
            for k, v in s.items():
                if k != "params":
                    d[k] = v

    @torch.no_grad()
    def _share_parameters(self) -> None:
        """Allgather each bucket's owned parameters so every rank has all of them."""
        if self.world_size == 1:
            return
        pending = []
        for b in self._buckets:
            mine = b.by_rank[self.rank]
            part = (torch.cat([p.detach().reshape(-1) for p in mine]) if mine
                    else torch.empty(0, dtype=b.dtype, device=b.device))
            pending.append((b, allgather_async(part, name=b.name + ".params", process_set=self.process_set)))
        for b, h in pending:
            full = synchronize(h)
            at = 0
            for r, ps in enumerate(b.by_rank):
                for p in ps:
                    k = p.numel()
                    if r != self.rank:
                        p.copy_(full[at:at + k].view_as(p))
                    at += k

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Reduce the gradients to their owners, step :attr:`optim` on this rank's share,
        and share the updated parameters with every rank. A ``closure`` is evaluated once,
        before the reduction (so optimizers that re-evaluate it, such as LBFGS, are not
        supported)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_gradients()
        self._sync_groups(self.param_groups, self.optim.param_groups)  # e.g. an LR scheduler's lr
        self.optim.step()
        self._sync_groups(self.optim.param_groups, self.param_groups)
        self._share_parameters()
        self._reduced = False
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._reduced = False
        for p in self._all_params():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (on every rank alike): its parameters get owners, this rank's share
        joins :attr:`optim`, and the buckets are laid out again."""
        super().add_param_group(param_group)
        if getattr(self, "optim", None) is None:  # from Optimizer.__init__: set up later
            return
        self._partition(self.param_groups[-1]["params"])
        self.optim.add_param_group(self._local_groups()[-1])
        self._build_buckets()

    # -- state ---------------------------------------------------------------------------

    def _global_index(self) -> dict[torch.Tensor, int]:
        return {p: i for i, p in enumerate(self._all_params())}

    def _my_share(self) -> tuple[dict[int, Any], list[dict[str, Any]]]:
        """This rank's state by global parameter number, and :attr:`optim`'s groups."""
        index = self._global_index()
        local = self.optim.state_dict()
        local_params = [p for g in self.optim.param_groups for p in g["params"]]
        return {index[local_params[k]]: v for k, v in local["state"].items()}, local["param_groups"]

    def _whole(self, state: dict[int, Any], local_groups: list[dict[str, Any]]) -> dict[str, Any]:
        """A whole state dict from every share's state and this rank's groups."""
        index = self._global_index()
        groups = [{**{k: v for k, v in lg.items() if k != "params"}, "params": [index[p] for p in g["params"]]}
                  for g, lg in zip(self.param_groups, local_groups)]
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Collect the whole optimizer state on rank ``to`` (a collective: every rank
        calls it; with a process set, ``to`` is a rank within the set and every member
        calls it); :meth:`state_dict` then returns it there. Each rank's share travels in
        turn, so no rank holds more than its own share and one other at a time, except
        ``to``, which keeps them all."""
        if not 0 <= to < self.world_size:
            raise ValueError(f"consolidate_state_dict: to={to} is not a rank of the {self.world_size} "
                             f"this optimizer shards over")
        mine, local_groups = self._my_share()
        state: dict[int, Any] = {}
        for r in range(self.world_size):
            got = broadcast_object(mine if r == self.rank else None, root_rank=self._world_ranks[r],
                                   name=f"zero.{self._index}.consolidate.{r}", process_set=self.process_set)
            if self.rank == to:     # a snapshot: its own share is copied, not the live state
                state.update(copy.deepcopy(got) if r == to else got)
        self._consolidated = self._whole(state, local_groups) if self.rank == to else None

    def state_dict(self) -> dict[str, Any]:
        """The whole optimizer state, in ``optimizer_class``'s own format with parameters
        numbered over all groups. Only on the rank of the last
        :meth:`consolidate_state_dict`, as in PyTorch."""
        if self._consolidated is None:
            raise RuntimeError("call consolidate_state_dict(to=...) on every rank first; state_dict() "
                               "then returns the whole state on that rank")
        return self._consolidated

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a whole state (from :meth:`state_dict`, or from ``optimizer_class``'s own
        ``state_dict()`` over the same parameters): this rank keeps its share."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(sg["params"]) != len(g["params"]) for sg, g in zip(groups, self.param_groups)):
            raise ValueError("the state dict's parameter groups do not match this optimizer's")
        saved_ids = [sid for sg in groups for sid in sg["params"]]
        ids = dict(zip(saved_ids, self._all_params()))
        local_params = [p for g in self.optim.param_groups for p in g["params"]]
        local_of = {p: k for k, p in enumerate(local_params)}
        local_state = {local_of[ids[sid]]: v for sid, v in state_dict["state"].items()
                       if self._owner[ids[sid]] == self.rank}
        local_groups = []
        for sg, lg in zip(groups, self.optim.param_groups):
            local_groups.append({**{k: v for k, v in sg.items() if k != "params"},
                                 "params": [local_of[p] for p in lg["params"]]})
        self.optim.load_state_dict({"state": local_state, "param_groups": local_groups})
        self._sync_groups(self.optim.param_groups, self.param_groups)

    # -- elastic jobs (hvd.elastic.TorchState) -------------------------------------------

    def _fits_world(self) -> bool:
        """Its shards were laid out for the ranks there are now."""
        with self._scope():
            return (self.rank, self.world_size) == (_ops.current_rank(), _ops.current_size())

    def _gathered_state(self) -> dict[str, Any]:
        """The whole state on every rank, its tensors copied to the CPU (a collective:
        every rank's share goes to all). What an elastic commit keeps, so that a lost
        rank's share survives on the others."""
        mine, local_groups = self._my_share()
        mine = {k: {n: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                    for n, v in st.items()} for k, st in mine.items()}
        state: dict[int, Any] = {}
        for share in allgather_object(mine, name=f"zero.{self._index}.gather", process_set=self.process_set):
            state.update(share)
        return self._whole(state, local_groups)

    def _reshard(self) -> None:
        """Shard again over the ranks there are now (after an elastic reset): new owners,
        a new :attr:`optim` with no state (the caller loads the whole state next), new
        buckets. The same local work on every rank; gradients in flight in the old world
        are dropped."""
        for b in self._buckets:
            b.handle = None
        if self.process_set is not None:
            if not self._fits_world():
                raise RuntimeError("a ZeroRedundancyOptimizer over a process set cannot follow an elastic "
                                   "reset that changed the set: build it again after the reset")
            self._build_buckets()
            self._reduced = False
            return
        self.rank, self.world_size = _ops.current_rank(), _ops.current_size()
        self._world_ranks = list(range(self.world_size))
        self._owner, self._loads = {}, [0] * self.world_size
        self._partition(self._all_params())
        self.optim = self.optimizer_class(self._local_groups(), **self.defaults)
        self._build_buckets()
        self._consolidated = None
        self._reduced = False

    # -- figures -------------------------------------------------------------------------

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (tensors in :attr:`optim`'s state)."""
        return sum(v.numel() * v.element_size() for s in self.optim.state.values()
                   for v in s.values() if isinstance(v, torch.Tensor))

    def bytes_per_step(self) -> int:
        """Bytes this rank sends in a step: every other owner's part of each bucket's
        gradients, and its own parameters to every other rank."""
        n = self.world_size
        if n == 1:
            return 0
        total = 0
        for b in self._buckets:
            es = torch.empty(0, dtype=b.dtype).element_size()
            total += (b.numel - b.splits[self.rank]) * es + b.splits[self.rank] * (n - 1) * es
        return total

    def __repr__(self) -> str:
        return f"ZeroRedundancyOptimizer({self.optimizer_class.__name__}, rank {self.rank} of {self.world_size})"
