"""Time per step with K = 1 and K = 2 processes (``torch.distributed``,
:mod:`pbscale.execution.distributed`), measured in the same run, printed as milliseconds per step
and the K = 1 / K = 2 ratio, for

* sample parallelism: an MC step on MaskedNNRegression (d = 8,050, batch 100, n = 100 by
  default), the n samples split over the ranks;
* data parallelism: training steps of ``pbscale.prune`` runs of LeNet-300-100 (joint dense and
  joint CP by default, ``--dp-methods``; batch ``--dp-batch`` 128, synthetic images), each
  minibatch split over the ranks and the gradients averaged (one flat all-reduce per step),
  timed over the second epoch's steps (``--dp-steps`` per epoch; evaluation excluded), wall
  clock and CPU time per process.

    python -m benchmarks.bench_distributed [--n 100] [--steps 20] [--ks 1,2] [--device cpu]
                                           [--dp-methods dense,cp] [--dp-batch 128]

On the CPU each rank uses ``--threads`` torch threads (default 1) and the ranks talk over gloo;
with ``--device cuda`` each rank takes GPU LOCAL_RANK and the ranks talk over nccl (give
``--ks 1,<number of GPUs>``). Each K is a fresh ``torch.distributed.run`` launch; the timed steps
follow ``--warmup`` untimed ones, and the slowest rank's time counts.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch

from analysis.cli import run
from pbexact.cli import (
    ArgumentParser,
    int_at_least,
    nonneg_int,
    positive_int,
    positive_int_list,
    thread_count,
)
from pbexact.errors import PBInputError
from pbscale.execution import distributed
from pbscale.methods import MC_METHODS, MaskTrainer, MethodConfig
from pbscale.regression.problem import BATCH, make_problem
from pbscale.runs.runtime import resolve_device


def _worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    shard = distributed.from_env(dev)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    prob = make_problem(0, dev)
    trainer = MaskTrainer(MethodConfig(args.estimator, args.n, chunk=args.chunk or None, seed=0),
                          prob.d, args.steps + args.warmup, dev,
                          bytes_per_sample=prob.bytes_per_sample())
    if shard is not None:
        distributed.rank_strategy(trainer, shard)  # its samples split over the ranks
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, prob.x_train.shape[0], (BATCH,), generator=gen).to(dev)
               for _ in range(args.steps + args.warmup)]
    t0 = 0.0
    for i, idx in enumerate(batches):
        if i == args.warmup:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            if shard is not None:
                torch.distributed.barrier()
            t0 = time.perf_counter()
        trainer.step(prob.batch_loss(idx))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    per_step = (time.perf_counter() - t0) / args.steps
    if shard is not None:
        t = torch.tensor([per_step], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        per_step = float(t[0])
    if shard is None or shard.rank == 0:
        print(json.dumps({"seconds_per_step": per_step, "chunk": trainer.chunk,
                          "r_sum": float(trainer.r.double().sum())}))
    distributed.shutdown()


def _dp_worker(args: argparse.Namespace) -> None:
    """One joint ``pbscale.prune`` run of LeNet (2 epochs of ``--dp-steps`` steps) as torchrun
    launches it; rank 0 prints the wall and CPU seconds per step of the second epoch's steps
    (all but its last: the step hook marks them), the slowest rank's."""
    from pbscale.pruning import config as pconfig
    from pbscale.pruning import run as prun

    torch.set_num_threads(args.threads)
    shard = distributed.from_env(args.device)
    cfg = pconfig.PruneConfig(model="lenet", mode="joint", method=args.dp_worker,
                            synthetic=args.dp_batch * args.dp_steps, batch_size=args.dp_batch,
                            epochs=2, max_batches=args.dp_steps, eval_batches=1, eval_masks=1,
                            val_size=args.dp_batch)
    marks: dict[str, tuple[float, float]] = {}

    def hook(epoch: int, i: int) -> None:  # steps 0 .. S-2 of the second epoch are timed
        if epoch == 1 and i in (0, args.dp_steps - 1):
            marks["start" if i == 0 else "end"] = (time.perf_counter(), time.process_time())

    with tempfile.TemporaryDirectory() as out:
        summary = prun.run(cfg, out, args.device, quiet=True, shard=shard, step_hook=hook)
    steps = args.dp_steps - 1
    wall = (marks["end"][0] - marks["start"][0]) / steps
    cpu = (marks["end"][1] - marks["start"][1]) / steps
    if shard is not None:  # the slowest rank counts
        t = torch.tensor([wall, cpu], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        wall, cpu = t.tolist()
    if shard is None or shard.rank == 0:
        print(json.dumps({"seconds_per_step": wall, "cpu_per_step": cpu,
                          "test_acc": summary["final_test_acc"]}))
    distributed.shutdown()


def _dp_methods(text: str) -> list[str]:
    """argparse type: comma-separated pruning methods of ``pbscale.prune`` ('' : none)."""
    from pbscale.pruning.config import PRUNE_METHODS
    methods = [m for m in text.split(",") if m]
    for m in methods:
        if m not in PRUNE_METHODS:
            raise argparse.ArgumentTypeError(f"unknown pruning method {m!r}; choose from "
                                  f"{', '.join(PRUNE_METHODS)}")
    return methods


def _launch(k: int, argv: list[str]) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(k),
           "--master_addr", "127.0.0.1", "--master_port", str(port), "-m",
           "benchmarks.bench_distributed", "--worker", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ,
                          "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    if proc.returncode != 0:
        sys.exit(f"K={k} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith("{")][-1]
    return json.loads(line)


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    # --samples: the name the ranks get (torchrun's parser would take --n for its own options)
    ap.add_argument("--n", "--samples", dest="n", type=int_at_least(2), default=100)
    ap.add_argument("--estimator", default="loorf", choices=MC_METHODS)
    ap.add_argument("--steps", type=positive_int, default=20)
    ap.add_argument("--warmup", type=nonneg_int, default=3)
    ap.add_argument("--chunk", type=nonneg_int, default=0,
                    help="samples per forward (0: automatic)")
    ap.add_argument("--ks", type=positive_int_list, default=[1, 2],
                    help="process counts to compare")
    ap.add_argument("--threads", type=thread_count, default=1, help="torch threads per process")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--dp-methods", type=_dp_methods, default="dense,cp",
                    help="joint LeNet pruning methods timed data-parallel ('' : none)")
    ap.add_argument("--dp-batch", type=positive_int, default=128)
    ap.add_argument("--dp-steps", type=int_at_least(2), default=20,
                    help="steps per epoch (all but the second epoch's last are timed)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dp-worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.dp_worker:
        _dp_worker(args)
        return
    if args.worker:
        _worker(args)
        return
    MethodConfig(args.estimator, args.n, chunk=args.chunk or None).validate()
    if resolve_device(args.device).type not in ("cpu", "cuda"):  # a missing GPU is refused
        raise PBInputError(f"--device {args.device} is neither cpu nor cuda; use --device cpu")
    forward = [f"--samples={args.n}", f"--estimator={args.estimator}", f"--steps={args.steps}",
               f"--warmup={args.warmup}", f"--chunk={args.chunk}", f"--threads={args.threads}",
               f"--device={args.device}"]
    ks = args.ks
    print(f"{args.estimator} n={args.n}, d=8,050, batch {BATCH}, {args.steps} timed steps, "
          f"{args.threads} thread(s) per process, device {args.device}")
    res = {}
    for k in ks:
        res[k] = _launch(k, forward)
        print(f"K={k}: {res[k]['seconds_per_step'] * 1e3:8.1f} ms/step (chunk {res[k]['chunk']}, "
              f"sum r after the run {res[k]['r_sum']:.6f})", flush=True)
    base = res[ks[0]]["seconds_per_step"]
    for k in ks[1:]:
        print(f"speed-up K={k} over K={ks[0]}: {base / res[k]['seconds_per_step']:.2f}x")
    for method in args.dp_methods:
        print(f"data parallel: joint {method} LeNet-300-100, batch {args.dp_batch}, "
              f"{args.dp_steps - 1} timed steps, {args.threads} thread(s) per process")
        dp = {}
        for k in ks:
            dp[k] = _launch(k, [f"--dp-worker={method}", f"--dp-batch={args.dp_batch}",
                                f"--dp-steps={args.dp_steps}", f"--threads={args.threads}",
                                f"--device={args.device}"])
            print(f"K={k}: {dp[k]['seconds_per_step'] * 1e3:8.1f} ms/step, CPU "
                  f"{dp[k]['cpu_per_step'] * 1e3:.1f} ms/step per process (test accuracy after "
                  f"2 epochs {dp[k]['test_acc']:.4f})", flush=True)
        for k in ks[1:]:
            print(f"speed-up K={k} over K={ks[0]}: "
                  f"{dp[ks[0]]['seconds_per_step'] / dp[k]['seconds_per_step']:.2f}x")


if __name__ == "__main__":
    sys.exit(run(main))
