"""The digits example's one training function, run as a user runs it through
``hvdlite.run``, Ray's ``RayExecutor`` and ``hvdlite.spark.run``: the same seed gives
the same parameters and accuracy through all three."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.launch import REPO

pytestmark = pytest.mark.timeout(600)


def _run(script: str, tmp_path, *args: str) -> tuple[float, np.ndarray]:
    saved = tmp_path / (script.replace("/", "_") + ".npy")
    proc = subprocess.run([sys.executable, str(REPO / "examples" / script), *args, "--epochs", "4",
                           "--save-params", str(saved)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = re.search(r"^accuracy (\S+) parameter sum (\S+) \((\d+) ranks", proc.stdout, re.M)
    assert found and found.group(3) == "3", proc.stdout[-2000:]
    return float(found.group(1)), np.load(saved)


def test_the_same_function_gives_the_same_parameters_through_every_launcher(tmp_path):
    pytest.importorskip("torch", reason="the digits example needs PyTorch")
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'hvdlite[ray]')")
    pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'hvdlite[spark]')")
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java (apt-get install openjdk-17-jre-headless)")
    accuracy, reference = _run("pytorch/run_digits_function.py", tmp_path, "--num-proc", "3")
    assert accuracy > 0.8 and reference.size == 64 * 64 + 64 + 64 * 10 + 10
    for script, option in (("ray/train_digits_ray.py", "--num-workers"),
                           ("spark/train_digits_spark.py", "--num-proc")):
        got_accuracy, got = _run(script, tmp_path, option, "3")
        # Equal up to float64 rounding (the order of a ring allreduce's sums varies).
        np.testing.assert_allclose(got, reference, rtol=1e-9, atol=1e-12)
        assert got_accuracy == accuracy
