"""Tests for the launcher ``hvdlite-run`` (hvdlite/runner).

Unit tests check the mpirun command and environment built for given flags
without starting a process; integration tests start real jobs through the real
``mpirun`` with 1-4 ranks (oversubscribed on small machines).
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdlite.runner import cli, command, slurm
from hvdlite.runner.cli import parse_args
from hvdlite.runner.command import build_mpirun_command
from hvdlite.runner.config import LaunchConfig
from hvdlite.runner.hosts import parse_hostfile, parse_hosts
from hvdlite.runner.mpirun import LaunchError, find_mpirun

REPO_ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120


def _pairs(argv: list[str]) -> list[tuple[str, str]]:
    return list(zip(argv, argv[1:]))


def _forwarded(argv: list[str]) -> set[str]:
    return {b for a, b in _pairs(argv) if a == "-x"}


def _build(config: LaunchConfig, environ: dict[str, str] | None = None, **kw):
    environ = {"PATH": "/usr/bin"} if environ is None else environ
    kw.setdefault("is_root", False)
    kw.setdefault("ompi_major", 5)
    return build_mpirun_command(config, "/opt/mpi/bin/mpirun", environ, **kw)


# ----------------------------------------------------------------- unit: command


def test_basic_local_command() -> None:
    argv, env = _build(LaunchConfig(num_proc=2, command=["python", "train.py", "--lr", "1"]))
    assert argv[0] == "/opt/mpi/bin/mpirun"
    assert argv[1:3] == ["-np", "2"]
    assert ("--map-by", ":OVERSUBSCRIBE") in _pairs(argv)
    assert ("--bind-to", "none") in _pairs(argv)
    assert "--allow-run-as-root" not in argv
    assert "--host" not in argv and "--hostfile" not in argv
    assert argv[-4:] == ["python", "train.py", "--lr", "1"]
    # Each rank starts through the shell that sizes its thread pools on its host.
    assert argv[-8:-4] == command.rank_prologue(placement=[("localhost", 2)])
    assert "OMP_NUM_THREADS" not in env
    assert env["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in env
    assert {"PATH", "OMPI_MCA_mpi_yield_when_idle"} <= _forwarded(argv)


def test_environ_not_mutated_and_user_yield_kept() -> None:
    environ = {"PATH": "/usr/bin", "OMPI_MCA_mpi_yield_when_idle": "0"}
    before = dict(environ)
    _, env = _build(LaunchConfig(num_proc=1, command=["true"], cache_capacity=5), environ)
    assert environ == before
    assert env["OMPI_MCA_mpi_yield_when_idle"] == "0"
    assert env["HVDLITE_CACHE_CAPACITY"] == "5"


def test_root_adds_flag_and_env() -> None:
    argv, env = _build(LaunchConfig(num_proc=2, command=["true"]), is_root=True)
    assert argv.count("--allow-run-as-root") == 1
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"


def test_tuning_flags_become_env(tmp_path: Path) -> None:
    _, config = parse_args([
        "-np", "3",
        "--timeline-filename", "tl.json",
        "--fusion-threshold-mb", "2.5",
        "--cycle-time-ms", "3.5",
        "--cache-capacity", "0",
        "--stall-check-time", "30",
        "--log-level", "debug",
        "python", "x.py",
    ])
    assert config is not None
    environ = {"PATH": "/usr/bin", "HOROVOD_CYCLE_TIME": "99", "HOROVOD_OTHER": "z",
               "UNRELATED": "u"}
    argv, env = _build(config, environ)
    assert env["HVDLITE_FUSION_THRESHOLD"] == str(int(2.5 * 1024 * 1024)) == "2621440"
    assert env["HVDLITE_CYCLE_TIME"] == "3.5"
    assert env["HVDLITE_CACHE_CAPACITY"] == "0"
    assert env["HVDLITE_STALL_CHECK_TIME_SECONDS"] == "30"
    assert env["HVDLITE_LOG_LEVEL"] == "DEBUG"
    assert env["HVDLITE_TIMELINE"] == os.path.abspath("tl.json")
    # The flag wins over a Horovod variable of the same tunable.
    assert env["HOROVOD_CYCLE_TIME"] == "3.5"
    fwd = _forwarded(argv)
    assert {"HVDLITE_FUSION_THRESHOLD", "HVDLITE_CYCLE_TIME", "HVDLITE_CACHE_CAPACITY",
            "HVDLITE_STALL_CHECK_TIME_SECONDS", "HVDLITE_LOG_LEVEL", "HVDLITE_TIMELINE",
            "HOROVOD_OTHER", "PATH"} <= fwd
    assert "UNRELATED" not in fwd
    assert argv[-2:] == ["python", "x.py"]
    # DYNAMIC is a mode, not a file name; --thread-affinity is the Horovod variable.
    _, config = parse_args(["-np", "2", "--timeline-filename", "DYNAMIC", "--thread-affinity", "1,0", "true"])
    _, env = _build(config, {"PATH": "/usr/bin", "HOROVOD_THREAD_AFFINITY": "7"})
    assert env["HVDLITE_TIMELINE"] == "DYNAMIC"
    assert env["HVDLITE_THREAD_AFFINITY"] == env["HOROVOD_THREAD_AFFINITY"] == "1,0"


def test_remote_hosts_respect_slots() -> None:
    config = LaunchConfig(num_proc=4, command=["true"], hosts="node1:2,node2:2")
    argv, _ = _build(config)
    assert ("--host", "node1:2,node2:2") in _pairs(argv)
    assert "--oversubscribe" not in argv and ":OVERSUBSCRIBE" not in argv
    with pytest.raises(LaunchError, match="exceeds the 4 slots"):
        _build(LaunchConfig(num_proc=5, command=["true"], hosts="node1:2,node2:2"))
    # ... unless the user asks for oversubscription explicitly.
    argv, _ = _build(LaunchConfig(num_proc=5, command=["true"], hosts="node1:2,node2:2",
                                  mpi_args=["--oversubscribe"]))
    assert argv.count("--oversubscribe") == 1


def test_local_host_list_keeps_to_its_slots() -> None:
    """-H localhost:1 -np 2 is an error that names the way out, not a silent
    oversubscription (horovodrun's mpirun refuses it too); without -H the ranks run
    here with as many slots as they need."""
    argv, _ = _build(LaunchConfig(num_proc=3, command=["true"], hosts="localhost:3"))
    assert ("--host", "localhost:3") in _pairs(argv)
    with pytest.raises(LaunchError) as err:
        _build(LaunchConfig(num_proc=2, command=["true"], hosts="localhost:1"))
    message = str(err.value)
    assert "-np 2 exceeds the 1 slot" in message and "localhost:1" in message
    assert "-H localhost:2" in message and "--mpi-args=--oversubscribe" in message
    argv, _ = _build(LaunchConfig(num_proc=2, command=["true"], hosts="localhost:1",
                                  mpi_args=["--oversubscribe"]))
    assert argv.count("--oversubscribe") == 1
    argv, _ = _build(LaunchConfig(num_proc=8, command=["true"]))
    assert ("--map-by", ":OVERSUBSCRIBE") in _pairs(argv)


def test_hostfile(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnode1 slots=4\n\nnode2 slots=2  # small one\nnode3 slots=1\n")
    assert parse_hostfile(str(hostfile)) == [("node1", 4), ("node2", 2), ("node3", 1)]
    # mpirun reads the file itself, and would take "node3:1" for a host of that name.
    colon = tmp_path / "colon"
    colon.write_text("node1 slots=4\nnode3:1\n")
    with pytest.raises(ValueError, match=r"colon:2: 'node3:1': a hostfile gives a host's slots "
                                         r"as 'node3 slots=1'"):
        parse_hostfile(str(colon))
    proc = subprocess.run([sys.executable, "-m", "hvdlite.runner", "-np", "1", "--hostfile", str(colon),
                           "true"], capture_output=True, text=True, timeout=TIMEOUT, env=_env(), cwd=REPO_ROOT)
    assert proc.returncode == 2 and "'node3 slots=1'" in proc.stderr, proc.stderr
    argv, _ = _build(LaunchConfig(num_proc=7, command=["true"], hostfile=str(hostfile)))
    assert ("--hostfile", str(hostfile)) in _pairs(argv)
    with pytest.raises(LaunchError):
        _build(LaunchConfig(num_proc=8, command=["true"], hostfile=str(hostfile)))


def test_parse_hosts_errors() -> None:
    assert parse_hosts("a:2,b") == [("a", 2), ("b", None)]
    for bad in ("a:0", "a:x", "a:2,,b", ":3"):
        with pytest.raises(ValueError):
            parse_hosts(bad)


@pytest.mark.parametrize("text, hosts", [
    ("h1", ["h1"]),
    ("h[1-2]", ["h1", "h2"]),
    ("h1,h2", ["h1", "h2"]),
    ("node[01-04,07],gpu3", ["node01", "node02", "node03", "node04", "node07", "gpu3"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),          # no padding: as wide as "8"
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),       # padded to the first number's width
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("a[1,3],b[2-3],c", ["a1", "a3", "b2", "b3", "c"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("gpu[3]-ib", ["gpu3-ib"]),
    ("x-1.example.org,y[5-6].example.org", ["x-1.example.org", "y5.example.org", "y6.example.org"]),
])
def test_slurm_nodelist(text: str, hosts: list[str]) -> None:
    assert slurm.parse_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["", "h[1-2", "h1-2]", "h[2-1]", "h[a-b]", "h[[1]]", "[1-2]", "h1,,h2",
                                  "h[1-]"])
def test_slurm_nodelist_errors(text: str) -> None:
    with pytest.raises(ValueError):
        slurm.parse_nodelist(text)


def test_slurm_counts() -> None:
    assert slurm.parse_counts("2(x2),1") == [2, 2, 1]
    assert slurm.parse_counts("4") == [4]
    assert slurm.parse_counts("72(x2),36,1(x3)") == [72, 72, 36, 1, 1, 1]
    for bad in ("", "2(x)", "x2", "2(2)", "2,,1"):
        with pytest.raises(ValueError):
            slurm.parse_counts(bad)


def test_slurm_allocation_hosts() -> None:
    assert slurm.allocation_hosts({"PATH": "/bin"}) is None
    env = {"SLURM_JOB_NODELIST": "node[01-02],gpu3", "SLURM_TASKS_PER_NODE": "2(x2),1",
           "SLURM_JOB_CPUS_PER_NODE": "8(x3)"}
    # Tasks per node give the slots (as Open MPI's mpirun reads them), not CPUs.
    assert slurm.allocation_hosts(env) == [("node01", 2), ("node02", 2), ("gpu3", 1)]
    # The older SLURM_NODELIST, and CPUs per node when the tasks are not given.
    assert slurm.allocation_hosts({"SLURM_NODELIST": "h[1-2]", "SLURM_JOB_CPUS_PER_NODE": "4(x2)"}) == \
        [("h1", 4), ("h2", 4)]
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE='2' gives 1 counts for the 2 nodes"):
        slurm.allocation_hosts({"SLURM_JOB_NODELIST": "h[1-2]", "SLURM_TASKS_PER_NODE": "2"})
    with pytest.raises(ValueError, match="neither SLURM_TASKS_PER_NODE"):
        slurm.allocation_hosts({"SLURM_JOB_NODELIST": "h[1-2]"})
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST='h\\[1-2'"):
        slurm.allocation_hosts({"SLURM_JOB_NODELIST": "h[1-2", "SLURM_TASKS_PER_NODE": "1"})


def test_slurm_allocation_places_ranks() -> None:
    """Without -H/--hostfile, inside an allocation, the ranks go to its nodes; -H and a
    hostfile still win; more ranks than the allocation's tasks is an error."""
    slurm_env = {"PATH": "/usr/bin", "SLURM_JOB_NODELIST": "h[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    argv, _ = _build(LaunchConfig(num_proc=4, command=["python", "t.py"]), slurm_env)
    assert ("--host", "h1:2,h2:2") in _pairs(argv)
    assert "--oversubscribe" not in argv and ":OVERSUBSCRIBE" not in argv
    argv, _ = _build(LaunchConfig(num_proc=3, command=["python", "t.py"]), slurm_env)
    assert ("--host", "h1:2,h2:2") in _pairs(argv)
    argv, _ = _build(LaunchConfig(num_proc=2, command=["t"], hosts="other:2"), slurm_env)
    assert ("--host", "other:2") in _pairs(argv)
    with pytest.raises(LaunchError, match="exceeds the 4 slots of the Slurm allocation"):
        _build(LaunchConfig(num_proc=5, command=["t"]), slurm_env)
    _build(LaunchConfig(num_proc=5, command=["t"], mpi_args=["--oversubscribe"]), slurm_env)
    with pytest.raises(LaunchError, match="Slurm allocation: SLURM_JOB_NODELIST"):
        _build(LaunchConfig(num_proc=1, command=["t"]),
               {"SLURM_JOB_NODELIST": "h[1-", "SLURM_TASKS_PER_NODE": "1"})


def test_open_mpi_4_and_user_mpi_args() -> None:
    argv, _ = _build(LaunchConfig(num_proc=3, command=["true"]), ompi_major=4)
    assert "--oversubscribe" in argv and ":OVERSUBSCRIBE" not in argv
    # A user's --map-by / --bind-to must not be duplicated (Open MPI 5 rejects that).
    config = LaunchConfig(num_proc=3, command=["true"],
                          mpi_args=["--map-by", "slot", "--bind-to", "core"])
    argv, _ = _build(config)
    assert argv.count("--map-by") == 1 and argv.count("--bind-to") == 1
    assert "--oversubscribe" in argv
    # Ranks bound to cores of their own get one thread per core they are bound to.
    assert argv[-9:] == ["--map-by", "slot", "--bind-to", "core",
                         *command.rank_prologue(divide=False), "true"]


def _notes(config: LaunchConfig, environ: dict[str, str] | None = None, **kw) -> tuple[list[str], list[str]]:
    notes: list[str] = []
    argv, _ = _build(config, environ, notes=notes, **kw)
    return argv, notes


def test_threads_per_rank_unless_the_user_sets_them() -> None:
    """Without OMP_NUM_THREADS each rank's thread pools are sized on its host (cores /
    ranks there), with one line for the whole job; a value of the user's, in the
    environment or given to mpirun with -x, is left alone and reaches every host."""
    wrapper = command.rank_prologue(placement=[("localhost", 2)])
    cores = len(os.sched_getaffinity(0))
    argv, notes = _notes(LaunchConfig(num_proc=2, command=["python", "t.py"]))
    assert argv[-6:] == [*wrapper, "python", "t.py"]
    want = max(1, cores // 2)
    assert notes == [f"OMP_NUM_THREADS is not set: each rank gets {want} thread{'s' * (want != 1)} "
                     f"({cores} cores / 2 ranks; OMP_NUM_THREADS, MKL_NUM_THREADS and TensorFlow's "
                     "TF_NUM_INTRAOP/INTEROP_THREADS); set OMP_NUM_THREADS to choose"]
    # A lone rank keeps the frameworks' defaults: nothing to say.
    assert _notes(LaunchConfig(num_proc=1, command=["t"]))[1] == []
    # The user's OMP_NUM_THREADS: no sizing, no line, forwarded to every rank.
    argv, notes = _notes(LaunchConfig(num_proc=2, command=["t"]), {"PATH": "/bin", "OMP_NUM_THREADS": "3"})
    assert argv[-5:] == [*command.rank_prologue(threads=False, placement=[("localhost", 2)]), "t"]
    assert "nproc" not in argv[-3] and notes == []
    assert "OMP_NUM_THREADS" in _forwarded(argv)
    for mpi_args in (["-x", "OMP_NUM_THREADS=3"], ["-x", "OMP_NUM_THREADS"]):
        argv, notes = _notes(LaunchConfig(num_proc=2, command=["t"], mpi_args=mpi_args))
        assert "nproc" not in argv[-3] and notes == [], mpi_args
    # MKL_NUM_THREADS alone is kept (and forwarded); the others are still sized.
    argv, _ = _notes(LaunchConfig(num_proc=2, command=["t"]), {"PATH": "/bin", "MKL_NUM_THREADS": "8"})
    assert argv[-5:-1] == wrapper and "MKL_NUM_THREADS" in _forwarded(argv)
    # Several hosts: each host's own cores and ranks, worked out where the rank starts.
    argv, notes = _notes(LaunchConfig(num_proc=4, command=["t"], hosts="node1:2,node2:2"))
    assert argv[-5:-1] == command.rank_prologue(placement=[("node1", 2), ("node2", 2)]) and "its host's cores / the ranks on that host" in notes[0]
    # A binding of the user's: the cores each rank is bound to, not divided again;
    # --bind-to none divides.
    argv, notes = _notes(LaunchConfig(num_proc=2, command=["t"], binding_args=["--bind-to", "core"]))
    assert argv[-5:-1] == command.rank_prologue(divide=False, placement=[("localhost", 2)])
    assert "one thread per core it is bound to" in notes[0]
    argv, _ = _notes(LaunchConfig(num_proc=2, command=["t"], binding_args=["--bind-to", "none"]))
    assert argv[-5:-1] == wrapper
    # Elastic: the most workers a host may hold (its slots) share its cores.
    argv, notes = _notes(LaunchConfig(num_proc=2, command=["t"], min_np=2, max_np=4))
    assert '[ "$d" -ge 4 ] || d=4' in argv[-3]
    assert f"({cores} cores / 4 ranks;" in notes[0]


@pytest.mark.parametrize("env, divide, at_least, expected", [
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, True, 1, 16 // 3),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, True, 1, 16 // 2),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "32"}, True, 1, 1),        # never 0
    ({"MPI_LOCALNRANKS": "4"}, True, 1, 16 // 4),              # MPICH's name
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, True, 4, 16 // 4),    # elastic: the host's slots
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, False, 1, 16),       # bound: its own cores
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, True, 1, None),      # a lone rank: left alone
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "x"}, True, 1, None),
])
def test_rank_prologue_sizes_the_pools(tmp_path: Path, env: dict[str, str], divide: bool,
                                              at_least: int, expected: int | None) -> None:
    """The shell run in front of each rank, on a host whose nproc says 16."""
    _write(tmp_path / "nproc", "#!/bin/sh\necho 16\n").chmod(0o755)
    show = "echo ${OMP_NUM_THREADS-unset} ${MKL_NUM_THREADS-unset} ${TF_NUM_INTRAOP_THREADS-unset} " \
           "${TF_NUM_INTEROP_THREADS-unset}"
    base = {"PATH": f"{tmp_path}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    cmd = [*command.rank_prologue(divide=divide, at_least=at_least), "/bin/sh", "-c", show]
    out = subprocess.run(cmd, env={**base, **env}, capture_output=True, text=True, check=True).stdout
    value = "unset" if expected is None else str(expected)
    assert out.split() == [value] * 4
    # What the user set stays: OMP_NUM_THREADS leaves everything alone, any other keeps its value.
    out = subprocess.run(cmd, env={**base, **env, "OMP_NUM_THREADS": "7"}, capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["7", "unset", "unset", "unset"]
    out = subprocess.run(cmd, env={**base, **env, "MKL_NUM_THREADS": "5"}, capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == [value, "5", value, value]
    # The command's exit status is the rank's (exec, not a child).
    rc = subprocess.run([*command.rank_prologue(), "/bin/sh", "-c", "exit 7"], env=base).returncode
    assert rc == 7


def _prologue_env(placement, rank: int, size: int, local_rank: int, local_size: int,
                  extra: dict[str, str] | None = None) -> dict[str, str]:
    show = "env | grep ^HOROVOD_ | sort"
    cmd = [*command.rank_prologue(threads=False, placement=placement), "/bin/sh", "-c", show]
    env = {"PATH": "/usr/bin:/bin", "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
           "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
           **(extra or {})}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.split())


def test_rank_prologue_sets_horovods_worker_variables() -> None:
    """Horovod's per-worker variables, worked out in front of each rank's command: 3
    ranks on h1:2 and h2:1. Local rank 0 lives on both hosts (cross size 2), local rank
    1 on h1 alone (cross size 1)."""
    placement = [("h1", 2), ("h2", 1)]
    want = {
        (0, 0, 2): ("0", "2", "h1"),
        (1, 1, 2): ("0", "1", "h1"),
        (2, 0, 1): ("1", "2", "h2"),
    }
    for (rank, local_rank, local_size), (cross_rank, cross_size, host) in want.items():
        got = _prologue_env(placement, rank, 3, local_rank, local_size,
                            extra={"HOROVOD_CROSS_RANK": "9", "HOROVOD_RANK": "7"})  # stale values go
        assert got == {"HOROVOD_RANK": str(rank), "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": str(local_rank),
                       "HOROVOD_LOCAL_SIZE": str(local_size), "HOROVOD_CROSS_RANK": cross_rank,
                       "HOROVOD_CROSS_SIZE": cross_size, "HOROVOD_HOSTNAME": host}, (rank, got)
    # Placement unknown (a hostfile, the user's --map-by): hvd.init() sets the cross pair,
    # and the host name is the machine's.
    got = _prologue_env(None, 1, 2, 1, 2, extra={"HOROVOD_CROSS_RANK": "9"})
    assert "HOROVOD_CROSS_RANK" not in got and "HOROVOD_CROSS_SIZE" not in got
    assert got["HOROVOD_RANK"] == "1" and got["HOROVOD_HOSTNAME"] == os.uname().nodename
    # Not started by mpirun: nothing is set.
    cmd = [*command.rank_prologue(threads=False), "/bin/sh", "-c", "env | grep -c ^HOROVOD_ || true"]
    assert subprocess.run(cmd, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True).stdout.strip() == "0"


def test_rank_placement_follows_the_slots() -> None:
    assert command.rank_placement([("a", 2), ("b", 2)], 3) == [("a", 2), ("b", 1)]
    assert command.rank_placement([("a", 2), ("b", 2)], 4) == [("a", 2), ("b", 2)]
    assert command.rank_placement([("a", 2), ("b", None)], 3) is None  # slots unknown
    assert command.rank_placement([("a", 1)], 2) is None  # more ranks than slots
    # The user's placement options: no placement in the prologue.
    for mpi_args in (["--map-by", "node"], ["--rank-by", "slot"], ["-N", "1"]):
        argv, _ = _build(LaunchConfig(num_proc=2, command=["t"], hosts="a:2,b:2", mpi_args=mpi_args))
        assert "HOROVOD_CROSS_RANK=" not in argv[-3], mpi_args
    argv, _ = _build(LaunchConfig(num_proc=2, command=["t"], hosts="a:2,b:2"))
    assert "HOROVOD_CROSS_RANK=" in argv[-3] and "a=2" in argv[-3]


def test_parse_args_command_keeps_its_flags() -> None:
    _, config = parse_args(["-np", "2", "--verbose", "--", "python", "t.py", "--verbose",
                            "-np", "9"])
    assert config is not None
    assert config.num_proc == 2 and config.verbose
    assert config.command == ["python", "t.py", "--verbose", "-np", "9"]
    _, config = parse_args(["-np", "1", "--mpi-args", "--tag-output -x FOO", "prog"])
    assert config is not None and config.mpi_args == ["--tag-output", "-x", "FOO"]


def test_horovodrun_options_map_to_mpirun(tmp_path: Path) -> None:
    key = tmp_path / "id_rsa"
    _, config = parse_args([
        "-np", "2", "-hostfile", str(_write(tmp_path / "hosts", "localhost slots=2\n")),
        "--timeline-mark-cycles", "--stall-check-warning-time-seconds", "20",
        "--stall-check-shutdown-time-seconds", "50", "-p", "2222", "-i", str(key),
        "--network-interface", "eth1", "--network-interfaces", "ib0,eth1", "--tcp",
        "--binding-args", "--bind-to socket --map-by ppr:1:socket",
        "--output-filename", "logs", "-prefix-timestamp", "--mpi", "--start-timeout", "60",
        "--disable-cache", "--hierarchical-allreduce", "--hierarchical-allgather", "python", "t.py",
    ])
    assert config is not None
    argv, env = _build(config, {"PATH": "/usr/bin", "HOROVOD_STALL_CHECK_DISABLE": "1",
                                "HOROVOD_HIERARCHICAL_ALLGATHER": "0"})
    pairs = _pairs(argv)
    assert ("--hostfile", str(tmp_path / "hosts")) in pairs
    assert ("plm_ssh_args", f"-p 2222 -i {key}") in pairs
    assert ("btl_tcp_if_include", "eth1,ib0") in pairs and env["NCCL_SOCKET_IFNAME"] == "eth1,ib0"
    assert ("pml", "ob1") in pairs and ("btl", "self,tcp") in pairs
    # The user's binding replaces the default one.
    assert ("--bind-to", "socket") in pairs and ("--map-by", "ppr:1:socket") in pairs
    assert argv.count("--bind-to") == 1
    assert ("--output", f"dir={os.path.abspath('logs')},timestamp") in pairs
    assert env["HVDLITE_TIMELINE_MARK_CYCLES"] == "1"
    assert env["HVDLITE_HIERARCHICAL_ALLREDUCE"] == "1"
    # The flag wins over the Horovod name in the caller's environment.
    assert env["HVDLITE_HIERARCHICAL_ALLGATHER"] == env["HOROVOD_HIERARCHICAL_ALLGATHER"] == "1"
    assert env["HVDLITE_STALL_CHECK_TIME_SECONDS"] == "20"
    assert env["HVDLITE_STALL_SHUTDOWN_TIME_SECONDS"] == "50"
    assert "HVDLITE_STALL_CHECK_DISABLE" not in env
    assert {"HVDLITE_TIMELINE_MARK_CYCLES", "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS",
            "NCCL_SOCKET_IFNAME", "HOROVOD_STALL_CHECK_DISABLE"} <= _forwarded(argv)
    assert argv[-2:] == ["python", "t.py"]
    # --no-stall-check; Open MPI 4 spells the output options differently.
    _, config = parse_args(["-np", "1", "--no-stall-check", "--output-filename", "o",
                            "--prefix-output-with-timestamp", "true"])
    assert config is not None
    argv, env = _build(config, ompi_major=4)
    assert env["HVDLITE_STALL_CHECK_DISABLE"] == "1"
    assert ("--output-filename", os.path.abspath("o")) in _pairs(argv)
    assert "--timestamp-output" in argv and "--output" not in argv
    # horovodrun's --no-X options set the variable to 0, overriding the environment.
    _, config = parse_args(["-np", "1", "--stall-check", "--no-hierarchical-allreduce",
                            "--no-hierarchical-allgather", "--no-timeline-mark-cycles", "--tcp",
                            "true"])
    assert config is not None
    _, env = _build(config, {"PATH": "/bin", "HOROVOD_STALL_CHECK_DISABLE": "1",
                             "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"})
    assert env["HVDLITE_STALL_CHECK_DISABLE"] == env["HOROVOD_STALL_CHECK_DISABLE"] == "0"
    assert env["HVDLITE_HIERARCHICAL_ALLREDUCE"] == env["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "0"
    assert env["HVDLITE_HIERARCHICAL_ALLGATHER"] == "0"
    assert env["HVDLITE_TIMELINE_MARK_CYCLES"] == "0"
    assert env["NCCL_IB_DISABLE"] == "1"  # --tcp keeps NCCL off InfiniBand, as horovodrun does
    # Without the options the variables are left alone.
    _, env = _build(LaunchConfig(num_proc=1, command=["true"]))
    assert not {"HVDLITE_STALL_CHECK_DISABLE", "HVDLITE_HIERARCHICAL_ALLREDUCE",
                "HVDLITE_TIMELINE_MARK_CYCLES", "NCCL_IB_DISABLE"} & set(env)
    # ssh options given both ways are refused.
    with pytest.raises(LaunchError, match="ssh options given twice"):
        _build(LaunchConfig(num_proc=1, command=["true"], ssh_port=22,
                            mpi_args=["--mca", "plm_ssh_args", "-p 23"]))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_find_mpirun_order(tmp_path: Path) -> None:
    fake = tmp_path / "my-mpirun"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert find_mpirun({"HVDLITE_MPIRUN": str(fake), "PATH": ""}) == str(fake)
    with pytest.raises(LaunchError, match="HVDLITE_MPIRUN"):
        find_mpirun({"HVDLITE_MPIRUN": str(tmp_path / "missing"), "PATH": ""})
    # Without the override, the mpirun beside the interpreter comes before PATH.
    beside = Path(sys.executable).parent / "mpirun"
    if beside.is_file():
        assert find_mpirun({"PATH": str(tmp_path)}) == str(beside)


# ----------------------------------------------------------------- integration


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(REPO_ROOT), env.get("PYTHONPATH", "")] if p
    )
    env.update(extra)
    return env


def _hvdrun(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hvdlite.runner", *args],
        capture_output=True, text=True, timeout=TIMEOUT, env=_env(**extra), cwd=REPO_ROOT,
    )


RANK_SCRIPT = "import os; print('rank', os.environ['OMPI_COMM_WORLD_RANK'], flush=True)"


def _ranks(stdout: str) -> list[int]:
    return sorted(int(line.split()[1]) for line in stdout.splitlines()
                  if line.startswith("rank "))


def test_two_ranks_print_their_rank() -> None:
    proc = _hvdrun("-np", "2", sys.executable, "-c", RANK_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    assert "rank 0" in proc.stdout and "rank 1" in proc.stdout
    assert _ranks(proc.stdout) == [0, 1]


@pytest.mark.parametrize("nproc", [1, 3, 4])
def test_oversubscribed_sizes(nproc: int) -> None:
    proc = _hvdrun("-np", str(nproc), sys.executable, "-c", RANK_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    assert _ranks(proc.stdout) == list(range(nproc))


def test_local_host_list_and_hostfile_run(tmp_path: Path) -> None:
    proc = _hvdrun("-np", "3", "-H", "localhost:3", sys.executable, "-c", RANK_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    assert _ranks(proc.stdout) == [0, 1, 2]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=1\n")
    proc = _hvdrun("-np", "3", "--hostfile", str(hostfile), sys.executable, "-c", RANK_SCRIPT)
    assert proc.returncode == 2 and "-np 3 exceeds the 1 slot" in proc.stderr, proc.stderr
    assert "--mpi-args=--oversubscribe" in proc.stderr
    proc = _hvdrun("-np", "3", "--hostfile", str(hostfile), "--mpi-args=--oversubscribe",
                   sys.executable, "-c", RANK_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    assert _ranks(proc.stdout) == [0, 1, 2]


HOROVOD_ENV_SCRIPT = """
import json, os, socket
names = ["RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME"]
before = [os.environ.get("HOROVOD_" + n) for n in names]
import hvdlite as hvd
hvd.init()
after = [os.environ.get("HOROVOD_" + n) for n in names]
api = [str(v) for v in (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),
                        hvd.cross_size())]
print("HVDENV " + json.dumps({"before": before, "after": after, "api": api}), flush=True)
"""


def test_workers_get_horovods_variables_before_and_after_init() -> None:
    """A script written for Horovod's launcher reads HOROVOD_RANK, HOROVOD_LOCAL_RANK,
    ... before hvd.init(); under plain mpirun, hvd.init() sets them."""
    proc = _hvdrun("-np", "3", sys.executable, "-c", HOROVOD_ENV_SCRIPT)
    assert proc.returncode == 0, proc.stderr
    seen = sorted((json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
                   if line.startswith("HVDENV ")), key=lambda d: int(d["api"][0]))
    assert [d["api"][0] for d in seen] == ["0", "1", "2"], proc.stdout
    for d in seen:
        assert d["before"] == d["api"] + ["localhost"], d  # -np alone: the hosts are localhost:3
        assert d["after"] == d["before"], d
    # Under mpirun itself, hvd.init() sets them from the job's layout.
    mpirun = find_mpirun()
    proc = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, "-c",
                           HOROVOD_ENV_SCRIPT], capture_output=True, text=True, timeout=TIMEOUT, env=_env(),
                          cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    seen = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("HVDENV ")]
    assert len(seen) == 2, proc.stdout
    for d in seen:
        assert d["after"] == d["api"] + [socket.gethostname()], d


def test_exit_status_propagated() -> None:
    script = ("import os, sys; "
              "sys.exit(3 if os.environ['OMPI_COMM_WORLD_RANK'] == '1' else 0)")
    proc = _hvdrun("-np", "2", sys.executable, "-c", script)
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    ok = _hvdrun("-np", "2", sys.executable, "-c", "pass")
    assert ok.returncode == 0, ok.stderr


def test_tuning_flags_reach_ranks(tmp_path: Path) -> None:
    script = (
        "import os\n"
        "keys = ['HVDLITE_TIMELINE', 'HVDLITE_FUSION_THRESHOLD', 'HVDLITE_CYCLE_TIME',\n"
        "        'HVDLITE_CACHE_CAPACITY', 'HVDLITE_STALL_CHECK_TIME_SECONDS',\n"
        "        'HVDLITE_LOG_LEVEL', 'OMPI_MCA_mpi_yield_when_idle', 'HOROVOD_MARK']\n"
        "r = os.environ['OMPI_COMM_WORLD_RANK']\n"
        "print('|'.join([r] + [os.environ.get(k, '-') for k in keys]), flush=True)\n"
    )
    timeline = tmp_path / "timeline.json"
    proc = _hvdrun(
        "-np", "2", "--timeline-filename", str(timeline), "--fusion-threshold-mb", "4",
        "--cycle-time-ms", "2.5", "--cache-capacity", "64", "--stall-check-time", "45",
        "--log-level", "warning", sys.executable, "-c", script, HOROVOD_MARK="hello",
    )
    assert proc.returncode == 0, proc.stderr
    rows = sorted(line.split("|") for line in proc.stdout.splitlines() if "|" in line)
    expected = [str(timeline), str(4 * 1024 * 1024), "2.5", "64", "45", "WARNING", "1", "hello"]
    assert rows == [["0", *expected], ["1", *expected]]


THREADS_SCRIPT = (
    "import os, torch\n"
    "keys = ['OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'TF_NUM_INTRAOP_THREADS', 'TF_NUM_INTEROP_THREADS']\n"
    "print('threads', os.environ['OMPI_COMM_WORLD_RANK'], *[os.environ.get(k, '-') for k in keys],\n"
    "      torch.get_num_threads(), flush=True)\n"
)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")
def test_threads_per_rank_reach_the_ranks() -> None:
    """Without OMP_NUM_THREADS, 3 ranks on this host get its cores / 3 threads each, in
    every thread variable and in PyTorch's own pool, and the launcher says so once; the
    user's value is what every rank gets, untouched, and nothing is said."""
    env = {k: v for k, v in _env().items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
                        "TF_NUM_INTEROP_THREADS")}
    proc = subprocess.run([sys.executable, "-m", "hvdlite.runner", "-np", "3", sys.executable, "-c",
                           THREADS_SCRIPT], capture_output=True, text=True, timeout=TIMEOUT, env=env,
                          cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    n = str(max(1, len(os.sched_getaffinity(0)) // 3))
    rows = sorted(line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("threads "))
    assert rows == [[str(r), n, n, n, n, n] for r in range(3)], proc.stdout
    assert proc.stderr.count("OMP_NUM_THREADS is not set") == 1, proc.stderr
    # All the cores for each of 2 ranks (PyTorch takes no more threads than cores).
    mine = str(len(os.sched_getaffinity(0)))
    proc = subprocess.run([sys.executable, "-m", "hvdlite.runner", "-np", "2", sys.executable, "-c",
                           THREADS_SCRIPT], capture_output=True, text=True, timeout=TIMEOUT,
                          env={**env, "OMP_NUM_THREADS": mine}, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    rows = sorted(line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("threads "))
    assert rows == [[str(r), mine, "-", "-", "-", mine] for r in range(2)], proc.stdout
    assert "OMP_NUM_THREADS is not set" not in proc.stderr


def test_horovodrun_options_run_a_job(tmp_path: Path) -> None:
    """A horovodrun command line, run as it is: TCP only on the loopback interface,
    output files with timestamps, a timeline with cycle marks, stall options."""
    script = ("import os, numpy as np, hvdlite as hvd\n"
              "hvd.init()\n"
              "s = hvd.allreduce(np.full(1000, hvd.rank() + 1.0), op=hvd.Sum)\n"
              "keys = ['HVDLITE_STALL_CHECK_TIME_SECONDS', 'HVDLITE_STALL_SHUTDOWN_TIME_SECONDS']\n"
              "print('sum', hvd.rank(), s[0], s[-1], *[os.environ[k] for k in keys], flush=True)\n")
    out, timeline = tmp_path / "out", tmp_path / "tl.json"
    proc = _hvdrun("-np", "2", "-H", "localhost:2", "--mpi", "--tcp", "--network-interface", "lo",
                   "--output-filename", str(out), "-prefix-timestamp",
                   "--timeline-filename", str(timeline), "--timeline-mark-cycles",
                   "--stall-check-warning-time-seconds", "30",
                   "--stall-check-shutdown-time-seconds", "90",
                   "--binding-args", "--bind-to none", "--start-timeout", "30",
                   "--disable-cache", sys.executable, "-c", script)
    assert proc.returncode == 0, proc.stderr
    files = sorted(out.rglob("stdout"))
    assert [f.parent.name for f in files] == ["rank.0", "rank.1"], files
    for rank, f in enumerate(files):
        line = next(l for l in f.read_text().splitlines() if "sum" in l)
        assert line.startswith("[") and "]" in line, line  # the timestamp
        assert line.split("sum", 1)[1].split() == [str(rank), "3.0", "3.0", "30", "90"], line
    import json
    events = json.loads(timeline.read_text())
    assert any(e.get("name") == "CYCLE_START" for e in events)
    assert any(e.get("name") == "MPI_ALLREDUCE" for e in events)


def test_version_flag() -> None:
    proc = _hvdrun("--version")
    assert proc.returncode == 0, proc.stderr
    import hvdlite
    assert proc.stdout.strip() in (f"hvdlite {hvdlite.__version__}", "hvdlite unknown")


def test_verbose_prints_command() -> None:
    proc = _hvdrun("--verbose", "-np", "2", "--cache-capacity", "7", sys.executable, "-c", "pass")
    assert proc.returncode == 0, proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("hvdlite-run:"))
    assert "mpirun" in line and "-np 2" in line and "--bind-to none" in line
    assert "HVDLITE_CACHE_CAPACITY=7" in line


def test_check_build_output() -> None:
    proc = _hvdrun("--check-build")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "MPI" in out and "Open MPI" in out
    for label, module in (("PyTorch", "torch"), ("TensorFlow", "tensorflow")):
        line = next(l for l in out.splitlines() if label in l)
        installed = importlib.util.find_spec(module) is not None
        if not installed:
            assert line.lstrip().startswith("[ ]") and "not installed" in line
        else:
            assert "not installed" not in line
    assert "NCCL" in out and "Gloo" in out
    for feature in ("Timeline", "Response cache", "Tensor fusion", "Stall inspector"):
        assert feature in out
    # NCCL, where it is not found: every place searched is listed, one per line below.
    lines = out.splitlines()
    nccl = next(i for i, l in enumerate(lines) if "] NCCL" in l)
    if lines[nccl].lstrip().startswith("[ ]"):
        assert lines[nccl].endswith("Searched:") and "Searched:;" not in out, lines[nccl]
        listed = []
        for line in lines[nccl + 1:]:
            if not line.startswith(" " * 10):
                break
            listed.append(line.strip())
        from hvdlite.common.gpu_libraries import search_folders
        for folder in search_folders()["nccl"]:
            assert any(item.startswith(folder) for item in listed), (folder, listed)
        assert any(item.startswith("the system's search for libnccl") for item in listed), listed
        assert any(item.startswith("already loaded in this process") for item in listed), listed


def test_check_build_imports_no_framework() -> None:
    code = ("import sys\n"
            "from hvdlite.runner.check_build import check_build_report\n"
            "text = check_build_report()\n"
            "assert 'PyTorch' in text\n"
            "heavy = [m for m in ('torch', 'tensorflow', 'hvdlite._core') if m in sys.modules]\n"
            "print('heavy:', heavy)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT, env=_env(), cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "heavy: []" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "-np"),
        (["-np", "2"], "no command"),
        (["-np", "0", "true"], "positive integer"),
        (["-np", "abc", "true"], "positive integer"),
        (["-np", "-1", "true"], "positive integer"),
        (["true"], "-np"),
        (["-np", "2", "-H", "a:0", "true"], "slots"),
        (["-np", "2", "-H", "a:1", "--hostfile", "f", "true"], "not allowed"),
        (["-np", "2", "--hostfile", "/nonexistent/hosts", "true"], "hostfile"),
        (["-np", "2", "--log-level", "loud", "true"], "log level"),
        (["-np", "2", "--cycle-time-ms", "0", "true"], "> 0"),
        # horovodrun options hvdlite-run does not implement say why.
        (["-np", "2", "--gloo", "true"], "no Gloo controller"),
        (["-np", "2", "--autotune-steps-per-sample", "0", "true"], "positive integer"),
        (["-np", "2", "--num-nccl-streams", "2", "true"], "one NCCL stream"),
        (["-np", "2", "--log-with-timestamp", "true"], "-prefix-timestamp"),
        (["-np", "2", "--mpi-threads-disable", "true"], "thread support"),
        (["-np", "2", "--config-file", "c.yaml", "true"], "config file"),
        (["-np", "2", "--hierarchical-allreduce", "--no-hierarchical-allreduce", "true"],
         "not allowed with"),
        # Elastic options are supported now; inconsistent ones are usage errors
        # (more cases in test_runner_elastic.py).
        (["-np", "2", "--min-np", "3", "true"], "--min-np 3 is above -np 2"),
        (["-np", "2", "--binding-args", "'", "true"], "--binding-args"),
        (["-np", "2", "--network-interface", "eth0,", "true"], "empty interface"),
        (["-np", "2", "-p", "0", "true"], "positive integer"),
    ],
)
def test_bad_usage_exits_2(args: list[str], message: str) -> None:
    proc = _hvdrun(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "usage:" in proc.stderr
    assert message in proc.stderr


# horovodrun 0.28.1's options (its --help), with a value where they take one.
HOROVODRUN_OPTIONS: list[list[str]] = [
    ["--disable-cache"], ["--start-timeout", "30"], ["--network-interfaces", "lo"],
    ["--network-interface", "lo"], ["--output-filename", "out"], ["--verbose"],
    ["--config-file", "c.yaml"], ["-p", "22"], ["--ssh-port", "22"], ["-i", "key"],
    ["--ssh-identity-file", "key"], ["--fusion-threshold-mb", "32"], ["--cycle-time-ms", "2"],
    ["--cache-capacity", "10"], ["--hierarchical-allreduce"], ["--no-hierarchical-allreduce"],
    ["--hierarchical-allgather"], ["--no-hierarchical-allgather"], ["--autotune"],
    ["--no-autotune"], ["--autotune-log-file", "a.csv"], ["--autotune-warmup-samples", "3"],
    ["--autotune-steps-per-sample", "10"], ["--autotune-bayes-opt-max-samples", "20"],
    ["--autotune-gaussian-process-noise", "0.8"], ["--min-np", "1"], ["--min-num-proc", "1"],
    ["--max-np", "2"], ["--max-num-proc", "2"], ["--min-np", "1", "--slots-per-host", "2"],
    ["--min-np", "1", "--elastic-timeout", "60"], ["--min-np", "1", "--reset-limit", "3"],
    ["--min-np", "1", "--blacklist-cooldown-range", "10", "100"],
    ["--timeline-filename", "t.json"], ["--timeline-mark-cycles"], ["--no-timeline-mark-cycles"],
    ["--no-stall-check"], ["--stall-check"], ["--stall-check-warning-time-seconds", "60"],
    ["--stall-check-shutdown-time-seconds", "120"], ["--mpi-threads-disable"],
    ["--no-mpi-threads-disable"], ["--mpi-args=--bind-to none"], ["--tcp"],
    ["--binding-args=--bind-to none"], ["--num-nccl-streams", "1"], ["--num-nccl-streams", "2"],
    ["--thread-affinity", "0"], ["--gloo-timeout-seconds", "30"], ["--log-level", "INFO"],
    ["--log-with-timestamp"], ["--log-without-timestamp"], ["-prefix-timestamp"],
    ["--prefix-output-with-timestamp"], ["--log-hide-timestamp"], ["--no-log-hide-timestamp"],
    ["-H", "localhost:2"], ["--hosts", "localhost:2"], ["-hostfile", "HOSTFILE"],
    ["--hostfile", "HOSTFILE"], ["--host-discovery-script", "SCRIPT"], ["--gloo"], ["--mpi"],
    ["--jsrun"],
]


def test_every_horovodrun_option_is_accepted_or_refused_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hostfile = _write(tmp_path / "hosts", "localhost slots=2\n")
    script = _write(tmp_path / "hosts.sh", "#!/bin/sh\necho localhost:2\n")
    script.chmod(0o755)
    refused = []
    for option in HOROVODRUN_OPTIONS:
        args = [{"HOSTFILE": str(hostfile), "SCRIPT": str(script)}.get(a, a) for a in option]
        try:
            _, config = parse_args(["-np", "2", *args, "true"])
        except SystemExit as exc:
            err = capsys.readouterr().err
            assert exc.code == 2 and "unrecognized arguments" not in err, (option, err)
            assert option[0].split("=")[0] in err, (option, err)  # names the option, says why
            refused.append(option[0])
            continue
        assert config is not None and config.command == ["true"], option
    # The refused ones: features hvdlite lacks (Gloo, jsrun, a config file, MPI without
    # threads, timestamps in its log lines, several NCCL streams).
    assert sorted(refused) == sorted([
        "--config-file", "--mpi-threads-disable", "--num-nccl-streams",
        "--gloo-timeout-seconds", "--log-with-timestamp",
        "--no-log-hide-timestamp", "--gloo", "--jsrun"])


def test_missing_mpirun_is_a_clear_error(tmp_path: Path) -> None:
    proc = _hvdrun("-np", "1", "true", HVDLITE_MPIRUN=str(tmp_path / "no-mpirun"))
    assert proc.returncode == 2
    assert "HVDLITE_MPIRUN" in proc.stderr and "mpirun" in proc.stderr


def _alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (not zombies)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            pass
    return alive


def _start_and_wait_ready(cmd: list[str], ready: int, env: dict[str, str]) -> subprocess.Popen:
    """Start ``cmd`` and wait (at most a minute) until 'ready' came ``ready`` times on
    its stdout; a job that does not get there is killed, and the failure shows what it
    printed."""
    from tests.launch import kill_tree
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO_ROOT, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    seen, out, err = 0, b"", b""
    pipes = [proc.stdout, proc.stderr]
    deadline = time.monotonic() + 60
    while seen < ready and pipes and time.monotonic() < deadline:
        # select, not readline: a job that hangs before its ranks print must not hang the test
        readable, _, _ = select.select(pipes, [], [], 0.5)
        for f in readable:
            data = os.read(f.fileno(), 65536)
            if not data:
                pipes.remove(f)
            elif f is proc.stdout:
                out += data
            else:
                err += data
        # Counted as words, not lines: two ranks writing at once can run their lines
        # together ("readyready\n\n").
        seen = out.count(b"ready")
    if seen != ready:
        kill_tree(proc.pid)
        raise AssertionError(f"the job did not start: {seen} of {ready} ranks ready after "
                             f"{'its exit' if proc.poll() is not None else 'a minute'}\n"
                             f"stdout: {out.decode(errors='replace')}\nstderr: {err.decode(errors='replace')}")
    return proc


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the job's processes from /proc")
def test_ctrl_c_stops_the_job_with_status_130() -> None:
    """Ctrl-C: one line saying what happens, the job stopped (no process of it left),
    and the shell's status for an interrupted command, 130."""
    from tests.launch import _tree, kill_tree
    script = ("import os, time; print('ready', os.environ['OMPI_COMM_WORLD_RANK'], flush=True); "
              "time.sleep(600)")
    proc = _start_and_wait_ready([sys.executable, "-m", "hvdlite.runner", "-np", "2", sys.executable,
                                  "-c", script], 2, _env())
    try:
        job = _tree(proc.pid)
        assert len(job) >= 4, job  # the launcher, mpirun, two ranks
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, (proc.returncode, err)
        assert err.count("hvdlite-run: interrupted, stopping the job (Ctrl-C again to kill it at once)") == 1, err
        assert "Traceback" not in err, err
        time.sleep(0.5)
        assert _alive(job) == [], f"left running: {_alive(job)}"
    finally:
        kill_tree(proc.pid)


def _stubborn_mpirun(tmp_path: Path) -> Path:
    """A stand-in mpirun that ignores SIGINT and SIGTERM, with two ranks that ignore
    them too (each prints 'ready'): a job that does not stop when asked."""
    rank = ("import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)")
    fake = _write(tmp_path / "mpirun", f"""#!{sys.executable}
import signal, subprocess, sys, time
if "--version" in sys.argv:
    print("mpirun (Open MPI) 5.0.0")
    sys.exit(0)
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
ranks = [subprocess.Popen([sys.executable, "-c", {rank!r}], start_new_session=True) for _ in range(2)]
for r in ranks:
    r.wait()
""")
    fake.chmod(0o755)
    return fake


def _start_stubborn_job(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    """hvdlite-run -np 2 on the stubborn stand-in, once both ranks are ready: the
    launcher's process and every process of the job."""
    from tests.launch import _tree
    proc = _start_and_wait_ready([sys.executable, "-m", "hvdlite.runner", "-np", "2", "true"], 2,
                                 _env(HVDLITE_MPIRUN=str(_stubborn_mpirun(tmp_path))))
    job = _tree(proc.pid)
    assert len(job) >= 4, job  # the launcher, mpirun, two ranks
    return proc, job


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the job's processes from /proc")
def test_second_ctrl_c_kills_the_job_at_once(tmp_path: Path) -> None:
    """An mpirun that does not stop on Ctrl-C (here a stand-in that ignores it, with
    ranks that ignore it too): the second Ctrl-C kills it and every process below it."""
    from tests.launch import kill_tree
    proc, job = _start_stubborn_job(tmp_path)
    try:
        proc.send_signal(signal.SIGINT)
        time.sleep(1.5)
        assert proc.poll() is None and len(_alive(job)) == len(job)  # ignored by this mpirun
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, (proc.returncode, err)
        assert "interrupted, stopping the job" in err and "killing the job" in err, err
        time.sleep(0.5)
        assert _alive(job) == [], f"left running: {_alive(job)}"
    finally:
        kill_tree(proc.pid)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the job's processes from /proc")
def test_sigterm_ends_a_job_that_does_not_stop_within_the_grace_period(tmp_path: Path) -> None:
    """SIGTERM (a scheduler's, or `timeout`'s) to a launcher whose mpirun never stops
    the job (here a stand-in that ignores it, as mpirun waiting for a daemon on a host
    cut off from the network does): the launcher kills the job after
    STOP_GRACE_SECONDS and exits with 143, leaving no process behind."""
    from hvdlite.runner.launch import STOP_GRACE_SECONDS
    from tests.launch import kill_tree
    proc, job = _start_stubborn_job(tmp_path)
    try:
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=STOP_GRACE_SECONDS + 30)
        took = time.monotonic() - start
        assert proc.returncode == 143, (proc.returncode, err)
        assert "got SIGTERM, stopping the job" in err, err
        assert f"the job did not stop within {STOP_GRACE_SECONDS:g} s; killing it" in err, err
        assert STOP_GRACE_SECONDS <= took < STOP_GRACE_SECONDS + 5, took
        time.sleep(0.5)
        assert _alive(job) == [], f"left running: {_alive(job)}"
    finally:
        kill_tree(proc.pid)


def test_module_import_is_light() -> None:
    """Importing the launcher loads neither a framework nor the compiled core."""
    code = ("import sys, hvdlite.runner, hvdlite.runner.cli\n"
            "print(sorted(m for m in ('torch', 'tensorflow', 'hvdlite._core')"
            " if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT, env=_env(), cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert cli.main is not None
