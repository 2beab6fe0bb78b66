"""Finished pruning and NN-regression runs as the scale claims read them (:class:`RunRecord`),
per-setting seed means (:class:`Point`), per-layer allocation distances, and the comparison of two
methods' accuracy/sparsity Pareto fronts (:func:`front_gap`, :func:`better_front`).

Outcomes are those of the microworld claims (:mod:`analysis.claims`: holds / fails / noise) and
``no data`` (:data:`MISSING`) where the runs a claim reads are not there (yet).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from analysis.claims import FAILS, HOLDS, NOISE, Verdict, Z

#: A claim whose runs are missing.
MISSING = "no data"
SCALE_OUTCOMES = (HOLDS, FAILS, NOISE, MISSING)
#: Pruning fronts: points below this test accuracy (ten classes: chance is 0.1; the floor is three
#: times chance) are not "useful" and do not set the range of remaining fractions two fronts are
#: compared over. It is set low enough that the committed study's short supermask runs (4 epochs,
#: where the MC fronts at n = 2 top out near 0.5 accuracy) are compared rather than left without
#: data; a front that stays below it still reads "no data".
ACC_FLOOR = 0.3
#: Remaining fractions at which two fronts are compared (log-spaced over the shared range).
GRID_POINTS = 25
#: Accuracy standard error of a setting's mean used when a method has no setting with two or
#: more seeds (half a point of accuracy, about the seed-to-seed s.d. of LeNet/MNIST).
FALLBACK_SE = 5e-3
#: "Much better" (pruning): the mean accuracy gap must also be at least this (two points).
MUCH_ACC = 0.02



@dataclass
class RunRecord:
    """One finished run, as the scale claims read it.

    experiment: ``supermask``, ``joint`` (pruning) or ``regression``; method: ``cp``, ``arms``,
    ``loorf``, ``mp``, ``gmp``, ``dense``, ``reinforce``, ``st``, ``rebar`` ...; settings: every
    option that defines the run except the seed (``param``, ``n``, ``lam``, ``optimizer``
    (``mask_opt`` for pruning), ``lr`` (``mask_lr``), ``target``, ``epochs``, ``model`` ...).
    Pruning: ``remaining`` (fraction of the masked weights left), ``accuracy`` (final test
    accuracy), ``layers`` ({layer: fraction left}) and ``layer_sizes`` ({layer: dense weights}).
    Regression: ``final_loss`` (final validation loss) and the curve ``epochs``, ``losses``
    (validation loss per logged epoch, (T,))."""

    experiment: str
    method: str
    settings: dict
    seed: int = 0
    remaining: float = math.nan
    accuracy: float = math.nan
    layers: dict[str, float] = field(default_factory=dict)
    layer_sizes: dict[str, int] = field(default_factory=dict)
    final_loss: float = math.nan
    epochs: np.ndarray = field(default_factory=lambda: np.zeros(0))
    losses: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def get(self, key: str, default=None):
        return self.settings.get(key, default)

    @property
    def setting(self) -> str:
        """The run's setting (method and settings, no seed) as canonical JSON."""
        import json
        return json.dumps({"method": self.method, **self.settings}, sort_keys=True, default=str)


@dataclass
class Point:
    """One setting: the means over its seeds (remaining, accuracy, per-layer fractions and
    allocation shares) and the seed-to-seed s.d. of accuracy and of the allocation distance
    (nan with one seed)."""

    method: str
    settings: dict
    seeds: int
    remaining: float
    accuracy: float
    acc_sd: float
    layers: dict[str, float]
    shares: dict[str, float]
    dense: dict[str, float]
    tv_sd: float

    @property
    def distance(self) -> float:
        """Allocation distance of the mean shares from the dense shares (TV)."""
        return tv_distance(self.shares, self.dense)


def allocation_shares(layers: dict[str, float], sizes: dict[str, int]) -> dict[str, float]:
    """Share of the remaining weights in each layer: r_l N_l / sum_k r_k N_k (the right-hand
    plots of `fig:joint_pruning_per_layer`); the dense shares N_l / sum_k N_k when nothing is
    left."""
    kept = {k: layers[k] * sizes[k] for k in sizes}
    total = sum(kept.values())
    if total <= 0:
        return dense_shares(sizes)
    return {k: v / total for k, v in kept.items()}


def dense_shares(sizes: dict[str, int]) -> dict[str, float]:
    total = sum(sizes.values())
    return {k: v / total for k, v in sizes.items()}


def tv_distance(a: dict[str, float], b: dict[str, float]) -> float:
    """Total-variation distance 1/2 sum_l |a_l - b_l| between two share vectors (0: the same
    allocation; 1: disjoint)."""
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def allocation_distance(r: RunRecord) -> float:
    """How far a run moved the per-layer allocation from the dense network's: the TV distance
    between its shares of remaining weights per layer and the dense layer sizes' shares (0 when
    every layer keeps the same fraction)."""
    return tv_distance(allocation_shares(r.layers, r.layer_sizes), dense_shares(r.layer_sizes))


def points(records: Sequence[RunRecord]) -> list[Point]:
    """One :class:`Point` per setting (records grouped by :attr:`RunRecord.setting`)."""
    groups: dict[str, list[RunRecord]] = {}
    for r in records:
        groups.setdefault(r.setting, []).append(r)
    out = []
    for rs in groups.values():
        acc = np.array([r.accuracy for r in rs])
        layers = {k: float(np.mean([r.layers[k] for r in rs])) for k in rs[0].layers}
        shares_each = [allocation_shares(r.layers, r.layer_sizes) for r in rs] \
            if rs[0].layer_sizes else []
        shares = {k: float(np.mean([s[k] for s in shares_each])) for k in rs[0].layer_sizes}
        tv_sd = math.nan
        if len(shares_each) > 1:
            # seed-to-seed spread of the allocation: mean TV distance of each seed to the mean
            tv_sd = float(np.mean([tv_distance(s, shares) for s in shares_each]))
        out.append(Point(rs[0].method, rs[0].settings, len(rs),
                         float(np.mean([r.remaining for r in rs])), float(acc.mean()),
                         float(acc.std(ddof=1)) if len(rs) > 1 else math.nan,
                         layers, shares, dense_shares(rs[0].layer_sizes), tv_sd))
    return out


