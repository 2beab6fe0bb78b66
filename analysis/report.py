"""Do the microworld conclusions survive other instances? (`tab:app_results_summ`)

    python -m analysis.report --quick --out report_quick          # CI-sized check of the machinery
    python -m analysis.report --jobs 16 --results results/instances --out figures/instances
    python -m analysis.report --replot --results results/instances --out figures/instances

Runs the microworld experiments (:mod:`analysis.microworld`, called through its command line, one
process per unit; :mod:`analysis.microworld.units`) on several benchmark instances, evaluates every
claim of :mod:`analysis.microworld.claims` on each instance and writes, under --out:

* ``agreement.md`` / ``agreement.csv``: per claim and benchmark, on how many instances it holds,
  fails or is within noise, and instance 0's verdict with its numbers;
* ``claims/<claim>.csv``: per instance the verdict, its numbers and the text behind it;
* ``final_loss_<benchmark>.png`` / ``.csv``: each method's final mean loss per instance, normalized
  as (final - J(z*)) / (E_0.5[J] - J(z*)) (0: z*, 1: no progress from theta = 0.5;
  :mod:`analysis.microworld.plots`);
* ``instance0_check.csv``: instance 0's per-seed final losses against the committed microworld
  CSVs in --compare-with (same code and seeds must give the same numbers);
* ``units.csv``: the settings and wall time of every unit.

A unit is one (experiment, benchmark, instance, d); its results live in
--results/units/<unit>-<key>/, keyed by its settings (so units of other --seeds, --steps, --seed
or --log-every stay beside each other), and are reused when its recorded settings
(``unit.json``) match the requested ones, so an interrupted study resumes where it stopped.
Every option is checked before any folder is touched, and a unit that is recomputed replaces its
old folder only once it has succeeded. Ctrl-C or SIGTERM stops the running units (their worker
processes too) and ends with one line saying how many units are finished and how to resume,
exit code 130 or 143, like the training tools.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from analysis.cli import (
    atomic_write_text,
    check_out_dir,
    run,
    save_figure,
    stop_signals,
    write_csv,
)
from analysis.microworld.claims import CLAIMS, OUTCOMES, Claim, UnitResult, Verdict
from analysis.microworld.plots import plot_final_losses
from analysis.microworld.units import (
    BENCHMARKS,
    EXPERIMENTS,
    Settings,
    Unit,
    check_units,
    is_done,
    load_units,
    plan_units,
    run_units,
    unit_dir,
)
from analysis.scale.study_report import EXPERIMENTS as SCALE_EXPERIMENTS
from analysis.scale.study_report import run_report
from pbexact.cli import (
    ArgumentParser,
    int_at_least,
    int_in_range,
    nonneg_int,
    positive_int,
    seed_list_at_most,
    step_count,
)
from pbexact.errors import PBInputError

FIGURES_DIR = Path(__file__).resolve().parent.parent / "figures"
QUICK = dict(instances=[0, 1], seeds=5, steps=50)
#: The d values at which tab:app_results_summ has claims (--d takes one of them).
CLAIM_DS = tuple(sorted({c.d for c in CLAIMS}))
#: Most instances one study takes (each is up to 8 units of up to minutes each; the list is
#: refused before it is expanded).
MAX_INSTANCES = 1000

HELP_TIMES = """\
measured on this project's 2-core development machine (one process per unit; CPU seconds,
which other jobs inflate less than wall time; README "Do the conclusions survive other
instances?"):
  --quick (2 instances, 5 seeds, 50 steps, d=4 row included, --jobs 1): 21 CPU-s
  (143 s of wall time while the machine ran at a load of 13)
  one unit at the paper's scale (d=10, 100 seeds, 10,000 steps): estimators 33 CPU-s (37 s wall,
  quiet machine) per benchmark, params ~70 s per benchmark, approaches ~240 s (NNLoss only);
  d=4: estimators ~16 s per benchmark, approaches ~210 s
  full study (instances 0-9, 80 units): about 7,200 CPU-s (2 h in one process); with --jobs 16
  on 16 cores of this speed about 8 minutes (the longest unit is ~4 minutes). Interrupted runs
  resume: finished units are reused, so the study can be run in several calls.
