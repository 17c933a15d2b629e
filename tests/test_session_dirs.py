"""Session folders of killed Open MPI processes: found, removed, and no longer a reason
for a job to fail at start."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdlite.runner.mpirun import find_mpirun
from hvdlite.runner.session_dirs import remove_stale_session_dirs, session_tmpdir
from tests.launch import job_env

REPO = Path(__file__).resolve().parents[1]


def _leave_session_dir(base: Path, name: str, pid: int) -> Path:
    """A session folder as a killed mpirun leaves it: its PMIx rendezvous files, named
    after this host."""
    folder = base / f"{name}.{pid}"
    folder.mkdir(exist_ok=True)
    host = socket.gethostname()
    for file in (f"pmix.{host}.tool", f"pmix.{host}.tool.{pid}", f"pmix.{host}.tool.prterun-{host}-{pid}@0"):
        (folder / file).write_text(f"tcp4://127.0.0.1:1\n5.0\n{pid}\n0:0\nthen\n")
    return folder


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_session_tmpdir_follows_prrte() -> None:
    assert session_tmpdir({}) == "/tmp"
    assert session_tmpdir({"TMP": "/a", "TMPDIR": "/b"}) == "/b"
    assert session_tmpdir({"TMPDIR": "/b", "PRTE_MCA_prte_tmpdir_base": "/c"}) == "/c"


def test_only_folders_of_gone_runtime_processes_are_removed(tmp_path: Path) -> None:
    dead = _dead_pid()
    gone = [_leave_session_dir(tmp_path, name, dead) for name in ("ompi", "prted")]
    # This pid is alive but no Open MPI process: a folder under it is stale as well.
    reused = _leave_session_dir(tmp_path, "ompi", os.getpid())
    # A live daemon (its process name is what counts) keeps its folder.
    daemon_exe = tmp_path / "prted"
    shutil.copy(shutil.which("sleep"), daemon_exe)
    daemon = subprocess.Popen([str(daemon_exe), "30"])
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{daemon.pid}/comm").read_text().strip() != "prted":
            assert time.monotonic() < deadline, "the stand-in daemon did not start"
            time.sleep(0.01)
        live = _leave_session_dir(tmp_path, "prted", daemon.pid)
        other_names = [tmp_path / "ompi.x1", tmp_path / "hvdlite-elastic-1", tmp_path / "ompi"]
        for folder in other_names:
            folder.mkdir()
        (tmp_path / f"prte.{dead}").write_text("a file, not a folder")
        removed = remove_stale_session_dirs({"TMPDIR": str(tmp_path)})
    finally:
        daemon.kill()
        daemon.wait()
    assert sorted(removed) == sorted(str(p) for p in [*gone, reused])
    assert all(not p.exists() for p in [*gone, reused])
    assert live.is_dir() and (live / "pmix.vm.tool").is_file()
    assert all(p.is_dir() for p in other_names)
    assert (tmp_path / f"prte.{dead}").is_file()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_another_users_folder_is_left_alone(tmp_path: Path) -> None:
    folder = _leave_session_dir(tmp_path, "ompi", _dead_pid())
    os.chown(folder, 65534, 65534)
    assert remove_stale_session_dirs({"TMPDIR": str(tmp_path)}) == []
    assert folder.is_dir()


def _leave_session_dirs_for_next_pids(base: Path, count: int) -> None:
    """Stale folders under the next ``count`` process ids the kernel will give (after
    the last one it gave, wrapping as it does), so that the next mpirun started gets
    one of them."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    pid = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    for _ in range(count):
        pid = pid + 1 if pid + 1 < pid_max else 300
        _leave_session_dir(base, "ompi", pid)


def test_a_killed_jobs_session_folder_does_not_stop_the_next_job(tmp_path: Path) -> None:
    """Open MPI 5.0's mpirun fails at start when its process id comes round to a killed
    mpirun's leftover folder; hvdlite-run removes such folders first and starts."""
    env = job_env({"TMPDIR": str(tmp_path)})
    mpirun = find_mpirun(env)
    _leave_session_dirs_for_next_pids(tmp_path, 1500)
    plain = subprocess.run([mpirun, "--allow-run-as-root", "-np", "1", "true"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert plain.returncode != 0, "mpirun started although every next pid had a stale folder"
    assert "listener thread failed to start" in plain.stdout + plain.stderr

    _leave_session_dirs_for_next_pids(tmp_path, 1500)
    script = "import hvdlite as hvd; hvd.init(); print('rank', hvd.rank(), 'of', hvd.size()); hvd.shutdown()"
    job = subprocess.run([sys.executable, "-m", "hvdlite.runner", "-np", "2", "--verbose",
                          sys.executable, "-c", script], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert sorted(line for line in job.stdout.splitlines() if line.startswith("rank")) == \
        ["rank 0 of 2", "rank 1 of 2"]
    assert "session folder(s) that killed Open MPI processes left in" in job.stderr
    assert not list(tmp_path.glob("ompi.*"))
