"""ZeRO stages 1 and 2 (``hvdlite.torch.ZeroRedundancyOptimizer``) through the real
launcher on 2 and 3 ranks: parameters equal to DistributedOptimizer's over the same torch
optimizer, even shards whatever the model (a tied embedding included), stage 2's freed
gradients, the whole state consolidated and loaded, an LR scheduler,
a group added mid-training, a process set of some of the ranks, and bad input (see
``workers/zero_worker.py``; dynamic process sets are on for the set's case)."""
from __future__ import annotations

import pytest

from tests.torch.torch_mp import assert_passed, run_ranks

CASES = ["adam_matches_distributed_optimizer", "sgd_momentum_with_sum_matches",
         "clip_grad_norm_matches_clipping_the_averaged_gradients",
         "accumulation_over_backward_passes_matches",
         "shards_are_even_and_disjoint", "stage_2_matches_and_frees_the_gradients",
         "stage_3_matches_and_keeps_only_shards", "stage_3_state_dicts",
         "stage_3_bf16_parameters_with_float32_shards", "parameters_changed_after_construction_are_taken",
         "state_dict_consolidates_and_loads",
         "lr_scheduler_reaches_the_shards", "param_group_added_mid_training",
         "process_set_shards_over_its_ranks",
         "bad_input_is_refused_and_the_library_goes_on"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 3])
def test_zero_redundancy_optimizer(n: int) -> None:
    out = run_ranks(n, "zero_worker.py", timeout=200, env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert_passed(out, n, CASES)


@pytest.mark.timeout(300)
def test_zero_benchmark_runs_and_reports(tmp_path) -> None:
    """benchmarks/bench_zero.py --quick: every configuration runs, and the figures it
    reports for ZeRO hold (state share and parameter difference; no timings asserted)."""
    import json
    import subprocess
    import sys

    from tests.launch import REPO

    out = tmp_path / "zero.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_zero.py"), "--quick",
                           "--json-out", str(out)], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["steps_per_s"]) == {"hvd_zero", "hvd_zero2", "hvd_zero3", "hvd_dist", "torch_zero", "ddp_adam"}
    assert all(v and all(x > 0 for x in v) for v in res["steps_per_s"].values())
    assert res["figures"]["state_share_max"] <= 0.55, res["figures"]
    assert res["figures"]["max_param_diff"] <= 1e-5, res["figures"]
    assert res["figures"]["bytes_per_step"]["hvd_zero"] > 0
