"""A TensorFlow collective that waits forever (no other rank submits it) can be ended
from the outside, through the real launcher on 2 ranks (``stuck_collective_cases.py``
run by pytest on each rank):

* pytest-timeout's ``thread`` method ends the job: the wait releases the GIL, so the
  timer thread dumps the stacks (the wait is in hvdlite's ``Request.wait``, in
  ``core.wait``) and exits.
* pytest-timeout's ``signal`` method (and a SIGINT, SIGALRM or any other signal with a
  Python handler) ends it too: a blocked caller waits in slices of 100 ms and runs
  Python's signal handlers between them, so the handler's exception comes out of the
  wait. A watchdog ends the job after ``WATCHDOG_S`` seconds if neither works.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.launch import run_job

CASES = Path(__file__).resolve().parent / "stuck_collective_cases.py"
WATCHDOG_S = 25  # stuck_collective_cases.py's
WATCHDOG_EXIT = 97

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("pytest_timeout") is None,
    reason="needs tensorflow and pytest-timeout (pip install hvdlite[test,tensorflow])")


def run_stuck(method: str) -> str:
    proc = run_job(2, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(CASES),
                   "--timeout", "5", f"--timeout-method={method}", timeout=WATCHDOG_S + 120)
    assert proc.returncode != 0, f"a collective nobody matched completed:\n{proc.stdout[-3000:]}"
    return proc.stdout + proc.stderr


@pytest.mark.timeout(WATCHDOG_S + 180)
def test_thread_timeout_ends_a_stuck_collective() -> None:
    out = run_stuck("thread")
    assert "Timeout" in out and "core.wait(" in out, out[-4000:]  # stacks: hvdlite's wait
    assert f"Exit code:    {WATCHDOG_EXIT}" not in out, f"the watchdog ended it:\n{out[-4000:]}"


@pytest.mark.timeout(WATCHDOG_S + 180)
def test_signal_timeout_ends_a_stuck_collective() -> None:
    out = run_stuck("signal")
    assert f"Exit code:    {WATCHDOG_EXIT}" not in out, f"the watchdog ended it:\n{out[-4000:]}"
    assert "Timeout" in out, out[-4000:]
