"""Start a script on N ranks through the real launcher, as a user would."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_ranks(n: int, script: str, *args: str, env: dict[str, str] | None = None,
              timeout: float = 180) -> subprocess.CompletedProcess:
    """Run tests/core/<script> with `hvdlite-run -np n`; returns the finished process."""
    full_env = dict(os.environ)
    full_env.setdefault("HVDLITE_LOG_LEVEL", "warning")
    if env:
        full_env.update(env)
    cmd = [sys.executable, "-m", "hvdlite.runner", "-np", str(n),
           sys.executable, str(HERE / script), *args]
    # Own process group, so a timeout kills mpirun's ranks too, not just the launcher.
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"job timed out after {timeout}s:\n{(out + err)[-6000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def assert_all_ranks_passed(proc: subprocess.CompletedProcess, n: int) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"job failed ({proc.returncode}):\n{out[-6000:]}"
    for r in range(n):
        assert f"ALL CHECKS PASSED rank {r}" in proc.stdout, f"rank {r} did not finish:\n{out[-6000:]}"
