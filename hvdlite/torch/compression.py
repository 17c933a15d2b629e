"""Gradient compression for allreduce: shrink the bytes on the wire, restore afterwards.

``Compression.none`` and ``Compression.fp16`` behave as in Horovod. ``Compression.bf16``
is an hvdlite addition: bfloat16 keeps float32's exponent range, so large or tiny
gradients do not overflow or flush to zero the way they can in float16, at the cost of
fewer mantissa bits.

A compressor is a class with two static methods::

    compressed, ctx = Compressor.compress(tensor)
    restored = Compressor.decompress(compressed, ctx)

Only floating-point tensors are compressed; integer tensors pass through unchanged.
"""
from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """Interface of a compression algorithm (all methods are static)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Return the tensor to send and a context needed to restore it."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Turn a received (reduced) tensor back into the original dtype."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class _CastCompressor(Compressor):
    """Casts floating-point tensors wider than ``wire_dtype`` down to it and back."""

    wire_dtype: torch.dtype = torch.float16

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), dtype
        return tensor, dtype

    @classmethod
    def decompress(cls, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        if ctx is not None and tensor.dtype != ctx:
            return tensor.to(ctx)
        return tensor


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16 (half the bytes of float32)."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16 (hvdlite addition): float32's range,
    8 bits of mantissa."""

    wire_dtype = torch.bfloat16


class Compression:
    """The available compressors: ``Compression.none``, ``Compression.fp16``,
    ``Compression.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
