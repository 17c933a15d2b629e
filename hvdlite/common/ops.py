"""The low-level request API that every front end (NumPy, PyTorch, TensorFlow) uses.

A front end describes its tensor as raw memory -- a data pointer, a dtype name and a
shape -- and submits it with :func:`submit`. The C++ engine negotiates the collective
with the other ranks on its background thread and fills the output. The returned
:class:`Request` keeps the front end's objects alive until the operation finishes; the
front end hands its caller a :class:`Handle` over its requests.

Outputs whose size is only known after negotiation (allgather, alltoall,
reducescatter) are allocated by the engine; :meth:`Request.output` hands them over
as a :class:`numpy.ndarray` of ``uint8`` without a copy, together with their shape and
dtype, so each framework can view the bytes as its own tensor.

Also here, the same for every front end: Horovod's rules for the ``op`` and ``average``
arguments (:func:`resolve_op`), and the refusal of input that only this rank cannot use
(:func:`refuse`, :func:`stage_or_refuse`), which fails the collective on every rank
instead of leaving the other ranks waiting for this one.
"""
from __future__ import annotations

import functools
import threading
import warnings
from typing import Any, Callable, NoReturn, Sequence, TypeVar

from hvdlite.common import basics as _basics, gpu_libraries
from hvdlite.common import process_set_table as _process_sets
# The engine's codes, used by the front ends as _ops.<NAME>.
from hvdlite.common.codes import (  # noqa: F401
    ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, CPU_DEVICE, DTYPE_NAMES, DTYPES,
    ENGINE_OUTPUT, ITEMSIZE, JOIN, KIND_NAMES, NAME_OF_NP_DTYPE, OP_NAMES, REDUCESCATTER,
    SUPPORTED_OPS, Adasum, Average, Max, Min, Product, Sum)
from hvdlite.common.exceptions import (HvdliteError, HvdliteTypeError,
                                       HvdliteValueError, refusal_error_for)
from hvdlite.common.handles import Handle, Refusal, Request, _orphans, _reap_orphans, _set_note  # noqa: F401
from hvdlite.common import naming as _naming


class RawTensor:
    """Memory as the engine sees it. ``ptr`` must stay valid and the memory
    C-contiguous until the request completes (keep the owner in ``keepalive``).
    ``device``: ``CPU_DEVICE`` for host memory, else the CUDA device's index; then
    ``stream`` is the cudaStream_t whose queued work produces the contents (the
    collective is ordered after it), or None if nothing needs waiting for.

    A plain slotted class rather than a dataclass: it is built on every collective call.
    """
    __slots__ = ("ptr", "dtype", "shape", "device", "stream")

    def __init__(self, ptr: int, dtype: str, shape: tuple[int, ...], device: int = CPU_DEVICE,
                 stream: int | None = None) -> None:
        self.ptr = ptr
        self.dtype = dtype
        self.shape = shape
        self.device = device
        self.stream = stream

    @property
    def nbytes(self) -> int:
        n = ITEMSIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n

    def __repr__(self) -> str:
        return f"RawTensor(ptr={self.ptr:#x}, dtype={self.dtype!r}, shape={self.shape!r})"


# ---- the reduce op ---------------------------------------------------------------------

