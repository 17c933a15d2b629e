"""Open MPI session folders left behind by killed jobs, found and removed.

Open MPI 5's ``mpirun`` and its daemons (``prted``) each keep their PMIx rendezvous
files in a folder named after their process id, ``$TMPDIR/ompi.PID`` and
``$TMPDIR/prted.PID``, and remove it when they end. One killed with SIGKILL (a job
killed by a scheduler, a timeout, a second Ctrl-C, a host's processes lost) leaves its
folder behind. The PMIx bundled with Open MPI 5.0 will not start a server whose
rendezvous file already exists, so once the process id comes round again (``pid_max``
is 32768 on many Linux systems) the mpirun or daemon that gets it fails at start with
"The PMIx server's listener thread failed to start" (exit status 213).

The launcher calls :func:`remove_stale_session_dirs` before each start of mpirun: a
folder counts as stale when it belongs to this user and no process of Open MPI's runtime
runs under its process id. Only this machine's folders are seen; a daemon killed on
another host leaves its folder there.
"""
from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping

__all__ = ["remove_stale_session_dirs", "session_tmpdir"]

#: Folder names Open MPI 5's runtime gives its processes' session folders.
_SESSION_DIR = re.compile(r"(?:ompi|prte|prterun|prted)\.(\d+)")
#: Process names of Open MPI 5's runtime (``/proc/PID/comm``).
_RUNTIME = {"mpirun", "mpiexec", "prterun", "prted", "prte", "orterun"}


def session_tmpdir(env: Mapping[str, str]) -> str:
    """The folder the runtime makes its session folders in, as PRRTE chooses it: its
    ``prte_tmpdir_base`` setting, else ``TMPDIR``, ``TEMP`` or ``TMP``, else ``/tmp``."""
    for name in ("PRTE_MCA_prte_tmpdir_base", "TMPDIR", "TEMP", "TMP"):
        if env.get(name):
            return env[name]
    return "/tmp"


def _runtime_process(pid: int) -> bool:
    """Whether a process of Open MPI's runtime runs under ``pid`` now."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() in _RUNTIME
    except OSError:
        # No such process; or no /proc to tell, and then nothing is removed.
        return not os.path.isdir("/proc")


def remove_stale_session_dirs(env: Mapping[str, str]) -> list[str]:
    """Remove this user's session folders whose process has gone; returns their paths."""
    base = session_tmpdir(env)
    try:
        entries = list(os.scandir(base))
    except OSError:
        return []
    removed = []
    uid = os.getuid()
    for entry in entries:
        match = _SESSION_DIR.fullmatch(entry.name)
        if match is None:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        if _runtime_process(int(match.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.exists(entry.path):
            removed.append(entry.path)
    return removed
