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
import sys
from functools import lru_cache
from typing import Any

import numpy as np

from . import arrays
from .errors import PBInputError, check_n, check_theta

Array = Any


def branch_side(theta: Array) -> tuple[Array, Array]:
    """(upper, m): the branch (theta > 0.5) and the probability m = 1 - theta (upper) or theta
    (lower) that one sample lies beyond the branch's threshold: (1 - c)^(n-1) = m exactly."""
    xp = arrays.namespace(theta)
    # min(theta, 1 - theta) equals where(upper, 1 - theta, theta) bit for bit (a NaN stays NaN)
    # and costs a quarter of torch's CPU where at the d of a network
    return theta > 0.5, xp.minimum(theta, 1 - theta)


def branch_threshold(m: Array, n: int) -> Array:
    """The branch's threshold c = 1 - m^(1/(n-1)) (upper: F^{-1}(theta); lower:
    F^{-1}(1 - theta)), as -expm1(log(m) / (n-1)): no 1 - (1 - theta) cancellation at tiny theta,
    none at theta = 1 - 1e-16, and accurate for large n. m = 0 gives c = 1."""
    xp = arrays.namespace(m)
    with np.errstate(divide="ignore"):
        return -xp.expm1(xp.log(m) / (n - 1))


def upper_tails(theta: Array, n: int, count: int) -> tuple[Array, Array]:
    """(upper, tails): tails[..., t] = P(t given samples all have d > c) = (1 - t c)_+^(n-1) for
    t = 0..count, shape theta.shape + (count+1,), numpy only.

    Computed without cancellation: t = 0 is 1, t = 1 is m (`branch_side`) exactly, and t >= 2
    (nonzero only for c < 1/2, where c is accurate) is exp((n-1) log1p(-t c))."""
    theta = np.asarray(theta, dtype=np.float64)
    upper, m = branch_side(theta)
    c = branch_threshold(m, n)[..., None]
    t = np.arange(count + 1, dtype=np.float64)
    inside = t * c < 1
    with np.errstate(divide="ignore", invalid="ignore"):
        far = np.exp((n - 1) * np.log1p(-np.where(inside, t * c, 0.0)))
    tails = np.where(inside, far, 0.0)
    tails[..., 0] = 1.0
    if count >= 1:
        tails[..., 1] = m
    return upper, tails


def arms_correlation(theta: Array, n: int) -> Array:
    """rho_i = Corr(z~^(s)_i, z~^(s')_i), s != s' (`alg:orig_arms`); 0 where theta_i is 0 or 1
    (the samples are then constant and their score is zero). numpy or torch, shape of theta.

    P(both samples beyond c) = (1 - 2c)_+^(n-1), by exp((n-1) log1p(-2c)) (`upper_tails`)."""
    xp = arrays.namespace(theta)
    q = 1 - theta
    m = xp.minimum(theta, q)  # the branch's "theta" in the paper's formula (branch_side)
    with np.errstate(divide="ignore", invalid="ignore"):
        # inside (0 < theta < 1) iff theta (1 - theta) > 0; `off` = 1 - sign is 0 there and 1
        # at theta 0 or 1, so var = theta (1 - theta) or 1 and c uses m or 0.5, with
        # arithmetic instead of torch's slow CPU where (invalid theta: 0, below). Updates in
        # place on temporaries autograd does not keep: the same operations on the same values,
        # fewer passes
        var = theta * q
        inside = var > 0
        off = 1 - xp.sign(var)
        var = var + off
        off *= 0.5
        off += m
        c = branch_threshold(off, n)
        c *= -2
        # (1 - 2c)_+^(n-1): log1p(-1) = -inf where c >= 1/2, so exp gives the positive part's 0
        both = xp.log1p(arrays.clip(c, -1.0, None))
        both *= n - 1
        both = xp.exp(both) - m * m
        both /= var
        return xp.where(inside, both, 0.0)


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


@lru_cache(maxsize=64)
def _inclusion_exclusion_matrix(n: int) -> np.ndarray:
    """A[below, j] = (-1)^t C(below, t) for j = n - below + t: row ``below`` combines the upper
    tails (1 - j c)_+^(n-1), j = 0..n, into one ordered pattern's probability."""
    A = np.zeros((n + 1, n + 1))
    for below in range(n + 1):
        for t in range(below + 1):
            A[below, n - below + t] = (-1) ** t * math.comb(below, t)
    return A


