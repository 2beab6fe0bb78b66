"""The microworld conclusions of `tab:app_results_summ`, each written once as a predicate over the
results of one benchmark instance, with a stated statistical criterion.

A claim reads one :class:`UnitResult` (one experiment on one instance of one benchmark: the
configs the microworld kept after its learning-rate selection, with their per-seed final losses
and mean curves) and returns a :class:`Verdict`: ``holds``, ``fails`` or ``noise`` (the data
cannot tell at the stated criterion), with the numbers behind it. :func:`analysis.report` runs the
experiments over instances and counts the verdicts.

Criterion for "A is worse than B" (:func:`compare`): with final means m_A, m_B over seeds and
standard errors s_A, s_B (0 for the deterministic true gradient and CP), A is worse when
m_A - m_B > Z sqrt(s_A^2 + s_B^2), better when m_A - m_B < -Z sqrt(...), and within noise
otherwise; Z = 2 (:data:`Z`). Lower loss is better.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from analysis.microworld_runs import DETERMINISTIC
from analysis.pareto import MC as PRUNE_MC

#: Standard errors a difference must exceed to count (about a 95% two-sided normal interval).
Z = 2.0
#: "Reaches z*" for the d = 4 row: this fraction of the seeds end with p_theta(z*) > 1/2.
FOUND_FRACTION = 0.95
#: Iterations to this fraction of the total drop of the mean curve measure "converges faster".
DROP_FRACTION = 0.9

HOLDS, FAILS, NOISE = "holds", "fails", "noise"
OUTCOMES = (HOLDS, FAILS, NOISE)


@dataclass
class ConfigResult:
    """One selected curve of an experiment: a method with n samples per step (0 for the true
    gradient and CP) under a parametrization at its selected learning rate.

    final: per-seed final loss (seeds,); found: per-seed "found z*" flags (seeds,); steps, curve:
    logged iterations and the mean loss over seeds there (T,)."""

    method: str
    n: int
    param: str
    lr: float
    final: np.ndarray
    found: np.ndarray
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    curve: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def mean(self) -> float:
        return float(np.mean(self.final))

    @property
    def stderr(self) -> float:
        """Standard error of the final mean; 0 for a single (deterministic) run."""
        k = self.final.size
        return float(np.std(self.final, ddof=1) / math.sqrt(k)) if k > 1 else 0.0

    @property
    def label(self) -> str:
        name = self.method if self.method in DETERMINISTIC else f"{self.method} n={self.n}"
        return name if self.param == "sigmoid" else f"{name} {self.param}"

    def text(self) -> str:
        if self.final.size > 1:
            return f"{self.mean:+.3f}+-{self.stderr:.3f}"
        return f"{self.mean:+.3f}"


@dataclass
class UnitResult:
    """The selected configs of one experiment on one benchmark instance (d bits), with the
    instance's J(z*) = min J and E_0.5[J] (the loss at theta = 0.5, where every run starts)."""

    experiment: str
    benchmark: str
    instance: int
    d: int
    min_J: float
    start_J: float
    configs: list[ConfigResult]

    def get(self, method: str, n: int | None = None, param: str = "sigmoid") -> ConfigResult:
        for c in self.configs:
            if c.method == method and c.param == param and (n is None or c.n == n):
                return c
        raise KeyError(f"{self.experiment} {self.benchmark}: no config {method} n={n} {param}")


@dataclass(frozen=True)
class Verdict:
    outcome: str  # one of OUTCOMES
    detail: str
    values: dict[str, float] = field(default_factory=dict)


def compare(a: ConfigResult, b: ConfigResult, z: float = Z) -> int:
    """+1 if a is worse (higher final loss) than b by more than z combined standard errors, -1 if
    better by more than that, 0 within noise. Two deterministic runs compare exactly (up to 1e-9
    relative)."""
    diff = a.mean - b.mean
    se = math.hypot(a.stderr, b.stderr)
    tol = z * se if se > 0 else 1e-9 * max(1.0, abs(a.mean), abs(b.mean))
    return 1 if diff > tol else -1 if diff < -tol else 0


def _z_score(a: ConfigResult, b: ConfigResult) -> float:
    se = math.hypot(a.stderr, b.stderr)
    diff = a.mean - b.mean
    return diff / se if se > 0 else math.copysign(math.inf, diff) if diff else 0.0


def worse_than_all(worse: Sequence[ConfigResult], better: Sequence[ConfigResult],
                   z: float = Z) -> Verdict:
    """"Every config of ``worse`` is worse than every config of ``better``": holds if each pair
    differs by more than z s.e. in that direction, fails if some pair differs by more than z s.e.
    the other way, noise otherwise."""
    signs, parts, values = [], [], {}
    for a in worse:
        for b in better:
            s = compare(a, b, z)
            signs.append(s)
            zs = _z_score(a, b)
            values[f"z[{a.label} - {b.label}]"] = zs
            parts.append(f"{a.label} {a.text()} vs {b.label} {b.text()} ({zs:+.1f} s.e.)")
    outcome = HOLDS if all(s == 1 for s in signs) else FAILS if -1 in signs else NOISE
    return Verdict(outcome, "; ".join(parts), values)


