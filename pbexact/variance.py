"""Exact estimator variances by enumerating all n-multisets of vertices (`sec:app_true_var`),
and the Monte Carlo estimate the paper used where enumeration is out of reach.

Var[g_p] = E[g_p^2] - (d E[J] / d r_p)^2 (`eq:app_main_var_eq`). Every estimator is symmetric in
its samples, so E[g^2] is a sum over multisets (`eq:n_multisets`) of g^2 times the multiset's
probability: the permutation count (`eq:multiset_permutations`) times the probability of one
ordering, prod_s p_theta(z^(s)) for iid samples (`eq:app_var_z_probs`) and
prod_i q_i(k_i) for ARMS, q from the copula (`pbexact.copula.pattern_probabilities`).

Every estimator is a `pbexact.estimators.LinearEstimate`, a combination of the two sums
U = sum_s J(z^(s)) S^(s) and B = sum_s S^(s); these are formed once per multiset from a table
over the 2^d vertices and shared by all estimators, and each estimator's moments then take one
pass over the multisets.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numba
import numpy as np

from . import estimators as est
from .copula import arms_correlation, pattern_probabilities
from .errors import check_table
from .parametrizations import Parametrization, get_parametrization
from .polynomial import flipped_expectation, true_gradient, vertex_probabilities
from .sampling import sample_arms, sample_bernoulli, vertex_index
from .vertices import multisets, permutation_counts, vertices

#: Floats held per pass over a chunk of multisets (their sums U, B and losses), about 32 MiB.
CHUNK_ENTRIES = 2**22


@dataclass(frozen=True)
class EstimatorMoments:
    """Per-parameter mean and variance of one estimator, shapes (P,)."""

    mean: np.ndarray
    variance: np.ndarray

    @property
    def total_variance(self) -> float:
        """Sum of the per-parameter variances: E||g - grad||^2."""
        return float(self.variance.sum())


@lru_cache(maxsize=8)
def _enumeration(d: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Multisets of the 2^d vertices, their permutation counts and per-dimension counts of ones."""
    ms = multisets(2**d, n)
    counts = permutation_counts(ms)
    ones = ((ms[:, :, None] >> np.arange(d)) & 1).sum(1)  # (m, d)
    return ms, counts, ones


def estimator_extra(
    name: str,
    J: np.ndarray,
    theta: np.ndarray,
    n: int,
    param: Parametrization,
    gradient: np.ndarray | None = None,
) -> np.ndarray | None:
    """The per-parameter constant an estimator needs, shape (..., P) for theta of shape (..., d):
    rho for ARMS, beta* for beta*; None for the others. ``gradient``: the true gradient with
    respect to theta, where the caller already has it."""
    if name == "arms":
        return param.expand(arms_correlation(theta, n))
    if name == "betastar":
        return param.expand(flipped_expectation(J, theta, gradient))
    return None


def apply_estimator(
    name: str, J: np.ndarray, S: np.ndarray, extra: np.ndarray | None
) -> np.ndarray:
    """The estimate of ``name`` from losses J (..., n), scores S (..., n, P) and its constant
    ``extra`` (..., P) from :func:`estimator_extra`; shape (..., P)."""
    return est.linear_estimate(name, J, extra).evaluate(S)


