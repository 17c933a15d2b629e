"""Horovod's process sets: collectives among a subset of the ranks.

A :class:`ProcessSet` names world ranks (or an mpi4py communicator, whose members form
the set). Sets are registered on every rank alike, in the same order -- statically by
``hvd.init(process_sets=[...])``, or at run time by :func:`add_process_set` when
``HOROVOD_DYNAMIC_PROCESS_SETS=1`` (or ``hvd.init(process_sets="dynamic")``). Each
registered set other than the global one gets an engine of its own in the core, on a
communicator of its members: its own negotiation, response cache, fusion and NCCL
communicators, and its own background thread, so sets (and the global set) run their
collectives concurrently without waiting for one another.

As in Horovod, ranks given to collectives (a broadcast's ``root_rank``) are world
ranks, also inside a set; :meth:`ProcessSet.rank` is the rank within the set.

Registration is itself checked: every rank publishes what it registers with one
allgather over the world (through the engine, so a rank that never comes is reported
by the stall inspector rather than waited for silently), and a set that not every rank
registers alike fails on every rank with a message naming the ranks that differ.
Process sets do not outlive hvdlite's world: ``shutdown()`` and an elastic reset
invalidate them.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from hvdlite.common import basics, objects
from hvdlite.common.basics import _load_core, rank, size
from hvdlite.common.exceptions import HvdliteValueError
from hvdlite.common.process_set_table import (  # noqa: F401 - the public names live here too
    ProcessSet, global_process_set, id_of, process_set_by_id, process_sets,
    record, reset, resolve)
from hvdlite.common import process_set_table as _table

DYNAMIC_ENV = "HOROVOD_DYNAMIC_PROCESS_SETS"

_dynamic = False
_round = 0  # registrations and removals since init: names their checks alike on every rank


def _dynamic_enabled() -> bool:
    return _dynamic or os.environ.get(DYNAMIC_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def setup(process_sets: Any, comm: Any = None) -> None:
    """Run by ``hvd.init`` once the world is up: forget older sets, then register the
    sets given to ``init`` (a list of :class:`ProcessSet`, or "dynamic"). `comm` is what
    ``init`` was given: an mpi4py communicator becomes ``global_process_set.mpi_comm``."""
    global _dynamic
    _forget_all()
    global_process_set.mpi_comm = comm if _is_communicator(comm) else None
    _dynamic = process_sets == "dynamic"
    if process_sets is None or process_sets == "dynamic":
        return
    sets = _checked_list(process_sets)
    if any(ps.mpi_comm is not None for ps in sets) and comm is not None and not _is_communicator(comm):
        raise NotImplementedError("process sets built from MPI communicators need hvd.init(comm=...) to be a "
                                  "communicator (or None), not a list of ranks, as in Horovod")
    _register_at_init(sets)
    _assign(sets)


def again(process_sets: Any) -> None:
    """``hvd.init(process_sets=[...])`` while hvdlite runs: the sets are looked up among
    those registered (nothing is registered now, as in Horovod), and a duplicate raises."""
    if process_sets is None or process_sets == "dynamic":
        return
    _assign(_checked_list(process_sets))


def _is_communicator(comm: Any) -> bool:
    return comm is not None and hasattr(comm, "Get_group") and hasattr(comm, "allgather")


def _checked_list(process_sets: Any) -> list[ProcessSet]:
    if isinstance(process_sets, ProcessSet) or not isinstance(process_sets, (list, tuple)):
        raise HvdliteValueError("hvd.init(process_sets=...) takes a list of ProcessSet objects or \"dynamic\"")
    for ps in process_sets:
        if not isinstance(ps, ProcessSet):
            raise HvdliteValueError(f"hvd.init(process_sets=...): {ps!r} is not a ProcessSet")
    return list(process_sets)


def _forget_all() -> None:
    """After a shutdown or a new world: the core has dropped every set but the global one."""
    global _round
    _round = 0
    reset()


basics.add_lifecycle_hooks(after_init=setup, after_change=_forget_all, init_again=again)


def _members_of(ps: ProcessSet) -> list[int]:
    """The world ranks of `ps`: its list, or its communicator's members, translated from
    the communicator's group into hvdlite's world (no communication)."""
    if ps.mpi_comm is None:
        return list(ps.ranks or [])
    from mpi4py import MPI
    world = global_process_set.mpi_comm or MPI.COMM_WORLD
    group, world_group = ps.mpi_comm.Get_group(), world.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world_group)
    finally:
        group.Free()
        world_group.Free()
    if any(r == MPI.UNDEFINED for r in ranks):
        raise HvdliteValueError(f"{ps}: its communicator has processes outside hvdlite's world")
    return sorted(int(r) for r in ranks)


def _world_id(ranks: list[int]) -> int | None:
    """The id of the registered set with these ranks: 0 for the whole world."""
    return 0 if ranks == list(range(size())) else id_of(ranks)


def _check_ranks(ranks: list[int]) -> None:
    world = size()
    bad = [r for r in ranks if not 0 <= r < world]
    if bad or not ranks or len(set(ranks)) != len(ranks):
        raise HvdliteValueError(f"process set {ranks}: " + (
            f"rank(s) {bad} outside hvdlite's world of {world}" if bad else
            "it has no ranks" if not ranks else "a rank is listed twice"))


def _publish(explicit: list[list[int]], from_comms: list[list[int]]) -> list[tuple[list, list]]:
    """Every rank's explicit rank lists and communicators' members, gathered, after
    checking that the explicit lists and the number of communicators agree."""
    global _round
    _round += 1
    everyone = objects.allgather_object((explicit, from_comms), name=f"hvdlite.process_sets.{_round}")
    differ = [r for r, (theirs, comms) in enumerate(everyone) if theirs != explicit or len(comms) != len(from_comms)]
    if differ:
        raise HvdliteValueError(
            f"process sets must be registered alike on every rank: rank {rank()} asked for {explicit}"
            f"{f' and {len(from_comms)} communicator(s)' if from_comms else ''}, but rank(s) "
            f"{', '.join(map(str, differ))} asked for something else "
            f"({'; '.join(f'rank {r}: {everyone[r][0]}, {len(everyone[r][1])} communicator(s)' for r in differ[:4])})")
    return everyone


def _register_lists(wanted: list[list[int]], allow_existing: bool) -> None:
    """Give each new rank list an engine, in order (the same on every rank)."""
    for ranks in wanted:
        _check_ranks(ranks)
    core = _load_core()
    for ranks in wanted:
        existing = _world_id(ranks)
        if existing is not None and not allow_existing:
            raise HvdliteValueError(f"a process set with ranks {ranks} is already registered "
                                    f"({'the global set' if existing == 0 else f'id {existing}'})")
        if existing is None:
            record(ProcessSet(ranks), int(core.add_process_set(ranks)), ranks)


def _register_at_init(sets: list[ProcessSet]) -> None:
    """Register the sets given to ``init`` on every rank alike, numbered as Horovod numbers
    them: first the sets of each communicator in turn (the member lists of every rank's
    communicator, in sorted order), then the explicit rank lists in the order given. A
    list seen before (or the whole world, the global set) gets no new id."""
    explicit = [list(ps.ranks or []) for ps in sets if ps.mpi_comm is None]
    from_comms = [_members_of(ps) for ps in sets if ps.mpi_comm is not None]
    everyone = _publish(explicit, from_comms)
    wanted: list[list[int]] = []
    for i in range(len(from_comms)):
        for ranks in sorted({tuple(comms[i]) for _, comms in everyone}):
            if list(ranks) not in wanted:
                wanted.append(list(ranks))
    for ranks in explicit:
        if ranks not in wanted:
            wanted.append(ranks)
    _register_lists(wanted, allow_existing=True)


def _assign(sets: list[ProcessSet]) -> None:
    """Point each ProcessSet object at its registered set. As in Horovod, an entry whose
    set the list names before it (or the global set) is a duplicate: it stays
    unregistered and this rank raises ValueError, after the others are assigned."""
    seen = {0}
    duplicates = []
    for i, ps in enumerate(sets):
        ranks = _members_of(ps)
        pid = _world_id(ranks)
        if pid is None:
            raise HvdliteValueError(f"process_sets entry {i} ({ps}) is not registered: hvdlite is already running, "
                                    "so hvd.init(process_sets=...) only looks up the sets of the first init; add "
                                    "new ones with hvd.add_process_set")
        if pid in seen:
            duplicates.append((i, ranks))
            continue
        seen.add(pid)
        if pid == 0:
            continue
        record(ps, pid, ranks)
    if duplicates:
        i, ranks = duplicates[0]
        what = "the global set" if _world_id(ranks) == 0 else f"an earlier entry's set {ranks}"
        raise HvdliteValueError(f"hvd.init(process_sets=...): entry number {i} ({sets[i]}) is a duplicate of "
                                f"{what}; each process set may be given once")


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set at run time (Horovod's dynamic process sets: needs
    ``HOROVOD_DYNAMIC_PROCESS_SETS=1`` or ``hvd.init(process_sets="dynamic")``).
    Every rank calls it, in the same order, with the same ranks; returns the
    registered :class:`ProcessSet` (a new one for a list of ranks)."""
    if not _dynamic_enabled():
        raise HvdliteValueError(
            "hvd.add_process_set needs dynamic process sets: set HOROVOD_DYNAMIC_PROCESS_SETS=1 (or call "
            "hvd.init(process_sets=\"dynamic\")), or pass the sets to hvd.init(process_sets=[...])")
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.mpi_comm is not None:
        raise NotImplementedError("adding a process set from an MPI communicator after hvd.init is not supported "
                                  "(as in Horovod); build it from a list of ranks")
    if process_set.process_set_id is not None:
        raise HvdliteValueError(f"{process_set} is already registered")
    ranks = list(process_set.ranks or [])
    _publish([ranks], [])
    _register_lists([ranks], allow_existing=False)
    record(process_set, _world_id(ranks), ranks)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set added by :func:`add_process_set` or ``init`` (every
    rank calls it, in the same order). Its engine stops and every ProcessSet object of
    it is invalidated. Returns False for the global set, which is never removed."""
    global _round
    if not _dynamic_enabled():
        raise HvdliteValueError("hvd.remove_process_set needs dynamic process sets: set "
                                "HOROVOD_DYNAMIC_PROCESS_SETS=1 (or call hvd.init(process_sets=\"dynamic\"))")
    pid = process_set.process_set_id
    if pid == 0:
        return False
    _round += 1
    everyone = objects.allgather_object(pid, name=f"hvdlite.process_sets.{_round}")
    differ = [r for r, theirs in enumerate(everyone) if theirs != pid]
    if differ:
        raise HvdliteValueError(f"process sets must be removed alike on every rank: rank {rank()} removes set "
                                f"{pid}, rank(s) {', '.join(map(str, differ))} another")
    if pid is None:
        return False
    removed = bool(_load_core().remove_process_set(pid))
    _table.forget(pid)
    process_set.invalidate()
    return removed
