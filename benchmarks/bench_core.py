"""hvdlite's core allreduce path against raw MPI (mpi4py), side by side in one run.

Run with two (or more) ranks::

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \\
        python benchmarks/bench_core.py [--quick] [--json-out F.json] [--plot F.png]
                                        [--results PATH]

Every measurement times hvdlite and its mpi4py peer(s) in interleaved repetitions
(A B A B ...), so that whatever else the machine is doing hits both; each side's
number is the median over repetitions of the per-call (or per-iteration) time, taken
as the slowest rank's time. Rank 0 prints one JSON line per measurement with the
fields ``name, hvdlite_us, peer, peer_us, ratio, target`` (ratio = hvdlite / peer;
lower is better, at or below ``target`` is the goal), then a table. See
``benchmarks/README.md`` for what each row means.

Before timing, every operation is run once on known data and its result compared
with the expected sum, so the benchmark never times a wrong answer.

Rank 0 also writes the results file (``benchmarks/_common.py``: command, machine, date,
commit, every row), by default ``benchmarks/results/bench_core.json``; ``--quick`` writes
none unless ``--results PATH`` is given.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ResultsRun, add_results_options, command_line, results_path  # noqa: E402
from resnet50_shapes import RESNET50_SHAPES  # noqa: E402  (sibling module)

KiB = 1024
MiB = 1024 * KiB

Fn = Callable[[], Any]


# --------------------------------------------------------------------------- results

@dataclass
class Row:
    """One measurement: hvdlite's time, its best peer's time and their ratio."""
    name: str
    hvdlite_us: float
    peer: str
    peer_us: float
    target: float | None
    peers: dict[str, float] = field(default_factory=dict)
    nbytes: int | None = None
    iters: int = 0
    reps: int = 0
    note: str = ""
    # the fastest repetition of each side (µs), where the row keeps every repetition
    hvdlite_min_us: float | None = None
    peer_min_us: float | None = None

    @property
    def ratio(self) -> float:
        return self.hvdlite_us / self.peer_us if self.peer_us > 0 else math.inf

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "hvdlite_us": round(self.hvdlite_us, 3),
            "peer": self.peer,
            "peer_us": round(self.peer_us, 3),
            "ratio": round(self.ratio, 4),
            "target": self.target,
        }
        if len(self.peers) > 1:
            d["peers_us"] = {k: round(v, 3) for k, v in self.peers.items()}
        if self.nbytes is not None:
            d["bytes"] = self.nbytes
            d["hvdlite_GBps"] = round(self.nbytes / self.hvdlite_us / 1e3, 3)
            d["peer_GBps"] = round(self.nbytes / self.peer_us / 1e3, 3)
        d["iters"] = self.iters
        d["reps"] = self.reps
        if self.hvdlite_min_us is not None and self.peer_min_us is not None:
            d["hvdlite_min_us"] = round(self.hvdlite_min_us, 3)
            d["peer_min_us"] = round(self.peer_min_us, 3)
        if self.note:
            d["note"] = self.note
        return d


def fmt_time(us: float) -> str:
    """Microseconds as a short human string."""
    if us < 1e3:
        return f"{us:.1f} us"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.2f} s"


def fmt_bytes(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


# --------------------------------------------------------------------------- harness

class Harness:
    """Times callables on every rank and compares hvdlite with its peers."""

    def __init__(self, comm: Any, MPI: Any, quick: bool) -> None:
        self.comm = comm
        self.MPI = MPI
        self.quick = quick
        self.rows: list[Row] = []

    def time_per_iter(self, fn: Fn, iters: int) -> float:
        """Seconds per call of ``fn`` over ``iters`` calls, the slowest rank's time."""
        self.comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        dt = time.perf_counter() - t0
        return self.comm.allreduce(dt, op=self.MPI.MAX) / iters

    def compare(self, name: str, hvd_fn: Fn, peers: dict[str, Fn], *, iters: int,
                reps: int, warmup: int, target: float | None,
                nbytes: int | None = None, note: str = "") -> Row:
        """Interleave ``reps`` repetitions of hvdlite and each peer (A B A B ...) and
        record the medians. The ratio is taken against the fastest peer."""
        everyone: dict[str, Fn] = {"hvdlite": hvd_fn, **peers}
        for fn in everyone.values():
            for _ in range(warmup):
                fn()
        samples: dict[str, list[float]] = {k: [] for k in everyone}
        for _ in range(reps):
            for key, fn in everyone.items():
                samples[key].append(self.time_per_iter(fn, iters))
        med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
        peer_meds = {k: med[k] for k in peers}
        best = min(peer_meds, key=peer_meds.__getitem__)
        row = Row(name, med["hvdlite"], best, peer_meds[best], target, peer_meds,
                  nbytes, iters, reps, note, min(samples["hvdlite"]) * 1e6, min(samples[best]) * 1e6)
        self.emit(row)
        return row

    def emit(self, row: Row) -> None:
        self.rows.append(row)
        if self.comm.rank == 0:
            print(json.dumps(row.as_dict()), flush=True)


