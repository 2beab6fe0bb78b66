"""Runs per hour of MaskedNNRegression runs (one MC setting, several seeds and learning rates):
batched (:mod:`pbscale.batched_seeds`, all runs one computation) against one at a time (the
loop, in one process) and against parallel processes (``python -m pbscale.regress`` children,
``--procs`` at once), measured in the same run on the same runs.

    python -m benchmarks.bench_batched_seeds [--method loorf] [--n 10] [--seeds 4]
        [--lrs 0.1,0.01] [--epochs 2] [--procs 2] [--device cpu]

Each mode writes to its own temporary folder (deleted afterwards); the times include what each
mode really pays (process start-up and data set-up for the parallel processes). Wall-clock
runs per hour, and the CPU seconds (this process's, plus the children's for the parallel
processes), whose ratios hold on a machine shared with other jobs; on a GPU only wall time
counts. The batched mode runs through the run loop (:func:`pbscale.loop.run`: checkpoints and
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

import torch

from pbexact.cli import ArgumentParser, positive_int
from pbscale import regress
from pbscale.batched_seeds import train_batched
from pbscale.methods import MethodConfig
from pbscale.regression import make_problem


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="loorf")
    ap.add_argument("--n", type=positive_int, default=10)
    ap.add_argument("--seeds", type=positive_int, default=4)
    ap.add_argument("--lrs", default="0.1,0.01")
    ap.add_argument("--epochs", type=positive_int, default=2)
    ap.add_argument("--procs", type=positive_int, default=2, help="parallel processes")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch threads per process")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    lrs = [float(v) for v in args.lrs.split(",")]
    configs = [MethodConfig(args.method, args.n, "sigmoid", lr, seed=s)
               for lr in lrs for s in range(args.seeds)]
    G = len(configs)
    print(f"{G} runs: {args.method} n={args.n}, lr in {lrs}, {args.seeds} seeds, "
          f"{args.epochs} epochs of 100 steps, d=8,050, device {dev}, {args.threads} thread(s)"
          f" per process")
    res: dict[str, tuple[float, float]] = {}

    def cpu() -> float:
        own = time.process_time()
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own + kids.ru_utime + kids.ru_stime

    def timed(name: str, fn) -> None:
        t0, c0 = time.perf_counter(), cpu()
        fn()
        res[name] = (time.perf_counter() - t0, cpu() - c0)

    with tempfile.TemporaryDirectory() as tmp:
        def batched() -> None:
            problem = make_problem(0, dev)
            train_batched(configs, args.epochs, problem, out=f"{tmp}/batched", device=dev)

        def serial() -> None:
            problem = make_problem(0, dev)
            for c in configs:
                regress.train(c, args.epochs, f"{tmp}/serial", device=str(dev), problem=problem,
                              progress=False)

        def child(c: MethodConfig) -> int:
            cmd = [sys.executable, "-m", "pbscale.regress", "--method", c.method, "--n",
                   str(c.n), "--lr", str(c.lr), "--seed", str(c.seed), "--epochs",
                   str(args.epochs), "--device", str(dev), "--threads", str(args.threads),
                   "--out", f"{tmp}/procs", "--quiet"]
            return subprocess.run(cmd, capture_output=True, env=os.environ).returncode

        def parallel() -> None:
            with ThreadPoolExecutor(args.procs) as pool:
                codes = list(pool.map(child, configs))
            if any(codes):
                sys.exit(f"a child run failed: exit codes {codes}")

        timed("batched (one process)", batched)
        timed("one at a time (one process)", serial)
        timed(f"{args.procs} parallel processes", parallel)
    base_wall, base_cpu = res["one at a time (one process)"]
    print(f"{'':<30} {'wall s':>8} {'runs/hour':>10} {'ratio':>6}   {'CPU s':>7} {'ratio':>6}")
    for name, (sec, cpu_s) in res.items():
        print(f"{name:<30} {sec:8.1f} {G / sec * 3600:10.0f} {base_wall / sec:5.2f}x   "
              f"{cpu_s:7.1f} {base_cpu / cpu_s:5.2f}x")
    print("ratio: one at a time / this mode (higher is faster); load average "
          f"{os.getloadavg()[0]:.1f}")

if __name__ == "__main__":
    main()
