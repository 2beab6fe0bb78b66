"""The exact bias and mean squared error of biased gradient estimators (ST, CP, relaxations,
and the unbiased REBAR/RELAX as a check), one sample at a time, against the unbiased
score-function estimators at their exact variances.

An estimator g of grad_r E_theta[J] (logits r of shape (P,), theta = theta(r) of a
parametrization, `tab:alternative_param`) has, for one sample, mean E[g] and per-parameter
variance Var[g] (both (P,)); its bias is b = E[g] - grad_r E_theta[J] and its mean squared error
at n independent samples is ||b||^2 + tr Cov[g] / n. The moments come from a weighted set of
per-sample estimates (N, P):

* ``exact``: every vertex of the hypercube with its probability p_theta (`eq:reinforce_p`), or
  a deterministic estimate (CP), or a closed form; exact to round-off;
* ``quadrature``: Gauss-Legendre rules over the uniform noise of a relaxation
  (`pbexact.relaxations`), with the error bar |Q_k - Q_{k/2}| per parameter;
* ``mc``: draws, independent or stratified (a stratum's draws weighted by its probability:
  REBAR and RELAX are drawn on every side of every Bernoulli threshold, so a rare sample is
  never missed or over-counted), with the standard error of the mean per parameter and the
  error of the trace and of the MSE (:class:`SamplingError`).

The estimators themselves are pbscale's (the tool `analysis.bias` feeds them the nodes); this
module holds the differentiable extensions of a J table, the moments, the summaries (bias norm,
cosine, MSE, the break-even n of an unbiased estimator) and the closed forms of ST's bias.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrays import sigmoid
from .closed_form import MAX_ARMS_CLOSED_FORM_N, closed_form_moments
from .errors import PBInputError, check_table
from .estimators import get_estimator
from .parametrizations import Parametrization
from .polynomial import multilinear_value, true_gradient, vertex_probabilities
from .vertices import vertices

#: How a row's moments were obtained (see the module docstring).
KINDS = ("exact", "quadrature", "mc")
#: Largest n searched for a break-even n: the closed-form ARMS variance is accurate up to here.
MAX_BREAK_EVEN_N = MAX_ARMS_CLOSED_FORM_N
#: The level and power at which a Monte Carlo row's detectable bias is stated.
DETECT_LEVEL = 0.05
DETECT_POWER = 0.80


class MultilinearExtension:
    """The multilinear extension P_J of a J table (`eq:multi_poly`) as a batched torch loss:
    z of shape (..., d) -> (...), differentiable in z. ST on it is unbiased (its derivative in
    z_i at a vertex is the difference J(z_i = 1) - J(z_i = 0) of `eq:true_as_avg`). Smooth:
    quadrature over a relaxation's noise converges (unlike NNLoss, whose LeakyReLU makes
    dJ/dz jump)."""

    multilinear = True
    smooth = True

    def __init__(self, J: np.ndarray) -> None:
        self.J = check_table(J)
        self.d = self.J.shape[0].bit_length() - 1

    def __call__(self, z: Any) -> Any:
        return multilinear_value(self.J, z)

    def table(self) -> np.ndarray:
        """J at every vertex, shape (2^d,)."""
        return self.J.copy()


class QuadraticLoss:
    """J(z) = z^T A z + b^T z for A (d, d) and b (d,), as a batched torch loss (..., d) -> (...).
    Its extension is not multilinear where A has a nonzero diagonal (z_i^2 = z_i only on the
    vertices); :func:`st_quadratic_bias` is ST's bias on it in closed form. Smooth (see
    :class:`MultilinearExtension`)."""

    smooth = True

    def __init__(self, A: np.ndarray, b: np.ndarray) -> None:
        self.A = np.asarray(A, dtype=np.float64)
        self.b = np.asarray(b, dtype=np.float64)
        self.d = self.b.shape[-1]
        if self.A.shape != (self.d, self.d):
            raise PBInputError(f"A must be ({self.d}, {self.d}) for b of shape ({self.d},), "
                               f"got {self.A.shape}")
        self.multilinear = bool(np.all(np.diag(self.A) == 0))

    def __call__(self, z: Any) -> Any:
        import torch

        A = torch.as_tensor(self.A, dtype=z.dtype, device=z.device)
        b = torch.as_tensor(self.b, dtype=z.dtype, device=z.device)
        return ((z @ A) * z).sum(-1) + z @ b

    def table(self) -> np.ndarray:
        z = vertices(self.d)
        return ((z @ self.A) * z).sum(-1) + z @ self.b


def st_quadratic_moments(A: np.ndarray, b: np.ndarray, theta: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Mean (d,) and covariance (d, d) of dJ/dz(z) = (A + A^T) z + b for z ~ Bern(theta): the ST
    estimate of the theta-gradient (`ch:other`) on :class:`QuadraticLoss`; mean S theta + b and
    covariance S diag(theta (1 - theta)) S with S = A + A^T."""
    S = np.asarray(A) + np.asarray(A).T
    return S @ theta + b, (S * (theta * (1 - theta))) @ S.T


