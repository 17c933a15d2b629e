"""Horovod's ``horovod.tensorflow.util._executing_eagerly``, which Horovod's own TF tests
import (``from horovod.tensorflow.util import _executing_eagerly``) and call as
``hvd.util._executing_eagerly()`` and ``hvd._executing_eagerly()``."""
from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="tensorflow is not installed (pip install hvdlite[tensorflow])")


def test_executing_eagerly_where_horovod_has_it() -> None:
    import tensorflow as tf

    import hvdlite.tensorflow as hvd
    from hvdlite.tensorflow.util import _executing_eagerly

    assert hvd.util._executing_eagerly is _executing_eagerly is hvd._executing_eagerly
    assert _executing_eagerly() is True
    seen = []

    @tf.function
    def traced():
        seen.append(_executing_eagerly())
        return tf.constant(0)

    traced()
    assert seen == [False]
    with tf.Graph().as_default():
        assert _executing_eagerly() is False
