"""The tables of ``python -m analysis.scale_report``: ``agreement.md`` / ``.csv`` (each claim's
verdict, its robustness under every reading, each sub-verdict on its own line, the scale of each
experiment next to the paper's), the per-claim CSVs, the console lines, and the table of rows
1-8 across studies of different training lengths (``training_length.md`` / ``.csv``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from analysis.scale.claims import SCALE_CLAIMS
from analysis.scale.family import ALPHA, Family, family_wise
from analysis.scale.front_verdict import SAFETY
from analysis.scale.gap_test import LEVEL, POWER
from analysis.scale.robust import FRAGILE, ROBUST, UNJUDGED, Judged, StudyRow
from analysis.scale.runs import (
    ACC_FLOOR,
    READINGS,
    SCALE_OUTCOMES,
    RunRecord,
    leaves,
    warnings_of,
)

#: The paper's scale of each experiment (`sec:app_supermask_setup`,
#: `sec:app_joint_pruning_setup`, `sec:app_maskednnregression`).
PAPER_SCALE = {
    "supermask": "LeNet/MNIST and Conv6/CIFAR-10; 200 epochs; 5 seeds; n in {2, 10, 100}; "
                 "lambda 1e-1..1e-5",
    "joint": "ResNet-20 and VGG-19/CIFAR-10; 200 epochs; 5 seeds; n in {2, 10, 100}; "
             "lambda 1e-1..1e-8 (CP to 1e-10)",
    "regression": "MaskedNNRegression (d = 8,050); 300 epochs; 10 seeds; n in {2, 10, 100, "
                  "1000}",
}
#: What each reading changes, for the notes under the tables.
READING_NOTES = {
    "floor_0.5": "a setting whose median accuracy is below 0.5 (the floor's first value) is on "
                 "no front",
    "safety_2": f"the interpolation allowance at 2 times the parabolas' disagreement instead of "
                f"{SAFETY:g}",
    "safety_4": f"the interpolation allowance at 4 times the parabolas' disagreement instead of "
                f"{SAFETY:g}",
    "leave_one_out": "the row judged again without each setting of its experiment in turn; the "
                     "first outcome that differs, with the settings that change it",
    "pooled": "the seeds of the two methods are not paired (every pair of seeds, the two-sample "
              "s.e., instead of the paired t)",
    "balanced": "only the seeds that every setting run with several seeds has",
}
NOT_APPLIED = "n/a"


def fmt(x) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def scale_text(records: Sequence[RunRecord], experiment: str) -> str:
    """Our scale of an experiment: model and data, epochs, seeds per setting, n and lambda."""
    rs = [r for r in records if r.experiment == experiment]
    if not rs:
        return "not run"
    seeds: dict[str, set[int]] = {}
    for r in rs:
        seeds.setdefault(r.setting, set()).add(r.seed)
    k = sorted({len(s) for s in seeds.values()})
    epochs = sorted({int(r.get("epochs")) for r in rs})
    ns = sorted({int(r.get("n")) for r in rs if r.info.uses("n") and r.get("n") is not None
                 and (experiment == "regression" or r.info.samples)})
    if experiment == "regression":
        model = "MaskedNNRegression (d = 8,050)"
    else:
        model = ", ".join(sorted({f"{r.get('model')}/{r.get('dataset')}" for r in rs}))
        if any(r.get("mask_head") for r in rs):
            model += " (head masked)"
    lams = sorted({float(r.get("lam")) for r in rs if experiment != "regression"
                   and r.info.uses("lam") and r.get("lam")})
    text = (f"{model}; {'/'.join(map(str, epochs))} epochs; "
            f"{'-'.join(map(str, sorted({k[0], k[-1]})))} seeds per setting; "
            + (f"n in {{{', '.join(map(str, ns))}}}" if ns else "no MC runs"))
    if lams:
        text += f"; lambda {lams[-1]:g}..{lams[0]:g}"
    div = sum(r.diverged is not None for r in rs)
    return f"{text}; {len(rs)} runs" + (f" ({div} diverged)" if div else "")


def cell(text: str) -> str:
    """Text for a Markdown table cell."""
    return text.replace("|", "/")


def reading_cells(j: Judged) -> list[str]:
    return [NOT_APPLIED if j.readings.get(r.key) is None else j.readings[r.key]
            for r in READINGS]


def verdict_table(judged: Sequence[Judged], head: str, family: Family) -> list[str]:
    """The verdicts: outcome, family-wise outcome, the outcome under each reading, robust or
    fragile."""
    cols = ["#", head, "outcome", "family-wise", *(r.title for r in READINGS), "robustness"]
    lines = ["", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for j in judged:
        rob = f"**{FRAGILE}**" if j.robustness == FRAGILE else j.robustness
        lines.append(f"| {j.claim.bullet} | {cell(j.claim.paper)} | **{j.verdict.outcome}** | "
                     f"{family.rows[j.claim.key]} | " + " | ".join(reading_cells(j))
                     + f" | {rob} |")
    return lines


def numbers_table(judged: Sequence[Judged]) -> list[str]:
    """One line per sub-verdict of each row (as reported): its part, outcome and numbers."""
    lines = ["", "| # | part | outcome | numbers |", "| --- | --- | --- | --- |"]
    for j in judged:
        for name, v in leaves(j.verdict):
            lines.append(f"| {j.claim.bullet} | {cell(name) or '-'} | {v.outcome} | "
                         f"{cell(v.detail)} |")
    return lines


def how_text(values: dict) -> str:
    """How a front gap was tested: ``paired, 5 seeds`` or ``all pairs of seeds``."""
    if values.get("paired"):
        return f"paired, {int(values['paired'])} seeds"
    return "all pairs of seeds"


def gaps_table(judged: Sequence[Judged], family: Family) -> list[str]:
    """One line per front comparison of each row (as reported): the gap, its 95% interval with
    the interpolation allowance counted, the allowance, the gap detectable at 80% power, the
    budgets it was read at, how it was tested, Holm's adjusted p-value and the family-wise
    outcome; a comparison without a gap (no shared budget) says why in its outcome."""
    lines = ["", f"| # | part | outcome | gap | {LEVEL:.0%} CI | allowance | detectable "
             f"({POWER:.0%}) | remaining | test | p (Holm) | family-wise |",
             "|" + " --- |" * 11]
    for j in judged:
        for name, v in leaves(j.verdict):
            x = v.values
            if "p_value" not in x:
                continue
            fam = family.part(j.claim.key, name)
            tail = f"{fam.adjusted:.3g} | {fam.family_outcome} |" if fam else "- | - |"
            if "gap_mean" not in x:
                lines.append(f"| {j.claim.bullet} | {cell(name) or '-'} | {v.outcome} | - | - | "
                             f"- | - | - | - | {tail}")
                continue
            det = "-" if math.isnan(x["detectable"]) else f"{x['detectable']:.4f}"
            lines.append(f"| {j.claim.bullet} | {cell(name) or '-'} | {v.outcome} | "
                         f"{x['gap_mean']:+.4f} | [{x['ci_low']:+.4f}, {x['ci_high']:+.4f}] | "
                         f"{x['allowance']:.4f} | {det} | "
                         f"{x['range_lo']:.2%}..{x['range_hi']:.2%} | {how_text(x)} | {tail}")
    return lines if len(lines) > 3 else []


def note_lines(judged: Sequence[Judged]) -> list[str]:
    """The readings' notes (the settings whose omission changes a verdict), one per row."""
    titles = {r.key: r.title for r in READINGS}
    return [f"- {j.claim.bullet} `{j.claim.key}`, {titles[k]}: {note}" for j in judged
            for k, note in j.notes.items()]