def st_quadratic_bias(A: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """ST's bias over theta on J(z) = z^T A z + b^T z, shape (d,): A_kk (2 theta_k - 1).

    On the vertices J equals its multilinear polynomial P(x) = sum_{i != j} A_ij x_i x_j +
    sum_i (A_ii + b_i) x_i, whose gradient is the true gradient (`eq:equivalence`):
    dP/dx_k = ((A + A^T) theta)_k - 2 A_kk theta_k + A_kk + b_k. ST averages dJ/dz_k(z) =
    ((A + A^T) z)_k + b_k, of mean ((A + A^T) theta)_k + b_k: the difference is
    A_kk (2 theta_k - 1). Zero at theta_k = 1/2 or A_kk = 0 (the multilinear case). Over logits,
    the bias is this times d theta_k / d r (`Parametrization.chain`)."""
    return np.diag(np.asarray(A)) * (2 * np.asarray(theta) - 1)


def tempered_true_gradient(J: np.ndarray, r: np.ndarray, tau: float) -> np.ndarray:
    """grad_r E_{Bern(sigmoid(r / tau))}[J], shape (d,): the true gradient under CP's tempered
    sigmoid (`eq:sigmoid_cp`), true_gradient(sigmoid(r / tau)) sigmoid'(r / tau) / tau."""
    s = sigmoid(np.asarray(r, dtype=np.float64) / tau)
    return true_gradient(J, s) * s * (1 - s) / tau


def vertex_uniforms(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Uniforms u (2^d, d) with 1[u < theta] = vertex h (`pbexact.vertices.vertices` order) and
    the vertices' probabilities p_theta (2^d,): a sampler that draws z = 1[u < theta] (pbscale's
    ST) then visits every vertex once; vertices of probability 0 get weight 0."""
    theta = np.asarray(theta, dtype=np.float64)
    z = vertices(theta.shape[-1])
    u = np.where(z == 1, theta / 2, (1 + theta) / 2)
    return u, vertex_probabilities(theta)


@dataclass(frozen=True)
class SamplingError:
    """How a Monte Carlo row's numbers vary from draw to draw: the covariance of the mean
    estimate ``mean_cov`` (P, P), and for q = ||g - mean||^2 (the trace's per-draw term) the
    covariance of the mean with the trace estimate ``cross`` (P,) and the trace estimate's
    variance ``trace_var``. For strata h of probability p_h with M_h draws each, every entry is
    sum_h p_h^2 / M_h times the within-stratum (co)variance (ddof 1)."""

    mean_cov: np.ndarray
    cross: np.ndarray
    trace_var: float


@dataclass(frozen=True)
class Moments:
    """Mean and per-parameter variance of one sample of an estimator, shapes (P,); ``error``:
    the error bar of the mean per parameter (None when exact); ``kind``: one of :data:`KINDS`;
    ``samples``: draws (mc) or quadrature points (1 when deterministic); ``sampling``: a
    Monte Carlo row's :class:`SamplingError` (None otherwise)."""

    mean: np.ndarray
    variance: np.ndarray
    kind: str = "exact"
    error: np.ndarray | None = None
    samples: int = 1
    sampling: SamplingError | None = None


def weighted_moments(g: np.ndarray, w: np.ndarray, kind: str = "exact") -> Moments:
    """Moments of estimates g (N, P) taking their values with probabilities (or quadrature
    weights) w (N,); the variance is taken about the mean (no cancellation)."""
    g, w = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
    mean = w @ g
    variance = np.maximum(w @ (g - mean) ** 2, 0.0)
    return Moments(mean, variance, kind, None, int(g.shape[0]))


def quadrature_moments(fine: Moments, coarse: Moments) -> Moments:
    """The finer rule's moments with the error bar |fine mean - coarse mean| per parameter (an
    estimate of the coarser rule's error, so conservative for the finer one)."""
    return Moments(fine.mean, fine.variance, "quadrature", np.abs(fine.mean - coarse.mean),
                   fine.samples)


def mc_moments(g: np.ndarray) -> Moments:
    """Moments of M independent estimates g (M, P): the sample mean, the sample variance
    (ddof 1) and the standard error of the mean sqrt(Var / M) per parameter (one stratum of
    :func:`stratified_moments`)."""
    g = np.asarray(g, dtype=np.float64)
    if g.shape[0] < 2:
        raise PBInputError(f"Monte Carlo moments need at least 2 draws, got {g.shape[0]}")
    return stratified_moments(g, np.zeros(g.shape[0], dtype=int), np.ones(1))


def stratified_moments(g: np.ndarray, stratum: np.ndarray, prob: np.ndarray) -> Moments:
    """Moments of estimates g (N, P) drawn by strata: row j from stratum ``stratum[j]`` (an
    index into ``prob``, the strata's probabilities, summing to 1), each stratum of positive
    probability with at least 2 rows.

    mean = sum_h p_h mean_h(g); the per-parameter variance of one sample, unbiased:
    sum_h p_h mean_h((g - mean)^2) + SE^2 (the squared distance to the estimated mean falls
    short of the variance by the mean's own variance); SE^2 = sum_h p_h^2 Var_h(g) / M_h
    (ddof 1), and :class:`SamplingError` with q = ||g - mean||^2."""
    g = np.asarray(g, dtype=np.float64)
    stratum = np.asarray(stratum)
    prob = np.asarray(prob, dtype=np.float64)
    counts = np.bincount(stratum, minlength=prob.size)
    live = prob > 0
    if np.any(counts[live] < 2):
        raise PBInputError("stratified Monte Carlo moments need at least 2 draws in every "
                           f"stratum of positive probability, got {counts[live].min()}")
    M = np.maximum(counts, 1)
    sums = np.zeros((prob.size, g.shape[1]))
    np.add.at(sums, stratum, g)
    means_h = sums / M[:, None]
    mean = prob @ means_h
    dev = g - mean
    q = (dev ** 2).sum(axis=1)
    w = prob ** 2 / (M * np.maximum(M - 1, 1))  # p_h^2 / M_h times the ddof-1 1 / (M_h - 1)
    within = g - means_h[stratum]
    q_h = np.zeros(prob.size)
    np.add.at(q_h, stratum, q)
    q_within = q - (q_h / M)[stratum]
    row_w = w[stratum]
    mean_cov = (within * row_w[:, None]).T @ within
    cross = (within * (row_w * q_within)[:, None]).sum(axis=0)
    trace_var = float((row_w * q_within ** 2).sum())
    sq = np.zeros((prob.size, g.shape[1]))
    np.add.at(sq, stratum, dev ** 2)
    se2 = np.diag(mean_cov).copy()
    variance = prob @ (sq / M[:, None]) + se2
    return Moments(mean, variance, "mc", np.sqrt(se2), int(g.shape[0]),
                   SamplingError(mean_cov, cross, trace_var))


@dataclass(frozen=True)
class BiasSummary:
    """An estimator's moments (``moments``) against the true gradient ``true`` (P,)."""

    moments: Moments
    true: np.ndarray

    @property
    def bias(self) -> np.ndarray:
        """b = E[g] - grad_r E_theta[J], shape (P,)."""
        return self.moments.mean - self.true

    @property
    def bias_norm(self) -> float:
        """||b||."""
        return float(np.linalg.norm(self.bias))

    @property
    def bias_norm_error(self) -> float:
        """Error bar of :attr:`bias_norm`: sqrt(sum of squared error bars of the mean) (the
        computed norm is within ||computed b - b|| of the true one); 0 when exact."""
        err = self.moments.error
        return 0.0 if err is None else float(np.sqrt(np.sum(err**2)))

    @property
    def bias_squared(self) -> float:
        """||b||^2; for Monte Carlo, ||b_hat||^2 - sum SE^2, unbiased for ||b||^2 (may be < 0)."""
        value = self.bias_norm**2
        if self.moments.kind == "mc":
            value -= float(np.sum(self.moments.error**2))
        return value

    @property
    def cosine(self) -> float:
        """cos(E[g], true gradient); NaN where either is zero."""
        a, b = np.linalg.norm(self.moments.mean), np.linalg.norm(self.true)
        if a == 0 or b == 0:
            return math.nan
        return float(self.moments.mean @ self.true / (a * b))

    @property
    def trace(self) -> float:
        """tr Cov[g] of one sample."""
        return float(self.moments.variance.sum())

    @property
    def trace_error(self) -> float:
        """Standard error of :attr:`trace` (Monte Carlo rows; 0 otherwise)."""
        s = self.moments.sampling
        return 0.0 if s is None else math.sqrt(max(s.trace_var, 0.0))

    def mse(self, n: int) -> float:
        """E||g_n - true||^2 = ||b||^2 + tr Cov / n for the mean g_n of n independent samples."""
        return self.bias_squared + self.trace / n

    def mse_error(self, n: int) -> float:
        """Standard error of :meth:`mse` (Monte Carlo rows; 0 otherwise): the delta method on
        its per-draw term 2 b (g - mean) + ||g - mean||^2 / n, whose variance is
        4 b^T C_mean b + 4 b . cross / n + Var(trace) / n^2 (:class:`SamplingError`)."""
        s = self.moments.sampling
        if s is None:
            return 0.0
        b = self.bias
        var = 4 * b @ s.mean_cov @ b + 4 * (b @ s.cross) / n + s.trace_var / n ** 2
        return math.sqrt(max(float(var), 0.0))

    def detectable_bias(self, level: float = DETECT_LEVEL, power: float = DETECT_POWER
                        ) -> float:
        """The smallest bias, along any one coordinate, that :attr:`zero_bias_pvalue` finds at
        ``level`` (Bonferroni over the P coordinates) with probability ``power``:
        (z_{1 - level / (2P)} + z_power) max_i SE_i (0 for exact rows: any bias is seen)."""
        err = self.moments.error
        if err is None or self.moments.kind != "mc":
            return 0.0
        from scipy.stats import norm

        z = norm.isf(level / (2 * err.size)) + norm.ppf(power)
        return float(z * err.max(initial=0.0))

    @property
    def zero_bias_pvalue(self) -> float:
        """Smallest two-sided p-value of the per-parameter z-tests of b = 0 (Monte Carlo: b_i /
        SE_i), Bonferroni-corrected (times P, at most 1); for exact rows 1 if b is zero to
        round-off (1e-12 of the gradient's scale) and 0 otherwise."""
        err = self.moments.error
        if err is None or self.moments.kind != "mc":
            scale = max(float(np.abs(self.true).max(initial=0.0)), 1e-300)
            return 1.0 if np.abs(self.bias).max(initial=0.0) <= 1e-12 * scale else 0.0
        z = np.abs(self.bias) / np.where(err > 0, err, np.inf)
        return float(min(1.0, math.erfc(z.max(initial=0.0) / math.sqrt(2)) * self.bias.size))


class UnbiasedVariance:
    """tr Var of an unbiased estimator of `pbexact.estimators.REGISTRY` (LOORF, ARMS, DisARM...)
    at n samples, exact by `pbexact.closed_form` at fixed J, r and parametrization; memoized
    over n (a call costs O(d log d 2^d), independent of n)."""

    def __init__(self, name: str, J: np.ndarray, r: np.ndarray, param: Parametrization) -> None:
        self.spec = get_estimator(name)
        self.J, self.r, self.param = J, np.asarray(r, dtype=np.float64), param
        self._cache: dict[int, float] = {}

    def __call__(self, n: int) -> float:
        if n not in self._cache:
            moments = closed_form_moments(self.J, self.r, n, self.param, (self.spec.name,))
            self._cache[n] = moments[self.spec.name].total_variance
        return self._cache[n]


def break_even_n(target: float, variance_at: Callable[[int], float], min_n: int,
                 step: int = 1, max_n: int = MAX_BREAK_EVEN_N) -> int | None:
    """The smallest n = min_n + k step with variance_at(n) <= target (the variance of a mean of
    more samples is not larger): doubling from min_n, then bisection, so that searches for
    several targets share their probes through a memoized ``variance_at``
    (:class:`UnbiasedVariance`); None if not reached by max_n. A target of 0 (an exact,
    unbiased, deterministic estimate) is never reached by a nonzero variance."""
    last = max_n - (max_n - min_n) % step
    lo, hi = min_n, min_n
    if variance_at(lo) <= target:
        return lo
    while variance_at(hi) > target:  # variance_at(lo) > target throughout
        if hi == last:
            return None
        lo, hi = hi, min(last, min_n + 2 * (hi - min_n) + step)
    while hi - lo > step:  # variance_at(lo) > target >= variance_at(hi)
        mid = lo + ((hi - lo) // step // 2) * step
        if variance_at(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi
