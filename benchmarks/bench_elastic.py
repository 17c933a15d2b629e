"""Elastic training: how long the survivors stand still when a worker dies or joins.

Each scenario is one ``hvdlite-run -np N --min-np 2 --max-np 4`` job of the elastic
tests' Horovod-style PyTorch script (``tests/elastic/workers/torch_elastic_train.py``:
an MLP, ``ElasticSampler``, ``TorchState`` committed every 2 steps), run side by side
with the same job without any failure:

* ``steady``: 4 workers, nobody dies (the baseline step time);
* ``kill rank 0`` / ``kill rank 2``: that worker of 4 SIGKILLs itself at step 20;
* ``join``: 2 workers; at step 10 the discovery script offers a 3rd slot;
* ``replace``: 4 workers; every 20 steps the one then of rank k % 4 dies and a new
  worker takes its slot, ``--chain`` times.

For each it prints the median step (time between two completed steps on a
survivor), the longest gap between two completed steps (the goal: at most 5 s), and
that gap less a median step: the time lost to the change. One JSON line per
scenario, then a table.

    python benchmarks/bench_elastic.py [--rounds 1] [--chain 5] [--json-out F] [--results PATH]

The results file (``benchmarks/_common.py``: command, machine, date, commit, every
scenario of every round, and per scenario the median over rounds) goes to
``benchmarks/results/bench_elastic.json`` by default.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ResultsRun, add_results_options, results_path  # noqa: E402  (sibling module)

SCRIPT = REPO / "tests" / "elastic" / "workers" / "torch_elastic_train.py"


def run(name: str, n: int, launcher: list[str], env_extra: dict[str, str], args: list[str],
        workdir: Path) -> dict:
    out = workdir / name.replace(" ", "_")
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HVDLITE_LOG_LEVEL="error",
               **{k: v.replace("{out}", str(out)) for k, v in env_extra.items()})
    cmd = [sys.executable, "-m", "hvdlite.runner", "-np", str(n), *launcher, sys.executable, str(SCRIPT),
           "--out", str(out), *args]
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    wall = time.time() - t0
    results = [json.loads(p.read_text()) for p in out.glob("*.json")]
    if proc.returncode != 0 or not results:
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    # The survivor that was there from the start and saw every change.
    first = min(results, key=lambda r: (r["joined"], r["first_rank"]))
    done = first["completed"]
    gaps = [b - a for a, b in zip(done, done[1:])]
    median = statistics.median(gaps)
    longest = max(gaps)
    return {"scenario": name, "workers_end": first["size"], "resets": len(first["resets"]),
            "same_params": len({r["params_sha"] for r in results}) == 1,
            "median_step_s": round(median, 4), "longest_gap_s": round(longest, 3),
            "lost_s": round(longest - median, 3), "wall_s": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--chain", type=int, default=5, help="kills in the 'replace' scenario")
    ap.add_argument("--json-out")
    add_results_options(ap, "bench_elastic")
    a = ap.parse_args()
    run_file = ResultsRun("bench_elastic")
    elastic = ["--min-np", "2", "--max-np", "4"]
    rows = []
    for _ in range(a.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            hosts2 = work / "hosts2.txt"
            hosts2.write_text("localhost:2\n")
            hosts4 = work / "hosts4.txt"
            hosts4.write_text("localhost:4\n")
            scripts = {}
            for key, hosts in (("2", hosts2), ("4", hosts4)):
                s = work / f"discover{key}.sh"
                s.write_text(f"#!/bin/sh\ncat {hosts}\n")
                s.chmod(0o755)
                scripts[key] = s
            scenarios = [
                ("steady", 4, elastic, {}, []),
                ("kill rank 0", 4, elastic, {"HVDLITE_TEST_KILL": "0:20"}, []),
                ("kill rank 2", 4, elastic, {"HVDLITE_TEST_KILL": "2:20"}, []),
                ("join", 2, ["--min-np", "2", "--max-np", "3", "--host-discovery-script", str(scripts["2"])],
                 {"HVDLITE_TEST_OFFER": f"10:{hosts2}:localhost:3"}, ["--epochs", "6", "--step-sleep", "0.03"]),
                (f"replace x{a.chain}", 4, elastic + ["--blacklist-cooldown-range", "0", "0",
                                                      "--host-discovery-script", str(scripts["4"])],
                 {"HVDLITE_TEST_CHAIN": f"{a.chain}:20"}, ["--epochs", str(max(3, a.chain * 20 // 15 + 2))]),
            ]
            for name, n, launcher, env_extra, args in scenarios:
                row = run(name, n, launcher, env_extra, args, work)
                print(json.dumps(row), flush=True)
                rows.append(row)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows, indent=1))
    summary = []
    for name in dict.fromkeys(r["scenario"] for r in rows):
        rs = [r for r in rows if r["scenario"] == name]
        summary.append({"scenario": name, "rounds": len(rs), "workers_end": rs[0]["workers_end"],
                        "resets": statistics.median(r["resets"] for r in rs),
                        "same_params": all(r["same_params"] for r in rs),
                        **{k: statistics.median(r[k] for r in rs) for k in ("median_step_s", "longest_gap_s", "lost_s")},
                        "longest_gap_s_range": [min(r["longest_gap_s"] for r in rs), max(r["longest_gap_s"] for r in rs)]})
    run_file.write(results_path(a, "bench_elastic"), rows, summary, vars(a), a.notes)
    print(f"\n{'scenario':<14} {'workers':>7} {'resets':>6} {'same':>5} {'step ms':>8} "
          f"{'longest gap s':>14} {'lost s':>7}")
    for r in rows:
        print(f"{r['scenario']:<14} {r['workers_end']:>7} {r['resets']:>6} {str(r['same_params']):>5} "
              f"{r['median_step_s'] * 1000:>8.1f} {r['longest_gap_s']:>14.3f} {r['lost_s']:>7.3f}")


if __name__ == "__main__":
    main()
