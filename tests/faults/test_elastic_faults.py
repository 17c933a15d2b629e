"""Faults in an elastic job (``--min-np 2 --max-np 3``) on 3 emulated hosts with one
worker each, training the elastic tests' PyTorch script (``ElasticSampler``,
``TorchState`` committed every 2 steps) while the discovery script keeps listing all
three hosts:

* h3 is cut off from the network: the two others count its worker as failed within
  ``--failure-timeout`` and go on; the cut-off worker, alone and not a majority, stops,
  with its host's daemon, rather than train on as a second job;
* h2's worker is stopped (SIGSTOP): the others go on without it;
* h3 leaves the discovery script's output: its worker stops at the next commit, and
  the others go on;
* h2's worker is stopped for less than the failure timeout, or h3's link flaps: all
  three go on; h2's worker is stopped for longer: the launcher ends its process once
  the others count it failed;
* h2's training script deadlocks while hvdlite's thread goes on: past the stall
  shutdown time rank 0 has the launcher end it, and the others go on;
* every process on h3 is killed (the host dies): mpirun ends the job, and hvdlite-run
  starts it again on h1 and h2 from the commit they kept;
* h3's worker leaks memory under a cgroup limit: the kernel's OOM killer ends it, and
  the others go on;
* h3 appears in the discovery output of a job started on h1 and h2: the job starts
  again on all three from its last commit (Open MPI cannot add a host to a running
  job).

Each time the job ends with status 0, the survivors hold the
same parameters, every sample of every epoch was trained exactly once, and nothing of
the job is left on any host a minute after the launcher exits.

Needs root (network namespaces); skipped with the reason otherwise."""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest

from tests.elastic.test_elastic import TRAIN, _check_each_sample_trained_once
from tests.faults.harness import FaultJob, memory_cgroup_root, oom_kills
from tests.hosts.emulated import EmulatedHosts

FAILURE_TIMEOUT_S = 10.0


def _elastic_job(hosts: EmulatedHosts, tmp_path: Path, listed_hosts: list[str] | None = None,
                 launcher_args: tuple[str, ...] = (), **env: str) -> tuple[FaultJob, Path]:
    """The job, one worker per listed host (every host by default), and its output
    folder; its discovery script prints ``tmp_path/hosts.txt`` (the listed hosts, one
    slot each, until a test rewrites it)."""
    out = tmp_path / "out"
    out.mkdir()
    listed_hosts = listed_hosts or hosts.hosts
    listed = tmp_path / "hosts.txt"
    listed.write_text("".join(f"{h}:1\n" for h in listed_hosts))
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {listed}\n")
    script.chmod(0o755)
    job = FaultJob(hosts, len(listed_hosts), TRAIN, args=["--out", str(out), "--epochs", "12", "--step-sleep", "0.05"],
                   launcher_args=["--min-np", "2", "--max-np", "3", "--host-discovery-script", str(script),
                                  "--failure-timeout", f"{FAILURE_TIMEOUT_S:g}", *launcher_args],
                   env={"HVDLITE_TEST_PRINT_STEPS": "1", **env})
    return job, out


def _ended(job: FaultJob, timeout: float = 240) -> int:
    """The launcher's exit status; fails, with the job's output, if it still runs after
    ``timeout`` s."""
    rc = job.wait(timeout=timeout)
    assert rc is not None, f"the job did not end\n{job.output(300)}"
    return rc


def _longest_gap(times: list[float]) -> float:
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


def _check_survivors(job: FaultJob, out: Path, survivors: set[str], rc: int | None) -> dict[str, float]:
    detail = job.output(300)
    assert rc == 0, f"exit status {rc}\n{detail}"
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert len(results) == len(survivors), (len(results), detail)
    assert all(r["size"] == len(survivors) for r in results), [r["size"] for r in results]
    assert len({r["params_sha"] for r in results}) == 1, detail
    assert len({r["steps"] for r in results}) == 1
    _check_each_sample_trained_once(results[0], 480)
    return {"longest gap": max(_longest_gap(r["completed"]) for r in results)}


