"""Inside a graph a collective is an op of hvdlite's own, ``HvdliteCollectives``, from a
small library that is compiled against the installed TensorFlow the first time a
process needs it and then cached (:mod:`hvdlite.tensorflow._kernels`; installing hvdlite
compiles nothing against TensorFlow). The op is asynchronous: it submits its requests
to the engine and returns, and it completes from a callback once the engine has
finished them, without ever blocking one of TensorFlow's threads. That matters because
TensorFlow runs independent ops in whatever order its executor picks, differently on
each rank: a graph of 20 independent allreduces run by a ``Session`` with one inter-op
thread used to deadlock at once on 2 ranks when each collective blocked its thread (each
rank waited in a different one). Now all of them are in flight together and the engine
matches them by name. Several collectives of one call (a grouped allreduce, the two
allgathers of an ``IndexedSlices``) share one op, so the engine sees them together and
fuses them. Allreduce results are written straight into the op's output (in place when
TensorFlow lets the input go); allgather, alltoall and reducescatter results, whose size
is known only after negotiation, are copied once into the output. The op fails with
TensorFlow's error codes, as Horovod's ops do (see :class:`_TFError`, :func:`_tf_code`).

``DistributedGradientTape`` and the Keras ``DistributedOptimizer`` can go one step
further inside graphs: gradients are submitted in buckets (``HVDLITE_TF_BUCKET_BYTES``; 0 =
one bucket), last layer first, each by a small ``HvdliteSubmit`` op that returns a ticket
at once, and a single asynchronous ``HvdliteWait`` op at the end collects all of them.
``hvdlite.tensorflow.overlap`` adds control edges that make TensorFlow run each submit as
soon as its bucket's gradients exist, before the rest of the backward pass, so that
communication overlaps it; by default only where a rank has a core to spare for
communication and TensorFlow several inter-op threads, elsewhere the whole step's
gradients go out in one batch after the backward pass (see ``gradients.bucket_bytes`` and
``overlap.enabled``).

Where hvdlite's graph ops cannot be used, a graph runs the eager path's code
(:mod:`hvdlite.tensorflow.eager`) inside one blocking ``tf.py_function`` op per batch
instead. That happens, with one warning per process, when the ops' library cannot be
built (no C++ compiler, no TensorFlow headers) or ``HVDLITE_TF_KERNEL=0`` is set, and,
without a warning, for a tensor whose element type the ops do not take
(:data:`_KERNEL_DTYPES`; ``tf.string``, for example). It works in ``tf.function``
(collectives run in program order there), but a ``Session`` graph with several
independent collectives can deadlock, and a failed collective arrives as
``tf.errors.UnknownError``.
"""
from __future__ import annotations

import itertools
import struct
import threading
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from hvdlite.common import ops as _ops
from hvdlite.common.handles import Handle
from hvdlite.common.process_sets import resolve as _resolve_process_set
from hvdlite.common.exceptions import HvdliteError
from hvdlite.tensorflow.eager import (_REDUCIBLE, _Spec, _check_not_xla, _execute, _executing_eagerly,
                                      _finish, _no_autograph, _np_to_tf, _submit, _to_numpy)
from hvdlite.tensorflow.errors import _as_tf_error, _tf_code

# Element types hvdlite's graph ops take (the engine's, and others moved as bytes by
# allgather, alltoall and broadcast). Anything else goes through the py_function path.
_KERNEL_DTYPES = frozenset((tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.uint8,
                            tf.int16, tf.uint16, tf.int32, tf.uint32, tf.int64, tf.uint64,
                            tf.bool, tf.complex64, tf.complex128))


def _graph_ops(tensors: Sequence[tf.Tensor | None]) -> Any:
    """hvdlite's graph ops, if they can take `tensors`; None for the py_function path."""
    if any(t is not None and t.dtype not in _KERNEL_DTYPES for t in tensors):
        return None
    from hvdlite.tensorflow import _kernels
    return _kernels.library()


