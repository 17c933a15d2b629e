"""hvdlite's GPU path against its peers on a real GPU, side by side in one run.

Needs PyTorch with CUDA and NCCL (the machine the ``device`` tool lends; not this
project's CPU machines). Run on one rank per GPU -- NCCL refuses two ranks on one GPU::

    hvdlite-run -np 1 python benchmarks/bench_gpu.py [--json-out F.json] [--results PATH]

Two measurements, each timed in interleaved repetitions (A B A B ...), median per side:

* ``step_overhead``: a training step (forward, backward, SGD step) of a small CNN and of
  a ResNet-18-sized network (11.7 M parameters) with ``hvd.DistributedOptimizer``,
  with its gradient buckets (the default) and per tensor (``bucket_cap_mb=None``),
  against the same step under ``DistributedDataParallel`` on NCCL (goal: at most 1.02)
  and in plain PyTorch. The optimizer is built as in an elastic job, whose hooks stay
  at size 1, so at size 1 the gradients still go through hvdlite's engine and NCCL.
  The step counts the allreduces it ran, to show they did.
* ``allreduce``: ``hvd.allreduce_`` of a 256 MiB float32 tensor against ``ncclAllReduce``
  called directly (ctypes, on the same NCCL library hvdlite loaded, a communicator of
  the same ranks, on PyTorch's current stream) and against
  ``torch.distributed.all_reduce`` on NCCL; in place and into a new tensor (goal for
  the new tensor against NCCL: at most 1.05); and the same at 4 KiB, where each layer's
  fixed cost per call shows (goal against ``torch.distributed``: at most 1.2).

Rank 0 prints one JSON line per measurement (name, hvdlite_ms, peer, peer_ms, ratio,
target, device) and a table, and writes the results file (``benchmarks/_common.py``:
command, machine and GPU, date, commit, the rows), by default
``benchmarks/results/bench_gpu.json``.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed
import torch.nn as nn
import torch.nn.functional as F

import hvdlite.torch as hvd
from hvdlite.common import basics, gpu_libraries

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (ResultsRun, add_results_options, command_line, load_synthetic_models,  # noqa: E402
                     results_path)


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


def step_overhead(args: argparse.Namespace) -> list[dict]:
    import torch.distributed as dist
    device = torch.device("cuda", torch.cuda.current_device())
    rows = []
    resnet18 = load_synthetic_models().MODELS["resnet18"][0]
    for model_name, net, batch in [("small CNN", SmallCNN, args.batch), ("ResNet-18", resnet18, args.resnet_batch)]:
        x = torch.randn(batch, 3, 32, 32, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)

        def make(kind: str):
            torch.manual_seed(0)
            model = net().to(device)
            if kind == "ddp":
                model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index or 0])
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            if kind.startswith("hvdlite"):
                # Alone, DistributedOptimizer has nothing to average and adds no hooks, as
                # in Horovod, except in an elastic job. Marked as one here (for the
                # construction only), its gradients go through hvdlite's engine and NCCL
                # even at size 1.
                os.environ["HVDLITE_ELASTIC"] = "1"
                try:
                    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                                   bucket_cap_mb=None if kind == "hvdlite per tensor" else 25)
                finally:
                    del os.environ["HVDLITE_ELASTIC"]

            def step() -> None:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            return step

        ours = {"hvdlite buckets": make("hvdlite buckets"), "hvdlite per tensor": make("hvdlite per tensor")}
        peers = {"plain PyTorch step": make("plain")}
        if dist.is_initialized():
            peers["DistributedDataParallel (NCCL)"] = make("ddp")
        for _ in range(5):  # warm up: cuDNN autotuning, NCCL communicators, response cache
            for step in (*ours.values(), *peers.values()):
                step()
        core = basics._load_core()
        for mine, step_ours in ours.items():
            for peer, theirs in peers.items():
                before = core.stats()["device_collectives"]
                t_ours, t_theirs = interleaved(step_ours, theirs, args.step_iters, args.reps)
                per_step = (core.stats()["device_collectives"] - before) / (args.step_iters * args.reps)
                rows.append({"name": f"step {model_name}, {mine}", "hvdlite_ms": t_ours * 1e3, "peer": peer,
                             "peer_ms": t_theirs * 1e3, "ratio": t_ours / t_theirs,
                             "target": 1.02 if peer.startswith("Distributed") else None,
                             "gpu_collectives_per_step": per_step})
    return rows


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

    def allreduce(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        self._check(self.lib.ncclAllReduce(src.data_ptr(), dst.data_ptr(), src.numel(), 7, 0, self.comm, stream),
                    "ncclAllReduce")  # float32, sum

    def close(self) -> None:
        self.lib.ncclCommDestroy(self.comm)


def torch_distributed_group() -> None:
    """torch.distributed on NCCL over the same ranks: what a DDP user's gradients go through."""
    import socket
    import torch.distributed as dist
    addr = None
    if hvd.rank() == 0:
        try:
            host = socket.gethostbyname(socket.gethostname())
        except OSError:  # a host whose name does not resolve: one host, then
            host = "127.0.0.1"
        with socket.socket() as s:
            s.bind(("", 0))
            addr = (host, s.getsockname()[1])
    host, port = hvd.broadcast_object(addr, root_rank=0)
    dist.init_process_group("nccl", init_method=f"tcp://{host}:{port}", rank=hvd.rank(), world_size=hvd.size(),
                            device_id=torch.device("cuda", torch.cuda.current_device()))


