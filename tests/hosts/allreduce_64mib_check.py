"""Run on emulated hosts by test_hosts_benchmarks.py: one 64 MiB float32 allreduce,
hvdlite's and mpi4py's ``MPI_Allreduce`` on the same data in the same job.

Every rank checks every result exactly against NumPy (the values are small integers, so
a float32 sum is exact in any order) and prints ``CHECK OK``; rank 0 prints one
``ALLREDUCE64 {json}`` line with the slowest rank's time of each repetition. Which
algorithm hvdlite runs is left to the job's environment (HOROVOD_HIERARCHICAL_ALLREDUCE
set or not)."""
from __future__ import annotations

import argparse
import json
import os
import socket
import time

import numpy as np
from mpi4py import MPI

import hvdlite as hvd


def contribution(rank: int, count: int) -> np.ndarray:
    """Rank ``rank``'s data: integers in [-1024, 1023] that differ between ranks."""
    return ((np.arange(count, dtype=np.int64) * 7 + 13 * rank) % 2048 - 1024).astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=float, default=64.0)
    p.add_argument("--reps", type=int, default=2, help="timed repetitions, after one warm-up")
    args = p.parse_args()
    count = int(args.mib * (1 << 20)) // 4

    hvd.init()
    comm = MPI.COMM_WORLD
    r, n = hvd.rank(), hvd.size()
    assert (r, n) == (comm.Get_rank(), comm.Get_size())
    x = contribution(r, count)
    want = np.zeros(count, np.float32)
    for q in range(n):
        want += contribution(q, count)  # partial sums stay below 2**24: exact
    out = np.empty_like(x)

    def slowest(t: float) -> float:
        return comm.allreduce(t, op=MPI.MAX)

    times: dict[str, list[float]] = {"hvdlite": [], "mpi": []}
    for rep in range(1 + args.reps):
        comm.Barrier()
        t0 = time.perf_counter()
        got = hvd.allreduce(x, op=hvd.Sum, name="allreduce64")
        t_h = slowest(time.perf_counter() - t0)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want, err_msg=f"hvdlite, rank {r}, repetition {rep}")
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(x, out, op=MPI.SUM)
        t_m = slowest(time.perf_counter() - t0)
        np.testing.assert_array_equal(out, want, err_msg=f"MPI_Allreduce, rank {r}, repetition {rep}")
        if rep:  # the first warms the connections and the pages
            times["hvdlite"].append(t_h)
            times["mpi"].append(t_m)
    print(f"CHECK OK rank {r} on {socket.gethostname()}", flush=True)
    if r == 0:
        print("ALLREDUCE64 " + json.dumps({
            "hierarchical": os.environ.get("HOROVOD_HIERARCHICAL_ALLREDUCE", "default"),
            "ranks": n, "local_size": hvd.local_size(), "cross_size": hvd.cross_size(),
            "bytes": 4 * count, **times}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
