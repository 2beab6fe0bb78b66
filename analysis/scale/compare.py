"""``python -m analysis.scale_report --compare A B``: does A beat B at matched sparsity on one's
own runs? The claims' front statistic (:func:`analysis.scale.fronts.better_front`) with the
claims' robustness readings (:func:`analysis.scale.robust.judge_claim`), per pruning experiment
and training budget; it writes nothing.

A and B are a method (``cp``), a group as ``points_*.csv`` names it (``cp rmsprop``, ``arms
escort n=2 rmsprop``), a method's recorded label, or a family (:data:`FAMILIES`: ``mc``, every
MC estimator). The answer says what each name covers, the budgets it compared, and the runs it
left out and why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from analysis.scale.claims import ScaleClaim
from analysis.scale.fronts import better_front
from analysis.scale.robust import judge_claim
from analysis.scale.run_files import budget_text
from analysis.scale.runs import (
    READINGS,
    Reading,
    RunRecord,
    by_budget,
    finished,
    group_label,
    leaves,
    legend_label,
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


def compare(records: Sequence[RunRecord], a: str, b: str,
            readings: Sequence[Reading] = READINGS) -> list[str]:
    """``--compare A B``: per pruning experiment where both have runs, "A performed better than
    B" by the claims' front statistic, with its robustness, the budgets compared and the runs
    left out."""
    lines = [f"does {a} beat {b} at matched sparsity? (the claims' front statistic: each seed's "
             "front interpolated in log remaining, the mean gap over the common range paired by "
             "seed, its 95% t interval)", coverage(records, a), coverage(records, b)]
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
                                [r for r in rs if matches(r, b)], a, b, reading=reading,
                                pool=[r for r in rs if r.experiment == exp])

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
    lines += skipped
    if not answered:
        have = sorted({g for r in records if r.experiment in PRUNING
                       for g in (r.method, group_label(r))} | set(FAMILIES))
        raise PBInputError(f"{a} and {b} have no finished pruning runs in one experiment; choose "
                           f"from {', '.join(have)}")
    return lines