def all_similar(group: Sequence[ConfigResult], z: float = Z) -> Verdict:
    """"These configs perform similarly": holds if every pair is within z combined s.e., fails
    otherwise (the largest gap is reported)."""
    values, worst = {}, 0.0
    for i, a in enumerate(group):
        for b in group[i + 1:]:
            zs = _z_score(a, b)
            values[f"z[{a.label} - {b.label}]"] = zs
            worst = max(worst, abs(zs))
    outcome = HOLDS if all(compare(a, b, z) == 0 for i, a in enumerate(group)
                           for b in group[i + 1:]) else FAILS
    text = ", ".join(f"{c.label} {c.text()}" for c in group)
    return Verdict(outcome, f"{text}; largest gap {worst:.1f} s.e.", values)


def iterations_to_drop(c: ConfigResult, fraction: float = DROP_FRACTION) -> float:
    """First logged iteration at which the mean curve has made ``fraction`` of its total drop
    (curve[0] - curve[-1]); inf if the curve does not go down."""
    drop = c.curve[0] - c.curve[-1]
    if not drop > 0:
        return math.inf
    hit = np.nonzero(c.curve <= c.curve[0] - fraction * drop)[0]
    return float(c.steps[hit[0]])


# ---------------------------------------------------------------------------------------------
# The claims


@dataclass(frozen=True)
class Claim:
    """One conclusion of `tab:app_results_summ` (``row``: its row; ``paper``: its wording) as a
    predicate over one instance's results of ``experiment`` at d = ``d`` on ``benchmarks``."""

    key: str
    row: str
    paper: str
    criterion: str
    experiment: str
    d: int
    benchmarks: tuple[str, ...]
    evaluate: Callable[[UnitResult], Verdict]


def _reinforce_worst(n: int) -> Callable[[UnitResult], Verdict]:
    def evaluate(u: UnitResult) -> Verdict:
        others = [u.get(m, n) for m in ("loorf", "arms", "betastar")
                  if any(c.method == m and c.n == n for c in u.configs)]
        return worse_than_all([u.get("reinforce", n)], others)
    return evaluate


def _similar(n: int) -> Callable[[UnitResult], Verdict]:
    def evaluate(u: UnitResult) -> Verdict:
        return all_similar([u.get(m, n) for m in ("loorf", "arms", "betastar")])
    return evaluate


def _mc(u: UnitResult) -> list[ConfigResult]:
    return [c for c in u.configs if c.method not in DETERMINISTIC]


def _true_misses(u: UnitResult) -> Verdict:
    t = u.get("true")
    found = bool(t.found.all())
    return Verdict(FAILS if found else HOLDS,
                   f"true gradient ends at {t.mean:+.3f}, J(z*) = {u.min_J:+.3f}, "
                   f"{'finds' if found else 'misses'} z*",
                   {"true_final": t.mean, "min_J": u.min_J, "found": float(found)})


def _true_beats_mc(u: UnitResult) -> Verdict:
    mc = _mc(u)
    v = worse_than_all(mc, [u.get("true")])
    best = min(mc, key=lambda c: c.mean)
    return Verdict(v.outcome, f"true {u.get('true').mean:+.3f}; best MC {best.label} "
                   f"{best.text()} (found z* in {int(best.found.sum())}/{best.found.size})",
                   v.values)


FAST, SLOW = ("direct", "escort"), ("sigmoid", "cosine")


def _param_method(n: int) -> str:
    return "reinforce" if n == 1 else "loorf"


def _fast(n: int) -> Callable[[UnitResult], Verdict]:
    def evaluate(u: UnitResult) -> Verdict:
        m = _param_method(n)
        t = {p: iterations_to_drop(u.get(m, n, p)) for p in (*FAST, *SLOW)}
        ok = max(t[p] for p in FAST) < min(t[p] for p in SLOW)
        return Verdict(HOLDS if ok else FAILS,
                       ", ".join(f"{p} {t[p]:g}" for p in t),
                       {f"iters90[{p}]": t[p] for p in t})
    return evaluate


def _slow_better(param: str, n: int) -> Callable[[UnitResult], Verdict]:
    def evaluate(u: UnitResult) -> Verdict:
        m = _param_method(n)
        return worse_than_all([u.get(m, n, p) for p in FAST], [u.get(m, n, param)])
    return evaluate


def _only_n1_finds(u: UnitResult) -> Verdict:
    counts = {(c.n, c.param): int(c.found.sum()) for c in u.configs}
    n1 = sum(v for (n, _), v in counts.items() if n == 1)
    larger = sum(v for (n, _), v in counts.items() if n > 1)
    seeds = u.configs[0].found.size
    ok = n1 > 0 and larger == 0
    text = "; ".join(f"n={k}: " + "/".join(str(counts[(k, p)]) for p in (*SLOW, *FAST))
                     for k in (1, 4, 10))
    return Verdict(HOLDS if ok else FAILS,
                   f"runs finding z* of {seeds} (sigmoid/cosine/direct/escort) {text}",
                   {f"found[n={n} {p}]": float(v) for (n, p), v in counts.items()})


def _cp_st_worst(u: UnitResult) -> Verdict:
    others = [u.get(m) for m in ("reinforce", "rebar", "relax", "true")]
    return worse_than_all([u.get("cp"), u.get("st")], others)


