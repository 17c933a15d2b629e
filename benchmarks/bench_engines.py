"""Ray and Spark against hvdlite.run on the same ranks of this machine: the cost of
starting a job, and steady training.

Start-up: from the call until the first line of the user's function runs on every rank
(each rank notes the wall-clock time it entered the function; same machine, same
clock), for

* ``hvdlite.run(fn, num_proc=N)``: the baseline (the launch of ``hvdlite-run``);
* ``RayExecutor.run(fn)`` with the executor already started (actors and ranks up: the
  steady state of an executor that runs many functions);
* ``RayExecutor(...).start()`` then ``.run(fn)``: from scratch on a running Ray instance
  (actors, placement group, ranks);
* ``hvdlite.spark.run(fn)`` on an active ``local[N]`` session.

Training: a PyTorch MLP (``--width``, ``--layers``) with ``DistributedOptimizer``,
``--steps`` timed steps after ``--warmup``, its steps/s measured inside the function
on rank 0, through each launcher in turn, in ``--rounds`` rounds; the ratio is each
launcher's median over hvdlite.run's.

    python benchmarks/bench_engines.py            # 2 ranks, writes benchmarks/results/bench_engines.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ResultsRun, add_results_options, results_path  # noqa: E402


def entered() -> float:
    return time.time()


def train(width: int, layers: int, warmup: int, steps: int) -> float:
    """Steps per second of an MLP trained with DistributedOptimizer (rank 0's clock)."""
    import torch
    import torch.nn as nn

    import hvdlite.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.randn(32, width)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    for _ in range(warmup):
        step()
    hvd.allreduce(torch.zeros(1), name="timed.start")
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    hvd.allreduce(torch.zeros(1), name="timed.end")
    return steps / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=200)
    add_results_options(p, "bench_engines")
    args = p.parse_args(argv)
    run = ResultsRun("bench_engines")

    import cloudpickle
    import ray
    from pyspark.sql import SparkSession

    import hvdlite
    import hvdlite.spark
    from hvdlite.ray import RayExecutor

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    n = args.ranks
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # The started executor holds n CPUs; the one made from scratch needs n more.
    ray.init(num_cpus=2 * n, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    spark = (SparkSession.builder.master(f"local[{n}]").config("spark.ui.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    settings = RayExecutor.create_settings(timeout_s=120)
    warm = RayExecutor(settings, num_workers=n)
    warm.start()

    def cold_ray(fn: Callable, *a: Any) -> list[Any]:
        ex = RayExecutor(settings, num_workers=n)
        ex.start()
        try:
            return ex.run(fn, args=list(a))
        finally:
            ex.shutdown()

    launchers: dict[str, Callable[..., list[Any]]] = {
        "hvdlite.run": lambda fn, *a: hvdlite.run(fn, args=a, num_proc=n),
        "ray_started": lambda fn, *a: warm.run(fn, args=list(a)),
        "ray_from_scratch": cold_ray,
        "spark_local": lambda fn, *a: hvdlite.spark.run(fn, args=a, num_proc=n),
    }
    rows: list[dict[str, Any]] = []
    try:
        # Each launcher once before timing: the first use of anything pays for imports.
        for name, launch in launchers.items():
            launch(entered)
        for r in range(args.rounds):
            for name, launch in launchers.items():
                t0 = time.time()
                entries = launch(entered)
                rows.append({"kind": "startup", "launcher": name, "round": r,
                             "seconds": max(entries) - t0})
                print(f"startup {name:17s} round {r}: {rows[-1]['seconds']:.3f} s", flush=True)
        for r in range(args.rounds):
            for name in ("hvdlite.run", "ray_started", "spark_local"):
                rate = launchers[name](train, args.width, args.layers, args.warmup, args.steps)[0]
                rows.append({"kind": "training", "launcher": name, "round": r, "steps_per_s": rate})
                print(f"training {name:16s} round {r}: {rate:.1f} steps/s", flush=True)
    finally:
        warm.shutdown()
        spark.stop()
        ray.shutdown()

    def median(kind: str, name: str, field: str) -> float:
        return statistics.median(x[field] for x in rows if x["kind"] == kind and x["launcher"] == name)

    base = median("startup", "hvdlite.run", "seconds")
    summary = [{"name": "startup_hvdlite_run_s", "value": round(base, 3)}]
    print(f"\n{'start-up (median)':28s} {'seconds':>8s} {'beyond hvdlite.run':>19s}")
    print(f"{'hvdlite.run':28s} {base:8.3f} {'':>19s}")
    for name in ("ray_started", "ray_from_scratch", "spark_local"):
        s = median("startup", name, "seconds")
        summary.append({"name": f"startup_{name}_beyond_s", "value": round(s - base, 3)})
        print(f"{name:28s} {s:8.3f} {s - base:+18.3f}s")
    train_base = median("training", "hvdlite.run", "steps_per_s")
    print(f"\n{'training (median)':28s} {'steps/s':>8s} {'÷ hvdlite.run':>14s}")
    print(f"{'hvdlite.run':28s} {train_base:8.1f}")
    for name in ("ray_started", "spark_local"):
        s = median("training", name, "steps_per_s")
        summary.append({"name": f"training_{name}_ratio", "value": round(s / train_base, 3)})
        print(f"{name:28s} {s:8.1f} {s / train_base:14.3f}")
    run.write(results_path(args, "bench_engines"), rows, summary, vars(args), args.notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
