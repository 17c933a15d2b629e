"""Batch normalization with the statistics of the global batch (all ranks together)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from hvdlite.common.basics import size
from hvdlite.torch.mpi_ops import Sum, allgather, allreduce


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                eps: float, momentum: float) -> torch.Tensor:
        channels = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        shape = [1, channels] + [1] * (x.dim() - 2)
        xs = x.detach().to(torch.float64)
        count = x.numel() // channels if channels else 0
        if count > 0:
            mean_l = xs.mean(dims)
            m2_l = ((xs - mean_l.view(shape)) ** 2).sum(dims)
        else:
            mean_l = xs.new_zeros(channels)
            m2_l = xs.new_zeros(channels)
        # Per-rank (count, mean, M2) combined exactly (Chan et al.), in float64.
        local = torch.cat([xs.new_tensor([float(count)]), mean_l, m2_l]).unsqueeze(0)
        gathered = allgather(local)
        counts = gathered[:, 0]
        total = counts.sum()
        if total <= 0:
            raise ValueError("SyncBatchNorm: the global batch is empty")
        means = gathered[:, 1:1 + channels]
        mean = (counts[:, None] * means).sum(0) / total
        m2 = gathered[:, 1 + channels:].sum(0) + (counts[:, None] * (means - mean) ** 2).sum(0)
        var = m2 / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = m2 / (total - 1) if total > 1 else var
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        mean_c = mean.to(compute).view(shape)
        invstd_c = invstd.to(compute).view(shape)
        xhat = (x.detach().to(compute) - mean_c) * invstd_c
        y = xhat
        if weight is not None:
            y = y * weight.detach().to(compute).view(shape)
        if bias is not None:
            y = y + bias.detach().to(compute).view(shape)
        ctx.save_for_backward(xhat, weight, invstd_c)
        ctx.total = float(total)
        ctx.has_bias = bias is not None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        xhat, weight, invstd = ctx.saved_tensors
        channels = xhat.shape[1]
        dims = [0] + list(range(2, xhat.dim()))
        shape = [1, channels] + [1] * (xhat.dim() - 2)
        dy = grad_out.to(xhat.dtype)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            # The input gradient depends on every rank's outputs through the shared mean
            # and variance: sum those terms over all ranks.
            both = allreduce(torch.cat([sum_dy, sum_dy_xhat]), op=Sum)
            g_dy, g_dy_xhat = both[:channels], both[channels:]
            scale = invstd if weight is None else invstd * weight.detach().to(xhat.dtype).view(shape)
            grad_x = scale * (dy - (g_dy / ctx.total).view(shape)
                              - xhat * (g_dy_xhat / ctx.total).view(shape))
            grad_x = grad_x.to(grad_out.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = sum_dy_xhat.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = sum_dy.to(weight.dtype if weight is not None else grad_out.dtype)
        return grad_x, grad_w, grad_b, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose mean and variance are computed over the whole global
    batch (the union of every rank's batch, whose sizes may differ), in training mode.

    A drop-in replacement for ``torch.nn.BatchNorm1d/2d/3d`` (any input of shape
    ``(N, C, ...)``). In evaluation mode, or with a single rank, it behaves exactly
    like ``BatchNorm``. The running statistics are updated identically on all ranks (the
    running variance uses the unbiased global variance, as PyTorch does). Every rank must
    call it the same number of times in the same order.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                momentum = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        running_mean = self.running_mean if (not self.training or self.track_running_stats) else None
        running_var = self.running_var if (not self.training or self.track_running_stats) else None
        if not use_batch_stats or size() == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                use_batch_stats, momentum, self.eps)
        return _SyncBatchNormFn.apply(input, self.weight, self.bias, running_mean, running_var,
                                      self.eps, momentum)

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module) -> torch.nn.Module:
        """Return ``module`` with every ``BatchNorm*d`` replaced by ``SyncBatchNorm``
        (parameters and running statistics carried over). hvdlite addition."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child))
        return out
