"""Launching a check worker (tf_worker.py, tf_graph_worker.py) on N ranks and reading its
verdicts: shared by test_tf_adapter.py and test_tf_graph_ops.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.launch import run_job


def launch(n: int, worker: Path, out_dir: Path, timeout: float, env: dict | None = None) -> dict:
    """Run `worker` on `n` ranks; each rank's verdicts (None where it wrote none) and the
    job's output."""
    try:
        proc = run_job(n, worker, str(out_dir), env=env, timeout=timeout)
        output = f"exit status {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    except AssertionError as e:  # timed out; the job was killed
        output = str(e)
    results = {}
    for r in range(n):
        f = out_dir / f"rank{r}.json"
        results[r] = json.loads(f.read_text()) if f.exists() else None
    return {"n": n, "results": results, "output": output}


def assert_ran_exactly(run: dict, checks: list[str]) -> None:
    """Every rank ran exactly `checks`."""
    for r, res in run["results"].items():
        assert res is not None, f"rank {r} of {run['n']} wrote no results:\n{run['output']}"
        assert sorted(res) == sorted(checks), f"rank {r}: checks differ from the list here:\n{run['output']}"


def assert_passed(run: dict, check: str) -> None:
    """`check` passed on every rank."""
    failures = []
    for r, res in run["results"].items():
        if res is None:
            pytest.fail(f"rank {r} of {run['n']} wrote no results:\n{run['output']}")
        verdict = res.get(check, f"not run:\n{run['output']}")
        if verdict != "ok":
            failures.append(f"rank {r}: {verdict}")
    assert not failures, f"{check} on {run['n']} ranks:\n" + "\n".join(failures)
