"""CUDA tensors through hvdlite.torch, checked against CPU references. Run with
HOROVOD_GPU_OPERATIONS=NCCL (the default) or MPI (through host memory)."""
from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdlite.torch as hvd
from hvdlite.common import basics as _basics
from _wcommon import all_ranks, case, check_close, run_cases


def device() -> torch.device:
    return torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())


@case
def gpu_collectives() -> None:
    r, n = hvd.rank(), hvd.size()
    dev = device()
    torch.cuda.set_device(dev)
    # On a side stream: the collective must follow the side stream's work (the input is
    # produced there by a slow chain of kernels) and the result be ready on it after.
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        x = torch.full((1 << 20,), float(r + 1), device=dev)
        for _ in range(20):
            x = x * 1.0001
        h = hvd.allreduce_async(x, op=hvd.Sum, name="side.stream")
        got = hvd.synchronize(h) * 1.0  # queued on the side stream right away
    torch.cuda.synchronize()
    want = sum(k + 1 for k in range(n)) * 1.0001 ** 20
    check_close(got[:4], np.full(4, want), "allreduce on a side stream", rtol=1e-5)
    xs = all_ranks((1000, 8), seed=1)
    # Produced by a kernel still queued on the current stream when the op starts.
    big = torch.tensor(xs[r], dtype=torch.float32, device=dev)
    y = (big * 3.0).sin()
    out = hvd.allreduce(y, op=hvd.Sum)
    assert out.device == dev
    check_close(out, np.sum([np.sin(a * 3.0) for a in xs], 0), "cuda allreduce", rtol=1e-5, atol=1e-5)
    # In place, then used by a kernel right away.
    z = torch.tensor(xs[r], dtype=torch.float64, device=dev)
    hvd.allreduce_(z, op=hvd.Max)
    check_close(z * 2, 2 * np.max(xs, 0), "cuda allreduce_")
    g = hvd.allgather(torch.full((r + 1, 2), float(r), device=dev))
    assert g.device == dev
    check_close(g, np.concatenate([np.full((k + 1, 2), float(k)) for k in range(n)]), "cuda allgather")
    b = torch.full((3,), float(r), device=dev, dtype=torch.bfloat16)
    hvd.broadcast_(b, root_rank=n - 1)
    check_close(b, np.full(3, float(n - 1)), "cuda broadcast_")
    a = hvd.alltoall(torch.arange(2 * n, device=dev, dtype=torch.float32) + 100 * r)
    want = np.concatenate([np.arange(2 * n)[2 * r:2 * r + 2] + 100 * k for k in range(n)])
    check_close(a, want, "cuda alltoall")


@case
def gpu_training() -> None:
    r, n = hvd.rank(), hvd.size()
    dev = device()
    torch.manual_seed(1 + r)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2)).double().to(dev)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    torch.manual_seed(1)
    ref = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2)).double()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)

    def data(k: int, s: int):
        g = torch.Generator().manual_seed(100 * s + k)
        return torch.randn(4, 5, generator=g, dtype=torch.float64), torch.randn(4, 2, generator=g, dtype=torch.float64)

    for s in range(3):
        opt.zero_grad()
        x, y = data(r, s)
        F.mse_loss(model(x.to(dev)), y.to(dev)).backward()
        opt.step()
        ref_opt.zero_grad()
        (sum(F.mse_loss(ref(data(k, s)[0]), data(k, s)[1]) for k in range(n)) / n).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.cpu(), q, atol=1e-10), "GPU training differs from the CPU reference"


def built_as_in_an_elastic_job(build):
    """Alone, DistributedOptimizer reduces nothing (as in Horovod) except in an elastic
    job; built as in one, its gradients go through the engine at any size."""
    os.environ["HVDLITE_ELASTIC"] = "1"
    try:
        return build()
    finally:
        del os.environ["HVDLITE_ELASTIC"]


