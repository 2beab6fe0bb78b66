"""Continuous relaxations of a Bernoulli(sigmoid(r)) mask at temperature beta, numpy or torch:
the binary concrete (Gumbel-softmax) sample of `ch:other` (Maddison, Mnih and Teh 2017; Jang,
Gu and Poole 2017) and the hard-concrete gate (Louizos, Welling and Kingma 2018); the
quadrature rules over their uniform noise; and the exact moments of their pathwise gradient
when J's extension is multilinear.

With L = log u - log(1 - u) the logistic noise of u ~ U(0, 1) and r the logit (log alpha),

    s = sigmoid((L + r) / beta)                      concrete
    g = min(1, max(0, s (zeta - gamma) + gamma))     hard concrete (concrete: gamma = 0, zeta = 1)

and the relaxed gradient is g_i = dJ/dx_i (g(r, u)) dg_i/dr_i for the extension J. Rounding,
1[s > 1/2] = 1[u > sigmoid(-r)], is exactly z ~ Bern(sigmoid(r)) at every beta (the Gumbel-max
trick), so a relaxation's bias is taken against the gradient of E_theta[J] at
theta = sigmoid(r). Coordinates are independent; every function takes logits r of shape (d,)
(or broadcasting with u) and uniforms u of shape (..., d).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import arrays
from .closed_form import pair_kernels
from .errors import PBInputError, check_table
from .polynomial import true_gradient

Array = Any

#: Hard-concrete stretch interval (gamma, zeta) and temperature beta (Louizos et al. 2018).
HC_GAMMA, HC_ZETA, HC_BETA = -0.1, 1.1, 2.0 / 3.0
#: Where the concrete sample's quadrature panels break, as values of s: its steep middle is
#: integrated apart from its flat tails, which near a vertex (|r| large) squeeze into a short
#: stretch of u at one end.
CONCRETE_PANEL_BREAKS = (0.01, 0.1, 0.5, 0.9, 0.99)
#: Largest d of a tensor-product rule (``nodes ** d`` points).
MAX_TENSOR_D = 4


def logistic_noise(u: Array, eps: float = 0.0) -> Array:
    """log u - log(1 - u) for uniforms u, first clamped to [eps, 1 - eps] when eps > 0."""
    xp = arrays.namespace(u)
    if eps > 0:
        u = arrays.clip(u, eps, 1 - eps)
    return xp.log(u) - xp.log1p(-u)


@dataclass(frozen=True)
class Relaxation:
    """One relaxation of Bern(sigmoid(r)): the gate g(r, u) of the module docstring with
    temperature ``beta`` and stretch interval (``gamma``, ``zeta``); the concrete sample is
    gamma = 0, zeta = 1 (no stretch, no clamp)."""

    name: str
    beta: float = HC_BETA
    gamma: float = 0.0
    zeta: float = 1.0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.beta) and self.beta > 0):
            raise PBInputError(f"{self.name}: the temperature beta must be > 0, got {self.beta}")
        if not (self.gamma <= 0 and self.zeta >= 1):
            raise PBInputError(f"{self.name}: the stretch interval must hold [0, 1], got "
                               f"gamma={self.gamma}, zeta={self.zeta}")

    @property
    def stretched(self) -> bool:
        """Whether the gate is stretched and clamped (point masses at 0 and 1)."""
        return self.gamma != 0 or self.zeta != 1

    def gate(self, r: Array, u: Array, eps: float = 0.0) -> Array:
        """g(r, u), shape of the broadcast of r and u (..., d); differentiable in r (torch).
        ``eps`` clamps u first (pbscale's samplers keep u in [1e-6, 1 - 1e-6])."""
        s = arrays.sigmoid((logistic_noise(u, eps) + r) / self.beta)
        if not self.stretched:
            return s
        return arrays.clip(s * (self.zeta - self.gamma) + self.gamma, 0.0, 1.0)

    def breaks(self) -> tuple[float, ...]:
        """Values of s where the quadrature panels break, increasing: the clamp points
        -gamma / (zeta - gamma), 1/2 and (1 - gamma) / (zeta - gamma) of a stretched gate,
        CONCRETE_PANEL_BREAKS otherwise."""
        if self.stretched:
            width = self.zeta - self.gamma
            return (-self.gamma / width, 0.5, (1 - self.gamma) / width)
        return CONCRETE_PANEL_BREAKS

    def panel_edges(self, r: np.ndarray) -> np.ndarray:
        """The u at which s crosses each break, u = sigmoid(beta logit(q) - r), with 0 and 1:
        shape (d, len(breaks) + 2), increasing along the last axis."""
        q = np.asarray(self.breaks())
        inner = arrays.sigmoid(self.beta * (np.log(q) - np.log1p(-q)) - np.asarray(r)[..., None])
        zeros = np.zeros(inner.shape[:-1] + (1,))
        return np.concatenate([zeros, inner, zeros + 1], axis=-1)


def get_relaxation(name: str, beta: float = HC_BETA) -> Relaxation:
    """The concrete (``concrete``) or hard-concrete (``hardconcrete``, Louizos et al.'s
    stretch) relaxation at temperature beta."""
    if name == "concrete":
        return Relaxation("concrete", beta)
    if name == "hardconcrete":
        return Relaxation("hardconcrete", beta, HC_GAMMA, HC_ZETA)
    raise PBInputError(f"unknown relaxation {name!r}; choose concrete or hardconcrete")


def gauss_legendre(edges: np.ndarray, counts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss-Legendre rule on panels [edges[..., j], edges[..., j + 1]] with counts[j]
    nodes on panel j: nodes and weights of shape (..., sum(counts))."""
    nodes, weights = [], []
    for j, k in enumerate(counts):
        x, w = np.polynomial.legendre.leggauss(k)
        lo, hi = edges[..., j, None], edges[..., j + 1, None]
        nodes.append((lo + hi) / 2 + (hi - lo) / 2 * x)
        weights.append((hi - lo) / 2 * w)
    return np.concatenate(nodes, axis=-1), np.concatenate(weights, axis=-1)


def coordinate_rule(relax: Relaxation, r: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A quadrature rule over u_i ~ U(0, 1) for each coordinate: k Gauss-Legendre nodes on each
    inner panel of :meth:`Relaxation.panel_edges` and half as many (at least one) on the two
    outer ones (one node where a stretched gate is constant 0 or 1 with zero derivative):
    nodes and weights of shape (d, K), the weights of each coordinate summing to 1."""
    if k < 1:
        raise PBInputError(f"a quadrature rule needs at least one node per panel, got {k}")
    tail = 1 if relax.stretched else max(k // 2, 1)
    counts = (tail,) + (k,) * (len(relax.breaks()) - 1) + (tail,)
    return gauss_legendre(relax.panel_edges(np.asarray(r, dtype=np.float64)), counts)


def tensor_rule(nodes: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The product of per-coordinate rules (d, K): points u of shape (K^d, d) and weights
    (K^d,), for d <= MAX_TENSOR_D."""
    d, K = nodes.shape
    if d > MAX_TENSOR_D:
        raise PBInputError(f"tensor-product quadrature goes up to d={MAX_TENSOR_D} ({K}^d "
                           f"points), got d={d}; use Monte Carlo")
    grid = np.stack(np.meshgrid(*nodes, indexing="ij"), axis=-1).reshape(-1, d)
    w = np.prod(np.stack(np.meshgrid(*weights, indexing="ij"), axis=-1), axis=-1).reshape(-1)
    return grid, w


def gate_and_derivative(relax: Relaxation, r: np.ndarray, u: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """g(r, u) and dg/dr (by autograd through :meth:`Relaxation.gate`), for r (d,) and u of
    shape (..., d); numpy arrays of the shape of u."""
    import torch

    rr = torch.as_tensor(np.broadcast_to(r, u.shape).copy(), dtype=torch.float64)
    rr.requires_grad_(True)
    g = relax.gate(rr, torch.as_tensor(u, dtype=torch.float64))
    (dg,) = torch.autograd.grad(g.sum(), rr)
    return g.detach().numpy(), dg.numpy()


def multilinear_relaxed_moments(J: np.ndarray, r: np.ndarray, relax: Relaxation, k: int
                                ) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance, shapes (d,), of the relaxed gradient g_i = dP_J/dx_i(g) dg_i/dr_i for
    the multilinear extension P_J (`eq:multi_poly`) of a J table (2^d,), sigmoid logits r (d,):
    exact up to the 1-D quadrature of :func:`coordinate_rule` (k nodes per panel).

    dP_J/dx_i does not depend on x_i and is multilinear in the others, which are independent,
    so E[g_i] = dP_J/dx_i(m) E[dg_i/dr_i] with m = E[g] per coordinate, and
    E[g_i^2] = E[(dP_J/dx_i)^2] E[(dg_i/dr_i)^2], the first factor being
    sum_{a, b} (-1)^(a+b) K_i(a, b) of the pair kernels
    (`pbexact.closed_form.pair_kernels`) with the second moments of (1 - g_j, g_j): O(d 2^d)
    after d one-dimensional integrals, for any d."""
    r = np.asarray(r, dtype=np.float64)
    d = r.shape[-1]
    J = check_table(J, d)
    nodes, w = coordinate_rule(relax, r, k)
    g, dg = gate_and_derivative(relax, r[:, None], nodes)
    m, m2 = (w * g).sum(-1), (w * g * g).sum(-1)
    a, a2 = (w * dg).sum(-1), (w * dg * dg).sum(-1)
    m = np.clip(m, 0.0, 1.0)
    mean = true_gradient(J, m) * a
    cross = m - m2
    pair = np.stack([np.stack([1 - m - cross, cross], -1), np.stack([cross, m2], -1)], -2)
    K = pair_kernels(J - J.mean(), pair)
    square = K[:, 1, 1] - K[:, 1, 0] - K[:, 0, 1] + K[:, 0, 0]
    return mean, np.maximum(square * a2 - mean**2, 0.0)


def relaxed_gradients(f: Any, r: Any, u: Any, relax: Relaxation, eps: float = 0.0) -> Any:
    """One relaxed-gradient estimate per row of uniforms u (N, d): g = d f(gate(r, u)) / d r
    (torch autograd, the pathwise estimator of the concrete and hard-concrete relaxations),
    r of shape (d,) (torch), f a batched loss (..., d) -> (...); shape (N, d), detached."""
    import torch

    rr = r.detach().expand(u.shape).clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(relax.gate(rr, u, eps)).sum(), rr)
    return g
