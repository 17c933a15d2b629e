"""An elastic job's last commit, kept in a file on every host it runs on.

Open MPI's ``mpirun`` ends the whole job when it loses a host's daemon (the host's
processes all died while its kernel lives on), and cannot add a host to a running job.
In both cases ``hvdlite-run`` starts the job again, and the new workers go on from the
last commit, which the processes of the old job no longer hold. So at every commit the
first rank on each host writes the commit (``State.snapshot()``, the commit count, the
resets so far and the blacklist) to ``$TMPDIR/hvdlite-commit-KEY-HOST.pickle``, where
``KEY`` names the launch (``HVDLITE_ELASTIC_KEEP``, set by ``hvdlite-run``).

The state is pickled at the commit, on the committing thread (what is written is the
commit, whatever training does next); the file is written by a thread of its own,
through a temporary file renamed into place, so a process killed while writing leaves
the previous commit whole. The file starts with a small header (commit count, resets,
blacklist) so that the hosts can compare what they hold without loading the state.

Cost: one ``pickle.dumps`` of the committed state per commit on one rank per host, and
the write to the local disk behind training.
"""
from __future__ import annotations

import glob
import os
import pickle
import tempfile
import threading
from typing import Any

from hvdlite.common.discovery import ENV_KEEP


def key() -> str | None:
    """The launch's key, or None where commits are not kept (not started by
    ``hvdlite-run`` reading the ranks' output)."""
    return os.environ.get(ENV_KEEP) or None


def path(host: str) -> str:
    """The file of ``host``'s kept commit."""
    return os.path.join(tempfile.gettempdir(), f"hvdlite-commit-{key()}-{host}.pickle")


def remove_all(job_key: str) -> None:
    """Remove every kept commit of the launch ``job_key`` in this machine's temporary
    folder, temporary files included."""
    pattern = os.path.join(tempfile.gettempdir(), f"hvdlite-commit-{job_key}-*")
    for name in glob.glob(pattern):
        try:
            os.unlink(name)
        except OSError:
            pass


class _Writer:
    """One thread that writes the newest commit handed to it; older ones not yet
    written are skipped."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: tuple[str, bytes, bytes] | None = None
        self._busy = False
        self._error: str | None = None
        self._thread: threading.Thread | None = None

    def put(self, target: str, header: bytes, body: bytes) -> None:
        with self._cond:
            self._pending = (target, header, body)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hvdlite kept commit", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def flush(self) -> str | None:
        """Wait until everything handed over is written; the last write's error, if any."""
        with self._cond:
            while self._pending is not None or self._busy:
                self._cond.wait()
            return self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None:
                    self._cond.wait()
                target, header, body = self._pending
                self._pending, self._busy = None, True
            error = _write(target, header, body)
            with self._cond:
                self._busy, self._error = False, error
                self._cond.notify_all()


def _write(target: str, header: bytes, body: bytes) -> str | None:
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(body)
        os.replace(tmp, target)
        return None
    except OSError as exc:  # a full disk, say: the previous commit stays in place
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return f"cannot keep the last commit in {target}: {exc}"


_writer = _Writer()


def keep(host: str, snapshot: Any, commits: int, resets: int, blacklist: dict[str, float]) -> None:
    """Hand the commit to the writer: ``snapshot`` (``State.snapshot()``), the commit
    count, the resets so far and the blacklist (seconds left per host)."""
    header = pickle.dumps({"commits": commits, "resets": resets, "blacklist": blacklist},
                          protocol=pickle.HIGHEST_PROTOCOL)
    body = pickle.dumps(snapshot, protocol=pickle.HIGHEST_PROTOCOL)
    _writer.put(path(host), header, body)


def flush() -> str | None:
    """Wait for the commit being written; its error, if the write failed."""
    return _writer.flush()


def read_header(host: str) -> dict[str, Any] | None:
    """What ``host``'s kept commit holds (commit count, resets, blacklist), or None
    when there is none."""
    try:
        with open(path(host), "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return None


def read_state(host: str) -> Any:
    """The state of ``host``'s kept commit (``State.snapshot()``'s value)."""
    with open(path(host), "rb") as f:
        pickle.load(f)
        return pickle.load(f)


def discard(host: str) -> None:
    """The job is over: wait for any write, then remove ``host``'s kept commit."""
    flush()
    try:
        os.unlink(path(host))
    except OSError:
        pass
