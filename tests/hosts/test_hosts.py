"""Multi-host runs on hosts emulated with network namespaces (``tests/hosts/emulated.py``).

``hvdlite-run -H``, ``--hostfile`` and a (faked) Slurm allocation place the ranks; every rank's view of the topology
(``local_rank``, ``local_size``, ``cross_rank``, ``cross_size``, ``is_homogeneous``) is
checked against the layout asked for, with even and uneven hosts; collectives cross the
hosts' rate-limited links; the PyTorch digits example trains across two hosts. Needs
root: without it every test skips with the reason."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.gpu.test_gpu import fake_cuda, gpu_env  # noqa: F401  (fake_cuda is a fixture)
from tests.hosts.emulated import EmulatedHosts, unavailable
from tests.launch import REPO, job_env, run_job

HERE = Path(__file__).resolve().parent
CHECKS = HERE / "hosts_checks.py"
GPU_CHECKS = HERE / "gpu_hosts_checks.py"
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


def check_topology(out: str, layout: list[int], placed_by_launcher: bool = True) -> None:
    seen = sorted((json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
                   if line.startswith("TOPOLOGY ")), key=lambda d: d["rank"])
    assert [d["rank"] for d in seen] == list(range(sum(layout))), out
    for got, want in zip(seen, expected(layout)):
        for key, value in want.items():
            assert got[key] == value, f"rank {got['rank']}: {key} {got[key]!r}, expected {value!r}\n{out}"
        check_horovod_env(got, placed_by_launcher)
    assert out.count("CHECKS OK") == sum(layout), out


def check_horovod_env(got: dict, placed_by_launcher: bool) -> None:
    """Horovod's per-worker variables: before hvd.init() as hvdlite-run set them (the
    cross pair only where it placed the ranks), and after it equal to the API's values."""
    api = {k: str(got[k]) for k in ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")}
    api["hostname"] = got["host"]
    at_start = dict(api) if placed_by_launcher else {k: v for k, v in api.items() if not k.startswith("cross")}
    assert got["horovod_env_at_start"] == at_start, (got["rank"], got["horovod_env_at_start"], at_start)
    assert got["horovod_env"] == api, (got["rank"], got["horovod_env"], api)


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


@pytest.mark.parametrize("schedule", ["torus", "leader"])
def test_hierarchical_allreduce_of_every_type_and_op_matches_numpy(hosts: EmulatedHosts, tmp_path: Path,
                                                                   schedule: str) -> None:
    """tests/core/dtype_checks.py across 2 hosts x 2 ranks with every allreduce in two
    levels: every element type and reduce op, sizes 1 to 4097, integer values that wrap
    around, alone, fused and on a process set, against NumPy's arithmetic."""
    timeline = tmp_path / "timeline.json"
    env = {"HOROVOD_TIMELINE": str(timeline), "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
           "HVDLITE_HIERARCHICAL_ALGORITHM": schedule}
    layout = [2, 2]
    out = run_on_hosts(hosts, layout, ["-H", hosts.host_spec(layout + [0])], "--paths", "negotiated,fused,set",
                       script=REPO / "tests" / "core" / "dtype_checks.py", env=env)
    assert out.count("ALL CHECKS PASSED") == 4, out[-3000:]
    seen = phases(timeline)
    phase = "MPI_HIERARCHICAL_ALLREDUCE" if schedule == "torus" else "MPI_LEADER_ALLREDUCE"
    for name in ("neg.int8.Sum.16", "neg.uint8.Sum.4097", "neg.float16.Average.33", "neg.int64.Product.1000"):
        assert phase in seen[name], (name, seen[name])


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


@pytest.mark.parametrize("layout", [[2, 2], [3, 3]], ids=lambda l: "x".join(map(str, l)))
def test_two_level_schedule_by_default_follows_the_cores(hosts: EmulatedHosts, tmp_path: Path,
                                                          layout: list[int]) -> None:
    """With HVDLITE_HIERARCHICAL_ALGORITHM unset, the two-level allreduce runs the torus
    where every rank of a host has a core of its own, and the leader schedule where a host
    runs more ranks than the machine has cores (the emulated hosts share this machine's
    cores, so 3 ranks a host are more than a 2-core machine has)."""
    timeline = tmp_path / "timeline.json"
    env = {"HOROVOD_TIMELINE": str(timeline), "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}
    seen = run_checks_with_timeline(hosts, layout, timeline, env)
    leader = layout[0] > (os.cpu_count() or 1)
    want, other = (("MPI_LEADER_ALLREDUCE", "MPI_HIERARCHICAL_ALLREDUCE") if leader
                   else ("MPI_HIERARCHICAL_ALLREDUCE", "MPI_LEADER_ALLREDUCE"))
    for name in ("scaled", "sum.7", "group.0"):
        assert want in seen[name] and other not in seen[name], (layout, name, seen[name])


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
    for d in seen:  # placed by the user's --map-by: the cross pair comes from hvd.init()
        check_horovod_env(d, placed_by_launcher=False)
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


def nccl_inits(log: Path) -> dict[str, list[int]]:
    """The communicator sizes each process's ncclCommInitRank calls asked for, by pid."""
    out: dict[str, list[int]] = {}
    for line in log.read_text().splitlines():
        if line.startswith("ncclCommInitRank "):
            fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
            out.setdefault(fields["pid"], []).append(int(fields["nranks"]))
    return out


def nccl_calls(log: Path) -> set[str]:
    return {line.split(" ", 1)[0] for line in log.read_text().splitlines()}


@pytest.mark.parametrize("cross", ["mpi", "nccl"])
def test_gpu_hierarchical_allreduce(hosts: EmulatedHosts, fake_cuda: Path, tmp_path: Path, cross: str) -> None:
    """GPU tensors (fake CUDA and NCCL) with HOROVOD_HIERARCHICAL_ALLREDUCE=1 on 2 hosts x 2
    ranks: ncclReduceScatter inside each host, the shard allreduced across the hosts by
    MPI through host memory or by NCCL (HVDLITE_HIERARCHICAL_CROSS), ncclAllGather inside
    the host. Every op, float32/float16/int32, scale factors, fused tensors, sizes 2 does
    not divide, a few MiB and a joined rank match NumPy (gpu_hosts_checks.py); the timeline
    names the levels; the fake's log shows the 2-rank communicators they ran on. Integer
    Average, which two levels cannot give exactly, stays flat."""
    timeline = tmp_path / "timeline.json"
    env = {**gpu_env(fake_cuda, tmp_path), "HOROVOD_TIMELINE": str(timeline),
           "HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HVDLITE_HIERARCHICAL_CROSS": cross}
    out = run_on_hosts(hosts, [2, 2], ["-H", hosts.host_spec([2, 2, 0])], script=GPU_CHECKS, env=env)
    assert out.count("GPU HOST CHECKS OK") == 4, out
    seen = phases(timeline)
    across = "MPI_ALLREDUCE" if cross == "mpi" else "NCCL_ALLREDUCE"
    for name in ("sum.float32.7", "avg.float16.1000", "max.int32.65537", "min.float32.1000.inplace",
                 "prod.float16.7", "scaled.avg.float16", "fused.3", "grouped.1", "big.even", "big.odd", "joined"):
        got = seen[name]
        for phase in ("NCCL_HIERARCHICAL_ALLREDUCE", "NCCL_REDUCESCATTER", across, "NCCL_ALLGATHER"):
            assert phase in got, (name, phase, got)
    for name in ("fused.3", "big.odd"):
        assert "MEMCPY_IN_FUSION_BUFFER" in seen[name], (name, seen[name])
    flat = seen["avg.int32.1000"]
    assert "NCCL_ALLREDUCE" in flat and "NCCL_HIERARCHICAL_ALLREDUCE" not in flat, flat
    log = tmp_path / "nccl.log"
    inits = nccl_inits(log)
    assert len(inits) == 4, inits
    # The world's communicator, this host's, and with NCCL across, the cross one.
    want = [4, 2] if cross == "mpi" else [4, 2, 2]
    assert all(sorted(v, reverse=True) == want for v in inits.values()), inits
    calls = nccl_calls(log)
    assert {"ncclReduceScatter", "ncclAllGather", "ncclRedOpCreatePreMulSum"} <= calls, calls
    assert "HOROVOD_HIERARCHICAL_ALLREDUCE=1 does not apply" not in out, out


@pytest.mark.parametrize("cross, call", [("mpi", "ncclReduceScatter"), ("nccl", "ncclAllReduce")])
def test_gpu_hierarchical_allreduce_async_error_fails_every_rank(hosts: EmulatedHosts, fake_cuda: Path,
                                                                 tmp_path: Path, cross: str, call: str) -> None:
    """An asynchronous NCCL error on the local communicator (its reduce-scatter) or on the
    cross one (its allreduce) fails every rank with the reason, and init() again works.
    The fake fails that call on communicator rank 1: world ranks 1 and 3 for the local
    communicators, 2 and 3 for the cross ones."""
    env = {**gpu_env(fake_cuda, tmp_path), "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
           "HVDLITE_HIERARCHICAL_CROSS": cross, "HVDLITE_FAKE_NCCL_ASYNC_FAIL": f"{call}:1:3",
           "FAILING_RANK": "1,3" if call == "ncclReduceScatter" else "2,3"}
    out = run_on_hosts(hosts, [2, 2], ["-H", hosts.host_spec([2, 2, 0])], "nccl_error",
                       script=REPO / "tests" / "gpu" / "gpu_failure_job.py", env=env, timeout=180)
    assert out.count("nccl_error OK") == 4, out


def test_gpu_hierarchical_allreduce_on_uneven_hosts_stays_flat(hosts: EmulatedHosts, fake_cuda: Path,
                                                               tmp_path: Path) -> None:
    """3 ranks on one host and 1 on the other, two levels forced: GPU allreduces run flat
    (one ncclAllReduce on the world's communicator), say why once, and are right."""
    timeline = tmp_path / "timeline.json"
    env = {**gpu_env(fake_cuda, tmp_path), "HOROVOD_TIMELINE": str(timeline),
           "HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HVDLITE_HIERARCHICAL_CROSS": "nccl"}
    out = run_on_hosts(hosts, [3, 1], ["-H", hosts.host_spec([3, 1, 0])], script=GPU_CHECKS, env=env)
    assert out.count("GPU HOST CHECKS OK") == 4, out
    message = ("HOROVOD_HIERARCHICAL_ALLREDUCE=1 does not apply to GPU allreduces: the hosts run different "
               "numbers of ranks")
    assert out.count(message) == 1, out
    seen = phases(timeline)
    for name in ("sum.float32.7", "fused.3", "big.odd", "joined"):
        assert "NCCL_ALLREDUCE" in seen[name] and "NCCL_HIERARCHICAL_ALLREDUCE" not in seen[name], seen[name]
    inits = nccl_inits(tmp_path / "nccl.log")
    assert sorted(inits.values()) == [[4]] * 4, inits
    assert "ncclReduceScatter" not in nccl_calls(tmp_path / "nccl.log")


def test_uneven_hosts_from_a_hostfile(hosts: EmulatedHosts, tmp_path: Path) -> None:
    layout = [3, 1]
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("# three ranks on h1, one on h2\nh1 slots=3\nh2 slots=1\n")
    out = run_on_hosts(hosts, layout, ["--hostfile", str(hostfile)], "--layout", "3,1")
    check_topology(out, layout)


THREADS = """
import os, socket
keys = ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"]
print("threads", socket.gethostname(), *[os.environ.get(k, "-") for k in keys], flush=True)
"""


def test_threads_per_rank_are_each_hosts_own(hosts: EmulatedHosts, tmp_path: Path) -> None:
    """Without OMP_NUM_THREADS, each rank's thread variables are worked out on its own
    host: 3 ranks on h1 share its cores; the one rank on h2 keeps the frameworks'
    defaults (nothing set), as a lone rank does. The launcher says so in one line."""
    script = tmp_path / "threads.py"
    script.write_text(THREADS)
    proc = run_job(4, script, env={**hosts.env(), "OMP_NUM_THREADS": None},
                   launcher_args=["-H", hosts.host_spec([3, 1, 0])], timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    n = str(max(1, len(os.sched_getaffinity(0)) // 3))  # the emulated hosts share this machine's cores
    rows = sorted(line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("threads "))
    assert rows == [["h1", n, n, n, n]] * 3 + [["h2", "-", "-", "-", "-"]], proc.stdout
    assert proc.stderr.count("its host's cores / the ranks on that host") == 1, proc.stderr


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


def test_sigterm_tears_the_hosts_down() -> None:
    """``kill`` of a command running on emulated hosts (as of a benchmark someone stops)
    still removes the namespaces: SIGTERM exits through the context manager."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "tests.hosts.emulated", "--hosts", "2", "--", "sleep", "60"],
                            cwd=REPO, env=job_env(), stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert line.startswith("emulated hosts h1, h2"), line
        tag = f"hvd{proc.pid % 100000}-"

        def ours() -> list[str]:
            out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            return [l.split()[0] for l in out.splitlines() if l.startswith(tag)]
        assert sorted(ours()) == [tag + "h1", tag + "h2"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        time.sleep(0.2)
        assert ours() == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
