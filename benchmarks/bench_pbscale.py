"""Time per optimization step on MaskedNNRegression (d = 8,050, batch 100): chunked-batched
evaluation (vmap over k masks at once, `alg:iter_loorf` accumulators across chunks) against a
Python loop over samples (one forward per mask, the per-sample recursion), in the same run, for
n in {10, 100, 1000}; plus peak memory of one step. Goal: >= 5x at n = 100 on a 2-core CPU.

    python -m benchmarks.bench_pbscale [--device cpu] [--estimator loorf] [--out DIR]

--out defaults to results/; --out figures updates the committed CSV.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from analysis.cli import run
from pbexact.cli import ArgumentParser, positive_int_list
from pbexact.io import check_out_dir
from pbscale.forward.masks import mean_absolute_error
from pbscale.methods import MC_METHODS, MaskTrainer, MethodConfig
from pbscale.regression.problem import BATCH, make_problem
from pbscale.runs import io
from pbscale.runs.memory import peak_memory
from pbscale.runs.runtime import resolve_device

REPEATS = {10: 30, 100: 10, 1000: 3}


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--estimator", default="loorf", choices=MC_METHODS)
    ap.add_argument("--ns", type=positive_int_list, default=[10, 100, 1000],
                    help="sample counts n (default 10,100,1000)")
    ap.add_argument("--out", default="results", help="folder of the CSV (default results)")
    ap.add_argument("--no-memory", action="store_true",
                    help="skip the peak-memory measurements (a fresh process each)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for n in args.ns:
        MethodConfig(method=args.estimator, n=n).validate()
    dev = resolve_device(args.device)  # a missing GPU is refused before --out is created
    if not args.child:
        check_out_dir(args.out)
    prob = make_problem(0, dev)
    idx = torch.arange(BATCH, device=dev)
    x, y = prob.x_train[idx], prob.y_train[idx]
    batched = prob.batch_loss(idx)

    def looped(z: torch.Tensor) -> torch.Tensor:
        # one forward per mask, the per-sample loop the chunking replaces
        return torch.stack([mean_absolute_error(prob.masked.forward(zs[None], x), y)[0]
                            for zs in z])

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def trainer(n: int, mode: str) -> tuple[MaskTrainer, object]:
        chunk = {"loop": 1, "batched": None, "one_shot": n}[mode]
        cfg = MethodConfig(method=args.estimator, n=n, chunk=chunk)
        tr = MaskTrainer(cfg, prob.d, 1000, dev, bytes_per_sample=prob.bytes_per_sample())
        return tr, looped if mode == "loop" else batched

    if args.child:  # one fresh process per memory measurement: no earlier step's pools
        n_str, mode = args.child.split(",")
        tr, f = trainer(int(n_str), mode)
        print(json.dumps({"peak": peak_memory(lambda: tr.step(f), dev), "chunk": tr.chunk}))
        return

    rows = []
    for n in args.ns:
        res: dict = {"n": n, "estimator": args.estimator, "device": str(dev),
                     "threads": torch.get_num_threads()}
        pair = {mode: trainer(n, mode) for mode in ("batched", "loop")}
        times: dict[str, list[float]] = {"batched": [], "loop": []}
        for rep in range(REPEATS.get(n, 3) + 1):
            for mode, (tr, f) in pair.items():  # interleaved: both see the same machine load
                sync()
                t = time.perf_counter()
                tr.step(f)
                sync()
                if rep:  # the first is warm-up
                    times[mode].append(time.perf_counter() - t)
        for mode in ("batched", "loop"):
            res[f"{mode}_ms"] = 1e3 * statistics.median(times[mode])
        res["speedup"] = res["loop_ms"] / res["batched_ms"]
        for mode in ("batched", "loop", "one_shot"):
            if args.no_memory:
                res[f"{mode}_peak_mib"] = float("nan")
                res[f"{mode}_chunk"] = {"batched": pair["batched"][0].chunk, "loop": 1,
                                        "one_shot": n}[mode]
                continue
            child = subprocess.run(
                [sys.executable, "-m", "benchmarks.bench_pbscale", "--device", str(dev),
                 "--estimator", args.estimator, "--child", f"{n},{mode}"],
                capture_output=True, text=True, check=True)
            got = json.loads(child.stdout.strip().splitlines()[-1])
            res[f"{mode}_peak_mib"] = (got["peak"] or 0) / 2**20
            res[f"{mode}_chunk"] = got["chunk"]
        rows.append(res)
        print(f"n={n:5d} chunk={res['batched_chunk']:4d}  batched {res['batched_ms']:9.2f} ms  "
              f"loop {res['loop_ms']:9.2f} ms  speedup {res['speedup']:5.2f}x  "
              f"peak MiB: batched {res['batched_peak_mib']:7.1f} loop {res['loop_peak_mib']:7.1f} "
              f"one-shot (k=n) {res['one_shot_peak_mib']:7.1f}", flush=True)
    out = Path(args.out)
    io.write_csv(out / f"bench_pbscale_{dev.type}.csv", rows)
    print(f"wrote {out / f'bench_pbscale_{dev.type}.csv'}")


if __name__ == "__main__":
    sys.exit(run(main))
