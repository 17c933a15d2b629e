"""The formulas of benchmarks/cost_model.py against closed forms worked out by hand.

No MPI, no matplotlib: every case below is a few lines of arithmetic written out
independently of the model's code, so a wrong term in a formula (a missing factor 2,
a step count off by one, streams that do not share a NIC) fails here.
"""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "cost_model.py"
_spec = importlib.util.spec_from_file_location("cost_model", _PATH)
cm = importlib.util.module_from_spec(_spec)
sys.modules["cost_model"] = cm  # dataclasses look their module up there
_spec.loader.exec_module(cm)

KiB = 1 << 10
MiB = 1 << 20

# A made-up cluster with round numbers: shared memory 1 us and 10 GB/s, the network
# 10 us and 1 GB/s per NIC, reduction 0.1 ns per byte.
A_L, BW_L = 1e-6, 10e9
A_X, BW_X = 10e-6, 1e9
GAMMA = 1e-10


def cluster(nics: int = 1, gamma: float = GAMMA) -> "cm.Cluster":
    return cm.Cluster("test", cm.Link(A_L, BW_L), cm.Link(A_X, BW_X), nics=nics, gamma=gamma)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def test_ring_allreduce_closed_form():
    # 4 ranks, 1 MB: 6 steps of 250 kB, 3 of them reduce 250 kB each
    t = cm.ring_allreduce(4, 1e6, A_X, BW_X, GAMMA)
    assert close(t, 6 * (10e-6 + 250e3 / 1e9) + 3 * 250e3 * 1e-10)  # 1.635 ms
    assert close(t, 1.635e-3)
    assert cm.ring_allreduce(1, 1e6, A_X, BW_X, GAMMA) == 0.0


def test_flat_ring_one_host_is_a_ring_over_shared_memory():
    assert close(cm.flat_ring(cluster(), 1, 4, 8e6), cm.ring_allreduce(4, 8e6, A_L, BW_L, GAMMA))


def test_flat_ring_two_hosts_is_limited_by_the_link():
    # 2 x 2 = 4 ranks, 8 MB: 6 steps of 2 MB; the hop between hosts (10 us + 2 ms) is
    # slower than the one inside (1 us + 0.2 ms); 3 reduction steps of 2 MB
    t = cm.flat_ring(cluster(), 2, 2, 8e6)
    assert close(t, 6 * (10e-6 + 2e6 / 1e9) + 3 * 2e6 * 1e-10)
    # the link carries 2(P-1)/P of S each way: 12 MB at 1 GB/s is the bulk of it
    assert 12e-3 < t < 12e-3 + 6 * 10e-6 + 1e-3


def test_flat_ring_channels_share_one_nic_but_use_several():
    # 2 rings of S/2 over 1 NIC: same bytes through the same NIC, same bandwidth term
    one, two = cm.flat_ring(cluster(1, 0), 2, 4, 64e6), cm.flat_ring(cluster(1, 0), 2, 4, 64e6, rings=2)
    assert close(one, two)
    # over 2 NICs each ring has its own: 14 steps of 4 MB at 1 GB/s, where one ring
    # needs 14 steps of 8 MB (the latency term stays)
    two_nics = cm.flat_ring(cluster(2, 0), 2, 4, 64e6, rings=2)
    assert close(two_nics, 14 * (10e-6 + 4e6 / 1e9))
    assert close(cm.flat_ring(cluster(2, 0), 2, 4, 64e6), 14 * (10e-6 + 8e6 / 1e9))


