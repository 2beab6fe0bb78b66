"""``python -m pbscale.prune``: pruning as PB optimization (`sec:app_pruning_setup`).

Supermask (`sec:app_supermask_setup`, weights fixed at their random initialization) and joint
pruning (`sec:app_joint_pruning_setup`, weights and masks trained together) of the networks of
:mod:`pbscale.models` on MNIST / CIFAR-10 (:mod:`pbscale.data`), with masks found by CP or by
MC estimators (ARMS, LOORF, DisARM; escort or sigmoid) through :class:`pbscale.methods.MaskTrainer`,
against magnitude pruning (MP, GMP: :mod:`pbscale.methods.magnitude`) and a dense network, all
on the one run loop :func:`pbscale.loop.run` (run folder by config hash, checkpoints every epoch
and on SIGTERM, exact resume, metrics CSV, progress bar).

Objective per batch and mask z (d masked weights): J(z) = CE(network with weights w * z) +
lambda * sum_i z_i (L0 strength lambda per weight). MC methods: CE of n masks evaluated at once
(:class:`pbscale.masks.MaskedModule`), the L0 term in closed form (lambda * sum theta); CP
differentiates CE(w * sigmoid(r / tau)) + lambda * sum sigmoid(r / tau), tau annealed from 1 to
1/200 over its mask-training steps, and is evaluated with 1[r > 0]. MC runs use dynamic weight
rescaling (:func:`pbscale.masks.rescaled_weight`; CP does not, as in the paper). Joint MC runs
train the dense network for the first 10% of epochs; joint mask methods freeze their mask for
the last 20% while the weights fine-tune. Evaluation mask of MC runs: 10 masks sampled, each
scored (training loss) on the same 10 training batches, the best kept for validation and test;
BatchNorm running statistics of mask methods are recomputed for the evaluation mask on those
batches before it is scored on validation and test.

Under ``torchrun`` (:func:`distribute`, :mod:`pbscale.distributed`) MC runs split their samples
over the ranks and CP, MP, GMP and dense runs their minibatches (data parallelism, gradients
averaged by one flat all-reduce per step); evaluation is split too; rank i > 0 writes its copy
of the run folder under ``OUT/.rank<i>``.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import prune as torch_prune

from pbexact.cli import (
    ArgumentParser,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    resolve_device,
    set_threads,
)
from pbexact.errors import PBInputError
from pbexact.parametrizations import PARAMETRIZATIONS
from pbscale import data as datamod
from pbscale import distributed
from pbscale import io as runio
from pbscale.batched import cross_entropy_per_mask
from pbscale.loop import full_config, resume_command, run_folder
from pbscale.loop import run as loop_run
from pbscale.loop_types import EvalContext, LoopConfig, RunHooks
from pbscale.masks import MaskedModule, plain_weight, rescaled_weight
from pbscale.methods import REGISTRY, Plan
from pbscale.models import INITS, MODELS, build_model
from pbscale.prune_config import (
    DEFAULT_PARAM,
    FREEZE_AT,
    MASK_OPTIMIZERS,
    MODES,
    PRUNE_METHODS,
    SUMMARY_KEYS,
    WEIGHT_DECAY,
    WEIGHT_GAMMA,
    WEIGHT_MILESTONES,
    WEIGHT_MOMENTUM,
    PruneConfig,
)


class PruneTask(RunHooks):
    """One pruning run as a :class:`pbscale.loop.Task`: the network, its data and evaluation.

    Masks are flat (d,) vectors laid out by :class:`pbscale.masks.MaskedModule` over
    :attr:`names` (model.masked_names()). ``batch_loss`` gives f(z (k, d)) -> CE per mask (k,)
    on one training batch (CIFAR: augmented on the device); ``evaluate`` scores the evaluation
    mask and, after the last epoch, writes ``masks.pt`` and ``pruned.pt``."""

    #: The flags named when a run diverges (:func:`pbscale.loop.run`).
    lr_flags = {"masks": "--mask-lr", "optimizer": "--mask-opt", "weights": "--lr"}

    def __init__(self, cfg: PruneConfig, data: datamod.Data, device: torch.device) -> None:
        self.cfg, self.data, self.device = cfg, data, device
        self.model = build_model(cfg.model, cfg.seed, cfg.init).to(device)
        self.names = self.model.masked_names(cfg.mask_head, cfg.mask_shortcuts)
        self.family = cfg.family
        self.trains_weights = cfg.mode == "joint" or self.family.dense_weights
        for p in self.model.parameters():
            p.requires_grad_(self.trains_weights)
        self.layout = MaskedModule(self.model, self.names, train_weights=self.trains_weights,
                                   weight_hook=rescaled_weight if self.family.rescale
                                   else plain_weight)
        self.name = f"{cfg.model}-{cfg.mode}-{cfg.method}"
        self.d = self.layout.d
        self.steps_per_epoch = math.ceil(len(data.train) / cfg.batch_size)
        if cfg.max_batches:
            self.steps_per_epoch = min(self.steps_per_epoch, cfg.max_batches)
        self.total_steps = self.steps_per_epoch * cfg.epochs
        self.num_all = sum(p.numel() for p in self.model.parameters())
        self.has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                          for m in self.model.modules())
        self.aug_gen = torch.Generator().manual_seed(cfg.seed)
        self.eval_mask: torch.Tensor | None = None
        self.export_dir: Path | None = None
        #: torchrun: this rank's :class:`pbscale.distributed.Shard` (batches and evaluation
        #: split over the ranks) and the run's :class:`pbscale.distributed.GradAverage`
        self.shard: distributed.Shard | None = None
        self.averager: distributed.GradAverage | None = None

    # ------------------------------------------------------------------ Task protocol

    def config(self) -> dict:
        return self.cfg.hashed()

    def weights(self) -> list[nn.Parameter]:
        return list(self.model.parameters()) if self.trains_weights else []

    def epoch_order(self, generator: torch.Generator) -> torch.Tensor:
        return torch.randperm(len(self.data.train), generator=generator,
                              device=generator.device)

    def batch_loss(self, order: torch.Tensor, i: int):
        B = self.cfg.batch_size
        idx = order[i * B:(i + 1) * B].to(self.data.train.y.device)
        self.model.train()
        if self.shard is None:
            x = self.data.train.x[idx]
            if self.data.augment:
                x = datamod.augment_batch(x, self.aug_gen)
            return self.layout.loss_fn(self.data.prepare(x), self.data.train.y[idx],
                                       cross_entropy_per_mask)
        # torchrun: the whole batch is augmented on every rank (the generator advances alike),
        # each rank gathers and converts only the rows it evaluates
        aug = datamod.augment_batch(self.data.train.x[idx], self.aug_gen) \
            if self.data.augment else None

        def make(rows: slice):
            x = aug[rows] if aug is not None else self.data.train.x[idx[rows]]
            return self.layout.loss_fn(self.data.prepare(x), self.data.train.y[idx[rows]],
                                       cross_entropy_per_mask)

        if self.averager is not None:
            self.averager.new_step()
        return distributed.DataParallelLoss(
            make, len(idx), self.shard,
            on_split=self.averager.split if self.averager is not None else None)

    def _mine(self, batches):
        """The batches this rank handles in a split evaluation (every K-th; all without a
        shard); the caller all-reduces the sums."""
        s = self.shard
        return (b for j, b in enumerate(batches) if s is None or j % s.world == s.rank)

    def state_dict(self) -> dict:
        return {"model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                "aug_gen": self.aug_gen.get_state(),
                "eval_mask": None if self.eval_mask is None else self.eval_mask.cpu()}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                v.copy_(state["model"][k].to(v.device))
        self.aug_gen.set_state(state["aug_gen"])
        em = state["eval_mask"]
        self.eval_mask = None if em is None else em.to(self.device)

    # ------------------------------------------------------------------ evaluation

    def selection_batches(self, generator: torch.Generator) -> list:
        """``eval_batches`` training batches (no augmentation) drawn with ``generator``."""
        B = self.cfg.batch_size
        order = torch.randperm(len(self.data.train), generator=generator,
                               device=generator.device).to(self.data.train.y.device)
        out = []
        for j in range(min(self.cfg.eval_batches, math.ceil(len(self.data.train) / B))):
            idx = order[j * B:(j + 1) * B]
            out.append((self.data.prepare(self.data.train.x[idx]), self.data.train.y[idx]))
        return out

    @torch.no_grad()
    def choose_mask(self, method, batches: list, sampled: bool | None = None) -> torch.Tensor:
        """The evaluation mask (d,): MC (or ``sampled=True``): the best of ``eval_masks`` masks
        sampled by the method, by mean training loss on ``batches`` (each mask with its batch
        statistics, as in training); the others: their deterministic mask (CP: 1[r > 0];
        MP/GMP/dense: their mask; hard-concrete: its test-time gates)."""
        if not (method.eval_sampled if sampled is None else sampled):
            return method.mode_mask().detach()
        self.model.train()
        saved = {k: b.clone() for k, b in self.model.named_buffers()}
        best, best_loss, left = None, math.inf, self.cfg.eval_masks
        while left:  # a chunk of masks at a time: memory O(chunk d)
            k = min(method.chunk, left)
            z = method.sample_masks(k)
            losses = torch.zeros(k, device=self.device)
            for x, y in self._mine(batches):
                losses += self.layout.loss_fn(x, y, cross_entropy_per_mask)(z)
            if self.shard is not None:
                losses = distributed.all_sum(losses.cpu(), self.shard).to(losses)
            i = int(torch.argmin(losses))
            if float(losses[i]) < best_loss:
                best, best_loss = z[i].clone(), float(losses[i])
            left -= k
        for k, b in self.model.named_buffers():  # scoring leaves running statistics alone
            b.copy_(saved[k])
        return best

    def frozen_mask(self, method, generator: torch.Generator) -> torch.Tensor:
        """The mask frozen for the last epochs of a joint run (the evaluation rule; the task is
        its own :class:`pbscale.loop.RunHooks`)."""
        return self.choose_mask(method, self.selection_batches(generator))

    def eval_params(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Parameters under one mask z (d,) through the run's weight hook (dynamic weight
        rescaling for MC): the tensors ``pruned.pt`` stores as weight_orig (weight_orig *
        weight_mask equals them bit for bit)."""
        weights = {k: w[0].detach() for k, w in self.layout.masked_weights(z[None]).items()}
        return {**{k: p.detach() for k, p in self.model.named_parameters()}, **weights}

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
            self.layout.forward_single(params, x)
        for m, mom in zip(bns, saved):
            m.momentum = mom

    @torch.no_grad()
    def score(self, params: dict, batches) -> tuple[float, float]:
        """(mean cross-entropy, accuracy) of the network under ``params`` in eval mode (under
        torchrun each rank scores every K-th batch and the sums are all-reduced)."""
        self.model.eval()
        loss, correct, count = 0.0, 0, 0
        for x, y in self._mine(batches):
            out = self.layout.forward_single(params, x)
            loss += float(F.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
            count += len(y)
        if self.shard is not None:
            loss, correct, count = distributed.all_sum([loss, correct, count], self.shard).tolist()
            correct, count = round(correct), round(count)
        return loss / max(count, 1), correct / max(count, 1)

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        """Metrics of the evaluation mask (the fixed mask of warm-up / frozen epochs, else
        :meth:`choose_mask`): train accuracy on the selection batches, validation and test
        loss and accuracy, weights remaining over the masked tensors, over all parameters and
        per layer. After the last epoch the exports are written."""
        batches = self.selection_batches(ctx.generator)
        z = ctx.mask if ctx.mask is not None else self.choose_mask(ctx.method, batches)
        self.eval_mask = z.detach().clone()
        extra: dict[str, float] = {}
        if ctx.method.also_sampled:  # the best sampled mask beside the deterministic one
            zs = self.choose_mask(ctx.method, batches, sampled=True)
            ps = self.eval_params(zs)
            if self.has_bn:
                self.recalibrate_bn(ps, batches)
            extra = {"sampled_val_acc": self.score(ps, self.data.batches("val", 1000))[1],
                     "sampled_test_acc": self.score(ps, self.data.batches("test", 1000))[1],
                     "sampled_remaining": int(zs.count_nonzero()) / self.d}
        params = self.eval_params(self.eval_mask)
        if self.has_bn and ctx.method.recalibrate_bn:
            self.recalibrate_bn(params, batches)
        val_loss, val_acc = self.score(params, self.data.batches("val", 1000))
        test_loss, test_acc = self.score(params, self.data.batches("test", 1000))
        kept = int(self.eval_mask.count_nonzero())
        # the loop's progress bar shows the first keys: accuracy and weights remaining
        row: dict[str, float] = {"val_acc": val_acc, "remaining": kept / self.d,
                                 "test_acc": test_acc,
                                 "train_acc": self.score(params, batches)[1],
                                 "val_loss": val_loss, "test_loss": test_loss}
        row["remaining_all"] = (self.num_all - self.d + kept) / self.num_all
        for k, m in self.layout.split(self.eval_mask[None]).items():
            row[f"remaining_{k.removesuffix('.weight')}"] = int(m.count_nonzero()) / m.numel()
        row.update(extra)
        if ctx.epoch == self.cfg.epochs and self.export_dir is not None:
            self.export(self.export_dir)
        return row

    # ------------------------------------------------------------------ export

    def export(self, folder: Path) -> None:
        """``masks.pt``: {"mask.<param>": 0/1 mask, "weight.<name>": every parameter and
        buffer as trained} plus, for MC, "scale.<param>": the dynamic-rescaling factor (0-dim);
        ``pruned.pt``: the network's state dict in ``torch.nn.utils.prune`` form
        (``<layer>.weight_orig`` = the weight the forward uses, rescaling folded in;
        ``<layer>.weight_mask``), for :func:`load_pruned`."""
        z = self.eval_mask
        values = {k: m[0].detach().cpu() for k, m in self.layout.split(z[None]).items()}
        # a gate method's mask holds gate values: 0/1 by its zeros, the values folded into
        # the weights (weight_orig) and kept as "gate.<param>"
        masks = {k: (v != 0).to(v.dtype) for k, v in values.items()}
        used = {k: v.cpu() for k, v in self.eval_params(z).items() if k in masks}
        blob = {f"mask.{k}": v for k, v in masks.items()}
        blob.update({f"gate.{k}": v for k, v in values.items() if not torch.equal(v, masks[k])})
        for k, m in masks.items():
            mean = float(m.mean())
            if self.family.rescale:
                blob[f"scale.{k}"] = torch.tensor(1.0 / mean if mean > 0 else 1.0)
        blob.update({f"weight.{k}": v.detach().cpu() for k, v in self.model.state_dict().items()})
        runio.save_checkpoint(folder / "masks.pt", blob)
        net = copy.deepcopy(self.model).cpu()
        mods = dict(net.named_modules())
        with torch.no_grad():
            for k, m in masks.items():
                mod = mods[k.removesuffix(".weight")]
                mod.weight.copy_(used[k])
                torch_prune.custom_from_mask(mod, "weight", m)
        runio.save_checkpoint(folder / "pruned.pt", net.state_dict())


def load_pruned(model_name: str, path: str | Path) -> nn.Module:
    """A network of :data:`pbscale.models.MODELS` with the pruned weights of ``pruned.pt``,
    by plain PyTorch: ``prune.identity`` on the masked layers, then ``load_state_dict`` of
    ``torch.load(path, weights_only=True)``; in eval mode."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    net = MODELS[model_name]()
    mods = dict(net.named_modules())
    for key in state:
        if key.endswith(".weight_mask"):
            torch_prune.identity(mods[key.removesuffix(".weight_mask")], "weight")
    net.load_state_dict(state)
    return net.eval()


# ---------------------------------------------------------------------- one run


def prepare(cfg: PruneConfig, device: str = "cpu", download: bool = False,
            download_url: str | None = None) -> tuple[PruneConfig, torch.device, datamod.Data]:
    """Validate everything (config, device, data presence), then load the data."""
    cfg = cfg.resolved().validate()
    dev = resolve_device(device)
    if cfg.synthetic:
        data = datamod.synthetic(cfg.dataset, n_train=cfg.synthetic, n_test=cfg.synthetic // 2,
                                 seed=cfg.split_seed, device=dev,
                                 val_size=min(cfg.val_size, cfg.synthetic // 2))
        return cfg, dev, data
    if not cfg.data_dir:
        raise PBInputError("--data-dir is required (e.g. ../shared/data/mnist); add --download "
                           "to fetch the data there")
    if download:
        datamod.download(cfg.dataset, cfg.data_dir, url=download_url)
    datamod.check_data(cfg.dataset, cfg.data_dir)
    data = datamod.load(cfg.dataset, cfg.data_dir, dev, cfg.val_size, cfg.split_seed)
    return cfg, dev, data


def build(cfg: PruneConfig, data: datamod.Data, dev: torch.device):
    """(task, method, loop config, weight optimizer) of a validated, resolved config."""
    task = PruneTask(cfg, data, dev)
    S, E = task.steps_per_epoch, cfg.epochs
    joint = task.trains_weights
    weight_opt = (torch.optim.SGD(task.weights(), lr=cfg.lr, momentum=WEIGHT_MOMENTUM,
                                  nesterov=True, weight_decay=WEIGHT_DECAY) if joint else None)
    wm = WEIGHT_MILESTONES if joint else ()
    family = cfg.family
    if not family.logits:  # one mask throughout: no mask schedule, warm-up or freezing
        loop = LoopConfig(epochs=E, seed=cfg.seed, weight_milestones=wm,
                          weight_gamma=WEIGHT_GAMMA)
    else:
        warmup = family.joint_warmup if cfg.mode == "joint" else 0.0
        freeze = FREEZE_AT if cfg.mode == "joint" else None
        milestones, gamma = family.mask_schedule
        loop = LoopConfig(epochs=E, seed=cfg.seed, mask_milestones=milestones,
                          mask_gamma=gamma, weight_milestones=wm,
                          weight_gamma=WEIGHT_GAMMA, mask_warmup=warmup, freeze_masks=freeze)
    plan = Plan(epochs=E, steps_per_epoch=S, mask_steps=max(loop.mask_epochs() * S, 1),
                layers=tuple(task.layout.sizes), run=cfg, weight_optimizer=weight_opt)
    method = family.make(cfg.method_config(), task.layout, plan)
    return task, method, loop, weight_opt


def run(cfg: PruneConfig, out: str | Path, device: str = "cpu", *, quiet: bool = False,
        download: bool = False, download_url: str | None = None, step_hook=None,
        shard=None) -> dict:
    """Train (or resume, or read back) the run of ``cfg`` under ``out``; returns its summary
    with the run folder, both weight counts and the final metrics. ``shard``
    (:mod:`pbscale.distributed`, a torchrun launch): MC samples split over the ranks, CP, MP,
    GMP and dense runs (and the fixed-mask epochs of joint MC runs) data-parallel, evaluation
    split; rank i > 0 writing its copy under ``out/.rank<i>``."""
    cfg, dev, data = prepare(cfg, device, download, download_url)
    task, method, loop, weight_opt = build(cfg, data, dev)
    hooks: list[RunHooks] = [task]  # the task chooses the mask a joint run freezes
    if shard is not None:
        hooks += distribute(task, method, weight_opt, shard)
        out = distributed.rank_out(out, shard)
        quiet = quiet or shard.rank > 0
    folder = run_folder(out, task.name, full_config(task, method, loop))
    task.export_dir = folder
    if shard is not None:  # every rank resumes from rank 0's checkpoint
        distributed.sync_resume_files(folder, shard, dev)
    if not quiet:
        print(f"{folder.name}: {cfg.model} on {cfg.dataset}, {cfg.mode} {cfg.method}; "
              f"{task.d:,} masked weights of {task.num_all:,} parameters; device {dev}",
              file=sys.stderr)
    info = {"data_dir": cfg.data_dir, "data": data.fingerprint,
            "world_size": 1 if shard is None else shard.world, "unused": cfg.unused()}
    folder = loop_run(task, method, loop, out, weight_optimizer=weight_opt, device=dev,
                      progress=not quiet, info=info, step_hook=step_hook, hooks=hooks,
                      lr_flags=task.lr_flags, method_info=cfg.family.info(cfg.method_settings()))
    summary = runio.read_summary(folder / "summary.json", SUMMARY_KEYS)
    runio.write_json(folder / "data.json", data.transform())
    summary.update({"folder": str(folder), "masked": task.d, "parameters": task.num_all})
    if not quiet:
        report(summary, task)
    return summary


def distribute(task: PruneTask, method, weight_opt: torch.optim.Optimizer | None,
               shard: distributed.Shard) -> list[RunHooks]:
    """Set a built run up for torch.distributed (see :mod:`pbscale.distributed`): batches and
    evaluation split over the ranks, MC samples split over the ranks, and the gradients of the
    weights (joint, dense) and of CP's logits averaged by one flat all-reduce per step, with
    the BatchNorm running statistics."""
    task.shard = shard
    hooks = method.distribute(shard)
    tracked = list(task.weights()) + method.synced_params()
    if tracked:
        task.averager = distributed.GradAverage(shard, tracked, list(task.model.buffers()))
        task.averager.attach([*method.optimizers, *([weight_opt] if weight_opt else [])])
    return hooks


def report(summary: dict, task: PruneTask) -> None:
    """Both weight counts of a finished run, overall and per layer."""
    d, n_all = task.d, task.num_all
    rem, rem_all = summary["final_remaining"], summary["final_remaining_all"]
    print(f"test_acc {summary['final_test_acc']:.4f}  remaining {round(rem * d):,} of {d:,} "
          f"masked weights ({rem:.4%}), {round(rem_all * n_all):,} of {n_all:,} parameters "
          f"({rem_all:.4%})")
    sizes = task.model.layer_counts(task.names)
    for k, size in sizes.items():
        layer = k.removesuffix(".weight")
        frac = summary[f"final_remaining_{layer}"]
        print(f"  {layer:<24} {round(frac * size):>10,} / {size:>10,}  ({frac:.4%})")


class _Given(argparse.Action):
    """Store the value and note the option as given (``namespace.given``), so that a left-out
    ``--param`` takes the method's own default while the parser's default stays the one that
    sweeps name their runs by."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.given = {*getattr(namespace, "given", set()), self.dest}


def build_parser() -> ArgumentParser:
    d = PruneConfig()
    p = ArgumentParser(
        prog="python -m pbscale.prune",
        description="Supermask / joint pruning with CP, MC estimators, MP, GMP or dense "
                    "training; writes a run folder (config.json, data.json, metrics.csv, "
                    "masks.pt, pruned.pt) under --out and resumes an interrupted run.")
    p.add_argument("--model", default=d.model, choices=list(MODELS))
    p.add_argument("--dataset", default="", choices=datamod.DATASETS,
                   help="default: the model's")
    p.add_argument("--mode", default=d.mode, choices=MODES)
    p.add_argument("--method", default=d.method, choices=PRUNE_METHODS)
    p.add_argument("--param", default=DEFAULT_PARAM, choices=list(PARAMETRIZATIONS),
                   action=_Given,
                   help=f"parametrization (MC methods; default {DEFAULT_PARAM}, sigmoid for "
                        f"{', '.join(n for n, f in REGISTRY.items() if f.prune_param)})")
    p.add_argument("--n", "--samples", dest="n", type=positive_int, default=d.n,
                   help="MC samples per step (under torchrun write --samples)")
    p.add_argument("--lam", type=nonneg_float, default=d.lam, help="L0 strength per weight")
    p.add_argument("--mask-opt", default=d.mask_opt, choices=MASK_OPTIMIZERS)
    p.add_argument("--mask-lr", type=positive_float, default=d.mask_lr)
    p.add_argument("--target", type=positive_float, default=d.target,
                   help="MP/GMP: final fraction of masked weights remaining; edge-popup: "
                        "fraction kept in each layer; in (0, 1]")
    p.add_argument("--epochs", type=positive_int, default=d.epochs)
    p.add_argument("--batch-size", type=nonneg_int, default=0,
                   help="0: 128 (64 for joint VGG)")
    p.add_argument("--lr", type=positive_float, default=d.lr, help="weight learning rate (joint)")
    p.add_argument("--seed", type=nonneg_int, default=d.seed)
    p.add_argument("--init", default=d.init, choices=list(INITS),
                   help="weight initialization (signed_constant: +-Kaiming std, random signs)")
    p.add_argument("--mask-head", action="store_true", help="mask the classifier layer too")
    p.add_argument("--mask-shortcuts", action="store_true",
                   help="mask ResNet 1x1 projection shortcuts too")
    p.add_argument("--prune-at", type=nonneg_float, default=d.prune_at,
                   help="MP: fraction of epochs trained dense before the one-shot cut, in [0, 1]")
    p.add_argument("--gmp-start", type=nonneg_float, default=d.gmp_start,
                   help="GMP: fraction of training when cutting starts, in [0, 1]")
    p.add_argument("--gmp-end", type=nonneg_float, default=d.gmp_end,
                   help="GMP: fraction of training when the target is reached, in [0, 1]")
    p.add_argument("--gmp-every", type=positive_int, default=d.gmp_every,
                   help="steps between GMP cuts")
    p.add_argument("--chunk", type=nonneg_int, default=0, help="masks per forward (0: automatic)")
    p.add_argument("--max-batches", type=nonneg_int, default=0,
                   help="training batches per epoch (0: all)")
    p.add_argument("--val-size", type=nonneg_int, default=d.val_size)
    p.add_argument("--split-seed", type=nonneg_int, default=d.split_seed)
    p.add_argument("--synthetic", type=nonneg_int, default=0,
                   help="random images instead of data (that many training images; tests)")
    p.add_argument("--eval-masks", type=positive_int, default=d.eval_masks,
                   help="MC evaluation: masks sampled, the best kept")
    p.add_argument("--eval-batches", type=positive_int, default=d.eval_batches,
                   help="training batches each evaluation mask is scored on")
    p.add_argument("--data-dir", default="", help="where the data set's files are")
    p.add_argument("--download", action="store_true",
                   help="fetch the official files into --data-dir first (needs a network)")
    p.add_argument("--download-url", default=None, help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:0 or auto")
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--out", default="runs/prune", help="parent folder of run folders")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(given=frozenset())
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args_or_code(argv)
    if isinstance(args, int):  # argparse's one-line error (2) or --help (0)
        return args
    fields = {k: v for k, v in vars(args).items() if k in PruneConfig.__dataclass_fields__}
    if "param" not in args.given:  # left out: the method's own default (PruneConfig.resolved)
        fields["param"] = ""
    cfg = PruneConfig(**fields)
    try:
        set_threads(args.threads)
        shard = distributed.from_env(resolve_device(args.device))  # torchrun: split samples
        run(cfg, args.out, args.device, quiet=args.quiet, download=args.download,
            download_url=args.download_url, shard=shard)
    except PBInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the run loop took over Ctrl-C (loading, epoch 0)
        print(f"interrupted; resume with: {resume_command()}", file=sys.stderr)
        return 130
    finally:
        distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
