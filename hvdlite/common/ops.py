"""The low-level request API that every front end (NumPy, PyTorch, TensorFlow) uses.

A front end describes its tensor as raw memory -- a data pointer, a dtype name and a
shape -- and submits it with :func:`submit`. The C++ engine negotiates the collective
with the other ranks on its background thread and fills the output. The returned
:class:`Handle` keeps the front end's objects alive until the operation finishes.

Outputs whose size is only known after negotiation (allgather, alltoall,
reducescatter) are allocated by the engine; :meth:`Handle.output` hands them over
as a :class:`numpy.ndarray` of ``uint8`` without a copy, together with their shape and
dtype, so each framework can view the bytes as its own tensor.
"""
from __future__ import annotations

import functools
import itertools
import threading
from typing import Any, NoReturn, Sequence

import numpy as np

from hvdlite.common.exceptions import HvdliteError
from hvdlite.common import basics as _basics

# Reduction ops: Horovod's constants and values.
Average = 0
Sum = 1
Adasum = 2  # accepted by name only; not implemented (rejected with a clear error)
Min = 3
Max = 4
Product = 5

_OP_NAMES = {Average: "Average", Sum: "Sum", Min: "Min", Max: "Max", Product: "Product", Adasum: "Adasum"}

# Kinds of request, as the engine numbers them.
ALLREDUCE = 0
ALLGATHER = 1
BROADCAST = 2
ALLTOALL = 3
REDUCESCATTER = 4
BARRIER = 5
JOIN = 6

# Kinds whose result the engine allocates (join: only the last rank, in ``aux``).
_ENGINE_OUTPUT = (ALLGATHER, ALLTOALL, REDUCESCATTER, JOIN)

KIND_NAMES = {ALLREDUCE: "allreduce", ALLGATHER: "allgather", BROADCAST: "broadcast",
              ALLTOALL: "alltoall", REDUCESCATTER: "reducescatter", BARRIER: "barrier",
              JOIN: "join"}

# Element types the engine reduces, by name; the numbers are the engine's codes.
DTYPES = {"uint8": 0, "int8": 1, "int32": 2, "int64": 3, "float16": 4,
          "bfloat16": 5, "float32": 6, "float64": 7}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# The engine's name of each NumPy dtype it reduces. numpy's dtype.name is a slow Python
# property, and every collective call needs the name: the front ends look it up here.
NAME_OF_NP_DTYPE = {np.dtype(n): n for n in DTYPES if n != "bfloat16"}
try:
    import ml_dtypes as _ml_dtypes
    NAME_OF_NP_DTYPE[np.dtype(_ml_dtypes.bfloat16)] = "bfloat16"
except ImportError:  # bfloat16 arrays can only come from ml_dtypes anyway
    pass
ITEMSIZE = {"uint8": 1, "int8": 1, "int32": 4, "int64": 8, "float16": 2,
            "bfloat16": 2, "float32": 4, "float64": 8}

CPU_DEVICE = -1


class RawTensor:
    """Host memory as the engine sees it. ``ptr`` must stay valid and the memory
    C-contiguous until the request completes (keep the owner in ``keepalive``).

    A plain slotted class rather than a dataclass: it is built on every collective call.
    """
    __slots__ = ("ptr", "dtype", "shape", "device")

    def __init__(self, ptr: int, dtype: str, shape: tuple[int, ...], device: int = CPU_DEVICE) -> None:
        self.ptr = ptr
        self.dtype = dtype
        self.shape = shape
        self.device = device

    @property
    def nbytes(self) -> int:
        n = ITEMSIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n

    def __repr__(self) -> str:
        return f"RawTensor(ptr={self.ptr:#x}, dtype={self.dtype!r}, shape={self.shape!r})"


# Deterministic names for unnamed requests: ranks that issue the same sequence of
# unnamed calls of one kind get the same names.
_name_lock = threading.Lock()
_name_counters: dict[str, Any] = {}


def auto_name(kind: str) -> str:
    """Return the next generated name for an unnamed request of this kind. Such names
    contain ".noname." and never repeat; the engine does not cache them (names that
    repeat, like a gradient's, must not contain ".noname.")."""
    with _name_lock:
        counter = _name_counters.setdefault(kind, itertools.count())
        return f"{kind}.noname.{next(counter)}"


def reset_auto_names() -> None:
    """Restart generated names (called by ``init``), so every rank starts equal."""
    with _name_lock:
        _name_counters.clear()


