"""Gradient compression, framework-neutral part (Horovod's ``hvd.Compression``).

A compressor is a class with two static methods::

    compressed, ctx = Compressor.compress(tensor)
    restored = Compressor.decompress(compressed, ctx)

``Compression.none`` and ``Compression.fp16`` behave as in Horovod. ``Compression.bf16``
is an hvdlite addition: bfloat16 keeps float32's exponent range, so large or tiny
gradients do not overflow or flush to zero the way they can in float16, at the cost of
fewer mantissa bits. Only floating-point tensors are compressed; integer tensors pass
through unchanged. Each adapter supplies the two framework operations a cast needs.
"""
from __future__ import annotations

from typing import Any


class Compressor:
    """Interface of a compression algorithm (all methods are static)."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """Return the tensor to send and a context needed to restore it."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Turn a received (reduced) tensor back into the original dtype."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class CastCompressor(Compressor):
    """Casts floating-point tensors to ``wire_dtype`` for the wire and back afterwards.
    A framework's subclass defines ``is_floating(dtype)`` and ``cast(tensor, dtype)``."""

    wire_dtype: Any = None

    @staticmethod
    def is_floating(dtype: Any) -> bool:
        raise NotImplementedError

    @staticmethod
    def cast(tensor: Any, dtype: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:
        dtype = tensor.dtype
        if cls.is_floating(dtype) and dtype != cls.wire_dtype:
            return cls.cast(tensor, cls.wire_dtype), dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:
        if ctx is None or tensor.dtype == ctx:
            return tensor
        return cls.cast(tensor, ctx)