def _grad_no_help(u: UnitResult) -> Verdict:
    base = u.get("reinforce")
    signs = {m: compare(u.get(m), base) for m in ("rebar", "relax")}
    values = {f"z[{m} - reinforce]": _z_score(u.get(m), base) for m in signs}
    text = ", ".join(f"{u.get(m).label} {u.get(m).text()} (lr {u.get(m).lr:g})"
                     for m in ("rebar", "relax", "reinforce"))
    return Verdict(FAILS if -1 in signs.values() else HOLDS, text, values)


def _all_find(u: UnitResult) -> Verdict:
    frac = {c.label: float(c.found.mean()) for c in u.configs}
    bad = [k for k, f in frac.items() if f < FOUND_FRACTION]
    seeds = max(c.found.size for c in u.configs)
    text = (f"all {len(frac)} methods find z* in >= {FOUND_FRACTION:.0%} of seeds" if not bad
            else "below: " + ", ".join(f"{k} {frac[k] * 100:.0f}%" for k in bad))
    return Verdict(FAILS if bad else HOLDS, f"{text} ({seeds} seeds)",
                   {f"found_fraction[{k}]": f for k, f in frac.items()})


BOTH = ("exponential", "nnloss")
_WORSE = f"worse = final mean higher by more than {Z:g} combined standard errors"


def _build() -> list[Claim]:
    out = []
    for n in (1, 4, 10):
        vs = "beta*" if n == 1 else "LOORF, ARMS and beta*"
        out.append(Claim(f"est_reinforce_worst_n{n}", "estimators", "REINFORCE performed the worst",
                         f"REINFORCE n={n} worse than {vs} at n={n} ({_WORSE})",
                         "estimators", 10, BOTH, _reinforce_worst(n)))
    for n in (4, 10):
        out.append(Claim(f"est_similar_n{n}", "estimators", "LOORF/ARMS/beta* performed similarly",
                         f"every pair of LOORF, ARMS, beta* at n={n} within {Z:g} combined s.e.",
                         "estimators", 10, BOTH, _similar(n)))
    out.append(Claim("est_true_misses", "estimators",
                     "true gradient failed to reach the correct solution in NNLoss",
                     "the (deterministic) true-gradient run ends with p_theta(z*) <= 1/2",
                     "estimators", 10, BOTH, _true_misses))
    out.append(Claim("est_true_beats_mc", "estimators (text)",
                     "the true gradient still finds a better local minimum than the MC methods",
                     f"every MC estimator worse than the true gradient ({_WORSE})",
                     "estimators", 10, BOTH, _true_beats_mc))
    for n in (1, 4, 10):
        out.append(Claim(f"par_fast_n{n}", "parametrizations", "escort and direct were faster",
                         f"{_param_method(n).upper()} n={n}: iterations to {DROP_FRACTION:.0%} of "
                         "the mean curve's total drop, direct and escort both fewer than sigmoid "
                         "and cosine (at each one's selected lr; resolution: --log-every)",
                         "params", 10, BOTH, _fast(n)))
    for param in SLOW:
        for n in (1, 4, 10):
            out.append(Claim(
                f"par_{param}_better_n{n}", "parametrizations",
                "escort and direct converged to worse final solutions; sigmoid and cosine to "
                "better ones",
                f"{_param_method(n).upper()} n={n}: direct and escort both worse than {param} "
                f"({_WORSE})", "params", 10, BOTH, _slow_better(param, n)))
    out.append(Claim("par_only_n1_finds", "parametrizations (fig:microworld_params_scatter)",
                     "only n=1 found z*, never larger n",
                     "some run at n=1 (any parametrization) ends with p_theta(z*) > 1/2 and none "
                     "at n=4 or n=10", "params", 10, BOTH, _only_n1_finds))
    out.append(Claim("app_cp_st_worst", "approaches", "CP and ST performed the worst",
                     f"CP and ST each worse than REINFORCE, REBAR, RELAX and the true gradient "
                     f"({_WORSE})", "approaches", 10, ("nnloss",), _cp_st_worst))
    out.append(Claim("app_grad_no_help", "approaches",
                     "grad_z J did not seem to help hybrid methods",
                     f"neither REBAR nor RELAX better than REINFORCE by more than {Z:g} combined "
                     "s.e.", "approaches", 10, ("nnloss",), _grad_no_help))
    out.append(Claim("d4_estimators_find", "d = 4", "all methods performed similarly well",
                     f"every estimator and the true gradient find z* in >= {FOUND_FRACTION:.0%} "
                     "of seeds", "estimators", 4, BOTH, _all_find))
    out.append(Claim("d4_approaches_find", "d = 4", "all methods performed similarly well",
                     f"every approach (REINFORCE, CP, ST, REBAR, RELAX, true gradient) finds z* in "
                     f">= {FOUND_FRACTION:.0%} of seeds", "approaches", 4, ("nnloss",), _all_find))
    return out


#: Every claim, in table order.
CLAIMS: tuple[Claim, ...] = tuple(_build())


def claims_for(experiments: Iterable[str], ds: Iterable[int]) -> list[Claim]:
    """The claims whose experiment and d are among those run."""
    experiments, ds = set(experiments), set(ds)
    return [c for c in CLAIMS if c.experiment in experiments and c.d in ds]


