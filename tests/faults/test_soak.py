"""A short soak in CI: ``benchmarks/bench_faults.py`` with each of its nine faults
twice, in turn (the benchmark runs 100 at random). Every run must end by itself with
status 0, with every sample trained once per epoch, the same parameters on every
survivor and nothing left behind; the table of detection times and gaps is printed.

Needs root (network namespaces); skipped with the reason otherwise."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.hosts.emulated import unavailable

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_faults.py"


@pytest.mark.timeout(1800)
def test_short_soak_of_random_faults() -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    spec = importlib.util.spec_from_file_location("bench_faults", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--runs", str(2 * len(bench.FAULTS)), "--in-turn", "--seed", "1", "--results", ""]) == 0
