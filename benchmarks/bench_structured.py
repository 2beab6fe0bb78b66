"""Structured (channel) pruning: PB methods (CP, ARMS; joint mode, ``granularity="channel"``,
``cost="macs"``) against Torch-Pruning's criteria (L2 group norm, Taylor, BN scale with network
slimming's L1 training, random groups), at given MACs reductions, same epochs for every arm.

    python -m benchmarks.bench_structured [--models lenet5,resnet18] [--targets 2,4]
        [--arms cp,arms,mp,gmp,l2,taylor,bn,random] [--seeds 3] [--first-seed 0]
        [--dense-epochs 30]
        [--finetune-epochs 30] [--train-size 0] [--data-dir DIR] [--device cpu]
        [--threads 1] [--out figures/structured] [--no-budget] [--smoke]

The defaults are the paper-like setting, for a GPU (full MNIST, 30 + 30 epochs, 3 seeds, full
widths; ResNet-18 width on MNIST padded to 32x32). Models: ``lenet5`` (Caffe's LeNet-5
20-50-500 with BatchNorm) and ``resnet18`` (widths 64-128-256-512) on MNIST, and, where
CIFAR-10 is at hand (``--cifar-dir``, its binary version), ``resnet20`` (the paper's ResNet-20,
its widths) on CIFAR-10, all in :mod:`benchmarks.structured_models`; the head is never
pruned. The same split (a tenth of the training subset, at most 5,000, validates) and initial
weights for every arm of a seed.

* Torch-Pruning arms (``l2``: ``GroupMagnitudeImportance(p=2)``, ``taylor``:
  ``GroupTaylorImportance`` on the gradients of 10 training batches, ``bn``: ``BNScaleImportance``
  after dense training with an L1 penalty on the BatchNorm scales (``--slimming-l1``; network
  slimming), ``random``: ``RandomImportance``): dense training for ``--dense-epochs``, one
  ``MetaPruner`` step with the same pruning ratio in every layer (found by bisection so that the
  MACs reduction is at least the target), fine-tuning for ``--finetune-epochs``. Weights: SGD
  with Nesterov momentum 0.9, weight decay 1e-4, lr 0.1 (fine-tuning 0.01), x0.1 at 40% and 60%
  of each phase, batch ``--batch-size``.
* PB arms (``cp``, ``arms``): :func:`pbscale.prune_model` in joint mode for ``--dense-epochs`` +
  ``--finetune-epochs`` epochs (its own schedule: same weight optimizer, masks frozen for the
  last 20%), the L0 term weighted by MACs, ``lam`` from ``--lam`` (defaults per model and
  target in :data:`DEFAULT_LAMS`, calibrated beforehand). The mask each run freezes for its
  last 20% is kept within the Torch-Pruning arms' MACs at that target (``budget``: the
  evaluated mask filled or cut by the mask probabilities, :func:`pbscale.methods.schedules.
  keep_budget`), so every pruned arm is compared at the same MACs (at most). ``--no-budget``
  leaves the frozen mask as the lam gave it (the MACs a PB run reaches are then what its lam
  gives). ``--steer`` starts from ``--lam`` and steers lambda to the target besides
  (``--lam-target``: scaled while the masks train until the MACs kept of the prunable part are
  the fraction that drops the whole network's MACs by the target, :func:`steer_fraction`);
  within 3 + 3 epochs it does not land (docs/measurements.md).
* Magnitude arms over channels (``mp``, ``gmp``): :func:`pbscale.prune_model` with
  ``method="mp"`` or ``"gmp"``, joint mode, the same epochs, each channel scored by the squared
  norm of what it removes over its MACs, cut globally (MP once at 40% of the epochs, GMP on its
  cubic schedule) to the MACs of the Torch-Pruning arms at that target (``--target`` as
  :func:`steer_fraction` of their reduction). The run counts them exactly; the physical network
  keeps more where a cut empties a coupled group (it keeps one zeroed channel), so the table's
  MACs, not the target, say whether the comparison is at equal MACs.

Every run reports the test accuracy of the physically smaller network (Torch-Pruning's pruned
model; :meth:`pbscale.PruneResult.structured` for PB), its parameters and MACs
(:func:`pbscale.nets.channel_costs.count`) and CPU latency at batch 1 and 128
(:func:`pbscale.nets.channel_costs.latency`, ``--threads`` threads). ``--out`` gets
``runs.csv`` (every run), ``summary.csv`` and ``summary.md`` (mean and s.d. over seeds per model,
target and arm; per target the best PB and the best magnitude arm read against the best
Torch-Pruning arm: a verdict only at at least as large a MACs reduction and where the seeds'
paired 95% t interval of the accuracy gap excludes 0, :func:`verdicts`),
``accuracy_vs_macs_<model>.png`` and ``settings.json`` (settings, command, date, commit)."""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from analysis.cli import run, save_figure
from analysis.scale.gap_test import GapTest
from benchmarks.structured_models import MODELS, make
from benchmarks.tp_criteria import tp_prune, tp_ratio
from pbexact.cli import (
    ArgumentParser,
    choice_list,
    nonneg_float,
    nonneg_int,
    out_folder,
    positive_int,
    thread_count,
)
from pbexact.errors import PBInputError
from pbscale.nets import channel_costs
from pbscale.nets.channel_types import ChannelGroups
from pbscale.nets.data import read_mnist
from pbscale.nets.models import init_weights
from pbscale.runs import io
from pbscale.runs.runtime import resolve_device

