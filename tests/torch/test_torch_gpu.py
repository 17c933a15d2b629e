"""CUDA tensors through hvdlite.torch: NCCL on hvdlite's own stream, ordered after the
current stream and before it again, no host waits; and the same through host memory
and MPI (HOROVOD_GPU_OPERATIONS=MPI).

Needs PyTorch with CUDA: skipped on machines without a GPU (the GPU path itself is
tested there on the fake CUDA runtime and NCCL, tests/gpu). NCCL refuses two ranks on
one GPU, so the 2-rank NCCL run needs two GPUs; through MPI two or four ranks share one.
Each rank uses GPU ``local_rank % device_count``.
"""
from __future__ import annotations

import pytest
import torch

from tests.torch.torch_mp import assert_passed, run_ranks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU available")
CASES = ["gpu_collectives", "gpu_training", "gpu_buckets", "gpu_sync_batch_norm", "gpu_digits_cnn_matches_cpu",
         "gpu_zero_and_one_bit_adam", "gpu_zero_offload", "gpu_topk_compression"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("backend", ["NCCL", "MPI"])
def test_cuda_tensors(n: int, backend: str) -> None:
    if backend == "NCCL" and n > torch.cuda.device_count():
        pytest.skip(f"{n} ranks need {n} GPUs (NCCL refuses two ranks on one GPU); "
                    f"this machine has {torch.cuda.device_count()}")
    out = run_ranks(n, "gpu_worker.py", timeout=250, env={"HOROVOD_GPU_OPERATIONS": backend})
    assert_passed(out, n, CASES)


@pytest.mark.timeout(300)
def test_zero_optimizer_on_cuda_follows_an_elastic_reset(tmp_path) -> None:
    """tests/elastic's ZeRO case with the model on the GPU and the collectives through
    host memory (HOROVOD_GPU_OPERATIONS=MPI: 4 ranks may share one GPU, which NCCL
    refuses): rank 1 dies at step 20; the survivors shard again and reload the whole
    committed state (kept on the CPU) into their CUDA optimizers."""
    import json
    from tests.elastic.test_elastic import ELASTIC, TRAIN, _check_survivors
    from tests.launch import run_job
    out = tmp_path / "out"
    out.mkdir()
    proc = run_job(4, TRAIN, "--out", str(out), "--optimizer", "zero", "--device", "cuda",
                   env={"HVDLITE_TEST_KILL": "1:20", "HOROVOD_GPU_OPERATIONS": "MPI"},
                   launcher_args=ELASTIC, timeout=250)
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    _check_survivors(proc, results, 4, {1})
    for r in results:
        assert r["device"].startswith("cuda"), r["device"]
        assert r["optimizer_steps"] == [float(r["steps"])], (r["optimizer_steps"], r["steps"])
