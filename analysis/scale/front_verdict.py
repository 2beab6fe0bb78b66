"""Does method A's accuracy/sparsity front lie above method B's? One comparison for every caller
(`fig:supermask_results`, `fig:joint_pruning_results`, `tab:app_results_summ`; the criterion is
ours, the paper states none): :func:`compare_fronts`.

Each side is an array of runs of shape (S, P): S seeds (rows) by P settings (columns: every
option but the seed), remaining fraction ``rem`` and test accuracy ``acc``, NaN where a run
diverged or was not run. A design (which settings, how many, where) must not decide the verdict,
so the statistic never reads a value the runs did not measure without saying how far off it can
be:

* **Fronts chosen on other seeds.** A setting is on a side's front for seed k when no other
  setting beats it in both median log remaining and median accuracy over the side's *other*
  seeds (and that median accuracy is at least the floor, :data:`analysis.scale.runs.ACC_FLOOR`);
  seed k's runs of those settings are then measured (a run at chance, below
  :data:`analysis.scale.runs.STALLED_ACC`, is no point). A side with more settings cannot win by
  taking the best of several noisy ones: the choice never sees the noise it is measured with.
* **Compared only where both fronts have runs.** For seed k (paired with seed k of the other
  side, or every pair of seeds when the sides are not paired) the budgets are both fronts' runs
  inside the overlap of their spans: nothing is extrapolated, flat or otherwise. At a budget, a
  side's value is its own run there, or is read between its two neighbouring runs.
* **The interpolation's error is counted.** Between two runs x0 < x < x1 (x = log remaining) a
  side is read through the parabolas through them and the run before or after (the nearest at
  least :data:`SEPARATION` interval widths away), their mean where both exist. The allowance is
  :data:`SAFETY` times half their disagreement, or times one parabola's departure from the line
  where only one exists, kept within the neighbours' accuracies. A budget where a side has no
  parabola is dropped, unless every budget is such: then the allowance is the whole rise between
  the neighbours, all a monotone front allows. At a run of its own a side's allowance is 0, so
  fronts run at matched budgets are compared with almost none.
* **The interval.** The gap g_k of seed k is the mean over its budgets of A's value minus B's,
  its allowance b_k the mean of both sides' allowances. Paired seeds: mean, s.d. / sqrt(K), K -
  1 df; unpaired: the mean over all pairs with the two-sample s.e. of that mean (Welch's df).
  The 95% interval is g -+ (t s.e. + b): **holds** when it lies above the threshold (0, or
  :data:`analysis.scale.gap_test.MUCH_ACC` for "much better"), **fails** when it lies below it;
  otherwise **cannot tell** when the allowance is what stands in the way (b > t s.e., or the
  interval without it would decide: more seeds would not settle it, budgets matched between
  the sides would), or when the fronts share no budget or a side has fewer than two seeds; and
  **noise** otherwise, with the gap the design detects at 80% power.
* **One front sparser and more accurate.** Where the fronts share no budget because one side's
  whole front lies at fewer remaining weights than the other's (for a seed pair), its run of
  its densest usable setting bounds its front at the other side's budgets from below (a front
  is the best accuracy at most at a budget, so it never falls as the budget grows), and the
  other side's most accurate run bounds that side's front from above: the gap is at least
  their difference. The t interval of that bound over the
  seeds decides one way only: **holds** (A sparser and, by the interval, more accurate, beyond
  the threshold) or **fails** (B so), else **cannot tell**; nothing is interpolated or
  extrapolated, so there is no allowance (:func:`dominance`).

The allowance bounds the error wherever a front bends no more between two runs than the runs
around them show; the calibration (:mod:`analysis.scale.calibration`) tries designs and curve
shapes the statistic was not built on (a knee, a slow rise, a cliff).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from analysis.microworld.claims import FAILS, HOLDS, NOISE
from analysis.scale.gap_test import MUCH_ACC, POWER, GapTest, detectable, t_quantile
from analysis.scale.runs import ACC_FLOOR, CANNOT_TELL, STALLED_ACC

#: The verdicts :func:`compare_fronts` gives.
VERDICTS = (HOLDS, FAILS, NOISE, CANNOT_TELL)
#: The interpolation allowance: this many times half the disagreement of the two parabolas
#: (or one parabola's departure from the line). 3 keeps every calibration cell's false verdicts
#: under 5% (a cliff between two runs bends more than the runs around it show); 2 and 4 are
#: readings.
SAFETY = 3.0
#: A parabola's third run lies at least this many interval widths beyond the interval (a run
#: beside one of its ends, as two methods' runs at one lambda are, would make the parabola's
#: slope the noise between them).
SEPARATION = 0.25


@dataclass(frozen=True)
class FrontComparison:
    """What :func:`compare_fronts` found: the verdict (holds, fails, noise, cannot tell), the gap
    of A's front over B's (mean over the compared budgets, seeds averaged), its 95% interval
    with the interpolation allowance counted, the allowance alone, the test behind it, the gap
    detectable at 80% power, the budget range judged (remaining fractions), the one-sided
    p-value of the verdict's direction (for error control over many comparisons), the per-seed
    gaps where paired, and the reason for the verdict in words."""

    verdict: str
    gap: float
    ci: tuple[float, float]
    allowance: float
    test: GapTest | None
    detectable: float
    budgets: tuple[float, float]
    p_value: float
    reason: str
    much: bool = False
    per_seed: tuple[float, ...] = field(default=())
    n_budgets: float = 0.0

    @property
    def judged(self) -> bool:
        """Whether a gap was measured (the fronts overlap and both sides have two seeds)."""
        return self.test is not None


def _nanmean(x: np.ndarray, axis: int) -> np.ndarray:
    ok = np.isfinite(x)
    n = ok.sum(axis=axis)
    s = np.where(ok, x, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, s / np.maximum(n, 1), np.nan)


def _held_out_medians(v: np.ndarray) -> np.ndarray:
    """(S, P) -> (S, P): for each row k, the median over the other rows of each column,
    ignoring NaN (NaN where no other row has a value)."""
    s = v.shape[0]
    others = np.stack([np.delete(v, k, axis=0) for k in range(s)])  # (S, S - 1, P)
    ordered = np.sort(others, axis=1)  # NaN last
    n = np.isfinite(ordered).sum(axis=1)  # (S, P)
    lo = np.take_along_axis(ordered, np.maximum((n - 1) // 2, 0)[:, None, :], axis=1)[:, 0]
    hi = np.take_along_axis(ordered, np.maximum(n // 2, 0)[:, None, :], axis=1)[:, 0]
    return np.where(n > 0, 0.5 * (lo + hi), np.nan)


def held_out_fronts(x: np.ndarray, acc: np.ndarray, floor: float
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each row k of (S, P) runs (x = log remaining, NaN: no run): which settings are on the
    front of the other rows' medians (S, P bool: not beaten in both median x and median
    accuracy, median accuracy at least ``floor``), and those medians (S, P) of x and accuracy
    (a setting that stalls on a minority of seeds keeps its place; one without another run has
    NaN)."""
    ok = np.isfinite(x) & np.isfinite(acc)
    mx = _held_out_medians(np.where(ok, x, np.nan))
    ma = _held_out_medians(np.where(ok, acc, np.nan))
    good = np.isfinite(mx) & (ma >= floor)
    # j beaten by i: i at most as dense and at least as accurate, strictly better in one
    xi, xj = mx[:, :, None], mx[:, None, :]
    ai, aj = ma[:, :, None], ma[:, None, :]
    with np.errstate(invalid="ignore"):
        beats = (good[:, :, None] & good[:, None, :] & (xi <= xj) & (ai >= aj)
                 & ((xi < xj) | (ai > aj)))
    on = good & ~beats.any(axis=1)
    return on, mx, ma


