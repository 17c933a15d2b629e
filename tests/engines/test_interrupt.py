"""Ctrl-C (SIGINT) on a driver that waits for a Ray or Spark job: the driver ends with
``KeyboardInterrupt`` within seconds, and no rank, actor or Spark task is left."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.engines.common import paired_ranks, wait_for_no_paired_ranks
from tests.launch import REPO

pytestmark = pytest.mark.timeout(300)

RAY_DRIVER = """
import time, ray
from hvdlite.ray import RayExecutor
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
ex = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=2)
ex.start()
try:
    ex.run(time.sleep, args=[300])
except KeyboardInterrupt:
    print("interrupted; workers left:", len(ex.workers), flush=True)
    raise
"""

SPARK_DRIVER = """
import os, sys, time
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
import hvdlite.spark
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
try:
    hvdlite.spark.run(time.sleep, args=(300,), num_proc=2)
except KeyboardInterrupt:
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 20
    while tracker.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.2)
    print("interrupted; Spark jobs left:", len(tracker.getActiveJobsIds()), flush=True)
    raise
"""


def _interrupt(driver: str, left: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(driver)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 150
        while len(paired_ranks()) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.2)
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGINT)
        started = time.monotonic()
        out, err = proc.communicate(timeout=60)
        assert time.monotonic() - started < 40
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err, err[-3000:]
    assert f"{left} 0" in out, out + err[-3000:]
    assert wait_for_no_paired_ranks() == []


def test_ctrl_c_ends_a_ray_job():
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'hvdlite[ray]')")
    _interrupt(RAY_DRIVER, "workers left:")


def test_ctrl_c_ends_a_spark_job():
    pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'hvdlite[spark]')")
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java (apt-get install openjdk-17-jre-headless)")
    _interrupt(SPARK_DRIVER, "Spark jobs left:")
