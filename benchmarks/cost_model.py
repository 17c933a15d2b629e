"""Cost model of allreduce across hosts: validated on emulated hosts here,
extrapolated to thousands of ranks, control plane included.

    python benchmarks/cost_model.py                 # tables and JSON lines, from the stored files
    python benchmarks/cost_model.py --plot          # and docs/scale_*.png (needs matplotlib)
    python benchmarks/cost_model.py --measure       # re-measure the parameters (root: emulated hosts)
    python benchmarks/cost_model.py --validate      # re-run bench_hosts.py on emulated hosts (root)

What it models, for H hosts of G ranks each (P = H*G ranks) and an allreduce of S bytes,
in the alpha-beta(-gamma) form: a message between two ranks costs alpha + bytes/bw, and
reducing costs gamma per byte. Links have two levels: inside a host (shared memory here,
NVLink on a GPU server) and between hosts (one stream per NIC; k streams leaving one host
share its NICs, so each gets bw * min(1, nics/k)).

- flat ring over all P ranks (hvdlite's ring, Horovod's MPI ring): 2(P-1) steps of
  S/P; in every step one stream per host crosses its link.
- two-level, as hvdlite implements it (= a 2D torus): ring reduce-scatter inside the
  host, an allreduce across hosts of each rank's S/G share among the ranks of the same
  local rank (G concurrent streams per host), ring allgather inside the host; hvdlite
  runs it in 2 MiB pieces, one after the other.
- hierarchical with a leader: reduce to one rank per host, allreduce of S among the H
  leaders (one stream per host), broadcast inside the host.
- double binary tree (NCCL's tree): pipelined reduce and broadcast over two trees across
  hosts, a chain inside each host.
- recursive doubling and Rabenseifner's reduce-scatter/allgather (what MPI libraries use
  for small and middle sizes), with the rank order that keeps the first steps in the host.

On the emulated hosts (network namespaces, links limited by a tc token bucket, all ranks
on 2 cores) two more effects are modelled: the token bucket (bursts pass at memory speed
until the bucket is empty, then the link's rate holds) and the 2 cores shared by all
ranks. The control plane (one negotiation cycle at P ranks: through rank 0, or one
bit-vector allreduce) is modelled from rank 0's measured cost per message.

Files beside this script: cost_model_params.json (measured parameters, how and when),
cost_model_validation.json (bench_hosts.py rows the validation uses). docs/scale_model.md,
written from both by make_performance_page.py, explains the formulas, sources and conclusions.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PARAMS_FILE = HERE / "cost_model_params.json"
VALIDATION_FILE = HERE / "cost_model_validation.json"
DOCS = REPO / "docs"

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# hvdlite's own settings that shape its algorithms (hvdlite/csrc/common/parameters.h, mpi_backend.cc)
HVD_FLAT_PIECE = 4 * MiB          # HVDLITE_HOST_CHUNK_BYTES: a flat allreduce runs in these pieces
HVD_TWO_LEVEL_PIECE = 2 * MiB     # HVDLITE_HIERARCHICAL_CHUNK_BYTES
HVD_RING_MIN_SEGMENT = 256 * KiB  # HVDLITE_RING_MIN_SEGMENT_BYTES: below, MPI_Allreduce instead of the ring
HVD_TWO_LEVEL_MIN = 64 * KiB      # default: two-level from 64 KiB on
# The steady state's cycle (cache_cycle.cc, bit_allreduce.cc): one recursive-doubling
# allreduce over all ranks of 36 words (its header, the ready and evict bits of the
# 1,024-entry cache, the payload's key and length), which also carries a cached Sum or
# Average allreduce of up to CacheCycle::kMaxCarriedBytes.
HVD_CYCLE_BYTES = 36 * 8
HVD_CARRY_MAX = 16 * KiB
ELEMENT = 4                       # float32


# ================================================================ the model
@dataclass(frozen=True)
class Link:
    """One kind of link: `alpha` seconds per message (one step of an algorithm), `bw`
    bytes per second for one stream in one direction."""
    alpha: float
    bw: float


@dataclass(frozen=True)
class Cluster:
    """Hosts of ranks. `intra`: between two ranks of one host; `inter`: one stream
    between hosts (one NIC's worth); `nics`: NICs per host (streams beyond that share
    them); `gamma`: seconds per byte a rank reduces."""
    name: str
    intra: Link
    inter: Link
    nics: int = 1
    gamma: float = 0.0
    note: str = ""
    # Measured exchanges of small messages between hosts, ((bytes, seconds), ...) by size:
    # where per-message costs rule rather than alpha + bytes/bw (TCP between the emulated
    # hosts). Empty: alpha + bytes/bw at every size.
    inter_small: tuple[tuple[float, float], ...] = ()

    def stream_bw(self, streams: int) -> float:
        """Bandwidth of each of `streams` concurrent streams leaving (or entering) a host."""
        return self.inter.bw * min(1.0, self.nics / max(1, streams))

    def inter_exchange(self, s: float, streams: int = 1) -> float:
        """Two ranks on two hosts send each other s bytes at once (one step of recursive
        doubling or halving): measured where inter_small covers s (interpolated between
        its sizes), else alpha + s / the stream's bandwidth."""
        if self.inter_small and s <= self.inter_small[-1][0]:
            return interpolate(self.inter_small, s)
        return self.inter.alpha + s / self.stream_bw(streams)

    @property
    def host_bw(self) -> float:
        return self.inter.bw * self.nics


def interpolate(table: tuple[tuple[float, float], ...], s: float) -> float:
    """Linear interpolation in ((x, y), ...) sorted by x; below the first x, its y."""
    if s <= table[0][0]:
        return table[0][1]
    for (s0, t0), (s1, t1) in zip(table, table[1:]):
        if s <= s1:
            return t0 + (t1 - t0) * (s - s0) / (s1 - s0)
    return table[-1][1]


def log2ceil(n: int) -> int:
    return 0 if n <= 1 else math.ceil(math.log2(n))


def ring_allreduce(n: int, size: float, alpha: float, bw: float, gamma: float) -> float:
    """Ring allreduce of `size` bytes over `n` ranks whose every step is limited by one
    link (alpha, bw): 2(n-1) steps of size/n, reducing in the first n-1."""
    if n <= 1:
        return 0.0
    seg = size / n
    return 2 * (n - 1) * (alpha + seg / bw) + (n - 1) * seg * gamma


def flat_ring(cl: Cluster, H: int, G: int, S: float, rings: int = 1) -> float:
    """One ring (or `rings` rings, each carrying S/rings, as NCCL's channels do) over all
    H*G ranks, ordered host by host: each step moves S/(rings*P) per ring; per host, one
    stream per ring crosses to the next host while the other hops stay in the host."""
    P = H * G
    if P <= 1:
        return 0.0
    if H == 1:
        return ring_allreduce(G, S, cl.intra.alpha, cl.intra.bw, cl.gamma)
    m = S / (rings * P)
    step_inter = cl.inter.alpha + m / cl.stream_bw(rings)
    step_intra = cl.intra.alpha + S / P / cl.intra.bw if G > 1 else 0.0
    return 2 * (P - 1) * max(step_inter, step_intra) + (P - 1) * (S / P) * cl.gamma


def recursive_doubling(cl: Cluster, H: int, G: int, S: float) -> float:
    """log2(P) exchanges of the whole buffer: the first log2(G) inside the host, the
    rest across hosts, where all G ranks of a host send S at once."""
    t = log2ceil(G) * (cl.intra.alpha + S / cl.intra.bw + S * cl.gamma)
    t += log2ceil(H) * (cl.inter.alpha + S / cl.stream_bw(G) + S * cl.gamma)
    return t


def rabenseifner(cl: Cluster, H: int, G: int, S: float) -> float:
    """Reduce-scatter by recursive halving, then allgather by recursive doubling; the
    halving steps with the larger pieces stay inside the host (log2 G of them), the last
    log2 H cross hosts with G streams each. Powers of two assumed."""
    lg, lh = log2ceil(G), log2ceil(H)
    t = 0.0
    piece = S
    for _ in range(lg):
        piece /= 2
        t += 2 * (cl.intra.alpha + piece / cl.intra.bw) + piece * cl.gamma
    for _ in range(lh):
        piece /= 2
        t += 2 * (cl.inter.alpha + piece / cl.stream_bw(G)) + piece * cl.gamma
    return t


def cross_allreduce(cl: Cluster, H: int, s: float, streams: int, alg: str = "ring") -> float:
    """Allreduce of `s` bytes among H ranks on H different hosts, while `streams` such
    allreduces run at once on every host (they share its NICs)."""
    if H <= 1:
        return 0.0
    bw = cl.stream_bw(streams)
    a = cl.inter.alpha
    if alg == "ring":
        return ring_allreduce(H, s, a, bw, cl.gamma)
    if alg == "rd":
        return log2ceil(H) * (cl.inter_exchange(s, streams) + s * cl.gamma)
    if alg == "rabenseifner":  # halving, then doubling: two exchanges of each piece s/2, s/4, ...
        t, piece = 0.0, s
        for _ in range(log2ceil(H)):
            piece /= 2
            t += 2 * cl.inter_exchange(piece, streams) + piece * cl.gamma
        return t
    if alg == "mpi":  # what an MPI library picks for a small or middle size: the faster of these two
        return min(cross_allreduce(cl, H, s, streams, x) for x in ("rd", "rabenseifner"))
    if alg == "best":
        return min(cross_allreduce(cl, H, s, streams, x) for x in ("ring", "rd", "rabenseifner"))
    raise ValueError(f"unknown cross-host algorithm {alg!r}")


