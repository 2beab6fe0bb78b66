"""Batched seeds for MaskedNNRegression: G runs that share the network and the number of steps
(different seeds and learning rates of one MC setting) step together, their G x n masks
evaluated in one grouped forward per step, each run with its own generator, its own
:class:`pbscale.methods.MaskTrainer` (logits, optimizer state) and its own history.

Per run the random stream is the one :func:`pbscale.loop.run` gives a separate run
(`pbscale.regress`): one generator seeded with the run's seed draws the epoch's batch order
(``RegressionTask.epoch_order``), then at every step the run's n samples in one chunk (the
estimate is :func:`pbscale.methods.mc_gradient` replaying them), and the evaluation of
``RegressionTask.evaluate`` after every epoch (and before training). The samplers' streams do
not depend on the chunking when k d is even (d = 8,050 is), so every run's history equals that
of the separate run up to the round-off of the grouped forward
(``tests/test_batched_seeds.py``). The grouped forward runs the backbone (Linear without bias,
BatchNorm1d without affine parameters or running statistics, LeakyReLU; `pbscale.regression`)
on masks z (G, k, d) with inputs x (G, B, 10), each run on its own minibatch.

``python -m pbscale.batched_seeds --method loorf --n 10 --lrs 0.1,0.01 --seeds 0-9 --epochs
300`` writes each run's folder exactly where ``python -m pbscale.regress`` would (same hash:
``config.json``, ``history.csv``, ``summary.json``), so sweeps and ``python -m
analysis.regression --collect`` read them; runs already finished there are skipped. Batched runs
write no checkpoint: an interrupted batch starts again.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

from pbexact.errors import (
    ArgumentParser,
    PBInputError,
    nonneg_float,
    nonneg_int,
    positive_int,
    seed_list,
)

from . import io
from .loop import EvalContext, LoopConfig, full_config, run_folder, write_summary
from .methods import (
    MC_METHODS,
    SAMPLERS,
    FixedSampler,
    MaskTrainer,
    MethodConfig,
    dense_regularizer,
    get_estimator,
    mc_gradient,
)
from .regress import DEFAULT_OUT, resolve_device, run_name, set_threads
from .regress import run_folder as regress_folder
from .regression import BATCH, RegressionProblem, RegressionTask, make_problem


def grouped_forward(problem: RegressionProblem, z: torch.Tensor, x: torch.Tensor
                    ) -> torch.Tensor:
    """The masked backbone for G groups: masks z (G, k, d), inputs x (G, B, in) ->
    outputs (G, k, B, out); group g's k masks see group g's inputs only."""
    masked = problem.masked
    offsets, off = {}, 0
    for name, size in zip(masked.names, masked.sizes):
        offsets[name] = off
        off += size
    G, k = z.shape[:2]
    # activations laid out as (G, k, features, B): a Linear is W (G, k, out, in) @ h and the
    # batch statistics reduce over the contiguous last dimension
    h = x.transpose(-1, -2)[:, None].expand(G, k, *x.shape[:0:-1])  # (G, k, in, B)
    for idx, module in enumerate(problem.backbone):
        if isinstance(module, nn.Linear):
            name = f"{idx}.weight"
            w = module.weight
            if name in offsets:
                o = offsets[name]
                w = z[..., o:o + w.numel()].view(G, k, *w.shape) * w
            h = w @ h
        elif isinstance(module, nn.BatchNorm1d):
            # each (group, mask, feature) row normalized over its B points by F.batch_norm,
            # which sees them as the channels of one (1, rows, B) input
            shape = h.shape
            h = nn.functional.batch_norm(h.reshape(1, -1, shape[-1]), None, None,
                                         training=True, eps=module.eps).view(shape)
        elif isinstance(module, nn.LeakyReLU):
            h = nn.functional.leaky_relu(h, module.negative_slope, inplace=True)
        else:
            raise PBInputError(f"grouped_forward does not handle {type(module).__name__}")
    return h.transpose(-1, -2)


def grouped_loss(problem: RegressionProblem, z: torch.Tensor, idx: torch.Tensor
                 ) -> torch.Tensor:
    """J = MAE of each group's masks (G, k, d) on its training points idx (G, B): (G, k)."""
    out = grouped_forward(problem, z, problem.x_train[idx])
    return (out - problem.y_train[idx][:, None]).abs().flatten(2).mean(2)


