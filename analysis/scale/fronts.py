"""Comparing two methods' accuracy/sparsity Pareto fronts (`fig:supermask_results`,
`fig:joint_pruning_results`): "A performed better than B" (:func:`better_front`), the claims
rows' and ``scale_report --compare``'s reading of run records; it never puts runs of two
training budgets on one front.

Each side is a :class:`Group` of settings (every option but the seed) with one row per seed it
was run with (NaN where a setting was not run with that seed, or diverged); the gap, its
interval and the verdict are :func:`analysis.scale.front_verdict.compare_fronts`'s, rows paired
by seed over the seeds both sides have (two or more), else every pair of seeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from analysis.microworld.claims import Verdict
from analysis.scale.front_verdict import FrontComparison, compare_fronts
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
    """One side of a comparison at one training budget: P settings (``names``: their keys), its
    seeds (every seed some setting was run with) with each seed's run per setting ``rem``,
    ``acc`` (K, P; NaN: not run with that seed, or diverged), each setting's seed means
    ``mean_rem``, ``mean_acc`` over its finished runs, their count ``count`` and the seed s.d.
    of accuracy ``sd`` (NaN below two), and ``notes``: the settings with diverged or stalled
    seeds."""

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
        """Whether two or more seeds have a run (a front can be chosen on one seed and measured
        on another)."""
        return int(np.isfinite(self.acc).any(axis=1).sum()) >= 2

    def rows(self, seeds: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(rem, acc) with one row per seed of ``seeds`` (NaN for a seed the group lacks)."""
        at = {s: i for i, s in enumerate(self.seeds)}
        rem = np.full((len(seeds), len(self.names)), np.nan)
        acc = np.full((len(seeds), len(self.names)), np.nan)
        for i, s in enumerate(seeds):
            if s in at:
                rem[i], acc[i] = self.rem[at[s]], self.acc[at[s]]
        return rem, acc


def group_of(records: Sequence[RunRecord], label: str) -> Group:
    """The :class:`Group` of the records of one budget (finished and diverged)."""
    by: dict[str, list[RunRecord]] = {}
    for r in records:
        by.setdefault(r.setting, []).append(r)
    keys = sorted(by)
    fin = {k: finished(by[k]) for k in keys}
    done = {(k, r.seed): r for k in keys for r in fin[k]}
    seeds = sorted({s for k, s in done})
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


def compare_groups(a: Group, b: Group, much: bool = False, reading: Reading = AS_REPORTED
                   ) -> tuple[FrontComparison, str] | str:
    """A's front against B's (:func:`analysis.scale.front_verdict.compare_fronts`, seeds paired
    where both sides have two or more in common and the reading pairs them) and its words, or
    why there is none (a side without a setting whose accuracy reaches the floor)."""
    seen = _RECORD.get()
    if seen is not None:
        seen.append((a, b, much))
    for g in (a, b):
        if not (g.mean_acc >= reading.acc_floor).any():
            return f"{g.label} has no front point with accuracy >= {reading.acc_floor:g}"
    shared = sorted(set(a.seeds) & set(b.seeds))
    paired = len(shared) >= 2 and not reading.pooled
    if paired:
        seeds = sorted(set(a.seeds) | set(b.seeds))
        (ra, aa), (rb, ab) = a.rows(seeds), b.rows(seeds)
    else:
        (ra, aa), (rb, ab) = (a.rem, a.acc), (b.rem, b.acc)
    kw = {} if reading.safety is None else {"safety": reading.safety}
    c = compare_fronts(ra, aa, rb, ab, much, reading.acc_floor, paired=paired, **kw)
    if c.judged:
        how = (f"paired over seeds {seed_text([s for s, d in zip(seeds, c.per_seed) if d == d])}"
               if paired else f"every pair of seeds {seed_text(a.seeds)} / {seed_text(b.seeds)}")
        if not c.n_budgets:  # no shared budget: one front sparser bounds the gap (dominance)
            text = (f"{a.label} - {b.label}: no budget shared, one front sparser "
                    f"({c.budgets[0]:.3%}..{c.budgets[1]:.3%}): gap bound {c.gap:+.4f}, 95% CI "
                    f"[{c.ci[0]:+.4f}, {c.ci[1]:+.4f}] ({how}); settings {len(a.names)} / "
                    f"{len(b.names)}")
        else:
            text = (f"{a.label} - {b.label} accuracy at matched budgets {c.budgets[0]:.3%}.."
                    f"{c.budgets[1]:.3%} ({c.n_budgets:.1f} budgets a seed): gap {c.gap:+.4f}, 95% "
                    f"CI [{c.ci[0]:+.4f}, {c.ci[1]:+.4f}] with interpolation allowance "
                    f"{c.allowance:.4f} ({how}); detectable {c.detectable:.4f}; settings "
                    f"{len(a.names)} / {len(b.names)}")
    else:
        text = f"{a.label} - {b.label}: settings {len(a.names)} / {len(b.names)}"
    text += f"; {c.verdict}: {c.reason}"
    notes = [*a.notes, *b.notes]
    if notes:
        text += "; " + "; ".join(notes)
    return c, text


