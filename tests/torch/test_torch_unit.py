"""Single-process checks of hvdlite.torch that need no MPI job: compression, the API
surface Horovod scripts use, and argument errors raised before anything is sent."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hvdlite.torch as hvd
from hvdlite.torch.mpi_ops import _stage_move, _stage_reduce

HOROVOD_NAMES = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "start_timeline", "stop_timeline", "Average", "Sum", "Adasum", "Min", "Max",
    "Product", "HorovodInternalError", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
    "reducescatter_async", "barrier", "join", "poll", "synchronize", "broadcast_parameters",
    "broadcast_optimizer_state", "broadcast_object", "allgather_object", "Compression",
    "DistributedOptimizer", "SyncBatchNorm", "global_process_set", "ProcessSet",
    "add_process_set", "remove_process_set"]


def test_horovod_api_names_exist() -> None:
    missing = [n for n in HOROVOD_NAMES if not hasattr(hvd, n)]
    assert not missing, f"missing from hvdlite.torch: {missing}"
    assert hvd.HorovodInternalError is hvd.HvdliteError
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)


def test_process_sets_are_checked_before_anything_is_sent() -> None:
    subset = hvd.ProcessSet([1, 0])  # building one is fine before init, as in Horovod
    assert subset.ranks == [0, 1] and "ranks=[0, 1]" in repr(subset)
    assert (subset.process_set_id, subset.size(), subset.rank(), subset.included()) == (None,) * 4
    with pytest.raises(ValueError, match="ranks must be integers"):
        hvd.ProcessSet([0, "1"])
    # A world of one process: rank 1 does not exist, on any rank.
    try:
        with pytest.raises(ValueError, match=r"rank\(s\) \[1\] outside hvdlite's world of 1"):
            hvd.init(process_sets=[subset])
        with pytest.raises(ValueError, match="not registered"):
            hvd.allreduce(torch.ones(2), process_set=subset)
        with pytest.raises(ValueError, match="HOROVOD_DYNAMIC_PROCESS_SETS"):
            hvd.add_process_set([0])
        assert hvd.global_process_set.ranks == [0] and hvd.global_process_set.process_set_id == 0
        assert hvd.allreduce(torch.ones(2), process_set=hvd.global_process_set).tolist() == [1.0, 1.0]
    finally:
        hvd.shutdown()  # the tests after this one start without hvdlite initialized
    assert hvd.global_process_set.ranks == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("comp,wire", [("fp16", torch.float16), ("bf16", torch.bfloat16),
                                       ("none", None)])
def test_compression_round_trip(dtype: torch.dtype, comp: str, wire: torch.dtype | None) -> None:
    c = getattr(hvd.Compression, comp)
    x = torch.linspace(-3, 3, 101, dtype=torch.float64).to(dtype)
    sent, ctx = c.compress(x)
    assert sent.dtype == (wire or dtype)
    back = c.decompress(sent, ctx)
    assert back.dtype == dtype and back.shape == x.shape
    # Error bounded by the coarser of the two formats' precision.
    eps = max(torch.finfo(dtype).eps, torch.finfo(wire).eps if wire else 0.0)
    assert torch.allclose(back.double(), x.double(), rtol=eps, atol=eps * 3)


def test_compression_leaves_integers_alone() -> None:
    x = torch.arange(10)
    for c in (hvd.Compression.fp16, hvd.Compression.bf16):
        sent, ctx = c.compress(x)
        assert sent.dtype == torch.int64 and torch.equal(c.decompress(sent, ctx), x)


def test_staging_is_zero_copy_for_contiguous_tensors() -> None:
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    st = _stage_reduce(x, hvd.Sum)
    assert st.shares and st.eng.data_ptr() == x.data_ptr() and st.dtype == "float32"
    bf = torch.zeros(4, dtype=torch.bfloat16)
    assert _stage_reduce(bf, hvd.Sum).dtype == "bfloat16"
    t = x.t()
    st = _stage_reduce(t, hvd.Sum)
    assert not st.shares and st.eng.is_contiguous() and torch.equal(st.eng, t)
    b = torch.tensor([True, False])
    st = _stage_move(b)
    assert st.dtype == "uint8" and st.shares and torch.equal(st.back(st.eng), b)
    c = torch.randn(3, 2, dtype=torch.complex64)
    st = _stage_move(c)
    assert st.dtype == "uint8" and st.eng.shape == (3, 16)
    assert torch.equal(st.back(st.eng.clone()), c)
    # 1-D tensors keep their rows: (rows,) -> (rows, itemsize) bytes, not (rows * itemsize,).
    for one_d in (torch.arange(3, dtype=torch.int16), torch.tensor([1j, 2.0, 3j]),
                  torch.zeros(0, dtype=torch.int16),
                  torch.from_numpy(np.zeros(0, dtype=np.int16))):  # stride (0,) from NumPy
        st = _stage_move(one_d)
        assert st.dtype == "uint8" and (st.shares or one_d.numel() == 0)
        assert st.eng.shape == (one_d.shape[0], one_d.element_size())
        back = st.back(st.eng.clone())
        assert back.dtype == one_d.dtype and torch.equal(back, one_d)


def test_unsupported_reductions_raise_type_error() -> None:
    with pytest.raises(TypeError, match="bool"):
        _stage_reduce(torch.tensor([True]), hvd.Sum)
    with pytest.raises(TypeError, match="complex"):
        _stage_reduce(torch.tensor([1j]), hvd.Max)


def test_synchronize_rejects_non_handles() -> None:
    with pytest.raises(TypeError, match="handle"):
        hvd.synchronize(42)


def test_sparse_tensors_are_rejected_with_advice() -> None:
    sp = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (4,),
                                 check_invariants=True)
    with pytest.raises(TypeError, match="sparse"):
        _stage_reduce(sp, hvd.Sum)
