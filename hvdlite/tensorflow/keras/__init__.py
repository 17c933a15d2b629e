"""hvdlite for Keras 3 on TensorFlow: ``import hvdlite.tensorflow.keras as hvd`` (or
``import hvdlite.keras as hvd``) in place of ``import horovod.tensorflow.keras as hvd``
(``horovod.keras``). Keras must run on its TensorFlow backend.

Typical use with ``model.fit``::

    import hvdlite.tensorflow.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x_shard, y_shard, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.01 * hvd.size(), warmup_epochs=3),
    ], verbose=1 if hvd.rank() == 0 else 0)

The callbacks are also importable from this module directly (an hvdlite addition).
The collective functions here (``allreduce``, ``allgather``, ``broadcast``,
``reducescatter``) take NumPy-compatible values or tensors and return a ``tf.Tensor``,
as Horovod's Keras module does; :mod:`hvdlite.tensorflow` has the full set of
collectives (process sets, async names, gradients).
"""
from __future__ import annotations

from typing import Any, Sequence

import keras
import tensorflow as tf

from hvdlite.tensorflow.keras_backend import wrong_keras_backend

if (_why := wrong_keras_backend("hvdlite.tensorflow.keras")) is not None:
    raise ImportError(_why)

from hvdlite.common.basics import (init, shutdown, is_initialized, rank, size, local_rank,
                                   local_size, cross_rank, cross_size, mpi_threads_supported,
                                   mpi_enabled, mpi_built, gloo_enabled, gloo_built, nccl_built,
                                   ddl_built, ccl_built, cuda_built, rocm_built,
                                   start_timeline, stop_timeline)
from hvdlite.common.exceptions import (HvdliteError, HorovodInternalError, HostsUpdatedInterrupt,
                                       NotInitializedError)
from hvdlite.tensorflow import mpi_ops as _mpi
from hvdlite.tensorflow.compression import Compression, Compressor
from hvdlite.common.process_sets import ProcessSet, add_process_set, remove_process_set
from hvdlite.tensorflow.functions import (broadcast_object, allgather_object, broadcast_variables,
                                          broadcast_global_variables)
from hvdlite.tensorflow.mpi_ops import (Average, Sum, Adasum, Min, Max, Product,
                                        global_process_set)
from hvdlite.tensorflow.keras import callbacks, elastic
from hvdlite.tensorflow.keras.callbacks import (BroadcastGlobalVariablesCallback,
                                                MetricAverageCallback,
                                                LearningRateScheduleCallback,
                                                LearningRateWarmupCallback,
                                                BestModelCheckpoint)
from hvdlite.tensorflow.sync_batch_norm import SyncBatchNormalization
from hvdlite.tensorflow.keras.optimizer import (DistributedOptimizer, PartialDistributedOptimizer,
                                                wrap_in_place as _wrap_in_place)


def _evaluated(result: Any) -> Any:
    """A Keras-level collective's result as Horovod's Keras module gives it: the
    ``tf.Tensor`` itself eagerly (and, hvdlite's addition, inside ``tf.function``, where
    it is a symbolic tensor); in a TensorFlow 1 graph, its value (NumPy), computed with
    the default session or a new one on the graph, as Horovod runs it with Keras's
    session."""
    if tf.executing_eagerly() or getattr(tf.compat.v1.get_default_graph(), "building_function", False):
        return result
    session = tf.compat.v1.get_default_session()
    if session is not None:
        return session.run(result)
    with tf.compat.v1.Session() as session:
        return session.run(result)


def allreduce(value: Any, name: str | None = None, average: bool | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: int | None = None, compression: type[Compressor] = Compression.none) -> Any:
    """Allreduce a tensor-like value over all ranks (``op`` defaults to ``Average``).
    Returns a ``tf.Tensor``, as Horovod's Keras module does (NumPy in a TensorFlow 1
    graph, which it runs)."""
    return _evaluated(_mpi.allreduce(tf.convert_to_tensor(value), average=average,
                                     compression=compression, op=op,
                                     prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor, name=name))


def allgather(value: Any, name: str | None = None) -> Any:
    """Concatenate a tensor-like value from every rank along dimension 0
    (``tf.Tensor`` result, as :func:`allreduce`)."""
    return _evaluated(_mpi.allgather(tf.convert_to_tensor(value), name=name))


def broadcast(value: Any, root_rank: int, name: str | None = None) -> Any:
    """Return ``root_rank``'s value on every rank (``tf.Tensor`` result, as
    :func:`allreduce`)."""
    return _evaluated(_mpi.broadcast(tf.convert_to_tensor(value), root_rank, name=name))


def reducescatter(value: Any, name: str | None = None, op: int = Average) -> Any:
    """Reduce over ranks and return this rank's block of rows (``tf.Tensor`` result, as
    :func:`allreduce`)."""
    return _evaluated(_mpi.reducescatter(tf.convert_to_tensor(value), op=op, name=name))


def load_model(filepath: Any, custom_optimizers: Sequence[type] | None = None,
               custom_objects: dict[str, Any] | None = None,
               compression: type[Compressor] = Compression.none, legacy_opts: bool = False,
               **optimizer_options: Any) -> keras.Model:
    """Load a saved Keras model (``.keras`` file) and make its restored optimizer a
    distributed one, keeping the optimizer's saved state (slots, iterations).

    ``custom_optimizers``: optimizer classes the file refers to that Keras does not know;
    ``custom_objects``: as for ``keras.models.load_model``. Further keyword arguments
    (``sparse_as_dense``, ``op``, ``gradient_predivide_factor``, ``backward_passes_per_step``,
    ...) configure the wrapper as in :func:`DistributedOptimizer`. Models saved with a
    ``DistributedOptimizer`` load with plain Keras too (the saved optimizer is the
    wrapped one's class). ``legacy_opts=True`` (Horovod's switch for
    ``tf.keras.optimizers.legacy``) raises ``ValueError``: Keras 3 has no legacy optimizers.
    """
    if legacy_opts:
        raise ValueError("load_model(legacy_opts=True): Keras 3 has no legacy optimizers; "
                         "leave legacy_opts=False")
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects.setdefault(cls.__name__, cls)
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        _wrap_in_place(optimizer, compression=compression, **optimizer_options)
    return model


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "start_timeline", "stop_timeline",
    "HvdliteError", "HorovodInternalError", "NotInitializedError",
    "Compression", "Compressor", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "allreduce", "allgather", "broadcast", "reducescatter",
    "broadcast_object", "allgather_object", "broadcast_variables", "broadcast_global_variables",
    "DistributedOptimizer", "PartialDistributedOptimizer", "load_model", "callbacks", "elastic",
    "HostsUpdatedInterrupt",
    "BroadcastGlobalVariablesCallback", "MetricAverageCallback",
    "LearningRateScheduleCallback", "LearningRateWarmupCallback", "BestModelCheckpoint",
    "SyncBatchNormalization",
]
