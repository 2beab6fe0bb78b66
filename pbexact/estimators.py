"""Score-function gradient estimators, written once for numpy (pbexact) and torch (pbscale).

Every estimator takes the n losses ``J`` of shape (..., n) and the n scores
``S = grad_r log p(z^(s); theta(r))`` of shape (..., n, P) and returns a gradient estimate of
shape (..., P); leading dimensions batch independent estimates (the exact variance enumerates
every multiset at once this way). The iterative accumulators (`alg:iter_reinforce`,
`alg:iter_loorf`, `alg:iter_arms`) take the samples in chunks of any size k >= 1 with memory
O(P), and equal the batch forms on the same samples to round-off; k = 1 is the paper's
per-sample recursion.
"""

from __future__ import annotations

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
    ``S`` with a ``weighted_sum(w)`` method (pbexact.variance's scores looked up at vertices)
    supplies its own faster evaluation of the same sum.
    """
    if hasattr(S, "weighted_sum"):
        return S.weighted_sum(w)
    return (w[..., None, :] @ S)[..., 0, :]


def reinforce(J: Array, S: Array) -> Array:
    """(1/n) sum_s J(z^(s)) S^(s)  (`eq:reinforce`)."""
    return sample_sum(J, S) / J.shape[-1]


def baseline(J: Array, S: Array, beta: Array) -> Array:
    """(1/n) sum_s (J(z^(s)) - beta) S^(s) with a constant baseline per parameter, beta of shape
    (..., P) (`eq:bstar_thm_estimator`; beta = beta* of `thm:bStarTwo` gives the beta* estimator).
    """
    return (sample_sum(J, S) - beta * sample_sum(arrays.namespace(J).ones_like(J), S)) / J.shape[-1]


def loorf(J: Array, S: Array) -> Array:
    """(1/(n-1)) sum_s (J(z^(s)) - mean_s' J(z^(s'))) S^(s)  (`eq:loorf`), n >= 2."""
    n = J.shape[-1]
    check_n(n, "LOORF", 2)
    centered = J - J.sum(-1)[..., None] / n
    return sample_sum(centered, S) / (n - 1)


def arms(J: Array, S: Array, rho: Array) -> Array:
    """LOORF on Dirichlet-copula samples divided by 1 - rho (`alg:orig_arms`), rho of shape
    (..., P) (per bit, expanded to the bit's logits), n >= 2."""
    return loorf(J, S) / (1 - rho)


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
