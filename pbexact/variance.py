"""Exact estimator variances by enumerating all n-multisets of vertices (`sec:app_true_var`),
and the Monte Carlo estimate the paper used where enumeration is out of reach.

Var[g_p] = E[g_p^2] - (d E[J] / d r_p)^2 (`eq:app_main_var_eq`). Every estimator is symmetric in
its samples, so E[g^2] is a sum over multisets (`eq:n_multisets`) of g^2 times the multiset's
probability: the permutation count (`eq:multiset_permutations`) times the probability of one
ordering, prod_s p_theta(z^(s)) for iid samples (`eq:app_var_z_probs`) and
prod_i q_i(k_i) for ARMS, q from the copula (`pbexact.copula.pattern_probabilities`).
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

#: Rows of multisets evaluated at once; bounds the memory of one pass to CHUNK * n * P floats.
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


@numba.njit(cache=True)
def _vertex_weighted_sum(w: np.ndarray, idx: np.ndarray, scores: np.ndarray) -> np.ndarray:
    rows, n = idx.shape
    out = np.zeros((rows, scores.shape[1]))
    for m in range(rows):
        for s in range(n):
            wm = w[m, s]
            row = scores[idx[m, s]]
            for p in range(row.shape[0]):
                out[m, p] += wm * row[p]
    return out


class VertexScores:
    """The scores of a batch of multisets, S[m, s] = scores[idx[m, s]], never materialized:
    ``weighted_sum(w)`` = sum_s w[m, s] scores[idx[m, s]] in one Numba pass, shape (rows, P).
    The estimators reach the scores only through this sum (`pbexact.estimators.sample_sum`)."""

    def __init__(self, idx: np.ndarray, scores: np.ndarray) -> None:
        self.idx = np.ascontiguousarray(idx)
        self.scores = np.ascontiguousarray(scores, dtype=np.float64)

    def weighted_sum(self, w: np.ndarray) -> np.ndarray:
        if w.shape != self.idx.shape:
            w = np.ascontiguousarray(np.broadcast_to(w, self.idx.shape))
        return _vertex_weighted_sum(w.astype(np.float64, copy=False), self.idx, self.scores)


def estimator_extra(
    name: str, J: np.ndarray, theta: np.ndarray, n: int, param: Parametrization
) -> np.ndarray | None:
    """The per-parameter constant an estimator needs, shape (..., P) for theta of shape (..., d):
    rho for ARMS, beta* for beta*; None for the others."""
    if name == "arms":
        return param.expand(arms_correlation(theta, n))
    if name == "betastar":
        return param.expand(flipped_expectation(J, theta))
    return None


def apply_estimator(
    name: str, J: np.ndarray, S: np.ndarray, extra: np.ndarray | None
) -> np.ndarray:
    """The estimate of ``name`` from losses J (..., n), scores S (..., n, P) and its constant
    ``extra`` (..., P) from :func:`estimator_extra`; shape (..., P)."""
    if name == "reinforce":
        return est.reinforce(J, S)
    if name == "loorf":
        return est.loorf(J, S)
    if name == "arms":
        return est.arms(J, S, extra)
    return est.baseline(J, S, extra)


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
    r = np.asarray(r, dtype=np.float64)
    theta = param.theta(r)
    d = theta.shape[-1]
    J = check_table(J, d)
    for name in estimators:
        est.check_estimator(name, n)
    ms, counts, ones = _enumeration(d, n)
    verts = vertices(d)
    scores = param.score(verts, r)  # (2^d, P)
    grad = param.chain(true_gradient(J, theta), r)
    p_vertex = vertex_probabilities(theta)
    extras = {name: estimator_extra(name, J, theta, n, param) for name in estimators}
    q = pattern_probabilities(theta, n) if "arms" in estimators else None
    rows = max(1, CHUNK_ENTRIES // (n * scores.shape[-1]))
    first = {name: np.zeros_like(grad) for name in estimators}
    second = {name: np.zeros_like(grad) for name in estimators}
    for start in range(0, ms.shape[0], rows):
        idx = ms[start : start + rows]
        weight = counts[start : start + rows]
        # column-major: the estimators' sums over the n samples then run across rows at once
        Jm, Sm = np.asfortranarray(J[idx]), VertexScores(idx, scores)
        # a product of n (or d) vectors beats a reduce over a short axis
        iid_prob = weight.copy()
        for s in range(n):
            iid_prob *= p_vertex[idx[:, s]]
        if q is not None:
            arms_prob = weight.copy()
            k = ones[start : start + rows]
            for i in range(d):
                arms_prob *= q[i, k[:, i]]
        for name in estimators:
            prob = arms_prob if name == "arms" else iid_prob
            g = apply_estimator(name, Jm, Sm, extras.get(name))
            first[name] += prob @ g
            second[name] += prob @ (g * g)
    return {
        name: EstimatorMoments(mean=first[name], variance=np.maximum(second[name] - grad**2, 0.0))
        for name in estimators
    }


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
