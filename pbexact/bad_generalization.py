"""The unwanted-generalization construction of `thm:mc_bad_gen_2` and the rate of
`cor:mc_bad_gen_2` (`sec:mc_bad_gen`).

`thm:mc_bad_gen_2` builds a J table with the value m at a target vertex z* and
M0 - d_H(z, z*) dM / d elsewhere (:func:`mc_bad_gen_table`); the true gradient points towards z*
in coordinate i, i.e. the alignment (-grad E[J])_i (grad p_theta(z*))_i of `eq:mc_bad_gen_inner`
(:func:`alignment`) is >= 0, iff m <= M0 - dM / (d prod_{j != i} p_theta_j(z*_j))
(:func:`mc_bad_gen_threshold`). `cor:mc_bad_gen_2`: with every p_theta_i(z*_i) = 1 - epsilon the
largest aligned m (:func:`largest_aligned_m`) is M0 - dM / (d (1 - epsilon)^(d-1)), so the gap
M0 - m* shrinks like c^(d-1) / d with c = 1 / (1 - epsilon) (:func:`corollary_fit`,
:func:`first_binding_d`). The checks live in `analysis.exact.bad_generalization_checks`, the
command lines in `analysis.theorems` and `analysis.counterexamples`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from scipy import stats

from .polynomial import true_gradient
from .sampling import vertex_index
from .vertices import vertices


def mc_bad_gen_table(d: int, z_star: np.ndarray, m: float, M0: float, dM: float) -> np.ndarray:
    """J of `thm:mc_bad_gen_2`: m at z*, M0 - d_H(z, z*) dM / d elsewhere, shape (2^d,)."""
    v = vertices(d)
    hamming = np.abs(v - np.asarray(z_star, dtype=float)).sum(-1)
    J = M0 - hamming * dM / d
    J[vertex_index(np.asarray(z_star, dtype=float))] = m
    return J


def mc_bad_gen_threshold(d: int, p_star: np.ndarray, M0: float, dM: float) -> np.ndarray:
    """The right-hand side of `eq:mc_bad_gen_inner` for every i:
    M0 - dM / (d prod_{j != i} p_theta_j(z*_j)), shape (d,); p_star[j] = p_theta_j(z*_j)."""
    others = np.array([np.prod(np.delete(p_star, i)) for i in range(d)])
    return M0 - dM / (d * others)


def alignment(J: np.ndarray, theta: np.ndarray, z_star: np.ndarray) -> np.ndarray:
    """The left-hand side of `eq:mc_bad_gen_inner` for every i:
    (-grad E[J])_i (grad p_theta(z*))_i, shape (d,). grad p_theta(z*) is the exact gradient of
    E[1[z = z*]]."""
    indicator = np.zeros_like(J)
    indicator[vertex_index(np.asarray(z_star, dtype=float))] = 1.0
    return -true_gradient(J, theta) * true_gradient(indicator, theta)


def exact_alignment(
    d: int, z_star: Sequence[int], p_star: Sequence[Fraction], m: Fraction, M0: Fraction,
    dM: Fraction, i: int,
) -> Fraction:
    """The left-hand side of `eq:mc_bad_gen_inner` in exact rational arithmetic, from the
    definition sum_h J(zeta_h) d p(zeta_h) / d theta_i (`eq:true_as_avg`); for equality cases."""
    theta = [p if z else 1 - p for z, p in zip(z_star, p_star)]

    def dp(zeta: Sequence[int]) -> Fraction:
        out = Fraction(2 * zeta[i] - 1)
        for j in range(d):
            if j != i:
                out *= theta[j] if zeta[j] else 1 - theta[j]
        return out

    grad = Fraction(0)
    for zeta in itertools.product((0, 1), repeat=d):
        dist = sum(a != b for a, b in zip(zeta, z_star))
        J = m if dist == 0 else M0 - dist * dM / d
        grad += J * dp(zeta)
    return -grad * dp(tuple(z_star))


def largest_aligned_m(
    d: int, theta: np.ndarray, z_star: np.ndarray, M0: float, dM: float,
    table: Callable[..., np.ndarray] = mc_bad_gen_table,
) -> float:
    """The largest m for which every coordinate of `eq:mc_bad_gen_inner` is >= 0, computed from
    exact gradients: the LHS is affine in m, so its root is found from two evaluations."""
    lo = alignment(table(d, z_star, M0 - dM - 1.0, M0, dM), theta, z_star)
    hi = alignment(table(d, z_star, M0 - dM - 2.0, M0, dM), theta, z_star)
    slope = hi - lo  # per unit decrease of m
    roots = (M0 - dM - 1.0) + lo / slope
    return float(roots.min())


@dataclass
class CorollaryFit:
    """m*(d) for d in ``ds``, the closed form, and the fit log(d (M0 - m*)) = a + d log c."""

    ds: np.ndarray
    exact: np.ndarray
    formula: np.ndarray
    c_fit: float
    c_expected: float
    intercept: float
    r_squared: float


def corollary_fit(
    ds: Sequence[int], epsilon: float, M0: float = 0.0, dM: float = 1.0, seed: int = 0,
    table: Callable[..., np.ndarray] = mc_bad_gen_table,
) -> CorollaryFit:
    """`cor:mc_bad_gen_2`: with every p_theta_i(z*_i) = 1 - epsilon, the exact largest m that
    keeps the gradient aligned with z*, against M0 - dM / (d (1 - epsilon)^(d-1)), and the least
    squares fit of log(d (M0 - m*)) on d, whose slope is log c (c = 1 / (1 - epsilon))."""
    rng = np.random.default_rng(seed)
    exact, formula = [], []
    for d in ds:
        z_star = rng.integers(0, 2, size=d).astype(float)
        theta = np.where(z_star == 1, 1 - epsilon, epsilon)
        exact.append(largest_aligned_m(d, theta, z_star, M0, dM, table))
        formula.append(M0 - dM / (d * (1 - epsilon) ** (d - 1)))
    ds_arr, exact_arr = np.asarray(ds, dtype=float), np.array(exact)
    y = np.log(ds_arr * (M0 - exact_arr))
    slope, intercept, r, _, _ = stats.linregress(ds_arr, y)
    return CorollaryFit(
        ds=ds_arr.astype(int), exact=exact_arr, formula=np.array(formula),
        c_fit=float(np.exp(slope)), c_expected=1 / (1 - epsilon), intercept=float(intercept),
        r_squared=float(r**2),
    )


def first_binding_d(epsilon: float, limit: int = 10_000) -> int | None:
    """Smallest d at which the bound of `cor:mc_bad_gen_2` (M0 = 0, dM = 1) falls below the
    second-lowest value M0 - dM, i.e. (1 - epsilon)^-(d-1) / d > 1: before it, every m that keeps
    z* the unique minimum already aligns the gradient with z*."""
    for d in range(2, limit):
        if (d - 1) * -math.log1p(-epsilon) > math.log(d):
            return d
    return None
