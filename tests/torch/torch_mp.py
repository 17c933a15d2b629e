"""Launching multi-rank PyTorch test workers through the real launcher.

Workers live in ``tests/torch/workers``. Each rank checks its own results against a
reference it computes independently (NumPy, or plain single-process PyTorch) and prints
``PASS <case> rank <r>``; the test asserts that every rank passed every case.
"""
from __future__ import annotations

from pathlib import Path

from tests.launch import run_ok

WORKERS = Path(__file__).resolve().parent / "workers"
DEFAULT_TIMEOUT = 180


def run_ranks(n: int, script: str | Path, *args: str, timeout: float = DEFAULT_TIMEOUT,
              env: dict[str, str] | None = None) -> str:
    """Run a worker (a name in ``workers/``, or a path) on ``n`` ranks; return its stdout,
    failing the test on error."""
    script = Path(script)
    if not script.is_absolute():
        script = WORKERS / script
    return run_ok(n, script, *args, timeout=timeout, env=env)


def assert_passed(output: str, n: int, cases: list[str]) -> None:
    """Every rank printed ``PASS <case> rank <r>`` for every case."""
    missing = [f"{c} rank {r}" for c in cases for r in range(n)
               if f"PASS {c} rank {r}" not in output]
    assert not missing, f"cases that did not pass: {missing}\noutput:\n{output[-4000:]}"
