"""The Dirichlet copula of ARMS (`alg:orig_arms`, `alg:iter_dir`, `sec:app_true_var`).

In one dimension, ARMS draws d ~ Dirichlet(1, ..., 1) over n samples, maps each d^(s) through
the marginal CDF F(x) = 1 - (1 - x)^(n-1) to u~^(s), and sets
  z~^(s) = 1[u~^(s) <= theta]      if theta > 0.5,
  z~^(s) = 1[1 - u~^(s) <= theta]  if theta <= 0.5 (theta = 0.5 exactly takes this branch).
So z~^(s) = 1 iff d^(s) < c with c = F^{-1}(theta) = 1 - (1 - theta)^(1/(n-1)) in the first
branch, and iff d^(s) > c(1 - theta) in the second. The probability that a given set B of samples
all have d > c is (1 - |B| c)_+^(n-1), so any ordered pattern's probability follows by
inclusion-exclusion. It depends only on how many samples are 1 (exchangeability).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from . import arrays
from .errors import check_n, check_theta

Array = Any


def dirichlet_threshold(theta: Array, n: int) -> Array:
    """c = F^{-1}(theta) = 1 - (1 - theta)^(1/(n-1)), the Dirichlet level of u~ = theta."""
    return 1 - (1 - theta) ** (1.0 / (n - 1))


def arms_correlation(theta: Array, n: int) -> Array:
    """rho_i = Corr(z~^(s)_i, z~^(s')_i), s != s' (`alg:orig_arms`); 0 where theta_i is 0 or 1
    (the samples are then constant and their score is zero). numpy or torch, shape of theta."""
    xp = arrays.namespace(theta)
    m = xp.where(theta > 0.5, 1 - theta, theta)  # the branch's "theta" in the paper's formula
    inside = (theta > 0) & (theta < 1)
    var = xp.where(inside, theta * (1 - theta), 1.0)
    both = xp.clip(2 * m ** (1.0 / (n - 1)) - 1, 0.0, None) ** (n - 1)
    return xp.where(inside, (both - m**2) / var, 0.0)


def antithetic_correlation(theta: Array) -> Array:
    """rho_i = Corr(z_i, z~_i) of an antithetic pair z = 1[u < theta], z~ = 1[1 - u < theta],
    u ~ U(0, 1) (DisARM): P(z_i = 1, z~_i = 0) = min(theta, 1 - theta), so
    rho = -min(theta, 1 - theta) / max(theta, 1 - theta) and 1 / (1 - rho) = max(theta, 1 - theta)
    (sigma(|r|) for sigmoid logits); 0 where theta_i is 0 or 1. numpy or torch, shape of theta."""
    xp = arrays.namespace(theta)
    low = xp.minimum(theta, 1 - theta)
    inside = (theta > 0) & (theta < 1)
    return xp.where(inside, -low / xp.where(inside, 1 - low, 1.0), 0.0)


def antithetic_pair_law(theta: np.ndarray) -> np.ndarray:
    """q[..., i, w]: law of one antithetic pair in dimension i, w = z_i + 2 z~_i, shape
    (..., d, 4): P(1, 0) = P(0, 1) = min(theta, 1 - theta), P(1, 1) = (2 theta - 1)_+,
    P(0, 0) = (1 - 2 theta)_+. Exchangeable (u and 1 - u have one law)."""
    theta = check_theta(theta)
    low = np.minimum(theta, 1 - theta)
    return np.stack(
        [np.clip(1 - 2 * theta, 0.0, None), low, low, np.clip(2 * theta - 1, 0.0, None)], axis=-1
    )


def arms_bits(u_tilde: Array, theta: Array) -> Array:
    """z~ from copula uniforms u~ of shape (..., n, d) and theta of shape (d,) or (..., d)
    (`alg:orig_arms`); a batch of thetas gets its own n samples: theta is broadcast over the
    sample axis."""
    xp = arrays.namespace(u_tilde)
    t = theta[..., None, :]
    return xp.where(t > 0.5, u_tilde <= t, 1 - u_tilde <= t) * 1.0


def _upper_tail(c: np.ndarray, count: np.ndarray, n: int) -> np.ndarray:
    """P(d^(s) > c for `count` given samples) = (1 - count c)_+^(n-1)."""
    return np.clip(1 - count * c, 0.0, None) ** (n - 1)


@lru_cache(maxsize=64)
def _inclusion_exclusion_matrix(n: int) -> np.ndarray:
    """A[below, j] = (-1)^t C(below, t) for j = n - below + t: row ``below`` combines the upper
    tails (1 - j c)_+^(n-1), j = 0..n, into one ordered pattern's probability."""
    A = np.zeros((n + 1, n + 1))
    for below in range(n + 1):
        for t in range(below + 1):
            A[below, n - below + t] = (-1) ** t * math.comb(below, t)
    return A


def ordered_pattern_probability(c: np.ndarray, n: int, below: int) -> np.ndarray:
    """P(d^(s) < c for `below` given samples and d^(s) > c for the other n - below), by
    inclusion-exclusion over the `below` samples:
    sum_t (-1)^t C(below, t) (1 - (n - below + t) c)_+^(n-1)."""
    return _all_patterns(np.asarray(c, dtype=np.float64), n)[..., below]


def _all_patterns(c: np.ndarray, n: int) -> np.ndarray:
    """ordered_pattern_probability for below = 0..n at once, shape c.shape + (n+1,)."""
    tails = _upper_tail(c[..., None], np.arange(n + 1, dtype=np.float64), n)
    return tails @ _inclusion_exclusion_matrix(n).T


def pattern_probabilities(theta: np.ndarray, n: int) -> np.ndarray:
    """q[..., i, k]: probability of one given ordered assignment of bits to the n ARMS samples in
    dimension i with k ones, k = 0..n, shape (..., d, n+1). Each row satisfies
    sum_k C(n, k) q[k] = 1.

    Inclusion-exclusion is exact in exact arithmetic; in float64 it loses digits to cancellation
    for large n (fine for the n <= 20 that enumeration can reach).
    """
    n = check_n(n, "ARMS", 2)
    theta = check_theta(theta)
    upper = (theta > 0.5)[..., None]
    c = np.where(upper[..., 0], dirichlet_threshold(theta, n), dirichlet_threshold(1 - theta, n))
    f = _all_patterns(c, n)
    # upper branch: ones are d < c; lower branch: ones are d > c, i.e. zeros are d < c
    out = np.where(upper, f, f[..., ::-1])
    return np.clip(out, 0.0, None)  # only round-off can make a term negative


def joint_one_probability(theta: np.ndarray, n: int, m: int) -> np.ndarray:
    """P(z~^(1) = ... = z~^(m) = 1) for m <= n given samples in one dimension, shape of theta.

    Upper branch: P(all m of d < c) = sum_t (-1)^t C(m, t) (1 - t c)_+^(n-1);
    lower branch: P(all m of d > c') = (1 - m c')_+^(n-1).
    """
    theta = check_theta(theta)
    upper = theta > 0.5
    c_up = dirichlet_threshold(theta, n)
    c_lo = dirichlet_threshold(1 - theta, n)
    up = sum(
        (-1) ** t * math.comb(m, t) * _upper_tail(c_up, np.float64(t), n) for t in range(m + 1)
    )
    lo = _upper_tail(c_lo, np.float64(m), n)
    return np.where(upper, up, lo)


def symbolic_pattern_table(n: int) -> list[dict]:
    """The ARMS copula table of `tab:integral_closed` for any n >= 2, in sympy.

    Rows by k = number of samples with z = 1 (d < c); each row is a list of pieces
    (lo, hi, polynomial in c) on the break points 0, 1/n, 1/(n-1), ..., 1/2, 1, adjacent equal
    pieces merged. This is the upper branch (theta > 0.5) in the variable c = F^{-1}(theta); the
    lower branch reads row n - k at c = F^{-1}(1 - theta) (the table's caption).
    """
    import sympy as sp

    n = check_n(n, "ARMS", 2)
    c = sp.Symbol("c")
    breaks = [sp.Integer(0)] + [sp.Rational(1, m) for m in range(n, 1, -1)] + [sp.Integer(1)]
    rows = []
    for k in range(n + 1):
        pieces: list[dict] = []
        for lo, hi in zip(breaks[:-1], breaks[1:]):
            # on (lo, hi), (1 - j c) > 0 iff j < 1/c, i.e. j * hi <= 1
            expr = sum(
                (-1) ** t * sp.binomial(k, t) * (1 - (n - k + t) * c) ** (n - 1)
                for t in range(k + 1)
                if (n - k + t) * hi <= 1
            )
            expr = sp.factor(sp.expand(sp.sympify(expr)))
            if pieces and sp.expand(pieces[-1]["expr"] - expr) == 0:
                pieces[-1]["hi"] = hi
            else:
                pieces.append({"lo": lo, "hi": hi, "expr": expr})
        rows.append({"ones": k, "pieces": pieces})
    return rows