@dataclass(frozen=True)
class _Side:
    """One seed's front: its runs on the front chosen on the other seeds, x (log remaining)
    ascending, and their accuracies."""

    x: np.ndarray
    a: np.ndarray


def _side(x: np.ndarray, acc: np.ndarray, on: np.ndarray) -> _Side:
    with np.errstate(invalid="ignore"):
        use = on & np.isfinite(x) & np.isfinite(acc) & (acc >= STALLED_ACC)
    order = np.argsort(x[use], kind="stable")
    return _Side(x[use][order], acc[use][order])


def _parabola(x0, x1, x2, a0, a1, a2, q):
    """The parabola through (x0, a0), (x1, a1), (x2, a2) at q (arrays of one shape)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a0 * (q - x1) * (q - x2) / ((x0 - x1) * (x0 - x2))
                + a1 * (q - x0) * (q - x2) / ((x1 - x0) * (x1 - x2))
                + a2 * (q - x0) * (q - x1) / ((x2 - x0) * (x2 - x1)))


def _values(side: _Side, q: np.ndarray, safety: float) -> tuple[np.ndarray, np.ndarray]:
    """A seed's front (runs x ascending, accuracies a) at budgets q inside its span, and the
    allowance for each value: its run there (allowance 0); else, between its neighbours x0 < q <
    x1, the parabolas through them and the nearest run before or after that lies at least
    :data:`SEPARATION` interval widths away (their mean where both exist), the allowance
    ``safety`` times their disagreement (one parabola: times its departure from the line), the
    value kept within the neighbours' accuracies and the allowance within what they leave; inf
    where there is no parabola (:func:`_pair_gap` drops such a budget, or takes the rise)."""
    x, a = side.x, side.a
    n = x.size
    idx = np.searchsorted(x, q)
    exact = (idx < n) & (x[np.minimum(idx, n - 1)] == q)
    i = np.clip(idx - 1, 0, max(n - 2, 0))
    if n < 2:
        return np.where(exact, a[0] if n else np.nan, np.nan), np.where(exact, 0.0, np.inf)
    x0, x1, a0, a1 = x[i], x[i + 1], a[i], a[i + 1]
    gap = SEPARATION * (x1 - x0)
    jb = np.searchsorted(x, x0 - gap, side="right") - 1
    ja = np.searchsorted(x, x1 + gap, side="left")
    has_b, has_a = jb >= 0, ja < n
    jb, ja = np.maximum(jb, 0), np.minimum(ja, n - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        line = a0 + (q - x0) / (x1 - x0) * (a1 - a0)
        left = _parabola(x[jb], x0, x1, a[jb], a0, a1, q)
        right = _parabola(x0, x1, x[ja], a0, a1, a[ja], q)
        both = has_b & has_a
        value = np.where(both, 0.5 * (left + right),
                         np.where(has_b, left, np.where(has_a, right, line)))
        allow = np.where(both, safety * 0.5 * np.abs(left - right),
                         np.where(has_b, safety * np.abs(left - line),
                                  np.where(has_a, safety * np.abs(right - line), np.inf)))
        low, high = np.minimum(a0, a1), np.maximum(a0, a1)
        value = np.where(has_b | has_a, np.clip(value, low, high), line)
        allow = np.minimum(allow, np.where(has_b | has_a, np.maximum(value - low, high - value),
                                           np.inf))
    runs = a[np.minimum(idx, n - 1)]
    return np.where(exact, runs, value), np.where(exact, 0.0, allow)


def _rises(side: _Side, q: np.ndarray) -> np.ndarray:
    """At budgets q inside a seed's front: 0 at its runs, else the larger part of the rise
    between the neighbours that a line leaves on either side (a monotone front's worst case)."""
    x, a = side.x, side.a
    n = x.size
    idx = np.searchsorted(x, q)
    exact = (idx < n) & (x[np.minimum(idx, n - 1)] == q)
    if n < 2:
        return np.zeros(q.size)
    i = np.clip(idx - 1, 0, n - 2)
    t = (q - x[i]) / (x[i + 1] - x[i])
    return np.where(exact, 0.0, np.maximum(t, 1 - t) * np.abs(a[i + 1] - a[i]))


def _overlap(sa: _Side, sb: _Side) -> tuple[float, float]:
    """The span both seeds' fronts cover (in x; lo > hi: none): nothing is extrapolated."""
    return max(sa.x[0], sb.x[0]), min(sa.x[-1], sb.x[-1])


def _pair_gap(sa: _Side, sb: _Side, safety: float) -> tuple[float, float, float, float, int]:
    """(gap, allowance, lo, hi, budgets) of one seed of A against one of B; NaN gap where the
    fronts share no budget."""
    if sa.x.size == 0 or sb.x.size == 0:
        return math.nan, math.nan, math.nan, math.nan, 0
    lo, hi = _overlap(sa, sb)
    if lo > hi:
        return math.nan, math.nan, math.nan, math.nan, 0
    xs = np.unique(np.concatenate([sa.x, sb.x]))
    xs = xs[(xs >= lo) & (xs <= hi)]
    va, ea = _values(sa, xs, safety)
    vb, eb = _values(sb, xs, safety)
    e = ea + eb
    keep = np.isfinite(e)
    if not keep.any():  # every budget needs a line without a parabola: all monotony allows
        keep[:] = True
        e = np.minimum(ea, _rises(sa, xs)) + np.minimum(eb, _rises(sb, xs))
    return float(np.mean((va - vb)[keep])), float(np.mean(e[keep])), lo, hi, int(keep.sum())


def _log_remaining(rem: np.ndarray) -> np.ndarray:
    """log of the remaining fractions (NaN where missing or not positive)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isfinite(rem) & (rem > 0), np.log(np.where(rem > 0, rem, 1.0)),
                        np.nan)


def _sides(rem: np.ndarray, acc: np.ndarray, floor: float) -> list[_Side]:
    x = _log_remaining(rem)
    on, mx, ma = held_out_fronts(x, acc, floor)
    return [_side(x[k], acc[k], on[k]) for k in range(x.shape[0])]


def _as_runs(rem, acc, name: str) -> tuple[np.ndarray, np.ndarray]:
    r = np.asarray(rem, dtype=float)
    a = np.asarray(acc, dtype=float)
    if r.ndim == 1:
        r, a = r[None], a[None]
    if r.ndim != 2 or r.shape != a.shape:
        raise ValueError(f"rem_{name} and acc_{name} must be arrays of one shape (seeds, "
                         f"settings); got {np.shape(rem)} and {np.shape(acc)}")
    return r, a


def _p_values(g: float, b: float, se: float, df: float, m: float) -> tuple[float, float]:
    """One-sided p-values of "the gap exceeds m" and "the gap is below m", the allowance
    counted against each."""
    if se <= 0:
        return (0.0 if g - b > m else 1.0), (0.0 if g + b < m else 1.0)
    dist = stats.t(df) if math.isfinite(df) else stats.norm()
    return float(dist.sf((g - b - m) / se)), float(dist.cdf((g + b - m) / se))


def _unjudged(reason: str, much: bool, lo: float = math.nan, hi: float = math.nan
              ) -> FrontComparison:
    return FrontComparison(CANNOT_TELL, math.nan, (math.nan, math.nan), math.nan, None,
                           math.nan, (lo, hi), 1.0, reason, much)


def compare_fronts(rem_a, acc_a, rem_b, acc_b, much: bool = False, floor: float = ACC_FLOOR,
                   paired: bool | None = None, safety: float = SAFETY) -> FrontComparison:
    """The verdict on "A's front lies above B's" (module docstring). ``rem_*``, ``acc_*``: arrays
    (seeds, settings) of remaining fraction and test accuracy, NaN where a run diverged; rows
    are paired by seed when both sides have as many rows (``paired=False``: never). ``much``:
    the front must lie above B's by more than :data:`MUCH_ACC`."""
    ra, aa = _as_runs(rem_a, acc_a, "a")
    rb, ab = _as_runs(rem_b, acc_b, "b")
    m = MUCH_ACC if much else 0.0
    for name, r, a in (("A", ra, aa), ("B", rb, ab)):
        rows = int((np.isfinite(r) & np.isfinite(a)).any(axis=1).sum())
        if rows < 2:
            return _unjudged(f"{name} has {rows} seed{'s' * (rows != 1)} with a run: a front "
                             "chosen and measured on the same noise; run two or more seeds",
                             much)
    sa, sb = _sides(ra, aa, floor), _sides(rb, ab, floor)
    pair = ra.shape[0] == rb.shape[0] and paired is not False
    rows = [(k, k) for k in range(len(sa))] if pair else [
        (i, j) for i in range(len(sa)) for j in range(len(sb))]
    cells = np.array([_pair_gap(sa[i], sb[j], safety) for i, j in rows]).reshape(-1, 5)
    gaps, allow, lo, hi, nb = cells.T
    ok = np.isfinite(gaps)
    seeds = _over_seeds(gaps, pair, len(sa), len(sb))
    if seeds is None:
        return (dominance(ra, aa, rb, ab, sa, sb, rows, pair, much, floor)
                or _no_overlap(sa, sb, much))
    g, se, df, how, per_seed = seeds
    b = float(np.mean(allow[ok]))
    test = GapTest(g, se, df, how)
    half = float(t_quantile(df)) * se
    ci = (g - half - b, g + half + b)
    budgets = (float(np.exp(np.median(lo[ok]))), float(np.exp(np.median(hi[ok]))))
    p_up, p_down = _p_values(g, b, se, df, m)
    det = float(detectable(test, much)) + b
    if ci[0] > m:
        verdict, reason = HOLDS, f"the interval lies above {m:g}"
    elif ci[1] < m:
        verdict, reason = FAILS, f"the interval lies below {m:g}"
    elif g - half > m or g + half < m:
        verdict = CANNOT_TELL
        reason = (f"without the interpolation allowance {b:.4f} the interval would decide: the "
                  "grids leave the gap's sign open; run both sides at matched budgets")
    elif b > half:
        verdict = CANNOT_TELL
        reason = (f"the interpolation allowance {b:.4f} between the two grids is wider than what "
                  f"the seeds leave open ({half:.4f}): matched budgets would settle it, more "
                  "seeds would not")
    else:
        verdict = NOISE
        reason = f"a gap under {det:.4f} could not be told at {POWER:.0%} power"
    return FrontComparison(verdict, g, ci, b, test, det, budgets,
                           min(1.0, 2 * min(p_up, p_down)), reason, much, per_seed,
                           float(np.mean(nb[ok])))


def _over_seeds(values: np.ndarray, pair: bool, na: int, nb: int
                ) -> tuple[float, float, float, str, tuple[float, ...]] | None:
    """The mean of per-pair values (NaN: no value) over the seeds, its s.e., df, the test's name
    and the per-seed values (paired only): paired, the values of seeds 0..K-1 with the paired t;
    unpaired, the na x nb table of every pair with the two-sample s.e. of its mean. None when
    fewer than two seeds (on a side, unpaired) have a value."""
    ok = np.isfinite(values)
    if pair:
        if ok.sum() < 2:
            return None
        d = values[ok]
        return (float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size)), float(d.size - 1),
                f"paired, {d.size} seeds", tuple(float(v) for v in values))
    table = values.reshape(na, nb)
    ga = _nanmean(table, 1)[np.isfinite(table).any(axis=1)]
    gb = _nanmean(table, 0)[np.isfinite(table).any(axis=0)]
    if ga.size < 2 or gb.size < 2:
        return None
    return (float(np.nanmean(table)), *_two_sample(ga, gb),
            f"unpaired, {ga.size} x {gb.size} seeds", ())


