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
from typing import Any, Callable

from hvdlite.common import membership
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
        then check whether hosts were added (``check_host_updates``)."""
        self.save()
        self._commits += 1
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank when the hosts changed. Only the
        launcher's discovery script adds hosts; a job without it has nothing to check."""

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


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

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, value)


def _choose_sync_root(state: State) -> None:
    """Collective: the rank with the most commits becomes the sync root."""
    global _sync_root
    from hvdlite.common.basics import size
    from hvdlite.common.objects import allgather_object
    if size() == 1:
        _sync_root = 0
        return
    counts = allgather_object(getattr(state, "_commits", 0), name="hvdlite.elastic.commits")
    newest = max(counts)
    _sync_root = counts.index(newest)
    state._commits = newest


def run_fn(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func(state, ...)`` run elastically (see the module's docstring)."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        global _sync_root
        settings = membership.settings()
        reset_limit = getattr(settings, "reset_limit", None)
        resets = 0
        skip_sync = False
        _sync_root = 0
        while True:
            if not skip_sync:
                state.sync()
            try:
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
            except Exception:  # noqa: BLE001 - HorovodInternalError, or a framework's wrapper of it
                # A collective inside a tf.function fails as a tf.errors type, and a
                # framework may wrap the error on its way out; what counts is why the
                # engine stopped.
                if not membership.peer_failed():
                    raise  # not a lost worker: nothing a new world would fix
                state.restore()
                skip_sync = False
            resets += 1
            if reset_limit is not None and resets > reset_limit:
                raise membership.ElasticJobError(
                    f"elastic training stops: the world changed {resets} times, more than "
                    f"--reset-limit {reset_limit}")
            membership.reset()
            state.on_reset()
            if not skip_sync:
                _choose_sync_root(state)

    return wrapper
