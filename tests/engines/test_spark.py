"""``hvdlite.spark.run`` on a real Spark session: ``local[N]`` (tasks are processes of
this machine's one executor) and ``local-cluster[2,1,1024]`` (two executor JVMs). Values
come back by rank, output reaches the given streams, and every failure is named on the
driver with no task or rank left running."""
from __future__ import annotations

import io
import os
import signal
import shutil
import sys
import time

import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'hvdlite[spark]')")
if shutil.which("java") is None:
    pytest.skip("Spark needs Java (apt-get install openjdk-17-jre-headless)", allow_module_level=True)

import hvdlite.spark  # noqa: E402
from tests.engines.common import (allreduce_rank, call_in_background, hold,  # noqa: E402
                                  raise_on_rank_one, reference_linear, train_linear,
                                  wait_for_no_paired_ranks)
from tests.hosts.spark_cluster import executors_on  # noqa: E402

pytestmark = pytest.mark.timeout(300)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _session(master: str):
    from pyspark.sql import SparkSession

    # The executors' Python is this one, and it imports these tests' modules.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_HOME"] = os.path.dirname(pyspark.__file__)
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return (SparkSession.builder.master(master).appName("hvdlite-tests")
            .config("spark.executorEnv.PYTHONPATH", path)
            .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
            .config("spark.test.home", os.environ["SPARK_HOME"])
            .config("spark.executor.memory", "512m")
            .config("spark.ui.enabled", "false")
            .getOrCreate())


@pytest.fixture(scope="module", params=["local[3]", "local-cluster[2,1,1024]"])
def spark(request):
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, old) if p)
    session = _session(request.param)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


def _slots(spark) -> int:
    return spark.sparkContext.defaultParallelism


def _no_jobs_left(spark) -> None:
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 20
    while tracker.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tracker.getActiveJobsIds() == []
    assert wait_for_no_paired_ranks() == []


def test_values_come_back_by_rank(spark):
    n = _slots(spark)
    got = hvdlite.spark.run(allreduce_rank, args=(0.5,), kwargs={"offset": 1}, num_proc=n)
    total = sum(r + 1 for r in range(n)) * 0.5
    assert got == [(r, n, [total] * 3) for r in range(n)]
    # num_proc defaults to the context's parallelism.
    assert [r for r, _, _ in hvdlite.spark.run(allreduce_rank, args=(1.0,))] == list(range(n))
    _no_jobs_left(spark)


def test_same_parameters_as_one_process(spark):
    got = np.array(hvdlite.spark.run(train_linear, args=(7,), num_proc=2))
    np.testing.assert_allclose(got, np.tile(reference_linear(7, 2), (2, 1)), rtol=1e-12)


def test_output_goes_to_the_given_streams_and_env_reaches_the_ranks(spark):
    def speak():
        import hvdlite as hvd
        hvd.init()
        print(f"out of rank {hvd.rank()}: {os.environ['HVDLITE_TEST_WORD']}", flush=True)
        print(f"err of rank {hvd.rank()}", file=sys.stderr, flush=True)
        return os.environ["HVDLITE_TEST_WORD"]

    out, err = io.StringIO(), io.StringIO()
    env = dict(os.environ, HVDLITE_TEST_WORD="kiwi")
    assert hvdlite.spark.run(speak, num_proc=2, env=env, stdout=out, stderr=err) == ["kiwi"] * 2
    assert "out of rank 0: kiwi" in out.getvalue() and "out of rank 1: kiwi" in out.getvalue()
    assert "err of rank 1" in err.getvalue() and "err of rank" not in out.getvalue()


def test_a_rank_that_raises_fails_the_job_with_its_traceback(spark):
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"raise_on_rank_one raised on rank\(s\) [0, ]*1") as info:
        hvdlite.spark.run(raise_on_rank_one, num_proc=2)
    assert time.monotonic() - started < 90
    assert "KeyError: 'rank one refuses'" in str(info.value)
    assert "--- rank 1 ---" in str(info.value)
    _no_jobs_left(spark)
    # The session is still usable.
    assert [r for r, _, _ in hvdlite.spark.run(allreduce_rank, args=(1.0,), num_proc=2)] == [0, 1]


def test_too_few_slots_time_out_with_the_numbers(spark):
    n = _slots(spark) + 2
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^Timed out waiting for Spark tasks to start\. "
                                           rf"0 of {n} task\(s\) started within 4 s"):
        hvdlite.spark.run(allreduce_rank, args=(1.0,), num_proc=n, start_timeout=4)
    assert time.monotonic() - started < 30
    _no_jobs_left(spark)


@pytest.mark.parametrize("spark", ["local-cluster[2,1,1024]"], indirect=True)
def test_a_lost_executor_fails_the_job(spark):
    thread, failure = call_in_background(hvdlite.spark.run, hold, num_proc=2)
    deadline = time.monotonic() + 60
    while len(executors_on()) < 2 or len(wait_for_no_paired_ranks(0)) < 2:
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.2)
    pids = executors_on()
    os.kill(pids[0], signal.SIGKILL)
    started = time.monotonic()
    thread.join(90)
    assert not thread.is_alive()
    assert time.monotonic() - started < 60
    assert isinstance(failure.get("error"), RuntimeError), failure
    assert "Spark job failed" in str(failure["error"]) or "no result" in str(failure["error"])
    _no_jobs_left(spark)


def test_no_active_session_is_named(monkeypatch):
    from pyspark import SparkContext
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    with pytest.raises(Exception, match="Could not find an active SparkContext"):
        hvdlite.spark.run(allreduce_rank, num_proc=1)


def test_refusals_by_name(spark):
    with pytest.raises(NotImplementedError, match="use_gloo=True.*MPI only"):
        hvdlite.spark.run(allreduce_rank, num_proc=1, use_gloo=True)
    with pytest.raises(ValueError, match="HOROVOD_CPU_OPERATIONS=gloo"):
        hvdlite.spark.run(allreduce_rank, num_proc=1, env={"HOROVOD_CPU_OPERATIONS": "gloo"})
    with pytest.raises(NotImplementedError, match="run_elastic.*barrier mode"):
        hvdlite.spark.run_elastic(allreduce_rank, num_proc=1)
    # Barrier mode, which Spark refuses under dynamic allocation.
    conf = spark.sparkContext.getConf()
    real_get_conf = type(spark.sparkContext).getConf
    try:
        type(spark.sparkContext).getConf = lambda self: conf.set("spark.dynamicAllocation.enabled", "true")
        with pytest.raises(ValueError, match="spark.dynamicAllocation.enabled is true.*barrier mode"):
            hvdlite.spark.run(allreduce_rank, num_proc=1)
    finally:
        type(spark.sparkContext).getConf = real_get_conf
