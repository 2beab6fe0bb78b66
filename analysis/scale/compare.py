"""``python -m analysis.scale_report --compare A B``: does A beat B at matched sparsity on one's
own runs? The claims' front statistic (:func:`analysis.scale.fronts.better_front`) with the
claims' robustness readings (:func:`analysis.scale.robust.judge_claim`), per pruning experiment
and training budget; it writes nothing.

A and B are a method (``cp``), a group as ``points_*.csv`` names it (``cp rmsprop``, ``arms
escort n=2 rmsprop``), a method's recorded label, or a family (:data:`FAMILIES`: ``mc``, every
MC estimator). The answer says what each name covers, the budgets it compared, and the runs it
left out and why.

``python -m analysis.pareto --compare A B`` asks the same of two of its series (labels as its
``runs.csv`` names them), per model and mode, with the front comparison alone
(:func:`compare_series`, on the rows of :mod:`analysis.scale.pareto_rows`; ``compare.csv``'s
columns :data:`COMPARE_COLUMNS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from analysis.scale.claims import ScaleClaim
from analysis.scale.front_verdict import compare_fronts
from analysis.scale.fronts import better_front, front
from analysis.scale.robust import judge_claim
from analysis.scale.run_files import budget_text
from analysis.scale.runs import (
    ACC_FLOOR,
    CANNOT_TELL,
    READINGS,
    Reading,
    RunRecord,
    by_budget,
    finished,
    group_label,
    leaves,
    legend_label,
    points,
)
from pbexact.errors import PBInputError

#: Names that cover several methods: name -> (what it covers, which runs).
FAMILIES: dict[str, tuple[str, Callable[[RunRecord], bool]]] = {
    "mc": ("every MC estimator (each method that samples its masks: the runs' own record)",
           lambda r: bool(r.info.samples)),
}
#: The pruning experiments --compare reads.
PRUNING = ("supermask", "joint")


def matches(r: RunRecord, name: str) -> bool:
    """Whether run r is one of ``name``'s: a family's, or its method, group or label."""
    if name in FAMILIES:
        return FAMILIES[name][1](r)
    return name in (r.method, r.info.label, group_label(r), legend_label(r))


def coverage(records: Sequence[RunRecord], name: str) -> str:
    """What a name covers on these runs: ``mc: every MC estimator ...: supermask: arms escort
    n=2 rmsprop, loorf ... (60 runs)``."""
    what = FAMILIES[name][0] if name in FAMILIES else "the method, group or label"
    parts = []
    for exp in PRUNING:
        rs = [r for r in records if r.experiment == exp and matches(r, name)]
        if rs:
            groups = sorted({group_label(r) for r in rs})
            parts.append(f"{exp}: {', '.join(groups)} ({len(rs)} runs)")
    return f"{name} = {what}: " + ("; ".join(parts) or "no pruning run")


def budgets_lines(ra: Sequence[RunRecord], rb: Sequence[RunRecord], a: str, b: str
                  ) -> list[str]:
    """The budgets compared and the runs left out for having no counterpart."""
    ga, gb = by_budget(ra), by_budget(rb)
    common = [k for k in ga if k in gb]
    every = [*ga, *gb]
    if common:
        used_a, used_b = common, common
        lines = [f"  compared at {', '.join(budget_text(k, every) for k in common)}"]
    else:
        used_a, used_b = [list(ga)[-1]], [list(gb)[-1]]
        lines = [f"  compared across budgets: {a} {budget_text(used_a[0], every)} against "
                 f"{b} {budget_text(used_b[0], every)} (no budget in common)"]
    for name, other, groups, used in ((a, b, ga, used_a), (b, a, gb, used_b)):
        for k, rs in groups.items():
            if k not in used:
                kinds = sorted({group_label(r) for r in rs})
                lines.append(f"  left out: {name} at {budget_text(k, every)} ({len(rs)} runs: "
                             f"{', '.join(kinds)}): {other} has no run of that budget")
    return lines


#: Two runs within this factor of each other's remaining fraction are at one budget (the
#: --lam-target controller's band is 10%).
SAME_BUDGET = 1.15


def _targets(rs: Sequence[RunRecord], floor: float = ACC_FLOOR) -> list[float]:
    """The remaining fractions of a side's front settings (seed means, accuracy >= floor), two
    significant digits."""
    pts = [p for p in front(points(rs)) if p.accuracy >= floor]
    return sorted({float(f"{p.remaining:.2g}") for p in pts})


def _spread(targets: Sequence[float]) -> list[float]:
    """Targets at least a factor 1.5 apart (the first of each close pair kept)."""
    out: list[float] = []
    for t in sorted(targets):
        if not out or t > 1.5 * out[-1]:
            out.append(t)
    return out


def reaches_by_construction(r: RunRecord) -> bool:
    """Whether run r's method reaches a remaining fraction by construction (it takes --target
    and has no L0 term): by what the run recorded, else by its registry family's current
    capabilities (a run made before runs recorded their settings lists, for some methods, an
    L0 weight its method never read)."""
    uses = r.info.settings if r.info is not None and r.info.source == "run" else None
    if uses is None:
        from pbscale.methods import REGISTRY

        fam = REGISTRY.get(r.method)
        uses = frozenset(fam.caps.uses) if fam is not None else (
            r.info.settings if r.info is not None and r.info.settings is not None
            else frozenset())
    return "target" in uses and "lam" not in uses


def command_for(r: RunRecord, target: str, seeds: str) -> str:
    """A ``python -m pbscale.prune`` line that reruns the setting of run r at the budget
    ``target`` (a shell word: a number or ``$t``) with ``seeds``: --target for a method that
    reaches a fraction by construction, else --lam-target from the run's lam."""
    s = r.settings
    parts = ["python -m pbscale.prune", f"--model {s.get('model')}", f"--mode {s.get('mode')}",
             f"--method {r.method}"]
    for k in sorted(r.info.settings) if r.info is not None else ():
        if k in ("lam", "target", "chunk") or s.get(k) is None:
            continue
        parts.append(f"--{k.replace('_', '-')} {s[k]:g}" if isinstance(s[k], float)
                     else f"--{k.replace('_', '-')} {s[k]}")
    for k in ("epochs", "batch_size", "max_batches"):
        if s.get(k):
            parts.append(f"--{k.replace('_', '-')} {s[k]}")
    if s.get("mask_head"):
        parts.append("--mask-head")
    if reaches_by_construction(r):
        parts.append(f"--target {target}")
    else:
        parts.append(f"--lam {s.get('lam', 1e-4):g} --lam-target {target}")
    parts.append(f"--seeds {seeds}")
    dataset = s.get("dataset")
    parts.append("--data FILE.npz" if dataset == "arrays" else "--data-dir DATA_DIR")
    return " ".join(parts)


