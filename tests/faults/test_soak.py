"""A short soak in CI: ``benchmarks/bench_faults.py`` with seven of its eight faults
twice each, in turn (the benchmark runs 100 at random). Every run must end by itself
with status 0, with every sample trained once per epoch, the same parameters on every
survivor and nothing left behind; the table of detection times and gaps is printed.

Left out: ``kill worker``, whose runs on emulated hosts hang now and then (about 1 in
6; docs/elastic.md, Faults: both survivors wait in the same allgather and rank 0 never
gets the other's request), a known fault not yet understood. A killed worker is still
tested here by every other path that ends a worker's process: ``kill rank 0``, the OOM
killer (test_elastic_faults.py) and the single-host kills of tests/elastic.

Needs root (network namespaces); skipped with the reason otherwise."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.hosts.emulated import unavailable

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_faults.py"


@pytest.mark.timeout(1500)
def test_short_soak_of_random_faults() -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    spec = importlib.util.spec_from_file_location("bench_faults", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    faults = [f for f in bench.FAULTS if f != "kill worker"]
    assert bench.main(["--runs", str(2 * len(faults)), "--in-turn", "--seed", "1", "--faults", ",".join(faults),
                       "--results", ""]) == 0
