"""op=Adasum in the TensorFlow front end through the real launcher: allreduce,
DistributedGradientTape and the Keras DistributedOptimizer against the pairwise formula
in NumPy on 1, 2 and 4 ranks; 3 ranks are refused (see ``tf_adasum_worker.py``)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.launch import run_ok
from tests.torch.torch_mp import assert_passed

WORKER = Path(__file__).resolve().parent / "tf_adasum_worker.py"
CASES = ["allreduce_matches_formula", "gradient_tape_combines_gradients",
         "keras_optimizer_applies_the_adasum"]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="tensorflow is not installed (pip install hvdlite[tensorflow])")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", [1, 2, 4])
def test_tf_adasum_matches_the_formula(n: int) -> None:
    assert_passed(run_ok(n, WORKER, *CASES, timeout=360), n, CASES)


@pytest.mark.timeout(300)
def test_tf_adasum_refuses_a_world_that_is_not_a_power_of_two() -> None:
    assert_passed(run_ok(3, WORKER, "not_a_power_of_two", timeout=240), 3, ["not_a_power_of_two"])
