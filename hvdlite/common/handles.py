"""Handles: the engine requests a front end submits, and what its calls return.

:class:`Request` is one request in the engine (what :func:`hvdlite.common.ops.submit`
returns). :class:`Handle` is what every front end's ``_async`` call returns: the
requests the call submitted (its parts) and how to turn them into the caller's result
once they are done; ``poll()`` and ``wait()`` work the same in every front end.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np

from hvdlite.common import basics as _basics
from hvdlite.common.codes import CPU_DEVICE, DTYPE_NAMES, ENGINE_OUTPUT, JOIN
from hvdlite.common.exceptions import HvdliteError
from hvdlite.common.process_set_table import members


class Request:
    """One request in the engine. ``wait()`` blocks until it is done and raises
    :class:`HvdliteError` if it failed; the memory it reads and writes is kept alive
    (``keepalive``) until then, even if the request is dropped before it finishes."""

    __slots__ = ("_id", "_keepalive", "_done", "_error", "kind", "name", "_output", "_aux",
                 "device", "consumers", "reader", "sync_host", "process_set", "__weakref__")

    def __init__(self, handle_id: int, kind: int, name: str, keepalive: Any, process_set: int = 0,
                 device: int = CPU_DEVICE, consumers: tuple[int, ...] = ()) -> None:
        self._id = handle_id
        self.kind = kind
        self.name = name
        self._keepalive = keepalive
        self._done = False
        self._error: str | None = None
        self._output: tuple[Any, tuple[int, ...], str] | None = None
        self._aux: list[int] | None = None
        # A GPU collective is done once it is queued on hvdlite's stream. The streams in
        # `consumers` (cudaStream_t) are then ordered after it, the host does not wait:
        # the stream that reads an in-place result, and the one that produced the input
        # (so that its later work cannot reuse the input's memory before hvdlite read
        # it). With `sync_host`, the host waits for it (memory whose owner named no
        # stream). A device result carries the stream it was produced on besides.
        self.consumers = consumers
        # Of those, the stream that will read a result the engine allocated: the memory
        # is freed only after the work queued there by then.
        self.reader: int | None = None
        self.sync_host = False
        self.device = device  # where the request's tensor lives
        self.process_set = process_set  # the id of the process set it runs on

    def poll(self) -> bool:
        """True once the request has finished (successfully or not)."""
        if self._done:
            return True
        return bool(_basics._load_core().poll(self._id))

    def wait(self) -> None:
        """Block until the request is done; raise :class:`HvdliteError` if it failed.

        Python's signal handlers run while it blocks: an exception one raises (Ctrl-C's
        ``KeyboardInterrupt``, a timeout's) comes out of ``wait`` with the request still
        in flight, and a later ``wait`` picks it up."""
        if not self._done:
            core = _basics._load_core()  # requests outlive a shutdown and report its reason
            has_output = self.kind in ENGINE_OUTPUT
            # The one place hvdlite waits on the engine (GIL released; every Handle and
            # refusal waits through here), and orders a GPU consumer after the work.
            # (None once done, else why it failed.)
            if not self.consumers and not self.sync_host:
                failure = core.wait(self._id, not has_output)  # release now if nothing to take
            else:
                failure = core.wait(self._id, not has_output, self.consumers, self.sync_host)
            if has_output:
                if failure is None:
                    buf, shape, dtype_code, aux = core.take_output(self._id)
                    self._aux = list(aux)
                    if self.kind != JOIN:
                        self._output = (_host_bytes(buf, self.reader), tuple(shape), DTYPE_NAMES[dtype_code])
                core.release(self._id)
            self._done = True
            self._error = None if failure is None else failure + _set_note(self.process_set)
            self._keepalive = None
        if self._error is not None:
            raise HvdliteError(self._error)

    def output(self) -> tuple[Any, tuple[int, ...], str]:
        """For allgather/alltoall/reducescatter: ``(uint8 bytes, shape, dtype name)``.
        The bytes are engine-owned memory handed over without a copy: a NumPy array, or
        for a GPU collective the engine's ``DeviceResult`` (see
        :mod:`hvdlite.common.device`)."""
        self.wait()
        assert self._output is not None, "this kind of request has no engine-allocated output"
        return self._output

    def aux(self) -> list[int]:
        """Extra integers of the result: alltoall's received splits, join's last rank."""
        self.wait()
        return list(self._aux or [])

    def __del__(self) -> None:
        # Dropped before completion: the engine may still write into the memory, so
        # keep it alive until the operation finishes (checked on later submissions).
        # No lock here: the cyclic garbage collector runs finalizers at any allocation,
        # in the middle of _reap_orphans too, and a lock taken there would be taken
        # twice by one thread. One append is atomic under the GIL.
        if not self._done and self._keepalive is not None:
            _orphans.append((self._id, self._keepalive))


def _set_note(process_set: int) -> str:
    """What an error of a process set's collective adds: the engine of a set numbers its
    ranks 0..n-1, so say which world ranks those are."""
    if not process_set:
        return ""
    ranks = members(process_set)
    where = f"; its ranks 0..{len(ranks) - 1} are world ranks {ranks}" if ranks else ""
    return f" (in process set {process_set}{where})"


def _host_bytes(buf: Any, reader: int | None) -> Any:
    """An engine output as the front ends take it: host results as NumPy bytes; GPU
    results (``DeviceResult``) as they are, noted as used on the reader's stream."""
    if hasattr(buf, "to_dlpack"):
        if reader is not None:
            buf.used_on(reader)
        return buf
    return np.frombuffer(buf, dtype=np.uint8) if len(buf) else np.empty(0, np.uint8)


