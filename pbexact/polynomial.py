"""The multilinear polynomial of a J table and its exact expectation and gradient.

A J table has 2^d entries indexed by h (z_i is bit i-1 of h). Every function here is exact,
costs O(2^d) or O(d 2^d), and accepts a batch of thetas of shape (..., d).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import arrays
from .errors import check_table, check_theta

#: Up to this d, E[J] and its gradient are products with the 2^d vertex probabilities (and a
#: (d, 2^d) difference table); beyond, those tables would be large and O(2^d)-memory contractions
#: are used instead.
_TABLE_GRADIENT_MAX_D = 14


def _contract(table: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_h table[h] prod_i (a_i if bit i of h is 0 else b_i); a, b of shape (..., d) batch.

    Consumes the lowest bit first, so each step is one pass over what is left: O(2^d) per batch
    entry, and the batch broadcasts in the first step without copying the table.
    """
    t = table
    for i in range(a.shape[-1]):
        t = t.reshape(t.shape[:-1] + (-1, 2))
        t = t[..., 0] * a[..., i, None] + t[..., 1] * b[..., i, None]
    return t[..., 0]


def _vertex_weights(x: Any) -> Any:
    """prod_i (x_i if bit i of h is 1 else 1 - x_i) for every h, shape (..., 2^d) for x of shape
    (..., d) (torch; differentiable)."""
    xp = arrays.namespace(x)
    w = xp.ones(x.shape[:-1] + (1,), dtype=x.dtype, device=x.device)
    for i in range(x.shape[-1]):
        xi = x[..., i, None]
        w = xp.cat([w * (1 - xi), w * xi], -1)
    return w


def _split_contract(table: Any, x: Any) -> Any:
    """P_J(x) for a torch batch x (..., d): the table as a (2^(d-k), 2^k) matrix between the
    vertex weights of the first k = d // 2 coordinates and of the rest, so a batch costs one
    matrix product (O(2^d) per row, without the (batch, 2^d) intermediates of `_contract`)."""
    d = x.shape[-1]
    k = d // 2
    low, high = _vertex_weights(x[..., :k]), _vertex_weights(x[..., k:])
    return ((low @ table.reshape(2 ** (d - k), 2**k).T) * high).sum(-1)


def vertex_probabilities(theta: np.ndarray) -> np.ndarray:
    """p_theta(zeta_h) for every h (`eq:reinforce_p`), shape (..., 2^d)."""
    return np.moveaxis(_vertex_major_probabilities(check_theta(theta)), 0, -1)


def _vertex_major_probabilities(theta: np.ndarray) -> np.ndarray:
    """p_theta(zeta_h) laid out (2^d, ...): each doubling step writes whole contiguous blocks."""
    d = theta.shape[-1]
    p = np.empty((2**d,) + theta.shape[:-1])
    p[0] = 1.0
    for i in range(d):
        half = 2**i
        t = theta[..., i]
        np.multiply(p[:half], t, out=p[half : 2 * half])
        p[:half] *= 1 - t
    return p


