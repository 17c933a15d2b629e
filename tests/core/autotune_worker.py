"""Trains nothing but runs a training loop's collectives under HOROVOD_AUTOTUNE: every
step allreduces the same named "gradients" (and allgathers one), each result checked
against NumPy on every rank, so that settings the tuner switches mid-run (fusion
threshold, cycle time, response cache) are seen to keep every rank's collectives
matched and exact. With ``sets`` as second argument, ranks 1 to N-1 form a process set
that allreduces its own gradients every step beside the global ones; at the end every
member's set engine must run with the settings the global set's tuner kept. Prints
``OK rank <r> steps <n>``."""
from __future__ import annotations

import sys

import numpy as np

import hvdlite as hvd
from hvdlite.common.basics import core

STEPS = int(sys.argv[1])
SIZES = [1024, 70_000, 300_000, 16, 2_000_000, 5000]  # elements: below and above the candidates


SETS = len(sys.argv) > 2 and sys.argv[2] == "sets"
TUNED = ("fusion_threshold_bytes", "cycle_time_ms", "response_cache")


def main() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    members = hvd.add_process_set(range(1, n)) if SETS else None   # HOROVOD_DYNAMIC_PROCESS_SETS=1
    in_set = SETS and members.included()
    for step in range(STEPS):
        grads = [np.full(s, float(r + step + i), np.float32) for i, s in enumerate(SIZES)]
        handles = [hvd.allreduce_async(g, op=hvd.Sum, name=f"grad.{i}") for i, g in enumerate(grads)]
        if in_set:
            set_handles = [hvd.allreduce_async(g, op=hvd.Sum, name=f"set.grad.{i}", process_set=members)
                           for i, g in enumerate(grads)]
        rows = hvd.allgather(np.full((r + 1, 2), step, np.int64), name="rows")
        for i, h in enumerate(handles):
            got = hvd.synchronize(h)
            want = sum(float(q + step + i) for q in range(n))
            assert got.shape == (SIZES[i],) and np.all(got == want), (step, i, got[:3], want)
        if in_set:
            for i, h in enumerate(set_handles):
                got = hvd.synchronize(h)
                want = sum(float(q + step + i) for q in range(1, n))
                assert np.all(got == want), (step, i, got[:3], want)
        assert rows.shape == (n * (n + 1) // 2, 2) and np.all(rows == step), (step, rows)
    if SETS:
        # Every rank's global engine has applied the tuner's last settings once this
        # barrier completes, and the set's rank 0 has been handed them; a request new to
        # the set goes to its rank 0 after that, so its list follows theirs everywhere.
        hvd.barrier()
        world = core().stats()  # hvdlite's own counters, and the settings in force
        if in_set:
            hvd.allreduce(np.ones(3, np.float32), name="set.after_tuning", process_set=members)
            mine = core().stats(members.process_set_id)
            assert world["tunables_applied"] > 0, world
            assert mine["tunables_applied"] > 0, mine
            assert [mine[k] for k in TUNED] == [world[k] for k in TUNED], (mine, world)
            print(f"SET rank {r} " + " ".join(f"{k}={mine[k]}" for k in TUNED), flush=True)
        hvd.barrier()   # rank 0's shutdown would stop the others' global engines
    print(f"OK rank {r} steps {STEPS}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
