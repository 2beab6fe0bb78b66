"""Runs per hour of MaskedNNRegression runs (one setting of a method, several seeds and learning
rates): as one regression group (mode ``group``, as ``python -m pbscale.regress --seeds`` trains
them: all runs one computation) against one at a time
(the loop, in one process) and against parallel processes (``python -m pbscale.regress``
children, ``--procs`` at once), measured in the same run on the same runs; each method of
``--method`` (comma-separated: any method that batches, e.g. ``cp,rebar``) in turn, in this
process.

    python -m benchmarks.bench_regress_group [--method loorf] [--n 10] [--seeds 4]
        [--lrs 0.1,0.01] [--epochs 2] [--procs 2] [--modes group,serial,parallel]
        [--device cpu] [--csv FILE]

Each mode writes to its own temporary folder (deleted afterwards); the times include what each
mode really pays (process start-up and data set-up for the parallel processes). Wall-clock
runs per hour, and the CPU seconds (this process's, plus the children's for the parallel
processes), whose ratios hold on a machine shared with other jobs; on a GPU only wall time
counts. The group mode runs through the run loop (:func:`pbscale.runs.loop.run`: checkpoints and
run folders every epoch).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from analysis.cli import run
from pbexact.cli import (
    ArgumentParser,
    choice_list,
    int_in_range,
    one_or_list,
    positive_float,
    positive_int,
    thread_count,
)
from pbexact.errors import PBInputError
from pbscale.methods import MethodConfig, names
from pbscale.regression import run as rrun
from pbscale.regression.group import MAX_RUNS, MaskTrainerGroup, train_group
from pbscale.regression.problem import RegressionProblem, make_problem
from pbscale.runs import io
from pbscale.runs.jobs import listed_values
from pbscale.runs.runtime import resolve_device

#: The modes :func:`time_modes` can time, by name.
MODES = ("group", "serial", "parallel")
LABELS = {"group": "one group (one process)", "serial": "one at a time (one process)",
          "parallel": "{procs} parallel processes"}


def time_modes(configs: list[MethodConfig], epochs: int, dev: torch.device,
               modes: tuple[str, ...] = MODES, procs: int = 2, threads: int = 1,
               problem: RegressionProblem | None = None, tmp_dir: str | Path | None = None
               ) -> dict[str, tuple[float, float]]:
    """Train the runs ``configs`` for ``epochs`` epochs in each mode of ``modes`` (group:
    :func:`pbscale.regression.group.train_group`, all runs one group; serial:
    :func:`pbscale.regression.run.train` one run after another; parallel: ``procs`` children
    ``python -m pbscale.regress`` at once, each with ``threads`` torch threads, the paper's
    problem); each mode in its own temporary folder (under ``tmp_dir``; default the system's).
    ``problem``: the in-process modes' problem (default the paper's on ``dev``, built inside
    each timed mode). Returns {mode: (wall
    seconds, CPU seconds of this process and its children)}."""
    res: dict[str, tuple[float, float]] = {}

    def cpu() -> float:
        own = time.process_time()
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own + kids.ru_utime + kids.ru_stime

    def get_problem() -> RegressionProblem:
        return make_problem(0, dev) if problem is None else problem

    with tempfile.TemporaryDirectory(dir=tmp_dir) as tmp:
        def group() -> None:
            train_group(configs, epochs, get_problem(), out=f"{tmp}/group", device=dev)

        def serial() -> None:
            prob = get_problem()
            for c in configs:
                rrun.train(c, epochs, f"{tmp}/serial", device=str(dev), problem=prob,
                              progress=False)

        def child(c: MethodConfig) -> int:
            cmd = [sys.executable, "-m", "pbscale.regress", "--method", c.method, "--n",
                   str(c.n), "--lr", str(c.lr), "--optimizer", c.optimizer, "--seed",
                   str(c.seed), "--epochs",
                   str(epochs), "--device", str(dev), "--threads", str(threads),
                   "--out", f"{tmp}/procs", "--quiet"]
            return subprocess.run(cmd, capture_output=True, env=os.environ).returncode

        def parallel() -> None:
            with ThreadPoolExecutor(procs) as pool:
                codes = list(pool.map(child, configs))
            if any(codes):
                raise RuntimeError(f"a child run failed: exit codes {codes}")

        jobs = {"group": group, "serial": serial, "parallel": parallel}
        for mode in modes:
            t0, c0 = time.perf_counter(), cpu()
            jobs[mode]()
            res[mode] = (time.perf_counter() - t0, cpu() - c0)
    return res


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(prog="python -m benchmarks.bench_regress_group",
                        description=__doc__.splitlines()[0])
    ap.add_argument("--method", type=choice_list(names("regress-group"), "methods"),
                    default="loorf",
                    help="comma-separated methods that train in groups, each timed in turn "
                    "(default loorf)")
    ap.add_argument("--n", type=positive_int, default=10)
    ap.add_argument("--seeds", type=positive_int, default=4)
    ap.add_argument("--lrs", type=one_or_list(positive_float), default="0.1,0.01",
                    help="comma-separated learning rates (default 0.1,0.01)")
    ap.add_argument("--epochs", type=positive_int, default=2)
    ap.add_argument("--procs", type=int_in_range(1, 1024, "parallel processes"), default=2,
                    help="parallel processes")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:K or auto (default cpu)")
    ap.add_argument("--threads", type=thread_count, default=1, help="torch threads per process")
    ap.add_argument("--modes", type=choice_list(MODES, "modes"), default=",".join(MODES),
                    help="what to time (serial, one at a time, is the ratios' baseline and "
                    "always timed)")
    ap.add_argument("--csv", default=None, help="also write the rows to this CSV file")
    args = ap.parse_args(argv)
    lrs = listed_values(args.lrs)
    if args.seeds * len(lrs) > MAX_RUNS:  # counted before the list is built
        raise PBInputError(f"{args.seeds * len(lrs):,} runs (--seeds x --lrs), more than the "
                           f"{MAX_RUNS:,} one group holds; lower --seeds")
    runs = {m: [MethodConfig(m, args.n, "sigmoid", lr, seed=s)
                for lr in lrs for s in range(args.seeds)] for m in args.method}
    for configs in runs.values():
        MaskTrainerGroup.check(configs)  # the method, n and rates, before any work
    modes = tuple(m for m in MODES if m in args.modes or m == "serial")
    dev = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    rows = []
    for method, configs in runs.items():
        G = len(configs)
        print(f"{G} runs: {method} n={args.n}, lr in {lrs}, {args.seeds} seeds, "
              f"{args.epochs} epochs of 100 steps, d=8,050, device {dev}, {args.threads} "
              f"thread(s) per process")
        try:
            timed = time_modes(configs, args.epochs, dev, modes, args.procs, args.threads)
        except RuntimeError as e:
            sys.exit(str(e))
        base_wall, base_cpu = timed["serial"]
        print(f"{'':<30} {'wall s':>8} {'runs/hour':>10} {'ratio':>6}   {'CPU s':>7} "
              f"{'ratio':>6}")
        for mode, (sec, cpu_s) in timed.items():
            name = LABELS[mode].format(procs=args.procs)
            print(f"{name:<30} {sec:8.1f} {G / sec * 3600:10.0f} {base_wall / sec:5.2f}x   "
                  f"{cpu_s:7.1f} {base_cpu / cpu_s:5.2f}x")
            rows.append({"method": method, "n": args.n, "runs": G, "epochs": args.epochs,
                         "mode": mode, "wall_s": sec, "runs_per_hour": G / sec * 3600,
                         "ratio": base_wall / sec, "cpu_s": cpu_s, "cpu_ratio": base_cpu / cpu_s,
                         "device": str(dev), "load": os.getloadavg()[0]})
        print("ratio: one at a time / this mode (higher is faster); load average "
              f"{os.getloadavg()[0]:.1f}")
    if args.csv:
        io.write_csv(Path(args.csv), rows)


if __name__ == "__main__":
    sys.exit(run(main))