def expected_loss(J: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """E_{z ~ Bern(theta)}[J(z)] = P_J(theta) (`eq:equivalence`), shape (...)."""
    theta = check_theta(theta)
    d = theta.shape[-1]
    J = check_table(J, d)
    if d <= _TABLE_GRADIENT_MAX_D and theta.ndim > 1:
        # for a batch of thetas one product with the vertex probabilities is faster; for a single
        # theta the contraction is
        p = _vertex_major_probabilities(theta)
        return (J @ p.reshape(2**d, -1)).reshape(theta.shape[:-1])
    return _contract(J, 1 - theta, theta)


def multilinear_value(J: np.ndarray, x: Any) -> Any:
    """P_J(x) in the literal form of `eq:multi_poly`, sum_h prod_i x_i^z_i (1-x_i)^(1-z_i) J_h,
    for any real x (not only [0, 1]), shape (...). A torch tensor x gives a torch result,
    differentiable in x (the table is taken to x's dtype and device): the multilinear extension
    that methods differentiating J (ST, CP, relaxations) use for a J table."""
    xp = arrays.namespace(x)
    if xp is not np:
        table = xp.as_tensor(check_table(J, x.shape[-1]), dtype=x.dtype, device=x.device)
        return _split_contract(table, x)
    x = np.asarray(x, dtype=np.float64)
    J = check_table(J, x.shape[-1])
    return _contract(J, 1 - x, x)


def moebius_weights(J: np.ndarray) -> np.ndarray:
    """Subset weights w_S of `eq:multi_poly_set`, indexed by the bitmask of S, shape (2^d,).

    Fast Moebius transform, O(d 2^d): w_S = sum_{T subset S} (-1)^{|S|-|T|} J(1_T).
    """
    w = check_table(J).copy()
    d = w.shape[0].bit_length() - 1
    for i in range(d):
        v = w.reshape(-1, 2, 2**i)
        v[:, 1, :] -= v[:, 0, :]
    return w


def moebius_value(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P_J(x) = sum_S w_S prod_{i in S} x_i (`eq:multi_poly_set`), shape (...)."""
    x = np.asarray(x, dtype=np.float64)
    return _contract(np.asarray(w, dtype=np.float64), np.ones_like(x), x)


def moebius_gradient(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """d P_J / d x_i = sum_{S containing i} w_S prod_{j in S, j != i} x_j, shape (..., d)."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    out = []
    for i in range(d):
        a = np.ones_like(x)
        b = x.copy()
        a[..., i] = 0.0  # drop subsets without i
        b[..., i] = 1.0  # differentiate x_i out of those with it
        out.append(_contract(np.asarray(w, dtype=np.float64), a, b))
    return np.stack(out, axis=-1)


def true_gradient(J: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """grad_theta E[J] (`eq:true_as_avg`): component i is E[J(z_i=1) - J(z_i=0)] over the other
    coordinates, shape (..., d). Exact also where theta_i is 0 or 1."""
    theta = check_theta(theta)
    d = theta.shape[-1]
    J = check_table(J, d)
    if d <= _TABLE_GRADIENT_MAX_D:
        return _gradient_by_table(J, theta)
    return _gradient_by_contraction(J, theta)


def _gradient_by_table(J: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """sum_h p_theta(h) (J(h with bit i set) - J(h with bit i clear)): the difference does not
    depend on z_i, so weighting it by p_theta(h) marginalizes z_i out."""
    d = theta.shape[-1]
    h = np.arange(2**d)
    bits = (1 << np.arange(d))[:, None]
    diff = J[h | bits] - J[h & ~bits]  # (d, 2^d)
    p = _vertex_major_probabilities(theta)
    grad = diff @ p.reshape(2**d, -1)  # (d, batch)
    return np.moveaxis(grad.reshape((d,) + theta.shape[:-1]), 0, -1)


def _gradient_by_contraction(J: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """The same gradient with O(2^d) memory: for each i, contract the difference table of the
    other d - 1 coordinates."""
    out = np.empty(theta.shape)
    for i in range(theta.shape[-1]):
        v = J.reshape(-1, 2, 2**i)
        rest = np.delete(theta, i, axis=-1)
        out[..., i] = _contract((v[:, 1, :] - v[:, 0, :]).reshape(-1), 1 - rest, rest)
    return out


def flipped_expectation(
    J: np.ndarray, theta: np.ndarray, gradient: np.ndarray | None = None
) -> np.ndarray:
    """beta*_i = E_theta[J(z_1, ..., 1 - z_i, ..., z_d)] (`thm:bStarTwo`), shape (..., d).

    With A_i = E[J | z_i = 1] and B_i = E[J | z_i = 0], E[J] = theta_i A_i + (1 - theta_i) B_i and
    the flipped expectation is (1 - theta_i) A_i + theta_i B_i = E[J] + (1 - 2 theta_i) dE/dtheta_i.
    ``gradient``: :func:`true_gradient` at theta, where the caller already has it.
    """
    theta = check_theta(theta)
    if gradient is None:
        gradient = true_gradient(J, theta)
    return expected_loss(J, theta)[..., None] + (1 - 2 * theta) * gradient


def entropy(theta: np.ndarray) -> np.ndarray:
    """Entropy of p_theta in nats, sum_i H(theta_i), shape (...)."""
    theta = check_theta(theta)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -(theta * np.log(theta) + (1 - theta) * np.log1p(-theta))
    return np.nan_to_num(h, nan=0.0).sum(-1)
