"""The case registry and runner of the TensorFlow case workers (tf_adasum_worker.py,
tf_process_sets_worker.py): each case prints ``PASS <case> rank <r>`` or ``FAIL ...``
with its traceback, as the PyTorch workers do (tests/torch/workers/_wcommon.py)."""
from __future__ import annotations

import sys
import traceback
from typing import Any, Callable

CASES: list[Callable[[], None]] = []


def case(fn: Callable[[], None]) -> Callable[[], None]:
    CASES.append(fn)
    return fn


def run_cases(hvd: Any, names: list[str]) -> None:
    """Run the cases named (all if none) on this initialized rank, keeping the ranks in
    step between cases; shut hvdlite down and exit non-zero if any failed."""
    failed = 0
    for fn in CASES:
        if names and fn.__name__ not in names:
            continue
        try:
            fn()
            print(f"PASS {fn.__name__} rank {hvd.rank()}", flush=True)
        except Exception:  # noqa: BLE001 - reported and counted
            failed += 1
            traceback.print_exc()
            print(f"FAIL {fn.__name__} rank {hvd.rank()}", flush=True)
        hvd.barrier()
    hvd.shutdown()
    sys.exit(1 if failed else 0)
