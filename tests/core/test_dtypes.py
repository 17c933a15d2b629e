"""Allreduce of every element type with every reduce op against NumPy's arithmetic
(tests/core/dtype_checks.py), through the real launcher: each of the engine's paths, the
NumPy, PyTorch and TensorFlow front ends, the global set and a process set. Integer
inputs span their type's whole range, so sums and products wrap around."""
from __future__ import annotations

import importlib.util

import pytest

from tests.core.launch import assert_all_ranks_passed, run_ranks

PATHS = ("negotiated", "carried", "fused", "set", "adasum")


def assert_paths_passed(proc, n: int, paths=PATHS) -> None:
    assert_all_ranks_passed(proc, n)
    for path in paths:
        if path == "set" and n == 1:
            continue  # one rank has no process set apart from the global one
        for r in range(n):
            assert f"PASS {path} rank {r}" in proc.stdout, (path, r, proc.stdout[-3000:])


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_type_and_op_matches_numpy(n: int) -> None:
    """NumPy front end: negotiated (MPI_Allreduce), carried inside cycles, fused, on a
    process set, and Adasum on the float types (1, 2 and 4 ranks)."""
    proc = run_ranks(n, "dtype_checks.py", "--paths", ",".join(PATHS), timeout=300)
    assert_paths_passed(proc, n)


@pytest.mark.parametrize("n", [2, 3])
def test_every_type_and_op_matches_numpy_on_the_ring(n: int) -> None:
    """With the ring's threshold at one byte, every allreduce of at least one element per
    rank runs on hvdlite's ring over MPI point-to-point."""
    paths = ("negotiated", "fused", "set")
    proc = run_ranks(n, "dtype_checks.py", "--paths", ",".join(paths),
                     env={"HVDLITE_RING_MIN_SEGMENT_BYTES": "1"}, timeout=300)
    assert_paths_passed(proc, n, paths)


def test_every_type_and_op_matches_numpy_without_the_response_cache() -> None:
    paths = ("negotiated", "fused", "set")
    proc = run_ranks(3, "dtype_checks.py", "--paths", ",".join(paths), env={"HVDLITE_CACHE_CAPACITY": "0"},
                     timeout=300)
    assert_paths_passed(proc, 3, paths)


@pytest.mark.parametrize("frontend,n", [("torch", 3), ("tensorflow", 2)])
def test_every_type_and_op_matches_numpy_from_the_frameworks(frontend: str, n: int) -> None:
    """PyTorch (int16 too, reduced in int32 and wrapped back) and TensorFlow tensors."""
    if importlib.util.find_spec(frontend) is None:
        pytest.skip(f"{frontend} is not installed")
    proc = run_ranks(n, "dtype_checks.py", "--frontend", frontend, "--paths", ",".join(PATHS), timeout=400)
    assert_paths_passed(proc, n)
