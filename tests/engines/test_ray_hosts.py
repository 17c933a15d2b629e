"""``RayExecutor`` on a Ray cluster over emulated hosts (a worker node under each host's
name, the head with no CPUs): Open MPI reaches the hosts through the workers' command
services, with no ssh; ranks run on the hosts of their actors, and a node's death ends
a static job with a clear error and nothing left behind. Needs root and Ray."""
from __future__ import annotations

import os
import time

import pytest

from tests.hosts import ray_cluster

why = ray_cluster.unavailable()
if why:
    pytest.skip(why, allow_module_level=True)

import ray  # noqa: E402

from hvdlite.ray import RayExecutor  # noqa: E402
from tests.engines.common import allreduce_rank, wait_for_no_paired_ranks  # noqa: E402
from tests.hosts.emulated import EmulatedHosts  # noqa: E402

pytestmark = pytest.mark.timeout(400)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def cluster():
    saved = dict(os.environ)
    os.environ["PYTHONPATH"] = ROOT
    try:
        with EmulatedHosts(2) as hosts, ray_cluster.RayCluster(hosts) as nodes:
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
