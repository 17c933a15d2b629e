"""hvdlite.tensorflow and hvdlite.tensorflow.keras on 1, 2, 3 and 4 ranks.

TensorFlow takes seconds to import, so each rank count is ONE launch of
``tf_worker.py`` through the real launcher (``python -m hvdlite.runner``, else
``mpirun``); the worker runs every check (see ``tf_ops_checks.py`` and
``tf_keras_checks.py``) and writes each rank's verdicts to a JSON file. Every check is
then reported here as its own test, for every rank count. The checks compare with
references computed independently: NumPy over all ranks' seeded data for the
collectives, plain single-process TensorFlow/Keras training on the global batch for
``DistributedGradientTape`` and ``model.fit`` with ``DistributedOptimizer``.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tensorflow import checks_launch

HERE = Path(__file__).resolve().parent
WORKER = HERE / "tf_worker.py"
LAUNCH_TIMEOUT_S = 480
RANK_COUNTS = [1, 2, 3, 4]

# Every check the worker registers; the worker's list must match (see test_check_list).
CHECKS = [
    "allreduce_ops_and_dtypes",
    "allreduce_scaling_variable_and_scalar",
    "grouped_allreduce_lists",
    "allgather_variable_first_dim",
    "broadcast_from_every_root",
    "alltoall_even_and_splits",
    "reducescatter_uneven",
    "barrier_and_join",
    "gradients_of_collectives",
    "indexed_slices_and_compression",
    "variables_and_objects",
    "errors_are_raised_and_recoverable",
    "unforeseen_staging_failure_fails_on_every_rank",
    "input_one_rank_cannot_use_fails_on_every_rank",
    "engine_stop_fails_collectives_in_flight_with_unknown_error",
    "gradient_tape_rejects_unsupported_ops",
    "distributed_gradient_tape_matches_single_process",
    "gradient_buckets_are_submitted_during_the_backward_pass",
    "embedding_indexed_slices_gradients",
    "local_sources_keep_their_gradients",
    "fit_with_distributed_optimizer_matches_single_process",
    "keras_collectives_return_tensors",
    "keras2_calls_scripts_make_are_bridged",
    "mixed_float16_fit_skips_a_non_finite_step_on_every_rank",
    "fit_sparse_embedding_gradients",
    "horovod_keras_module_name_trains_the_same",
    "auto_jit_compile_chooses_no_xla_with_distributed_optimizer",
    "elastic_keras_state_fit_commit_and_restore",
    "metric_average_callback_averages_logs",
    "broadcast_callback_leaves_local_variables_alone",
    "best_model_checkpoint_saves_the_best_epoch_on_rank_0",
    "warmup_callback_learning_rates_and_momentum_correction",
    "schedule_callback_rmsprop_momentum_correction",
    "schedule_callback_staircase",
    "load_model_wraps_restored_optimizer",
    "backward_passes_per_step_accumulates",
    "backward_passes_per_step_builds_the_optimizer",
    "distributed_optimizer_keeps_state_of_built_optimizer",
    "distributed_optimizer_rejects_unsupported_ops",
    "distributed_optimizer_keeps_weight_decay_exclusions",
    "local_variables_of_distributed_optimizer",
    "sync_batch_normalization_matches_global_batch",
    "sync_batch_normalization_fit_matches_global_batch",
]

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                       reason="tensorflow is not installed (pip install hvdlite[tensorflow])"),
    pytest.mark.timeout(LAUNCH_TIMEOUT_S + 120),
]


# The 3-rank launch runs every check with gradients in small buckets submitted during
# the backward pass (hvdlite.tensorflow.overlap), which the default leaves off on a
# machine with fewer than two cores per rank; the others run with the defaults.
LAUNCH_ENV = {3: {"HVDLITE_TF_OVERLAP": "1", "HVDLITE_TF_BUCKET_BYTES": "64"}}


@pytest.fixture(scope="module", params=RANK_COUNTS, ids=[f"np{n}" for n in RANK_COUNTS])
def run(request, tmp_path_factory):
    n = request.param
    return checks_launch.launch(n, WORKER, tmp_path_factory.mktemp(f"tf_np{n}"), LAUNCH_TIMEOUT_S,
                                LAUNCH_ENV.get(n))


def test_check_list(run):
    """The worker ran exactly the checks listed here, on every rank."""
    checks_launch.assert_ran_exactly(run, CHECKS)


@pytest.mark.parametrize("check", CHECKS)
def test_tf(run, check):
    checks_launch.assert_passed(run, check)


# Keras's backends other than TensorFlow: torch is the one installed with hvdlite[torch]
# (the numpy backend needs jax to import).
@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="Keras's torch backend needs torch (pip install hvdlite[torch])")
@pytest.mark.parametrize("code, error", [
    ("import hvdlite.tensorflow.keras", "ImportError"),
    ("import hvdlite.keras", "ImportError"),
    ("import hvdlite.tensorflow as hvd; hvd.SyncBatchNormalization()", "RuntimeError"),
])
def test_keras_on_another_backend_is_refused(code, error):
    """Keras 3 on a backend other than TensorFlow gets a clear error at import (or when
    the layer is made), not a TypeError deep inside the first allreduce."""
    env = dict(os.environ, KERAS_BACKEND="torch", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode != 0, proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{error}:") and "'torch' backend" in last, proc.stderr[-2000:]
    assert "KERAS_BACKEND=tensorflow" in last, last