def _pieces(S: float, piece: float | None) -> list[float]:
    if not piece or piece >= S:
        return [S]
    n = int(S // piece)
    rest = S - n * piece
    return [piece] * n + ([rest] if rest > 0 else [])


def two_level_phases(cl: Cluster, H: int, G: int, c: float, cross: str = "ring") -> tuple[float, float, float]:
    """(reduce-scatter in host, allreduce across hosts, allgather in host) for one piece."""
    seg = c / G
    rs = (G - 1) * (cl.intra.alpha + seg / cl.intra.bw + seg * cl.gamma)
    ag = (G - 1) * (cl.intra.alpha + seg / cl.intra.bw)
    return rs, cross_allreduce(cl, H, seg, G, cross), ag


def two_level(cl: Cluster, H: int, G: int, S: float, piece: float | None = None, cross: str = "ring",
              pipelined: bool = False) -> float:
    """The two-level allreduce (2D torus). `piece`: hvdlite's pieces, run one after the
    other (`pipelined=False`, as hvdlite does) or with the levels of consecutive pieces
    overlapped (`pipelined=True`: after the first piece, each costs the slower level)."""
    if H <= 1:
        return ring_allreduce(G, S, cl.intra.alpha, cl.intra.bw, cl.gamma)
    if G <= 1:
        return cross_allreduce(cl, H, S, 1, cross)
    pieces = _pieces(S, piece)
    if not pipelined:
        return sum(sum(two_level_phases(cl, H, G, c, cross)) for c in pieces)
    rs, x, ag = two_level_phases(cl, H, G, pieces[0], cross)
    total = rs + x + ag
    for c in pieces[1:]:
        rs, x, ag = two_level_phases(cl, H, G, c, cross)
        total += max(rs + ag, x)
    return total


def two_level_best_piece(cl: Cluster, H: int, G: int, S: float, cross: str = "ring") -> tuple[float, float]:
    """The pipelined two-level allreduce at its best piece size: (time, piece)."""
    best = (two_level(cl, H, G, S, None, cross), S)
    piece = 64 * KiB
    while piece < S:
        t = two_level(cl, H, G, S, piece, cross, pipelined=True)
        if t < best[0]:
            best = (t, piece)
        piece *= 2
    return best


def two_level_hvdlite_rules(cl: Cluster, H: int, G: int, S: float) -> float:
    """The two-level allreduce with hvdlite's rules (mpi_backend.cc, hierarchical_allreduce.cc):
    2 MiB pieces one after the other; across hosts hvdlite's ring when each ring segment
    (piece/G/H) reaches 256 KiB, else MPI_Allreduce, taken as the faster of recursive
    doubling and Rabenseifner."""
    if H <= 1 or G <= 1:
        return flat_ring(cl, H, G, S)
    t = 0.0
    for c in _pieces(S, HVD_TWO_LEVEL_PIECE):
        rs, x, ag = two_level_phases(cl, H, G, c, "ring" if c / G / H >= HVD_RING_MIN_SEGMENT else "mpi")
        t += rs + x + ag
    return t


def leader(cl: Cluster, H: int, G: int, S: float, cross: str = "ring") -> float:
    """Hierarchical with a leader per host: reduce-scatter then gather to the leader,
    allreduce of S among the H leaders (one stream per host), scatter then allgather."""
    seg = S / G
    local = 0.0
    if G > 1:
        reduce = (G - 1) * (cl.intra.alpha + seg / cl.intra.bw + seg * cl.gamma) \
            + (G - 1) * (cl.intra.alpha + seg / cl.intra.bw)
        bcast = 2 * (G - 1) * (cl.intra.alpha + seg / cl.intra.bw)
        local = reduce + bcast
    return local + cross_allreduce(cl, H, S, 1, cross)


HAN_SEGMENT = 64 * KiB  # Open MPI 5's coll_han_allreduce_segsize (ompi_info --param coll han --level 9)


def han(cl: Cluster, H: int, G: int, S: float, segment: float = HAN_SEGMENT) -> float:
    """Open MPI 5's HAN allreduce (coll/han, its default algorithm), which Open MPI runs on
    a communicator whose hosts hold several ranks each. Every segment of `segment` bytes
    goes through four stages: a reduce to the host's leader (tuned: binomial, log2 G
    steps), a reduce among the H leaders (libnbc's non-blocking ireduce: binomial, log2 H
    one-way messages), a broadcast among the leaders (ibcast, the same), a broadcast in
    the host. Consecutive segments overlap: in each iteration the host level runs one
    segment's reduce and an older one's broadcast one after the other, while the leaders'
    ireduce and ibcast of two others are in flight together; an iteration costs the
    slower of the two levels. One message between hosts is taken as one exchange
    (cl.inter_exchange: measured where small), since the ireduce of one segment and the
    ibcast of another cross the link in opposite directions at once. Link bytes: each
    host sends at most log2 H times S each way (the root's broadcast)."""
    def reduce_low(s: float) -> float:
        return log2ceil(G) * (cl.intra.alpha + s / cl.intra.bw + s * cl.gamma)

    def bcast_low(s: float) -> float:
        return log2ceil(G) * (cl.intra.alpha + s / cl.intra.bw)

    def reduce_up(s: float) -> float:
        return log2ceil(H) * (cl.inter_exchange(s, 1) + s * cl.gamma)

    def bcast_up(s: float) -> float:
        return log2ceil(H) * cl.inter_exchange(s, 1)

    segs = _pieces(S, segment)
    n = len(segs)

    def seg(i: int) -> float | None:
        return segs[i] if 0 <= i < n else None

    total = 0.0
    for k in range(n + 3):  # iteration k: reduce_low(k), reduce_up(k-1), bcast_up(k-2), bcast_low(k-3)
        low = sum(f(s) for f, s in ((reduce_low, seg(k)), (bcast_low, seg(k - 3))) if s is not None)
        up = max([f(s) for f, s in ((reduce_up, seg(k - 1)), (bcast_up, seg(k - 2))) if s is not None] or [0.0])
        total += max(low, up)
    return total


def tree_pipeline(cl: Cluster, H: int, G: int, S: float, d: float) -> float:
    """NCCL-style double binary tree across hosts (a chain inside each), pipelined in
    steps that each move `d` bytes of data (d/2 per tree). Per byte of data a host's link
    carries 2 bytes in each direction (interior node of one tree, leaf of the other), so
    an inter-host stage costs alpha + 2d/host_bw; an intra-host stage alpha + 2d/bw.
    Time = sum of the stage times (filling the pipeline) + (steps-1) * slowest stage."""
    stages = []
    if H > 1:
        tx = cl.inter.alpha + 2 * d / cl.host_bw + d * cl.gamma
        stages += [tx] * (2 * log2ceil(H))
    if G > 1:
        tl = cl.intra.alpha + 2 * d / cl.intra.bw + d * cl.gamma
        stages += [tl] * (2 * (G - 1))
    if not stages:
        return 0.0
    steps = max(1, math.ceil(S / d))
    return sum(stages) + (steps - 1) * max(stages)


def tree(cl: Cluster, H: int, G: int, S: float) -> tuple[float, float]:
    """The double binary tree at its best pipeline step size: (time, step bytes)."""
    best = (tree_pipeline(cl, H, G, S, S), S)
    d = S / 2
    while d >= 1 * KiB:
        t = tree_pipeline(cl, H, G, S, d)
        if t < best[0]:
            best = (t, d)
        d /= 2
    return best


ALGORITHMS = ("flat_ring", "two_level", "two_level_hvdlite", "leader", "tree", "recursive_doubling",
              "rabenseifner")
LABELS = {
    "flat_ring": "flat ring",
    "two_level": "two-level / 2D torus (best piece, pipelined)",
    "two_level_hvdlite": "two-level as hvdlite runs it (2 MiB pieces, serial; MPI across hosts below 256 KiB segments)",
    "leader": "leader per host (reduce, ring of leaders, bcast)",
    "tree": "double binary tree (pipelined)",
    "recursive_doubling": "recursive doubling",
    "rabenseifner": "Rabenseifner (halving/doubling)",
}


def predict(cl: Cluster, H: int, G: int, S: float) -> dict[str, float]:
    """Every algorithm's time (seconds) for an allreduce of S bytes on H x G ranks."""
    return {
        "flat_ring": flat_ring(cl, H, G, S),
        "two_level": two_level_best_piece(cl, H, G, S)[0],
        "two_level_hvdlite": two_level_hvdlite_rules(cl, H, G, S),
        "leader": leader(cl, H, G, S),
        "tree": tree(cl, H, G, S)[0],
        "recursive_doubling": recursive_doubling(cl, H, G, S),
        "rabenseifner": rabenseifner(cl, H, G, S),
    }


# ---------------------------------------------------------------- control plane
def rank0_cycle(P: int, alpha: float, per_message: float) -> float:
    """One negotiation cycle through rank 0: every other rank's message reaches rank 0
    (one latency), rank 0 handles the P-1 messages and answers each (per_message for
    the pair, one after the other), the answers travel back (one latency)."""
    if P <= 1:
        return 0.0
    return 2 * alpha + (P - 1) * per_message


def bitvector_cycle(H: int, G: int, intra_alpha: float, inter_alpha: float, kind: str = "tree") -> float:
    """One allreduce (bitwise AND) of a small bit vector among all ranks: a few bytes, so
    latency only. `tree`: recursive doubling, log2 G steps in the host and log2 H across;
    `ring`: 2(P-1) steps, each paying the slower link's latency."""
    P = H * G
    if P <= 1:
        return 0.0
    if kind == "tree":
        return log2ceil(G) * intra_alpha + log2ceil(H) * inter_alpha
    if kind == "ring":
        return 2 * (P - 1) * (inter_alpha if H > 1 else intra_alpha)
    raise ValueError(kind)


# ================================================================ the emulated hosts
@dataclass(frozen=True)
class Emulation:
    """What the emulated hosts add to the alpha-beta model: a token bucket per host and
    direction (`rate` bytes/s of payload once the bucket is empty, `burst` bytes that pass
    at the `wire` speed of TCP over the veth pair), and `cores` CPU cores for all ranks."""
    rate: float
    burst: float
    wire: Link
    cores: int = 2
    # Two ranks alone on two hosts exchange both ways at once over their one TCP
    # connection; measured (--measure-pair-exchange), such exchanges take this many
    # times what the rate allows (docs/scale_model.md, "One connection, both ways").
    lone_pair: float = 1.0


def emulated_cluster(params: dict, rate_name: str) -> tuple[Cluster, Emulation]:
    """The emulated hosts as a Cluster. Below the token bucket's rate every transfer is
    CPU work (TCP over a veth pair, copies, sums), and all ranks of all hosts share the
    same cores; so streams do not share a NIC here (`nics` unbounded) but the cores,
    which emulated_time() applies to the whole path. Each parameter was measured with 2
    ranks on the 2 cores, i.e. uncontended."""
    shm, em = params["shm"], params["emulated"][rate_name]
    small = params.get("small_messages", {}).get(rate_name, {}).get("exchange_s", {})
    cl = Cluster(name=f"emulated {rate_name}", intra=Link(shm["alpha"], shm["bw"]),
                 inter=Link(em["alpha"], em["wire_bw"]), nics=1 << 20, gamma=shm["gamma"],
                 inter_small=tuple(sorted((float(k), v) for k, v in small.items())))
    pair = max(1.0, params.get("pair_exchange", {}).get(rate_name, {}).get("factor", 1.0))
    return cl, Emulation(rate=em["rate"], burst=em["burst"], wire=cl.inter, cores=params.get("cores", 2),
                         lone_pair=pair)


@dataclass(frozen=True)
class OpenMpiRules:
    """Which algorithm Open MPI's MPI_Allreduce runs among ranks on different hosts, as
    measured on the emulated hosts. `rd_max`: with more than two such ranks, recursive
    doubling below this size, above it an algorithm that sends 2(H-1)/H of the buffer
    per rank, taken as Rabenseifner's (--measure-mpi-bytes). `two_rank_steps`: with two,
    how many exchanges it makes, ((bytes, 1 or 2), ...) by size (--measure-small): one
    is recursive doubling, two are halving and doubling (each half the buffer)."""
    rd_max: float = math.inf
    two_rank_steps: tuple[tuple[float, int], ...] = ()

    def algorithm(self, H: int, s: float) -> str:
        if H <= 2:
            measured = [steps for size, steps in self.two_rank_steps if size <= s]
            last = self.two_rank_steps[-1][0] if self.two_rank_steps else 0
            return "rabenseifner" if measured and s <= last and measured[-1] == 2 else "rd"
        return "rd" if s < self.rd_max else "rabenseifner"


def open_mpi_rules(params: dict, rate_name: str) -> OpenMpiRules:
    """OpenMpiRules from the measured parameters (--measure-mpi-bytes, --measure-small)."""
    steps = params.get("small_messages", {}).get(rate_name, {}).get("mpi_steps", {})
    return OpenMpiRules(rd_max=params.get("mpi_one_per_host", {}).get("rd_max", math.inf),
                        two_rank_steps=tuple(sorted((float(k), int(v)) for k, v in steps.items())))


def _one_per_host(cl: Cluster, H: int, s: float, streams: int,
                  mpi: OpenMpiRules = OpenMpiRules()) -> tuple[float, float]:
    """Open MPI's MPI_Allreduce of s bytes among H ranks on H hosts (tuned), while
    `streams` such run at once from each host, with the algorithm `mpi` says.
    (time, bytes each of the streams sends)"""
    alg = mpi.algorithm(H, s)
    sent = log2ceil(H) * s if alg == "rd" else 2 * (H - 1) / H * s
    return cross_allreduce(cl, H, s, streams, alg), sent


def _mpi_small(cl: Cluster, H: int, G: int, c: float, mpi: OpenMpiRules = OpenMpiRules()) -> tuple[float, float]:
    """What an MPI_Allreduce of c bytes (below hvdlite's ring threshold) is modelled as.
    Open MPI 5 gives a communicator spanning several hosts with several ranks each to
    its HAN component (priority 35 over tuned's 30, `ompi_info --param coll all`): han().
    One rank per host: tuned's choice (_one_per_host). Returns (time, bytes per host
    link and direction)."""
    if G > 1 and H > 1:
        return han(cl, H, G, c), log2ceil(H) * c
    if G == 1 and H > 1:
        return _one_per_host(cl, H, c, 1, mpi)
    return recursive_doubling(cl, H, G, c), log2ceil(H) * G * c


def hvdlite_flat(cl: Cluster, H: int, G: int, S: float,
                 mpi: OpenMpiRules = OpenMpiRules()) -> tuple[float, float, list[str]]:
    """hvdlite with HOROVOD_HIERARCHICAL_ALLREDUCE=0: 4 MiB pieces, each a ring over all
    ranks if its segments reach 256 KiB, else MPI_Allreduce (as `mpi` says). (time, link
    bytes, what ran)"""
    P = H * G
    t = x = 0.0
    used = set()
    for c in _pieces(S, HVD_FLAT_PIECE):
        if c / P >= HVD_RING_MIN_SEGMENT and c / ELEMENT >= P:
            t += flat_ring(cl, H, G, c)
            x += 2 * (P - 1) / P * c if H > 1 else 0.0
            used.add("ring")
        else:
            dt, dx = _mpi_small(cl, H, G, c, mpi)
            t += dt
            x += dx if H > 1 else 0.0
            used.add("MPI_Allreduce")
    return t, x, sorted(used)


def hvdlite_two_level(cl: Cluster, H: int, G: int, S: float,
                      mpi: OpenMpiRules = OpenMpiRules()) -> tuple[float, float, list[str]]:
    """hvdlite with HOROVOD_HIERARCHICAL_ALLREDUCE=1: 2 MiB pieces, one after the other;
    across hosts hvdlite's ring if each rank's share per host reaches 256 KiB, else
    MPI_Allreduce (one rank per host: _one_per_host). With one rank per host it is the
    flat allreduce."""
    if G <= 1 or H <= 1:
        return hvdlite_flat(cl, H, G, S, mpi)
    t = x = 0.0
    used = set()
    for c in _pieces(S, HVD_TWO_LEVEL_PIECE):
        seg = c / G
        if seg / H >= HVD_RING_MIN_SEGMENT:
            rs, xt, ag = two_level_phases(cl, H, G, c, "ring")
            x += 2 * (H - 1) / H * c
            used.add("ring")
        else:
            rs, _, ag = two_level_phases(cl, H, G, c, "ring")
            xt, per_stream = _one_per_host(cl, H, seg, G, mpi)
            x += G * per_stream
            used.add("MPI_Allreduce")
        t += rs + xt + ag
    return t, x, sorted(used)


def open_mpi_two_hosts(cl: Cluster, H: int, G: int, S: float,
                       mpi: OpenMpiRules = OpenMpiRules()) -> tuple[float, float, list[str]] | None:
    """Open MPI's own MPI_Allreduce across hosts, where its algorithm is known well enough
    to model: on 2 hosts every algorithm it may pick moves S each way over the link.
    Several ranks per host: HAN (han()); one: tuned, with the step count `mpi` says.
    None elsewhere (4 hosts: which algorithms HAN's levels and tuned combine from 1 MiB
    up is not modelled)."""
    if H != 2:
        return None
    if G > 1:
        return han(cl, H, G, S), S, ["HAN"]
    return _one_per_host(cl, H, S, 1, mpi)[0], S, ["tuned"]


def bench_reps(S: float, max_reps: int = 20, budget: float = 512 * MiB, rounds: int = 5, min_reps: int = 2) -> int:
    """Timed repetitions bench_hosts.py runs at size S in each turn (after 1 warm-up)."""
    return max(min_reps, min(max_reps, int(budget / S / rounds)))


BENCH_WARMUP = 1  # bench_hosts.py --warmup


def emulated_time(cl: Cluster, em: Emulation, P: int, path: float, link_bytes: float, S: float,
                  overhead: float, max_reps: int = 20, pair_pieces: int = 1, op_index: int = 0,
                  alternating: bool = False) -> tuple[float, str]:
    """Turns an algorithm's alpha-beta time on the emulated hosts (`path`, with the
    inter-host links at wire speed) into a predicted median of bench_hosts.py.

    - CPU: every rank of every host shares `cores` cores. The busy phases of the P
      ranks (copies, reductions, TCP) run together, so the path stretches by P/cores.
    - Token bucket: bench_hosts.py starts each size with the bucket full, then repeats
      [hvdlite op, MPI op] back to back (taken as alike). Repetition by repetition, an
      op that finds enough tokens (with those that refill while it runs) takes its
      burst time; one that does not waits for the missing bytes at the link's payload
      rate. The prediction is the median over the timed repetitions (the mean of the two
      middle ones for an even count, as statistics.median): `burst` if it ran on
      tokens, `rate` if it waited, `edge` if the two middle ones differ.
    - `pair_pieces`: the link carries one pair of ranks exchanging both ways over one
      TCP connection (2 hosts x 1 rank), in this many pieces back to back. The first
      starts with the ranks in step; each later one takes em.lone_pair times what the
      rate allows (measured: docs/scale_model.md, "One connection, both ways").
    - `op_index`: which op of each repetition is timed: 0 for hvdlite's, 1 for MPI's,
      where hvdlite's goes first in every repetition (stored rows without an `order`);
      with `alternating`, the two go first by turns, starting with hvdlite's."""
    t = (path + overhead) * max(1.0, P / em.cores)
    if link_bytes <= 0:
        return t, "one host"
    pairs = max(1, pair_pieces)
    slow = (1 + (pairs - 1) * em.lone_pair) / pairs  # the rate's time, stretched for a lone pair
    tokens = em.burst
    timed: list[tuple[float, str]] = []
    reps = bench_reps(S, max_reps)
    for rep in range(BENCH_WARMUP + reps):
        for op in range(2):
            if tokens + em.rate * t >= link_bytes:
                dt, regime = t, "burst"
                tokens = min(em.burst, tokens + em.rate * t - link_bytes)
            else:
                dt, regime = max(t, (link_bytes - tokens) / em.rate * slow), "rate"
                tokens = 0.0
            mine = op_index if not alternating or rep % 2 == 0 else 1 - op_index
            if op == mine and rep >= BENCH_WARMUP:
                timed.append((dt, regime))
    # statistics.median, as bench_hosts.py takes it: with an even count, the mean of the
    # two middle repetitions. Where the bucket runs dry halfway through a size, those two
    # are one on tokens and one at the rate, and the median lies between the regimes.
    timed.sort()
    lo, hi = timed[(len(timed) - 1) // 2], timed[len(timed) // 2]
    return (lo[0] + hi[0]) / 2, lo[1] if lo[1] == hi[1] else "edge"


# ================================================================ measuring the parameters
def _median_time(comm, fn, reps: int, inner: int = 1, warm: int = 2) -> float:
    """Median over `reps` repetitions (after `warm`) of the time per call of fn, each
    repetition `inner` calls after a barrier, as rank 0 sees it."""
    out = []
    for i in range(reps + warm):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        dt = (time.perf_counter() - t0) / inner
        if i >= warm:
            out.append(dt)
    return statistics.median(out)


def _fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x: (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def _pingpong_and_exchange(comm, sizes: list[int], budget: float) -> dict:
    import numpy as np
    rank, peer = comm.Get_rank(), 1 - comm.Get_rank()
    out: dict = {"pingpong_half_rtt": {}, "exchange": {}}
    for s in sizes:
        a, b = np.ones(max(1, s), np.uint8), np.empty(max(1, s), np.uint8)
        inner = max(1, min(200, int(256 * KiB / max(s, 1))))
        reps = max(5, min(40, int(budget / max(s, 1) / inner)))

        def pingpong() -> None:
            if rank == 0:
                comm.Send(a, peer, 7)
                comm.Recv(b, peer, 7)
            else:
                comm.Recv(b, peer, 7)
                comm.Send(a, peer, 7)

        def exchange() -> None:
            comm.Sendrecv(a, peer, 8, b, peer, 8)

        out["pingpong_half_rtt"][s] = _median_time(comm, pingpong, reps, inner) / 2
        out["exchange"][s] = _median_time(comm, exchange, reps, inner)
    return out


def _control_fan_in(comm, ks: list[int], reps: int) -> dict:
    """Rank 1 stands for k workers: it posts k small requests to rank 0 at once; rank 0
    receives them one by one as hvdlite's coordinator does (MPI_Improbe + MPI_Mrecv on a
    duplicate communicator) and answers each; rank 1 receives the k answers. The slope of
    the cycle time over k is rank 0's cost per worker message (receive + answer)."""
    import numpy as np
    from mpi4py import MPI
    ctrl = comm.Dup()
    rank = comm.Get_rank()
    msg, inbox = np.zeros(64, np.uint8), np.zeros(64, np.uint8)
    res = {}
    for k in ks:
        def cycle() -> None:
            if rank == 0:
                got = 0
                while got < k:
                    m = ctrl.improbe(MPI.ANY_SOURCE, 11)
                    if m is None:
                        continue
                    m.Recv(inbox)
                    got += 1
                MPI.Request.Waitall([ctrl.Isend(msg, 1, 12) for _ in range(k)])
            else:
                MPI.Request.Waitall([ctrl.Isend(msg, 0, 11) for _ in range(k)])
                for _ in range(k):
                    ctrl.Recv(inbox, 0, 12)
        res[k] = _median_time(comm, cycle, reps)
    ctrl.Free()
    a, b = _fit_line([float(k) for k in ks], [res[k] for k in ks])
    return {"cycle_s": res, "fixed_s": a, "per_message_s": b}


def _small_allreduce(comm, reps: int) -> float:
    """An allreduce (bitwise AND) of a 32-byte bit vector: the steady-state agreement."""
    import numpy as np
    from mpi4py import MPI
    bits = np.full(4, -1, np.int64)
    return _median_time(comm, lambda: comm.Allreduce(MPI.IN_PLACE, bits, op=MPI.BAND), reps, inner=20)


def _hvdlite_overhead(comm, reps: int) -> dict:
    """hvdlite's fixed cost per call: a 4-byte hvd.allreduce_ (Python, the engine's
    thread, the round trip to rank 0, waking the caller) against MPI_Allreduce of the
    same buffer, interleaved call by call."""
    import numpy as np
    from mpi4py import MPI
    import hvdlite as hvd
    hvd.init()
    x = np.zeros(1, np.float32)
    th, tm = [], []
    for i in range(reps + 5):
        comm.Barrier()
        t0 = time.perf_counter()
        hvd.allreduce_(x, op=hvd.Sum, name="cost_model.tiny")
        t1 = time.perf_counter()
        comm.Barrier()
        t2 = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        t3 = time.perf_counter()
        if i >= 5:
            th.append(t1 - t0)
            tm.append(t3 - t2)
    hvd.shutdown()
    h, m = statistics.median(th), statistics.median(tm)
    return {"hvdlite_s": h, "mpi_s": m, "overhead_s": h - m}


MPI_BYTES_SIZES = [2 * KiB, 4 * KiB, 6 * KiB, 8 * KiB, 16 * KiB, 64 * KiB, 256 * KiB]


def _mpi_link_bytes(comm, sizes: list[int], reps: int = 20) -> dict:
    """Bytes this rank's emulated host sent on its link (eth0's tx counter, frames with
    their headers) per MPI_Allreduce of each size, one rank per host: which algorithm
    Open MPI's tuned component picks shows in how much each host sends (recursive
    doubling log2(P) * S, the bandwidth-optimal ones 2(P-1)/P * S). The largest host's
    figure, as rank 0 gathers them."""
    import numpy as np
    from mpi4py import MPI

    def tx() -> int:
        with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
            return int(f.read())

    out = {}
    for size in sizes:
        buf = np.ones(size // 4, np.float32)
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        comm.Barrier()
        before = tx()
        for _ in range(reps):
            comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            buf.fill(1.0)
        comm.Barrier()
        per_op = (tx() - before) / reps
        out[size] = max(comm.allgather(per_op))
    return out


def _reduction_speed(comm, sizes: list[int]) -> dict:
    """Seconds per byte of a float32 sum a += b (NumPy's vectorized loop, as hvdlite's
    reduction kernel), on rank 0 alone and on both ranks at once."""
    import numpy as np
    rank = comm.Get_rank()
    out: dict = {"alone": {}, "pair": {}}
    for s in sizes:
        a, b = np.zeros(s // 4, np.float32), np.ones(s // 4, np.float32)
        inner = max(1, int(16 * MiB / s))
        reps = 15

        def add() -> None:
            np.add(a, b, out=a)

        def alone() -> None:
            if rank == 0:
                add()
        out["alone"][s] = _median_time(comm, alone, reps, inner) / s
        out["pair"][s] = _median_time(comm, add, reps, inner) / s
    return out


def _pair_exchanges(comm, rate_bytes: float, send_first: bool, piece: int = 2 * MiB, rings: int = 32) -> dict:
    """Two ranks on two emulated hosts run what hvdlite's flat ring does with them: per
    4 MiB piece, exchange 2 MiB both ways, add, exchange 2 MiB both ways, back to back;
    each exchange posted as hvdlite's Exchange does (`send_first`: the send, then the
    receive) or as MPI_Sendrecv does (the receive first). Each exchange's time against
    what the rate allows for it (piece / rate), with the bucket drained first. hvdlite
    was initialized before (as in every benchmark), so its first messages opened the
    ranks' one TCP connection."""
    import numpy as np
    from mpi4py import MPI
    peer = 1 - comm.Get_rank()
    n = piece // 4
    data = np.ones(2 * n, np.float32)
    inc = np.empty(n, np.float32)
    mine, give = (data[:n], data[n:]) if comm.Get_rank() == 0 else (data[n:], data[:n])

    def exchange(out, into, tag: int) -> None:
        if send_first:
            MPI.Request.Waitall([comm.Isend([out, MPI.FLOAT], peer, tag), comm.Irecv([into, MPI.FLOAT], peer, tag)])
        else:
            comm.Sendrecv([out, MPI.FLOAT], peer, tag, [into, MPI.FLOAT], peer, tag)
    times = []
    for r in range(rings + 4):  # the first 4 drain the bucket
        t0 = time.perf_counter()
        exchange(give, inc, 31)
        t1 = time.perf_counter()
        np.add(mine, inc, out=mine)
        t2 = time.perf_counter()
        exchange(mine, give, 32)
        t3 = time.perf_counter()
        data.fill(1.0)
        if r >= 4:
            times += [t1 - t0, t3 - t2]
    ideal = piece / rate_bytes
    return {"piece": piece, "exchanges": len(times), "ideal_s": ideal,
            "median_s": statistics.median(times), "factor": sum(times) / (len(times) * ideal),
            "slow_fraction": sum(1 for t in times if t > 1.5 * ideal) / len(times)}


SMALL_SIZES = [8, 512, 2 * KiB, 4 * KiB, 8 * KiB, 16 * KiB, 32 * KiB, 64 * KiB]


def _small_messages(comm, rate_bytes: float, sizes: list[int] = SMALL_SIZES, reps: int = 60) -> dict:
    """Small messages between two ranks on two emulated hosts, timed as bench_hosts.py
    times its calls: one call after a barrier, rank 0's median. Before each call the
    ranks idle long enough for the token bucket to refill what the call takes, so the
    link is in the regime such calls run in (`burst`). Per size: an exchange both ways
    (send posted first, as hvdlite's steps are), and Open MPI's MPI_Allreduce of that
    size, whose time says how many exchanges its algorithm for two ranks makes."""
    import numpy as np
    from mpi4py import MPI
    peer = 1 - comm.Get_rank()
    bufs = {s: (np.ones(max(1, s // 4), np.float32), np.empty(max(1, s // 4), np.float32)) for s in sizes}
    ops = {
        "exchange": lambda a, b: MPI.Request.Waitall([comm.Isend(a, peer, 41), comm.Irecv(b, peer, 41)]),
        "mpi_allreduce": lambda a, b: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM),
    }
    times: dict = {op: {s: [] for s in sizes} for op in ops}
    for rep in range(reps + 3):
        for s in sizes:
            for op, fn in ops.items():
                a, b = bufs[s]
                comm.Barrier()
                time.sleep(max(2e-4, 4 * s / rate_bytes))
                comm.Barrier()
                t0 = time.perf_counter()
                fn(a, b)
                t = time.perf_counter() - t0
                a.fill(1.0)
                if rep >= 3:
                    times[op][s].append(t)
    return {op: {s: statistics.median(ts) for s, ts in by.items()} for op, by in times.items()}


def measure_worker(kind: str, rate: str) -> None:
    """Runs inside a 2-rank job (`intra`: one host; `inter`: one rank on each of two
    emulated hosts) and prints rank 0's findings as one RESULT line."""
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    res: dict = {"kind": kind, "hosts": comm.allgather(MPI.Get_processor_name())}
    if kind == "small":        # one rank on each of 2 emulated hosts
        from tests.hosts.emulated import _rate_bytes
        res["small"] = _small_messages(comm, _rate_bytes(rate))
    elif kind == "pairx":        # one rank on each of 2 emulated hosts
        import hvdlite as hvd
        from tests.hosts.emulated import _rate_bytes
        hvd.init()
        res["pairx"] = {"send_first": _pair_exchanges(comm, _rate_bytes(rate), True),
                                "sendrecv": _pair_exchanges(comm, _rate_bytes(rate), False)}
        hvd.shutdown()
    elif kind == "mpibytes":     # one rank on each of 4 emulated hosts
        res["ranks"] = comm.Get_size()
        res["tx_bytes_per_op"] = _mpi_link_bytes(comm, MPI_BYTES_SIZES)
    elif kind == "intra":
        res.update(_pingpong_and_exchange(comm, [8, 64, 512, 4 * KiB, 32 * KiB, 256 * KiB, 1 * MiB, 4 * MiB,
                                                 16 * MiB, 64 * MiB], 256 * MiB))
        res["reduce_s_per_byte"] = _reduction_speed(comm, [256 * KiB, 2 * MiB, 64 * MiB])
        res["control"] = _control_fan_in(comm, [1, 2, 4, 8, 16, 32, 64, 128, 256], 200)
        res["bitvector_allreduce_s"] = _small_allreduce(comm, 200)
        res["hvdlite"] = _hvdlite_overhead(comm, 300)
    else:
        from tests.hosts.emulated import _rate_bytes
        rb = _rate_bytes(rate)
        peer = 1 - rank
        # latency with messages far below the bucket
        res.update(_pingpong_and_exchange(comm, [8, 64, 512, 4 * KiB], 1 * MiB))
        # bursts: one message after the bucket refilled (idle 60 ms), then a 1-byte answer
        ack = np.zeros(1, np.uint8)
        burst: dict = {}
        for s in [64 * KiB, 256 * KiB, 1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB]:
            if s > rb * 0.3:
                break
            buf = np.ones(s, np.uint8)
            ts = []
            for _ in range(5):
                comm.Barrier()
                time.sleep(0.06)
                comm.Barrier()
                t0 = time.perf_counter()
                if rank == 0:
                    comm.Send(buf, peer, 21)
                    comm.Recv(ack, peer, 22)
                else:
                    comm.Recv(buf, peer, 21)
                    comm.Send(ack, peer, 22)
                ts.append(time.perf_counter() - t0)
            burst[s] = statistics.median(ts)
        res["burst_one_way_s"] = burst
        # sustained: drain the bucket, then stream 1 MiB messages for ~0.6 s
        chunk = np.ones(1 * MiB, np.uint8)
        n = max(16, int(rb * 0.6 / MiB))

        def stream(count: int, both: bool) -> float:
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(count):
                if both:
                    comm.Sendrecv(chunk, peer, 23, chunk, peer, 23)
                elif rank == 0:
                    comm.Send(chunk, peer, 23)
                else:
                    comm.Recv(chunk, peer, 23)
            if rank == 0:
                comm.Recv(ack, peer, 24)
            else:
                comm.Send(ack, peer, 24)
            return time.perf_counter() - t0
        one, two = [], []
        for _ in range(3):
            stream(max(4, int(rb * 0.05 / MiB)), False)  # empties the bucket
            one.append(n * MiB / stream(n, False))
            stream(max(4, int(rb * 0.05 / MiB)), True)
            two.append(n * MiB / stream(n, True))
        res["stream_one_way_Bps"] = statistics.median(one)
        res["stream_both_ways_Bps"] = statistics.median(two)
        res["control"] = _control_fan_in(comm, [1, 4, 16, 64, 256], 60)
        res["bitvector_allreduce_s"] = _small_allreduce(comm, 100)
        res["hvdlite"] = _hvdlite_overhead(comm, 200)
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)


def _launch_worker(kind: str, rate: str, hosts=None, ranks: int = 2) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), HVDLITE_LOG_LEVEL="error")
    cmd = [sys.executable, "-m", "hvdlite.runner", "-np", str(ranks)]
    if hosts is not None:
        env.update(hosts.env())
        cmd += ["-H", hosts.host_spec(1)]
    cmd += [sys.executable, str(Path(__file__).resolve()), "--measure-worker", kind, "--rate", rate]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=str(REPO))
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"measure {kind} {rate}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[0][7:])


def _keys_to_int(d: dict) -> dict:
    return {int(k): v for k, v in d.items()}


def derive_shm(run: dict) -> dict:
    """alpha, bw and gamma of shared memory from one `intra` run."""
    pp = _keys_to_int(run["pingpong_half_rtt"])
    ex = _keys_to_int(run["exchange"])
    alpha = pp[8]
    big = [s for s in ex if s >= 1 * MiB]
    # a ring step is an exchange: both ranks send and receive at once
    _, slope = _fit_line([float(s) for s in big], [ex[s] for s in big])
    red = _keys_to_int(run["reduce_s_per_byte"]["pair"])
    return {"alpha": alpha, "bw": 1 / slope, "gamma": red[2 * MiB],
            "gamma_large": red[64 * MiB], "pingpong_bw": 1 / _fit_line(
                [float(s) for s in pp if s >= 1 * MiB], [pp[s] for s in pp if s >= 1 * MiB])[1]}


def derive_link(run: dict, rate_bytes: float) -> dict:
    """alpha, wire speed, payload rate and bucket size of an emulated link."""
    pp = _keys_to_int(run["pingpong_half_rtt"])
    alpha = pp[8]
    rate = run["stream_one_way_Bps"]
    burst = _keys_to_int(run["burst_one_way_s"])
    rtt = 2 * alpha
    fits = {s: t - rtt for s, t in burst.items()}
    nominal_bucket = rate_bytes / 100  # tests/hosts/emulated.py: 10 ms at the link's rate
    small = [s for s in fits if s <= nominal_bucket / 2]
    wire = statistics.median([s / fits[s] for s in small])
    # beyond the bucket: t = b/wire + (s - b)/rate, so b = (s/rate - t) / (1/rate - 1/wire)
    large = [s for s in fits if s >= 2 * nominal_bucket]
    fitted = statistics.median([(s / rate - fits[s]) / (1 / rate - 1 / wire) for s in large]) if large \
        else float("nan")
    # The fit divides by 1/rate - 1/wire: meaningless where the wire is hardly faster than
    # the rate (10 Gbit/s here, where TCP itself is the limit). The harness sets the bucket
    # anyway; the fit is kept as a check of it.
    b = fitted if wire > 2 * rate and not math.isnan(fitted) else nominal_bucket
    return {"alpha": alpha, "wire_bw": wire, "rate": rate, "rate_both_ways": run["stream_both_ways_Bps"],
            "burst": b, "burst_fitted": fitted, "burst_configured": nominal_bucket, "nominal_rate": rate_bytes,
            "payload_efficiency": rate / rate_bytes}


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _core_stamp() -> str:
    """When the hvdlite extension in the repository was built (it may be rebuilt between runs)."""
    found = sorted((REPO / "hvdlite").glob("_core*.so"))
    if not found:
        return "no _core built"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(found[0].stat().st_mtime))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _median_dict(ds: list[dict]) -> dict:
    return {k: statistics.median(d[k] for d in ds) for k in ds[0]}


def run_measure(rates: list[str], rounds: int, out: Path) -> dict:
    """Measures shared memory (2 ranks on this host) and each emulated link rate (1 rank
    on each of 2 emulated hosts), `rounds` times interleaved, and writes the medians of
    the derived parameters with every raw run to `out`."""
    sys.path.insert(0, str(REPO))
    from tests.hosts.emulated import EmulatedHosts, _rate_bytes, unavailable
    reason = unavailable()
    if reason:
        print(f"cost_model --measure: inter-host links skipped: {reason}", file=sys.stderr)
        rates = []
    runs: dict = {"intra": [], "inter": {r: [] for r in rates}}
    for rnd in range(rounds):
        load = os.getloadavg()[0]
        run = _launch_worker("intra", "")
        run.update(started=_now(), load_before=load, load_after=os.getloadavg()[0])
        runs["intra"].append(run)
        print(f"measure: shared memory, round {rnd}: load {load:.2f}", flush=True)
        for rate in rates:
            load = os.getloadavg()[0]
            with EmulatedHosts(2, rate) as hosts:
                run = _launch_worker("inter", rate, hosts)
            run.update(started=_now(), load_before=load, load_after=os.getloadavg()[0])
            runs["inter"][rate].append(run)
            print(f"measure: {rate} link, round {rnd}: load {load:.2f}", flush=True)
    shm = _median_dict([derive_shm(r) for r in runs["intra"]])
    emulated = {rate: _median_dict([derive_link(r, _rate_bytes(rate)) for r in rs]) for rate, rs in runs["inter"].items()}
    ctl_shm = statistics.median(r["control"]["per_message_s"] for r in runs["intra"])
    control = {
        "rank0_per_message_shm": ctl_shm,
        "bitvector_allreduce_shm": statistics.median(r["bitvector_allreduce_s"] for r in runs["intra"]),
        "hvdlite_overhead_shm": statistics.median(r["hvdlite"]["overhead_s"] for r in runs["intra"]),
        "hvdlite_call_shm": statistics.median(r["hvdlite"]["hvdlite_s"] for r in runs["intra"]),
    }
    for rate, rs in runs["inter"].items():
        control[f"rank0_per_message_{rate}"] = statistics.median(r["control"]["per_message_s"] for r in rs)
        control[f"bitvector_allreduce_{rate}"] = statistics.median(r["bitvector_allreduce_s"] for r in rs)
        control[f"hvdlite_overhead_{rate}"] = statistics.median(r["hvdlite"]["overhead_s"] for r in rs)
        control[f"hvdlite_call_{rate}"] = statistics.median(r["hvdlite"]["hvdlite_s"] for r in rs)
    params = {
        "about": "Parameters of benchmarks/cost_model.py, measured on this machine by "
                 f"`python benchmarks/cost_model.py --measure --rounds {rounds}` (medians over rounds; "
                 "every raw run under `runs`). Units: seconds, bytes, bytes/s; gamma in s per byte reduced.",
        "measured": _now(), "commit": _git_commit(), "core_built": _core_stamp(), "cores": os.cpu_count(),
        "how": {
            "shm": "2 ranks on one host (hvdlite-run -np 2). alpha: half the round trip of an 8-byte "
                   "ping-pong. bw: slope of MPI_Sendrecv exchange time (both ranks send and receive "
                   "at once, as in a ring step) over 1-64 MiB. gamma: NumPy float32 a += b on both "
                   "ranks at once, per byte, at 2 MiB (the size of hvdlite's two-level pieces).",
            "emulated": "1 rank on each of 2 emulated hosts (tests/hosts/emulated.py, tc tbf). alpha: "
                        "half the round trip of an 8-byte ping-pong over TCP. wire_bw: one message of "
                        "at most half a bucket after 60 ms idle (bucket full). rate: payload bytes/s "
                        "of a stream of 1 MiB messages after the bucket was emptied. burst: from "
                        "one-way transfers of 2-30 buckets after idle, t = b/wire + (s-b)/rate.",
            "control": "rank0_per_message: slope over k = 1..256 of a cycle in which one rank posts "
                       "k 64-byte requests to rank 0, which receives each (MPI_Improbe/Mrecv through "
                       "mpi4py, so including Python's cost per call) and answers each. "
                       "hvdlite_overhead: median 4-byte hvd.allreduce_ minus MPI_Allreduce, interleaved.",
        },
        "shm": shm, "emulated": emulated, "control": control, "runs": runs,
    }
    out.write_text(json.dumps(params, indent=1))
    return params


def run_measure_mpi_bytes(out: Path) -> dict:
    """What Open MPI's MPI_Allreduce sends per host with one rank on each of 4 emulated
    hosts (1 Gbit/s), size by size (_mpi_link_bytes); stored in the parameters as
    `mpi_one_per_host` with the size from which it stops sending recursive doubling's
    log2(4) * S (the model's rd_max)."""
    sys.path.insert(0, str(REPO))
    from tests.hosts.emulated import EmulatedHosts
    params = json.loads(out.read_text())
    with EmulatedHosts(4, "1gbit") as hosts:
        run = _launch_worker("mpibytes", "1gbit", hosts, ranks=4)
    ratios = {int(k): v / int(k) for k, v in run["tx_bytes_per_op"].items()}
    # Frames carry headers (1514 bytes on the wire per 1448 of payload, plus the
    # acknowledgements), so recursive doubling shows as a little above 2 * S.
    rd_max = next((size for size in sorted(ratios) if ratios[size] < 1.8), math.inf)
    params["mpi_one_per_host"] = {
        "measured": _now(), "ranks": 4, "rate": "1gbit",
        "how": "python benchmarks/cost_model.py --measure-mpi-bytes: eth0 tx bytes of each emulated host per "
               "MPI_Allreduce (20 of each size), the largest host's, divided by the size",
        "tx_over_size": ratios, "rd_max": rd_max}
    out.write_text(json.dumps(params, indent=1))
    for size in sorted(ratios):
        print(f"measure: MPI_Allreduce of {size} B, 4 hosts x 1: each host sends {ratios[size]:.2f} x the size",
              flush=True)
    return params


def _two_host_rounds(kind: str, rate: str, rounds: int) -> list[dict]:
    """`rounds` jobs of the worker `kind` with one rank on each of 2 emulated hosts, each
    on hosts made afresh: what each job's rank 0 found under the key `kind`."""
    sys.path.insert(0, str(REPO))
    from tests.hosts.emulated import EmulatedHosts
    runs = []
    for _ in range(rounds):
        with EmulatedHosts(2, rate) as hosts:
            runs.append(_launch_worker(kind, rate, hosts)[kind])
    return runs


def run_measure_pair_exchange(rates: list[str], rounds: int, out: Path) -> dict:
    """How long a pair of ranks alone on two emulated hosts takes for a ring's exchanges
    (_pair_exchanges), per rate, posted both ways: as hvdlite's Exchange does (send
    first; the model's `factor`) and as MPI_Sendrecv does (`sendrecv_factor`). Medians
    over `rounds` jobs, stored in the parameters as `pair_exchange`."""
    params = json.loads(out.read_text())
    found = params.setdefault("pair_exchange", {})
    for rate in rates:
        runs = _two_host_rounds("pairx", rate, rounds)
        found[rate] = {
            "measured": _now(), "rounds": runs,
            "how": "python benchmarks/cost_model.py --measure-pair-exchange: 2 hosts x 1 rank, hvdlite "
                   "initialized, 64 back-to-back 2 MiB exchanges both ways (hvdlite's ring on 4 MiB pieces), "
                   "send posted first (hvdlite) and receive first (MPI_Sendrecv); factor = their total time / "
                   "(64 x 2 MiB / rate), the median of the rounds",
            "factor": statistics.median(r["send_first"]["factor"] for r in runs),
            "slow_fraction": statistics.median(r["send_first"]["slow_fraction"] for r in runs),
            "sendrecv_factor": statistics.median(r["sendrecv"]["factor"] for r in runs),
            "sendrecv_slow_fraction": statistics.median(r["sendrecv"]["slow_fraction"] for r in runs)}
        f = found[rate]
        print(f"measure: {rate}, 2 hosts x 1: 2 MiB exchanges take {f['factor']:.2f} x the rate's time sending "
              f"first ({f['slow_fraction']:.0%} over 1.5 x), {f['sendrecv_factor']:.2f} x as MPI_Sendrecv "
              f"({f['sendrecv_slow_fraction']:.0%})", flush=True)
    out.write_text(json.dumps(params, indent=1))
    return params


def run_measure_small(rates: list[str], rounds: int, out: Path) -> dict:
    """Small messages across two emulated hosts (_small_messages), per rate: medians over
    `rounds` jobs, stored in the parameters as `small_messages`: what a cross-host
    exchange of each size costs where per-message costs rule (the model's exchange below
    64 KiB), and how many exchanges Open MPI's MPI_Allreduce makes between two ranks at
    each size (`mpi_steps`: 1 where its time is nearer to one exchange of the size than
    to two of half the size, else 2)."""
    params = json.loads(out.read_text())
    found = params.setdefault("small_messages", {})
    for rate in rates:
        runs = _two_host_rounds("small", rate, rounds)
        med = {op: {s: statistics.median(r[op][str(s)] for r in runs) for s in SMALL_SIZES}
               for op in ("exchange", "mpi_allreduce")}
        table = tuple(sorted(med["exchange"].items()))
        # one exchange of s, or two of s/2: whichever the measured time is nearer to (by ratio)
        steps = {s: 1 if abs(math.log(t / interpolate(table, s))) <= abs(math.log(t / (2 * interpolate(table, s / 2))))
                 else 2 for s, t in med["mpi_allreduce"].items()}
        found[rate] = {
            "measured": _now(), "rounds": runs,
            "how": "python benchmarks/cost_model.py --measure-small: 2 hosts x 1 rank; per size, 60 calls each "
                   "after a barrier and a pause that lets the token bucket refill, rank 0's median; an exchange "
                   "both ways (Isend, Irecv, Waitall) and MPI_Allreduce; the median of the rounds",
            "exchange_s": med["exchange"], "mpi_allreduce_s": med["mpi_allreduce"], "mpi_steps": steps}
        for s in SMALL_SIZES:
            print(f"measure: {rate}, 2 hosts x 1, {fmt_b(s)}: exchange {fmt_t(med['exchange'][s])}, "
                  f"MPI_Allreduce {fmt_t(med['mpi_allreduce'][s])} ({steps[s]} step{'s' if steps[s] > 1 else ''})",
                  flush=True)
    out.write_text(json.dumps(params, indent=1))
    return params


def _machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent in user and system mode since boot."""
    with open("/proc/stat") as f:
        user, nice, system = (int(v) for v in f.readline().split()[1:4])
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


class _OwnCpu:
    """Samples, twice a second, the CPU time of every process whose command line names
    `marker` (this run's bench_hosts.py: its driver and its ranks, in whatever network
    namespace), so that the machine's busy time minus ours is what other work took."""

    def __init__(self, marker: str) -> None:
        import threading
        self.marker = marker.encode()
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if self.marker not in f.read():
                        continue
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                self.seen[int(pid)] = (int(fields[11]) + int(fields[12])) / tick
            except OSError:
                continue

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def __enter__(self) -> "_OwnCpu":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())


# ---------------------------------------------------------------- validation runs
VALIDATE_CONFIGS = "2x1@1gbit,2x2@1gbit,4x1@1gbit,4x2@1gbit,2x4@1gbit,2x1@10gbit,2x2@10gbit,4x2@10gbit"
VALIDATE_SIZES = "4K,64K,1M,4M,16M,64M"


def run_validation(configs: str, sizes: str, rounds: int, out: Path, max_reps: int) -> None:
    """Runs benchmarks/bench_hosts.py once per configuration and round (configurations
    interleaved across rounds, so that a disturbed minute hits one sample of each rather
    than all samples of one) and appends every row, with when and how it ran, to `out`."""
    data = json.loads(out.read_text()) if out.exists() else {"runs": []}
    data.setdefault("about", {
        "what": "hvdlite flat / two-level / default and MPI_Allreduce on emulated hosts, "
                "from benchmarks/bench_hosts.py (medians over its repetitions, seconds)",
        "command": f"python benchmarks/cost_model.py --validate --configs {configs} --sizes {sizes} "
                   f"--rounds {rounds}",
    })
    for rnd in range(rounds):
        for config in configs.split(","):
            started = _now()
            load_before = list(os.getloadavg())
            busy0 = _machine_busy_seconds()
            t0 = time.time()
            tmp = out.with_suffix(".tmp.json")
            cmd = [sys.executable, str(HERE / "bench_hosts.py"), "--configs", config, "--sizes", sizes,
                   "--max-reps", str(max_reps), "--json-out", str(tmp), "--results", ""]
            with _OwnCpu(str(HERE / "bench_hosts.py")) as own:
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO))
            wall = time.time() - t0
            busy1 = _machine_busy_seconds()
            entry = {"config": config, "round": rnd, "started": started, "seconds": round(wall, 1),
                     "foreign_cpu_share": round(max(0.0, busy1 - busy0 - own.seconds) / (wall * (os.cpu_count() or 1)), 3),
                     "load_before": load_before, "load_after": list(os.getloadavg()), "commit": _git_commit(),
                     "core_built": _core_stamp(), "max_reps": max_reps}
            if proc.returncode != 0 or not tmp.exists():
                entry["error"] = (proc.stdout[-2000:] + proc.stderr[-2000:]).strip()
                print(f"validate: {config} round {rnd} failed:\n{entry['error']}", file=sys.stderr, flush=True)
            else:
                entry["rows"] = json.loads(tmp.read_text())[0]["rows"]
                tmp.unlink()
            data["runs"].append(entry)
            out.write_text(json.dumps(data, indent=1))
            print(f"validate: {config} round {rnd} done in {entry['seconds']} s, load {entry['load_after'][0]:.2f}, "
                  f"other processes' CPU share {entry['foreign_cpu_share']:.2f}", flush=True)


