"""Ending a lost worker's process, on the request of an elastic job's rank 0.

When the workers of an elastic job count one of them failed because it stopped
answering (its process stopped by SIGSTOP, a debugger or a swap storm), that process
may still exist. Were it to run again, its own failure detector would count the others
failed a timeout later, and Open MPI's reliable broadcast would tell them so: the
workers that went on would stop. So the new rank 0 writes one line per lost worker on
its stdout (``[hvdlite-run request] evict rank=R host=H pid=P start=S``, see
:func:`hvdlite.common.membership._request_eviction`), ``hvdlite-run`` keeps that line
from the screen (:class:`hvdlite.runner.output.LineMux`) and ends the process here:

* on this machine, with SIGKILL;
* on another host, through the agent that Open MPI starts its daemons with
  (``PRTE_MCA_plm_ssh_agent``, ``OMPI_MCA_plm_rsh_agent``, else ``ssh``), within 30 s.

Only a process with that pid *and* that start time is killed, so a process that is
gone, or a new one that was given its pid, is left alone. A host that cannot be reached
(cut off from the network) cannot be helped: the worker there stops by itself when it
finds it is not the majority, or ends itself on resuming (the core's suspension watch).

This module is pure Python and imports nothing of hvdlite's compiled core.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import threading
from collections.abc import Callable, Mapping

from hvdlite.common.discovery import parse_host_slots
from hvdlite.runner.hosts import is_local_host
from hvdlite.runner.processes import kill_processes, process_tree

__all__ = ["Evictor", "Requests", "parse_request", "remote_command"]

_REQUEST = re.compile(r"evict rank=(\d+) host=(\S+) pid=(\d+) start=(\d+)")
_TIMEOUT_S = 30.0


def parse_request(text: str) -> tuple[int, str, int, str] | None:
    """``(rank, host, pid, start)`` from a request's text (after the prefix), or None."""
    match = _REQUEST.fullmatch(text.strip())
    if match is None:
        return None
    return int(match.group(1)), match.group(2), int(match.group(3)), match.group(4)


def remote_command(pid: int, start: str) -> str:
    """A shell command that kills ``pid`` if it is still the process started at
    ``start`` and prints ``killed`` if it did."""
    return (f"p={pid}; s={shlex.quote(start)}; "
            "[ -r /proc/$p/stat ] && [ \"$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f20)\" = \"$s\" ] "
            "&& kill -KILL $p && echo killed")


def _agent(environ: Mapping[str, str]) -> list[str]:
    for name in ("PRTE_MCA_plm_ssh_agent", "PRTE_MCA_plm_rsh_agent", "OMPI_MCA_plm_rsh_agent"):
        value = environ.get(name, "").strip()
        if value:
            return shlex.split(value)
    return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]


class Evictor:
    """Acts on eviction requests, each in a thread of its own; ``say`` prints one line
    for each process it ended."""

    def __init__(self, environ: Mapping[str, str], say: Callable[[str], None]) -> None:
        self._agent = _agent(environ)
        self._say = say
        self._lock = threading.Lock()
        self._agents: list[subprocess.Popen] = []  # the agents still running
        self._closed = False

    def request(self, text: str) -> None:
        parsed = parse_request(text)
        if parsed is None:
            self._say(f"ignored a request it does not know: {text.strip()!r}")
            return
        threading.Thread(target=self._evict, args=parsed, name="hvdlite-run evict", daemon=True).start()

    def close(self) -> None:
        """The job has ended: stop the agents still trying to reach a host."""
        with self._lock:
            self._closed = True
            agents, self._agents = self._agents, []
        for proc in agents:
            try:
                proc.kill()
            except OSError:
                pass

    def _evict(self, rank: int, host: str, pid: int, start: str) -> None:
        if is_local_host(host):
            killed = self._kill_here(pid, start)
        else:
            killed = self._kill_there(host, pid, start)
        if killed:
            self._say(f"ended the process of rank {rank} on {host} (pid {pid}), which rank 0 counted lost")

    @staticmethod
    def _kill_here(pid: int, start: str) -> bool:
        noted = {pid: int(start)}
        if not process_tree(pid, only=noted):
            return False  # gone, or its pid is another process's now
        kill_processes(noted)
        return True

    def _kill_there(self, host: str, pid: int, start: str) -> bool:
        with self._lock:
            if self._closed:
                return False
            try:
                proc = subprocess.Popen([*self._agent, host, remote_command(pid, start)], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            except OSError:
                return False
            self._agents.append(proc)
        try:
            out, _ = proc.communicate(timeout=_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()  # the host cannot be reached: see the module's docstring
            proc.communicate()
            out = ""
        with self._lock:
            if proc in self._agents:
                self._agents.remove(proc)
        return "killed" in out


_RELAUNCH = re.compile(r"relaunch hosts=(\S+)")
# The host named in Open MPI's messages about a daemon it lost: "Remote daemon: [NAME]
# on node HOST" (PRRTE lost its connection), "Remote host: HOST" (the process that
# started the daemon there ended, as when the host's processes are killed).
_LOST_DAEMON = re.compile(r"\s*Remote (?:daemon:.*\bon node|host:)\s+(\S+)\s*")
_LOST_DAEMON_HEADERS = ("lost communication with a remote daemon", "A daemon failed to report back")


class Requests:
    """What rank 0 asks of ``hvdlite-run`` in its output: ``evict ...`` (above);
    ``finished`` when the training of an elastic job ended well, which reaches the
    launcher from any host (a note in a file could only from this one); and
    ``relaunch hosts=H1:S1,H2:S2`` when a host joined the discovery output: every
    worker then leaves, and the launcher starts the job again on those hosts
    (:attr:`relaunch`).

    Also what ``mpirun`` itself says (:meth:`runtime_line`): the hosts whose daemon it
    lost (:attr:`lost_hosts`), which end the job."""

    def __init__(self, environ: Mapping[str, str], say: Callable[[str], None]) -> None:
        self.evictor = Evictor(environ, say)
        self.finished = False
        self.relaunch: list[tuple[str, int]] | None = None
        self.lost_hosts: list[str] = []
        self._daemon_lost = False
        self.stopped = False  # the launcher stopped the job (a signal it received)
        self._say = say

    def handle(self, text: str) -> None:
        relaunch = _RELAUNCH.fullmatch(text.strip())
        if text.strip() == "finished":
            self.finished = True
        elif relaunch is not None:
            try:
                self.relaunch = parse_host_slots(relaunch.group(1))
            except ValueError as exc:
                self._say(f"ignored a request to start the job again: {exc}")
        else:
            self.evictor.request(text)

    def runtime_line(self, text: str) -> None:
        """A line of output that may be one of mpirun's messages about its daemons."""
        if any(h in text for h in _LOST_DAEMON_HEADERS):
            self._daemon_lost = True
            return
        lost = _LOST_DAEMON.fullmatch(text) if self._daemon_lost else None
        if lost is not None:
            self._daemon_lost = False
            if lost.group(1) not in self.lost_hosts:
                self.lost_hosts.append(lost.group(1))

    def close(self) -> None:
        self.evictor.close()