def _float_bits(x: float) -> int:
    """A float64 as the int64 with the same bits: TensorFlow's float attributes are
    float32, and a scale factor must reach the engine exactly as eagerly."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _static_problem(spec: _Spec, t: tf.Tensor | None) -> tuple[str, int]:
    """What :func:`_problem` finds when the graph is traced (the dtype, the op, a rank
    that is known), as the problem and TensorFlow's error code; ("", 0) if nothing. The
    graph op checks what only the running tensor shows (``RuntimeProblem``)."""
    if spec.problem is not None:
        return spec.problem, _tf_code(spec.error)
    kind = spec.kind
    if kind in (_ops.BARRIER, _ops.JOIN) or t is None:
        return "", 0
    if kind in (_ops.ALLREDUCE, _ops.REDUCESCATTER):
        dname = t.dtype.name
        if dname not in _REDUCIBLE:
            return (f"dtype {dname} cannot be reduced; supported: {', '.join(_ops.DTYPES)}",
                    _tf_code(HvdliteError))
        why = _ops.op_problem(spec.op)
        if why is not None:
            return why[0], _tf_code(why[1])
    if kind in (_ops.REDUCESCATTER, _ops.ALLGATHER, _ops.ALLTOALL) and t.shape.rank == 0:
        return "needs a tensor of rank >= 1", _tf_code(HvdliteError)
    return "", 0


def _batch_attrs(specs: Sequence[_Spec], tensors: Sequence[tf.Tensor | None]) -> dict[str, Any]:
    """The attributes that describe a batch of requests to hvdlite's graph ops."""
    problems = [_static_problem(spec, t) for spec, t in zip(specs, tensors)]
    process_set = _ops.current_process_set()
    pid = 0 if process_set is None else _resolve_process_set(process_set)[0]
    # Roots are world ranks (Horovod's); the engine of a set counts its own ranks.
    roots = [s.root if pid == 0 or s.root < 0 else _resolve_process_set(process_set, s.root)[1]
             for s in specs]
    return {
        "process_set": pid,
        "kinds": [s.kind for s in specs],
        "names": [s.name for s in specs],
        "reduce_ops": [int(s.op) if _ops.op_problem(s.op) is None else -1 for s in specs],
        "scale_bits": [b for s in specs for b in (_float_bits(s.prescale), _float_bits(s.postscale))],
        "roots": roots,
        "groups": [s.group for s in specs],
        "dtype_codes": [-1 if t is None else _ops.DTYPES.get(t.dtype.name, -1) for t in tensors],
        "problems": [p for p, _ in problems],
        "problem_codes": [c for _, c in problems],
    }


def _set_result_shapes(specs: Sequence[_Spec], tensors: Sequence[tf.Tensor | None],
                       outs: Sequence[tf.Tensor]) -> list[Any]:
    """The results of a batch from the graph op's outputs, with the shapes known when
    the graph is traced (see :func:`_run`)."""
    results: list[Any] = []
    k = 0
    for spec, t in zip(specs, tensors):
        if spec.kind in (_ops.BARRIER, _ops.JOIN):
            o = outs[k]
            o.set_shape([])
            results.append(o if spec.kind == _ops.JOIN else None)
            k += 1
        elif spec.kind == _ops.ALLTOALL:
            o, rs = outs[k], outs[k + 1]
            o.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]))
            rs.set_shape([None])
            results.append((o, rs))
            k += 2
        else:
            o = outs[k]
            if spec.kind in (_ops.ALLREDUCE, _ops.BROADCAST):
                o.set_shape(t.shape)
            else:
                o.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]))
            results.append(o)
            k += 1
    return results


def _run_in_graph_op(lib: Any, specs: Sequence[_Spec], tensors: Sequence[tf.Tensor | None],
                     splits: Sequence[tf.Tensor | None] | None) -> list[Any]:
    """A batch of requests as one ``HvdliteCollectives`` op (asynchronous: it submits
    every request and finishes when all have, without holding a TensorFlow thread)."""
    inputs: list[tf.Tensor] = []
    input_index: list[int] = []
    splits_index: list[int] = []
    for i, t in enumerate(tensors):
        input_index.append(-1 if t is None else len(inputs))
        if t is not None:
            inputs.append(t)
        s = None if splits is None else splits[i]
        splits_index.append(-1 if s is None else len(inputs))
        if s is not None:
            inputs.append(tf.cast(s, tf.int32))
    tout: list[tf.DType] = []
    for spec, t in zip(specs, tensors):
        if spec.kind in (_ops.BARRIER, _ops.JOIN):
            tout.append(tf.int32)
        elif spec.kind == _ops.ALLTOALL:
            tout.extend([t.dtype, tf.int32])
        else:
            tout.append(t.dtype)
    outs = lib.ops.hvdlite_collectives(inputs, Tout=tout, input_index=input_index,
                                       splits_index=splits_index, name="hvdlite_collectives",
                                       **_batch_attrs(specs, tensors))
    return _set_result_shapes(specs, tensors, list(outs))