# ================================================================ validation against bench_hosts.py
def parse_config(config: str) -> tuple[int, int, str]:
    shape, rate = config.split("@")
    h, g = (int(v) for v in shape.lower().split("x"))
    return h, g, rate


def cycle_time(cl: Cluster, H: int, G: int, s: float) -> float:
    """hvdlite's steady-state cycle carrying s bytes: recursive doubling over the P ranks,
    numbered host by host, so log2 G exchanges inside the host, then log2 H across, all
    G ranks of a host crossing at once."""
    return log2ceil(G) * (cl.intra.alpha + s / cl.intra.bw) + log2ceil(H) * cl.inter_exchange(s, G)


def hvdlite_local_cost(params: dict, cl: Cluster) -> float:
    """What an hvdlite call costs beyond its cycle (the Python call, the hand-over to the
    engine, waking the caller): the measured 4-byte hvd.allreduce_ of 2 ranks on one
    host (steady state: the cycle carries it) less that cycle's exchange."""
    return params["control"]["hvdlite_call_shm"] - cycle_time(cl, 1, 2, HVD_CYCLE_BYTES + 4)


def hvdlite_call(cl: Cluster, H: int, G: int, S: float, two_level: bool,
                 mpi: OpenMpiRules = OpenMpiRules()) -> tuple[float, float, list[str]]:
    """One cached hvdlite allreduce in the steady state, without its local cost: up to
    HVD_CARRY_MAX the cycle carries the tensor and that is all; above, the cycle (the
    bit vector alone) and then the allreduce (flat or two-level). (time, link bytes,
    what ran)"""
    if S <= HVD_CARRY_MAX:
        return cycle_time(cl, H, G, HVD_CYCLE_BYTES + S), log2ceil(H) * G * (HVD_CYCLE_BYTES + S), ["cycle"]
    t, x, used = (hvdlite_two_level if two_level else hvdlite_flat)(cl, H, G, S, mpi)
    return cycle_time(cl, H, G, HVD_CYCLE_BYTES) + t, x + log2ceil(H) * G * HVD_CYCLE_BYTES, used


