"""Host synchronizations inside ARMS / LOORF steps on a GPU: runs each piece of a step a few times
under ``torch.cuda.set_sync_debug_mode("error")`` (any synchronizing call raises) on the
MaskedNNRegression problem (d = 8,050, batch 100) and reports, per piece, "no sync" or the
first synchronizing call (file:line). Pieces: the copula sampler (ARMS) and the Bernoulli
sampler (LOORF) over a step's chunks, the batched loss, and a whole optimizer step
(``MaskTrainer.surrogate`` + backward + ``apply``) for each estimator.

    python -m benchmarks.check_gpu_sync [--n 100] [--chunk 25] [--steps 3]

Exit code 0 when every piece is free of synchronizations, 1 otherwise; without a CUDA GPU it
prints that and exits with 0 (nothing to check).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable

import torch


def _first_sync(fn: Callable[[], object]) -> str | None:
    """None if fn runs without a host synchronization, else where the first one happened."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as e:
        if "synchroniz" not in str(e):
            raise
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if "/torch/" not in f.filename]
        where = frames[-1] if frames else traceback.extract_tb(e.__traceback__)[-1]
        return f"{where.filename}:{where.lineno} ({where.line})"
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="samples per step (default 100)")
    ap.add_argument("--chunk", type=int, default=25, help="samples per chunk (default 25)")
    ap.add_argument("--steps", type=int, default=3, help="steps per piece (default 3)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("check_gpu_sync: no CUDA GPU is visible; nothing to check (run it on a GPU "
              "machine)")
        return 0
    from pbscale.methods import BernoulliSampler, CopulaSampler, MaskTrainer, MethodConfig
    from pbscale.regression import BATCH, make_problem

    dev = torch.device("cuda")
    prob = make_problem(0, dev)
    f = prob.batch_loss(torch.arange(BATCH, device=dev))
    n, chunk = args.n, min(args.chunk, args.n)
    gen = torch.Generator(device=dev).manual_seed(0)
    theta = torch.full((prob.d,), 0.3, device=dev)

    def sample(make: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(args.steps):
                s = make()
                for _ in range(0, n, chunk):
                    s.next(min(chunk, n))
        return run

    pieces: dict[str, Callable[[], object]] = {
        "copula sampler (ARMS)": sample(lambda: CopulaSampler(theta, n, gen)),
        "Bernoulli sampler (LOORF)": sample(lambda: BernoulliSampler(theta, gen)),
        "batched loss f(z)": lambda: f(torch.ones(chunk, prob.d, device=dev)),
    }
    for est in ("arms", "loorf"):
        tr = MaskTrainer(MethodConfig(method=est, n=n, chunk=chunk), prob.d, 1000, dev)

        def step(tr: MaskTrainer = tr) -> None:
            for _ in range(args.steps):
                tr.zero_grad()
                value, _ = tr.surrogate(f)
                value.backward()
                tr.apply()
        step()  # warm-up outside the check (first-call allocations, cuBLAS handles)
        pieces[f"whole {est.upper()} step"] = step
    clean = True
    for name, fn in pieces.items():
        fn()  # warm-up
        where = _first_sync(fn)
        clean &= where is None
        print(f"{name:28s} " + ("no sync" if where is None else f"SYNC at {where}"))
    print(f"device {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, n={n}, "
          f"chunk={chunk}")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
