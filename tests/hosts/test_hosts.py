"""Multi-host runs on hosts emulated with network namespaces (``tests/hosts/emulated.py``).

``hvdlite-run -H``, ``--hostfile`` and a (faked) Slurm allocation place the ranks; every rank's view of the topology
(``local_rank``, ``local_size``, ``cross_rank``, ``cross_size``, ``is_homogeneous``) is
checked against the layout asked for, with even and uneven hosts; collectives cross the
hosts' rate-limited links; the PyTorch digits example trains across two hosts. Needs
root: without it every test skips with the reason."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.hosts.emulated import EmulatedHosts, unavailable
from tests.launch import REPO, job_env, run_job

HERE = Path(__file__).resolve().parent
CHECKS = HERE / "hosts_checks.py"
REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="module")
def hosts():
    with EmulatedHosts(3, rate="1gbit") as h:
        yield h


def expected(layout: list[int]) -> list[dict]:
    """What Horovod defines for ranks placed ``layout[i]`` per host, in host order."""
    out = []
    for host, k in enumerate(layout):
        for local in range(k):
            ranks_with_this_local = [i for i, m in enumerate(layout) if m > local]
            out.append({"host": f"h{host + 1}", "local_rank": local, "local_size": k,
                        "cross_rank": ranks_with_this_local.index(host),
                        "cross_size": len(ranks_with_this_local),
                        "is_homogeneous": len(set(layout)) == 1})
    return out


def run_on_hosts(hosts: EmulatedHosts, layout: list[int], launcher_args: list[str],
                 *args: str, script: Path = CHECKS, timeout: float = 240, env: dict | None = None):
    proc = run_job(sum(layout), script, *args, env={**hosts.env(), **(env or {})},
                   launcher_args=launcher_args, timeout=timeout)
    assert proc.returncode == 0, (f"exit status {proc.returncode}\nstdout:\n{proc.stdout[-6000:]}\n"
                                  f"stderr:\n{proc.stderr[-6000:]}")
    return proc.stdout + proc.stderr


def phases(timeline: Path) -> dict[str, set[str]]:
    """Every tensor's timeline phases, by tensor name."""
    events = json.loads(timeline.read_text())
    tensors = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    out: dict[str, set[str]] = {}
    for e in events:
        if e.get("ph") == "X" and e["pid"] in tensors:
            out.setdefault(tensors[e["pid"]], set()).add(e["name"])
    return out


def check_topology(out: str, layout: list[int]) -> None:
    seen = sorted((json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
                   if line.startswith("TOPOLOGY ")), key=lambda d: d["rank"])
    assert [d["rank"] for d in seen] == list(range(sum(layout))), out
    for got, want in zip(seen, expected(layout)):
        for key, value in want.items():
            assert got[key] == value, f"rank {got['rank']}: {key} {got[key]!r}, expected {value!r}\n{out}"
    assert out.count("CHECKS OK") == sum(layout), out


@pytest.mark.parametrize("layout", [[2, 2], [1, 1, 1], [2, 2, 2]], ids=lambda l: "x".join(map(str, l)))
def test_ranks_placed_with_H_see_the_topology(hosts: EmulatedHosts, layout: list[int]) -> None:
    spec = hosts.host_spec(layout + [0] * (hosts.n - len(layout)))
    out = run_on_hosts(hosts, layout, ["-H", spec], "--layout", ",".join(map(str, layout)))
    check_topology(out, layout)


def run_checks_with_timeline(hosts: EmulatedHosts, layout: list[int], timeline: Path,
                             env: dict[str, str]) -> dict[str, set[str]]:
    """Runs hosts_checks.py on `layout` with `env` (which names `timeline`), checks every
    rank's topology, and returns the phases each tensor went through."""
    spec = hosts.host_spec(layout + [0] * (hosts.n - len(layout)))
    out = run_on_hosts(hosts, layout, ["-H", spec], "--layout", ",".join(map(str, layout)), env=env)
    check_topology(out, layout)
    return phases(timeline)