# =============================================================================================
# The supermask, pruning and NN-regression rows of `tab:app_results_summ`, as predicates over
# plain run data: lists of :class:`RunRecord` (one finished run each), not over one microworld
# instance. Outcomes: holds / fails / noise as above, and ``no data`` (:data:`MISSING`) where the
# runs a claim reads are not there (yet).

#: A claim whose runs are missing.
MISSING = "no data"
SCALE_OUTCOMES = (HOLDS, FAILS, NOISE, MISSING)
#: Pruning fronts: points below this test accuracy (ten classes: chance is 0.1) are not "useful"
#: and do not set the range of remaining fractions two fronts are compared over.
ACC_FLOOR = 0.5
#: Remaining fractions at which two fronts are compared (log-spaced over the shared range).
GRID_POINTS = 25
#: Accuracy standard error of a setting's mean used when a method has no setting with two or
#: more seeds (half a point of accuracy, about the seed-to-seed s.d. of LeNet/MNIST).
FALLBACK_SE = 5e-3
#: "Much better" (pruning): the mean accuracy gap must also be at least this (two points).
MUCH_ACC = 0.02
#: "Much worse" (regression): the final loss must also be this fraction above the other's.
MUCH_REL = 0.10
#: Per-layer allocation: runs of two methods are matched when their remaining fractions differ by
#: at most this factor.
MATCH_FACTOR = 2.0
#: "Very different" allocations: total-variation distance between the shares of remaining
#: weights per layer of at least this (a tenth of the network's capacity reallocated).
VERY_TV = 0.10
#: Allocation standard error used when no setting has two or more seeds.
FALLBACK_TV_SE = 0.02
#: Regression: standard error of a single run's final loss, as a fraction of it (a setting run
#: with one seed has no seed spread).
FALLBACK_REL_SE = 0.02


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
    ua = [p for p in fa if p.accuracy >= ACC_FLOOR]
    ub = [p for p in fb if p.accuracy >= ACC_FLOOR]
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


def _sel(records: Sequence[RunRecord], experiment: str, **want) -> list[RunRecord]:
    """Records of an experiment whose method / settings equal every ``want`` (a tuple: one of)."""
    out = []
    for r in records:
        if r.experiment != experiment:
            continue
        ok = True
        for k, v in want.items():
            got = r.method if k == "method" else r.get(k)
            if not (got in v if isinstance(v, tuple) else got == v):
                ok = False
                break
        if ok:
            out.append(r)
    return out


def _ns(records: Sequence[RunRecord]) -> list[int]:
    return sorted({int(r.get("n")) for r in records})


# ----------------------------------------------------------------------------- supermask (1-4)

#: The MC estimators of the pruning runs (pbscale.prune's ``--method`` choices).
MC_PRUNE = PRUNE_MC


def _mc_pair(key: str, a: str, b: str, label_a: str, label_b: str
             ) -> Callable[[Sequence[RunRecord]], Verdict]:
    """Supermask MC runs with ``key`` == a against those with ``key`` == b, at every n both
    have."""
    def evaluate(records: Sequence[RunRecord]) -> Verdict:
        mc = _sel(records, "supermask", method=MC_PRUNE)
        parts = []
        for n in _ns(mc):
            ra = _sel(mc, "supermask", n=n, **{key: a})
            rb = _sel(mc, "supermask", n=n, **{key: b})
            if ra and rb:
                parts.append((f"n={n}", better_front(ra, rb, f"{label_a} n={n}",
                                                     f"{label_b} n={n}")))
        return combine(parts) if parts else Verdict(
            MISSING, f"no {label_a} and {label_b} runs at one n", {})
    return evaluate


def _supermask_cp_mc(records: Sequence[RunRecord]) -> Verdict:
    cp = _sel(records, "supermask", method="cp")
    mc = _sel(records, "supermask", method=MC_PRUNE)
    parts = [(f"n={n}", better_front(cp, _sel(mc, "supermask", n=n), "CP", f"MC n={n}"))
             for n in _ns(mc)]
    if 100 not in _ns(mc):
        parts.append(("n=100", Verdict(MISSING, "no MC run with n = 100", {})))
    return combine(parts)


def _cp_optimizers(experiment: str, better: str, worse: str) -> Callable[[Sequence[RunRecord]],
                                                                       Verdict]:
    def evaluate(records: Sequence[RunRecord]) -> Verdict:
        a = _sel(records, experiment, method="cp", mask_opt=better)
        b = _sel(records, experiment, method="cp", mask_opt=worse)
        return better_front(a, b, f"CP {better}", f"CP {worse}", much=True)
    return evaluate


# ---------------------------------------------------------------------------- joint (5-8)


def _joint_cp_best(records: Sequence[RunRecord]) -> Verdict:
    cp = _sel(records, "joint", method="cp")
    others = [("MC", _sel(records, "joint", method=MC_PRUNE)),
              ("MP", _sel(records, "joint", method="mp")),
              ("GMP", _sel(records, "joint", method="gmp"))]
    return combine([(name, better_front(cp, rs, "CP", name)) for name, rs in others])


ALLOCATION_METHODS = (("CP", ("cp",)), ("MC", MC_PRUNE), ("GMP", ("gmp",)))


