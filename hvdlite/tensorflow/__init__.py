"""hvdlite for TensorFlow 2: ``import hvdlite.tensorflow as hvd`` in place of
``import horovod.tensorflow as hvd``.

Works with the TensorFlow installed (tested with ``tensorflow-cpu==2.21.0``); installing
hvdlite compiles nothing against it. Eagerly, collectives reach hvdlite's engine from
Python; inside graphs (``tf.function``, Keras ``fit``, TensorFlow 1 graphs run by a
``tf.compat.v1.Session``) they are asynchronous ops of a small library that is compiled
against the installed TensorFlow on first use and cached (see
:mod:`hvdlite.tensorflow.mpi_ops` and :mod:`hvdlite.tensorflow._kernels` for how, and for the
limits, notably: no XLA ``jit_compile`` around hvdlite collectives).

Typical custom training loop::

    import hvdlite.tensorflow as hvd
    hvd.init()
    ...
    @tf.function
    def step(x, y, first):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    ...
    hvd.broadcast_variables(model.variables, root_rank=0)  # after the first step,
    hvd.broadcast_variables(opt.variables, root_rank=0)    # or before it once built
"""
from __future__ import annotations

import tensorflow as tf

from hvdlite.common.basics import (init, shutdown, is_initialized, rank, size, local_rank,
                                   local_size, cross_rank, cross_size, is_homogeneous,
                                   mpi_threads_supported,
                                   mpi_enabled, mpi_built, gloo_enabled, gloo_built, nccl_built,
                                   ddl_built, ccl_built, cuda_built, rocm_built,
                                   start_timeline, stop_timeline)
from hvdlite.common.exceptions import (HvdliteError, HorovodInternalError, HostsUpdatedInterrupt,
                                       NotInitializedError)
from hvdlite.tensorflow.compression import Compression, Compressor
from hvdlite.common.process_sets import (ProcessSet, add_process_set, global_process_set,
                                         remove_process_set)
from hvdlite.tensorflow.mpi_ops import (Average, Sum, Adasum, Min, Max, Product,
                                        allreduce, grouped_allreduce, allgather, grouped_allgather,
                                        broadcast, broadcast_, alltoall, reducescatter,
                                        grouped_reducescatter, barrier, join,
                                        size_op, rank_op, local_size_op, local_rank_op,
                                        process_set_included_op)
from hvdlite.tensorflow.functions import (broadcast_variables, broadcast_global_variables,
                                          broadcast_object, broadcast_object_fn, allgather_object)
from hvdlite.tensorflow.gradients import (DistributedGradientTape, PartialDistributedGradientTape,
                                          allreduce_gradients)
from hvdlite.tensorflow.sync_batch_norm import SyncBatchNormalization
from hvdlite.tensorflow import elastic
from hvdlite.tensorflow import util
from hvdlite.tensorflow.util import _executing_eagerly  # noqa: F401 - Horovod's package has it
from hvdlite.tensorflow.keras_backend import make_optimizer_variables_callable as _callable_variables

_callable_variables()  # opt.variables() as Keras 2 wrote it (see docs/keras3.md)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="",
                         device_sparse="", compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True):
    """Horovod's ``hvd.DistributedOptimizer`` of the TensorFlow module, with its arguments
    in its order.

    For a TensorFlow 1 optimizer (``tf.compat.v1.train.Optimizer``), a wrapper whose
    ``compute_gradients`` combines the gradients over the ranks (and ``minimize``
    through it), for graphs run by a ``tf.compat.v1.Session``; see
    :mod:`hvdlite.tensorflow.legacy_optimizer`. For a Keras 3 optimizer,
    :func:`hvdlite.tensorflow.keras.DistributedOptimizer` (``use_locking`` is accepted
    and ignored there; unlike Horovod, which drops ``op``, ``num_groups`` and ``groups``
    on that path, hvdlite applies them). ``device_dense`` and ``device_sparse`` are
    accepted for compatibility."""
    import keras
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        from hvdlite.tensorflow.legacy_optimizer import distributed_legacy_optimizer
        return distributed_legacy_optimizer(
            optimizer, name, use_locking, compression, sparse_as_dense, backward_passes_per_step,
            op, gradient_predivide_factor, average_aggregated_gradients, num_groups, groups,
            process_set, scale_local_gradients)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError("hvd.DistributedOptimizer wraps a Keras 3 optimizer or a TensorFlow 1 "
                        f"tf.compat.v1.train.Optimizer, not {type(optimizer).__name__}; for other "
                        "training loops use hvd.DistributedGradientTape")
    from hvdlite.tensorflow.keras.optimizer import DistributedOptimizer as _keras_distributed
    del use_locking
    return _keras_distributed(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients)


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "start_timeline", "stop_timeline",
    "HvdliteError", "HorovodInternalError", "NotInitializedError",
    "Compression", "Compressor",
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set",
    "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast",
    "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter", "barrier", "join",
    "size_op", "rank_op", "local_size_op", "local_rank_op", "process_set_included_op",
    "broadcast_variables", "broadcast_global_variables", "broadcast_object",
    "broadcast_object_fn", "allgather_object",
    "DistributedGradientTape", "PartialDistributedGradientTape", "DistributedOptimizer",
    "allreduce_gradients", "SyncBatchNormalization", "elastic", "HostsUpdatedInterrupt",
]