def matched_budget_lines(ra: Sequence[RunRecord], rb: Sequence[RunRecord], a: str, b: str
                         ) -> list[str]:
    """For a comparison that cannot tell: the budgets both sides' fronts name, and for each side
    the ones it has no run at, as commands to paste (one setting of the side's front, each
    budget in turn)."""
    targets = _spread(set(_targets(ra)) | set(_targets(rb)))
    if not targets:
        return []
    lines = ["  cannot tell from these grids: run both sides at the same remaining fractions "
             f"({', '.join(f'{t:g}' for t in targets)}), then compare again:"]
    for name, rs in ((a, ra), (b, rb)):
        have = [r.remaining for r in finished(rs)]
        need = [t for t in targets
                if not any(abs(math.log(h / t)) <= math.log(SAME_BUDGET) for h in have if h > 0)]
        if not need:
            continue
        best = max(finished(rs), key=lambda r: (r.accuracy >= ACC_FLOOR, r.accuracy))
        seeds = sorted({r.seed for r in rs})
        span = (f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0] if seeds else 0))
        lines.append(f"  {name}: for t in {' '.join(f'{t:g}' for t in need)}; do "
                     f"{command_for(best, '$t', span)}; done")
    return lines


def compare(records: Sequence[RunRecord], a: str, b: str,
            readings: Sequence[Reading] = READINGS) -> list[str]:
    """``--compare A B``: per pruning experiment where both have runs, "A performed better than
    B" by the claims' front statistic, with its robustness, the budgets compared and the runs
    left out."""
    lines = [f"does {a} beat {b} at matched sparsity? (the claims' front comparison: each side's "
             "front chosen on its other seeds, compared where both have runs with an "
             "interpolation allowance, paired by seed, a 95% t interval)",
             coverage(records, a), coverage(records, b)]
    answered, skipped = False, []
    for exp in PRUNING:
        mine = [r for r in records if r.experiment == exp]
        ra = [r for r in mine if matches(r, a)]
        rb = [r for r in mine if matches(r, b)]
        if not finished(ra) or not finished(rb):
            if finished(ra) or finished(rb):  # one side only: say so, not a silent skip
                lacking = b if finished(ra) else a
                skipped.append(f"{exp}: not compared ({lacking} has no finished {exp} run)")
            continue
        both = [r for r in ra if any(r is q for q in rb)]
        if both:
            raise PBInputError(f"{a} and {b} share {len(both)} {exp} runs ({group_label(both[0])}"
                               " ...); choose names that do not overlap")
        answered = True

        def evaluate(rs: Sequence[RunRecord], reading: Reading, exp: str = exp
                     ) -> object:
            return better_front([r for r in rs if matches(r, a)],
                                [r for r in rs if matches(r, b)], a, b, reading=reading)

        claim = ScaleClaim("compare", 0, exp, f"{a} performed better than {b}", "", exp,
                           evaluate)
        j = judge_claim(claim, mine, readings)
        titles = {r.key: r.title for r in readings}
        bad = [f"{titles[k]}: {j.readings[k]}" for k in j.disagreeing()]
        lines.append(f"{exp}: {j.verdict.outcome}, " + (
            f"fragile ({'; '.join(bad)})" if bad else
            "robust (every reading that acts agrees)"))
        lines += [f"  {titles[k]}: {note}" for k, note in j.notes.items()]
        lines += [f"  {name + ': ' if name else ''}{pv.outcome}: {pv.detail}"
                  for name, pv in leaves(j.verdict)]
        lines += budgets_lines(ra, rb, a, b)
        if CANNOT_TELL in {pv.outcome for _, pv in leaves(j.verdict)}:
            lines += matched_budget_lines(ra, rb, a, b)
    lines += skipped
    if not answered:
        have = sorted({g for r in records if r.experiment in PRUNING
                       for g in (r.method, group_label(r))} | set(FAMILIES))
        raise PBInputError(f"{a} and {b} have no finished pruning runs in one experiment; choose "
                           f"from {', '.join(have)}")
    return lines


