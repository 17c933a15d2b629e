"""A few training steps whose backward pass is slow between layers, for the timeline test.

Each layer's backward takes at least ``DELAY`` seconds (a sleeping autograd function), so
a backward pass lasts several times ``DELAY``. With hooks that start each gradient's
allreduce as soon as it is ready, the last layers' allreduces run while the first
layers' gradients are still being computed; the test reads that from the trace file
(HVDLITE_TIMELINE) rank 0 writes. The argument is ``per_tensor`` (an allreduce per
gradient) or ``buckets`` (gradient buckets of one layer each). Rank 0 prints ``STEP <i> BACKWARD_S <seconds>`` (the
duration of each backward pass) so the test can see that all steps ran.
"""
from __future__ import annotations

import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdlite.torch as hvd

DELAY = 0.1
LAYERS = 5


class SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        time.sleep(DELAY)
        return grad


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = SlowBackward.apply(torch.tanh(layer(x)))
        return x


def main() -> None:
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = Net()
    layer_mib = sum(p.numel() * p.element_size() for p in model.layers[0].parameters()) / 2 ** 20
    cap = None if sys.argv[1] == "per_tensor" else layer_mib * 1.1
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), bucket_cap_mb=cap)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(3):
        opt.zero_grad()
        x = torch.randn(8, 64)
        loss = F.mse_loss(model(x), torch.zeros(8, 64))
        t0 = time.perf_counter()
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        if hvd.rank() == 0:
            print(f"STEP {step} BACKWARD_S {t1 - t0:.4f}", flush=True)
    hvd.barrier()
    hvd.shutdown()


if __name__ == "__main__":
    main()
