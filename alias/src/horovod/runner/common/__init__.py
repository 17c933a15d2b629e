"""Placeholder for Horovod's ``horovod.runner.common``: only ``util.env`` is provided."""