@pytest.mark.timeout(300)
def test_a_host_cut_off_is_left_behind_and_stops_alone(hosts: EmulatedHosts, tmp_path: Path) -> None:
    job, out = _elastic_job(hosts, tmp_path)
    job.start()
    try:
        assert job.wait_for_step(30), job.output()
        job.cut("h3")
        t_cut = time.time()
        rc = _ended(job)
        figures = _check_survivors(job, out, {"h1", "h2"}, rc)
        print(f"cut-off host: longest gap between two steps {figures['longest gap']:.1f} s")
        assert figures["longest gap"] <= FAILURE_TIMEOUT_S + 5, figures
        assert any("failed; continuing with 2 workers" in line for _, line in job.lines), job.output(300)
        # The cut-off side stopped by itself: nothing of the job is left on h3 (nor on
        # the others) within a minute of the launcher's exit.
        left = job.wait_for_no_leftovers(60)
        print(f"cut-off host: its processes gone {time.time() - t_cut:.0f} s after the cut")
        assert left == {}, left
    finally:
        job.mend("h3")
        job.stop()


@pytest.mark.timeout(300)
def test_a_frozen_worker_is_left_behind(hosts: EmulatedHosts, tmp_path: Path) -> None:
    job, out = _elastic_job(hosts, tmp_path)
    job.start()
    try:
        assert job.wait_for_step(30), job.output()
        frozen = job.freeze("h2")
        assert len(frozen) == 1, frozen
        rc = _ended(job)
        figures = _check_survivors(job, out, {"h1", "h3"}, rc)
        print(f"frozen worker: longest gap between two steps {figures['longest gap']:.1f} s")
        assert figures["longest gap"] <= FAILURE_TIMEOUT_S + 5, figures
        left = job.wait_for_no_leftovers(60)
        assert left == {}, left
    finally:
        job.stop()


@pytest.mark.timeout(300)
def test_a_host_that_leaves_the_discovery_output_has_its_worker_stopped(hosts: EmulatedHosts,
                                                                         tmp_path: Path) -> None:
    """h3 leaves the discovery script's output: at the next commit its worker stops (its
    process ends), and h1 and h2 go on from that commit, as Horovod does; no failure is
    reported, and nothing of the job is left on h3."""
    job, out = _elastic_job(hosts, tmp_path)
    job.start()
    try:
        assert job.wait_for_step(30), job.output()
        (tmp_path / "hosts.txt").write_text("h1:1\nh2:1\n")
        t_left = time.time()
        rc = _ended(job)
        figures = _check_survivors(job, out, {"h1", "h2"}, rc)
        stopped = [s.t for s in job.steps if s.host == "h3"]
        print(f"host left: h3's last step {max(stopped) - t_left:.1f} s after the discovery output changed; "
              f"longest gap between two steps {figures['longest gap']:.1f} s")
        assert max(stopped) - t_left < 5.0, max(stopped) - t_left  # the discovery script runs once a second
        lines = [line for _, line in job.lines]
        assert any("rank 2 on h3 stops: the discovery output no longer lists its slot" in line for line in lines), \
            job.output(300)
        assert any("rank 2 of 3 stopped (the discovery output no longer lists their slot on h3); continuing with "
                   "2 workers" in line for line in lines), job.output(300)
        failed = [line for line in lines if "failed" in line]
        assert not failed, failed
        left = job.wait_for_no_leftovers(60)
        assert left == {}, left
    finally:
        job.stop()


@pytest.mark.timeout(300)
def test_a_worker_stopped_shorter_than_the_failure_timeout_carries_on(hosts: EmulatedHosts,
                                                                       tmp_path: Path) -> None:
    """h2's worker is stopped for 3 s (SIGSTOP, then SIGCONT), well within
    ``--failure-timeout``: nobody counts it as failed; the three finish together after
    a pause of about that long."""
    job, out = _elastic_job(hosts, tmp_path)
    job.start()
    try:
        assert job.wait_for_step(30), job.output()
        assert len(job.freeze("h2")) == 1
        time.sleep(3.0)
        job.thaw("h2")
        rc = _ended(job)
        figures = _check_survivors(job, out, {"h1", "h2", "h3"}, rc)
        print(f"worker stopped for 3 s: longest gap between two steps {figures['longest gap']:.1f} s")
        assert 2.5 <= figures["longest gap"] <= FAILURE_TIMEOUT_S - 2, figures
        assert not any("failed" in line for _, line in job.lines), job.output(300)
        assert job.wait_for_no_leftovers(60) == {}
    finally:
        job.thaw("h2")
        job.stop()