class Refusal(Request):
    """A request this rank refused (see :func:`hvdlite.common.ops.refusal`). It fails
    on every rank; here ``wait()`` raises ``error_type`` (an :class:`HvdliteError`
    class) with the coordinator's message, which names the rank and the problem."""

    __slots__ = ("error_type",)

    def __init__(self, handle_id: int, kind: int, name: str,
                 error_type: type[HvdliteError] = HvdliteError) -> None:
        # An empty keepalive: a refusal dropped unwaited is still reaped (released).
        super().__init__(handle_id, kind, name, ())
        self.error_type = error_type

    def wait(self) -> None:
        try:
            super().wait()
        except HvdliteError as exc:
            raise self.error_type(str(exc)) from None


# One reaper at a time; finalizers only append (see Request.__del__).
_orphan_lock = threading.Lock()
# Changed in place only: the engine's direct path holds this list (see mpi_ops._direct_run).
_orphans: list[tuple[int, Any]] = []


def _reap_orphans(core: Any) -> None:
    """Release the dropped requests that have finished; keep the others' memory."""
    if not _orphans:  # the common case, checked without the lock
        return
    if not _orphan_lock.acquire(blocking=False):
        return  # another thread reaps them now (or this one, from a finalizer)
    try:
        # Handles dropped meanwhile (a finalizer can run at any allocation here) are
        # appended behind the ones taken, and wait for the next reap.
        n = len(_orphans)
        taken = _orphans[:n]
        del _orphans[:n]
        keep = []
        for hid, ka in taken:
            if core.poll(hid):
                core.release(hid)
            else:
                keep.append((hid, ka))
        _orphans.extend(keep)
    finally:
        _orphan_lock.release()


class Handle:
    """An operation in flight, returned by the ``_async`` functions of every front end.

    Pass it to ``poll()`` to ask whether it finished and to ``synchronize()`` to wait
    for it and get its result; synchronizing again returns the same result (or raises
    the same error). It raises :class:`HvdliteError` if the operation failed, for
    example because ranks submitted mismatching shapes under one name.

    Inside: the requests (or handles) the call submitted, ``parts``, and
    ``finish(parts)``, which turns them into the result once all are done. ``error``
    is a failure that happened while submitting: ``wait()`` raises it after the parts
    that were submitted have finished. ``keepalive`` holds anything their memory
    belongs to until then.
    """

    __slots__ = ("_parts", "_finish", "_result", "_done", "_error", "name", "keepalive",
                 "__weakref__")

    def __init__(self, parts: Sequence[Any], finish: Callable[[Sequence[Any]], Any], name: str,
                 error: BaseException | None = None) -> None:
        self._parts = parts
        self._finish = finish
        self._result: Any = None
        self._done = False
        self._error = error
        self.name = name
        self.keepalive: Any = None

    @property
    def submit_error(self) -> BaseException | None:
        """The failure kept while submitting (``error``), until ``wait()`` raises it."""
        return None if self._done else self._error

    def poll(self) -> bool:
        """True once every part has finished, so that ``wait()`` will not block."""
        return self._done or all(p.poll() for p in self._parts)

    def wait(self) -> Any:
        """Wait for every part, then return the result (or raise the first failure)."""
        if not self._done:
            self._complete()
        if self._error is not None:
            raise self._error
        return self._result

    def _complete(self) -> None:
        error = self._error
        # Each part waits on the engine in Request.wait (a CUDA consumer stream this
        # handle may carry one day goes down from here to there).
        for part in self._parts:
            try:
                part.wait()
            except Exception as exc:  # noqa: BLE001 - keep waiting so that nothing dangles
                if not part.poll():
                    # A signal handler's exception out of the wait (see Request.wait): the
                    # part is still in flight, and so is this handle; a later wait goes on.
                    raise
                if error is None:
                    error = exc
        if error is None:
            try:
                self._result = self._run_finish()
            except Exception as exc:  # noqa: BLE001 - reported to the caller by wait()
                error = exc
        self._done = True
        self._error = error
        self._parts = ()
        self._finish = None  # type: ignore[assignment]
        self.keepalive = None

    def _run_finish(self) -> Any:
        """Call ``finish`` (a front end may wrap it, e.g. to switch autograd off)."""
        return self._finish(self._parts)

    def __repr__(self) -> str:
        return f"<hvdlite handle {self.name!r} {'done' if self._done else 'pending'}>"
