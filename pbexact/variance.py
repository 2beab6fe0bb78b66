"""Exact estimator variances by enumerating all n-multisets of vertices (`sec:app_true_var`),
and the Monte Carlo estimate the paper used where enumeration is out of reach.

Var[g_p] = E[g_p^2] - (d E[J] / d r_p)^2 (`eq:app_main_var_eq`). Every estimator is symmetric in
its samples, so E[g^2] is a sum over multisets (`eq:n_multisets`) of g^2 times the multiset's
probability: the permutation count (`eq:multiset_permutations`) times the probability of one
ordering, prod_s p_theta(z^(s)) for iid samples (`eq:app_var_z_probs`) and
prod_i q_i(k_i) for ARMS, q from the copula (`pbexact.copula.pattern_probabilities`). DisARM's
n/2 antithetic pairs are iid, so its moments come from all 4^d ordered pairs of vertices instead
(`_pair_moments`). Which path and which law an estimator takes is read from its spec in
`pbexact.estimators.REGISTRY`.

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
from .copula import antithetic_pair_law, pattern_probabilities
from .errors import PBInputError, check_table
from .parametrizations import Parametrization, get_parametrization
from .polynomial import true_gradient, vertex_probabilities
from .sampling import sample_law, vertex_index
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
    rho for ARMS and DisARM, beta* for beta*; None for the others
    (`pbexact.estimators.EstimatorSpec.constant_of`). ``gradient``: the true gradient with
    respect to theta, where the caller already has it."""
    return est.get_estimator(name).constant_of(theta, n, param, J, gradient)


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
    estimators: tuple[str, ...] | None = None,
) -> dict[str, EstimatorMoments]:
    """Exact mean and variance of each estimator at logits r (shape (P,)) by enumerating every
    n-multiset of the 2^d vertices (iid and copula laws) or every ordered antithetic pair
    (`_pair_moments`); the variance uses E[g] = the true gradient. ``estimators``: names of
    the registry (default: every one defined for this n)."""
    param = get_parametrization(parametrization)
    param.check_exact(r)
    r = np.asarray(r, dtype=np.float64)
    theta = param.theta(r)
    d = theta.shape[-1]
    J = check_table(J, d)
    if estimators is None:
        estimators = est.estimators_for(n)
    for name in estimators:
        est.check_estimator(name, n)
    grad_theta = true_gradient(J, theta)
    grad = param.chain(grad_theta, r)
    pairs = tuple(k for k in estimators if est.get_estimator(k).center == "pair")
    out = {
        name: _pair_moments(J, r, n, param, name, estimator_extra(name, J, theta, n, param), grad)
        for name in pairs
    }
    out.update(_multiset_moments(J, r, theta, n, param,
                                 tuple(k for k in estimators if k not in pairs), grad_theta, grad))
    return {name: out[name] for name in estimators}


def _multiset_moments(
    J: np.ndarray,
    r: np.ndarray,
    theta: np.ndarray,
    n: int,
    param: Parametrization,
    estimators: tuple[str, ...],
    grad_theta: np.ndarray,
    grad: np.ndarray,
) -> dict[str, EstimatorMoments]:
    """Moments of the iid and copula estimators by enumerating the n-multisets of vertices;
    theta = param.theta(r) (d,)."""
    if not estimators:
        return {}
    d = theta.shape[-1]
    ms, counts, ones = _enumeration(d, n)
    scores = param.score(vertices(d), r)  # (2^d, P)
    specs = {name: est.get_estimator(name) for name in estimators}
    laws = {name: spec.law for name, spec in specs.items()}
    mean_centered = any(spec.center == "mean" for spec in specs.values())
    for name, law in laws.items():
        if law not in ("iid", "copula"):
            raise PBInputError(f"{name}: multisets are enumerated for iid and copula samples "
                                 "only; use closed_form_moments or mc_moments")
    extras = {name: estimator_extra(name, J, theta, n, param, grad_theta) for name in estimators}
    # one lookup table per sample (iid: p_theta of the vertex) or per bit (ARMS: the copula's
    # probability of that many ones)
    iid_table = np.ascontiguousarray(np.broadcast_to(vertex_probabilities(theta), (n, 2**d)))
    copula = "copula" in laws.values()
    arms_table = pattern_probabilities(theta, n) if copula else None
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
        sum_j = losses.sum(-1) if mean_centered else None  # shared by LOORF and ARMS
        for name in estimators:
            form = specs[name].linear(n, sum_j, extras[name], losses, check=False)
            shift[:] = c - form.center
            coef[0], coef[1] = 1 / (form.norm * form.divisor), form.baseline
            prob = arms_prob if laws[name] == "copula" else iid_prob
            moments[name] += _linear_estimate_moments(prob, sums, shift, coef)
    return {
        name: EstimatorMoments(mean=first, variance=np.maximum(second - grad**2, 0.0))
        for name, (first, second) in moments.items()
    }


