"""Do the paper's supermask, pruning and NN-regression conclusions hold? (`tab:app_results_summ`)

    python -m analysis.scale_report --runs runs/claims --out figures/claims
    python -m analysis.scale_report --replot --out figures/claims
    python -m analysis.scale_report --runs my/runs --compare cp arms
    python -m analysis.scale_report --replot --out figures/claims20 --baseline figures/claims

Reads finished run folders of ``python -m pbscale.prune`` (supermask and joint) and
``python -m pbscale.regress`` (MaskedNNRegression) under --runs (at any depth; the sweeps
``sweeps/claims_*.toml`` write them), copies their small files (``config.json``, ``metrics.csv``
or ``history.csv``, ``summary.json``; not checkpoints or masks) to ``OUT/runs/<name of the --runs
folder>/`` (two --runs folders of one name: ``<parent>-<name>`` each; a different run already
under that name is refused, never overwritten) and, from those copies only, evaluates every claim
of :data:`analysis.scale.claims.SCALE_CLAIMS`, as reported and under each robustness reading
(:mod:`analysis.scale.robust`). ``--replot`` skips the copy, so a fresh clone redraws the
committed tables and figures from the committed files. A damaged run folder is skipped with one
warning line. Writes, under --out:

* ``agreement.md`` / ``agreement.csv``: per claim the paper's wording, the criterion, the outcome
  (holds / fails / noise / no data), its outcome under each reading and whether it is robust,
  each sub-verdict with its numbers on its own line, and the scale it was run at next to the
  paper's (model, data, epochs, seeds, n);
* ``claims/<claim>.csv``: the numbers behind each verdict;
* ``points_<experiment>.csv``: every pruning setting (seed means: remaining fraction, test
  accuracy, its seed s.d., on its group's Pareto front or not, distance of its per-layer
  allocation from the dense one) and ``points_regression.csv`` (final validation loss per
  setting);
* ``pareto_<experiment>.png``: test accuracy against weights remaining, one front per group;
* ``hyper_generalization.png`` / ``.csv``: supermask MC settings run at two or more n, linked
  across n (`fig:app_hyper_gen_scatter`, `fig:app_hyper_gen_parallel`), with the console's
  reading of the paper's observation (:mod:`analysis.scale.hyper`);
* ``layers_over_training.png`` / ``.csv``: remaining weights per layer over training (left: the
  fraction left in each layer; right: each layer's share of the weights left) for one joint run
  of CP, MC and GMP at matched sparsity (`sec:sparsities_throughout`): the sparsest MC front run
  with accuracy >= ``ACC_FLOOR`` and the CP and GMP front runs nearest to it;
* with ``--baseline STUDY...``: ``training_length.md`` / ``.csv``, rows 1-8's verdicts in each
  baseline study (its ``runs/`` folder) beside this one's, and the rows that changed.

``--compare A B`` answers "does A beat B on these runs at matched sparsity?" with the claims'
front criterion (A, B: a method name, a group such as ``cp rmsprop``, or a recorded label), per
experiment and training budget, with its robustness; it writes nothing.

This module reads the options; the work is :func:`analysis.scale.study_report.run_report`'s
(``python -m analysis.report`` runs the scale rows through it too).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from analysis.cli import run
from analysis.scale.outputs import out_folder
from analysis.scale.study_report import EXPERIMENTS, parse_experiments, run_report
from pbexact.cli import ArgumentParser


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m analysis.scale_report",
                       description=__doc__.split("\n\n")[0],
                       epilog="The run folders come from python -m pbscale.sweep run "
                              "sweeps/claims_*.toml (see each file's header for its cost).")
    p.add_argument("--runs", type=out_folder, nargs="+", default=None,
                   help="folders holding finished run folders (searched at any depth)")
    p.add_argument("--out", type=out_folder, default=Path("results/claims"),
                   help="folder for the tables, figures and the copied run files (the "
                        "committed study: figures/claims)")
    p.add_argument("--experiments", default=",".join(EXPERIMENTS),
                   help="comma-separated subset of " + ", ".join(EXPERIMENTS))
    p.add_argument("--replot", action="store_true",
                   help="only redraw from OUT/runs (no --runs, nothing copied)")
    p.add_argument("--baseline", type=out_folder, nargs="+", default=(), metavar="STUDY",
                   help="other studies' --out folders (their runs/): write "
                        "training_length.md/.csv, rows 1-8 of each beside this one's")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                   help="only answer: does A beat B at matched sparsity on the --runs (or, "
                        "with --replot, OUT/runs)? A, B: a method, a group (\"cp rmsprop\") "
                        "or a label; writes nothing")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    experiments = parse_experiments(args.experiments)
    return run_report(args.runs, args.out, experiments, args.replot, args.baseline,
                      args.compare)


if __name__ == "__main__":
    raise SystemExit(run(main))
