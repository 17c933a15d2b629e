"""Collectives on TensorFlow tensors: eagerly, inside ``tf.function`` (and Keras
``model.fit``), and in TensorFlow 1 graphs run by ``tf.compat.v1.Session``.

This module is the public API (Horovod's ``horovod.tensorflow.mpi_ops``): the
collectives, differentiable where Horovod's are, and the process-set helpers. Beneath
it, :mod:`hvdlite.tensorflow.eager` runs collectives eagerly,
:mod:`hvdlite.tensorflow.graph` inside graphs, and :mod:`hvdlite.tensorflow.errors`
gives failures TensorFlow's error classes.

Limits that follow from this design:

* XLA cannot compile hvdlite's ops (nor ``py_function``): do not use ``jit_compile=True`` on
  a function (or a Keras ``model.compile``) that contains hvdlite collectives. Keras 3's
  default ``jit_compile="auto"`` picks no XLA on CPU-only machines, and hvdlite makes it
  pick no XLA on GPU machines too when the optimizer is a ``DistributedOptimizer``.
* A graph containing hvdlite collectives can not be exported with ``tf.saved_model``
  for serving on a machine without hvdlite (its ops live in hvdlite's library); save
  the Keras model or its weights instead.
* Collectives inside one ``tf.function`` run in program order (they are stateful ops),
  so every rank must issue them in the same order, as with Horovod. Each is submitted
  when the one before it has completed; collectives that should travel together belong
  in one call (``grouped_allreduce``, ``grouped_allgather``, ...). In a ``Session`` graph
  no order is imposed, and none is needed.
* Tensors travel through host memory. hvdlite's ops have CPU kernels only: TensorFlow 2
  places them there by itself (soft placement), a TF1 ``Session`` that puts them on a
  GPU with ``tf.device`` needs ``ConfigProto(allow_soft_placement=True)``.
* A failed collective raises ``tf.errors.FailedPreconditionError`` (ranks disagreed, or
  another rank refused its input), ``InvalidArgumentError`` or ``UnimplementedError`` on
  the rank that refused its own input as a bad value or as something hvdlite lacks, and
  ``UnknownError`` once the engine has stopped; eagerly these are also
  :class:`HvdliteError` (and the TypeError, ValueError or NotImplementedError Horovod
  raises for such input), inside graphs they are TensorFlow's own classes. The message
  names the tensor and the ranks.
* Input that only this rank cannot use (a dtype that cannot be reduced, a 0-d tensor to
  gather, an op Horovod refuses, alltoall splits that do not fit) is refused on every
  rank, not raised here alone: the other ranks run the same batch and would wait for it
  (see :func:`_submit`, and ``RuntimeProblem`` in the graph op).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from hvdlite.common import basics as _basics
from hvdlite.common import ops as _ops
from hvdlite.common.codes import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 - Horovod's constants
from hvdlite.common import process_set_table as _process_set_table
from hvdlite.common.process_sets import global_process_set, resolve as _resolve_process_set  # noqa: F401 - re-exported
from hvdlite.common.exceptions import HvdliteError, HvdliteNotImplementedError, HvdliteValueError
from hvdlite.tensorflow.compression import Compression, Compressor
from hvdlite.tensorflow.eager import _Spec, _execute, _executing_eagerly, _no_autograph, _op_name, _tensor_of
from hvdlite.tensorflow.errors import _as_tf_error
from hvdlite.tensorflow.graph import _run

_resolve_op = _ops.resolve_op  # Horovod's rules for op= and the deprecated average=


def _reducescatter_problem(op: Any) -> dict[str, Any]:
    """The :class:`_Spec` fields that refuse a reducescatter with an op other than Sum
    or Average (on every rank: the others may have passed a supported op)."""
    if op in (Sum, Average):
        return {}
    return {"problem": f"reducescatter supports only Sum and Average, not {_ops.describe_op(op)}",
            "error": HvdliteNotImplementedError}


def _allreduce_dense(tensors: Sequence[tf.Tensor], names: Sequence[str], op: int,
                     prescale: float, postscale: float, grouped: bool) -> list[tf.Tensor]:
    """Allreduce of dense tensors in one batch, differentiable: the gradient is the same
    allreduce (op and scale factors) of the incoming gradient."""
    tensors = [_tensor_of(t) for t in tensors]

    @tf.custom_gradient
    def fn(*xs):
        specs = [_Spec(_ops.ALLREDUCE, nm, op, prescale, postscale, group=0 if grouped else -1)
                 for nm in names]
        ys = _run(specs, list(xs))

        def grad(*dys):
            dys = [tf.zeros_like(x) if dy is None else dy for x, dy in zip(xs, dys)]
            gnames = [_op_name("allreduce", f"{_plain(nm)}_grad") for nm in names]
            return _allreduce_dense(dys, gnames, op, prescale, postscale, grouped)

        return ys, _keeps_process_set(grad)

    out = fn(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _set_scope(process_set: Any) -> _ops.process_set_scope:
    """``_ops.process_set_scope(process_set)`` for a public TensorFlow function, with
    Horovod's TensorFlow errors: a set this rank is not a member of raises
    ``tf.errors.InvalidArgumentError`` (Horovod's ops refuse it so, eagerly and in
    graphs; here when the call is made or traced), which is also a ``ValueError`` and
    an :class:`HvdliteError`; so does a set that is not registered (Horovod raises
    ``ValueError`` for it). Nothing is submitted, so no other rank waits."""
    try:
        pid = getattr(process_set, "process_set_id", None)
        if (pid not in (None, 0) and isinstance(pid, int)
                and _process_set_table.members(pid) is None):
            raise HvdliteValueError(f"process set id {pid} is not registered on rank {_basics.rank()}: "
                                    "pass the set to hvd.init(process_sets=[...]) or hvd.add_process_set()")
        return _ops.process_set_scope(process_set)
    except HvdliteError as exc:
        error = exc
    raise _as_tf_error(error)


def _keeps_process_set(grad: Callable[..., Any]) -> Callable[..., Any]:
    """A custom gradient's function, run on the process set its forward ran on (the
    gradient is built later, outside the caller's ``process_set_scope``)."""
    process_set = _ops.current_process_set()

    def on_set(*dys: Any) -> Any:
        with _ops.process_set_scope(process_set):
            return grad(*dys)
    return on_set


