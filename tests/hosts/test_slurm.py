"""``hvdlite-run`` inside a real Slurm allocation: a cluster of emulated hosts
(``tests/hosts/slurm_cluster.py``: ``slurmctld``, one ``slurmd`` per host, MUNGE), a
batch job submitted with ``sbatch``, and in it ``hvdlite-run -np N`` without ``-H``.
The ranks must land on the allocation's nodes as Slurm counted its tasks, mpirun must
reach the other nodes through Slurm (its ssh is set to ``false``, which always fails),
and every rank's topology and collectives are checked (``hosts_checks.py``).

Needs root and Slurm's daemons (``apt-get install slurmctld slurmd slurm-client
munge``); without them every test skips with the reason. ``test_hosts.py`` covers the
same placement with the allocation's variables faked, which needs no Slurm."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hosts.emulated import EmulatedHosts
from tests.hosts.slurm_cluster import SlurmCluster, unavailable
from tests.hosts.test_hosts import CHECKS, check_topology
from tests.launch import REPO, job_env

REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="module")
def cluster():
    with EmulatedHosts(3, rate="1gbit") as hosts, SlurmCluster(hosts, cpus=2) as c:
        yield c


def sbatch(cluster: SlurmCluster, tmp_path: Path, sbatch_args: list[str], command: str,
           timeout: float = 300) -> str:
    """Submits ``command`` as a batch job and waits for it; returns the job's output."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n"
                      'echo "BATCH host=$(hostname) nodes=$SLURM_JOB_NODELIST '
                      'tasks=$SLURM_TASKS_PER_NODE"\n'
                      f"exec {command}\n")
    script.chmod(0o755)
    out = tmp_path / "job.out"
    # An ssh that always fails: mpirun must start its daemons with srun.
    env = job_env({**cluster.env(), "PRTE_MCA_plm_ssh_agent": "false"})
    proc = subprocess.run(["sbatch", "--wait", "-o", str(out), "-D", str(REPO), *sbatch_args,
                           str(script)], env=env, capture_output=True, text=True, timeout=timeout)
    text = out.read_text() if out.exists() else ""
    assert proc.returncode == 0, (f"sbatch: exit status {proc.returncode}\n{proc.stdout}{proc.stderr}\n"
                                  f"job output:\n{text[-6000:]}\nSlurm's logs:\n{cluster.logs()}")
    return text


@pytest.mark.parametrize("sbatch_args, layout", [(["-N", "2", "--ntasks-per-node", "2"], [2, 2]),
                                                 (["-N", "3", "-n", "4"], [2, 1, 1])],
                         ids=["2x2", "2-1-1"])
def test_hvdlite_run_inside_an_sbatch_job(cluster: SlurmCluster, tmp_path: Path,
                                          sbatch_args: list[str], layout: list[int]) -> None:
    n = sum(layout)
    command = (f"{sys.executable} -m hvdlite.runner -np {n} {sys.executable} {CHECKS} "
               f"--layout {','.join(map(str, layout))}")
    out = sbatch(cluster, tmp_path, sbatch_args, command)
    batch = next(line for line in out.splitlines() if line.startswith("BATCH "))
    assert batch.startswith("BATCH host=h1 "), batch  # the batch script runs on the first node
    check_topology(out, layout)


def test_more_ranks_than_the_allocation_is_refused(cluster: SlurmCluster, tmp_path: Path) -> None:
    """-np above the allocation's tasks: hvdlite-run says so instead of oversubscribing."""
    command = f"{sys.executable} -m hvdlite.runner -np 5 {sys.executable} {CHECKS} --layout 5"
    script_out = tmp_path / "job.out"
    with pytest.raises(AssertionError, match="exceeds the 4 slots"):
        sbatch(cluster, tmp_path, ["-N", "2", "--ntasks-per-node", "2"], command)
    assert "CHECKS OK" not in script_out.read_text()
