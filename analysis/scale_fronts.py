"""Comparing two methods' accuracy/sparsity Pareto fronts (`fig:supermask_results`,
`fig:joint_pruning_results`): the front of a group of pruning runs (:func:`front`), the gap
between two fronts at matched remaining fractions (:func:`front_gaps`, :func:`front_gap`), its
standard error (pooled over seeds, :func:`pooled_se`, or bootstrapped, :func:`bootstrap_gap_se`)
and the verdict "A performed better than B" (:func:`better_front`), which never puts runs of two
training budgets on one front.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.claims import FAILS, HOLDS, NOISE, Verdict, Z
from analysis.run_files import budget_text
from analysis.scale_runs import (
    ACC_FLOOR,
    AS_REPORTED,
    BOOTSTRAP_DRAWS,
    BOOTSTRAP_SEED,
    MISSING,
    Point,
    Reading,
    RunRecord,
    ScaleVerdict,
    balanced_seeds,
    by_budget,
    combine,
    points,
    resample_means,
)

#: Remaining fractions at which two fronts are compared (log-spaced over the shared range).
GRID_POINTS = 25
#: Accuracy standard error of a setting's mean used when a method has no setting with two or
#: more seeds (half a point of accuracy, about the seed-to-seed s.d. of LeNet/MNIST).
FALLBACK_SE = 5e-3
#: "Much better" (pruning): the mean accuracy gap must also be at least this (two points).
MUCH_ACC = 0.02
#: A setting whose mean test accuracy is below this (1.5 times chance for ten classes) has
#: stalled: its masks never left chance.
STALLED_ACC = 0.15


def front(pts: Sequence[Point]) -> list[Point]:
    """The Pareto front (fewest weights remaining, highest accuracy) of the points with some
    weights left, sorted by remaining (:func:`analysis.pareto.pareto_front`)."""
    from analysis.pareto import pareto_front
    kept = [p for p in pts if p.remaining > 0]
    rows = [{"remaining": p.remaining, "test_acc": p.accuracy, "i": i} for i, p in enumerate(kept)]
    return [kept[row["i"]] for row in pareto_front(rows)]


def useful(fr: Sequence[Point], floor: float = ACC_FLOOR) -> list[Point]:
    """The points of a front with test accuracy >= ``floor`` (the ones that may set the range
    two fronts are compared over, or be matched across methods)."""
    return [p for p in fr if p.accuracy >= floor]


def degenerate(p: Point) -> bool:
    """A collapsed setting (no weight left, or every seed with the same accuracy) or a stalled
    one (some seed's accuracy below :data:`STALLED_ACC`: all of them, or only some, which makes
    the setting unstable): its seed s.d. says nothing of a working run's."""
    return (p.remaining <= 0 or p.acc_sd == 0 or p.accuracy < STALLED_ACC
            or any(r.accuracy < STALLED_ACC for r in p.runs))


def replicated(pts: Sequence[Point], reading: Reading = AS_REPORTED) -> list[Point]:
    """The settings with two or more seeds (and a finite s.d.) that the pooled s.d. reads: with
    ``reading.drop_degenerate``, not the :func:`degenerate` ones."""
    return [p for p in pts if p.seeds > 1 and math.isfinite(p.acc_sd)
            and not (reading.drop_degenerate and degenerate(p))]


def fallback(reading: Reading) -> float:
    """The s.d. (= s.e.) of a one-seed setting's accuracy where a group has no setting of
    several seeds: the reading's borrowed s.d., else FALLBACK_SE."""
    return FALLBACK_SE if reading.fallback_sd is None else reading.fallback_sd


def pooled_sd(pts: Sequence[Point], reading: Reading = AS_REPORTED) -> tuple[float, bool]:
    """The pooled seed s.d. of accuracy, sqrt(sum_s (k_s - 1) sd_s^2 / sum_s (k_s - 1)) over the
    :func:`replicated` settings s (k_s seeds, sample s.d. sd_s), and whether there were any;
    (:func:`fallback`, False) without such."""
    rep = replicated(pts, reading)
    if not rep:
        return fallback(reading), False
    var = sum((p.seeds - 1) * p.acc_sd ** 2 for p in rep) / sum(p.seeds - 1 for p in rep)
    return math.sqrt(var), True


def pooled_se(pts: Sequence[Point], reading: Reading = AS_REPORTED) -> tuple[float, bool]:
    """Standard error of one setting's mean accuracy: :func:`pooled_sd` / sqrt(mean_s k_s) over
    the same settings; (:func:`fallback`, False) without any setting of two or more seeds."""
    rep = replicated(pts, reading)
    if not rep:
        return fallback(reading), False
    return pooled_sd(pts, reading)[0] / math.sqrt(np.mean([p.seeds for p in rep])), True


def best_accuracy_at(fr: Sequence[Point], r: float) -> float:
    """The best accuracy of a front with at most ``r`` of the weights remaining (nan if none)."""
    accs = [p.accuracy for p in fr if p.remaining <= r * (1 + 1e-12)]
    return max(accs) if accs else math.nan


