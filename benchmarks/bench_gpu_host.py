"""Host microseconds per GPU collective, on the fake CUDA runtime and NCCL.

What a GPU training step pays on the CPU for each collective, where no GPU is needed
to see it: the fake runtime (``tests/fake_cuda``) runs no kernels, so everything timed
here is hvdlite's host work and the CUDA and NCCL calls it makes. Run it on any
machine; it builds the fake libraries (g++) and launches its own ranks::

    python benchmarks/bench_gpu_host.py [--np 1] [--iters 2000] [--reps 5] [--results PATH]

Each collective is an allreduce of float32 device memory in place, submitted in one of
two ways: as one request each time, as the PyTorch front end submits a CUDA tensor
(``hvdlite.common.ops.submit`` with the tensor's stream, a ``Request`` waited for), or
as a persistent request prepared once, as ``DistributedOptimizer`` starts a gradient
bucket every step (``hvdlite.common.ops.Persistent``: one call to start, one to wait).
Waiting orders the tensor's stream after the collective. Each is split in three:

- **submit**: the call that hands the request to the engine; while the engine is idle,
  a GPU request's submitter takes the engine's step itself (queues NCCL), so this
  column then holds most of the work;
- **engine**: from there until the engine reports the request done (the negotiation,
  or the response cache's agreement, and NCCL queued on hvdlite's stream), watched by
  polling;
- **completion**: the wait that follows: the consumer stream ordered after the
  collective's event, the handle released.

Workloads: a lone 4 KiB allreduce both ways, and the 8 gradients of ``bench_gpu.py``'s
small CNN sent per tensor (``bucket_cap_mb=None``) and as one persistent bucket (the
default), their sizes divided by 256 (see ``SMALL_CNN``). The rows are medians over
repetitions of the per-collective (or per-step) time on rank 0; each repetition runs
every workload in turn, so that a slow phase of the machine falls on all rows alike,
and drains the stream after each (untimed: the fake does the device work on the host's
cores, so what a workload left queued would slow the next one down).
Compare two builds side by side with ``benchmarks/bench_builds.py --suites gpu_host``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import REPO, ResultsRun, add_results_options, command_line, results_path  # noqa: E402

# bench_gpu.py's SmallCNN: conv1..3 weights and biases, fc weight and bias, in float32
# elements divided by 256: the fake runtime moves the bytes with the CPU (its stand-in
# for the GPU's work), which would otherwise compete with the host work measured here.
SMALL_CNN = [max(1, n // 256) for n in (64 * 3 * 9, 64, 128 * 64 * 9, 128, 256 * 128 * 9, 256, 1000 * 256 * 16,
                                        1000)]

# The workloads (rows of the results file), in pairs: what a persistent request sends
# (as DistributedOptimizer sends a GPU gradient) and what a new request per tensor
# sends. (summary label, persistent row, per-request row)
LONE = ("lone allreduce 4 KiB, persistent", "lone allreduce 4 KiB, a request each time")
CNN = ("small CNN as one bucket (persistent)", "small CNN per tensor (8 allreduces)")
HOST = ("host memory: 4 KiB, persistent", "host memory: 4 KiB, a request each time")
PAIRS = [("small CNN step, one persistent bucket / per tensor", *CNN),
         ("lone 4 KiB on the GPU, persistent / a request each time", *LONE),
         ("lone 4 KiB in host memory, persistent / a request each time", *HOST)]


def worker(args: argparse.Namespace) -> None:
    # hvdlite and the fake's helpers come from PYTHONPATH: this tree, or another build
    # that bench_builds.py compares.
    import numpy as np

    from tests.fake_cuda import device as fake
    fake.load(os.path.dirname(os.environ["HVDLITE_CUDART_LIBRARY"]))
    import hvdlite as hvd
    from hvdlite.common import ops as _ops

    hvd.init()
    stream = fake.create_stream()

    def tensors(sizes: list[int], host: bool = False) -> list[tuple[object, object]]:
        out = []
        for n in sizes:
            if host:
                arr = np.ones(n, np.float32)
                raw = _ops.RawTensor(arr.ctypes.data, "float32", (n,))
            else:
                arr = fake.FakeDeviceArray.from_numpy(np.ones(n, np.float32))
                raw = _ops.RawTensor(arr.__cuda_array_interface__["data"][0], "float32", (n,), 0, stream)
            out.append((arr, raw))
        return out

    persistent = hasattr(_ops, "Persistent")  # (a build from before persistent requests has none)
    workloads = {
        LONE[1]: (tensors([1024]), False),
        LONE[0]: (tensors([1024]), True),
        CNN[1]: (tensors(SMALL_CNN), False),
        CNN[0]: (tensors([sum(SMALL_CNN)]), True),
        HOST[1]: (tensors([1024], host=True), False),
        HOST[0]: (tensors([1024], host=True), True),
    }
    def make_step(label: str, ts: list[tuple[object, object]], prepared: bool) -> Callable[[], tuple[int, ...]]:
        names = [f"bench.{label}.{i}" for i in range(len(ts))]
        on = None if label.startswith("host") else stream
        if prepared:
            (_, raw), = ts
            req = _ops.Persistent(_ops.ALLREDUCE, raw, raw, name=names[0], op=_ops.Sum)

            def step() -> tuple[int, ...]:
                t0 = time.perf_counter_ns()
                req.start(on)
                t1 = time.perf_counter_ns()
                while not req.poll():
                    pass
                t2 = time.perf_counter_ns()
                req.wait(on)
                t3 = time.perf_counter_ns()
                return t1 - t0, t2 - t1, t3 - t2
            return step

        def step() -> tuple[int, ...]:
            t0 = time.perf_counter_ns()
            reqs = [_ops.submit(_ops.ALLREDUCE, raw, raw, name=nm, op=_ops.Sum)
                    for (_, raw), nm in zip(ts, names)]
            t1 = time.perf_counter_ns()
            for r in reqs:
                while not r.poll():
                    pass
            t2 = time.perf_counter_ns()
            for r in reqs:
                r.wait()
            t3 = time.perf_counter_ns()
            return t1 - t0, t2 - t1, t3 - t2
        return step

    def counters() -> tuple[int, int, int]:
        stats = _ops._basics.core().stats()
        return stats["requests_in_full"], stats["requests_as_ids"], stats.get("submits_advanced", 0)

    runs = {label: (ts, make_step(label, ts, prepared)) for label, (ts, prepared) in workloads.items()
            if persistent or not prepared}
    for _, step in runs.values():
        for _ in range(50):  # warm up: communicator, response cache
            step()
    # Repetitions go round the workloads, so that a slow phase of the machine (the
    # fake's stream threads and the engine's sharing 2 cores) falls on every row alike.
    reps: dict[str, list[list[float]]] = {label: [] for label in runs}
    counted = {label: [0, 0, 0] for label in runs}  # in full, as ids, queued by the submitter
    for _ in range(args.reps):
        for label, (_, step) in runs.items():
            before = counters()
            acc = [0, 0, 0]
            for _ in range(args.iters):
                for k, v in enumerate(step()):
                    acc[k] += v
            reps[label].append([v / args.iters / 1e3 for v in acc])  # µs per step
            for k, (a, b) in enumerate(zip(counters(), before)):
                counted[label][k] += a - b
            # The fake runs the queued device work on this machine's cores: drain it
            # before the next workload, which would otherwise compete with what is left
            # of this one's (a build whose host work outpaces the fake leaves a backlog).
            fake.stream_synchronize(stream)
    rows = []
    for label, (ts, _) in runs.items():
        submit, engine, completion = (statistics.median(r[k] for r in reps[label]) for k in range(3))
        # Negotiated through rank 0 (in full) or agreed in cycles as response-cache ids;
        # queued on the device by the submitting thread itself, with no hand-off to the
        # engine's thread (an idle engine; GPU memory only).
        in_full, as_ids, advanced = counted[label]
        rows.append({"name": label, "collectives_per_step": len(ts), "submit_us": submit, "engine_us": engine,
                     "completion_us": completion, "step_us": submit + engine + completion,
                     "per_collective_us": (submit + engine + completion) / len(ts),
                     "bytes_per_step": 4 * sum(int(raw.shape[0]) for _, raw in ts),
                     "requests_through_rank0": in_full, "requests_as_cache_ids": as_ids,
                     "requests_queued_by_submitter": advanced})
    fake.stream_synchronize(stream)
    # Every rank has read its counters before any rank shuts down (a peer's
    # shutdown ends this rank's engine too).
    hvd.barrier()
    if hvd.rank() == 0:
        Path(args.worker_out).write_text(json.dumps(rows))
    hvd.shutdown()


def build_fake(outdir: Path) -> None:
    subprocess.run(["bash", str(REPO / "tests" / "fake_cuda" / "build.sh"), str(outdir)], check=True,
                   stdout=subprocess.DEVNULL)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=1, help="ranks (default 1: one rank's host cost, no peer to wait for)")
    p.add_argument("--iters", type=int, default=2000, help="steps per repetition (default 2000)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    add_results_options(p, "bench_gpu_host")
    args = p.parse_args()
    if args.worker_out:
        worker(args)
        return 0
    run = ResultsRun("bench_gpu_host")
    with tempfile.TemporaryDirectory() as tmp:
        fake_dir = Path(tmp) / "fake"
        build_fake(fake_dir)
        out = Path(tmp) / "rows.json"
        env = dict(os.environ, HVDLITE_CUDART_LIBRARY=str(fake_dir / "libcudart.so"),
                   HVDLITE_NCCL_LIBRARY=str(fake_dir / "libnccl.so"), HVDLITE_FAKE_CUDA_DELAY_US="0",
                   OMP_NUM_THREADS="1", PYTHONPATH=os.environ.get("PYTHONPATH") or str(REPO))
        cmd = [sys.executable, "-m", "hvdlite.runner", "-np", str(args.np), sys.executable, __file__,
               "--iters", str(args.iters), "--reps", str(args.reps), "--worker-out", str(out)]
        subprocess.run(cmd, env=env, check=True)
        rows = json.loads(out.read_text())
    print(f"\nhost µs on the fake CUDA runtime, {args.np} rank(s), medians of {args.reps} x {args.iters} steps")
    head = (f"{'workload':44} {'calls':>5} {'submit':>8} {'engine':>8} {'complete':>9} {'per step':>9} "
            f"{'per call':>9}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['name']:44} {r['collectives_per_step']:5d} {r['submit_us']:8.1f} {r['engine_us']:8.1f} "
              f"{r['completion_us']:9.1f} {r['step_us']:9.1f} {r['per_collective_us']:9.1f}")
    by_name = {r["name"]: r for r in rows}
    summary = []
    for label, new, old in PAIRS:
        if new in by_name and old in by_name:
            summary.append({"name": label, "ratio": by_name[new]["step_us"] / by_name[old]["step_us"], "peer": old})
            print(f"{label}: {summary[-1]['ratio']:.3f}")
    path = results_path(args, "bench_gpu_host")
    if path:
        run.write(path, rows, summary, {k: v for k, v in vars(args).items() if k != "worker_out"}, args.notes,
                  command=command_line())
        print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
