"""``DistributedOptimizer`` for Keras 3 optimizers (TensorFlow backend)."""
from __future__ import annotations

import copy
from typing import Any

import keras
import tensorflow as tf

from hvdlite.tensorflow.compression import Compression, Compressor
from hvdlite.tensorflow.gradients import (LocalVariables, check_reduction_options, is_variable,
                                          reduce_gradients_except_local,
                                          trainable_weights_of_layers)
from hvdlite.common import basics as _basics
from hvdlite.tensorflow.mpi_ops import Average, Min, allreduce, outside_of

_no_autograph = tf.autograph.experimental.do_not_convert


def _options(compression, sparse_as_dense, gradient_predivide_factor, op,
             backward_passes_per_step, average_aggregated_gradients, num_groups, groups,
             process_set, scale_local_gradients=True) -> dict[str, Any]:
    groups = check_reduction_options(op, gradient_predivide_factor, num_groups, groups,
                                     process_set)
    if int(backward_passes_per_step) < 1:
        raise ValueError("backward_passes_per_step must be >= 1")
    return dict(compression=compression, sparse_as_dense=bool(sparse_as_dense),
                gradient_predivide_factor=float(gradient_predivide_factor), op=op,
                backward_passes_per_step=int(backward_passes_per_step),
                average_aggregated_gradients=bool(average_aggregated_gradients), groups=groups,
                scale_local_gradients=bool(scale_local_gradients), process_set=process_set)


# What DistributedOptimizer's own defaults give.
_DEFAULT_OPTIONS: dict[str, Any] = _options(Compression.none, False, 1.0, Average, 1, False, 0,
                                            None, None)


