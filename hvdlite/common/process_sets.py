"""Horovod's process sets, as far as hvdlite has them: only the global one (all ranks).
The collectives accept ``process_set=global_process_set`` (or None) for compatibility."""
from __future__ import annotations

from typing import Any

from hvdlite.common.basics import rank, size


class ProcessSet:
    """The global process set (all ranks). hvdlite does not implement other process
    sets yet."""

    process_set_id = 0

    def size(self) -> int:
        return size()

    def rank(self) -> int:
        return rank()

    def included(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "ProcessSet(global)"


global_process_set = ProcessSet()


def check_process_set(process_set: Any) -> None:
    """Raise unless ``process_set`` is None or the global process set."""
    if process_set is not None and process_set is not global_process_set:
        raise NotImplementedError("hvdlite supports only the global process set")
