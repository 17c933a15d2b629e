"""Gradient compression for the PyTorch adapter: ``Compression.none``, ``.fp16`` and
``.bf16`` (an hvdlite addition); see :mod:`hvdlite.common.compression`."""
from __future__ import annotations

from typing import Any

import torch

from hvdlite.common.compression import CastCompressor, Compressor, NoneCompressor


class _TorchCast(CastCompressor):
    @staticmethod
    def is_floating(dtype: torch.dtype) -> bool:
        return dtype.is_floating_point

    @staticmethod
    def cast(tensor: torch.Tensor, dtype: Any) -> torch.Tensor:
        return tensor.to(dtype)


class FP16Compressor(_TorchCast):
    """Sends floating-point tensors as float16 (half the bytes of float32)."""

    wire_dtype = torch.float16


class BF16Compressor(_TorchCast):
    """Sends floating-point tensors as bfloat16 (hvdlite addition): float32's range,
    8 bits of mantissa."""

    wire_dtype = torch.bfloat16


class Compression:
    """The available compressors: ``Compression.none``, ``Compression.fp16``,
    ``Compression.bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]
