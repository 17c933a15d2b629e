"""SyncBatchNorm on N ranks against torch.nn.BatchNorm on the concatenated batch.

Rank k holds k + 2 samples (uneven on purpose). With loss = sum over all ranks of
sum(y * w), the gradient each rank gets for its inputs must equal the single-process
gradient of the same total loss for those rows.
"""
from __future__ import annotations

import torch
import torch.nn as nn

import hvdlite.torch as hvd
from _wcommon import case, run_cases

torch.set_default_dtype(torch.float64)


def inputs(k: int, shape_tail: tuple[int, ...], step: int = 0):
    g = torch.Generator().manual_seed(300 + k + 17 * step)
    x = torch.randn((k + 2,) + shape_tail, generator=g) * 3 + 1
    w = torch.randn((k + 2,) + shape_tail, generator=g)
    return x, w


def compare(bn_cls, sync_kwargs: dict, shape_tail: tuple[int, ...], what: str) -> None:
    r, n = hvd.rank(), hvd.size()
    c = shape_tail[0]
    sync = hvd.SyncBatchNorm(c, **sync_kwargs)
    ref = bn_cls(c, **sync_kwargs)
    with torch.no_grad():
        if sync.affine:
            for m in (sync, ref):
                m.weight.copy_(torch.linspace(0.5, 1.5, c))
                m.bias.copy_(torch.linspace(-1, 1, c))
    for step in range(2):
        x, w = inputs(r, shape_tail, step)
        x.requires_grad_(True)
        y = sync(x)
        (y * w).sum().backward()

        xs, ws = zip(*[inputs(k, shape_tail, step) for k in range(n)])
        xa = torch.cat(xs).requires_grad_(True)
        ya = ref(xa)
        (ya * torch.cat(ws)).sum().backward()
        start = sum(k + 2 for k in range(r))
        rows = slice(start, start + r + 2)
        assert torch.allclose(y, ya[rows], atol=1e-10), f"{what}: forward differs (step {step})"
        assert torch.allclose(x.grad, xa.grad[rows], atol=1e-10), f"{what}: input gradient differs"
        if sync.track_running_stats:
            assert torch.allclose(sync.running_mean, ref.running_mean, atol=1e-12), f"{what}: running_mean"
            assert torch.allclose(sync.running_var, ref.running_var, atol=1e-12), f"{what}: running_var"
            assert int(sync.num_batches_tracked) == int(ref.num_batches_tracked)
    if sync.affine:
        # Parameter gradients are per rank (DistributedOptimizer averages them); their sum
        # over ranks is the single-process gradient.
        gw = hvd.allreduce(sync.weight.grad, op=hvd.Sum)
        gb = hvd.allreduce(sync.bias.grad, op=hvd.Sum)
        assert torch.allclose(gw, ref.weight.grad, atol=1e-9), f"{what}: weight gradient"
        assert torch.allclose(gb, ref.bias.grad, atol=1e-9), f"{what}: bias gradient"
    # Eval mode uses the running statistics, like BatchNorm.
    sync.eval()
    ref.eval()
    x, _ = inputs(r, shape_tail)
    assert torch.allclose(sync(x), ref(x), atol=1e-10), f"{what}: eval mode"


@case
def syncbn_1d() -> None:
    compare(nn.BatchNorm1d, {}, (4,), "BatchNorm1d on (N, C)")
    compare(nn.BatchNorm1d, {"momentum": None}, (3, 5), "BatchNorm1d (N, C, L), cumulative average")


@case
def syncbn_2d() -> None:
    compare(nn.BatchNorm2d, {}, (3, 4, 5), "BatchNorm2d")
    compare(nn.BatchNorm2d, {"affine": False}, (2, 3, 3), "BatchNorm2d without affine")


@case
def syncbn_float32_and_convert() -> None:
    r = hvd.rank()
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU()).float()
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(converted[1], hvd.SyncBatchNorm)
    assert converted[1].weight is model[1].weight
    x = torch.randn(2 + r, 2, 6, 6, dtype=torch.float32)
    out = converted(x)
    assert out.dtype == torch.float32 and out.shape == (2 + r, 3, 4, 4)
    out.sum().backward()
    assert converted[0].weight.grad is not None


if __name__ == "__main__":
    run_cases()
