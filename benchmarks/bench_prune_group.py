"""Runs per hour of a pruning group (:mod:`pbscale.pruning.group`) against the same runs one at a
time, in one process:

    python -m benchmarks.bench_prune_group --data-dir ../shared/data/mnist --methods cp,arms \\
        --groups 8 --max-batches 20 --epochs 1 --out bench_prune_group.csv

For each method (LeNet-300-100 supermask; MC methods with ``--n`` samples) and group size G:
``--separate`` runs trained one after another with ``pbscale.prune.run`` (seeds 0..), then the
G runs (seeds 0..G-1) as one group with ``pbscale.prune.run_group``; each in a fresh temporary
folder, evaluation and file writing included (what a run costs). Runs per hour = runs / wall
seconds; ``ratio`` = the group's over the separate runs'. The separate runs are timed once per
method with ``min(--separate, G)`` runs (one at a time, a run's time does not depend on G). A
first tiny run of each path warms up lazy imports and first-call kernels outside the timing.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from pbexact.cli import ArgumentParser, nonneg_int, positive_int, run_main
from pbexact.errors import PBInputError
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun
from pbscale.runs import io
from pbscale.runs.runtime import resolve_device, set_threads


def configs(method: str, G: int, n: int, epochs: int, max_batches: int, data_dir: str,
            synthetic: int) -> list[pconfig.PruneConfig]:
    """The G runs (seeds 0..G-1) of a LeNet supermask setting."""
    return [pconfig.PruneConfig(model="lenet", mode="supermask", method=method, n=n,
                              epochs=epochs, max_batches=max_batches, data_dir=data_dir,
                              synthetic=synthetic, seed=s) for s in range(G)]


def time_separate(cfgs: list[pconfig.PruneConfig], device: str) -> float:
    """Wall seconds of the runs one after another (fresh folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        for c in cfgs:
            prun.run(c, Path(tmp), device, quiet=True)
        return time.perf_counter() - t0


def time_group(cfgs: list[pconfig.PruneConfig], device: str) -> float:
    """Wall seconds of the runs as one group (fresh folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        prun.run_group(cfgs, Path(tmp), device, quiet=True)
        return time.perf_counter() - t0


def measure(methods: list[str], groups: list[int], n: int, epochs: int, max_batches: int,
            data_dir: str = "", synthetic: int = 0, separate: int = 8, device: str = "cpu",
            say=print) -> list[dict]:
    """One row per (method, mode, runs): wall seconds, runs per hour and the ratio to the
    separate runs'."""
    rows: list[dict] = []
    for method in methods:
        warm = configs(method, 2, n, 1, 1, data_dir, synthetic)
        time_separate(warm[:1], device)
        time_group(warm, device)
        k = min(separate, max(groups))
        wall = time_separate(configs(method, k, n, epochs, max_batches, data_dir, synthetic),
                             device)
        base = k / wall * 3600
        rows.append({"method": method, "n": n, "mode": "one at a time", "runs": k,
                     "epochs": epochs, "max_batches": max_batches, "wall_s": wall,
                     "runs_per_hour": base, "ratio": 1.0})
        say(f"{method}: {k} runs one at a time {wall:.1f} s ({base:.0f} runs/hour)")
        for G in groups:
            gwall = time_group(configs(method, G, n, epochs, max_batches, data_dir, synthetic),
                               device)
            rate = G / gwall * 3600
            rows.append({"method": method, "n": n, "mode": "group", "runs": G,
                         "epochs": epochs, "max_batches": max_batches, "wall_s": gwall,
                         "runs_per_hour": rate, "ratio": rate / base})
            say(f"{method}: group of {G} {gwall:.1f} s ({rate:.0f} runs/hour, "
                f"{rate / base:.2f}x one at a time)")
    return rows


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m benchmarks.bench_prune_group",
                       description=__doc__.splitlines()[0])
    p.add_argument("--methods", default="cp,arms", help="comma list of pruning methods")
    p.add_argument("--groups", default="8", help="comma list of group sizes")
    p.add_argument("--n", type=positive_int, default=10, help="MC samples per step")
    p.add_argument("--epochs", type=positive_int, default=1,
                   help="epochs of each run (default 1)")
    p.add_argument("--max-batches", type=positive_int, default=20,
                   help="batches per epoch (default 20)")
    p.add_argument("--separate", type=positive_int, default=8,
                   help="runs timed one at a time (at most the largest group)")
    p.add_argument("--data-dir", default="", help="MNIST folder (default: --synthetic images)")
    p.add_argument("--synthetic", type=nonneg_int, default=0,
                   help="random images instead of --data-dir (that many training images)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", default="", help="CSV of the rows")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args_or_code(argv)
    if isinstance(args, int):  # argparse's one-line error (2) or --help (0)
        return args

    def body() -> None:
        if not args.data_dir and not args.synthetic:
            raise PBInputError("no data; give --data-dir (MNIST) or --synthetic N")
        try:
            groups = [int(g) for g in args.groups.split(",")]
        except ValueError:
            raise PBInputError(f"--groups takes whole numbers, got {args.groups!r}; give "
                               "group sizes like 1,8,32") from None
        if min(groups) < 1:
            raise PBInputError(f"--groups: group sizes are >= 1, got {args.groups!r}; give "
                               "sizes like 1,8,32")
        set_threads(args.threads)
        dev = str(resolve_device(args.device))
        rows = measure(args.methods.split(","), groups, args.n, args.epochs, args.max_batches,
                       args.data_dir, args.synthetic, args.separate, dev)
        print(f"torch threads {torch.get_num_threads()}, device {dev}")
        if args.out:
            io.write_csv(Path(args.out), rows)

    return run_main(body)


if __name__ == "__main__":
    sys.exit(main())
