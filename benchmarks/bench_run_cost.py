"""What a whole run costs, start-up included: wall time, CPU time and peak memory of fresh
processes, beside the same commands at another checkout of the code (issue 55):

    python -m benchmarks.bench_run_cost --data-dir ../shared/data/mnist \\
        --baseline-path /tmp/pbnn-before --repeats 3 --out results

Each case is one command run as its own process (``python -m ...`` with ``--threads 1`` and
``OMP_NUM_THREADS=1``, a fresh ``--out`` folder in a temporary directory), in this checkout
("current") and, with ``--baseline-path``, in that folder ("baseline", e.g. ``git worktree add
/tmp/pbnn-before <commit>``), their repeats alternating current, baseline, current, ... so that
load on the machine falls on both alike. Wall seconds around the process, CPU seconds (user +
system) and peak resident set (``ru_maxrss``) from ``wait4``; medians over the repeats, the
baseline's over the current's (and the fastest wall time of each, the run least disturbed on a
shared machine), and the goals of issue 55, judged by the medians:

* ``import``: ``python -c "import pbscale.prune"`` (no goal);
* ``batch1``: LeNet-300-100 supermask ARMS n = 10, sigmoid, mask lr 0.1, lambda 0.005, batch
  128, real MNIST, one epoch cut to one batch (``--max-batches 1``): at most 3 s, 500 MiB;
* ``epoch``: the same, one whole epoch (430 steps): at most 10 s, 535 MiB;
* ``regress``: MaskedNNRegression, ARMS escort n = 10, 30 epochs: at most 7 s.

Before the timed runs each checkout runs one short pruning and one short regression run,
untimed, so that Numba's cache of the checkout is written and the files are in the page cache.
Writes ``bench_run_cost.csv`` (every run) and ``bench_run_cost_summary.csv`` (medians, ratios,
goals) into ``--out``; progress on stderr.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pbexact.cli import ArgumentParser, out_folder, positive_int, run_main
from pbexact.errors import PBInputError
from pbexact.io import check_out_dir
from pbscale.runs import io

#: The LeNet setting of issue 55 (the paper's code was measured on it).
LENET = ["--model", "lenet", "--mode", "supermask", "--method", "arms", "--n", "10",
         "--param", "sigmoid", "--mask-lr", "0.1", "--lam", "0.005", "--batch-size", "128",
         "--epochs", "1", "--threads", "1", "--quiet"]
#: The MaskedNNRegression setting of issue 55.
REGRESS = ["--method", "arms", "--n", "10", "--param", "escort", "--epochs", "30",
           "--threads", "1"]


@dataclass(frozen=True)
class Case:
    """One measured command: its arguments after ``python`` (``{data}``: the MNIST folder,
    ``{out}``: a fresh output folder), whether it reads MNIST, and its goals (None: none)."""

    name: str
    text: str
    argv: tuple[str, ...]
    needs_data: bool
    wall_goal: float | None = None
    peak_goal: float | None = None


CASES = {c.name: c for c in (
    Case("import", "import pbscale.prune", ("-c", "import pbscale.prune"), False),
    Case("batch1", "LeNet ARMS n=10, 1 batch",
         ("-m", "pbscale.prune", *LENET, "--max-batches", "1", "--data-dir", "{data}",
          "--out", "{out}"), True, 3.0, 500.0),
    Case("epoch", "LeNet ARMS n=10, 1 epoch",
         ("-m", "pbscale.prune", *LENET, "--data-dir", "{data}", "--out", "{out}"), True,
         10.0, 535.0),
    Case("regress", "regression ARMS n=10, 30 epochs",
         ("-m", "pbscale.regress", *REGRESS, "--out", "{out}"), False, 7.0),
)}
#: The untimed runs of each checkout before the timed ones (Numba's cache, page cache).
WARMUPS = (
    ("-m", "pbscale.prune", *LENET, "--max-batches", "1", "--synthetic", "256",
     "--out", "{out}"),
    ("-m", "pbscale.regress", "--method", "arms", "--n", "10", "--param", "escort", "--epochs",
     "1", "--threads", "1", "--out", "{out}"),
)


def checkout(path: str) -> Path:
    """The root of a checkout of pbnn (the folder holding ``pbscale/prune.py``)."""
    root = Path(path).expanduser().resolve()
    if not (root / "pbscale" / "prune.py").is_file():
        raise PBInputError(f"--baseline-path {path} holds no pbnn checkout (no pbscale/prune.py); "
                           "make one with: git worktree add /tmp/pbnn-before <commit>")
    return root


def run_once(root: Path, argv: tuple[str, ...], data_dir: str) -> dict:
    """One process of ``python argv`` in checkout ``root`` (its code imported first: the
    working folder and ``PYTHONPATH``), one thread; wall seconds, CPU seconds and peak MiB."""
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="bench_run_cost_") as tmp:
        args = [a.format(data=data_dir, out=str(Path(tmp) / "out")) for a in argv]
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *args], cwd=root, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        stderr = proc.stderr.read() if proc.stderr is not None else b""
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        last = (stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise PBInputError(f"python {' '.join(args)} failed in {root} (exit "
                           f"{proc.returncode}: {last[:200]}); run it there by hand")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_mib": usage.ru_maxrss / 1024}


def measure(cases: list[Case], trees: dict[str, Path], repeats: int, data_dir: str = "",
            say=print) -> list[dict]:
    """One row per process: case, checkout ("current", "baseline"), repeat, wall and CPU
    seconds, peak MiB; the checkouts alternate within each repeat."""
    for code, root in trees.items():
        for argv in WARMUPS:
            run_once(root, argv, data_dir)
        say(f"warm-up of {code} ({root}) done")
    rows = []
    for case in cases:
        for r in range(repeats):
            order = list(trees.items())
            if r % 2:  # alternate which checkout goes first
                order.reverse()
            for code, root in order:
                m = run_once(root, case.argv, data_dir)
                rows.append({"case": case.name, "code": code, "repeat": r + 1, **m})
                say(f"{case.name} {code} {r + 1}/{repeats}: {m['wall_s']:.2f} s wall, "
                    f"{m['cpu_s']:.2f} s CPU, {m['peak_mib']:.0f} MiB")
    return rows


def summarize(rows: list[dict], cases: list[Case], codes: list[str]) -> list[dict]:
    """Medians per case and checkout, the baseline's over the current's, and the goals met
    (by the current checkout's medians)."""
    out = []
    for case in cases:
        med = {}
        for code in codes:
            mine = [r for r in rows if r["case"] == case.name and r["code"] == code]
            med[code] = {k: statistics.median(r[k] for r in mine)
                         for k in ("wall_s", "cpu_s", "peak_mib")}
            med[code]["fastest_wall_s"] = min(r["wall_s"] for r in mine)
        cur, base = med["current"], med.get("baseline")
        row = {"case": case.name, "what": case.text, "repeats": len(
                   [r for r in rows if r["case"] == case.name and r["code"] == "current"]),
               **{f"current_{k}": v for k, v in cur.items()}}
        row.update({f"baseline_{k}": base[k] if base else "" for k in cur})
        row.update({f"ratio_{k}": base[k] / cur[k] if base else "" for k in cur})
        row["wall_goal_s"] = case.wall_goal if case.wall_goal is not None else ""
        row["wall_met"] = "" if case.wall_goal is None else cur["wall_s"] <= case.wall_goal
        row["peak_goal_mib"] = case.peak_goal if case.peak_goal is not None else ""
        row["peak_met"] = "" if case.peak_goal is None else cur["peak_mib"] <= case.peak_goal
        out.append(row)
    return out


def table(summary: list[dict]) -> str:
    """The summary as text: medians of current and baseline, ratios, goals."""
    lines = [f"{'case':8s} {'current: wall s':>15s} {'fastest':>7s} {'CPU s':>6s} {'MiB':>5s} | "
             f"{'baseline: wall s':>16s} {'fastest':>7s} {'CPU s':>6s} {'MiB':>5s} | "
             f"{'ratio wall':>10s} {'CPU':>5s} {'MiB':>5s} | goal"]
    for s in summary:
        base = (f"{s['baseline_wall_s']:16.2f} {s['baseline_fastest_wall_s']:7.2f} "
                f"{s['baseline_cpu_s']:6.2f} {s['baseline_peak_mib']:5.0f} | "
                f"{s['ratio_wall_s']:10.2f} {s['ratio_cpu_s']:5.2f} {s['ratio_peak_mib']:5.2f}"
                if s["baseline_wall_s"] != ""
                else f"{'':16s} {'':7s} {'':6s} {'':5s} | {'':10s} {'':5s} {'':5s}")
        goals = []
        if s["wall_goal_s"] != "":
            goals.append(f"<= {s['wall_goal_s']:g} s {'met' if s['wall_met'] else 'NOT met'}")
        if s["peak_goal_mib"] != "":
            goals.append(f"<= {s['peak_goal_mib']:g} MiB "
                         f"{'met' if s['peak_met'] else 'NOT met'}")
        lines.append(f"{s['case']:8s} {s['current_wall_s']:15.2f} "
                     f"{s['current_fastest_wall_s']:7.2f} {s['current_cpu_s']:6.2f} "
                     f"{s['current_peak_mib']:5.0f} | {base} | {', '.join(goals) or '-'}")
    return "\n".join(lines)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m benchmarks.bench_run_cost",
                       description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default="",
                   help="MNIST folder (the batch1 and epoch cases), e.g. ../shared/data/mnist")
    p.add_argument("--baseline-path", default="",
                   help="another checkout of pbnn measured beside this one (e.g. the code "
                   "before a change: git worktree add /tmp/pbnn-before <commit>)")
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma list of {', '.join(CASES)} (default all)")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="processes per case and checkout (default 3; medians)")
    p.add_argument("--out", type=out_folder, default=Path("results"),
                   help="folder of the CSVs (default results)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args_or_code(argv)
    if isinstance(args, int):  # argparse's one-line error (2) or --help (0)
        return args

    def body() -> None:
        names = [c for c in args.cases.split(",") if c]
        unknown = [c for c in names if c not in CASES]
        if unknown or not names:
            raise PBInputError(f"--cases: unknown case {unknown[0] if unknown else '(none)'!r}; "
                               f"choose from {', '.join(CASES)}")
        cases = [CASES[c] for c in names]
        if any(c.needs_data for c in cases) and not args.data_dir:
            raise PBInputError("the batch1 and epoch cases read MNIST; give --data-dir (e.g. "
                               "../shared/data/mnist) or --cases import,regress")
        data_dir = str(Path(args.data_dir).resolve()) if args.data_dir else ""
        trees = {"current": Path(__file__).resolve().parent.parent}
        if args.baseline_path:
            trees["baseline"] = checkout(args.baseline_path)
        out = check_out_dir(args.out, "--out")
        for name in ("bench_run_cost.csv", "bench_run_cost_summary.csv"):
            io.check_output_file(out / name)

        def say(line: str) -> None:
            print(line, file=sys.stderr, flush=True)

        rows = measure(cases, trees, args.repeats, data_dir, say)
        summary = summarize(rows, cases, list(trees))
        print(table(summary))
        print(f"median of {args.repeats} processes each; one thread; {time.strftime('%F')}")
        io.write_csv(out / "bench_run_cost.csv", rows)
        io.write_csv(out / "bench_run_cost_summary.csv", summary)

    return run_main(body)


if __name__ == "__main__":
    sys.exit(main())