class _DistributedOptimizerMixin:
    """Placed in front of the wrapped optimizer's class: gradients handed to ``apply`` /
    ``apply_gradients`` are first combined over all ranks (one batch per step)."""

    # Instances made without DistributedOptimizer (``type(opt).from_config(...)``,
    # ``copy``) average with the default options instead of failing.
    _hvd_options: dict[str, Any] = _DEFAULT_OPTIONS

    def register_local_var(self, var: Any) -> None:
        """Make ``var`` local to this rank: its gradient is applied without being combined
        over ranks (divided by the number of ranks unless ``scale_local_gradients=False``
        was given)."""
        local = self.__dict__.get("_hvd_local_vars")
        if local is None:
            local = LocalVariables()
            object.__setattr__(self, "_hvd_local_vars", local)
        local.add(var)

    @_no_autograph
    def apply(self, grads, trainable_variables=None):
        opts = self._hvd_options
        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
            var_list = trainable_variables
        else:
            var_list = list(getattr(self, "_trainable_variables", []) or [])
        if opts["backward_passes_per_step"] > 1:
            return self._hvd_apply_accumulated(grads, trainable_variables, var_list)
        if self._hvd_take_combined(grads):  # from compute_gradients: combined already
            return super().apply(grads, trainable_variables)
        reduced = self._hvd_reduce(grads, var_list)
        return super().apply(reduced, trainable_variables)

    def apply_gradients(self, grads_and_vars, name=None, skip_gradients_aggregation=False,
                        **kwargs):
        """Keras's ``apply_gradients``; also takes the arguments Keras 2's took (``name``,
        ``skip_gradients_aggregation``, ``experimental_aggregate_gradients``), which
        scripts written for Horovod pass, and ignores them (they concerned
        ``tf.distribute`` replicas; the gradients are combined over the ranks here
        either way)."""
        kwargs.pop("experimental_aggregate_gradients", None)
        if kwargs:
            raise TypeError(f"apply_gradients() got unexpected keyword arguments {sorted(kwargs)}")
        return super().apply_gradients(grads_and_vars)

    def compute_gradients(self, loss, var_list, tape=None):
        """Horovod's ``compute_gradients`` (Keras 2 optimizers had it): the gradients of
        ``loss`` (a tensor recorded on ``tape``, or a callable, evaluated on a new tape)
        with respect to ``var_list`` (or a callable that returns it), combined over the
        ranks, as a list of ``(gradient, variable)`` pairs. ``apply_gradients`` then
        applies them without combining them again. With ``backward_passes_per_step`` > 1
        the local gradients are returned and ``apply_gradients`` sums and combines them."""
        return self._compute_gradients(loss, var_list, None, tape)

    @_no_autograph
    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """:meth:`compute_gradients` under the name Keras 2's private method had (which
        Horovod's tests call), with its ``grad_loss``."""
        tape = tf.GradientTape() if tape is None else tape
        if callable(loss):
            with tape:
                if not callable(var_list):
                    tape.watch(var_list)
                loss = loss()
        if callable(var_list):
            var_list = var_list()
        var_list = list(tf.nest.flatten(var_list))
        grads = list(tape.gradient(loss, var_list, grad_loss))
        if self._hvd_options["backward_passes_per_step"] == 1:
            grads = list(self._hvd_reduce(grads, var_list))
            # The latest call's results only: gradients changed before apply_gradients
            # (clipped, scaled) are other objects, and are combined there as usual.
            object.__setattr__(self, "_hvd_combined", {id(g): g for g in grads if g is not None})
        return list(zip(grads, var_list))

    def _hvd_take_combined(self, grads) -> bool:
        """True (and forgotten) when every gradient came from :meth:`compute_gradients`."""
        combined = self.__dict__.get("_hvd_combined")
        present = [g for g in grads if g is not None]
        if not combined or not present or any(combined.get(id(g)) is not g for g in present):
            return False
        for g in present:
            combined.pop(id(g), None)
        return True

    @property
    def lr(self):
        """Keras 2's name of the learning rate, which Horovod's examples use
        (``opt.lr.assign(x)``, ``tf.keras.backend.set_value(opt.lr, x)``): the
        ``tf.Variable`` that holds ``learning_rate`` (its current value when the
        learning rate is a schedule). hvdlite addition; Keras 3 optimizers lack it."""
        holder = getattr(self, "_learning_rate", None)
        value = getattr(holder, "value", None)
        if isinstance(value, tf.Variable):
            return value
        return self.learning_rate

    @lr.setter
    def lr(self, value):
        self.learning_rate = value

    def _hvd_reduce(self, grads, var_list):
        opts = self._hvd_options
        return reduce_gradients_except_local(
            grads, var_list if len(var_list) == len(grads) else None,
            self.__dict__.get("_hvd_local_vars"), opts["scale_local_gradients"],
            op=opts["op"],
            compression=opts["compression"], sparse_as_dense=opts["sparse_as_dense"],
            gradient_predivide_factor=opts["gradient_predivide_factor"], groups=opts["groups"],
            process_set=opts.get("process_set"), name="DistributedOptimizer")

    def build(self, variables):
        super().build(variables)
        opts = self.__dict__.get("_hvd_options")
        if opts and opts["backward_passes_per_step"] > 1 and "_hvd_accumulators" not in self.__dict__:
            self._hvd_make_accumulators(variables)

    def _hvd_make_accumulators(self, variables):
        accs = [self.add_variable_from_reference(v, name="hvd_local_gradient_sum")
                for v in variables]
        counter = self.add_variable(shape=(), initializer="zeros", dtype="int64",
                                    name="hvd_backward_passes")
        object.__setattr__(self, "_hvd_accumulators", accs)
        object.__setattr__(self, "_hvd_counter", counter)

    def _hvd_apply_accumulated(self, grads, trainable_variables, var_list):
        opts = self._hvd_options
        n = opts["backward_passes_per_step"]
        if not self.built:
            if trainable_variables is None:
                raise ValueError("the optimizer is not built; pass the variables")
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        if "_hvd_accumulators" not in self.__dict__:
            self._hvd_make_accumulators(list(self._trainable_variables))
        accs = [self._hvd_accumulators[self._get_variable_index(v)] for v in var_list]
        dense = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        for acc, g in zip(accs, dense):
            if g is not None:
                acc.assign_add(tf.cast(g, acc.dtype))
        self._hvd_counter.assign_add(1)
        base_apply = super(_DistributedOptimizerMixin, self).apply

        def update():
            scale = 1.0 / n if opts["average_aggregated_gradients"] else 1.0
            summed = [None if g is None else
                      (tf.convert_to_tensor(acc) * scale if scale != 1.0 else tf.convert_to_tensor(acc))
                      for acc, g in zip(accs, dense)]
            reduced = self._hvd_reduce(summed, var_list)
            base_apply(reduced, trainable_variables)
            for acc in accs:
                acc.assign(tf.zeros_like(acc))
            return tf.constant(True)

        is_update = tf.equal(self._hvd_counter % n, 0)
        if tf.executing_eagerly():
            if bool(is_update):
                update()
        else:
            tf.cond(is_update, update, lambda: tf.constant(False))