def _useful_front(records: Sequence[RunRecord]) -> list[Point]:
    return [p for p in front(points(records)) if p.accuracy >= ACC_FLOOR]


def _matched(fa: Sequence[Point], fb: Sequence[Point]) -> list[tuple[Point, Point]]:
    """Each point of fa with the point of fb nearest in log remaining, kept if within
    MATCH_FACTOR."""
    pairs = []
    for p in fa:
        if not fb:
            break
        q = min(fb, key=lambda q: abs(math.log(q.remaining / p.remaining)))
        if abs(math.log(q.remaining / p.remaining)) <= math.log(MATCH_FACTOR):
            pairs.append((p, q))
    return pairs


def _tv_se(pts: Sequence[Point]) -> tuple[float, bool]:
    rep = [p.tv_sd for p in pts if p.seeds > 1 and math.isfinite(p.tv_sd)]
    return (float(np.mean(rep)), True) if rep else (FALLBACK_TV_SE, False)


def _joint_fronts(records: Sequence[RunRecord]) -> dict[str, list[Point]]:
    out = {}
    for name, methods in ALLOCATION_METHODS:
        out[name] = _useful_front(_sel(records, "joint", method=methods))
    return out


def _joint_solutions_differ(records: Sequence[RunRecord]) -> Verdict:
    fronts = _joint_fronts(records)
    present = [k for k, v in fronts.items() if v]
    if len(present) < 2:
        return Verdict(MISSING, "fewer than two of CP, MC, GMP have front points with accuracy "
                       f">= {ACC_FLOOR:g}", {})
    within, known = _tv_se([p for v in fronts.values() for p in v])
    cut = max(VERY_TV, Z * within)
    kinds, parts, values = [], [], {}
    for i, x in enumerate(present):
        for y in present[i + 1:]:
            pairs = _matched(fronts[x], fronts[y])
            if not pairs:
                kinds.append(MISSING)
                parts.append(f"{x}/{y}: no runs within x{MATCH_FACTOR:g} remaining")
                continue
            d = float(np.mean([tv_distance(p.shares, q.shares) for p, q in pairs]))
            values[f"tv[{x}-{y}]"] = d
            if d > cut:
                kinds.append(HOLDS)
            elif d <= VERY_TV and Z * within < VERY_TV:
                kinds.append(FAILS)
            else:
                kinds.append(NOISE)
            parts.append(f"{x}/{y}: TV {d:.3f} over {len(pairs)} matched runs")
    values["within_seed_tv"] = within
    outcome = (FAILS if FAILS in kinds else MISSING if MISSING in kinds
               else NOISE if NOISE in kinds else HOLDS)
    return Verdict(outcome, "; ".join(parts) + f"; seed spread {within:.3f}"
                   + ("" if known else " (fallback)") + f"; 'very different' > {cut:.3f}",
                   values)


def _joint_mc_allocation(records: Sequence[RunRecord]) -> Verdict:
    fronts = _joint_fronts(records)
    if not fronts["MC"]:
        return Verdict(MISSING, f"no MC front point with accuracy >= {ACC_FLOOR:g}", {})
    parts = []
    for other in ("CP", "GMP"):
        pairs = _matched(fronts["MC"], fronts[other])
        if not pairs:
            parts.append((other, Verdict(MISSING, f"no {other} run within x{MATCH_FACTOR:g} of "
                                         "an MC run's remaining fraction", {})))
            continue
        diffs = [q.distance - p.distance for p, q in pairs]
        mean = float(np.mean(diffs))
        (se_m, km), (se_o, ko) = _tv_se(fronts["MC"]), _tv_se(fronts[other])
        se = math.hypot(se_m, se_o) / math.sqrt(len(pairs))
        outcome = HOLDS if mean > Z * se else FAILS if mean < -Z * se else NOISE
        mc_d = float(np.mean([p.distance for p, _ in pairs]))
        o_d = float(np.mean([q.distance for _, q in pairs]))
        parts.append((other, Verdict(
            outcome, f"distance from the dense allocation (TV): {other} {o_d:.3f}, MC {mc_d:.3f} "
            f"over {len(pairs)} matched runs, difference {mean:+.3f} (s.e. {se:.3f}"
            + ("" if km and ko else ", fallback") + ")",
            {"tv_other": o_d, "tv_mc": mc_d, "diff": mean, "se": se})))
    return combine(parts)


# ----------------------------------------------------------------------- regression (9-11)


@dataclass
class NamedResult(ConfigResult):
    """A :class:`ConfigResult` with its own label (regression: "cp sgd", "loorf escort")."""

    name: str = ""

    @property
    def label(self) -> str:
        return self.name or super().label

    @property
    def stderr(self) -> float:
        """Standard error over seeds; FALLBACK_REL_SE x |final| for a single run."""
        if self.final.size == 1:
            return FALLBACK_REL_SE * abs(float(self.final[0]))
        return super().stderr