def test_two_level_one_piece_closed_form():
    # 2 hosts x 4 ranks, 8 MB, 1 NIC: segments of 2 MB
    S = 8e6
    rs = 3 * (1e-6 + 2e6 / 10e9 + 2e6 * 1e-10)
    ag = 3 * (1e-6 + 2e6 / 10e9)
    # across hosts: 4 concurrent 2-rank rings of 2 MB, each stream gets 1/4 of the NIC;
    # 2 steps of 1 MB at 0.25 GB/s, 1 reduction of 1 MB
    cross = 2 * (10e-6 + 1e6 / 0.25e9) + 1e6 * 1e-10
    assert close(cm.two_level(cluster(), 2, 4, S), rs + cross + ag)
    # the link carries 2(H-1)/H * S = 8 MB at 1 GB/s: 8 ms of the 8.12 ms across hosts
    assert 8e-3 < cross < 8.2e-3


def test_two_level_serial_pieces_add_up_and_pipelining_overlaps_them():
    cl = cluster()
    one_piece = cm.two_level(cl, 2, 4, 4e6)
    assert close(cm.two_level(cl, 2, 4, 8e6, piece=4e6), 2 * one_piece)
    rs, x, ag = cm.two_level_phases(cl, 2, 4, 4e6)
    assert close(rs + x + ag, one_piece)
    # pipelined: the first piece whole, then the slower level of each further piece
    assert close(cm.two_level(cl, 2, 4, 12e6, piece=4e6, pipelined=True), one_piece + 2 * max(rs + ag, x))


def test_two_level_with_one_nic_per_rank_uses_them_all():
    # 8 NICs for 8 ranks per host: each cross-host stream gets a whole NIC
    S = 64e6
    t8 = cm.two_level(cluster(8, 0), 2, 8, S)
    cross = 2 * (10e-6 + S / 8 / 2 / 1e9)
    local = 7 * (1e-6 + S / 8 / 10e9) * 2
    assert close(t8, local + cross)
    assert cm.two_level(cluster(1, 0), 2, 8, S) > 7 * t8 / 2  # one NIC: 8x the cross time


def test_leader_closed_form():
    # 2 hosts x 2 ranks, 4 MB: reduce-scatter (1 step of 2 MB + reduce) + gather (1 step),
    # leaders' ring of 4 MB over 2 (2 steps of 2 MB, one stream), scatter + allgather
    S = 4e6
    reduce = (1e-6 + 2e6 / 10e9 + 2e6 * 1e-10) + (1e-6 + 2e6 / 10e9)
    bcast = 2 * (1e-6 + 2e6 / 10e9)
    cross = 2 * (10e-6 + 2e6 / 1e9) + 2e6 * 1e-10
    assert close(cm.leader(cluster(), 2, 2, S), reduce + cross + bcast)


def test_recursive_doubling_closed_form():
    # 4 hosts x 2 ranks, 1 MB: 1 exchange in the host, 2 across where both ranks of a
    # host send 1 MB at once through one NIC (0.5 GB/s each)
    S = 1e6
    expect = (1e-6 + S / 10e9 + S * 1e-10) + 2 * (10e-6 + S / 0.5e9 + S * 1e-10)
    assert close(cm.recursive_doubling(cluster(), 4, 2, S), expect)


def test_rabenseifner_closed_form():
    # 2 hosts x 2 ranks, 4 MB: halving in the host (pieces of 2 MB), then across (1 MB,
    # 2 streams on 1 NIC); each level: 2 messages (reduce-scatter + allgather), 1 reduction
    S = 4e6
    intra = 2 * (1e-6 + 2e6 / 10e9) + 2e6 * 1e-10
    inter = 2 * (10e-6 + 1e6 / 0.5e9) + 1e6 * 1e-10
    assert close(cm.rabenseifner(cluster(), 2, 2, S), intra + inter)
    # same link bytes as the two-level allreduce: 2(H-1)/H * S through the host's NIC
    assert close(cm.rabenseifner(cluster(1, 0), 2, 2, S) - 2 * (1e-6 + 2e6 / 10e9) - 2 * 10e-6, 4e-3)


