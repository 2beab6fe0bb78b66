"""Pruning and NN-regression runs as the scale claims read them (:class:`RunRecord`: finished,
or diverged with its record), their selection (:func:`select`) and training budgets
(:func:`by_budget`), per-setting seed means (:class:`Point`) and per-layer allocation distances;
the comparison of Pareto fronts is :mod:`analysis.scale.fronts`.

Outcomes are those of the microworld claims (:mod:`analysis.microworld.claims`: holds / fails /
noise) and ``no data`` (:data:`MISSING`) where the runs a claim reads are not there (yet). A verdict
made of parts (one per n, per method compared, per training budget ...) keeps them
(:class:`ScaleVerdict`), so that each can be shown on its own line.

How the runs are read is a :class:`Reading`: the one the study reports (:data:`AS_REPORTED`)
and the variations the robustness columns try (:mod:`analysis.scale.robust`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from analysis.microworld.claims import FAILS, HOLDS, NOISE, Verdict
from analysis.scale.run_files import (
    PRUNE_BUDGET,
    REGRESSION_BUDGET,
    MethodInfo,
    budget_of,
    budget_text,
    lam_text,
    method_info,
)

#: A claim whose runs are missing.
MISSING = "no data"
#: A front comparison whose designs cannot separate a gap from their own shape (the fronts share
#: no budget, or the interpolation between grids leaves the sign open:
#: :func:`analysis.scale.front_verdict.compare_fronts`).
CANNOT_TELL = "cannot tell"
SCALE_OUTCOMES = (HOLDS, FAILS, NOISE, CANNOT_TELL, MISSING)
#: Pruning fronts: points below this test accuracy (ten classes: chance is 0.1; the floor is three
#: times chance) are not "useful" and do not set the range of remaining fractions two fronts are
#: compared over. It is set low enough that the committed study's short supermask runs (4 epochs,
#: where the MC fronts at n = 2 top out near 0.5 accuracy) are compared rather than left without
#: data; a front that stays below it still reads "no data".
ACC_FLOOR = 0.3
#: A run whose test accuracy is below this (1.5 times chance for ten classes) has stalled: its
#: masks never left chance.
STALLED_ACC = 0.15


@dataclass(frozen=True)
class Reading:
    """How the claims read the runs.

    ``acc_floor``: a setting whose median accuracy is below it is on no front
    (:func:`analysis.scale.front_verdict.compare_fronts`); ``safety``: the interpolation
    allowance's factor (None: the statistic's
    :data:`~analysis.scale.front_verdict.SAFETY`); ``leave_out``: the claim is judged again
    without each setting of its experiment in turn (:func:`analysis.scale.robust.judge_claim`);
    ``pooled``: seeds are not paired across the two methods (every pair of seeds, the
    two-sample s.e.); ``balanced``: only the seeds that every setting run with several seeds has
    (:func:`balanced_seeds`)."""

    key: str = "as_reported"
    title: str = "as reported"
    acc_floor: float = ACC_FLOOR
    safety: float | None = None
    leave_out: bool = False
    pooled: bool = False
    balanced: bool = False


#: The reading the study reports.
AS_REPORTED = Reading()
#: The floors the robustness columns try (those other than ACC_FLOOR; `ACC_FLOOR` was 0.5 until
#: the first runs of the study had been seen).
ROBUST_FLOORS = (0.3, 0.5)
#: The readings the robustness columns try besides the reported one. Each varies one real
#: choice of the criterion; one that gives the reported numbers on a row did not act on it.
READINGS = (
    *(Reading(f"floor_{f:g}", f"floor {f:g}", acc_floor=f) for f in ROBUST_FLOORS
      if f != ACC_FLOOR),
    Reading("safety_2", "allowance x2", safety=2.0),
    Reading("safety_4", "allowance x4", safety=4.0),
    Reading("leave_one_out", "leave one setting out", leave_out=True),
    Reading("pooled", "seeds not paired", pooled=True),
    Reading("balanced", "balanced seeds", balanced=True),
)


@dataclass(frozen=True)
class ScaleVerdict(Verdict):
    """A :class:`~analysis.microworld.claims.Verdict` with the verdicts it was made of (``parts``:
    (name, verdict), each possibly with parts of its own) and warnings for the console (a front
    compared across training budgets)."""

    parts: tuple[tuple[str, Verdict], ...] = ()
    warnings: tuple[str, ...] = ()


def leaves(v: Verdict, prefix: str = "") -> list[tuple[str, Verdict]]:
    """The sub-verdicts of a verdict, flattened: (``n=2``, ``300 ep CP first`` ..., verdict) for
    each part without parts of its own; [("", v)] for a verdict of one piece."""
    parts = getattr(v, "parts", ())
    if not parts:
        return [(prefix, v)]
    return [leaf for name, pv in parts
            for leaf in leaves(pv, f"{prefix} / {name}" if prefix else name)]


def warnings_of(v: Verdict) -> list[str]:
    """Every warning of a verdict and of its parts."""
    own = list(getattr(v, "warnings", ()))
    return own + [w for _, pv in getattr(v, "parts", ()) for w in warnings_of(pv)
                  if w not in own]


def prefixed(v: Verdict, prefix: str) -> ScaleVerdict:
    """The same verdict with ``prefix`` before its detail and the names of its parts."""
    parts = tuple((f"{prefix}: {name}", pv) for name, pv in getattr(v, "parts", ()))
    return ScaleVerdict(v.outcome, f"{prefix}: {v.detail}", v.values, parts,
                        tuple(getattr(v, "warnings", ())))


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
    (validation loss per logged epoch, (T,)). ``info``: what the run recorded about its method
    (:func:`analysis.scale.run_files.method_info`; by default the registry's). ``diverged``: the
    record of a run that stopped on a non-finite value (:data:`analysis.scale.run_files.DIVERGED`:
    epoch, step, where, reason, last_metrics), whose final numbers are NaN; None for a finished
    run."""

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
    info: MethodInfo | None = None
    diverged: dict | None = None

    def __post_init__(self) -> None:
        if self.info is None:
            self.info = method_info({}, self.method)

    def get(self, key: str, default=None):
        return self.settings.get(key, default)

    @cached_property
    def setting(self) -> str:
        """The run's setting (method and settings, no seed; the training budget among them) as
        canonical JSON."""
        import json
        return json.dumps({"method": self.method, **self.settings}, sort_keys=True, default=str)

    @cached_property
    def budget(self) -> tuple:
        """What was trained and for how long (:data:`analysis.scale.run_files.PRUNE_BUDGET`,
        :data:`~analysis.scale.run_files.REGRESSION_BUDGET`)."""
        return budget_of(self.settings, REGRESSION_BUDGET if self.experiment == "regression"
                         else PRUNE_BUDGET)


