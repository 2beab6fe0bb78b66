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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from analysis.microworld.runs import DETERMINISTIC

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


def z_score(a: ConfigResult, b: ConfigResult) -> float:
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
            zs = z_score(a, b)
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
            zs = z_score(a, b)
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
    values = {f"z[{m} - reinforce]": z_score(u.get(m), base) for m in signs}
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
