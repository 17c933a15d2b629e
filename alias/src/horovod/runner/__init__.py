"""``horovod.runner`` of hvdlite's horovod alias: :func:`run` (``horovod.runner.run``,
the same function as ``horovod.run``: :func:`hvdlite.run`).

Of Horovod's launcher package only the helpers that scripts and test suites import are
here: ``horovod.runner.common.util.env.get_env_rank_and_size`` and
``horovod.runner.util.threads`` (``in_thread``, ``on_event``). Its internals (``launch``,
``gloo_run``, ``mpi_run``, ``elastic``, ``driver``, ...) are not part of hvdlite; launch
jobs with hvdlite's launcher, ``hvdlite-run`` (also installed as ``horovodrun``), which
takes horovodrun's command line.
"""
from hvdlite.runner.function import run

__all__ = ["run"]