def counts(judged: Sequence[Judged]) -> str:
    outcomes = ", ".join(f"{sum(j.verdict.outcome == o for j in judged)} {o}"
                         for o in SCALE_OUTCOMES)
    kinds = [j.robustness for j in judged]
    unjudged = kinds.count(UNJUDGED)
    return (f"{outcomes}; {kinds.count(ROBUST)} {ROBUST}, {kinds.count(FRAGILE)} {FRAGILE}"
            + (f", {unjudged} {UNJUDGED}" if unjudged else ""))


def markdown(judged: Sequence[Judged], scales: dict[str, str], n_runs: int,
             n_diverged: int = 0) -> str:
    """agreement.md: verdicts with their robustness, the numbers of every sub-verdict, the
    scale of each experiment next to the paper's, the readings and the criteria."""
    beyond = {c.key for c in SCALE_CLAIMS if c.beyond}
    family = family_wise(judged)
    paper = [j for j in judged if j.claim.key not in beyond]
    diverged = f" ({n_diverged} of them diverged)" if n_diverged else ""
    extra = [j for j in judged if j.claim.key in beyond]
    lines = ["# Supermask, pruning and NN-regression rows of tab:app_results_summ",
             "",
             f"Generated by `python -m analysis.scale_report` from {n_runs} runs{diverged} "
             f"(`runs/` next to this file). The paper's rows: {counts(paper)}. A row is "
             f"{ROBUST} when every reading that acts on it (below) gives its outcome, "
             f"{FRAGILE} otherwise, {UNJUDGED} when no reading has data for it; "
             f"{NOT_APPLIED}: the reading does not act on the row."]
    lines += verdict_table(paper, "paper", family)
    lines += ["", f"Family-wise: Holm's rule over all {len(family.parts)} front comparisons of "
              f"this report (rows beyond the paper included) at {ALPHA:.0%}; a comparison decided "
              "alone but not by the rule reads noise (analysis/scale/family.py)."]
    gaps = gaps_table(paper, family)
    if gaps:
        lines += ["", "### Gaps", "", "Each front comparison (as reported): the gap of the first "
                  "method's front over the second's at the budgets where both fronts have runs, "
                  "its interval (the seeds' t interval widened by the interpolation allowance), "
                  "the allowance, the smallest gap the design detects with probability "
                  f"{POWER:.0%}, Holm's adjusted p-value and the family-wise outcome."]
        lines += gaps
    notes = note_lines(paper)
    if notes:
        lines += ["", "### Settings that change a verdict when left out", "", *notes]
    lines += ["", "### Numbers", "", "Each sub-verdict of a row on its own line (as reported)."]
    lines += numbers_table(paper)
    if extra:
        lines += ["", "## Beyond the paper", "",
                  "Methods the paper does not run (docs/beyond.md), each front set against "
                  f"CP's: {counts(extra)}."]
        lines += verdict_table(extra, "statement", family)
        lines += gaps_table(extra, family)
        notes = note_lines(extra)
        if notes:
            lines += ["", *notes]
        lines += numbers_table(extra)
    lines += ["", "## Scale", "", "| experiment | ours | paper's |", "| --- | --- | --- |"]
    for exp in dict.fromkeys(j.claim.experiment for j in judged):
        lines.append(f"| {exp} | {scales[exp]} | {PAPER_SCALE[exp]} |")
    lines += ["", "## Readings", "",
              "The outcome column is the reported reading (accuracy floor "
              f"{ACC_FLOOR:g}, fronts chosen on held-out seeds and compared at matched budgets "
              f"with an interpolation allowance of {SAFETY:g} times the parabolas' "
              f"disagreement, seeds paired, every seed; {LEVEL:.0%} t interval, detectable gap at "
              f"{POWER:.0%} power). The "
              "others change one thing; one that gives the reported numbers did not act on the "
              f"row ({NOT_APPLIED}):", ""]
    for r in READINGS:
        lines.append(f"- {r.title}: {READING_NOTES[r.key]}")
    lines += ["", "## Criteria", ""]
    lines += [f"- {j.claim.bullet} `{j.claim.key}`: {j.claim.criterion}" for j in judged]
    return "\n".join(lines) + "\n"