def _two_sample(ga: np.ndarray, gb: np.ndarray) -> tuple[float, float]:
    """The s.e. of the mean over all pairs of A's and B's seeds, from the spread of A's row means
    ``ga`` and B's column means ``gb`` (the two-sample form), and Welch-Satterthwaite's df."""
    va, vb = ga.var(ddof=1) / ga.size, gb.var(ddof=1) / gb.size
    denom = va ** 2 / (ga.size - 1) + vb ** 2 / (gb.size - 1)
    df = (va + vb) ** 2 / denom if denom > 0 else float(ga.size + gb.size - 2)
    return math.sqrt(va + vb), float(df)


def _reach(rem: np.ndarray, acc: np.ndarray, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """Per seed (S,): the accuracy of its run of the side's densest usable setting (the largest
    median log remaining over the *other* seeds among the settings whose median accuracy there
    is at least ``floor``; NaN where the run stalled or there is none), and its most accurate
    run (NaN: none). Neither is chosen on the seed's own accuracies in a way that favours the
    side: the first is chosen on other seeds' remaining fractions, the second only ever stands
    for the other side of a bound (it can only make the bound looser)."""
    x = _log_remaining(rem)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(x) & np.isfinite(acc) & (acc >= STALLED_ACC)
    _, mx, ma = held_out_fronts(x, acc, floor)
    with np.errstate(invalid="ignore"):
        usable = ok & np.isfinite(mx) & (ma >= floor)
    j = np.argmax(np.where(usable, mx, -np.inf), axis=1)
    rows = np.arange(x.shape[0])
    densest = np.where(usable.any(axis=1), acc[rows, j], np.nan)
    best = np.where(ok.any(axis=1), np.max(np.where(ok, acc, -np.inf), axis=1), np.nan)
    return densest, best


def _disjoint(sa: _Side, sb: _Side) -> str | None:
    """"below" where A's seed front lies wholly at fewer remaining weights than B's, "above"
    where B's does, None where either is empty or they overlap."""
    if not (sa.x.size and sb.x.size):
        return None
    return "below" if sa.x[-1] < sb.x[0] else "above" if sb.x[-1] < sa.x[0] else None


def dominance(ra: np.ndarray, aa: np.ndarray, rb: np.ndarray, ab: np.ndarray,
              sa: list[_Side], sb: list[_Side], rows: list[tuple[int, int]], pair: bool,
              much: bool, floor: float) -> FrontComparison | None:
    """The verdict where the fronts share no budget and, on every seed pair of ``rows`` that has
    both, one side's front lies wholly at fewer remaining weights than the other's (module
    docstring). A front never falls as the budget grows, so the sparser side's run of its
    densest usable setting (:func:`_reach`) is at most its front at the other side's budgets,
    and the other side's most accurate run at least its own front there: their difference
    bounds the gap from one side (A sparser: from below; B sparser: from above), with no
    interpolation. Holds (fails) when the bound's 95% t interval over the seeds lies beyond the
    threshold; None (the fronts share no budget: cannot tell) otherwise, when the seeds disagree
    on which side is sparser, or when fewer than two seeds on a side have runs."""
    where = [_disjoint(sa[i], sb[j]) for i, j in rows]
    kinds = {k for k in where if k is not None}
    if len(kinds) != 1:
        return None
    kind = kinds.pop()  # "below": A's front at fewer remaining weights, its bound is a floor
    dense_a, best_a = _reach(ra, aa, floor)
    dense_b, best_b = _reach(rb, ab, floor)
    bounds = np.array([(dense_a[i] - best_b[j] if kind == "below" else best_a[i] - dense_b[j])
                       if w == kind else np.nan for (i, j), w in zip(rows, where)])
    seeds = _over_seeds(bounds, pair, len(sa), len(sb))
    if seeds is None:
        return None
    g, se, df, how, per_seed = seeds
    how += ", one front sparser"
    ok = np.isfinite(bounds)
    m = MUCH_ACC if much else 0.0
    half = float(t_quantile(df)) * se
    p_up, p_down = _p_values(g, 0.0, se, df, m)
    test = GapTest(g, se, df, how)
    spans = [(min(sa[i].x[0], sb[j].x[0]), max(sa[i].x[-1], sb[j].x[-1]))
             for (i, j), use in zip(rows, ok) if use]
    budgets = (float(np.exp(np.median([s[0] for s in spans]))),
               float(np.exp(np.median([s[1] for s in spans]))))
    if kind == "below" and g - half > m:
        return FrontComparison(
            HOLDS, g, (g - half, math.inf), 0.0, test, math.nan, budgets, min(1.0, 2 * p_up),
            f"A's front lies at fewer remaining weights than B's and its densest setting's run "
            f"is more accurate than B's best run by at least {g - half:+.4f} (95%): above "
            f"{m:g}", much, per_seed, 0.0)
    if kind == "above" and g + half < m:
        return FrontComparison(
            FAILS, g, (-math.inf, g + half), 0.0, test, math.nan, budgets, min(1.0, 2 * p_down),
            f"B's front lies at fewer remaining weights than A's and its densest setting's run "
            f"is more accurate than A's best run: the gap is at most {g + half:+.4f} (95%), "
            f"below {m:g}", much, per_seed, 0.0)
    return None


def _no_overlap(sa: list[_Side], sb: list[_Side], much: bool) -> FrontComparison:
    def span(sides: list[_Side]) -> str:
        xs = [s.x for s in sides if s.x.size]
        if not xs:
            return "no front point at or above the floor"
        return (f"{math.exp(np.median([x[0] for x in xs])):.2%}.."
                f"{math.exp(np.median([x[-1] for x in xs])):.2%}")
    return _unjudged(f"the fronts share no budget (A {span(sa)}, B {span(sb)}): run both at "
                     "matched budgets", much)
