"""Averaging gradients over ranks: ``DistributedGradientTape`` and the shared helper the
Keras ``DistributedOptimizer`` uses too."""
from __future__ import annotations

import functools
import os
from typing import Any, Sequence

import tensorflow as tf

from hvdlite.common import ops as _ops
from hvdlite.common.discovery import in_elastic_job
from hvdlite.tensorflow import mpi_ops as _mpi
from hvdlite.tensorflow import overlap as _overlap
from hvdlite.tensorflow.compression import Compression, Compressor
from hvdlite.tensorflow.eager import _Spec, _op_name, _tensor_of
from hvdlite.tensorflow.graph import _run, _run_buckets
from hvdlite.tensorflow.mpi_ops import Average, Sum

_no_autograph = tf.autograph.experimental.do_not_convert  # our ops are not user code


def _group_index(n_dense: int, dense_vars: Sequence[Any] | None, groups: Any) -> list[int]:
    """Local group index (-1: no group) for each dense gradient."""
    if groups is None or (isinstance(groups, int) and groups <= 0):
        return [-1] * n_dense
    if isinstance(groups, int):
        k = min(groups, n_dense)
        # contiguous chunks of nearly equal length, as Horovod splits the list
        base, extra = divmod(n_dense, k)
        out: list[int] = []
        for g in range(k):
            out.extend([g] * (base + (1 if g < extra else 0)))
        return out
    if dense_vars is None:
        raise ValueError("groups given as lists of variables need the variables of the gradients")
    membership: dict[int, int] = {}
    for g, members in enumerate(groups):
        for v in members:
            membership[id(v)] = g
    next_group = len(groups)
    out = []
    for v in dense_vars:
        g = membership.get(id(v))
        if g is None:  # a variable in no list forms a group of its own
            g = next_group
            next_group += 1
        out.append(g)
    return out


_GRADIENT_OPS = (Average, Sum, _ops.Min, _ops.Max, _ops.Product, _ops.Adasum)

_DEFAULT_BUCKET_BYTES = 1 << 20
_OVERLAP_BUCKET_BYTES = 4 << 20


def bucket_bytes() -> int:
    """Bytes per submit bucket inside graphs (``HVDLITE_TF_BUCKET_BYTES``; 0 submits a
    whole step's gradients at once, after the backward pass). hvdlite addition.

    Default with a single inter-op thread: 4 MiB where buckets are submitted during the
    backward pass (:func:`hvdlite.tensorflow.overlap.enabled`), each bucket costing a
    submit op on the thread that computes (0.2-0.3 ms as a ``py_function`` on the 2-core
    test host; hvdlite's own ``HvdliteSubmit`` op costs less); otherwise 0, since that
    thread's executor would run every submit after the backward pass anyway and each
    extra op would only cost time. With more inter-op
    threads, 1 MiB: an idle thread runs a bucket's submit as soon as it is ready."""
    value = os.environ.get("HVDLITE_TF_BUCKET_BYTES")
    if value is not None:
        try:
            return int(value)
        except ValueError:
            pass
    if tf.config.threading.get_inter_op_parallelism_threads() == 1:
        return _OVERLAP_BUCKET_BYTES if _overlap.enabled() else 0
    return _DEFAULT_BUCKET_BYTES


def _nbytes(t: tf.Tensor, limit: int) -> int:
    n = t.shape.num_elements()
    return limit if n is None else n * t.dtype.size


def _buckets(specs: Sequence[Any], inputs: Sequence[tf.Tensor], owner: Sequence[int],
             limit: int) -> list[list[int]]:
    """Request indices split into buckets, last gradient first (the order in which the
    backward pass produces them): consecutive gradients fill a bucket up to ``limit``
    bytes; a gradient never spans buckets; the members of one group share a bucket."""
    by_grad: dict[int, list[int]] = {}
    for j, i in enumerate(owner):
        by_grad.setdefault(i, []).append(j)
    grouped = any(s.group >= 0 for s in specs)
    buckets: list[list[int]] = []
    if grouped:
        emitted: set[int] = set()
        for i in sorted(by_grad, reverse=True):
            g = specs[by_grad[i][0]].group
            if g < 0:
                buckets.append(by_grad[i])
            elif g not in emitted:
                emitted.add(g)
                buckets.append([j for j, s in enumerate(specs) if s.group == g])
        return buckets
    current: list[int] = []
    size = 0
    for i in sorted(by_grad, reverse=True):
        current.extend(by_grad[i])
        size += sum(_nbytes(inputs[j], limit) for j in by_grad[i])
        if size >= limit:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