@case
def gpu_buckets() -> None:
    r = hvd.rank()
    dev = device()

    def data(s: int):
        g = torch.Generator().manual_seed(10 * s + r)
        return (torch.randn(4, 5, generator=g, dtype=torch.float64).to(dev),
                torch.randn(4, 2, generator=g, dtype=torch.float64).to(dev))

    def trained(cap):
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                              nn.Linear(16, 2)).double().to(dev)
        opt = built_as_in_an_elastic_job(lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            named_parameters=model.named_parameters(), bucket_cap_mb=cap))
        for s in range(4):
            opt.zero_grad()
            x, y = data(s)
            F.mse_loss(model(x), y).backward()
            opt.step()
        return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]), opt

    want, _ = trained(None)
    got, opt = trained(25)
    assert (got - want).abs().max().item() <= 1e-12, "CUDA buckets differ from the per-tensor path"
    assert opt._hvd_buckets is not None and opt._hvd_buckets.buckets[0].flat.device == dev
    # Gradients on another device than their bucket: the model moved to the GPU after
    # the optimizer was built. step() fails on every rank, naming the problem.
    model = nn.Linear(5, 2).double()
    opt = built_as_in_an_elastic_job(lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()))
    model.to(dev)
    x, y = data(0)
    F.mse_loss(model(x), y).backward()
    try:
        opt.step()
    except hvd.HorovodInternalError as e:
        assert "changed shape, dtype or device" in str(e), str(e)
    else:
        raise AssertionError("a gradient on another device than its bucket must fail step()")


@case
def gpu_sync_batch_norm() -> None:
    r, n = hvd.rank(), hvd.size()
    dev = device()
    torch.manual_seed(3)
    bn = hvd.SyncBatchNorm(4).to(dev).double()
    xs = [torch.randn(5 + k, 4, 3, generator=torch.Generator().manual_seed(k), dtype=torch.float64) for k in range(n)]
    y = bn(xs[r].to(dev))
    full = torch.cat(xs)
    mean = full.mean((0, 2), keepdim=True)
    var = full.var((0, 2), unbiased=False, keepdim=True)
    want = ((xs[r] - mean) / torch.sqrt(var + bn.eps)).numpy()
    check_close(y, want, "SyncBatchNorm on CUDA", rtol=1e-9, atol=1e-9)


@case
def gpu_digits_cnn_matches_cpu() -> None:
    """A few steps of a small CNN with DistributedOptimizer on CUDA end where the same
    steps end on the CPU in one process on the global batch."""
    r, n = hvd.rank(), hvd.size()
    dev = device()

    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10)).double()

    model, ref = make().to(dev), make()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    g = torch.Generator().manual_seed(7)
    for _ in range(4):
        x = torch.rand(8 * n, 1, 8, 8, generator=g, dtype=torch.float64)
        y = torch.randint(0, 10, (8 * n,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x[8 * r:8 * r + 8].to(dev)), y[8 * r:8 * r + 8].to(dev)).backward()
        opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.cpu(), q, atol=1e-9), "CUDA training differs from the CPU reference"
    # The gradients were reduced on the GPU (by NCCL, or host-staged under MPI), not
    # copied to the host by the front end.
    assert _basics._load_core().stats()["device_collectives"] > 0



def same_steps_on_gpu_and_cpu(build_optimizer, seed: int, sizes: tuple[int, int, int], steps: int,
                              batch: int, what: str, gathered: bool = False):
    """Trains a float64 MLP of `sizes` (inputs, hidden, classes) on this rank's GPU and a
    copy on the CPU with the same batches, each under ``build_optimizer(model, i)`` (i: 0
    for the GPU's, 1 for the CPU's), and checks that the GPU's parameters end where the
    CPU's do (``gathered``: compared inside the optimizers' ``gathered_parameters()``,
    ZeRO stage 3). Returns the GPU's optimizer."""
    dev = device()
    inputs, hidden, classes = sizes
    g = torch.Generator().manual_seed(seed + hvd.rank())
    data = [(torch.randn(batch, inputs, generator=g, dtype=torch.float64),
             torch.randint(0, classes, (batch,), generator=g)) for _ in range(steps)]
    runs = []
    for i, d in enumerate((dev, torch.device("cpu"))):
        torch.manual_seed(seed)
        m = nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, classes)).double().to(d)
        runs.append((m, build_optimizer(m, i), d))
    for xb, yb in data:
        for m, opt, d in runs:
            opt.zero_grad()
            F.cross_entropy(m(xb.to(d)), yb.to(d)).backward()
            opt.step()
    import contextlib
    with contextlib.ExitStack() as stack:
        if gathered:
            for _, opt, _ in runs:
                stack.enter_context(opt.gathered_parameters())
        for p, q in zip(runs[0][0].parameters(), runs[1][0].parameters()):
            assert p.is_cuda and torch.allclose(p.cpu(), q, atol=1e-9), f"{what} on CUDA differs from the CPU"
    return runs[0][1]