@pytest.mark.timeout(300)
def test_a_stopped_worker_is_ended_through_the_launcher(hosts: EmulatedHosts, tmp_path: Path) -> None:
    """h2's worker is stopped (SIGSTOP); once the others count it failed, the new rank 0
    asks hvdlite-run to end it, and it is gone (SIGKILL through the hosts' agent)
    before the others go on: resumed later (SIGCONT), it can no longer tell them
    anything. The other two finish."""
    job, out = _elastic_job(hosts, tmp_path)
    job.start()
    try:
        assert job.wait_for_step(30), job.output()
        frozen = job.freeze("h2")
        assert len(frozen) == 1
        assert job.wait_for(lambda j: any("continuing with 2 workers" in line for _, line in j.lines), 60), \
            job.output(300)
        t_on = time.time()
        assert job.wait_for(lambda j: not _alive(frozen[0]), 10), job.output(300)
        print(f"stopped worker: ended {time.time() - t_on:+.1f} s from the others' going on")
        # The launcher says so once the hosts' agent that killed it has returned.
        ended = f"ended the process of rank 1 on h2 (pid {frozen[0]})"
        assert job.wait_for(lambda j: any(ended in line for _, line in j.lines), 10), job.output(300)
        assert not any("[hvdlite-run request]" in line for _, line in job.lines), "a request reached the screen"
        job.thaw("h2")
        rc = _ended(job)
        _check_survivors(job, out, {"h1", "h3"}, rc)
        assert job.wait_for_no_leftovers(60) == {}
    finally:
        job.thaw("h2")
        job.stop()


@pytest.mark.timeout(300)
def test_a_worker_deadlocked_in_its_script_is_evicted(hosts: EmulatedHosts, tmp_path: Path) -> None:
    """h2's training script deadlocks at step 20 while hvdlite's thread goes on, so no
    failure detector sees it: it misses its collectives, and past the stall shutdown
    time (5 s) rank 0 asks hvdlite-run to end it; the others go on without it."""
    stall_s = 5.0
    job, out = _elastic_job(hosts, tmp_path, launcher_args=(
        "--stall-check-warning-time-seconds", "1", "--stall-check-shutdown-time-seconds", f"{stall_s:g}"),
        HVDLITE_TEST_KILL="1:20", HVDLITE_TEST_KILL_BY="hang")
    job.start()
    try:
        rc = _ended(job)
        figures = _check_survivors(job, out, {"h1", "h3"}, rc)
        print(f"deadlocked worker: longest gap between two steps {figures['longest gap']:.1f} s")
        assert figures["longest gap"] <= stall_s + 5, figures
        assert any("ended the process of rank 1 on h2" in line for _, line in job.lines), job.output(300)
        assert job.wait_for_no_leftovers(60) == {}
    finally:
        job.stop()


@pytest.mark.timeout(300)
def test_a_link_that_flaps_within_the_failure_timeout_loses_nobody(hosts: EmulatedHosts,
                                                                    tmp_path: Path) -> None:
    """h3's link goes down for 2 s, three times, 2 s apart (a flapping switch port): TCP
    carries the traffic over each outage, nobody is counted as failed, and the three
    finish together."""
    job, out = _elastic_job(hosts, tmp_path)
    job.start()
    try:
        assert job.wait_for_step(30), job.output()
        for _ in range(3):
            job.cut("h3")
            time.sleep(2.0)
            job.mend("h3")  # waits 1 s for the carrier
            time.sleep(1.0)
        rc = _ended(job)
        figures = _check_survivors(job, out, {"h1", "h2", "h3"}, rc)
        print(f"flapping link: longest gap between two steps {figures['longest gap']:.1f} s")
        assert figures["longest gap"] >= 1.5, figures  # the outages did stop training
        assert not any("failed" in line for _, line in job.lines), job.output(300)
        assert job.wait_for_no_leftovers(60) == {}
    finally:
        job.mend("h3")
        job.stop()


