"""GPU tensors go through host memory (copy, MPI, copy back) in stream order.

Skipped without CUDA. Each rank uses GPU ``local_rank % device_count``.
"""
from __future__ import annotations

import pytest
import torch

from tests.torch.torch_mp import assert_passed, run_ranks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU available")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [1, 2])
def test_gpu_tensors_through_host(n: int) -> None:
    out = run_ranks(n, "gpu_worker.py", timeout=250)
    assert_passed(out, n, ["gpu_collectives", "gpu_training"])