def agreement_rows(judged: Sequence[Judged], scales: dict[str, str]) -> tuple[list[str], list]:
    """agreement.csv: header and rows."""
    family = family_wise(judged)
    cols = ["bullet", "claim", "row", "paper", "criterion", "outcome", "family_wise",
            *(f"reading_{r.key}" for r in READINGS), "robustness", "detail", "our_scale",
            "paper_scale"]
    rows = [[j.claim.bullet, j.claim.key, j.claim.row, j.claim.paper, j.claim.criterion,
             j.verdict.outcome, family.rows[j.claim.key], *reading_cells(j), j.robustness,
             j.verdict.detail, scales[j.claim.experiment], PAPER_SCALE[j.claim.experiment]]
            for j in judged]
    return cols, rows


def claim_rows(j: Judged) -> list[list[str]]:
    """claims/<claim>.csv: outcome, robustness, each reading, detail, criterion, the numbers."""
    body = [["outcome", j.verdict.outcome], ["robustness", j.robustness]]
    body += [[f"reading_{r.key}", c] for r, c in zip(READINGS, reading_cells(j))]
    body += [["detail", j.verdict.detail], ["criterion", j.claim.criterion]]
    body += [[k, fmt(float(v))] for k, v in sorted(j.verdict.values.items())]
    return body


