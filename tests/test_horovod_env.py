"""No HOROVOD_* variable is silently ignored (hvdlite/common/horovod_env.py).

The table's claims are checked against the code that reads the variables, the list
of Horovod's documented names below is typed in from Horovod 0.28.1's documentation
(not taken from the table), and a real job shows that rank 0 warns once for each
variable hvdlite does not honour and stays quiet about the ones it does.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvdlite.common import horovod_env
from hvdlite.common.horovod_env import BUILD, HONOURED, NOT_YET, VARIABLES, unhonoured

from tests.launch import REPO, job_env, run_job

# Every HOROVOD_* name in Horovod 0.28.1's user documentation (install, Tensor Fusion,
# Timeline, Autotune, MPI, GPU, oneCCL, XLA, process sets, elastic), horovodrun's
# option-to-variable mapping and its core's knobs.
DOCUMENTED = """
HOROVOD_FUSION_THRESHOLD HOROVOD_CYCLE_TIME HOROVOD_CACHE_CAPACITY HOROVOD_TIMELINE
HOROVOD_TIMELINE_MARK_CYCLES HOROVOD_AUTOTUNE HOROVOD_AUTOTUNE_LOG
HOROVOD_AUTOTUNE_WARMUP_SAMPLES HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE
HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE
HOROVOD_STALL_CHECK_DISABLE HOROVOD_STALL_CHECK_TIME_SECONDS HOROVOD_STALL_SHUTDOWN_TIME_SECONDS
HOROVOD_HIERARCHICAL_ALLREDUCE HOROVOD_HIERARCHICAL_ALLGATHER HOROVOD_TORUS_ALLREDUCE
HOROVOD_MPI_THREADS_DISABLE HOROVOD_NUM_NCCL_STREAMS HOROVOD_CCL_BGT_AFFINITY
HOROVOD_GLOO_TIMEOUT_SECONDS HOROVOD_GLOO_IFACE HOROVOD_LOG_LEVEL HOROVOD_LOG_HIDE_TIME
HOROVOD_CPU_OPERATIONS HOROVOD_CONTROLLER HOROVOD_CCL_CACHE HOROVOD_THREAD_AFFINITY
HOROVOD_ADASUM_MPI_CHUNK_SIZE HOROVOD_DISABLE_GROUP_FUSION HOROVOD_DISABLE_NVTX_RANGES
HOROVOD_ENABLE_ASYNC_COMPLETION HOROVOD_DYNAMIC_PROCESS_SETS HOROVOD_ENABLE_XLA_OPS
HOROVOD_BATCH_D2D_MEMCOPIES HOROVOD_ELASTIC HOROVOD_ELASTIC_TIMEOUT
HOROVOD_ELASTIC_START_TIMEOUT HOROVOD_START_TIMEOUT
HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_ALLGATHER HOROVOD_GPU_BROADCAST
HOROVOD_GPU_ALLTOALL HOROVOD_GPU_REDUCESCATTER HOROVOD_GPU HOROVOD_ALLOW_MIXED_GPU_IMPL
HOROVOD_WITH_TENSORFLOW HOROVOD_WITHOUT_TENSORFLOW HOROVOD_WITH_PYTORCH HOROVOD_WITHOUT_PYTORCH
HOROVOD_WITH_MXNET HOROVOD_WITHOUT_MXNET HOROVOD_WITH_MPI HOROVOD_WITHOUT_MPI
HOROVOD_WITH_GLOO HOROVOD_WITHOUT_GLOO HOROVOD_CUDA_HOME HOROVOD_CUDA_INCLUDE HOROVOD_CUDA_LIB
HOROVOD_ROCM_HOME HOROVOD_NCCL_HOME HOROVOD_NCCL_INCLUDE HOROVOD_NCCL_LIB HOROVOD_NCCL_LINK
HOROVOD_BUILD_ARCH_FLAGS HOROVOD_BUILD_CUDA_CC_LIST HOROVOD_DEBUG HOROVOD_CMAKE
HOROVOD_MPICXX_SHOW
""".split()

# Variables of features hvdlite does not have; each must be marked NOT_YET. Empty: every
# documented feature is in.
STILL_TO_COME: list[str] = []


def test_every_documented_variable_has_an_entry() -> None:
    names = [v.name for v in VARIABLES]
    assert len(names) == len(set(names)), "an entry twice"
    missing = sorted(set(DOCUMENTED) - set(names))
    assert not missing, missing
    by_name = {v.name: v for v in VARIABLES}
    for name in STILL_TO_COME:
        assert by_name[name].status == NOT_YET, name
    for v in VARIABLES:
        assert v.note, v.name  # every entry says why (or what hvdlite does with it)


def test_honoured_entries_are_read_where_they_say() -> None:
    """An entry marked honoured by the engine names a suffix parameters.cc reads; one
    marked honoured by the launcher is read by hvdlite/runner, one by the front ends in
    hvdlite/common, one by the integrations in hvdlite/ray or hvdlite/spark."""
    core = (REPO / "hvdlite/csrc/common/parameters.cc").read_text()
    read = set(re.findall(r'"([A-Z_]+)"', core))
    runner = "".join(p.read_text() for p in (REPO / "hvdlite/runner").glob("*.py"))
    for v in VARIABLES:
        if v.where == "core":
            assert v.name.removeprefix("HOROVOD_") in read, v.name
        elif v.where == "launcher":
            assert v.name in runner or f'"{v.name.removeprefix("HOROVOD_")}' in runner, v.name
        elif v.where == "front ends":
            common = "".join(p.read_text() for p in (REPO / "hvdlite/common").glob("*.py")
                             if p.name != "horovod_env.py")
            assert f'"{v.name}"' in common, v.name
        elif v.where == "integrations":
            engines = "".join(p.read_text() for part in ("ray", "spark")
                              for p in (REPO / "hvdlite" / part).glob("*.py"))
            assert f'"{v.name}"' in engines, v.name
        else:
            assert v.status != HONOURED, v.name


def test_unhonoured_names_each_variable_and_spares_honoured_ones() -> None:
    env = {
        "HOROVOD_FUSION_THRESHOLD": "1048576",   # honoured
        "HOROVOD_CPU_OPERATIONS": "MPI",          # honoured for this value
        "HOROVOD_LOG_HIDE_TIME": "1",             # honoured: hvdlite's logs have no time
        "HOROVOD_WITH_PYTORCH": "1",              # build time only: no warning
        "HOROVOD_AUTOTUNE": "1",                  # honoured
        "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.8",  # ignored: no Gaussian process
        "HOROVOD_THREAD_AFFINITY": "0,1",         # honoured
        "HOROVOD_TIMELINE": "DYNAMIC",            # honoured
        "HOROVOD_DYNAMIC_PROCESS_SETS": "1",      # honoured
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "30",     # ignored by design
        "HOROVOD_FUSION_TRESHOLD": "1",           # a typo
        "PATH": "/bin",
    }
    found = dict(unhonoured(env))
    assert sorted(found) == ["HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "HOROVOD_FUSION_TRESHOLD",
                             "HOROVOD_GLOO_TIMEOUT_SECONDS"]
    for name, message in found.items():
        assert message.startswith(name), message
    assert "Gaussian process" in found["HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"]
    assert "Gloo" in found["HOROVOD_GLOO_TIMEOUT_SECONDS"]
    assert "spelling" in found["HOROVOD_FUSION_TRESHOLD"]
    # The same variables with values hvdlite does honour: nothing to say.
    assert unhonoured({"HOROVOD_AUTOTUNE": "0", "HOROVOD_TIMELINE": "/tmp/t.json",
                       "HOROVOD_CPU_OPERATIONS": "mpi"}) == []
    assert [n for n, _ in unhonoured({"HOROVOD_CPU_OPERATIONS": "CCL"})] == ["HOROVOD_CPU_OPERATIONS"]
    # What Horovod's launcher sets for each worker, hvdlite-run sets too: nothing to say.
    # hvdlite's own engine settings are read under Horovod's prefix too: no warning.
    assert unhonoured({"HOROVOD_SPIN_MICROSECONDS": "10", "HOROVOD_HOST_CHUNK_BYTES": "1048576",
                       "HOROVOD_HUGE_PAGES": "0"}) == []
    assert unhonoured({"HOROVOD_RANK": "1", "HOROVOD_CROSS_SIZE": "2", "HOROVOD_HOSTNAME": "h1"}) == []


SCRIPT = """
import os, hvdlite as hvd
hvd.init()
hvd.init()  # again: no second warning
x = hvd.allreduce(__import__("numpy").ones(3), op=hvd.Sum)
print("rank", hvd.rank(), "sum", x[0], flush=True)
hvd.shutdown()
"""


@pytest.mark.timeout(180)
def test_each_warning_once_per_job(tmp_path: Path) -> None:
    """3 ranks: rank 0 alone warns about each variable hvdlite does not honour, and the
    launcher alone about each value the engine cannot use (every rank then runs with
    the engine's default, without a line of its own)."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.5", "HOROVOD_CCL_CACHE": "1",
           "HOROVOD_MLSL_BGT_AFFINITY": "0",
           "HOROVOD_TIMELINE": "DYNAMIC", "HOROVOD_FUSION_THRESHOLD": "1048576",
           "HOROVOD_CYCLE_TIME": "2", "HOROVOD_STALL_CHECK_TIME_SECONDS": "soon",
           "HVDLITE_HIERARCHICAL_ALGORITHM": "ring", "HOROVOD_CACHE_CAPACITY": "100000"}
    proc = run_job(3, script, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(re.findall(r"rank (\d) sum 3.0", proc.stdout)) == ["0", "1", "2"]
    for name in ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "HOROVOD_CCL_CACHE", "HOROVOD_MLSL_BGT_AFFINITY"):
        assert proc.stderr.count(f"HorovodVariableWarning: {name}=") == 1, (name, proc.stderr)
    for name in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME"):
        assert f"HorovodVariableWarning: {name}" not in proc.stderr, proc.stderr
    for text in ("ignoring HOROVOD_STALL_CHECK_TIME_SECONDS='soon': expected a number",
                 "ignoring HVDLITE_HIERARCHICAL_ALGORITHM='ring': expected torus or leader",
                 "HOROVOD_CACHE_CAPACITY=100000 is above hvdlite's limit"):
        assert proc.stderr.count(text) == 1, (text, proc.stderr)
    assert "] ignoring" not in proc.stderr, proc.stderr  # no rank said it again
    assert not (tmp_path / "DYNAMIC").exists()  # not taken for a timeline file name