def expect_equal(what: str, got: np.ndarray, want: np.ndarray) -> None:
    """Fail loudly (on every rank) when hvdlite's result is wrong."""
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-6, atol=0):
        bad = np.flatnonzero(~np.isclose(got.ravel(), want.ravel(), rtol=1e-6, atol=0))
        raise AssertionError(
            f"{what}: hvdlite returned a wrong result (shape {got.shape} vs {want.shape}; "
            f"{bad.size} elements differ, first at {bad[:5].tolist()})")


# --------------------------------------------------------------------------- measurements

def bench_latency(h: Harness, hvd: Any) -> None:
    """(a) A lone blocking 4 KiB float32 Sum allreduce, in place and out of place."""
    MPI, comm = h.MPI, h.comm
    n = 4 * KiB // 4
    size = comm.size

    # correctness first
    x = np.full(n, comm.rank + 1, np.float32)
    want = np.full(n, size * (size + 1) / 2, np.float32)
    expect_equal("allreduce 4 KiB", hvd.allreduce(x, name="bench.lat4k.oop", op=hvd.Sum), want)
    hvd.allreduce_(x, name="bench.lat4k", op=hvd.Sum)
    expect_equal("allreduce_ 4 KiB", x, want)

    a = np.zeros(n, np.float32)  # zeros stay zeros under repeated in-place sums
    b = np.zeros(n, np.float32)
    # 10 x 200 timed calls per side (quick: 5 x 20)
    iters, reps, warm = (20, 5, 20) if h.quick else (200, 10, 200)
    h.compare("latency_4KiB_inplace",
              lambda: hvd.allreduce_(a, name="bench.lat4k", op=hvd.Sum),
              {"mpi4py Allreduce(IN_PLACE)": lambda: comm.Allreduce(MPI.IN_PLACE, b)},
              iters=iters, reps=reps, warmup=warm, target=1.1, nbytes=4 * KiB)

    src = np.ones(n, np.float32)
    dst = np.empty(n, np.float32)
    h.compare("latency_4KiB",
              lambda: hvd.allreduce(src, name="bench.lat4k.oop", op=hvd.Sum),
              {"mpi4py Allreduce": lambda: comm.Allreduce(src, dst)},
              iters=iters, reps=reps, warmup=warm, target=1.1, nbytes=4 * KiB,
              note="hvdlite returns a new array; mpi4py writes a preallocated one")


