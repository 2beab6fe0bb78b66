"""Do the microworld conclusions survive other instances? (`tab:app_results_summ`, issue 14)

    python -m analysis.report --quick --out report_quick          # CI-sized check of the machinery
    python -m analysis.report --jobs 16 --results results/instances --out figures/instances
    python -m analysis.report --replot --results results/instances --out figures/instances

Runs the microworld experiments (:mod:`analysis.microworld`, called through its command line, one
process per unit) on several benchmark instances, evaluates every claim of :mod:`analysis.claims`
on each instance and writes, under --out:

* ``agreement.md`` / ``agreement.csv``: per claim and benchmark, on how many instances it holds,
  fails or is within noise, and instance 0's verdict with its numbers;
* ``claims/<claim>.csv``: per instance the verdict, its numbers and the text behind it;
* ``final_loss_<benchmark>.png`` / ``.csv``: each method's final mean loss per instance, normalized
  as (final - J(z*)) / (E_0.5[J] - J(z*)) (0: z*, 1: no progress from theta = 0.5);
* ``instance0_check.csv``: instance 0's per-seed final losses against the committed microworld
  CSVs in --compare-with (same code and seeds must give the same numbers);
* ``units.csv``: the settings and wall time of every unit.

A unit is one (experiment, benchmark, instance, d); its results live in --results/units/<unit>/
and are reused when its recorded settings (``unit.json``) match the requested ones, so an
interrupted study resumes where it stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from analysis.claims import CLAIMS, OUTCOMES, Claim, ConfigResult, UnitResult, Verdict
from analysis.cli import atomic_write_text, run, save_figure, write_csv, write_json
from analysis.scale_report import EXPERIMENTS as SCALE_EXPERIMENTS
from analysis.scale_report import main as scale_main
from pbexact.cli import ArgumentParser, seed_list
from pbexact.errors import PBInputError

EXPERIMENTS = ("estimators", "params", "approaches")
BENCHMARKS = ("exponential", "nnloss")
FIGURES_DIR = Path(__file__).resolve().parent.parent / "figures"
#: Relative cost of one unit at the paper's scale (measured, d = 10 estimators = 1): the longest
#: units are started first so that the parallel run ends soon after the longest one.
COST = {("approaches", 10): 5.5, ("approaches", 4): 4.6, ("params", 10): 1.6,
        ("estimators", 10): 1.0, ("params", 4): 0.8, ("estimators", 4): 0.4}
QUICK = dict(instances=[0, 1], seeds=5, steps=50)

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


@dataclass(frozen=True)
class Unit:
    """One run of ``python -m analysis.microworld``: an experiment on one benchmark instance."""

    experiment: str
    benchmark: str
    instance: int
    d: int

    @property
    def name(self) -> str:
        return f"{self.experiment}_d{self.d}_{self.benchmark}_i{self.instance}"

    @property
    def stem(self) -> str:
        """The microworld's results CSV (without .csv) inside the unit folder."""
        return f"microworld_{self.experiment}_{self.benchmark}_d{self.d}"


@dataclass(frozen=True)
class Settings:
    """What a unit's results depend on besides the unit itself (recorded in unit.json)."""

    seeds: int
    steps: int
    seed: int
    log_every: int

    def unit_log_every(self, unit: Unit) -> int:
        """approaches selects lr by the mean loss over iterations >= 10, averaged over the logged
        steps, so it is logged at every step to select exactly as ``analysis.microworld``."""
        return 1 if unit.experiment == "approaches" else self.log_every

    def record(self, unit: Unit) -> dict:
        return {**asdict(unit), "seeds": self.seeds, "steps": self.steps, "seed": self.seed,
                "log_every": self.unit_log_every(unit)}


def plan_units(experiments: Sequence[str], instances: Sequence[int], d: int,
               d4: bool) -> list[Unit]:
    """The units of a study: every experiment on every benchmark it runs on (approaches: NNLoss
    only) and instance at d, plus the d = 4 row (estimators on both benchmarks, approaches on
    NNLoss) when ``d4``."""
    out = []
    for dd, exps in ((d, experiments), (4, ("estimators", "approaches") if d4 else ())):
        for exp in exps:
            for bench in (("nnloss",) if exp == "approaches" else BENCHMARKS):
                out += [Unit(exp, bench, i, dd) for i in instances]
    return list(dict.fromkeys(out))


def unit_dir(results: Path, unit: Unit) -> Path:
    return results / "units" / unit.name