def _plain(name: str) -> str:
    """Last component of an engine name, usable as a base for derived names."""
    return name.rsplit("/", 1)[-1]


@_no_autograph
def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "",
              device_sparse: str = "", compression: type[Compressor] = Compression.none,
              op: int | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None,
              process_set: Any = None, ignore_name_scope: bool = False) -> Any:
    """Reduce ``tensor`` over all ranks; every rank gets the result.

    ``op`` is ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``;
    ``prescale_factor``/``postscale_factor`` multiply the input before and the result
    after the reduction. A ``tf.IndexedSlices`` is combined with two allgathers (values
    and indices) instead, its values divided by the number of ranks for ``Average`` (true
    division: integer values give floats, as in Horovod); other ops and scale factors are
    refused for it with ``NotImplementedError``, on every rank and, in a graph, when the
    graph is built (as Horovod).
    ``tensor`` must have the same shape and dtype on every rank. Works eagerly and inside
    ``tf.function``; differentiable (the gradient is the same allreduce of the gradient).
    ``device_*`` are accepted for compatibility; tensors travel through host memory.
    """
    with _set_scope(process_set):
        op = _resolve_op(op, average)
        if isinstance(tensor, tf.IndexedSlices):
            return _allreduce_indexed_slices(tensor, op, prescale_factor, postscale_factor, name,
                                             ignore_name_scope)
        t = _tensor_of(tensor)
        compressed, ctx = compression.compress(t)
        nm = _op_name("allreduce", name, ignore_name_scope)
        reduced = _allreduce_dense([compressed], [nm], op, prescale_factor, postscale_factor, False)[0]
        return compression.decompress(reduced, ctx)


