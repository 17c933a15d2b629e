"""hvd.DistributedOptimizer around TensorFlow 1 optimizers (tf.compat.v1.train.Optimizer)
in tf.compat.v1 graphs run by a Session, on 2 ranks through the real launcher, against
single-process training on the global batch (see ``tf_legacy_optimizer_worker.py``)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.launch import run_ok
from tests.torch.torch_mp import assert_passed

WORKER = Path(__file__).resolve().parent / "tf_legacy_optimizer_worker.py"
CASES = ["average_matches_single_process", "sparse_gradients_and_local_variables",
         "backward_passes_per_step_sums_then_applies", "adasum_combines_the_updates",
         "delegation_and_errors"]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="tensorflow is not installed (pip install hvdlite[tensorflow])")


@pytest.mark.timeout(400)
def test_tf1_distributed_optimizer_on_two_ranks() -> None:
    out = run_ok(2, WORKER, timeout=360)
    assert_passed(out, 2, CASES)
