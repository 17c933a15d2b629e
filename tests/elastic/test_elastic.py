"""Elastic training through the real launcher: ``hvdlite-run -np 4 --min-np 2 --max-np 4``.

A worker (any rank, rank 0 included) kills itself with SIGKILL mid-training; the
survivors must finish in the same processes, from the last commit, as a world of
their own with identical parameters, and every sample of every epoch must have been
committed as processed (none lost to the reshard).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.gpu.test_gpu import fake_cuda, gpu_env  # noqa: F401  (fake_cuda is a fixture)
from tests.launch import REPO, job_env, kill_tree, run_job

WORKERS = Path(__file__).parent / "workers"
TRAIN = WORKERS / "torch_elastic_train.py"
ELASTIC = ["--min-np", "2", "--max-np", "4"]


def _results(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def _run(tmp_path: Path, n: int, kill: str, *args: str, launcher: list[str] = ELASTIC,
         timeout: float = 240, env: dict[str, str] | None = None) -> tuple[object, list[dict]]:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_job(n, TRAIN, "--out", str(out), *args, env={"HVDLITE_TEST_KILL": kill, **(env or {})},
                   launcher_args=launcher, timeout=timeout)
    return proc, _results(out)


def _check_survivors(proc, results: list[dict], n: int, dead: set[int], samples: int = 480) -> None:
    detail = f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{detail}"
    survivors = sorted(r["first_rank"] for r in results)
    assert survivors == sorted(set(range(n)) - dead), f"survivors {survivors}\n{detail}"
    left = n - len(dead)
    # A world of the survivors: ranks 0..left-1 in their old order.
    by_first = sorted(results, key=lambda r: r["first_rank"])
    assert [r["rank"] for r in by_first] == list(range(left)), by_first
    assert all(r["size"] == left for r in results)
    # Horovod's HOROVOD_RANK, HOROVOD_SIZE, ... were set again for the new world.
    assert all(r["horovod_env"] == r["horovod_env_expected"] for r in results), \
        [(r["horovod_env"], r["horovod_env_expected"]) for r in results]
    # Identical parameters everywhere, and as many resets as workers lost.
    assert len({r["params_sha"] for r in results}) == 1, [r["params_sha"] for r in results]
    assert all(len(r["resets"]) == len(dead) for r in results), [r["resets"] for r in results]
    # The step counter is part of the committed state: equal everywhere.
    assert len({r["steps"] for r in results}) == 1
    # Every epoch's committed samples, over all ranks, are the whole dataset.
    for epoch, per_rank in results[0]["epoch_samples"].items():
        seen = set(i for part in per_rank for i in part)
        assert seen == set(range(samples)), f"epoch {epoch}: {samples - len(seen)} sample(s) never processed"
    _check_each_sample_trained_once(results[0], samples)
    # Training went somewhere (the loss of the initial model is ~1-3 on this data).
    assert results[0]["loss"] < 0.5, results[0]["loss"]


def _check_each_sample_trained_once(result: dict, samples: int) -> None:
    """In every epoch's committed steps, each sample was trained exactly once, over all
    ranks and across the reshards that losing or adding workers caused."""
    assert result["epoch_trained"], "no epoch finished"
    for epoch, trained in result["epoch_trained"].items():
        counts = Counter(trained)
        repeated = sorted(i for i, c in counts.items() if c > 1)
        lost = sorted(set(range(samples)) - set(counts))
        assert not repeated and not lost, f"epoch {epoch}: repeated {repeated}, lost {lost}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("victim", [0, 2])
def test_survivors_finish_when_a_rank_dies(tmp_path: Path, victim: int) -> None:
    proc, results = _run(tmp_path, 4, f"{victim}:20")
    _check_survivors(proc, results, 4, {victim})
    # The failure was reported as the lost rank, on the survivors.
    assert f"rank {victim} of 4 failed" in proc.stderr
    # No survivor calls it an error (the engine's own line is at INFO in an elastic job).
    assert "[hvdlite ERROR" not in proc.stderr, proc.stderr[-4000:]
    # One warning for the job says what happens next: the commit every rank made just
    # before the victim died at step 20 (a commit every 2 steps) is where training goes on.
    said = re.findall(r"\[hvdlite WARNING rank 0\] rank (\d) of 4 failed; continuing with 3 workers "
                      r"from commit \d+ \(epoch=\d+, batch=\d+, steps=(\d+)\)\n", proc.stderr)
    assert said == [(str(victim), "20")], proc.stderr[-4000:]
    # The survivors leave without waiting in MPI_Finalize for the dead process.
    assert "MPI_Finalize did not finish" not in proc.stderr


@pytest.mark.timeout(300)
def test_a_rank_that_raises_leaves_and_the_others_go_on(tmp_path: Path) -> None:
    """A training script that fails with an exception on one rank: as with Horovod's
    elastic driver, that worker is lost and the others go on from the last commit
    (Open MPI's fault tolerance only reports processes that died, not ones that exited
    with an error status, so the survivors must not be left waiting for it)."""
    proc, results = _run(tmp_path, 4, "1:20", env={"HVDLITE_TEST_KILL_BY": "raise"})
    _check_survivors(proc, results, 4, {1})
    assert "RuntimeError: the test's failure at step 20" in proc.stderr
    assert "rank 1 leaves the elastic job on the uncaught RuntimeError above" in proc.stderr
    assert "rank 1 of 4 failed; continuing with 3 workers" in proc.stderr, proc.stderr[-4000:]


@pytest.mark.timeout(300)
def test_a_job_whose_every_worker_fails_ends_with_an_error(tmp_path: Path) -> None:
    """Every worker raises at the same step: none is left to finish, so the job fails
    (mpirun alone would report 0: under fault tolerance a lost worker is no error)."""
    proc, results = _run(tmp_path, 2, "0:6,1:6", env={"HVDLITE_TEST_KILL_BY": "raise"},
                         launcher=["--min-np", "1", "--max-np", "2"])
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert not results
    assert "the elastic job ended without finishing its training" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.timeout(300)
def test_a_full_disk_while_rank_0_saves_a_checkpoint(tmp_path: Path) -> None:
    """Rank 0 saves a checkpoint every 10 steps (a temporary file, then a rename) to a
    1 MiB tmpfs, which fills up before step 20: its save fails with the disk's error,
    which nothing in the script catches, so rank 0 leaves like a failed worker and the
    others go on from the last commit, the new rank 0 saving to its own disk. The
    checkpoint saved before the disk filled up is intact."""
    if os.geteuid() != 0:
        pytest.skip("needs root (mounts a tmpfs)")
    checkpoints = tmp_path / "checkpoints"
    small = checkpoints / "w0"
    small.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        proc, results = _run(tmp_path, 3, "", "--checkpoint", str(checkpoints),
                             launcher=["--min-np", "2", "--max-np", "3"], env={"HVDLITE_TEST_FILL_DISK": "15"})
        _check_survivors(proc, results, 3, {0})
        # torch.save's error on a full disk (its wording varies), then rank 0 leaves.
        assert "in save_checkpoint" in proc.stderr, proc.stderr[-4000:]
        assert "rank 0 leaves the elastic job on the uncaught" in proc.stderr, proc.stderr[-4000:]
        assert "rank 0 of 3 failed; continuing with 2 workers" in proc.stderr, proc.stderr[-4000:]
        import torch
        kept = torch.load(small / "checkpoint.pt")
        assert kept["steps"] == 10, kept["steps"]
        last = torch.load(checkpoints / "w1" / "checkpoint.pt")
        assert last["steps"] == max(s for s in range(0, results[0]["steps"] + 1, 10)), \
            (last["steps"], results[0]["steps"])
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


@pytest.mark.parametrize("hung", [1, 0])
@pytest.mark.timeout(300)
def test_a_rank_deadlocked_in_the_script_is_evicted_past_the_stall_limit(tmp_path: Path, hung: int) -> None:
    """A rank whose training script deadlocks (hvdlite's own thread goes on answering,
    so no failure detector sees it) misses its collectives: past the stall shutdown
    time rank 0 asks hvdlite-run to end its process, and the others go on from the last
    commit. Rank 0 itself may be the one: it asks for its own end."""
    stall = ["--stall-check-warning-time-seconds", "1", "--stall-check-shutdown-time-seconds", "4"]
    proc, results = _run(tmp_path, 3, f"{hung}:20", launcher=["--min-np", "2", "--max-np", "3", *stall],
                         env={"HVDLITE_TEST_KILL_BY": "hang"})
    _check_survivors(proc, results, 3, {hung})
    said = f"ranks [{hung} ("
    assert said in proc.stderr and "missed collectives for longer than the stall shutdown time" in proc.stderr, \
        proc.stderr[-4000:]
    assert f"rank {hung} of 3 failed; continuing with 2 workers" in proc.stderr, proc.stderr[-4000:]
    assert "[hvdlite-run request]" not in proc.stdout


@pytest.mark.parametrize("optimizer", ["zero", "zero3"])
@pytest.mark.timeout(300)
def test_zero_optimizer_reshards_when_a_rank_dies(tmp_path: Path, optimizer: str) -> None:
    """ZeroRedundancyOptimizer(Adam) in a TorchState: rank 1 dies with its share of the
    optimizer state (at stage 3 also of the parameters); the survivors shard again over
    3 ranks and load the whole committed state, so every parameter's Adam step count
    equals the committed steps (a share lost and rebuilt empty would count from 0), and
    they finish with the same parameters."""
    proc, results = _run(tmp_path, 4, "1:20", "--optimizer", optimizer)
    _check_survivors(proc, results, 4, {1})
    steps = results[0]["steps"]
    for r in results:
        assert r["optimizer_steps"] == [float(steps)], (r["optimizer_steps"], steps)
        assert r["optimizer_params"] == 4 and r["shards"] == [r["rank"], 3], r


@pytest.mark.timeout(300)
def test_one_bit_adam_follows_the_new_world_when_a_rank_dies(tmp_path: Path) -> None:
    """OneBitAdam in a TorchState, compressing from step 11; rank 2 dies at step 20: the
    survivors lay their error buffers out for 3 ranks, keep compressing and finish with
    equal parameters, the committed step count, and no warning about another rank's
    buffers (each keeps its own)."""
    proc, results = _run(tmp_path, 4, "2:20", "--optimizer", "onebit")
    _check_survivors(proc, results, 4, {2})
    steps = results[0]["steps"]
    for r in results:
        assert r["optimizer_steps"] == [steps], (r["optimizer_steps"], steps)
        rank, size, worker, server = r["error_layout"]
        assert (rank, size) == (r["rank"], 3) and worker % (8 * 3) == 0 and server * 3 == worker, r
    assert "error-feedback buffers" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.timeout(300)
def test_two_ranks_die_at_different_times(tmp_path: Path) -> None:
    proc, results = _run(tmp_path, 4, "1:12,0:40")
    _check_survivors(proc, results, 4, {0, 1})


@pytest.mark.timeout(300)
def test_a_second_worker_dies_during_the_recovery(tmp_path: Path) -> None:
    """Rank 2 of 4 dies; while the others recover, the new rank 0 (old rank 0) dies in
    its reset callback: the two left recover again and finish alike."""
    out = tmp_path / "out"
    out.mkdir()
    proc = run_job(4, TRAIN, "--out", str(out), env={"HVDLITE_TEST_KILL": "2:20", "HVDLITE_TEST_KILL_IN_RESET": "0"},
                   launcher_args=ELASTIC, timeout=240)
    _check_survivors(proc, _results(out), 4, {0, 2})


@pytest.mark.timeout(300)
def test_below_min_np_ends_the_job_with_the_reason(tmp_path: Path) -> None:
    proc, results = _run(tmp_path, 3, "2:10", launcher=["--min-np", "3", "--max-np", "3",
                                                        "--elastic-timeout", "2"])
    assert proc.returncode != 0
    assert not results
    assert "fewer than --min-np 3" in proc.stderr and "--elastic-timeout 2 s" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.timeout(300)
def test_reset_limit_ends_the_job_with_the_reason(tmp_path: Path) -> None:
    proc, results = _run(tmp_path, 4, "3:10,2:30", launcher=ELASTIC + ["--reset-limit", "1"])
    assert proc.returncode != 0
    assert not results
    assert "more than --reset-limit 1" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.timeout(120)
def test_without_elastic_options_a_failure_still_ends_the_job(tmp_path: Path) -> None:
    proc, results = _run(tmp_path, 3, "1:5", launcher=[], timeout=60)
    assert proc.returncode != 0
    assert not results


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["fit", "loop"])
def test_keras_survivors_finish_when_a_rank_dies(tmp_path: Path, mode: str) -> None:
    """KerasState with the Keras callbacks under model.fit, and TensorFlowKerasState
    under a custom tf.function loop: rank 1 of 3 dies, 2 finish alike."""
    out = tmp_path / "out"
    out.mkdir()
    proc = run_job(3, WORKERS / "keras_elastic_train.py", "--mode", mode, "--out", str(out),
                   env={"HVDLITE_TEST_KILL": "1:7"}, launcher_args=["--min-np", "2", "--max-np", "3"],
                   timeout=240)
    detail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, detail
    results = _results(out)
    assert sorted(r["first_rank"] for r in results) == [0, 2], detail
    assert sorted(r["rank"] for r in results) == [0, 1] and all(r["size"] == 2 for r in results)
    assert len({r["weights_sha"] for r in results}) == 1
    assert all(r["resets"] == [2] for r in results)
    assert results[0]["loss"] < 4.0, results[0]["loss"]  # ~8 before training


def _discovery(tmp_path: Path, text: str) -> tuple[Path, Path]:
    """A discovery script printing the file ``hosts.txt`` (which the test or the
    training script rewrites), as Horovod's examples do."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(text)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    return hosts, script


