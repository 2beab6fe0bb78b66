"""The networks of :mod:`benchmarks.bench_structured`: a LeNet-5-style CNN (Caffe's LeNet-5,
20-50-500, with BatchNorm so that the BN-scale criterion applies to every coupled group) for
MNIST 1x28x28, and a ResNet-18-width residual network (widths 64-128-256-512, BatchNorm, two
basic blocks per stage) for MNIST padded to 1x32x32; ``width`` scales every hidden width (the
smoke run's small networks)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from pbscale.nets.models import BasicBlock, ResNet20

NUM_CLASSES = 10


def _w(c: int, width: float) -> int:
    return max(2, round(c * width))


class LeNet5(nn.Module):
    """conv 5x5 20 + BN + ReLU + max-pool 2, conv 5x5 50 + BN + ReLU + max-pool 2, Linear
    800-500 + BN + ReLU, Linear 500-10 (the head): x (B, 1, 28, 28) -> logits (B, 10)."""

    input_shape = (1, 28, 28)
    dataset = "mnist"

    def __init__(self, width: float = 1.0) -> None:
        super().__init__()
        c1, c2, h = _w(20, width), _w(50, width), _w(500, width)
        self.conv1 = nn.Conv2d(1, c1, 5)
        self.bn1 = nn.BatchNorm2d(c1)
        self.conv2 = nn.Conv2d(c1, c2, 5)
        self.bn2 = nn.BatchNorm2d(c2)
        self.fc1 = nn.Linear(c2 * 16, h)
        self.bn3 = nn.BatchNorm1d(h)
        self.fc = nn.Linear(h, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.bn3(self.fc1(torch.flatten(x, 1))))
        return self.fc(x)


class ResNet18W(nn.Module):
    """ResNet-18 widths for 1x32x32 inputs: 3x3 conv 64 + BN + ReLU, four stages of two basic
    blocks (64, 128, 256, 512 channels; stride 2 at the start of stages 2-4), global average
    pool, Linear 512-10 (the head); the blocks are ResNet-20's
    (:class:`pbscale.nets.models.BasicBlock`)."""

    input_shape = (1, 32, 32)
    dataset = "mnist"

    def __init__(self, width: float = 1.0) -> None:
        super().__init__()
        widths = [_w(c, width) for c in (64, 128, 256, 512)]
        self.conv = nn.Conv2d(1, widths[0], 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        blocks: list[nn.Module] = []
        c_in = widths[0]
        for stage, c in enumerate(widths):
            for b in range(2):
                blocks.append(BasicBlock(c_in, c, 2 if (stage > 0 and b == 0) else 1))
                c_in = c
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c_in, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(F.relu(self.bn(self.conv(x))))
        return self.fc(h.mean(dim=(2, 3)))


class PaperResNet20(ResNet20):
    """The paper's ResNet-20 (:class:`pbscale.nets.models.ResNet20`: 16-32-64 channels, three
    basic blocks per stage) on CIFAR-10, x (B, 3, 32, 32) -> logits (B, 10), at the paper's
    widths (``--width`` does not scale it: :func:`make`)."""

    input_shape = (3, 32, 32)
    scales_width = False


#: --models choices: name -> class (:func:`make` builds one).
MODELS: dict[str, type[nn.Module]] = {"lenet5": LeNet5, "resnet18": ResNet18W,
                                      "resnet20": PaperResNet20}


def make(name: str, width: float) -> nn.Module:
    """Model ``name`` with every hidden width times ``width``, where its class scales widths
    (``scales_width``; ResNet-20 keeps the paper's)."""
    cls = MODELS[name]
    return cls(width) if getattr(cls, "scales_width", True) else cls()
