"""ARMS step against LOORF step on MaskedNNRegression (d = 8,050, batch 100), interleaved in one
process so both see the same machine load; goal: ARMS <= 1.3x LOORF at n = 100 (one thread).
Also times the samplers alone (the copula sampler against the Bernoulli sampler). Wall time, and
the process's CPU time (less sensitive to other jobs on a shared machine; on a GPU it does not
count the device's work).

    python -m benchmarks.bench_arms_step [--ns 100] [--repeats 40] [--threads 1] [--device cpu]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from analysis.cli import run
from pbexact.cli import (
    ArgumentParser,
    positive_int,
    positive_int_list,
    thread_count,
)
from pbscale.methods import BernoulliSampler, CopulaSampler, MaskTrainer, MethodConfig
from pbscale.regression.problem import BATCH, RegressionProblem, make_problem
from pbscale.runs.runtime import resolve_device


def step_ratio(n: int, repeats: int, dev: torch.device, problem: RegressionProblem | None = None
               ) -> dict[str, float]:
    """ARMS and LOORF steps at ``n`` and the copula and Bernoulli samplers alone, interleaved
    (``repeats`` timed rounds after two warm-up rounds) on MaskedNNRegression (``problem``:
    default the paper's, data seed 0, on ``dev``). Returns the medians and minima (ms) of wall
    and process CPU time per job (``<job>_ms``, ``<job>_min_ms``, ``<job>_cpu_ms`` for job in
    arms, loorf, copula, bernoulli), ``ratio`` (ARMS / LOORF, medians), ``ratio_min`` (minima),
    ``ratio_cpu`` and the chunk."""
    prob = make_problem(0, dev) if problem is None else problem
    f = prob.batch_loss(torch.arange(BATCH, device=dev))

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    trainers = {m: MaskTrainer(MethodConfig(method=m, n=n), prob.d, 1000, dev,
                               bytes_per_sample=prob.bytes_per_sample())
                for m in ("arms", "loorf")}
    theta = trainers["arms"].theta()
    gen = torch.Generator(device=dev).manual_seed(0)
    samplers = {
        "copula": lambda: CopulaSampler(theta, n, gen).next(n),
        "bernoulli": lambda: BernoulliSampler(theta, gen).next(n),
    }
    jobs = {**{m: (lambda t=t: t.step(f)) for m, t in trainers.items()}, **samplers}
    times: dict[str, list[float]] = {k: [] for k in jobs}
    cpu: dict[str, list[float]] = {k: [] for k in jobs}
    for rep in range(repeats + 2):
        for name, job in jobs.items():
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            job()
            sync()
            if rep >= 2:  # warm-up
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    out: dict[str, float] = {"n": n, "chunk": trainers["arms"].chunk}
    for k in jobs:
        out[f"{k}_ms"] = 1e3 * statistics.median(times[k])
        out[f"{k}_min_ms"] = 1e3 * min(times[k])
        out[f"{k}_cpu_ms"] = 1e3 * statistics.median(cpu[k])
    out["ratio"] = out["arms_ms"] / out["loorf_ms"]
    out["ratio_min"] = out["arms_min_ms"] / out["loorf_min_ms"]
    out["ratio_cpu"] = out["arms_cpu_ms"] / out["loorf_cpu_ms"]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(prog="python -m benchmarks.bench_arms_step",
                        description=__doc__.splitlines()[0])
    ap.add_argument("--ns", type=positive_int_list, default=[100],
                    help="samples per step, comma-separated (default 100)")
    ap.add_argument("--repeats", type=positive_int, default=40)
    ap.add_argument("--threads", type=thread_count, default=1)
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:K or auto (default cpu)")
    args = ap.parse_args(argv)
    for n in args.ns:  # ARMS and LOORF need n >= 2: refused before any work
        for method in ("arms", "loorf"):
            MethodConfig(method=method, n=n).validate()
    dev = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    prob = make_problem(0, dev)
    for n in args.ns:
        r = step_ratio(n, args.repeats, dev, prob)
        print(f"n={n} chunk={r['chunk']} threads={torch.get_num_threads()} "
              f"device={dev}: step ARMS {r['arms_ms']:.2f} ms, LOORF {r['loorf_ms']:.2f} ms, "
              f"ratio {r['ratio']:.2f} (median; min-based {r['ratio_min']:.2f}); samplers: "
              f"copula {r['copula_ms']:.2f} ms, Bernoulli {r['bernoulli_ms']:.2f} ms", flush=True)
        print(f"  CPU time (median): step ARMS {r['arms_cpu_ms']:.2f} ms, LOORF "
              f"{r['loorf_cpu_ms']:.2f} ms, ratio {r['ratio_cpu']:.2f}; samplers: copula "
              f"{r['copula_cpu_ms']:.2f} ms, Bernoulli {r['bernoulli_cpu_ms']:.2f} ms", flush=True)


if __name__ == "__main__":
    sys.exit(run(main))
