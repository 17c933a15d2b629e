"""hvdlite's launcher, ``hvdlite-run`` (also ``python -m hvdlite.runner``).

It turns ``-np``/``-H``/``--hostfile`` and tuning flags into one Open MPI
``mpirun`` command and runs it; see :mod:`hvdlite.runner.launch`. :func:`run` is
Horovod's function API over the same command line (:mod:`hvdlite.runner.function`).
Importing this package does not load hvdlite's compiled core or any framework.
"""

from hvdlite.runner.launch import (
    LaunchConfig,
    LaunchError,
    build_mpirun_command,
    find_mpirun,
    main,
    parse_args,
)
from hvdlite.runner.function import run

__all__ = [
    "LaunchConfig",
    "LaunchError",
    "build_mpirun_command",
    "find_mpirun",
    "main",
    "parse_args",
    "run",
]
