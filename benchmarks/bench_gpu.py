"""hvdlite's GPU path against its peers on a real GPU, side by side in one run.

Needs PyTorch with CUDA and NCCL (the machine the ``device`` tool lends; not this
project's CPU machines). Run on one rank per GPU -- NCCL refuses two ranks on one GPU::

    hvdlite-run -np 1 python benchmarks/bench_gpu.py [--json-out F.json]

Two measurements, each timed in interleaved repetitions (A B A B ...), median per side:

* ``step_overhead``: a training step of a small CNN (forward, backward, SGD step) with
  ``hvd.DistributedOptimizer`` against the same step in plain PyTorch. At size 1 the
  gradients still go through hvdlite's engine and NCCL, so the ratio is hvdlite's own
  cost per step (goal: at most 1.02).
* ``allreduce_256MiB``: ``hvd.allreduce_`` of a 256 MiB float32 tensor against
  ``ncclAllReduce`` called directly (ctypes, on the same NCCL library hvdlite loaded, a
  communicator of the same ranks, on PyTorch's current stream) (goal: at most 1.05).

Rank 0 prints one JSON line per measurement (name, hvdlite_ms, peer, peer_ms, ratio,
target, device) and a table.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdlite.torch as hvd
from hvdlite.common import basics, gpu_libraries


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1)
        self.conv2 = nn.Conv2d(64, 128, 3, padding=1)
        self.conv3 = nn.Conv2d(128, 256, 3, padding=1)
        self.fc = nn.Linear(256 * 4 * 4, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        return self.fc(x.flatten(1))


def timed(fn, iters: int) -> float:
    """Seconds per call of `fn`, GPU work included."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def interleaved(a, b, iters: int, reps: int) -> tuple[float, float]:
    ta, tb = [], []
    for _ in range(reps):
        ta.append(timed(a, iters))
        tb.append(timed(b, iters))
    return statistics.median(ta), statistics.median(tb)


def step_overhead(args: argparse.Namespace) -> dict:
    device = torch.device("cuda")
    x = torch.randn(args.batch, 3, 32, 32, device=device)
    y = torch.randint(0, 1000, (args.batch,), device=device)

    def make(distributed: bool):
        torch.manual_seed(0)
        model = SmallCNN().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if distributed:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

        def step() -> None:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return step

    plain, dist = make(False), make(True)
    for _ in range(5):  # warm up: cuDNN autotuning, NCCL communicator, response cache
        plain()
        dist()
    t_dist, t_plain = interleaved(dist, plain, args.step_iters, args.reps)
    return {"name": "step_overhead", "hvdlite_ms": t_dist * 1e3, "peer": "plain PyTorch step",
            "peer_ms": t_plain * 1e3, "ratio": t_dist / t_plain, "target": 1.02}


class DirectNccl:
    """ncclAllReduce through ctypes on the library hvdlite loaded, on a communicator of
    the same ranks (its unique id broadcast with hvdlite)."""

    def __init__(self) -> None:
        info = gpu_libraries.describe(basics._load_core())
        self.lib = ctypes.CDLL(info["nccl"]["path"])
        self.comm = ctypes.c_void_p()
        uid = ctypes.create_string_buffer(128)
        if hvd.rank() == 0:
            self._check(self.lib.ncclGetUniqueId(uid), "ncclGetUniqueId")
        raw = hvd.broadcast_object(bytes(uid.raw), root_rank=0)

        class UniqueId(ctypes.Structure):
            _fields_ = [("internal", ctypes.c_char * 128)]
        uid_struct = UniqueId()
        ctypes.memmove(ctypes.addressof(uid_struct), raw, 128)
        self.lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
        self._check(self.lib.ncclCommInitRank(ctypes.byref(self.comm), hvd.size(), uid_struct, hvd.rank()),
                    "ncclCommInitRank")
        self.lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                           ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed with NCCL error {rc}")

    def allreduce_(self, t: torch.Tensor) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        self._check(self.lib.ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), 7, 0, self.comm, stream),
                    "ncclAllReduce")  # float32, sum

    def close(self) -> None:
        self.lib.ncclCommDestroy(self.comm)


def allreduce_large(args: argparse.Namespace) -> dict:
    t = torch.ones(args.size_mib * 1024 * 1024 // 4, device="cuda")
    direct = DirectNccl()
    ours = lambda: hvd.allreduce_(t, op=hvd.Sum, name="bench.large")  # noqa: E731
    theirs = lambda: direct.allreduce_(t)  # noqa: E731
    ours()
    theirs()
    t_ours, t_theirs = interleaved(ours, theirs, args.ar_iters, args.reps)
    direct.close()
    return {"name": f"allreduce_{args.size_mib}MiB", "hvdlite_ms": t_ours * 1e3, "peer": "ncclAllReduce direct",
            "peer_ms": t_theirs * 1e3, "ratio": t_ours / t_theirs, "target": 1.05}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--step-iters", type=int, default=20)
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--ar-iters", type=int, default=10)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json-out")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu.py needs PyTorch with CUDA and a GPU", file=sys.stderr)
        return 2
    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    torch.backends.cudnn.benchmark = True
    rows = [step_overhead(args), allreduce_large(args)]
    if hvd.rank() == 0:
        name = torch.cuda.get_device_name()
        for row in rows:
            row["device"] = name
            row["ranks"] = hvd.size()
            print(json.dumps(row))
        print(f"\n# {hvd.size()} rank(s) on {name}")
        print(f"{'measurement':24s} {'hvdlite':>10s} {'peer':>10s} {'ratio':>7s} {'target':>7s}  peer")
        for row in rows:
            ok = "ok" if row["ratio"] <= row["target"] else "MISS"
            print(f"{row['name']:24s} {row['hvdlite_ms']:8.3f}ms {row['peer_ms']:8.3f}ms {row['ratio']:7.3f} "
                  f"{row['target']:7.2f} {ok:4s} {row['peer']}")
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(rows, f, indent=1)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