def console_lines(judged: Sequence[Judged]) -> list[str]:
    """Each row: outcome and robustness (the disagreeing readings named), then each
    sub-verdict on its own line, in full."""
    titles = {r.key: r.title for r in READINGS}
    family = family_wise(judged)
    out = []
    for j in judged:
        why = ", ".join(f"{titles[k]}: {j.readings[k]}" for k in j.disagreeing())
        fw = family.rows[j.claim.key]
        out.append(f"{j.claim.bullet:>2} {j.claim.key:<26} {j.verdict.outcome:<11} "
                   f"{j.robustness}" + (f" ({why})" if why else "")
                   + (f"; family-wise {fw}" if fw != j.verdict.outcome else ""))
        out += [f"     {titles[k]}: {note}" for k, note in j.notes.items()]
        for name, v in leaves(j.verdict):
            out.append(f"     {name + ': ' if name else ''}{v.outcome}: {v.detail}")
    return out


def warning_lines(judged: Sequence[Judged]) -> list[str]:
    return [f"warning: row {j.claim.bullet}: {w}" for j in judged
            for w in warnings_of(j.verdict)]


# ------------------------------------------------------------------- training length


def study_cell(epochs: str, j: Judged) -> str:
    if j.robustness == UNJUDGED:
        return f"{j.verdict.outcome} ({epochs})"
    return f"{j.verdict.outcome}, {j.robustness} ({epochs})"


def length_markdown(rows: Sequence[StudyRow], sources: Sequence[tuple[str, str, int]]) -> str:
    """training_length.md: the pruning rows' verdict (1-8, 12-14) in each study, side by side,
    and the rows whose verdict changed. ``sources``: (study, its runs folder, runs read) each."""
    names = [s for s, _, _ in sources]
    lines = ["# Rows 1-8 and 12-14 of tab:app_results_summ by training length", "",
             "Generated by `python -m analysis.scale_report --baseline ...`: each study's "
             "verdict of the supermask and joint-pruning rows (the paper's and those beyond it), "
             "with its robustness "
             "(robust: every reading of agreement.md gives the same outcome) and the epochs its "
             "runs trained. Studies: " + "; ".join(
                 f"{s} (`{folder}`, {n} runs)" for s, folder, n in sources) + ".",
             "", "| # | paper | " + " | ".join(names) + " | changed |",
             "|" + " --- |" * (len(names) + 3)]
    for row in rows:
        lines.append(f"| {row.claim.bullet} | {cell(row.claim.paper)} | " + " | ".join(
            study_cell(e, j) for _, e, j in row.cells) + f" | {changed_cell(row)} |")
    changed = [row for row in rows if row.changed]
    lines += ["", "Rows whose verdict changed: " + ("; ".join(
        f"{row.claim.bullet} (" + ", ".join(f"{s} {j.verdict.outcome}" for s, _, j in row.cells)
        + ")" for row in changed) if changed else "none") + "."]
    unknown = [row.claim.bullet for row in rows if not row.compared]
    if unknown:
        lines.append("Rows not compared (fewer than two studies have data for them): "
                     + ", ".join(map(str, unknown)) + ".")
    return "\n".join(lines) + "\n"


def changed_cell(row: StudyRow) -> str:
    """yes / no, or "not compared" where fewer than two studies have data for the row."""
    if not row.compared:
        return "not compared"
    return "yes" if row.changed else "no"


def length_rows(rows: Sequence[StudyRow]) -> tuple[list[str], list[list]]:
    """training_length.csv: header and rows."""
    names = [s for s, _, _ in rows[0].cells] if rows else []
    cols = ["bullet", "claim", "paper"]
    for s in names:
        cols += [f"{s}_epochs", f"{s}_outcome", f"{s}_robustness", f"{s}_readings"]
    cols.append("changed")
    titles = {r.key: r.title for r in READINGS}
    out = []
    for row in rows:
        line: list = [row.claim.bullet, row.claim.key, row.claim.paper]
        for _, e, j in row.cells:
            line += [e, j.verdict.outcome, j.robustness, "; ".join(
                f"{titles[k]}: {o}" for k, o in j.readings.items() if o is not None)]
        out.append(line + [int(row.changed) if row.compared else ""])
    return cols, out