def _allreduce_indexed_slices(slices: tf.IndexedSlices, op: int, prescale: float,
                              postscale: float, name: str | None,
                              ignore_name_scope: bool) -> tf.IndexedSlices:
    base = name or "indexed_slices"
    problem = None
    if op not in (Average, Sum):
        problem = f"allreduce of tf.IndexedSlices supports only Average and Sum, not {_ops.describe_op(op)}"
    elif prescale != 1.0 or postscale != 1.0:
        problem = "allreduce of tf.IndexedSlices takes no prescale_factor or postscale_factor"
    if problem is not None:
        # Refused as the first of the two allgathers the other ranks run, so that a rank
        # alone in passing this fails them too, and raised here, also while a graph is
        # built (Horovod raises NotImplementedError there): the refusal goes through the
        # engine at once, and a rank whose graph holds the allgather meets it when it runs.
        nm = _op_name("allgather", f"{base}.values" if name else None, ignore_name_scope)
        _execute([_Spec(_ops.ALLGATHER, nm, problem=problem, error=HvdliteNotImplementedError)], [None])
        raise AssertionError("a refused request returned")  # _execute raised
    values = allgather(slices.values, name=f"{base}.values" if name else None,
                       ignore_name_scope=ignore_name_scope)
    indices = allgather(slices.indices, name=f"{base}.indices" if name else None,
                        ignore_name_scope=ignore_name_scope)
    if op == Average:
        # True division, as Horovod: integer values average to floats (float32 for 8 and
        # 16 bits, float64 for 32 and 64), not to zeros.
        values = tf.math.truediv(values, _ops.current_size())
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


@_no_autograph
def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: type[Compressor] = Compression.none, op: int | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: Any = None, ignore_name_scope: bool = False,
                      name: str | None = None) -> list[Any]:
    """Allreduce a list of tensors as one group: the engine negotiates and fuses them
    together. Same arguments (in Horovod's order) and result per tensor as
    :func:`allreduce`."""
    with _set_scope(process_set):
        op = _resolve_op(op, average)
        tensors = list(tensors)
        if not tensors:
            return []
        results: list[Any] = [None] * len(tensors)
        dense_idx = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
        base = name or "grouped_allreduce"
        for i, t in enumerate(tensors):
            if isinstance(t, tf.IndexedSlices):
                results[i] = _allreduce_indexed_slices(t, op, prescale_factor, postscale_factor,
                                                       f"{base}.{i}" if name else None, ignore_name_scope)
        if dense_idx:
            comp = [compression.compress(_tensor_of(tensors[i])) for i in dense_idx]
            if _executing_eagerly():
                stem = name if name is not None else _ops.auto_name("grouped_allreduce")
                names = [f"{stem}.{k}" for k in range(len(dense_idx))]
            else:
                names = [_op_name("allreduce", f"{base}.{k}", ignore_name_scope)
                         for k in range(len(dense_idx))]
            reduced = _allreduce_dense([c for c, _ in comp], names, op, prescale_factor,
                                       postscale_factor, True)
            for k, i in enumerate(dense_idx):
                results[i] = compression.decompress(reduced[k], comp[k][1])
        return results


@_no_autograph
def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: Any = None) -> tf.Tensor:
    """Concatenate ``tensor`` from every rank along dimension 0 (rank order). The first
    dimension may differ between ranks, the others must agree. Differentiable: the
    gradient is the rank's own slice of the gradient averaged over ranks (Horovod's rule).
    Tensors of types the engine cannot reduce (bool, int16, complex...) are moved as bytes.
    """
    with _set_scope(process_set):
        t = _tensor_of(tensor)
        nm = _op_name("allgather", name, ignore_name_scope)

        @tf.custom_gradient
        def fn(x):
            y = _run([_Spec(_ops.ALLGATHER, nm)], [x])[0]

            def grad(dy):
                avg = allreduce(dy, op=Average, name=f"{_plain(nm)}_grad",
                                ignore_name_scope=True)
                d0 = tf.reshape(tf.shape(x, out_type=tf.int64)[0], [1])
                sizes = allgather(d0, name=f"{_plain(nm)}_grad_sizes",
                                  ignore_name_scope=True)
                n = _ops.current_size()
                return tf.split(avg, tf.reshape(sizes, [n]), num=n, axis=0)[_ops.current_rank()]

            return y, _keeps_process_set(grad)

        if not t.dtype.is_floating:
            return _run([_Spec(_ops.ALLGATHER, nm)], [t])[0]
        return fn(t)