def front_gap(a: Sequence[RunRecord], b: Sequence[RunRecord], label_a: str, label_b: str,
              much: bool = False, reading: Reading = AS_REPORTED
              ) -> tuple[FrontComparison, str] | str:
    """:func:`compare_groups` of two groups of runs of one budget (with ``reading.balanced``,
    only the seeds every setting of several seeds has)."""
    if reading.balanced:
        keep = balanced_seeds([*a, *b])
        if keep is not None:
            a, b = [r for r in a if r.seed in keep], [r for r in b if r.seed in keep]
    if not finished(a) or not finished(b):
        return f"no finished {label_a if not finished(a) else label_b} runs"
    return compare_groups(group_of(a, label_a), group_of(b, label_b), much, reading)


def verdict_of(c: FrontComparison, text: str) -> Verdict:
    """A comparison as a claims :class:`~analysis.microworld.claims.Verdict`: its outcome, words
    and numbers (the p-value is the one family-wise control reads)."""
    values = {"p_value": c.p_value}
    if c.judged:
        t = c.test
        values |= {"gap_mean": c.gap, "gap_se": float(t.se), "df": float(t.df),
                   "ci_low": c.ci[0], "ci_high": c.ci[1], "allowance": c.allowance,
                   "detectable": c.detectable, "range_lo": c.budgets[0],
                   "range_hi": c.budgets[1], "budgets": c.n_budgets,
                   "paired": float(sum(d == d for d in c.per_seed))}
    return Verdict(c.verdict, text + (" ('much': the interval must clear 0.02)" if c.much
                                      else ""), values)


def _better_one(a: Sequence[RunRecord], b: Sequence[RunRecord], label_a: str, label_b: str,
                much: bool, reading: Reading) -> Verdict:
    g = front_gap(a, b, label_a, label_b, much, reading)
    if isinstance(g, str):
        return Verdict(MISSING, g, {})
    return verdict_of(*g)


def better_front(a: Sequence[RunRecord], b: Sequence[RunRecord], label_a: str, label_b: str,
                 much: bool = False, reading: Reading = AS_REPORTED) -> Verdict:
    """"A performed better than B" on the accuracy/sparsity trade-off (module docstring): holds,
    fails, noise or cannot tell as :func:`analysis.scale.front_verdict.compare_fronts` reads the
    runs; no data if a group has no finished run or no setting with accuracy >= the floor.

    Runs of different training budgets are never on one front: A and B are compared at each
    budget both have (a part per budget when there are several). Where they share none, A's and
    B's largest budgets are compared, and the verdict says so and carries a warning."""
    if not a or not b:
        missing = label_a if not a else label_b
        return Verdict(MISSING, f"no {missing} runs", {})
    ga, gb = by_budget(a), by_budget(b)
    common = [k for k in ga if k in gb]
    if len(common) == 1:
        k = common[0]
        return _better_one(ga[k], gb[k], label_a, label_b, much, reading)
    if common:
        every = [*ga, *gb]
        return combine([(budget_text(k, every), _better_one(ga[k], gb[k], label_a, label_b,
                                                            much, reading))
                        for k in common])
    ka, kb = list(ga)[-1], list(gb)[-1]
    v = _better_one(ga[ka], gb[kb], label_a, label_b, much, reading)
    note = (f"budgets differ: {label_a} {budget_text(ka, [kb])}, {label_b} "
            f"{budget_text(kb, [ka])}")
    return ScaleVerdict(v.outcome, f"{note}; {v.detail}", v.values,
                        warnings=(f"{label_a} against {label_b}: {note}; no shared training "
                                  "budget, so the front comparison mixes budgets",))