def _final(records: Sequence[RunRecord], label: str, method: str, n: int = 0,
           param: str = "sigmoid", lr: float = 0.0) -> NamedResult:
    """Per-seed final losses (seeds,) and the mean curve over seeds of a group of runs."""
    finals = np.array([r.final_loss for r in sorted(records, key=lambda r: r.seed)])
    # (a single run gets the fallback standard error FALLBACK_REL_SE x its loss)
    steps = records[0].epochs
    curve = np.mean([r.losses for r in records], axis=0) if all(
        r.losses.size == steps.size for r in records) else np.zeros(0)
    return NamedResult(method, n, param, lr, finals, np.zeros(finals.size, dtype=bool),
                       steps=steps, curve=curve, name=label)


def select_setting(records: Sequence[RunRecord], label: str) -> ConfigResult | None:
    """Among the settings of a group of regression runs (learning rate, CP's optimizer ...), the
    one with the lowest mean over seeds of the mean validation loss over the second half of
    training (`sec:app_maskednnregression`, :func:`analysis.regression.select`)."""
    from analysis.regression import select

    groups: dict[str, list[RunRecord]] = {}
    for r in records:
        groups.setdefault(r.setting, []).append(r)
    if not groups:
        return None
    hist = {k: [{"epoch": r.epochs, "val_loss_chosen": r.losses} for r in rs]
            for k, rs in groups.items()}
    best, _ = select(hist)
    rs = groups[best]
    return _final(rs, label, rs[0].method, int(rs[0].get("n", 0)), rs[0].get("param", "sigmoid"),
                  float(rs[0].get("lr", 0.0)))


def _by_epochs(records: Sequence[RunRecord]) -> dict[int, list[RunRecord]]:
    out: dict[int, list[RunRecord]] = {}
    for r in records:
        out.setdefault(int(r.get("epochs")), []).append(r)
    return dict(sorted(out.items(), reverse=True))


def much_worse(worse: ConfigResult, better: ConfigResult, z: float = Z) -> Verdict:
    """"worse is much worse than better": worse by more than z combined s.e. and by at least
    MUCH_REL of better's final loss (holds); better than it by z s.e., or worse but by less than
    MUCH_REL, fails; noise otherwise."""
    s = compare(worse, better, z)
    rel = (worse.mean - better.mean) / abs(better.mean) if better.mean else math.inf
    zs = _z_score(worse, better)
    outcome = (HOLDS if s == 1 and rel >= MUCH_REL else FAILS if s == -1 or s == 1
               else NOISE)
    return Verdict(outcome, f"{worse.label} {worse.text()} vs {better.label} {better.text()} "
                   f"({zs:+.1f} s.e., {rel:+.0%})", {f"z[{worse.label} - {better.label}]": zs,
                                                     f"rel[{worse.label} - {better.label}]": rel})


def _reg_reinforce_much_worse(records: Sequence[RunRecord]) -> Verdict:
    parts = []
    for epochs, rs in _by_epochs(_sel(records, "regression", param="sigmoid", lr=0.1,
                                      optimizer="rmsprop")).items():
        for n in _ns([r for r in rs if r.method in ("reinforce", "loorf", "arms")]):
            group = {m: [r for r in rs if r.method == m and r.get("n") == n]
                     for m in ("reinforce", "loorf", "arms")}
            if not group["reinforce"] or not (group["loorf"] or group["arms"]):
                continue
            rf = _final(group["reinforce"], f"reinforce n={n}", "reinforce", n)
            for m in ("loorf", "arms"):
                if group[m]:
                    parts.append((f"{epochs} ep n={n} vs {m}",
                                  much_worse(rf, _final(group[m], f"{m} n={n}", m, n))))
    return combine(parts) if parts else Verdict(MISSING, "no REINFORCE and LOORF/ARMS runs at "
                                                "one n, sigmoid, lr 0.1", {})


PARAMS = ("sigmoid", "cosine", "direct", "escort")


def _param_curves(records: Sequence[RunRecord]) -> tuple[int, dict[str, ConfigResult]] | None:
    rs = _sel(records, "regression", method="loorf", n=10, optimizer="rmsprop")
    for epochs, group in _by_epochs(rs).items():
        sel = {p: select_setting([r for r in group if r.get("param") == p], f"loorf {p}")
               for p in PARAMS}
        if all(v is not None for v in sel.values()):
            return epochs, sel  # type: ignore[return-value]
    return None


def _speed(fast: ConfigResult, slow: Sequence[ConfigResult]) -> Verdict:
    t = {c.label: iterations_to_drop(c) for c in (fast, *slow)}
    ok = all(t[fast.label] < t[c.label] for c in slow)
    return Verdict(HOLDS if ok else FAILS, "epochs to 90% of the mean curve's drop: "
                   + ", ".join(f"{k} {v:g}" for k, v in t.items()),
                   {f"epochs90[{k}]": v for k, v in t.items()})


def _slower(slow: ConfigResult, fast: Sequence[ConfigResult]) -> Verdict:
    t = {c.label: iterations_to_drop(c) for c in (slow, *fast)}
    ok = all(t[slow.label] > t[c.label] for c in fast)
    return Verdict(HOLDS if ok else FAILS, "epochs to 90% of the mean curve's drop: "
                   + ", ".join(f"{k} {v:g}" for k, v in t.items()),
                   {f"epochs90[{k}]": v for k, v in t.items()})


