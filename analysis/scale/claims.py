"""The supermask, pruning and NN-regression rows of `tab:app_results_summ` (the 11 bullets of the
claims study), each a predicate over plain run data: a list of :class:`RunRecord` (one finished
run each, :mod:`analysis.scale.runs`), not over one microworld instance, read as a
:class:`~analysis.scale.runs.Reading` says.

Pruning claims compare Pareto fronts (:func:`analysis.scale.runs.better_front`) and per-layer
allocations (total-variation distances); regression claims (:mod:`analysis.scale.regression`)
compare final validation losses over seeds as the microworld claims do
(:func:`analysis.microworld.claims.compare`). :data:`SCALE_CLAIMS` lists them in table order;
:func:`evaluate_scale` runs them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from analysis.microworld.claims import FAILS, HOLDS, NOISE, Verdict, Z
from analysis.scale.front_verdict import SAFETY
from analysis.scale.fronts import better_front, front, useful
from analysis.scale.gap_test import LEVEL, MUCH_ACC, POWER
from analysis.scale.regression import (
    CP,
    MUCH_REL,
    Evaluate,
    cp_best,
    cp_sgd,
    grad_helps,
    parametrizations,
    reinforce_much_worse,
)
from analysis.scale.runs import (
    ACC_FLOOR,
    AS_REPORTED,
    MISSING,
    Point,
    Reading,
    RunRecord,
    combine,
    finished,
    ns,
    per_budget,
    points,
    select,
    select_seeds,
    tv_distance,
)

#: Per-layer allocation: runs of two methods are matched when their remaining fractions differ by
#: at most this factor.
MATCH_FACTOR = 2.0
#: "Very different" allocations: total-variation distance between the shares of remaining
#: weights per layer of at least this (a tenth of the network's capacity reallocated).
VERY_TV = 0.10
#: Allocation standard error used when no setting has two or more seeds.
FALLBACK_TV_SE = 0.02


# ----------------------------------------------------------------------------- supermask (1-4)
# CP is named as data (the method the paper calls CP); the MC estimators are the methods whose
# runs record that they sample (``samples=True`` in :func:`analysis.scale.runs.select`).


def _mc_pair(key: str, a: str, b: str, label_a: str, label_b: str,
             matched_lr: bool = False) -> Evaluate:
    """Supermask MC runs with ``key`` == a against those with ``key`` == b, at every n both
    have; with ``matched_lr`` also at each mask learning rate both were run at (a part
    ``n=2, lr 0.01``): the grid's best of each against each other, and the two at one lr, so
    that a difference of learning rates is not read as one of ``key``."""
    def evaluate(records: Sequence[RunRecord], reading: Reading = AS_REPORTED) -> Verdict:
        mc = select(records, "supermask", samples=True)
        parts = []
        for n in ns(mc):
            ra = select(mc, "supermask", n=n, **{key: a})
            rb = select(mc, "supermask", n=n, **{key: b})
            if not (ra and rb):
                continue
            parts.append((f"n={n}", better_front(ra, rb, f"{label_a} n={n}",
                                                 f"{label_b} n={n}", reading=reading)))
            if not matched_lr:
                continue
            shared = sorted({r.get("mask_lr") for r in ra} & {r.get("mask_lr") for r in rb})
            if len({r.get("mask_lr") for r in ra + rb}) < 2:
                continue  # one lr: the grid's comparison is already matched
            for lr in shared:
                la, lb = (select(g, "supermask", mask_lr=lr) for g in (ra, rb))
                v = better_front(la, lb, f"{label_a} n={n} lr {lr:g}",
                                 f"{label_b} n={n} lr {lr:g}", reading=reading)
                if v.outcome != MISSING:  # a side below the floor at this lr: not compared
                    parts.append((f"n={n}, lr {lr:g}", v))
        return combine(parts) if parts else Verdict(
            MISSING, f"no {label_a} and {label_b} runs at one n", {})
    return evaluate


def _supermask_cp_mc(records: Sequence[RunRecord], reading: Reading = AS_REPORTED) -> Verdict:
    cp = select(records, "supermask", method=CP)
    mc = select(records, "supermask", samples=True)
    parts = [(f"n={n}", better_front(cp, select(mc, "supermask", n=n), "CP", f"MC n={n}",
                                     reading=reading))
             for n in ns(mc)]
    if 100 not in ns(mc):
        parts.append(("n=100", Verdict(MISSING, "no MC run with n = 100", {})))
    return combine(parts)


def _cp_optimizers(experiment: str, better: str, worse: str) -> Evaluate:
    def evaluate(records: Sequence[RunRecord], reading: Reading = AS_REPORTED) -> Verdict:
        a = select(records, experiment, method=CP, mask_opt=better)
        b = select(records, experiment, method=CP, mask_opt=worse)
        return better_front(a, b, f"CP {better}", f"CP {worse}", much=True, reading=reading)
    return evaluate


# ---------------------------------------------------------------------------- joint (5-8)

#: Claim 5's opponents of CP: (label, selection of the joint runs).
JOINT_OPPONENTS = (("MC", {"samples": True}), ("MP", {"method": "mp"}),
                   ("GMP", {"method": "gmp"}))


def _joint_cp_best(records: Sequence[RunRecord], reading: Reading = AS_REPORTED) -> Verdict:
    cp = select(records, "joint", method=CP)
    return combine([(name, better_front(cp, select(records, "joint", **want), "CP", name,
                                        reading=reading))
                    for name, want in JOINT_OPPONENTS])


#: The groups whose per-layer allocations claims 6 and 7 compare: (label, selection).
ALLOCATION_METHODS = (("CP", {"method": CP}), ("MC", {"samples": True}),
                      ("GMP", {"method": "gmp"}))


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
    """The seed spread of the allocation: the mean :attr:`Point.tv_sd` over the settings of two
    or more seeds; (FALLBACK_TV_SE, False) without such."""
    rep = [p.tv_sd for p in pts if p.seeds > 1 and math.isfinite(p.tv_sd)]
    return (float(np.mean(rep)), True) if rep else (FALLBACK_TV_SE, False)


def joint_fronts(records: Sequence[RunRecord], floor: float = ACC_FLOOR
                 ) -> dict[str, list[Point]]:
    """{CP, MC, GMP: the joint-pruning front points with accuracy >= floor}, sorted by
    remaining (:func:`analysis.scale.runs.useful`)."""
    return {name: useful(front(points(select(records, "joint", **want))), floor)
            for name, want in ALLOCATION_METHODS}


def solutions_differ(records: Sequence[RunRecord], reading: Reading = AS_REPORTED) -> Verdict:
    """Claim 6 on the joint runs of one training budget."""
    fronts = joint_fronts(select_seeds(records, reading), reading.acc_floor)
    present = [k for k, v in fronts.items() if v]
    if len(present) < 2:
        return Verdict(MISSING, "fewer than two of CP, MC, GMP have front points with accuracy "
                       f">= {reading.acc_floor:g}", {})
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


def _joint_solutions_differ(records: Sequence[RunRecord],
                            reading: Reading = AS_REPORTED) -> Verdict:
    return per_budget(select(records, "joint"), lambda rs: solutions_differ(rs, reading))


def allocation_se(se_mc: float, se_other: float, pairs: int) -> float:
    """Claim 7's standard error of the mean distance difference over ``pairs`` matched runs:
    sqrt(se_mc^2 + se_other^2) / sqrt(pairs) (each pair taken as an independent draw)."""
    return math.hypot(se_mc, se_other) / math.sqrt(pairs)


def mc_allocation(records: Sequence[RunRecord], reading: Reading = AS_REPORTED) -> Verdict:
    """Claim 7 on the joint runs of one training budget."""
    fronts = joint_fronts(select_seeds(records, reading), reading.acc_floor)
    if not fronts["MC"]:
        return Verdict(MISSING, f"no MC front point with accuracy >= {reading.acc_floor:g}", {})
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
        se = allocation_se(se_m, se_o, len(pairs))
        outcome = HOLDS if mean > Z * se else FAILS if mean < -Z * se else NOISE
        mc_d = float(np.mean([p.distance for p, _ in pairs]))
        o_d = float(np.mean([q.distance for _, q in pairs]))
        parts.append((other, Verdict(
            outcome, f"distance from the dense allocation (TV): {other} {o_d:.3f}, MC {mc_d:.3f} "
            f"over {len(pairs)} matched runs, difference {mean:+.3f} (s.e. {se:.3f}"
            + ("" if km and ko else ", fallback") + ")",
            {"tv_other": o_d, "tv_mc": mc_d, "diff": mean, "se": se})))
    return combine(parts)


def _joint_mc_allocation(records: Sequence[RunRecord],
                         reading: Reading = AS_REPORTED) -> Verdict:
    return per_budget(select(records, "joint"), lambda rs: mc_allocation(rs, reading))


# ------------------------------------------------------------------- beyond the paper (12-14)

#: Supermask methods beyond the paper (docs/beyond.md), each set against CP: (method, label,
#: source).
BEYOND = (("st-theta", "ST on theta", "straight-through on the probabilities"),
          ("hardconcrete", "Hard-concrete", "Louizos, Welling, Kingma 2018"),
          ("edgepopup", "Edge-popup", "Ramanujan et al. 2020"))


def _beyond_vs_cp(method: str, label: str) -> Evaluate:
    def evaluate(records: Sequence[RunRecord], reading: Reading = AS_REPORTED) -> Verdict:
        return better_front(select(records, "supermask", method=method),
                            select(records, "supermask", method=CP), label, "CP",
                            reading=reading)
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
    evaluate: Evaluate
    beyond: bool = False


def finished_only(evaluate: Evaluate) -> Evaluate:
    """A claim that reads finished runs only (the regression rows compare final losses)."""
    def only(records: Sequence[RunRecord], reading: Reading = AS_REPORTED) -> Verdict:
        return evaluate(finished(records), reading)
    return only


_FRONT = ("each side's front chosen per seed on its other seeds (medians; a setting below "
          f"accuracy {ACC_FLOOR:g} is on no front), compared only at the two fronts' runs inside "
          "the overlap of their spans, a side between two runs read through parabolas with "
          f"{SAFETY:g} times their disagreement as an interpolation allowance, the gap paired by "
          f"seed; better = its {LEVEL:.0%} t interval, widened by the allowance, above 0; cannot "
          "tell where the allowance or a lack of shared budgets leaves the sign open; noise "
          f"verdicts state the gap detectable at {POWER:.0%} power")
_REG = f"final validation loss higher by more than {Z:g} combined s.e. over seeds"


def _build_scale() -> list[ScaleClaim]:
    return [
        ScaleClaim("sm_arms_gt_loorf", 1, "supermask: estimators",
                   "ARMS performed marginally better than LOORF",
                   f"at every n run: ARMS front better than LOORF front ({_FRONT})",
                   "supermask", _mc_pair("method", "arms", "loorf", "ARMS", "LOORF")),
        ScaleClaim("sm_escort_gt_sigmoid", 2, "supermask: parametrization",
                   "Escort performed marginally better than sigmoid",
                   f"at every n run: escort front (ARMS and LOORF) better than sigmoid front, "
                   "over the grid's learning rates and at each mask lr both were run at (where "
                   "both reach the floor) "
                   f"({_FRONT})", "supermask",
                   _mc_pair("param", "escort", "sigmoid", "escort", "sigmoid", matched_lr=True)),
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
                   finished_only(reinforce_much_worse)),
        ScaleClaim("reg_cosine_slow_worse", 10, "NN regression: parametrization",
                   "Cosine was slower and converged to worse values",
                   "LOORF n=10, lr selected per parametrization: cosine takes the most epochs to "
                   f"90% of its mean curve's drop, and {_REG} than sigmoid and escort",
                   "regression", finished_only(parametrizations("cosine"))),
        ScaleClaim("reg_direct_fast_poor", 10, "NN regression: parametrization",
                   "Direct was fast and converged to poor values",
                   "LOORF n=10: direct reaches 90% of its drop in fewer epochs than cosine and "
                   f"sigmoid, and its {_REG} than sigmoid and escort", "regression",
                   finished_only(parametrizations("direct"))),
        ScaleClaim("reg_escort_sigmoid_well", 10, "NN regression: parametrization",
                   "Escort and sigmoid performed relatively well",
                   f"LOORF n=10: cosine and direct each {_REG} than sigmoid and than escort",
                   "regression", finished_only(parametrizations("well"))),
        ScaleClaim("reg_grad_helps", 11, "NN regression: approaches",
                   "grad_z J started becoming helpful for hybrid methods",
                   f"at each epochs run: REINFORCE n=10 {_REG} than ST and than REBAR (those "
                   "run; lr selected per method)", "regression", finished_only(grad_helps)),
        ScaleClaim("reg_cp_best", 11, "NN regression: approaches",
                   "CP performed the best, followed by ST and LOORF",
                   f"CP (optimizer and lr selected) better than ST, LOORF, REINFORCE, REBAR; ST "
                   f"and LOORF better than REINFORCE and REBAR ({_REG})", "regression",
                   finished_only(cp_best)),
        ScaleClaim("reg_cp_sgd", 11, "NN regression: approaches",
                   "CP performed well with SGD, but not with RMSprop",
                   f"CP RMSprop (lr selected) {_REG} than CP SGD (lr selected)", "regression",
                   finished_only(cp_sgd)),
        *(ScaleClaim(f"sm_{method.replace('-', '_')}_vs_cp", 12 + i, "supermask: beyond the paper",
                     f"{label} performed better than CP ({source})",
                     f"{label} front better than the CP front (both optimizers) ({_FRONT})",
                     "supermask", _beyond_vs_cp(method, label), beyond=True)
          for i, (method, label, source) in enumerate(BEYOND)),
    ]


#: The supermask, pruning and NN-regression claims, in table order.
SCALE_CLAIMS: tuple[ScaleClaim, ...] = tuple(_build_scale())


def evaluate_scale(records: Sequence[RunRecord], experiments: Iterable[str] | None = None,
                   reading: Reading = AS_REPORTED) -> list[tuple[ScaleClaim, Verdict]]:
    """Every scale claim (of ``experiments``, default all) on the records, as ``reading``
    reads them."""
    chosen = None if experiments is None else set(experiments)
    return [(c, c.evaluate(records, reading)) for c in SCALE_CLAIMS
            if chosen is None or c.experiment in chosen]
