"""Faults as clusters have them, injected into a job on emulated hosts.

A :class:`FaultJob` runs ``hvdlite-run`` on :class:`~tests.hosts.emulated.EmulatedHosts`
(network namespaces on one bridge, one hostname each), reads the ranks' output as it
comes, and injects, on the host it is told:

* ``cut`` / ``mend``: the host's link goes silent (taken off the bridge: its packets go
  nowhere and nothing answers, as when a switch port or cable fails, with no TCP reset)
  and comes back;
* ``freeze`` / ``thaw``: SIGSTOP / SIGCONT to the host's ranks (a process that hangs);
* ``kill_host``: SIGKILL to every process on the host (the host dies);
* ``oom``: the host's ranks put under a memory limit (a cgroup) and made to leak, for
  the kernel's OOM killer to end them (workers started with ``HVDLITE_TEST_BALLOON``);
* ``signal_launcher``: a signal to ``hvdlite-run`` itself (a scheduler's SIGTERM, Ctrl-C).

Workers print ``STEP <n> <time> <rank> <host>`` lines (``workers/``); the job keeps them
as :attr:`FaultJob.steps` and every line as :attr:`FaultJob.lines`. After the job,
:meth:`FaultJob.leftovers` lists the processes of the job still alive anywhere: on any
host, and the launcher's own children on this machine.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.hosts.emulated import EmulatedHosts
from tests.launch import _children, job_env, kill_tree

WORKERS = Path(__file__).parent / "workers"


@dataclass
class Step:
    t: float
    step: int
    rank: int
    host: str


@dataclass
class FaultJob:
    hosts: EmulatedHosts
    np: int
    script: Path
    args: list[str] = field(default_factory=list)
    launcher_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self.steps: list[Step] = []
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.ended: float | None = None
        self._seen: set[int] = set()  # every process ever below the launcher
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        self._cgroups: list[Path] = []

    # ---------------------------------------------------------------- running
    def start(self) -> "FaultJob":
        cmd = [sys.executable, "-m", "hvdlite.runner", "-np", str(self.np), *self.launcher_args,
               sys.executable, str(self.script), *self.args]
        env = job_env({**self.hosts.env(), **self.env})
        self.started = time.time()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True, cwd=Path(__file__).resolve().parents[2])
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.time()
            line = line.rstrip("\n")
            with self._cond:
                self.lines.append((now, line))
                if line.startswith("STEP "):
                    parts = line.split()
                    try:
                        self.steps.append(Step(float(parts[2]), int(parts[1]), int(parts[3]), parts[4]))
                    except (IndexError, ValueError):
                        pass
                self._cond.notify_all()

    def _watch(self) -> None:
        """Remember every process below the launcher while it runs (prterun and what
        it starts here), to find those left behind after it exits."""
        assert self.proc is not None
        while self.proc.poll() is None:
            children = _children()
            todo = [self.proc.pid]
            while todo:
                p = todo.pop()
                self._seen.add(p)
                todo.extend(children.get(p, []))
            time.sleep(0.2)

    def wait_for(self, predicate, timeout: float) -> bool:
        """Wait until ``predicate(job)`` holds (checked at every output line)."""
        deadline = time.time() + timeout
        with self._cond:
            while not predicate(self):
                left = deadline - time.time()
                if left <= 0 or (self.proc is not None and self.proc.poll() is not None and not predicate(self)
                                 and self._reader is not None and not self._reader.is_alive()):
                    return predicate(self)
                self._cond.wait(min(left, 0.2))
        return True

    def wait_for_step(self, step: int, timeout: float = 120) -> bool:
        return self.wait_for(lambda j: any(s.step >= step for s in j.steps), timeout)

    def wait(self, timeout: float) -> int | None:
        """The launcher's exit status, or None if it still runs after ``timeout`` s."""
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        if self.ended is None:
            self.ended = time.time()
        if self._reader is not None:
            self._reader.join(timeout=10)
        return rc

    def stop(self) -> None:
        """End whatever is left of the job, on every host."""
        if self.proc is not None and self.proc.poll() is None:
            kill_tree(self.proc.pid)
            self.proc.wait()
        for pid in self._seen:
            _kill(pid)
        for host in self.hosts.hosts:
            for pid in self.host_pids(host):
                _kill(pid)
        for group in self._cgroups:
            for _ in range(50):  # empty once the kernel has reaped its processes
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)

    def output(self, last: int = 200) -> str:
        with self._cond:
            return "\n".join(line for _, line in self.lines[-last:])

    # ---------------------------------------------------------------- faults
    def host_pids(self, host: str) -> list[int]:
        """Every process in ``host``'s network namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.hosts.namespaces[host]], capture_output=True,
                             text=True).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    def rank_pids(self, host: str) -> list[int]:
        """The ranks (processes running the worker script) on ``host``."""
        pids = []
        for pid in self.host_pids(host):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(self.script.name.encode()) for a in argv) and b"-c" not in argv[:2]:
                pids.append(pid)
        return pids

    def freeze(self, host: str) -> list[int]:
        pids = self.rank_pids(host)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    def thaw(self, host: str) -> None:
        for pid in self.rank_pids(host):
            os.kill(pid, signal.SIGCONT)

    def cut(self, host: str) -> None:
        # Off the bridge, and down on this side too: otherwise this machine's own
        # network stack would still take the host's packets to the bridge's address
        # (where mpirun listens) from the loose end, and only the other way would be cut.
        subprocess.run(["ip", "link", "set", self._veth(host), "nomaster"], check=True)
        subprocess.run(["ip", "link", "set", self._veth(host), "down"], check=True)
        if self.hosts.cuts is not None:
            (self.hosts.cuts / host).touch()  # mpirun no longer hears of that host's daemon

    def mend(self, host: str) -> None:
        if self.hosts.cuts is not None:
            (self.hosts.cuts / host).unlink(missing_ok=True)
        subprocess.run(["ip", "link", "set", self._veth(host), "up"], check=True)
        subprocess.run(["ip", "link", "set", self._veth(host), "master", self.hosts.bridge], check=True)
        # Addresses the host failed to resolve while cut off would stay failed a while.
        for ns in self.hosts.namespaces.values():
            subprocess.run(["ip", "-n", ns, "neigh", "flush", "all"], check=False)
        subprocess.run(["ip", "neigh", "flush", "dev", self.hosts.bridge], check=False)
        time.sleep(1.0)  # the link's carrier comes back

    def oom(self, host: str, balloon: str, limit_mib: int = 256) -> Path:
        """Put ``host``'s ranks in a new memory cgroup of ``limit_mib`` MiB (charged
        with what they allocate from now on) and start their leak (``balloon`` is the
        workers' ``HVDLITE_TEST_BALLOON``): the kernel's OOM killer ends them. Returns
        the cgroup, whose OOM kills :func:`oom_kills` counts."""
        group = memory_cgroup_root() / f"hvdlite_faults_{os.getpid()}_{host}"
        group.mkdir(exist_ok=True)
        self._cgroups.append(group)
        limit = "memory.max" if (group / "memory.max").exists() else "memory.limit_in_bytes"
        (group / limit).write_text(str(limit_mib << 20))
        for pid in self.rank_pids(host):
            (group / "cgroup.procs").write_text(str(pid))
        Path(f"{balloon}.{host}").touch()
        return group

    def kill_host(self, host: str) -> None:
        for pid in self.host_pids(host):
            _kill(pid)

    def signal_launcher(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def _veth(self, host: str) -> str:
        i = self.hosts.hosts.index(host) + 1
        return f"{self.hosts.tag}v{i}"[:15]

    # ---------------------------------------------------------------- after
    def leftovers(self) -> dict[str, list[str]]:
        """What of the job still runs: processes on each host, and the launcher's
        children here, by host ("launcher" for this machine), as ``pid command``."""
        found: dict[str, list[str]] = {}
        for host in self.hosts.hosts:
            for pid in self.host_pids(host):
                found.setdefault(host, []).append(f"{pid} {_command(pid)}")
        for pid in sorted(self._seen):
            cmd = _command(pid)
            if cmd and _state(pid) not in ("Z", ""):
                found.setdefault("launcher", []).append(f"{pid} {cmd}")
        return found

    def wait_for_no_leftovers(self, timeout: float) -> dict[str, list[str]]:
        deadline = time.time() + timeout
        while True:
            left = self.leftovers()
            if not left or time.time() >= deadline:
                return left
            time.sleep(0.5)

    def messages(self, prefix: str) -> list[str]:
        with self._cond:
            return [line for _, line in self.lines if line.startswith(prefix)]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def memory_cgroup_root() -> Path:
    """Where memory cgroups are made here: cgroup v1's memory hierarchy, or the v2 root
    when it offers the memory controller to its children."""
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").exists():
        return v1
    v2 = Path("/sys/fs/cgroup")
    try:
        if "memory" in (v2 / "cgroup.subtree_control").read_text().split():
            return v2
    except OSError:
        pass
    raise OSError("no memory cgroup controller here")


def oom_kills(group: Path) -> int:
    """How many processes the kernel's OOM killer ended in ``group``."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            for line in (group / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            continue
    return 0
