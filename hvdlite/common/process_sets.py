"""Horovod's process sets, as far as hvdlite has them: only the global one (all ranks).
The collectives accept ``process_set=global_process_set`` (or None) for compatibility."""
from __future__ import annotations

from typing import Any, Sequence

from hvdlite.common.basics import PROCESS_SETS_UNSUPPORTED as _UNSUPPORTED, rank, size


class ProcessSet:
    """A set of ranks, as in Horovod. hvdlite runs collectives on the global set only:
    ``ProcessSet(ranks)`` can be built (as a Horovod script does before ``init``), but
    registering or using any set other than :data:`global_process_set` raises
    ``NotImplementedError``. As in Horovod, the argument is a sequence of ranks or an
    mpi4py communicator (kept as ``mpi_comm``)."""

    def __init__(self, ranks_or_comm: Sequence[int] | Any = None) -> None:
        self.mpi_comm = None
        if ranks_or_comm is not None and hasattr(ranks_or_comm, "Get_rank"):
            self.mpi_comm, ranks_or_comm = ranks_or_comm, []
        self.ranks = None if ranks_or_comm is None else [int(r) for r in ranks_or_comm]
        self.process_set_id = 0 if ranks_or_comm is None else None

    def size(self) -> int:
        self._check_global()
        return size()

    def rank(self) -> int:
        self._check_global()
        return rank()

    def included(self) -> bool:
        self._check_global()
        return True

    def _check_global(self) -> None:
        if self is not global_process_set:
            raise NotImplementedError(_UNSUPPORTED)

    def __repr__(self) -> str:
        return "ProcessSet(global)" if self is global_process_set else f"ProcessSet({self.ranks})"


global_process_set = ProcessSet()


def check_process_set(process_set: Any) -> None:
    """Raise unless ``process_set`` is None or the global process set."""
    if process_set is not None and process_set is not global_process_set:
        raise NotImplementedError(_UNSUPPORTED)


def add_process_set(process_set: Any) -> None:
    """Horovod's dynamic process sets; not implemented by hvdlite (raises)."""
    raise NotImplementedError(_UNSUPPORTED)


def remove_process_set(process_set: Any) -> None:
    """Horovod's dynamic process sets; not implemented by hvdlite (raises)."""
    raise NotImplementedError(_UNSUPPORTED)
