"""DistributedOptimizer, state broadcast, SyncBatchNorm and hvd.elastic against
single-process PyTorch.

After k steps on N ranks the parameters must equal those of plain single-process
training on the concatenated global batch (float64, so up to rounding) and be
bit-identical across ranks; see the workers for the cases.
"""
from __future__ import annotations

import pytest

from tests.torch.torch_mp import assert_passed, run_ranks

OPTIMIZER_CASES = [
    "sgd_momentum_matches_global_batch", "sgd_concatenated_batch_literally",
    "adam_matches_global_batch", "adamw_groups_match_global_batch", "explicit_groups_and_unnamed",
    "sum_op_and_predivide", "backward_passes_per_step_equals_4x_batch", "compression_fp16_bf16",
    "unused_parameters_on_some_ranks", "hooked_at_every_size_with_unused_parameters",
    "synchronize_clip_skip_synchronize",
    "zero_grad_while_in_flight_is_an_error", "model_zero_grad_while_in_flight_is_an_error",
    "step_with_closure_averages_gradients", "lbfgs_closure_is_averaged_every_evaluation", "two_unnamed_optimizers_one_loss",
    "frozen_then_unfrozen_and_added_group",
    "lr_scheduler_and_state_dict", "sparse_embedding_gradients", "torch_compile_matches_global_batch",
    "buckets_equal_per_tensor", "bucket_bad_input_fails_on_every_rank", "wrong_arguments_raise"]
FUNCTION_CASES = ["broadcast_parameters_forms", "optimizer_state_makes_fresh_rank_identical",
                  "optimizer_state_cleared_when_root_has_none", "objects"]
SYNCBN_CASES = ["syncbn_1d", "syncbn_2d", "syncbn_float32_and_convert"]
ELASTIC_CASES = ["run_syncs_rank0_state_then_trains_like_global_batch",
                 "commit_and_restore_return_to_the_committed_state",
                 "restored_sampler_skips_what_any_rank_processed", "uneven_shares_train_each_sample_once",
                 "errors_propagate_without_retry"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_distributed_optimizer_equals_global_batch(n: int) -> None:
    out = run_ranks(n, "optimizer_worker.py", timeout=280)
    assert_passed(out, n, OPTIMIZER_CASES)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_broadcast_state_and_objects(n: int) -> None:
    out = run_ranks(n, "functions_worker.py", timeout=200)
    assert_passed(out, n, FUNCTION_CASES)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_sync_batch_norm_equals_global_batch_norm(n: int) -> None:
    out = run_ranks(n, "syncbn_worker.py", timeout=200)
    assert_passed(out, n, SYNCBN_CASES)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_elastic_api_on_a_fixed_world(n: int) -> None:
    out = run_ranks(n, "elastic_worker.py", timeout=200)
    assert_passed(out, n, ELASTIC_CASES)
