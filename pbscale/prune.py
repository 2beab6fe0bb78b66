"""``python -m pbscale.prune``: pruning as PB optimization (`sec:app_pruning_setup`).

Supermask (`sec:app_supermask_setup`, weights fixed at their random initialization) and joint
pruning (`sec:app_joint_pruning_setup`, weights and masks trained together) of the networks of
:mod:`pbscale.models` on MNIST / CIFAR-10 (:mod:`pbscale.data`), with masks found by CP or by
MC estimators (ARMS, LOORF, DisARM; escort or sigmoid), against magnitude pruning (MP, GMP:
:mod:`pbscale.magnitude`) and a dense network.

Objective per batch and mask z (d masked weights): J(z) = CE(network with weights w * z) +
lambda * sum_i z_i (L0 strength lambda per weight). MC methods get the gradient of the CE term
from :func:`pbscale.methods.mc_gradient` over n masks evaluated at once
(:func:`pbscale.batched.forward_masked`) and the L0 term in closed form (lambda * sum theta);
CP differentiates CE(w * sigmoid(r / tau)) + lambda * sum sigmoid(r / tau) with tau annealed from 1
to 1/200 (:func:`pbscale.methods.cp_temperature`) and is evaluated with 1[r > 0]. MC runs use
dynamic weight rescaling (each layer's masked weights divided by the mean of its mask, a
constant in the backward pass; CP does not, as in the paper). Joint MC runs train the dense
network for the first 10% of epochs; joint mask methods freeze their mask for the last 20%
while the weights fine-tune. The evaluation mask of MC runs: 10 masks sampled, each scored
(training loss) on the same 10 training batches, the best kept for validation and test.
BatchNorm running statistics of mask methods are recomputed for the evaluation mask on those
10 batches (the k-mask forward uses each mask's batch statistics and never updates them).

The run loop here (``run``: run folder by config hash, metrics CSV, checkpoints every epoch and
on SIGTERM, resume) is the thinnest one pruning needs; it is meant to move onto the shared run
loop (``pbscale/loop.py``) once that exists.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F
from torch.nn.utils import prune as torch_prune

from pbexact.errors import PBInputError
from pbexact.estimators import MIN_SAMPLES
from pbexact.io import atomic_write_bytes, write_json
from pbexact.parametrizations import PARAMETRIZATIONS, get_parametrization
from pbscale import data as datamod
from pbscale import magnitude
from pbscale.batched import cross_entropy_per_mask, forward_masked
from pbscale.io import read_json
from pbscale.io import write_csv as write_rows
from pbscale.masks import MaskedModule
from pbscale.methods import (
    BernoulliSampler,
    auto_chunk,
    cp_hard_mask,
    cp_temperature,
    dense_regularizer,
    mc_gradient,
)
from pbscale.models import INITS, MODELS, build_model
from pbscale.regress import resolve_device, set_threads

MODES = ("supermask", "joint")
MC = ("arms", "loorf", "disarm")
PRUNE_METHODS = ("cp", *MC, "mp", "gmp", "dense")
MASK_OPTIMIZERS = ("rmsprop", "sgd")
#: Default model -> data set.
MODEL_DATA = {"lenet": "mnist", "conv6": "cifar10", "resnet20": "cifar10", "vgg19": "cifar10"}
#: Weight optimizer of joint runs (`sec:app_joint_pruning_setup`).
WEIGHT_LR, WEIGHT_MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-4
#: Step decays (fraction of epochs, multiplier) of `tab:app_supermask_hypers` and
#: `tab:app_pruning_broad`: weights and CP masks x0.1 at 40% and 60%; MC masks x0.5 at 60%.
WEIGHT_SCHEDULE = ((0.4, 0.1), (0.6, 0.1))
CP_SCHEDULE = ((0.4, 0.1), (0.6, 0.1))
MC_SCHEDULE = ((0.6, 0.5),)
#: Joint runs: MC masks start after 10% of epochs; masks frozen for the last 20%.
MC_START, FREEZE_AT = 0.1, 0.8
#: Evaluation rule of MC runs: masks sampled x training batches scored.
EVAL_MASKS, EVAL_BATCHES = 10, 10
THETA0 = 0.5


@dataclass
class PruneConfig:
    """One pruning run; every field goes into the run folder's hash (``config.json``)."""

    model: str = "lenet"
    dataset: str = ""
    mode: str = "supermask"
    method: str = "cp"
    param: str = "escort"
    n: int = 10
    lam: float = 1e-4
    mask_opt: str = "rmsprop"
    mask_lr: float = 0.01
    target: float = 0.1
    epochs: int = 200
    batch_size: int = 0
    lr: float = WEIGHT_LR
    seed: int = 0
    init: str = "kaiming_normal"
    mask_head: bool = False
    mask_shortcuts: bool = False
    prune_at: float = 0.4
    gmp_start: float = MC_START
    gmp_end: float = FREEZE_AT
    gmp_every: int = 100
    chunk: int = 0
    max_batches: int = 0
    val_size: int = datamod.VAL_SIZE
    split_seed: int = 0
    synthetic: int = 0
    eval_masks: int = EVAL_MASKS
    eval_batches: int = EVAL_BATCHES
    data_dir: str = field(default="", metadata={"hash": False})

    def resolved(self) -> PruneConfig:
        """Defaults that depend on other fields filled in (data set, batch size)."""
        c = copy.copy(self)
        if not c.dataset:
            c.dataset = MODEL_DATA.get(c.model, "")
        if not c.batch_size:
            c.batch_size = 64 if (c.model == "vgg19" and c.mode == "joint") else 128
        return c

    def validate(self) -> PruneConfig:
        """Raise :class:`PBInputError` (one line: the problem and the fix) on the first bad
        setting; nothing is trained or loaded before this passes."""
        c = self
        if c.model not in MODELS:
            raise PBInputError(f"unknown model {c.model!r}; choose one of {', '.join(MODELS)}")
        if c.dataset not in datamod.DATASETS:
            raise PBInputError(f"unknown dataset {c.dataset!r}; choose one of "
                               f"{', '.join(datamod.DATASETS)}")
        if c.dataset != MODEL_DATA[c.model]:
            raise PBInputError(f"{c.model} takes {MODEL_DATA[c.model]} inputs, not {c.dataset}; "
                               f"use --dataset {MODEL_DATA[c.model]}")
        if c.mode not in MODES:
            raise PBInputError(f"unknown mode {c.mode!r}; choose one of {', '.join(MODES)}")
        if c.method not in PRUNE_METHODS:
            raise PBInputError(f"unknown method {c.method!r}; choose one of "
                               f"{', '.join(PRUNE_METHODS)}")
        if c.method in ("mp", "gmp") and c.mode != "joint":
            raise PBInputError(f"{c.method.upper()} prunes trained weights; use --mode joint")
        if c.param not in PARAMETRIZATIONS:
            raise PBInputError(f"unknown parametrization {c.param!r}; choose one of "
                               f"{', '.join(PARAMETRIZATIONS)}")
        if c.method in MC:
            if c.method not in MIN_SAMPLES:
                raise PBInputError(f"estimator {c.method!r} is not available in this build; "
                                   f"use arms or loorf")
            if not isinstance(c.n, int) or c.n < 2:
                raise PBInputError(f"{c.method.upper()} needs n >= 2 samples per step, got "
                                   f"n={c.n}; use e.g. --n 10")
            if c.method == "disarm" and c.n % 2:
                raise PBInputError(f"DisARM uses antithetic pairs: n must be even, got n={c.n}")
        if not (isinstance(c.lam, (int, float)) and math.isfinite(c.lam) and c.lam >= 0):
            raise PBInputError(f"--lam is an L0 strength and must be >= 0, got {c.lam}")
        if c.mask_opt not in MASK_OPTIMIZERS:
            raise PBInputError(f"unknown mask optimizer {c.mask_opt!r}; choose one of "
                               f"{', '.join(MASK_OPTIMIZERS)}")
        for name in ("mask_lr", "lr"):
            v = getattr(c, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise PBInputError(f"--{name.replace('_', '-')} must be a positive number, "
                                   f"got {v}")
        if c.method in ("mp", "gmp"):
            magnitude.check_fraction(c.target)
        if not isinstance(c.epochs, int) or c.epochs < 1:
            raise PBInputError(f"--epochs must be a positive integer, got {c.epochs}")
        if c.batch_size < 1:
            raise PBInputError(f"--batch-size must be positive, got {c.batch_size}")
        if c.init not in INITS:
            raise PBInputError(f"unknown init {c.init!r}; choose one of {', '.join(INITS)}")
        for name in ("prune_at", "gmp_start", "gmp_end"):
            if not 0 <= getattr(c, name) <= 1:
                raise PBInputError(f"--{name.replace('_', '-')} is a fraction of training in "
                                   f"[0, 1], got {getattr(c, name)}")
        if c.gmp_end < c.gmp_start:
            raise PBInputError("--gmp-end must not come before --gmp-start")
        if c.eval_masks < 1 or c.eval_batches < 1:
            raise PBInputError("--eval-masks and --eval-batches must be >= 1")
        if c.gmp_every < 1 or c.chunk < 0 or c.max_batches < 0 or c.synthetic < 0:
            raise PBInputError("--gmp-every must be >= 1; --chunk, --max-batches and "
                               "--synthetic must be >= 0 (0: off)")
        return c

    def hashed(self) -> dict:
        """The fields that define the run (not where its data lives)."""
        d = asdict(self)
        d.pop("data_dir")
        return d

    def run_name(self) -> str:
        blob = json.dumps(self.hashed(), sort_keys=True).encode()
        return f"{self.model}-{self.mode}-{self.method}-{hashlib.sha256(blob).hexdigest()[:12]}"


def schedule_factor(epoch: int, epochs: int, milestones: tuple[tuple[float, float], ...]) -> float:
    """Step decay: the product of the multipliers whose milestone (fraction of epochs) has been
    reached at ``epoch`` (0-based)."""
    f = 1.0
    for frac, mult in milestones:
        if epoch >= round(frac * epochs):
            f *= mult
    return f


def rescale(masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Dynamic weight rescaling (`sec:app_pruning_setup`): each mask (k, *shape) divided by the
    mean of its own values per mask, the quotient detached (a constant in the backward pass);
    an all-zero mask keeps scale 1 (its layer outputs only its biases)."""
    out = {}
    for name, m in masks.items():
        mean = m.detach().flatten(1).mean(1)
        scale = torch.where(mean > 0, 1.0 / mean.clamp_min(1e-30), torch.ones_like(mean))
        out[name] = m * scale.view(-1, *([1] * (m.dim() - 1)))
    return out


def masked_ce(model: nn.Module, layout: MaskedModule, x: torch.Tensor, y: torch.Tensor,
              dwr: bool = True, backward_scale: float | None = None):
    """The batched loss f(z) of MC pruning: masks z (k, d) laid out by ``layout`` -> mean
    cross-entropy on (x, y) per mask (k,), the k masked networks evaluated at once by
    :func:`pbscale.batched.forward_masked` with dynamic weight rescaling (``dwr``). When
    ``backward_scale`` is given (joint training) it also adds backward_scale * the gradient of
    sum_k CE_k to the weights' .grad: with backward_scale = 1 / n over a step's n samples, the
    weights get the mean of the per-sample gradients."""

    def f(z: torch.Tensor) -> torch.Tensor:
        masks = layout.split(z.to(layout.dtype))
        if dwr:
            masks = rescale(masks)
        with torch.enable_grad() if backward_scale is not None else torch.no_grad():
            J = cross_entropy_per_mask(forward_masked(model, masks, x), y)
            if backward_scale is not None:
                (J.sum() * backward_scale).backward()
        return J.detach()

    return f


class PruneTask:
    """Everything one pruning run trains and evaluates: the network, its masks and optimizers.

    Task-shaped (train one epoch, evaluate -> metrics, state_dict / load_state_dict, export), so
    that it can move onto the shared run loop. Shapes: masks are flat (d,) vectors laid out by
    :class:`pbscale.masks.MaskedModule` over :attr:`names`; escort logits are (2d,)."""

    def __init__(self, cfg: PruneConfig, data: datamod.Data, device: torch.device) -> None:
        self.cfg = cfg
        self.data = data
        self.device = device
        self.model = build_model(cfg.model, cfg.seed, cfg.init).to(device)
        self.names = self.model.masked_names(cfg.mask_head, cfg.mask_shortcuts)
        self.layout = MaskedModule(self.model, self.names)
        self.d = self.layout.d
        self.steps_per_epoch = math.ceil(len(data.train) / cfg.batch_size)
        if cfg.max_batches:
            self.steps_per_epoch = min(self.steps_per_epoch, cfg.max_batches)
        self.total_steps = self.steps_per_epoch * cfg.epochs
        self.trains_weights = cfg.mode == "joint" or cfg.method == "dense"
        for p in self.model.parameters():
            p.requires_grad_(self.trains_weights)
        self.weight_opt = (torch.optim.SGD(self.model.parameters(), lr=cfg.lr,
                                           momentum=WEIGHT_MOMENTUM, nesterov=True,
                                           weight_decay=WEIGHT_DECAY)
                           if self.trains_weights else None)
        self.param = get_parametrization(cfg.param)
        self.r: torch.Tensor | None = None
        self.mask_opt: torch.optim.Optimizer | None = None
        if cfg.method in MC or cfg.method == "cp":
            theta0 = torch.full((self.d,), THETA0, dtype=torch.float64)
            r0 = torch.zeros(self.d, dtype=torch.float64) if cfg.method == "cp" else \
                self.param.logits(theta0)
            self.r = nn.Parameter(r0.float().to(device))
            opt_cls = torch.optim.RMSprop if cfg.mask_opt == "rmsprop" else torch.optim.SGD
            self.mask_opt = opt_cls([self.r], lr=cfg.mask_lr)
        # binary masks of MP / GMP (all ones for dense); the frozen mask of mask methods
        self.fixed: dict[str, torch.Tensor] | None = None
        if cfg.method in ("mp", "gmp", "dense"):
            self.fixed = {k: torch.ones_like(self.params[k]) for k in self.names}
        self.frozen = False
        self.eval_mask: torch.Tensor | None = None  # (d,) chosen at the latest evaluation
        self.data_gen = torch.Generator().manual_seed(4 * cfg.seed + 1)
        self.mask_gen = torch.Generator(device=device).manual_seed(4 * cfg.seed + 2)
        self.eval_gen = torch.Generator().manual_seed(4 * cfg.seed + 3)
        self.sel_gen = torch.Generator(device=device).manual_seed(4 * cfg.seed + 4)
        self.step = 0
        self.has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                          for m in self.model.modules())
        self.num_all = sum(p.numel() for p in self.model.parameters())
        self.chunk = cfg.chunk or auto_chunk(cfg.n, 64 * self.d, device)

    # ------------------------------------------------------------------ masks and forwards

    @property
    def params(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters())

    @property
    def mc(self) -> bool:
        return self.cfg.method in MC

    def masked_params(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Parameters under ONE mask z (d,): (w * scale) * mask for the masked tensors (scale:
        dynamic weight rescaling for MC, else 1), the rest unchanged; the exact tensors
        ``pruned.pt`` stores as weight_orig * weight_mask."""
        scales = self.layer_scales(z)
        masks = self.layout.split(z[None])
        p = self.params
        return {**p, **{k: (p[k] * scales[k]) * masks[k][0] for k in masks}}

    def layer_scales(self, z: torch.Tensor) -> dict[str, float]:
        """Dynamic weight rescaling constants 1 / mean(mask) per layer for mask z (d,)."""
        out = {}
        for k, m in self.layout.split(z[None]).items():
            mean = float(m.mean())
            out[k] = (1.0 / mean if mean > 0 else 1.0) if self.mc else 1.0
        return out

    def forward_one(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.model, params, (x,))

    def mc_loss(self, x: torch.Tensor, y: torch.Tensor, backward_scale: float | None):
        """:func:`masked_ce` of this run's network on the batch (x, y)."""
        return masked_ce(self.model, self.layout, x, y, backward_scale=backward_scale)

    def current_fixed_mask(self) -> torch.Tensor:
        """The mask (d,) used while masks are not trained: MP/GMP/dense binary masks, or the
        frozen evaluation mask."""
        if self.fixed is not None:
            return torch.cat([self.fixed[k].reshape(-1) for k in self.names])
        assert self.eval_mask is not None
        return self.eval_mask

    # ------------------------------------------------------------------ training

    def set_learning_rates(self, epoch: int) -> None:
        c = self.cfg
        if self.weight_opt is not None:
            for g in self.weight_opt.param_groups:
                g["lr"] = c.lr * schedule_factor(epoch, c.epochs, WEIGHT_SCHEDULE)
        if self.mask_opt is not None:
            sched = MC_SCHEDULE if self.mc else CP_SCHEDULE
            for g in self.mask_opt.param_groups:
                g["lr"] = c.mask_lr * schedule_factor(epoch, c.epochs, sched)

    def phase(self, epoch: int) -> str:
        """'masks' (masks train; joint: weights too), 'warmup' (joint MC: dense weights only),
        'fixed' (weights train under a fixed mask: MP/GMP/dense, or a frozen mask)."""
        c = self.cfg
        if c.method in ("mp", "gmp", "dense"):
            return "fixed"
        if c.mode == "supermask":
            return "masks"
        frac = epoch / c.epochs
        if frac >= FREEZE_AT:
            return "fixed"
        if self.mc and frac < MC_START:
            return "warmup"
        return "masks"

    def magnitude_update(self, epoch: int) -> None:
        """MP: one global cut at the start of epoch round(prune_at * epochs); GMP: a cut every
        ``gmp_every`` steps on Zhu and Gupta's cubic schedule from gmp_start to gmp_end."""
        c = self.cfg
        if c.method == "mp":
            cut = min(round(c.prune_at * c.epochs) * self.steps_per_epoch, self.total_steps - 1)
            if self.step != cut:
                return
            frac = c.target
        elif c.method == "gmp":
            end = min(round(c.gmp_end * self.total_steps), self.total_steps - 1)
            start = min(round(c.gmp_start * self.total_steps), end)
            if self.step < start or self.step > end:
                return
            if (self.step - start) % c.gmp_every and self.step != end:
                return
            frac = magnitude.gmp_fraction(self.step, start, end, c.target)
        else:
            return
        p = self.params
        self.fixed = magnitude.global_magnitude_masks({k: p[k] for k in self.names}, frac,
                                                      self.fixed)
        magnitude.apply_masks_(p, self.fixed)

    def train_step(self, x: torch.Tensor, y: torch.Tensor, epoch: int) -> float:
        c, phase = self.cfg, self.phase(epoch)
        self.model.train()
        if self.weight_opt is not None:
            self.weight_opt.zero_grad(set_to_none=True)
        if c.method in ("mp", "gmp"):
            self.magnitude_update(epoch)
        if phase == "fixed" or phase == "warmup":
            if phase == "warmup" or c.method == "dense":
                params = self.params
            elif self.fixed is not None:
                p = self.params
                params = {**p, **{k: p[k] * self.fixed[k] for k in self.names}}
            else:
                params = self.masked_params(self.eval_mask)
            loss = F.cross_entropy(self.forward_one(params, x), y)
            loss.backward()
            value = float(loss.detach())
        elif c.method == "cp":
            tau = cp_temperature(self.step, self.mask_steps())
            soft = torch.sigmoid(self.r / tau)
            masks = self.layout.split(soft[None])
            p = self.params
            params = {**p, **{k: p[k] * masks[k][0] for k in self.names}}
            ce = F.cross_entropy(self.forward_one(params, x), y)
            (ce + c.lam * soft.sum()).backward()
            value = float(ce.detach())
        else:  # MC
            f = self.mc_loss(x, y, 1.0 / c.n if self.trains_weights else None)
            est = mc_gradient(f, self.r, self.param, c.method, c.n, self.mask_gen, self.chunk)
            grad = est.grad
            if c.lam > 0:
                grad = grad + dense_regularizer(self.r, self.param.theta, c.lam)[1]
            self.r.grad = grad.to(self.r.dtype)
            value = est.loss
        if self.mask_opt is not None and phase == "masks":
            self.mask_opt.step()
            self.mask_opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                self.r.copy_(self.param.project(self.r))
        if self.weight_opt is not None:
            self.weight_opt.step()
            if self.fixed is not None and c.method != "dense":
                magnitude.apply_masks_(self.params, self.fixed)
        self.step += 1
        return value

    def mask_steps(self) -> int:
        """Steps over which CP anneals tau: the steps during which its mask trains."""
        if self.cfg.mode == "joint":
            return max(1, round(FREEZE_AT * self.cfg.epochs) * self.steps_per_epoch)
        return self.total_steps

    def epoch_start(self, epoch: int) -> None:
        """Learning rates of this epoch; at the first frozen epoch, fix the evaluation mask."""
        self.set_learning_rates(epoch)
        if self.phase(epoch) == "fixed" and self.r is not None and not self.frozen:
            self.eval_mask = self.choose_mask()[0]
            self.frozen = True

    # ------------------------------------------------------------------ evaluation

    def selection_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """EVAL_BATCHES training batches (no augmentation) drawn with the evaluation
        generator."""
        return list(self.data.batches("train", self.cfg.batch_size, self.eval_gen,
                                      augment=False, limit=self.cfg.eval_batches))

    @torch.no_grad()
    def choose_mask(self) -> tuple[torch.Tensor, list]:
        """The evaluation mask (d,) and the batches it was scored on: MC: the best of
        EVAL_MASKS sampled masks by mean training loss on EVAL_BATCHES batches; CP: 1[r > 0];
        MP/GMP/dense: their binary mask; a frozen mask stays."""
        batches = self.selection_batches()
        if self.frozen or self.r is None:
            return self.current_fixed_mask(), batches
        if self.cfg.method == "cp":
            return cp_hard_mask(self.r.detach()), batches
        theta = self.param.theta(self.r.detach())
        sampler = BernoulliSampler(theta, self.sel_gen)
        self.model.train()  # batch statistics per mask, as in training
        best, best_loss = None, math.inf
        left = self.cfg.eval_masks
        while left:  # masks drawn and scored a chunk at a time: memory O(chunk d)
            k = min(self.chunk, left)
            z = sampler.next(k)
            losses = torch.zeros(k, device=self.device)
            for x, y in batches:
                losses += self.mc_loss(x, y, None)(z)
            i = int(torch.argmin(losses))
            if float(losses[i]) < best_loss:
                best, best_loss = z[i].clone(), float(losses[i])
            left -= k
        return best, batches

    @torch.no_grad()
    def recalibrate_bn(self, params: dict, batches: list) -> None:
        """BatchNorm running statistics recomputed (cumulative average) for ``params``."""
        bns = [m for m in self.model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        saved = [m.momentum for m in bns]
        for m in bns:
            m.reset_running_stats()
            m.momentum = None
        self.model.train()
        for x, _ in batches:
            self.forward_one(params, x)
        for m, mom in zip(bns, saved):
            m.momentum = mom

    @torch.no_grad()
    def score(self, params: dict, batches) -> tuple[float, float]:
        """(mean cross-entropy, accuracy) of the network under ``params`` in eval mode."""
        self.model.eval()
        loss, correct, count = 0.0, 0, 0
        for x, y in batches:
            out = self.forward_one(params, x)
            loss += float(F.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
            count += len(y)
        return loss / max(count, 1), correct / max(count, 1)

    def evaluate(self) -> dict:
        """Metrics of the evaluation mask: train (on the selection batches), val, test, and
        weights remaining over the masked tensors, over all parameters and per layer."""
        z, batches = self.choose_mask()
        self.eval_mask = z
        params = self.masked_params(z)
        if self.has_bn and self.cfg.method in (*MC, "cp"):
            self.recalibrate_bn(params, batches)
        row = {}
        row["train_loss"], row["train_acc"] = self.score(params, batches)
        row["val_loss"], row["val_acc"] = self.score(params, self.data.batches("val", 1000))
        row["test_loss"], row["test_acc"] = self.score(params, self.data.batches("test", 1000))
        kept = int(z.count_nonzero())
        row["remaining"] = kept / self.d
        row["remaining_all"] = (self.num_all - self.d + kept) / self.num_all
        for k, m in self.layout.split(z[None]).items():
            row[f"remaining_{k.removesuffix('.weight')}"] = float(m.count_nonzero()) / m.numel()
        return row

    def layer_report(self) -> list[tuple[str, int, int]]:
        """(layer, kept, size) per masked tensor for the evaluation mask."""
        z = self.eval_mask
        return [(k.removesuffix(".weight"), int(m.count_nonzero()), m.numel())
                for k, m in self.layout.split(z[None]).items()]

    # ------------------------------------------------------------------ state and export

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "r": None if self.r is None else self.r.detach().cpu(),
            "weight_opt": None if self.weight_opt is None else self.weight_opt.state_dict(),
            "mask_opt": None if self.mask_opt is None else self.mask_opt.state_dict(),
            "fixed": None if self.fixed is None else {k: v.cpu() for k, v in self.fixed.items()},
            "frozen": self.frozen,
            "eval_mask": None if self.eval_mask is None else self.eval_mask.cpu(),
            "gens": {k: getattr(self, k).get_state() for k in
                     ("data_gen", "mask_gen", "eval_gen", "sel_gen")},
            "step": self.step,
        }

    def load_state_dict(self, s: dict) -> None:
        self.model.load_state_dict(s["model"])
        if self.r is not None:
            with torch.no_grad():
                self.r.copy_(s["r"].to(self.device))
        if self.weight_opt is not None:
            self.weight_opt.load_state_dict(s["weight_opt"])
        if self.mask_opt is not None:
            self.mask_opt.load_state_dict(s["mask_opt"])
        if s["fixed"] is not None:
            self.fixed = {k: v.to(self.device) for k, v in s["fixed"].items()}
        self.frozen = bool(s["frozen"])
        self.eval_mask = None if s["eval_mask"] is None else s["eval_mask"].to(self.device)
        for k, st in s["gens"].items():
            getattr(self, k).set_state(st)
        self.step = int(s["step"])

    def export(self, folder: Path) -> None:
        """``masks.pt``: {"mask.<param>": 0/1 mask, "scale.<param>": rescaling constant (0-dim),
        "weight.<param>": every parameter and buffer of the network}; ``pruned.pt``: the state
        dict of the network in ``torch.nn.utils.prune`` form (``<layer>.weight_orig`` with the
        rescaling folded in, ``<layer>.weight_mask``), loadable by :func:`load_pruned`."""
        z = self.eval_mask
        masks = {k: m[0].detach().cpu() for k, m in self.layout.split(z[None]).items()}
        scales = self.layer_scales(z)
        blob = {f"mask.{k}": v for k, v in masks.items()}
        blob.update({f"scale.{k}": torch.tensor(scales[k]) for k in masks})
        blob.update({f"weight.{k}": v.detach().cpu() for k, v in self.model.state_dict().items()})
        _save(folder / "masks.pt", blob)
        net = copy.deepcopy(self.model).cpu()
        mods = dict(net.named_modules())
        with torch.no_grad():
            for k, m in masks.items():
                mod = mods[k.removesuffix(".weight")]
                mod.weight.mul_(scales[k])
                torch_prune.custom_from_mask(mod, "weight", m)
        _save(folder / "pruned.pt", net.state_dict())


def _save(path: Path, obj) -> None:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_pruned(model_name: str, path: str | Path, masked: list[str] | None = None) -> nn.Module:
    """A network of :data:`pbscale.models.MODELS` with the pruned weights of ``pruned.pt``
    (plain PyTorch: ``prune.identity`` on the masked layers, then ``load_state_dict`` of
    ``torch.load(path, weights_only=True)``)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    net = MODELS[model_name]()
    mods = dict(net.named_modules())
    for key in state:
        if key.endswith(".weight_mask"):
            torch_prune.identity(mods[key.removesuffix(".weight_mask")], "weight")
    net.load_state_dict(state)
    return net.eval()


# ---------------------------------------------------------------------- the (thin) run loop


class _Stop:
    """SIGTERM sets a flag; the loop checkpoints after the current step and stops."""

    def __init__(self) -> None:
        self.flag = False

    def __call__(self, *_) -> None:
        self.flag = True


def prepare(cfg: PruneConfig, device: str = "cpu", download: bool = False,
            download_url: str | None = None) -> tuple[PruneConfig, torch.device, datamod.Data]:
    """Validate everything (config, device, data presence) before any training."""
    cfg = cfg.resolved().validate()
    dev = resolve_device(device)
    if cfg.synthetic:
        data = datamod.synthetic(cfg.dataset, n_train=cfg.synthetic, n_test=cfg.synthetic // 2,
                                 seed=cfg.split_seed, device=dev,
                                 val_size=min(cfg.val_size, cfg.synthetic // 2))
        return cfg, dev, data
    if not cfg.data_dir:
        raise PBInputError("--data-dir is required (e.g. ../shared/data/mnist); or add "
                           "--download to fetch the data there")
    if download:
        datamod.download(cfg.dataset, cfg.data_dir, url=download_url)
    datamod.check_data(cfg.dataset, cfg.data_dir)
    data = datamod.load(cfg.dataset, cfg.data_dir, dev, cfg.val_size, cfg.split_seed)
    return cfg, dev, data


def run(cfg: PruneConfig, out: str | Path, device: str = "cpu", *, quiet: bool = False,
        stop_after_steps: int | None = None, download: bool = False,
        download_url: str | None = None) -> dict:
    """Train (or resume) the run of ``cfg`` in ``out/<run name>``; returns the summary.

    ``stop_after_steps`` stops as SIGTERM would after that many steps of this call (tests)."""
    from tqdm import tqdm

    cfg, dev, data = prepare(cfg, device, download, download_url)
    folder = Path(out) / cfg.run_name()
    cfg_file, ckpt_file, summary_file = (folder / "config.json", folder / "checkpoint.pt",
                                         folder / "summary.json")
    if cfg_file.exists() and read_json(cfg_file) != cfg.hashed():
        raise PBInputError(f"{folder} holds a run of another configuration; choose another "
                           f"--out")
    if summary_file.exists():
        summary = read_json(summary_file)
        if not quiet:
            print(f"{folder}: already complete (test_acc {summary['test_acc']:.4f})")
        return summary
    folder.mkdir(parents=True, exist_ok=True)
    write_json(cfg_file, cfg.hashed())
    task = PruneTask(cfg, data, dev)
    rows: list[dict] = []
    start_epoch, skip = 0, 0
    state = (torch.load(ckpt_file, map_location="cpu", weights_only=True)
             if ckpt_file.exists() else None)
    if state is not None:
        task.load_state_dict(state["task"])
        rows = state["rows"]
        start_epoch = int(state["epoch"])
        skip = int(state["batch"])  # batches of start_epoch already trained
        epoch_gen_state = state["epoch_gen"]
    stop = _Stop()
    old = signal.signal(signal.SIGTERM, stop) if _main_thread() else None
    counts = task.layout
    if not quiet:
        print(f"{folder.name}: {cfg.model} on {cfg.dataset}, {cfg.mode} {cfg.method}; "
              f"{counts.d:,} masked weights of {task.num_all:,} parameters; device {dev}")
    bar = tqdm(total=task.total_steps, initial=task.step, disable=quiet, file=sys.stderr,
               dynamic_ncols=True)
    steps_here = 0
    try:
        for epoch in range(start_epoch, cfg.epochs):
            t0 = time.perf_counter()
            if skip:
                task.data_gen.set_state(epoch_gen_state)
            epoch_gen_state = task.data_gen.get_state()
            task.epoch_start(epoch)
            losses = []
            for b, (x, y) in enumerate(task.data.batches("train", cfg.batch_size, task.data_gen,
                                                         limit=task.steps_per_epoch)):
                if b < skip:
                    continue
                losses.append(task.train_step(x, y, epoch))
                bar.update(1)
                steps_here += 1
                if stop.flag or (stop_after_steps is not None and steps_here >=
                                 stop_after_steps):
                    if b + 1 < task.steps_per_epoch:
                        _save(ckpt_file, {"task": task.state_dict(), "rows": rows,
                                          "epoch": epoch, "batch": b + 1,
                                          "epoch_gen": epoch_gen_state})
                        if not quiet:
                            print(f"\nstopped; checkpoint in {ckpt_file}: rerun the same "
                                  f"command to resume")
                        return {"stopped": True}
                    stop.flag = True
            skip = 0
            row = {"epoch": epoch + 1, **task.evaluate(), "seconds": time.perf_counter() - t0}
            rows.append(row)
            write_rows(folder / "metrics.csv", rows)
            _save(ckpt_file, {"task": task.state_dict(), "rows": rows, "epoch": epoch + 1,
                              "batch": 0, "epoch_gen": task.data_gen.get_state()})
            bar.set_postfix(test_acc=f"{row['test_acc']:.4f}",
                            remaining=f"{row['remaining']:.4f}")
            if stop.flag and epoch + 1 < cfg.epochs:
                if not quiet:
                    print(f"\nstopped; checkpoint in {ckpt_file}: rerun the same command to "
                          f"resume")
                return {"stopped": True}
    finally:
        bar.close()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    task.export(folder)
    last = rows[-1]
    summary = {"run": folder.name, **cfg.hashed(), "masked": task.d, "parameters": task.num_all,
               **{k: v for k, v in last.items()},
               "mean_seconds_per_epoch": sum(r["seconds"] for r in rows) / len(rows)}
    write_json(summary_file, summary)
    if not quiet:
        print(f"test_acc {last['test_acc']:.4f}  remaining {last['remaining']:.4%} of "
              f"{task.d:,} masked weights, {last['remaining_all']:.4%} of {task.num_all:,} "
              f"parameters")
        for name, kept, size in task.layer_report():
            print(f"  {name:<24} {kept:>10,} / {size:>10,}  ({kept / size:.4%})")
    return summary


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# ---------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    d = PruneConfig()
    p = argparse.ArgumentParser(
        prog="python -m pbscale.prune",
        description="Supermask / joint pruning with CP, MC estimators, MP, GMP or dense "
                    "training; writes a run folder (config.json, metrics.csv, masks.pt, "
                    "pruned.pt) under --out and resumes an interrupted run.")
    p.add_argument("--model", default=d.model, help=f"one of {', '.join(MODELS)}")
    p.add_argument("--dataset", default="", help="mnist or cifar10 (default: the model's)")
    p.add_argument("--mode", default=d.mode, help="supermask or joint")
    p.add_argument("--method", default=d.method, help=", ".join(PRUNE_METHODS))
    p.add_argument("--param", default=d.param, help="escort or sigmoid (MC methods)")
    p.add_argument("--n", type=int, default=d.n, help="MC samples per step")
    p.add_argument("--lam", type=float, default=d.lam, help="L0 strength per weight")
    p.add_argument("--mask-opt", default=d.mask_opt, help="rmsprop or sgd")
    p.add_argument("--mask-lr", type=float, default=d.mask_lr)
    p.add_argument("--target", type=float, default=d.target,
                   help="MP/GMP: final fraction of masked weights remaining, in (0, 1]")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--batch-size", type=int, default=0,
                   help="default 128 (64 for joint VGG)")
    p.add_argument("--lr", type=float, default=d.lr, help="weight learning rate (joint)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--init", default=d.init, help=", ".join(INITS))
    p.add_argument("--mask-head", action="store_true", help="mask the classifier layer too")
    p.add_argument("--mask-shortcuts", action="store_true",
                   help="mask ResNet 1x1 projection shortcuts too")
    p.add_argument("--prune-at", type=float, default=d.prune_at,
                   help="MP: fraction of epochs trained dense before the one-shot cut")
    p.add_argument("--gmp-start", type=float, default=d.gmp_start)
    p.add_argument("--gmp-end", type=float, default=d.gmp_end)
    p.add_argument("--gmp-every", type=int, default=d.gmp_every, help="steps between GMP cuts")
    p.add_argument("--chunk", type=int, default=0, help="masks per forward (0: automatic)")
    p.add_argument("--max-batches", type=int, default=0,
                   help="training batches per epoch (0: all)")
    p.add_argument("--val-size", type=int, default=d.val_size)
    p.add_argument("--split-seed", type=int, default=d.split_seed)
    p.add_argument("--synthetic", type=int, default=0,
                   help="random images instead of data (that many training images; tests)")
    p.add_argument("--eval-masks", type=int, default=d.eval_masks,
                   help="MC evaluation: masks sampled, the best kept")
    p.add_argument("--eval-batches", type=int, default=d.eval_batches,
                   help="training batches each evaluation mask is scored on")
    p.add_argument("--data-dir", default="", help="where the data set's files are")
    p.add_argument("--download", action="store_true",
                   help="fetch the official files into --data-dir first (needs a network)")
    p.add_argument("--download-url", default=None, help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:0 or auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="runs/prune", help="parent folder of run folders")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    fields = {k: v for k, v in vars(args).items() if k in PruneConfig.__dataclass_fields__}
    cfg = PruneConfig(**fields)
    try:
        set_threads(args.threads)
        summary = run(cfg, args.out, args.device, quiet=args.quiet, download=args.download,
                      download_url=args.download_url)
    except PBInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 143 if summary.get("stopped") else 0


if __name__ == "__main__":
    sys.exit(main())
