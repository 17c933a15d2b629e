"""Training throughput on synthetic data, in the spirit of Horovod's synthetic benchmark.

    hvdlite-run -np 2 python examples/pytorch/pytorch_synthetic_benchmark.py --model resnet
    hvdlite-run -np 2 python examples/pytorch/pytorch_synthetic_benchmark.py --model mlp

Three models (no torchvision needed):

* ``mlp``: 20 Linear+ReLU layers, 1024 -> 700 (x19) -> 10, 9.56 M parameters in 40
  tensors; little compute per byte of gradient, so it stresses communication.
* ``resnet``: a ResNet-like CNN for 32x32 images, 3 stages of 2 basic blocks with widths
  64/128/256, 2.78 M parameters in 47 tensors; compute-heavy.
* ``resnet18``: ResNet-18's layers for 32x32 images (4 stages of 2 basic blocks, widths
  64 to 512, 1000 classes), 11.7 M parameters in 62 tensors; for a GPU.

Each rank trains on its own random batch of ``--batch-size`` samples with
``hvd.DistributedOptimizer``; the script prints images (samples) per second per rank
and in total, as mean +- 1.96 standard deviations over ``--num-iters`` measurements.
"""
from __future__ import annotations

import argparse
import sys
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp() -> nn.Module:
    """1024 -> 700 (x19) -> 10 with ReLU between the layers: 9,557,110 parameters."""
    widths = [1024] + [700] * 19 + [10]
    layers: list[nn.Module] = []
    for i in range(20):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < 19:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """Stem + one stage of 2 basic blocks per width (the first block of each stage after
    the first halves the image) + linear."""

    def __init__(self, widths: tuple[int, ...], num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        blocks = []
        cin = 64
        for i, width in enumerate(widths):
            for j in range(2):
                blocks.append(BasicBlock(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def resnet() -> nn.Module:
    """Widths 64/128/256, 10 classes: 2,777,674 parameters."""
    return ResNet((64, 128, 256))


def resnet18() -> nn.Module:
    """ResNet-18's widths 64/128/256/512 and 1000 classes: 11,681,832 parameters."""
    return ResNet((64, 128, 256, 512), num_classes=1000)


MODELS = {"mlp": (mlp, (1024,)), "resnet": (resnet, (3, 32, 32)), "resnet18": (resnet18, (3, 32, 32))}


def synthetic_batch(model_name: str, batch_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = MODELS[model_name][1]
    return torch.randn((batch_size,) + shape, generator=g), torch.randint(0, 10, (batch_size,), generator=g)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="hvdlite PyTorch synthetic benchmark",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="resnet")
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16")
    p.add_argument("--threads", type=int, default=0,
                   help="PyTorch threads per rank; 0 keeps PyTorch's choice, which follows "
                        "OMP_NUM_THREADS (hvdlite-run sets it to the host's cores / its ranks)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import hvdlite.torch as hvd

    args = parse_args(argv)
    hvd.init()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = MODELS[args.model][0]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    data, target = synthetic_batch(args.model, args.batch_size, seed=hvd.rank())

    def benchmark_step() -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def log(text: str) -> None:
        if hvd.rank() == 0:
            print(text, flush=True)

    n_params = sum(p.numel() for p in model.parameters())
    log(f"Model: {args.model} ({n_params / 1e6:.2f} M parameters in "
        f"{len(list(model.parameters()))} tensors)")
    log(f"Batch size: {args.batch_size} per rank")
    log(f"Number of ranks: {hvd.size()}, {torch.get_num_threads()} PyTorch thread(s) each")
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / t
        log(f"Iter #{i}: {rate:.1f} img/sec per rank")
        rates.append(rate)
    # Every rank's own mean, so the total is a sum over ranks, not rank 0 times size.
    mine = torch.tensor([float(np.mean(rates))], dtype=torch.float64)
    per_rank = hvd.allgather(mine).numpy()
    mean, conf = float(np.mean(rates)), 1.96 * float(np.std(rates))
    log(f"Img/sec per rank: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} rank(s): {per_rank.sum():.1f} +-{hvd.size() * conf:.1f}")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