@case
def gpu_zero_and_one_bit_adam() -> None:
    """ZeroRedundancyOptimizer on CUDA parameters (float64) ends where the same steps end
    on the CPU, and OneBitAdam's compressed average on the GPU gives what it gives on the
    CPU for the same inputs, call after call (the CPU paths are checked against
    DistributedOptimizer and a NumPy reference in test_zero.py and test_onebit.py); the
    1-bit signs packed on the GPU equal those packed on the CPU."""
    from hvdlite.torch.onebit import pack_signs, unpack_signs
    r, n = hvd.rank(), hvd.size()
    dev = device()
    x = torch.randn(8 * 999, generator=torch.Generator().manual_seed(3))
    assert torch.equal(pack_signs(x.to(dev)).cpu(), pack_signs(x))
    assert torch.equal(unpack_signs(pack_signs(x).to(dev), torch.float32).cpu(),
                       unpack_signs(pack_signs(x), torch.float32))

    same_steps_on_gpu_and_cpu(
        lambda m, i: hvd.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.Adam, lr=0.01,
                                                 bucket_cap_mb=0.002),
        seed=100, sizes=(12, 32, 4), steps=12, batch=16, what="ZeRO")

    length = 8 * n * 64
    b_gpu, b_cpu = (hvd.OneBitAdam(nn.Linear(length, 1, bias=False).to(d).parameters(), lr=0.1, freeze_step=0)
                    for d in (dev, torch.device("cpu")))
    for call in range(5):
        v = torch.randn(length, generator=torch.Generator().manual_seed(10 * call + r))
        got, want = b_gpu._compressed_average(v.to(dev)), b_cpu._compressed_average(v.clone())
        assert got.is_cuda and torch.allclose(got.cpu(), want, atol=1e-5), call


@case
def gpu_zero_offload() -> None:
    """ZeroRedundancyOptimizer(offload_optimizer="cpu") on CUDA parameters (float64), at
    stages 1, 2 and 3: the master shards, their gradients and Adam's state in pinned host
    memory, stepped by PyTorch's fused CPU Adam, and the parameters end where the same
    steps end on the CPU (where offload changes nothing)."""
    for stage in (1, 2, 3):
        built = []

        def build(m, i, stage=stage):
            opt = hvd.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.Adam, lr=0.01,
                                              bucket_cap_mb=0.002, stage=stage, offload_optimizer="cpu",
                                              **({"model": m} if stage == 3 else {}))
            built.append(opt)
            return opt

        same_steps_on_gpu_and_cpu(build, seed=300 + stage, sizes=(12, 32, 4), steps=8, batch=16,
                                  what=f"ZeRO-Offload at stage {stage}", gathered=stage == 3)
        gpu_opt, cpu_opt = built
        assert gpu_opt._offloaded() and not cpu_opt._offloaded()
        assert gpu_opt.optim.defaults.get("fused") is True, gpu_opt.optim.defaults
        for f in (f for fs in gpu_opt._flats for f in fs):
            assert f.master.device.type == "cpu" and f.master.is_pinned() and f.grad.is_pinned()
            assert f.device_shard.is_cuda
        state = [v for st in gpu_opt.optim.state.values() for v in st.values() if torch.is_tensor(v)]
        assert state and all(v.device.type == "cpu" for v in state), [v.device for v in state]


@case
def gpu_topk_compression() -> None:
    """DistributedOptimizer with Compression.topk on CUDA parameters ends where the same
    steps end on the CPU (the residuals stay on the GPU with their parameters). At size 1
    the optimizer adds no hooks and sends nothing, as Horovod's."""
    opt = same_steps_on_gpu_and_cpu(
        lambda m, i: hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                              named_parameters=[(f"topk{i}.{k}", v) for k, v in m.named_parameters()],
                                              compression=hvd.Compression.topk(0.25)),
        seed=200, sizes=(10, 24, 3), steps=8, batch=8, what="top-k")
    if hvd.size() > 1:  # at size 1 the optimizer sends nothing, so keeps no residuals
        residuals = opt.state_dict()["hvdlite_topk"]["residuals"]
        assert residuals and all(t.is_cuda for t in residuals.values()), residuals


if __name__ == "__main__":
    run_cases()