@_no_autograph
def _run(specs: Sequence[_Spec], tensors: Sequence[tf.Tensor],
         splits: Sequence[tf.Tensor | None] | None = None) -> list[Any]:
    """Execute a batch of requests on TensorFlow tensors. Returns per request: a tensor,
    ``(tensor, received_splits)`` for alltoall, an int32 scalar tensor for join, None for
    barrier. Inside a graph the whole batch is one ``tf.py_function`` op."""
    n = len(specs)
    if _executing_eagerly():
        arrays = [None if t is None else _to_numpy(t) for t in tensors]
        split_arrays = None if splits is None else [None if s is None else _to_numpy(s) for s in splits]
        results = _execute(specs, arrays, split_arrays)
        return [_result_to_tf(spec, r) for spec, r in zip(specs, results)]

    _check_not_xla()
    lib = _graph_ops(tensors)
    if lib is not None:
        return _run_in_graph_op(lib, specs, tensors, splits)

    # Fallback: one py_function for the whole batch.
    inputs: list[tf.Tensor] = []
    input_index: list[int | None] = []
    split_index: list[int | None] = []
    for i in range(n):
        t = tensors[i]
        if t is None:
            input_index.append(None)
        else:
            input_index.append(len(inputs))
            inputs.append(t)
        s = None if splits is None else splits[i]
        if s is None:
            split_index.append(None)
        else:
            split_index.append(len(inputs))
            inputs.append(tf.cast(s, tf.int32))
    tout: list[tf.DType] = []
    for i, spec in enumerate(specs):
        if spec.kind == _ops.BARRIER:
            tout.append(tf.int32)
        elif spec.kind == _ops.JOIN:
            tout.append(tf.int32)
        elif spec.kind == _ops.ALLTOALL:
            tout.extend([tensors[i].dtype, tf.int32])
        else:
            tout.append(tensors[i].dtype)

    process_set = _ops.current_process_set()  # the py_function runs later, outside the scope

    def body(*ts):
        arrays = [None if k is None else _to_numpy(ts[k]) for k in input_index]
        split_arrays = [None if k is None else _to_numpy(ts[k]) for k in split_index]
        with _ops.process_set_scope(process_set):
            results = _execute(specs, arrays, split_arrays)
        flat: list[tf.Tensor] = []
        for spec, r in zip(specs, results):
            if spec.kind == _ops.BARRIER:
                flat.append(tf.constant(0, tf.int32))
            elif spec.kind == _ops.JOIN:
                flat.append(tf.constant(int(r), tf.int32))
            elif spec.kind == _ops.ALLTOALL:
                flat.extend([_np_to_tf(r[0]), tf.constant(r[1], tf.int32)])
            else:
                flat.append(_np_to_tf(r))
        return flat

    outs = tf.py_function(body, inputs, tout, name="hvdlite_collectives")
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    return _set_result_shapes(specs, tensors, list(outs))


# Requests submitted by one py_function and waited for by a later one (see _run_buckets).
_tickets: dict[int, Handle] = {}
_ticket_lock = threading.Lock()
_ticket_counter = itertools.count(1)


def _drain_tickets() -> None:
    """Wait for (and forget) every ticket still open: after a failed step nothing will."""
    with _ticket_lock:
        open_tickets = list(_tickets.values())
        _tickets.clear()
    for p in open_tickets:
        try:
            _finish(p)
        except Exception:
            pass