def _reg_params(which: str) -> Callable[[Sequence[RunRecord]], Verdict]:
    def evaluate(records: Sequence[RunRecord]) -> Verdict:
        got = _param_curves(records)
        if got is None:
            return Verdict(MISSING, "LOORF n=10 runs of the four parametrizations missing", {})
        epochs, c = got
        good = [c["sigmoid"], c["escort"]]
        if which == "cosine":
            parts = [("slower", _slower(c["cosine"], good + [c["direct"]])),
                     ("worse", worse_than_all([c["cosine"]], good))]
        elif which == "direct":
            parts = [("fast", _speed(c["direct"], [c["cosine"], c["sigmoid"]])),
                     ("poor", worse_than_all([c["direct"]], good))]
        else:
            parts = [("well", worse_than_all([c["cosine"], c["direct"]], good))]
        v = combine(parts)
        return Verdict(v.outcome, f"{epochs} epochs, lr selected per parametrization: "
                       + v.detail, v.values)
    return evaluate


APPROACHES = ("reinforce", "loorf", "st", "rebar")


def _approach_curves(records: Sequence[RunRecord]) -> dict[int, dict[str, ConfigResult]]:
    """Per epochs, the selected setting of REINFORCE, LOORF, ST, REBAR (n = 10, sigmoid,
    RMSprop, lr selected) and of CP with each optimizer (lr selected) and with both."""
    out: dict[int, dict[str, ConfigResult]] = {}
    rs = _sel(records, "regression", param="sigmoid")
    for epochs, group in _by_epochs(rs).items():
        sel: dict[str, ConfigResult] = {}
        for m in APPROACHES:
            c = select_setting([r for r in group if r.method == m and r.get("n") == 10
                                and r.get("optimizer") == "rmsprop"], m)
            if c is not None:
                sel[m] = c
        for opt in ("rmsprop", "sgd"):
            c = select_setting([r for r in group if r.method == "cp"
                                and r.get("optimizer") == opt], f"cp {opt}")
            if c is not None:
                sel[f"cp {opt}"] = c
        c = select_setting([r for r in group if r.method == "cp"], "cp")
        if c is not None:
            sel["cp"] = c
        if "reinforce" in sel and len(sel) > 1:
            out[epochs] = sel
    return out


def _reg_grad_helps(records: Sequence[RunRecord]) -> Verdict:
    parts = []
    for epochs, c in _approach_curves(records).items():
        for m in ("st", "rebar"):
            if m in c:
                parts.append((f"{epochs} ep {m}", worse_than_all([c["reinforce"]], [c[m]])))
    return combine(parts) if parts else Verdict(MISSING, "no REINFORCE with ST or REBAR runs at "
                                                "the same epochs", {})


def _reg_cp_best(records: Sequence[RunRecord]) -> Verdict:
    parts = []
    for epochs, c in _approach_curves(records).items():
        if not {"cp", "st", "loorf"} <= set(c):
            continue
        others = [c[m] for m in ("reinforce", "rebar") if m in c]
        parts.append((f"{epochs} ep CP first", worse_than_all([c["st"], c["loorf"], *others],
                                                              [c["cp"]])))
        if others:
            parts.append((f"{epochs} ep ST, LOORF next", worse_than_all(others,
                                                                       [c["st"], c["loorf"]])))
    return combine(parts) if parts else Verdict(MISSING, "no CP, ST and LOORF runs at the same "
                                                "epochs", {})


def _reg_cp_sgd(records: Sequence[RunRecord]) -> Verdict:
    parts = [(f"{epochs} ep", worse_than_all([c["cp rmsprop"]], [c["cp sgd"]]))
             for epochs, c in _approach_curves(records).items()
             if {"cp rmsprop", "cp sgd"} <= set(c)]
    return combine(parts) if parts else Verdict(MISSING, "no CP runs with both optimizers", {})


@dataclass(frozen=True)
class ScaleClaim:
    """One supermask / pruning / NN-regression conclusion of `tab:app_results_summ`: ``bullet``
    is its number in the list of the study (1-11), ``experiment`` the runs it reads."""

    key: str
    bullet: int
    row: str
    paper: str
    criterion: str
    experiment: str
    evaluate: Callable[[Sequence[RunRecord]], Verdict]


_FRONT = (f"mean over {GRID_POINTS} log-spaced remaining fractions of the difference of the two "
          "Pareto fronts' best test accuracy with at most that fraction remaining (range: from "
          f"the larger of the fronts' sparsest point with accuracy >= {ACC_FLOOR:g} to the "
          "densest point); better = gap > "
          f"{Z:g} s.e. (pooled seed s.d.; {FALLBACK_SE:g} per setting with one seed)")
_REG = f"final validation loss higher by more than {Z:g} combined s.e. over seeds"


