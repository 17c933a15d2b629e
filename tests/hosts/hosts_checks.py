"""Run on emulated hosts by test_hosts.py: what each rank sees of the topology, and
collectives whose results depend on every host's data.

Prints one ``TOPOLOGY {json}`` line per rank and ``CHECKS OK`` on each rank that got
through every collective. Takes the expected host layout as ``--layout 2,2`` (ranks
per host, in host order), and ``--placement node`` when mpirun was told to place the
ranks round robin over the hosts (``--map-by node``) rather than filling each host in
turn. Every result is compared with one NumPy computes from what each rank contributed."""
from __future__ import annotations

import argparse
import json
import os
import socket

import numpy as np

import hvdlite as hvd
from hvdlite.common.codes import NP_DTYPE_OF_NAME

# Horovod's per-worker variables as the launcher set them, before hvd.init().
HOROVOD_NAMES = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "hostname")
HOROVOD_AT_START = {k: os.environ["HOROVOD_" + k.upper()] for k in HOROVOD_NAMES
                    if "HOROVOD_" + k.upper() in os.environ}


def rows_of(q: int, scale: int) -> int:
    """First dimension of rank q's part in the ragged allgathers: rank 0 has none."""
    return (q * 7) % 5 * scale if q else 0


def check_allgathers(r: int, n: int) -> None:
    """Ragged allgathers of every element type, one above the default two-level
    threshold, and small ones in flight together (fused)."""
    def part(q: int, dt: np.dtype, rows: int, cols: int = 3) -> np.ndarray:
        return ((np.arange(rows * cols) % 61) - 30 + 2 * q).reshape(rows, cols).astype(dt)

    for name, dt in NP_DTYPE_OF_NAME.items():
        got = hvd.allgather(part(r, dt, rows_of(r, 3)), name=f"gather.{name}")
        want = np.concatenate([part(q, dt, rows_of(q, 3)) for q in range(n)])
        assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape, want.shape)
        assert got.tobytes() == want.tobytes(), f"allgather of {name} differs"
    # About 0.3-1.5 MB a rank, odd byte counts: pieces of the hosts' segments that no
    # number of ranks divides.
    big = hvd.allgather(part(r, np.uint8, rows_of(r, 100_001), 3), name="gather.big")
    want = np.concatenate([part(q, np.uint8, rows_of(q, 100_001), 3) for q in range(n)])
    assert big.shape == want.shape and (big == want).all()
    # 128-192 KiB in all on 4-6 ranks: below the default's two-level threshold (256 KiB).
    mid = hvd.allgather(np.full(4096, r + 0.5, np.float64), name="gather.mid")
    assert (mid == np.repeat(np.arange(n) + 0.5, 4096)).all()
    # A rank's 1-d part, every rank contributing alike.
    same = hvd.allgather(np.full(70_000, r, np.float64), name="gather.same")
    assert (same == np.repeat(np.arange(n, dtype=np.float64), 70_000)).all()
    # Small allgathers submitted together: the coordinator fuses them, whatever their types.
    kinds = list(NP_DTYPE_OF_NAME.items())
    handles, wants = [], []
    for i in range(24):
        name, dt = kinds[i % len(kinds)]
        cols = 1 + i % 4
        handles.append(hvd.allgather_async(part(r + i, dt, rows_of(r, 50 + i), cols), name=f"fused.{i}"))
        wants.append(np.concatenate([part(q + i, dt, rows_of(q, 50 + i), cols) for q in range(n)]))
    for i, (h, want) in enumerate(zip(handles, wants)):
        got = hvd.synchronize(h)
        assert got.shape == want.shape and got.tobytes() == want.tobytes(), f"fused.{i} differs"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layout", required=True)
    p.add_argument("--mib", type=float, default=4.0, help="size of the large allreduce")
    p.add_argument("--placement", choices=["slot", "node"], default="slot",
                   help="slot: each host filled in turn (mpirun's default); node: round robin")
    args = p.parse_args()
    layout = [int(x) for x in args.layout.split(",")]

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    info = {"rank": r, "size": n, "host": socket.gethostname(), "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
            "cross_size": hvd.cross_size(), "is_homogeneous": hvd.is_homogeneous(),
            "horovod_env_at_start": HOROVOD_AT_START,
            "horovod_env": {k: os.environ.get("HOROVOD_" + k.upper()) for k in HOROVOD_NAMES}}
    print("TOPOLOGY " + json.dumps(info), flush=True)
    assert n == sum(layout), f"size {n}, layout {layout}"

    # Every rank's hostname, gathered: the ranks of one host are consecutive, as -H asks
    # (or dealt round robin, with --map-by node).
    hosts = hvd.allgather_object(info["host"])
    if args.placement == "slot":
        assert hosts == [f"h{i + 1}" for i, k in enumerate(layout) for _ in range(k)], hosts
    else:
        assert hosts == [f"h{q % len(layout) + 1}" for q in range(n)], hosts

    # Small and large allreduces, an allgather and a broadcast that cross the hosts.
    for count in (7, int(args.mib * (1 << 20)) // 4):
        x = (np.arange(count, dtype=np.float32) % 97) * (r + 1)
        got = hvd.allreduce(x, op=hvd.Sum, name=f"sum.{count}")
        want = (np.arange(count, dtype=np.float32) % 97) * (n * (n + 1) / 2)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        got = hvd.allreduce(x, op=hvd.Average, name=f"avg.{count}")
        np.testing.assert_allclose(got, want / n, rtol=1e-6)
    # A size no host's rank count divides, scaled, and other ops and types.
    odd = 1_000_003
    x = np.linspace(-1, 1, odd, dtype=np.float64) + r
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name="scaled")
    want = 1.5 * (n * np.linspace(-1, 1, odd) + n * (n - 1) / 2)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)
    big = (np.arange(odd) % 1000).astype(np.float32)
    np.testing.assert_array_equal(hvd.allreduce(big + r, op=hvd.Max, name="max"), big + (n - 1))
    np.testing.assert_array_equal(hvd.allreduce(big - r, op=hvd.Min, name="min"), big - (n - 1))
    half = np.full(300_001, 0.25 * (r + 1), np.float16)
    np.testing.assert_allclose(hvd.allreduce(half, op=hvd.Sum, name="half").astype(np.float32),
                               0.25 * n * (n + 1) / 2, rtol=1e-3)
    # Many small tensors in flight together: fused.
    parts = [np.full(1000 + 17 * i, i + r, np.float32) for i in range(40)]
    outs = hvd.grouped_allreduce(parts, op=hvd.Sum, name="group")
    for i, o in enumerate(outs):
        np.testing.assert_allclose(o, n * i + n * (n - 1) / 2)
    check_allgathers(r, n)
    gathered = hvd.allgather(np.full((r + 1, 3), r, np.int64), name="ragged")
    assert gathered.shape == (n * (n + 1) // 2, 3)
    assert list(gathered[:, 0]) == [i for i in range(n) for _ in range(i + 1)]
    b = hvd.broadcast(np.full(5, r, np.float64), root_rank=n - 1, name="from_last")
    assert (b == n - 1).all()
    hvd.barrier()
    print("CHECKS OK", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
