"""1-bit Adam (DeepSpeed; Tang et al., 2021) on hvdlite's collectives.

    opt = hvd.OneBitAdam(model.parameters(), lr=1e-3, freeze_step=400)
    loss.backward()
    opt.step()        # distributed by itself: no DistributedOptimizer around it

- **Warm-up** (the first ``freeze_step`` steps): Adam as ``torch.optim.Adam`` computes it,
  on gradients averaged over the ranks with one fused allreduce per step.
- **Compressed phase.** Adam's second moment is frozen. Each rank folds its own
  (unreduced) gradient into its momentum ``m``, and the ranks average
  ``m / (sqrt(v) + eps)``, each element clipped to Adam's own step bound (docs/zero.md
  says why this and not ``m`` itself), by a compressed allreduce with error feedback on
  both sides:

  1. Each rank adds its *worker error* to its momentum, keeps the signs and one scale
     (the vector's root mean square), and remembers what that lost as the new worker
     error. One alltoall sends chunk ``j`` of the packed signs (one bit per element) to
     rank ``j``; one allgather shares the scales.
  2. Rank ``j`` averages the N decoded chunks, adds its *server error*, compresses the
     result the same way and keeps the loss as its new server error. One allgather of
     the packed chunks and one of their scales gives every rank the same averaged
     momentum.

  The parameters then move by ``lr`` times that average (bias-corrected), and ``m``
  becomes the average times ``sqrt(v) + eps``, the same on every rank.
  Per step a rank sends about 2(N-1)/N * n/8 bytes of signs for n parameters, against
  2(N-1)/N * 4n for the float32 allreduce: 32 times less once warm-up is over.

Each rank's error buffers are its own: :meth:`state_dict` holds this rank's, so a
checkpoint that is to resume the compression exactly saves one file per rank. Buffers
of another rank (one checkpoint loaded everywhere, ``broadcast_optimizer_state``) are
not loaded: each rank's error buffers then start from zero, as at the freeze.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Iterable

import numpy as np
import torch

from hvdlite.common import ops as _ops
from hvdlite.torch.mpi_ops import Average, allgather, allreduce_, alltoall

_BITS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)
_instances = 0


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """One bit per element of ``x`` (length a multiple of 8): 1 where x >= 0, the
    first element in the highest bit."""
    if x.device.type == "cpu":      # NumPy's packbits is one pass in C
        return torch.from_numpy(np.packbits((x >= 0).numpy()))
    return _pack_with_torch(x)


def unpack_signs(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """±1 per bit of ``packed`` (the inverse of :func:`pack_signs`)."""
    if packed.device.type == "cpu":
        bits = torch.from_numpy(np.unpackbits(packed.numpy()))
    else:
        bits = _bits_with_torch(packed)
    return bits.to(dtype).mul_(2).sub_(1)


def _pack_with_torch(x: torch.Tensor) -> torch.Tensor:
    """pack_signs on any device (GPUs), with tensor operations."""
    bits = (x >= 0).to(torch.uint8).view(-1, 8)
    return (bits * _BITS.to(x.device)).sum(1, dtype=torch.uint8)


def _bits_with_torch(packed: torch.Tensor) -> torch.Tensor:
    """The bits of ``packed`` (0 or 1, highest first), with tensor operations."""
    return (packed.view(-1, 1) & _BITS.to(packed.device)).ne(0).view(-1)


def compress(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed signs, scale, error): ``scale * sign(x)`` is the 1-bit value of ``x``
    with the same root mean square, and ``error = x - scale * sign(x)``."""
    scale = x.norm() / math.sqrt(max(1, x.numel()))
    packed = pack_signs(x)
    error = x - unpack_signs(packed, x.dtype).mul_(scale)
    return packed, scale.reshape(1), error


