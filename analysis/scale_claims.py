"""The supermask, pruning and NN-regression rows of `tab:app_results_summ` (the 11 bullets of the
claims study), each a predicate over plain run data: a list of :class:`RunRecord` (one finished
run each, :mod:`analysis.scale_runs`), not over one microworld instance.

Pruning claims compare Pareto fronts (:func:`analysis.scale_runs.better_front`) and per-layer
allocations (total-variation distances); regression claims compare final validation losses over
seeds as the microworld claims do (:func:`analysis.claims.compare`). :data:`SCALE_CLAIMS` lists
them in table order; :func:`evaluate_scale` runs them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from analysis.claims import (
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
from analysis.pareto import MC as PRUNE_MC
from analysis.scale_runs import (
    ACC_FLOOR,
    FALLBACK_SE,
    GRID_POINTS,
    MISSING,
    MUCH_ACC,
    Point,
    RunRecord,
    better_front,
    combine,
    front,
    points,
    tv_distance,
    useful,
)

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


def joint_fronts(records: Sequence[RunRecord]) -> dict[str, list[Point]]:
    """{CP, MC, GMP: the joint-pruning front points with accuracy >= ACC_FLOOR}, sorted by
    remaining (:func:`analysis.scale_runs.useful`)."""
    return {name: useful(front(points(_sel(records, "joint", method=methods))))
            for name, methods in ALLOCATION_METHODS}


def _joint_solutions_differ(records: Sequence[RunRecord]) -> Verdict:
    fronts = joint_fronts(records)
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
    fronts = joint_fronts(records)
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
    zs = z_score(worse, better)
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


# ------------------------------------------------------------------- beyond the paper (12-14)

#: Supermask methods beyond the paper (docs/beyond.md), each set against CP: (method, label,
#: source).
BEYOND = (("st-theta", "ST on theta", "straight-through on the probabilities"),
          ("hardconcrete", "Hard-concrete", "Louizos, Welling, Kingma 2018"),
          ("edgepopup", "Edge-popup", "Ramanujan et al. 2020"))


def _beyond_vs_cp(method: str, label: str) -> Callable[[Sequence[RunRecord]], Verdict]:
    def evaluate(records: Sequence[RunRecord]) -> Verdict:
        return better_front(_sel(records, "supermask", method=method),
                            _sel(records, "supermask", method="cp"), label, "CP")
    return evaluate


@dataclass(frozen=True)
class ScaleClaim:
    """One supermask / pruning / NN-regression conclusion of `tab:app_results_summ`: ``bullet``
    is its number in the list of the study (1-11; 12 on: rows beyond the paper, ``beyond``),
    ``experiment`` the runs it reads."""

    key: str
    bullet: int
    row: str
    paper: str
    criterion: str
    experiment: str
    evaluate: Callable[[Sequence[RunRecord]], Verdict]
    beyond: bool = False


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
        *(ScaleClaim(f"sm_{method.replace('-', '_')}_vs_cp", 12 + i, "supermask: beyond the paper",
                     f"{label} performed better than CP ({source})",
                     f"{label} front better than the CP front (both optimizers) ({_FRONT})",
                     "supermask", _beyond_vs_cp(method, label), beyond=True)
          for i, (method, label, source) in enumerate(BEYOND)),
    ]


#: The supermask, pruning and NN-regression claims, in table order.
SCALE_CLAIMS: tuple[ScaleClaim, ...] = tuple(_build_scale())


def evaluate_scale(records: Sequence[RunRecord],
                   experiments: Iterable[str] | None = None) -> list[tuple[ScaleClaim, Verdict]]:
    """Every scale claim (of ``experiments``, default all) on the records."""
    chosen = None if experiments is None else set(experiments)
    return [(c, c.evaluate(records)) for c in SCALE_CLAIMS
            if chosen is None or c.experiment in chosen]
