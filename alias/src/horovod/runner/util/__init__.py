"""Placeholder for Horovod's ``horovod.runner.util``: only ``threads`` is provided, as
:mod:`hvdlite.runner.threads`."""
