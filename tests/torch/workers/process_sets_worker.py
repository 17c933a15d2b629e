"""Process sets on 3 or 4 ranks (run through the launcher by test_process_sets.py).

``static``: ``hvd.init(process_sets=[even, odd])``, every collective kind on each
rank's set checked against NumPy references built from the members' inputs, the sets
and the global set interleaved so that a set blocked behind another would deadlock,
DistributedOptimizer on a set against a single-process reference, and the errors.
``dynamic`` (HOROVOD_DYNAMIC_PROCESS_SETS=1): add, use, remove and add again.
``comm``: sets built from mpi4py communicators, as in Horovod's documentation.
Prints ``PASS <case> rank <r>`` for each case that passed.
"""
from __future__ import annotations

import sys
import traceback

import numpy as np
import torch

import hvdlite as hnp
import hvdlite.torch as hvd
from _wcommon import rank_data, to_np

MODE = sys.argv[1]
EVEN = ODD = None  # the static sets
torch.set_num_threads(1)


def expect_error(kind: type[BaseException], fn, *words: str) -> str:
    try:
        fn()
    except kind as exc:
        text = str(exc)
        for w in words:
            assert w in text, f"{w!r} not in {text!r}"
        return text
    raise AssertionError(f"no {kind.__name__} raised")


def check_collectives(ps: hvd.ProcessSet, tag: str) -> None:
    """Every collective kind on `ps` (this rank a member), against NumPy."""
    me, members = hvd.rank(), ps.ranks
    n = len(members)
    assert ps.size() == n and ps.rank() == members.index(me) and ps.included()
    data = {r: rank_data(r, (5, 3), seed=7) for r in members}
    x = torch.from_numpy(data[me])
    s = hvd.allreduce(x, op=hvd.Sum, name=f"{tag}.sum", process_set=ps)
    assert np.allclose(to_np(s), sum(data.values()))
    a = hvd.allreduce(x, name=f"{tag}.avg", process_set=ps)  # Average: over the set's ranks
    assert np.allclose(to_np(a), sum(data.values()) / n)
    m = hvd.allreduce(x, op=hvd.Max, name=f"{tag}.max", process_set=ps)
    assert np.allclose(to_np(m), np.max(np.stack(list(data.values())), 0))
    g = hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum, name=f"{tag}.grouped", process_set=ps)
    assert np.allclose(to_np(g[1]), 2 * sum(data.values()))
    # Uneven first dimensions: member i sends i + 1 rows.
    rows = torch.full((ps.rank() + 1, 2), float(me))
    gathered = hvd.allgather(rows, name=f"{tag}.gather", process_set=ps)
    ref = np.concatenate([np.full((i + 1, 2), float(r)) for i, r in enumerate(members)])
    assert np.array_equal(to_np(gathered), ref)
    root = members[-1]  # a world rank, as in Horovod
    b = hvd.broadcast(torch.tensor([float(me)] * 3), root_rank=root, name=f"{tag}.bcast", process_set=ps)
    assert to_np(b).tolist() == [float(root)] * 3
    # Alltoall: member i sends j + 1 rows to member j, each row holding (i, j).
    send = torch.cat([torch.tensor([[ps.rank(), j]] * (j + 1), dtype=torch.int64) for j in range(n)])
    got, splits = hvd.alltoall(send, splits=[j + 1 for j in range(n)], name=f"{tag}.a2a", process_set=ps)
    assert splits.tolist() == [ps.rank() + 1] * n
    assert to_np(got).tolist() == [[i, ps.rank()] for i in range(n) for _ in range(ps.rank() + 1)]
    rs = hvd.reducescatter(torch.from_numpy(rank_data(me, (2 * n, 2), seed=9)), op=hvd.Sum,
                           name=f"{tag}.rs", process_set=ps)
    full = sum(rank_data(r, (2 * n, 2), seed=9) for r in members)
    assert np.allclose(to_np(rs), full[2 * ps.rank():2 * ps.rank() + 2])
    objs = hvd.allgather_object({"rank": me}, name=f"{tag}.objs", process_set=ps)
    assert objs == [{"rank": r} for r in members]
    assert hvd.broadcast_object(f"from {me}", root_rank=root, name=f"{tag}.obj", process_set=ps) == f"from {root}"
    # The NumPy front end on the same set.
    assert np.allclose(hnp.allreduce(data[me], op=hnp.Sum, process_set=ps), sum(data.values()))
    hvd.barrier(process_set=ps)


