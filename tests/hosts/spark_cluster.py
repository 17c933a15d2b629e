"""A Spark standalone cluster over emulated hosts: the master on this machine (on the
hosts' bridge), one worker on each host, under the host's name.

Needs root (the emulated hosts), Java and PySpark; :func:`unavailable` says what is
missing. Use as a context manager; the daemons are stopped on exit.
"""
from __future__ import annotations

import os
import shutil
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
    if shutil.which("java") is None:
        return "Spark needs Java (apt-get install openjdk-17-jre-headless)"
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "PySpark is not installed (pip install 'hvdlite[spark]')"
    return None


class SparkCluster(SetUpAndTearDown):
    """A master and one worker of ``cores`` cores on each of ``hosts``."""

    def __init__(self, hosts: EmulatedHosts, cores: int = 1, timeout: float = 90.0) -> None:
        import pyspark

        self.hosts = hosts
        self.cores = cores
        self.timeout = timeout
        self.spark_home = os.path.dirname(pyspark.__file__)
        self.address = ""
        self.master_url = ""
        self._dir: tempfile.TemporaryDirectory | None = None
        self.root = Path()
        self._procs: list[subprocess.Popen] = []
        self._logs: list = []

    def _env(self) -> dict[str, str]:
        return dict(os.environ, SPARK_HOME=self.spark_home, PYSPARK_PYTHON=sys.executable,
                    SPARK_LOG_DIR=str(self.root), SPARK_NO_DAEMONIZE="1")

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "w")
        self._logs.append(log)
        self._procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self._env(),
                                            start_new_session=True))

    def up(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="hvdlite_spark_")
        self.root = Path(self._dir.name)
        self.address = f"10.77.{self.hosts.octet}.254"
        port = free_port()
        self.master_url = f"spark://{self.address}:{port}"
        spark_class = os.path.join(self.spark_home, "bin", "spark-class")
        self._start("master", [spark_class, "org.apache.spark.deploy.master.Master",
                               "--host", self.address, "--port", str(port),
                               "--webui-port", str(free_port())])
        for i, (host, ns) in enumerate(self.hosts.namespaces.items(), start=1):
            work = self.root / f"work-{host}"
            work.mkdir()
            self._start(f"worker-{host}", [
                "nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "/bin/sh", "-c",
                # Java cannot resolve the host's name: give it the host's address.
                'hostname "$0" && exec "$@"', host, "env",
                f"SPARK_LOCAL_IP=10.77.{self.hosts.octet}.{i}", spark_class,
                "org.apache.spark.deploy.worker.Worker", "--host", f"10.77.{self.hosts.octet}.{i}",
                "--cores", str(self.cores), "--memory", "1g", "--work-dir", str(work),
                "--webui-port", str(free_port()), self.master_url])
        deadline = time.monotonic() + self.timeout
        while self._registered() < len(self.hosts.hosts):
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited ({proc.args!r}):\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for the Spark workers:\n{self.logs()}")
            time.sleep(0.5)

    def _registered(self) -> int:
        try:
            return (self.root / "master.out").read_text(errors="replace").count("Registering worker")
        except OSError:
            return 0

    def session(self, **conf: str):
        """A SparkSession of this cluster, its driver on the bridge."""
        from pyspark.sql import SparkSession

        builder = (SparkSession.builder.master(self.master_url).appName("hvdlite-hosts")
                   .config("spark.driver.host", self.address)
                   .config("spark.driver.bindAddress", self.address)
                   .config("spark.executor.memory", "512m")
                   .config("spark.ui.enabled", "false")
                   .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable))
        for k, v in conf.items():
            builder = builder.config(k, v)
        return builder.getOrCreate()

    def logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.out")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def down(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 9)
                except OSError:
                    pass
            proc.wait()
        self._procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def executors_on(namespace: str | None = None) -> list[int]:
    """Process ids of the Spark executors in an emulated host's namespace (None: on
    this whole machine), in ascending order."""
    if namespace is None:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    else:
        pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                              text=True).stdout.split()
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"CoarseGrainedExecutorBackend" in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return sorted(found)