FOREIGN_MAX = 0.2  # rounds in which other processes took more of the CPU are left out


def group_validation(val: dict) -> tuple[dict, dict]:
    """{(config, bytes): {mode: [medians of each run], "alternating": [how each run
    ordered its ops]}} and per-config run notes."""
    grouped: dict = {}
    notes: dict = {}
    for run in val.get("runs", []):
        if "rows" not in run or run.get("foreign_cpu_share", 1.0) > FOREIGN_MAX:
            continue
        notes.setdefault(run["config"], []).append(
            {k: run.get(k) for k in ("round", "started", "seconds", "foreign_cpu_share", "commit", "core_built")})
        for row in run["rows"]:
            g = grouped.setdefault((row["config"], row["bytes"]),
                                   {m: [] for m in ("flat", "two_level", "default", "mpi", "alternating")})
            # a stored row without "order" ran hvdlite's op first in every repetition
            g["alternating"].append(row.get("order") == "alternating")
            g["flat"].append(row["flat_s"])
            # stored rows name this column "hierarchical_s" or "two-level_s"
            g["two_level"].append(row["hierarchical_s"] if "hierarchical_s" in row else row["two-level_s"])
            g["default"].append(row["default_s"])
            g["mpi"].append(row["mpi_s"])
    return grouped, notes


