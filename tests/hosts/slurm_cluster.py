"""A real Slurm cluster on emulated hosts: ``slurmctld`` beside the bridge, one
``slurmd`` inside each emulated host, ``munged`` for their authentication.

Everything lives in a temporary directory (configuration, keys, spool and state, logs)
and is stopped and removed on exit; nothing in ``/etc`` is read or changed. Jobs are
submitted with the cluster's own ``sbatch``/``srun``/``salloc`` and :meth:`SlurmCluster.env`
(``SLURM_CONF``). A batch script then runs on the first node, in that host's namespace and
under its hostname, and Open MPI's ``mpirun`` inside it finds the allocation and starts
its daemons on the other nodes with ``srun``, as on a real cluster.

Needs root (as the emulated hosts do) and Slurm's and MUNGE's daemons
(``apt-get install slurmctld slurmd slurm-client munge``). :func:`unavailable` says
what is missing, for tests to skip.

From a shell::

    python -m tests.hosts.slurm_cluster --hosts 2 --cpus 2 -- \\
        sbatch -N 2 --ntasks-per-node 2 --wait job.sh
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.hosts.emulated import EmulatedHosts, SetUpAndTearDown, free_port
from tests.hosts.emulated import unavailable as hosts_unavailable

_DAEMONS = ("slurmctld", "slurmd", "munged")
_CLIENTS = ("sbatch", "srun", "sinfo", "scontrol")


def unavailable() -> str | None:
    """Why a Slurm cluster cannot be made here, or None if it can."""
    reason = hosts_unavailable()
    if reason:
        return reason
    missing = [tool for tool in _DAEMONS + _CLIENTS if shutil.which(tool) is None]
    if missing:
        return (f"no {', '.join(missing)} here "
                "(apt-get install slurmctld slurmd slurm-client munge)")
    return None


class SlurmCluster(SetUpAndTearDown):
    """Slurm over ``hosts``: node ``hI`` is emulated host ``hI`` with ``cpus`` CPUs (slots;
    they need not exist: the configuration overrides what ``slurmd`` finds), one
    partition ``emu`` holding them all. Use as a context manager."""

    def __init__(self, hosts: EmulatedHosts, cpus: int = 2, timeout: float = 60.0) -> None:
        self.hosts = hosts
        self.cpus = cpus
        self.timeout = timeout
        self._dir: tempfile.TemporaryDirectory | None = None
        self.root = Path()
        self.conf = Path()
        self._procs: list[subprocess.Popen] = []
        self._logs: list = []

    # -- set up and tear down
    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.out", "w")
        self._logs.append(log)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self._procs.append(proc)
        return proc

    def up(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="hvdlite_slurm_")
        self.root = Path(self._dir.name)
        self.root.chmod(0o755)
        (self.root / "state").mkdir()
        for host in self.hosts.hosts:
            (self.root / f"spool-{host}").mkdir()

        # MUNGE: a key of our own and a daemon on a socket of our own.
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = self.root / "munge.socket"
        self._start("munged", ["munged", "--foreground", "--force",
                               f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={self.root / 'munged.pid'}",
                               f"--seed-file={self.root / 'munged.seed'}",
                               f"--log-file={self.root / 'munged.log'}"])
        self._wait_for(lambda: self.munge_socket.exists(), "munged to open its socket")

        controller_addr = f"10.77.{self.hosts.octet}.254"
        nodes = "\n".join(
            f"NodeName={host} NodeAddr=10.77.{self.hosts.octet}.{i} CPUs={self.cpus} "
            f"RealMemory=1000 State=UNKNOWN"
            for i, host in enumerate(self.hosts.hosts, start=1))
        self.conf = self.root / "slurm.conf"
        self.conf.write_text(f"""\
ClusterName=hvdemu
SlurmctldHost=ctl({controller_addr})
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={self.root / 'state'}
SlurmdSpoolDir={self.root}/spool-%n
SlurmctldPidFile={self.root / 'slurmctld.pid'}
SlurmdPidFile={self.root}/slurmd-%n.pid
SlurmctldLogFile={self.root / 'slurmctld.log'}
SlurmdLogFile={self.root}/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
{nodes}
PartitionName=emu Nodes={','.join(self.hosts.hosts)} Default=YES MaxTime=INFINITE State=UP
""")
        # The controller checks that it runs on SlurmctldHost's name: give it one.
        self._start("slurmctld", ["unshare", "--uts", "/bin/sh", "-c",
                                  'hostname ctl && exec slurmctld -D -i -f "$0"', str(self.conf)])
        # nsenter, not `ip netns exec`: that one mounts a sysfs of the namespace's own,
        # without the cgroup file systems slurmd requires.
        for host, ns in self.hosts.namespaces.items():
            self._start(f"slurmd-{host}", [
                "nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "/bin/sh", "-c",
                'hostname "$0" && exec slurmd -D -N "$0" -f "$1"', host, str(self.conf)])
        self._wait_for(self._all_idle, "every node to be idle in sinfo")

    def _all_idle(self) -> bool:
        for proc in self._procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a Slurm daemon exited ({proc.args!r}, rc "
                                   f"{proc.returncode}):\n{self.logs()}")
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env(),
                             capture_output=True, text=True)
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return all(states.get(host) == "idle" for host in self.hosts.hosts)

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        """The daemons' logs, for a failing test's message."""
        parts = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.name}\n{text[-3000:]}")
        return "\n".join(parts)

    def down(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 15)
                except OSError:
                    pass
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
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

    # -- using it
    def env(self) -> dict[str, str]:
        """Variables for Slurm's commands (and the jobs they start) to use this cluster,
        and the emulated hosts' own that keep Open MPI's traffic on their bridge, but
        not their stand-in for ssh: inside an allocation mpirun must reach the other
        nodes through Slurm (``srun``), as on a real cluster."""
        env = {k: v for k, v in self.hosts.env().items() if k != "PRTE_MCA_plm_ssh_agent"}
        env["SLURM_CONF"] = str(self.conf)
        return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--cpus", type=int, default=2, help="CPUs (slots) per node")
    p.add_argument("--rate", default="1gbit", help="each host's link, both ways (tc units)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give a command after --")
    reason = unavailable()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    with EmulatedHosts(args.hosts, args.rate) as hosts, SlurmCluster(hosts, args.cpus) as cluster:
        print(f"Slurm cluster: nodes {', '.join(hosts.hosts)} on {hosts.subnet}, "
              f"SLURM_CONF={cluster.conf}", file=sys.stderr, flush=True)
        return subprocess.call(command, env=dict(os.environ, **cluster.env()))


if __name__ == "__main__":
    sys.exit(main())