@_no_autograph
def allreduce_gradients(grads: Sequence[Any], variables: Sequence[Any] | None = None, *,
                        op: int = Average, compression: type[Compressor] = Compression.none,
                        sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                        groups: Any = None, name: str = "gradient") -> list[Any]:
    """Combine a list of gradients over ranks. Eagerly all are submitted before any is
    waited for, so the engine fuses them. Inside a graph, buckets of about
    :func:`bucket_bytes` are submitted, last gradient first, and one op waits; where
    :func:`hvdlite.tensorflow.overlap.enabled`, each bucket is submitted as soon as its
    gradients exist, before the rest of the backward pass (which the communication then
    overlaps). ``None`` stays ``None``. Dense gradients are
    allreduced with ``op``; ``tf.IndexedSlices`` are allgathered (values and indices),
    or densified first with ``sparse_as_dense=True``. ``gradient_predivide_factor`` f
    (only with ``op=Average``) divides by f before the sum and by size/f after it.
    ``groups``: an int (number of contiguous groups) or lists of variables whose
    gradients form one grouped allreduce each. With one rank nothing is communicated,
    except in an elastic job (whose world may grow while a traced function lives on).
    Not differentiable (no second-order gradients through the communication)."""
    if op not in _GRADIENT_OPS:
        raise ValueError(f"unsupported op {op!r} for gradients")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor needs op == Average")
    grads = list(grads)
    if op == _ops.Adasum and not sparse_as_dense and any(isinstance(g, tf.IndexedSlices) for g in grads):
        raise ValueError("Adasum cannot combine sparse gradients (tf.IndexedSlices); "
                         "pass sparse_as_dense=True")
    if _ops.current_size() == 1 and not in_elastic_job():  # an elastic world may grow later
        return [tf.convert_to_tensor(g) if (sparse_as_dense and isinstance(g, tf.IndexedSlices)) else g
                for g in grads]
    prescale = 1.0 / gradient_predivide_factor
    postscale = gradient_predivide_factor
    eager = tf.executing_eagerly()

    specs: list[_Spec] = []
    inputs: list[tf.Tensor] = []
    plan: list[tuple[str, int, Any]] = []  # ("none"|"dense"|"sparse", first spec index, ctx)
    dense_positions = []
    prepared: list[Any] = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices) and sparse_as_dense:
            g = tf.convert_to_tensor(g)
        prepared.append(g)
        if g is not None and not isinstance(g, tf.IndexedSlices):
            dense_positions.append(len(prepared) - 1)
    dense_vars = None
    if variables is not None and groups is not None and not isinstance(groups, int):
        dense_vars = [list(variables)[i] for i in dense_positions]
    group_of = dict(zip(dense_positions, _group_index(len(dense_positions), dense_vars, groups)))

    def engine_name(label: str) -> str:
        # Stable names: the same for every step, so the engine's response cache hits.
        return label if eager else _op_name(label.split(".")[0], label)

    owner: list[int] = []  # the gradient each request belongs to
    for i, g in enumerate(prepared):
        if g is None:
            plan.append(("none", -1, None))
        elif isinstance(g, tf.IndexedSlices):
            plan.append(("sparse", len(specs), g))
            specs.append(_Spec(_ops.ALLGATHER, engine_name(f"allgather.{name}.{i}.values")))
            inputs.append(g.values)
            specs.append(_Spec(_ops.ALLGATHER, engine_name(f"allgather.{name}.{i}.indices")))
            inputs.append(g.indices)
            owner += [i, i]
        else:
            c, ctx = compression.compress(_tensor_of(g))
            plan.append(("dense", len(specs), ctx))
            specs.append(_Spec(_ops.ALLREDUCE, engine_name(f"allreduce.{name}.{i}"), op,
                                    prescale, postscale, group=group_of[i]))
            inputs.append(c)
            owner.append(i)
    if not specs:
        return prepared
    limit = bucket_bytes()
    if eager or limit <= 0:
        outs = _run(specs, inputs)
    else:
        buckets = _buckets(specs, inputs, owner, limit)
        order = None
        if _overlap.enabled():
            gate = tf.config.threading.get_inter_op_parallelism_threads() == 1
            order = functools.partial(_overlap.submit_during_backward, gate=gate)
        parts = _run_buckets([([specs[j] for j in b], [inputs[j] for j in b]) for b in buckets],
                                  order=order)
        outs = [None] * len(specs)
        for b, part in zip(buckets, parts):
            for j, o in zip(b, part):
                outs[j] = o
    result: list[Any] = []
    sparse_scale = prescale * postscale / (_ops.current_size() if op == Average else 1)
    for kind, k, ctx in plan:
        if kind == "none":
            result.append(None)
        elif kind == "dense":
            result.append(compression.decompress(outs[k], ctx))
        else:
            values, indices = outs[k], outs[k + 1]
            if sparse_scale != 1.0:
                values = values * tf.cast(sparse_scale, values.dtype)
            result.append(tf.IndexedSlices(values, indices, dense_shape=ctx.dense_shape))
    return result