def validation_rows(params: dict, val: dict, max_reps: int = 20) -> list[dict]:
    grouped, _ = group_validation(val)
    rows = []
    order = VALIDATE_CONFIGS.split(",")
    for (config, S), samples in sorted(grouped.items(), key=lambda kv: (
            order.index(kv[0][0]) if kv[0][0] in order else len(order), kv[0][0], kv[0][1])):
        H, G, rate = parse_config(config)
        if rate not in params["emulated"]:
            continue
        cl, em = emulated_cluster(params, rate)
        P = H * G
        local = hvdlite_local_cost(params, cl)
        row = {"table": "validation", "config": config, "bytes": S, "runs": len(samples["flat"])}
        rules = open_mpi_rules(params, rate)
        models = {"flat": hvdlite_call(cl, H, G, S, False, rules), "two_level": hvdlite_call(cl, H, G, S, True, rules)}
        mpi = open_mpi_two_hosts(cl, H, G, S, rules)
        if mpi is not None:
            models["mpi"] = mpi
        for mode in ("flat", "two_level", "mpi"):
            meas = samples[mode]
            row[f"{mode}_measured_s"] = statistics.median(meas)
            row[f"{mode}_best_s"] = min(meas)  # other work on the machine only ever slows a run down
            row[f"{mode}_spread"] = (max(meas) - min(meas)) / statistics.median(meas) if len(meas) > 1 else 0.0
            if mode not in models:
                continue
            path, link_bytes, used = models[mode]
            # A lone pair (2 x 1): hvdlite's ring pieces follow each other back to back.
            # Open MPI's segments are not modelled, so its column gets no such term.
            pieces = len(_pieces(S, HVD_FLAT_PIECE)) if (H, G) == (2, 1) and mode != "mpi" else 1
            # Each run as it ordered its ops; then the median over runs, as measured.
            by_order = {alt: emulated_time(cl, em, P, path, link_bytes, S, 0.0 if mode == "mpi" else local,
                                           max_reps, pair_pieces=pieces, op_index=1 if mode == "mpi" else 0,
                                           alternating=alt)
                        for alt in set(samples["alternating"])}
            t = statistics.median(by_order[alt][0] for alt in samples["alternating"])
            regimes = {by_order[alt][1] for alt in samples["alternating"]}
            regime = regimes.pop() if len(regimes) == 1 else "edge"
            row[f"{mode}_model_s"] = t
            row[f"{mode}_regime"] = regime
            row[f"{mode}_algorithm"] = "+".join(used)
            row[f"{mode}_error"] = (t - row[f"{mode}_measured_s"]) / row[f"{mode}_measured_s"]
            row[f"{mode}_error_best"] = (t - row[f"{mode}_best_s"]) / row[f"{mode}_best_s"]
        rows.append(row)
    return rows