@_no_autograph
def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      ignore_name_scope: bool = False,
                      process_set: Any = None) -> list[tf.Tensor]:
    """Allgather several tensors in one batch; differentiable like :func:`allgather` when
    every tensor is floating point (the gradients are averaged in one grouped allreduce)."""
    with _set_scope(process_set):
        ts = [_tensor_of(t) for t in tensors]
        if not ts:
            return []
        base = name or "grouped_allgather"
        names = [_op_name("allgather", f"{base}.{i}" if (name or not _executing_eagerly()) else None,
                          ignore_name_scope) for i in range(len(ts))]
        if not all(t.dtype.is_floating for t in ts):
            return _run([_Spec(_ops.ALLGATHER, n) for n in names], ts)

        @tf.custom_gradient
        def fn(*xs):
            ys = _run([_Spec(_ops.ALLGATHER, n) for n in names], list(xs))

            def grad(*dys):
                stem = _plain(names[0])
                avg = grouped_allreduce(list(dys), op=Average, name=f"{stem}_grad",
                                        ignore_name_scope=True)
                d0 = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in xs])
                sizes = allgather(tf.reshape(d0, [1, len(xs)]), name=f"{stem}_grad_sizes",
                                  ignore_name_scope=True)  # [ranks, tensors]
                n, r = _ops.current_size(), _ops.current_rank()
                return [tf.split(a, sizes[:, i], num=n, axis=0)[r] for i, a in enumerate(avg)]

            return ys, _keeps_process_set(grad)

        return fn(*ts)


@_no_autograph
def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              ignore_name_scope: bool = False, process_set: Any = None) -> tf.Tensor:
    """Return ``root_rank``'s value of ``tensor`` on every rank (shape and dtype must
    agree). Differentiable: the root's gradient is the average of all ranks' gradients,
    the others' is zero (Horovod's rule)."""
    with _set_scope(process_set):
        t = _tensor_of(tensor)
        nm = _op_name("broadcast", name, ignore_name_scope)
        root = int(root_rank)

        @tf.custom_gradient
        def fn(x):
            y = _run([_Spec(_ops.BROADCAST, nm, root=root)], [x])[0]

            def grad(dy):
                avg = allreduce(dy, op=Average, name=f"{_plain(nm)}_grad",
                                ignore_name_scope=True)
                return avg if _basics.rank() == root else avg * 0  # a world rank, as root is

            return y, _keeps_process_set(grad)

        if not t.dtype.is_floating:
            return _run([_Spec(_ops.BROADCAST, nm, root=root)], [t])[0]
        return fn(t)


@_no_autograph
def broadcast_(variables: Sequence[Any], root_rank: int, name: str | None = None,
               process_set: Any = None) -> list[tf.Tensor]:
    """Broadcast variables in place from ``root_rank``: one batch for all of them, then
    each variable is assigned the root's value. Returns the new values."""
    with _set_scope(process_set):
        variables = list(variables)
        if not variables:
            return []
        values = [_tensor_of(v) for v in variables]
        base = name or "broadcast_"
        if _executing_eagerly():
            names = [_op_name("broadcast", None) if name is None else f"{base}.{i}"
                     for i in range(len(values))]
        else:
            names = [_op_name("broadcast", f"{base}.{i}") for i in range(len(values))]
        new = _run([_Spec(_ops.BROADCAST, n, root=int(root_rank)) for n in names], values)
        assigned = [v.assign(x) for v, x in zip(variables, new)]
        if _executing_eagerly():
            return new
        # In a TF1 graph nothing runs an op that nothing needs: the values returned depend
        # on the assignments (inside tf.function they run anyway, as stateful ops).
        deps = [a if isinstance(a, tf.Operation) else a.op for a in assigned
                if isinstance(a, tf.Operation) or isinstance(getattr(a, "op", None), tf.Operation)]
        with tf.control_dependencies(deps):
            return [tf.identity(x) for x in new]


