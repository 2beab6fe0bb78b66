"""The scale report's work (``python -m analysis.scale_report``, and the scale rows of
``python -m analysis.report``): copy the small files of finished run folders to ``OUT/runs``
(:mod:`analysis.scale.study`), judge every claim of :data:`analysis.scale.claims.SCALE_CLAIMS`
from those copies only, as reported and under each robustness reading
(:mod:`analysis.scale.robust`), and write the agreement tables, the claims' numbers, the points
and figures (:mod:`analysis.scale.plots`) and, with baselines, the training-length table
(:func:`report`); or answer ``--compare A B`` and write nothing (:func:`run_report`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from analysis.scale.compare import compare
from analysis.scale.hyper import generalization_rows
from analysis.scale.outputs import Outputs, check_out
from analysis.scale.plots import chosen_runs, plot_hyper, plot_layers, plot_pareto, write_points
from analysis.scale.robust import by_study, judge
from analysis.scale.study import check_root, copy_small_files, load, study_records
from analysis.scale.tables import (
    agreement_rows,
    claim_rows,
    console_lines,
    length_markdown,
    length_rows,
    markdown,
    scale_text,
    warning_lines,
)
from pbexact.errors import PBInputError

#: The experiments of the scale rows, the claims' row groups.
EXPERIMENTS = ("supermask", "joint", "regression")


def parse_experiments(text: str) -> list[str]:
    """The experiments of a comma-separated ``--experiments`` (a subset of
    :data:`EXPERIMENTS`, in the order given); an unknown or empty one is a one-line error."""
    chosen = [e.strip() for e in text.split(",") if e.strip()]
    bad = [e for e in chosen if e not in EXPERIMENTS]
    if bad or not chosen:
        raise PBInputError(f"unknown experiment {bad[0] if bad else text!r}; choose from "
                           f"{', '.join(EXPERIMENTS)}")
    return chosen


def report(out: Path, experiments: Sequence[str], baselines: Sequence[Path] = ()) -> list:
    """Everything under ``out`` from the run files in ``out/runs`` (and, with ``baselines``,
    the training-length table); returns the judged claims
    (:class:`analysis.scale.robust.Judged`)."""
    runs_dir = out / "runs"
    if not runs_dir.is_dir():
        raise PBInputError(f"{runs_dir} does not exist; run without --replot and with --runs "
                           "first")
    loaded = load(runs_dir)
    records = [r for r, _ in loaded if r.experiment in experiments]
    judged = judge(records, experiments)
    scales = {e: scale_text(records, e) for e in EXPERIMENTS}
    files = Outputs(out)
    cols, rows = agreement_rows(judged, scales)
    files.csv("agreement.csv", cols, rows)
    files.text("agreement.md", markdown(judged, scales, len(records),
                                        sum(r.diverged is not None for r in records)))
    for j in judged:
        files.csv(Path("claims") / f"{j.claim.key}.csv", ["name", "value"], claim_rows(j))
    for exp in experiments:
        if any(r.experiment == exp for r in records):
            plotted = write_points(files, records, exp)
            if exp != "regression":
                plot_pareto(files, plotted, exp)
    hyper = generalization_rows(records) if "supermask" in experiments else []
    if hyper:
        for line in plot_hyper(files, hyper):
            print(f"hyperparameters across n: {line}")
    if "joint" in experiments:
        chosen = chosen_runs([(r, f) for r, f in loaded if r.experiment == "joint"])
        if chosen:
            plot_layers(files, chosen)
    if baselines:
        studies = [(b.resolve().name, study_records(b, experiments)) for b in baselines]
        studies.append((out.resolve().name, records))
        names = [s for s, _ in studies]
        if len(set(names)) < len(names):
            raise PBInputError(f"--baseline and --out folders share a name ({', '.join(names)}); "
                               "give each study a folder of its own name")
        sources = [(b.resolve().name, str(b / "runs" if (b / "runs").is_dir() else b), len(rs))
                   for b, (_, rs) in zip(baselines, studies)]
        sources.append((out.resolve().name, str(runs_dir), len(records)))
        length = by_study(studies, {out.resolve().name: judged})
        files.text("training_length.md", length_markdown(length, sources))
        files.csv("training_length.csv", *length_rows(length))
    files.write()
    return judged


def run_report(runs: Sequence[Path] | None, out: Path, experiments: Sequence[str],
               replot: bool = False, baselines: Sequence[Path] = (),
               compare_pair: Sequence[str] | None = None) -> int:
    """The scale report of ``python -m analysis.scale_report`` once its options are read (their
    flags name the arguments in the messages): with ``runs`` copy their small files to
    ``out/runs`` first (``replot``: redraw from there only), then :func:`report` into ``out``,
    the claims' lines on the console and their warnings on stderr; ``compare_pair`` (A, B):
    only print whether A beats B on ``runs`` (or ``out/runs``) and write nothing. Returns the
    exit code (0); bad input is a :class:`PBInputError` before anything is written."""
    if replot and runs:
        raise PBInputError("--replot redraws from OUT/runs only; drop --runs")
    if not replot and not runs:
        raise PBInputError("no --runs given; pass the folders holding the run folders, or "
                           "--replot")
    if compare_pair:
        if baselines:
            raise PBInputError("--compare writes nothing; drop --baseline")
        roots = runs or [out / "runs"]
        records = [r for root in roots for r, _ in load(check_root(root))
                   if r.experiment in experiments]
        for line in compare(records, *compare_pair):
            print(line)
        return 0
    for b in baselines:
        check_root(b, "--baseline")
    if replot and not (out / "runs").is_dir():  # before --out is created
        if out.exists() or out.is_symlink():
            check_out(out, "--out")  # a file, a link out: its own message
        raise PBInputError(f"{out / 'runs'} does not exist; run without --replot and with "
                           "--runs first")
    out = check_out(out, "--out")
    if runs and not replot:
        n = copy_small_files(runs, out)
        print(f"copied the small files of {n} run folders to {out / 'runs'}")
    judged = report(out, experiments, baselines)
    for line in console_lines(judged):
        print(line)
    for line in warning_lines(judged):
        print(line, file=sys.stderr)
    print(f"-> {out / 'agreement.md'}"
          + (f", {out / 'training_length.md'}" if baselines else ""))
    return 0
