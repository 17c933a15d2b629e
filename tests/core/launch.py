"""Core test jobs: scripts in tests/core, launched through tests/launch.py."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tests.launch import run_job

HERE = Path(__file__).resolve().parent


def run_ranks(n: int, script: str, *args: str, env: dict[str, str] | None = None,
              timeout: float = 180) -> subprocess.CompletedProcess:
    """Run tests/core/<script> on ``n`` ranks; returns the finished job."""
    return run_job(n, HERE / script, *args, env=env, timeout=timeout)


def assert_all_ranks_passed(proc: subprocess.CompletedProcess, n: int) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"job failed ({proc.returncode}):\n{out[-6000:]}"
    for r in range(n):
        assert f"ALL CHECKS PASSED rank {r}" in proc.stdout, f"rank {r} did not finish:\n{out[-6000:]}"
