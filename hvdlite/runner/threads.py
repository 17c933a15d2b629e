"""Horovod's ``horovod.runner.util.threads`` helpers that scripts and test suites use:
run a function in a background thread, at once or when an event is set."""
from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["in_thread", "on_event"]


def _check_args(args: Any) -> None:
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple, not {type(args).__name__}; for one argument "
                         "write (arg,)")


def in_thread(target: Callable[..., Any], args: tuple = (), name: str | None = None,
              daemon: bool = True, silent: bool = False) -> threading.Thread:
    """Start ``target(*args)`` in a new thread and return the thread (started).

    ``daemon``: the thread does not keep the process alive. ``silent``: an exception
    from ``target`` ends the thread quietly instead of being printed. ``ValueError`` if
    ``args`` is not a tuple."""
    _check_args(args)
    body = target
    if silent:
        def body(*a: Any) -> None:
            try:
                target(*a)
            except BaseException:  # noqa: BLE001 - silent means silent
                pass
    thread = threading.Thread(target=body, args=args, name=name, daemon=daemon)
    thread.start()
    return thread


def on_event(event: threading.Event, func: Callable[..., Any], args: tuple = (),
             stop: threading.Event | None = None, check_stop_interval_s: float = 1.0,
             daemon: bool = True, silent: bool = False) -> threading.Thread:
    """Start a thread that waits for ``event`` and then calls ``func(*args)``.

    With ``stop``, the thread also ends, without calling ``func``, once ``stop`` is set
    (it looks every ``check_stop_interval_s`` seconds). A non-daemon thread needs a
    ``stop`` event, or it could keep the process alive forever. ``ValueError`` for a
    missing ``event``, ``args`` that is not a tuple, or a non-daemon thread without
    ``stop``."""
    if event is None:
        raise ValueError("on_event needs an event to wait for")
    _check_args(args)
    if stop is None and not daemon:
        raise ValueError("a non-daemon event thread needs a stop event")

    def wait_then_call() -> None:
        if stop is None:
            event.wait()
        else:
            while not event.is_set() and not stop.is_set():
                event.wait(timeout=check_stop_interval_s)
            if stop.is_set():
                return
        func(*args)

    return in_thread(wait_then_call, daemon=daemon, silent=silent)