class Handle:
    """An operation in flight. ``wait()`` blocks (GIL released) until it is done and
    raises :class:`HvdliteError` if it failed."""

    __slots__ = ("_id", "_keepalive", "_done", "_error", "kind", "name", "_output", "_aux",
                 "result_fn", "__weakref__")

    def __init__(self, handle_id: int, kind: int, name: str, keepalive: Any) -> None:
        self._id = handle_id
        self.kind = kind
        self.name = name
        self._keepalive = keepalive
        self._done = False
        self._error: str | None = None
        self._output: tuple[np.ndarray, tuple[int, ...], str] | None = None
        self._aux: list[int] | None = None
        # Set by a front end: turns the finished handle into what synchronize() returns.
        self.result_fn: Any = None

    def result(self) -> Any:
        """Wait, then return the front end's result (``result_fn(self)``), or None."""
        self.wait()
        return self.result_fn(self) if self.result_fn is not None else None

    def poll(self) -> bool:
        """True once the operation has finished (successfully or not)."""
        if self._done:
            return True
        return bool(_basics._load_core().poll(self._id))

    def wait(self) -> None:
        if not self._done:
            core = _basics._load_core()  # handles outlive a shutdown and report its reason
            has_output = self.kind in _ENGINE_OUTPUT
            ok, message = core.wait(self._id, not has_output)  # release now if nothing to take
            if has_output:
                if ok:
                    buf, shape, dtype_code, aux = core.take_output(self._id)
                    self._aux = list(aux)
                    if self.kind != JOIN:
                        self._output = (np.frombuffer(buf, dtype=np.uint8) if len(buf) else np.empty(0, np.uint8),
                                        tuple(shape), DTYPE_NAMES[dtype_code])
                core.release(self._id)
            self._done = True
            self._error = None if ok else message
            self._keepalive = None
        if self._error is not None:
            raise HvdliteError(self._error)

    def output(self) -> tuple[np.ndarray, tuple[int, ...], str]:
        """For allgather/alltoall/reducescatter: ``(uint8 bytes, shape, dtype name)``.
        The bytes are engine-owned memory handed over without a copy."""
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
        if not self._done and self._keepalive is not None:
            with _orphan_lock:
                _orphans.append((self._id, self._keepalive))


_orphan_lock = threading.Lock()
# Changed in place only: the engine's direct path holds this list (see mpi_ops._direct_run).
_orphans: list[tuple[int, Any]] = []


def _reap_orphans(core: Any) -> None:
    if not _orphans:  # the common case, checked without the lock
        return
    with _orphan_lock:
        if not _orphans:
            return
        keep = []
        for hid, ka in _orphans:
            if core.poll(hid):
                core.release(hid)
            else:
                keep.append((hid, ka))
        _orphans[:] = keep


def submit(kind: int, tensor: RawTensor, output: RawTensor | None = None, *,
           name: str | None = None, op: int = Sum, prescale_factor: float = 1.0,
           postscale_factor: float = 1.0, root_rank: int = -1,
           splits: Sequence[int] | None = None, group_id: int = -1, group_size: int = 0,
           keepalive: Any = None) -> Handle:
    """Hand one request to the engine and return at once.

    kind: ALLREDUCE (output required; may equal ``tensor`` for in-place), BROADCAST
    (in place on ``tensor``; ``output`` ignored), ALLGATHER / ALLTOALL / REDUCESCATTER
    (engine allocates the output), BARRIER / JOIN (``tensor`` is ignored; pass
    ``EMPTY``). ``op`` is Sum/Average/Min/Max/Product; Average is applied by the engine
    (sum, then divide by the number of contributing ranks), so do not fold it into
    ``postscale_factor`` yourself. ``splits``: alltoall's rows per destination rank.
    ``group_id``/``group_size``: members of one grouped allreduce share a group id
    from :func:`new_group_id` and are negotiated and fused as a unit.
    """
    core, name = _prepare(kind, name, tensor.dtype, op)
    out_ptr = output.ptr if output is not None else 0
    try:
        hid = core.enqueue(kind, name, tensor.ptr, out_ptr, DTYPES[tensor.dtype],
                           tensor.shape, tensor.device, op,
                           float(prescale_factor), float(postscale_factor), root_rank,
                           splits if splits is not None else (),
                           group_id, group_size, _caller.waits)
    except RuntimeError as exc:
        _reraise(exc)
    return Handle(hid, kind, name, keepalive)


def _prepare(kind: int, name: str | None, dtype: str, op: int) -> tuple[Any, str]:
    """What submit and run do first: the engine module and the request's name.

    Every collective call passes here, so the common case (a named request of a known
    dtype and op, no dropped handles to reap) costs two lookups and no further call;
    a call that finds the engine not running is sorted out by :func:`_reraise`.
    Everything else takes :func:`_prepare_fully`."""
    core = _basics._core_module
    if core is None or _orphans or name is None or dtype not in DTYPES or op not in _SUPPORTED_OPS:
        return _prepare_fully(kind, name, dtype, op)
    return core, name