def _grow_by_one(tmp_path: Path, n: int) -> tuple[list[dict], str]:
    """Start `n` workers (``--min-np n --max-np n+1``); at step 10 the discovery script
    offers one more slot. Returns every worker's results once the job has succeeded."""
    hosts, script = _discovery(tmp_path, f"localhost:{n}\n")
    out = tmp_path / "out"
    out.mkdir()
    # 6 epochs of 30 steps at >= 30 ms: seconds of training after the offer, for the
    # discovery script (run once a second) to see it and a commit to act on it.
    proc = run_job(n, TRAIN, "--out", str(out), "--epochs", "6", "--step-sleep", "0.03",
                   env={"HVDLITE_TEST_OFFER": f"10:{hosts}:localhost:{n + 1}"},
                   launcher_args=["--min-np", str(n), "--max-np", str(n + 1), "--host-discovery-script", str(script)],
                   timeout=240)
    detail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, detail
    return _results(out), detail


@pytest.mark.timeout(300)
def test_a_worker_joins_when_a_slot_is_offered(tmp_path: Path) -> None:
    """Start with 2; at step 10 the discovery script offers a 3rd slot: 3 finish alike,
    the new one started into the running job (the others kept their processes)."""
    results, detail = _grow_by_one(tmp_path, 2)
    assert sorted((r["first_rank"], r["joined"]) for r in results) == [(0, False), (1, False), (2, True)], detail
    assert sorted(r["rank"] for r in results) == [0, 1, 2] and all(r["size"] == 3 for r in results)
    assert len({r["params_sha"] for r in results}) == 1
    assert len({r["steps"] for r in results}) == 1
    # The two original workers went through one reset (the join); the new one none.
    assert sorted(len(r["resets"]) for r in results) == [0, 1, 1]
    for epoch, per_rank in results[0]["epoch_samples"].items():
        assert set(i for part in per_rank for i in part) == set(range(480)), f"epoch {epoch}"
    _check_each_sample_trained_once(results[0], 480)