@pytest.mark.parametrize("mode", ["default", "1", "0"])
@pytest.mark.parametrize("layout", [[2, 2], [2, 2, 2]], ids=lambda l: "x".join(map(str, l)))
def test_hierarchical_allreduce(hosts: EmulatedHosts, tmp_path: Path, layout: list[int], mode: str) -> None:
    """HOROVOD_HIERARCHICAL_ALLREDUCE=1 runs every host-memory allreduce in two levels,
    0 none, and by default those of 64 KiB and more; every result is checked against
    NumPy. The timeline shows which ran: the MPI_HIERARCHICAL_ALLREDUCE phase."""
    timeline = tmp_path / "timeline.json"
    env = {"HOROVOD_TIMELINE": str(timeline)}
    if mode != "default":
        env["HOROVOD_HIERARCHICAL_ALLREDUCE"] = mode
    seen = run_checks_with_timeline(hosts, layout, timeline, env)
    large, small = seen["scaled"], seen["sum.7"]
    two_level = "MPI_HIERARCHICAL_ALLREDUCE"
    assert (two_level in large) == (mode != "0"), large
    assert (two_level in small) == (mode == "1"), small


@pytest.mark.parametrize("layout", [[2, 2], [2, 2, 2]], ids=lambda l: "x".join(map(str, l)))
def test_leader_allreduce(hosts: EmulatedHosts, tmp_path: Path, layout: list[int]) -> None:
    """HVDLITE_HIERARCHICAL_ALGORITHM=leader: every two-level allreduce is reduced to
    local rank 0, allreduced among the hosts' leaders and broadcast inside the host;
    every result (sums, averages, scaling, max, min, float16, fused) matches NumPy, and
    the timeline shows the MPI_LEADER_ALLREDUCE phase instead of the torus's."""
    timeline = tmp_path / "timeline.json"
    env = {"HOROVOD_TIMELINE": str(timeline), "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
           "HVDLITE_HIERARCHICAL_ALGORITHM": "leader"}
    seen = run_checks_with_timeline(hosts, layout, timeline, env)
    for name in ("scaled", "sum.7", "max", "half", "group.0"):
        assert "MPI_LEADER_ALLREDUCE" in seen[name], (name, seen[name])
        assert "MPI_HIERARCHICAL_ALLREDUCE" not in seen[name], (name, seen[name])


@pytest.mark.parametrize("mode", ["default", "1", "0"])
@pytest.mark.parametrize("layout", [[2, 2], [2, 2, 2]], ids=lambda l: "x".join(map(str, l)))
def test_hierarchical_allgather(hosts: EmulatedHosts, tmp_path: Path, layout: list[int], mode: str) -> None:
    """HOROVOD_HIERARCHICAL_ALLGATHER=1 runs every host-memory allgather in two levels
    (ragged, every type, fused), 0 none, and by default those that gather 256 KiB or more;
    every result is checked against NumPy, and the timeline's phase says which ran."""
    timeline = tmp_path / "timeline.json"
    env = {"HOROVOD_TIMELINE": str(timeline)}
    if mode != "default":
        env["HOROVOD_HIERARCHICAL_ALLGATHER"] = mode
    seen = run_checks_with_timeline(hosts, layout, timeline, env)
    two_level = "MPI_HIERARCHICAL_ALLGATHER"
    for name in ("gather.big", "gather.same"):
        assert (two_level in seen[name]) == (mode != "0"), (name, seen[name])
        assert ("MPI_ALLGATHER" in seen[name]) == (mode == "0"), (name, seen[name])
    for name in ("gather.float32", "gather.mid"):
        assert (two_level in seen[name]) == (mode == "1"), (name, seen[name])
    fused = [seen[f"fused.{i}"] for i in range(24)]
    assert any("MEMCPY_IN_FUSION_BUFFER" in p for p in fused), fused
    if mode != "default":
        assert all((two_level in p) == (mode == "1") for p in fused), fused


def test_hierarchical_allgather_with_ranks_round_robin(hosts: EmulatedHosts, tmp_path: Path) -> None:
    """Ranks dealt round robin over the hosts (--map-by node): the world's order is not
    host after host, so the two-level allgather gathers into scratch memory and puts
    the blocks in rank order; the results still match NumPy."""
    timeline = tmp_path / "timeline.json"
    out = run_on_hosts(hosts, [2, 2], ["-H", hosts.host_spec([2, 2, 0]), "--mpi-args=--map-by node"],
                       "--layout", "2,2", "--placement", "node",
                       env={"HOROVOD_TIMELINE": str(timeline), "HOROVOD_HIERARCHICAL_ALLGATHER": "1",
                            "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"})
    seen = sorted((json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
                   if line.startswith("TOPOLOGY ")), key=lambda d: d["rank"])
    assert [(d["host"], d["local_rank"], d["cross_rank"]) for d in seen] == \
        [("h1", 0, 0), ("h2", 0, 1), ("h1", 1, 0), ("h2", 1, 1)], out
    assert out.count("CHECKS OK") == 4, out
    assert "MPI_HIERARCHICAL_ALLGATHER" in phases(timeline)["gather.big"]