_SUPPORTED_OPS = frozenset(op for op in _OP_NAMES if op != Adasum)


def _prepare_fully(kind: int, name: str | None, dtype: str, op: int) -> tuple[Any, str]:
    """:func:`_prepare` with every check: the engine initialized (or the reason it is
    not), orphaned requests reaped, the name generated when None, dtype and op
    refused on every rank when unsupported."""
    core = _basics.core()
    _reap_orphans(core)
    if name is None:
        name = auto_name(KIND_NAMES[kind])
    if dtype not in DTYPES:
        refuse_all(kind, [name], [f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}"])
    if op == Adasum:
        refuse_all(kind, [name], ["the Adasum op is not supported by hvdlite"])
    if op not in _OP_NAMES:
        refuse_all(kind, [name], [f"unknown reduce op {op!r}"])
    return core, name


def _reraise(exc: RuntimeError) -> NoReturn:
    """Raise what an engine call failed with. The engine says only "not initialized"
    when it is not running; :func:`hvdlite.common.basics.core` knows the full reason
    (never initialized, shut down and why, a forked child) and raises it instead."""
    if not isinstance(exc, HvdliteError):
        try:
            _basics.core()
        except Exception as reason:
            raise reason from None
    raise exc


def refuse(kind: int, name: str | None, problem: str) -> NoReturn:
    """Fail a collective that this rank cannot take part in, on every rank, and raise.

    For a front end whose own check of the caller's input failed (`problem` says what).
    The other ranks may have submitted the same collective; raising only here would
    leave them waiting for this rank forever. Instead the request goes to the
    coordinator marked as refused (under the name it would have had, generated when
    None, so later unnamed calls still agree), and every rank's collective fails with
    "rank R: <kind> '<name>': <problem>". Raises that :class:`HvdliteError` here too,
    once the other ranks have submitted it."""
    refuse_all(kind, [name], [problem])


def refuse_all(kind: int, names: Sequence[str | None], problems: Sequence[str],
               group_id: int = -1) -> NoReturn:
    """:func:`refuse` for several requests that the other ranks submit together (the
    members of a grouped allreduce, `group_id` from :func:`new_group_id`): all are
    refused before any is waited for, since the coordinator answers a group only once
    it is whole. Raises every member's error, as a failed group does on the other ranks."""
    core = _basics.core()
    kname = KIND_NAMES[kind]
    handles = []
    for name, problem in zip(names, problems):
        if name is None:
            name = auto_name(kname)
        handles.append(core.refuse(kind, name, f"{kname} '{name}': {problem}", group_id,
                                   len(names) if group_id >= 0 else 0))
    raise HvdliteError("; ".join(core.wait(h, True)[1] for h in handles))


def run(kind: int, tensor: Any, output: Any, dtype: str, *, name: str | None = None,
        op: int = Sum, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
        root_rank: int = -1) -> None:
    """Run one request on arrays the caller owns and return when it is done: the
    blocking twin of :func:`submit`, for ALLREDUCE (into ``output``; in place when it
    is ``tensor``), BROADCAST (in place on ``tensor``) and BARRIER (``tensor`` None).
    Arrays are anything exporting a C-contiguous buffer (NumPy arrays); ``dtype`` is
    their element type's name. Raises :class:`HvdliteError` if the collective fails, or
    if an array is not C-contiguous (or not writable where it is written).

    One call into the engine instead of submit + wait: on a blocking call the Python
    work around the collective is most of hvdlite's cost over raw MPI.
    """
    core, name = _prepare(kind, name, dtype, op)
    try:
        core.run(kind, name, tensor, output, DTYPES[dtype], op, float(prescale_factor),
                 float(postscale_factor), root_rank)
    except RuntimeError as exc:
        _reraise(exc)


class _Caller(threading.local):
    waits = False  # inside a blocking call on this thread (see `blocking`)


_caller = _Caller()


def blocking(fn: Any) -> Any:
    """Mark a front-end function that waits for every request it submits before it
    returns. Its requests do not wake the engine's background thread: the calling
    thread runs the engine itself while it waits, which saves two thread hand-offs
    per call. A request that is never waited on is still picked up by the background
    thread within its idle period (100 ms)."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _caller.waits:
            return fn(*args, **kwargs)
        _caller.waits = True
        try:
            return fn(*args, **kwargs)
        finally:
            _caller.waits = False
    return call


_group_lock = threading.Lock()
_group_counter = itertools.count()


def new_group_id() -> int:
    """A fresh id for one grouped allreduce (the same sequence on every rank)."""
    with _group_lock:
        return next(_group_counter)


EMPTY = RawTensor(0, "uint8", (0,))