def is_done(results: Path, unit: Unit, settings: Settings) -> bool:
    """A unit is reused only if its marker exists and records the same settings."""
    marker = unit_dir(results, unit) / "unit.json"
    if not marker.exists():
        return False
    try:
        rec = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return rec.get("settings") == settings.record(unit) and (
        unit_dir(results, unit) / f"{unit.stem}.csv").exists()


def run_unit(unit: Unit, settings: Settings, results: Path) -> tuple[Unit, float]:
    """Run one unit through the microworld's command line (output and progress bars go to the
    unit's log); writes unit.json last, so a unit without it is unfinished."""
    from analysis.microworld import main as microworld_main

    folder = unit_dir(results, unit)
    (folder / "unit.json").unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)  # a stale or partial run of this unit
    folder.mkdir(parents=True, exist_ok=True)
    argv = [unit.experiment, "--benchmark", unit.benchmark, "--instance", str(unit.instance),
            "--d", str(unit.d), "--seeds", str(settings.seeds), "--steps", str(settings.steps),
            "--seed", str(settings.seed), "--log-every", str(settings.unit_log_every(unit)),
            "--out", str(folder), "--figures", str(folder / "figures")]
    start = time.perf_counter()
    with open(folder / "log.txt", "w") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log):
        microworld_main(argv)
    wall = time.perf_counter() - start
    import matplotlib.pyplot as plt

    plt.close("all")  # the microworld's figures, saved already
    write_json(folder / "unit.json", {"settings": settings.record(unit), "wall_s": wall,
                                      "argv": ["python", "-m", "analysis.microworld", *argv]})
    return unit, wall


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def run_units(units: Sequence[Unit], settings: Settings, results: Path, jobs: int) -> None:
    """Run the units not already done, longest first, in ``jobs`` processes of one thread each."""
    todo = [u for u in units if not is_done(results, u, settings)]
    reused = len(units) - len(todo)
    todo.sort(key=lambda u: -COST.get((u.experiment, u.d), 1.0))
    print(f"{len(units)} units: {reused} reused from {results}, {len(todo)} to run "
          f"with {jobs} process(es)", flush=True)
    if not todo:
        return
    start = time.perf_counter()

    def done(k: int, unit: Unit, wall: float) -> None:
        print(f"  [{k}/{len(todo)}] {unit.name}: {wall:.1f} s "
              f"(elapsed {time.perf_counter() - start:.0f} s)", flush=True)

    if jobs == 1:
        for k, unit in enumerate(todo, 1):
            done(k, *run_unit(unit, settings, results))
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
                "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"  # inherited by the worker processes
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker) as pool:
        futures = {pool.submit(run_unit, u, settings, results): u for u in todo}
        for k, fut in enumerate(as_completed(futures), 1):
            try:
                done(k, *fut.result())
            except PBInputError:
                raise
            except Exception as exc:  # a crashed unit: report it, keep the others
                print(f"  [{k}/{len(todo)}] {futures[fut].name} FAILED: {exc!r} "
                      f"(log: {unit_dir(results, futures[fut]) / 'log.txt'})", flush=True)


# ---------------------------------------------------------------------------------------------
# Reading results


def instance_table(benchmark: str, d: int, instance: int) -> np.ndarray:
    """The 2^d J table of an instance, exactly as the microworld builds it."""
    from pbexact.benchmarks import NNLoss, benchmark_table

    if benchmark == "nnloss":
        return NNLoss(d, instance).table()
    return benchmark_table(benchmark, d, instance)


def read_unit(path: Path, unit: Unit, J: np.ndarray) -> UnitResult:
    """The selected configs of a microworld results CSV (``analysis.microworld.write_results``
    format; rows other than ``curve`` and ``final`` are ignored). Checks that the curves start
    at E_0.5[J] of ``J`` (CP: at J of its hard mask), so that results of another instance
    cannot be read by mistake."""
    curves: dict[tuple, list] = {}
    finals: dict[tuple, list] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            if row.get("selected") != "1":
                continue
            key = (row["method"], int(row["n"]), row["param"], float(row["lr"]))
            if row["record"] == "curve":
                curves.setdefault(key, []).append((int(row["step"]), float(row["mean"])))
            elif row["record"] == "final":
                finals.setdefault(key, []).append((float(row["value"]),
                                                   row["found_z_star"] == "1"))
    if not curves:
        raise PBInputError(f"{path} has no selected curves; delete it and rerun the unit")
    start_J = float(J.mean())
    configs = []
    for key, rows in curves.items():
        rows.sort()
        steps = np.array([s for s, _ in rows])
        curve = np.array([m for _, m in rows])
        off = abs(curve[0] - start_J) > 1e-9 * max(1.0, abs(start_J))
        if steps[0] != 0 or (off and key[0] != "cp"):  # CP logs J(1[r > 0]), not E_0.5[J]
            raise PBInputError(f"{path}: curve {key} does not start at E_0.5[J] = {start_J:.6g} "
                               f"of {unit.benchmark} instance {unit.instance}; delete the unit "
                               "folder and rerun")
        value, found = zip(*finals[key])
        configs.append(ConfigResult(key[0], key[1], key[2], key[3], np.array(value),
                                    np.array(found, dtype=bool), steps, curve))
    return UnitResult(unit.experiment, unit.benchmark, unit.instance, unit.d, float(J.min()),
                      start_J, configs)