# ================================================================ extrapolation (public figures)
SOURCES = {
    "nvlink4": "NVLink 4 (H100/H200 SXM): 18 links, 900 GB/s per GPU both directions together, so 450 GB/s "
               "each way (MLCommons system description, mlcommons/inference_results_v4.1 "
               "closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json: \"18x 4th Gen NVLink, 900GB/s\")",
    "ndr": "NDR InfiniBand, 400 Gb/s = 50 GB/s per port; 8 such NICs in an 8-GPU H100 server (MLCommons "
           "system description mlcommons/inference_results_v3.1 closed/Dell/systems/XE9680_H100_SXM_80GBx8_TRT.json: "
           "\"8x 400Gb Infiniband\"); switch port-to-port latency below 1 us",
    "ethernet": "100 GbE = 12.5 GB/s per host; TCP latency 20-50 us against ~1 us for RDMA "
                "(malgukke.de/expertise/nodecommu.html); we take 10 us per step (RoCE or a tuned stack)",
    "resnet50": "ResNet-50 v1.5, mixed precision, batch 256 per GPU: 2,470 img/s on one A100 80GB, 1,200 on one "
                "V100 (NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md); "
                "25,557,032 parameters (benchmarks/resnet50_shapes.py)",
}


def public_clusters() -> list[Cluster]:
    """GPU clusters of 8 GPUs per host, from public figures (SOURCES) and stated assumptions
    for the per-step latencies (a few us: NCCL's per-hop software cost dominates the wire's)."""
    nvlink = Link(alpha=3e-6, bw=450e9)
    gamma_gpu = 3 / 3.35e12  # reading two operands and writing one at H100 SXM's 3.35 TB/s HBM3
    return [
        Cluster("8xH100 NVLink, 8 x 400G IB per host", nvlink, Link(5e-6, 50e9), nics=8, gamma=gamma_gpu,
                note="one NDR NIC per GPU (rail-optimized, as DGX H100)"),
        Cluster("8xH100 NVLink, 1 x 400G IB per host", nvlink, Link(5e-6, 50e9), nics=1, gamma=gamma_gpu,
                note="one NDR NIC per host"),
        Cluster("8xH100 NVLink, 1 x 100GbE per host", nvlink, Link(10e-6, 12.5e9), nics=1, gamma=gamma_gpu,
                note="one 100 Gb/s Ethernet NIC per host"),
    ]


EXTRAP_HOSTS = [2, 4, 8, 16, 32, 64, 128, 256, 512]
EXTRAP_SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 100 * 10**6, 1 * GiB]
RESNET50_BYTES = 25_557_032 * 4
FUSION_BUCKET = 64 * MiB  # Horovod's default fusion threshold


def extrapolation_rows(clusters: list[Cluster], G: int = 8) -> list[dict]:
    rows = []
    for cl in clusters:
        for H in EXTRAP_HOSTS:
            for S in EXTRAP_SIZES:
                t = predict(cl, H, G, S)
                win = min(t, key=t.get)
                rows.append({"table": "extrapolation", "cluster": cl.name, "hosts": H, "ranks": H * G, "bytes": S,
                             **{f"{a}_s": v for a, v in t.items()}, "winner": win,
                             "two_level_piece": two_level_best_piece(cl, H, G, S)[1]})
    return rows


def gradient_allreduce(cl: Cluster, H: int, G: int, alg: str, total: float = RESNET50_BYTES,
                       bucket: float = FUSION_BUCKET) -> float:
    """The whole gradient set, fused into buckets of `bucket` bytes, one allreduce each."""
    t = 0.0
    for b in _pieces(total, bucket):
        t += predict(cl, H, G, b)[alg]
    return t


def efficiency(t_compute: float, t_comm: float, t_control: float, overlap: float) -> float:
    """Scaling efficiency of a data-parallel step (weak scaling, batch per GPU fixed):
    the one-GPU step time over the P-GPU step time. `overlap`: the share of the compute
    (the backward pass) under which the allreduce can hide."""
    exposed = max(0.0, t_comm - overlap * t_compute)
    return t_compute / (t_compute + exposed + t_control)


def efficiency_rows(clusters: list[Cluster], params: dict, G: int = 8) -> list[dict]:
    """The claim checked: a 2D-ring (two-level) allreduce keeps scaling efficiency above
    0.90 at a thousand cards. ResNet-50 (fp32 gradients), batch 256 per GPU."""
    per_msg = params["control"]["rank0_per_message_shm"] if params else 2e-6
    rows = []
    computes = {"A100 AMP (2,470 img/s)": 256 / 2470, "3x faster GPU (assumed)": 256 / 2470 / 3}
    for cl in clusters:
        for H in [2, 16, 128, 256, 512]:
            P = H * G
            ctl_rank0 = 2 * rank0_cycle(P, cl.inter.alpha, per_msg)  # two buckets, one agreement each
            ctl_bits = 2 * bitvector_cycle(H, G, cl.intra.alpha, cl.inter.alpha)
            for cname, tc in computes.items():
                for alg in ("two_level", "two_level_hvdlite", "flat_ring", "tree", "leader"):
                    ta = gradient_allreduce(cl, H, G, alg)
                    rows.append({
                        "table": "efficiency", "cluster": cl.name, "hosts": H, "ranks": P, "compute": cname,
                        "compute_s": tc, "algorithm": alg, "allreduce_s": ta,
                        "control_rank0_s": ctl_rank0, "control_bitvector_s": ctl_bits,
                        "eff_no_overlap_bitvector": efficiency(tc, ta, ctl_bits, 0.0),
                        "eff_overlap_bitvector": efficiency(tc, ta, ctl_bits, 2 / 3),
                        "eff_no_overlap_rank0": efficiency(tc, ta, ctl_rank0, 0.0),
                        "eff_overlap_rank0": efficiency(tc, ta, ctl_rank0, 2 / 3),
                    })
    return rows


CONTROL_RANKS = [2, 8, 64, 256, 1024, 2048, 4096, 16384]


