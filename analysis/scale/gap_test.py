"""The t model behind every front comparison (`tab:app_results_summ`; the criterion is ours, the
paper states none): a gap with its standard error and degrees of freedom (:class:`GapTest`), the
two-sided quantile of its 95% interval (:func:`t_quantile`, scipy.stats) and the smallest gap the
design detects (:func:`detectable`): the true gap at which the interval clears the threshold
(0; "much": :data:`MUCH_ACC`) with probability :data:`POWER` (noncentral t). A noise verdict says
a gap at least that large was unlikely, not that the methods are equal. The verdict itself is
:func:`analysis.scale.front_verdict.compare_fronts`'s, which widens the interval by its
interpolation allowance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
from scipy import optimize, stats

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
