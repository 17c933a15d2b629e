"""Gradient compression for the TensorFlow adapter: ``Compression.none``, ``.fp16`` and
``.bf16`` (an hvdlite addition); see :mod:`hvdlite.common.compression`."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from hvdlite.common.compression import CastCompressor, Compressor, NoneCompressor


class _TFCast(CastCompressor):
    @staticmethod
    def is_floating(dtype: tf.DType) -> bool:
        return dtype.is_floating

    @staticmethod
    def cast(tensor: tf.Tensor, dtype: Any) -> tf.Tensor:
        return tf.cast(tensor, dtype)


class FP16Compressor(_TFCast):
    """Casts floating-point tensors to float16 for the wire and back afterwards."""
    wire_dtype = tf.float16


class BF16Compressor(_TFCast):
    """Casts floating-point tensors to bfloat16 for the wire and back afterwards
    (hvdlite addition: same range as float32, less precision than float16)."""
    wire_dtype = tf.bfloat16


class Compression:
    """The available compressors: ``Compression.none``, ``.fp16`` and ``.bf16``."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]
