"""ZeRO stages 1 to 3 on hvdlite's collectives: each rank keeps the optimizer state (at
stage 2 also the reduced gradients, at stage 3 also the parameters) of one equal shard
of the parameters, as DeepSpeed does, under PyTorch's name and API::

    opt = hvd.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    loss.backward()
    opt.step()        # gradients reduced to the shards, each rank steps its shard, parameters shared

It replaces ``DistributedOptimizer`` (it reduces the gradients itself); it is not wrapped
in one, and no DDP is needed.

How a step runs (``docs/zero.md``):

- *Shards.* Each parameter group's trainable parameters of one dtype and device are laid
  end to end, in the order backward produces their gradients, and the flat buffer is cut
  into N equal shards (padded to a multiple of :data:`ALIGN` elements); a parameter may
  span two shards. The local optimizer (:attr:`optim`) steps rank r's pieces of
  parameters (views into the parameters at stages 1 and 2, into a shard buffer at
  stage 3 or offloaded), so no rank holds more than 1/N of the optimizer state and one
  alignment unit, however the model's size is spread over its parameters.
- *Buckets.* Each flat buffer is cut into buckets of about ``bucket_cap_mb``.
- *Gradients.* When backward has produced every gradient of a bucket (a post-accumulate
  hook per parameter), the bucket is reduce-scattered to the shards: one alltoall sends
  each rank the part of the bucket in its shard (uneven: a bucket crosses shards
  anywhere), and the rank sums the N parts it receives. This overlaps the rest of
  backward. At stage 2 the bucket's full gradients are freed once sent.
- *Step.* ``step()`` waits for the buckets, gives the pieces their reduced gradients,
  steps :attr:`optim`, and allgathers each flat buffer's shards so that every rank has
  every parameter again.
- *Stage 3.* The parameters are freed once sharded; hooks on each module that holds
  parameters gather them just before it runs, forward and backward (prefetching the
  next module), and free them after, as FSDP does; the step updates the shards only.
"""
from __future__ import annotations

import contextlib
import copy
import math
import weakref
from collections import defaultdict
from typing import Any, Callable, Iterable, Iterator

import torch

from hvdlite.common import ops as _ops
from hvdlite.common.process_set_table import ProcessSet, global_process_set
from hvdlite.torch.functions import allgather_object, broadcast_object
from hvdlite.torch.mpi_ops import (Average, Max, Sum, allgather, allgather_async, allreduce, alltoall_async,
                                    poll, synchronize)

DEFAULT_BUCKET_CAP_MB = 4.0
_instances: dict[int, int] = defaultdict(int)   # by process set id


def _next_index(process_set_id: int) -> int:
    """The number of this optimizer among those over its process set, which names its
    requests: counted per set, it agrees on every member however many optimizers of
    other sets each rank has built."""
    _instances[process_set_id] += 1
    return _instances[process_set_id]


#: Shards begin at multiples of this many elements.
ALIGN = 16
#: Optimizer state that is one number for a whole parameter, never cut into shards.
_SCALAR_STATE = frozenset({"step", "eta", "mu", "mu_product"})
#: Optimizers that need whole parameters (or a closure), which shards cannot give them.
_WHOLE_PARAMETER_OPTIMIZERS = ("LBFGS", "Adafactor", "SparseAdam")


#: For tests where no GPU is: ``offload_optimizer="cpu"`` with CPU parameters takes the
#: offloaded path (a separate shard in host memory and its copy "on the device"), so
#: that its logic runs; with CPU parameters it otherwise costs nothing.
_OFFLOAD_CPU_PARAMETERS = False


def _has_fused_cpu_step(optimizer_class: type) -> bool:
    """PyTorch's optimizers with a fused kernel for CPU tensors."""
    return any(issubclass(optimizer_class, c) for c in (torch.optim.Adam, torch.optim.AdamW))


@torch.no_grad()
def _copy_into_pieces(pieces: Iterable["_Piece"]) -> None:
    """Each piece takes its parameter's current values."""
    for piece in pieces:
        piece.tensor.copy_(piece.param.detach().reshape(-1)[piece.lo:piece.hi])


class _Piece:
    """The part of one parameter that falls in this rank's shard of its flat buffer:
    ``param.view(-1)[lo:hi]``. :attr:`tensor` is the local optimizer's parameter: a view
    into the shard's master copy, or, where the shard has none (:attr:`_Flat.views`), into
    the parameter itself. :attr:`grad` is where its reduced gradient landed this step
    when that is not a slice of the shard's gradients."""

    def __init__(self, param: torch.Tensor, lo: int, hi: int, tensor: torch.Tensor) -> None:
        self.param, self.lo, self.hi, self.tensor = param, lo, hi, tensor
        self.grad: torch.Tensor | None = None

    def own_slice(self) -> torch.Tensor:
        """A fresh leaf view of the parameter's elements ``[lo, hi)``."""
        return self.param.detach().view(-1)[self.lo:self.hi]

    def grad_target(self) -> torch.Tensor:
        """Stage 1 without master copies: where this piece's reduced gradient goes, the
        same elements of the parameter's own gradient (sent already, no longer needed as
        it was); a separate tensor where this rank had no gradient for the parameter."""
        g = self.param.grad
        if g is not None and g.is_contiguous():
            self.grad = g.detach().view(-1)[self.lo:self.hi]
        else:
            self.grad = torch.empty(self.hi - self.lo, dtype=self.param.dtype, device=self.param.device)
        return self.grad


