"""The test behind every front comparison of the claims study: a gap between two methods with
its 95% confidence interval, the verdict it gives and the smallest gap the design could have
detected (`tab:app_results_summ`; the criterion is ours, the paper states none).

A gap comes with a standard error and degrees of freedom (:class:`GapTest`):

* :func:`paired`: per-seed gaps d_k (the two methods run with the same seeds): mean, s.d. / sqrt
  K, K - 1 df (the paired t interval);
* :func:`welch`: per-seed values of each method without pairing: difference of means, Welch's
  s.e. and Welch-Satterthwaite df;
* :func:`modelled`: a gap whose s.e. comes from a model of the seed noise (one-seed designs),
  with the df of the s.d. it used (inf: a fixed s.d.).

The interval is mean +- t(0.975, df) s.e. (scipy.stats). "A better than B" holds when the
interval lies above the threshold (0; 'much': :data:`MUCH_ACC`), fails when it lies below it,
and is noise otherwise (:func:`outcome`). The detectable gap (:func:`detectable`) is the true gap
at which the verdict reads holds with probability :data:`POWER` under the same t model
(noncentral t): a noise verdict says a gap at least that large was unlikely, not that the
methods are equal. Every function takes numbers or numpy arrays (the calibration simulations
run thousands of studies at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
from scipy import optimize, stats

from analysis.microworld.claims import FAILS, HOLDS, NOISE

#: Two-sided level of the confidence interval (a false holds or fails has probability 1 - LEVEL
#: at most in all, about half of it each way).
LEVEL = 0.95
#: The power at which the detectable gap is stated.
POWER = 0.80
#: "Much better" (pruning): the interval must clear this accuracy gap (two points).
MUCH_ACC = 0.02


@dataclass(frozen=True)
class GapTest:
    """A gap (mean), its standard error, degrees of freedom (inf: normal) and how it was made
    (``paired``, ``welch``, ``model``); numbers or arrays of one shape."""

    mean: np.ndarray | float
    se: np.ndarray | float
    df: np.ndarray | float
    how: str

    @property
    def half_width(self):
        return t_quantile(self.df) * self.se

    @property
    def low(self):
        return self.mean - self.half_width

    @property
    def high(self):
        return self.mean + self.half_width


def t_quantile(df, level: float = LEVEL):
    """The two-sided ``level`` quantile of Student's t with df degrees of freedom (normal for
    inf)."""
    if np.ndim(df) == 0:
        return _t_quantile(float(df), level)
    return stats.t.ppf(0.5 + level / 2, df)


@cache
def _t_quantile(df: float, level: float) -> float:
    return float(stats.t.ppf(0.5 + level / 2, df))


def paired(d: np.ndarray) -> GapTest:
    """Per-seed gaps d (..., K), K >= 2: the paired t test."""
    k = d.shape[-1]
    return GapTest(d.mean(axis=-1), d.std(axis=-1, ddof=1) / np.sqrt(k),
                   np.full(d.shape[:-1], float(k - 1)) if d.ndim > 1 else float(k - 1), "paired")


def welch(a: np.ndarray, b: np.ndarray) -> GapTest:
    """Per-seed values a (..., K_A) and b (..., K_B), K >= 2 each, not paired: Welch's test."""
    va = a.var(axis=-1, ddof=1) / a.shape[-1]
    vb = b.var(axis=-1, ddof=1) / b.shape[-1]
    se = np.sqrt(va + vb)
    with np.errstate(invalid="ignore", divide="ignore"):
        df = (va + vb) ** 2 / (va ** 2 / (a.shape[-1] - 1) + vb ** 2 / (b.shape[-1] - 1))
    df = np.where(np.isfinite(df), df, float(a.shape[-1] + b.shape[-1] - 2))
    return GapTest(a.mean(axis=-1) - b.mean(axis=-1), se, df if df.ndim else float(df), "welch")


def modelled(mean, se, df) -> GapTest:
    """A gap with an s.e. from a model of the seed noise (df of the s.d. it rests on)."""
    return GapTest(mean, se, df, "model")


def outcome(test: GapTest, much: bool = False):
    """holds / fails / noise: the interval above the threshold (0, or MUCH_ACC with ``much``),
    below it, or across it; an array of outcomes for arrays."""
    m = MUCH_ACC if much else 0.0
    lo, hi = np.asarray(test.low), np.asarray(test.high)
    out = np.where(lo > m, HOLDS, np.where(hi < m, FAILS, NOISE))
    return str(out) if out.ndim == 0 else out


@cache
def _noncentrality(df: float, level: float, power: float) -> float:
    """The noncentrality at which a t statistic with df degrees of freedom exceeds its
    two-sided ``level`` quantile with probability ``power``."""
    crit = float(t_quantile(df, level))
    if not np.isfinite(df):
        return crit + float(stats.norm.ppf(power))
    return float(optimize.brentq(lambda nc: stats.nct.sf(crit, df, nc) - power, 0.0,
                                 crit + 50.0))


@cache
def _median_ratio(df: float) -> float:
    """The median of s / sigma for a sample s.d. s with df degrees of freedom
    (sqrt(median(chi2_df) / df); 1 for inf)."""
    if not np.isfinite(df):
        return 1.0
    return math.sqrt(stats.chi2.median(df) / df)


def detectable(test: GapTest, much: bool = False, power: float = POWER):
    """The smallest true gap at which the verdict reads holds with probability ``power``: the
    threshold plus nc(df) sigma_se, where a noncentral t with noncentrality nc exceeds the
    interval's quantile with that probability, and sigma_se = s.e. / the median of s / sigma
    (the estimated s.e. is below the true one more often than not: by 8% at the median for 4
    df, so the gap stated at the estimate itself would have less power than it says)."""
    m = MUCH_ACC if much else 0.0
    df = np.asarray(test.df, dtype=float)
    nc = np.vectorize(lambda f: _noncentrality(float(f), LEVEL, power)
                      / _median_ratio(float(f)))(df)
    out = m + nc * np.asarray(test.se)
    return float(out) if out.ndim == 0 else out