def finished(records: Iterable[RunRecord]) -> list[RunRecord]:
    """The records of finished runs (not diverged ones)."""
    return [r for r in records if r.diverged is None]


def stalled(r: RunRecord) -> bool:
    """A finished pruning run whose test accuracy is below :data:`STALLED_ACC`: its masks never
    left chance."""
    return r.diverged is None and r.accuracy < STALLED_ACC


def setting_text(r: RunRecord) -> str:
    """A setting in words: method, the sampling law and count, optimizer, learning rate, and
    lambda or target, as far as the method uses them (``arms escort n=2 rmsprop lr 0.01 lam
    0.01``, ``gmp target 0.1``; regression: ``loorf sigmoid n=10 rmsprop lr 0.1 300 ep``)."""
    regression = r.experiment == "regression"
    keys = (("param", "n", "optimizer", "lr", "epochs") if regression
            else ("param", "n", "mask_opt", "mask_lr", "lam", "target"))
    words = [r.method]
    for k in keys:
        v = lam_text(r.settings) if k == "lam" and not regression else r.get(k)
        if v is None or (not regression and not r.info.uses(k)):
            continue
        words.append(f"n={v}" if k == "n" else f"lr {v:g}" if k in ("lr", "mask_lr")
                     else f"{v} ep" if k == "epochs"
                     else v if isinstance(v, str) and k == "lam"
                     else f"{k} {v:g}" if k in ("lam", "target") else str(v))
    return " ".join(words)


#: The settings of a pruning run that make a curve of its own (with its method), where the
#: method uses them: the sampling law and count, and the mask optimizer.
SERIES = ("param", "n", "mask_opt")


def group_label(r: RunRecord, name: str | None = None) -> str:
    """The curve a pruning run belongs to: its method's ``name`` (default: the method) and the
    values of the :data:`SERIES` settings its method uses (``cp rmsprop``, ``arms escort n=10
    rmsprop``, ``gmp``)."""
    words = [name or r.method]
    for k in SERIES:
        if r.info.uses(k) and r.get(k) is not None:
            words.append(f"n={r.get(k)}" if k == "n" else str(r.get(k)))
    return " ".join(words)


def legend_label(r: RunRecord) -> str:
    """:func:`group_label` under the method's recorded label (``CP rmsprop``)."""
    return group_label(r, r.info.label)


def select(records: Sequence[RunRecord], experiment: str, **want) -> list[RunRecord]:
    """Records of an experiment whose method / settings equal every ``want`` (a tuple: one of);
    ``samples=True`` selects the runs whose method samples (the MC estimators; the run's own
    record of its method, :attr:`RunRecord.info`)."""
    out = []
    for r in records:
        if r.experiment != experiment:
            continue
        ok = True
        for k, v in want.items():
            got = (r.method if k == "method" else r.info.samples if k == "samples"
                   else r.get(k))
            if not (got in v if isinstance(v, tuple) else got == v):
                ok = False
                break
        if ok:
            out.append(r)
    return out