def resolve_op(op: Any, average: Any, stacklevel: int = 3) -> Any:
    """The reduce op of a call with Horovod's ``op`` and deprecated ``average``
    arguments, by Horovod's rules: both given is a ``ValueError``; ``average`` alone
    warns (``DeprecationWarning``) and means Average if true, else Sum; neither means
    Average; otherwise ``op`` as given.

    The ``ValueError`` is raised here, before anything is sent, as Horovod does: every
    rank runs the same call. The op itself is checked when the request is submitted
    (:func:`op_problem`): unknown ops are refused there, on every rank.
    ``stacklevel`` points the warning at the user's call (3: the caller's caller)."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average; pass only one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` is deprecated; use `op=hvd.Average` or "
                      "`op=hvd.Sum` instead.", DeprecationWarning, stacklevel=stacklevel)
        return Average if average else Sum
    return Average


def op_problem(op: Any) -> tuple[str, type[HvdliteError]] | None:
    """None if the engine runs reduce op `op`; else why not, and the error to raise
    (:class:`HvdliteValueError`)."""
    try:
        if op in SUPPORTED_OPS:
            return None
    except TypeError:  # unhashable: certainly no op
        pass
    return (f"unknown reduce op {op!r}; use Average, Sum, Adasum, Min, Max or Product",
            HvdliteValueError)


def describe_op(op: Any) -> str:
    """A reduce op as messages name it: its Horovod name, else its value."""
    try:
        return OP_NAMES.get(op, repr(op))
    except TypeError:  # unhashable
        return repr(op)


# ---- the process set of a call ----------------------------------------------------------

class _Scope(threading.local):
    process_set: Any = None  # the set the current thread's collectives run on (None: global)


_scope = _Scope()


class process_set_scope:
    """``with process_set_scope(ps):`` -- the collectives this thread submits inside run
    on process set ``ps`` (a front end's public function wraps its body in one, so the
    internals need not carry the set). Checks ``ps`` at once: raises ValueError here if
    it is not registered or this process is not a member. ``None`` keeps the set of an
    enclosing scope (the global set at top level); pass ``global_process_set`` to leave
    one."""

    __slots__ = ("_set", "_prev")

    def __init__(self, process_set: Any) -> None:
        if process_set is not None:
            _process_sets.resolve(process_set)
        self._set = process_set

    def __enter__(self) -> None:
        self._prev = _scope.process_set
        if self._set is not None:
            _scope.process_set = self._set

    def __exit__(self, *exc: Any) -> None:
        _scope.process_set = self._prev


def current_process_set() -> Any:
    """The process set of the enclosing :class:`process_set_scope` (None: global)."""
    return _scope.process_set


def current_set_size() -> int:
    """How many ranks the enclosing process set has (the job's size for the global set)."""
    ps = _scope.process_set
    return _basics.size() if ps is None else (ps.size() or 1)  # unregistered: refused when submitted


def _current_id() -> int:
    ps = _scope.process_set
    return 0 if ps is None else (ps.process_set_id or 0)


def auto_name(kind: str) -> str:
    """The next generated name of an unnamed request of `kind` on the current thread's
    process set (see :mod:`hvdlite.common.naming`)."""
    return _naming.auto_name(kind, _current_id())


def new_group_id() -> int:
    """A fresh grouped-allreduce id on the current thread's process set."""
    return _naming.new_group_id(_current_id())


def current_size() -> int:
    """Number of ranks the current thread's collectives run on."""
    ps = _scope.process_set
    return _basics.size() if ps is None else _process_sets.set_size(ps)


def current_rank() -> int:
    """This process's rank among them."""
    ps = _scope.process_set
    if ps is None or ps.process_set_id == 0:
        return _basics.rank()
    return ps.rank()


# ---- submitting ------------------------------------------------------------------------

def submit(kind: int, tensor: RawTensor, output: RawTensor | None = None, *,
           name: str | None = None, op: int = Sum, prescale_factor: float = 1.0,
           postscale_factor: float = 1.0, root_rank: int = -1,
           splits: Sequence[int] | None = None, group_id: int = -1, group_size: int = 0,
           keepalive: Any = None, process_set: Any = None) -> Request:
    """Hand one request to the engine and return at once.

    kind: ALLREDUCE (output required; may equal ``tensor`` for in-place), BROADCAST
    (in place on ``tensor``; ``output`` ignored), ALLGATHER / ALLTOALL / REDUCESCATTER
    (engine allocates the output), BARRIER / JOIN (``tensor`` is ignored; pass
    ``EMPTY``). ``op`` is Sum/Average/Min/Max/Product; Average is applied by the engine
    (sum, then divide by the number of contributing ranks), so do not fold it into
    ``postscale_factor`` yourself. ``splits``: alltoall's rows per destination rank.
    ``group_id``/``group_size``: members of one grouped allreduce share a group id
    from :func:`new_group_id` and are negotiated and fused as a unit.

    An unsupported dtype or op is refused on every rank here (and raised). Members of
    a group are refused one by one here, so a front end checks the whole group first
    (:func:`stage_or_refuse`), and refuses it whole.

    ``process_set``: a registered :class:`~hvdlite.common.process_sets.ProcessSet`
    this process is in (None: the global set); ``root_rank`` is a world rank.
    """
    pid = 0
    if process_set is None:
        process_set = _scope.process_set
    if process_set is not None:
        pid, root_rank = _process_sets.resolve(process_set, root_rank)
    core, name = _prepare(kind, name, tensor.dtype, op, pid)
    device = tensor.device
    stream = None  # host memory: nothing to order after
    if device != CPU_DEVICE:
        if not gpu_libraries.configured:
            gpu_libraries.configure(core)  # where the NVIDIA wheels are, before the first GPU tensor
        stream = tensor.stream
    try:
        # Positional, in the engine's order (see bindings.cc: enqueue).
        hid = core.enqueue(kind, name, tensor.ptr, output.ptr if output is not None else 0, DTYPES[tensor.dtype],
                           tensor.shape, device, op, prescale_factor, postscale_factor, root_rank,
                           splits if splits is not None else (), group_id, group_size, _caller.waits, stream, pid)
    except RuntimeError as exc:
        raise_engine_error(exc)
    if stream is None:
        return Request(hid, kind, name, keepalive, pid, device)
    # The producer's stream waits for the collective once it is waited for: its later
    # work (reuse of the input's memory included) comes after hvdlite's.
    return Request(hid, kind, name, keepalive, pid, device, (stream,))


class Persistent:
    """A collective submitted again and again with the same name, memory and options (a
    gradient bucket, every step): built and checked once, then each :meth:`start` and
    :meth:`wait` is a single call into the engine that creates no Python object.

    ``kind`` is ALLREDUCE (``output`` may be ``tensor``: in place) or BROADCAST (in
    place). ``keepalive`` owns the memory: it is kept until a start still in flight when
    the request is closed (or dropped) has finished. Unlike :func:`submit`, a bad dtype
    or op raises here, on this rank only: build persistent requests from input every
    rank has checked alike."""

    __slots__ = ("name", "process_set", "start", "_wait", "_id", "_keepalive", "__weakref__")

    def __init__(self, kind: int, tensor: RawTensor, output: RawTensor | None = None, *, name: str,
                 op: int = Sum, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                 keepalive: Any = None, process_set: Any = None) -> None:
        if tensor.dtype not in DTYPES:
            raise HvdliteTypeError(f"unsupported dtype {tensor.dtype!r}; supported: {', '.join(DTYPES)}")
        if (problem := op_problem(op)) is not None:
            raise problem[1](problem[0])
        pid = 0
        if process_set is None:
            process_set = _scope.process_set
        if process_set is not None:
            pid, _ = _process_sets.resolve(process_set)
        core = _basics.core()
        if tensor.device != CPU_DEVICE:
            gpu_libraries.configure(core)
        out = output if output is not None else tensor
        self._id = core.persistent_prepare(kind, name, tensor.ptr, out.ptr, DTYPES[tensor.dtype], tensor.shape,
                                           tensor.device, op, float(prescale_factor), float(postscale_factor),
                                           process_set=pid)
        self.name = name
        self.process_set = pid
        self._keepalive = keepalive
        #: ``start(stream)``: queue the collective again, after the work queued so far on
        #: ``stream`` (a cudaStream_t as an int; None for host memory).
        self.start = functools.partial(core.persistent_start, self._id)
        self._wait = functools.partial(core.persistent_wait, self._id)

    def poll(self) -> bool:
        """True once the last start has finished (or when none is in flight)."""
        return bool(_basics._load_core().persistent_done(self._id))

    def wait(self, consumer: int | None = None) -> None:
        """Wait for the last start; order ``consumer`` (a cudaStream_t, or None) and the
        stream it was started after behind it. Raises :class:`HvdliteError` if it failed."""
        try:
            self._wait(consumer)
        except HvdliteError as exc:
            if self.process_set:
                raise type(exc)(str(exc) + _set_note(self.process_set)) from None
            raise

    def close(self) -> None:
        """Forget the request; a start still in flight keeps its memory until it is done."""
        if self._id < 0:
            return
        core = _basics._core_module
        hid = core.persistent_close(self._id) if core is not None else 0
        self._id = -1
        if hid:
            _orphans.append((hid, self._keepalive))
        self._keepalive = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the engine may be gone
            pass


def _prepare(kind: int, name: str | None, dtype: str, op: int, pid: int = 0) -> tuple[Any, str]:
    """What submit and run do first: the engine module and the request's name.

    Every collective call passes here, so the common case (a named request of a known
    dtype and op, no dropped handles to reap) costs two lookups and no further call;
    a call that finds the engine not running is sorted out by :func:`raise_engine_error`.
    Everything else takes :func:`_prepare_fully`."""
    core = _basics._core_module
    if core is None or _orphans or name is None or dtype not in DTYPES or op not in SUPPORTED_OPS:
        return _prepare_fully(kind, name, dtype, op, pid)
    return core, name


def _prepare_fully(kind: int, name: str | None, dtype: str, op: int, pid: int = 0) -> tuple[Any, str]:
    """:func:`_prepare` with every check: the engine initialized (or the reason it is
    not), orphaned requests reaped, the name generated when None, dtype and op
    refused on every rank when unsupported."""
    core = _basics.core()
    _reap_orphans(core)
    if name is None:
        name = _naming.auto_name(KIND_NAMES[kind], pid)
    where = _process_sets.process_set_by_id(pid) if pid else None
    if dtype not in DTYPES:
        refuse(kind, name, f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}",
               HvdliteTypeError, process_set=where)
    problem = op_problem(op)
    if problem is not None:
        refuse(kind, name, *problem, process_set=where)
    return core, name


