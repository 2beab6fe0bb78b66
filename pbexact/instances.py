"""Microworld benchmarks of `sec:microworld`, deterministic from a seed, and a random table.

Each tabulates to a J table over all 2^d vertices (index h, z_i = bit i-1 of h); NNLoss is also a
torch module, so that methods which differentiate J (CP, ST, REBAR, RELAX) can use it. The random
table (iid standard normal values) is no benchmark of the paper: it is one's own instance for the
exact variance tools.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from pbexact.errors import check_d
from pbexact.vertices import vertices

#: Batches of uniform points that set NNLoss's normalization statistics, and their size.
NN_CALIBRATION_BATCHES = 10
NN_CALIBRATION_SIZE = 1000


def exponential_tabular_loss(d: int, seed: int) -> np.ndarray:
    """ExponentialTabularLoss: E_h ~ Exp(rate 1.5) iid, mapped affinely so that max_h E_h -> -1
    and min_h E_h -> 1; shape (2^d,)."""
    d = check_d(d)
    e = np.random.default_rng(seed).exponential(scale=1 / 1.5, size=2**d)
    return 1 - 2 * (e - e.min()) / (e.max() - e.min())


class NNLoss(nn.Module):
    """NNLoss: J(z) = N(2z - 1) for a fixed network N with 9 hidden layers of width 20.

    Each hidden layer is Linear (no bias, weights +-1 with probability 1/2), BatchNorm1d without
    affine parameters, LeakyReLU; the output is Linear(20, 1) then BatchNorm1d(1) without affine.
    The normalization statistics are the cumulative averages over NN_CALIBRATION_BATCHES forward
    passes in training mode on NN_CALIBRATION_SIZE points uniform on [0, 1]^d, then frozen (eval
    mode). float64 throughout; input z of shape (..., d) (any real values), output shape (...).
    """

    def __init__(self, d: int, seed: int, width: int = 20, hidden_layers: int = 9) -> None:
        super().__init__()
        self.d = check_d(d)
        gen = torch.Generator().manual_seed(seed)
        layers: list[nn.Module] = []
        fan_in = d
        for _ in range(hidden_layers):
            layers += [self._sign_linear(fan_in, width, gen), self._norm(width), nn.LeakyReLU()]
            fan_in = width
        layers += [self._sign_linear(fan_in, 1, gen), self._norm(1)]
        self.net = nn.Sequential(*layers).to(torch.float64)
        self.net.train()
        with torch.no_grad():
            for _ in range(NN_CALIBRATION_BATCHES):
                u = torch.rand(NN_CALIBRATION_SIZE, d, generator=gen, dtype=torch.float64)
                self.net(2 * u - 1)
        self.eval()
        for p in self.parameters():
            p.requires_grad_(False)

    @staticmethod
    def _sign_linear(fan_in: int, fan_out: int, gen: torch.Generator) -> nn.Linear:
        layer = nn.Linear(fan_in, fan_out, bias=False)
        with torch.no_grad():
            signs = torch.randint(0, 2, (fan_out, fan_in), generator=gen) * 2 - 1
            layer.weight.copy_(signs.to(layer.weight.dtype))
        return layer

    @staticmethod
    def _norm(width: int) -> nn.BatchNorm1d:
        return nn.BatchNorm1d(width, affine=False, momentum=None)  # momentum=None: plain average

    def train(self, mode: bool = True) -> NNLoss:
        # The statistics are fixed once calibrated: J(z) must not depend on the batch.
        return super().train(False) if hasattr(self, "d") and mode else super().train(mode)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z = torch.as_tensor(z, dtype=torch.float64)
        batch = z.shape[:-1]
        out = self.net(2 * z.reshape(-1, self.d) - 1)
        return out.reshape(batch)

    def table(self) -> np.ndarray:
        """J at every vertex, shape (2^d,)."""
        with torch.no_grad():
            return self.forward(torch.from_numpy(vertices(self.d))).numpy().copy()


def random_table(d: int, seed: int) -> np.ndarray:
    """A random instance: J(z) iid standard normal over the 2^d vertices; shape (2^d,)."""
    d = check_d(d)
    return np.random.default_rng(seed).standard_normal(2**d)


#: The paper's microworld benchmarks.
BENCHMARKS = ("exponential", "nnloss")
#: Every table :func:`benchmark_table` builds: the benchmarks and the random instance.
TABLES = (*BENCHMARKS, "random")


def benchmark_table(name: str, d: int, seed: int = 0) -> np.ndarray:
    """The J table of a microworld benchmark by name (exponential or nnloss), or the random
    instance (``random``, :func:`random_table`)."""
    from pbexact.errors import PBInputError

    if name == "exponential":
        return exponential_tabular_loss(d, seed)
    if name == "nnloss":
        return NNLoss(d, seed).table()
    if name == "random":
        return random_table(d, seed)
    raise PBInputError(f"unknown benchmark {name!r}; choose one of {', '.join(TABLES)}")
