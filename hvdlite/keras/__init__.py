"""``import hvdlite.keras as hvd`` in place of ``import horovod.keras as hvd``.

Keras 3 is the Keras that ships with today's TensorFlow, so Horovod's two Keras modules
(``horovod.keras`` for standalone Keras, ``horovod.tensorflow.keras`` for ``tf.keras``)
are one here: this module is :mod:`hvdlite.tensorflow.keras` under the name Horovod
gave the other one, with the same functions, classes and ``callbacks`` and ``elastic`` submodules.
"""
import sys as _sys

from hvdlite.tensorflow.keras import *  # noqa: F401,F403 - the whole public API
from hvdlite.tensorflow.keras import __all__, callbacks, elastic  # noqa: F401

# `import hvdlite.keras.callbacks` (and `.elastic`) find the same modules as hvd.callbacks.
_sys.modules[__name__ + ".callbacks"] = callbacks
_sys.modules[__name__ + ".elastic"] = elastic
