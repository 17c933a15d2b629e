"""The Python half of membership: what elastic training does between two worlds.

The core detects a dead peer and stops (see ``hvdlite/csrc/membership.h``); this module
decides, on every survivor alike, what the next world is and builds it:

* :func:`reset` -- the survivors agree on a world of themselves
  (``MPI_Comm_shrink``) and start a new engine on it, in the same processes; the new
  rank 0 coordinates. Then, if fewer than ``--min-np`` are left, they wait for the
  launcher's discovery to offer slots, up to ``--elastic-timeout``.
* :func:`settings` -- what ``hvdlite-run``'s elastic options asked for
  (``hvdlite.runner.discovery.ElasticSettings``, passed through the environment).

Without ULFM (a job not started by ``hvdlite-run``'s elastic mode or ``mpirun --with-ft
ulfm``) no failure is ever survivable: the launcher ends the job, as without elastic.
"""
from __future__ import annotations

import os
import time
from typing import Any

from hvdlite.common import naming
from hvdlite.common.exceptions import HvdliteError


class ElasticJobError(HvdliteError):
    """Elastic training cannot go on: fewer workers than ``--min-np`` for longer than
    ``--elastic-timeout``, or ``--reset-limit`` resets reached. Raised on every rank."""


def settings() -> Any:
    """The launcher's elastic settings, or None when the job was not started elastic."""
    try:
        from hvdlite.runner.discovery import ElasticSettings
    except ImportError:  # pragma: no cover - the launcher ships with the package
        return None
    return ElasticSettings.from_environ(os.environ)


def _core() -> Any:
    from hvdlite.common.basics import _load_core
    return _load_core()


def peer_failed() -> bool:
    """The engine stopped because a peer process died (or another rank saw one die):
    a new world of the survivors can be built."""
    c = _core()
    return bool(c.has_world() and c.peer_failed())


def reset() -> None:
    """Collective over the surviving processes: a new world of them, ranks renumbered in
    their old order, a fresh engine (negotiation, response cache, fusion state). Then,
    under ``--min-np``, wait for enough workers or end with :class:`ElasticJobError`."""
    _core().rebuild()
    naming.reset_auto_names()  # every rank's unnamed requests count from 0 again
    _check_min_np()


def _check_min_np() -> None:
    s = settings()
    if s is None or not s.min_np:
        return
    from hvdlite.common.basics import size
    if size() >= s.min_np:
        return
    deadline = time.monotonic() + float(s.timeout_s)
    # Workers join only through the discovery script's new slots; until they can, the
    # wait is the --elastic-timeout the user gave, then the job ends.
    while time.monotonic() < deadline and size() < s.min_np:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    if size() < s.min_np:
        raise ElasticJobError(
            f"elastic training stops: {size()} worker(s) left, fewer than --min-np {s.min_np}, "
            f"and no new ones came within --elastic-timeout {s.timeout_s:g} s")