def case_static_collectives(mine: hvd.ProcessSet) -> None:
    check_collectives(mine, "static")
    # The global set still works, and still means every rank.
    total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="static.global")
    assert total.item() == hvd.size()


def case_sets_do_not_wait_for_each_other(mine: hvd.ProcessSet) -> None:
    """The members of a set run a collective of the set while a global collective they
    submitted earlier is still waiting for a rank outside the set (the last rank
    submits it only after its own set's collective). If a set's collectives queued
    behind the global ones this would deadlock."""
    me, last = hvd.rank(), hvd.size() - 1
    x = torch.tensor([float(me)])
    if me == last:
        ours = hvd.allreduce(x, op=hvd.Sum, name="overlap.set", process_set=mine)
        pending = hvd.allreduce_async(x, op=hvd.Sum, name="overlap.global")
    else:
        pending = hvd.allreduce_async(x, op=hvd.Sum, name="overlap.global")
        ours = hvd.allreduce(x, op=hvd.Sum, name="overlap.set", process_set=mine)
    assert ours.item() == float(sum(mine.ranks))
    assert hvd.synchronize(pending).item() == float(sum(range(hvd.size())))


def case_optimizer_on_a_set(mine: hvd.ProcessSet) -> None:
    """Gradients averaged over the set's ranks only: the same step as one process
    taking the mean of the members' gradients."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    ref = torch.nn.Linear(3, 1)
    ref.load_state_dict(model.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(), process_set=mine)
    inputs = {r: torch.from_numpy(rank_data(r, (4, 3), seed=11)).float() for r in mine.ranks}
    model(inputs[hvd.rank()]).pow(2).sum().backward()
    opt.step()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    sum(ref(inputs[r]).pow(2).sum() for r in mine.ranks).div(len(mine.ranks)).backward()
    ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6), (p, q)
    hvd.broadcast_parameters(model.state_dict(), root_rank=mine.ranks[0], process_set=mine)
    # On the other set's optimizer this rank is not a member: as in Horovod, it builds
    # and trains on its own gradients, reducing nothing.
    other = next(ps for ps in (EVEN, ODD) if ps is not mine)
    local = torch.nn.Linear(3, 1)
    alone = torch.nn.Linear(3, 1)
    alone.load_state_dict(local.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(local.parameters(), lr=0.5),
                                   named_parameters=local.named_parameters(), process_set=other)
    local(inputs[hvd.rank()]).pow(2).sum().backward()
    opt.step()
    alone_opt = torch.optim.SGD(alone.parameters(), lr=0.5)
    alone(inputs[hvd.rank()]).pow(2).sum().backward()
    alone_opt.step()
    for p, q in zip(local.parameters(), alone.parameters()):
        assert torch.equal(p, q), (p, q)


def case_errors(mine: hvd.ProcessSet, other: hvd.ProcessSet) -> None:
    me = hvd.rank()
    # Not a member: raised here, before anything is sent.
    expect_error(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=other),
                 f"rank {me} is not in process set {other.process_set_id}")
    # A root outside the set.
    outsider = other.ranks[0]
    expect_error(ValueError, lambda: hvd.broadcast(torch.ones(1), root_rank=outsider, process_set=mine),
                 f"root rank {outsider} is not in process set")
    # Dynamic sets are off in this run.
    expect_error(ValueError, lambda: hvd.add_process_set([0]), "HOROVOD_DYNAMIC_PROCESS_SETS")
    # A shape mismatch inside the set fails on every member and names world ranks.
    if mine.size() > 1:
        shape = (2,) if mine.rank() == 0 else (3,)
        text = expect_error(hvd.HorovodInternalError,
                            lambda: hvd.allreduce(torch.ones(shape), name="bad.shape", process_set=mine),
                            "bad.shape", f"process set {mine.process_set_id}", str(mine.ranks))
        assert "rank" in text
    # The set still works afterwards.
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after.errors", process_set=mine).item() == mine.size()


def static() -> None:
    n = 4 if len(sys.argv) < 3 else int(sys.argv[2])
    global EVEN, ODD
    even = EVEN = hvd.ProcessSet(range(0, n, 2))
    odd = ODD = hvd.ProcessSet(range(1, n, 2))
    hvd.init(process_sets=[even, odd])
    assert hvd.size() == n
    assert (even.process_set_id, odd.process_set_id) == (1, 2)
    assert hvd.global_process_set.ranks == list(range(n))
    mine, other = (even, odd) if hvd.rank() % 2 == 0 else (odd, even)
    assert other.rank() == -1 and other.included() is False
    run("static_collectives", case_static_collectives, mine)
    run("sets_do_not_wait_for_each_other", case_sets_do_not_wait_for_each_other, mine)
    run("optimizer_on_a_set", case_optimizer_on_a_set, mine)
    run("errors", case_errors, mine, other)


def dynamic() -> None:
    hvd.init()
    me, n = hvd.rank(), hvd.size()

    def add_use_remove() -> None:
        first = hvd.add_process_set([0, n - 1])
        assert first.process_set_id == 1 and first.ranks == [0, n - 1]
        if first.included():
            check_collectives(first, "dyn1")
        # A set that not every rank asks for alike fails on every rank, naming them.
        asked = [0] if me == 0 else [0, n - 1]
        expect_error(ValueError, lambda: hvd.add_process_set(asked), "registered alike on every rank")
        assert hvd.remove_process_set(first) is True
        assert first.process_set_id is None
        expect_error(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=first), "not registered")
        assert hvd.remove_process_set(hvd.global_process_set) is False
        # Every rank is the global set: a duplicate, as in Horovod.
        expect_error(ValueError, lambda: hvd.add_process_set(hvd.ProcessSet(range(n))), "already registered",
                     "global set")
        again = hvd.add_process_set(hvd.ProcessSet(range(n - 1)))
        assert again.process_set_id not in (None, 0, 1)
        expect_error(ValueError, lambda: hvd.add_process_set(range(n - 1)), "already registered")
        if again.included():
            check_collectives(again, "dyn2")
        assert hvd.remove_process_set(again)
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="dyn.global").item() == n

    run("dynamic_add_use_remove", add_use_remove)


def comm() -> None:
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    sub = world.Split(color=world.rank % 2, key=world.rank)
    n = world.size
    # The whole world again, and a rank list equal to one half: duplicates, refused on
    # the ranks whose list holds them (the world clone: every rank; the evens: even ranks).
    clone = hvd.ProcessSet(world.Dup())
    try:
        hvd.init(world, process_sets=[hvd.ProcessSet([0]), hvd.ProcessSet(sub), clone])
        raise AssertionError("a clone of the world was accepted")
    except ValueError as exc:
        assert "entry number 2" in str(exc) and "global set" in str(exc), exc
    assert clone.process_set_id is None
    evens = hvd.ProcessSet(range(0, n, 2))
    if world.rank % 2 == 0:
        expect_error(ValueError, lambda: hvd.init(world, process_sets=[hvd.ProcessSet(sub), evens]),
                     "entry number 1", "duplicate")
    else:
        hvd.init(world, process_sets=[hvd.ProcessSet(sub), evens])
        assert evens.process_set_id == 1
    # hvdlite runs: init with a list free of duplicates looks its sets up.
    first, split_set = hvd.ProcessSet([0]), hvd.ProcessSet(sub)
    hvd.init(world, process_sets=[first, split_set])

    def from_communicators() -> None:
        assert hvd.size() == n and hvd.global_process_set.mpi_comm is world
        assert split_set.ranks == list(range(hvd.rank() % 2, n, 2)), split_set
        # Numbered as Horovod numbers them: the communicator's sets (every rank's, in
        # sorted order) before the rank lists, whatever order the list gives them in.
        assert hvd.mpi_ops._basics._get_process_set_ids_and_ranks() == {
            0: list(range(n)), 1: list(range(0, n, 2)), 2: list(range(1, n, 2)), 3: [0]}
        assert split_set.process_set_id == 1 + hvd.rank() % 2 and first.process_set_id == 3
        check_collectives(split_set, "comm")
        # A set that was never registered is not registered by a later init.
        expect_error(ValueError, lambda: hvd.init(world, process_sets=[hvd.ProcessSet([1])]), "not registered")

    run("sets_from_communicators", from_communicators)


failed = 0


def run(name: str, fn, *args) -> None:
    global failed
    try:
        fn(*args)
        print(f"PASS {name} rank {hvd.rank()}", flush=True)
    except Exception:  # noqa: BLE001 - reported and counted
        failed += 1
        traceback.print_exc()
        print(f"FAIL {name} rank {hvd.rank()}", flush=True)


{"static": static, "dynamic": dynamic, "comm": comm}[MODE]()
hvd.barrier()
hvd.shutdown()
sys.exit(1 if failed else 0)
