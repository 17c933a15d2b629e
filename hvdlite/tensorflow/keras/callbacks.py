"""Keras 3 callbacks for data-parallel training, with Horovod's names and meanings."""
from __future__ import annotations

import os
from typing import Any, Callable

import keras
import numpy as np

from hvdlite.common import basics as _basics
from hvdlite.common import ops as _ops
from hvdlite.tensorflow.eager import _Spec, _execute
from hvdlite.tensorflow.functions import broadcast_variables
from hvdlite.tensorflow.gradients import LocalVariables, is_variable


def _optimizer_variables(optimizer: Any) -> list[Any]:
    if optimizer is None:
        return []
    v = optimizer.variables
    return list(v() if callable(v) else v)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Make every rank start from ``root_rank``'s weights and optimizer state.

    At the start of ``fit`` the model's variables and the optimizer's variables are
    broadcast from ``root_rank`` (the optimizer is built first if needed, so even the
    first step runs from identical state everywhere). A model that is not yet built at
    that point is broadcast as soon as it is, at the latest after the first batch (where
    Horovod always does it).
    ``local_variables`` (a variable or a list of them), and variables passed to
    ``register_local_var`` later, are model variables that keep each rank's own value:
    they are left out of the broadcast (the optimizer's variables are all broadcast, as
    in Horovod). ``device`` is accepted for compatibility.
    """

    def __init__(self, root_rank: int = 0, device: str = "",
                 local_variables: Any = None) -> None:
        super().__init__()
        self.root_rank = int(root_rank)
        self.device = device
        self.broadcast_done = False
        self.local_variables = LocalVariables()
        if local_variables is None:
            local_variables = []
        elif is_variable(local_variables):
            local_variables = [local_variables]
        for var in local_variables:
            self.register_local_var(var)

    def register_local_var(self, var: Any) -> None:
        """Leave the model variable ``var`` out of the broadcast."""
        if not is_variable(var):
            raise ValueError("BroadcastGlobalVariablesCallback: local variables must be "
                             f"tf.Variable or keras.Variable objects, got {type(var).__name__}")
        self.local_variables.add(var)

    def _broadcast(self) -> None:
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and not optimizer.built and model.trainable_variables:
            optimizer.build(model.trainable_variables)
        shared = [v for v in model.variables if v not in self.local_variables]
        broadcast_variables(shared, root_rank=self.root_rank)
        broadcast_variables(_optimizer_variables(optimizer), root_rank=self.root_rank)
        self.broadcast_done = True

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not self.broadcast_done and self.model.built and self.model.variables:
            self._broadcast()

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        # A model built by its first step is broadcast before the second one. (Using
        # batch *begin* leaves Keras free to run batch-end callbacks asynchronously.)
        if not self.broadcast_done and self.model.built and self.model.variables:
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of every epoch replace each value in ``logs`` (loss, metrics, and the
    ``val_`` ones) with its average over all ranks, so that callbacks placed after this
    one (checkpointing, early stopping, learning-rate schedules, History) see global
    values. Put it before those callbacks. ``device`` is accepted for compatibility."""

    def __init__(self, device: str = "") -> None:
        super().__init__()
        self.device = device

    def _average_in_place(self, logs: dict | None) -> None:
        if not logs or _basics.size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and _is_number(v))
        arrays = [np.array([float(logs[k])], np.float64) for k in keys]
        specs = [_Spec(_ops.ALLREDUCE, f"MetricAverageCallback.{k}", _ops.Average) for k in keys]
        for k, r in zip(keys, _execute(specs, arrays)):
            logs[k] = float(r[0])

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._average_in_place(logs)


