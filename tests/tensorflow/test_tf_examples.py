"""The TensorFlow 2 examples run through the real launcher on 2 ranks and learn.

The digits examples (custom loop with DistributedGradientTape, Keras model.fit with
DistributedOptimizer and the callbacks) must reach a test accuracy that an untrained or
wrongly averaged model does not (chance is 0.10); the synthetic benchmark must run both
of its APIs and report a throughput.
"""
from __future__ import annotations

import importlib.util
import re

import pytest

from tests.launch import REPO, run_ok

EXAMPLES = REPO / "examples" / "tensorflow2"
TIMEOUT_S = 300

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                       reason="tensorflow is not installed (pip install hvdlite[tensorflow])"),
    pytest.mark.timeout(TIMEOUT_S + 60),
]


def run_example(script: str, *args: str, ranks: int = 2) -> str:
    return run_ok(ranks, EXAMPLES / script, *args, timeout=TIMEOUT_S)


def final_accuracy(out: str) -> float:
    found = re.findall(r"final test accuracy: ([0-9.]+)", out)
    assert len(found) == 1, f"expected one accuracy line (rank 0 only):\n{out}"
    return float(found[0])


def test_custom_loop_digits_learns():
    out = run_example("tensorflow2_digits_custom_loop.py", "--epochs", "5")
    assert final_accuracy(out) >= 0.90, out
    losses = [float(v) for v in re.findall(r"epoch \d+: loss ([0-9.]+)", out)]
    assert len(losses) == 5 and losses[-1] < losses[0], out


def test_keras_fit_digits_learns():
    out = run_example("tensorflow2_keras_digits.py", "--epochs", "5", "--warmup-epochs", "2")
    assert final_accuracy(out) >= 0.90, out
    assert "finished gradual learning rate warmup" in out, out


@pytest.mark.parametrize("api", ["loop", "fit"])
def test_synthetic_benchmark_runs(api):
    out = run_example("tensorflow2_synthetic_benchmark.py", "--model", "mlp", "--api", api,
                      "--batch-size", "16", "--num-warmup-batches", "1",
                      "--num-batches-per-iter", "2", "--num-iters", "2")
    assert "9,557,110 parameters" in out, out
    rate = re.findall(r"Total samples/sec on 2 rank\(s\): ([0-9.]+)", out)
    assert rate and float(rate[0]) > 0, out
