"""Run on emulated hosts by test_hosts.py, with the fake CUDA runtime and fake NCCL
(tests/fake_cuda): GPU allreduces whose results depend on every host's data, for the
two-level allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE=1) and the flat one it falls back to.

Sums, averages, Min, Max and Product, prescale and postscale, float32, float16 and int32,
sizes no host's rank count divides, in place and not, a fused set, tensors of a few MiB,
and a joined rank; every result is compared with one NumPy computes from what each rank
contributed. Prints ``GPU HOST CHECKS OK rank R`` on each rank that got through.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fake_cuda import device as fake  # noqa: E402

fake.load(os.path.dirname(os.environ["HVDLITE_CUDART_LIBRARY"]))

import hvdlite as hvd  # noqa: E402


def dev(arr: np.ndarray) -> fake.FakeDeviceArray:
    """`arr` on the (fake) GPU, still being written on its own delayed stream."""
    return fake.FakeDeviceArray.from_numpy(arr)


def host(obj) -> np.ndarray:
    return fake.cai_to_numpy(obj)


def part(q: int, count: int, dt, seed: int, low: int = -5, high: int = 6) -> np.ndarray:
    """Rank q's data: small whole numbers, exact in float16 and in every sum here."""
    return ((np.arange(count, dtype=np.int64) * 7 + seed * 13 + q * 5) % (high - low) + low).astype(dt)


def reduce_ref(op, parts: list[np.ndarray]) -> np.ndarray:
    stack = np.stack([p.astype(np.float64) for p in parts])
    if op in (hvd.Sum, hvd.Average):
        out = stack.sum(0)
        return out / len(parts) if op == hvd.Average else out
    if op == hvd.Min:
        return stack.min(0)
    if op == hvd.Max:
        return stack.max(0)
    return stack.prod(0)


def check(got: np.ndarray, want: np.ndarray, dt, what: str) -> None:
    dt = np.dtype(dt)
    assert got.dtype == dt and got.shape == want.shape, (what, got.dtype, got.shape, want.shape)
    if dt.kind in "iu":
        np.testing.assert_array_equal(got.astype(np.float64), np.trunc(want), err_msg=what)
    else:
        tol = {2: 2e-3, 4: 1e-6, 8: 1e-12}[dt.itemsize]
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol, err_msg=what)


def main() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    names = {hvd.Sum: "sum", hvd.Average: "avg", hvd.Min: "min", hvd.Max: "max", hvd.Product: "prod"}

    # Every op and type on sizes that 2 (the ranks of a host) does and does not divide.
    seed = 0
    for dt in (np.float32, np.float16, np.int32):
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
            for count in (7, 1000, 65_537):
                seed += 1
                low, high = (1, 3) if op == hvd.Product else (-5, 6)
                mine = part(r, count, dt, seed, low, high)
                want = reduce_ref(op, [part(q, count, dt, seed, low, high) for q in range(n)])
                name = f"{names[op]}.{np.dtype(dt).name}.{count}"
                check(host(hvd.allreduce(dev(mine), op=op, name=name)), want, dt, name)
                inplace = dev(mine)
                hvd.allreduce_(inplace, op=op, name=name + ".inplace")
                check(host(inplace), want, dt, name + " in place")

    # Scale factors: the whole factor goes into the first level's PreMulSum.
    for dt in (np.float32, np.float16):
        for op in (hvd.Sum, hvd.Average):
            count = 10_001
            mine = part(r, count, dt, 50)
            want = reduce_ref(op, [part(q, count, dt, 50) for q in range(n)]) * 0.5 * 3.0
            name = f"scaled.{names[op]}.{np.dtype(dt).name}"
            got = hvd.allreduce(dev(mine), op=op, prescale_factor=0.5, postscale_factor=3.0, name=name)
            check(host(got), want, dt, name)

    # A fused set: tensors in flight together, none of a size 2 divides.
    handles, wants = [], []
    for i in range(12):
        count = 101 + 34 * i
        handles.append(hvd.allreduce_async(dev(part(r, count, np.float32, 200 + i)), op=hvd.Average,
                                           name=f"fused.{i}"))
        wants.append(reduce_ref(hvd.Average, [part(q, count, np.float32, 200 + i) for q in range(n)]))
    for i, (h, want) in enumerate(zip(handles, wants)):
        check(host(hvd.synchronize(h)), want, np.float32, f"fused.{i}")
    outs = hvd.grouped_allreduce([dev(part(r, 3 + 2 * i, np.float16, 300 + i)) for i in range(5)], op=hvd.Sum,
                                 name="grouped")
    for i, o in enumerate(outs):
        check(host(o), reduce_ref(hvd.Sum, [part(q, 3 + 2 * i, np.float16, 300 + i) for q in range(n)]),
              np.float16, f"grouped.{i}")

    # A few MiB: one tensor 2 divides (reduced where it lies), one it does not (padded).
    for name, count in (("big.even", 3 << 18), ("big.odd", (3 << 18) + 1)):
        mine = part(r, count, np.float32, 400)
        want = reduce_ref(hvd.Sum, [part(q, count, np.float32, 400) for q in range(n)])
        check(host(hvd.allreduce(dev(mine), op=hvd.Sum, name=name)), want, np.float32, name)

    # The last rank joins: its share is zeros, and Average still divides by every rank.
    count = 4097
    if r < n - 1:
        got = hvd.allreduce(dev(part(r, count, np.float32, 500)), op=hvd.Average, name="joined")
        want = reduce_ref(hvd.Sum, [part(q, count, np.float32, 500) for q in range(n - 1)]) / n
        check(host(got), want, np.float32, "joined")
    hvd.join()

    hvd.barrier()
    print(f"GPU HOST CHECKS OK rank {r}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