def _pair_law(law: str, theta: np.ndarray) -> np.ndarray:
    """The law of one pair of samples in each dimension, (d, 4), w = bit of the first + 2 bits of
    the second: antithetic (`pbexact.copula.antithetic_pair_law`) or two iid samples."""
    if law == "antithetic":
        return antithetic_pair_law(theta)
    if law == "iid":
        return np.stack([(1 - theta) ** 2, theta * (1 - theta), theta * (1 - theta), theta**2], -1)
    raise PBInputError(f"no pair law for the {law} law: pair-centered estimators take iid or "
                       "antithetic pairs")


def _pair_moments(
    J: np.ndarray,
    r: np.ndarray,
    n: int,
    param: Parametrization,
    name: str,
    extra: np.ndarray | None,
    grad: np.ndarray,
) -> EstimatorMoments:
    """Exact moments of a pair-centered estimator (DisARM) by enumerating all 4^d ordered pairs
    of vertices with the pair law, a product over dimensions. Its n/2 pairs are iid, so with the
    one-pair term h = (J(x) - J(y)) / 2 (S(x) - S(y)) / divisor, E[g] = E[h] and
    E[g^2] = Var[h] / (n/2) + E[h]^2; the variance is E[g^2] - grad^2 as for the others."""
    spec = est.get_estimator(name)
    theta = param.theta(r)
    d = theta.shape[-1]
    law = _pair_law(spec.law, theta)  # (d, 4)
    form = spec.linear(n, None, extra)
    bits = vertices(d).astype(np.int64)  # (2^d, d)
    scores = param.score(vertices(d), r)  # (2^d, P)
    P = scores.shape[-1]
    Jc = J - J.mean()  # the estimate does not see a constant shift of J
    first, second = np.zeros(P), np.zeros(P)
    rows = max(1, CHUNK_ENTRIES // (2**d * (P + d)))
    dims = np.arange(d)
    for start in range(0, 2**d, rows):
        x = np.arange(start, min(start + rows, 2**d))
        prob = law[dims, bits[x][:, None, :] + 2 * bits[None, :, :]].prod(-1)  # (rows, 2^d)
        half = (Jc[x][:, None] - Jc[None, :]) / 2
        h = half[..., None] * (scores[x][:, None, :] - scores[None]) / (form.divisor * 1.0)
        first += np.einsum("xy,xyp->p", prob, h)
        second += np.einsum("xy,xyp->p", prob, h * h)
    mean_square = (second - first**2) / (n // 2) + first**2
    return EstimatorMoments(mean=first, variance=np.maximum(mean_square - grad**2, 0.0))


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
    spec = est.get_estimator(name)
    spec.check_n(n)
    z = sample_law(spec.law, theta, n, (draws,), rng)
    S = param.score(z, r)
    return apply_estimator(name, J[vertex_index(z)], S, estimator_extra(name, J, theta, n, param))


def mc_moments(
    J: np.ndarray,
    r: np.ndarray,
    n: int,
    draws: int,
    rng: np.random.Generator,
    parametrization: str | Parametrization = "sigmoid",
    estimators: tuple[str, ...] | None = None,
) -> dict[str, EstimatorMoments]:
    """The paper's Monte Carlo variance (`sec:app_true_var`): mean of g^2 over ``draws``
    estimates minus the exact squared gradient (default: every estimator defined for n)."""
    if estimators is None:
        estimators = est.estimators_for(n)
    param = get_parametrization(parametrization)
    r = np.asarray(r, dtype=np.float64)
    grad = param.chain(true_gradient(J, param.theta(r)), r)
    out = {}
    for name in estimators:
        g = sample_estimates(name, J, r, n, draws, rng, param)
        out[name] = EstimatorMoments(mean=g.mean(0), variance=(g * g).mean(0) - grad**2)
    return out
