"""hvdlite's launcher, ``hvdlite-run`` (also ``python -m hvdlite.runner``).

It turns ``-np``/``-H``/``--hostfile`` and tuning flags into one Open MPI
``mpirun`` command and runs it: :mod:`hvdlite.runner.cli` reads the command line into
a :class:`LaunchConfig`, :mod:`hvdlite.runner.hosts` says where the ranks go,
:mod:`hvdlite.runner.command` makes the ``mpirun`` command and
:mod:`hvdlite.runner.launch` runs it to the end. :func:`run` is
Horovod's function API over the same command line (:mod:`hvdlite.runner.function`).
Importing this package does not load hvdlite's compiled core or any framework.
"""

from hvdlite.runner.cli import main, parse_args
from hvdlite.runner.command import build_mpirun_command
from hvdlite.runner.config import LaunchConfig
from hvdlite.runner.mpirun import LaunchError, find_mpirun
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