def test_tree_pipeline_closed_form():
    # 4 hosts x 1 rank, 8 MB in steps of 1 MB: 2*log2(4) = 4 stages of
    # 10 us + 2 * 1 MB / 1 GB/s + 1 MB * gamma, then 7 more steps of the slowest stage
    tau = 10e-6 + 2 * 1e6 / 1e9 + 1e6 * 1e-10
    assert close(cm.tree_pipeline(cluster(), 4, 1, 8e6, 1e6), 4 * tau + 7 * tau)
    best, d = cm.tree(cluster(), 4, 1, 8e6)
    assert best <= cm.tree_pipeline(cluster(), 4, 1, 8e6, 8e6)
    assert close(best, cm.tree_pipeline(cluster(), 4, 1, 8e6, d))


def test_large_messages_reach_the_bandwidth_bounds():
    # with no latency and no reduction cost, only bytes through the slowest link count
    cl = cm.Cluster("bw", cm.Link(0.0, BW_L), cm.Link(0.0, BW_X), nics=1, gamma=0.0)
    H, G, S = 8, 4, 1e9
    assert math.isclose(cm.flat_ring(cl, H, G, S), 2 * (H * G - 1) / (H * G) * S / BW_X, rel_tol=1e-9)
    local = 2 * (G - 1) / G * S / BW_L
    assert math.isclose(cm.two_level(cl, H, G, S), local + 2 * (H - 1) / H * S / BW_X, rel_tol=1e-9)
    # the tree moves 2 S per link direction: H/(H-1) times the ring's bytes
    t_tree, _ = cm.tree(cl, H, 1, S)
    assert math.isclose(t_tree, 2 * S / BW_X, rel_tol=0.01)


def test_control_plane_cycles():
    # 1,025 ranks through rank 0 at 2 us per message: 2 latencies + 1,024 messages
    assert close(cm.rank0_cycle(1025, 5e-6, 2e-6), 2 * 5e-6 + 1024 * 2e-6)
    assert cm.rank0_cycle(1, 5e-6, 2e-6) == 0.0
    # 128 hosts x 8: a bit vector by recursive doubling, 3 steps inside, 7 across
    assert close(cm.bitvector_cycle(128, 8, 1e-6, 5e-6), 3 * 1e-6 + 7 * 5e-6)
    assert close(cm.bitvector_cycle(128, 8, 1e-6, 5e-6, "ring"), 2 * 1023 * 5e-6)


def test_hvdlite_piece_rules():
    cl = cluster()
    # flat, 8 ranks: a 1 MiB piece has 128 KiB segments, below the ring's 256 KiB: MPI
    assert cm.hvdlite_flat(cl, 4, 2, 1 * MiB)[2] == ["MPI_Allreduce"]
    assert cm.hvdlite_flat(cl, 4, 2, 4 * MiB)[2] == ["ring"]
    # two-level on 2 x 2: 2 MiB pieces, 1 MiB per rank, 512 KiB per ring segment: ring
    t, x, used = cm.hvdlite_two_level(cl, 2, 2, 8 * MiB)
    assert used == ["ring"] and close(x, 8 * MiB)  # 2(H-1)/H * S through each link
    assert close(t, 4 * sum(cm.two_level_phases(cl, 2, 2, 2 * MiB)))
    # with one rank per host it is the flat allreduce
    assert cm.hvdlite_two_level(cl, 4, 1, 8 * MiB) == cm.hvdlite_flat(cl, 4, 1, 8 * MiB)