def train_batched(configs: list[MethodConfig], epochs: int, problem: RegressionProblem,
                  data_seed: int = 0, out: str | Path | None = None,
                  device: torch.device | str = "cpu") -> list[list[dict]]:
    """Train the G runs of ``configs`` (MC methods, one n; any seeds, learning rates,
    parametrizations, optimizers) together for ``epochs``; returns each run's history (rows as
    in pbscale.loop's metrics CSV, without the timing columns). With ``out``, each run's
    folder is written as pbscale.regress would (history.csv, config.json, summary.json)."""
    if not configs:
        raise PBInputError("no runs to train; give at least one seed and learning rate")
    ns = {c.n for c in configs}
    if len(ns) != 1:
        raise PBInputError(f"batched runs share n; got n in {sorted(ns)}")
    (n,) = ns
    dev = torch.device(device)
    task = RegressionTask(problem, data_seed)
    S = task.steps_per_epoch
    trainers, gens, tasks = [], [], []
    for c in configs:
        c.validate()  # the run's own config (its folder hash); the batch uses one chunk of n
        if c.method not in MC_METHODS:
            raise PBInputError(f"batched runs are MC runs ({', '.join(MC_METHODS)}); run "
                               f"{c.method} with python -m pbscale.regress")
        t = MaskTrainer(c, problem.d, epochs * S, dev)
        g = torch.Generator(device=dev)
        g.manual_seed(c.seed)
        t.generator = g
        trainers.append(t)
        gens.append(g)
        tk = RegressionTask(problem, data_seed)
        tk.name = run_name(c)
        tasks.append(tk)
    histories: list[list[dict]] = []
    for t, g, tk in zip(trainers, gens, tasks):
        histories.append([{"epoch": 0, "train_loss": math.nan,
                           **tk.evaluate(EvalContext(t, g, "train", None, 0))}])
    seconds = 0.0
    for epoch in range(epochs):
        t0 = time.perf_counter()
        orders = [tk.epoch_order(g) for tk, g in zip(tasks, gens)]
        losses: list[list[float]] = [[] for _ in trainers]
        for i in range(S):
            idx = torch.stack([o[i * BATCH:(i + 1) * BATCH] for o in orders])
            zs = []
            with torch.no_grad():
                for t, g in zip(trainers, gens):
                    theta = t.param.theta(t.r.detach())
                    spec = get_estimator(t.method)
                    zs.append(SAMPLERS[spec.law](theta, n, g).next(n).to(t.r.dtype))
                J = grouped_loss(problem, torch.stack(zs), idx)
            for gi, (t, g) in enumerate(zip(trainers, gens)):
                Jg = J[gi]
                est = mc_gradient(lambda z, Jg=Jg: Jg, t.r, t.param, t.method, n, g, n,
                                  sampler=FixedSampler(zs[gi]))
                if t.config.lam > 0:
                    est.grad = est.grad + dense_regularizer(t.r, t.param.theta, t.config.lam)[1]
                t.zero_grad()
                t.r.grad = est.grad.detach().to(t.r.dtype).clone()
                t.apply()
                losses[gi].append(est.loss)
        seconds += time.perf_counter() - t0
        for t, g, tk, hist, ls in zip(trainers, gens, tasks, histories, losses):
            hist.append({"epoch": epoch + 1, "train_loss": sum(ls) / len(ls),
                         **tk.evaluate(EvalContext(t, g, "train", None, epoch + 1))})
    if out is not None:
        loop = LoopConfig(epochs=epochs, seed=0, metrics_file="history.csv")
        for t, tk, hist in zip(trainers, tasks, histories):
            lc = LoopConfig(**{**loop.__dict__, "seed": t.config.seed})
            cfg = full_config(tk, t, lc)
            folder = run_folder(out, tk.name, cfg)
            per = seconds / len(trainers) / epochs
            rows = [{**h, "train_seconds": per if h["epoch"] else 0.0, "val_seconds": 0.0}
                    for h in hist]
            io.write_json(folder / "config.json",
                          {**cfg, "info": {"device": str(dev), "batched_runs": len(trainers)}})
            io.write_csv(folder / "history.csv", rows)
            write_summary(folder, rows, dev, batched_runs=len(trainers))
    return histories


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m pbscale.batched_seeds",
                                description=__doc__.splitlines()[0])
    p.add_argument("--method", default="loorf", help=", ".join(MC_METHODS))
    p.add_argument("--n", type=positive_int, default=10)
    p.add_argument("--param", default="sigmoid")
    p.add_argument("--optimizer", default="rmsprop")
    p.add_argument("--lrs", default="0.1", help="comma-separated learning rates")
    p.add_argument("--seeds", type=seed_list, default="0-9", help="e.g. 0-9 or 0,3,5")
    p.add_argument("--epochs", type=positive_int, default=300)
    p.add_argument("--data-seed", type=nonneg_int, default=0)
    p.add_argument("--lam", type=nonneg_float, default=0.0)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--out", default=DEFAULT_OUT)
    args = p.parse_args(argv)
    try:
        set_threads(args.threads)
        lrs = [float(v) for v in args.lrs.split(",") if v]
        seeds = args.seeds
        dev = resolve_device(args.device)
        problem = make_problem(args.data_seed, dev)
        configs = [MethodConfig(args.method, args.n, args.param, lr, args.optimizer, seed,
                                chunk=None, lam=args.lam) for lr in lrs for seed in seeds]
        todo = []
        for c in configs:
            if not (regress_folder(c, args.epochs, args.out, args.data_seed, problem)
                    / "summary.json").exists():
                todo.append(c)
        if todo:
            train_batched(todo, args.epochs, problem, args.data_seed, args.out, dev)
    except (PBInputError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{len(configs) - len(todo)} runs already finished, {len(todo)} trained together "
          f"in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
