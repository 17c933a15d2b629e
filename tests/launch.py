"""Start a script on N ranks through the real launcher, as a user would.

Every multi-rank test goes through here: ``python -m hvdlite.runner -np N python
SCRIPT``, from the repository root, with this checkout on ``PYTHONPATH`` and one
compute thread per rank. The job runs in its own process group, so a timeout kills
mpirun's ranks too, not just the launcher.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]


def job_env(extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """The environment a rank sees: the caller's, plus this checkout and quiet logs;
    ``extra`` adds variables, and removes those it gives as None."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("HVDLITE_LOG_LEVEL", "warning")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for name, value in (extra or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def kill_tree(pid: int) -> None:
    """SIGKILL a job's launcher and every process below it. Its process group is not
    enough: mpirun starts the ranks in process groups of their own, and ranks left
    behind by a killed launcher would keep running (and waiting) forever."""
    for p in reversed(_tree(pid)):
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _tree(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children = _children()
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def stacks_of_tree(pid: int, frames: int = 14) -> str:
    """The native stack of every thread of every process of a job, as gdb prints it,
    so that a job which timed out says where it was stuck. Empty without gdb."""
    return stacks_of(_tree(pid), frames)


def stacks_of(pids: Iterable[int], frames: int = 14) -> str:
    """The native stack of every thread of each process ``pids``, as gdb prints it."""
    if shutil.which("gdb") is None:
        return "(gdb is not installed: no stacks)"
    parts = []
    for p in pids:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                name = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
            bt = subprocess.run(["gdb", "-p", str(p), "-batch", "-ex", f"thread apply all bt {frames}"],
                                capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = [ln for ln in bt.splitlines() if ln.startswith(("#", "Thread"))]
        parts.append(f"--- pid {p}: {name}\n" + "\n".join(lines))
    return "\n".join(parts)


def run_job(n: int, script: str | Path, *args: str, env: dict[str, str | None] | None = None,
            timeout: float = 180, cwd: str | Path = REPO,
            launcher_args: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Run ``script`` on ``n`` ranks with ``hvdlite-run`` (given ``launcher_args`` too, such
    as ``-H h1:2,h2:2``); returns the finished job.

    Raises AssertionError with the job's output if it does not finish in ``timeout``
    seconds."""
    cmd = [sys.executable, "-m", "hvdlite.runner", "-np", str(n), *launcher_args,
           sys.executable, str(script), *args]
    proc = subprocess.Popen(cmd, cwd=cwd, env=job_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = stacks_of_tree(proc.pid)
        kill_tree(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(f"job timed out after {timeout} s: {' '.join(cmd)}\n"
                             f"stdout:\n{out[-6000:]}\nstderr:\n{err[-6000:]}\n"
                             f"where each process was:\n{stacks}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_ok(n: int, script: str | Path, *args: str, **kw) -> str:
    """:func:`run_job`, failing unless the job exits 0; returns its stdout."""
    proc = run_job(n, script, *args, **kw)
    assert proc.returncode == 0, (f"exit status {proc.returncode}: {' '.join(proc.args)}\n"
                                  f"stdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-6000:]}")
    return proc.stdout