@_no_autograph
def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             ignore_name_scope: bool = False, process_set: Any = None) -> Any:
    """Send slice ``i`` of ``tensor`` (along dimension 0) to rank ``i`` and concatenate
    what every rank sent here. ``splits`` lists the rows for each rank; without it dim 0
    is divided evenly (it must be divisible by the number of ranks). Returns the tensor,
    and, when ``splits`` was given, also the received splits (as Horovod does).
    Differentiable: the gradient is the reverse alltoall."""
    with _set_scope(process_set):
        t = _tensor_of(tensor)
        nm = _op_name("alltoall", name, ignore_name_scope)
        split_t, refused = None, {}
        if splits is not None:
            try:
                split_t = tf.cast(_tensor_of(splits), tf.int32)
            except Exception as exc:  # noqa: BLE001 - refused on every rank, when it runs
                refused = {"problem": f"splits must be integers ({exc})", "error": HvdliteValueError}

        def run(x):
            return _run([_Spec(_ops.ALLTOALL, nm, **refused)], [x], [split_t])[0]

        if t.dtype.is_floating and not refused:
            @tf.custom_gradient
            def fn(x):
                y, recv = run(x)

                def grad(dy, *unused):
                    back, _ = alltoall(dy, splits=recv, name=f"{_plain(nm)}_grad",
                                       ignore_name_scope=True)
                    return back

                return (y, recv), _keeps_process_set(grad)

            y, recv = fn(t)
        else:
            y, recv = run(t)
        return (y, recv) if splits is not None else y


@_no_autograph
def reducescatter(tensor: Any, device_dense: str = "",
                  compression: type[Compressor] = Compression.none, op: int = Average,
                  name: str | None = None, process_set: Any = None,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce ``tensor`` over ranks (``Sum`` or ``Average``) and give each rank a block of
    rows of the result: rank ``r`` gets ``dim0 // size`` rows, plus one if
    ``r < dim0 % size``. Differentiable, with Horovod's convention: the gradient is the
    allgather of the gradient, times the number of ranks for ``Sum`` (in line with
    allreduce's gradient, which sums over the ranks), and times the scale factors."""
    with _set_scope(process_set):
        refused = _reducescatter_problem(op)
        t = _tensor_of(tensor)
        compressed, ctx = compression.compress(t)
        nm = _op_name("reducescatter", name, ignore_name_scope)

        def run(x):
            return _run([_Spec(_ops.REDUCESCATTER, nm, op, prescale_factor, postscale_factor,
                               **refused)], [x])[0]

        if compressed.dtype.is_floating and not refused:
            @tf.custom_gradient
            def fn(x):
                y = run(x)

                def grad(dy):
                    g = allgather(dy, name=f"{_plain(nm)}_grad",
                                  ignore_name_scope=True)
                    scale = prescale_factor * postscale_factor * (1 if op == Average else _ops.current_size())
                    return g * tf.cast(scale, g.dtype) if scale != 1.0 else g

                return y, _keeps_process_set(grad)

            out = fn(compressed)
        else:
            out = run(compressed)
        return compression.decompress(out, ctx)


@_no_autograph
def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: type[Compressor] = Compression.none, op: int = Average,
                          process_set: Any = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0, name: str | None = None,
                          ignore_name_scope: bool = False) -> list[tf.Tensor]:
    """Reducescatter several tensors in one batch; differentiable like :func:`reducescatter`
    when every tensor is floating point (the gradients are allgathered in one batch). The
    arguments up to ``postscale_factor`` are Horovod's, in its order; ``name`` is
    hvdlite's."""
    with _set_scope(process_set):
        refused = _reducescatter_problem(op)
        comp = [compression.compress(_tensor_of(t)) for t in tensors]
        if not comp:
            return []
        base = name or "grouped_reducescatter"
        names = [_op_name("reducescatter", f"{base}.{i}" if (name or not _executing_eagerly()) else None,
                          ignore_name_scope) for i in range(len(comp))]

        def run(xs):
            return _run([_Spec(_ops.REDUCESCATTER, n, op, prescale_factor, postscale_factor,
                               **refused) for n in names], list(xs))

        if all(c.dtype.is_floating for c, _ in comp) and not refused:
            @tf.custom_gradient
            def fn(*xs):
                ys = run(xs)

                def grad(*dys):
                    gs = grouped_allgather(list(dys), name=f"{_plain(names[0])}_grad",
                                           ignore_name_scope=True)
                    scale = prescale_factor * postscale_factor * (1 if op == Average else _ops.current_size())
                    return [g * tf.cast(scale, g.dtype) if scale != 1.0 else g for g in gs]

                return ys, _keeps_process_set(grad)

            outs = fn(*[c for c, _ in comp])
        else:
            outs = run([c for c, _ in comp])
        return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, comp)]


