"""The processes of a job on this machine, from ``/proc``: found by descent and start
time (a pid used again later is never taken for the one noted), and killed.

Pure Python; used by the launcher (a job that does not stop) and by
:mod:`hvdlite.runner.evict` (a lost worker's process here)."""
from __future__ import annotations

import os
import signal
from collections.abc import Mapping

__all__ = ["kill_processes", "process_table", "process_tree"]


def process_table() -> tuple[dict[int, list[int]], dict[int, int]]:
    """Every process's children and start time, from ``/proc`` (empty without it)."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return children, started
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parent, start = int(fields[1]), int(fields[19])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
        started[int(entry)] = start
    return children, started


def process_tree(*roots: int, only: Mapping[int, int] | None = None) -> dict[int, int]:
    """The ``roots`` and every process below them, each with its start time (so that a
    pid used again later is not taken for it). With ``only`` (pid -> start time), a root
    counts only while it is still the process noted there."""
    children, started = process_table()
    tree: dict[int, int] = {}
    todo = [r for r in roots if r in started and (only is None or only.get(r) == started[r])]
    while todo:
        pid = todo.pop()
        if pid in started and pid not in tree:
            tree[pid] = started[pid]
            todo.extend(children.get(pid, []))
    return tree


def kill_processes(processes: Mapping[int, int]) -> None:
    """SIGKILL each noted process that is still the one noted, and everything now below
    it."""
    for pid in process_tree(*processes, only=processes):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
