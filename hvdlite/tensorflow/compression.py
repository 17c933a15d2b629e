"""Gradient compression for the TensorFlow adapter (Horovod's ``hvd.Compression``).

A compressor turns a tensor into the form sent over the wire and back again:
``compress(tensor) -> (compressed, ctx)`` and ``decompress(compressed, ctx) -> tensor``.
Compression only touches floating-point tensors; integer tensors pass unchanged.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf


class Compressor:
    """Interface of a compression algorithm; subclass and override both methods."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        """Return the tensor to communicate and the context ``decompress`` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        """Undo ``compress`` on the communicated tensor."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor


class _CastCompressor(Compressor):
    wire_dtype: tf.DType = tf.float16

    @classmethod
    def compress(cls, tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        dtype = tensor.dtype
        if dtype.is_floating and dtype != cls.wire_dtype:
            return tf.cast(tensor, cls.wire_dtype), dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor if ctx is None else tf.cast(tensor, ctx)


class FP16Compressor(_CastCompressor):
    """Casts floating-point tensors to float16 for the wire and back afterwards."""
    wire_dtype = tf.float16


class BF16Compressor(_CastCompressor):
    """Casts floating-point tensors to bfloat16 for the wire and back afterwards
    (hvdlite addition: same range as float32, less precision than float16)."""
    wire_dtype = tf.bfloat16


class Compression:
    """The available compressors: ``Compression.none``, ``.fp16`` and ``.bf16``."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
