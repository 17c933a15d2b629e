"""Names for unnamed requests and ids for grouped allreduces, the same on every rank.

Ranks that issue the same sequence of unnamed calls of one kind get the same names, and
the same sequence of grouped allreduces the same group ids, without talking to each
other. ``init()`` restarts the names, so every rank starts equal. Each process set counts
on its own: only its members make its calls. This module depends on
nothing else in hvdlite, so that ``basics`` (``init``) and ``ops`` (every request) can
both use it.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any

_name_lock = threading.Lock()
_name_counters: dict[str, Any] = {}


def auto_name(kind: str, process_set: int = 0) -> str:
    """Return the next generated name for an unnamed request of this kind on process set
    `process_set` (an id; 0 the global set). Such names contain ".noname." and never
    repeat; the engine does not cache them (names that repeat, like a gradient's, must
    not contain ".noname.")."""
    with _name_lock:
        counter = _name_counters.setdefault((kind, process_set), itertools.count())
        n = next(counter)
    return f"{kind}.noname.{n}" if not process_set else f"{kind}.set{process_set}.noname.{n}"


def reset_auto_names() -> None:
    """Restart generated names (called by ``init``), so every rank starts equal."""
    with _name_lock:
        _name_counters.clear()


_group_lock = threading.Lock()
_group_counters: dict[int, Any] = {}


def new_group_id(process_set: int = 0) -> int:
    """A fresh id for one grouped allreduce on process set `process_set` (the same
    sequence on every member). A rank that refuses a group takes its id too, so later
    groups still agree."""
    with _group_lock:
        return next(_group_counters.setdefault(process_set, itertools.count()))