@pytest.mark.timeout(300)
def test_a_job_started_alone_averages_once_a_worker_joins(tmp_path: Path) -> None:
    """Start with 1 (``--min-np 1``); at step 10 a 2nd slot is offered. The optimizer
    built by the lone worker must average gradients with the newcomer from then on (as
    Horovod's does in an elastic job): both end with the same parameters, and each sample
    is trained once per epoch."""
    results, detail = _grow_by_one(tmp_path, 1)
    assert sorted((r["first_rank"], r["joined"]) for r in results) == [(0, False), (1, True)], detail
    assert all(r["size"] == 2 for r in results), detail
    assert len({r["params_sha"] for r in results}) == 1, [r["params_sha"] for r in results]
    _check_each_sample_trained_once(results[0], 480)


@pytest.mark.timeout(300)
def test_a_worker_whose_slot_leaves_the_discovery_output_stops(tmp_path: Path) -> None:
    """Start 3 (``--min-np 2 --max-np 3``); at step 10 the discovery script offers 2
    slots instead of 3. At the next commit the highest rank stops (its process exits
    with status 0), as Horovod stops the workers of a host that left; the other two go
    on from that commit as a world of 2 and finish alike, each sample trained once."""
    hosts, script = _discovery(tmp_path, "localhost:3\n")
    out = tmp_path / "out"
    out.mkdir()
    proc = run_job(3, TRAIN, "--out", str(out), "--epochs", "6", "--step-sleep", "0.03",
                   env={"HVDLITE_TEST_OFFER": f"10:{hosts}:localhost:2"},
                   launcher_args=["--min-np", "2", "--max-np", "3", "--host-discovery-script", str(script)],
                   timeout=240)
    detail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, detail
    results = _results(out)
    assert sorted((r["first_rank"], r["rank"], r["size"]) for r in results) == [(0, 0, 2), (1, 1, 2)], detail
    assert len({r["params_sha"] for r in results}) == 1
    assert len({r["steps"] for r in results}) == 1
    # One reset each (the departure), none for a failure.
    assert all(len(r["resets"]) == 1 for r in results), [r["resets"] for r in results]
    _check_each_sample_trained_once(results[0], 480)
    assert "rank 2 on " in proc.stderr and "stops: the discovery output no longer lists its slot" in proc.stderr, detail
    assert re.search(r"\[hvdlite WARNING rank 0\] rank 2 of 3 stopped \(the discovery output no longer lists "
                     r"their slot on [^)]+\); continuing with 2 workers from commit \d+", proc.stderr), detail
    assert "failed" not in proc.stderr, detail