def control_rows(params: dict, clusters: list[Cluster]) -> list[dict]:
    """The cost of one negotiation cycle at P ranks (8 per host)."""
    c = params["control"]
    per_msg = {"measured here (mpi4py, shared memory)": c["rank0_per_message_shm"]}
    rows = []
    for cl in clusters[:1] + clusters[2:]:
        for P in CONTROL_RANKS:
            G = min(8, P)
            H = max(1, P // G)
            for label, pm in per_msg.items():
                rows.append({"table": "control", "cluster": cl.name, "ranks": P, "per_message_source": label,
                             "per_message_s": pm,
                             "rank0_s": rank0_cycle(P, cl.inter.alpha if H > 1 else cl.intra.alpha, pm),
                             "bitvector_tree_s": bitvector_cycle(H, G, cl.intra.alpha, cl.inter.alpha, "tree"),
                             "bitvector_ring_s": bitvector_cycle(H, G, cl.intra.alpha, cl.inter.alpha, "ring")})
    return rows


# ================================================================ output
def fmt_t(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms" if s < 0.1 else f"{s * 1e3:.0f} ms"
    return f"{s:.2f} s"


def fmt_b(n: float) -> str:
    for unit, f in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= f and n % f == 0:
            return f"{n // f:g} {unit}"
    if n >= 10**6:
        return f"{n / 10**6:g} MB"
    return f"{n:g} B"


def fmt_e(e: float | None) -> str:
    return "-" if e is None else f"{e * 100:+.0f} %"


def print_params(params: dict) -> None:
    shm, c = params["shm"], params["control"]
    print(f"\nParameters (measured {params['measured']}, commit {params['commit']}; "
          f"{PARAMS_FILE.name})")
    print(f"  shared memory: alpha {fmt_t(shm['alpha'])}, bw {shm['bw'] / 1e9:.2f} GB/s (exchange), "
          f"gamma {shm['gamma'] * 1e9:.3f} ns/B ({1 / shm['gamma'] / 1e9:.1f} GB/s reduced)")
    for rate, e in params["emulated"].items():
        print(f"  emulated {rate}: alpha {fmt_t(e['alpha'])}, wire {e['wire_bw'] / 1e9:.2f} GB/s, "
              f"rate {e['rate'] / 1e6:.1f} MB/s ({e['payload_efficiency']:.3f} of nominal), "
              f"bucket {e['burst'] / 1e6:.2f} MB")
    print(f"  rank 0 per worker message: {fmt_t(c['rank0_per_message_shm'])} (shared memory)"
          + "".join(f", {fmt_t(v)} ({k.split('_')[-1]})" for k, v in c.items()
                    if k.startswith("rank0_per_message_") and not k.endswith("shm")))
    print(f"  hvdlite fixed cost per call: {fmt_t(c['hvdlite_overhead_shm'])} (one host)"
          + "".join(f", {fmt_t(v)} ({k.split('_')[-1]})" for k, v in c.items()
                    if k.startswith("hvdlite_overhead_") and not k.endswith("shm")))


def validation_summary(rows: list[dict]) -> list[str]:
    """The counts docs/scale_model.md gives under the validation table."""
    lines = []
    for label, modes in (("hvdlite flat and two-level", ("flat", "two_level")), ("MPI_Allreduce (2 hosts)", ("mpi",))):
        big = [abs(r[f"{m}_error"]) for r in rows for m in modes if f"{m}_error" in r and r["bytes"] >= MiB]
        small = [abs(r[f"{m}_error"]) for r in rows for m in modes if f"{m}_error" in r and r["bytes"] < MiB]
        if big:
            lines.append(f"- {label}: {sum(e <= 0.25 for e in big)} of {len(big)} rows within 25 % from 1 MiB up "
                         f"(median |error| {statistics.median(big) * 100:.0f} %), {sum(e <= 0.25 for e in small)} of "
                         f"{len(small)} at 4 and 64 KiB.")
    return lines


def print_validation(rows: list[dict]) -> None:
    print("\nValidation: measured (median of runs) vs modelled on emulated hosts")
    head = (f"{'config':<11} {'size':>8} | {'flat':>8} {'model':>8} {'err':>6} | {'2-level':>8} {'model':>8} "
            f"{'err':>6} | {'MPI':>8} {'model':>8} {'err':>6} | regime")
    print(head)
    print("-" * len(head))
    for r in rows:
        def cell(m: str) -> str:
            return (f"{fmt_t(r.get(f'{m}_measured_s')):>8} {fmt_t(r.get(f'{m}_model_s')):>8} "
                    f"{fmt_e(r.get(f'{m}_error')):>6}")
        print(f"{r['config']:<11} {fmt_b(r['bytes']):>8} | {cell('flat')} | {cell('two_level')} | {cell('mpi')} | "
              f"{r.get('two_level_regime', '')}")
    errs = [abs(r[f"{m}_error"]) for r in rows for m in ("flat", "two_level", "mpi") if f"{m}_error" in r]
    big = [abs(r[f"{m}_error"]) for r in rows for m in ("flat", "two_level", "mpi")
           if f"{m}_error" in r and r["bytes"] >= 1 * MiB]
    if errs:
        print(f"within 25 %: {sum(e <= 0.25 for e in errs)} of {len(errs)} (all sizes); "
              f"{sum(e <= 0.25 for e in big)} of {len(big)} from 1 MiB; median |error| "
              f"{statistics.median(errs) * 100:.0f} % / {statistics.median(big) * 100:.0f} %")


def print_extrapolation(rows: list[dict]) -> None:
    short = {"flat_ring": "ring", "two_level": "2lvl", "two_level_hvdlite": "2lvl-hvd", "leader": "leader",
             "tree": "tree", "recursive_doubling": "rec.dbl", "rabenseifner": "rabens."}
    clusters = sorted({r["cluster"] for r in rows}, key=[r["cluster"] for r in rows].index)
    for cl in clusters:
        print(f"\nExtrapolation: {cl}, 8 ranks per host (time per allreduce; * = fastest)")
        head = f"{'ranks':>6} {'size':>8} " + " ".join(f"{v:>9}" for v in short.values())
        print(head)
        print("-" * len(head))
        for r in rows:
            if r["cluster"] != cl or r["hosts"] not in (2, 16, 128, 512):
                continue
            cells = []
            for a in short:
                s = fmt_t(r[f"{a}_s"]) + ("*" if a == r["winner"] else " ")
                cells.append(f"{s:>9}")
            print(f"{r['ranks']:>6} {fmt_b(r['bytes']):>8} " + " ".join(cells))


def print_efficiency(rows: list[dict]) -> None:
    print("\nResNet-50 data-parallel step, fp32 gradients in 64 MiB buckets: scaling efficiency")
    print("  (no overlap / backward overlap 2/3 of compute), control plane = bit-vector allreduce; "
          "[rank-0 control plane, with overlap]")
    head = f"{'cluster':<38} {'ranks':>6} {'compute':>8} {'algorithm':<18} {'allreduce':>9} {'efficiency':>14} {'[rank 0]':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        if r["algorithm"] not in ("two_level", "two_level_hvdlite", "flat_ring") or r["hosts"] not in (16, 128, 512):
            continue
        print(f"{r['cluster']:<38} {r['ranks']:>6} {fmt_t(r['compute_s']):>8} {r['algorithm']:<18} "
              f"{fmt_t(r['allreduce_s']):>9} {r['eff_no_overlap_bitvector']:>6.3f} / {r['eff_overlap_bitvector']:.3f} "
              f"{r['eff_overlap_rank0']:>8.3f}")


def print_control(rows: list[dict]) -> None:
    print("\nControl plane: one negotiation cycle (8 ranks per host)")
    head = f"{'cluster':<38} {'ranks':>6} {'via rank 0':>10} {'bits, tree':>10} {'bits, ring':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['cluster']:<38} {r['ranks']:>6} {fmt_t(r['rank0_s']):>10} {fmt_t(r['bitvector_tree_s']):>10} "
              f"{fmt_t(r['bitvector_ring_s']):>10}")


def markdown_tables(params: dict, vrows: list[dict], erows: list[dict], frows: list[dict], crows: list[dict]) -> str:
    """The tables of docs/scale_model.md, as printed by --markdown."""
    return "\n".join([md_params(params), "", md_validation(vrows), "", *validation_summary(vrows), "",
                      md_extrapolation(erows), md_efficiency(frows), "", md_control(crows)])


def md_params(params: dict) -> str:
    """The measured parameters as a Markdown table."""
    out = []
    shm, c = params["shm"], params["control"]
    out.append("| parameter | value |\n| --- | --- |")
    out.append(f"| shared memory α (half an 8-byte round trip) | {shm['alpha'] * 1e6:.2f} µs |")
    out.append(f"| shared memory bw (MPI_Sendrecv exchange, 1–64 MiB) | {shm['bw'] / 1e9:.2f} GB/s |")
    out.append(f"| γ, float32 sum on both ranks at once, 2 MiB / 64 MiB | {shm['gamma'] * 1e9:.3f} / "
               f"{shm['gamma_large'] * 1e9:.3f} ns per byte |")
    for rate, e in params["emulated"].items():
        out.append(f"| {rate} link: α over TCP / wire speed in a burst | {e['alpha'] * 1e6:.1f} µs / "
                   f"{e['wire_bw'] / 1e9:.2f} GB/s |")
        fitted = e.get("burst_fitted", float("nan"))
        out.append(f"| {rate} link: payload rate after the bucket / bucket | {e['rate'] / 1e6:.1f} MB/s "
                   f"({e['payload_efficiency']:.3f} of nominal) / {e['burst'] / 1e6:.2f} MB"
                   + (f" (fit {fitted / 1e6:.2f} MB)" if not math.isnan(fitted) else "") + " |")
    out.append(f"| rank 0's cost per worker message (receive + answer), shared memory | "
               f"{c['rank0_per_message_shm'] * 1e6:.2f} µs |")
    for k, v in c.items():
        if k.startswith("rank0_per_message_") and not k.endswith("shm"):
            out.append(f"| … over an emulated {k.split('_')[-1]} link (TCP) | {v * 1e6:.2f} µs |")
    out.append(f"| 32-byte bit-vector MPI_Allreduce, 2 ranks, shared memory | {c['bitvector_allreduce_shm'] * 1e6:.2f} µs |")
    cl_shm = Cluster("shm", Link(shm["alpha"], shm["bw"]), Link(shm["alpha"], shm["bw"]))
    out.append(f"| hvdlite's 4-byte hvd.allreduce_, 2 ranks, one host (steady state: its cycle carries it) / "
               f"less that cycle's exchange: the local cost per call | {c['hvdlite_call_shm'] * 1e6:.1f} / "
               f"{hvdlite_local_cost(params, cl_shm) * 1e6:.1f} µs |")
    one = params.get("mpi_one_per_host")
    if one:
        sent = ", ".join(f"{fmt_b(int(k))}: {v:.2f}" for k, v in sorted(one["tx_over_size"].items(), key=lambda kv: int(kv[0])))
        out.append(f"| `MPI_Allreduce`, 4 hosts × 1 rank: bytes each host sends ÷ S (frames with headers) | {sent}; "
                   f"recursive doubling below {fmt_b(one['rd_max'])} |")
    for rate, small in sorted(params.get("small_messages", {}).items()):
        ex = ", ".join(f"{fmt_b(int(k))}: {v * 1e6:.0f}" for k, v in sorted(small["exchange_s"].items(), key=lambda kv: int(kv[0])))
        mp = ", ".join(f"{fmt_b(int(k))}: {v * 1e6:.0f} ({small['mpi_steps'][k]})"
                       for k, v in sorted(small["mpi_allreduce_s"].items(), key=lambda kv: int(kv[0])))
        out.append(f"| 2 hosts × 1 rank, {rate}, one call after a barrier, bucket full: exchange both ways, µs | {ex} |")
        out.append(f"| … `MPI_Allreduce`, µs (exchanges its algorithm makes) | {mp} |")
    for rate, pair in sorted(params.get("pair_exchange", {}).items()):
        out.append(f"| 2 hosts × 1 rank, {rate}: 2 MiB exchanges back to back ÷ what the rate allows "
                   f"(share over 1.5 ×), send posted first (hvdlite) / as `MPI_Sendrecv` | "
                   f"{pair['factor']:.2f} ({pair['slow_fraction']:.0%}) / "
                   f"{pair.get('sendrecv_factor', float('nan')):.2f} ({pair.get('sendrecv_slow_fraction', 0):.0%}) |")
    return "\n".join(out)


def md_validation(vrows: list[dict]) -> str:
    """Measured against modelled on the emulated hosts, as a Markdown table."""
    out = []
    out.append("| config | size | flat: measured | model | error | two-level: measured | model | error | "
               "MPI_Allreduce: measured | model | error | link |")
    out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in vrows:
        cells = []
        for m in ("flat", "two_level", "mpi"):
            spread = r.get(f"{m}_spread", 0)
            meas = fmt_t(r.get(f"{m}_measured_s")) + (" ±" if spread > 0.3 else "")
            cells += [meas, fmt_t(r.get(f"{m}_model_s")), fmt_e(r.get(f"{m}_error"))]
        out.append(f"| {r['config']} | {fmt_b(r['bytes'])} | " + " | ".join(cells) + f" | {r.get('two_level_regime', '')} |")
    return "\n".join(out)


SHORT = {"flat_ring": "flat ring", "two_level": "2D torus", "two_level_hvdlite": "hvdlite 2-level",
         "leader": "leader", "tree": "tree", "recursive_doubling": "rec. doubling", "rabenseifner": "Rabenseifner"}


def md_extrapolation(erows: list[dict]) -> str:
    """The modelled time per allreduce on each public network, one Markdown table each
    (bold: the fastest)."""
    out = []
    short = SHORT
    for cl in dict.fromkeys(r["cluster"] for r in erows):
        out.append(f"{cl}:\n")
        out.append("| ranks | size | " + " | ".join(short.values()) + " |")
        out.append("| --- | --- | " + " | ".join("---" for _ in short) + " |")
        for r in erows:
            if r["cluster"] == cl and r["hosts"] in (2, 16, 128, 512) and r["bytes"] in (64 * KiB, 16 * MiB, 100 * 10**6):
                cells = [("**" + fmt_t(r[f"{a}_s"]) + "**") if a == r["winner"] else fmt_t(r[f"{a}_s"]) for a in short]
                out.append(f"| {r['ranks']} | {fmt_b(r['bytes'])} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def md_efficiency(frows: list[dict]) -> str:
    """Scaling efficiency of the ResNet-50 step as a Markdown table: no overlap /
    overlapped with the bit-vector control plane; last column, the control plane through
    rank 0."""
    short = SHORT
    out = []
    algs = ("two_level", "two_level_hvdlite", "flat_ring", "tree")
    out.append("| network | GPUs | compute per step | " + " | ".join(short[a] for a in algs)
               + " | 2D torus overlapped, control via rank 0 |")
    out.append("| --- | --- | --- | " + " | ".join("---" for _ in algs) + " | --- |")
    keys = list(dict.fromkeys((r["cluster"], r["hosts"], r["compute"]) for r in frows if r["hosts"] in (16, 128, 512)))
    for cl, H, comp in keys:
        by = {r["algorithm"]: r for r in frows if (r["cluster"], r["hosts"], r["compute"]) == (cl, H, comp)}
        cells = [f"{by[a]['eff_no_overlap_bitvector']:.3f} / {by[a]['eff_overlap_bitvector']:.3f}" for a in algs]
        out.append(f"| {cl} | {H * 8} | {fmt_t(by['two_level']['compute_s'])} | " + " | ".join(cells)
                   + f" | {by['two_level']['eff_overlap_rank0']:.3f} |")
    return "\n".join(out)


def md_control(crows: list[dict]) -> str:
    """One negotiation cycle's cost as a Markdown table."""
    out = []
    out.append("| network | ranks | via rank 0 | bit vector, recursive doubling | bit vector, ring |")
    out.append("| --- | --- | --- | --- | --- |")
    for r in crows:
        out.append(f"| {r['cluster']} | {r['ranks']} | {fmt_t(r['rank0_s'])} | {fmt_t(r['bitvector_tree_s'])} | "
                   f"{fmt_t(r['bitvector_ring_s'])} |")
    return "\n".join(out)


# ================================================================ plots
COLORS = {"flat_ring": "tab:red", "two_level": "tab:blue", "two_level_hvdlite": "tab:cyan", "leader": "tab:orange",
          "tree": "tab:green", "recursive_doubling": "tab:purple", "rabenseifner": "tab:brown"}


def plot_all(params: dict, vrows: list[dict], clusters: list[Cluster], erows: list[dict], crows: list[dict],
             outdir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    written = []

    # 1. which algorithm wins where: among all modelled, and among what NCCL and Horovod ship
    sizes = [2.0 ** k for k in range(12, 31)]
    sets = [("all modelled algorithms", [a for a in ALGORITHMS if a != "two_level_hvdlite"]),
            ("rings and trees only", ["flat_ring", "two_level", "leader", "tree"])]
    cache = {(cl.name, H, S): predict(cl, H, 8, S) for cl in clusters for H in EXTRAP_HOSTS for S in sizes}
    shown = [a for a in ALGORITHMS if a != "two_level_hvdlite"]
    cmap = ListedColormap([COLORS[a] for a in shown])
    fig, axes = plt.subplots(2, len(clusters), figsize=(5.2 * len(clusters), 8.4), sharey=True, squeeze=False)
    for row, (what, algs) in enumerate(sets):
        for ax, cl in zip(axes[row], clusters):
            grid = [[shown.index(min(algs, key=lambda a: cache[(cl.name, H, S)][a])) for S in sizes]
                    for H in EXTRAP_HOSTS]
            ax.imshow(grid, origin="lower", aspect="auto", cmap=cmap, vmin=-0.5, vmax=len(shown) - 0.5)
            ax.set_xticks(range(0, len(sizes), 3))
            ax.set_xticklabels([fmt_b(sizes[i]).replace(" ", "") for i in range(0, len(sizes), 3)], fontsize=8)
            ax.set_yticks(range(len(EXTRAP_HOSTS)))
            ax.set_yticklabels([f"{H}x8={H * 8}" for H in EXTRAP_HOSTS], fontsize=8)
            ax.set_title(f"{cl.name}\n({what})", fontsize=9)
            ax.set_xlabel("allreduce size")
        axes[row][0].set_ylabel("hosts x GPUs = ranks")
    fig.legend(handles=[Patch(color=COLORS[a], label=LABELS[a]) for a in shown], loc="lower center", ncol=3,
               fontsize=8)
    fig.suptitle("Fastest allreduce algorithm by the model (8 GPUs per host)", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    written.append(outdir / "scale_winner.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # 2. time vs size at several scales
    picks = [(clusters[0], 8), (clusters[0], 128), (clusters[-1], 8), (clusters[-1], 128)]
    fig, axes = plt.subplots(2, 2, figsize=(11, 9.5))
    for ax, (cl, H) in zip(axes.flat, picks):
        for a in ALGORITHMS:
            ys = [predict(cl, H, 8, S)[a] for S in sizes]
            ax.loglog(sizes, ys, label=LABELS[a], color=COLORS[a], ls="--" if a == "two_level_hvdlite" else "-")
        ax.set_title(f"{cl.name}: {H} hosts x 8 = {H * 8} ranks", fontsize=9)
        ax.set_xlabel("allreduce size (bytes)")
        ax.set_ylabel("time (s)")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8)
    fig.suptitle("Modelled allreduce time", fontsize=11)
    fig.tight_layout(rect=(0, 0.1, 1, 0.97))
    written.append(outdir / "scale_time_vs_size.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # 3. measured vs modelled on the emulated hosts
    order = VALIDATE_CONFIGS.split(",")
    configs = sorted({r["config"] for r in vrows}, key=lambda c: (order.index(c) if c in order else len(order), c))
    if configs:
        n = len(configs)
        cols = 3
        fig, axes = plt.subplots(math.ceil(n / cols), cols, figsize=(15, 4.2 * math.ceil(n / cols)), squeeze=False)
        for ax, config in zip(axes.flat, configs):
            rs = [r for r in vrows if r["config"] == config]
            xs = [r["bytes"] for r in rs]
            for mode, color, marker in (("flat", "tab:red", "o"), ("two_level", "tab:blue", "s"), ("mpi", "tab:gray", "^")):
                ax.loglog(xs, [r[f"{mode}_measured_s"] for r in rs], marker, color=color, label=f"{mode} measured")
                if any(f"{mode}_model_s" in r for r in rs):
                    pts = [(r["bytes"], r[f"{mode}_model_s"]) for r in rs if f"{mode}_model_s" in r]
                    ax.loglog([p[0] for p in pts], [p[1] for p in pts], "-", color=color, alpha=0.7,
                              label=f"{mode} model")
            H, G, rate = parse_config(config)
            if rate in params["emulated"]:
                floor = [2 * (H - 1) / H * x / params["emulated"][rate]["rate"] for x in xs]
                ax.loglog(xs, floor, ":", color="black", label="link floor (payload rate)")
            ax.set_title(f"{H} hosts x {G} ranks, {rate} links", fontsize=9)
            ax.set_xlabel("allreduce size (bytes)")
            ax.set_ylabel("time (s)")
            ax.grid(True, which="both", alpha=0.3)
        axes.flat[0].legend(fontsize=7)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.suptitle("Emulated hosts: bench_hosts.py medians (points) against the model (lines)", fontsize=11)
        fig.tight_layout()
        written.append(outdir / "scale_validation.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    # 4. control plane
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for cl, style in ((clusters[0], "-"), (clusters[-1], "--")):
        rs = [r for r in crows if r["cluster"] == cl.name]
        ps = [r["ranks"] for r in rs]
        ax.loglog(ps, [r["rank0_s"] for r in rs], style, color="tab:red", marker="o", label=f"via rank 0 ({cl.name})")
        ax.loglog(ps, [r["bitvector_tree_s"] for r in rs], style, color="tab:blue", marker="s",
                  label=f"bit-vector allreduce, tree ({cl.name})")
        ax.loglog(ps, [r["bitvector_ring_s"] for r in rs], style, color="tab:gray", marker="^",
                  label=f"bit-vector allreduce, ring ({cl.name})")
    ax.axhline(1e-3, color="black", ls=":", lw=1)
    ax.text(2, 1.1e-3, "1 ms: Horovod's cycle time", fontsize=8)
    ax.set_xlabel("ranks (8 per host)")
    ax.set_ylabel("one negotiation cycle (s)")
    ax.set_title("Control plane: cost of one cycle", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(outdir / "scale_control_plane.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # 5. scaling efficiency
    fig, axes = plt.subplots(1, len(clusters), figsize=(5.2 * len(clusters), 5.2), sharey=True)
    hs = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    tc = 256 / 2470
    per_msg = params["control"]["rank0_per_message_shm"]
    for ax, cl in zip(axes, clusters):
        for a in ("two_level", "two_level_hvdlite", "flat_ring", "tree"):
            effs, effo, effr = [], [], []
            for H in hs:
                ta = gradient_allreduce(cl, H, 8, a)
                cb = 2 * bitvector_cycle(H, 8, cl.intra.alpha, cl.inter.alpha)
                cr = 2 * rank0_cycle(H * 8, cl.inter.alpha, per_msg)
                effs.append(efficiency(tc, ta, cb, 0))
                effo.append(efficiency(tc, ta, cb, 2 / 3))
                effr.append(efficiency(tc, ta, cr, 2 / 3))
            ps = [H * 8 for H in hs]
            ax.semilogx(ps, effs, "-", color=COLORS[a], label=f"{LABELS[a]}, no overlap")
            ax.semilogx(ps, effo, "--", color=COLORS[a], label="same, overlapped with backward")
            if a == "two_level":
                ax.semilogx(ps, effr, ":", color="black", label="2D torus overlapped, control via rank 0")
        ax.axhline(0.9, color="gray", lw=1)
        ax.set_ylim(0, 1.02)
        ax.set_title(cl.name, fontsize=9)
        ax.set_xlabel("GPUs (8 per host)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("scaling efficiency")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, [l.split(" (")[0] + (", no overlap" if l.endswith("no overlap") and "(" in l else "")
                         for l in labels], loc="lower center", ncol=3, fontsize=7)
    fig.suptitle("ResNet-50, fp32 gradients, batch 256/GPU at A100 speed (104 ms compute per step)", fontsize=10)
    fig.tight_layout(rect=(0, 0.16, 1, 0.95))
    written.append(outdir / "scale_efficiency.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


# ================================================================ main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--measure", action="store_true", help="re-measure the parameters into --params")
    p.add_argument("--rates", default="1gbit,10gbit", help="emulated link rates to measure")
    p.add_argument("--measure-mpi-bytes", action="store_true",
                   help="measure what Open MPI's allreduce sends per host, 4 hosts x 1 rank, into --params (root)")
    p.add_argument("--measure-pair-exchange", action="store_true",
                   help="measure, per --rates, how long a lone pair's ring exchanges take across 2 hosts (root)")
    p.add_argument("--measure-small", action="store_true",
                   help="measure, per --rates, small exchanges and MPI_Allreduce across 2 hosts (root)")
    p.add_argument("--validate", action="store_true", help="run bench_hosts.py on emulated hosts (root)")
    p.add_argument("--configs", default=VALIDATE_CONFIGS, help="for --validate: HxG@RATE,...")
    p.add_argument("--sizes", default=VALIDATE_SIZES, help="for --validate")
    p.add_argument("--rounds", type=int, default=3, help="repetitions of --measure / --validate")
    p.add_argument("--max-reps", type=int, default=20, help="bench_hosts.py --max-reps")
    p.add_argument("--params", default=str(PARAMS_FILE))
    p.add_argument("--validation-file", default=str(VALIDATION_FILE))
    p.add_argument("--plot", action="store_true", help="write docs/scale_*.png")
    p.add_argument("--plot-dir", default=str(DOCS))
    p.add_argument("--no-json", action="store_true", help="tables only")
    p.add_argument("--markdown", action="store_true", help="print docs/scale_model.md's tables in Markdown instead")
    p.add_argument("--measure-worker", choices=["intra", "inter", "mpibytes", "pairx", "small"], help=argparse.SUPPRESS)
    p.add_argument("--rate", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure_worker:
        sys.path.insert(0, str(REPO))
        measure_worker(args.measure_worker, args.rate)
        return 0
    if args.measure:
        run_measure([r for r in args.rates.split(",") if r], args.rounds, Path(args.params))
    if args.measure_mpi_bytes:
        run_measure_mpi_bytes(Path(args.params))
    if args.measure_pair_exchange:
        run_measure_pair_exchange([r for r in args.rates.split(",") if r], args.rounds, Path(args.params))
    if args.measure_small:
        run_measure_small([r for r in args.rates.split(",") if r], args.rounds, Path(args.params))
    if args.validate:
        run_validation(args.configs, args.sizes, args.rounds, Path(args.validation_file), args.max_reps)
    if not Path(args.params).exists():
        print(f"cost_model: no parameters in {args.params}; run with --measure first", file=sys.stderr)
        return 2
    params = json.loads(Path(args.params).read_text())
    val = json.loads(Path(args.validation_file).read_text()) if Path(args.validation_file).exists() else {}
    clusters = public_clusters()
    vrows = validation_rows(params, val, args.max_reps)
    erows = extrapolation_rows(clusters)
    frows = efficiency_rows(clusters, params)
    crows = control_rows(params, clusters)
    if args.markdown:
        print(markdown_tables(params, vrows, erows, frows, crows))
        return 0
    print_params(params)
    print_validation(vrows)
    print_extrapolation(erows)
    print_efficiency(frows)
    print_control(crows)
    if not args.no_json:
        print()
        for row in vrows + erows + frows + crows:
            print(json.dumps(row))
    if args.plot:
        try:
            written = plot_all(params, vrows, clusters, erows, crows, Path(args.plot_dir))
        except ImportError:
            print("cost_model: --plot needs matplotlib (pip install matplotlib); tables only", file=sys.stderr)
        else:
            print("wrote " + ", ".join(str(w.relative_to(REPO)) if w.is_relative_to(REPO) else str(w)
                                       for w in written), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