def allreduces(args: argparse.Namespace) -> list[dict]:
    """hvdlite's allreduce against ncclAllReduce called directly and against
    torch.distributed's, in place and into a new tensor, at a large size and a small one.
    On one rank NCCL moves no data for an in-place allreduce, so there the times are each
    layer's fixed cost per call."""
    import torch.distributed as dist
    direct = DirectNccl()
    rows = []
    for label, numel, iters in [(f"{args.size_mib}MiB", args.size_mib * 1024 * 1024 // 4, args.ar_iters),
                                ("4KiB", 1024, args.ar_iters * 10)]:
        t = torch.ones(numel, device="cuda")
        out = torch.empty_like(t)
        cases = {
            "in place": (lambda: hvd.allreduce_(t, op=hvd.Sum, name=f"bench.{label}.inplace"),
                         {"ncclAllReduce direct": lambda: direct.allreduce(t, t),
                          **({"torch.distributed.all_reduce": lambda: dist.all_reduce(t)}
                             if dist.is_initialized() else {})}),
            "new tensor": (lambda: hvd.allreduce(t, op=hvd.Sum, name=f"bench.{label}.new"),
                           {"ncclAllReduce direct": lambda: direct.allreduce(t, out)}),
        }
        for how, (ours, peers) in cases.items():
            ours()
            for name, theirs in peers.items():
                theirs()
                t_ours, t_theirs = interleaved(ours, theirs, iters, args.reps)
                target = None
                if label == "4KiB" and name.startswith("torch"):
                    target = 1.2
                elif label != "4KiB" and how == "new tensor":
                    target = 1.05
                rows.append({"name": f"allreduce_{label} ({how})", "hvdlite_ms": t_ours * 1e3, "peer": name,
                             "peer_ms": t_theirs * 1e3, "ratio": t_ours / t_theirs, "target": target})
    direct.close()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--resnet-batch", type=int, default=64)
    p.add_argument("--step-iters", type=int, default=20)
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--ar-iters", type=int, default=10)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json-out")
    add_results_options(p, "bench_gpu")
    args = p.parse_args()
    run = ResultsRun("bench_gpu")
    if not torch.cuda.is_available():
        print("bench_gpu.py needs PyTorch with CUDA and a GPU", file=sys.stderr)
        return 2
    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    torch.backends.cudnn.benchmark = True
    try:
        torch_distributed_group()
    except Exception as exc:  # the table keeps the other peers
        print(f"torch.distributed on NCCL unavailable, its rows left out: {exc}", file=sys.stderr)
    rows = [*step_overhead(args), *allreduces(args)]
    if hvd.rank() == 0:
        name = torch.cuda.get_device_name()
        for row in rows:
            row["device"] = name
            row["ranks"] = hvd.size()
            print(json.dumps(row))
        print(f"\n# {hvd.size()} rank(s) on {name}")
        print(f"{'measurement':36s} {'hvdlite':>10s} {'peer':>10s} {'ratio':>7s} {'target':>7s}  peer")
        for row in rows:
            target = row["target"]
            ok = "" if target is None else "ok" if row["ratio"] <= target else "MISS"
            shown = "" if target is None else f"{target:.2f}"
            print(f"{row['name']:36s} {row['hvdlite_ms']:8.3f}ms {row['peer_ms']:8.3f}ms {row['ratio']:7.3f} "
                  f"{shown:>7s} {ok:4s} {row['peer']}")
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(rows, f, indent=1)
        summary = [{k: r[k] for k in ("name", "peer", "ratio", "target")} for r in rows]
        run.write(results_path(args, "bench_gpu"), rows, summary, vars(args), args.notes,
                  command=command_line(launcher=f"hvdlite-run -np {hvd.size()} python"),
                  extra={"device": name, "cuda": torch.version.cuda})
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