@pytest.mark.timeout(300)
def test_a_host_added_to_the_discovery_output_gets_a_worker(hosts: EmulatedHosts, tmp_path: Path) -> None:
    """Started on h1 and h2; h3 appears in the discovery output during the job. Open MPI
    cannot add a host to a running job, so at the next commit rank 0 leaves the commit
    in a file on h1, every worker leaves, and hvdlite-run starts the job again on h1, h2
    and h3, whose rank 0 (on h1) loads the commit: three workers finish, every sample
    trained once, within 10 s of the last step before."""
    job, out = _elastic_job(hosts, tmp_path, listed_hosts=["h1", "h2"])
    job.start()
    try:
        assert job.wait_for_step(30), job.output()
        (tmp_path / "hosts.txt").write_text("h1:1\nh2:1\nh3:1\n")
        rc = _ended(job)
        _check_survivors(job, out, {"h1", "h2", "h3"}, rc)
        for said in ("hvdlite: the discovery script offers h3; the job starts again on 3 workers from commit",
                     "hvdlite-run: starting the job again on h1:1,h2:1,h3:1 (3 workers) from its last commit",
                     "the job started again on more hosts (h3 joined); continuing with 3 workers from commit"):
            assert len([line for _, line in job.lines if said in line]) == 1, (said, job.output(300))
        assert [s for s in job.steps if s.host == "h3"], job.output(300)
        gap = _longest_gap(sorted(s.t for s in job.steps if s.host == "h1"))
        print(f"joining host: longest gap between two steps {gap:.1f} s")
        assert gap <= 10, gap
        assert job.wait_for_no_leftovers(60) == {}
        assert not list(Path(tempfile.gettempdir()).glob("hvdlite-commit-*")), "the commit's file was left"
    finally:
        job.stop()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dead", ["h3", "h1"])
def test_a_host_that_dies_is_left_behind(hosts: EmulatedHosts, tmp_path: Path, dead: str) -> None:
    """Every process on one host is killed, Open MPI's daemon included (the host dies
    while its kernel lives on, so its connections close); h1 is rank 0's. Open MPI 5.0's
    mpirun ends the whole job when it loses a daemon; hvdlite-run starts it again on the
    other two hosts, which go on from the last commit their hosts kept: two workers
    finish, every sample trained once, and nothing is left on any host, commit files
    included."""
    job, out = _elastic_job(hosts, tmp_path)
    job.start()
    left = [h for h in hosts.hosts if h != dead]
    try:
        assert job.wait_for_step(30), job.output()
        t_kill = time.time()
        job.kill_host(dead)
        rc = _ended(job)
        _check_survivors(job, out, set(left), rc)
        # Across the two jobs: the workers' own records start again with the new job.
        gap = _longest_gap(sorted(s.t for s in job.steps if s.host == left[0]))
        print(f"host died ({dead}): longest gap between two steps {gap:.1f} s")
        assert gap <= 15, gap
        for said in (f"hvdlite-run: mpirun lost the daemon of {dead} and ended the job; starting it again on "
                     f"{left[0]}:1,{left[1]}:1 (2 workers) from its last commit",
                     f"the job started again without {dead}, whose Open MPI daemon was lost; continuing with "
                     "2 workers from commit"):
            assert len([line for _, line in job.lines if said in line]) == 1, (said, job.output(300))
        assert not [s for s in job.steps if s.host == dead and s.t > t_kill + 1], f"{dead} trained after it died"
        assert job.wait_for_no_leftovers(60) == {}
        assert not list(Path(tempfile.gettempdir()).glob("hvdlite-commit-*")), "a kept commit was left"
    finally:
        job.stop()


@pytest.mark.timeout(300)
def test_a_worker_the_oom_killer_ends_is_left_behind(hosts: EmulatedHosts, tmp_path: Path) -> None:
    """h3's worker, under a 256 MiB memory limit (a cgroup), starts leaking 64 MiB a step:
    the kernel's OOM killer ends it, and the others go on from the last commit."""
    try:
        memory_cgroup_root()
    except OSError as exc:
        pytest.skip(f"needs a memory cgroup controller: {exc}")
    balloon = str(tmp_path / "balloon")
    job, out = _elastic_job(hosts, tmp_path, HVDLITE_TEST_BALLOON=balloon)
    job.start()
    try:
        assert job.wait_for_step(30), job.output()
        group = job.oom("h3", balloon)
        rc = _ended(job)
        assert oom_kills(group) >= 1, "the OOM killer did not act"
        figures = _check_survivors(job, out, {"h1", "h2"}, rc)
        print(f"OOM-killed worker: longest gap between two steps {figures['longest gap']:.1f} s")
        assert any("failed; continuing with 2 workers" in line for _, line in job.lines), job.output(300)
        assert job.wait_for_no_leftovers(60) == {}
    finally:
        job.stop()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
