"""The NumPy front end on a real GPU: CuPy arrays (``__cuda_array_interface__``) through
every collective, produced by kernels still queued on a non-blocking CuPy stream, and
compared with NumPy. Needs CuPy and a GPU; run by tests/gpu/test_gpu.py through
hvdlite-run on as many ranks as there are GPUs (NCCL refuses two ranks on one GPU)."""
from __future__ import annotations

import cupy as cp
import numpy as np

import hvdlite as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
cp.cuda.Device(hvd.local_rank() % cp.cuda.runtime.getDeviceCount()).use()
TOL = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-12}


def data(shape: tuple[int, ...], dtype, k: int) -> np.ndarray:
    return (np.random.default_rng(10 + k).random(shape) * 10).astype(dtype)


def produced(arr: np.ndarray, stream: cp.cuda.Stream) -> cp.ndarray:
    """`arr` on the GPU, written by a chain of kernels queued on `stream` (a collective
    that does not wait for that stream reads it half-written)."""
    with stream:
        x = cp.asarray(arr)
        ones = cp.ones_like(x)
        for _ in range(50):
            x = x * ones
        return x


def host(obj) -> np.ndarray:
    assert hasattr(obj, "__cuda_array_interface__"), f"expected a device result, got {type(obj).__name__}"
    return cp.asnumpy(cp.asarray(obj))


def check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    tol = TOL.get(want.dtype.type, 0)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol,
                               err_msg=what)


side = cp.cuda.Stream(non_blocking=True)
for dtype in [np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64]:
    xs = np.stack([data((1025, 3), dtype, k) for k in range(n)])
    x = produced(xs[r], side)
    ops = {"Sum": (hvd.Sum, xs.sum(0, dtype=dtype)), "Min": (hvd.Min, xs.min(0)), "Max": (hvd.Max, xs.max(0))}
    if np.issubdtype(dtype, np.floating):
        ops["Average"] = (hvd.Average, xs.astype(np.float64).mean(0).astype(dtype))
    for name, (op, want) in ops.items():
        with side:
            out = hvd.allreduce(x, op=op, name=f"ar.{np.dtype(dtype).name}.{name}")
        side.synchronize()
        check(host(out), want, f"allreduce {name} {np.dtype(dtype).name}")
    if dtype is np.float32:
        with side:
            out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name="ar.scaled")
        side.synchronize()
        check(host(out), xs.sum(0) * 1.5, "allreduce with pre/postscale")
        y = produced(xs[r], side)
        with side:
            hvd.allreduce_(y, op=hvd.Sum, name="ar.inplace")
            doubled = y * 2  # queued right after the collective on the same stream
        side.synchronize()
        check(cp.asnumpy(doubled), xs.sum(0) * 2, "allreduce_ in place")
        grouped = hvd.grouped_allreduce([produced(xs[r][:, k].copy(), side) for k in range(3)], op=hvd.Sum)
        for k, g in enumerate(grouped):
            check(host(g), xs.sum(0)[:, k], f"grouped_allreduce member {k}")

    mine = produced(np.full((r + 1, 2), r, dtype=dtype), side)
    check(host(hvd.allgather(mine, name=f"ag.{np.dtype(dtype).name}")),
          np.concatenate([np.full((k + 1, 2), k, dtype=dtype) for k in range(n)]), "allgather")
    b = produced(np.full(7, r + 1, dtype=dtype), side)
    hvd.broadcast_(b, root_rank=n - 1, name=f"bc.{np.dtype(dtype).name}")
    check(cp.asnumpy(b), np.full(7, n, dtype=dtype), "broadcast_")
    send = produced((np.arange(2 * n) + 10 * r).astype(dtype), side)
    check(host(hvd.alltoall(send, name=f"a2a.{np.dtype(dtype).name}")),
          np.concatenate([(np.arange(2 * n) + 10 * k)[2 * r:2 * r + 2] for k in range(n)]).astype(dtype), "alltoall")
    rows = 2 * n + 1  # uneven: the first ranks get one row more, as in Horovod
    rs = np.stack([data((rows, 2), dtype, k) for k in range(n)])
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    start = sum(counts[:r])
    check(host(hvd.reducescatter(produced(rs[r], side), op=hvd.Sum, name=f"rs.{np.dtype(dtype).name}")),
          rs.sum(0, dtype=dtype)[start:start + counts[r]], "reducescatter")

hvd.barrier()
hvd.shutdown()
print(f"ALL CHECKS PASSED rank {r}", flush=True)
