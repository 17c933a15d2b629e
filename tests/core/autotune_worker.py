"""Trains nothing but runs a training loop's collectives under HOROVOD_AUTOTUNE: every
step allreduces the same named "gradients" (and allgathers one), each result checked
against NumPy on every rank, so that settings the tuner switches mid-run (fusion
threshold, cycle time, response cache) are seen to keep every rank's collectives
matched and exact. Prints ``OK rank <r> steps <n>``."""
from __future__ import annotations

import sys

import numpy as np

import hvdlite as hvd

STEPS = int(sys.argv[1])
SIZES = [1024, 70_000, 300_000, 16, 2_000_000, 5000]  # elements: below and above the candidates


def main() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for step in range(STEPS):
        grads = [np.full(s, float(r + step + i), np.float32) for i, s in enumerate(SIZES)]
        handles = [hvd.allreduce_async(g, op=hvd.Sum, name=f"grad.{i}") for i, g in enumerate(grads)]
        rows = hvd.allgather(np.full((r + 1, 2), step, np.int64), name="rows")
        for i, h in enumerate(handles):
            got = hvd.synchronize(h)
            want = sum(float(q + step + i) for q in range(n))
            assert got.shape == (SIZES[i],) and np.all(got == want), (step, i, got[:3], want)
        assert rows.shape == (n * (n + 1) // 2, 2) and np.all(rows == step), (step, rows)
    print(f"OK rank {r} steps {STEPS}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