class _Flat:
    """One parameter group's trainable parameters of one dtype and device, laid end to
    end in backward's order (reverse registration) and cut into ``size`` equal shards of
    :attr:`shard` elements (a multiple of :data:`ALIGN`; the last shard is padded). A
    parameter may span two or more shards. :attr:`master` is this rank's shard, in
    ``master_dtype`` (the parameters' own, or float32 for 16-bit ones at stage 3), and
    :attr:`grad` its reduced gradients.

    Where the parameters stay whole on every rank in their own dtype (stages 1 and 2, not
    offloaded), the shard needs no copy of them: :attr:`views` is then true, there is no
    :attr:`master`, and the pieces are views into the parameters. At stage 1 the
    parameters keep their full gradients until the step anyway, so the reduced ones land
    in them too (``grads_in_params``: no :attr:`grad`). That is the 1/N of the model
    each of these saves per rank."""

    def __init__(self, params: list[torch.Tensor], size: int, rank: int, name: str,
                 master_dtype: torch.dtype | None = None, numels: list[int] | None = None,
                 values: torch.Tensor | None = None, offload: bool = False,
                 views: bool = False, grads_in_params: bool = False, pin_memory: bool = True) -> None:
        """``numels``: the parameters' sizes where they are freed (stage 3); ``values``:
        the whole flat buffer to take the shard from, instead of the parameters;
        ``offload``: the shard and its gradients in host memory (pinned for a GPU), with
        a copy of the shard in the parameters' dtype on their device
        (:attr:`device_shard`, what the gathers send); ``views`` and
        ``grads_in_params``: see the class (the caller checks that they apply);
        ``pin_memory``: an offloaded shard of GPU parameters in pinned host memory."""
        self.params = params
        self.name = name
        self.offset: dict[torch.Tensor, int] = {}
        self.size: dict[torch.Tensor, int] = {}     # elements (the parameter may be freed later)
        at = 0
        for p, n in zip(params, numels or [p.numel() for p in params]):
            self.offset[p] = at
            self.size[p] = n
            at += n
        self.numel = at
        self.shard = -(-at // (size * ALIGN)) * ALIGN
        self.dtype, self.device = params[0].dtype, params[0].device
        self.lo = rank * self.shard                      # this rank's range of the flat buffer
        self.hi = min(self.lo + self.shard, self.numel)
        self.master_dtype = master_dtype or self.dtype
        self.offload = offload
        self.views = views
        host = torch.device("cpu") if offload else self.device
        pin = offload and pin_memory and self.device.type == "cuda"
        try:
            self.master = None if views else torch.zeros(self.shard, dtype=self.master_dtype, device=host,
                                                         pin_memory=pin)
            self.grad = None if grads_in_params else torch.zeros(self.shard, dtype=self.master_dtype,
                                                                 device=host, pin_memory=pin)
        except RuntimeError as exc:
            if not pin:
                raise
            raise RuntimeError(f"offload_optimizer='cpu' keeps the shards in pinned host memory, which this "
                               f"machine refused ({exc}); pass offload_optimizer={{'device': 'cpu', "
                               f"'pin_memory': False}} for pageable memory (slower copies)") from None
        self.device_shard = (torch.empty(self.shard, dtype=self.dtype, device=self.device)
                             if offload else None)
        self.pieces: list[_Piece] = []
        for p in params:
            a, b = self.part_of(p, rank)
            if a < b:
                o = self.offset[p] - self.lo
                piece = _Piece(p, a, b, None)
                piece.tensor = (piece.own_slice() if views else self.master[o + a:o + b]).requires_grad_(True)
                self.pieces.append(piece)
        if values is not None:
            self.take_whole(values)
        elif not views:
            _copy_into_pieces(self.pieces)
            self.refresh()

    def rebind(self) -> None:
        """:attr:`views`: pieces whose parameter was given new storage (``p.data = ...``)
        view it again; the local optimizer keeps the same tensors."""
        for piece in self.pieces:
            if piece.tensor.data_ptr() != piece.param.data_ptr() + piece.lo * piece.param.element_size():
                piece.tensor.data = piece.own_slice()

    def shard_values(self) -> torch.Tensor:
        """A copy of this rank's shard, :attr:`shard` elements (zeros past the end)."""
        if not self.views:
            return self.master.detach().clone()
        out = torch.zeros(self.shard, dtype=self.dtype, device=self.device)
        for piece in self.pieces:
            o = self.offset[piece.param] + piece.lo - self.lo
            out[o:o + piece.hi - piece.lo].copy_(piece.tensor.detach())
        return out

    @torch.no_grad()
    def take_whole(self, values: torch.Tensor) -> None:
        """This rank's shard takes its part of ``values``, the whole flat buffer."""
        if self.views:
            for piece in self.pieces:
                o = self.offset[piece.param]
                piece.tensor.copy_(values[o + piece.lo:o + piece.hi])
            return
        self.master.zero_()
        if self.hi > self.lo:
            self.master[:self.hi - self.lo].copy_(values[self.lo:self.hi])
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Offloaded: the device's copy of the shard takes the master's values (after a
        step or anything else that wrote the master), in the order of the device's
        current stream."""
        if self.device_shard is not None:
            self.device_shard.copy_(self.master, non_blocking=True)

    def source(self, a: int, b: int) -> torch.Tensor:
        """Elements ``[a, b)`` of this rank's shard as the gathers send them: on the
        parameters' device (the master's values; for an offloaded shard its device
        copy; with :attr:`views`, the pieces' values packed)."""
        if self.views:
            parts = []
            for piece in self.pieces:
                o = self.offset[piece.param] + piece.lo - self.lo
                lo, hi = max(a, o), min(b, o + piece.hi - piece.lo)
                if lo < hi:
                    parts.append(piece.tensor.detach()[lo - o:hi - o])
            return torch.cat(parts) if parts else torch.empty(0, dtype=self.dtype, device=self.device)
        return (self.master if self.device_shard is None else self.device_shard)[a:b]

    def range_of(self, rank: int) -> tuple[int, int]:
        lo = rank * self.shard
        return lo, max(lo, min(lo + self.shard, self.numel))

    def part_of(self, p: torch.Tensor, rank: int) -> tuple[int, int]:
        """The elements ``[a, b)`` of ``p`` (flattened) in ``rank``'s shard (a == b: none)."""
        lo, hi = self.range_of(rank)
        o = self.offset[p]
        a, b = max(o, lo) - o, min(o + self.size[p], hi) - o
        return (a, b) if a < b else (0, 0)


class _Unit:
    """Stage 3: the parameters a module holds itself (not its children's), gathered from
    the shards just before the module runs, forward or backward, and freed after."""

    def __init__(self, module: torch.nn.Module, params: list[torch.Tensor], name: str) -> None:
        self.module, self.params, self.name = module, params, name
        self.held = False              # this unit keeps its parameters gathered
        self.pending: list[Any] = []   # gathers in flight: (flat, params, handle)
        self.accumulated: set[torch.Tensor] = set()   # gradients produced in this backward


class _Bucket:
    """A run of one flat buffer's parameters whose gradients are reduced together: the
    elements ``[lo, hi)`` of the flat buffer, split by the shard each falls in."""

    def __init__(self, flat: _Flat, params: list[torch.Tensor], size: int, name: str) -> None:
        self.flat, self.order, self.name = flat, params, name
        self.lo = flat.offset[params[0]]
        self.hi = flat.offset[params[-1]] + flat.size[params[-1]]
        self.splits = []
        for r in range(size):
            a, b = flat.range_of(r)
            self.splits.append(max(0, min(b, self.hi) - max(a, self.lo)))
        self.params = set(params)
        self.passes: dict[torch.Tensor, int] = {}   # backward passes seen per parameter
        self.present: list[bool] | None = None      # which gradients there were, when sent
        # This rank's pieces in the bucket: (piece, offset in its part, elements).
        start = max(self.lo, flat.lo)
        self.mine = [(piece, flat.offset[piece.param] + piece.lo - start, piece.hi - piece.lo)
                     for piece in flat.pieces if piece.param in self.params]
        self.handles: list[Any] = []   # reductions in flight, oldest first
        self.sent = 0        # reductions sent this step (stages 2 and 3: one per backward pass)
        self.landed = 0      # of them, summed into the shard


def _offload_setting(value: Any) -> tuple[str | None, bool]:
    """``offload_optimizer`` as given (None, "none", "cpu", or DeepSpeed's section
    ``{"device": ..., "pin_memory": ...}``): (``"cpu"`` or None, whether to pin)."""
    pin = True
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"device", "pin_memory"})
        if unknown:
            raise ValueError(f"offload_optimizer: {', '.join(unknown)} not supported (hvdlite takes its 'device' "
                             f"and 'pin_memory')")
        pin = value.get("pin_memory", False)    # DeepSpeed's default
        if not isinstance(pin, bool):
            raise ValueError(f"offload_optimizer's pin_memory must be True or False, not {pin!r}")
        value = value.get("device", "none")
    if value in (None, "none"):
        return None, pin
    if value == "cpu":
        return "cpu", pin
    raise ValueError(f"offload_optimizer must be None, 'cpu' (master weights and optimizer state in host memory, "
                     f"the step on the CPU) or DeepSpeed's {{'device': 'cpu'}}, not {value!r}"
                     + ("; NVMe offload is not supported" if value == "nvme" else ""))


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """Optimizer-state sharding (ZeRO stages 1 to 3) with PyTorch's API.

    ``params`` and ``**defaults`` are what ``optimizer_class`` takes; every rank must pass
    the same parameters in the same order. :attr:`optim` is the local optimizer over this
    rank's shard. ``stage`` (hvdlite's addition, DeepSpeed's meaning): 1 shards the
    optimizer state; 2 also frees each bucket's full gradients once they are sent, so
    that a rank keeps only its shard's reduced gradients; 3 also shards the parameters of
    ``model`` (required then), gathering each module's just before it runs (see
    :meth:`gathered_parameters` for saving them). ``op`` (hvdlite's addition) is
    ``hvd.Average`` (the default, as ``DistributedOptimizer``) or ``hvd.Sum``.
    ``bucket_cap_mb`` bounds a bucket's size. ``backward_passes_per_step`` (as
    ``DistributedOptimizer``'s): the number of backward passes whose gradients are summed
    locally before they are reduced; a bucket leaves once the last pass has produced its
    gradients.
    ``process_group`` (or ``process_set``, Horovod's name) is ``None`` for the whole world
    or an hvdlite :class:`~hvdlite.ProcessSet` registered on every rank: the optimizer
    then shards over the set's ranks only, and is built only on them; ``rank``,
    ``world_size`` and the ``to`` of :meth:`consolidate_state_dict` count within the set,
    as PyTorch's do within a process group. ``overlap_with_ddp`` is refused: without DDP
    the gradient reduction already overlaps backward.
    ``parameters_as_bucket_view`` is accepted and changes nothing.
    ``offload_optimizer="cpu"`` (ZeRO-Offload, DeepSpeed's name): for parameters on a GPU,
    this rank's shard of master weights (float32 for 16-bit parameters) and its optimizer
    state live in pinned host memory and the step runs on the CPU (with PyTorch's fused
    CPU kernel for Adam and AdamW); each bucket's reduced gradients are copied to the host
    on a side stream as soon as they are in, and the updated shard goes back to the GPU
    for the gathers. With CPU parameters it is accepted and changes nothing.
    DeepSpeed's section ``{"device": "cpu", "pin_memory": False}`` is taken too.

    DeepSpeed's names (see also :func:`from_deepspeed_config`): ``reduce_bucket_size``
    (elements per gradient bucket, instead of ``bucket_cap_mb``),
    ``allgather_bucket_size`` (elements per allgather of the parameters after a step at
    stages 1 and 2; by default the gradient buckets), ``overlap_comm`` (``False``: each
    bucket's reduction is waited for where it is sent, instead of overlapping the rest of
    backward) and ``contiguous_gradients`` (accepted; the reduced gradients are always
    contiguous).

    The local optimizer steps pieces of parameters, so it must treat each element on its
    own, as the optimizers of ``torch.optim`` do but ``LBFGS``, ``Adafactor`` and
    ``SparseAdam`` (refused)."""

    def __init__(self, params: Iterable[Any], optimizer_class: type[torch.optim.Optimizer],
                 process_group: Any = None, parameters_as_bucket_view: bool = False,
                 overlap_with_ddp: bool = False, *, stage: int = 1, model: torch.nn.Module | None = None,
                 op: int = Average, bucket_cap_mb: float | None = None,
                 backward_passes_per_step: int = 1, process_set: Any = None,
                 offload_optimizer: str | dict[str, Any] | None = None,
                 reduce_bucket_size: int | None = None, allgather_bucket_size: int | None = None,
                 overlap_comm: bool = True, contiguous_gradients: bool = True, **defaults: Any) -> None:
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
        if optimizer_class.__name__ in _WHOLE_PARAMETER_OPTIMIZERS:
            raise ValueError(f"ZeroRedundancyOptimizer cannot shard {optimizer_class.__name__}: it needs whole "
                             f"parameters (or a closure), and each rank steps pieces of them; use an "
                             f"optimizer that treats each element on its own (SGD, Adam, AdamW, ...)")
        if stage not in (1, 2, 3):
            raise ValueError(f"stage must be 1 (optimizer state sharded), 2 (gradients too) or 3 "
                             f"(parameters too), not {stage!r}")
        if stage == 3 and not isinstance(model, torch.nn.Module):
            raise ValueError("stage 3 gathers each module's parameters just before it runs: pass the "
                             "model as model=, the torch.nn.Module whose parameters these are")
        if stage != 3 and model is not None:
            raise ValueError(f"model= is for stage 3, which shards the parameters; stage {stage} leaves "
                             f"them whole and needs no model")
        if op not in (Average, Sum):
            raise ValueError("ZeroRedundancyOptimizer reduces gradients with hvd.Average or hvd.Sum")
        offload_optimizer, pin_memory = _offload_setting(offload_optimizer)
        if bucket_cap_mb is not None and reduce_bucket_size is not None:
            raise ValueError("give the gradient buckets' size as bucket_cap_mb (MiB) or as reduce_bucket_size "
                             "(elements, DeepSpeed's name), not both")
        if bucket_cap_mb is not None and bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be positive, not {bucket_cap_mb}")
        for name, value in (("reduce_bucket_size", reduce_bucket_size),
                            ("allgather_bucket_size", allgather_bucket_size)):
            if value is not None and (int(value) != value or value < 1):
                raise ValueError(f"{name} (elements) must be a positive integer, not {value!r}")
        for name, value in (("overlap_comm", overlap_comm), ("contiguous_gradients", contiguous_gradients)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, not {value!r}")
        if int(backward_passes_per_step) != backward_passes_per_step or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be a positive integer, not {backward_passes_per_step!r}")
        super().__init__(params, defaults)
        self.optimizer_class = optimizer_class
        self.parameters_as_bucket_view = parameters_as_bucket_view
        self.stage = stage
        self.op = op
        self.bucket_bytes = int((DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * 1024 * 1024)
        self.reduce_bucket_size = None if reduce_bucket_size is None else int(reduce_bucket_size)
        self.allgather_bucket_size = None if allgather_bucket_size is None else int(allgather_bucket_size)
        self.overlap_comm = overlap_comm
        self.contiguous_gradients = contiguous_gradients
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.process_set = process_set
        self.offload_optimizer = offload_optimizer
        self._pin_memory = pin_memory
        self._copy_streams: dict[torch.device, Any] = {}   # offload: device-to-host copies
        with self._scope():             # checks that the set is registered
            self.rank, self.world_size = _ops.current_rank(), _ops.current_size()
        # World ranks of the ranks it shards over (roots of broadcasts are world ranks).
        self._world_ranks = list(process_set.ranks) if process_set is not None else list(range(self.world_size))
        self._index = _next_index(process_set.process_set_id if process_set is not None else 0)
        self._hooks: dict[torch.Tensor, Any] = {}
        weakref.finalize(self, lambda hooks: [h.remove() for h in hooks.values()], self._hooks)
        self._flats: list[list[_Flat]] = []           # per parameter group
        self._buckets: list[_Bucket] = []
        self._bucket_of: dict[torch.Tensor, _Bucket] = {}
        self._consolidated: dict[str, Any] | None = None
        self._reduced = False                     # this step's gradients are in the shards
        self.optim: torch.optim.Optimizer | None = None
        self._flats = [self._flats_of(i) for i in range(len(self.param_groups))]
        self._local_defaults = dict(defaults)
        if self._offloaded() and _has_fused_cpu_step(optimizer_class) and not (
                {"fused", "foreach"} & set(defaults)):
            # The step runs on the CPU: PyTorch's fused CPU kernel is its fastest there.
            self._local_defaults["fused"] = True
        self.optim = optimizer_class(self._local_groups(), **self._local_defaults)
        self._build_buckets()
        self._units: list[_Unit] = []
        if stage == 3:
            self._shard_model(model)

    def _scope(self) -> Any:
        """Inside, ``_ops.current_rank()``/``current_size()`` count within this
        optimizer's ranks (its collectives take ``process_set=`` themselves)."""
        return _ops.process_set_scope(self.process_set)

    # -- shards and buckets --------------------------------------------------------------

    def _all_params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def _flats_of(self, group: int, values: list[torch.Tensor] | None = None) -> list[_Flat]:
        """Group ``group``'s trainable parameters, one flat buffer per dtype and device,
        each cut into this optimizer's shards. ``values``: each flat buffer whole, to
        take the shards from (stage 3 after a reset, its parameters freed)."""
        by_key: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = defaultdict(list)
        for p in reversed(self.param_groups[group]["params"]):
            if p.requires_grad:
                by_key[(p.dtype, p.device)].append(p)
        sixteen = (torch.float16, torch.bfloat16)
        shapes = getattr(self, "_shapes", {})
        flats = []
        for k, ps in enumerate(by_key.values()):
            offload = self.offload_optimizer == "cpu" and (ps[0].device.type != "cpu" or _OFFLOAD_CPU_PARAMETERS)
            # Stages 1 and 2 keep the parameters whole: the shard can be views into them.
            views = self.stage < 3 and not offload and all(p.is_contiguous() for p in ps)
            flats.append(_Flat(ps, self.world_size, self.rank, f"zero.{self._index}.flat.{group}.{k}",
                               torch.float32 if (self.stage == 3 or offload) and ps[0].dtype in sixteen else None,
                               numels=[math.prod(shapes[p]) if p in shapes else p.numel() for p in ps],
                               values=None if values is None else values[k], offload=offload,
                               views=views, grads_in_params=views and self.stage == 1,
                               pin_memory=self._pin_memory))
        return flats

    def _offloaded(self) -> bool:
        return any(f.offload for fs in self._flats for f in fs)

    @torch.no_grad()
    def _load_shards(self, shards: list[torch.Tensor]) -> None:
        """This rank's shards (one per flat buffer, in order) take ``shards``' values."""
        for s, f in zip(shards, (f for fs in self._flats for f in fs)):
            f.master.copy_(s)
        self._masters_changed()

    def _masters_changed(self) -> None:
        """The shards' master values were written: offloaded ones go to their device."""
        for f in (f for fs in self._flats for f in fs):
            f.refresh()

    def _local_groups(self) -> list[dict[str, Any]]:
        """Every group of :attr:`param_groups` with this rank's pieces of its parameters
        (a group may have none here), so that group i of :attr:`optim` is group i of this
        one."""
        return [{**{k: v for k, v in g.items() if k != "params"},
                 "params": [piece.tensor for f in flats for piece in f.pieces]}
                for g, flats in zip(self.param_groups, self._flats)]

    def _pieces(self) -> list[_Piece]:
        return [piece for flats in self._flats for f in flats for piece in f.pieces]

    def _runs(self, cap: int, in_elements: bool, kind: str) -> list["_Bucket"]:
        """Every flat buffer cut into runs of its parameters in backward's order, each at
        most ``cap`` bytes (or elements; a larger parameter alone)."""
        runs: list[_Bucket] = []
        for flats in self._flats:
            for f in flats:
                run: list[torch.Tensor] = []
                size = 0
                for p in f.params + [None]:
                    n = 0 if p is None else f.size[p] * (1 if in_elements else p.element_size())
                    if run and (p is None or size + n > cap):
                        runs.append(_Bucket(f, run, self.world_size, f"zero.{self._index}.{kind}.{len(runs)}"))
                        run, size = [], 0
                    if p is not None:
                        run.append(p)
                        size += n
        return runs

    def _build_buckets(self) -> None:
        """Gradient buckets of at most ``bucket_cap_mb`` (or ``reduce_bucket_size``
        elements), and the runs the parameters are gathered in after a step (the same,
        or of ``allgather_bucket_size`` elements)."""
        for b in self._buckets:
            if b.handles:
                raise RuntimeError("ZeroRedundancyOptimizer: parameter groups changed while gradients "
                                   "were in flight; call step() first")
        self._in_flight: list[_Bucket] = []     # buckets with reductions not yet landed, oldest first
        if self.reduce_bucket_size is None:
            self._buckets = self._runs(self.bucket_bytes, False, "bucket")
        else:
            self._buckets = self._runs(self.reduce_bucket_size, True, "bucket")
        self._bucket_of = {p: b for b in self._buckets for p in b.order}
        self._gathers = (self._buckets if self.allgather_bucket_size is None
                         else self._runs(self.allgather_bucket_size, True, "gather"))
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
        if b is None:
            return
        seen = b.passes.get(p, 0) + 1
        if self._reduced or seen > self.backward_passes_per_step or (self.stage == 1 and b.sent):
            raise RuntimeError(f"ZeroRedundancyOptimizer: a gradient was computed more than "
                               f"backward_passes_per_step={self.backward_passes_per_step} times before "
                               f"step() (bucket {b.name}); raise backward_passes_per_step to accumulate "
                               f"more backward passes locally")
        b.passes[p] = seen
        # Stage 1 sums the passes' gradients locally and sends them once; stages 2 and 3
        # send each pass's and free them, as DeepSpeed does, so that accumulating holds
        # no full gradients (one reduction per pass).
        last = self.backward_passes_per_step if self.stage == 1 else b.sent + 1
        if len(b.passes) == len(b.params) and all(k == last for k in b.passes.values()):
            self._submit(b)
            if not self.overlap_comm:   # DeepSpeed's overlap_comm=False: the reduction done here
                while b.handles:
                    self._land(b)
        if self.stage == 3:
            self._gradient_produced(p)

    def _submit(self, b: _Bucket) -> None:
        """Send bucket ``b``'s gradients (zeros for those this rank has none of). Each
        bucket is sent the same number of times a step on every rank (once at stage 1,
        ``backward_passes_per_step`` times at stages 2 and 3), so that the reductions
        match whichever rank's gradients came when; sending never waits for another
        rank. The reductions already done, of every bucket, are summed into the shard
        first: that frees their buffers (the gradients sent and received), so a rank
        holds a bucket or two in flight rather than the whole model's gradients, and
        with the shards offloaded their copies to host memory overlap backward."""
        for done in list(self._in_flight):
            self._land_done(done)
        flat = torch.empty(b.hi - b.lo, dtype=b.flat.dtype, device=b.flat.device)
        for p in b.order:
            at, n = b.flat.offset[p] - b.lo, b.flat.size[p]
            if p.grad is None:      # another rank may have a gradient for it: send zeros
                flat[at:at + n].zero_()
            else:
                flat[at:at + n].copy_(p.grad.reshape(-1))
        present = [p.grad is not None for p in b.order]
        b.present = present if b.present is None else [a or c for a, c in zip(b.present, present)]
        if self.stage >= 2:         # sent: this rank keeps only its shard's reduced gradients
            for p in b.order:
                p.grad = None
        b.sent += 1
        if not b.handles:
            self._in_flight.append(b)
        if self.world_size == 1:
            b.handles.append(flat)
        else:
            name = b.name if b.sent == 1 else f"{b.name}.{b.sent}"
            b.handles.append(alltoall_async(flat, splits=b.splits, name=name, process_set=self.process_set))

    def _land_done(self, b: _Bucket) -> None:
        """Sum into the shard the reductions of ``b`` that are done, oldest first,
        without waiting."""
        while b.handles and (self.world_size == 1 or poll(b.handles[0])):
            self._land(b)
        if not b.handles and b in self._in_flight:
            self._in_flight.remove(b)

    def _land(self, b: _Bucket) -> None:
        """Wait for bucket ``b``'s oldest reduction in flight and put this rank's part of
        it into its shard's gradients (summed with the earlier passes' of this step)."""
        handle = b.handles.pop(0)
        out = handle if self.world_size == 1 else synchronize(handle)[0]
        first = b.landed == 0
        b.landed += 1
        n = b.splits[self.rank]
        if n == 0:
            return
        start = max(b.lo, b.flat.lo) - b.flat.lo
        scale = self.world_size if self.op == Average and self.world_size > 1 else 1
        if b.flat.grad is None:     # stage 1 without master copies: into the parameters' gradients
            rows = out.view(self.world_size, n)
            for piece, o, k in b.mine:
                torch.sum(rows[:, o:o + k], 0, out=piece.grad_target())
                if scale > 1:
                    piece.grad.div_(scale)
            return
        into = b.flat.grad[start:start + n]
        if self.world_size == 1:
            part = out
        elif first and into.dtype == out.dtype and into.device == out.device:   # summed in place: the usual case
            torch.sum(out.view(self.world_size, n), 0, out=into)
            if scale > 1:
                into.div_(scale)
            return
        else:   # 16-bit gradients into float32 shards, an offloaded shard, or a later pass
            part = out.view(self.world_size, n).sum(0)
        if scale > 1:
            part = part / scale
        if first and into.device != part.device and part.device.type == "cuda":
            # Offloaded: to host memory on a side stream, overlapping what the GPU does next.
            stream = self._copy_streams.get(part.device)
            if stream is None:
                stream = self._copy_streams[part.device] = torch.cuda.Stream(part.device)
            stream.wait_stream(torch.cuda.current_stream(part.device))
            with torch.cuda.stream(stream):
                into.copy_(part, non_blocking=True)
            part.record_stream(stream)
        elif first:
            into.copy_(part)
        else:
            self._wait_for_copies()
            into.add_(part.to(into.device))

    def _wait_for_copies(self) -> None:
        """Offloaded: the gradients copied to host memory are there."""
        for stream in self._copy_streams.values():
            stream.synchronize()

    def reduce_gradients(self) -> None:
        """Finish the gradient reduction of this step: afterwards this rank's shard has
        the average (or sum) over ranks of its elements' gradients, which its pieces of
        parameters hold as ``.grad``. ``step()`` calls it (once a step: after
        :meth:`clip_grad_norm_` it does nothing)."""
        if not self._fits_world():
            with self._scope():
                now = _ops.current_rank(), _ops.current_size()
            raise RuntimeError(f"ZeroRedundancyOptimizer was built for rank {self.rank} of {self.world_size}, "
                               f"but this is now rank {now[0]} of {now[1]} (an elastic reset?): its shards "
                               f"no longer fit; in an elastic job keep it in hvd.elastic.TorchState, which "
                               f"shards it again after a reset, or build it again")
        if self._reduced:
            return
        sends = 1 if self.stage == 1 else self.backward_passes_per_step
        for b in self._buckets:
            # Some gradient never came (an unused parameter, here or in some pass): the
            # rest now, and zeros for the sends other ranks made.
            while b.sent < sends:
                self._submit(b)
        # As DistributedOptimizer: a parameter no rank has a gradient for keeps grad None
        # (so the optimizer leaves it alone); every rank says which gradients it had.
        params = [p for b in self._buckets for p in b.order]
        mine = torch.tensor([f for b in self._buckets for f in b.present], dtype=torch.uint8)
        if self.world_size > 1:
            mine = allreduce(mine, name=f"zero.{self._index}.has_grad.{len(params)}", op=Max,
                             process_set=self.process_set)
        present = {p for p, f in zip(params, mine.tolist()) if f}
        for b in self._buckets:
            while b.handles:
                self._land(b)
            b.passes, b.present, b.sent, b.landed = {}, None, 0, 0
        self._in_flight = []
        self._wait_for_copies()
        for f in (f for flats in self._flats for f in flats):
            for piece in f.pieces:
                o = f.offset[piece.param] + piece.lo - f.lo
                g = piece.grad if f.grad is None else f.grad[o:o + piece.hi - piece.lo]
                piece.tensor.grad = g if piece.param in present else None
                piece.grad = None
        self._reduced = True

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False) -> torch.Tensor:
        """Clip the gradients by their norm over the whole model, as
        ``torch.nn.utils.clip_grad_norm_(model.parameters(), ...)`` would on the averaged
        gradients (FairScale's sharded optimizer has the same method). Call it between
        backward and ``step()`` on every rank. It reduces the gradients to the shards
        first (``step()`` then does not again); each rank takes the norm of its shard's
        gradients, one allreduce combines the ranks' parts, and the shards' gradients are
        scaled. Returns the total norm, the same on every rank.

        ``torch.nn.utils.clip_grad_norm_`` itself would see the local, unreduced
        gradients (or none, at stage 2): use this method instead."""
        self.reduce_gradients()
        norm_type = float(norm_type)
        grads = [piece.tensor.grad for piece in self._pieces() if piece.tensor.grad is not None]
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
        dtypes = [f.dtype for flats in self._flats for f in flats]
        return total.to(dtypes[0] if dtypes else torch.float32)

    # -- step ----------------------------------------------------------------------------

    def _sync_groups(self, src: list[dict[str, Any]], dst: list[dict[str, Any]]) -> None:
        for s, d in zip(src, dst):
            for k, v in s.items():
                if k != "params":
                    d[k] = v

    @torch.no_grad()
    def _take_parameters(self) -> None:
        """Copy into this rank's pieces the parameters changed since this optimizer last
        wrote them (a broadcast from rank 0, a loaded checkpoint: an in-place change moves
        a tensor's version counter, a new ``.data`` its address). Not at stage 3, where
        the shards are the parameters."""
        if self.stage == 3:
            return
        written = getattr(self, "_written", {})
        for f in (f for flats in self._flats for f in flats):
            if f.views:     # the pieces are the parameters: only new storage matters
                f.rebind()
            else:
                _copy_into_pieces(piece for piece in f.pieces
                                  if written.get(piece.param) != (piece.param._version, piece.param.data_ptr()))

    @torch.no_grad()
    def _share_parameters(self) -> None:
        """Allgather every flat buffer's shards so every rank has all the parameters (not
        at stage 3: each module gathers its own when it runs)."""
        if self.stage == 3:
            return
        # Bucket by bucket: each rank's part of a bucket is a slice of its shard, and the
        # parts in rank order are the bucket's run of the flat buffer.
        pending = []
        for b in self._gathers:
            f = b.flat
            lo, hi = max(b.lo, f.lo), min(b.hi, f.hi)
            mine = f.source(lo - f.lo, hi - f.lo) if lo < hi else f.source(0, 0)
            pending.append((b, mine if self.world_size == 1 else
                            allgather_async(mine, name=b.name + ".params", process_set=self.process_set)))
        self._written: dict[torch.Tensor, tuple[int, int]] = {}   # version and address once written here
        for b, h in pending:
            run = h if self.world_size == 1 else synchronize(h)
            for p in b.order:
                o = b.flat.offset[p] - b.lo
                p.copy_(run[o:o + p.numel()].view_as(p))
                self._written[p] = (p._version, p.data_ptr())

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Reduce the gradients to the shards, step :attr:`optim` on this rank's shard,
        and share the updated parameters with every rank. A ``closure`` is evaluated once,
        before the reduction."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_gradients()
        if self.stage == 3:
            self._drop_prefetched()
        self._take_parameters()
        self._sync_groups(self.param_groups, self.optim.param_groups)  # e.g. an LR scheduler's lr
        self.optim.step()
        self._sync_groups(self.optim.param_groups, self.param_groups)
        self._masters_changed()
        self._share_parameters()
        for piece in self._pieces():
            piece.tensor.grad = None
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
        """Add a group (on every rank alike): its parameters get flat buffers cut into
        shards, this rank's pieces join :attr:`optim`, and the buckets are laid out again."""
        if getattr(self, "optim", None) is not None and self.stage == 3:
            raise ValueError("stage 3 shards the model's parameters when the optimizer is made: give every "
                             "parameter group to the constructor")
        super().add_param_group(param_group)
        if getattr(self, "optim", None) is None:  # from Optimizer.__init__: set up later
            return
        self._flats.append(self._flats_of(len(self.param_groups) - 1))
        self.optim.add_param_group(self._local_groups()[-1])
        self._build_buckets()

    # -- state ---------------------------------------------------------------------------
    #
    # A state dict is always the whole optimizer's, in ``optimizer_class``'s own format
    # (the state of each parameter, numbered over all groups), whatever the shards: each
    # rank's share is its pieces' state, and a piece's elementwise state is the slice of
    # the whole parameter's.

    def _full_shape(self, p: torch.Tensor) -> torch.Size:
        """``p``'s shape, also while stage 3 has freed it."""
        return self._shapes[p] if self.stage == 3 and p in self._shapes else p.shape

    def _global_index(self) -> dict[torch.Tensor, int]:
        return {p: i for i, p in enumerate(self._all_params())}

    def _my_share(self) -> tuple[dict[int, list[tuple[int, int, dict[str, Any]]]], list[dict[str, Any]]]:
        """This rank's state by global parameter number: ``(lo, hi, state)`` per piece;
        and :attr:`optim`'s groups."""
        index = self._global_index()
        local = self.optim.state_dict()
        pieces = self._pieces()
        share: dict[int, list[tuple[int, int, dict[str, Any]]]] = defaultdict(list)
        for k, st in local["state"].items():
            piece = pieces[k]
            share[index[piece.param]].append((piece.lo, piece.hi, st))
        return dict(share), local["param_groups"]

    def _whole(self, shares: list[dict[int, list[tuple[int, int, dict[str, Any]]]]],
               local_groups: list[dict[str, Any]]) -> dict[str, Any]:
        """A whole state dict from every rank's share and this rank's groups."""
        params = self._all_params()
        pieces: dict[int, list[tuple[int, int, dict[str, Any]]]] = defaultdict(list)
        for share in shares:
            for i, ps in share.items():
                pieces[i].extend(ps)
        state: dict[int, Any] = {}
        for i, ps in sorted(pieces.items()):
            ps.sort(key=lambda t: t[0])
            p = params[i]
            whole: dict[str, Any] = {}
            for key, v in ps[0][2].items():
                if key not in _SCALAR_STATE and torch.is_tensor(v) and v.dim() == 1 and v.numel() == ps[0][1] - ps[0][0]:
                    whole[key] = torch.cat([st[key].reshape(-1) for _, _, st in ps]).view(self._full_shape(p))
                else:
                    whole[key] = v
            state[i] = whole
        index = self._global_index()
        groups = [{**{k: v for k, v in lg.items() if k != "params"}, "params": [index[p] for p in g["params"]]}
                  for g, lg in zip(self.param_groups, local_groups)]
        return {"state": state, "param_groups": groups}

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
        shares = []
        for r in range(self.world_size):
            got = broadcast_object(mine if r == self.rank else None, root_rank=self._world_ranks[r],
                                   name=f"zero.{self._index}.consolidate.{r}", process_set=self.process_set)
            if self.rank == to:
                shares.append(got)
        self._consolidated = copy.deepcopy(self._whole(shares, local_groups)) if self.rank == to else None

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
        ``state_dict()`` over the same parameters, such as a checkpoint of
        ``DistributedOptimizer`` or of this optimizer when it gave each rank whole
        parameters): this rank keeps the state of its pieces."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(sg["params"]) != len(g["params"]) for sg, g in zip(groups, self.param_groups)):
            raise ValueError("the state dict's parameter groups do not match this optimizer's")
        saved_ids = [sid for sg in groups for sid in sg["params"]]
        ids = dict(zip(saved_ids, self._all_params()))
        saved = {ids[sid]: st for sid, st in state_dict["state"].items()}
        local_state = {}
        for k, piece in enumerate(self._pieces()):
            st = saved.get(piece.param)
            if st is None:
                continue
            shape = self._full_shape(piece.param)
            local_state[k] = {
                key: (v.reshape(-1)[piece.lo:piece.hi].clone()
                      if key not in _SCALAR_STATE and torch.is_tensor(v) and v.shape == shape and
                      (v.dim() > 0 or len(shape) == 0)
                      else v.clone() if torch.is_tensor(v) else copy.deepcopy(v))
                for key, v in st.items()}
        local_groups = []
        at = 0
        for sg, lg in zip(groups, self.optim.param_groups):
            local_groups.append({**{k: v for k, v in sg.items() if k != "params"},
                                 "params": list(range(at, at + len(lg["params"])))})
            at += len(lg["params"])
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
        mine = {i: [(lo, hi, {n: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                              for n, v in st.items()}) for lo, hi, st in ps] for i, ps in mine.items()}
        shares = allgather_object(mine, name=f"zero.{self._index}.gather", process_set=self.process_set)
        return self._whole(shares, local_groups)

    @torch.no_grad()
    def _whole_parameters(self) -> list[list[torch.Tensor]] | None:
        """Stage 3: every flat buffer whole (per group, in the shards' dtype, on the CPU),
        gathered from every rank's shard (a collective). None at stages 1 and 2, where
        the model holds the parameters."""
        if self.stage != 3:
            return None
        whole = []
        for g, flats in enumerate(self._flats):
            whole.append([])
            for k, f in enumerate(flats):
                full = f.master if self.world_size == 1 else allgather(
                    f.master, name=f"zero.{self._index}.whole.{g}.{k}", process_set=self.process_set)
                whole[-1].append(full[:f.numel].to("cpu", copy=True))
        return whole

    def _elastic_state(self) -> dict[str, Any]:
        """What an elastic commit keeps (a collective): the whole optimizer state, and at
        stage 3 the whole parameters (the model's own are freed there)."""
        return {"optim": self._gathered_state(), "params": self._whole_parameters()}

    def _load_elastic_state(self, state: dict[str, Any]) -> None:
        """Load :meth:`_elastic_state`'s value into the shards as they are laid out now."""
        if state["params"] is not None:
            self._release_all()
            for flats, values in zip(self._flats, state["params"]):
                for f, v in zip(flats, values):
                    f.take_whole(v)
        self.load_state_dict(state["optim"])

    def _reshard(self, params: list[list[torch.Tensor]] | None = None) -> None:
        """Shard again over the ranks there are now (after an elastic reset): new shards
        of the parameters as they are (at stage 3, of ``params``, the whole flat buffers
        from :meth:`_whole_parameters`), a new :attr:`optim` with no state (the caller
        loads the whole state next), new buckets. The same local work on every rank;
        gradients and gathers in flight in the old world are dropped."""
        for b in self._buckets:
            b.handles = []
        if self.stage == 3 and params is None:
            raise ValueError("stage 3 shards again from the whole parameters: pass them")
        if self.process_set is not None:
            if not self._fits_world():
                raise RuntimeError("a ZeroRedundancyOptimizer over a process set cannot follow an elastic "
                                   "reset that changed the set: build it again after the reset")
        else:
            self.rank, self.world_size = _ops.current_rank(), _ops.current_size()
            self._world_ranks = list(range(self.world_size))
        if self.stage == 3:
            self._release_all()
        self._flats = [self._flats_of(i, None if params is None else params[i]) for i in range(len(self.param_groups))]
        self.optim = self.optimizer_class(self._local_groups(), **self._local_defaults)
        self._build_buckets()
        if self.stage == 3:
            self._flat_of = {p: f for fs in self._flats for f in fs for p in f.params}
        self._consolidated = None
        self._reduced = False

    # -- stage 3: each module's parameters gathered while it runs ------------------------

    def _shard_model(self, model: torch.nn.Module) -> None:
        """Stage 3: a unit per module that holds parameters of this optimizer, hooks that
        gather a unit's parameters before the module runs (forward, and backward through
        hooks on its outputs) and free them after, and every parameter freed now: between
        uses a rank keeps only its shard."""
        self._flat_of = {p: f for fs in self._flats for f in fs for p in f.params}
        self._shapes = {p: p.shape for p in self._flat_of}
        self._holders: dict[torch.Tensor, int] = defaultdict(int)   # units holding each parameter
        self._unit_of: dict[torch.nn.Module, _Unit] = {}
        self._units_of: dict[torch.Tensor, list[_Unit]] = defaultdict(list)
        self._order: dict[_Unit, int] = {}      # the order of the first forward
        self._ordered: list[_Unit] = []
        self._in_backward = False
        self._backward_seen = False             # the order is known
        for m in model.modules():
            ps = [p for p in m.parameters(recurse=False) if p in self._flat_of]
            if not ps:
                continue
            u = _Unit(m, ps, f"zero.{self._index}.unit.{len(self._units)}")
            self._units.append(u)
            self._unit_of[m] = u
            for p in ps:
                self._units_of[p].append(u)
        outside = [i for i, p in enumerate(self._all_params()) if p in self._flat_of and not self._units_of[p]]
        if outside:
            raise ValueError(f"stage 3: parameters {outside} (numbered over the groups) are not parameters of "
                             f"the model given as model=; give the model that holds them")
        ref = weakref.ref(self)

        def before(module: torch.nn.Module, args: Any) -> None:
            opt = ref()
            if opt is not None:
                opt._before_forward(module)

        def after(module: torch.nn.Module, args: Any, output: Any) -> None:
            opt = ref()
            if opt is not None:
                opt._after_forward(module, output)

        def check(module: torch.nn.Module, args: Any) -> None:
            opt = ref()
            if opt is not None:
                opt._check_model(module)

        self._model_params = dict(model.named_parameters())
        # What the check before each forward compares, in model.parameters()' order:
        # each parameter, and for the sharded ones their dtype and device.
        self._model_layout = self._layout_of(model)
        handles = [model.register_forward_pre_hook(check, prepend=True)]
        for m in self._unit_of:
            handles.append(m.register_forward_pre_hook(before))
            handles.append(m.register_forward_hook(after))
        weakref.finalize(self, lambda hs: [h.remove() for h in hs], handles)
        # Per parameter, the tensor the hooks gather it into, whose storage is freed in
        # place (resized to nothing) when the unit is released and filled again for
        # backward: autograd's saved views of a parameter (a transposed weight) share
        # that storage, so they hold no memory between forward and backward either.
        self._resident: dict[torch.Tensor, torch.Tensor] = {}
        self._in_resident: set[torch.Tensor] = set()     # parameters whose data is theirs now
        for p in self._flat_of:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def _layout_of(self, model: torch.nn.Module) -> list[tuple[torch.Tensor, Any]]:
        """Each of the model's parameters in order, with the dtype and device of those
        sharded."""
        return [(p, (p.dtype, p.device) if p in self._flat_of else None) for p in model.parameters()]

    def _check_model(self, model: torch.nn.Module) -> None:
        """Stage 3, before the model's forward (before any gather): the model still has
        the parameters it had when sharded, with their dtype and device. A model changed
        since would train parameters the optimizer does not know, silently."""
        layout, at = self._model_layout, 0
        for p in model.parameters():   # the usual case: nothing changed, no names built
            if at == len(layout) or p is not layout[at][0] or (
                    layout[at][1] is not None and (p.dtype, p.device) != layout[at][1]):
                break
            at += 1
        else:
            if at == len(layout):
                return
        now = dict(model.named_parameters())
        added = sorted(now.keys() - self._model_params.keys())
        removed = sorted(self._model_params.keys() - now.keys())
        replaced = sorted(k for k in now.keys() & self._model_params.keys() if now[k] is not self._model_params[k])
        moved = sorted(k for k, p in now.items() if p in self._flat_of and
                       (p.dtype, p.device) != (self._flat_of[p].dtype, self._flat_of[p].device))
        what = "; ".join(f"{label}: {', '.join(names)}" for label, names in (
            ("added", added), ("removed", removed), ("replaced", replaced), ("moved to another dtype or device",
                                                                           moved)) if names)
        if not what:     # the same parameters, in another order: compare in that order from now on
            self._model_layout = self._layout_of(model)
            return
        raise RuntimeError(f"stage 3: the model changed after ZeroRedundancyOptimizer sharded it ({what}); make "
                           f"the model final (layers, tied weights, .to()) before building the optimizer, "
                           f"or build it again")

    def _before_forward(self, module: torch.nn.Module) -> None:
        u = self._unit_of[module]
        if not self._backward_seen and u not in self._order:
            self._order[u] = len(self._ordered)
            self._ordered.append(u)
        self._gather(u)
        self._prefetch(u, +1)

    def _after_forward(self, module: torch.nn.Module, output: Any) -> None:
        u = self._unit_of[module]
        if torch.is_grad_enabled():
            from torch.utils._pytree import tree_flatten
            ref = weakref.ref(self)

            def before_backward(grad: torch.Tensor) -> None:
                opt = ref()
                if opt is not None:
                    opt._before_backward(u)

            for t in tree_flatten(output)[0]:
                if torch.is_tensor(t) and t.requires_grad:
                    t.register_hook(before_backward)
        self._release(u)

    def _before_backward(self, u: _Unit) -> None:
        if not self._in_backward:
            self._in_backward = True
            self._backward_seen = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)
        if u.held:
            return
        self._gather(u)
        u.accumulated = set()
        self._prefetch(u, -1)

    def _gradient_produced(self, p: torch.Tensor) -> None:
        """A parameter's gradient is in: a unit whose every gradient is in frees its
        parameters (backward no longer needs them)."""
        for u in self._units_of.get(p, ()):
            if u.held and self._in_backward:
                u.accumulated.add(p)
                if len(u.accumulated) == len(u.params):
                    self._release(u)

    def _after_backward(self) -> None:
        self._in_backward = False
        self._drop_prefetched()
        for u in self._units:
            self._release(u)
            u.accumulated = set()

    def _drop_prefetched(self) -> None:
        """Gathers started for a unit that did not run: their values may be older than
        the next step's."""
        for u in self._units:
            for _, _, handle in u.pending:
                synchronize(handle)
            u.pending = []

    def _prefetch(self, u: _Unit, step: int) -> None:
        at = self._order.get(u)
        if at is not None and 0 <= at + step < len(self._ordered):
            self._start_gather(self._ordered[at + step])

    def _start_gather(self, u: _Unit) -> None:
        """Start the allgathers of unit ``u``'s parameters: each rank sends the parts of
        them in its shard (cast to the parameters' dtype)."""
        if u.held or u.pending:
            return
        by_flat: dict[int, list[torch.Tensor]] = defaultdict(list)
        flats = {}
        for p in u.params:
            f = self._flat_of[p]
            by_flat[id(f)].append(p)
            flats[id(f)] = f
        for k, (key, ps) in enumerate(by_flat.items()):
            f = flats[key]
            ps.sort(key=lambda q: f.offset[q])
            parts = []
            for p in ps:
                a, b = f.part_of(p, self.rank)
                if b > a:
                    o = f.offset[p] - f.lo
                    parts.append(f.source(o + a, o + b))
            mine = (torch.cat(parts) if parts else f.source(0, 0)).to(f.dtype)
            u.pending.append((f, ps, allgather_async(mine, name=f"{u.name}.{k}", process_set=self.process_set)))

    def _whole_tensor(self, p: torch.Tensor, resident: bool) -> torch.Tensor:
        """Where ``p`` is gathered to: its resident tensor, its storage allocated again
        (``resident``: the hooks' gathers), or a new tensor that whoever keeps it owns
        (:meth:`gathered_parameters`, whose tensors a caller may keep)."""
        n = math.prod(self._shapes[p])
        f = self._flat_of[p]
        if not resident:
            return torch.empty(n, dtype=f.dtype, device=f.device)
        t = self._resident.get(p)
        if t is None:
            t = self._resident[p] = torch.empty(n, dtype=f.dtype, device=f.device)
        else:
            t.untyped_storage().resize_(n * t.element_size())
        self._in_resident.add(p)
        return t

    def _free(self, p: torch.Tensor) -> None:
        """``p``'s gathered values dropped: its resident storage freed in place (with any
        view autograd saved of it), or left to whoever still holds it."""
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        if p in self._in_resident:
            self._in_resident.discard(p)
            self._resident[p].untyped_storage().resize_(0)

    @torch.no_grad()
    def _gather(self, u: _Unit, resident: bool = True) -> None:
        """Unit ``u``'s parameters whole on this rank until :meth:`_release`."""
        if u.held:
            return
        self._start_gather(u)
        for f, ps, handle in u.pending:
            out = synchronize(handle)
            fulls = {p: self._whole_tensor(p, resident) for p in ps if self._holders[p] == 0}
            at = 0
            for r in range(self.world_size):
                for p in ps:
                    a, b = f.part_of(p, r)
                    if p in fulls:
                        fulls[p][a:b] = out[at:at + b - a]
                    at += b - a
            for p, full in fulls.items():
                p.data = full.view(self._shapes[p])
        u.pending = []
        u.held = True
        for p in u.params:
            self._holders[p] += 1

    def _release_all(self) -> None:
        """Every parameter freed and every gather forgotten, as between two steps (after
        an elastic failure, whatever forward or backward was doing: the gathers of a
        broken world are never waited for)."""
        for u in self._units:
            u.pending, u.held, u.accumulated = [], False, set()
        self._holders.clear()
        self._in_backward = False
        for p in self._flat_of:
            if p.numel() or p in self._in_resident:
                self._free(p)

    def _release(self, u: _Unit) -> None:
        if not u.held:
            return
        u.held = False
        for p in u.params:
            self._holders[p] -= 1
            if self._holders[p] == 0:
                self._free(p)

    @contextlib.contextmanager
    def gathered_parameters(self, modify: bool = False) -> Iterator[None]:
        """Inside, every parameter is whole on every rank, as it is at stages 1 and 2
        (a collective: every rank enters it). For ``torch.save(model.state_dict())``, an
        evaluation outside the model's forward, or a loaded checkpoint: with
        ``modify=True`` what the parameters hold at the end goes back into the shards.
        Nothing is gathered at stages 1 and 2."""
        if self.stage != 3:
            yield
            return
        units = [u for u in self._units if not u.held]
        for u in units:
            self._start_gather(u)
        for u in units:
            self._gather(u, resident=False)
        try:
            yield
        finally:
            if modify:
                _copy_into_pieces(self._pieces())
                self._masters_changed()
            for u in units:
                self._release(u)

    def sharded_state_dict(self) -> dict[str, Any]:
        """This rank's shards and its local optimizer's state, as they are (no
        collective): quick to save, one file per rank, and loaded by
        :meth:`load_sharded_state_dict` on the same number of ranks."""
        return {"world_size": self.world_size, "rank": self.rank, "stage": self.stage,
                "shards": [f.shard_values() for fs in self._flats for f in fs],
                "optim": copy.deepcopy(self.optim.state_dict())}

    @torch.no_grad()
    def load_sharded_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load what :meth:`sharded_state_dict` returned on the rank of the same number,
        with as many ranks: the shards (at stage 3 the parameters; at stages 1 and 2 the
        parameters are the model's, loaded with it) and the optimizer state."""
        flats = [f for fs in self._flats for f in fs]
        if (state_dict.get("world_size"), state_dict.get("rank")) != (self.world_size, self.rank):
            raise ValueError(f"a sharded state dict of rank {state_dict.get('rank')} of "
                             f"{state_dict.get('world_size')} cannot load into rank {self.rank} of "
                             f"{self.world_size}: load it with as many ranks, or save the whole state "
                             f"(consolidate_state_dict) instead")
        shards = state_dict["shards"]
        if len(shards) != len(flats) or any(s.numel() != f.shard for s, f in zip(shards, flats)):
            raise ValueError("the sharded state dict's shards do not match this optimizer's parameters")
        if self.stage == 3:
            self._load_shards(shards)
        self.optim.load_state_dict(state_dict["optim"])
        self._sync_groups(self.optim.param_groups, self.param_groups)

    # -- figures -------------------------------------------------------------------------

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (tensors in :attr:`optim`'s state)."""
        return sum(v.numel() * v.element_size() for s in self.optim.state.values()
                   for v in s.values() if isinstance(v, torch.Tensor))

    def bytes_per_step(self) -> int:
        """Bytes this rank sends in a step: the other shards' parts of each bucket's
        gradients, and its own shard of each flat buffer to every other rank (twice at
        stage 3, which gathers the parameters for forward and again for backward)."""
        n = self.world_size
        if n == 1:
            return 0
        total = 0
        for b in self._buckets:
            total += (b.hi - b.lo - b.splits[self.rank]) * b.flat.dtype.itemsize
        gathers = 2 if self.stage == 3 else 1
        for f in (f for fs in self._flats for f in fs):
            total += gathers * f.shard * (n - 1) * f.dtype.itemsize
        return total

    def __repr__(self) -> str:
        return (f"ZeroRedundancyOptimizer({self.optimizer_class.__name__}, stage {self.stage}, "
                f"rank {self.rank} of {self.world_size})")


# -- DeepSpeed's configuration ----------------------------------------------------------

#: The ZeRO settings of a DeepSpeed configuration that mean here what they mean there
#: (each is a keyword argument of ZeroRedundancyOptimizer of the same name).
DEEPSPEED_KEYS = ("stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm",
                  "contiguous_gradients", "offload_optimizer")
#: DeepSpeed settings accepted at the one value that is what hvdlite always does.
DEEPSPEED_FIXED = {"reduce_scatter": True, "allgather_partitions": True, "round_robin_gradients": False,
                   "offload_param": {"device": "none"}}


def _zero_section(config: Any) -> tuple[dict[str, Any], list[str]]:
    """The ``zero_optimization`` section of a DeepSpeed configuration (a dict, or the
    path of its JSON file; the section itself is taken too), and the other top-level
    keys, which are not read."""
    import json
    import os
    if isinstance(config, (str, os.PathLike)):
        with open(config) as fh:
            config = json.load(fh)
    if not isinstance(config, dict):
        raise TypeError(f"a DeepSpeed configuration is a dict or the path of its JSON file, not "
                        f"{type(config).__name__}")
    if "zero_optimization" in config:
        section = config["zero_optimization"]
        if not isinstance(section, dict):
            raise ValueError(f"zero_optimization must be a dict of ZeRO settings, not {section!r}")
        return section, sorted(k for k in config if k != "zero_optimization")
    return config, []


def from_deepspeed_config(model: torch.nn.Module, optimizer_class: type[torch.optim.Optimizer],
                          config: Any, **kwargs: Any) -> torch.optim.Optimizer:
    """Build the optimizer a DeepSpeed configuration's ZeRO section describes, over
    ``model``'s parameters: a :class:`ZeroRedundancyOptimizer` at ``stage`` 1 to 3 (with
    ``model=`` at stage 3), or at stage 0 (ZeRO off) ``optimizer_class`` wrapped in
    :func:`hvdlite.torch.DistributedOptimizer`.

    ``config`` is the configuration (a dict, or the path of its JSON file) or its
    ``zero_optimization`` section alone. Only that section is read: its settings in
    :data:`DEEPSPEED_KEYS` become the keyword arguments of the same name
    (``offload_optimizer`` as DeepSpeed's ``{"device": "cpu", "pin_memory": ...}``), a
    value ``"auto"`` leaves hvdlite's default, and the settings of
    :data:`DEEPSPEED_FIXED` are accepted at the value listed. Any other ZeRO setting is
    refused by name (ValueError). The configuration's other sections (``optimizer``,
    ``fp16``, batch sizes, ...) are not read, and a warning names them: give the
    optimizer's hyperparameters, and hvdlite's own arguments (``process_set``, ``op``,
    ``backward_passes_per_step``, ...), as ``kwargs``::

        opt = from_deepspeed_config(model, torch.optim.AdamW, "ds_config.json", lr=1e-4)
    """
    import warnings
    section, others = _zero_section(config)
    settings: dict[str, Any] = {}
    refused = []
    for key, value in section.items():
        if isinstance(value, str) and value == "auto":
            continue
        if key in DEEPSPEED_KEYS:
            settings[key] = value
        elif key in DEEPSPEED_FIXED and value == DEEPSPEED_FIXED[key]:
            continue
        elif key == "offload_param" and isinstance(value, dict) and value.get("device", "none") == "none":
            continue
        else:
            refused.append(f"{key}={value!r}")
    if refused:
        fixed = ", ".join(f"{k}={v!r}" for k, v in DEEPSPEED_FIXED.items())
        raise ValueError(f"DeepSpeed ZeRO settings hvdlite does not support: {', '.join(refused)} (it takes "
                         f"{', '.join(DEEPSPEED_KEYS)}, and {fixed}); remove them")
    if others:
        warnings.warn(f"from_deepspeed_config reads only the ZeRO section; not read: {', '.join(others)} "
                      f"(give the optimizer's hyperparameters as keyword arguments)", stacklevel=2)
    both = sorted(settings.keys() & kwargs.keys())
    if both:
        raise ValueError(f"{', '.join(both)} given both in the DeepSpeed configuration and as arguments")
    stage = settings.pop("stage", 0)
    if stage == 0:
        from hvdlite.torch.optimizer import DistributedOptimizer
        dropped = sorted(k for k in settings if k not in ("overlap_comm", "contiguous_gradients"))
        if dropped:
            raise ValueError(f"stage 0 (ZeRO off) takes no {', '.join(dropped)}: they shard, and nothing is "
                             f"sharded at stage 0")
        hvd_args = {k: kwargs.pop(k) for k in ("backward_passes_per_step", "op", "process_set") if k in kwargs}
        return DistributedOptimizer(optimizer_class(model.parameters(), **kwargs),
                                    named_parameters=model.named_parameters(), **hvd_args)
    if stage == 3:
        settings["model"] = model
    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class, stage=stage, **settings, **kwargs)