def test_mpi_allreduce_one_rank_per_host_switches_algorithm_at_rd_max():
    cl = cluster()
    rules = cm.OpenMpiRules(rd_max=8 * KiB)
    # below rd_max: recursive doubling, log2(4) = 2 whole buffers out of each host
    t, x = cm._one_per_host(cl, 4, 4 * KiB, 1, rules)
    assert close(x, 2 * 4 * KiB) and close(t, cm.cross_allreduce(cl, 4, 4 * KiB, 1, "rd"))
    # from rd_max on: 2(H-1)/H of the buffer (Rabenseifner's), 2 log2(4) latencies
    t, x = cm._one_per_host(cl, 4, 64 * KiB, 1, rules)
    assert close(x, 1.5 * 64 * KiB) and close(t, cm.cross_allreduce(cl, 4, 64 * KiB, 1, "rabenseifner"))
    # on 2 hosts both send the buffer once: recursive doubling (one exchange)
    assert close(cm._one_per_host(cl, 2, 64 * KiB, 1, rules)[1], 64 * KiB)
    # flat on 4 x 1 at 64 KiB calls MPI_Allreduce: its bytes follow
    assert close(cm.hvdlite_flat(cl, 4, 1, 64 * KiB, rules)[1], 1.5 * 64 * KiB)
    assert close(cm.hvdlite_flat(cl, 4, 1, 64 * KiB)[1], 2 * 64 * KiB)  # no rd_max: as before
    # two-level on 4 x 2 at 64 KiB: each rank's 32 KiB across 4 hosts, 2 streams a host
    assert close(cm.hvdlite_two_level(cl, 4, 2, 64 * KiB, rules)[1], 2 * 1.5 * 32 * KiB)


def test_two_ranks_follow_the_measured_step_count():
    cl = cluster()
    # measured: one exchange up to 2 KiB, two from 4 KiB, one again at 8 KiB (16 KiB the last size measured)
    rules = cm.OpenMpiRules(two_rank_steps=((8, 1), (2 * KiB, 1), (4 * KiB, 2), (8 * KiB, 1), (16 * KiB, 2)))
    assert rules.algorithm(2, 2 * KiB) == "rd" and rules.algorithm(2, 3 * KiB) == "rd"
    assert rules.algorithm(2, 4 * KiB) == "rabenseifner" and rules.algorithm(2, 6 * KiB) == "rabenseifner"
    assert rules.algorithm(2, 8 * KiB) == "rd" and rules.algorithm(2, 16 * KiB) == "rabenseifner"
    assert rules.algorithm(2, 64 * KiB) == "rd"  # beyond what was measured: one exchange
    assert rules.algorithm(4, 4 * KiB) == "rd"   # more ranks: rd_max decides (none: rd)
    # two exchanges of half the buffer each, the first reducing
    t, x = cm._one_per_host(cl, 2, 4 * KiB, 1, rules)
    assert close(t, 2 * (A_X + 2 * KiB / BW_X) + 2 * KiB * GAMMA) and close(x, 4 * KiB)
    # Open MPI's own allreduce on 2 x 1 (tuned) follows the same rule
    assert close(cm.open_mpi_two_hosts(cl, 2, 1, 4 * KiB, rules)[0], t)
    # with several ranks per host it is HAN, whose leaders reduce and broadcast instead
    assert close(cm.open_mpi_two_hosts(cl, 2, 2, 4 * KiB, rules)[0], cm.han(cl, 2, 2, 4 * KiB))


def test_han_one_segment_runs_its_four_stages_in_turn():
    # 2 hosts x 4 ranks, 32 KiB (one segment): binomial reduce in the host (2 steps,
    # reducing), ireduce to the root leader (1 message + its reduction), ibcast back
    # (1 message), binomial broadcast in the host (2 steps)
    s = 32 * KiB
    low_reduce = 2 * (A_L + s / BW_L + s * GAMMA)
    up = (A_X + s / BW_X) + s * GAMMA + (A_X + s / BW_X)
    low_bcast = 2 * (A_L + s / BW_L)
    assert close(cm.han(cluster(), 2, 4, s), low_reduce + up + low_bcast)
    # 4 hosts: the leaders' binomial trees take 2 messages each way
    up4 = 2 * ((A_X + s / BW_X) + s * GAMMA) + 2 * (A_X + s / BW_X)
    assert close(cm.han(cluster(), 4, 4, s), low_reduce + up4 + low_bcast)