def bench_large(h: Harness, hvd: Any) -> None:
    """(b) One float32 Sum allreduce of 4 MiB and of 64 MiB, in place and out of place."""
    MPI, comm = h.MPI, h.comm
    for nbytes, iters_full, reps_full in ((4 * MiB, 1, 200), (64 * MiB, 3, 10)):
        n = nbytes // 4
        tag = fmt_bytes(nbytes).replace(" ", "")
        x = np.full(n, comm.rank + 1, np.float32)
        want = np.full(n, comm.size * (comm.size + 1) / 2, np.float32)
        expect_equal(f"allreduce {tag}", hvd.allreduce(x, name=f"bench.{tag}.oop", op=hvd.Sum), want)
        hvd.allreduce_(x, name=f"bench.{tag}", op=hvd.Sum)
        expect_equal(f"allreduce_ {tag}", x, want)
        del x, want

        # Both sides reduce the same buffer (zeros stay zeros), so that nothing about
        # the memory differs between them.
        a = np.zeros(n, np.float32)
        iters, reps = (1, 3) if h.quick else (iters_full, reps_full)
        h.compare(f"allreduce_{tag}_inplace",
                  lambda: hvd.allreduce_(a, name=f"bench.{tag}", op=hvd.Sum),
                  {"mpi4py Allreduce(IN_PLACE)": lambda: comm.Allreduce(MPI.IN_PLACE, a)},
                  iters=iters, reps=reps, warmup=1, target=1.05, nbytes=nbytes)
        del a

        src = np.ones(n, np.float32)
        dst = np.empty(n, np.float32)
        h.compare(f"allreduce_{tag}",
                  lambda: hvd.allreduce(src, name=f"bench.{tag}.oop", op=hvd.Sum),
                  {"mpi4py Allreduce": lambda: comm.Allreduce(src, dst)},
                  iters=iters, reps=reps, warmup=1, target=1.05, nbytes=nbytes,
                  note="hvdlite allocates its output; mpi4py writes a preallocated one")
        del src, dst


def allreduce_all(hvd: Any, tensors: list[np.ndarray], names: list[str]) -> None:
    """allreduce_async_ every tensor (in place, fixed names), then synchronize all."""
    handles = [hvd.allreduce_async_(t, name=nm, op=hvd.Sum) for t, nm in zip(tensors, names)]
    for hd in handles:
        hvd.synchronize(hd)


class ResNetSet:
    """ResNet-50's 161 float32 gradient tensors and the ways to allreduce them."""

    def __init__(self, hvd: Any, comm: Any, MPI: Any) -> None:
        self.hvd, self.comm, self.MPI = hvd, comm, MPI
        # Submitted in backward order: the last layer's gradients are ready first.
        order = list(reversed(RESNET50_SHAPES))
        self.names = [f"grad.{name}" for name, _ in order]
        self.tensors = [np.zeros(shape, np.float32) for _, shape in order]
        self.total = sum(t.size for t in self.tensors)
        self.nbytes = self.total * 4
        self.flat = np.zeros(self.total, np.float32)
        self.offsets = np.cumsum([0] + [t.size for t in self.tensors]).tolist()

    def fill(self, value: float) -> None:
        for t in self.tensors:
            t.fill(value)

    def hvdlite(self) -> None:
        allreduce_all(self.hvd, self.tensors, self.names)

    def mpi_per_tensor(self) -> None:
        """161 blocking in-place MPI allreduces."""
        allreduce, in_place = self.comm.Allreduce, self.MPI.IN_PLACE
        for t in self.tensors:
            allreduce(in_place, t)

    def mpi_flat(self) -> None:
        """Copy all into one preallocated buffer, one allreduce, copy back out."""
        flat, off = self.flat, self.offsets
        for i, t in enumerate(self.tensors):
            flat[off[i]:off[i + 1]] = t.ravel()
        self.comm.Allreduce(self.MPI.IN_PLACE, flat)
        for i, t in enumerate(self.tensors):
            t.ravel()[:] = flat[off[i]:off[i + 1]]

    def check(self) -> None:
        """One hvdlite round on known data; every tensor must hold the rank sum."""
        size, rank = self.comm.size, self.comm.rank
        self.fill(rank + 1)
        self.hvdlite()
        want = size * (size + 1) / 2
        for t, nm in zip(self.tensors, self.names):
            if not np.all(t == want):
                raise AssertionError(f"resnet50 set: tensor {nm} holds {t.ravel()[:3]} "
                                     f"instead of {want}")
        self.fill(0.0)

    def peers(self) -> dict[str, Callable[[], None]]:
        return {"mpi4py 161x Allreduce": self.mpi_per_tensor,
                "mpi4py flat buffer": self.mpi_flat}