@_no_autograph
def barrier(process_set: Any = None) -> None:
    """Block until every rank has reached this barrier (inside ``tf.function`` the
    barrier is an op that runs in program order)."""
    with _set_scope(process_set):
        _run([_Spec(_ops.BARRIER, _op_name("barrier", None))], [None])


@_no_autograph
def join() -> tf.Tensor:
    """Declare that this rank has no more data. Until every rank has joined, collectives
    issued by the others proceed with this rank contributing nothing (zeros to
    allreduce). Returns (int32 scalar tensor) the rank that joined last."""
    return _run([_Spec(_ops.JOIN, _op_name("join", None))], [None])[0]


@_no_autograph
def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The number of ranks of process set ``process_set_id`` (0: the global set) as an
    int32 tensor."""
    return tf.constant(len(_set_members(process_set_id)), tf.int32, name=name)


@_no_autograph
def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 (int32) when this rank belongs to process set ``process_set_id``, else 0."""
    return tf.constant(int(_basics.rank() in _set_members(process_set_id)), tf.int32, name=name)


def _set_members(process_set_id: int) -> list[int]:
    """The world ranks of a registered process set (ValueError if there is none)."""
    if process_set_id == 0:
        return list(range(_basics.size()))  # raises NotInitializedError before init()
    ranks = _process_set_table.members(process_set_id)
    if ranks is None:
        raise ValueError(f"process set id {process_set_id} is not registered")
    return ranks


def check_process_set(process_set: Any, members_only: bool = True) -> None:
    """Raise unless this process can run collectives on `process_set` (a registered set
    it is a member of; None or the global set always), as :func:`_set_scope` does.
    With ``members_only=False`` a registered set this rank is not in passes too."""
    if not members_only and outside_of(process_set):
        return
    with _set_scope(process_set):
        pass


def outside_of(process_set: Any) -> bool:
    """True when `process_set` is a registered set (not the global one) that this rank
    is not a member of."""
    pid = getattr(process_set, "process_set_id", None)
    if not isinstance(process_set, _process_set_table.ProcessSet) or pid in (None, 0):
        return False
    ranks = _process_set_table.members(pid)
    return ranks is not None and _basics.rank() not in ranks


@_no_autograph
def rank_op(name: str | None = None) -> tf.Tensor:
    """This rank as an int32 tensor."""
    return tf.constant(_basics.rank(), tf.int32, name=name)


@_no_autograph
def local_size_op(name: str | None = None) -> tf.Tensor:
    """The number of ranks on this host as an int32 tensor."""
    return tf.constant(_basics.local_size(), tf.int32, name=name)


@_no_autograph
def local_rank_op(name: str | None = None) -> tf.Tensor:
    """This rank's index on its host as an int32 tensor."""
    return tf.constant(_basics.local_rank(), tf.int32, name=name)
