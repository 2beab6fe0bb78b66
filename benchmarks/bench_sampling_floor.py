"""The floor of an MC pruning step's sampling on a CPU: per sample, drawing d uniforms alone
(24-bit integers from the CPU generator, `pbscale.methods.uniform_bits24`), a Bernoulli sample
(REINFORCE/LOORF) and an ARMS copula sample (one chunk of n; chunks of 10, which draw twice),
against a dense forward pass of the same network at the same batch, timed interleaved in one
process (CPU time). Says how close an MC step can come to the goal of 1.2 n dense forwards when
sampling alone costs this much.

    python -m benchmarks.bench_sampling_floor [--models lenet] [--batch 128] [--n 100]
        [--repeats 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from analysis.cli import run
from pbexact.cli import ArgumentParser, positive_int, thread_count
from pbscale.methods import BernoulliSampler, CopulaSampler, uniform_bits24
from pbscale.nets.models import INPUT_SHAPES, MODELS, build_model


def model_list(text: str) -> list[str]:
    """argparse type: comma-separated model names of ``pbscale.nets.models``."""
    names = [m.strip() for m in text.split(",")]
    if not text.strip() or not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated models like lenet,resnet20, "
                                         f"got {text!r}")
    bad = [m for m in names if m not in MODELS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown model {bad[0]!r}; choose from "
                                         f"{', '.join(MODELS)}")
    return names


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(prog="python -m benchmarks.bench_sampling_floor",
                        description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=model_list, default="lenet",
                    help=f"comma-separated, from {', '.join(MODELS)} (default lenet)")
    ap.add_argument("--batch", type=positive_int, default=128)
    ap.add_argument("--n", type=positive_int, default=100)
    ap.add_argument("--repeats", type=positive_int, default=20)
    ap.add_argument("--threads", type=thread_count, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    n = args.n
    for name in args.models:
        measure(name, args.batch, n, args.repeats)


def measure(name: str, batch: int, n: int, repeats: int) -> None:
    net = build_model(name, seed=0).eval()
    d = sum(net.get_parameter(p).numel() for p in net.masked_names(mask_shortcuts=True))
    x = torch.randn((batch, *INPUT_SHAPES[MODELS[name].dataset]))
    theta = torch.full((d,), 0.5)
    gen = torch.Generator().manual_seed(0)

    def forward() -> None:
        with torch.no_grad():
            net(x)

    def copula_chunks() -> None:
        s = CopulaSampler(theta, n, gen)
        for _ in range(0, n, 10):
            s.next(min(10, n - s.drawn))

    jobs = {"dense forward (1 pass)": (forward, 1),
            "uniforms alone": (lambda: uniform_bits24((n, d), gen), n),
            "Bernoulli sample": (lambda: BernoulliSampler(theta, gen).next(n), n),
            "ARMS sample, one chunk of n": (lambda: CopulaSampler(theta, n, gen).next(n), n),
            "ARMS sample, chunks of 10": (copula_chunks, n)}
    cpu: dict[str, list[float]] = {k: [] for k in jobs}
    for rep in range(repeats + 1):
        for key, (fn, _) in jobs.items():
            c = time.process_time()
            fn()
            if rep:
                cpu[key].append(time.process_time() - c)
    per = {k: 1e3 * statistics.median(v) / jobs[k][1] for k, v in cpu.items()}
    fwd = per["dense forward (1 pass)"]
    print(f"{name}: d={d:,} masked weights, batch {batch}, n={n}, "
          f"{torch.get_num_threads()} thread(s), CPU time per sample (median):")
    for key, ms in per.items():
        print(f"  {key:30s} {ms:8.3f} ms = {1e6 * ms / d:6.2f} ns/weight = "
              f"{ms / fwd:5.2f} dense forwards", flush=True)


if __name__ == "__main__":
    sys.exit(run(main))
