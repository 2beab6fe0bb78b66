"""Score-function gradient estimators, written once for numpy (pbexact) and torch (pbscale).

Every estimator takes the n losses ``J`` of shape (..., n) and the n scores
``S = grad_r log p(z^(s); theta(r))`` of shape (..., n, P) and returns a gradient estimate of
shape (..., P); leading dimensions batch independent estimates. Each is defined once, as a
:class:`LinearEstimate` (sample weights from the losses, per-parameter constants); the batch
functions evaluate it on scores, and the exact variance evaluates it on every multiset of
vertices. The iterative accumulators (`alg:iter_reinforce`, `alg:iter_loorf`, `alg:iter_arms`)
take the samples in chunks of any size k >= 1 with memory O(P), and equal the batch forms on the
same samples to round-off; k = 1 is the paper's per-sample recursion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import arrays
from .errors import PBInputError, check_n

Array = Any

ESTIMATORS = ("reinforce", "loorf", "arms", "betastar")
#: Fewest samples each estimator is defined for.
MIN_SAMPLES = {"reinforce": 1, "loorf": 2, "arms": 2, "betastar": 1}


def check_estimator(name: str, n: int | None = None) -> str:
    """Validate an estimator name and, if given, its number of samples."""
    if name not in MIN_SAMPLES:
        raise PBInputError(f"unknown estimator {name!r}; choose one of {', '.join(ESTIMATORS)}")
    if n is not None:
        check_n(n, name.upper() if name != "betastar" else "beta*", MIN_SAMPLES[name])
    return name


def sample_sum(w: Array, S: Array) -> Array:
    """sum_s w^(s) S^(s) for weights w (..., n) and scores S (..., n, P): shape (..., P).

    Every estimator below touches the scores only through this sum, so it is linear in them; an
    ``S`` with a ``weighted_sum(w)`` method (pbscale's affine scores, never built in full)
    supplies its own faster evaluation of the same sum.
    """
    if hasattr(S, "weighted_sum"):
        return S.weighted_sum(w)
    return (w[..., None, :] @ S)[..., 0, :]


@dataclass(frozen=True)
class LinearEstimate:
    """An estimate from n samples in the form every estimator here takes:

        g_p = (sum_s (J^(s) - center) S^(s)_p - baseline_p sum_s S^(s)_p) / (norm divisor_p),

    with the losses J^(s) (``losses``, (..., n)), a ``center`` (scalar or (...,)) shared by the
    n samples of one estimate, a per-parameter ``baseline`` and ``divisor`` (scalars or
    (..., P)) and a number ``norm``. In terms of the sums U = sum_s J^(s) S^(s) and
    B = sum_s S^(s) it is (U - (center + baseline) B) / (norm divisor), which lets the exact
    variance (`pbexact.variance`) share U and B between estimators. :meth:`evaluate` follows the
    formula as written (losses centered before the sum over samples, the division last).
    """

    losses: Array
    norm: int
    center: Array | float = 0.0
    baseline: Array | float = 0.0
    divisor: Array | float = 1.0

    def evaluate(self, S: Array) -> Array:
        """The estimate from scores S (..., n, P): shape (..., P)."""
        centered = self.losses
        if hasattr(self.center, "shape"):
            centered = self.losses - self.center[..., None]
        elif self.center != 0.0:
            centered = self.losses - self.center
        g = sample_sum(centered, S)
        if not _is_scalar(self.baseline, 0.0):
            ones = arrays.namespace(self.losses).ones_like(self.losses)
            g = g - self.baseline * sample_sum(ones, S)
        g = g / self.norm
        if not _is_scalar(self.divisor, 1.0):
            g = g / self.divisor
        return g


def _is_scalar(x: Array | float, value: float) -> bool:
    return isinstance(x, float) and x == value


def reinforce_form(J: Array) -> LinearEstimate:
    """REINFORCE, (1/n) sum_s J(z^(s)) S^(s)  (`eq:reinforce`), from losses J (..., n)."""
    return LinearEstimate(J, J.shape[-1])


def baseline_form(J: Array, beta: Array) -> LinearEstimate:
    """(1/n) sum_s (J(z^(s)) - beta) S^(s) with a constant baseline per parameter, beta of shape
    (..., P) (`eq:bstar_thm_estimator`; beta = beta* of `thm:bStarTwo` gives the beta* estimator).
    """
    return LinearEstimate(J, J.shape[-1], baseline=beta)


def loorf_form(J: Array) -> LinearEstimate:
    """LOORF, (1/(n-1)) sum_s (J(z^(s)) - mean_s' J(z^(s'))) S^(s)  (`eq:loorf`), n >= 2."""
    n = J.shape[-1]
    check_n(n, "LOORF", 2)
    return LinearEstimate(J, n - 1, center=J.sum(-1) / n)


def arms_form(J: Array, rho: Array) -> LinearEstimate:
    """ARMS: LOORF on Dirichlet-copula samples divided by 1 - rho (`alg:orig_arms`), rho of
    shape (..., P) (per bit, expanded to the bit's logits), n >= 2."""
    loorf = loorf_form(J)
    return LinearEstimate(J, loorf.norm, loorf.center, divisor=1 - rho)


def linear_estimate(name: str, J: Array, extra: Array | None = None) -> LinearEstimate:
    """The estimator ``name`` on losses J (..., n); ``extra`` is rho for ARMS, beta for beta*."""
    check_estimator(name)
    if name == "reinforce":
        return reinforce_form(J)
    if name == "loorf":
        return loorf_form(J)
    if extra is None:
        what = "rho" if name == "arms" else "beta"
        raise PBInputError(
            f"{name} needs its per-parameter constant {what}; "
            "pbexact.variance.estimator_extra computes it"
        )
    if name == "arms":
        return arms_form(J, extra)
    return baseline_form(J, extra)


def reinforce(J: Array, S: Array) -> Array:
    """REINFORCE from losses J (..., n) and scores S (..., n, P), shape (..., P); see
    :func:`reinforce_form`."""
    return reinforce_form(J).evaluate(S)


def baseline(J: Array, S: Array, beta: Array) -> Array:
    """The constant-baseline estimator, shape (..., P); see :func:`baseline_form`."""
    return baseline_form(J, beta).evaluate(S)


def loorf(J: Array, S: Array) -> Array:
    """LOORF, shape (..., P); see :func:`loorf_form`."""
    return loorf_form(J).evaluate(S)


def arms(J: Array, S: Array, rho: Array) -> Array:
    """ARMS on copula samples, shape (..., P); see :func:`arms_form`."""
    return arms_form(J, rho).evaluate(S)


class ReinforceAccumulator:
    """`alg:iter_reinforce`: g <- (m/(m+k)) g + (1/(m+k)) sum_chunk J S."""

    def __init__(self) -> None:
        self.count = 0
        self.g: Array = None

    def update(self, J: Array, S: Array) -> None:
        self._add(sample_sum(J, S), J.shape[-1])

    def _add(self, chunk_sum: Array, k: int) -> None:
        m = self.count
        if self.g is None:
            self.g = chunk_sum / k
        else:
            self.g = self.g * (m / (m + k)) + chunk_sum / (m + k)
        self.count = m + k

    def value(self) -> Array:
        if self.count == 0:
            raise PBInputError("no samples were accumulated; call update() at least once")
        return self.g


class BaselineAccumulator(ReinforceAccumulator):
    """Iterative form of the constant-baseline (beta*) estimator, beta of shape (..., P)."""

    def __init__(self, beta: Array) -> None:
        super().__init__()
        self.beta = beta

    def update(self, J: Array, S: Array) -> None:
        ones = arrays.namespace(J).ones_like(J)
        self._add(sample_sum(J, S) - self.beta * sample_sum(ones, S), J.shape[-1])


class LoorfAccumulator:
    """`alg:iter_loorf`, for chunks of k samples at a time:

    J_hat <- (m / (m+k)) J_hat + (1 / (m+k)) sum J,
    Lambda <- (max(m-1, 1) / max(m+k-1, 1)) Lambda + (1 / max(m+k-1, 1)) sum (.),
    for Lambda_s (sum of scores) and Lambda_Js (sum of J times score);
    g = Lambda_Js - Lambda_s J_hat.
    """

    def __init__(self) -> None:
        self.count = 0
        self.j_mean: Array = None
        self.lam_s: Array = None
        self.lam_js: Array = None

    def update(self, J: Array, S: Array) -> None:
        k = J.shape[-1]
        m = self.count
        sum_j = J.sum(-1)
        sum_s = S.sum(-2)
        sum_js = sample_sum(J, S)
        old, new = max(m - 1, 1), max(m + k - 1, 1)
        if self.j_mean is None:
            self.j_mean = sum_j / k
            self.lam_s = sum_s / new
            self.lam_js = sum_js / new
        else:
            self.j_mean = self.j_mean * (m / (m + k)) + sum_j / (m + k)
            self.lam_s = self.lam_s * (old / new) + sum_s / new
            self.lam_js = self.lam_js * (old / new) + sum_js / new
        self.count = m + k

    def value(self) -> Array:
        check_n(self.count, "LOORF", 2)
        return self.lam_js - self.lam_s * self.j_mean[..., None]


class ArmsAccumulator(LoorfAccumulator):
    """`alg:iter_arms`: the LOORF accumulators on copula samples, divided by 1 - rho at the end."""

    def __init__(self, rho: Array) -> None:
        super().__init__()
        self.rho = rho

    def value(self) -> Array:
        check_n(self.count, "ARMS", 2)
        return (self.lam_js - self.lam_s * self.j_mean[..., None]) / (1 - self.rho)
