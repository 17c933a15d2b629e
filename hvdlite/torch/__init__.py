"""hvdlite for PyTorch: ``import hvdlite.torch as hvd`` in place of
``import horovod.torch as hvd``.

A typical training script changes in four places::

    import hvdlite.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

and is launched with ``hvdlite-run -np 4 python train.py`` (or ``mpirun -np 4 ...``).
"""
from __future__ import annotations

from hvdlite.common.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built,
                                   gloo_built, gloo_enabled, init, is_homogeneous,
                                   is_initialized, local_rank,
                                   local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                                   nccl_built, rank, rocm_built, shutdown, size, start_timeline,
                                   stop_timeline)
from hvdlite.common.exceptions import (HorovodInternalError, HostsUpdatedInterrupt, HvdliteError,
                                       NotInitializedError)
from hvdlite.torch.compression import Compression
from hvdlite.torch.functions import (allgather_object, broadcast_object,
                                     broadcast_optimizer_state, broadcast_parameters)
from hvdlite.common.process_sets import (ProcessSet, add_process_set, global_process_set,
                                         remove_process_set)
from hvdlite.torch.mpi_ops import (Adasum, Average, Handle, Max, Min, Product, Sum,
                                   allgather, allgather_async, allreduce, allreduce_,
                                   allreduce_async, allreduce_async_, alltoall, alltoall_async,
                                   barrier, broadcast, broadcast_, broadcast_async,
                                   broadcast_async_, grouped_allgather,
                                   grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
                                   grouped_allreduce_async, grouped_allreduce_async_,
                                   grouped_reducescatter, grouped_reducescatter_async, join, poll,
                                   reducescatter, reducescatter_async, sparse_allreduce_async,
                                   synchronize)
from hvdlite.torch.optimizer import DistributedOptimizer
from hvdlite.torch.sync_batch_norm import SyncBatchNorm
from hvdlite.torch.zero import ZeroRedundancyOptimizer
from hvdlite.torch.onebit import OneBitAdam
from hvdlite.torch import elastic


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built", "start_timeline", "stop_timeline",
    "HorovodInternalError", "HostsUpdatedInterrupt", "HvdliteError", "NotInitializedError",
    "elastic",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "Handle", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "poll", "synchronize",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "sparse_allreduce_async",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "barrier", "join",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "Compression", "DistributedOptimizer", "SyncBatchNorm", "ZeroRedundancyOptimizer", "OneBitAdam",
]
