"""Benchmark of the vectorized microworld runs (`analysis.microworld`), printed, never asserted.

Per-step cost of training 100 seeds at once (one batched computation, `analysis.microworld.runs`
and `analysis.microworld.hybrid`) against a Python loop over the same 100 seeds (each seed its
own run, seeds=1), measured in the same process at d = 10 with the exact loss logged every step,
as the experiments do. Goal: at least 20x for the exact-core estimators. Timings are the best of
``--repeats`` (least disturbed by other processes on a shared machine).

    python -m benchmarks.bench_microworld [--seeds 100] [--steps 200] [--loop-steps 30]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from analysis.cli import run, write_json
from analysis.microworld.hybrid import run_torch
from analysis.microworld.runs import check_run_memory, run_exact
from benchmarks.timing import best_time
from pbexact.cli import ArgumentParser, positive_int, step_count
from pbexact.errors import check_d
from pbexact.instances import NNLoss
from pbexact.io import check_out_dir

CASES = (
    ("reinforce", 1, "exact"), ("loorf", 10, "exact"), ("arms", 10, "exact"),
    ("betastar", 10, "exact"), ("loorf", 10, "escort"), ("st", 1, "torch"),
    ("rebar", 1, "torch"), ("relax", 1, "torch"),
)



def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m benchmarks.bench_microworld",
                                description=__doc__.splitlines()[0])
    p.add_argument("--d", type=positive_int, default=10)
    p.add_argument("--seeds", type=positive_int, default=100)
    p.add_argument("--steps", type=step_count(), default=200,
                   help="steps timed for the vectorized run")
    p.add_argument("--loop-steps", type=step_count(), default=30,
                   help="steps timed per seed in the loop")
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--out", type=Path, default=Path("results"))
    args = p.parse_args(argv)
    check_d(args.d, limit=16)
    check_run_memory(args.steps, 1, 1, args.seeds, max(n for _, n, _ in CASES), args.d)
    check_out_dir(args.out)
    torch.set_num_threads(1)
    net = NNLoss(args.d, 0)
    J = net.table()

    def runner(method: str, n: int, kind: str, seeds: int, steps: int, seed: int):
        if kind == "torch":
            return lambda: run_torch(net, J, method, n, 0.1, steps, seeds, seed)
        param = "sigmoid" if kind == "exact" else kind
        return lambda: run_exact(J, method, n, param, 0.1, steps, seeds, seed)

    rows = []
    print(f"d={args.d}, {args.seeds} seeds, per-step cost of all seeds (ms), best of "
          f"{args.repeats}; goal: loop / vectorized >= 20x")
    print(f"{'method':18s} {'vectorized':>11s} {'loop':>10s} {'ratio':>7s}")
    for method, n, kind in CASES:
        # the loop runs each seed on its own: seeds=1, its own seed
        runner(method, n, kind, args.seeds, 5, 0)()  # warm-up: first calls pay one-off costs
        vec = best_time(runner(method, n, kind, args.seeds, args.steps, 0), args.repeats)
        vec_step = vec / args.steps

        per_seed = [runner(method, n, kind, 1, args.loop_steps, s) for s in range(args.seeds)]
        loop_step = best_time(lambda fs=per_seed: [f() for f in fs], max(1, args.repeats - 1))
        loop_step /= args.loop_steps
        ratio = loop_step / vec_step
        name = f"{method} n={n}" + (f" {kind}" if kind not in ("exact", "torch") else "")
        print(f"{name:18s} {1e3 * vec_step:11.3f} {1e3 * loop_step:10.2f} {ratio:6.1f}x")
        rows.append({"method": method, "n": n, "kind": kind, "vectorized_ms_per_step":
                     1e3 * vec_step, "loop_ms_per_step": 1e3 * loop_step, "ratio": ratio})
    write_json(args.out / "bench_microworld.json", {"d": args.d, "seeds": args.seeds, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
