"""ARMS step against LOORF step on MaskedNNRegression (d = 8,050, batch 100), interleaved in one
process so both see the same machine load; goal: ARMS <= 1.3x LOORF at n = 100 (one thread).
Also times the samplers alone (the copula sampler against the Bernoulli sampler). Wall time, and
the process's CPU time (less sensitive to other jobs on a shared machine; on a GPU it does not
count the device's work).

    python -m benchmarks.bench_arms_step [--ns 100] [--repeats 40] [--threads 1] [--device cpu]
"""

from __future__ import annotations

import statistics
import time

import torch

from pbexact.cli import ArgumentParser, positive_int
from pbscale.methods import BernoulliSampler, CopulaSampler, MaskTrainer, MethodConfig
from pbscale.regression import BATCH, make_problem


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="100")
    ap.add_argument("--repeats", type=positive_int, default=40)
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    prob = make_problem(0, dev)
    f = prob.batch_loss(torch.arange(BATCH, device=dev))

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for n in (int(v) for v in args.ns.split(",")):
        trainers = {m: MaskTrainer(MethodConfig(method=m, n=n), prob.d, 1000, dev,
                                   bytes_per_sample=prob.bytes_per_sample())
                    for m in ("arms", "loorf")}
        theta = trainers["arms"].theta()
        gen = torch.Generator(device=dev).manual_seed(0)
        samplers = {
            "copula": lambda theta=theta, n=n, gen=gen: CopulaSampler(theta, n, gen).next(n),
            "bernoulli": lambda theta=theta, n=n, gen=gen: BernoulliSampler(theta, gen).next(n),
        }
        jobs = {**{m: (lambda t=t: t.step(f)) for m, t in trainers.items()}, **samplers}
        times: dict[str, list[float]] = {k: [] for k in jobs}
        cpu: dict[str, list[float]] = {k: [] for k in jobs}
        for rep in range(args.repeats + 2):
            for name, job in jobs.items():
                sync()
                t0, c0 = time.perf_counter(), time.process_time()
                job()
                sync()
                if rep >= 2:  # warm-up
                    times[name].append(time.perf_counter() - t0)
                    cpu[name].append(time.process_time() - c0)
        med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        low = {k: 1e3 * min(v) for k, v in times.items()}
        cmed = {k: 1e3 * statistics.median(v) for k, v in cpu.items()}
        print(f"n={n} chunk={trainers['arms'].chunk} threads={torch.get_num_threads()} "
              f"device={dev}: step ARMS {med['arms']:.2f} ms, LOORF {med['loorf']:.2f} ms, "
              f"ratio {med['arms'] / med['loorf']:.2f} (median; min-based "
              f"{low['arms'] / low['loorf']:.2f}); samplers: copula {med['copula']:.2f} ms, "
              f"Bernoulli {med['bernoulli']:.2f} ms", flush=True)
        print(f"  CPU time (median): step ARMS {cmed['arms']:.2f} ms, LOORF {cmed['loorf']:.2f} ms,"
              f" ratio {cmed['arms'] / cmed['loorf']:.2f}; samplers: copula "
              f"{cmed['copula']:.2f} ms, Bernoulli {cmed['bernoulli']:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
