"""Accuracy/sparsity Pareto fronts as curves (`fig:supermask_results`,
`fig:joint_pruning_results`), vectorized over any leading axes (seeds, replicates of a
simulation): a front's value at a budget r (:func:`front_values`), the range two sets of fronts
are compared over (:func:`common_range`) and a front's mean over that range in log remaining
(:func:`range_means`), with the weight each point has in that mean (for a standard error that
is linear in the points' accuracies).

Points are arrays ``rem`` and ``acc`` of shape (..., P): remaining fraction and test accuracy; a
point with ``rem <= 0`` (nothing left) or a NaN (a run that diverged or was not run) is no point.
A front's value at r is

* ``step``: the best accuracy among its points with remaining <= r (the front as measured);
* interpolated (the default): linear in log(r) between consecutive front points, flat beyond
  the densest point (the best accuracy with at most r weights left stays reachable), so it is
  monotone in r; undefined (NaN) below the sparsest point.

The mean over [lo, hi] in log remaining is exact (no grid): every front is linear (interpolated)
or constant (step) between consecutive points, so the trapezoid (rectangle) rule over the union
of all points is the integral. ``grid=G`` reads the fronts at G log-spaced budgets instead, as
the first version of the criterion did (G = 25).
"""

from __future__ import annotations

import numpy as np

#: Relative slack when a point's remaining fraction is compared with a budget (round-off).
REL_TOL = 1e-12


