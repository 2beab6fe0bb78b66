"""Samplers for the estimators: iid Bernoulli and the ARMS Dirichlet copula, in both the
original (`alg:orig_arms`) and the iterative (`alg:iter_dir`) form.

The transforms from uniforms to copula values are array-agnostic (numpy or torch); the numpy
drivers below take an explicit ``numpy.random.Generator`` so that the same seed gives the same
numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .arrays import namespace
from .copula import arms_bits
from .errors import PBInputError, check_n, check_theta

Array = Any


def copula_from_uniforms(u: Array) -> Array:
    """`alg:orig_arms`: iid uniforms u of shape (..., n, d) -> copula uniforms u~, same shape:
    d^(s) = log u^(s) / sum_s' log u^(s'), u~ = 1 - (1 - d)^(n-1)."""
    n = u.shape[-2]
    log_u = namespace(u).log(u)
    dirichlet = log_u / log_u.sum(-2)[..., None, :]
    return 1 - (1 - dirichlet) ** (n - 1)


class IterativeDirichletCopula:
    """`alg:iter_dir` for d dimensions at once: draws the n copula uniforms one by one (or in
    chunks) with O(d) state, given the Gamma(n, 1) totals of shape (d,) and, per draw, uniforms.

    After s draws the remainder R is the sum of the n - s exponentials not yet drawn; the next one
    is E = R (1 - U^(1/(n-s))) (`eq:arms_iter_app_cond_sample`), and the last takes all of R.
    """

    def __init__(self, total: Array, n: int) -> None:
        self.n = check_n(n, "ARMS", 2)
        self.total = total
        self.remaining = total * 1.0
        self.drawn = 0

    def next(self, u: Array) -> Array:
        """Copula uniforms u~ of the next k samples, from uniforms u of shape (k, d); (k, d).

        The remainders after each of the k draws are a cumulative product over the chunk,
        R_s = R_(s-1) U_s^(1/(n-s)) (R_n = 0: the last draw takes all), so the chunk is computed
        without a loop over its rows; E_s = R_(s-1) - R_s."""
        k = u.shape[0]
        first = self.drawn + 1
        if first + k - 1 > self.n:
            raise ValueError(f"all n={self.n} copula samples were already drawn")
        xp = namespace(u)
        s = np.arange(first, first + k)
        expo = 1.0 / np.maximum(self.n - s, 1)
        last = (s == self.n).astype(np.float64)
        if xp is not np:
            expo = xp.as_tensor(expo, dtype=u.dtype, device=u.device)
            last = xp.as_tensor(last, dtype=u.dtype, device=u.device)
        w = u ** expo[:, None] * (1 - last[:, None])  # U_s^(1/(n-s)), 0 for the last draw
        cum = np.cumprod(w, axis=0) if xp is np else xp.cumprod(w, dim=0)
        after = self.remaining * cum  # R_s, (k, d)
        before = xp.concatenate([self.remaining[None], after[:-1]]) if xp is np else \
            xp.cat([self.remaining[None], after[:-1]])
        e = before - after
        self.remaining = after[-1]
        self.drawn = first + k - 1
        return 1 - (1 - e / self.total) ** (self.n - 1)


def sample_bernoulli(
    theta: np.ndarray, size: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """z ~ prod_i Bern(theta_i), shape size + (d,), float64 (`eq:reinforce_p`)."""
    theta = check_theta(theta)
    return (rng.random(size + theta.shape) < theta) * 1.0


def sample_arms(
    theta: np.ndarray, n: int, size: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """z~ from the Dirichlet copula (`alg:orig_arms`) for theta of shape (..., d), shape
    size + (...) + (n, d): each theta of a batch gets its own n copula samples (for theta of shape
    (d,) the draws are the same as without a batch)."""
    theta = check_theta(theta)
    n = check_n(n, "ARMS", 2)
    u = rng.random(size + theta.shape[:-1] + (n,) + theta.shape[-1:])
    u = np.maximum(u, np.finfo(np.float64).tiny)  # log(0) would break the normalization
    return arms_bits(copula_from_uniforms(u), theta)


def sample_antithetic(
    theta: np.ndarray, n: int, size: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """n/2 independent antithetic pairs (DisARM), interleaved: sample 2j is z = 1[u < theta] and
    sample 2j + 1 is z~ = 1[1 - u < theta] for one u ~ U(0, 1)^d; theta of shape (..., d), shape
    size + (...) + (n, d)."""
    theta = check_theta(theta)
    n = check_n(n, "DisARM", 2)
    if n % 2:
        raise PBInputError(f"antithetic pairs need an even number of samples, got n={n}; "
                           "give an even n")
    u = rng.random(size + theta.shape[:-1] + (n // 2,) + theta.shape[-1:])
    t = theta[..., None, :]
    pairs = np.stack([u < t, 1 - u < t], axis=-2) * 1.0  # (..., n/2, 2, d)
    return pairs.reshape(pairs.shape[:-3] + (n,) + theta.shape[-1:])


def sample_law(
    law: str, theta: np.ndarray, n: int, size: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """The n samples of one estimate under an estimator's law (`pbexact.estimators.LAWS`) for
    theta of shape (..., d), shape size + (...) + (n, d): iid Bernoulli, the ARMS copula or
    antithetic pairs."""
    if law == "copula":
        return sample_arms(theta, n, size, rng)
    if law == "antithetic":
        return sample_antithetic(theta, n, size, rng)
    if law == "iid":
        return np.moveaxis(sample_bernoulli(theta, size + (n,), rng), len(size), -2)
    raise PBInputError(f"unknown sampling law {law!r}; choose iid, copula or antithetic")


def vertex_index(z: Array) -> Array:
    """h = sum_i 2^(i-1) z_i (`sec:pb_basics`) for z of shape (..., d)."""
    d = z.shape[-1]
    weights = 2 ** np.arange(d, dtype=np.int64)
    if isinstance(z, np.ndarray):
        return z.astype(np.int64) @ weights
    import torch

    return z.to(torch.int64) @ torch.as_tensor(weights, device=z.device)
