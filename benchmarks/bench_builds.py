"""This build of hvdlite against another one, side by side on the same machine.

Compares the working tree (the *candidate*) with another checkout whose extension is
built in place (the *baseline*), for a change that must not cost speed::

    git worktree add /tmp/base <commit> && (cd /tmp/base && python setup.py build_ext --inplace)
    python benchmarks/bench_builds.py --baseline /tmp/base [--repeats 2] [--suites core,torch,tf,hosts]

Each suite runs one of the project's benchmarks, in each tree with that tree's own copy
of it (``PYTHONPATH`` and the working directory pick the tree), in the order baseline,
candidate, candidate, baseline, ... so that a drift of the machine's speed hits both
alike. From each run it takes hvdlite's own times, not its ratios to peers:

- ``core``: ``bench_core.py`` on 2 ranks: one allreduce of 4 KiB, 4 MiB and 64 MiB, and
  ResNet-50's 161 gradients, in microseconds per call;
- ``torch``: ``bench_torch_training.py``: a PyTorch training step (MLP and the small
  ResNet) with ``hvd.DistributedOptimizer`` on 2 ranks, in milliseconds;
- ``tf``: ``bench_tf_training.py``: the same in TensorFlow, with a custom loop and with
  ``model.fit``;
- ``hosts``: ``bench_hosts.py``: a 64 MiB allreduce on 2 emulated hosts of 2 ranks at
  1 Gbit/s, with hvdlite's default algorithm (needs root);
- ``gpu_host``: ``bench_gpu_host.py``: host microseconds of GPU collectives on the fake
  CUDA runtime (a lone 4 KiB allreduce, a small CNN's gradients per tensor and as one
  bucket). This suite runs this tree's copy of the script in both trees, so that a
  baseline older than the script can be measured too. Its two "as the optimizer sends
  it" figures compare what ``DistributedOptimizer`` submits in each build: a persistent
  request (a bucket) where the build has them, a new request per tensor where not:
  its gradients only (both builds' optimizers also send one has-grad allreduce in host
  memory per step).

It prints, for every figure, the median over repetitions in each tree and the ratio
candidate / baseline (above 1: the candidate is slower), with the spread of each tree's
repetitions (largest / smallest): a ratio within the spreads is noise. Writes the
results file (``benchmarks/_common.py``), by default ``benchmarks/results/bench_builds.json``.
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
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, ResultsRun, add_results_options, results_path  # noqa: E402
from bench_gpu_host import CNN, LONE  # noqa: E402  (sibling module: its workloads' labels)

# The figures each suite reports: (label, unit, how to find it in a results file).
Extract = Callable[[dict[str, Any]], dict[str, float]]


def _core(results: dict[str, Any]) -> dict[str, float]:
    wanted = {"latency_4KiB": "allreduce 4 KiB", "allreduce_4MiB": "allreduce 4 MiB",
              "allreduce_64MiB": "allreduce 64 MiB", "resnet50_161_tensors": "ResNet-50's 161 tensors"}
    return {wanted[r["name"]]: r["hvdlite_us"] for r in results["rows"] if r.get("name") in wanted}


def _training(results: dict[str, Any], keys: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for r in results["rows"]:
        if r.get("mode") != "hvdlite":
            continue
        label = " ".join(str(r[k]) for k in keys) + " step"
        out.setdefault(label, []).append(r["step_ms"])
    return {k: statistics.median(v) for k, v in out.items()}


# What DistributedOptimizer sends for a GPU gradient, by the rows a build has: a build
# without persistent requests and buckets submits a new request per tensor.
_AS_SENT = {
    "host 4 KiB GPU gradient as the optimizer sends it": LONE,
    "host small CNN step as the optimizer sends it": CNN,
}


def _gpu_host(results: dict[str, Any]) -> dict[str, float]:
    steps = {r["name"]: r["step_us"] for r in results["rows"]}
    out = {f"host {name}": us for name, us in steps.items()}
    for label, choices in _AS_SENT.items():
        out[label] = next(steps[c] for c in choices if c in steps)
    return out


def _hosts(results: dict[str, Any]) -> dict[str, float]:
    return {f"2x2 hosts allreduce {r['bytes'] // (1024 * 1024)} MiB": r["default_s"] * 1e3
            for r in results["rows"] if r.get("config") == "2x2@1gbit"}


SUITES: dict[str, tuple[list[str], str, Extract, bool]] = {
    # name: (command after the interpreter, unit, extract, run under hvdlite-run -np 2)
    "core": (["benchmarks/bench_core.py", "--no-sweep", "--no-steady"], "us", _core, True),
    "torch": (["benchmarks/bench_torch_training.py", "--rounds", "1", "--warmup", "2", "--steps", "8",
               "--windows", "3"], "ms", lambda r: _training(r, ("model",)), False),
    "tf": (["benchmarks/bench_tf_training.py", "--rounds", "1", "--modes", "single,hvdlite", "--warmup", "2",
            "--steps", "4", "--windows", "3"], "ms", lambda r: _training(r, ("model", "api")), False),
    "hosts": (["benchmarks/bench_hosts.py", "--configs", "2x2@1gbit", "--sizes", "64M", "--rounds", "3"], "ms",
              _hosts, False),
    "gpu_host": ([str(REPO / "benchmarks" / "bench_gpu_host.py"), "--iters", "1000", "--reps", "3"], "us",
                 _gpu_host, False),
}


def run_once(tree: Path, suite: str, out: Path, timeout: float) -> dict[str, float]:
    """One run of `suite` with `tree`'s hvdlite and benchmark scripts; its figures."""
    script, _, extract, launched = SUITES[suite]
    cmd = [sys.executable, *script, "--results", str(out)]
    if launched:
        cmd = [sys.executable, "-m", "hvdlite.runner", "-np", "2", *cmd]
    env = dict(os.environ, PYTHONPATH=str(tree), HVDLITE_LOG_LEVEL="error")
    proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{suite} in {tree} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    figures = extract(json.loads(out.read_text()))
    if not figures:
        raise RuntimeError(f"{suite} in {tree}: no figures in {out}")
    return figures


