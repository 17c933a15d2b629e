"""Horovod's autotuner in hvdlite: what the search costs, and what the settings it keeps give.

    python benchmarks/bench_autotune.py [--models mlp,resnet] [--steps 1000] [--rounds 3]
                                        [--ranks 2] [--quick] [--results PATH]

Runs the PyTorch training benchmark's models (``bench_torch_training.py``: SGD through
``hvdlite.torch.DistributedOptimizer`` on synthetic batches) on ``--ranks`` processes
under ``hvdlite-run``, ``--steps`` steps per run, in two modes taken in turn each round:

* ``default``: hvdlite's default settings;
* ``autotune``: ``--autotune`` with Horovod's defaults (3 warm-up samples, 10 steps per
  sample, at most 20 scored samples), its log written to a temporary CSV file.

Rank 0 notes the time at the end of every step. Reported per model, medians over the
rounds (ratios are taken within a round, then the median):

* ``run ratio`` = autotune's time for all ``--steps`` steps / default's: the search's cost
  (Horovod's target: at most 1.05 over 1,000 steps);
* ``tuned ratio`` = default's time / autotune's time over the steps after tuning ended
  (the last sample of the log, plus a margin of 20 steps), for the same step range in
  both runs: >= 1.0 means the settings kept are at least as fast as the defaults;
* what the tuner kept (from its log), and on which step the search ended.

The results file (``benchmarks/_common.py``: command, machine, date, commit, every run's
time and what the tuner kept) goes to ``benchmarks/results/bench_autotune.json`` by
default; ``--quick`` writes none unless ``--results PATH`` is given.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ResultsRun, add_results_options, launcher, results_path  # noqa: E402  (sibling module)

REPO = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> None:
    """Runs under the launcher: ``--steps`` training steps, rank 0 prints step end times."""
    import time

    import torch
    import torch.nn.functional as F

    import hvdlite.torch as hvd
    from bench_torch_training import make_training  # noqa: E402  (sibling module)

    torch.set_num_threads(1)
    hvd.init()
    model, opt, (data, target) = make_training(args.worker_model, seed=hvd.rank())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.barrier()
    ends = []
    t0 = time.perf_counter()
    for _ in range(args.steps):
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()
        ends.append(time.perf_counter() - t0)
    if hvd.rank() == 0:
        print("STEP_ENDS " + json.dumps(ends), flush=True)
    hvd.shutdown()


def run(model: str, autotune: bool, args: argparse.Namespace) -> dict[str, Any]:
    extra: list[str] = []
    log = None
    if autotune:
        log = tempfile.NamedTemporaryFile(prefix="hvdlite-autotune-", suffix=".csv", delete=False).name
        extra = ["--autotune", "--autotune-log-file", log]
    cmd = launcher(args.ranks) + extra + [sys.executable, str(Path(__file__).resolve()), "--worker-model", model,
                                          "--steps", str(args.steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + str(Path(__file__).resolve().parent) + os.pathsep + \
        env.get("PYTHONPATH", "")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("STEP_ENDS ")), None)
    if proc.returncode != 0 or line is None:
        sys.exit(f"run failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = {"model": model, "mode": "autotune" if autotune else "default",
                           "ends": json.loads(line.split(" ", 1)[1])}
    if log is not None:
        rows = list(csv.DictReader(open(log)))
        os.unlink(log)
        out["samples"] = len(rows) - 1
        best = rows[-1] if rows and rows[-1]["kind"] == "best" else None
        out["kept"] = None if best is None else {k: best[k] for k in (
            "fusion_threshold_mb", "cycle_time_ms", "response_cache", "hierarchical_allreduce")}
        # Steps per sample (10) times the samples, plus the step the first one waited for.
        out["tuned_after_step"] = None if best is None else sum(int(r["steps"]) for r in rows[:-1]) + 1
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mlp")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="300 steps, one round: checks that it runs")
    p.add_argument("--timeout", type=float, default=1800)
    add_results_options(p, "bench_autotune")
    p.add_argument("--worker-model", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_model:
        worker(args)
        return 0
    if args.quick:
        args.steps, args.rounds = 300, 1
    run_file = ResultsRun("bench_autotune")
    raw = []
    table = []
    for model in args.models.split(","):
        run_ratios, tuned_ratios, kept, tuned_after = [], [], [], []
        for rnd in range(args.rounds):
            d = run(model, False, args)
            a = run(model, True, args)
            for r in (d, a):
                line = {"round": rnd, **{k: v for k, v in r.items() if k != "ends"}, "seconds": r["ends"][-1]}
                print(json.dumps(line), flush=True)
                raw.append(line)
            run_ratios.append(a["ends"][-1] / d["ends"][-1])
            start = a.get("tuned_after_step")
            if start is not None and start + 20 < args.steps - 50:
                first = start + 20
                tuned_ratios.append((d["ends"][-1] - d["ends"][first]) / (a["ends"][-1] - a["ends"][first]))
                tuned_after.append(start)
            kept.append(a.get("kept"))
        table.append({
            "model": model, "ranks": args.ranks, "steps": args.steps, "rounds": args.rounds,
            "run_ratio": statistics.median(run_ratios), "run_ratios": run_ratios,
            "tuned_ratio": statistics.median(tuned_ratios) if tuned_ratios else None,
            "tuned_ratios": tuned_ratios, "tuned_after_step": tuned_after, "kept": kept,
        })
    print()
    print(f"{'model':8} {'run ratio (autotune/default)':>30} {'tuned ratio (default/autotune)':>32}  kept")
    for row in table:
        tuned = "-" if row["tuned_ratio"] is None else f"{row['tuned_ratio']:.3f}"
        print(f"{row['model']:8} {row['run_ratio']:>30.3f} {tuned:>32}  {row['kept']}")
    print(json.dumps({"summary": table}))
    run_file.write(results_path(args, "bench_autotune", args.quick), raw, table,
                   {k: v for k, v in vars(args).items() if k != "worker_model"}, args.notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