PB_ARMS = ("cp", "arms")
#: pbscale's own magnitude pruning over channels (global score ||W_i||^2 / cost, one cut)
MAG_ARMS = ("mp", "gmp")
TP_ARMS = ("l2", "taylor", "bn", "random")
ARMS = PB_ARMS + MAG_ARMS + TP_ARMS
LABELS = {"cp": "CP (PB)", "arms": "ARMS (PB)", "mp": "MP over channels (pbscale)",
          "gmp": "GMP over channels (pbscale)", "l2": "TP L2 group norm",
          "taylor": "TP Taylor", "bn": "TP BN scale (slimming)", "random": "TP random",
          "dense": "dense (E1 epochs)", "dense-slimming": "dense, L1 on BN scales (E1)"}
MARKERS = {"cp": "o", "arms": "s", "mp": "<", "gmp": ">", "l2": "^", "taylor": "v", "bn": "D",
           "random": "x", "dense": "*", "dense-slimming": "P"}
#: lam of the PB arms, (arm, model, target) -> lam (L0 term weighted by MACs, mean cost 1);
#: LeNet-5: calibrated on 3 + 3 epochs of a 6,000-example MNIST subset, seed 0 (CP at 3e-5:
#: 3.86x; ARMS at 3e-5: 2.05x); ResNet-18 width and ResNet-20: a first guess. Longer runs
#: prune more.
DEFAULT_LAMS: dict[tuple[str, str, float], float] = {
    ("cp", "lenet5", 2.0): 1e-5, ("cp", "lenet5", 4.0): 3e-5,
    ("arms", "lenet5", 2.0): 3e-5, ("arms", "lenet5", 4.0): 1e-4,
    ("cp", "resnet18", 2.0): 1e-5, ("cp", "resnet18", 4.0): 3e-5,
    ("arms", "resnet18", 2.0): 3e-5, ("arms", "resnet18", 4.0): 1e-4,
    ("cp", "resnet20", 2.0): 1e-5, ("cp", "resnet20", 4.0): 3e-5,
    ("arms", "resnet20", 2.0): 3e-5, ("arms", "resnet20", 4.0): 1e-4,
}
SMOKE = {"models": ["lenet5", "resnet18"], "seeds": 1, "dense_epochs": 1, "finetune_epochs": 2,
         "train_size": 256, "test_size": 256, "width": 0.125, "n": 2, "latency_repeats": 3,
         "batch_size": 64}
LR, FT_LR, MOMENTUM, WD = 0.1, 0.01, 0.9, 1e-4
#: MACs reductions within this relative difference count as equal in a verdict (a budgeted PB
#: arm keeps at most the Torch-Pruning arms' MACs, a few hundred fewer in 572,912)
MACS_TOLERANCE = 0.01
TAYLOR_BATCHES = 10


# ----------------------------------------------------------------------------- arguments


def target_list(text: str) -> list[float]:
    """argparse type: comma-separated MACs reduction factors > 1, e.g. ``2,4``."""
    try:
        vals = [float(v) for v in text.split(",")]
    except ValueError:
        vals = []
    if not vals or any(not (v > 1 and np.isfinite(v)) for v in vals) or len(set(vals)) != len(vals):
        raise argparse.ArgumentTypeError(
            f"--targets {text!r}: give comma-separated MACs reductions > 1, each once, e.g. 2,4")
    return vals


def lam_entry(text: str) -> tuple[str, str, float, float]:
    """argparse type of ``--lam ARM:MODEL:TARGET=LAM``."""
    try:
        key, value = text.split("=")
        arm, model, target = key.split(":")
        lam, tgt = float(value), float(target)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--lam {text!r}: give ARM:MODEL:TARGET=LAM, e.g. cp:lenet5:4=1e-3") from None
    if arm not in PB_ARMS or model not in MODELS or not (lam > 0 and tgt > 1):
        raise argparse.ArgumentTypeError(
            f"--lam {text!r}: ARM one of {', '.join(PB_ARMS)}, MODEL one of "
            f"{', '.join(MODELS)}, TARGET > 1 and LAM > 0, e.g. cp:lenet5:4=1e-3")
    return arm, model, tgt, lam


def parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python -m benchmarks.bench_structured",
                        description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=choice_list(tuple(MODELS), "models", "invalid model"),
                    default="lenet5,resnet18", help="comma-separated models")
    ap.add_argument("--targets", type=target_list, default="2,4",
                    help="comma-separated MACs reduction factors (dense MACs / pruned MACs)")
    ap.add_argument("--arms", type=choice_list(ARMS, "arms", "invalid arm"),
                    default=",".join(ARMS),
                    help="comma-separated arms")
    ap.add_argument("--seeds", type=positive_int, default=3,
                    help="K seeds: --first-seed .. --first-seed + K - 1")
    ap.add_argument("--first-seed", type=nonneg_int, default=0,
                    help="the first seed (e.g. fresh seeds for a comparison chosen on 0..K-1)")
    ap.add_argument("--dense-epochs", type=positive_int, default=30,
                    help="E1: dense training of the Torch-Pruning arms")
    ap.add_argument("--finetune-epochs", type=positive_int, default=30,
                    help="E2: fine-tuning of the Torch-Pruning arms (PB arms train E1 + E2)")
    ap.add_argument("--train-size", type=nonneg_int, default=0,
                    help="training examples used (0: all 60,000 of MNIST, 50,000 of "
                    "CIFAR-10; a tenth validates)")
    ap.add_argument("--test-size", type=nonneg_int, default=0,
                    help="test examples scored (0: all 10,000)")
    ap.add_argument("--batch-size", type=positive_int, default=128)
    ap.add_argument("--width", type=float, default=1.0,
                    help="multiplier of every hidden width (smoke: 1/8)")
    ap.add_argument("--n", type=positive_int, default=10, help="ARMS samples per step")
    ap.add_argument("--lam", type=lam_entry, action="append", default=[],
                    help="ARM:MODEL:TARGET=LAM, PB lam where the run starts (repeatable; "
                    "default DEFAULT_LAMS)")
    ap.add_argument("--no-budget", action="store_true",
                    help="PB arms freeze the mask their lam gives instead of one within the "
                    "Torch-Pruning arms' MACs (--budget)")
    ap.add_argument("--steer", action="store_true",
                    help="PB arms steer lambda from --lam to the target MACs (--lam-target) "
                    "instead of keeping it")
    ap.add_argument("--slimming-l1", type=nonneg_float, default=1e-4,
                    help="L1 strength on BN scales in the bn arm's dense training")
    ap.add_argument("--latency-repeats", type=positive_int, default=20)
    ap.add_argument("--data-dir", default="../shared/data/mnist",
                    help="folder of the four MNIST IDX files")
    ap.add_argument("--cifar-dir", default="../shared/data/cifar10",
                    help="folder of CIFAR-10's binary version (resnet20 only)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:K or auto")
    ap.add_argument("--threads", type=thread_count, default=1, help="torch threads")
    ap.add_argument("--out", type=out_folder, default=Path("figures/structured"))
    ap.add_argument("--summarize", action="store_true",
                    help="no runs: write the summary, table and figures again from --out's "
                    "runs.csv (e.g. of an interrupted benchmark)")
    ap.add_argument("--smoke", action="store_true",
                    help="tests: 256 training examples, 1 + 2 epochs, 1 seed, width 1/8, "
                    "ARMS n=2")
    return ap


# ----------------------------------------------------------------------------- data


