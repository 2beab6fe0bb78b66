"""The NN-regression rows of the claims study (`tab:app_results_summ` bullets 9-11,
`sec:app_maskednnregression`): predicates over finished MaskedNNRegression runs
(:class:`analysis.scale.runs.RunRecord`), comparing final validation losses over seeds as the
microworld claims do (:func:`analysis.microworld.claims.compare`);
:data:`analysis.scale.claims.SCALE_CLAIMS` lists them with the pruning rows. Each takes (records,
reading); a reading acts here through its balanced seeds only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from analysis.microworld.claims import (
    FAILS,
    HOLDS,
    NOISE,
    ConfigResult,
    Verdict,
    Z,
    compare,
    iterations_to_drop,
    worse_than_all,
    z_score,
)
from analysis.scale.runs import (
    AS_REPORTED,
    MISSING,
    Reading,
    RunRecord,
    combine,
    ns,
    prefixed,
    select,
    select_seeds,
)

#: The method the paper calls CP.
CP = "cp"
#: A claim's evaluation: (records, reading) -> verdict.
Evaluate = Callable[[Sequence[RunRecord], Reading], Verdict]
#: "Much worse" (regression): the final loss must also be this fraction above the other's.
MUCH_REL = 0.10
#: Regression: standard error of a single run's final loss, as a fraction of it (a setting run
#: with one seed has no seed spread).
FALLBACK_REL_SE = 0.02


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


def best_setting(runs: dict[str, list[dict]]) -> tuple[str, list[dict]]:
    """The setting whose mean over seeds of the mean loss over the second half of training is
    lowest (`sec:app_maskednnregression`)."""
    def score(hs: list[dict]) -> float:
        e = hs[0]["epoch"]
        half = e > e.max() / 2
        return float(np.mean([h["val_loss_chosen"][half].mean() for h in hs]))

    best = min(runs, key=lambda k: score(runs[k]))
    return best, runs[best]


def select_setting(records: Sequence[RunRecord], label: str) -> ConfigResult | None:
    """Among the settings of a group of regression runs (learning rate, CP's optimizer ...), the
    one with the lowest mean over seeds of the mean validation loss over the second half of
    training (`sec:app_maskednnregression`, :func:`best_setting`)."""

    groups: dict[str, list[RunRecord]] = {}
    for r in records:
        groups.setdefault(r.setting, []).append(r)
    if not groups:
        return None
    hist = {k: [{"epoch": r.epochs, "val_loss_chosen": r.losses} for r in rs]
            for k, rs in groups.items()}
    best, _ = best_setting(hist)
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
    zs = z_score(worse, better)
    outcome = (HOLDS if s == 1 and rel >= MUCH_REL else FAILS if s == -1 or s == 1
               else NOISE)
    return Verdict(outcome, f"{worse.label} {worse.text()} vs {better.label} {better.text()} "
                   f"({zs:+.1f} s.e., {rel:+.0%})", {f"z[{worse.label} - {better.label}]": zs,
                                                     f"rel[{worse.label} - {better.label}]": rel})


def _regression(records: Sequence[RunRecord], reading: Reading) -> list[RunRecord]:
    """The regression records the reading uses (balanced seeds over the experiment)."""
    return select_seeds(select(records, "regression"), reading)


#: Claim 9: the method that is much worse, and the ones it is worse than.
ROW9 = ("reinforce", ("loorf", "arms"))


def reinforce_much_worse(records: Sequence[RunRecord],
                              reading: Reading = AS_REPORTED) -> Verdict:
    worse, better = ROW9
    parts = []
    for epochs, rs in _by_epochs(select(_regression(records, reading), "regression",
                                      param="sigmoid", lr=0.1, optimizer="rmsprop")).items():
        for n in ns(select(rs, "regression", method=(worse, *better))):
            group = {m: select(rs, "regression", method=m, n=n) for m in (worse, *better)}
            if not group[worse] or not any(group[m] for m in better):
                continue
            rf = _final(group[worse], f"{worse} n={n}", worse, n)
            for m in better:
                if group[m]:
                    parts.append((f"{epochs} ep n={n} vs {m}",
                                  much_worse(rf, _final(group[m], f"{m} n={n}", m, n))))
    return combine(parts) if parts else Verdict(MISSING, "no REINFORCE and LOORF/ARMS runs at "
                                                "one n, sigmoid, lr 0.1", {})


PARAMS = ("sigmoid", "cosine", "direct", "escort")


def _param_curves(records: Sequence[RunRecord]) -> tuple[int, dict[str, ConfigResult]] | None:
    rs = select(records, "regression", method="loorf", n=10, optimizer="rmsprop")
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


def parametrizations(which: str) -> Evaluate:
    def evaluate(records: Sequence[RunRecord], reading: Reading = AS_REPORTED) -> Verdict:
        got = _param_curves(_regression(records, reading))
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
        return prefixed(combine(parts), f"{epochs} epochs, lr selected per parametrization")
    return evaluate


APPROACHES = ("reinforce", "loorf", "st", "rebar")


def _approach_curves(records: Sequence[RunRecord]) -> dict[int, dict[str, ConfigResult]]:
    """Per epochs, the selected setting of REINFORCE, LOORF, ST, REBAR (n = 10, sigmoid,
    RMSprop, lr selected) and of CP with each optimizer (lr selected) and with both."""
    out: dict[int, dict[str, ConfigResult]] = {}
    rs = select(records, "regression", param="sigmoid")
    for epochs, group in _by_epochs(rs).items():
        sel: dict[str, ConfigResult] = {}
        for m in APPROACHES:
            c = select_setting(select(group, "regression", method=m, n=10, optimizer="rmsprop"),
                               m)
            if c is not None:
                sel[m] = c
        for opt in ("rmsprop", "sgd"):
            c = select_setting(select(group, "regression", method=CP, optimizer=opt),
                               f"{CP} {opt}")
            if c is not None:
                sel[f"{CP} {opt}"] = c
        c = select_setting(select(group, "regression", method=CP), CP)
        if c is not None:
            sel[CP] = c
        if "reinforce" in sel and len(sel) > 1:
            out[epochs] = sel
    return out


def grad_helps(records: Sequence[RunRecord], reading: Reading = AS_REPORTED) -> Verdict:
    parts = []
    for epochs, c in _approach_curves(_regression(records, reading)).items():
        for m in ("st", "rebar"):
            if m in c:
                parts.append((f"{epochs} ep {m}", worse_than_all([c["reinforce"]], [c[m]])))
    return combine(parts) if parts else Verdict(MISSING, "no REINFORCE with ST or REBAR runs at "
                                                "the same epochs", {})


def cp_best(records: Sequence[RunRecord], reading: Reading = AS_REPORTED) -> Verdict:
    parts = []
    for epochs, c in _approach_curves(_regression(records, reading)).items():
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


def cp_sgd(records: Sequence[RunRecord], reading: Reading = AS_REPORTED) -> Verdict:
    parts = [(f"{epochs} ep", worse_than_all([c["cp rmsprop"]], [c["cp sgd"]]))
             for epochs, c in _approach_curves(_regression(records, reading)).items()
             if {"cp rmsprop", "cp sgd"} <= set(c)]
    return combine(parts) if parts else Verdict(MISSING, "no CP runs with both optimizers", {})


