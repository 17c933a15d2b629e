"""Process sets in the TensorFlow front end through the real launcher, on 3 ranks:
every collective kind on a set (eagerly, in tf.function and in a TF1 Session graph,
where the sets reach hvdlite's graph ops), the global set in between, gradients and the
Keras optimizer over a set, refusals outside a set, and dynamic sets
(see ``tf_process_sets_worker.py``)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.launch import run_ok
from tests.torch.torch_mp import assert_passed

WORKER = Path(__file__).resolve().parent / "tf_process_sets_worker.py"
CASES = ["collectives_on_a_set", "gradients_on_a_set",
         "gradient_of_every_collective_stays_on_its_set", "session_gradients_on_a_set",
         "session_graph_on_a_set",
         "outside_the_set_is_refused", "outside_the_set_gets_local_gradients",
         "tf1_distributed_optimizer_on_a_set", "dynamic_sets"]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="tensorflow is not installed (pip install hvdlite[tensorflow])")


@pytest.mark.timeout(500)
def test_tf_process_sets_on_three_ranks() -> None:
    out = run_ok(3, WORKER, timeout=450, env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert_passed(out, 3, CASES)
