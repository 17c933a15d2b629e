"""hvdlite's GPU path on the fake CUDA runtime and fake NCCL (tests/fake_cuda), through
the NumPy front end: objects exposing ``__cuda_array_interface__`` whose contents are
written asynchronously on a delayed stream of their own, so a collective that did not
wait for its producer, or a reader that did not wait for the collective, sees wrong
data. Results are read back with the fake's own helpers (honouring the interface's
``stream``), independently of hvdlite, and compared with NumPy.

Run by tests/gpu/test_gpu.py through hvdlite-run with the fake libraries configured;
``python gpu_checks.py [check ...]`` runs the named checks only.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fake_cuda import device as fake  # noqa: E402

fake.load(os.path.dirname(os.environ["HVDLITE_CUDART_LIBRARY"]))

import hvdlite as hvd  # noqa: E402
from hvdlite.common import basics as _basics  # noqa: E402
from tests.core.core_checks import close, data_for, reference  # noqa: E402  (the host checks' references)

DTYPES = [np.uint8, np.int8, np.int32, np.int64, np.float16, np.float32, np.float64]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}


def dev(arr: np.ndarray) -> fake.FakeDeviceArray:
    """`arr` on the (fake) GPU, still being written on its own delayed stream."""
    return fake.FakeDeviceArray.from_numpy(arr)


def host(obj) -> np.ndarray:
    """A device result back on the host, ordered after its producer's stream."""
    assert hasattr(obj, "__cuda_array_interface__"), f"expected a device array, got {type(obj).__name__}"
    return fake.cai_to_numpy(obj)


def expect_error(fn, *needles: str) -> str:
    try:
        fn()
    except hvd.HvdliteError as exc:
        msg = str(exc)
        for needle in needles:
            assert needle in msg, f"{needle!r} not in {msg!r}"
        return msg
    raise AssertionError("expected an HvdliteError")


def nccl_calls(name: str) -> int:
    """Lines of this process's NCCL calls named `name` in the fake's log so far."""
    path = os.environ.get("HVDLITE_FAKE_NCCL_LOG")
    if not path or not os.path.exists(path):
        return 0
    pid = f"pid={os.getpid()}"
    with open(path) as f:
        return sum(1 for line in f if line.split(" ", 1)[0] == name and pid in line)


# ---- checks ---------------------------------------------------------------------------

def check_allreduce(r: int, n: int) -> None:
    seed = 1
    for dt in DTYPES:
        for opname, op in OPS.items():
            seed += 1
            shape = (3, int(seed % 5) + 1)
            small = op == hvd.Product or (op == hvd.Sum and np.dtype(dt).itemsize == 1)
            mine = data_for(r, shape, dt, seed, small)
            want = reference(op, [data_for(q, shape, dt, seed, small) for q in range(n)])
            got = hvd.allreduce(dev(mine), op=op, name=f"ar.{np.dtype(dt).name}.{opname}")
            assert isinstance(got, hvd.DeviceArray), type(got)
            assert got.shape == mine.shape and got.dtype == mine.dtype
            close(host(got), want, dt, f"allreduce {np.dtype(dt).name} {opname}")
            close(got.get(), want, dt, f"DeviceArray.get {np.dtype(dt).name} {opname}")
            inplace = dev(mine)
            assert hvd.allreduce_(inplace, op=op, name=f"ari.{np.dtype(dt).name}.{opname}") is inplace
            close(host(inplace), want, dt, f"allreduce_ {np.dtype(dt).name} {opname}")


def check_scaled_allreduce(r: int, n: int) -> None:
    """Scale factors: floats through NCCL's PreMulSum, integers through host memory."""
    for dt in (np.float16, np.float32, np.float64, np.int32):
        for op in (hvd.Sum, hvd.Average) if np.dtype(dt).kind == "f" else (hvd.Sum,):
            mine = data_for(r, (17,), dt, 7, small=True)
            pre, post = (0.5, 3.0) if np.dtype(dt).kind == "f" else (2, 3)
            want = reference(op, [data_for(q, (17,), dt, 7, small=True) for q in range(n)]) * pre * post
            got = hvd.allreduce(dev(mine), op=op, prescale_factor=pre, postscale_factor=post,
                                name=f"scaled.{np.dtype(dt).name}.{op}")
            if np.dtype(dt).kind == "f":
                close(host(got), want, dt, f"scaled {np.dtype(dt).name}")
            else:  # exact: whole factors on integers
                np.testing.assert_array_equal(host(got), want.astype(dt))


