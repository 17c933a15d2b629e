"""Elastic training on Ray when a node dies: how long the survivors stand still.

Three emulated hosts (network namespaces, needs root), a Ray node of one CPU on each,
and ``RayExecutor(min_workers=2, max_workers=3)`` training a small PyTorch model with
``hvd.elastic.run`` and a commit every step. After ``--kill-at`` steps one node's Ray
processes are killed (its actor, Open MPI daemon and worker with them); the two
survivors go on from their last commit. The figure is the longest gap between two
completed steps (rank 0's log) around the loss, against the median gap of the steps
before it, over ``--rounds`` rounds.

    python benchmarks/bench_ray_elastic.py     # writes benchmarks/results/bench_ray_elastic.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import REPO, ResultsRun, add_results_options, results_path  # noqa: E402

sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--kill-at", type=int, default=15)
    p.add_argument("--pause", type=float, default=0.2, help="seconds of work per step")
    add_results_options(p, "bench_ray_elastic")
    args = p.parse_args(argv)

    from tests.engines.common import elastic_steps
    from tests.hosts import ray_cluster
    from tests.hosts.emulated import EmulatedHosts
    why = ray_cluster.unavailable()
    if why:
        print(f"bench_ray_elastic: {why}", file=sys.stderr)
        return 2
    import ray

    from hvdlite.ray import RayExecutor

    run = ResultsRun("bench_ray_elastic")
    os.environ["PYTHONPATH"] = str(REPO)
    rows = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as folder, EmulatedHosts(3) as hosts, \
                ray_cluster.RayCluster(hosts, cpus=1) as cluster:
            saved = dict(os.environ)
            os.environ.update(hosts.env())
            ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
            log = os.path.join(folder, "steps.log")
            killed = []

            def kill() -> None:
                while not os.path.exists(log) or len(open(log).read().splitlines()) < args.kill_at:
                    time.sleep(0.05)
                killed.append(time.time())
                cluster.kill_node("h2")

            threading.Thread(target=kill, daemon=True).start()
            ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), min_workers=2, max_workers=3)
            try:
                ex.start()
                got = ex.run(elastic_steps, args=[args.steps, log, args.pause])
            finally:
                ex.shutdown()
                ray.shutdown()
                os.environ.clear()
                os.environ.update(saved)
            lines = [line.split() for line in open(log).read().splitlines()]
        times = [float(t) for t, _, _ in lines]
        gaps = [b - a for a, b in zip(times, times[1:])]
        before = [g for g, (_, _, size) in zip(gaps, lines[1:]) if size == "3"]
        row = {"round": r, "workers_after": len(got), "steps_logged": len(lines),
               "longest_gap_s": round(max(gaps), 3), "median_gap_before_s": round(statistics.median(before), 3),
               "killed_at": killed[0] if killed else None}
        rows.append(row)
        print(f"round {r}: longest gap {row['longest_gap_s']:.2f} s (steps before the loss: "
              f"{row['median_gap_before_s']:.2f} s each); {len(got)} workers at the end", flush=True)
    longest = statistics.median(x["longest_gap_s"] for x in rows)
    print(f"\nlongest gap between two steps around a lost node (median of {args.rounds}): {longest:.2f} s")
    summary = [{"name": "ray_elastic_longest_gap_s", "value": round(longest, 3)}]
    run.write(results_path(args, "bench_ray_elastic"), rows, summary, vars(args), args.notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
