"""``RayExecutor`` on a Ray cluster over emulated hosts (a worker node under each host's
name, the head with no CPUs): Open MPI reaches the hosts through the workers' command
services, with no ssh; ranks run on the hosts of their actors; a node's death ends a
static job with a clear error and nothing left behind, and an elastic job goes on with
the survivors from its last commit. Needs root and Ray."""
from __future__ import annotations

import os
import threading
import time

import pytest

from tests.hosts import ray_cluster

why = ray_cluster.unavailable()
if why:
    pytest.skip(why, allow_module_level=True)

import ray  # noqa: E402

from hvdlite.ray import RayExecutor  # noqa: E402
from tests.engines.common import (allreduce_rank, elastic_steps,  # noqa: E402
                                  wait_for_no_paired_ranks)
from tests.hosts.emulated import EmulatedHosts  # noqa: E402

pytestmark = pytest.mark.timeout(400)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def cluster(request):
    """Emulated hosts with a Ray node each: ``(hosts, CPUs per node)`` by parameter."""
    n, cpus = getattr(request, "param", (2, 2))
    saved = dict(os.environ)
    os.environ["PYTHONPATH"] = ROOT
    try:
        with EmulatedHosts(n) as hosts, ray_cluster.RayCluster(hosts, cpus=cpus) as nodes:
            os.environ.update(hosts.env())
            ray.init(address=nodes.address, log_to_driver=False, logging_level="ERROR")
            try:
                yield nodes
            finally:
                ray.shutdown()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def placement():
    import socket

    import hvdlite as hvd
    hvd.init()
    return socket.gethostname(), hvd.rank(), hvd.local_rank(), hvd.cross_rank(), hvd.cross_size()


def test_ranks_run_on_the_hosts_of_their_actors_and_a_lost_node_ends_the_job(cluster):
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=90), num_hosts=2, num_workers_per_host=2)
    try:
        ex.start()
        got = ex.run(placement)
        first, second = got[0][0], got[2][0]
        assert {first, second} == {"h1", "h2"}
        assert got == [(first, 0, 0, 0, 2), (first, 1, 1, 0, 2),
                       (second, 2, 0, 1, 2), (second, 3, 1, 1, 2)]
        actor_hosts = ray.get([w.hostname.remote() for w in ex.workers])
        assert actor_hosts == [h for h, *_ in got]
        assert ex.run(allreduce_rank, args=[1.0]) == [(r, 4, [6.0] * 3) for r in range(4)]

        # A node dies in the middle of a call: the call fails on the driver, the
        # executor is shut down, and no rank is left on any host.
        refs = ex.run_remote(time.sleep, args=[120])
        time.sleep(1.0)
        cluster.kill_node(second)
        started = time.monotonic()
        with pytest.raises(Exception):
            ex.execute(lambda _: None)
        with pytest.raises(Exception):
            ray.get(refs, timeout=60)
        assert time.monotonic() - started < 60
        assert wait_for_no_paired_ranks() == []
    finally:
        ex.shutdown()


# Three hosts of one worker each: losing one leaves a majority, so the survivors go on
# whichever host rank 0 was on (with two hosts, the half without rank 0 would stop, as
# on the far side of a network partition: see the elastic guide).
@pytest.mark.parametrize("cluster", [(3, 1)], indirect=True)
def test_an_elastic_job_goes_on_without_a_lost_node(cluster, tmp_path):
    log = tmp_path / "steps.log"
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), min_workers=2, max_workers=4)
    ex.start()
    failure = {}

    def kill_when_training() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log.exists() and len(log.read_text().splitlines()) >= 10:
                cluster.kill_node("h2")
                return
            time.sleep(0.1)
        failure["kill"] = "training did not reach step 10"

    killer = threading.Thread(target=kill_when_training, daemon=True)
    killer.start()
    try:
        got = ex.run(elastic_steps, args=[40, str(log)])
    finally:
        ex.shutdown()
    killer.join(5)
    assert not failure
    # The last world: the workers of h1 and h3, at the last step.
    assert sorted(got) == [("h1", 40, 2), ("h3", 40, 2)]
    steps = [line.split() for line in log.read_text().splitlines()]
    sizes = [int(s) for _, _, s in steps]
    assert sizes[0] == 3 and sizes[-1] == 2
    # After the loss the survivors went on from a commit, not from the start.
    first_after = next(int(step) for _, step, size in steps if size == "2")
    assert first_after > 5
    assert [int(step) for _, step, _ in steps][-1] == 40
    assert wait_for_no_paired_ranks() == []