# Values the engine cannot use, one per variable it checks, under either name.
BAD_VALUES = {
    "HOROVOD_FUSION_THRESHOLD": "64MB", "HVDLITE_CACHE_CAPACITY": "1e3",
    "HOROVOD_HOST_CHUNK_BYTES": "", "HVDLITE_SPIN_MICROSECONDS": "5.0",
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "99999999999999999999", "HOROVOD_CYCLE_TIME": "fast",
    "HVDLITE_STALL_CHECK_TIME_SECONDS": "1e999", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "1_0",
    "HOROVOD_LOG_LEVEL": "loud", "HVDLITE_THREAD_AFFINITY": "0,,1", "HOROVOD_GPU_OPERATIONS": "DDL",
    "HVDLITE_GPU_ALLREDUCE": "gloo", "HOROVOD_GPU_ALLGATHER": " mpi", "HVDLITE_HIERARCHICAL_ALGORITHM": "ring",
    "HVDLITE_HIERARCHICAL_CROSS": "tcp", "HVDLITE_RING_MIN_SEGMENT_BYTES": "+",
    "HOROVOD_FUSION_DIRECT_BYTES": "0x10", "HOROVOD_HIERARCHICAL_CHUNK_BYTES": "12 34",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "ten", "HVDLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "-",
}
# Values it reads, spelled as unusually as it allows.
GOOD_VALUES = {
    "HOROVOD_FUSION_THRESHOLD": " 1048576 ", "HVDLITE_CYCLE_TIME": "0x1p1",
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "1e3", "HOROVOD_LOG_LEVEL": "WARN",
    "HVDLITE_THREAD_AFFINITY": " 0", "HOROVOD_GPU_OPERATIONS": "", "HVDLITE_GPU_ALLREDUCE": "mpi",
    "HVDLITE_HIERARCHICAL_ALGORITHM": "LEADER", "HOROVOD_SPIN_MICROSECONDS": "+0",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "-2.5e1",
}
ENGINE_PROBE = "import hvdlite as hvd; hvd.init(); hvd.shutdown(); print('probe done', flush=True)"


