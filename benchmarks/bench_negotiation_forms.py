"""What a negotiation round costs before a collective, in two forms, with raw mpi4py.

Run with 2 ranks::

    mpirun -np 2 python benchmarks/bench_negotiation_forms.py [--sizes 4096,4194304] [--reps 400]

For each size, three variants of one in-place float32 ``Allreduce`` are interleaved
(A B C A B C ...), each after a barrier, and their medians printed:

- ``alone``: the allreduce by itself;
- ``via_rank0``: rank 1 sends a small message to rank 0, which answers; then the
  allreduce. This is the shape of hvdlite's negotiation through rank 0 (a tensor not
  in the response cache);
- ``symmetric``: every rank sends a small message to every other at once and receives
  theirs; then the allreduce. This is what agreeing without rank 0 would cost.

The difference of each from ``alone`` is the price of that form of agreement. hvdlite
itself is not involved: this decides whether a protocol change is worth making.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4096,4194304", help="bytes, comma-separated")
    ap.add_argument("--reps", type=int, default=400)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    ctrl = comm.Dup()  # control messages on their own communicator, as in hvdlite
    rank, size = comm.Get_rank(), comm.Get_size()
    msg = np.zeros(8, np.uint8)
    inbox = [np.zeros(8, np.uint8) for _ in range(size)]

    def via_rank0() -> None:
        if rank == 0:
            for r in range(1, size):
                ctrl.Recv(inbox[r], r, 1)
            for r in range(1, size):
                ctrl.Send(msg, r, 2)
        else:
            ctrl.Send(msg, 0, 1)
            ctrl.Recv(inbox[0], 0, 2)

    def symmetric() -> None:
        sends = [ctrl.Isend(msg, r, 3) for r in range(size) if r != rank]
        for r in range(size):
            if r != rank:
                ctrl.Recv(inbox[r], r, 3)
        MPI.Request.Waitall(sends)

    if rank == 0:
        print(f"# {size} ranks, {args.reps} interleaved repetitions, medians in µs")
        print(f"{'bytes':>10} {'alone':>10} {'via_rank0':>10} {'symmetric':>10} "
              f"{'+via_rank0':>11} {'+symmetric':>11}")
    for nbytes in (int(s) for s in args.sizes.split(",")):
        bufs = {k: np.ones(nbytes // 4, np.float32) for k in ("alone", "via_rank0", "symmetric")}
        agree = {"alone": None, "via_rank0": via_rank0, "symmetric": symmetric}
        samples: dict[str, list[float]] = {k: [] for k in bufs}
        for rep in range(args.reps + 2):  # two warm-up rounds
            for k, buf in bufs.items():
                comm.Barrier()
                t = time.perf_counter()
                if agree[k] is not None:
                    agree[k]()
                comm.Allreduce(MPI.IN_PLACE, buf)
                if rep >= 2:
                    samples[k].append(time.perf_counter() - t)
        med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
        if rank == 0:
            print(f"{nbytes:>10} {med['alone']:>10.1f} {med['via_rank0']:>10.1f} "
                  f"{med['symmetric']:>10.1f} {med['via_rank0'] - med['alone']:>+11.1f} "
                  f"{med['symmetric'] - med['alone']:>+11.1f}", flush=True)


if __name__ == "__main__":
    main()
