"""The timeline of a training step shows gradient allreduces overlapping backward.

``workers/overlap_worker.py`` trains a 5-layer model whose backward pass sleeps 100 ms
per layer (0.1 s), with ``HVDLITE_TIMELINE`` set. Rank 0's Chrome trace names every tensor in a
``process_name`` metadata event; per step, the allreduce of the last layer (whose
gradient is ready first) must have finished before the first layer's gradient was even
handed to the engine -- impossible unless communication overlaps backward.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from tests.torch.torch_mp import run_ranks

LAYERS = 5
DELAY_US = 100_000


def load_phases(path: Path) -> dict[str, dict[str, list[tuple[int, int]]]]:
    """tensor name -> phase name -> [(start_us, end_us), ...] in time order."""
    events = json.loads(path.read_text())
    assert isinstance(events, list) and events, "the trace must be a non-empty JSON array"
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    phases: dict[str, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    open_b: dict[tuple, int] = {}
    for e in events:
        if e.get("ph") == "M" or e.get("pid") not in names:
            continue
        tensor = names[e["pid"]]
        if e["ph"] == "X":
            phases[tensor][e["name"]].append((e["ts"], e["ts"] + e.get("dur", 0)))
        elif e["ph"] == "B":
            open_b[(e["pid"], e.get("tid"), e["name"])] = e["ts"]
        elif e["ph"] == "E":
            key = (e["pid"], e.get("tid"), e.get("name"))
            start = open_b.pop(key, None)
            if start is None:  # an E without a name closes the innermost B of that thread
                key = next(k for k in reversed(list(open_b)) if k[:2] == (e["pid"], e.get("tid")))
                start = open_b.pop(key)
            phases[tensor][key[2]].append((start, e["ts"]))
    for t in phases.values():
        for v in t.values():
            v.sort()
    return phases


def collective(phases: dict[str, list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """The data-plane phases of a tensor, in time order: MPI_ALLREDUCE, or CYCLE_ALLREDUCE
    where the cycle that agreed on a small tensor also reduced it."""
    spans = sorted(span for name, v in phases.items()
                   if "ALLREDUCE" in name and not name.startswith("NEGOTIATE") for span in v)
    assert spans, f"no allreduce phase among {sorted(phases)}"
    return spans


def merged(phases: dict[str, dict[str, list[tuple[int, int]]]], names: list[str]) -> dict[str, list[tuple[int, int]]]:
    """The phases of several timeline rows as one row (a bucket under each of its names)."""
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for name in names:
        for phase, spans in phases[name].items():
            out[phase].extend(spans)
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["per_tensor", "buckets"])
def test_allreduce_overlaps_backward(tmp_path: Path, mode: str) -> None:
    trace = tmp_path / "timeline.json"
    out = run_ranks(2, "overlap_worker.py", mode, env={"HVDLITE_TIMELINE": str(trace)}, timeout=150)
    assert out.count("BACKWARD_S") == 3
    phases = load_phases(trace)
    if mode == "per_tensor":
        last, first = [f"allreduce.layers.{LAYERS - 1}.weight"], ["allreduce.layers.0.weight"]
    else:
        # A bucket per layer, the last layer's first; the layout may change after the
        # first step (a new generation of names), so a bucket is its rows of both.
        buckets = [n for n in phases if n.startswith(f"allreduce.bucket.layers.{LAYERS - 1}.bias.")]
        last = [n for n in buckets if n.endswith(".0")]
        first = [n for n in buckets if n.endswith(f".{LAYERS - 1}")]
        assert last and first, f"no bucket rows among {sorted(phases)}"
    for names in (last, first):
        for name in names:
            assert name in phases, f"tensor {name} missing from the trace: {sorted(phases)[:20]}"
            assert "QUEUE" in phases[name], f"{name} has no QUEUE phase: {sorted(phases[name])}"
    last_done = collective(merged(phases, last))
    first_submitted = merged(phases, first)["QUEUE"]
    assert len(last_done) == len(first_submitted) == 3, (last_done, first_submitted)
    for step, ((_, done), (submitted, _)) in enumerate(zip(last_done, first_submitted)):
        # The last layer's allreduce ended at least one layer's backward time before the
        # first layer's gradient existed.
        assert done + DELAY_US <= submitted, (
            f"step {step}: last layer's allreduce ended at {done} us, first layer's gradient "
            f"was submitted at {submitted} us: no overlap with backward")


NAMES_SCRIPT = """
import sys
import torch
import hvdlite.torch as hvd

hvd.init()
hvd.allreduce(torch.tensor([1.0, 2.0, 3.0]), name="test_allreduce")
hvd.allgather(torch.ones(2), name="test_allgather")
hvd.broadcast(torch.ones(2), root_rank=0, name="test_broadcast")
hvd.allreduce(torch.ones(2))
hvd.barrier()
rank = hvd.rank()
hvd.shutdown()
print(f"ALL CHECKS PASSED rank {rank}", flush=True)
"""


@pytest.mark.timeout(120)
def test_tensor_rows_carry_horovods_pytorch_names(tmp_path: Path) -> None:
    """As in Horovod's PyTorch API, a request named NAME is the timeline row
    ``allreduce.NAME`` (``allgather.NAME``, ...); unnamed ones ``allreduce.noname.N``."""
    script = tmp_path / "names.py"
    script.write_text(NAMES_SCRIPT)
    trace = tmp_path / "timeline.json"
    run_ranks(2, str(script), env={"HOROVOD_TIMELINE": str(trace)}, timeout=100)
    rows = set(load_phases(trace))
    assert {"allreduce.test_allreduce", "allgather.test_allgather", "broadcast.test_broadcast",
            "allreduce.noname.0"} <= rows, sorted(rows)
    assert "NEGOTIATE_ALLREDUCE" in load_phases(trace)["allreduce.test_allreduce"]
