"""The core engine through the real launcher (hvdlite-run), with 1 to 4 ranks."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.core.launch import HERE, assert_all_ranks_passed, run_ranks
from tests.launch import run_job


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_all_collectives_match_numpy(n: int) -> None:
    proc = run_ranks(n, "core_checks.py", timeout=300)
    assert_all_ranks_passed(proc, n)
    for check in ("check_allreduce", "check_ring_allreduce", "check_fusion", "check_gather_bcast",
                  "check_alltoall_reducescatter", "check_barrier_join", "check_response_cache", "check_errors",
                  "check_restart", "check_caller_runs_engine", "check_cycles_carry_small_allreduces",
                  "check_fused_response_wakes_waiter_once", "check_shutdown_finishes_what_every_rank_submitted",
                  "check_persistent_requests", "check_request_calls_refuse_malformed_arguments"):
        for r in range(n):
            assert f"PASS {check} rank {r}" in proc.stdout


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_allreduce_down_to_one_element_per_rank(n: int) -> None:
    """With the ring's threshold at one byte, every allreduce of at least one element per
    rank runs on hvdlite's ring: all dtypes and ops, scale factors, fused sets, joins."""
    proc = run_ranks(n, "core_checks.py", "check_ring_allreduce", "check_allreduce", "check_fusion",
                     "check_barrier_join", env={"HVDLITE_RING_MIN_SEGMENT_BYTES": "1"}, timeout=300)
    assert_all_ranks_passed(proc, n)


def test_fusion_in_small_pieces_and_without_cache() -> None:
    """Tiny fusion threshold and host chunk: many pieces, tensors split across chunks."""
    proc = run_ranks(3, "core_checks.py", "check_fusion", "check_allreduce",
                     env={"HVDLITE_FUSION_THRESHOLD": "65536", "HVDLITE_HOST_CHUNK_BYTES": "16384",
                          "HVDLITE_CACHE_CAPACITY": "0"})
    assert_all_ranks_passed(proc, 3)


def test_one_off_names_leave_the_response_cache_free() -> None:
    proc = run_ranks(2, "core_checks.py", "check_response_cache", env={"HVDLITE_CACHE_CAPACITY": "4"})
    assert_all_ranks_passed(proc, 2)


def test_horovod_environment_names_are_honoured() -> None:
    proc = run_ranks(2, "core_checks.py", "check_fusion",
                     env={"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CACHE_CAPACITY": "1"})
    assert_all_ranks_passed(proc, 2)


def test_plain_mpirun_works() -> None:
    mpirun = Path(sys.executable).parent / "mpirun"
    mpirun_cmd = str(mpirun) if mpirun.exists() else shutil.which("mpirun")
    assert mpirun_cmd, "mpirun not found"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run([mpirun_cmd, "--oversubscribe", "-np", "2", sys.executable,
                           str(HERE / "core_checks.py"), "check_gather_bcast"],
                          env=env, capture_output=True, text=True, timeout=180)
    assert_all_ranks_passed(proc, 2)


def test_bad_environment_values_under_plain_mpirun_are_said_once() -> None:
    """Without hvdlite-run the engine reads the values itself: rank 0 alone says what it
    ignores, once."""
    mpirun = Path(sys.executable).parent / "mpirun"
    mpirun_cmd = str(mpirun) if mpirun.exists() else shutil.which("mpirun")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **BAD_VALUES)
    proc = subprocess.run([mpirun_cmd, "--oversubscribe", "-np", "3", sys.executable,
                           str(HERE / "core_checks.py"), "check_fusion"],
                          env=env, capture_output=True, text=True, timeout=180)
    assert_all_ranks_passed(proc, 3)
    for message in BAD_VALUE_MESSAGES:
        assert proc.stderr.count(message) == 1, (message, proc.stderr[-3000:])
        assert f"[hvdlite WARNING rank 0] {message}" in proc.stderr


def test_init_on_communicator_and_rank_list() -> None:
    proc = run_ranks(3, "init_job.py")
    assert_all_ranks_passed(proc, 3)


def test_dynamic_process_sets_asked_at_init_hold_when_loaded_later() -> None:
    proc = run_ranks(3, "dynamic_sets_job.py")
    assert_all_ranks_passed(proc, 3)


def test_children_of_a_rank_get_a_clear_error() -> None:
    """A forked child cannot run collectives, and a spawned child that re-runs the
    script's top level cannot init; both say why, and the ranks carry on."""
    proc = run_ranks(2, "child_job.py")
    assert_all_ranks_passed(proc, 2)
    assert proc.stderr.count("a child cannot join its parent's job") == 2, proc.stderr[-3000:]
    assert "if __name__ == '__main__':" in proc.stderr