#: The columns of compare.csv.
COMPARE_COLUMNS = ("model", "mode", "a", "b", "verdict", "gap", "ci_low", "ci_high", "allowance",
                   "detectable", "budget_lo", "budget_hi", "seeds", "reason")


def runs_table(runs: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
    """One series' runs as (seeds, settings) arrays of remaining and test accuracy, NaN where a
    setting was not run with a seed or diverged (rows: the seeds in order)."""
    keys = sorted({r["key"] for r in runs})
    seeds = sorted({r["seed"] for r in runs})
    rem = np.full((len(seeds), len(keys)), np.nan)
    acc = np.full((len(seeds), len(keys)), np.nan)
    for r in runs:
        if r["diverged"] is None:
            i, j = seeds.index(r["seed"]), keys.index(r["key"])
            rem[i, j], acc[i, j] = r["remaining"], r["test_acc"]
    return rem, acc


def compare_series(runs: Sequence[dict], a: str, b: str) -> list[dict]:
    """``--compare A B``: per (model, mode) where both series have runs, the verdict of
    :func:`analysis.scale.front_verdict.compare_fronts` (seeds paired when both series were run
    with the same seeds)."""
    out = []
    labels = {r["label"] for r in runs}
    for name in (a, b):
        if name not in labels:
            raise PBInputError(f"--compare: no series {name!r} among the runs; choose from "
                               f"{', '.join(sorted(labels))}")
    for model, mode in sorted({(r["model"], r["mode"]) for r in runs}):
        mine = [r for r in runs if (r["model"], r["mode"]) == (model, mode)]
        ra, rb = ([r for r in mine if r["label"] == x] for x in (a, b))
        if not ra or not rb:
            continue
        same = sorted({r["seed"] for r in ra}) == sorted({r["seed"] for r in rb})
        c = compare_fronts(*runs_table(ra), *runs_table(rb), paired=same)
        out.append({"model": model, "mode": mode, "a": a, "b": b, "verdict": c.verdict,
                    "gap": c.gap, "ci_low": c.ci[0], "ci_high": c.ci[1],
                    "allowance": c.allowance, "detectable": c.detectable,
                    "budget_lo": c.budgets[0], "budget_hi": c.budgets[1],
                    "seeds": c.test.how if c.test is not None else "", "reason": c.reason})
    if not out:
        raise PBInputError(f"--compare: {a} and {b} have no runs of one model and mode; choose "
                           "two series of the same model and mode")
    return out