def raise_engine_error(exc: RuntimeError) -> NoReturn:
    """Raise what an engine call failed with. The engine says only "not initialized"
    when it is not running; :func:`hvdlite.common.basics.core` knows the full reason
    (never initialized, shut down and why, a forked child) and raises it instead."""
    if not isinstance(exc, HvdliteError):
        try:
            _basics.core()
        except Exception as reason:
            raise reason from None
    raise exc


# ---- refusing input only this rank cannot use -----------------------------------------

def refusal(kind: int, name: str | None, problem: str, group_id: int = -1, group_size: int = 0,
            error: type[HvdliteError] = HvdliteError, process_set: Any = None) -> Refusal:
    """Submit, without waiting, a request that this rank cannot take part in.

    The other ranks may have submitted the same collective; raising only here would
    leave them waiting for this rank forever. Instead the request goes to the
    coordinator marked as refused (under the name it would have had, generated when
    None, so later unnamed calls still agree), and every rank's collective fails with
    "rank R: <kind> '<name>': <problem>". Waiting for the returned :class:`Refusal`
    raises that message as `error`. ``group_id``/``group_size``: the grouped allreduce
    it belongs to; ``process_set``: the set it runs on (None: the global set)."""
    core = _basics.core()
    pid, _ = _process_sets.resolve(process_set if process_set is not None else _scope.process_set)
    kname = KIND_NAMES[kind]
    if name is None:
        name = _naming.auto_name(kname, pid)
    hid = core.refuse(kind, name, f"{kname} '{name}': {problem}", group_id, group_size, process_set=pid)
    refused = Refusal(hid, kind, name, error)
    refused.process_set = pid
    return refused