def _is_number(v: Any) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def _get_value(x: Any) -> float:
    return float(keras.ops.convert_to_numpy(x))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` for epochs in
    ``[start_epoch, end_epoch)``.

    ``multiplier`` is a function of the epoch, or a number m meaning
    ``m ** (epoch - start_epoch)`` (so the rate is ``initial_lr`` at ``start_epoch``).
    With ``staircase=True`` the rate changes at the start of each epoch (integer epoch);
    otherwise before every batch, with the fractional epoch
    ``epoch + batch / steps_per_epoch`` (``steps_per_epoch`` is read from ``fit`` when not
    given). ``initial_lr=None`` takes the optimizer's rate at the start of training.

    ``momentum_correction`` (Goyal et al., 2017): when the rate changes from ``old`` to
    ``new``, the optimizer's momentum buffers are scaled by ``new / old`` so that the
    momentum keeps the step size it had. Horovod does this by changing the momentum
    coefficient for one batch; Keras 3 compiles the coefficient of its ``SGD`` and
    ``RMSprop`` into the training step, so hvdlite scales their momentum buffers
    (``SGD.momentums``, ``RMSprop._momentums``) instead -- the same update for plain
    momentum (for Nesterov momentum the look-ahead term keeps the unscaled coefficient).
    Optimizers without momentum are left alone.
    The current rate is written to ``logs['lr']`` at the end of each epoch.
    """

    def __init__(self, initial_lr: float | None, multiplier: Callable[[float], float] | float,
                 start_epoch: int = 0, end_epoch: int | None = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None) -> None:
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch: int | None = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            # exponential decay counted from start_epoch: the rate is initial_lr at start_epoch
            factor = float(multiplier)
            first = start_epoch
            self.multiplier = lambda epoch: factor ** (epoch - first)

    def _autodetect_steps_per_epoch(self) -> int:
        params = self.params or {}
        if params.get("steps"):
            return int(params["steps"])
        if params.get("samples") and params.get("batch_size"):
            return int(params["samples"]) // int(params["batch_size"])
        raise ValueError(f"could not find the number of steps per epoch; pass steps_per_epoch "
                         f"to {type(self).__name__}")

    def _momentum_buffers(self) -> list[Any]:
        opt = self.model.optimizer
        momentum = getattr(opt, "momentum", None)
        if momentum is None or not _is_number(momentum) or float(momentum) == 0.0:
            return []
        # SGD keeps its buffers in ``momentums``, RMSprop in ``_momentums``
        buffers = getattr(opt, "momentums", None) or getattr(opt, "_momentums", None) or []
        return [m for m in buffers if m is not None]

    def _adjust_learning_rate(self, epoch: float) -> None:
        opt = self.model.optimizer
        old_lr = _get_value(opt.learning_rate)
        new_lr = float(self.initial_lr) * float(self.multiplier(epoch))
        opt.learning_rate = new_lr
        if self.momentum_correction and old_lr > 0 and new_lr != old_lr:
            ratio = new_lr / old_lr
            for m in self._momentum_buffers():
                m.assign(m * ratio)

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.initial_lr is None:
            self.initial_lr = _get_value(self.model.optimizer.learning_rate)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.current_epoch = epoch

    def _in_range(self) -> bool:
        e = self.current_epoch
        return e is not None and e >= self.start_epoch and (self.end_epoch is None or e < self.end_epoch)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if not self._in_range():
            return
        if self.staircase:
            if batch == 0:
                self._adjust_learning_rate(self.current_epoch)
        else:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["lr"] = _get_value(self.model.optimizer.learning_rate)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size`` up to ``initial_lr`` over
    ``warmup_epochs`` epochs, adjusting before every batch (Goyal et al., 2017: large
    global batches train well when the rate that was scaled by the number of ranks is
    reached gradually). ``initial_lr`` is the target rate, usually the single-process
    rate times ``hvd.size()``. At fractional epoch e (counted after the batch, so the
    last warm-up batch uses exactly ``initial_lr``) the rate is
    ``initial_lr / size * (e * (size - 1) / warmup_epochs + 1)``.
    ``verbose`` > 0 prints a line on rank 0 when the warm-up ends. See
    :class:`LearningRateScheduleCallback` for ``momentum_correction`` and
    ``steps_per_epoch``."""

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        def multiplier(epoch: float) -> float:
            e = epoch + 1.0 / self.steps_per_epoch
            n = _basics.size()
            return 1.0 / n * (e * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and _basics.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_get_value(self.model.optimizer.learning_rate):g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Horovod's ``BestModelCheckpoint``: a ``keras.callbacks.ModelCheckpoint`` that saves
    only when ``monitor`` improves (``save_best_only=True``), with Horovod's argument
    order (``monitor`` first).

    hvdlite additions: only rank 0 writes the file (every rank may add the callback, and
    no two ranks write the same path), and ``filepath`` may be given here. Horovod
    leaves the path to be set later (its Spark estimator does that); a callback still
    without one when training starts raises ``ValueError``. Put
    :class:`MetricAverageCallback` before it to compare metrics averaged over ranks
    rather than rank 0's own.
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0,
                 save_weights_only: bool = False, mode: str = "auto",
                 save_freq: Any = "epoch", filepath: Any = None,
                 initial_value_threshold: float | None = None) -> None:
        # Keras checks the path's suffix here; a path set later is checked at the start
        # of training.
        placeholder = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(placeholder if filepath is None else filepath, monitor=monitor,
                         verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq,
                         initial_value_threshold=initial_value_threshold)
        if filepath is None:
            self.filepath = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint has no file path: pass filepath=... or set "
                             "its .filepath before training")
        self.filepath = os.fspath(self.filepath)
        suffixes = (".weights.h5",) if self.save_weights_only else (".keras", ".h5")
        if not self.filepath.endswith(suffixes):
            raise ValueError(f"BestModelCheckpoint: the file path must end in {' or '.join(suffixes)} "
                             f"(save_weights_only={self.save_weights_only}), got {self.filepath!r}")
        super().on_train_begin(logs)

    def _save_model(self, epoch: int, batch: int | None, logs: dict | None) -> None:
        if _basics.rank() == 0:
            super()._save_model(epoch, batch, logs)


__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback", "BestModelCheckpoint"]
