"""Horovod's autotuner (``hvdlite-run --autotune``) through the real launcher: rank 0
searches the fusion threshold, the cycle time and the response cache while a loop of
collectives runs, logs one CSV line per sample, and ends keeping its best settings or
the defaults; every collective's result stays exact on every rank throughout
(``autotune_worker.py``)."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.launch import run_job

WORKER = Path(__file__).resolve().parent / "autotune_worker.py"


# (ranks, the search's budget, the samples it scores): on one host it tries the
# defaults, 4 more fusion thresholds, 4 more cycle times and the cache off (10 in all;
# the two-level allreduce needs several hosts); a smaller budget stops it early.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("n, budget, searched", [(2, 20, 10), (3, 6, 6)])
def test_autotune_searches_logs_and_keeps_results_exact(tmp_path: Path, n: int, budget: int,
                                                        searched: int) -> None:
    log = tmp_path / "autotune.csv"
    proc = run_job(n, WORKER, "90", timeout=240, launcher_args=[
        "--autotune", "--autotune-log-file", str(log), "--autotune-warmup-samples", "2",
        "--autotune-steps-per-sample", "3", "--autotune-bayes-opt-max-samples", str(budget)])
    detail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, detail
    assert sorted(proc.stdout.split("OK rank ")[1:]) == sorted(f"{r} steps 90\n" for r in range(n)), detail
    rows = list(csv.DictReader(log.open()))
    kinds = [row["kind"] for row in rows]
    # Two warm-up samples, the search, the final comparison (the best settings and the
    # defaults once more, unless the defaults were best), then the decision.
    assert kinds[:2] == ["warmup", "warmup"], kinds
    assert kinds.count("search") == searched, kinds
    assert kinds.count("confirm") in (0, 2), kinds
    assert kinds[-1] == "best" and kinds.count("best") == 1, kinds
    assert set(kinds[2:-1]) <= {"search", "confirm"}, kinds
    search = [row for row in rows if row["kind"] == "search"]
    fusion = {float(row["fusion_threshold_mb"]) for row in search}
    cycle = {float(row["cycle_time_ms"]) for row in search}
    assert fusion == {1.0, 4.0, 16.0, 64.0, 128.0}, fusion
    if searched == 10:
        assert len(cycle) == 5, cycle
        assert any(row["response_cache"] == "0" for row in search), "the cache was never switched off"
    for row in rows[:-1]:
        assert int(row["steps"]) == 3 and float(row["bytes_per_second"]) > 0, row
    # What it kept: the defaults or a searched setting that scored better than them.
    best = rows[-1]
    keep = (best["fusion_threshold_mb"], best["cycle_time_ms"], best["response_cache"])
    assert keep in {(r["fusion_threshold_mb"], r["cycle_time_ms"], r["response_cache"]) for r in search}


@pytest.mark.timeout(300)
def test_process_sets_take_up_the_tuned_settings(tmp_path: Path) -> None:
    """Ranks 1 and 2 of 3 form a process set that reduces its own gradients beside the
    global ones while rank 0 tunes: the set's results stay exact through every switch,
    and at the end its engine runs with the settings the global tuner kept, on both
    members (as in Horovod, where one set of tuned parameters serves every set)."""
    log = tmp_path / "autotune.csv"
    proc = run_job(3, WORKER, "60", "sets", timeout=240, env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"},
                   launcher_args=["--autotune", "--autotune-log-file", str(log), "--autotune-warmup-samples",
                                  "1", "--autotune-steps-per-sample", "3", "--autotune-bayes-opt-max-samples", "6"])
    detail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, detail
    assert sorted(line for line in proc.stdout.splitlines() if line.startswith("OK rank ")) == \
        [f"OK rank {r} steps 60" for r in range(3)], detail
    rows = list(csv.DictReader(log.open()))
    assert rows[-1]["kind"] == "best", rows
    best = rows[-1]
    kept = f"fusion_threshold_bytes={int(float(best['fusion_threshold_mb']) * 1024 * 1024)}"
    said = [line for line in proc.stdout.splitlines() if line.startswith("SET rank ")]
    assert len(said) == 2 and all(kept in line for line in said), (kept, said, detail)


@pytest.mark.timeout(120)
def test_gaussian_process_noise_is_refused_by_name(tmp_path: Path) -> None:
    proc = run_job(2, WORKER, "2", timeout=100,
                   launcher_args=["--autotune-gaussian-process-noise", "0.8"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE=0.8 is not honoured") == 1, proc.stderr
