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


ERROR_CASES = ["reductions_refuse_tensors_one_rank_cannot_reduce", "reduce_ops_one_rank_asks_for",
               "groups_fail_whole_when_one_member_is_bad", "moves_refuse_what_one_rank_cannot_send",
               "sparse_allreduce_refuses_an_op_one_rank_asks_for",
               "every_rank_passing_bad_input_raises_the_same_way"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 3])
def test_input_one_rank_cannot_use_fails_on_every_rank(n: int) -> None:
    """One rank's bad input (a dtype the op cannot reduce, a sparse tensor, bad splits,
    an op hvdlite does not run) fails the collective on every rank, naming the rank and
    the problem, instead of leaving the others waiting; the next collective works."""
    out = run_ranks(n, "errors_worker.py", timeout=200)
    assert_passed(out, n, ERROR_CASES)
