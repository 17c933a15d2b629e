"""Shared bits of the multi-rank test workers: a case registry and deterministic data."""
from __future__ import annotations

import sys
import traceback
from typing import Callable

import numpy as np
import torch

import hvdlite.torch as hvd

CASES: list[Callable[[], None]] = []


def case(fn: Callable[[], None]) -> Callable[[], None]:
    CASES.append(fn)
    return fn


def run_cases(argv: list[str] | None = None) -> None:
    """Run the registered cases (or those named on the command line) on this rank and
    print PASS/FAIL lines; exit non-zero if any failed."""
    torch.set_num_threads(1)
    hvd.init()
    wanted = set((argv if argv is not None else sys.argv[1:]) or [])
    me = hvd.rank()
    failed = 0
    for fn in CASES:
        if wanted and fn.__name__ not in wanted:
            continue
        try:
            fn()
            print(f"PASS {fn.__name__} rank {me}", flush=True)
        except Exception:  # noqa: BLE001 - reported and counted
            failed += 1
            traceback.print_exc()
            print(f"FAIL {fn.__name__} rank {me}", flush=True)
    # Shutting down on one rank stops the others' engines too: finish together.
    hvd.barrier()
    hvd.shutdown()
    sys.exit(1 if failed else 0)


def rank_data(r: int, shape: tuple[int, ...], seed: int = 0, low: int = -8, high: int = 8) -> np.ndarray:
    """Values that are multiples of 1/4 in [low, high): exact in float16 and bfloat16,
    so sums over a few ranks are exact in every float type."""
    rng = np.random.default_rng(1000 * seed + r)
    return rng.integers(4 * low, 4 * high, size=shape).astype(np.float64) / 4.0


def all_ranks(shape: tuple[int, ...], seed: int = 0, **kw) -> list[np.ndarray]:
    return [rank_data(r, shape, seed, **kw) for r in range(hvd.size())]


def to_np(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.to(torch.float64)
    return t.numpy()


def check_close(got: torch.Tensor, want: np.ndarray, what: str, rtol: float = 1e-6,
                atol: float = 1e-6) -> None:
    g = to_np(got)
    if g.shape != tuple(want.shape):
        raise AssertionError(f"{what}: shape {g.shape} != expected {tuple(want.shape)}")
    if not np.allclose(g.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol):
        raise AssertionError(f"{what}: values differ\n got {g.ravel()[:10]}\nwant {want.ravel()[:10]}")
