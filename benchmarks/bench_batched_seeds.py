"""Runs per hour of MaskedNNRegression runs (one MC setting, several seeds and learning rates):
batched (:mod:`pbscale.batched_seeds`, all runs one computation) against one at a time (the
loop, in one process) and against parallel processes (``python -m pbscale.regress`` children,
``--procs`` at once), measured in the same run on the same runs.

    python -m benchmarks.bench_batched_seeds [--method loorf] [--n 10] [--seeds 4]
        [--lrs 0.1,0.01] [--epochs 2] [--procs 2] [--device cpu]

Each mode writes to its own temporary folder (deleted afterwards); the times include what each
mode really pays (process start-up and data set-up for the parallel processes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from pbexact.errors import ArgumentParser
from pbscale import regress
from pbscale.batched_seeds import train_batched
from pbscale.methods import MethodConfig
from pbscale.regression import make_problem


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="loorf")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--lrs", default="0.1,0.01")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--procs", type=int, default=2, help="parallel processes")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
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
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        problem = make_problem(0, dev)
        train_batched(configs, args.epochs, problem, out=f"{tmp}/batched", device=dev)
        res["batched (one process)"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        problem = make_problem(0, dev)
        for c in configs:
            regress.train(c, args.epochs, f"{tmp}/serial", device=str(dev), problem=problem,
                          progress=False)
        res["one at a time (one process)"] = time.perf_counter() - t0

        def child(c: MethodConfig) -> int:
            cmd = [sys.executable, "-m", "pbscale.regress", "--method", c.method, "--n",
                   str(c.n), "--lr", str(c.lr), "--seed", str(c.seed), "--epochs",
                   str(args.epochs), "--device", str(dev), "--threads", str(args.threads),
                   "--out", f"{tmp}/procs", "--quiet"]
            return subprocess.run(cmd, capture_output=True, env=os.environ).returncode

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.procs) as pool:
            codes = list(pool.map(child, configs))
        if any(codes):
            sys.exit(f"a child run failed: exit codes {codes}")
        res[f"{args.procs} parallel processes"] = time.perf_counter() - t0
    base = res["one at a time (one process)"]
    for name, sec in res.items():
        print(f"{name:<30} {sec:8.1f} s  {G / sec * 3600:8.0f} runs/hour  "
              f"({base / sec:.2f}x one at a time)")


if __name__ == "__main__":
    main()
