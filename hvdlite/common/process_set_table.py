"""The process sets hvdlite knows in this process: Horovod's :class:`ProcessSet`, the
table of registered sets by id, and what a collective needs of one (its engine id,
its members, a world root rank as a rank of the set).

Registering and removing sets (collective over the world) is
:mod:`hvdlite.common.process_sets`; this module sits below the collectives so that
every front end's submit path can look a set up.
"""
from __future__ import annotations

import threading
from typing import Any, Sequence

from hvdlite.common.basics import is_initialized, rank, size
from hvdlite.common.exceptions import HvdliteValueError


class ProcessSet:
    """A set of hvdlite processes that run collectives together (Horovod's class).

    Built from a sequence of world ranks (kept sorted) or an mpi4py communicator (kept
    as ``mpi_comm``; its members form the set), then passed to ``hvd.init`` or
    :func:`add_process_set`. Until registered, ``process_set_id`` is None and
    :meth:`size`, :meth:`rank` and :meth:`included` return None."""

    process_set_id: int | None = None
    ranks: list[int] | None = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        if hasattr(ranks_or_comm, "Get_rank") and hasattr(ranks_or_comm, "allgather"):
            self.mpi_comm = ranks_or_comm
            return
        try:
            ranks = list(ranks_or_comm)
        except TypeError:
            raise HvdliteValueError("ProcessSet takes a sequence of ranks or an mpi4py communicator, not "
                                    f"{type(ranks_or_comm).__name__}") from None
        if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks):
            raise HvdliteValueError(f"ProcessSet: ranks must be integers, got {ranks!r}")
        self.ranks = sorted(ranks)

    def size(self) -> int | None:
        """Number of processes in the set (None until registered)."""
        return None if self.process_set_id is None or self.ranks is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank within the set; -1 if it is not a member (None until
        registered). Collectives still take world ranks (``root_rank``)."""
        if self.process_set_id is None or self.ranks is None:
            return None
        me = rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool | None:
        """Whether this process is a member (None until registered)."""
        if self.process_set_id is None or self.ranks is None:
            return None
        return rank() in self.ranks

    def invalidate(self) -> None:
        """Forget the registration (the set was removed, or hvdlite shut down)."""
        self.process_set_id = None
        if self is not global_process_set:
            self.ranks = self.ranks if self.mpi_comm is None else None

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

    __repr__ = __str__


global_process_set = ProcessSet([])
"""The process set of every rank (id 0), the default ``process_set`` of every
collective; after ``hvd.init(comm=...)`` its ``mpi_comm`` is that communicator."""
global_process_set.process_set_id = 0

_lock = threading.Lock()
_registered: dict[int, list[ProcessSet]] = {0: [global_process_set]}


def reset() -> None:
    """Forget every set but the global one, whose ranks become the world's (hvdlite
    shut down, or elastic training changed its world)."""
    with _lock:
        for sets in _registered.values():
            for ps in sets:
                if ps is not global_process_set:
                    ps.invalidate()
        _registered.clear()
        _registered[0] = [global_process_set]
    global_process_set.ranks = list(range(size())) if is_initialized() else []


def record(ps: ProcessSet, process_set_id: int, ranks: list[int]) -> None:
    """Note `ps` as registered under `process_set_id` with world ranks `ranks`."""
    ps.ranks = ranks
    ps.process_set_id = process_set_id
    with _lock:
        sets = _registered.setdefault(process_set_id, [])
        if ps not in sets:
            sets.append(ps)


def forget(process_set_id: int) -> None:
    """Drop a removed set: every ProcessSet object of it is invalidated."""
    with _lock:
        for ps in _registered.pop(process_set_id, []):
            ps.invalidate()


def id_of(ranks: list[int]) -> int | None:
    """The id of the registered set (other than the global one) with these ranks."""
    with _lock:
        for pid, sets in _registered.items():
            if pid != 0 and sets and sets[0].ranks == ranks:
                return pid
    return None


def members(process_set_id: int) -> list[int] | None:
    """The world ranks of a registered set, or None."""
    with _lock:
        sets = _registered.get(process_set_id)
        return list(sets[0].ranks) if sets and sets[0].ranks is not None else None


def process_set_by_id(process_set_id: int) -> ProcessSet:
    """The registered ProcessSet with this id."""
    with _lock:
        sets = _registered.get(process_set_id)
    if not sets:
        raise HvdliteValueError(f"no process set with id {process_set_id} is registered")
    return sets[0]


def process_sets() -> list[ProcessSet]:
    """One registered ProcessSet per id, in id order (the global set first)."""
    with _lock:
        return [_registered[pid][0] for pid in sorted(_registered) if _registered[pid]]


def resolve(process_set: Any, root_rank: int = -1) -> tuple[int, int]:
    """For a collective: the engine's id of `process_set` (None: the global set) and
    `root_rank` (a world rank, as in Horovod) as a rank of the set. Raises
    ValueError on this rank if the set is not registered, this process is not a
    member, or the root is not one."""
    if process_set is None or process_set is global_process_set:
        return 0, root_rank
    if not isinstance(process_set, ProcessSet):
        raise HvdliteValueError(f"process_set must be a ProcessSet, not {type(process_set).__name__}")
    pid = process_set.process_set_id
    if pid == 0:
        return 0, root_rank
    ranks = process_set.ranks
    if pid is None or ranks is None:
        raise HvdliteValueError(f"{process_set} is not registered: pass it to hvd.init(process_sets=[...]) or "
                                "hvd.add_process_set() first")
    me = rank()
    if me not in ranks:
        raise HvdliteValueError(f"rank {me} is not in process set {pid} (ranks {ranks}); only its members may "
                                "run its collectives")
    if root_rank >= 0:
        if root_rank not in ranks:
            raise HvdliteValueError(f"root rank {root_rank} is not in process set {pid} (ranks {ranks})")
        root_rank = ranks.index(root_rank)
    return pid, root_rank


def set_size(process_set: Any) -> int:
    """Number of ranks a collective on `process_set` involves."""
    pid, _ = resolve(process_set)
    return size() if pid == 0 else len(process_set.ranks)
