"""Comparing two methods' accuracy/sparsity Pareto fronts (`fig:supermask_results`,
`fig:joint_pruning_results`): "A performed better than B" (:func:`better_front`), the one
statistic behind every front row of the claims study and ``scale_report --compare``; it never
puts runs of two training budgets on one front.

The statistic (:func:`compare_groups`):

* each side is a :class:`Group` of settings (every option but the seed) run with some seeds;
  its **complete seeds** are those every setting was run with (finished or diverged);
* with two or more complete seeds on each side, each seed has its own front (that seed's run of
  every setting; a diverged run is no point), interpolated in log remaining
  (:mod:`analysis.scale.curves`); the range is common to all these fronts (from the largest of
  their sparsest points with accuracy >= the floor to the largest densest point); each front's
  mean over the range in log remaining is exact; the gap is paired by seed over the seeds both
  sides have (the paired t interval), else Welch's (:mod:`analysis.scale.gap_test`);
* with fewer (a one-seed design), the fronts are those of the settings' seed means and the s.e.
  comes from a model: each setting's mean has s.d. sigma / sqrt(k), with sigma the pooled seed
  s.d. of the settings that carry weight in the gap (never a setting outside the compared
  range), else of the experiment's settings inside the range, else :data:`FALLBACK_SD`; the
  s.e. is the gap's s.d. over draws of the means from that model (:data:`MODEL_DRAWS`).

The verdict is that of the 95% interval (holds / fails / noise; "much" against
:data:`analysis.scale.gap_test.MUCH_ACC`), with the gap the design could have detected at 80% power.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from analysis.microworld.claims import NOISE, Verdict
from analysis.scale.curves import compared_means, front_ends
from analysis.scale.gap_test import GapTest, detectable, modelled, outcome, paired, welch
from analysis.scale.run_files import budget_text
from analysis.scale.runs import (
    ACC_FLOOR,
    AS_REPORTED,
    MISSING,
    Point,
    Reading,
    RunRecord,
    ScaleVerdict,
    balanced_seeds,
    by_budget,
    combine,
    finished,
    setting_text,
    stalled,
)

#: The seed s.d. of a setting's test accuracy assumed where no setting that the gap reads, and
#: none of the experiment's inside the compared range, has two or more seeds (half a point of
#: accuracy, about the seed-to-seed s.d. of LeNet/MNIST).
FALLBACK_SD = 5e-3
#: A one-seed design's s.e.: the s.d. of the gap over this many draws of every setting's mean
#: (normal, s.d. sigma / sqrt(its seeds)), seeded by MODEL_SEED: a front whose best point
#: changes from draw to draw counts, which a linear propagation of the s.d. would miss.
MODEL_DRAWS = 400
MODEL_SEED = 0


def pareto_front(points: list[dict]) -> list[dict]:
    """Points not dominated (another point with remaining <= and test_acc >=, one strictly),
    sorted by remaining."""
    front = []
    for p in points:
        dominated = any(q["remaining"] <= p["remaining"] and q["test_acc"] >= p["test_acc"]
                        and (q["remaining"] < p["remaining"] or q["test_acc"] > p["test_acc"])
                        for q in points)
        if not dominated:
            front.append(p)
    return sorted(front, key=lambda p: p["remaining"])


def front(pts: Sequence[Point]) -> list[Point]:
    """The Pareto front (fewest weights remaining, highest accuracy) of the points with some
    weights left, sorted by remaining (:func:`pareto_front`)."""
    kept = [p for p in pts if p.remaining > 0]
    rows = [{"remaining": p.remaining, "test_acc": p.accuracy, "i": i} for i, p in enumerate(kept)]
    return [kept[row["i"]] for row in pareto_front(rows)]


def useful(fr: Sequence[Point], floor: float = ACC_FLOOR) -> list[Point]:
    """The points of a front with test accuracy >= ``floor`` (the ones that may set the range
    two fronts are compared over, or be matched across methods)."""
    return [p for p in fr if p.accuracy >= floor]


def seed_text(seeds: Sequence[int]) -> str:
    """Seeds as words: ``0-4``, ``0, 1, 4``."""
    s = sorted(seeds)
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        return f"{s[0]}-{s[-1]}"
    return ", ".join(map(str, s))


def outcome_note(runs: int, diverged: int, stalls: int) -> str:
    """``2 of 5 seeds diverged, 2 stalled`` (empty when every run finished and trained)."""
    if diverged:
        return f"{diverged} of {runs} seeds diverged" + (f", {stalls} stalled" if stalls else "")
    return f"{stalls} of {runs} seeds stalled" if stalls else ""


@dataclass(frozen=True)
class Group:
    """One side of a comparison at one training budget: P settings (``names``: their keys),
    ``seeds`` its K complete seeds with each seed's point per setting ``rem``, ``acc`` (K, P;
    NaN: diverged), each setting's seed means ``mean_rem``, ``mean_acc`` over its finished runs,
    their count ``count`` and the seed s.d. of accuracy ``sd`` (NaN below two), and ``notes``:
    the settings with diverged or stalled seeds."""

    label: str
    names: tuple[str, ...]
    seeds: tuple[int, ...]
    rem: np.ndarray
    acc: np.ndarray
    mean_rem: np.ndarray
    mean_acc: np.ndarray
    count: np.ndarray
    sd: np.ndarray
    notes: tuple[str, ...]

    @property
    def per_seed(self) -> bool:
        """Whether the group has its own per-seed fronts (two or more complete seeds)."""
        return len(self.seeds) >= 2


def group_of(records: Sequence[RunRecord], label: str) -> Group:
    """The :class:`Group` of the records of one budget (finished and diverged)."""
    by: dict[str, list[RunRecord]] = {}
    for r in records:
        by.setdefault(r.setting, []).append(r)
    keys = sorted(by)
    fin = {k: finished(by[k]) for k in keys}
    attempted = [{r.seed for r in by[k]} for k in keys]
    done = {(k, r.seed): r for k in keys for r in fin[k]}
    seeds = [s for s in sorted(set.intersection(*attempted)) if any((k, s) in done for k in keys)
             ] if attempted else []  # (a seed with no point at all is not a front)
    rem = np.full((len(seeds), len(keys)), np.nan)
    acc = np.full((len(seeds), len(keys)), np.nan)
    mean_rem, mean_acc = np.full(len(keys), np.nan), np.full(len(keys), np.nan)
    count, sd = np.zeros(len(keys), dtype=int), np.full(len(keys), np.nan)
    notes, dead = [], 0
    for j, k in enumerate(keys):
        for i, s in enumerate(seeds):
            if (k, s) in done:
                rem[i, j], acc[i, j] = done[k, s].remaining, done[k, s].accuracy
        runs = fin[k]
        count[j] = len(runs)
        if runs:
            mean_rem[j] = sum(r.remaining for r in runs) / len(runs)
            mean_acc[j] = sum(r.accuracy for r in runs) / len(runs)
        if len(runs) > 1:
            sd[j] = math.sqrt(sum((r.accuracy - mean_acc[j]) ** 2 for r in runs)
                              / (len(runs) - 1))
        stalls = sum(stalled(r) for r in runs)
        if stalls == len(by[k]):
            dead += 1  # every seed at chance (a collapsed setting): counted, not named
            continue
        note = outcome_note(len(by[k]), len(by[k]) - len(runs), stalls)
        if note:
            notes.append(f"{setting_text(by[k][0])}: {note}")
    if dead:
        notes.append(f"{label}: {dead} setting{'s' * (dead != 1)} stalled on every seed")
    return Group(label, tuple(keys), tuple(seeds), rem, acc, mean_rem, mean_acc, count, sd,
                 tuple(notes))


@dataclass(frozen=True)
class FrontGap:
    """The gap of front A over front B: the test (:class:`analysis.scale.gap_test.GapTest`), the
    range [lo, hi] it was read over, the per-seed gaps where paired, the detectable gap and
    the words for the verdict."""

    test: GapTest
    lo: float
    hi: float
    per_seed: dict[int, float]
    detectable: float
    text: str
    seeds: tuple[int, int] = (0, 0)

    @property
    def mean(self) -> float:
        return float(self.test.mean)


def pooled_sd(groups: Sequence[Group], use: Sequence[np.ndarray]) -> tuple[float, float, int]:
    """sqrt(sum (k_s - 1) sd_s^2 / sum (k_s - 1)) over the settings of ``groups`` selected by the
    boolean masks ``use`` that have two or more finished seeds, its df and how many there were;
    (NaN, 0, 0) without any."""
    num = den = 0.0
    n = 0
    for g, u in zip(groups, use):
        for j in np.flatnonzero(u & (g.count > 1)):
            num += (g.count[j] - 1) * g.sd[j] ** 2
            den += g.count[j] - 1
            n += 1
    return (math.sqrt(num / den), den, n) if den else (math.nan, 0.0, 0)


def _seed_gap(a: Group, b: Group, reading: Reading) -> tuple[GapTest, float, float, dict]:
    ma, mb, lo, hi = compared_means(a.rem, a.acc, b.rem, b.acc, reading.acc_floor, reading.step,
                                    reading.grid)
    ga, gb = dict(zip(a.seeds, ma)), dict(zip(b.seeds, mb))
    shared = [s for s in a.seeds if s in gb]
    if len(shared) >= 2 and not reading.pooled:
        d = {s: float(ga[s] - gb[s]) for s in shared}
        return paired(np.array(list(d.values()))), float(lo), float(hi), d
    return welch(ma, mb), float(lo), float(hi), {}


def contenders(rem: np.ndarray, acc: np.ndarray, sd: np.ndarray, z: float = 6.0) -> np.ndarray:
    """The points (P,) that noise of s.d. ``sd`` (P,) could put on the front: not beaten by a
    point at most as dense by more than z times their combined s.d. (no weight left or no
    number: never)."""
    ok = np.isfinite(rem) & np.isfinite(acc) & (rem > 0)
    with np.errstate(invalid="ignore"):
        beaten = (ok[None, :] & (rem[None, :] <= rem[:, None])
                  & (acc[None, :] - acc[:, None] > z * np.hypot(sd[None, :], sd[:, None])))
    return ok & ~beaten.any(axis=1)


def _model_gap(a: Group, b: Group, reading: Reading, pool: Sequence[RunRecord]
               ) -> tuple[GapTest, float, float, str]:
    ma, mb, lo, hi, wa, wb = compared_means(
        a.mean_rem[None], a.mean_acc[None], b.mean_rem[None], b.mean_acc[None],
        reading.acc_floor, reading.step, reading.grid, weights=True)
    wa, wb = wa[0], wb[0]
    sd, df, n = pooled_sd((a, b), (np.abs(wa) > 1e-12, np.abs(wb) > 1e-12))
    where = f"{n} setting{'s' * (n != 1)} the gap reads"
    if not n:
        others = group_of(pool, "pool") if pool else None
        if others is not None:
            inside = (others.mean_rem >= lo * (1 - 1e-12)) & (others.mean_rem <= hi * (1 + 1e-12))
            sd, df, n = pooled_sd((others,), (inside,))
        where = f"{n} setting{'s' * (n != 1)} of the experiment inside the range"
    if not n:
        sd, df, where = FALLBACK_SD, math.inf, "fixed: no setting in the range has two seeds"
    rng = np.random.default_rng(MODEL_SEED)
    rems, draws = [], []
    for g in (a, b):
        keep = contenders(g.mean_rem, g.mean_acc, sd / np.sqrt(np.maximum(g.count, 1)))
        scale = sd / np.sqrt(np.maximum(g.count[keep], 1))
        draws.append(g.mean_acc[keep] + scale * rng.standard_normal((MODEL_DRAWS, 1, keep.sum())))
        rems.append(np.broadcast_to(g.mean_rem[keep], draws[-1].shape))
    da, db, *_ = compared_means(rems[0], draws[0], rems[1], draws[1], reading.acc_floor,
                                reading.step, reading.grid)
    gaps = (da - db)[:, 0]
    gaps = gaps[np.isfinite(gaps)]
    test = modelled(float(ma[0] - mb[0]), float(gaps.std(ddof=1)) if gaps.size > 1 else math.inf,
                    df)
    how = f"seed means; seed s.d. {sd:.4f} ({where}" + (f", df {df:g})" if math.isfinite(df)
                                                         else ")")
    return test, float(lo), float(hi), how


#: Where :func:`recording` collects the comparisons made ((A, B, much) each), if anywhere.
_RECORD: ContextVar[list | None] = ContextVar("front_comparisons", default=None)


@contextmanager
def recording() -> Iterator[list[tuple[Group, Group, bool]]]:
    """Inside the block, every front comparison made (:func:`compare_groups`) is appended to the
    list it yields, as (A, B, much): the designs a calibration simulates."""
    seen: list[tuple[Group, Group, bool]] = []
    token = _RECORD.set(seen)
    try:
        yield seen
    finally:
        _RECORD.reset(token)


def compare_groups(a: Group, b: Group, much: bool = False, reading: Reading = AS_REPORTED,
                   pool: Sequence[RunRecord] = ()) -> FrontGap | str:
    """The gap of A's front over B's (module docstring), or why there is none (a side without a
    point at or above the floor). ``pool``: the experiment's runs of this budget, whose seed s.d.
    a one-seed design may borrow."""
    seen = _RECORD.get()
    if seen is not None:
        seen.append((a, b, much))
    for g in (a, b):
        rows = (g.rem, g.acc) if g.per_seed else (g.mean_rem[None], g.mean_acc[None])
        if not front_ends(*rows, reading.acc_floor)[3].any():
            return f"{g.label} has no front point with accuracy >= {reading.acc_floor:g}"
    if a.per_seed and b.per_seed:
        test, lo, hi, per = _seed_gap(a, b, reading)
        how = (f"paired over seeds {seed_text(per)}" if per else
               f"Welch over seeds {seed_text(a.seeds)} / {seed_text(b.seeds)}")
    else:
        test, lo, hi, how = _model_gap(a, b, reading, pool)
        per = {}
    det = detectable(test, much)
    kind = ("step" if reading.step else "interpolated") + (
        f", {reading.grid} budgets" if reading.grid else "")
    text = (f"{a.label} - {b.label} accuracy over remaining {lo:.3%}..{hi:.3%} ({kind} fronts): "
            f"gap {test.mean:+.4f}, 95% CI [{test.low:+.4f}, {test.high:+.4f}] ({how}); "
            f"detectable {det:.4f}; settings {len(a.names)} / {len(b.names)}")
    notes = [*a.notes, *b.notes]
    if notes:
        text += "; " + "; ".join(notes)
    return FrontGap(test, lo, hi, per, det, text, (len(a.seeds), len(b.seeds)))


def front_gap(a: Sequence[RunRecord], b: Sequence[RunRecord], label_a: str, label_b: str,
              much: bool = False, reading: Reading = AS_REPORTED,
              pool: Sequence[RunRecord] = ()) -> FrontGap | str:
    """:func:`compare_groups` of two groups of runs of one budget (with ``reading.balanced``,
    only the seeds every setting of several seeds has)."""
    if reading.balanced:
        keep = balanced_seeds([*a, *b])
        if keep is not None:
            a, b = [r for r in a if r.seed in keep], [r for r in b if r.seed in keep]
    if not finished(a) or not finished(b):
        return f"no finished {label_a if not finished(a) else label_b} runs"
    return compare_groups(group_of(a, label_a), group_of(b, label_b), much, reading, pool)


def _better_one(a: Sequence[RunRecord], b: Sequence[RunRecord], label_a: str, label_b: str,
                much: bool, reading: Reading, pool: Sequence[RunRecord]) -> Verdict:
    g = front_gap(a, b, label_a, label_b, much, reading, pool)
    if isinstance(g, str):
        return Verdict(MISSING, g, {})
    t = g.test
    values = {"gap_mean": float(t.mean), "gap_se": float(t.se), "df": float(t.df),
              "ci_low": float(t.low), "ci_high": float(t.high), "detectable": g.detectable,
              "range_lo": g.lo, "range_hi": g.hi, "paired": len(g.per_seed),
              "seeds_a": g.seeds[0], "seeds_b": g.seeds[1],
              **{f"gap_seed{s}": d for s, d in g.per_seed.items()}}
    verdict = outcome(t, much)
    note = " ('much': the interval must clear 0.02)" if much else ""
    if verdict == NOISE:
        note += f"; a gap under {g.detectable:.4f} could not be told at 80% power"
    return Verdict(verdict, g.text + note, values)


def better_front(a: Sequence[RunRecord], b: Sequence[RunRecord], label_a: str, label_b: str,
                 much: bool = False, reading: Reading = AS_REPORTED,
                 pool: Sequence[RunRecord] = ()) -> Verdict:
    """"A performed better than B" on the accuracy/sparsity trade-off (module docstring): holds
    if the 95% interval of the front gap lies above 0 (with ``much``, above 0.02), fails if it
    lies below, noise otherwise; no data if a group has no finished run or no front point with
    accuracy >= the floor. ``pool``: the experiment's runs (a one-seed design's s.d.).

    Runs of different training budgets are never on one front: A and B are compared at each
    budget both have (a part per budget when there are several). Where they share none, A's and
    B's largest budgets are compared, and the verdict says so and carries a warning."""
    if not a or not b:
        missing = label_a if not a else label_b
        return Verdict(MISSING, f"no {missing} runs", {})
    ga, gb = by_budget(a), by_budget(b)
    pools = by_budget(pool)
    common = [k for k in ga if k in gb]
    if len(common) == 1:
        k = common[0]
        return _better_one(ga[k], gb[k], label_a, label_b, much, reading, pools.get(k, ()))
    if common:
        every = [*ga, *gb]
        return combine([(budget_text(k, every), _better_one(ga[k], gb[k], label_a, label_b,
                                                            much, reading, pools.get(k, ())))
                        for k in common])
    ka, kb = list(ga)[-1], list(gb)[-1]
    v = _better_one(ga[ka], gb[kb], label_a, label_b, much, reading, ())
    note = (f"budgets differ: {label_a} {budget_text(ka, [kb])}, {label_b} "
            f"{budget_text(kb, [ka])}")
    return ScaleVerdict(v.outcome, f"{note}; {v.detail}", v.values,
                        warnings=(f"{label_a} against {label_b}: {note}; no shared training "
                                  "budget, so the front comparison mixes budgets",))
