"""Horovod's elastic-training API: ``@hvd.elastic.run`` and the ``State`` objects.

A training function decorated with ``run`` survives the death of any worker, rank 0
included, when the job runs with fault tolerance (``hvdlite-run --min-np ...``, or
``mpirun --with-ft ulfm``): the failure reaches every survivor as
``HorovodInternalError`` from its pending or next collective; ``run`` then restores
the state of the last ``commit()``, the survivors build a new world of themselves in
the same processes (new ranks 0..n-1, a new coordinator, fresh caches), the reset
callbacks run, the state is synced, and the function is called again.

What a commit is: ``state.commit()`` keeps an in-memory copy of the state
(``save()``) and counts it. After a failure the survivors may have committed
different numbers of times (one finished a step that another did not); the sync
after the reset takes the state from the survivor with the newest commit, so no
commit that any survivor made is lost.

Without fault tolerance a failure ends the job as it does without ``elastic``, and
``run`` lets every error through.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

from hvdlite.common import membership
from hvdlite.common.basics import rank, size
from hvdlite.common.exceptions import HostsUpdatedInterrupt

_sync_root = 0


def sync_root() -> int:
    """The rank whose state ``State.sync()`` broadcasts: 0, or after a reset the rank
    whose last commit is the newest (ties: the lowest rank)."""
    return _sync_root


class State:
    """What a training function carries between sync points: ``save``/``restore``/``sync``
    are provided by subclasses; ``commit`` saves."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], Any]] = []
        self._commits = 0

    def register_reset_callbacks(self, callbacks: list[Callable[[], Any]]) -> None:
        """Functions to call after the world changed (a worker was lost or added),
        before the state is synced and training resumes."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Keep the current state as the one ``restore()`` returns to after a failure,
        then check whether hosts were added (``check_host_updates``).

        In an elastic job the ranks first agree that none of them failed since the
        world was made (and on whether workers are to be added): a step that a failure
        interrupted is never committed, even on a rank where it seemed to complete."""
        self._commit_check = membership.check_for_new_workers()
        self.save()
        self._commits += 1
        membership.keep_commit(self)
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank when workers are to be added
        (the launcher's discovery script offers free slots, up to ``--max-np``).
        Collective in an elastic job; nothing to check in a fixed one."""
        updated = self.__dict__.pop("_commit_check", None)
        if updated is None:
            updated = membership.check_for_new_workers()
        if updated:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def snapshot(self) -> Any:
        """The last commit as picklable values, for a job that starts again (a host
        joined the discovery output, or mpirun lost a host's daemon): the first rank on
        each host keeps it in a file at every commit, and in the new job one of them
        loads it (``load_snapshot``) before the first sync. A state class that does not
        provide both keeps new hosts unused, and a lost daemon ends its job."""
        raise NotImplementedError

    def load_snapshot(self, snapshot: Any) -> None:
        raise NotImplementedError


def can_snapshot(state: State) -> bool:
    """Whether ``state`` can be carried over a start on more hosts: the class that
    defines its ``save`` also defines ``snapshot`` (a subclass that saves more than its
    parent knows of cannot)."""
    for cls in type(state).__mro__:
        if "save" in cls.__dict__:
            return "snapshot" in cls.__dict__ and "load_snapshot" in cls.__dict__
    return False


class ObjectState(State):
    """State made of plain Python values, given as keyword arguments and kept as
    attributes (``state.epoch``, ``state.batch``, ...). ``sync`` makes them the sync
    root's (:func:`sync_root`, rank 0 at the start). ``get_rank`` is part of Horovod's
    signature; nothing here needs it."""

    def __init__(self, bcast_object: Callable[..., Any], get_rank: Callable[[], int],
                 **kwargs: Any) -> None:
        self._bcast_object = bcast_object
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super().__init__()

    def save(self) -> None:
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:  # the last saved values, the sync root's (as in Horovod)
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def snapshot(self) -> Any:
        return {"values": dict(self._saved_state)}

    def load_snapshot(self, snapshot: Any) -> None:
        self._saved_state = dict(snapshot["values"])
        self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, value)


def _choose_sync_root(state: State) -> None:
    """Collective (elastic jobs): the rank with the most commits becomes the sync root
    (the lowest such rank; rank 0 at the start), and every rank's host, launch (the
    first job, or the one that added it) and process are noted."""
    global _sync_root
    from hvdlite.common.objects import allgather_object
    mine = (getattr(state, "_commits", 0), membership.hostname(), membership.job_name(),
            membership.process_id())
    gathered = allgather_object(mine, name="hvdlite.elastic.world")
    counts = [c for c, _, _, _ in gathered]
    membership.world_hosts([h for _, h, _, _ in gathered], [j for _, _, j, _ in gathered],
                           [p for _, _, _, p in gathered])
    newest = max(counts)
    _sync_root = counts.index(newest)
    state._commits = newest


def _report_recovery(state: State) -> None:
    """After the world lost workers, or stopped some whose host left the discovery
    output, and the survivors synced: one line, from the new rank 0, saying what
    happened and what training goes on with."""
    losses, dismissed, added = membership.take_changes()
    resumed = membership.take_resumed()
    if not (losses or dismissed or resumed) or rank() != 0 or not _warnings_shown():
        return

    def ranks_text(ranks: list[int], before: int) -> str:
        return f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))} of {before}"

    events = [f"{ranks_text(ranks, before)} failed" if before
              else f"{len(ranks)} worker{'s' * (len(ranks) > 1)} failed" for ranks, before in losses]
    events += [f"{ranks_text(ranks, before)} stopped (the discovery output no longer lists their slot"
               f"{'s' * (len(ranks) > 1)} on {', '.join(hosts)})" for ranks, before, hosts in dismissed]
    if resumed and resumed[0] == "joined":
        events.append(f"the job started again on more hosts ({', '.join(resumed[1])} joined)")
    elif resumed:
        events.append(f"the job started again without {', '.join(resumed[1]) or 'a host'}, whose Open MPI "
                      "daemon was lost")
    commits = getattr(state, "_commits", 0)
    where = f"commit {commits}" if commits else "the start (nothing was committed yet)"
    progress = ", ".join(f"{k}={v}" for k, v in (getattr(state, "_saved_state", None) or {}).items()
                         if isinstance(v, int) and not isinstance(v, bool))
    n = size()
    new = f" ({added} new)" if added else ""
    sys.stderr.write(f"[hvdlite WARNING rank 0] {', then '.join(events)}; continuing with {n} "
                     f"worker{'s' * (n != 1)}{new} from {where}{f' ({progress})' if progress and commits else ''}\n")
    sys.stderr.flush()


def _warnings_shown() -> bool:
    """Whether hvdlite's log level (HVDLITE_LOG_LEVEL, HOROVOD_LOG_LEVEL) shows warnings."""
    level = (os.environ.get("HVDLITE_LOG_LEVEL") or os.environ.get("HOROVOD_LOG_LEVEL") or "").strip().lower()
    return level not in ("error", "fatal", "4", "5")


def _count_reset(resets: int, reset_limit: int | None) -> None:
    """``resets`` world changes so far: kept with the commits, and past ``--reset-limit``
    the end of training (on every rank alike)."""
    membership.note_resets(resets)
    if reset_limit is not None and resets > reset_limit:
        raise membership.ElasticJobError(
            f"elastic training stops: the world changed {resets} times, more than "
            f"--reset-limit {reset_limit}")


def run_fn(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func(state, ...)`` run elastically (see the module's docstring)."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        global _sync_root
        settings = membership.settings()
        membership.watch_for_suspension()
        membership.watch_for_stalls()
        membership.set_relaunchable(can_snapshot(state))
        # The times the world changed before this process (in a job that started
        # again), the start itself included.
        resets = membership.resume(state)
        reset_limit = getattr(settings, "reset_limit", None)
        skip_sync = False
        _sync_root = 0
        _count_reset(resets, reset_limit)
        while True:
            try:
                if not skip_sync:
                    if settings is not None:
                        _choose_sync_root(state)
                    state.sync()
                _report_recovery(state)
                result = func(state, *args, **kwargs)
                membership.training_done()
                return result
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
                after_failure = False
            except Exception:  # noqa: BLE001 - HorovodInternalError, or a framework's wrapper of it
                # A collective inside a tf.function fails as a tf.errors type, and a
                # framework may wrap the error on its way out; what counts is why the
                # engine stopped.
                if not membership.peer_failed():
                    raise  # not a lost worker: nothing a new world would fix
                state.restore()
                skip_sync = False
                after_failure = True
            resets += 1
            _count_reset(resets, reset_limit)
            if not after_failure and membership.relaunch_agreed():
                # A host joined: every worker leaves here (SystemExit), and the launcher
                # starts the job again on more hosts from this commit; on here when the
                # offer went away meanwhile.
                membership.relaunch(state)
            while True:
                try:
                    if membership.reset(after_failure):
                        # Workers left: what they did since the last commit goes with
                        # them, and the survivors go back to that commit (which also
                        # holds every rank's processed samples, theirs included).
                        state.restore()
                    break
                except membership.ElasticJobError:
                    raise
                except Exception:  # noqa: BLE001 - another worker lost during the reset
                    if not membership.peer_failed():
                        raise
                    after_failure = True
            state.on_reset()

    return wrapper