def _engine_reports(env: dict[str, str]) -> str:
    """What the engine itself prints at hvd.init() in one process with ``env``."""
    proc = subprocess.run([sys.executable, "-c", ENGINE_PROBE], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=job_env({"HVDLITE_LOG_LEVEL": None, **env}))
    assert proc.returncode == 0 and "probe done" in proc.stdout, proc.stderr
    return proc.stderr


@pytest.mark.timeout(300)
def test_value_rules_are_the_engines() -> None:
    """bad_engine_values() finds exactly the variables the engine reports, checked by
    starting the engine on those values (and on valid ones it reports nothing about)."""
    bad = horovod_env.bad_engine_values(BAD_VALUES)
    assert sorted(b.name for b in bad) == sorted(BAD_VALUES)
    reported = re.findall(r"\[hvdlite WARNING rank 0\] ignoring ([A-Z_]+)=", _engine_reports(BAD_VALUES))
    assert sorted(reported) == sorted(BAD_VALUES)
    assert all(b.replace == {b.name: None} for b in bad)
    assert horovod_env.bad_engine_values(GOOD_VALUES) == []
    over = {**GOOD_VALUES, "HVDLITE_CACHE_CAPACITY": "100000"}
    report = _engine_reports(over)
    assert "] ignoring" not in report, report
    assert "HOROVOD_CACHE_CAPACITY=100000 is above hvdlite's limit; using 65536" in report
    (capacity,) = horovod_env.bad_engine_values(over)
    assert capacity.replace == {"HVDLITE_CACHE_CAPACITY": "65536"}


