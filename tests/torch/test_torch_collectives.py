"""hvdlite.torch collectives on 1-4 ranks, launched through the real launcher.

Every rank checks each result against a NumPy reference built from every rank's
(deterministic) input; see ``workers/ops_worker.py`` and ``workers/autograd_worker.py``.
"""
from __future__ import annotations

import pytest

from tests.torch.torch_mp import assert_passed, run_ranks

OPS_CASES = ["allreduce_float_ops", "allreduce_with_compression", "allreduce_int_ops",
             "allreduce_scaling_and_deprecated_average",
             "allreduce_inplace_async_and_noncontiguous", "allreduce_other_dtypes",
             "grouped_allreduce_ops", "allgather_ops", "broadcast_ops", "alltoall_ops",
             "alltoall_non_native_1d", "inplace_ops_bump_autograd_version",
             "reducescatter_ops", "barrier_and_join", "join_with_uneven_work",
             "mismatch_errors_then_recovers"]
GRAD_CASES = ["allreduce_grad", "allgather_grad", "broadcast_grad", "alltoall_grad",
              "reducescatter_grad"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_collectives_match_numpy(n: int) -> None:
    out = run_ranks(n, "ops_worker.py", timeout=200)
    assert_passed(out, n, OPS_CASES)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_gradients_match_hand_derived(n: int) -> None:
    out = run_ranks(n, "autograd_worker.py", timeout=200)
    assert_passed(out, n, GRAD_CASES)
