"""GPU tensors through hvdlite.torch (host staging), checked against CPU references."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdlite.torch as hvd
from _wcommon import all_ranks, case, check_close, run_cases


def device() -> torch.device:
    return torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())


@case
def gpu_collectives() -> None:
    r, n = hvd.rank(), hvd.size()
    dev = device()
    torch.cuda.set_device(dev)
    xs = all_ranks((1000, 8), seed=1)
    # Produced by a kernel still queued on the current stream when the op starts.
    big = torch.tensor(xs[r], dtype=torch.float32, device=dev)
    y = (big * 3.0).sin()
    out = hvd.allreduce(y, op=hvd.Sum)
    assert out.device == dev
    check_close(out, np.sum([np.sin(a * 3.0) for a in xs], 0), "cuda allreduce", rtol=1e-5, atol=1e-5)
    # In place, then used by a kernel right away.
    z = torch.tensor(xs[r], dtype=torch.float64, device=dev)
    hvd.allreduce_(z, op=hvd.Max)
    check_close(z * 2, 2 * np.max(xs, 0), "cuda allreduce_")
    g = hvd.allgather(torch.full((r + 1, 2), float(r), device=dev))
    assert g.device == dev
    check_close(g, np.concatenate([np.full((k + 1, 2), float(k)) for k in range(n)]), "cuda allgather")
    b = torch.full((3,), float(r), device=dev, dtype=torch.bfloat16)
    hvd.broadcast_(b, root_rank=n - 1)
    check_close(b, np.full(3, float(n - 1)), "cuda broadcast_")
    a = hvd.alltoall(torch.arange(2 * n, device=dev, dtype=torch.float32) + 100 * r)
    want = np.concatenate([np.arange(2 * n)[2 * r:2 * r + 2] + 100 * k for k in range(n)])
    check_close(a, want, "cuda alltoall")


@case
def gpu_training() -> None:
    r, n = hvd.rank(), hvd.size()
    dev = device()
    torch.manual_seed(1 + r)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2)).double().to(dev)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    torch.manual_seed(1)
    ref = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2)).double()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)

    def data(k: int, s: int):
        g = torch.Generator().manual_seed(100 * s + k)
        return torch.randn(4, 5, generator=g, dtype=torch.float64), torch.randn(4, 2, generator=g, dtype=torch.float64)

    for s in range(3):
        opt.zero_grad()
        x, y = data(r, s)
        F.mse_loss(model(x.to(dev)), y.to(dev)).backward()
        opt.step()
        ref_opt.zero_grad()
        (sum(F.mse_loss(ref(data(k, s)[0]), data(k, s)[1]) for k in range(n)) / n).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.cpu(), q, atol=1e-10), "GPU training differs from the CPU reference"


if __name__ == "__main__":
    run_cases()