def load_data(data_dir: str, train_size: int, test_size: int, seed: int = 0
              ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """MNIST as float (N, 1, 28, 28) standardized with the training subset's mean and s.d.:
    {"train", "val", "test"}; a tenth of the training subset (at most 5,000) validates."""
    if not Path(data_dir).is_dir():
        raise PBInputError(f"--data-dir {data_dir} is not a folder; give the folder of the "
                           f"four MNIST IDX files")
    xtr, ytr, xte, yte, n_val = subsets(*read_mnist(data_dir), train_size, test_size, seed)
    xf = torch.from_numpy(xtr.astype(np.float32) / 255.0)
    mean, std = xf[n_val:].mean(), xf[n_val:].std()

    def prep(x: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(x.astype(np.float32) / 255.0)
        return ((t - mean) / std).reshape(-1, 1, 28, 28)

    return splits(prep, xtr, ytr, xte, yte, n_val)


def load_cifar(cifar_dir: str, train_size: int, test_size: int, seed: int = 0
               ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """CIFAR-10 (the binary version in ``cifar_dir`` or its ``cifar-10-batches-bin``) as float
    (N, 3, 32, 32) standardized per channel with the training subset's means and s.d.s;
    {"train", "val", "test"} split as :func:`load_data` splits MNIST."""
    from pbscale.nets.data import read_cifar10

    if not Path(cifar_dir).is_dir():
        raise PBInputError(f"--cifar-dir {cifar_dir} is not a folder; give the folder of "
                           "CIFAR-10's binary version (cifar-10-batches-bin), or leave resnet20 "
                           "out of --models")
    xtr, ytr, xte, yte, n_val = subsets(*read_cifar10(cifar_dir, records=None), train_size,
                                        test_size, seed)
    xf = torch.from_numpy(xtr[n_val:].astype(np.float32) / 255.0)
    mean = xf.mean(dim=(0, 2, 3), keepdim=True)
    std = xf.std(dim=(0, 2, 3), keepdim=True)

    def prep(x: np.ndarray) -> torch.Tensor:
        return (torch.from_numpy(x.astype(np.float32) / 255.0) - mean) / std

    return splits(prep, xtr, ytr, xte, yte, n_val)


def subsets(xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray, yte: np.ndarray,
            train_size: int, test_size: int, seed: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The training examples drawn (a permutation from ``seed``, the first ``train_size``; 0:
    all), the first ``test_size`` test examples (0: all) and how many of the drawn ones
    validate (a tenth, at most 5,000)."""
    idx = np.random.default_rng(seed).permutation(len(xtr))[:train_size or len(xtr)]
    xtr, ytr = xtr[idx], ytr[idx]
    if test_size:
        xte, yte = xte[:test_size], yte[:test_size]
    return xtr, ytr, xte, yte, min(5000, len(xtr) // 10)


def splits(prep: Callable[[np.ndarray], torch.Tensor], xtr: np.ndarray, ytr: np.ndarray,
           xte: np.ndarray, yte: np.ndarray, n_val: int
           ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{"train", "val", "test"}: the first ``n_val`` training examples validate, the rest
    train; images through ``prep``, labels int64."""
    x_all, y_all = prep(xtr), torch.from_numpy(ytr.astype(np.int64))
    return {"train": (x_all[n_val:], y_all[n_val:]), "val": (x_all[:n_val], y_all[:n_val]),
            "test": (prep(xte), torch.from_numpy(yte.astype(np.int64)))}


def pad32(data: dict[str, tuple[torch.Tensor, torch.Tensor]], background: float
          ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The splits padded by 2 pixels each side to 32x32 with the standardized black."""
    return {k: (F.pad(x, (2, 2, 2, 2), value=background), y) for k, (x, y) in data.items()}


def batches(x: torch.Tensor, y: torch.Tensor, size: int, g: torch.Generator | None
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    order = torch.randperm(len(x), generator=g) if g is not None else torch.arange(len(x))
    for i in range(0, len(x), size):
        j = order[i:i + size]
        yield x[j], y[j]


# ----------------------------------------------------------------------------- training


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dev: torch.device) -> float:
    model.eval()
    right = 0
    with torch.inference_mode():
        for xb, yb in batches(x, y, 1000, None):
            right += int((model(xb.to(dev)).argmax(1) == yb.to(dev)).sum())
    return right / len(x)


def train(model: nn.Module, split: tuple[torch.Tensor, torch.Tensor], epochs: int, lr: float,
          batch: int, seed: int, dev: torch.device, l1_bn: float = 0.0) -> None:
    """SGD (Nesterov, momentum 0.9, wd 1e-4), lr x0.1 at 40% and 60% of the epochs; with
    ``l1_bn`` > 0, network slimming's subgradient of an L1 penalty on the BatchNorm scales."""
    x, y = split
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM, nesterov=True,
                          weight_decay=WD)
    sched = torch.optim.lr_scheduler.MultiStepLR(
        opt, [int(0.4 * epochs), int(0.6 * epochs)], 0.1)
    g = torch.Generator().manual_seed(seed)
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for _ in range(epochs):
        model.train()
        for xb, yb in batches(x, y, batch, g):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb.to(dev)), yb.to(dev)).backward()
            if l1_bn:
                for m in bns:
                    m.weight.grad.add_(l1_bn * torch.sign(m.weight.detach()))
            opt.step()
        sched.step()


# ----------------------------------------------------------------------------- Torch-Pruning


def taylor_grads(split: tuple[torch.Tensor, torch.Tensor], batch: int, dev: torch.device
                 ) -> Callable[[nn.Module], None]:
    def accumulate(model: nn.Module) -> None:
        model.eval()
        model.zero_grad(set_to_none=True)
        for k, (xb, yb) in enumerate(batches(*split, batch, torch.Generator().manual_seed(0))):
            if k == TAYLOR_BATCHES:
                break
            F.cross_entropy(model(xb.to(dev)), yb.to(dev)).backward()
    return accumulate


# ----------------------------------------------------------------------------- measuring


def measure(model: nn.Module, example: torch.Tensor, batch_example: torch.Tensor,
            repeats: int) -> dict[str, float]:
    """Parameters, MACs per example, CPU latency (batch 1 and 128) and the widths (output
    channels or features of every Conv and Linear layer, ``name:width`` space-separated) of
    ``model`` (on the CPU)."""
    model = model.cpu().eval()
    params, macs = channel_costs.count(model, example)
    widths = " ".join(f"{n}:{m.weight.shape[0]}" for n, m in model.named_modules()
                      if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)))
    return {"params": params, "macs": macs, "widths": widths,
            "latency_b1": channel_costs.latency(model, example, repeats, 3),
            "latency_b128": channel_costs.latency(model, batch_example, repeats, 3)}


