"""hvdlite: data-parallel training with Horovod's API.

``import hvdlite as hvd`` gives the framework-neutral API over NumPy arrays;
``hvdlite.torch`` and ``hvdlite.tensorflow`` (with ``.keras``) give the same for
PyTorch and TensorFlow. MPI starts at ``hvd.init()``, not at import.

``import hvdlite`` itself loads no compiled code, so that the launcher
(``hvdlite-run``, ``--check-build``) works even where the engine is not built. The
NumPy collectives (:mod:`hvdlite.mpi_ops`) take their codes from the engine, so they
are imported when one of their names is first used here; so is :func:`run`, the
launcher's function API, so that the framework-neutral API loads no launcher code.
"""
from typing import Any

from hvdlite.common.basics import (
    init, shutdown, is_initialized, rank, size, local_rank, local_size, cross_rank, cross_size,
    is_homogeneous, mpi_threads_supported, mpi_enabled, mpi_built, gloo_enabled, gloo_built,
    nccl_built, ddl_built, ccl_built, cuda_built, rocm_built, start_timeline, stop_timeline,
)
from hvdlite.common.exceptions import HvdliteError, HorovodInternalError, NotInitializedError

__version__ = "0.1.0"
"""hvdlite's own version, not a Horovod one (hvdlite follows Horovod 0.28.1's API)."""

# The launcher's function API, from hvdlite.runner.function on first use.
_LAUNCHER_API = ("run",)

# hvdlite.mpi_ops.__all__ (tests/test_imports.py checks that the two agree).
_NUMPY_OPS = (
    "Average", "Sum", "Min", "Max", "Product", "Adasum",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "allgather", "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "barrier", "join", "poll", "synchronize", "broadcast_object", "allgather_object", "DeviceArray",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
)


def __getattr__(name: str) -> Any:
    """The NumPy collectives and :func:`run`, imported on first use (see the module's
    docstring)."""
    if name in _LAUNCHER_API:
        import hvdlite.runner.function as launcher_api
        globals().update((n, getattr(launcher_api, n)) for n in _LAUNCHER_API)
        return globals()[name]
    if name in _NUMPY_OPS:
        import hvdlite.mpi_ops as numpy_ops  # loads the engine's extension for its codes
        # Bound here once, so that later lookups no longer come to this function.
        globals().update((n, getattr(numpy_ops, n)) for n in _NUMPY_OPS)
        return globals()[name]
    raise AttributeError(f"module 'hvdlite' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NUMPY_OPS) | set(_LAUNCHER_API))


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "start_timeline", "stop_timeline", "HvdliteError", "HorovodInternalError",
    "NotInitializedError", "__version__", *_LAUNCHER_API, *_NUMPY_OPS,
]