def exact_moments(
    J: np.ndarray,
    r: np.ndarray,
    n: int,
    parametrization: str | Parametrization = "sigmoid",
    estimators: tuple[str, ...] = est.ESTIMATORS,
) -> dict[str, EstimatorMoments]:
    """Exact mean and variance of each estimator at logits r (shape (P,)) by enumerating every
    n-multiset of the 2^d vertices; the variance uses E[g] = the true gradient."""
    param = get_parametrization(parametrization)
    param.check_exact(r)
    r = np.asarray(r, dtype=np.float64)
    theta = param.theta(r)
    d = theta.shape[-1]
    J = check_table(J, d)
    for name in estimators:
        est.check_estimator(name, n)
    ms, counts, ones = _enumeration(d, n)
    scores = param.score(vertices(d), r)  # (2^d, P)
    grad_theta = true_gradient(J, theta)
    grad = param.chain(grad_theta, r)
    extras = {name: estimator_extra(name, J, theta, n, param, grad_theta) for name in estimators}
    # one lookup table per sample (iid: p_theta of the vertex) or per bit (ARMS: the copula's
    # probability of that many ones)
    iid_table = np.ascontiguousarray(np.broadcast_to(vertex_probabilities(theta), (n, 2**d)))
    arms_table = pattern_probabilities(theta, n) if "arms" in estimators else None
    P = scores.shape[-1]
    # every estimator is g = (U - (center + baseline) B) / (norm divisor) (`LinearEstimate`), so
    # the per-multiset sums U = sum_s J S and B = sum_s S are shared by all of them; U is taken
    # of J - c (c the table's mean), which keeps it from cancelling against center B when J
    # sits far from 0: g = (U_c + (c - center - baseline) B) / (norm divisor)
    c = float(J.mean())
    vertex_table = np.concatenate([(J - c)[:, None] * scores, scores], axis=1)  # (2^d, 2P)
    rows = max(1, CHUNK_ENTRIES // (2 * P + 2 * n))
    moments = {name: np.zeros((2, P)) for name in estimators}
    coef = np.empty((2, P))
    for start in range(0, ms.shape[0], rows):
        idx = ms[start : start + rows]
        weight = counts[start : start + rows]
        sums = _multiset_sums(idx, vertex_table)  # (2P, rows): U then B
        losses = np.asfortranarray(J[idx])  # column-major: sums over samples run across rows
        iid_prob = _product_of_lookups(weight, idx, iid_table)
        if arms_table is not None:
            arms_prob = _product_of_lookups(weight, ones[start : start + rows], arms_table)
        shift = np.empty(weight.shape)
        for name in estimators:
            form = est.linear_estimate(name, losses, extras[name])
            shift[:] = c - form.center
            coef[0], coef[1] = 1 / (form.norm * form.divisor), form.baseline
            prob = arms_prob if name == "arms" else iid_prob
            moments[name] += _linear_estimate_moments(prob, sums, shift, coef)
    return {
        name: EstimatorMoments(mean=first, variance=np.maximum(second - grad**2, 0.0))
        for name, (first, second) in moments.items()
    }


@numba.njit(cache=True)
def _multiset_sums(idx: np.ndarray, table: np.ndarray) -> np.ndarray:
    """sum_s table[idx[m, s]] for every multiset m, laid out (K, rows) for a table (2^d, K)."""
    rows, n = idx.shape
    K = table.shape[1]
    out = np.empty((K, rows))
    acc = np.empty(K)
    for m in range(rows):
        acc[:] = 0.0
        for s in range(n):
            h = idx[m, s]
            for k in range(K):
                acc[k] += table[h, k]
        for k in range(K):
            out[k, m] = acc[k]
    return out


# reassociating the sums over multisets lets LLVM vectorize them (about 2.5x here); the result
# then depends on the machine's vector width in the last bits, as BLAS results do
@numba.njit(cache=True, fastmath={"reassoc"})
def _linear_estimate_moments(
    prob: np.ndarray, sums: np.ndarray, shift: np.ndarray, coef: np.ndarray
) -> np.ndarray:
    """sum_m prob[m] g_m and sum_m prob[m] g_m^2, shape (2, P), for the estimates
    g_m = (U_m + (shift_m - baseline) B_m) / (norm divisor) (`pbexact.estimators.LinearEstimate`)
    from the multisets' sums = [U; B] (2P, rows) and coef = [1 / (norm divisor); baseline]
    (2, P); g is never stored."""
    P = coef.shape[1]
    out = np.zeros((2, P))
    for p in range(P):
        inv = coef[0, p]
        baseline = coef[1, p]
        u = sums[p]
        b = sums[P + p]
        first = 0.0
        second = 0.0
        for m in range(u.shape[0]):
            g = (u[m] + (shift[m] - baseline) * b[m]) * inv
            pg = prob[m] * g
            first += pg
            second += pg * g
        out[0, p] = first
        out[1, p] = second
    return out


@numba.njit(cache=True)
def _product_of_lookups(weight: np.ndarray, keys: np.ndarray, table: np.ndarray) -> np.ndarray:
    """weight[m] * prod_j table[j, keys[m, j]]: a multiset's probability (`eq:app_var_z_probs`)."""
    rows, cols = keys.shape
    out = np.empty(rows)
    for m in range(rows):
        prob = weight[m]
        for j in range(cols):
            prob *= table[j, keys[m, j]]
        out[m] = prob
    return out


def sample_estimates(
    name: str,
    J: np.ndarray,
    r: np.ndarray,
    n: int,
    draws: int,
    rng: np.random.Generator,
    parametrization: str | Parametrization = "sigmoid",
) -> np.ndarray:
    """``draws`` independent estimates of one estimator at logits r, shape (draws, P)."""
    param = get_parametrization(parametrization)
    r = np.asarray(r, dtype=np.float64)
    theta = param.theta(r)
    J = check_table(J, theta.shape[-1])
    est.check_estimator(name, n)
    if name == "arms":
        z = sample_arms(theta, n, (draws,), rng)
    else:
        z = sample_bernoulli(theta, (draws, n), rng)
    S = param.score(z, r)
    return apply_estimator(name, J[vertex_index(z)], S, estimator_extra(name, J, theta, n, param))


def mc_moments(
    J: np.ndarray,
    r: np.ndarray,
    n: int,
    draws: int,
    rng: np.random.Generator,
    parametrization: str | Parametrization = "sigmoid",
    estimators: tuple[str, ...] = est.ESTIMATORS,
) -> dict[str, EstimatorMoments]:
    """The paper's Monte Carlo variance (`sec:app_true_var`): mean of g^2 over ``draws``
    estimates minus the exact squared gradient."""
    param = get_parametrization(parametrization)
    r = np.asarray(r, dtype=np.float64)
    grad = param.chain(true_gradient(J, param.theta(r)), r)
    out = {}
    for name in estimators:
        g = sample_estimates(name, J, r, n, draws, rng, param)
        out[name] = EstimatorMoments(mean=g.mean(0), variance=(g * g).mean(0) - grad**2)
    return out
