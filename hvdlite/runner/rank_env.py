"""Horovod's ``horovod.runner.common.util.env.get_env_rank_and_size``: a process's rank
and the job's size as its launcher put them in the environment, read without starting
MPI or hvdlite."""
from __future__ import annotations

import os

__all__ = ["get_env_rank_and_size"]

# Horovod's launcher (Gloo mode), Open MPI's mpirun (hence hvdlite-run), and MPICH's
# Hydra and other PMI launchers; the first pair found wins, in this order.
_RANK_AND_SIZE_VARIABLES = (
    ("HOROVOD_RANK", "HOROVOD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
)


def get_env_rank_and_size() -> tuple[int, int]:
    """``(rank, size)`` from the first launcher's pair of variables that is set, or
    ``(0, 1)`` when none is (a process started without a launcher is a job of one).

    ``RuntimeError`` if only one variable of a pair is set; ``ValueError`` if a value is
    not an integer."""
    for rank_var, size_var in _RANK_AND_SIZE_VARIABLES:
        rank = os.environ.get(rank_var)
        size = os.environ.get(size_var)
        if rank is not None and size is not None:
            return int(rank), int(size)
        if rank is not None or size is not None:
            missing, found = (size_var, rank_var) if rank is not None else (rank_var, size_var)
            raise RuntimeError(f"cannot tell this process's rank and the job's size: {found} is set "
                               f"but {missing} is not")
    return 0, 1
