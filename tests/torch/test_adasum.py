"""op=Adasum through the real launcher: allreduce (PyTorch and NumPy, float16/32/64),
reducescatter, DistributedOptimizer(op=Adasum) and Adasum on a process set, each against
the pairwise formula in NumPy; integer tensors and a world of 3 ranks are refused on
every rank (see ``workers/adasum_worker.py``)."""
from __future__ import annotations

import pytest

from tests.torch.torch_mp import assert_passed, run_ranks

CASES = ["allreduce_matches_formula", "reducescatter_keeps_its_share", "optimizer_combines_the_updates",
         "on_a_process_set", "refused_where_it_cannot_run"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [1, 2, 4])
def test_adasum_matches_the_formula(n: int) -> None:
    out = run_ranks(n, "adasum_worker.py", *CASES, timeout=200, env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert_passed(out, n, CASES)


@pytest.mark.timeout(240)
def test_adasum_refuses_a_world_that_is_not_a_power_of_two() -> None:
    out = run_ranks(3, "adasum_worker.py", "not_a_power_of_two", timeout=200)
    assert_passed(out, 3, ["not_a_power_of_two"])
