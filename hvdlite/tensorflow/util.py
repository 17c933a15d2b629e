"""Horovod's ``horovod.tensorflow.util``: the helper its scripts and tests import from it
(``from horovod.tensorflow.util import _executing_eagerly``, ``hvd.util._executing_eagerly()``)."""
from __future__ import annotations

from hvdlite.tensorflow.eager import _executing_eagerly

__all__ = ["_executing_eagerly"]