def front(pts: Sequence[Point]) -> list[Point]:
    """The Pareto front (fewest weights remaining, highest accuracy) of the points with some
    weights left, sorted by remaining (:func:`analysis.pareto.pareto_front`)."""
    from analysis.pareto import pareto_front
    kept = [p for p in pts if p.remaining > 0]
    rows = [{"remaining": p.remaining, "test_acc": p.accuracy, "i": i} for i, p in enumerate(kept)]
    return [kept[row["i"]] for row in pareto_front(rows)]


def useful(fr: Sequence[Point]) -> list[Point]:
    """The points of a front with test accuracy >= ACC_FLOOR (the ones that may set the range
    two fronts are compared over, or be matched across methods)."""
    return [p for p in fr if p.accuracy >= ACC_FLOOR]


def _pooled_se(pts: Sequence[Point]) -> tuple[float, bool]:
    """Standard error of one setting's mean accuracy: the pooled seed s.d. over the settings with
    two or more seeds, / sqrt(their mean seed count); (FALLBACK_SE, False) without such."""
    rep = [p for p in pts if p.seeds > 1 and math.isfinite(p.acc_sd)]
    if not rep:
        return FALLBACK_SE, False
    var = sum((p.seeds - 1) * p.acc_sd ** 2 for p in rep) / sum(p.seeds - 1 for p in rep)
    return math.sqrt(var / np.mean([p.seeds for p in rep])), True


def best_accuracy_at(fr: Sequence[Point], r: float) -> float:
    """The best accuracy of a front with at most ``r`` of the weights remaining (nan if none)."""
    accs = [p.accuracy for p in fr if p.remaining <= r * (1 + 1e-12)]
    return max(accs) if accs else math.nan


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
              label_b: str) -> FrontGap | None:
    """Compare two groups of pruning runs by their Pareto fronts (seed means per setting).

    Each front's accuracy at a budget r is the best accuracy among its points with remaining
    <= r. The budgets compared run log-spaced from lo = the larger of the two fronts' smallest
    remaining fraction with accuracy >= ACC_FLOOR to hi = the largest remaining fraction of
    either front (so fronts that do not overlap are compared at the budget where the sparser one
    ends). The gap's standard error is sqrt(se_A^2 + se_B^2) with each group's pooled seed s.e.
    (:func:`_pooled_se`). None if either front has no point with accuracy >= ACC_FLOOR."""
    pa, pb = points(a), points(b)
    fa, fb = front(pa), front(pb)
    ua, ub = useful(fa), useful(fb)
    if not ua or not ub:
        return None
    lo = max(min(p.remaining for p in ua), min(p.remaining for p in ub))
    hi = max(max(p.remaining for p in fa), max(p.remaining for p in fb), lo)
    grid = np.geomspace(lo, hi, GRID_POINTS) if hi > lo else np.array([lo])
    gaps = np.array([best_accuracy_at(fa, r) - best_accuracy_at(fb, r) for r in grid])
    (se_a, ka), (se_b, kb) = _pooled_se(pa), _pooled_se(pb)
    se = math.hypot(se_a, se_b)
    text = (f"{label_a} - {label_b} accuracy at matched remaining {lo:.3%}..{hi:.3%}: mean "
            f"{gaps.mean():+.4f} (min {gaps.min():+.4f}, max {gaps.max():+.4f}), s.e. {se:.4f}"
            + ("" if ka and kb else " (one seed: fallback s.e.)")
            + f"; fronts {len(fa)} / {len(fb)} points")
    return FrontGap(float(gaps.mean()), float(gaps.min()), float(gaps.max()), lo, hi, se,
                    ka and kb, text)


def better_front(a: Sequence[RunRecord], b: Sequence[RunRecord], label_a: str, label_b: str,
                 much: bool = False, z: float = Z) -> Verdict:
    """"A performed better than B" on the accuracy/sparsity trade-off: holds if the mean front
    gap (:func:`front_gap`) exceeds z standard errors (and, with ``much``, MUCH_ACC too), fails
    if it is below -z s.e. (or, with ``much``, if A is better but by less than MUCH_ACC), noise
    otherwise; no data if a group has no run or no front point with accuracy >= ACC_FLOOR."""
    if not a or not b:
        missing = label_a if not a else label_b
        return Verdict(MISSING, f"no {missing} runs", {})
    g = front_gap(a, b, label_a, label_b)
    if g is None:
        return Verdict(MISSING, f"a front never reaches accuracy {ACC_FLOOR:g}", {})
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


def combine(parts: Sequence[tuple[str, Verdict]]) -> Verdict:
    """All parts must hold: fails if one fails, else no data if one has none, else noise if one
    is noise, else holds. The detail lists every part."""
    outcomes = [v.outcome for _, v in parts]
    outcome = (FAILS if FAILS in outcomes else MISSING if MISSING in outcomes
               else NOISE if NOISE in outcomes else HOLDS)
    values = {f"{name}: {k}": x for name, v in parts for k, x in v.values.items()}
    return Verdict(outcome, " | ".join(f"{name}: {v.outcome}: {v.detail}" for name, v in parts),
                   values)