def refuse(kind: int, name: str | None, problem: str,
           error: type[HvdliteError] = HvdliteError, process_set: Any = None) -> NoReturn:
    """Fail a collective that this rank cannot take part in, on every rank, and raise.

    For a front end whose own check of the caller's input failed (`problem` says what;
    see :func:`refusal`). Raises `error` (an :class:`HvdliteError` class; one that is
    also a TypeError, ValueError, ... where Horovod raises that type) with the message
    every rank gets, once the other ranks have submitted the collective."""
    refuse_all(kind, [name], [problem], error=error, process_set=process_set)


def refuse_all(kind: int, names: Sequence[str | None], problems: Sequence[str],
               group_id: int = -1, error: type[HvdliteError] = HvdliteError,
               process_set: Any = None) -> NoReturn:
    """:func:`refuse` for the requests that the other ranks submit together in one call
    (the members of a grouped allreduce, `group_id` from :func:`new_group_id`, or the
    requests of one call that are not an engine group): all are refused before any is
    waited for, since the other ranks may wait for them all and the coordinator
    answers a group only once it is whole. Raises every request's error, joined."""
    size = len(names) if group_id >= 0 else 0
    refused = [refusal(kind, name, problem, group_id, size, process_set=process_set)
               for name, problem in zip(names, problems)]
    messages = []
    for r in refused:
        try:
            r.wait()
        except HvdliteError as exc:
            messages.append(str(exc))
    raise error("; ".join(messages) or "; ".join(problems))