def steer_fraction(model: nn.Module | ChannelGroups, example: torch.Tensor | None,
                   target: float) -> float:
    """The fraction of the prunable part's MACs (``pbscale.prune --cost macs``'s
    ``remaining``, :func:`pbscale.nets.channel_layout.prunable`) a channel run keeps when the
    whole network's MACs drop by ``target``: 1 - dense (1 - 1 / target) / prunable, from the
    model's channel groups (traced on ``example``, or given); a target the prunable part cannot
    reach is a one-line :class:`PBInputError`."""
    from pbscale.nets.channel_layout import prunable
    from pbscale.nets.channels import channel_groups

    groups = (model if isinstance(model, ChannelGroups)
              else channel_groups(copy.deepcopy(model).cpu(), example))
    part, dense = prunable(groups, "macs"), groups.costs.dense_macs
    fraction = 1 - dense * (1 - 1 / target) / part
    if not 0 < fraction <= 1:
        raise PBInputError(f"a {target:g}x MACs reduction needs more than the prunable part "
                           f"({part:,} of {dense:,} MACs); give a smaller --targets")
    return fraction


def check_budget_epochs(arm: str, epochs: int) -> None:
    """A one-line :class:`PBInputError` where a PB run of ``arm`` for ``epochs`` would freeze
    no mask, so that no budget would apply (:func:`pbscale.pruning.run.loop_config`)."""
    from pbscale.pruning.config import PruneConfig
    from pbscale.pruning.run import loop_config

    try:
        loop_config(PruneConfig(method=arm, mode="joint", epochs=epochs, budget=0.5))
    except PBInputError as e:
        raise PBInputError(f"the {arm} arm freezes a mask within the criteria's MACs in its "
                           f"last epochs, and {epochs} epochs leave none frozen ({e}); give "
                           "more --dense-epochs or --finetune-epochs, or --no-budget") from None


def lam_for(arm: str, model: str, target: float, given: list[tuple[str, str, float, float]]
            ) -> float:
    for a, m, t, lam in reversed(given):
        if (a, m, t) == (arm, model, target):
            return lam
    if (arm, model, target) in DEFAULT_LAMS:
        return DEFAULT_LAMS[arm, model, target]
    raise PBInputError(f"no lam for {arm} on {model} at {target:g}x; give --lam "
                       f"{arm}:{model}:{target:g}=LAM")


# ----------------------------------------------------------------------------- the runs