def pattern_probabilities(theta: np.ndarray, n: int) -> np.ndarray:
    """q[..., i, k]: probability of one given ordered assignment of bits to the n ARMS samples in
    dimension i with k ones, k = 0..n, shape (..., d, n+1). Each row satisfies
    sum_k C(n, k) q[k] = 1.

    Inclusion-exclusion is exact in exact arithmetic; in float64 it loses digits to cancellation
    for large n (fine for the n <= 20 that enumeration can reach).
    """
    n = check_n(n, "ARMS", 2)
    theta = check_theta(theta)
    upper, tails = upper_tails(theta, n, n)
    upper = upper[..., None]
    # patterns by the number of samples below c, sum_t (-1)^t C(below, t) tails[n - below + t]
    f = tails @ _inclusion_exclusion_matrix(n).T
    # upper branch: ones are d < c; lower branch: ones are d > c, i.e. zeros are d < c
    out = np.where(upper, f, f[..., ::-1])
    return np.clip(out, 0.0, None)  # only round-off can make a term negative


def joint_one_probability(theta: np.ndarray, n: int, m: int) -> np.ndarray:
    """P(z~^(1) = ... = z~^(m) = 1) for m <= n given samples in one dimension, shape of theta.

    Upper branch: P(all m of d < c) = sum_t (-1)^t C(m, t) (1 - t c)_+^(n-1);
    lower branch: P(all m of d > c') = (1 - m c')_+^(n-1).
    """
    theta = check_theta(theta)
    upper, tails = upper_tails(theta, n, m)
    up = sum((-1) ** t * math.comb(m, t) * tails[..., t] for t in range(m + 1))
    return np.where(upper, up, tails[..., m])


#: Largest n of the symbolic table: (n+1) rows of up to n pieces, each a factored polynomial of
#: degree n-1 (n = 20 takes about 11 s; the time grows faster than n^3).
MAX_SYMBOLIC_N = 20


def symbolic_pattern_table(n: int, progress: bool = False) -> list[dict]:
    """The ARMS copula table of `tab:integral_closed` for any 2 <= n <= MAX_SYMBOLIC_N, in sympy.

    Rows by k = number of samples with z = 1 (d < c); each row is a list of pieces
    (lo, hi, polynomial in c) on the break points 0, 1/n, 1/(n-1), ..., 1/2, 1, adjacent equal
    pieces merged. This is the upper branch (theta > 0.5) in the variable c = F^{-1}(theta); the
    lower branch reads row n - k at c = F^{-1}(1 - theta) (the table's caption). Polynomials are
    summed as sympy Polys over QQ (exact) and factored for display; ``progress`` shows a bar.
    """
    import sympy as sp
    from tqdm import tqdm

    n = check_n(n, "ARMS", 2)
    if n > MAX_SYMBOLIC_N:
        raise PBInputError(
            f"the symbolic ARMS table goes up to n={MAX_SYMBOLIC_N} (n={MAX_SYMBOLIC_N} takes "
            f"about 11 s and the time grows faster than n^3), got n={n}; use a smaller n"
        )
    c = sp.Symbol("c")
    breaks = [sp.Integer(0)] + [sp.Rational(1, m) for m in range(n, 1, -1)] + [sp.Integer(1)]
    powers = {j: sp.Poly(1 - j * c, c, domain="QQ") ** (n - 1) for j in range(n + 1)}
    rows = []
    for k in tqdm(range(n + 1), desc=f"ARMS table n={n}", unit="row", disable=not progress,
                  file=sys.stderr):
        pieces: list[dict] = []
        for lo, hi in zip(breaks[:-1], breaks[1:]):
            # on (lo, hi), (1 - j c) > 0 iff j < 1/c, i.e. j * hi <= 1
            poly = sp.Poly(0, c, domain="QQ")
            for t in range(k + 1):
                if (n - k + t) * hi <= 1:
                    poly += (-1) ** t * math.comb(k, t) * powers[n - k + t]
            if pieces and pieces[-1]["poly"] == poly:
                pieces[-1]["hi"] = hi
            else:
                pieces.append({"lo": lo, "hi": hi, "poly": poly})
        for piece in pieces:
            piece["expr"] = sp.factor(piece.pop("poly").as_expr())
        rows.append({"ones": k, "pieces": pieces})
    return rows