_Staged = TypeVar("_Staged")


def stage_or_refuse(kind: int, names: Sequence[str], inputs: Sequence[Any],
                    stage: Callable[[Any], _Staged], group_id: int = -1,
                    op: Any = None, process_set: Any = None) -> list[_Staged]:
    """``[stage(x) for x in inputs]`` for the inputs of one collective call, one
    request each (named `names`); if a local check fails, the whole call is refused on
    every rank and the error raised.

    `stage` turns a caller's input into what the front end submits, raising (TypeError,
    ValueError, NotImplementedError, ...) with the problem when it cannot. Only this
    rank sees that problem, while the others submit the same call. So every request
    of the call is refused (as one grouped allreduce when `group_id` >= 0) and the
    error raised here is the :class:`HvdliteError` that is also the check's type
    (:class:`HvdliteTypeError` for a TypeError, ...), naming the rank and the problem.
    With `op`, the reduce op is checked first (:func:`op_problem`)."""
    bad, problem, error = -1, "", HvdliteError
    if op is not None and (why := op_problem(op)) is not None:
        if not names:
            raise why[1](why[0])  # nothing to refuse: an empty call is empty everywhere
        bad, (problem, error) = 0, why
        problems = [problem] * len(names)
    else:
        staged: list[_Staged] = []
        for i, x in enumerate(inputs):
            try:
                staged.append(stage(x))
            except Exception as exc:  # noqa: BLE001 - any failure here would hang the others
                bad, problem, error = i, str(exc) or type(exc).__name__, refusal_error_for(exc)
                break
        if bad < 0:
            return staged
        problems = [problem if i == bad else f"member {bad} of its group: {problem}"
                    for i in range(len(names))]
    refuse_all(kind, names, problems, group_id, error, process_set=process_set)


def run(kind: int, tensor: Any, output: Any, dtype: str, *, name: str | None = None,
        op: int = Sum, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
        root_rank: int = -1, process_set: Any = None) -> None:
    """Run one request on arrays the caller owns and return when it is done: the
    blocking twin of :func:`submit`, for ALLREDUCE (into ``output``; in place when it
    is ``tensor``), BROADCAST (in place on ``tensor``) and BARRIER (``tensor`` None).
    Arrays are anything exporting a C-contiguous buffer (NumPy arrays); ``dtype`` is
    their element type's name. Raises :class:`HvdliteError` if the collective fails, or
    if an array is not C-contiguous (or not writable where it is written).

    One call into the engine instead of submit + wait: on a blocking call the Python
    work around the collective is most of hvdlite's cost over raw MPI.
    """
    pid = 0
    if process_set is None:
        process_set = _scope.process_set
    if process_set is not None:
        pid, root_rank = _process_sets.resolve(process_set, root_rank)
    core, name = _prepare(kind, name, dtype, op, pid)
    try:
        core.run(kind, name, tensor, output, DTYPES[dtype], op, float(prescale_factor),
                 float(postscale_factor), root_rank, pid)
    except RuntimeError as exc:
        raise_engine_error(exc)


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


EMPTY = RawTensor(0, "uint8", (0,))