def run_model(name: str, args: argparse.Namespace, data: dict, dev: torch.device,
              tmp: Path, log: Callable[[dict], None]) -> None:
    """Every seed, target and arm of model ``name``; each finished run passed to ``log``."""
    from pbscale import prune_model
    from pbscale.nets.channels import channel_groups

    cls = MODELS[name]
    shape = cls.input_shape
    example = torch.zeros(1, *shape)
    batch_example = torch.zeros(128, *shape)
    total = args.dense_epochs + args.finetune_epochs
    ref = make(name, args.width)
    dense_cost = measure(copy.deepcopy(ref), example, batch_example, args.latency_repeats)
    budgeted = set(MAG_ARMS) | (set() if args.no_budget else set(PB_ARMS))
    ratios = {t: tp_ratio(ref, t, example) for t in args.targets
              if set(args.arms) & (set(TP_ARMS) | budgeted)}
    groups = channel_groups(copy.deepcopy(ref), example)  # traced once for every target
    matched = {t: steer_fraction(groups, None, dense_cost["macs"] / ratios[t][1])
               for t in ratios if set(args.arms) & budgeted}
    tp_arms = [a for a in args.arms if a in TP_ARMS]
    fractions = {t: steer_fraction(groups, None, t) for t in args.targets
                 if args.steer and set(args.arms) & set(PB_ARMS)}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        init = init_weights(make(name, args.width), "kaiming_normal",
                            torch.Generator().manual_seed(seed))
        base = {"model": name, "seed": seed, "dense_params": dense_cost["params"],
                "dense_macs": dense_cost["macs"], "dense_latency_b1": dense_cost["latency_b1"],
                "dense_latency_b128": dense_cost["latency_b128"]}
        dense: dict[bool, nn.Module] = {}
        for slim in sorted({a == "bn" and args.slimming_l1 > 0 for a in tp_arms}):
            t0 = time.perf_counter()
            net = copy.deepcopy(init).to(dev)
            train(net, data["train"], args.dense_epochs, LR, args.batch_size, seed, dev,
                  args.slimming_l1 if slim else 0.0)
            dense[slim] = net
            log({**base, "target": 1.0, "arm": "dense-slimming" if slim else "dense",
                 "lam": "", "ratio": 0.0, "epochs": args.dense_epochs,
                 "acc": accuracy(net, *data["test"], dev), **dense_cost,
                 "seconds": time.perf_counter() - t0})
        for target in args.targets:
            for arm in args.arms:
                t0 = time.perf_counter()
                if arm in TP_ARMS:
                    net = copy.deepcopy(dense[arm == "bn" and args.slimming_l1 > 0])
                    grads = (taylor_grads(data["train"], args.batch_size, dev)
                             if arm == "taylor" else None)
                    torch.manual_seed(seed)  # the random criterion
                    tp_prune(net, arm, ratios[target][0], example.to(dev), grads)
                    train(net, data["train"], args.finetune_epochs, FT_LR, args.batch_size,
                          seed, dev)
                    lam, ratio, reported, own = "", ratios[target][0], "", {}
                else:  # pbscale's arms: one joint channel run, the L0 term or cut by MACs
                    if arm in MAG_ARMS:  # cut to the Torch-Pruning arms' MACs
                        lam, own = "", {"target": matched[target]}
                    else:
                        lam = lam_for(arm, name, target, args.lam)
                        own = {"lam": lam, "n": args.n,
                               **({"lam_target": fractions[target]} if args.steer else {}),
                               **({} if args.no_budget else {"budget": matched[target]})}
                    res = prune_model(copy.deepcopy(init), data["train"], data["test"],
                                      val=data["val"], method=arm, mode="joint",
                                      epochs=total, seed=seed, granularity="channel",
                                      cost="macs", init="model", batch_size=args.batch_size,
                                      out=tmp / f"{name}-{arm}-{target:g}-{seed}",
                                      device=str(dev), threads=args.threads, progress=False,
                                      **own)
                    net = res.structured().to(dev)
                    ratio, reported = "", res.summary.get("final_test_acc", "")
                acc = accuracy(net, *data["test"], dev)
                cost = measure(net, example, batch_example, args.latency_repeats)
                log({**base, "target": target, "arm": arm, "lam": lam, "ratio": ratio,
                     "lam_target": own.get("lam_target", ""),
                     "budget": own.get("budget", own.get("target", "")),
                     "epochs": total, "acc": acc, **cost, "reported_acc": reported,
                     "seconds": time.perf_counter() - t0})


# ----------------------------------------------------------------------------- reporting


def summarize(rows: list[dict]) -> list[dict]:
    """Mean and s.d. over seeds per (model, target, arm)."""
    keys: dict[tuple, list[dict]] = {}
    for r in rows:
        keys.setdefault((r["model"], float(r["target"]), r["arm"]), []).append(r)
    out = []
    for (model, target, arm), rs in keys.items():
        def stat(k: str, rs: list[dict] = rs) -> tuple[float, float]:
            v = [float(r[k]) for r in rs]
            return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else 0.0)

        acc, acc_sd = stat("acc")
        macs, macs_sd = stat("macs")
        red = [float(r["dense_macs"]) / float(r["macs"]) for r in rs]
        sp1 = [float(r["dense_latency_b1"]) / float(r["latency_b1"]) for r in rs]
        sp128 = [float(r["dense_latency_b128"]) / float(r["latency_b128"]) for r in rs]
        out.append({"model": model, "target": target, "arm": arm, "seeds": len(rs),
                    "acc_mean": acc, "acc_sd": acc_sd, "params_mean": stat("params")[0],
                    "macs_mean": macs, "macs_sd": macs_sd,
                    "macs_reduction": statistics.fmean(red),
                    "speedup_b1": statistics.fmean(sp1), "speedup_b128": statistics.fmean(sp128),
                    "speedup_b128_per_macs_ratio": statistics.fmean(
                        s / m for s, m in zip(sp128, red))})
    return out


