"""``hvd.DistributedOptimizer`` for TensorFlow 1 optimizers (``tf.compat.v1.train.Optimizer``),
as Horovod's wraps them: for graphs built with ``tf.compat.v1`` and run by a
``tf.compat.v1.Session`` (or ``MonitoredTrainingSession``), and for ``minimize`` /
``compute_gradients`` / ``apply_gradients`` called eagerly.

``compute_gradients`` returns the wrapped optimizer's gradients combined over the ranks
(with the options of :func:`hvdlite.tensorflow.DistributedGradientTape`: ``op``,
``compression``, ``sparse_as_dense``, ``gradient_predivide_factor``, ``groups``,
``process_set``, local variables); ``apply_gradients`` is the wrapped optimizer's.
``minimize`` goes through both. ``backward_passes_per_step`` k > 1 (graphs only, as in
Horovod) sums k steps' gradients in variables of the ``LOCAL_VARIABLES`` collection
(initialize them with ``tf.compat.v1.local_variables_initializer()``;
``MonitoredTrainingSession`` does), communicates the sum (divided by k with
``average_aggregated_gradients``) at every k-th ``compute_gradients`` and applies it in
that step's ``apply_gradients``; in the other steps nothing is applied and
``global_step`` is still incremented.

``op=hvd.Adasum`` follows Horovod's Adasum optimizer for TensorFlow 1: each rank applies
its own gradients, and every ``backward_passes_per_step`` steps the change of every
variable since the last exchange is combined over the ranks with Adasum and applied from
there (``docs/adasum.md``). (Horovod 0.28.1's own class for this hands
``apply_gradients`` straight to the wrapped optimizer, so it never exchanges anything;
hvdlite does what that class describes.)
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import tensorflow as tf

from hvdlite.tensorflow import mpi_ops as _mpi
from hvdlite.tensorflow.compression import Compression, Compressor
from hvdlite.tensorflow.gradients import (LocalVariables, check_reduction_options,
                                          reduce_gradients_except_local)
from hvdlite.tensorflow.mpi_ops import Adasum, Average

_no_autograph = tf.autograph.experimental.do_not_convert

_LegacyOptimizer = tf.compat.v1.train.Optimizer


def _not_none(values: Sequence[Any]) -> list[Any]:
    return [v for v in values if v is not None]


@contextlib.contextmanager
def _graph_control_flow() -> Iterator[None]:
    """TensorFlow 1's ``tf.cond`` while a TensorFlow 1 graph is built. Its branches may
    assign to reference variables (``use_resource=False``, as Horovod's tests make) and
    the wrapped optimizer may create its slots in them; TensorFlow 2's ``cond`` turns
    branches into functions, which can do neither. Inside ``tf.function`` nothing
    changes."""
    graph = tf.compat.v1.get_default_graph()
    if tf.executing_eagerly() or getattr(graph, "building_function", False) \
            or not tf.compat.v1.control_flow_v2_enabled():
        yield
        return
    tf.compat.v1.disable_control_flow_v2()
    try:
        yield
    finally:
        tf.compat.v1.enable_control_flow_v2()


def _cond(pred: Any, true_fn: Callable[[], Any], false_fn: Callable[[], Any]) -> Any:
    with _graph_control_flow():
        return tf.cond(pred, true_fn, false_fn)


class _Wrapper(_LegacyOptimizer):
    """A ``tf.compat.v1.train.Optimizer`` around another one, ``_optimizer``, whose slots
    and variables are its own."""

    def __init__(self, optimizer: Any, name: str | None, prefix: str, use_locking: bool) -> None:
        super().__init__(name=name or f"{prefix}{type(optimizer).__name__}", use_locking=use_locking)
        self._optimizer = optimizer

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped optimizer's ``get_slot``."""
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped optimizer's ``get_slot_names``."""
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped optimizer's ``variables``."""
        return self._optimizer.variables(*args, **kwargs)


class _DistributedOptimizer(_Wrapper):
    """A ``tf.compat.v1.train.Optimizer`` that combines the gradients of the optimizer it
    wraps over the ranks before that optimizer applies them (see the module)."""

    def __init__(self, optimizer: Any, name: str | None = None, use_locking: bool = False,
                 compression: type[Compressor] = Compression.none, sparse_as_dense: bool = False,
                 op: int = Average, gradient_predivide_factor: float = 1.0,
                 backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                 groups: Any = None, process_set: Any = None,
                 scale_local_gradients: bool = True) -> None:
        super().__init__(optimizer, name, "Distributed", use_locking)
        self.process_set = process_set
        self.scale_local_gradients = bool(scale_local_gradients)
        self._options = dict(op=op, compression=compression, sparse_as_dense=bool(sparse_as_dense),
                             gradient_predivide_factor=float(gradient_predivide_factor), groups=groups)
        self._local = LocalVariables()
        self._passes = int(backward_passes_per_step)
        self._average_aggregated = bool(average_aggregated_gradients)
        self._sums: dict[Any, Any] = {}   # graph -> (counter, {variable index: sum variable})
        if self._passes > 1 and tf.executing_eagerly():
            raise ValueError("backward_passes_per_step > 1 needs a TensorFlow 1 graph (run by a "
                             "tf.compat.v1.Session) with a tf.compat.v1 optimizer, as in Horovod; "
                             "eagerly, use hvd.DistributedGradientTape or a Keras optimizer")

    def register_local_var(self, var: Any) -> None:
        """Keep the gradient of ``var`` local to this rank: it is not combined over the
        ranks (divided by their number while ``scale_local_gradients`` is True)."""
        self._local.add(var)

    @_no_autograph
    def _reduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        return reduce_gradients_except_local(
            list(grads), list(variables), self._local, self.scale_local_gradients,
            process_set=self.process_set, name=self.get_name(), **self._options)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        """The wrapped optimizer's ``compute_gradients``, its gradients combined over
        the ranks (every ``backward_passes_per_step``-th call; see the module)."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs:
            return pairs
        grads, variables = (list(t) for t in zip(*pairs))
        if self._passes > 1:
            reduced = self._accumulate(grads, variables)
        else:
            reduced = self._reduce(grads, variables)
        return list(zip(reduced, variables))

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None,
                        name: str | None = None) -> Any:
        """The wrapped optimizer's ``apply_gradients`` (only on the steps whose
        gradients were combined, with ``backward_passes_per_step`` > 1)."""
        if self._passes == 1:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        grads_and_vars = list(grads_and_vars)
        counter, _ = self._accumulators(None, None)

        def apply() -> Any:
            return tf.group(self._optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                                            name=name))

        def skip() -> Any:
            if global_step is None:
                return tf.no_op()
            return tf.group(tf.compat.v1.assign_add(global_step, tf.constant(1, global_step.dtype.base_dtype)))

        with tf.control_dependencies(_not_none([g for g, _ in grads_and_vars])):
            return _cond(tf.equal(counter, 0), apply, skip)

    # -- backward_passes_per_step > 1 --------------------------------------------------

    def _accumulators(self, grads: Sequence[Any] | None, variables: Sequence[Any] | None
                      ) -> tuple[Any, dict[int, Any]]:
        """This graph's step counter and one sum variable per gradient (made on the first
        call with gradients), in the ``LOCAL_VARIABLES`` collection."""
        graph = tf.compat.v1.get_default_graph()
        found = self._sums.get(graph)
        if found is not None:
            return found
        if grads is None:
            raise ValueError("apply_gradients with backward_passes_per_step > 1 needs the gradients "
                             "of this optimizer's compute_gradients in the same graph")
        collections = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
        with tf.compat.v1.variable_scope(f"{self.get_name()}_aggregation", reuse=tf.compat.v1.AUTO_REUSE):
            counter = tf.compat.v1.get_variable("backward_passes", shape=(), dtype=tf.int32,
                                                initializer=tf.compat.v1.zeros_initializer(),
                                                trainable=False, collections=collections)
            sums = {}
            for i, (g, v) in enumerate(zip(grads, variables)):
                if g is None:
                    continue
                sums[i] = tf.compat.v1.get_variable(f"gradient_sum_{i}", shape=v.shape,
                                                    dtype=v.dtype.base_dtype,
                                                    initializer=tf.compat.v1.zeros_initializer(),
                                                    trainable=False, collections=collections)
        self._sums[graph] = (counter, sums)
        return counter, sums

    def _dense(self, g: Any) -> Any:
        if isinstance(g, tf.IndexedSlices):
            if not self._options["sparse_as_dense"]:
                raise ValueError("backward_passes_per_step > 1 sums gradients in dense variables: "
                                 "pass sparse_as_dense=True for sparse (tf.IndexedSlices) gradients")
            return tf.convert_to_tensor(g)
        return g

    def _accumulate(self, grads: list[Any], variables: list[Any]) -> list[Any]:
        """Add this step's gradients to the sums; on every ``backward_passes_per_step``-th
        step return the sums combined over the ranks and restart, else this step's own
        gradients (which apply_gradients does not apply)."""
        if tf.executing_eagerly():
            raise ValueError("backward_passes_per_step > 1 needs a TensorFlow 1 graph")
        dense = [None if g is None else self._dense(g) for g in grads]
        counter, sums = self._accumulators(dense, variables)
        order = sorted(sums)
        # Only the collective is conditional: every variable is read and written outside
        # the cond, in an order fixed by data and control edges.
        first = tf.equal(counter.read_value(), 0)
        totals = []
        for i in order:
            earlier = tf.where(first, tf.zeros_like(sums[i]), sums[i].read_value())
            total = earlier + tf.cast(dense[i], sums[i].dtype)
            with tf.control_dependencies([sums[i].assign(total)]):
                totals.append(tf.identity(total))
        count = counter.read_value() + 1
        due = tf.equal(count, self._passes)

        def communicate() -> list[Any]:
            parts = totals
            if self._average_aggregated:
                parts = [t / tf.cast(self._passes, t.dtype) for t in parts]
            return list(self._reduce(parts, [variables[i] for i in order]))

        def keep() -> list[Any]:
            return [tf.cast(dense[i], sums[i].dtype) for i in order]

        out = _cond(due, communicate, keep)
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        # After every read of the counter and the sums (`totals` needs them; the branch
        # the cond takes may not).
        with tf.control_dependencies(out + totals):
            counted = counter.assign(tf.where(due, 0, count))
        with tf.control_dependencies([counted]):
            out = [tf.identity(o) for o in out]
        result: list[Any] = [None] * len(grads)
        for i, o in zip(order, out):
            result[i] = o
        return result


class _DistributedAdasumOptimizer(_Wrapper):
    """Each rank applies its own gradients with the wrapped optimizer; every
    ``backward_passes_per_step`` steps the variables' changes since the last exchange
    are combined over the ranks with Adasum and added to where they started."""

    def __init__(self, optimizer: Any, name: str | None = None, use_locking: bool = False,
                 compression: type[Compressor] = Compression.none,
                 backward_passes_per_step: int = 1) -> None:
        super().__init__(optimizer, name, "DistributedDelta", use_locking)
        self._compression = compression
        self._passes = int(backward_passes_per_step)
        self._state: dict[Any, Any] = {}  # graph -> (step, {variable: start})

    def compute_gradients(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped optimizer's (nothing is combined before the update)."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def _starts(self, variables: Sequence[Any]) -> tuple[Any, dict[int, Any]]:
        graph = tf.compat.v1.get_default_graph()
        found = self._state.get(graph)
        if found is None:
            collections = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
            with tf.compat.v1.variable_scope(f"{self.get_name()}_adasum", reuse=tf.compat.v1.AUTO_REUSE):
                step = tf.compat.v1.get_variable("step", shape=(), dtype=tf.int64,
                                                 initializer=tf.compat.v1.zeros_initializer(),
                                                 trainable=False, collections=collections)
                starts = {}
                for i, v in enumerate(variables):
                    starts[id(v)] = tf.compat.v1.get_variable(
                        f"start_{i}", shape=v.shape, dtype=v.dtype.base_dtype,
                        initializer=tf.compat.v1.zeros_initializer(), trainable=False,
                        collections=collections)
            found = self._state[graph] = (step, starts)
        return found

    @_no_autograph
    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None,
                        name: str | None = None) -> Any:
        """Apply the wrapped optimizer's update, then, on exchange steps, combine the
        changes since the last exchange with Adasum (see the class)."""
        if tf.executing_eagerly():
            raise ValueError("hvd.DistributedOptimizer(tf.compat.v1 optimizer, op=hvd.Adasum) "
                             "needs a TensorFlow 1 graph run by a tf.compat.v1.Session")
        grads_and_vars = list(grads_and_vars)
        variables = [v for g, v in grads_and_vars if g is not None]
        step, starts = self._starts(variables)
        # Variables are read and written outside any cond, in an order fixed by data and
        # control edges; only the collective is conditional.
        first = tf.equal(step.read_value(), 0)
        begun = []
        for v in variables:
            start = tf.where(first, v.read_value(), starts[id(v)].read_value())
            with tf.control_dependencies([starts[id(v)].assign(start)]):
                begun.append(tf.identity(start))
        with tf.control_dependencies(begun):
            update = self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        with tf.control_dependencies([update]):
            now = [tf.identity(v.read_value()) for v in variables]
        deltas = [n - b for n, b in zip(now, begun)]
        due = tf.equal((step.read_value() + 1) % self._passes, 0)

        def exchange() -> list[Any]:
            return list(_mpi.grouped_allreduce(deltas, op=Adasum, compression=self._compression,
                                               name=f"{self.get_name()}.delta"))

        combined = _cond(due, exchange, lambda: [tf.zeros_like(d) for d in deltas]) if deltas else []
        combined = list(combined) if isinstance(combined, (list, tuple)) else [combined]
        writes = []
        for v, b, n, c in zip(variables, begun, now, combined):
            moved = b + c
            writes.append(starts[id(v)].assign(moved))
            writes.append(v.assign(tf.where(due, moved, n)))
        with tf.control_dependencies(writes):
            return tf.group(step.assign_add(1))



def distributed_legacy_optimizer(optimizer: Any, name: str | None, use_locking: bool,
                                 compression: type[Compressor], sparse_as_dense: bool,
                                 backward_passes_per_step: int, op: int,
                                 gradient_predivide_factor: float,
                                 average_aggregated_gradients: bool, num_groups: int, groups: Any,
                                 process_set: Any, scale_local_gradients: bool) -> Any:
    """:func:`hvdlite.tensorflow.DistributedOptimizer` for a ``tf.compat.v1.train.Optimizer``."""
    groups = check_reduction_options(op, gradient_predivide_factor, num_groups, groups, process_set)
    if int(backward_passes_per_step) < 1:
        raise ValueError("backward_passes_per_step must be >= 1")
    if op == Adasum:
        if average_aggregated_gradients:
            raise ValueError("Adasum does not support average_aggregated_gradients=True (as in Horovod)")
        if getattr(process_set, "process_set_id", 0) not in (None, 0):
            raise NotImplementedError("Adasum with a tf.compat.v1 optimizer runs on the global process set "
                                      "only (as in Horovod)")
        return _DistributedAdasumOptimizer(optimizer, name, use_locking, compression,
                                           backward_passes_per_step)
    return _DistributedOptimizer(optimizer, name, use_locking, compression, sparse_as_dense, op,
                                 gradient_predivide_factor, backward_passes_per_step,
                                 average_aggregated_gradients, groups, process_set,
                                 scale_local_gradients)