def is_variable(value: Any) -> bool:
    """True for a ``tf.Variable`` or a Keras 3 variable."""
    import keras  # TensorFlow 2.21 brings Keras 3
    return isinstance(value, (tf.Variable, keras.Variable))


def _variable_keys(variable: Any) -> list[int]:
    """Identities under which a registered local variable is recognised: the object
    itself and, for a Keras 3 variable, the ``tf.Variable`` it wraps."""
    keys = [id(variable)]
    import keras  # TensorFlow 2.21 brings Keras 3
    if isinstance(variable, keras.Variable):
        inner = getattr(variable, "_value", None)
        if isinstance(inner, tf.Variable):
            keys.append(id(inner))
    return keys


class LocalVariables:
    """Variables registered as local to their rank (``register_local_source`` /
    ``register_local_var``): their gradients are not combined over ranks."""

    def __init__(self) -> None:
        self._by_key: dict[int, Any] = {}  # holds the variables, so their ids stay theirs

    def add(self, variable: Any) -> None:
        for key in _variable_keys(variable):
            self._by_key[key] = variable

    def __contains__(self, variable: Any) -> bool:
        return any(key in self._by_key for key in _variable_keys(variable))

    def __bool__(self) -> bool:
        return bool(self._by_key)


@_no_autograph
def reduce_gradients_except_local(grads: Sequence[Any], variables: Sequence[Any] | None,
                                  local: LocalVariables | None, scale_local_gradients: bool,
                                  process_set: Any = None, **options: Any) -> list[Any]:
    """:func:`allreduce_gradients` for the gradients of every variable that is not in
    ``local``; the gradients of local variables are not communicated, only divided by
    the number of ranks when ``scale_local_gradients`` (as Horovod does, so that they
    keep the scale of the averaged ones). On ``process_set``'s ranks (None: all).

    On a rank outside ``process_set`` nothing is communicated: the gradients come back
    as they are (dense where ``sparse_as_dense``), as Horovod's do, local ones divided
    by the set's size when ``scale_local_gradients``."""
    if _mpi.outside_of(process_set):
        return _outside_gradients(grads, variables, local, scale_local_gradients,
                                  len(_set_ranks(process_set)), options.get("sparse_as_dense", False))
    with _mpi._set_scope(process_set):
        return _reduce_gradients_except_local(grads, variables, local, scale_local_gradients, **options)


def _set_ranks(process_set: Any) -> list[int]:
    from hvdlite.common import process_set_table
    return process_set_table.members(process_set.process_set_id) or []


