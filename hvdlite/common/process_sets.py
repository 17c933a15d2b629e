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


def setup(process_sets: Any) -> None:
    """Run by ``hvd.init`` once the world is up: forget older sets, then register the
    sets given to ``init`` (a list of :class:`ProcessSet`, or "dynamic")."""
    global _dynamic
    _forget_all()
    _dynamic = process_sets == "dynamic"
    if process_sets is None or process_sets == "dynamic":
        return
    if isinstance(process_sets, ProcessSet) or not isinstance(process_sets, (list, tuple)):
        raise HvdliteValueError("hvd.init(process_sets=...) takes a list of ProcessSet objects or \"dynamic\"")
    for ps in process_sets:
        if not isinstance(ps, ProcessSet):
            raise HvdliteValueError(f"hvd.init(process_sets=...): {ps!r} is not a ProcessSet")
    _register(list(process_sets), allow_existing=True)


def _forget_all() -> None:
    """After a shutdown or a new world: the core has dropped every set but the global one."""
    global _round
    _round = 0
    reset()


basics.add_lifecycle_hooks(after_init=setup, after_change=_forget_all)


def _members_of(ps: ProcessSet) -> list[int]:
    """The world ranks of `ps`: its list, or its communicator's members (collective
    over that communicator)."""
    if ps.mpi_comm is None:
        return list(ps.ranks or [])
    return sorted(int(r) for r in ps.mpi_comm.allgather(rank()))


def _register(sets: list[ProcessSet], allow_existing: bool) -> None:
    """Register `sets` on every rank alike. Every rank publishes the rank lists it
    asks for; lists given explicitly must be the same on every rank; lists from
    communicators (which differ between ranks: each rank passes its own) are merged.
    New lists get ids in the same order everywhere."""
    global _round
    explicit = [list(ps.ranks or []) for ps in sets if ps.mpi_comm is None]
    from_comms = {id(ps): _members_of(ps) for ps in sets if ps.mpi_comm is not None}
    _round += 1
    everyone = objects.allgather_object((explicit, list(from_comms.values())),
                                        name=f"hvdlite.process_sets.{_round}")
    differ = [r for r, (theirs, _) in enumerate(everyone) if theirs != explicit]
    if differ:
        raise HvdliteValueError(
            f"process sets must be registered alike on every rank: rank {rank()} asked for {explicit}, but rank(s) "
            f"{', '.join(map(str, differ))} asked for something else "
            f"({'; '.join(f'rank {r}: {everyone[r][0]}' for r in differ[:4])})")
    wanted: list[list[int]] = []
    for ranks in explicit + [lst for _, comms in everyone for lst in comms]:
        if ranks not in wanted:
            wanted.append(ranks)
    world = size()
    for ranks in wanted:
        bad = [r for r in ranks if not 0 <= r < world]
        if bad or not ranks or len(set(ranks)) != len(ranks):
            raise HvdliteValueError(f"process set {ranks}: " + (
                f"rank(s) {bad} outside hvdlite's world of {world}" if bad else
                "it has no ranks" if not ranks else "a rank is listed twice"))
    core = _load_core()
    ids: dict[tuple[int, ...], int] = {}
    for ranks in wanted:
        existing = id_of(ranks)
        if existing is not None and not allow_existing:
            raise HvdliteValueError(f"a process set with ranks {ranks} is already registered (id {existing})")
        ids[tuple(ranks)] = existing if existing is not None else int(core.add_process_set(ranks))
    for ps in sets:
        ranks = from_comms[id(ps)] if ps.mpi_comm is not None else list(ps.ranks or [])
        record(ps, ids[tuple(ranks)], ranks)


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
    _register([process_set], allow_existing=False)
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