def _make_loss_scaling_agree() -> None:
    """Make Keras's ``LossScaleOptimizer`` take the same branch on every rank when it
    wraps a distributed optimizer.

    ``model.compile`` under the ``mixed_float16`` policy wraps the optimizer it is given
    in a ``LossScaleOptimizer``, which checks the *local* gradients for inf/NaN and calls
    the inner optimizer's ``apply`` only if they are finite. With a
    ``DistributedOptimizer`` inside, a rank whose own gradients overflowed would skip the
    gradient allreduce while the others wait in it forever. So when the inner optimizer
    is distributed, the finiteness flag is combined over ranks (Min) first: if any rank's
    gradients are not finite, every rank skips the step and lowers its loss scale, which
    is what one process training on the global batch does. Wrapping the other way round,
    ``DistributedOptimizer(LossScaleOptimizer(opt))``, needs nothing: the gradients are
    combined before the check."""
    lso = keras.optimizers.LossScaleOptimizer
    local_check = lso.check_finite
    if getattr(local_check, "_hvdlite_agreed", False):
        return

    def check_finite(self, grads):
        finite = local_check(self, grads)
        process_set = (self.inner_optimizer._hvd_options.get("process_set")
                       if isinstance(self.inner_optimizer, _DistributedOptimizerMixin) else None)
        if (isinstance(self.inner_optimizer, _DistributedOptimizerMixin) and _basics.size() > 1
                and not outside_of(process_set)):  # outside its set a rank steps alone
            votes = allreduce(tf.cast(finite, tf.int32), op=Min,
                              name=f"{self.name}.gradients_finite", process_set=process_set)
            finite = tf.greater(votes, 0)
        return finite

    check_finite._hvdlite_agreed = True
    check_finite.__doc__ = local_check.__doc__
    lso.check_finite = check_finite


_make_loss_scaling_agree()


def _is_distributed(optimizer: Any) -> bool:
    """``optimizer`` is a distributed optimizer, or a ``LossScaleOptimizer`` around one."""
    inner = getattr(optimizer, "inner_optimizer", None)
    return isinstance(optimizer, _DistributedOptimizerMixin) or isinstance(
        inner, _DistributedOptimizerMixin)


def _keep_auto_xla_off() -> None:
    """Make ``model.compile(jit_compile="auto")`` (Keras 3's default) choose no XLA when
    the model's optimizer is distributed.

    Keras resolves "auto" to XLA on any machine with a GPU, and to no XLA only on
    CPU-only machines and under its own ``tf.distribute`` strategies. hvdlite's
    collectives are ops XLA cannot compile (hvdlite's own, or ``py_function``), so without this a
    Horovod-style ``model.fit`` script would fail at its first step on a GPU machine.
    This treats hvdlite's optimizer as Keras treats its own strategies. An explicit
    ``jit_compile=True`` is left alone and gets the clear error of
    :func:`hvdlite.tensorflow.eager._check_not_xla`. If Keras's private method is
    missing (another Keras version), nothing is patched and that error is what users see.
    """
    try:
        from keras.src.trainers.trainer import Trainer
    except ImportError:  # pragma: no cover - a Keras without this layout
        return
    resolve = getattr(Trainer, "_resolve_auto_jit_compile", None)
    if resolve is None or getattr(resolve, "_hvdlite_xla_off", False):
        return

    def _resolve_auto_jit_compile(self):
        if _is_distributed(getattr(self, "optimizer", None)):
            return False
        return resolve(self)

    _resolve_auto_jit_compile._hvdlite_xla_off = True
    _resolve_auto_jit_compile.__doc__ = resolve.__doc__
    Trainer._resolve_auto_jit_compile = _resolve_auto_jit_compile