def _outside_gradients(grads: Sequence[Any], variables: Sequence[Any] | None,
                       local: LocalVariables | None, scale_local_gradients: bool, set_size: int,
                       sparse_as_dense: bool) -> list[Any]:
    """What a rank outside the process set of a tape or optimizer gets: its own
    gradients, unreduced (Horovod's ``_allreduce_cond`` takes its identity branch there);
    the gradients of local variables are scaled as on the set's members."""
    grads = [tf.convert_to_tensor(g) if sparse_as_dense and isinstance(g, tf.IndexedSlices) else g
             for g in grads]
    if not (local and scale_local_gradients and variables is not None
            and len(variables) == len(grads) and set_size > 1):
        return grads
    return [_divided(g, set_size) if (g is not None and v in local) else g
            for g, v in zip(grads, variables)]


def _divided(g: Any, n: int) -> Any:
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values / tf.cast(n, g.values.dtype), g.indices,
                                dense_shape=g.dense_shape)
    return g / tf.cast(n, g.dtype)


def _reduce_gradients_except_local(grads: Sequence[Any], variables: Sequence[Any] | None,
                                   local: LocalVariables | None, scale_local_gradients: bool,
                                   **options: Any) -> list[Any]:
    grads = list(grads)
    if not local or variables is None or len(variables) != len(grads):
        return allreduce_gradients(grads, variables, **options)
    variables = list(variables)
    is_local = [v in local for v in variables]
    shared = [i for i, loc in enumerate(is_local) if not loc]
    reduced = allreduce_gradients([grads[i] for i in shared], [variables[i] for i in shared],
                                  **options)
    for i, g in zip(shared, reduced):
        grads[i] = g
    n = _ops.current_size()
    if scale_local_gradients and n > 1:
        for i, loc in enumerate(is_local):
            if loc and grads[i] is not None:
                grads[i] = _divided(grads[i], n)
    return grads


class _DistributedGradientTapeMixin:
    """Methods added to the class of the wrapped tape."""

    def register_local_source(self, source: Any) -> None:
        """Make ``source`` (a variable) local to this rank: its gradient is returned
        without being combined over ranks (divided by the number of ranks unless the
        tape was made with ``scale_local_gradients=False``)."""
        self._hvd_options["local_sources"].add(source)

    @_no_autograph
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients=output_gradients,
                                 unconnected_gradients=unconnected_gradients)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        flat_sources = tf.nest.flatten(sources, expand_composites=False)
        o = self._hvd_options
        reduced = reduce_gradients_except_local(
            flat_grads, flat_sources if len(flat_sources) == len(flat_grads) else None,
            o["local_sources"], o["scale_local_gradients"],
            op=o["op"], compression=o["compression"], sparse_as_dense=o["sparse_as_dense"],
            gradient_predivide_factor=o["gradient_predivide_factor"], groups=o["groups"],
            process_set=o["process_set"], name="DistributedGradientTape")
        return tf.nest.pack_sequence_as(grads, reduced, expand_composites=False)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names: bool = False):
        """Horovod's: :meth:`gradient`, split by kind of source. Returns
        ``(local, global)``: lists of ``(source, gradient)`` pairs for the sources
        registered with :meth:`register_local_source` and for the others (reduced over
        the ranks). ``use_generic_names`` is accepted for compatibility; hvdlite names its
        requests itself."""
        flat_sources = tf.nest.flatten(sources, expand_composites=False)
        grads = tf.nest.flatten(self.gradient(target, sources, output_gradients=output_gradients),
                                expand_composites=False)
        local_sources = self._hvd_options["local_sources"]
        local, shared = [], []
        for source, grad in zip(flat_sources, grads):
            (local if source in local_sources else shared).append((source, grad))
        return local, shared


_tape_classes: dict[type, type] = {}


