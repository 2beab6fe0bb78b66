"""``python -m pbscale.sweep``'s command line: ``run`` (the lock, what is left to do, the
engine), ``status`` and ``results`` (see :mod:`pbscale.sweep` for the file format and what each
action does)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from pbexact.cli import ArgumentParser, nonneg_int, out_folder, run_main
from pbexact.errors import PBInputError
from pbscale.runs import io

from .engines import (
    MAX_JOBS,
    Interrupted,
    Progress,
    default_jobs,
    require_ray,
    run_local,
    run_ray,
)
from .file import (
    Group,
    Run,
    Sweep,
    label,
    load,
    plan,
)
from .identity import CHOICE, Change, changed_line
from .records import (
    STATES,
    SweepLock,
    changed_runs,
    divergence,
    keep_identity,
    read_record,
    results,
    saved_text,
    status,
    summary_damage,
    sweep_folders,
    todo,
)

ENGINES = ("local", "ray")


def print_status(sweep: Sweep, verbose: bool) -> None:
    """Counts per state, then the failed, running and interrupted runs with their logs (and
    with ``verbose``, every run), each with its run folder when it has one."""
    groups = status(sweep)
    total = len(sweep.runs)
    print(f"{sweep.path}: {total} runs of python -m {sweep.module} in {sweep.out}")
    print("  " + ", ".join(f"{s} {len(groups[s])}" for s in STATES))
    listed = ("failed", "diverged", "running", "interrupted")
    folders = sweep_folders(sweep) if verbose or any(groups[s] for s in listed) else {}
    shown = listed + (("finished", "pending") if verbose else ())
    for s in shown:
        for r in groups[s]:
            line = f"  {s:<11} {r.id}  {label(r)}"
            if r.id in folders:
                line += f"  folder: {folders[r.id]}"
            if s == "diverged":
                line += f"  {divergence(folders[r.id])}"
            elif s in listed:
                log = (read_record(sweep, r) or {}).get("log", sweep.record_dir / f"{r.id}.log")
                line += f"  log: {log}"
            print(line)
    warn_changed(sweep)


def warn_changed(sweep: Sweep, found: Sequence[Change] | None = None) -> None:
    """One ``warning:`` line on stderr when finished runs were trained on a data file or
    network module that has changed since (:mod:`pbscale.sweep.identity`), with the choice."""
    found = changed_runs(sweep) if found is None else found
    if found:
        print(f"warning: {changed_line(found, len(sweep.runs))}; {CHOICE}", file=sys.stderr)


def jobs_arg(text: str) -> int:
    """argparse type of --jobs: 0 (from the machine) up to MAX_JOBS."""
    value = nonneg_int(text)
    if value > MAX_JOBS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_JOBS}, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m pbscale.sweep",
                       description="Run a TOML sweep of pbscale runs (resumable), show its "
                       "status, or tabulate its results.")
    sub = p.add_subparsers(dest="action", required=True)
    r = sub.add_parser("run", help="run every unfinished run of the sweep")
    r.add_argument("sweep", help="sweep file (.toml)")
    r.add_argument("--engine", default="local", choices=ENGINES,
                   help="local: a process pool; ray: Ray tasks (default: %(default)s)")
    r.add_argument("--jobs", type=jobs_arg, default=0,
                   help=f"runs at once (local) / CPUs of a local Ray, at most {MAX_JOBS} "
                   "(default: %(default)s = CPU cores // [sweep] cpus, and with GPUs "
                   "floor(1/gpus) per GPU)")
    r.add_argument("--address", default=None, help="Ray cluster address (default: %(default)s "
                   "= start a local Ray)")
    r.add_argument("--out", type=out_folder, default=None,
                   help="parent folder of the runs, relative to the "
                   "current folder (default: %(default)s = [sweep] out, relative to the file)")
    r.add_argument("--no-retry", action="store_true", help="leave failed runs alone (default: "
                   "%(default)s)")
    r.add_argument("--dry-run", action="store_true", help="print the command lines only "
                   "(default: %(default)s)")
    changed = r.add_mutually_exclusive_group()
    changed.add_argument("--rerun-changed", action="store_true",
                         help="launch again the finished runs whose data file or network "
                         "module changed since they trained: each trains a new run folder "
                         "beside the old one where its data or network differs (default: "
                         "%(default)s; without this or --keep-changed, such runs stop the "
                         "sweep with one line)")
    changed.add_argument("--keep-changed", action="store_true",
                         help="keep those runs as they are (their results stay the old "
                         "files'), and stop asking until the files change again (default: "
                         "%(default)s)")
    r.add_argument("--group", action="store_true", help="groups: runs differing only in "
                   "seed and lr (regress) or seed, lam and mask lr (prune) train together in "
                   "one child, python -m pbscale.regress or pbscale.prune with --seeds (also "
                   "[sweep] group = true; default: %(default)s)")
    s = sub.add_parser("status", help="finished / running / failed / diverged / interrupted / "
                                      "pending")
    s.add_argument("sweep", help="sweep file (.toml)")
    s.add_argument("--out", type=out_folder, default=None,
                   help="parent folder of the runs (default: "
                   "%(default)s = [sweep] out)")
    s.add_argument("-v", "--verbose", action="store_true", help="list every run with its run "
                   "folder (default: %(default)s)")
    t = sub.add_parser("results", help="a table of the finished runs (the options that differ, "
                       "the main metrics); --csv: every option, run folder and summary entry")
    t.add_argument("sweep", help="sweep file (.toml)")
    t.add_argument("--out", type=out_folder, default=None,
                   help="parent folder of the runs (default: "
                   "%(default)s = [sweep] out)")
    t.add_argument("--csv", default=None, help="write every column to this CSV file instead "
                   "of printing the compact table (default: %(default)s = print the table)")
    return p


def check_csv_target(path: str) -> Path:
    """``results --csv``: a file path whose folder exists and is writable (one-line error
    otherwise)."""
    target = Path(path)
    if target.is_dir():
        raise PBInputError(f"--csv {path} is a folder; give a file name, e.g. {target / 'x.csv'}")
    folder = target.absolute().parent
    if not folder.is_dir():
        raise PBInputError(f"--csv {path}: folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (target.exists() and not os.access(
            target, os.W_OK)):
        raise PBInputError(f"--csv {path} cannot be written (permission denied); choose a "
                           "writable place")
    return target


#: The summary entries the compact ``results`` table shows, those present, in this order.
TABLE_METRICS = ("final_test_acc", "final_remaining", "final_val_loss_chosen", "final_val_loss",
                 "final_train_loss", "seconds_per_epoch")


def results_table(rows: list[dict], options: list[str]) -> list[str]:
    """The compact ``results`` table (lines): per row the run's options that differ between
    rows (of ``options``), then the :data:`TABLE_METRICS` it has (floats to 4 digits), then
    the run folder's name."""
    varied = [k for k in options if len({repr(r.get(k)) for r in rows}) > 1] or options[:1]
    metrics = [k for k in TABLE_METRICS if any(k in r for r in rows)][:4]

    def cell(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))

    head = [*varied, *(k.removeprefix("final_") for k in metrics), "folder"]
    body = [[cell(r.get(k)) for k in (*varied, *metrics)] + [Path(r["folder"]).name]
            for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return ["  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip()
            for line in [head, *body]]


def write_results(sweep: Sweep, csv: str | None) -> int:
    """``sweep results``: the compact table on stdout, or with ``csv`` every column written to
    that file."""
    target = check_csv_target(csv) if csv is not None else None
    damaged: list[Path] = []
    rows = results(sweep, damaged)
    for p in damaged:
        why = summary_damage(p.parent) if p.name == "summary.json" else None
        print(f"warning: skipped {p}: {why or 'damaged or not a JSON object'}",
              file=sys.stderr)
    if not rows:
        raise PBInputError(f"no finished runs of {sweep.path} in {sweep.out}; run the "
                           "sweep first")
    keys = list(dict.fromkeys(k for row in rows for k in row))
    if target is None:
        options = list(dict.fromkeys(k for r in sweep.runs for k in r.options))
        print("\n".join(results_table(rows, options)))
        print(f"{len(rows)} of {len(sweep.runs)} runs finished; every column: results "
              f"{sweep.path} --csv FILE", file=sys.stderr)
        print_diverged(sweep)
        warn_changed(sweep)
        return 0
    try:
        io.write_csv(target, [{k: row.get(k, "") for k in keys} for row in rows])
    except OSError as e:
        raise PBInputError(f"cannot write --csv {csv} ({e.strerror}); choose a writable "
                           "place") from None
    print(f"wrote {len(rows)} rows to {csv}")
    print_diverged(sweep)
    warn_changed(sweep)
    return 0


def print_diverged(sweep: Sweep) -> None:
    """``results``: the diverged runs (not in the table), counted and named on stderr."""
    diverged = status(sweep)["diverged"]
    if diverged:
        folders = sweep_folders(sweep)
        print(f"diverged {len(diverged)}: " + "; ".join(
            f"{r.id} ({divergence(folders[r.id])})" for r in diverged), file=sys.stderr)


#: Stopped runs whose saved state an interrupted ``sweep run`` lists one per line.
SAVED_SHOWN = 20


def run_sweep(args: argparse.Namespace, argv: list[str]) -> int:
    """``sweep run``: with ``--engine ray`` and runs left to do, Ray present (else one line,
    before anything is printed or written); the lock (so that what is left to do is read while
    no other sweep runs this folder), then the runs not finished, on the chosen engine (none
    left: no engine is started)."""
    sweep = load(args.sweep, args.out)
    if args.engine == "ray" and not args.dry_run and todo(sweep, not args.no_retry)[0]:
        require_ray()  # before anything is printed or written (the lock, records)
    for note in sweep.notes:
        print(note, file=sys.stderr)
    changed = changed_runs(sweep)
    if args.dry_run:
        if not (args.rerun_changed or args.keep_changed):
            warn_changed(sweep, changed)
        return dry_run(sweep, args, changed)
    if changed and not (args.rerun_changed or args.keep_changed):
        raise PBInputError(f"{changed_line(changed, len(sweep.runs))}; {CHOICE}")
    resume = shlex.join(["python", "-m", "pbscale.sweep", *argv])
    with SweepLock(sweep.record_dir):
        if changed and args.keep_changed:
            kept = list({c.run.id: c.run for c in changed}.values())
            keep_identity(sweep, kept)
            print(f"kept {len(kept)} changed runs as they are (their results are those of the "
                  "files as they were)", file=sys.stderr)
        runs, running, children = plan_todo(sweep, args, changed)
        if not children:
            print(f"nothing to run: every run of {sweep.path} in {sweep.out} is finished"
                  f"{', failed' if args.no_retry else ''} or running", file=sys.stderr)
            print_status(sweep, verbose=False)
            return 0
        jobs = args.jobs or default_jobs(sweep)
        n_groups = sum(isinstance(c, Group) for c in children)
        how = (f" ({n_groups} groups, {len(children)} children)"
               if args.group or sweep.group else "")
        elsewhere = f" ({len(running)} still running)" if running else ""
        print(f"{len(sweep.runs) - len(runs) - len(running)} of {len(sweep.runs)} runs already "
              f"finished{elsewhere}; running {len(runs)}{how} with --engine {args.engine} "
              f"({jobs} at once)", file=sys.stderr, flush=True)
        progress = Progress(sweep, len(runs))
        try:
            if args.engine == "ray":
                codes = run_ray(sweep, children, jobs, args.address, progress)
            else:
                codes = run_local(sweep, children, jobs, progress)
        except Interrupted:
            print_status(sweep, verbose=False)
            states = status(sweep)
            left = len(sweep.runs) - len(states["finished"])
            folders = sweep_folders(sweep)
            stopped = [r for r in runs if r in states["interrupted"]]
            for r in stopped[:SAVED_SHOWN]:
                print(f"  {r.id}: {saved_text(sweep, r, folders)}", file=sys.stderr)
            if len(stopped) > SAVED_SHOWN:
                print(f"  ... and {len(stopped) - SAVED_SHOWN} more stopped runs (sweep status "
                      f"lists them)", file=sys.stderr)
            print(f"interrupted: {left} runs not finished ({len(stopped)} stopped, what each "
                  f"saved above); resume with: {resume}", file=sys.stderr)
            return 143
    print_status(sweep, verbose=False)
    return 1 if any(c != 0 for c in codes.values()) else 0


def plan_todo(sweep: Sweep, args: argparse.Namespace, changed: Sequence[Change] = ()
              ) -> tuple[list[Run], list[Run], list[Run | Group]]:
    """(runs to launch, runs still running in a child of an earlier sweep on this host, the
    children that run the runs to launch); a line per run still running, which is left
    alone. With ``--rerun-changed`` the ``changed`` runs are launched again too."""
    runs, running = todo(sweep, retry_failed=not args.no_retry)
    if args.rerun_changed:
        again = {c.run.id for c in changed}
        runs = [r for r in sweep.runs if r in runs or r.id in again]
    for r in running:
        rec = read_record(sweep, r) or {}
        print(f"still running from an earlier sweep (pid {rec.get('pid')}), left alone: {r.id}  "
              f"{label(r)}", file=sys.stderr)
    return runs, running, plan(sweep, runs) if (args.group or sweep.group) else list(runs)


def dry_run(sweep: Sweep, args: argparse.Namespace, changed: Sequence[Change] = ()) -> int:
    """``sweep run --dry-run``: the command lines still to run (with ``--rerun-changed``, the
    changed runs' too), or that there are none."""
    _, _, children = plan_todo(sweep, args, changed)
    if not children:
        print(f"nothing to do: every run of {sweep.path} in {sweep.out} is finished"
              f"{', failed' if args.no_retry else ''} or running", file=sys.stderr)
    for c in children:
        print(" ".join(["python", *sweep.command_line(c)]))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)  # a usage error: argparse's one line, exit 2

    def body() -> int:
        if args.action == "run":
            return run_sweep(args, argv)
        sweep = load(args.sweep, args.out)
        for note in sweep.notes:
            print(note, file=sys.stderr)
        if args.action == "status":
            print_status(sweep, args.verbose)
            return 0
        return write_results(sweep, args.csv)

    return run_main(body)