def load_units(units: Sequence[Unit], settings: Settings, results: Path) -> dict[Unit, UnitResult]:
    missing = [u.name for u in units if not is_done(results, u, settings)]
    if missing:
        raise PBInputError(
            f"{len(missing)} unit(s) missing or run with other settings in {results}/units "
            f"(first: {missing[0]}); run without --replot to compute them")
    out = {}
    for u in units:
        J = instance_table(u.benchmark, u.d, u.instance)
        out[u] = read_unit(unit_dir(results, u) / f"{u.stem}.csv", u, J)
    return out


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
            "`python -m analysis.report`; criteria in `analysis/claims.py`).\n\n"
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
        write_csv(out / "claims" / f"{claim.key}.csv",
                  ["benchmark", "instance", "outcome", *keys, "detail"], body)


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


def plot_final_losses(rows: list[dict], bench: str, d: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    exps = [e for e in EXPERIMENTS if any(r["experiment"] == e and r["benchmark"] == bench
                                          for r in rows)]
    fig, axes = plt.subplots(1, len(exps), figsize=(5.6 * len(exps), 4.4), squeeze=False)
    for ax, exp in zip(axes[0], exps):
        mine = [r for r in rows if r["experiment"] == exp and r["benchmark"] == bench]
        methods = list(dict.fromkeys(r["method"] for r in mine))
        insts = sorted({r["instance"] for r in mine})
        width = 0.8 / max(len(methods), 1)
        for k, m in enumerate(methods):
            pts = sorted((r["instance"], r["normalized"], r["normalized_stderr"])
                         for r in mine if r["method"] == m)
            x = np.array([p[0] for p in pts]) - 0.4 + width * (k + 0.5)
            ax.errorbar(x, [p[1] for p in pts], yerr=[p[2] for p in pts],
                        fmt="osD^v<>"[k // 10 % 7], ms=3.5, lw=0.8, label=m, color=f"C{k % 10}")
        ax.set_xticks(insts)
        ax.set_xlabel("instance")
        ax.set_ylabel("normalized final loss")
        ax.set_title(f"{exp}", fontsize=10)
        ax.axhline(0, color="k", lw=0.6, ls=":")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=6, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    name = {"exponential": "ExponentialTabularLoss", "nnloss": "NNLoss"}[bench]
    fig.suptitle(f"{name}, d={d}: final mean loss per instance, normalized (0 = z*, 1 = start; "
                 "bars: 1 s.e.)", fontsize=11)
    fig.tight_layout()
    return fig


def instance0_check(loaded: dict[Unit, UnitResult], results: Path, compare_with: Path
                    ) -> list[list]:
    """Instance 0's per-seed final losses against the committed microworld CSV of the same
    experiment, benchmark and d (if there is one and it has the same number of steps and seeds),
    for every config (all lrs). ``identical`` needs every reference value reproduced exactly;
    configs the reference lacks (a method added since it was written) are only counted."""
    rows = []
    for u in loaded:
        ref = compare_with / f"{u.stem}.csv"
        if u.instance != 0 or not ref.exists():
            continue
        mine = _finals(unit_dir(results, u) / f"{u.stem}.csv")
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
parse_instances = seed_list


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m analysis.report",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Evaluate every microworld claim of tab:app_results_summ over several "
        "benchmark instances (analysis/claims.py) and write the agreement tables, per-claim CSVs "
        "and normalized final-loss figures.",
        epilog=HELP_TIMES,
    )
    p.add_argument("--instances", type=seed_list, default="0-9",
                   help="instance seeds, e.g. 0-9 (default) or 0,3")
    p.add_argument("--experiments", nargs="+", choices=EXPERIMENTS + SCALE_EXPERIMENTS,
                   default=list(EXPERIMENTS),
                   help="microworld experiments at --d (default: all three); supermask, joint, "
                   "regression: the scale rows from run folders (python -m analysis.scale_report, "
                   "see --scale-runs, --scale-out)")
    p.add_argument("--scale-runs", type=Path, nargs="+", default=None,
                   help="scale rows: folders holding pruning/regression run folders (default: "
                   "redraw from --scale-out/runs)")
    p.add_argument("--scale-out", type=Path, default=FIGURES_DIR / "claims",
                   help="scale rows: output folder (default: the repository's figures/claims)")
    p.add_argument("--d", type=int, default=10, help="bits (default 10, the paper's)")
    p.add_argument("--no-d4", action="store_true", help="skip the d = 4 row")
    p.add_argument("--seeds", type=int, default=100, help="seeds per method (default 100)")
    p.add_argument("--steps", type=int, default=10_000, help="SGD steps (default 10,000)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the runs (default 0)")
    p.add_argument("--log-every", type=int, default=10,
                   help="logged iterations of estimators/params (default 10; approaches always "
                   "logs every step, its lr selection averages the logged curve)")
    p.add_argument("--quick", action="store_true",
                   help=f"a small study for CI: instances {QUICK['instances']}, "
                   f"{QUICK['seeds']} seeds, {QUICK['steps']} steps (overrides those options)")
    p.add_argument("--jobs", type=int, default=1,
                   help="units run in parallel, one process and one thread each (default 1)")
    p.add_argument("--results", type=Path, default=Path("results/instances"),
                   help="where unit results are stored and reused (default results/instances)")
    p.add_argument("--out", type=Path, default=Path("results/instances/report"),
                   help="where the tables and figures go (default results/instances/report)")
    p.add_argument("--replot", action="store_true",
                   help="only rebuild tables and figures from --results (nothing is trained)")
    p.add_argument("--compare-with", type=Path, default=FIGURES_DIR,
                   help="folder of the committed instance-0 microworld CSVs to check instance 0 "
                   "against (default: the repository's figures/)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    scale = [e for e in args.experiments if e in SCALE_EXPERIMENTS]
    args.experiments = [e for e in args.experiments if e in EXPERIMENTS]
    if scale:
        source = ["--runs", *map(str, args.scale_runs)] if args.scale_runs else ["--replot"]
        scale_main([*source, "--out", str(args.scale_out), "--experiments", ",".join(scale)])
        if not args.experiments:
            return 0
    instances = args.instances
    if args.quick:
        instances, args.seeds, args.steps = QUICK["instances"], QUICK["seeds"], QUICK["steps"]
    if args.seeds < 2:
        raise PBInputError("--seeds must be >= 2 (the claims compare standard errors)")
    if args.steps < 1 or args.log_every < 1 or args.jobs < 1:
        raise PBInputError("--steps, --log-every and --jobs must be >= 1")
    if args.d < 5 and not args.no_d4:
        raise PBInputError(f"--d {args.d} overlaps the d = 4 row; add --no-d4")
    settings = Settings(args.seeds, args.steps, args.seed, args.log_every)
    units = plan_units(args.experiments, instances, args.d, not args.no_d4)
    start = time.perf_counter()
    if not args.replot:
        run_units(units, settings, args.results, args.jobs)
    loaded = load_units(units, settings, args.results)
    claims = [c for c in CLAIMS if any(u.experiment == c.experiment and u.d == c.d
                                       for u in units)]
    verdicts = evaluate_claims(claims, loaded)
    out = args.out
    rows = summary_rows(claims, verdicts)
    if out.exists() and (out / "agreement.csv").exists():
        shutil.rmtree(out / "claims", ignore_errors=True)  # stale claims of an earlier study
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
    check = instance0_check(loaded, args.results, args.compare_with)
    write_csv(out / "instance0_check.csv",
              ["unit", "reference", "finals", "reference_finals", "common", "max_abs_diff",
               "found_flags_differ", "identical"], check)
    units_rows = []
    for u in units:
        rec = json.loads((unit_dir(args.results, u) / "unit.json").read_text())
        units_rows.append([u.name, *settings.record(u).values(), f"{rec['wall_s']:.1f}"])
    write_csv(out / "units.csv", [*("unit", *settings.record(units[0])), "wall_s"], units_rows)
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