def markdown(summary: list[dict]) -> str:
    lines = ["| model | target | arm | seeds | test acc (mean ± s.d.) | params | MACs | MACs "
             "reduction | CPU speedup b1 | CPU speedup b128 | b128 speedup / MACs ratio |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in summary:
        tgt = "dense" if s["target"] == 1 else f"{s['target']:g}x"
        lines.append(
            f"| {s['model']} | {tgt} | {LABELS.get(s['arm'], s['arm'])} | {s['seeds']} | "
            f"{100 * s['acc_mean']:.2f} ± {100 * s['acc_sd']:.2f} | {s['params_mean']:,.0f} | "
            f"{s['macs_mean']:,.0f} | {s['macs_reduction']:.2f}x | {s['speedup_b1']:.2f}x | "
            f"{s['speedup_b128']:.2f}x | {s['speedup_b128_per_macs_ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def paired_gap(ours: list[dict], theirs: list[dict]) -> GapTest | None:
    """The accuracy gap ours - theirs over the seeds both arms ran (runs.csv rows of one model
    and target; a seed shares the initial weights and the split between arms, so the seeds
    pair): mean, standard error sd / sqrt(k) and k - 1 degrees of freedom; None under two
    seeds."""
    a = {int(r["seed"]): float(r["acc"]) for r in ours}
    b = {int(r["seed"]): float(r["acc"]) for r in theirs}
    diffs = [a[k] - b[k] for k in sorted(a.keys() & b.keys())]
    if len(diffs) < 2:
        return None
    return GapTest(statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs)),
                   len(diffs) - 1, "paired")


def reading(pb: dict, tp: dict, kind: str = "PB", gap: GapTest | None = None) -> str:
    """Which of two arms (summary rows: ours, of ``kind``, and Torch-Pruning's) is ahead: the
    more accurate one only where it also removed at least as many MACs (it dominates; MACs
    reductions within :data:`MACS_TOLERANCE` of each other count as equal) and,
    given the seeds' paired ``gap`` (ours - theirs), its 95% interval excludes 0; otherwise
    no verdict: not at equal MACs, or within the seeds' noise."""
    acc = pb["acc_mean"] >= tp["acc_mean"]
    who, more, less = (kind, pb, tp) if acc else ("Torch-Pruning", tp, pb)
    if more["macs_reduction"] < less["macs_reduction"] * (1 - MACS_TOLERANCE):
        why = ("the PB arms freeze masks within the Torch-Pruning arms' MACs unless --no-budget"
               if kind == "PB" else "no channel left out fitted the rest of the MACs budget")
        return (f"{who} more accurate but with fewer MACs removed: no verdict at equal MACs "
                f"({why})")
    if gap is None:
        return f"{who} more accurate at at least as large a MACs reduction (one seed: no interval)"
    interval = (f"gap {100 * gap.mean:+.2f} points, 95% paired interval "
                f"[{100 * gap.low:+.2f}, {100 * gap.high:+.2f}] over {gap.df + 1:g} seeds")
    if gap.low > 0 or gap.high < 0:
        return f"{who} more accurate at at least as large a MACs reduction ({interval})"
    return f"within the seeds' noise ({interval}): no verdict"


def verdicts(summary: list[dict], rows: list[dict]) -> list[str]:
    """Per model and target: the best PB and the best Torch-Pruning arm (accuracy, MACs), and
    the best magnitude arm over channels against the best Torch-Pruning arm, each read with
    the seeds' paired gap of ``rows`` (runs.csv; all arms are cut to the Torch-Pruning arms'
    MACs unless --no-budget)."""
    out = []
    for model in dict.fromkeys(s["model"] for s in summary):
        for target in sorted({s["target"] for s in summary if s["model"] == model} - {1.0}):
            here = [s for s in summary if s["model"] == model and s["target"] == target]
            tp = [s for s in here if s["arm"] in TP_ARMS]
            if not tp:
                continue
            b_tp = max(tp, key=lambda s: s["acc_mean"])

            def runs(arm: str, model: str = model, target: float = target) -> list[dict]:
                return [r for r in rows if r["model"] == model and r["arm"] == arm
                        and float(r["target"]) == target]

            for kind, arms in (("PB", PB_ARMS), ("magnitude", MAG_ARMS)):
                ours = [s for s in here if s["arm"] in arms]
                if not ours:
                    continue
                b = max(ours, key=lambda s: s["acc_mean"])
                gap = paired_gap(runs(b["arm"]), runs(b_tp["arm"]))
                out.append(f"{model} {target:g}x: best {kind} {b['arm']} "
                           f"{100 * b['acc_mean']:.2f}% at {b['macs_reduction']:.2f}x MACs, "
                           f"best TP {b_tp['arm']} {100 * b_tp['acc_mean']:.2f}% at "
                           f"{b_tp['macs_reduction']:.2f}x MACs: {reading(b, b_tp, kind, gap)}")
    return out


