"""Several features at once on 4 ranks: process sets (static and dynamic) beside global
collectives, Adasum against its formula, a timeline started and stopped at run time,
while ``--autotune`` searches and writes its log (parity_worker.py)."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.launch import run_job

WORKER = Path(__file__).resolve().parent / "parity_worker.py"


@pytest.mark.timeout(300)
def test_sets_adasum_timeline_and_autotune_together_on_four_ranks(tmp_path: Path) -> None:
    log, timeline = tmp_path / "autotune.csv", tmp_path / "timeline.json"
    proc = run_job(4, WORKER, str(timeline), "60", timeout=240,
                   env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"},
                   launcher_args=["--autotune", "--autotune-log-file", str(log), "--autotune-warmup-samples", "1",
                                  "--autotune-steps-per-sample", "2", "--autotune-bayes-opt-max-samples", "6"])
    detail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, detail
    assert sorted(proc.stdout.split("PARITY OK rank ")[1:]) == [f"{r}\n" for r in range(4)], detail
    kinds = [row["kind"] for row in csv.DictReader(log.open())]
    assert kinds[0] == "warmup" and kinds[-1] == "best" and "search" in kinds, kinds
