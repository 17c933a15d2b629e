"""Launching multi-rank PyTorch test workers through the real launcher.

Workers live in ``tests/torch/workers``. Each rank checks its own results against a
reference it computes independently (NumPy, or plain single-process PyTorch) and prints
``PASS <case> rank <r>``; the test asserts that every rank passed every case.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
DEFAULT_TIMEOUT = 180


def launcher(n: int) -> list[str]:
    """``python -m hvdlite.runner -np N`` when the launcher is importable, else ``mpirun``
    (the one beside this Python first) with the flags this machine needs."""
    if importlib.util.find_spec("hvdlite.runner.launch") is not None:
        return [sys.executable, "-m", "hvdlite.runner", "-np", str(n)]
    mpirun = Path(sys.executable).parent / "mpirun"
    path = str(mpirun) if mpirun.exists() else shutil.which("mpirun")
    if path is None:
        pytest.fail("mpirun not found next to sys.executable nor on PATH")
    return [path, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(n)]


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    if extra:
        env.update(extra)
    return env


def run_ranks(n: int, script: str | Path, *args: str, timeout: float = DEFAULT_TIMEOUT,
              env: dict[str, str] | None = None) -> str:
    """Run a worker on ``n`` ranks; return its stdout, failing the test on error."""
    script = Path(script)
    if not script.is_absolute():
        script = WORKERS / script
    cmd = launcher(n) + [sys.executable, str(script), *args]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=worker_env(env), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after {timeout} s: {' '.join(cmd)}\n"
                    f"stdout:\n{e.stdout}\nstderr:\n{e.stderr}")
    if proc.returncode != 0:
        pytest.fail(f"exit status {proc.returncode}: {' '.join(cmd)}\n"
                    f"stdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-6000:]}")
    return proc.stdout


def assert_passed(output: str, n: int, cases: list[str]) -> None:
    """Every rank printed ``PASS <case> rank <r>`` for every case."""
    missing = [f"{c} rank {r}" for c in cases for r in range(n)
               if f"PASS {c} rank {r}" not in output]
    assert not missing, f"cases that did not pass: {missing}\noutput:\n{output[-4000:]}"
