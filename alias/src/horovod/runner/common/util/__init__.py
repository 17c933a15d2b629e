"""Placeholder for Horovod's ``horovod.runner.common.util``: only ``env`` (``get_env_rank_and_size``) is
provided, as :mod:`hvdlite.runner.rank_env`."""
