"""hvdlite: data-parallel training with Horovod's API.

``import hvdlite as hvd`` gives the framework-neutral API over NumPy arrays;
``hvdlite.torch`` and ``hvdlite.tensorflow`` (with ``.keras``) give the same for
PyTorch and TensorFlow. The engine is loaded by ``hvd.init()``, not at import.
"""
from hvdlite.common.basics import (
    init, shutdown, is_initialized, rank, size, local_rank, local_size, cross_rank, cross_size,
    mpi_threads_supported, mpi_enabled, mpi_built, gloo_enabled, gloo_built, nccl_built,
    ddl_built, ccl_built, cuda_built, rocm_built, start_timeline, stop_timeline,
)
from hvdlite.common.exceptions import HvdliteError, HorovodInternalError, NotInitializedError
from hvdlite.mpi_ops import *  # noqa: F401,F403
from hvdlite.mpi_ops import __all__ as _ops_all
from hvdlite.runner.function import run

__version__ = "0.1.0"

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "start_timeline", "stop_timeline", "HvdliteError", "HorovodInternalError",
    "NotInitializedError", "__version__", "run", *_ops_all,
]