@dataclass(frozen=True)
class Gaps:
    """Front A's best accuracy minus front B's at matched remaining fractions, per row of the
    inputs (R,): mean, min and max over the grid of ``GRID_POINTS`` log-spaced fractions in
    [lo, hi]; nan where a front has no point with accuracy >= the floor."""

    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


def _ends(rem: np.ndarray, acc: np.ndarray, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the sparsest point with accuracy >= floor (inf: none) and the front's densest
    point (the sparsest of the most accurate)."""
    ok = (rem > 0) & ~np.isnan(acc)
    lo = np.where(ok & (acc >= floor), rem, np.inf).min(axis=1)
    a = np.where(ok, acc, -np.inf)
    hi = np.where(ok & (a == a.max(axis=1, keepdims=True)), rem, np.inf).min(axis=1)
    return lo, hi


def _best_at(rem: np.ndarray, acc: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Best accuracy with at most grid[i, j] remaining, (R, G), of points (R, P)."""
    ok = (rem > 0) & ~np.isnan(acc)
    within = ok[:, None, :] & (rem[:, None, :] <= grid[:, :, None] * (1 + 1e-12))
    return np.where(within, acc[:, None, :], -np.inf).max(axis=2)


def front_gaps(rem_a: np.ndarray, acc_a: np.ndarray, rem_b: np.ndarray, acc_b: np.ndarray,
               floor: float = ACC_FLOOR) -> Gaps:
    """Compare the Pareto fronts of point sets A and B (remaining and accuracy (R, P_A),
    (R, P_B): R replicates of the same settings, one row the observed means).

    A front's accuracy at a budget r is the best accuracy among its points with remaining
    <= r (points with no weight left aside). The budgets compared run log-spaced from lo = the
    larger of the two fronts' smallest remaining fraction with accuracy >= ``floor`` to hi = the
    largest remaining fraction of either front (so fronts that do not overlap are compared at
    the budget where the sparser one ends)."""
    (lo_a, hi_a), (lo_b, hi_b) = _ends(rem_a, acc_a, floor), _ends(rem_b, acc_b, floor)
    valid = np.isfinite(lo_a) & np.isfinite(lo_b)
    lo = np.where(valid, np.maximum(lo_a, lo_b), 1.0)
    hi = np.maximum(np.maximum(hi_a, hi_b), lo)
    hi = np.where(valid, hi, 1.0)
    grid = np.geomspace(lo, hi, GRID_POINTS, axis=1)
    with np.errstate(invalid="ignore"):  # rows without a useful point: -inf - -inf, set to nan
        gaps = _best_at(rem_a, acc_a, grid) - _best_at(rem_b, acc_b, grid)
    nan = np.where(valid, 0.0, np.nan)
    return Gaps(gaps.mean(axis=1) + nan, gaps.min(axis=1) + nan, gaps.max(axis=1) + nan,
                lo + nan, hi + nan)


def _observed(pts: Sequence[Point]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([[p.remaining for p in pts]]), np.array([[p.accuracy for p in pts]]))


def replicate_fronts(pts: Sequence[Point], sd: float, rng: np.random.Generator,
                     draws: int = BOOTSTRAP_DRAWS) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap replicates of the points' (remaining, accuracy) means, (draws, P) each: a
    setting of k >= 2 seeds resamples its k runs with replacement; a setting of one seed keeps
    its remaining fraction and draws its accuracy from N(its accuracy, sd^2)."""
    rem = np.empty((draws, len(pts)))
    acc = np.empty((draws, len(pts)))
    for j, p in enumerate(pts):
        if len(p.runs) > 1:
            both = resample_means(np.array([[r.remaining, r.accuracy] for r in p.runs]), rng,
                               draws)
            rem[:, j], acc[:, j] = both[:, 0], both[:, 1]
        else:
            rem[:, j] = p.remaining
            acc[:, j] = p.accuracy + rng.normal(0.0, sd, draws)
    return rem, acc


def bootstrap_gap_se(pa: Sequence[Point], pb: Sequence[Point], floor: float) -> float:
    """The s.d. of the mean front gap over :data:`BOOTSTRAP_DRAWS` replicates of both point
    sets (:func:`replicate_fronts`, one-seed settings drawn with the group's pooled seed s.d.;
    seeded by :data:`BOOTSTRAP_SEED`); inf when fewer than half of the replicates give a gap."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    ra = replicate_fronts(pa, pooled_sd(pa)[0], rng)
    rb = replicate_fronts(pb, pooled_sd(pb)[0], rng)
    means = front_gaps(*ra, *rb, floor).mean
    means = means[np.isfinite(means)]
    return float(means.std(ddof=1)) if len(means) >= BOOTSTRAP_DRAWS / 2 else math.inf


@dataclass(frozen=True)
class FrontGap:
    """Accuracy of front A minus front B at matched remaining fractions: mean, min and max over
    ``GRID_POINTS`` log-spaced fractions in [lo, hi], and the standard error of the mean gap."""

    mean: float
    low: float
    high: float
    lo: float
    hi: float
    se: float
    seeds_known: bool
    text: str


def front_gap(a: Sequence[RunRecord], b: Sequence[RunRecord], label_a: str,
              label_b: str, reading: Reading = AS_REPORTED) -> FrontGap | None:
    """Compare two groups of pruning runs by their Pareto fronts (seed means per setting;
    :func:`front_gaps`).

    The gap's standard error is sqrt(se_A^2 + se_B^2) with each group's pooled seed s.e.
    (:func:`pooled_se`), or, with ``reading.bootstrap``, :func:`bootstrap_gap_se`. None if
    either front has no point with accuracy >= the reading's floor."""
    if reading.balanced:
        keep = balanced_seeds([*a, *b])
        if keep is not None:
            a, b = [r for r in a if r.seed in keep], [r for r in b if r.seed in keep]
    pa, pb = points(a), points(b)
    if not pa or not pb:
        return None
    g = front_gaps(*_observed(pa), *_observed(pb), reading.acc_floor)
    if not math.isfinite(g.mean[0]):
        return None
    mean, low, high, lo, hi = (float(x[0]) for x in (g.mean, g.low, g.high, g.lo, g.hi))
    (se_a, ka), (se_b, kb) = pooled_se(pa, reading), pooled_se(pb, reading)
    se = (bootstrap_gap_se(pa, pb, reading.acc_floor) if reading.bootstrap
          else math.hypot(se_a, se_b))
    text = (f"{label_a} - {label_b} accuracy at matched remaining {lo:.3%}..{hi:.3%}: mean "
            f"{mean:+.4f} (min {low:+.4f}, max {high:+.4f}), s.e. {se:.4f}"
            + (" (bootstrap)" if reading.bootstrap else "")
            + ("" if ka and kb else " (one seed: fallback s.e.)" if reading.fallback_sd is None
               else " (one seed: the experiment's seed s.d.)")
            + f"; fronts {len(front(pa))} / {len(front(pb))} points")
    return FrontGap(mean, low, high, lo, hi, se, ka and kb, text)


def _better_one(a: Sequence[RunRecord], b: Sequence[RunRecord], label_a: str, label_b: str,
                much: bool, z: float, reading: Reading) -> Verdict:
    g = front_gap(a, b, label_a, label_b, reading)
    if g is None:
        return Verdict(MISSING, f"a front never reaches accuracy {reading.acc_floor:g}", {})
    tol = z * g.se
    values = {"gap_mean": g.mean, "gap_min": g.low, "gap_max": g.high, "gap_se": g.se,
              "range_lo": g.lo, "range_hi": g.hi}
    if g.mean < -tol:
        outcome = FAILS
    elif g.mean > tol:
        outcome = HOLDS if (not much or g.mean >= MUCH_ACC) else FAILS
    else:
        outcome = NOISE
    note = f"; 'much' needs >= {MUCH_ACC:g}" if much else ""
    return Verdict(outcome, g.text + note, values)


def better_front(a: Sequence[RunRecord], b: Sequence[RunRecord], label_a: str, label_b: str,
                 much: bool = False, z: float = Z, reading: Reading = AS_REPORTED) -> Verdict:
    """"A performed better than B" on the accuracy/sparsity trade-off: holds if the mean front
    gap (:func:`front_gap`) exceeds z standard errors (and, with ``much``, MUCH_ACC too), fails
    if it is below -z s.e. (or, with ``much``, if A is better but by less than MUCH_ACC), noise
    otherwise; no data if a group has no run or no front point with accuracy >= the floor.

    Runs of different training budgets are never on one front: A and B are compared at each
    budget both have (a part per budget when there are several). Where they share none, A's and
    B's largest budgets are compared, and the verdict says so and carries a warning."""
    if not a or not b:
        missing = label_a if not a else label_b
        return Verdict(MISSING, f"no {missing} runs", {})
    ga, gb = by_budget(a), by_budget(b)
    common = [k for k in ga if k in gb]
    if len(common) == 1:
        return _better_one(ga[common[0]], gb[common[0]], label_a, label_b, much, z, reading)
    if common:
        every = [*ga, *gb]
        return combine([(budget_text(k, every), _better_one(ga[k], gb[k], label_a, label_b,
                                                            much, z, reading))
                        for k in common])
    ka, kb = list(ga)[-1], list(gb)[-1]
    v = _better_one(ga[ka], gb[kb], label_a, label_b, much, z, reading)
    note = (f"budgets differ: {label_a} {budget_text(ka, [kb])}, {label_b} "
            f"{budget_text(kb, [ka])}")
    return ScaleVerdict(v.outcome, f"{note}; {v.detail}", v.values,
                        warnings=(f"{label_a} against {label_b}: {note}; no shared training "
                                  "budget, so the front comparison mixes budgets",))