def valid_points(rem: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """Which entries of (..., P) are points: some weight left, both numbers finite."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(rem) & np.isfinite(acc) & (rem > 0)


def front_ends(rem: np.ndarray, acc: np.ndarray, floor: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per front (..., P) -> (...): the sparsest point with accuracy >= floor (inf: none), the
    sparsest point of any accuracy (inf: no point), the densest front point (the sparsest of
    the most accurate; inf: no point) and whether the front has a point >= floor."""
    ok = valid_points(rem, acc)
    a = np.where(ok, acc, -np.inf)
    useful = ok & (a >= floor)
    lo_useful = np.where(useful, rem, np.inf).min(axis=-1)
    lo_any = np.where(ok, rem, np.inf).min(axis=-1)
    best = a.max(axis=-1, keepdims=True)
    hi = np.where(ok & (a == best), rem, np.inf).min(axis=-1)
    return lo_useful, lo_any, hi, useful.any(axis=-1)


def front_values(rem: np.ndarray, acc: np.ndarray, x: np.ndarray, step: bool = False,
                 coefficients: bool = False):
    """The fronts of points (..., P) at budgets x (..., M) (broadcast against the leading axes):
    values (..., M), NaN below a front's sparsest point. With ``coefficients``, also the
    weights (..., M, P) that make each value a combination of the points' accuracies (the
    front's membership held fixed)."""
    ok = valid_points(rem, acc)[..., None, :]
    r = np.where(ok, rem[..., None, :], np.inf)
    a = np.where(ok, acc[..., None, :], -np.inf)
    xs = x[..., :, None]
    within = ok & (r <= xs * (1 + REL_TOL))
    s = np.where(within, a, -np.inf).max(axis=-1)  # step value (..., M)
    at = within & (a == s[..., None])
    i = np.argmin(np.where(at, r, np.inf), axis=-1)  # the step point: sparsest of the best
    defined = np.isfinite(s)
    if step:
        values = np.where(defined, s, np.nan)
        if not coefficients:
            return values
        coef = (np.arange(rem.shape[-1]) == i[..., None]) * defined[..., None]
        return values, coef.astype(float)
    after = ok & ~within & (a > s[..., None])
    rj = np.where(after, r, np.inf).min(axis=-1)
    nxt = after & (r == rj[..., None])
    j = np.argmax(np.where(nxt, a, -np.inf), axis=-1)
    aj = np.take_along_axis(np.where(nxt, a, -np.inf), j[..., None], axis=-1)[..., 0]
    ri = np.take_along_axis(r, i[..., None], axis=-1)[..., 0]
    has_next = np.isfinite(rj) & defined
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(has_next, (np.log(np.broadcast_to(x, s.shape)) - np.log(ri))
                     / (np.log(rj) - np.log(ri)), 0.0)
        values = np.where(defined, s + t * np.where(has_next, aj - s, 0.0), np.nan)
    if not coefficients:
        return values
    p = np.arange(rem.shape[-1])
    coef = ((p == i[..., None]) * (1 - t)[..., None] + (p == j[..., None]) * t[..., None]
            * has_next[..., None]) * defined[..., None]
    return values, coef


def common_range(rem: np.ndarray, acc: np.ndarray, floor: float
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The range [lo, hi] over which all fronts (..., F, P) are compared, (...) each, and
    whether every front has a point: lo is the largest, over the fronts, of the sparsest point
    with accuracy >= floor (and of the sparsest point of a front without one, so that every
    front is defined on the range); hi the largest densest point (at least lo)."""
    lo_useful, lo_any, hi, _ = front_ends(rem, acc, floor)
    lo = np.maximum(np.where(np.isfinite(lo_useful), lo_useful, -np.inf).max(axis=-1),
                    lo_any.max(axis=-1))
    hi = np.maximum(np.where(np.isfinite(hi), hi, -np.inf).max(axis=-1), lo)
    return lo, hi, np.isfinite(lo_any).all(axis=-1)


def _budgets(rem: np.ndarray, lo: np.ndarray, hi: np.ndarray, grid: int | None) -> np.ndarray:
    """The budgets each front (..., F, P) is read at, (..., F, M) or (..., 1, G): G log-spaced
    ones, or the front's own points' remaining fractions clipped to [lo, hi], with lo and hi,
    sorted (its breakpoints: between two of them it is linear in log r, or constant)."""
    if grid is not None:
        return np.exp(np.linspace(np.log(lo), np.log(hi), grid, axis=-1))[..., None, :]
    lo, hi = lo[..., None, None], hi[..., None, None]
    inside = np.where(np.isfinite(rem) & (rem > 0), rem, lo)
    pts = np.clip(inside, lo, hi)
    ends = np.broadcast_to(lo, rem.shape[:-1] + (1,)), np.broadcast_to(hi, rem.shape[:-1] + (1,))
    return np.sort(np.concatenate([ends[0], pts, ends[1]], axis=-1), axis=-1)


def _quadrature(x: np.ndarray, step: bool, grid: int | None) -> np.ndarray:
    """Weights (..., M) of the values at budgets x whose sum is the mean over [x_0, x_-1] in log
    remaining (exact for the fronts' shapes); the plain mean on a grid; all weight on x_0 when
    the range is one budget."""
    if grid is not None:
        return np.full(x.shape, 1.0 / x.shape[-1])
    lx = np.log(x)
    width = np.diff(lx, axis=-1)
    total = lx[..., -1:] - lx[..., :1]
    w = np.zeros(x.shape)
    if step:
        w[..., :-1] = width
    else:
        w[..., :-1] += width / 2
        w[..., 1:] += width / 2
    point = np.zeros(x.shape)
    point[..., 0] = 1.0
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, w / np.where(total > 0, total, 1.0), point)


def range_means(rem: np.ndarray, acc: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                step: bool = False, grid: int | None = None, weights: bool = False):
    """Each front's mean value over [lo, hi] in log remaining: fronts (..., F, P), range (...)
    -> (..., F). The budgets read are each front's breakpoints (exact), or ``grid`` log-spaced
    ones. With ``weights``, also each point's weight in its front's mean, (..., F, P)."""
    x = _budgets(rem, lo, hi, grid)
    q = _quadrature(x, step, grid)
    if not weights:
        return (front_values(rem, acc, x, step) * q).sum(axis=-1)
    values, coef = front_values(rem, acc, x, step, coefficients=True)
    return (values * q).sum(axis=-1), (coef * q[..., None]).sum(axis=-2)


def _pad(x: np.ndarray, width: int) -> np.ndarray:
    pad = [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])]
    return np.pad(x, pad, constant_values=np.nan)


def compared_means(rem_a: np.ndarray, acc_a: np.ndarray, rem_b: np.ndarray, acc_b: np.ndarray,
                   floor: float, step: bool = False, grid: int | None = None,
                   weights: bool = False) -> tuple:
    """Two sets of fronts, A (..., K_A, P_A) and B (..., K_B, P_B) (K: seeds, or one front of
    seed means), compared over their common range (:func:`common_range` over all K_A + K_B
    fronts): (means_a (..., K_A), means_b (..., K_B), lo, hi), and with ``weights`` each
    point's weight in its front's mean, (..., K_A, P_A) and (..., K_B, P_B)."""
    width = max(rem_a.shape[-1], rem_b.shape[-1])
    rem = np.concatenate([_pad(rem_a, width), _pad(rem_b, width)], axis=-2)
    acc = np.concatenate([_pad(acc_a, width), _pad(acc_b, width)], axis=-2)
    lo, hi, _ = common_range(rem, acc, floor)
    ka = rem_a.shape[-2]
    out = range_means(rem, acc, lo, hi, step, grid, weights)
    means = out[0] if weights else out
    result = (means[..., :ka], means[..., ka:], lo, hi)
    if not weights:
        return result
    w = out[1]
    return (*result, w[..., :ka, :rem_a.shape[-1]], w[..., ka:, :rem_b.shape[-1]])