def figure(summary: list[dict], model: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for arm in dict.fromkeys(s["arm"] for s in summary if s["model"] == model):
        pts = [s for s in summary if s["model"] == model and s["arm"] == arm]
        ax.errorbar([s["macs_mean"] for s in pts], [100 * s["acc_mean"] for s in pts],
                    xerr=[s["macs_sd"] for s in pts], yerr=[100 * s["acc_sd"] for s in pts],
                    marker=MARKERS.get(arm, "."), linestyle="none", capsize=3,
                    label=LABELS.get(arm, arm))
    ax.set_xscale("log")
    ax.set_xlabel("MACs per example (pruned network)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{model}: accuracy against MACs (mean ± s.d. over seeds)")
    ax.legend(fontsize=7)
    save_figure(fig, [path])
    plt.close(fig)


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    if args.smoke:
        for k, v in SMOKE.items():
            if f"--{k.replace('_', '-')}" not in (argv if argv is not None else sys.argv[1:]):
                setattr(args, k, v)
    if not (0 < args.width <= 4):
        raise PBInputError(f"--width {args.width:g} is out of range; give a multiplier in "
                           f"(0, 4], e.g. 0.5")
    for arm in args.arms:  # every PB lam, and epochs that freeze a budgeted mask, first
        if arm in PB_ARMS:
            for model in args.models:
                for target in args.targets:
                    lam_for(arm, model, target, args.lam)
            if not args.no_budget:
                check_budget_epochs(arm, args.dense_epochs + args.finetune_epochs)
    try:
        import torch_pruning  # noqa: F401
    except ImportError:
        raise PBInputError("the benchmark prunes channels with torch-pruning; pip install "
                           "'pbnn[structured]' (or torch-pruning)") from None
    out = args.out
    if args.summarize:
        if not (out / "runs.csv").is_file():
            raise PBInputError(f"--summarize: {out}/runs.csv does not exist; give the --out of "
                               f"a benchmark")
        rows = io.read_csv(out / "runs.csv")
        report(rows, out, list(dict.fromkeys(r["model"] for r in rows)))
        return
    dev = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    kinds = {MODELS[m].dataset for m in args.models}
    data = {"mnist": lambda: load_data(args.data_dir, args.train_size, args.test_size),
            "cifar10": lambda: load_cifar(args.cifar_dir, args.train_size, args.test_size)}
    sets = {k: data[k]() for k in sorted(kinds)}
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    settings.update(command="python -m benchmarks.bench_structured " + shlex.join(
        argv if argv is not None else sys.argv[1:]), date=datetime.date.today().isoformat(),
        commit=commit(), torch=torch.__version__, lams={
            f"{a}:{m}:{t:g}": lam_for(a, m, t, args.lam) for a in args.arms if a in PB_ARMS
            for m in args.models for t in args.targets})
    (out / "settings.json").write_text(json.dumps(settings, indent=1) + "\n")
    rows: list[dict] = []

    def log(row: dict) -> None:
        rows.append(row)
        print(f"{row['model']:9} {row['arm']:15} target {row['target']:g}x seed {row['seed']}: "
              f"acc {100 * row['acc']:.2f}%  MACs {row['dense_macs'] / row['macs']:.2f}x "
              f"fewer  b128 latency {row['dense_latency_b128'] / row['latency_b128']:.2f}x "
              f"faster  ({row['seconds']:.0f} s)", flush=True)
        io.write_csv(out / "runs.csv", [{**{"reported_acc": "", "lam_target": "",
                                             "budget": "", "widths": ""}, **r} for r in rows])

    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            d = sets[MODELS[name].dataset]
            if d["train"][0].shape[-1] < MODELS[name].input_shape[-1]:  # MNIST for 32x32
                d = pad32(d, float(d["train"][0].min()))
            run_model(name, args, d, dev, Path(tmp), log)
    report(rows, out, args.models)


def report(rows: list[dict], out: Path, models: list[str]) -> None:
    """summary.csv, summary.md and the figures of ``rows`` (runs.csv) in ``out``."""
    summary = summarize(rows)
    io.write_csv(out / "summary.csv", summary)
    lines = verdicts(summary, rows)
    (out / "summary.md").write_text(markdown(summary) + "\n" + "".join(
        f"* {v}\n" for v in lines))
    for name in models:
        figure(summary, name, out / f"accuracy_vs_macs_{name}.png")
    print(markdown(summary))
    for v in lines:
        print(v)
    print(f"wrote {out}/runs.csv, summary.csv, summary.md, accuracy_vs_macs_*.png, "
          f"settings.json")


if __name__ == "__main__":
    sys.exit(run(main))