def nccl_allreduce_ops(count: int) -> list[int]:
    """The `op` of each ncclAllReduce of `count` elements this process made so far."""
    path = os.environ.get("HVDLITE_FAKE_NCCL_LOG")
    pid = f"pid={os.getpid()}"
    ops = []
    for line in open(path) if path and os.path.exists(path) else []:
        if line.startswith("ncclAllReduce ") and pid in line and f"count={count} " in line:
            ops.append(int(line.split(" op=", 1)[1].split()[0]))
    return ops


def check_one_rank_average_and_scaling(r: int, n: int) -> None:
    """On one rank, NCCL's kernel for ncclAvg and PreMulSum (before 2.29.7; the fake says
    2.23.3) leaves the last elements of some counts unwritten (NVIDIA/nccl#1950): an
    Average is ncclSum there (a copy), and a scale factor goes through host memory."""
    if n != 1:
        return
    x = (np.arange(4097) % 97 - 48).astype(np.float32)
    got = hvd.allreduce(dev(x), op=hvd.Average, name="one.avg")
    np.testing.assert_array_equal(host(got), x)
    assert nccl_allreduce_ops(4097) == [0], nccl_allreduce_ops(4097)  # ncclSum, not ncclAvg (4)
    got = hvd.allreduce(dev(x), op=hvd.Sum, prescale_factor=0.5, postscale_factor=0.5, name="one.scaled")
    np.testing.assert_array_equal(host(got), x * np.float32(0.25))
    assert nccl_allreduce_ops(4097) == [0], "a scaled one-rank allreduce reached NCCL"


def check_fusion(r: int, n: int) -> None:
    """Tensors in flight together are fused: fewer NCCL allreduces than tensors, and the
    fake's delay shows any copy into or out of the fusion buffer that was not ordered."""
    before = nccl_calls("ncclAllReduce")
    handles, wants = [], []
    for i in range(24):
        mine = data_for(r, (i + 1, 3), np.float32, 100 + i)
        wants.append(reference(hvd.Sum, [data_for(q, (i + 1, 3), np.float32, 100 + i) for q in range(n)]))
        handles.append(hvd.allreduce_async(dev(mine), op=hvd.Sum, name=f"fuse.{i}"))
    results = [hvd.synchronize(h) for h in handles]
    for i, (got, want) in enumerate(zip(results, wants)):
        close(host(got), want, np.float32, f"fused tensor {i}")
    calls = nccl_calls("ncclAllReduce") - before
    assert 1 <= calls < 24, f"{calls} NCCL allreduces for 24 tensors submitted together"
    grouped = hvd.grouped_allreduce([dev(data_for(r, (5,), np.float64, 200 + i)) for i in range(6)],
                                    op=hvd.Average, name="grouped")
    for i, got in enumerate(grouped):
        close(host(got), reference(hvd.Average, [data_for(q, (5,), np.float64, 200 + i) for q in range(n)]),
              np.float64, f"grouped member {i}")
    print(f"FUSION rank {r}: {calls} NCCL allreduce(s) for 24 tensors", flush=True)