def test_uneven_hosts_refuse_hierarchical_allreduce(hosts: EmulatedHosts) -> None:
    """3 ranks on one host and 1 on the other: a forced two-level allreduce and
    allgather are refused with the reason (once, by rank 0), and the collectives run
    flat and right."""
    layout = [3, 1]
    out = run_on_hosts(hosts, layout, ["-H", hosts.host_spec([3, 1, 0])], "--layout", "3,1",
                       env={"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_HIERARCHICAL_ALLGATHER": "1"})
    check_topology(out, layout)
    for what in ("ALLREDUCE", "ALLGATHER"):
        message = f"HOROVOD_HIERARCHICAL_{what}=1 is ignored: the hosts run different numbers of ranks"
        assert out.count(message) == 1, out


def test_uneven_hosts_from_a_hostfile(hosts: EmulatedHosts, tmp_path: Path) -> None:
    layout = [3, 1]
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("# three ranks on h1, one on h2\nh1 slots=3\nh2 slots=1\n")
    out = run_on_hosts(hosts, layout, ["--hostfile", str(hostfile)], "--layout", "3,1")
    check_topology(out, layout)


@pytest.mark.parametrize("nodelist, tasks, layout", [("h[1-2]", "2(x2)", [2, 2]), ("h1,h[2-3]", "2,1(x2)", [2, 1, 1])],
                         ids=["2x2", "2-1-1"])
def test_ranks_placed_on_a_slurm_allocation(hosts: EmulatedHosts, nodelist: str, tasks: str,
                                            layout: list[int]) -> None:
    """Inside a Slurm allocation (its variables faked here: no SLURM_JOB_ID, so that
    mpirun still reaches the hosts through the emulation's ssh stand-in rather than
    srun), ``hvdlite-run -np N`` without -H puts SLURM_TASKS_PER_NODE ranks on each
    node of SLURM_JOB_NODELIST, in order; every rank's host and topology are checked."""
    env = {"SLURM_JOB_NODELIST": nodelist, "SLURM_TASKS_PER_NODE": tasks,
           "SLURM_JOB_CPUS_PER_NODE": "16(x3)"}
    out = run_on_hosts(hosts, layout, [], "--layout", ",".join(map(str, layout)), env=env)
    check_topology(out, layout)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_digits_example_trains_across_two_hosts(hosts: EmulatedHosts, tmp_path: Path) -> None:
    """The README's main job on 2 hosts x 2 ranks ends with the single-process
    reference's weights (float64, so the two agree to rounding)."""
    example = REPO / "examples" / "pytorch" / "train_digits_cnn.py"
    common = ["--float64", "--epochs", "2", "--batch-size", "64", "--no-progress", "--checkpoint", ""]
    ref = subprocess.run([sys.executable, str(example), "--reference", *common,
                          "--save-params", str(tmp_path / "ref.npz")],
                         cwd=tmp_path, env=job_env(), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    out = run_on_hosts(hosts, [2, 2], ["-H", hosts.host_spec([2, 2, 0])], *common,
                       "--save-params", str(tmp_path / "dist.npz"), script=example)
    accuracy = re.findall(r"final test accuracy: ([0-9.]+)", out)
    want = re.findall(r"final test accuracy: ([0-9.]+)", ref.stdout)
    assert len(accuracy) == 1 and abs(float(accuracy[0]) - float(want[-1])) < 1e-9, (accuracy, want, out[-3000:])
    got, ref_params = dict(np.load(tmp_path / "dist.npz")), dict(np.load(tmp_path / "ref.npz"))
    assert got.keys() == ref_params.keys()
    for k in got:
        np.testing.assert_allclose(got[k], ref_params[k], rtol=1e-8, atol=1e-10, err_msg=k)