class OneBitAdam(torch.optim.Optimizer):
    """Adam with 1-bit compressed momentum after ``freeze_step`` warm-up steps.

    ``lr``, ``betas`` and ``eps`` mean what they do in ``torch.optim.Adam``; each group
    may set its own, and its own ``weight_decay``, which is added to the update,
    ``weight_decay * p``, as DeepSpeed's 1-bit Adam does (not to the gradient).
    ``freeze_step`` is the number of uncompressed warm-up steps. Every rank passes the
    same parameters in the same order. All parameters must be float32 and on one device.
    Groups may be added until the first step (the error buffers cover every parameter).
    All parameters' moments form one flat vector, compressed as one."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, freeze_step: int = 100000,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        if freeze_step < 0:
            raise ValueError(f"freeze_step must be non-negative, not {freeze_step}")
        self.freeze_step = int(freeze_step)
        self.rank, self.world_size = _ops.current_rank(), _ops.current_size()
        self.steps = 0
        self.sent_bytes = 0                     # by this rank, since construction
        self._denom: torch.Tensor | None = None  # sqrt(v̂) + eps, once v is frozen
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        global _instances
        _instances += 1
        self._name = f"onebit.{_instances}"
        self._size_buffers()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (its ``lr``, ``betas``, ``eps`` and ``weight_decay`` checked like the
        constructor's); only before the first step, when the error buffers are still zero."""
        if self.steps:
            raise ValueError("OneBitAdam: add parameter groups before the first step (its moments and "
                             "error buffers cover the parameters it has stepped)")
        settings = {**self.defaults, **param_group}   # as the group will have them
        lr, (b1, b2), eps, wd = settings["lr"], settings["betas"], settings["eps"], settings["weight_decay"]
        if lr < 0 or eps < 0 or wd < 0:
            raise ValueError(f"lr, eps and weight_decay must be non-negative (lr={lr}, eps={eps}, "
                             f"weight_decay={wd})")
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"betas must be in [0, 1): {settings['betas']}")
        super().add_param_group(param_group)
        if hasattr(self, "_name"):      # after the constructor: the buffers grow
            self._size_buffers()

    def _size_buffers(self) -> None:
        params_all = self._params()
        if any(p.dtype != torch.float32 for p in params_all):
            raise TypeError("OneBitAdam takes float32 parameters")
        if len({p.device for p in params_all}) > 1:
            raise ValueError("OneBitAdam takes parameters on one device")
        n = sum(p.numel() for p in params_all)
        quantum = 8 * self.world_size           # whole bytes of signs in every chunk
        self._numel, self._padded = n, -(-n // quantum) * quantum
        dev = params_all[0].device if params_all else torch.device("cpu")
        self.worker_error = torch.zeros(self._padded, device=dev)
        self.server_error = torch.zeros(self._padded // self.world_size, device=dev)

    def _spans(self) -> list[tuple[int, int, dict[str, Any]]]:
        """(start, end, group) of each group's parameters in the flat vectors."""
        spans, at = [], 0
        for group in self.param_groups:
            k = sum(p.numel() for p in group["params"])
            spans.append((at, at + k, group))
            at += k
        return spans

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def _flat_grads(self) -> torch.Tensor:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self._params()])

    def _compressed_average(self, m: torch.Tensor) -> torch.Tensor:
        """The average over ranks of ``m`` (flat, length n) through 1-bit exchanges with
        error feedback on the worker and the server side."""
        n, chunk = self.world_size, self._padded // self.world_size
        x = torch.zeros(self._padded, device=m.device)
        x[: self._numel] = m
        x += self.worker_error
        packed, scale, self.worker_error = compress(x)
        # Phase 1: chunk j of every rank's signs to rank j; every rank's scale to all.
        mine = alltoall(packed, name=f"{self._name}.signs")
        scales = allgather(scale, name=f"{self._name}.scales")
        decoded = unpack_signs(mine, m.dtype).view(n, chunk) * scales.view(n, 1)
        y = decoded.mean(0) + self.server_error
        # Phase 2: this rank's chunk of the average, compressed again, to every rank.
        packed2, scale2, self.server_error = compress(y)
        signs = allgather(packed2, name=f"{self._name}.avg_signs")
        scales2 = allgather(scale2, name=f"{self._name}.avg_scales")
        avg = unpack_signs(signs, m.dtype).view(n, chunk) * scales2.view(n, 1)
        self.sent_bytes += 2 * (n - 1) * (packed.numel() // n) + 2 * (n - 1) * 4
        return avg.reshape(-1)[: self._numel]

    def _floor_variance(self, v: torch.Tensor) -> None:
        """At the freeze: an element that had no gradient in the whole warm-up has v = 0,
        and the compressed momentum is never 0 (it is ±scale everywhere), so its update
        would be that noise divided by eps. Such elements take the smallest non-zero v of
        their parameter instead (of all parameters if theirs has none)."""
        positive = v[v > 0]
        overall = positive.min() if positive.numel() else torch.tensor(1.0)
        at = 0
        for p in self._params():
            part = v[at:at + p.numel()]
            pos = part[part > 0]
            part[part == 0] = pos.min() if pos.numel() else overall
            at += p.numel()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._params()
        if not params:
            return loss
        if (_ops.current_rank(), _ops.current_size()) != (self.rank, self.world_size):
            raise RuntimeError(f"OneBitAdam was built for rank {self.rank} of {self.world_size}, but this is "
                               f"now rank {_ops.current_rank()} of {_ops.current_size()} (an elastic "
                               f"reset?): its error buffers no longer fit; in an elastic job keep it in "
                               f"hvd.elastic.TorchState, which lays them out again after a reset, or build it again")
        self.steps += 1
        compressed = self.steps > self.freeze_step and self.world_size > 1
        g = self._flat_grads()
        if not compressed and self.world_size > 1:
            allreduce_(g, op=Average, name=f"{self._name}.grads")
            self.sent_bytes += int(2 * (self.world_size - 1) / self.world_size * g.numel() * 4)
        # Adam's moments, kept flat in the state of the first parameter's group.
        st = self.state.setdefault(params[0], {})
        if "exp_avg" not in st:
            st["exp_avg"] = torch.zeros_like(g)
            st["exp_avg_sq"] = torch.zeros_like(g)
            st["step"] = 0
        m, v = st["exp_avg"], st["exp_avg_sq"]
        st["step"] += 1
        t = st["step"]
        spans = self._spans()
        if not compressed:
            # 1 - b2^t of each group, kept: once v is frozen it stays divided by it.
            st["frozen_bias2"] = [1 - grp["betas"][1] ** t for _, _, grp in spans]
        elif not st.get("floored"):
            self._floor_variance(v)
            st["floored"] = True
        frozen_bias2 = st["frozen_bias2"]
        if not isinstance(frozen_bias2, list):      # a checkpoint of one group's value
            frozen_bias2 = [frozen_bias2] * len(spans)
        reuse = compressed and self._denom is not None   # v is frozen: so is the denominator
        denom = self._denom if reuse else torch.empty_like(v)
        direction = torch.empty_like(m)
        bias1 = []
        for (a, b, grp), fb2 in zip(spans, frozen_bias2):
            b1, b2 = grp["betas"]
            m[a:b].mul_(b1).add_(g[a:b], alpha=1 - b1)
            if not compressed:
                v[a:b].mul_(b2).addcmul_(g[a:b], g[a:b], value=1 - b2)
            if not reuse:
                torch.div(v[a:b], fb2, out=denom[a:b]).sqrt_().add_(grp["eps"])
            torch.div(m[a:b], denom[a:b], out=direction[a:b])
            bias1.append(1 - b1 ** t)
            if compressed:
                # Adam bounds each step by about lr (|update| <= lr * max(1, (1 - b1) /
                # sqrt(1 - b2)); Kingma & Ba, 2015, sec. 2.1), but with v frozen an
                # element whose gradient was near zero through the warm-up can ask for far
                # more, and one such element would set the 1-bit scale of all the others.
                # Clipped to Adam's own bound before compression, it cannot.
                bound = max(1.0, (1 - b1) / math.sqrt(1 - b2)) * bias1[-1]
                direction[a:b].clamp_(-bound, bound)
        self._denom = denom if compressed else None
        if compressed:
            # The momentum divided by the frozen denominator (the same on every rank, so
            # its average is the average momentum divided by it) is what is compressed:
            # the 1-bit noise is then on the scale of the updates, not of m, which an
            # element with a small v would otherwise blow up.
            direction = self._compressed_average(direction)
            m.copy_(direction * denom)
        for (a, _, group), b1t in zip(spans, bias1):
            at = a
            for p in group["params"]:
                k = p.numel()
                u = direction[at:at + k].view_as(p) / b1t
                if group["weight_decay"]:
                    u = u + group["weight_decay"] * p
                p.add_(u, alpha=-group["lr"])
                at += k
        return loss

    def _error_feedback_state(self) -> dict[str, Any]:
        """This rank's error-feedback buffers (copies), with whose they are: what
        :meth:`state_dict` keeps under ``"onebit"``."""
        return {"rank": self.rank, "world_size": self.world_size, "steps": self.steps,
                "worker_error": self.worker_error.clone(), "server_error": self.server_error.clone()}

    def _follow_world(self, own: dict[str, Any]) -> None:
        """After an elastic sync (``hvd.elastic.TorchState``): lay the error buffers out
        for the ranks there are now. ``own`` is this rank's :meth:`_error_feedback_state`
        from before the sync: kept where this rank's number and the world's size are
        unchanged, else the buffers start from zero (what they held was this rank's
        share of the old world's exchange; dropping it loses one step's residual)."""
        self.rank, self.world_size = _ops.current_rank(), _ops.current_size()
        self._denom = None
        if (own["rank"], own["world_size"]) == (self.rank, self.world_size):
            self.worker_error.copy_(own["worker_error"])
            self.server_error.copy_(own["server_error"])
        else:
            self._size_buffers()

    def state_dict(self) -> dict[str, Any]:
        """Adam's state, and this rank's error-feedback buffers (one checkpoint per rank
        resumes the compression exactly)."""
        sd = super().state_dict()
        sd["onebit"] = self._error_feedback_state()
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        extra = dict(state_dict.get("onebit") or {})
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "onebit"})
        self._denom = None
        if not extra:
            return
        self.steps = int(extra["steps"])
        if extra["world_size"] != self.world_size or extra["worker_error"].numel() != self.worker_error.numel():
            warnings.warn("OneBitAdam: the checkpoint's error-feedback buffers are for another number of "
                          "ranks; they start from zero", stacklevel=2)
            return
        if extra["rank"] != self.rank:
            # Another rank's errors belong to its momentum and its chunk of the average:
            # added here they would be counted twice, or in the wrong chunk.
            self.worker_error.zero_()
            self.server_error.zero_()
            if extra["worker_error"].any() or extra["server_error"].any():
                warnings.warn(f"OneBitAdam: rank {self.rank} was given rank {extra['rank']}'s error-feedback "
                              f"buffers and starts its own from zero; save one checkpoint per rank to "
                              f"resume the compression exactly", stacklevel=2)
            return
        self.worker_error.copy_(extra["worker_error"])
        self.server_error.copy_(extra["server_error"])