def test_han_overlaps_the_levels_of_consecutive_segments():
    # 2 x 2, three segments of 64 KiB. Per segment: host level reduce r, broadcast b;
    # leaders' ireduce u (with its reduction), ibcast v. Iterations:
    # 0: r | 1: max(r, u) | 2: max(r, max(u, v)) | 3: max(b, max(u, v)) | 4: max(b, v) | 5: b
    g = 64 * KiB
    r = A_L + g / BW_L + g * GAMMA
    b = A_L + g / BW_L
    u = A_X + g / BW_X + g * GAMMA
    v = A_X + g / BW_X
    expect = r + max(r, u) + max(r, u, v) + max(b, u, v) + max(b, v) + b
    assert close(cm.han(cluster(), 2, 2, 3 * g), expect)
    # link-bound here (u, v >> r, b): each further segment adds one message, as its
    # ireduce travels beside the previous one's ibcast; 4 messages instead of 6
    assert cm.han(cluster(), 2, 2, 3 * g) < 0.7 * 3 * cm.han(cluster(), 2, 2, g)


def test_measured_small_exchanges_replace_alpha_beta_below_their_largest_size():
    table = ((8, 11e-6), (4 * KiB, 17e-6), (64 * KiB, 80e-6))
    cl = cm.replace(cluster(), inter_small=table)
    assert close(cl.inter_exchange(4), 11e-6)                    # below the first size: the first
    assert close(cl.inter_exchange(4 * KiB), 17e-6)
    assert close(cl.inter_exchange(34 * KiB), 17e-6 + 63e-6 * 30 / 60)  # halfway from 4 to 64 KiB
    assert close(cl.inter_exchange(128 * KiB), A_X + 128 * KiB / BW_X)  # beyond: alpha-beta
    # recursive doubling and halving step through it: on 4 hosts, 2 exchanges of 4 KiB, or
    # 2 x (2 KiB then 1 KiB) pieces
    assert close(cm.cross_allreduce(cl, 4, 4 * KiB, 1, "rd"), 2 * (17e-6 + 4 * KiB * GAMMA))
    piece = lambda s: cl.inter_exchange(s)  # noqa: E731
    assert close(cm.cross_allreduce(cl, 4, 4 * KiB, 1, "rabenseifner"),
                 2 * piece(2 * KiB) + 2 * piece(1 * KiB) + 3 * KiB * GAMMA)


def test_hvdlite_call_carries_small_tensors_in_its_cycle():
    cl = cluster()
    cyc = cm.HVD_CYCLE_BYTES
    # 2 x 4 ranks: the cycle is 2 exchanges in the host, then one across, where the
    # host's 4 ranks share its one NIC
    assert close(cm.cycle_time(cl, 2, 4, 1000), 2 * (A_L + 1000 / BW_L) + A_X + 4 * 1000 / BW_X)
    # 4 KiB rides in the cycle; each host's 4 ranks send it once across
    t, x, used = cm.hvdlite_call(cl, 2, 4, 4 * KiB, two_level=False)
    assert used == ["cycle"] and close(t, cm.cycle_time(cl, 2, 4, cyc + 4 * KiB)) and close(x, 4 * (cyc + 4 * KiB))
    # 64 KiB does not: the cycle with the bits alone, then the allreduce
    t, x, used = cm.hvdlite_call(cl, 2, 4, 64 * KiB, two_level=True)
    t2, x2, used2 = cm.hvdlite_two_level(cl, 2, 4, 64 * KiB)
    assert used == used2 and close(t, cm.cycle_time(cl, 2, 4, cyc) + t2) and close(x, x2 + 4 * cyc)