def ns(records: Sequence[RunRecord]) -> list[int]:
    """The sample counts n of the records, sorted."""
    return sorted({int(r.get("n")) for r in records})


def budget_size(budget: tuple) -> tuple[float, float]:
    """Order of budgets: epochs, then batches per epoch (0: all)."""
    b = dict(budget)
    return float(b.get("epochs") or 0), float(b.get("max_batches") or math.inf)


def by_budget(records: Iterable[RunRecord]) -> dict[tuple, list[RunRecord]]:
    """Records grouped by training budget, smallest budget first."""
    out: dict[tuple, list[RunRecord]] = {}
    for r in records:
        out.setdefault(r.budget, []).append(r)
    return dict(sorted(out.items(), key=lambda kv: budget_size(kv[0])))


def per_budget(records: Sequence[RunRecord],
               evaluate: Callable[[Sequence[RunRecord]], Verdict]) -> Verdict:
    """``evaluate`` on the records of each training budget apart (one part per budget when
    there are several), so that runs of different budgets never meet."""
    groups = by_budget(records)
    if len(groups) <= 1:
        return evaluate(records)
    return combine([(budget_text(k, groups), evaluate(rs)) for k, rs in groups.items()])


def balanced_seeds(records: Iterable[RunRecord]) -> set[int] | None:
    """The seeds that every setting run with several seeds has (None: no such setting)."""
    seeds: dict[str, set[int]] = {}
    for r in records:
        seeds.setdefault(r.setting, set()).add(r.seed)
    multi = [s for s in seeds.values() if len(s) > 1]
    return set.intersection(*multi) if multi else None


def select_seeds(records: Sequence[RunRecord], reading: Reading) -> list[RunRecord]:
    """The records the reading uses: with ``balanced``, those of :func:`balanced_seeds`."""
    keep = balanced_seeds(records) if reading.balanced else None
    return list(records) if keep is None else [r for r in records if r.seed in keep]


@dataclass
class Point:
    """One setting: the means over its seeds (remaining, accuracy, per-layer fractions and
    allocation shares) and the seed-to-seed s.d. of accuracy and of the allocation distance
    (nan with one seed); ``runs``: its records."""

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
    runs: tuple[RunRecord, ...] = field(default=(), repr=False)

    @property
    def rem_sd(self) -> float:
        """The seed s.d. of the remaining fraction (NaN with one seed)."""
        if len(self.runs) < 2:
            return math.nan
        return float(np.std([r.remaining for r in self.runs], ddof=1))

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


def point_of(rs: Sequence[RunRecord]) -> Point:
    """The :class:`Point` of the runs of one setting."""
    acc = np.array([r.accuracy for r in rs])
    layers = {k: float(np.mean([r.layers[k] for r in rs])) for k in rs[0].layers}
    shares_each = [allocation_shares(r.layers, r.layer_sizes) for r in rs] \
        if rs[0].layer_sizes else []
    shares = {k: float(np.mean([s[k] for s in shares_each])) for k in rs[0].layer_sizes}
    tv_sd = math.nan
    if len(shares_each) > 1:
        # seed-to-seed spread of the allocation: mean TV distance of each seed to the mean
        tv_sd = float(np.mean([tv_distance(s, shares) for s in shares_each]))
    return Point(rs[0].method, rs[0].settings, len(rs),
                 float(np.mean([r.remaining for r in rs])), float(acc.mean()),
                 float(acc.std(ddof=1)) if len(rs) > 1 else math.nan,
                 layers, shares, dense_shares(rs[0].layer_sizes), tv_sd, tuple(rs))


def points(records: Sequence[RunRecord]) -> list[Point]:
    """One :class:`Point` per setting (finished records grouped by :attr:`RunRecord.setting`)."""
    groups: dict[str, list[RunRecord]] = {}
    for r in finished(records):
        groups.setdefault(r.setting, []).append(r)
    return [point_of(rs) for rs in groups.values()]


def combine(parts: Sequence[tuple[str, Verdict]]) -> ScaleVerdict:
    """All parts must hold: fails if one fails, else no data if one has none, else cannot tell if
    one cannot, else noise if one is noise, else holds. The detail lists every part; the parts
    are kept."""
    outcomes = [v.outcome for _, v in parts]
    outcome = (FAILS if FAILS in outcomes else MISSING if MISSING in outcomes
               else CANNOT_TELL if CANNOT_TELL in outcomes
               else NOISE if NOISE in outcomes else HOLDS)
    values = {f"{name}: {k}": x for name, v in parts for k, x in v.values.items()}
    return ScaleVerdict(outcome, " | ".join(f"{name}: {v.outcome}: {v.detail}"
                                            for name, v in parts), values, tuple(parts))