def bench_resnet(h: Harness, rs: ResNetSet) -> Row:
    """(c) ResNet-50's 161 gradients: hvdlite async vs the better of two MPI plans."""
    rs.check()
    iters = 2 if not h.quick else 1
    reps = 10 if not h.quick else 3
    return h.compare("resnet50_161_tensors", rs.hvdlite, rs.peers(), iters=iters, reps=reps,
                     warmup=1, target=1.2, nbytes=rs.nbytes,
                     note="161 tensors, 25,557,032 float32 values")


def bench_sweep(h: Harness, hvd: Any) -> list[Row]:
    """Message-size sweep 4 KiB ... 64 MiB, in place, for the bandwidth plot."""
    MPI, comm = h.MPI, h.comm
    rows = []
    nbytes = 4 * KiB
    while nbytes <= 64 * MiB:
        n = nbytes // 4
        tag = fmt_bytes(nbytes).replace(" ", "")
        a = np.zeros(n, np.float32)
        b = np.zeros(n, np.float32)
        iters = max(1, min(200, (32 * MiB) // nbytes))
        if h.quick:
            iters = max(1, iters // 20)
        reps = 7 if not h.quick else 3
        rows.append(h.compare(f"sweep_{tag}",
                              lambda: hvd.allreduce_(a, name=f"bench.sweep.{tag}", op=hvd.Sum),
                              {"mpi4py Allreduce(IN_PLACE)": lambda: comm.Allreduce(MPI.IN_PLACE, b)},
                              iters=iters, reps=reps, warmup=min(iters, 10), target=None,
                              nbytes=nbytes))
        del a, b
        nbytes *= 4
    return rows


def reinit(hvd: Any, name: str, value: int | None) -> None:
    """Restart the engine with the tunable ``HVDLITE_<name>`` set to ``value`` (None:
    unset); tunables are read at init."""
    hvd.shutdown()
    if value is None:
        os.environ.pop(f"HVDLITE_{name}", None)
    else:
        os.environ[f"HVDLITE_{name}"] = str(value)
    hvd.init()


def control_stats() -> dict[str, int]:
    """The engine's control-plane counters on this rank (see Engine::Stats)."""
    from hvdlite.common import basics
    return dict(basics._load_core().stats())


class SmallSet:
    """Many small tensors: the case where negotiation, not data, sets the pace."""

    def __init__(self, hvd: Any, count: int = 400, elems: int = 64) -> None:
        self.hvd = hvd
        self.names = [f"model.block{i // 4}.layer{i % 4}.bias.grad" for i in range(count)]
        self.tensors = [np.zeros(elems, np.float32) for _ in range(count)]

    def hvdlite(self) -> None:
        allreduce_all(self.hvd, self.tensors, self.names)


def bench_steady(h: Harness, hvd: Any, rs: ResNetSet, peer_name: str) -> None:
    """(d) A set of tensors repeated, response cache on vs off.

    Two sets: ResNet-50's 161 gradients (data-bound) and 400 tensors of 64 floats
    (negotiation-bound). The cache capacity is read at ``hvd.init()``, so each
    repetition restarts the engine (``shutdown``; set ``HVDLITE_CACHE_CAPACITY``;
    ``init``) once with the cache on (1024) and once off (0), in the order on off,
    off on (so drift hits both alike); the ResNet set's mpi4py peer runs right after
    each block. Besides time, each block records the control-plane traffic per
    iteration, summed over ranks: what the cache is meant to cut."""
    peer_fn = rs.peers()[peer_name]
    small = SmallSet(hvd)
    iters = 50 if not h.quick else 3
    reps = 4 if not h.quick else 2
    samples: dict[str, list[float]] = {}
    traffic: dict[str, list[float]] = {}
    user_setting = os.environ.get("HVDLITE_CACHE_CAPACITY")
    for rep in range(reps):
        modes = (("on", 1024), ("off", 0))
        for mode, cap in (modes if rep % 2 == 0 else modes[::-1]):  # on off, off on, ...
            reinit(hvd, "CACHE_CAPACITY", cap)
            rs.check()             # correctness, and the first (uncached) round
            for name, fn in (("resnet", rs.hvdlite), ("small", small.hvdlite)):
                fn()               # warm: the cache, if on, now knows every tensor
                before = control_stats()["control_bytes_sent"]
                samples.setdefault(f"{name}_{mode}", []).append(h.time_per_iter(fn, iters))
                sent = control_stats()["control_bytes_sent"] - before
                traffic.setdefault(f"{name}_{mode}", []).append(h.comm.allreduce(sent) / iters)
            samples.setdefault("peer", []).append(h.time_per_iter(peer_fn, iters))
    reinit(hvd, "CACHE_CAPACITY", None if user_setting is None else int(user_setting))
    med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    kib = {k: statistics.median(v) / 1024 for k, v in traffic.items()}
    for mode in ("on", "off"):
        h.emit(Row(f"steady_resnet50_cache_{mode}", med[f"resnet_{mode}"], peer_name, med["peer"],
                   1.2, {peer_name: med["peer"]}, rs.nbytes, iters, reps,
                   f"{iters} iterations of the 161-tensor set per repetition; control traffic "
                   f"{kib[f'resnet_{mode}']:.1f} KiB per iteration"))
    for name, label in (("resnet", "resnet50"), ("small", "400_small_tensors")):
        h.emit(Row(f"steady_{label}_cache_on_vs_off", med[f"{name}_on"], "hvdlite cache off",
                   med[f"{name}_off"], 1.0, {"hvdlite cache off": med[f"{name}_off"]}, None,
                   iters, reps,
                   f"ratio < 1: the response cache saves time per iteration; control traffic "
                   f"per iteration (all ranks) {kib[f'{name}_on']:.1f} KiB with the cache, "
                   f"{kib[f'{name}_off']:.1f} KiB without"))


def bench_ring(h: Harness, hvd: Any) -> None:
    """(e) hvdlite's ring allreduce against the same engine calling MPI_Allreduce.

    Each size is timed with Sum and with Average (gradients; MPI_Allreduce needs a pass
    of scaling after it), out of place (as TensorFlow's gradients) and in place (as
    PyTorch's). ``HVDLITE_RING_MIN_SEGMENT_BYTES`` is read at init, so each repetition
    restarts the engine once with the ring (threshold 1 byte) and once without (a
    threshold above every size), in the order on off, off on, ...; mpi4py runs after
    each pair. Ratio = ring / MPI_Allreduce: below 1 where the ring should be used."""
    MPI, comm = h.MPI, h.comm
    sizes = [64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB]
    reps = 12 if not h.quick else 2
    user_setting = os.environ.get("HVDLITE_RING_MIN_SEGMENT_BYTES")
    arrays = {nb: (np.ones(nb // 4, np.float32), np.zeros(nb // 4, np.float32), np.empty(nb // 4, np.float32))
              for nb in sizes}
    samples: dict[str, list[float]] = {}

    def run_sizes(mode: str) -> None:
        for nb, (src, zeros, dst) in arrays.items():
            iters = max(8, min(200, (16 * MiB) // nb)) if not h.quick else 2
            tag = fmt_bytes(nb).replace(" ", "")
            if mode == "mpi4py":  # MPI's sum, for scale: it has no Average
                fns = {"oop": lambda: comm.Allreduce(src, dst),
                       "inplace": lambda: comm.Allreduce(MPI.IN_PLACE, zeros)}
            else:
                fns = {f"{kind}_{op_name}": (
                           (lambda op=op: hvd.allreduce(src, name=f"bench.ring.{op}.{tag}", op=op)) if kind == "oop"
                           else (lambda op=op: hvd.allreduce_(zeros, name=f"bench.ring_.{op}.{tag}", op=op)))
                       for kind in ("oop", "inplace") for op_name, op in (("sum", hvd.Sum), ("avg", hvd.Average))}
            for kind, fn in fns.items():
                for _ in range(3):
                    fn()
                samples.setdefault(f"{tag}.{kind}.{mode}", []).append(h.time_per_iter(fn, iters))

    for rep in range(reps):
        modes = (("ring", 1), ("mpi", 1 << 62))
        for mode, threshold in (modes if rep % 2 == 0 else modes[::-1]):
            reinit(hvd, "RING_MIN_SEGMENT_BYTES", threshold)
            # correctness of both paths first: the average of rank+1 over the ranks
            x = np.full(4 * MiB // 4, comm.rank + 1, np.float32)
            expect_equal(f"{mode} allreduce", hvd.allreduce(x, name="bench.ring.check", op=hvd.Average),
                         np.full_like(x, (comm.size + 1) / 2))
            run_sizes(mode)
        run_sizes("mpi4py")
    reinit(hvd, "RING_MIN_SEGMENT_BYTES", None if user_setting is None else int(user_setting))
    for nb in sizes:
        tag = fmt_bytes(nb).replace(" ", "")
        for kind, where in (("oop", "out of place"), ("inplace", "in place")):
            peer = statistics.median(samples[f"{tag}.{kind}.mpi4py"]) * 1e6
            for op_name, op_label in (("sum", "Sum"), ("avg", "Average")):
                med = {m: statistics.median(samples[f"{tag}.{kind}_{op_name}.{m}"]) * 1e6 for m in ("ring", "mpi")}
                h.emit(Row(f"ring_vs_mpi_{tag}_{kind}_{op_name}", med["ring"], "hvdlite MPI_Allreduce", med["mpi"],
                           None, {"hvdlite MPI_Allreduce": med["mpi"]}, nb, 0, reps,
                           f"{op_label}, {where}; mpi4py's Sum: {fmt_time(peer)}"))


def bench_gather(h: Harness, hvd: Any) -> None:
    """(f) Sparse gradients' allgathers: 10 embedding-like gradients, each a values
    tensor (rows x 64 float32) and an indices tensor (rows int64), with a different row
    count on every rank, all submitted before any is waited for. hvdlite with small
    allgathers fused (the default) and with fusion off (``HVDLITE_FUSION_DIRECT_BYTES=0``;
    read at init, so the engine restarts between the two, alternating the order), against
    one mpi4py Allgatherv per tensor. Ratio = hvdlite / mpi4py."""
    MPI, comm = h.MPI, h.comm
    r, n = comm.rank, comm.size
    pairs = 10
    rows = [8 + q for q in range(n)]
    offs = [sum(rows[:q]) for q in range(n)]
    tensors, names = [], []
    for i in range(pairs):
        tensors += [np.full((rows[r], 64), i + r, np.float32), np.arange(rows[r], dtype=np.int64) + 100 * i + r]
        names += [f"bench.gather.{i}.values", f"bench.gather.{i}.indices"]
    outs = [np.empty((sum(rows),) + t.shape[1:], t.dtype) for t in tensors]
    counts = [[k * (t.size // rows[r]) for k in rows] for t in tensors]
    displs = [[o * (t.size // rows[r]) for o in offs] for t in tensors]

    def hvdlite_all() -> list[np.ndarray]:
        hs = [hvd.allgather_async(t, name=nm) for t, nm in zip(tensors, names)]
        return [hvd.synchronize(x) for x in hs]

    def mpi_all() -> None:
        for t, o, c, d in zip(tensors, outs, counts, displs):
            comm.Allgatherv(t, [o, c, d, MPI.INT64_T if t.dtype == np.int64 else MPI.FLOAT])

    mpi_all()
    iters, reps = (10, 3) if h.quick else (200, 12)
    samples: dict[str, list[float]] = {"fused": [], "unfused": [], "mpi4py": []}
    user_setting = os.environ.get("HVDLITE_FUSION_DIRECT_BYTES")
    default = None if user_setting is None else int(user_setting)
    modes = (("fused", default), ("unfused", 0))
    for rep in range(reps):
        for mode, direct in (modes if rep % 2 == 0 else modes[::-1]):
            reinit(hvd, "FUSION_DIRECT_BYTES", direct)
            for got, want in zip(hvdlite_all(), outs):  # correctness first
                expect_equal(f"{mode} allgather", got, want)
            for _ in range(20):
                hvdlite_all()
            samples[mode].append(h.time_per_iter(hvdlite_all, iters))
        samples["mpi4py"].append(h.time_per_iter(mpi_all, iters))
    reinit(hvd, "FUSION_DIRECT_BYTES", default)
    med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    nbytes = sum(t.nbytes for t in tensors)
    for mode in ("fused", "unfused"):
        h.emit(Row(f"allgather_{2 * pairs}_sparse_{mode}", med[mode], "mpi4py Allgatherv per tensor",
                   med["mpi4py"], None, {"mpi4py Allgatherv per tensor": med["mpi4py"]}, nbytes, iters, reps,
                   f"{2 * pairs} async allgathers, values + indices; fused vs unfused: "
                   f"{med['fused'] / med['unfused']:.2f}"))


# --------------------------------------------------------------------------- output

def print_table(rows: list[Row]) -> None:
    """A human-readable summary of all rows (rank 0)."""
    head = f"{'measurement':34s} {'hvdlite':>11s} {'peer':>11s}  {'ratio':>7s} {'target':>7s}  {'':4s} peer"
    print()
    print(head)
    print("-" * len(head) + "-" * 20)
    for r in rows:
        tgt = f"{r.target:.2f}" if r.target is not None else "-"
        ok = "" if r.target is None else ("ok" if r.ratio <= r.target else "MISS")
        print(f"{r.name:34s} {fmt_time(r.hvdlite_us):>11s} {fmt_time(r.peer_us):>11s}  "
              f"{r.ratio:7.3f} {tgt:>7s}  {ok:4s} {r.peer}")
    steady = [r for r in rows if r.name.startswith("steady_") and r.note]
    if steady:
        print()
        for r in steady:
            print(f"{r.name}: {r.note}")
    sweep = [r for r in rows if r.name.startswith("sweep_") and r.nbytes]
    if sweep:
        print()
        print(f"{'size':>8s} {'hvdlite GB/s':>13s} {'mpi4py GB/s':>12s}")
        for r in sweep:
            print(f"{fmt_bytes(r.nbytes or 0):>8s} {r.nbytes / r.hvdlite_us / 1e3:13.2f} "
                  f"{r.nbytes / r.peer_us / 1e3:12.2f}")


def write_plot(rows: list[Row], path: str, title: str) -> None:
    """Bar chart of the ratios with their targets; bandwidth curves of the sweep."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [r for r in rows if not r.name.startswith("sweep_")]
    sweep = [r for r in rows if r.name.startswith("sweep_") and r.nbytes]
    fig, axes = plt.subplots(1, 2 if sweep else 1, figsize=(15 if sweep else 9, 5.5),
                             squeeze=False)
    ax = axes[0][0]
    xs = np.arange(len(bars))
    ratios = [r.ratio for r in bars]
    colors = ["tab:green" if r.target is not None and r.ratio <= r.target else "tab:red"
              for r in bars]
    ax.bar(xs, ratios, color=colors)
    for x, r in zip(xs, bars):
        if r.target is not None:
            ax.hlines(r.target, x - 0.42, x + 0.42, colors="black", linestyles="--")
        top = max(r.ratio, r.target or 0.0) * 1.04
        ax.annotate(f"{r.ratio:.2f}", (x, top), ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([r.name for r in bars], rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("hvdlite / peer time (log; lower is better)")
    ax.set_title("ratios (dashed: target; green: met)")
    if sweep:
        ax2 = axes[0][1]
        sizes = [r.nbytes for r in sweep]
        ax2.plot(sizes, [r.nbytes / r.hvdlite_us / 1e3 for r in sweep], "o-", label="hvdlite")
        ax2.plot(sizes, [r.nbytes / r.peer_us / 1e3 for r in sweep], "s--", label="mpi4py")
        ax2.set_xscale("log", base=2)
        ax2.set_xticks(sizes)
        ax2.set_xticklabels([fmt_bytes(s) for s in sizes], fontsize=8)
        ax2.set_xlabel("message size (float32, in place, Sum)")
        ax2.set_ylabel("algorithm bandwidth, GB/s")
        ax2.set_title("allreduce bandwidth")
        ax2.grid(True, alpha=0.3)
        ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="about 20x fewer iterations: for development, not for numbers")
    p.add_argument("--json-out", metavar="F", help="write the list of measurements as JSON")
    p.add_argument("--plot", metavar="F.png", help="write a PNG chart of the ratios")
    p.add_argument("--no-sweep", action="store_true", help="skip the message-size sweep")
    p.add_argument("--no-steady", action="store_true",
                   help="skip the steady-state (response cache on/off) measurement")
    p.add_argument("--only", metavar="PARTS",
                   help="comma-separated subset of: latency, large, resnet, sweep, steady, ring, gather")
    add_results_options(p, "bench_core")
    args = p.parse_args(argv)
    parts = {"latency", "large", "resnet", "sweep", "steady", "ring", "gather"}
    args.parts = parts if not args.only else set(args.only.split(","))
    if not args.parts <= parts:
        p.error(f"--only: unknown part(s) {', '.join(sorted(args.parts - parts))}")
    if args.no_sweep:
        args.parts.discard("sweep")
    if args.no_steady:
        args.parts.discard("steady")
    return args


def summary_rows(rows: list[Row]) -> list[dict[str, Any]]:
    """The ratios the performance page shows: every row but the sweep's (which it plots)."""
    return [{"name": r.name, "ratio": round(r.ratio, 4), "peer": r.peer, "target": r.target}
            for r in rows if not r.name.startswith("sweep_")]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = ResultsRun("bench_core")
    import hvdlite as hvd
    hvd.init()
    from mpi4py import MPI  # after hvd.init(), as in a user's script; MPI is up already
    comm = MPI.COMM_WORLD
    if comm.size != hvd.size():
        raise SystemExit(f"hvdlite's world ({hvd.size()}) is not MPI_COMM_WORLD ({comm.size})")
    h = Harness(comm, MPI, args.quick)
    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
              MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    title = (f"hvdlite vs mpi4py, {comm.size} ranks{' (quick)' if args.quick else ''}, "
             f"MPI thread level {levels.get(MPI.Query_thread(), '?')}")
    if comm.rank == 0:
        print(f"# {title}; started {time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    t_start = time.perf_counter()

    if "latency" in args.parts:
        bench_latency(h, hvd)
    if "large" in args.parts:
        bench_large(h, hvd)
    if args.parts & {"resnet", "steady"}:
        rs = ResNetSet(hvd, comm, MPI)
        resnet_row = bench_resnet(h, rs)
        if "steady" in args.parts:
            bench_steady(h, hvd, rs, resnet_row.peer)
    if "sweep" in args.parts:
        bench_sweep(h, hvd)
    if "ring" in args.parts:
        bench_ring(h, hvd)
    if "gather" in args.parts:
        bench_gather(h, hvd)

    if comm.rank == 0:
        print_table(h.rows)
        print(f"\n# total time {time.perf_counter() - t_start:.1f} s", flush=True)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps([r.as_dict() for r in h.rows], indent=1) + "\n")
        if args.plot:
            write_plot(h.rows, args.plot, title)
        settings = {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()}
        run.write(results_path(args, "bench_core", args.quick), [r.as_dict() for r in h.rows],
                  summary_rows(h.rows), dict(settings, ranks=comm.size), args.notes,
                  command=command_line(None if argv is None else [sys.argv[0], *argv],
                                       launcher=f"hvdlite-run -np {comm.size} python"),
                  extra={"mpi_thread_level": levels.get(MPI.Query_thread(), "?"),
                         "mpi_library": MPI.Get_library_version().splitlines()[0].strip(" \x00")})
    comm.Barrier()
    hvd.shutdown()


if __name__ == "__main__":
    main()