def _rank_pid(marker: str, rank: int) -> int | None:
    """The pid of the worker whose command line holds ``marker`` and whose Open MPI
    rank is ``rank``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
            if marker.encode() not in command or b"torch_elastic_train" not in command:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"OMPI_COMM_WORLD_RANK={rank}".encode() in f.read().split(b"\0"):
                    return int(entry)
        except OSError:
            continue
    return None


@pytest.mark.timeout(300)
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the worker's process in /proc")
def test_a_worker_resumed_before_anyone_ended_it_ends_itself(tmp_path: Path) -> None:
    """Rank 2 is stopped (SIGSTOP) for 22 s of a 30 s ``--failure-timeout``, and resumed
    before anyone could end it (the launcher's eviction is off: no live output): the
    core's suspension watch sees it missed more than 70 % of the timeout, by when the
    others' detectors may count it failed, and ends it at once; the others go on."""
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "hvdlite.runner", "-np", "3", "--min-np", "2", "--max-np", "3", "--failure-timeout", "30",
           sys.executable, str(TRAIN), "--out", str(out), "--epochs", "6", "--step-sleep", "0.03"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=job_env({"HVDLITE_TEST_PRINT_STEPS": "1", "HVDLITE_LIVE_OUTPUT": "0"}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any(line.startswith("STEP 10 ") for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = _rank_pid(str(out), 2)
        assert pid is not None, "".join(lines[-50:])
        os.kill(pid, signal.SIGSTOP)
        time.sleep(22.0)
        os.kill(pid, signal.SIGCONT)
        rc = proc.wait(timeout=200)
        reader.join(10)
        text = "".join(lines)
        detail = "\n".join(line for line in text.splitlines() if not line.startswith("STEP"))[-4000:]
        assert rc == 0, detail
        assert re.search(rf"the worker with pid {pid} on \S+ was stopped for 2\d\.\d s, too long for the failure "
                         r"timeout \(30 s\).*it exits", text), detail
        assert "rank 2 of 3 failed; continuing with 2 workers" in text, detail
        # The two went on (a new worker may have taken the free slot since), alike.
        results = _results(out)
        assert {0, 1} <= {r["first_rank"] for r in results} and 2 not in {r["first_rank"] for r in results}, detail
        assert len({r["size"] for r in results}) == 1 and len({r["params_sha"] for r in results}) == 1
        _check_each_sample_trained_once(results[0], 480)
    finally:
        kill_tree(proc.pid)


@pytest.mark.timeout(600)
def test_twenty_kills_in_a_row_each_replaced(tmp_path: Path) -> None:
    """20 consecutive kill-and-recover cycles in one job of 4: every 20 steps the worker
    that is then rank k % 4 dies (rank 0 included, and workers that joined), the
    survivors go on from their last commit, and a new worker takes the free slot.
    No hang, no lost commit: the final 4 agree on parameters and on the committed step
    count, which advanced through every cycle."""
    _, script = _discovery(tmp_path, "localhost:4\n")
    out = tmp_path / "out"
    out.mkdir()
    proc = run_job(4, TRAIN, "--out", str(out), "--epochs", "30", "--step-sleep", "0",
                   env={"HVDLITE_TEST_CHAIN": "20:20"},
                   launcher_args=["--min-np", "2", "--max-np", "4", "--blacklist-cooldown-range", "0", "0",
                                  "--host-discovery-script", str(script)],
                   timeout=540)
    detail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    assert proc.returncode == 0, detail
    assert sorted(p.name for p in out.glob("kill-*")) == sorted(f"kill-{k}" for k in range(1, 21))
    results = _results(out)
    assert len(results) == 4 and all(r["size"] == 4 for r in results), detail
    assert len({r["params_sha"] for r in results}) == 1
    steps = {r["steps"] for r in results}
    assert len(steps) == 1 and steps.pop() >= 20 * 20, steps
    assert results[0]["loss"] < 0.5
    # One warning per recovery, each naming the worker lost and the replacement.
    said = re.findall(r"\[hvdlite WARNING rank 0\] rank \d of 4 failed; continuing with (\d) workers"
                      r"(?: \((\d) new\))? from commit", proc.stderr)
    assert len(said) == 20 and all(w in (("3", ""), ("4", "1")) for w in said), said
    # Every process left cleanly: none waited for a dead one in MPI_Finalize, and none
    # was taken by the runtime for one that ended abnormally.
    assert "MPI_Finalize did not finish" not in proc.stderr and "improperly" not in proc.stderr, detail


@pytest.mark.timeout(300)
def test_across_two_emulated_hosts_rank_0_dies_and_a_worker_joins_elsewhere(tmp_path: Path) -> None:
    """2 emulated hosts (network namespaces, 1 Gbit/s): rank 0 on h1 dies; the 3
    survivors go on, and the discovery script's spare slot on h2 gets a new worker."""
    from tests.hosts.emulated import EmulatedHosts, unavailable
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    _, script = _discovery(tmp_path, "h1:2\nh2:3\n")
    out = tmp_path / "out"
    out.mkdir()
    with EmulatedHosts(2, rate="1gbit") as hosts:
        proc = run_job(4, TRAIN, "--out", str(out), "--epochs", "5", "--step-sleep", "0.02",
                       env={**hosts.env(), "HVDLITE_TEST_KILL": "0:20"},
                       launcher_args=["--min-np", "2", "--max-np", "4", "--blacklist-cooldown-range", "0", "0",
                                      "--host-discovery-script", str(script)],
                       timeout=240)
    detail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, detail
    results = _results(out)
    assert sorted((r["first_rank"], r["joined"]) for r in results) == [(1, False), (2, False), (3, False),
                                                                       (3, True)], detail
    assert all(r["size"] == 4 for r in results) and len({r["params_sha"] for r in results}) == 1
    assert "rank 0 of 4 failed" in proc.stderr


@pytest.mark.timeout(300)
def test_gpu_path_goes_on_with_new_nccl_communicators(fake_cuda: Path, tmp_path: Path) -> None:
    """The fake CUDA runtime and NCCL: rank 1 of 3 dies mid-training; the survivors'
    NCCL communicators are aborted with the old engine and made anew for the world of
    2, whose device and host sums are checked exactly."""
    env = gpu_env(fake_cuda, tmp_path, KILL_RANK="1", KILL_STEP="10")
    proc = run_job(3, WORKERS / "gpu_elastic_job.py", env=env, launcher_args=["--min-np", "2", "--max-np", "3"],
                   timeout=240)
    detail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, detail
    oks = sorted(line.split()[5] for line in proc.stdout.splitlines() if line.startswith("GPU ELASTIC OK"))
    assert oks == ["0", "2"], detail