"""


# ---------------------------------------------------------------------------------------------
# Tables


def evaluate_claims(claims: Sequence[Claim], loaded: dict[Unit, UnitResult]
                    ) -> dict[tuple[str, str], list[tuple[int, Verdict]]]:
    """Per (claim key, benchmark): the verdict on each instance run, by instance."""
    out: dict[tuple[str, str], list[tuple[int, Verdict]]] = {}
    for claim in claims:
        for bench in claim.benchmarks:
            rows = [(u.instance, claim.evaluate(r)) for u, r in loaded.items()
                    if u.experiment == claim.experiment and u.d == claim.d
                    and u.benchmark == bench]
            if rows:
                out[(claim.key, bench)] = sorted(rows, key=lambda t: t[0])
    return out


def summary_rows(claims: Sequence[Claim], verdicts: dict) -> list[dict]:
    rows = []
    for claim in claims:
        for bench in claim.benchmarks:
            if (claim.key, bench) not in verdicts:
                continue
            vs = verdicts[(claim.key, bench)]
            counts = {o: sum(v.outcome == o for _, v in vs) for o in OUTCOMES}
            inst0 = next((v for i, v in vs if i == 0), None)
            rows.append({
                "claim": claim.key, "row": claim.row, "paper": claim.paper,
                "criterion": claim.criterion, "d": claim.d, "benchmark": bench,
                "instances": len(vs), **counts,
                "holds_on": " ".join(str(i) for i, v in vs if v.outcome == "holds"),
                "instance0": inst0.outcome if inst0 else "",
                "instance0_detail": inst0.detail if inst0 else "",
            })
    return rows


def markdown_table(rows: list[dict], settings: Settings, instances: Sequence[int]) -> str:
    head = (f"Claims of `tab:app_results_summ` over instances {_ranges(instances)} "
            f"({settings.seeds} seeds, {settings.steps} steps; generated by "
            "`python -m analysis.report`; criteria in `analysis/microworld/claims.py`).\n\n"
            "| row | the paper | criterion | benchmark, d | holds | fails | noise | "
            "instance 0 |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
    lines, last = [], None
    for r in rows:
        bench = {"exponential": "Exponential", "nnloss": "NNLoss"}[r["benchmark"]]
        first = r["claim"] != last
        last = r["claim"]
        row, paper, crit = (r["row"], r["paper"], r["criterion"]) if first else ("", "", "")
        on = f" (on {r['holds_on']})" if r["holds_on"] else ""
        lines.append(f"| {row} | {paper} | {crit} | {bench}, {r['d']} | "
                     f"{r['holds']}/{r['instances']}{on} | {r['fails']} | {r['noise']} | "
                     f"{r['instance0']}: {r['instance0_detail']} |")
    return head + "\n".join(lines) + "\n"


def _ranges(xs: Sequence[int]) -> str:
    xs = sorted(xs)
    return f"{xs[0]}-{xs[-1]}" if xs == list(range(xs[0], xs[-1] + 1)) and len(xs) > 2 else \
        ", ".join(map(str, xs))


def write_claim_csvs(out: Path, claims: Sequence[Claim], verdicts: dict) -> None:
    """``claims/<claim>.csv`` for every claim evaluated; claim CSVs of an earlier study in the
    same folder that this one did not write are removed after the new ones are in place."""
    written = set()
    for claim in claims:
        rows, keys = [], []
        for bench in claim.benchmarks:
            for inst, v in verdicts.get((claim.key, bench), []):
                keys += [k for k in v.values if k not in keys]
                rows.append((bench, inst, v))
        if not rows:
            continue
        body = [[b, i, v.outcome, *[repr(float(v.values[k])) if k in v.values else ""
                                    for k in keys], v.detail] for b, i, v in rows]
        written.add(write_csv(out / "claims" / f"{claim.key}.csv",
                              ["benchmark", "instance", "outcome", *keys, "detail"], body).name)
    if (out / "claims").is_dir():
        for stale in (out / "claims").glob("*.csv"):
            if stale.name not in written:
                stale.unlink()


# ---------------------------------------------------------------------------------------------
# Final-loss figure and the instance-0 check


def normalized_rows(loaded: dict[Unit, UnitResult], d: int) -> list[dict]:
    rows = []
    for u, r in loaded.items():
        if u.d != d:
            continue
        span = r.start_J - r.min_J
        for c in r.configs:
            rows.append({
                "benchmark": u.benchmark, "experiment": u.experiment, "instance": u.instance,
                "method": c.label, "lr": c.lr, "seeds": c.final.size, "final_mean": c.mean,
                "final_stderr": c.stderr, "min_J": r.min_J, "E05_J": r.start_J,
                "normalized": (c.mean - r.min_J) / span if span > 0 else math.nan,
                "normalized_stderr": c.stderr / span if span > 0 else math.nan,
                "found_z_star": int(c.found.sum()),
            })
    return rows


def instance0_check(loaded: dict[Unit, UnitResult], results: Path, settings: Settings,
                    compare_with: Path) -> list[list]:
    """Instance 0's per-seed final losses against the committed microworld CSV of the same
    experiment, benchmark and d (if there is one and it has the same number of steps and seeds),
    for every config (all lrs). ``identical`` needs every reference value reproduced exactly;
    configs the reference lacks (a method added since it was written) are only counted."""
    rows = []
    for u in loaded:
        ref = compare_with / f"{u.stem}.csv"
        if u.instance != 0 or not ref.exists():
            continue
        mine = _finals(unit_dir(results, u, settings) / f"{u.stem}.csv")
        theirs = _finals(ref)
        if _shape(mine) != _shape(theirs):
            continue  # another scale (e.g. --quick): nothing to compare
        common = mine.keys() & theirs.keys()
        diff = max((abs(mine[k][0] - theirs[k][0]) for k in common), default=math.nan)
        found = sum(mine[k][1] != theirs[k][1] for k in common)
        rows.append([u.name, str(ref), len(mine), len(theirs), len(common), repr(diff), found,
                     int(len(common) == len(theirs) and diff == 0.0 and found == 0)])
    return rows


def _finals(path: Path) -> dict[tuple, tuple[float, str]]:
    """Per (method, n, param, lr, seed, last step): the final loss and found-z* flag."""
    out = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            if r["record"] == "final":
                out[(r["method"], r["n"], r["param"], float(r["lr"]), int(r["seed"]),
                     int(r["step"]))] = (float(r["value"]), r["found_z_star"])
    return out


def _shape(finals: dict) -> tuple[int, int]:
    """(steps, seeds) of a results CSV read by :func:`_finals`."""
    return (max(k[5] for k in finals), max(k[4] for k in finals) + 1) if finals else (0, 0)


# ---------------------------------------------------------------------------------------------
# Command line


#: "0-9" or "0,2,5" -> a sorted list of instance seeds (the shared argparse type).
parse_instances = seed_list_at_most(MAX_INSTANCES, "instances")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m analysis.report",
        description="Evaluate every microworld claim of tab:app_results_summ over several "
        "benchmark instances (analysis/microworld/claims.py) and write the agreement tables, "
        "per-claim CSVs and normalized final-loss figures.",
        epilog=HELP_TIMES,
    )
    p.add_argument("--instances", type=parse_instances, default="0-9",
                   help=f"instance seeds, a range or list such as 0-9 or 0,3 (at most "
                   f"{MAX_INSTANCES:,})")
    p.add_argument("--experiments", nargs="+", choices=EXPERIMENTS + SCALE_EXPERIMENTS,
                   default=list(EXPERIMENTS),
                   help="microworld experiments at --d; supermask, joint, regression: the scale "
                   "rows from run folders (python -m analysis.scale_report; see --scale-runs, "
                   "--scale-out)")
    p.add_argument("--scale-runs", type=Path, nargs="+", default=None,
                   help="scale rows: folders holding pruning/regression run folders (default: "
                   "redraw from --scale-out/runs; --scale-out figures/claims redraws the "
                   "committed study)")
    p.add_argument("--scale-out", type=Path, default=Path("results/claims"),
                   help="scale rows: output folder")
    p.add_argument("--d", type=int, choices=CLAIM_DS, default=max(CLAIM_DS),
                   help="bits (the paper's claims are at d = 10, and the d = 4 row)")
    p.add_argument("--no-d4", action="store_true", help="skip the d = 4 row")
    p.add_argument("--seeds", type=int_at_least(2), default=100,
                   help="seeds per method (>= 2: the claims compare standard errors)")
    p.add_argument("--steps", type=step_count(), default=10_000, help="SGD steps")
    p.add_argument("--seed", type=nonneg_int, default=0, help="random seed of the runs")
    p.add_argument("--log-every", type=positive_int, default=10,
                   help="logged iterations of estimators/params (approaches always logs every "
                   "step, its lr selection averages the logged curve)")
    p.add_argument("--quick", action="store_true",
                   help=f"a small study for CI: instances {QUICK['instances']}, "
                   f"{QUICK['seeds']} seeds, {QUICK['steps']} steps (overrides those options)")
    p.add_argument("--jobs", type=int_in_range(1, 1024, "worker processes"), default=1,
                   help="units run in parallel, one process and one thread each")
    p.add_argument("--results", type=Path, default=Path("results/instances"),
                   help="folder where unit results are stored and reused")
    p.add_argument("--out", type=Path, default=Path("results/instances/report"),
                   help="folder for the tables and figures")
    p.add_argument("--replot", action="store_true",
                   help="only rebuild tables and figures from --results (nothing is trained)")
    p.add_argument("--compare-with", type=Path, default=None,
                   help="folder of the committed instance-0 microworld CSVs to check instance 0 "
                   "against (default: the repository's figures/, "
                   f"{FIGURES_DIR}, when it exists)")
    return p


def check_study(args: argparse.Namespace) -> None:
    """Refuse, before any folder is touched, a study with no claim to evaluate or with paths
    that cannot be used."""
    if args.d < 5 and not args.no_d4:
        raise PBInputError(f"--d {args.d} overlaps the d = 4 row; add --no-d4")
    for exp in args.experiments:
        if not any(c.experiment == exp and c.d == args.d for c in CLAIMS):
            have = sorted({c.d for c in CLAIMS if c.experiment == exp})
            raise PBInputError(f"no claim of tab:app_results_summ is defined for {exp} at "
                               f"d = {args.d} (only at d = {', '.join(map(str, have))}); "
                               "change --d or --experiments")
    for flag, folder in (("--results", args.results), ("--compare-with", args.compare_with)):
        if folder is not None and folder.exists() and not folder.is_dir():
            raise PBInputError(f"{flag} {folder} is a file, not a folder; choose a folder")
    if args.compare_with is not None and not args.compare_with.is_dir():
        raise PBInputError(f"--compare-with {args.compare_with} does not exist; give the folder "
                           f"of the committed microworld CSVs (default {FIGURES_DIR})")
    if args.replot and not (args.results / "units").is_dir():
        raise PBInputError(f"--replot needs the unit results in {args.results}/units; run the "
                           "study without --replot first")


def scale_rows(args: argparse.Namespace, scale: Sequence[str]) -> int:
    """The scale rows as ``python -m analysis.scale_report`` makes them
    (:func:`analysis.scale.study_report.run_report`); its one-line errors are its own, and
    anything else it raises (a damaged run folder it cannot read) becomes one line naming the
    command that shows the details."""
    if args.scale_out.exists() and not args.scale_out.is_dir():
        raise PBInputError(f"--scale-out {args.scale_out} is a file, not a folder; choose a "
                           "folder")
    for folder in args.scale_runs or ():
        if not folder.is_dir():
            raise PBInputError(f"--scale-runs {folder} is not a folder; give folders holding "
                               "run folders")
    source = ["--runs", *map(str, args.scale_runs)] if args.scale_runs else ["--replot"]
    argv = [*source, "--out", str(args.scale_out), "--experiments", ",".join(scale)]
    try:
        return run(lambda _: run_report(args.scale_runs, args.scale_out, scale,
                                        replot=not args.scale_runs), argv)
    except Exception as exc:  # noqa: BLE001 - one line instead of a traceback
        raise PBInputError(
            f"the scale rows failed ({type(exc).__name__}: {exc}); run python -m "
            f"analysis.scale_report {shlex.join(argv)} to see where (a damaged run folder?)"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    scale = [e for e in args.experiments if e in SCALE_EXPERIMENTS]
    args.experiments = [e for e in args.experiments if e in EXPERIMENTS]
    if scale:
        code = scale_rows(args, scale)
        if code or not args.experiments:
            return code
    instances = args.instances
    if args.quick:
        instances, args.seeds, args.steps = QUICK["instances"], QUICK["seeds"], QUICK["steps"]
    check_study(args)
    settings = Settings(args.seeds, args.steps, args.seed, args.log_every)
    units = plan_units(args.experiments, instances, args.d, not args.no_d4)
    check_units(units, settings)
    out = check_out_dir(args.out, "--out")
    start = time.perf_counter()
    if not args.replot:
        results = check_out_dir(args.results, "--results")
        try:
            with stop_signals():
                run_units(units, settings, results, args.jobs)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM under stop_signals
            signum = getattr(exc, "signum", signal.SIGINT)
            done = sum(is_done(results, u, settings) for u in units)
            resume = shlex.join(["python", "-m", "analysis.report",
                                 *(sys.argv[1:] if argv is None else argv)])
            print(f"{signal.Signals(signum).name}: {done} of {len(units)} units finished, kept "
                  f"in {results / 'units'}; resume with: {resume}", file=sys.stderr)
            return 128 + signum
    loaded = load_units(units, settings, args.results)
    claims = [c for c in CLAIMS if any(u.experiment == c.experiment and u.d == c.d
                                       for u in units)]
    verdicts = evaluate_claims(claims, loaded)
    rows = summary_rows(claims, verdicts)
    write_csv(out / "agreement.csv", list(rows[0]), [list(r.values()) for r in rows])
    atomic_write_text(out / "agreement.md", markdown_table(rows, settings, instances))
    write_claim_csvs(out, claims, verdicts)
    norm = normalized_rows(loaded, args.d)
    write_csv(out / f"final_loss_d{args.d}.csv", list(norm[0]),
              [list(r.values()) for r in norm])
    for bench in BENCHMARKS:
        if any(r["benchmark"] == bench for r in norm):
            fig = plot_final_losses(norm, bench, args.d)
            save_figure(fig, [out / f"final_loss_{bench}_d{args.d}.png"])
            import matplotlib.pyplot as plt

            plt.close(fig)
    check = instance0_check(loaded, args.results, settings, args.compare_with or FIGURES_DIR)
    write_csv(out / "instance0_check.csv",
              ["unit", "reference", "finals", "reference_finals", "common", "max_abs_diff",
               "found_flags_differ", "identical"], check)
    units_rows = []
    for u in units:
        rec = json.loads((unit_dir(args.results, u, settings) / "unit.json").read_text())
        units_rows.append([u.name, *u.record(settings).values(), f"{rec['wall_s']:.1f}"])
    write_csv(out / "units.csv", [*("unit", *units[0].record(settings)), "wall_s"], units_rows)
    total = sum(float(r[-1]) for r in units_rows)
    print(f"{len(units)} units ({total:.0f} s of unit wall time in all); report built in "
          f"{time.perf_counter() - start:.1f} s")
    for r in rows:
        print(f"  {r['claim']:24s} {r['benchmark']:11s} holds {r['holds']}/{r['instances']}, "
              f"fails {r['fails']}, noise {r['noise']}")
    for c in check:
        print(f"  instance 0 {c[0]}: {'identical to' if c[-1] else 'DIFFERS from'} {c[1]} "
              f"(max |diff| {c[5]})")
    print(f"wrote {out}/agreement.md, agreement.csv, claims/, final_loss_*.png/csv, "
          "instance0_check.csv, units.csv")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
