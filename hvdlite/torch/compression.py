"""Gradient compression for the PyTorch adapter: ``Compression.none``, ``.fp16`` and
``.bf16`` (an hvdlite addition); see :mod:`hvdlite.common.compression`."""
from __future__ import annotations

import math
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


class TopKCompressor:
    """Top-k sparsification with error feedback, for ``DistributedOptimizer`` (an hvdlite
    addition; made by ``Compression.topk(ratio)``).

    Each step a parameter's gradient plus its *residual* (what earlier steps did not send)
    is cut to its ``k = ceil(ratio * elements)`` entries of largest magnitude; those travel
    as indices and values (an allgather, like a sparse gradient), and the rest becomes the
    new residual, so nothing is dropped for good, only delayed (Stich et al., 2018; Lin et
    al.'s Deep Gradient Compression, 2018, without its momentum correction). Each rank
    keeps its own residuals, one per parameter. See docs/zero.md for the caveats."""

    sparse = True   # DistributedOptimizer sends select()'s result by gathering

    def __init__(self, ratio: float) -> None:
        if not 0 < ratio <= 1:
            raise ValueError(f"Compression.topk: ratio must be in (0, 1], not {ratio}")
        self.ratio = float(ratio)
        self.residuals: dict[str, torch.Tensor] = {}

    def k(self, numel: int) -> int:
        return max(1, min(numel, math.ceil(self.ratio * numel)))

    def select(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        """The entries of ``grad`` (plus the residual of ``name``) to send, as a 1-D sparse
        tensor over the flattened gradient; the residual keeps the others."""
        acc = grad.detach().reshape(-1).clone()
        r = self.residuals.get(name)
        if r is not None and r.shape == acc.shape and r.dtype == acc.dtype and r.device == acc.device:
            acc += r
        idx = acc.abs().topk(self.k(acc.numel()), sorted=False).indices
        values = acc[idx]
        acc[idx] = 0
        self.residuals[name] = acc
        return torch.sparse_coo_tensor(idx.unsqueeze(0), values, acc.shape, check_invariants=False)

    def bytes_sent(self, numel: int, element_size: int, ranks: int) -> int:
        """Bytes one rank sends for a gradient of ``numel`` elements (each rank's indices
        and values reach every other rank)."""
        return (ranks - 1) * self.k(numel) * (8 + element_size)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.residuals.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.residuals = {k: v.clone() for k, v in state.items()}

    def compress(self, tensor: Any) -> tuple[Any, Any]:
        raise TypeError("Compression.topk works in DistributedOptimizer only (it keeps a residual per "
                        "parameter); collectives take Compression.none, fp16 or bf16")

    decompress = compress

    def __repr__(self) -> str:
        return f"Compression.topk({self.ratio})"


class Compression:
    """The available compressors: ``Compression.none``, ``Compression.fp16``,
    ``Compression.bf16``, and ``Compression.topk(ratio)`` (error feedback, for
    ``DistributedOptimizer``)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    @staticmethod
    def topk(ratio: float = 0.01) -> TopKCompressor:
        return TopKCompressor(ratio)


__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor", "TopKCompressor"]
