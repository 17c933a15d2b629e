"""1-bit Adam (``hvdlite.torch.OneBitAdam``) and DistributedOptimizer's
``Compression.topk`` through the real launcher on 2 and 3 ranks. 1-bit Adam:
the sign packing, the warm-up against Adam, the two-phase compressed average against a
NumPy implementation of it, error feedback over many calls, training against Adam, the
checkpointed error buffers, and bad input. Top-k: each step against a NumPy reference
of pick and residual, training, and bad input (see ``workers/onebit_worker.py``)."""
from __future__ import annotations

import pytest

from tests.torch.torch_mp import assert_passed, run_ranks

CASES = ["signs_pack_and_unpack", "warm_up_is_adam", "per_group_betas_after_the_freeze",
         "another_ranks_buffers_are_not_loaded", "compressed_average_matches_its_definition",
         "error_feedback_keeps_the_average", "trains_like_adam", "state_dict_resumes_the_compression",
         "bad_input_is_refused", "topk_sends_the_largest_and_keeps_the_rest", "topk_trains",
         "topk_residuals_are_checkpointed",
         "topk_bad_input_is_refused"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 3])
def test_one_bit_adam(n: int) -> None:
    out = run_ranks(n, "onebit_worker.py", timeout=200)
    assert_passed(out, n, CASES)


@pytest.mark.timeout(300)
def test_onebit_benchmark_runs_and_reports(tmp_path) -> None:
    """benchmarks/bench_onebit.py --quick (2 ranks on this host, 10 steps): every
    optimizer runs, the losses are finite, and 1-bit Adam and top-k send fewer bytes than
    Adam's allreduce (no timings asserted)."""
    import json
    import math
    import subprocess
    import sys

    from tests.launch import REPO

    out = tmp_path / "onebit.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_onebit.py"), "--quick",
                           "--json-out", str(out)], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())["results"]
    assert set(res) == {"adam", "onebit", "topk"}
    for kind, runs in res.items():
        assert runs and all(r["steps_per_s"] > 0 and math.isfinite(r["final_loss"]) for r in runs), (kind, runs)
    adam = res["adam"][0]["bytes_per_step"]
    assert res["onebit"][0]["bytes_per_step"] < adam and res["topk"][0]["bytes_per_step"] < adam
