"""Faults in a fixed-size job, on 3 emulated hosts with one rank each: a frozen rank
(SIGSTOP) is named, with its host, in the error every other rank gets within the stall
shutdown time, the launcher ends the whole job, and nothing of it stays behind.

Needs root (network namespaces); skipped with the reason otherwise."""
from __future__ import annotations

import signal
import time

import pytest

from tests.faults.harness import WORKERS, FaultJob
from tests.hosts.emulated import EmulatedHosts

STALL_LIMIT_S = 5.0
STATIC = WORKERS / "static_steps.py"


def _static_job(hosts: EmulatedHosts) -> FaultJob:
    return FaultJob(hosts, 3, STATIC, launcher_args=["-H", hosts.host_spec(1)],
                    env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "2",
                         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(STALL_LIMIT_S)})


@pytest.mark.timeout(180)
@pytest.mark.parametrize("frozen_host, frozen_rank", [("h2", 1), ("h1", 0)], ids=["worker", "rank0"])
def test_a_frozen_rank_ends_the_job_with_its_name_on_every_rank(hosts: EmulatedHosts, frozen_host: str,
                                                                 frozen_rank: int) -> None:
    job = _static_job(hosts).start()
    try:
        assert job.wait_for_step(20), job.output()
        frozen = job.freeze(frozen_host)
        assert len(frozen) == 1, frozen
        t_freeze = time.time()
        rc = job.wait(timeout=STALL_LIMIT_S + 5 + 20)
        assert rc is not None, f"the job did not end after a rank froze\n{job.output()}"
        detail = job.output()
        assert rc != 0, detail
        # Every other rank failed, naming the frozen rank and its host.
        failed = {int(line.split()[1]): line for line in job.messages("FAILED ")}
        alive = {0, 1, 2} - {frozen_rank}
        name = f"rank {frozen_rank} (host {frozen_host})" if frozen_rank == 0 else f"{frozen_rank} ({frozen_host})"
        for r in alive:
            if r in failed:
                assert name in failed[r], (r, failed[r])
        # Rank 0 may be ended by the launcher before its script prints, but its engine
        # says why first; a worker that lost rank 0 always prints.
        assert any(name in line for _, line in job.lines if "hvdlite shut down" in line), detail
        if frozen_rank == 0:
            assert set(failed) >= alive, detail
        # Within the stall limit and 5 s: the last failure, and the launcher's exit.
        times = [float(line.split()[3]) for line in failed.values()]
        print(f"frozen {frozen_host}: errors after {sorted(round(t - t_freeze, 1) for t in times)} s, "
              f"the launcher exited after {job.ended - t_freeze:.1f} s")
        assert all(t - t_freeze <= STALL_LIMIT_S + 5 for t in times), (times, t_freeze)
        assert job.ended - t_freeze <= STALL_LIMIT_S + 5 + 3, (job.ended - t_freeze, detail)
        # Nothing is left: not the frozen rank, not a daemon.
        assert job.wait_for_no_leftovers(10) == {}, job.leftovers()
    finally:
        job.stop()


@pytest.mark.timeout(120)
def test_sigterm_ends_a_job_with_a_frozen_rank_within_10_s(hosts: EmulatedHosts) -> None:
    job = FaultJob(hosts, 3, STATIC, launcher_args=["-H", hosts.host_spec(1)]).start()
    try:
        assert job.wait_for_step(20), job.output()
        job.freeze("h3")
        job.wait_for(lambda j: False, 2)  # the others are now stuck in their collective
        t = time.time()
        job.signal_launcher(signal.SIGTERM)
        rc = job.wait(timeout=15)
        assert rc is not None, f"hvdlite-run did not exit after SIGTERM\n{job.output()}"
        print(f"SIGTERM with a frozen rank: the launcher exited after {job.ended - t:.1f} s")
        assert job.ended - t <= 10, job.ended - t
        assert rc == 128 + signal.SIGTERM, (rc, job.output())
        assert job.wait_for_no_leftovers(10) == {}, job.leftovers()
    finally:
        job.stop()