def spread(values: list[float]) -> float:
    return max(values) / min(values) if values and min(values) > 0 else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, help="another checkout of hvdlite, its extension built in place")
    p.add_argument("--repeats", type=int, default=2, help="runs of each suite in each tree (default 2)")
    p.add_argument("--suites", default="core,torch,tf,hosts", help=f"of {','.join(SUITES)}")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds for one run")
    add_results_options(p, "bench_builds")
    args = p.parse_args(argv)
    baseline = Path(args.baseline).resolve()
    if not any((baseline / "hvdlite").glob("_core*.so")):
        p.error(f"{baseline}/hvdlite has no built extension: run python setup.py build_ext --inplace there")
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    for s in suites:
        if s not in SUITES:
            p.error(f"unknown suite {s!r} (known: {', '.join(SUITES)})")
    run = ResultsRun("bench_builds")
    trees = {"baseline": baseline, "candidate": REPO}
    commits = {name: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                                    text=True).stdout.strip() for name, tree in trees.items()}
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for suite in suites:
            unit = SUITES[suite][1]
            seen: dict[str, dict[str, list[float]]] = {"baseline": {}, "candidate": {}}
            order = []
            for i in range(args.repeats):
                order += ["baseline", "candidate"] if i % 2 == 0 else ["candidate", "baseline"]
            for i, name in enumerate(order):
                t0 = time.time()
                figures = run_once(trees[name], suite, Path(tmp) / f"{suite}_{i}.json", args.timeout)
                print(f"{suite:6} run {i + 1}/{len(order)} {name:9} {time.time() - t0:6.0f} s  "
                      + ", ".join(f"{k} {v:.4g} {unit}" for k, v in figures.items()), flush=True)
                for k, v in figures.items():
                    seen[name].setdefault(k, []).append(v)
                    rows.append({"suite": suite, "tree": name, "figure": k, "value": v, "unit": unit, "run": i})
            for k in seen["candidate"]:
                b, c = seen["baseline"].get(k, []), seen["candidate"][k]
                if not b:
                    continue
                mb, mc = statistics.median(b), statistics.median(c)
                summary.append({"suite": suite, "figure": k, "unit": unit, "baseline": mb, "candidate": mc,
                                "ratio": mc / mb, "baseline_spread": spread(b), "candidate_spread": spread(c),
                                "repeats": len(c)})
    print()
    head = f"{'figure':34} {'baseline':>12} {'candidate':>12} {'cand/base':>10} {'spread b':>9} {'spread c':>9}"
    print(f"baseline {commits['baseline']} ({baseline}), candidate {commits['candidate']} (this tree)")
    print(head)
    print("-" * len(head))
    for s in summary:
        print(f"{s['figure']:34} {s['baseline']:10.4g}{s['unit']:>2} {s['candidate']:10.4g}{s['unit']:>2} "
              f"{s['ratio']:10.3f} {s['baseline_spread']:9.3f} {s['candidate_spread']:9.3f}")
    path = results_path(args, "bench_builds")
    if path:
        run.write(path, settings={**vars(args), "baseline_commit": commits["baseline"],
                                  "candidate_commit": commits["candidate"]}, rows=rows, summary=summary,
                  notes=args.notes)
        print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
