"""Vertices of the hypercube and n-multisets of them (`sec:pb_basics`, `sec:app_true_var`).

Vertex order is the paper's ``zeta_h``: z_i is bit i-1 of h, so ``vertices(2)`` is
[[0, 0], [1, 0], [0, 1], [1, 1]].
"""

from __future__ import annotations

import math

import numba
import numpy as np

from .errors import (
    ENUMERATION_MEMORY_LIMIT,
    PBInputError,
    check_d,
    format_bytes,
    format_count,
    multiset_count,
)


def vertices(d: int) -> np.ndarray:
    """All 2^d vertices zeta_h, shape (2^d, d), dtype float64, row h has z_i = bit i-1 of h."""
    d = check_d(d)
    h = np.arange(2**d, dtype=np.int64)
    return ((h[:, None] >> np.arange(d, dtype=np.int64)) & 1).astype(np.float64)


@numba.njit(cache=True)
def _multisets_kernel(num_items: int, n: int, count: int) -> np.ndarray:
    out = np.empty((count, n), dtype=np.int64)
    cur = np.zeros(n, dtype=np.int64)
    for row in range(count):
        out[row, :] = cur
        j = n - 1
        while j >= 0 and cur[j] == num_items - 1:
            j -= 1
        if j < 0:
            break
        v = cur[j] + 1
        for k in range(j, n):
            cur[k] = v
    return out


@numba.njit(cache=True)
def _permutation_counts_kernel(ms: np.ndarray, fact: np.ndarray) -> np.ndarray:
    count, n = ms.shape
    out = np.empty(count, dtype=np.float64)
    for row in range(count):
        denom = 1.0
        run = 1
        for k in range(1, n):
            if ms[row, k] == ms[row, k - 1]:
                run += 1
            else:
                denom *= fact[run]
                run = 1
        denom *= fact[run]
        out[row] = fact[n] / denom
    return out


def enumeration_bytes(num_items: int, n: int, per_entry: int = 8) -> int:
    """Working memory of an enumeration over all n-multisets: one int64 index per sample."""
    return multiset_count(num_items, n) * n * per_entry


def check_enumeration(num_items: int, n: int) -> None:
    """Raise PBInputError, with the memory it would need, if the n-multisets of ``num_items``
    vertices are too many to enumerate."""
    if n < 1 or num_items < 1:
        raise PBInputError(f"multisets need n >= 1 and at least one item, got n={n}; "
                           "give n >= 1")
    need = enumeration_bytes(num_items, n)
    if need > ENUMERATION_MEMORY_LIMIT:
        raise PBInputError(
            f"enumerating the {format_count(multiset_count(num_items, n))} {n}-multisets of "
            f"{num_items} vertices needs about {format_bytes(need)}, over the limit of "
            f"{format_bytes(ENUMERATION_MEMORY_LIMIT)}; use --method closed (exact) or mc"
        )


def multisets(num_items: int, n: int) -> np.ndarray:
    """All n-multisets of range(num_items) as sorted rows, shape (C(num_items-1+n, n), n)
    (`eq:n_multisets`); 3,876 rows for the 16 vertices of d=4 and n=4."""
    check_enumeration(num_items, n)
    return _multisets_kernel(num_items, n, multiset_count(num_items, n))


def permutation_counts(ms: np.ndarray) -> np.ndarray:
    """Number of orderings n! / prod_h m_h! of each sorted multiset row
    (`eq:multiset_permutations`), shape (rows,), float64."""
    n = ms.shape[1]
    fact = np.array([float(math.factorial(k)) for k in range(n + 1)])
    return _permutation_counts_kernel(np.ascontiguousarray(ms), fact)