@_no_autograph
def _run_buckets(buckets: Sequence[tuple[Sequence[_Spec], Sequence[tf.Tensor]]],
                 order: Callable[[Sequence[Sequence[tf.Tensor]], Sequence[Any]], Any] | None = None
                 ) -> list[list[tf.Tensor]]:
    """Inside a graph: one small "submit" op per bucket and one "wait" op for all of them.

    A submit op needs only its own bucket's tensors, so TensorFlow may run it as soon as
    they exist, and the engine communicates them in the background; ``order`` (called
    with each bucket's tensors and the submit ops, e.g.
    :func:`hvdlite.tensorflow.overlap.submit_during_backward`) can make it do so before
    the rest of the backward pass. The wait op then collects every result. Only
    ALLREDUCE and ALLGATHER requests. Eagerly the buckets simply run one after the
    other, each submitted whole before any wait."""
    if _executing_eagerly():
        return [_run(specs, tensors) for specs, tensors in buckets]
    _check_not_xla()
    lib = _graph_ops([t for _, tensors in buckets for t in tensors])
    if lib is not None:
        return _run_buckets_in_graph_ops(lib, buckets, order)
    tickets = []
    process_set = _ops.current_process_set()  # the py_functions run later, outside the scope
    for specs, tensors in buckets:
        def submit_body(*ts, specs=specs):
            with _ops.process_set_scope(process_set):
                pending = _submit(specs, [_to_numpy(t) for t in ts])
            if pending.submit_error is not None:
                _drain_tickets()
                _finish(pending)  # raises the submit error after the rest completed
            pending.keepalive = ts  # the tensors' memory must outlive the requests
            ticket = next(_ticket_counter)
            with _ticket_lock:
                _tickets[ticket] = pending
            return np.int64(ticket)
        tickets.append(tf.py_function(submit_body, list(tensors), tf.int64, name="hvdlite_submit"))
    if order is not None:  # e.g. overlap.submit_during_backward
        order([tensors for _, tensors in buckets], [t.op for t in tickets])

    tout = [t.dtype for _, tensors in buckets for t in tensors]

    def wait_body(*ticket_values):
        first_error: BaseException | None = None
        flat: list[tf.Tensor] = []
        for tv in ticket_values:
            with _ticket_lock:
                pending = _tickets.pop(int(tv), None)
            if pending is None:
                raise _as_tf_error(HvdliteError("hvdlite: a collective's results were lost (step aborted?)"))
            try:
                flat.extend(_np_to_tf(r) for r in _finish(pending))
            except BaseException as exc:
                if first_error is None:
                    first_error = exc
        if first_error is not None:
            raise first_error
        return flat

    outs = tf.py_function(wait_body, tickets, tout, name="hvdlite_wait")
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    results: list[list[tf.Tensor]] = []
    k = 0
    for specs, tensors in buckets:
        part = []
        for spec, t in zip(specs, tensors):
            o = outs[k]
            k += 1
            if spec.kind == _ops.ALLREDUCE:
                o.set_shape(t.shape)
            else:
                o.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]))
            part.append(o)
        results.append(part)
    return results


def _run_buckets_in_graph_ops(lib: Any, buckets: Sequence[tuple[Sequence[_Spec], Sequence[tf.Tensor]]],
                              order: Callable[[Sequence[Sequence[tf.Tensor]], Sequence[Any]], Any] | None
                              ) -> list[list[tf.Tensor]]:
    """:func:`_run_buckets` with hvdlite's graph ops: an ``HvdliteSubmit`` op per bucket
    (it submits and returns a ticket at once) and one asynchronous ``HvdliteWait``."""
    tickets = [lib.ops.hvdlite_submit(list(tensors), name="hvdlite_submit", **_batch_attrs(specs, tensors))
               for specs, tensors in buckets]
    if order is not None:  # e.g. overlap.submit_during_backward
        order([tensors for _, tensors in buckets], [t.op for t in tickets])
    tout = [t.dtype for _, tensors in buckets for t in tensors]
    outs = list(lib.ops.hvdlite_wait(tickets, Tout=tout, name="hvdlite_wait"))
    results: list[list[tf.Tensor]] = []
    k = 0
    for specs, tensors in buckets:
        results.append(_set_result_shapes(specs, tensors, outs[k:k + len(specs)]))
        k += len(specs)
    return results


def _result_to_tf(spec: _Spec, r: Any) -> Any:
    if spec.kind == _ops.BARRIER:
        return None
    if spec.kind == _ops.JOIN:
        return tf.constant(int(r), tf.int32)
    if spec.kind == _ops.ALLTOALL:
        return _np_to_tf(r[0]), tf.constant(r[1], tf.int32)
    return _np_to_tf(r)