def check_reduction_options(op: int, gradient_predivide_factor: float, num_groups: int,
                            groups: Any, process_set: Any) -> Any:
    """Validate the options that DistributedGradientTape and the Keras
    DistributedOptimizer share; returns ``groups`` (``num_groups`` is its older name)."""
    _mpi.check_process_set(process_set, members_only=False)  # outside: local gradients
    if op not in _GRADIENT_OPS:
        raise ValueError(f"unsupported op {op!r} for gradients; use Average, Sum, Adasum, "
                         f"Min, Max or Product")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor needs op == Average")
    if groups is None and num_groups:
        groups = num_groups
    if isinstance(groups, int) and groups < 0:
        raise ValueError("groups must be a non-negative integer or a list of lists of variables")
    return groups


@_no_autograph
def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "",
                            compression: type[Compressor] = Compression.none,
                            sparse_as_dense: bool = False, op: int = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None, process_set: Any = None,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """Wrap a ``tf.GradientTape`` so that ``gradient()`` returns gradients averaged (``op``)
    over all ranks.

    Use it after recording: ``tape = hvd.DistributedGradientTape(tape)``; the returned
    object is a ``tf.GradientTape`` sharing the wrapped tape's state. The gradients of
    one ``gradient()`` call are submitted together, so the engine fuses them: eagerly all
    at once; inside ``tf.function`` in one batch after the backward pass, or, where a rank
    has a core to spare for communication, in buckets as the backward pass produces them
    (``HVDLITE_TF_OVERLAP``, ``HVDLITE_TF_BUCKET_BYTES``; see
    :func:`hvdlite.tensorflow.overlap.enabled`). ``tf.IndexedSlices`` gradients (embeddings) are allgathered, or
    densified and allreduced with ``sparse_as_dense=True``. ``compression``
    (``Compression.none/fp16/bf16``) casts on the wire. ``gradient_predivide_factor`` f:
    divide by f before the sum and by size/f after (needs ``op=Average``).
    ``groups`` (or the older ``num_groups``): an int splits the gradients into that many
    grouped allreduces; lists of variables group those variables' gradients.
    ``tape.register_local_source(v)`` keeps the gradient of ``v`` local to each rank;
    ``scale_local_gradients`` (default True) divides such gradients by the number of
    ranks, as Horovod does. ``device_*`` are accepted for compatibility.
    ``process_set``: average over that set's ranks only; on a rank outside the set
    ``gradient()`` returns the rank's own gradients, unreduced, as Horovod's does.
    """
    groups = check_reduction_options(op, gradient_predivide_factor, num_groups, groups,
                                     process_set)
    base = type(gradtape)
    if isinstance(gradtape, _DistributedGradientTapeMixin):
        base = next(c for c in base.__mro__[1:] if not issubclass(c, _DistributedGradientTapeMixin))
    cls = _tape_classes.get(base)
    if cls is None:
        cls = type(base.__name__, (_DistributedGradientTapeMixin, base), {})
        cls.__module__ = __name__
        _tape_classes[base] = cls
    tape = object.__new__(cls)
    # Share the wrapped tape's state: recording, watched variables and the tape itself.
    tape.__dict__ = gradtape.__dict__
    options = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                   gradient_predivide_factor=gradient_predivide_factor, groups=groups,
                   scale_local_gradients=bool(scale_local_gradients),
                   local_sources=LocalVariables(), process_set=process_set)
    object.__setattr__(tape, "_hvd_options", options)
    return tape


def trainable_weights_of_layers(local_layers: Any) -> list[Any]:
    """The trainable weights of ``local_layers`` (one Keras layer or several)."""
    import keras
    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    local_layers = list(local_layers)
    if not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("local_layers must be Keras layers (keras.layers.Layer)")
    return [w for layer in local_layers for w in layer.trainable_weights]


@_no_autograph
def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "",
                                   compression: type[Compressor] = Compression.none,
                                   sparse_as_dense: bool = False, op: int = Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: Any = None, process_set: Any = None,
                                   local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """:func:`DistributedGradientTape` whose gradients for the trainable weights of
    ``local_layers`` (Keras layers) stay local to each rank, as if each weight had been
    passed to ``register_local_source``. The other arguments are those of
    :func:`DistributedGradientTape`."""
    local = trainable_weights_of_layers(local_layers)
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for w in local:
        tape.register_local_source(w)
    return tape