def _build_scale() -> list[ScaleClaim]:
    return [
        ScaleClaim("sm_arms_gt_loorf", 1, "supermask: estimators",
                   "ARMS performed marginally better than LOORF",
                   f"at every n run: ARMS front better than LOORF front ({_FRONT})",
                   "supermask", _mc_pair("method", "arms", "loorf", "ARMS", "LOORF")),
        ScaleClaim("sm_escort_gt_sigmoid", 2, "supermask: parametrization",
                   "Escort performed marginally better than sigmoid",
                   f"at every n run: escort front (ARMS and LOORF) better than sigmoid front "
                   f"({_FRONT})", "supermask",
                   _mc_pair("param", "escort", "sigmoid", "escort", "sigmoid")),
        ScaleClaim("sm_cp_gt_mc", 3, "supermask: approaches",
                   "CP performed better than MC, even when n = 100",
                   f"CP front (both optimizers) better than the MC front at every n, n = 100 "
                   f"included ({_FRONT})", "supermask", _supermask_cp_mc),
        ScaleClaim("sm_cp_rmsprop_gt_sgd", 4, "supermask: approaches",
                   "CP performed much better with RMSprop than with SGD",
                   f"CP RMSprop front better than CP SGD front by at least {MUCH_ACC:g} "
                   f"accuracy ({_FRONT})", "supermask", _cp_optimizers("supermask", "rmsprop",
                                                                         "sgd")),
        ScaleClaim("joint_cp_best", 5, "pruning: approaches", "CP performed the best",
                   f"CP front better than each of MC (every n), MP and GMP ({_FRONT})", "joint",
                   _joint_cp_best),
        ScaleClaim("joint_solutions_differ", 6, "pruning: approaches",
                   "Per-method solutions were very different qualitatively",
                   "for every pair of CP, MC, GMP: mean total-variation distance between the "
                   "shares of remaining weights per layer of front runs matched within "
                   f"x{MATCH_FACTOR:g} remaining > max({VERY_TV:g}, {Z:g} x seed spread); "
                   f"fails if <= {VERY_TV:g} while the seed spread could show it", "joint",
                   _joint_solutions_differ),
        ScaleClaim("joint_mc_allocation", 7, "pruning: approaches",
                   "MC methods could not change the per-layer allocation as much as CP or GMP",
                   "allocation distance = TV distance of the shares of remaining weights per "
                   "layer from the dense layer sizes' shares; over MC front runs matched within "
                   f"x{MATCH_FACTOR:g} remaining to CP (and GMP) front runs, CP's (GMP's) minus "
                   f"MC's distance > {Z:g} s.e.", "joint", _joint_mc_allocation),
        ScaleClaim("joint_cp_sgd_gt_rmsprop", 8, "pruning: approaches",
                   "CP performed much better with SGD than with RMSprop",
                   f"CP SGD front better than CP RMSprop front by at least {MUCH_ACC:g} "
                   f"accuracy ({_FRONT})", "joint", _cp_optimizers("joint", "sgd", "rmsprop")),
        ScaleClaim("reg_reinforce_much_worse", 9, "NN regression: estimators",
                   "REINFORCE performed much worse than the others",
                   f"at each n and epochs run (sigmoid, lr 0.1): REINFORCE {_REG} and by >= "
                   f"{MUCH_REL:.0%} than each of LOORF and ARMS", "regression",
                   _reg_reinforce_much_worse),
        ScaleClaim("reg_cosine_slow_worse", 10, "NN regression: parametrization",
                   "Cosine was slower and converged to worse values",
                   "LOORF n=10, lr selected per parametrization: cosine takes the most epochs to "
                   f"90% of its mean curve's drop, and {_REG} than sigmoid and escort",
                   "regression", _reg_params("cosine")),
        ScaleClaim("reg_direct_fast_poor", 10, "NN regression: parametrization",
                   "Direct was fast and converged to poor values",
                   "LOORF n=10: direct reaches 90% of its drop in fewer epochs than cosine and "
                   f"sigmoid, and its {_REG} than sigmoid and escort", "regression",
                   _reg_params("direct")),
        ScaleClaim("reg_escort_sigmoid_well", 10, "NN regression: parametrization",
                   "Escort and sigmoid performed relatively well",
                   f"LOORF n=10: cosine and direct each {_REG} than sigmoid and than escort",
                   "regression", _reg_params("well")),
        ScaleClaim("reg_grad_helps", 11, "NN regression: approaches",
                   "grad_z J started becoming helpful for hybrid methods",
                   f"at each epochs run: REINFORCE n=10 {_REG} than ST and than REBAR (those "
                   "run; lr selected per method)", "regression", _reg_grad_helps),
        ScaleClaim("reg_cp_best", 11, "NN regression: approaches",
                   "CP performed the best, followed by ST and LOORF",
                   f"CP (optimizer and lr selected) better than ST, LOORF, REINFORCE, REBAR; ST "
                   f"and LOORF better than REINFORCE and REBAR ({_REG})", "regression",
                   _reg_cp_best),
        ScaleClaim("reg_cp_sgd", 11, "NN regression: approaches",
                   "CP performed well with SGD, but not with RMSprop",
                   f"CP RMSprop (lr selected) {_REG} than CP SGD (lr selected)", "regression",
                   _reg_cp_sgd),
    ]


#: The supermask, pruning and NN-regression claims, in table order.
SCALE_CLAIMS: tuple[ScaleClaim, ...] = tuple(_build_scale())


def evaluate_scale(records: Sequence[RunRecord],
                   experiments: Iterable[str] | None = None) -> list[tuple[ScaleClaim, Verdict]]:
    """Every scale claim (of ``experiments``, default all) on the records."""
    chosen = None if experiments is None else set(experiments)
    return [(c, c.evaluate(records)) for c in SCALE_CLAIMS
            if chosen is None or c.experiment in chosen]
