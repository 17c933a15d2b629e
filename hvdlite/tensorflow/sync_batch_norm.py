"""Keras batch normalization with the statistics of the global batch (all ranks together).

``hvd.SyncBatchNormalization`` is ``keras.layers.BatchNormalization`` whose training-time
mean and variance are those of every rank's batch concatenated: what one process would
compute on the global batch. Inference (``training=False``) uses the moving statistics,
as the Keras layer does, and runs no collective, so a model may be evaluated on one rank
alone.
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from hvdlite.common import basics as _basics
from hvdlite.tensorflow.keras_backend import wrong_keras_backend
from hvdlite.tensorflow.mpi_ops import Sum, allreduce


@keras.saving.register_keras_serializable(package="hvdlite")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization synchronized over all hvdlite ranks.

    Takes the arguments of ``keras.layers.BatchNormalization``. In training, each rank
    sums its inputs and their squares per channel (in float64) and counts its samples;
    one allreduce adds these up, and the mean and (biased) variance follow from the
    totals. Ranks may hold batches of different sizes, and a rank may hold an empty
    one. The gradient flows through the shared statistics to every rank's inputs (the
    allreduce's gradient is the allreduce of the gradients), so training matches one
    process on the global batch. Every rank must call the layer in training mode the
    same number of times, in the same order, as with any collective.

    Keras's own ``synchronized=True`` works through a ``tf.distribute`` strategy, which
    hvdlite does not use; the argument is accepted and has no further effect here.

    As in Horovod, the only positional argument is ``fused``, which must be ``False``
    (Keras 3's layer has no fused kernel); pass the Keras arguments by keyword.
    """

    def __init__(self, fused: bool | None = False, **kwargs: Any) -> None:
        if (why := wrong_keras_backend("hvd.SyncBatchNormalization")) is not None:
            raise RuntimeError(why)
        if fused is not False:
            raise ValueError(f"SyncBatchNormalization does not support fused={fused!r}; "
                             f"leave fused=False")
        kwargs["synchronized"] = False
        super().__init__(**kwargs)

    def _moments(self, inputs: tf.Tensor, mask: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor]:
        if _basics.size() == 1:
            return super()._moments(inputs, mask)
        axes = list(self._reduction_axes)
        x = tf.cast(inputs, tf.float64)
        if mask is None:
            count = tf.reduce_prod(tf.gather(tf.shape(x, out_type=tf.int64), axes))
            count = tf.fill([1], tf.cast(count, tf.float64))
            s1 = tf.reduce_sum(x, axes)
            s2 = tf.reduce_sum(tf.square(x), axes)
        else:
            # Keras's mask has the input's shape without the last (channel) axis.
            w = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(x)), tf.float64)
            count = tf.reshape(tf.reduce_sum(w, axes), [-1])
            s1 = tf.reduce_sum(w * x, axes)
            s2 = tf.reduce_sum(w * tf.square(x), axes)
        stats_shape = tf.shape(s1)
        s1, s2 = tf.reshape(s1, [-1]), tf.reshape(s2, [-1])
        channels = tf.size(s1)
        # One collective per call: [sum, sum of squares, count(s)].
        totals = allreduce(tf.concat([s1, s2, tf.stop_gradient(count)], 0), op=Sum,
                           name="SyncBatchNormalization")
        n = totals[2 * channels:]
        tf.debugging.assert_positive(
            n, message=f"{self.name}: the global batch is empty (no rank has a sample to "
                       f"normalize in training mode)")
        mean = totals[:channels] / n
        # float64 sums keep E[x^2] - E[x]^2 accurate for float32 inputs; clamp rounding.
        variance = tf.maximum(totals[channels:2 * channels] / n - tf.square(mean), 0.0)
        mean = tf.cast(tf.reshape(mean, stats_shape), inputs.dtype)
        variance = tf.cast(tf.reshape(variance, stats_shape), inputs.dtype)
        return mean, variance


__all__ = ["SyncBatchNormalization"]