_keep_auto_xla_off()


from hvdlite.tensorflow.keras_backend import CallableList, make_optimizer_variables_callable  # noqa: E402,F401

make_optimizer_variables_callable()


def _accept_experimental_run_tf_function() -> None:
    """Let ``model.compile(optimizer=hvd.DistributedOptimizer(...),
    experimental_run_tf_function=False)`` through, as Horovod's TensorFlow 2 Keras
    examples write it (their optimizer needed it on TensorFlow 2.0 and 2.1; it has had
    no effect since). Keras 3's ``compile`` takes no such argument; it is dropped when
    the optimizer is a distributed one, and left for Keras to refuse otherwise."""
    from keras.src.trainers.trainer import Trainer
    compile_ = Trainer.__dict__.get("compile")
    if compile_ is None or getattr(compile_, "_hvdlite_compat", False):
        return

    def compile(self, *args, **kwargs):
        if "experimental_run_tf_function" in kwargs:
            optimizer = kwargs.get("optimizer", args[0] if args else None)
            if _is_distributed(optimizer):
                kwargs.pop("experimental_run_tf_function")
        return compile_(self, *args, **kwargs)

    compile._hvdlite_compat = True
    compile.__doc__ = compile_.__doc__
    compile.__wrapped__ = compile_
    Trainer.compile = compile


_accept_experimental_run_tf_function()


_classes: dict[type, type] = {}


def _distributed_class(base: type) -> type:
    """The class ``base`` with gradient averaging in front. It keeps ``base``'s name and
    module, so a model saved with it loads as the plain optimizer anywhere."""
    if issubclass(base, _DistributedOptimizerMixin):
        return base
    cls = _classes.get(base)
    if cls is None:
        cls = type(base.__name__, (_DistributedOptimizerMixin, base),
                   {"__module__": base.__module__, "__qualname__": base.__qualname__,
                    "__doc__": base.__doc__})
        try:  # keep a registered custom optimizer's registered name
            from keras.src.saving import object_registration as _reg
            registered = _reg.get_registered_name(base)
            if registered != base.__name__:
                _reg._GLOBAL_CUSTOM_NAMES[cls] = registered
        except Exception:
            pass
        _classes[base] = cls
    return cls


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: str | None = None,
                         device_dense: str = "", device_sparse: str = "",
                         compression: type[Compressor] = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: int = Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: Any = None,
                         scale_local_gradients: bool = True) -> keras.optimizers.Optimizer:
    """Return a copy of the Keras 3 ``optimizer`` that combines gradients over all ranks
    before applying them; use it in ``model.compile`` (``model.fit``) or call
    ``apply_gradients`` yourself.

    The result is an instance of a subclass of ``type(optimizer)`` with the same config
    (and the same state if ``optimizer`` was already built), and the instance attributes
    that the config does not record, such as ``exclude_from_weight_decay()``'s
    exclusions. ``op=Adasum`` combines the gradients with Adasum, as Horovod's Keras
    optimizer does (power-of-two numbers of ranks; see docs/adasum.md). A whole step's gradients are submitted together so the engine fuses them, as
    for :func:`hvdlite.tensorflow.DistributedGradientTape` (in ``model.fit``: in one batch
    after the backward pass, or in buckets while it runs where a rank has a core to
    spare, see :func:`hvdlite.tensorflow.overlap.enabled`).
    Each rank computes its loss on its own batch; with ``op=Average`` (default) the update equals single-process training on the
    union of the batches. ``tf.IndexedSlices`` gradients are allgathered (or allreduced
    dense with ``sparse_as_dense=True``). ``backward_passes_per_step`` k > 1 sums k
    local gradients (averages them with ``average_aggregated_gradients=True``) and
    communicates and applies once every k calls; ``optimizer.iterations`` then counts
    applied updates. ``compression``, ``gradient_predivide_factor``, ``groups`` /
    ``num_groups`` mean what they mean for :func:`hvdlite.tensorflow.DistributedGradientTape`.
    ``register_local_var(v)`` on the result keeps the gradient of ``v`` local to each
    rank (divided by the number of ranks while ``scale_local_gradients`` is True).
    ``process_set``: average over that set's ranks; a rank outside the set applies its
    own gradients, unreduced, as with Horovod.
    ``model.compile``'s default ``jit_compile="auto"`` then chooses no XLA, on GPU
    machines as well (XLA cannot compile hvdlite's collectives; an explicit
    ``jit_compile=True`` fails on more than one rank). ``name`` renames the optimizer;
    ``device_*`` are accepted for compatibility.
    """
    opts = _options(compression, sparse_as_dense, gradient_predivide_factor, op,
                    backward_passes_per_step, average_aggregated_gradients, num_groups, groups,
                    process_set, scale_local_gradients)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer needs a Keras 3 optimizer, got {type(optimizer)!r}")
    base = type(optimizer)
    if isinstance(optimizer, _DistributedOptimizerMixin):
        base = next(c for c in base.__mro__[1:]
                    if not issubclass(c, _DistributedOptimizerMixin))
    cls = _distributed_class(base)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    new = cls.from_config(config)
    object.__setattr__(new, "_hvd_options", opts)
    if optimizer.built:
        trainable = list(optimizer._trainable_variables)
        new.build(trainable)
        old_vars = list(optimizer.variables)
        for target, source in zip(new.variables, old_vars):
            target.assign(source)
    _copy_unconfigured_state(optimizer, new)
    return new


def PartialDistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: str | None = None,
                                device_dense: str = "", device_sparse: str = "",
                                compression: type[Compressor] = Compression.none,
                                sparse_as_dense: bool = False,
                                gradient_predivide_factor: float = 1.0, op: int = Average,
                                backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False, num_groups: int = 0,
                                groups: Any = None, process_set: Any = None,
                                local_layers: Any = None,
                                scale_local_gradients: bool = True) -> keras.optimizers.Optimizer:
    """:func:`DistributedOptimizer` whose gradients for the trainable weights of
    ``local_layers`` (Keras layers) stay local to each rank, as if each weight had been
    passed to ``register_local_var``. The other arguments are those of
    :func:`DistributedOptimizer`."""
    local = trainable_weights_of_layers(local_layers)
    new = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression,
                               sparse_as_dense, gradient_predivide_factor, op,
                               backward_passes_per_step, average_aggregated_gradients,
                               num_groups, groups, process_set, scale_local_gradients)
    for w in local:
        new.register_local_var(w)
    return new


def _holds_variables(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds_variables(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_variables(v) for v in value.values())
    return is_variable(value)


def _copy_unconfigured_state(source: Any, target: Any) -> None:
    """Give ``target`` (made by ``from_config`` and, if ``source`` was built, built) the
    instance attributes of ``source`` that neither did set -- state such as
    ``exclude_from_weight_decay()``'s exclusions, which ``get_config`` does not record.
    Optimizer variables are not shared (build made the target its own), hvdlite's own
    attributes are the target's, and look-up caches start empty."""
    for key, value in source.__dict__.items():
        if key in target.__dict__ or key.startswith("_hvd_") or _holds_variables(value):
            continue
        if key.endswith("_cache") and isinstance(value, dict):
            value = {}
        elif isinstance(value, (list, dict, set)):
            value = copy.copy(value)
        object.__setattr__(target, key, value)


def wrap_in_place(optimizer: keras.optimizers.Optimizer, **options: Any) -> keras.optimizers.Optimizer:
    """Turn ``optimizer`` itself into a distributed optimizer, keeping its variables
    (used by :func:`hvdlite.tensorflow.keras.load_model`)."""
    defaults = dict(compression=Compression.none, sparse_as_dense=False,
                    gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                    average_aggregated_gradients=False, num_groups=0, groups=None,
                    process_set=None)
    defaults.update(options)
    opts = _options(**defaults)
    base = type(optimizer)
    optimizer.__class__ = _distributed_class(base)
    object.__setattr__(optimizer, "_hvd_options", opts)
    if optimizer.built and opts["backward_passes_per_step"] > 1 and "_hvd_accumulators" not in optimizer.__dict__:
        optimizer._hvd_make_accumulators(list(optimizer._trainable_variables))
    return optimizer
