"""A Ray cluster over emulated hosts: the head on this machine (on the hosts' bridge,
with no CPUs, so that no worker lands there), one worker node on each host, under the
host's name.

Needs root (the emulated hosts) and Ray; :func:`unavailable` says what is missing. Use
as a context manager; every node is stopped on exit (by its own process, never with
``ray stop``, which would end every Ray process of this machine).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.hosts.emulated import EmulatedHosts, SetUpAndTearDown, free_port
from tests.hosts.emulated import unavailable as hosts_unavailable


def unavailable() -> str | None:
    why = hosts_unavailable()
    if why:
        return why
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install 'hvdlite[ray]')"
    return None


class RayCluster(SetUpAndTearDown):
    """A head and one worker node of ``cpus`` CPUs on each of ``hosts``."""

    def __init__(self, hosts: EmulatedHosts, cpus: int = 2, timeout: float = 90.0) -> None:
        self.hosts = hosts
        self.cpus = cpus
        self.timeout = timeout
        self.address = ""
        self._dir: tempfile.TemporaryDirectory | None = None
        self.root = Path()
        self.nodes: dict[str, subprocess.Popen] = {}
        self._head: subprocess.Popen | None = None
        self._logs: list = []

    def _ray(self) -> str:
        return shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray"

    def _env(self) -> dict[str, str]:
        # Quick to notice a node that died (the defaults take about half a minute).
        return dict(os.environ, RAY_health_check_period_ms="1000",
                    RAY_health_check_failure_threshold="3", RAY_health_check_timeout_ms="1000",
                    RAY_USAGE_STATS_ENABLED="0")

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.out", "w")
        self._logs.append(log)
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=self._env(), start_new_session=True)

    def up(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="hvdlite_ray_", dir="/tmp")
        self.root = Path(self._dir.name)
        bridge = f"10.77.{self.hosts.octet}.254"
        port = free_port()
        self.address = f"{bridge}:{port}"
        common = ["--block", "--disable-usage-stats", "--num-gpus", "0"]
        self._head = self._start("head", [
            self._ray(), "start", "--head", "--node-ip-address", bridge, "--port", str(port),
            "--num-cpus", "0", "--include-dashboard", "false",
            "--temp-dir", str(self.root / "ray"), *common])
        self._wait_for(lambda: self._alive() >= 1, "the Ray head")
        for i, (host, ns) in enumerate(self.hosts.namespaces.items(), start=1):
            self.nodes[host] = self._start(f"node-{host}", [
                "nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "/bin/sh", "-c",
                'hostname "$0" && exec "$@"', host, self._ray(), "start",
                "--address", self.address, "--node-ip-address", f"10.77.{self.hosts.octet}.{i}",
                "--num-cpus", str(self.cpus), *common,
                # Nodes of one machine: a folder each for their sessions and sockets.
                "--temp-dir", str(self.root / f"ray-{host}")])
        self._wait_for(lambda: self._alive() >= 1 + len(self.nodes), "the Ray worker nodes")

    def _alive(self) -> int:
        for name, proc in [("head", self._head), *self.nodes.items()]:
            if proc is not None and proc.poll() is not None and name not in self._killed:
                raise RuntimeError(f"Ray node {name} exited:\n{self.logs()}")
        out = subprocess.run(
            [sys.executable, "-c", "import ray, sys; ray.init(address=sys.argv[1], "
             "logging_level='ERROR'); print(sum(1 for n in ray.nodes() if n['Alive']))",
             self.address], capture_output=True, text=True, env=self._env())
        try:
            return int(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0

    _killed: set = set()

    def kill_node(self, host: str) -> None:
        """End one host's Ray node and everything it started, as a crash would."""
        self._killed = self._killed | {host}
        os.killpg(self.nodes[host].pid, signal.SIGKILL)
        ns = self.hosts.namespaces[host]
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")
            time.sleep(0.5)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.root.glob("*.out")))

    def down(self) -> None:
        for proc in [*self.nodes.values(), self._head]:
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except OSError:
                    pass
        for proc in [*self.nodes.values(), self._head]:
            if proc is None:
                continue
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.nodes.clear()
        self._head = None
        for log in self._logs:
            log.close()
        self._logs.clear()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
