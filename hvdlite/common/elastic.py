"""Horovod's elastic-training API on a fixed world.

Scripts written for Horovod's elastic mode (``@hvd.elastic.run`` around the training
function, a ``State`` object that is committed as training goes) run under hvdlite
unchanged, on the ranks ``hvdlite-run``/``mpirun`` started. What hvdlite does not have
is the elastic launcher: the world never grows or shrinks, so no reset ever happens,
and a rank that fails ends the job as it does without ``elastic`` (hvdlite-run refuses
horovodrun's elastic options with a message).

What works as in Horovod: ``run`` brings every rank to rank 0's state before calling the
function; ``commit()`` keeps a copy of the state in memory and ``restore()`` returns to
it; ``register_reset_callbacks`` stores callbacks (called on a reset, which a fixed
world never has).
"""
from __future__ import annotations

import functools
from typing import Any, Callable


class State:
    """What a training function carries between sync points: ``save``/``restore``/``sync``
    are provided by subclasses; ``commit`` saves."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], Any]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], Any]]) -> None:
        """Functions to call after the world changes size (never, on a fixed world)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Keep the current state as the one ``restore()`` returns to. In Horovod this is
        also where a worker learns that hosts were added or removed; here they never are."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Horovod raises ``HostsUpdatedInterrupt`` here when the hosts changed. The world
        is fixed, so there is nothing to check."""

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """State made of plain Python values, given as keyword arguments and kept as
    attributes (``state.epoch``, ``state.batch``, ...). ``sync`` makes them rank 0's.
    ``get_rank`` is part of Horovod's signature; nothing here needs it."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int],
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
        if self._saved_state:  # the last saved values, rank 0's (as in Horovod)
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, value)


def run_fn(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func(state, ...)`` after ``state.sync()``. Errors propagate: a fixed world has
    no other ranks to carry on with, and retrying a failed collective on the same ranks
    would fail the same way (or hang), so nothing is retried."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        state.sync()
        return func(state, *args, **kwargs)

    return wrapper
