"""Several features at once, on 4 ranks through hvdlite-run (tests/core/test_parity.py):
static process sets and a dynamic one beside global collectives, Adasum against its
pairwise formula, a timeline started and stopped while the job runs, all while the
autotuner searches (its log is read by the test). Each rank prints
``PARITY OK rank <r>`` when every check passed.

Usage: parity_worker.py TIMELINE_PATH STEPS
"""
from __future__ import annotations

import json
import sys

import numpy as np

import hvdlite as hvd


def adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Adasum of two vectors: (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b."""
    dot = float(np.dot(a, b))
    return (1 - dot / (2 * float(np.dot(a, a)))) * a + (1 - dot / (2 * float(np.dot(b, b)))) * b


def main() -> None:
    timeline, steps = sys.argv[1], int(sys.argv[2])
    evens, odds = hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 3])
    hvd.init(process_sets=[evens, odds])
    r, n = hvd.rank(), hvd.size()
    assert n == 4, f"run on 4 ranks, not {n}"
    mine = evens if r % 2 == 0 else odds
    assert mine.included() and mine.size() == 2 and mine.rank() == r // 2
    other = odds if r % 2 == 0 else evens
    assert not other.included() and other.rank() == -1

    rng = np.random.default_rng(5)
    vecs = [rng.standard_normal(1000) for _ in range(n)]  # every rank draws all four
    for step in range(steps):
        # The same names every step: the autotuner's steps, and the response cache.
        x = np.full(256, float(r + step), np.float32)
        got = hvd.allreduce(x, op=hvd.Sum, name="parity.global")
        np.testing.assert_allclose(got, np.full(256, float(sum(range(n)) + n * step)), err_msg="global")
        got = hvd.allreduce(x, op=hvd.Sum, name="parity.set", process_set=mine)
        members = [q for q in range(n) if q % 2 == r % 2]
        np.testing.assert_allclose(got, np.full(256, float(sum(members) + 2 * step)), err_msg="static set")
        g = hvd.allgather(np.full((r + 1, 2), r, np.int32), name="parity.gather")
        np.testing.assert_array_equal(g, np.concatenate([np.full((q + 1, 2), q, np.int32) for q in range(n)]))
        if step == steps // 3:
            hvd.start_timeline(timeline)
        if step == steps // 3 + 3:
            hvd.stop_timeline()
        if step % 10 == 0:
            # A dynamic set of three ranks beside the static ones and the global set.
            trio = hvd.add_process_set([0, 1, 2])
            if r < 3:
                got = hvd.allreduce(np.array([float(r)]), op=hvd.Sum, name="parity.trio", process_set=trio)
                np.testing.assert_allclose(got, [3.0], err_msg="dynamic set")
            else:
                assert not trio.included()
            hvd.remove_process_set(trio)
            # Adasum over the four ranks: pairs (0,1) and (2,3), then the two results.
            got = hvd.allreduce(vecs[r], op=hvd.Adasum, name="parity.adasum")
            want = adasum_pair(adasum_pair(vecs[0], vecs[1]), adasum_pair(vecs[2], vecs[3]))
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg="Adasum")
    hvd.barrier()
    if r == 0:
        with open(timeline) as f:
            events = json.load(f)
        events = events["traceEvents"] if isinstance(events, dict) else events
        names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
        assert "parity.global" in names and "parity.set" not in names, names  # rank 0's global set only
        assert any(e.get("ph") == "X" for e in events), "no phases in the timeline"
    hvd.shutdown()
    print(f"PARITY OK rank {r}", flush=True)


if __name__ == "__main__":
    main()
