"""The gradient tensors of ResNet-50, built from the architecture (no torchvision needed).

ResNet-50 (He et al., 2015, "Deep Residual Learning for Image Recognition") is a 7x7
stem convolution with batch norm, four stages of bottleneck blocks ([3, 4, 6, 3] blocks,
widths 64/128/256/512, expansion 4 so each stage outputs 4x its width), global average
pooling and a 1000-way fully connected layer. Convolutions have no bias; every batch
norm has a weight and a bias (its running statistics are buffers, not gradients); the
first block of each stage projects its shortcut with a 1x1 convolution and a batch norm.

That gives 161 trainable tensors holding 25,557,032 values, which is what a
data-parallel ResNet-50 training step allreduces every iteration. The names follow
PyTorch's ``torchvision.models.resnet50`` parameter names so that they read familiarly.

Run this file to print the table::

    python benchmarks/resnet50_shapes.py
"""
from __future__ import annotations

import math

BLOCKS_PER_STAGE: tuple[int, ...] = (3, 4, 6, 3)
STAGE_WIDTHS: tuple[int, ...] = (64, 128, 256, 512)
EXPANSION = 4
STEM_WIDTH = 64
NUM_CLASSES = 1000

EXPECTED_COUNT = 161
EXPECTED_TOTAL = 25_557_032


def _conv(out_ch: int, in_ch: int, k: int) -> tuple[int, ...]:
    """Shape of a bias-free convolution's weight: (out, in, k, k)."""
    return (out_ch, in_ch, k, k)


def resnet50_param_shapes(num_classes: int = NUM_CLASSES) -> list[tuple[str, tuple[int, ...]]]:
    """Return ``(name, shape)`` for every trainable tensor of ResNet-50, in forward order.

    A backward pass produces the gradients in roughly the reverse of this order.
    """
    params: list[tuple[str, tuple[int, ...]]] = []

    def batch_norm(prefix: str, channels: int) -> None:
        params.append((f"{prefix}.weight", (channels,)))
        params.append((f"{prefix}.bias", (channels,)))

    params.append(("conv1.weight", _conv(STEM_WIDTH, 3, 7)))
    batch_norm("bn1", STEM_WIDTH)

    in_ch = STEM_WIDTH
    for stage, (n_blocks, width) in enumerate(zip(BLOCKS_PER_STAGE, STAGE_WIDTHS), start=1):
        out_ch = width * EXPANSION
        for block in range(n_blocks):
            p = f"layer{stage}.{block}"
            params.append((f"{p}.conv1.weight", _conv(width, in_ch, 1)))
            batch_norm(f"{p}.bn1", width)
            params.append((f"{p}.conv2.weight", _conv(width, width, 3)))
            batch_norm(f"{p}.bn2", width)
            params.append((f"{p}.conv3.weight", _conv(out_ch, width, 1)))
            batch_norm(f"{p}.bn3", out_ch)
            if block == 0:  # the shortcut changes width (and, after stage 1, stride)
                params.append((f"{p}.downsample.0.weight", _conv(out_ch, in_ch, 1)))
                batch_norm(f"{p}.downsample.1", out_ch)
            in_ch = out_ch

    params.append(("fc.weight", (num_classes, in_ch)))
    params.append(("fc.bias", (num_classes,)))
    return params


def total_elements(shapes: list[tuple[str, tuple[int, ...]]]) -> int:
    """Number of values in all tensors together."""
    return sum(math.prod(s) for _, s in shapes)


RESNET50_SHAPES: list[tuple[str, tuple[int, ...]]] = resnet50_param_shapes()
assert len(RESNET50_SHAPES) == EXPECTED_COUNT, len(RESNET50_SHAPES)
assert total_elements(RESNET50_SHAPES) == EXPECTED_TOTAL, total_elements(RESNET50_SHAPES)


if __name__ == "__main__":
    for name, shape in RESNET50_SHAPES:
        print(f"{name:40s} {str(shape):22s} {math.prod(shape):>10,d}")
    n = total_elements(RESNET50_SHAPES)
    print(f"{len(RESNET50_SHAPES)} tensors, {n:,d} values, "
          f"{n * 4 / 2**20:.1f} MiB as float32")
