"""A model that does not fit: under a per-rank memory cap that replicated Adam exceeds,
ZeRO stage 3 trains it on 4 ranks to the loss of an uncapped reference
(``benchmarks/bench_zero_capped.py --quick``: each rank in a memory cgroup of its own), and
the performance page renders the benchmark's results file.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.harness import memory_cgroup_root
from tests.test_performance_page import _load

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


def _no_cgroups() -> str:
    """Why memory cgroups cannot be made here ('' when they can)."""
    try:
        root = memory_cgroup_root()
    except OSError as e:
        return f"{e}: the per-rank memory cap needs a memory cgroup controller"
    if os.geteuid() != 0:
        return "making memory cgroups needs root"
    probe = root / f"hvdlite-capped-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        return f"cannot make a memory cgroup under {root}: {e}"
    return ""


def test_stage3_trains_under_a_cap_that_kills_replicated_adam(tmp_path: Path) -> None:
    reason = _no_cgroups()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "capped.json"
    proc = subprocess.run([sys.executable, str(BENCH / "bench_zero_capped.py"), "--quick", "--json-out", str(out),
                           "--results", ""], capture_output=True, text=True, timeout=480, cwd=REPO)
    print(proc.stdout[-4000:])
    assert out.exists(), f"no results (status {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    res = json.loads(out.read_text())
    f, by = res["figures"], {s["job"]: s for s in res["summary"]}
    cap = f["cap_bytes"]
    # The cap lies between what stage 3 and replicated Adam need, measured without one.
    assert f["peak_stage3_uncapped_bytes"] < cap < f["peak_replicated_uncapped_bytes"], f
    # Replicated Adam under the cap: the kernel's OOM killer ended it.
    rep = by["replicated_capped"]
    assert not rep["finished"] and rep["oom_kills"] >= 1, rep
    assert rep["returncode"] != 0
    # Stage 3 under the same cap: every step, no OOM kill, the reference's loss.
    st3 = by["stage3_capped"]
    assert st3["finished"] and st3["oom_kills"] == 0, (st3, proc.stderr[-3000:])
    assert st3["largest_peak_bytes"] <= cap
    ref = by["reference"]["final_loss"]
    assert st3["final_loss"] == pytest.approx(ref, rel=1e-5, abs=0)
    assert by["stage3_uncapped"]["final_loss"] == pytest.approx(ref, rel=1e-5, abs=0)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The cgroups are gone.
    prefix = f["cgroup_names"].split("-JOB-")[0]
    assert not list(Path(f["cgroup_root"]).glob(prefix + "-*"))


def test_the_page_shows_who_was_killed_and_the_losses(tmp_path: Path) -> None:
    page, common = _load("make_performance_page"), _load("_common")
    MiB = 1 << 20
    summary = [
        {"job": "reference", "optimizer": "DistributedOptimizer(Adam)", "cap_bytes": None, "finished": True,
         "returncode": 0, "timed_out": False, "oom_kills": 0, "oom_killed_ranks": 0,
         "largest_peak_bytes": 1000 * MiB, "final_loss": 0.5, "loss_rel_diff": 0.0},
        {"job": "stage3_uncapped", "optimizer": "ZeroRedundancyOptimizer(Adam, stage=3)", "cap_bytes": None,
         "finished": True, "returncode": 0, "timed_out": False, "oom_kills": 0, "oom_killed_ranks": 0,
         "largest_peak_bytes": 600 * MiB, "final_loss": 0.5, "loss_rel_diff": 0.0},
        {"job": "replicated_capped", "optimizer": "DistributedOptimizer(Adam)", "cap_bytes": 800 * MiB,
         "finished": False, "returncode": 137, "timed_out": False, "oom_kills": 3, "oom_killed_ranks": 3,
         "largest_peak_bytes": 800 * MiB, "final_loss": None, "loss_rel_diff": None},
        {"job": "stage3_capped", "optimizer": "ZeroRedundancyOptimizer(Adam, stage=3)", "cap_bytes": 800 * MiB,
         "finished": True, "returncode": 0, "timed_out": False, "oom_kills": 0, "oom_killed_ranks": 0,
         "largest_peak_bytes": 600 * MiB, "final_loss": 0.5000001, "loss_rel_diff": 2e-7},
    ]
    figures = {"params": 50 * 2**20 // 4, "cap_bytes": 800 * MiB, "cap_file": "memory.limit_in_bytes (cgroup v1)",
               "baseline_bytes": 200 * MiB, "peak_replicated_uncapped_bytes": 1000 * MiB,
               "peak_stage3_uncapped_bytes": 600 * MiB, "held_replicated_bytes": 950 * MiB,
               "held_stage3_bytes": 300 * MiB}
    run = common.ResultsRun("bench_zero_capped")
    doc = run.document([], summary, {"ranks": 4, "width": 2048, "layers": 3, "steps": 20}, command="python "
                       "benchmarks/bench_zero_capped.py", extra={"figures": figures})
    doc["_file"] = "bench_zero_capped.json"
    lines = page.zero_capped_section(page.Context([doc], set()), [doc])
    assert ("| replicated, capped | `DistributedOptimizer(Adam)` | 800 MiB | **killed by the OOM killer (3 of 4 "
            "ranks)** | 800 MiB | – | – |") in lines
    assert ("| stage 3, capped | `ZeroRedundancyOptimizer(Adam, stage=3)` | 800 MiB | **trained 20 steps** | "
            "600 MiB | 0.500000 | 2.0e-07 |") in lines
    assert "| reference, no cap | `DistributedOptimizer(Adam)` | none | trained 20 steps | 1000 MiB | 0.500000 | 0.0e+00 |" in lines
    text = "\n".join(lines)
    assert "cap 800 MiB per rank (`memory.limit_in_bytes`)" in text
    # 13.1 M parameters; (1000 - 200) MiB / 13.1 M = 64 bytes each, (600 - 200) MiB: 32.
    assert "replicated Adam peaks at 64.0 bytes per parameter and stage 3 at **32.0**" in text
    assert "they hold 950 MiB and 300 MiB" in text
