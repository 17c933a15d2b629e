"""The bookkeeping of benchmarks/bench_horovod.py, without Horovod, MPI or PyTorch.

The benchmark itself needs a Horovod build (benchmarks/build_horovod.sh) and is never run
here; these tests check what turns its jobs' output into the reported ratios: the result
line found behind a launcher's tag, the order of the configurations across rounds, and the
per-round ratios, worked out by hand below.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_horovod.py"
_spec = importlib.util.spec_from_file_location("bench_horovod", _PATH)
bh = importlib.util.module_from_spec(_spec)
sys.modules["bench_horovod"] = bh
_spec.loader.exec_module(bh)


def test_find_result_behind_horovodrun_tag_and_raw() -> None:
    payload = {"library": "horovod", "rows": {"a": {"us": 1.5}}}
    tagged = ("[1,1]<stderr>: noise\n"
              f"[1,0]<stdout>: {bh.RESULT_TAG} {json.dumps(payload)}\n"
              "[1,0]<stdout>: after\n")
    assert bh.find_result(tagged) == payload
    raw = f"hello\n{bh.RESULT_TAG} {json.dumps({'x': 2})}\n"
    assert bh.find_result(raw) == {"x": 2}
    assert bh.find_result(f"{bh.RESULT_TAG}X {{}}\nnothing here\n") is None


def test_round_order_puts_each_configuration_first_once() -> None:
    configs = ["hvdlite", "horovod", "horovod_yield"]
    orders = [bh.round_order(configs, r) for r in range(3)]
    assert [o[0] for o in orders] == configs
    assert all(sorted(o) == sorted(configs) for o in orders)
    assert bh.round_order(["hvdlite", "horovod"], 1) == ["horovod", "hvdlite"]
    assert bh.round_order(["hvdlite", "horovod"], 2) == ["hvdlite", "horovod"]


def _job(rnd: int, config: str, us: float, floor: float, mlp: float) -> dict:
    return {"round": rnd, "config": config,
            "rows": {"allreduce_4KiB": {"us": us, "mpi4py_us": floor, "bytes": 4096, "iters": 100, "reps": 10}},
            "training": {"mlp": {"samples_per_s": mlp, "batch_per_rank": 64, "steps": 20, "windows": 5}}}


def test_summarize_takes_the_median_of_per_round_ratios() -> None:
    jobs = [
        _job(0, "hvdlite", 10.0, 5.0, 1000.0), _job(0, "horovod", 100.0, 6.0, 500.0),
        _job(1, "hvdlite", 20.0, 7.0, 900.0), _job(1, "horovod", 50.0, 8.0, 600.0),
        _job(2, "hvdlite", 30.0, 9.0, 800.0), _job(2, "horovod", 60.0, 4.0, 800.0),
        # a round in which Horovod did not run: counts for hvdlite's median only
        _job(3, "hvdlite", 1e6, 1.0, 1.0),
    ]
    rows = {r["name"]: r for r in bh.summarize(jobs, ["horovod"])}
    ar = rows["allreduce_4KiB"]
    # per-round times 10/100, 20/50, 30/60 -> ratios 0.1, 0.4, 0.5
    assert ar["hvdlite_over_horovod"] == pytest.approx(0.4)
    assert ar["hvdlite_over_horovod_range"] == pytest.approx([0.1, 0.5])
    assert ar["horovod"] == pytest.approx(60.0)
    assert ar["horovod_rounds"] == [100.0, 50.0, 60.0]
    assert ar["hvdlite"] == pytest.approx(25.0)  # median of 10, 20, 30, 1e6
    assert ar["mpi4py_in_hvdlite_job"] == pytest.approx(6.0)  # median of 5, 7, 9, 1
    assert ar["mpi4py_in_horovod_job"] == pytest.approx(6.0)  # median of 6, 8, 4
    assert ar["unit"] == "us" and ar["bytes"] == 4096
    # training: hvdlite's step time over Horovod's = Horovod's samples/s over hvdlite's:
    # 500/1000, 600/900, 800/800 -> 0.5, 0.667, 1.0
    mlp = rows["train_mlp"]
    assert mlp["unit"] == "samples/s"
    assert mlp["hvdlite_over_horovod"] == pytest.approx(600 / 900)
    assert mlp["hvdlite_over_horovod_range"] == pytest.approx([0.5, 1.0])
    assert mlp["batch_per_rank"] == 64


def test_summarize_keeps_each_peer_to_its_own_rounds() -> None:
    jobs = [
        _job(0, "hvdlite", 10.0, 5.0, 100.0), _job(0, "horovod", 40.0, 5.0, 50.0),
        _job(0, "horovod_yield", 20.0, 5.0, 80.0),
        _job(1, "hvdlite", 30.0, 5.0, 100.0), _job(1, "horovod", 60.0, 5.0, 25.0),
    ]
    row = next(r for r in bh.summarize(jobs, ["horovod", "horovod_yield"]) if r["name"] == "allreduce_4KiB")
    assert row["hvdlite_over_horovod"] == pytest.approx((10 / 40 + 30 / 60) / 2)
    assert row["hvdlite_over_horovod_yield"] == pytest.approx(0.5)  # round 0 only
    assert row["horovod_yield_rounds"] == [20.0]