def test_emulated_time_regimes():
    cl = cluster()
    em = cm.Emulation(rate=100e6, burst=1e6, wire=cl.inter, cores=2)
    # 4 ranks on 2 cores stretch the path 2x; a tiny op stays inside the bucket
    t, regime = cm.emulated_time(cl, em, 4, 1e-4, 1e3, 4096, 0.0)
    assert regime == "burst" and close(t, 2e-4)
    # 64 MB through the link: the bucket is gone at once, the rate holds
    t, regime = cm.emulated_time(cl, em, 4, 1e-3, 64e6, 64 * MiB, 0.0)
    assert regime == "rate" and close(t, 64e6 / 100e6)
    # A lone pair in 16 pieces: the first at the rate, the other 15 at the measured factor
    pair = cm.Emulation(rate=100e6, burst=1e6, wire=cl.inter, cores=2, lone_pair=1.5)
    t, regime = cm.emulated_time(cl, pair, 2, 1e-3, 64e6, 64 * MiB, 0.0, pair_pieces=16)
    assert regime == "rate" and close(t, 64e6 / 100e6 * (1 + 15 * 1.5) / 16)
    assert close(cm.emulated_time(cl, pair, 2, 1e-3, 64e6, 64 * MiB, 0.0)[0], 64e6 / 100e6)
    # 64 KiB: 1 warm-up and 20 timed repetitions of two ops, each taking 200 kB and
    # refilling 10 kB in its 0.1 ms. A 5 MB bucket lasts 26 ops: 13 of the 20 timed first
    # ops run on tokens, and so do the two middle ones, whose mean is the median.
    assert cm.bench_reps(64 * KiB) == 20
    biggest = cm.Emulation(rate=100e6, burst=5e6, wire=cl.inter, cores=2)
    assert cm.emulated_time(cl, biggest, 2, 1e-4, 2e5, 64 * KiB, 0.0) == (1e-4, "burst")
    # A 4 MB bucket lasts 21 ops: 10 timed first ops on tokens, then 10 that wait for
    # all 200 kB at the rate (2 ms). The median is the mean of the 10th and 11th: the
    # size sits on the bucket's edge.
    big = cm.Emulation(rate=100e6, burst=4e6, wire=cl.inter, cores=2)
    t, regime = cm.emulated_time(cl, big, 2, 1e-4, 2e5, 64 * KiB, 0.0)
    assert regime == "edge" and close(t, (1e-4 + 2e-3) / 2)
    # The second op of each repetition (MPI's) finds the bucket as the first left it:
    # 9 timed ones on tokens, the 10th waits for the 190 kB the bucket lacks, the 11th
    # for all 200 kB
    t, regime = cm.emulated_time(cl, big, 2, 1e-4, 2e5, 64 * KiB, 0.0, op_index=1)
    assert regime == "rate" and close(t, (1.9e-3 + 2e-3) / 2)
    # A 4.4 MB bucket lasts 23 ops: the last op on tokens is the first of repetition 11.
    # With hvdlite's op first in every repetition, hvdlite's column gets 11 timed ops on
    # tokens (its median on tokens) and MPI's 10 (its median on the edge); with the two
    # going first by turns (hvdlite's first in even repetitions), the other way round.
    edge_in_pair = cm.Emulation(rate=100e6, burst=4.4e6, wire=cl.inter, cores=2)
    assert cm.emulated_time(cl, edge_in_pair, 2, 1e-4, 2e5, 64 * KiB, 0.0) == (1e-4, "burst")
    t, regime = cm.emulated_time(cl, edge_in_pair, 2, 1e-4, 2e5, 64 * KiB, 0.0, op_index=1)
    assert regime == "edge" and close(t, (1e-4 + 1.7e-3) / 2)  # the 11th waits for 170 of 200 kB
    assert cm.emulated_time(cl, edge_in_pair, 2, 1e-4, 2e5, 64 * KiB, 0.0, op_index=1,
                            alternating=True) == (1e-4, "burst")
    t, regime = cm.emulated_time(cl, edge_in_pair, 2, 1e-4, 2e5, 64 * KiB, 0.0, alternating=True)
    assert regime == "edge" and close(t, (1e-4 + 1.7e-3) / 2)
    # A 3 MB bucket lasts 15 ops (7 timed): the median op waits at the rate
    smaller = cm.Emulation(rate=100e6, burst=3e6, wire=cl.inter, cores=2)
    t, regime = cm.emulated_time(cl, smaller, 2, 1e-4, 2e5, 64 * KiB, 0.0)
    assert regime == "rate" and close(t, 2e5 / 100e6)


