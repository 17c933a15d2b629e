"""``hvdlite.spark.run`` on a Spark standalone cluster over emulated hosts (a worker
under each host's name): Open MPI reaches every host through the tasks' command
services, with no ssh; ranks really run on different hosts, and a lost executor ends
the job with nothing left behind. Needs root, Java and PySpark."""
from __future__ import annotations

import os
import signal
import time

import pytest

from tests.hosts import spark_cluster

why = spark_cluster.unavailable()
if why:
    pytest.skip(why, allow_module_level=True)

import hvdlite.spark  # noqa: E402
from tests.engines.common import (allreduce_rank, call_in_background, hold,  # noqa: E402
                                  wait_for_no_paired_ranks)
from tests.hosts.emulated import EmulatedHosts  # noqa: E402

pytestmark = pytest.mark.timeout(400)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def cluster():
    saved = dict(os.environ)
    with EmulatedHosts(2) as hosts, spark_cluster.SparkCluster(hosts) as spark:
        os.environ.update(hosts.env())
        os.environ["PYTHONPATH"] = ROOT
        session = spark.session(**{"spark.executorEnv.PYTHONPATH": ROOT})
        session.sparkContext.setLogLevel("ERROR")
        try:
            yield spark, session
        finally:
            session.stop()
            os.environ.clear()
            os.environ.update(saved)


def placement():
    import socket

    import hvdlite as hvd
    hvd.init()
    return socket.gethostname(), hvd.rank(), hvd.local_rank(), hvd.cross_rank(), hvd.cross_size()


def test_ranks_run_on_the_hosts_of_their_tasks(cluster):
    got = hvdlite.spark.run(placement, num_proc=2, start_timeout=120)
    assert sorted(h for h, *_ in got) == ["h1", "h2"]
    assert [r for _, r, *_ in got] == [0, 1]
    assert [(lr, cr, cs) for _, _, lr, cr, cs in got] == [(0, 0, 2), (0, 1, 2)]
    assert hvdlite.spark.run(allreduce_rank, args=(2.0,), num_proc=2) == \
        [(r, 2, [2.0] * 3) for r in range(2)]
    assert wait_for_no_paired_ranks() == []


def test_a_lost_executor_on_one_host_ends_the_job(cluster):
    spark, _ = cluster
    thread, failure = call_in_background(hvdlite.spark.run, hold, num_proc=2, start_timeout=120)
    deadline = time.monotonic() + 90
    while len(wait_for_no_paired_ranks(0)) < 2:
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.2)
    executors = spark_cluster.executors_on(spark.hosts.namespaces["h2"])
    assert executors, "no executor on h2"
    os.kill(executors[0], signal.SIGKILL)
    started = time.monotonic()
    thread.join(120)
    assert not thread.is_alive()
    assert time.monotonic() - started < 90
    assert isinstance(failure.get("error"), RuntimeError), failure
    assert wait_for_no_paired_ranks() == []
