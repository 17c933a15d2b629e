"""How much of this machine two processes get at once: memory bandwidth and arithmetic.

    python benchmarks/bench_host_memory.py [--rounds R] [--mib M] [--results PATH]

A training step mixes arithmetic (matrix products, which mostly run from cache) with
passes over memory (the optimizer update, the gradient allreduce). A machine scales
the first with its cores; whether it scales the second depends on its memory system,
which on a small virtual machine may be shared with the host's other guests. This
script measures both, with NumPy and one thread per process, each kernel first alone
and then in two processes started together:

* ``stream``: ``c = a + b`` over three float32 arrays of ``--mib`` MiB each (default
  40, beyond the last-level cache), reported as GB/s moved (read a, b; write c);
* ``matmul``: a 512 x 512 float32 product (in cache), reported as GFLOP/s.

``pair / alone`` is each process's speed with the other running over its speed alone:
1.0 means the second process costs the first nothing; 0.5 means the two share one
process's worth. The TensorFlow and PyTorch benchmarks' ``independent`` ceiling is
this, measured on whole training steps.

The results file (``benchmarks/_common.py``: command, machine, date, commit, every
measurement) goes to ``benchmarks/results/bench_host_memory.json`` by default.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ResultsRun, add_results_options, results_path  # noqa: E402  (sibling module)


UNITS = {"stream": "GB/s", "matmul": "GFLOP/s"}


def _kernel(kind: str, mib: int):
    """The kernel to repeat and the work one call does, in UNITS[kind] x seconds."""
    import numpy as np
    if kind == "stream":
        n = mib * (1 << 20) // 4
        a, b = np.ones(n, np.float32), np.ones(n, np.float32)
        c = np.empty_like(a)
        return (lambda: np.add(a, b, out=c)), 3 * 4 * n / 1e9
    m = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    return (lambda: m @ m), 2 * 512 ** 3 / 1e9


def _run(kind: str, mib: int, seconds: float, barrier, out) -> None:
    fn, work = _kernel(kind, mib)
    fn()
    barrier.wait()
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        reps += 1
    out.put(work * reps / (time.perf_counter() - t0))


def measure(kind: str, procs: int, mib: int, seconds: float) -> list[float]:
    """Per-process speed of `procs` processes running the kernel at once."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=_run, args=(kind, mib, seconds, barrier, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    rates = [out.get() for _ in ps]
    for p in ps:
        p.join()
    return rates


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mib", type=int, default=40, help="size of each stream array")
    p.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    add_results_options(p, "bench_host_memory")
    args = p.parse_args(argv)
    run = ResultsRun("bench_host_memory")
    rows = []
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned processes
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    print(f"{'kernel':7} {'unit':8} {'alone':>8} {'pair, each':>11} {'pair / alone':>13}")
    for kind in UNITS:
        alone, pair = [], []
        for _ in range(args.rounds):
            alone += measure(kind, 1, args.mib, args.seconds)
            pair += measure(kind, 2, args.mib, args.seconds)
        a, b = statistics.median(alone), statistics.median(pair)
        unit = UNITS[kind]
        print(f"{kind:7} {unit:8} {a:8.1f} {b:11.1f} {b / a:13.2f}")
        row = {"kernel": kind, "unit": unit, "alone": alone, "pair_each": pair, "pair_over_alone": b / a}
        print(json.dumps(row), flush=True)
        rows.append(row)
    summary = [{"kernel": r["kernel"], "unit": r["unit"], "alone": statistics.median(r["alone"]),
                "pair_each": statistics.median(r["pair_each"]), "pair_over_alone": r["pair_over_alone"]}
               for r in rows]
    run.write(results_path(args, "bench_host_memory"), rows, summary, vars(args), args.notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