def test_efficiency():
    assert close(cm.efficiency(0.1, 0.03, 0.001, 0.0), 0.1 / 0.131)
    assert close(cm.efficiency(0.1, 0.03, 0.001, 2 / 3), 0.1 / 0.101)  # hidden under the backward pass
    assert close(cm.efficiency(0.1, 0.09, 0.0, 2 / 3), 0.1 / (0.1 + 0.09 - 0.2 / 3))


@pytest.mark.parametrize("H,G", [(2, 2), (4, 2), (16, 8), (128, 8)])
def test_predict_gives_every_algorithm_a_positive_time(H, G):
    t = cm.predict(cluster(8), H, G, 16 * MiB)
    assert set(t) == set(cm.ALGORITHMS)
    assert all(v > 0 and math.isfinite(v) for v in t.values())
    # nothing beats the lower bound of the bytes each host must send: 2(H-1)/H * S
    floor = 2 * (H - 1) / H * 16 * MiB / (8 * BW_X)
    assert min(t.values()) >= floor * 0.999


def test_two_level_with_hvdlites_rules():
    cl = cluster(8)
    # 2 x 2 ranks, 8 MiB: 2 MiB pieces with 512 KiB ring segments across hosts: the ring
    assert close(cm.two_level_hvdlite_rules(cl, 2, 2, 8 * MiB), 4 * sum(cm.two_level_phases(cl, 2, 2, 2 * MiB)))
    # 128 hosts x 8: segments of 2 KiB, so MPI_Allreduce across hosts, modelled as the
    # faster of recursive doubling (7 exchanges of 256 KiB) and Rabenseifner (14 messages)
    rs, _, ag = cm.two_level_phases(cl, 128, 8, 2 * MiB)
    seg = 2 * MiB / 8
    rd = 7 * (A_X + seg / BW_X + seg * GAMMA)
    rab = 14 * A_X + 2 * 127 / 128 * seg / BW_X + 127 / 128 * seg * GAMMA
    assert close(cm.two_level_hvdlite_rules(cl, 128, 8, 4 * MiB), 2 * (rs + min(rd, rab) + ag))


def test_validation_predicts_each_run_under_its_own_order(monkeypatch):
    """A cell measured by runs with hvdlite's op always first (rows without "order")
    and by runs that alternate gets, per run, the prediction for its
    order, and then the median over runs, as the measured figure is taken."""
    import json
    params = json.loads((_PATH.parent / "cost_model_params.json").read_text())

    def fake_emulated_time(cl, em, P, path, link_bytes, S, overhead, max_reps=20, pair_pieces=1, op_index=0,
                           alternating=False):
        # tells apart the order (1 / 2) and which op is timed (+10 for MPI's)
        return (2.0 if alternating else 1.0) + 10 * op_index, "rate" if alternating else "burst"

    monkeypatch.setattr(cm, "emulated_time", fake_emulated_time)

    def run(order):
        row = {"config": "2x2@1gbit", "bytes": 64 * KiB, "flat_s": 3e-4, "two-level_s": 3e-4,
               "default_s": 3e-4, "mpi_s": 4e-4}
        if order:
            row["order"] = order
        return {"config": "2x2@1gbit", "foreign_cpu_share": 0.0, "rows": [row]}

    def predicted(*orders):
        (row,) = cm.validation_rows(params, {"runs": [run(o) for o in orders]})
        return row["flat_model_s"], row["mpi_model_s"], row["flat_regime"]

    assert predicted(None) == (1.0, 11.0, "burst")
    assert predicted("alternating") == (2.0, 12.0, "rate")
    assert predicted(None, "alternating", None) == (1.0, 11.0, "edge")  # the median run's order
    assert predicted(None, "alternating") == (1.5, 11.5, "edge")  # two runs: the mean