def check_gather_bcast_alltoall_reducescatter(r: int, n: int) -> None:
    for dt in (np.uint8, np.float16, np.float32, np.int64):
        # ragged allgather: rank q contributes q + 1 rows
        mine = data_for(r, (r + 1, 4), dt, 300)
        got = hvd.allgather(dev(mine), name=f"ag.{np.dtype(dt).name}")
        want = np.concatenate([data_for(q, (q + 1, 4), dt, 300) for q in range(n)])
        np.testing.assert_array_equal(host(got), want)
        # equal sizes take ncclAllGather
        got = hvd.allgather(dev(data_for(r, (2, 3), dt, 301)), name=f"ag.eq.{np.dtype(dt).name}")
        np.testing.assert_array_equal(host(got), np.concatenate([data_for(q, (2, 3), dt, 301) for q in range(n)]))
        # broadcast, in place and not
        root = n - 1
        src = data_for(r, (6,), dt, 302)
        want = data_for(root, (6,), dt, 302)
        got = hvd.broadcast(dev(src), root_rank=root, name=f"bc.{np.dtype(dt).name}")
        np.testing.assert_array_equal(host(got), want)
        d = dev(src)
        assert hvd.broadcast_(d, root_rank=root, name=f"bci.{np.dtype(dt).name}") is d
        np.testing.assert_array_equal(host(d), want)
        # alltoall with splits: rank r sends q + 1 rows to rank q
        splits = [q + 1 for q in range(n)]
        mine = data_for(r, (sum(splits), 2), dt, 303)
        got, received = hvd.alltoall(dev(mine), splits=splits, name=f"a2a.{np.dtype(dt).name}")
        want = np.concatenate([data_for(q, (sum(splits), 2), dt, 303)[sum(splits[:r]):sum(splits[:r + 1])]
                               for q in range(n)])
        np.testing.assert_array_equal(host(got), want)
        assert list(received) == [r + 1] * n
    # reducescatter, even and uneven first dimensions
    for rows in (2 * n, 2 * n + 1):
        mine = data_for(r, (rows, 3), np.float32, 304 + rows)
        total = reference(hvd.Sum, [data_for(q, (rows, 3), np.float32, 304 + rows) for q in range(n)])
        counts = [rows // n + (1 if q < rows % n else 0) for q in range(n)]
        start = sum(counts[:r])
        for op in (hvd.Sum, hvd.Average):
            got = hvd.reducescatter(dev(mine), op=op, name=f"rs.{rows}.{op}")
            want = total[start:start + counts[r]] / (n if op == hvd.Average else 1)
            close(host(got), want, np.float32, f"reducescatter rows={rows} op={op}")
    hvd.barrier()


def check_mixed_cycle(r: int, n: int) -> None:
    """Host and GPU tensors in flight together: each goes to its own backend."""
    handles = []
    for i in range(6):
        mine = data_for(r, (8,), np.float32, 400 + i)
        handles.append(hvd.allreduce_async(dev(mine) if i % 2 else mine, op=hvd.Sum, name=f"mixed.{i}"))
    for i, h in enumerate(handles):
        got = hvd.synchronize(h)
        want = reference(hvd.Sum, [data_for(q, (8,), np.float32, 400 + i) for q in range(n)])
        if i % 2:
            close(host(got), want, np.float32, f"mixed gpu {i}")
        else:
            assert isinstance(got, np.ndarray)
            close(got, want, np.float32, f"mixed host {i}")


def check_ordering_under_delay(r: int, n: int) -> None:
    """A chain of collectives, each input the previous result, read back at the end:
    every hand-over goes through streams and events only."""
    x = dev(np.full((1000,), r + 1, np.float64))
    for step in range(5):
        x = hvd.allreduce(x, op=hvd.Sum, name=f"chain.{step}")
    want = float(sum(range(1, n + 1))) * n ** 4
    np.testing.assert_array_equal(host(x), np.full((1000,), want))


def check_errors(r: int, n: int) -> None:
    """Bad input fails on every rank, naming the tensor and the ranks; the next
    collective works."""
    # The same name on a GPU on one rank and in host memory on another.
    mine = data_for(r, (4,), np.float32, 500)
    expect_error(lambda: hvd.allreduce(dev(mine) if r == 0 else mine, name="where"), "where", "device")
    # Shapes differ.
    expect_error(lambda: hvd.allreduce(dev(np.zeros((r + 2,), np.float32)), name="shapes"), "shapes", "shape")
    # Only rank 0's input cannot be used (a non-contiguous device array).
    d = dev(np.zeros((4, 4), np.float32))

    class Strided:
        __cuda_array_interface__ = dict(d.__cuda_array_interface__, shape=(4, 2), strides=(16, 8))
    expect_error(lambda: hvd.allreduce(Strided() if r == 0 else dev(np.zeros((4, 2), np.float32)), name="strided"),
                 "strided", "rank 0", "contiguous")
    # A second GPU in one process (on one rank only): hvdlite drives one GPU per process.
    if r == n - 1:
        fake.check(fake.lib().cudaSetDevice(1), "cudaSetDevice")
        other = dev(np.ones(4, np.float32))
        fake.check(fake.lib().cudaSetDevice(0), "cudaSetDevice")
    else:
        other = dev(np.ones(4, np.float32))
    expect_error(lambda: hvd.allreduce(other, name="second.gpu"), "second.gpu", f"rank {n - 1}", "one GPU per process")
    got = hvd.allreduce(dev(np.ones((3,), np.float32)), op=hvd.Sum, name="after.errors")
    np.testing.assert_array_equal(host(got), np.full((3,), n, np.float32))


class DlpackOnly:
    """A device array that only speaks DLPack (as a JAX array does)."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self._inner.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._inner.__dlpack_device__()


def check_dlpack_and_bfloat16(r: int, n: int) -> None:
    """Objects that only export DLPack on a CUDA device, bfloat16 included (the array
    interface has no type string for it)."""
    import ml_dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
    for dt in (np.float32, bf16):
        mine = (np.arange(12, dtype=np.float32) * (r + 1)).astype(dt).reshape(3, 4)
        src = DlpackOnly(hvd.DeviceArray.from_numpy(mine, 0))
        got = hvd.allreduce(src, op=hvd.Sum, name=f"dlpack.{dt}")
        assert isinstance(got, hvd.DeviceArray) and got.dtype == dt, (type(got), got.dtype)
        want = (np.arange(12, dtype=np.float64) * sum(q + 1 for q in range(n))).reshape(3, 4)
        close(got.get(), want, dt if dt != bf16 else np.float16, f"DLPack allreduce {dt}")
        g = hvd.allgather(DlpackOnly(hvd.DeviceArray.from_numpy(mine, 0)), name=f"dlpack.ag.{dt}")
        np.testing.assert_array_equal(g.get().astype(np.float32),
                                      np.concatenate([(np.arange(12, dtype=np.float32) * (q + 1)).astype(dt)
                                                      .astype(np.float32).reshape(3, 4) for q in range(n)]))


def check_timeline(r: int, n: int) -> None:
    """NCCL phases appear in the timeline (rank 0 writes it)."""
    path = os.environ["GPU_TIMELINE"]
    hvd.start_timeline(path)
    for i in range(3):
        hvd.allreduce(dev(np.ones((64,), np.float32)), name=f"traced.{i}")
    hvd.allgather(dev(np.ones((2, 2), np.float32)), name="traced.gather")
    hvd.barrier()
    time.sleep(0.2)  # the completion of the last collective is seen by polling
    hvd.allreduce(np.ones(1, np.float32), name="traced.flush")
    hvd.stop_timeline()
    if r == 0:
        events = json.loads(Path(path).read_text())
        phases = {e.get("name") for e in events}
        assert "NCCL_ALLREDUCE" in phases and "NCCL_ALLGATHER" in phases, sorted(p for p in phases if p)


def check_restart(r: int, n: int) -> None:
    """shutdown() destroys the NCCL communicators; init() again makes new ones."""
    hvd.barrier()  # shutdown() on one rank stops every rank: all finish what came before
    hvd.shutdown()
    hvd.init()
    got = hvd.allreduce(dev(np.full((5,), r, np.float32)), op=hvd.Sum, name="after.restart")
    np.testing.assert_array_equal(host(got), np.full((5,), sum(range(n)), np.float32))


def check_queued_work_is_watched_cheaply(r: int, n: int) -> None:
    """GPU work still queued is watched without asking NCCL about every collective at
    every engine step: about once per collective (when its event is first seen fired),
    and about the oldest one still running at most once a millisecond. 100 allreduces
    queued one after another (the fake's stream delays each) would otherwise be asked
    about thousands of times."""
    k = 100
    x = dev(np.ones(64, np.float32))
    hvd.barrier()
    before = nccl_calls("ncclCommGetAsyncError")
    start = time.monotonic()
    for _ in range(k):
        hvd.allreduce_(x, op=hvd.Average, name="watched")
    np.testing.assert_array_equal(host(x), np.ones(64, np.float32))
    elapsed_ms = (time.monotonic() - start) * 1e3
    asked = nccl_calls("ncclCommGetAsyncError") - before
    assert asked <= 2 * k + elapsed_ms + 10, \
        f"NCCL was asked for errors {asked} times for {k} collectives in {elapsed_ms:.0f} ms"
    print(f"WATCHED rank {r}: {asked} error queries for {k} collectives in {elapsed_ms:.0f} ms", flush=True)


CHECKS = [check_allreduce, check_scaled_allreduce, check_fusion, check_gather_bcast_alltoall_reducescatter,
          check_mixed_cycle, check_ordering_under_delay, check_dlpack_and_bfloat16, check_errors, check_timeline,
          check_restart, check_one_rank_average_and_scaling, check_queued_work_is_watched_cheaply]


def main() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    wanted = set(sys.argv[1:])
    for check in CHECKS:
        if wanted and check.__name__ not in wanted:
            continue
        check(r, n)
        print(f"PASS {check.__name__} rank {r}", flush=True)
    print(f"stats rank {r}: {json.dumps(_basics._load_core().stats())}", flush=True)
    print(f"ALL CHECKS PASSED rank {r}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
