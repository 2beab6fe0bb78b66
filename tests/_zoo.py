"""A zoo of small user networks of different shapes for tests/test_own_network.py, each with
data of its kind: imported by import path (``_zoo:<factory>``) as a user's module would be.

Every factory builds its network with no arguments; :data:`ZOO` maps each to the arrays it
takes (:func:`arrays`) and the ``--masked`` patterns it is pruned with ("" for the paper's
rule)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class BasicBlock(nn.Module):
    """A ResNet basic block with a 1x1 projection shortcut when the shape changes (a part of the
    test networks of tests/test_pbscale_batched.py and tests/test_channel_groups.py, not a zoo
    entry)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.short(x))


class MLP(nn.Module):
    """Flat images through two Linear layers, its own forward (the vmap path)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(64, 32), nn.Linear(32, 16), nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x.flatten(1)))
        return self.head(torch.relu(self.fc2(h)))


class ResCNN(nn.Module):
    """A small CNN with BatchNorm and a residual block (images (B, 1, 8, 8))."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.conv_a = nn.Conv2d(6, 6, 3, padding=1, bias=False)
        self.bn_a = nn.BatchNorm2d(6)
        self.conv_b = nn.Conv2d(6, 6, 3, padding=1, bias=False)
        self.bn_b = nn.BatchNorm2d(6)
        self.head = nn.Linear(6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))
        r = torch.relu(self.bn_a(self.conv_a(h)))
        h = torch.relu(h + self.bn_b(self.conv_b(r)))
        return self.head(h.mean(dim=(2, 3)))


class TwoConv(nn.Module):
    """LeNet-5's shape in miniature: two convolutions with BatchNorm, each followed by 2x2 max
    pooling, flattened into a Linear head (images (B, 1, 8, 8)); not a zoo entry
    (tests/test_channel_pruning.py scores its channels by hand)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)  # (B, 4, 4, 4)
        h = nn.functional.max_pool2d(torch.relu(self.bn2(self.conv2(h))), 2)  # (B, 6, 2, 2)
        return self.fc(h.flatten(1))


def depthwise() -> nn.Module:
    """Depthwise, grouped and pointwise convolutions with pooling, an nn.Sequential (the folded
    path); RGB images (B, 3, 8, 8)."""
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1, groups=3), nn.ReLU(),
        nn.Conv2d(6, 6, 3, padding=1, groups=2), nn.BatchNorm2d(6), nn.ReLU(),
        nn.Conv2d(6, 8, 1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 10))


def conv1d() -> nn.Module:
    """1-D convolutions over float sequences (B, 2, 16)."""
    return nn.Sequential(nn.Conv1d(2, 8, 5, padding=2), nn.ReLU(), nn.Conv1d(8, 8, 3),
                         nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(8, 10))


class Embed(nn.Module):
    """An embedding of integer ids (B, 6) averaged, then two Linear layers; its embedding is
    masked too (``--masked``)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 12)
        self.fc = nn.Linear(12, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc(self.emb(x).mean(1))))


class Tied(nn.Module):
    """Two layers sharing one weight (tied), which stays dense, and one masked layer."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(64, 16)
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)
        self.b.weight = self.a.weight
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x.flatten(1)))
        h = torch.relu(self.b(torch.relu(self.a(h))))
        return self.head(h)


def regressor() -> nn.Module:
    """Float inputs (B, 5) to one float output (B, 1): a regression."""
    return nn.Sequential(nn.Linear(5, 32), nn.Tanh(), nn.Linear(32, 16), nn.Tanh(),
                         nn.Linear(16, 1))


def arrays(kind: str, n_train: int = 160, n_test: int = 64, seed: int = 0
           ) -> dict[str, np.ndarray]:
    """Learnable random data of ``kind``: "gray" (uint8 (N, 1, 8, 8)), "rgb" (uint8
    (N, 3, 8, 8)), "seq" (float32 (N, 2, 16)), "ids" (int64 (N, 6) in [0, 50)), "reg" (float32
    (N, 5) with float targets (N, 1)); labels 0-9 from a fixed random rule of the inputs."""
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    if kind == "gray":
        x = rng.integers(0, 256, (n, 1, 8, 8), dtype=np.uint8)
    elif kind == "rgb":
        x = rng.integers(0, 256, (n, 3, 8, 8), dtype=np.uint8)
    elif kind == "seq":
        x = rng.standard_normal((n, 2, 16)).astype(np.float32)
    elif kind == "ids":
        x = rng.integers(0, 50, (n, 6), dtype=np.int64)
    else:
        x = rng.standard_normal((n, 5)).astype(np.float32)
        y = (np.sin(x @ rng.standard_normal(5)) + 0.1 * x[:, 0] ** 2)[:, None]
        y = y.astype(np.float32)
        return {"x_train": x[:n_train], "y_train": y[:n_train], "x_test": x[n_train:],
                "y_test": y[n_train:]}
    flat = x.reshape(n, -1).astype(np.float64)
    y = (flat @ rng.standard_normal(flat.shape[1]) > 0).astype(np.int64) * 5 + \
        rng.integers(0, 5, n)
    return {"x_train": x[:n_train], "y_train": y[:n_train].astype(np.int64),
            "x_test": x[n_train:], "y_test": y[n_train:].astype(np.int64)}


#: factory name -> (data kind, --masked patterns)
ZOO = {
    "MLP": ("gray", ""),
    "ResCNN": ("gray", ""),
    "depthwise": ("rgb", ""),
    "conv1d": ("seq", ""),
    "Embed": ("ids", "emb.weight,fc.weight"),
    "Tied": ("gray", ""),
    "regressor": ("reg", ""),
}
