"""hvdlite on Spark, with Horovod's API: :func:`run` runs one MPI rank per Spark task of
the active session (``pip install 'hvdlite[spark]'``). See the Spark guide."""
from hvdlite.spark.runner import run, run_elastic

__all__ = ["run", "run_elastic"]