def test_launcher_passes_on_what_the_engine_would_use() -> None:
    """A bad value is said once by hvdlite-run and not given to the ranks, under either
    name: the engine ignores HOROVOD_X too when HVDLITE_X is bad."""
    from hvdlite.runner.command import build_mpirun_command
    from hvdlite.runner.config import LaunchConfig
    environ = {"PATH": "/bin", "HVDLITE_CYCLE_TIME": "fast", "HOROVOD_CYCLE_TIME": "3",
               "HOROVOD_CACHE_CAPACITY": "70000", "HOROVOD_FUSION_THRESHOLD": "1024"}
    notes: list[str] = []
    argv, env = build_mpirun_command(LaunchConfig(num_proc=2, command=["t"]), "mpirun", environ,
                                     is_root=False, notes=notes)
    assert "HVDLITE_CYCLE_TIME" not in env and "HOROVOD_CYCLE_TIME" not in env
    assert env["HOROVOD_CACHE_CAPACITY"] == "65536" and env["HOROVOD_FUSION_THRESHOLD"] == "1024"
    assert "HOROVOD_CYCLE_TIME" not in argv and "HOROVOD_CACHE_CAPACITY" in argv
    said = [n for n in notes if "CYCLE_TIME" in n or "CACHE_CAPACITY" in n]
    assert said == ["HOROVOD_CACHE_CAPACITY=70000 is above hvdlite's limit; every rank uses 65536 "
                    "(each cycle carries two bits per entry)",
                    "ignoring HVDLITE_CYCLE_TIME='fast': expected a number; every rank uses the default"]