def _faults_per_round(proc: subprocess.CompletedProcess, n: int) -> list[list[int]]:
    assert_all_ranks_passed(proc, n)
    rows = [ln.split(" ", 3)[3] for ln in proc.stdout.splitlines() if ln.startswith("FAULTS rank ")]
    assert len(rows) == n, proc.stdout
    return [json.loads(r) for r in rows]


def test_memory_freed_between_steps_is_not_faulted_back_in() -> None:
    """A thread that allocates and frees 81 MB per step keeps its memory after init().
    The control run sets hvdlite's mmap and trim thresholds but not its top pad (its own
    tuning is then off): glibc unmaps one heap per step there, and every later step
    faults 18 MB back in. That shows the check can fail."""
    for per_rank in _faults_per_round(run_ranks(2, "malloc_job.py"), 2):
        assert max(per_rank[1:]) < 256, per_rank  # first round: ~20,700 faults
    control = run_ranks(1, "malloc_job.py", env={"MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                                                 "MALLOC_TRIM_THRESHOLD_": str(64 << 20)})
    assert min(_faults_per_round(control, 1)[0][1:]) > 2000


def _huge_pages(proc: subprocess.CompletedProcess, n: int) -> list[dict[str, int]]:
    assert_all_ranks_passed(proc, n)
    rows = [ln.split()[3:] for ln in proc.stdout.splitlines() if ln.startswith("HUGEPAGES rank ")]
    assert len(rows) == n, proc.stdout
    return [{k: int(v) for k, v in (field.split("=") for field in row)} for row in rows]


def test_reused_allreduce_buffers_move_to_huge_pages() -> None:
    """A buffer allreduced in place three times is remapped onto 2 MiB pages (its four
    extents, once seen a second time) and keeps the right sums; HVDLITE_HUGE_PAGES=0
    leaves it on 4 KiB pages. Where the kernel cannot collapse pages (before Linux 6.1,
    or THP off), the engine must not count any, and the test says so."""
    on = _huge_pages(run_ranks(2, "hugepage_job.py"), 2)
    off = _huge_pages(run_ranks(2, "hugepage_job.py", env={"HVDLITE_HUGE_PAGES": "0"}), 2)
    for row in off:
        assert row["extents"] == 0, off
    if not on[0]["can"]:
        for row in on:
            assert row["extents"] == 0, on
        pytest.skip("this kernel cannot collapse pages into huge pages (MADV_COLLAPSE); checked "
                    "only that hvdlite counted none")
    for row in on:
        assert row["extents"] == 4, on
        assert row["after_kib"] >= 4 * 2048, on
    # Unless THP is "always" (then the mapping starts on huge pages), the buffer starts on
    # small pages and only the engine moves it: with it off, it stays there.
    if on[0]["before_kib"] == 0 and off[0]["before_kib"] == 0:
        for row in off:
            assert row["after_kib"] == 0, off


BAD_VALUES = {"HVDLITE_FUSION_THRESHOLD": "64MB", "HOROVOD_CYCLE_TIME": "fast",
              "HVDLITE_HIERARCHICAL_ALGORITHM": "ring", "HVDLITE_HIERARCHICAL_CROSS": "ib"}
BAD_VALUE_MESSAGES = ("ignoring HVDLITE_FUSION_THRESHOLD='64MB': expected an integer",
                      "ignoring HOROVOD_CYCLE_TIME='fast': expected a number",
                      "ignoring HVDLITE_HIERARCHICAL_ALGORITHM='ring': expected torus or leader",
                      "ignoring HVDLITE_HIERARCHICAL_CROSS='ib': expected mpi or nccl")


def test_bad_environment_values_are_reported_and_log_level_applies() -> None:
    """A value that does not parse is named and ignored (the default applies: 64MB
    is not read as 64 bytes), once for the job (hvdlite-run says it; the ranks get the
    defaults); HVDLITE_LOG_LEVEL=debug shows the engine's decisions."""
    proc = run_ranks(3, "core_checks.py", "check_fusion", env={**BAD_VALUES, "HVDLITE_LOG_LEVEL": "debug"})
    assert_all_ranks_passed(proc, 3)
    err = proc.stderr
    for message in BAD_VALUE_MESSAGES:
        assert err.count(message) == 1, (message, err[-3000:])
    for r in range(3):
        assert f"[hvdlite INFO rank {r}] engine started: rank {r} of 3" in err, err[-3000:]
        assert "fusion threshold 134217728 B" in err
        assert f"[hvdlite DEBUG rank {r}] executing" in err, err[-3000:]
    quiet = run_ranks(2, "core_checks.py", "check_fusion", env={"HVDLITE_LOG_LEVEL": "warning"})
    assert_all_ranks_passed(quiet, 2)
    assert "[hvdlite DEBUG" not in quiet.stderr and "[hvdlite INFO" not in quiet.stderr


def test_timeline_records_every_phase(tmp_path: Path) -> None:
    trace, runtime_trace = tmp_path / "trace.json", tmp_path / "runtime.json"
    proc = run_ranks(2, "timeline_job.py", str(runtime_trace), env={"HVDLITE_TIMELINE": str(trace)})
    assert_all_ranks_passed(proc, 2)
    events = json.loads(trace.read_text())  # valid JSON after a normal shutdown
    names = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    for tensor in ["grad.0", "grad.5", "grad.big", "gathered", "bcast"]:
        assert tensor in names, f"{tensor} missing from the timeline"
    phases: dict[str, set[str]] = {}
    for e in events:
        if e.get("ph") == "X":
            phases.setdefault(e["pid"], set()).add(e["name"])
    # Small gradients are fused (copied in and out of the fusion buffer), or, when a
    # cycle carries one, reduced inside the cycle that agreed on it.
    small = [phases[names[f"grad.{i}"]] for i in range(6)]
    assert all({"NEGOTIATE_ALLREDUCE", "QUEUE"} <= p and p & {"MPI_ALLREDUCE", "CYCLE_ALLREDUCE"} for p in small), small
    assert any({"MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"} <= p for p in small), small
    assert any("CYCLE_ALLREDUCE" in p for p in small), small
    assert {"NEGOTIATE_ALLREDUCE", "MPI_ALLREDUCE"} <= phases[names["grad.big"]]
    assert "MEMCPY_IN_FUSION_BUFFER" not in phases[names["grad.big"]]  # goes alone, no copy
    assert {"NEGOTIATE_ALLGATHER", "MPI_ALLGATHER"} <= phases[names["gathered"]]
    assert "MEMCPY_IN_FUSION_BUFFER" not in phases[names["gathered"]]  # alone, no copy
    fused_gathers = [t for t in (f"gathered.{i}" for i in range(6))
                     if {"MEMCPY_IN_FUSION_BUFFER", "MPI_ALLGATHER", "MEMCPY_OUT_FUSION_BUFFER"} <= phases[names[t]]]
    assert len(fused_gathers) >= 2, phases[names["gathered.1"]]
    negotiations = [e for e in events if e["name"] == "NEGOTIATE_ALLREDUCE"]
    # Negotiated by rank 0: when each rank's request arrived; agreed in a cycle: which one.
    full = [e for e in negotiations if "ready_ranks_us" in e["args"]]
    cycled = [e for e in negotiations if "cycle" in e["args"]]
    assert full and len(full) + len(cycled) == len(negotiations), negotiations[:3]
    assert all(set(e["args"]["ready_ranks_us"]) == {"0", "1"} for e in full)
    assert all(e["args"]["cycle"] >= 1 for e in cycled)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in events if e.get("ph") == "X")
    runtime = json.loads(runtime_trace.read_text())
    assert any(e["name"] == "CYCLE_START" for e in runtime)
    assert any(e["name"] == "process_name" and e["args"]["name"] == "runtime.tensor" for e in runtime)
    assert not any(e["name"] == "process_name" and e["args"]["name"] == "grad.0" for e in runtime)


def test_timeline_records_every_process_set(tmp_path: Path) -> None:
    """Rank 0's trace holds the global set's collectives and every process set's, those
    of sets without rank 0 too (their own rank 0 sends them), named NAME (process set ID)."""
    trace = tmp_path / "sets.json"
    proc = run_job(3, HERE / "timeline_sets_job.py", str(trace), cwd=tmp_path,
                   env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert_all_ranks_passed(proc, 3)
    events = json.loads(trace.read_text())
    names = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    phases: dict[int, set[str]] = {}
    for e in events:
        if e.get("ph") == "X":
            phases.setdefault(e["pid"], set()).add(e["name"])
    assert {"shared.name", "shared.name (process set 1)", "set.gather (process set 1)",
            "dynamic.bcast (process set 3)", "after.removal", "not.on.zero (process set 2)",
            "late.not.on.zero (process set 2)"} <= set(names), names
    assert "ALLREDUCE" in " ".join(phases[names["not.on.zero (process set 2)"]])
    assert "NEGOTIATE_ALLREDUCE" in phases[names["not.on.zero (process set 2)"]]
    assert "ALLREDUCE" in " ".join(phases[names["shared.name (process set 1)"]])
    assert "ALLGATHER" in " ".join(phases[names["set.gather (process set 1)"]])
    assert "BROADCAST" in " ".join(phases[names["dynamic.bcast (process set 3)"]])
    assert "ALLREDUCE" in " ".join(phases[names["after.removal"]])


@pytest.mark.parametrize("n", [2, 3])
def test_a_blocked_collective_can_be_interrupted(n: int) -> None:
    """A signal handler's exception (here SIGALRM's; Ctrl-C's KeyboardInterrupt alike)
    ends a wait for a collective that another rank has not submitted yet, within the
    engine's 100 ms slices; the request stays in flight and completes later, and the
    library goes on."""
    proc = run_ranks(n, "interrupt_job.py", timeout=120)
    assert_all_ranks_passed(proc, n)


def test_thread_affinity_pins_each_background_thread() -> None:
    proc = run_ranks(2, "affinity_job.py", env={"HOROVOD_THREAD_AFFINITY": "1,0"})
    assert_all_ranks_passed(proc, 2)


def test_dynamic_timeline_writes_only_what_is_started_at_run_time(tmp_path: Path) -> None:
    """HOROVOD_TIMELINE=DYNAMIC (Horovod's): no file at init, a trace from
    start_timeline to stop_timeline, on 4 ranks (rank 0 writes it)."""
    runtime_trace = tmp_path / "runtime.json"
    proc = run_job(4, HERE / "timeline_job.py", str(runtime_trace), cwd=tmp_path,
                   env={"HOROVOD_TIMELINE": "DYNAMIC"})
    assert_all_ranks_passed(proc, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runtime.json"]  # no file named DYNAMIC
    runtime = json.loads(runtime_trace.read_text())
    names = {e["args"]["name"] for e in runtime if e["name"] == "process_name"}
    assert names == {"runtime.tensor"}, names
    assert any(e["name"] == "CYCLE_START" for e in runtime)


def test_stop_timeline_after_rank_zero_shut_down_does_nothing() -> None:
    """A rank whose closing stop_timeline() comes after rank 0's shutdown has ended every
    engine is not failed for it (the timeline is closed); start_timeline still refuses.
    Two CI runs failed on this race in core_checks.py and timeline_job.py."""
    proc = run_job(3, HERE / "late_stop_timeline_job.py")
    assert_all_ranks_passed(proc, 3)


def run_stall_job(*args: str, warnings: tuple[str, ...]):
    """stall_job.py on 3 ranks with a 1 s stall check and a 3 s shutdown: the job ends
    cleanly, rank 0 warned with each of `warnings`, and every rank got the error."""
    proc = run_ranks(3, "stall_job.py", *args, env={"HVDLITE_STALL_CHECK_TIME_SECONDS": "1",
                                                    "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "3"}, timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for warning in warnings:
        assert warning in proc.stderr, out
    for r in range(3):
        assert f"rank {r} GOT ERROR" in proc.stdout, out
        assert f"rank {r} exiting" in proc.stdout, out
    return proc


@pytest.mark.parametrize("how", ["new", "cached"])
def test_stall_inspector_warns_then_shuts_down_every_rank(how: str) -> None:
    proc = run_stall_job(*([how] if how == "cached" else []),
                         warnings=("stall detected: allreduce 'stalled.tensor'",
                                   "submitted by ranks [0, 1], missing ranks [2 ("))
    assert proc.stdout.count("stalled.tensor") >= 3


def test_stall_inspector_names_members_of_a_group_no_rank_sent() -> None:
    """Members of a grouped allreduce held by rank 0 for a member no rank submits are
    reported (they are in no table of pending tensors) and end the job like a stall."""
    run_stall_job("group", warnings=("stall detected: grouped allreduce 'short.group.0' (and 1 more)",
                                     "for the other 1 of its 3 members, which no rank has submitted"))


def test_killed_rank_ends_the_job_quickly() -> None:
    start = time.time()
    proc = run_ranks(2, "kill_job.py", timeout=60)
    end = time.time()
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    killed_at = float(out.split("KILLING at ")[1].split()[0])
    assert end - killed_at < 10, f"job took {end - killed_at:.1f}s to end after the kill"
    assert end - start < 60


def test_calls_before_init_raise_clearly() -> None:
    code = ("import numpy as np, hvdlite as hvd\n"
            "for f in (hvd.rank, hvd.size, lambda: hvd.allreduce(np.ones(2))):\n"
            "    try:\n        f()\n    except hvd.NotInitializedError as e:\n        print('ERR', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("ERR hvdlite has not been initialized; call hvd.init() first") == 3
