"""The evaluation of a pruning run (`sec:app_pruning_setup`): which mask it is scored with, and
its metrics. A method evaluated by sampling (MC) is scored with the best of ``eval_masks``
masks it samples, by mean training loss on ``eval_batches`` training batches; the others with
their deterministic mask (CP: 1[r > 0]; MP/GMP/dense: their mask; hard-concrete: its test-time
gates). BatchNorm running statistics are recomputed for the evaluation mask on those batches
(methods whose training used another mask) before it is scored on validation and test. The same
rule chooses the mask a joint run freezes for its last epochs (:meth:`MaskEvaluation.
frozen_mask`, a :class:`pbscale.runs.contracts.RunHooks`). Under torchrun the batches are dealt to
the ranks and the sums all-reduced."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from pbscale.execution import distributed
from pbscale.forward.masks import MaskedModule
from pbscale.methods import schedules
from pbscale.nets import data as datamod
from pbscale.nets.channel_layout import channel_row
from pbscale.nets.objectives import CROSS_ENTROPY, Objective
from pbscale.pruning.config import PruneConfig
from pbscale.runs.contracts import EvalContext, MaskMethod, RunHooks


class MaskEvaluation(RunHooks):
    """Metrics of a run's evaluation mask (:meth:`evaluate`), the mask itself (:attr:`mask`,
    kept with the task's state) and the mask a joint run freezes (:meth:`frozen_mask`).
    ``batches`` has ``selection(generator)``, the training batches masks are scored on;
    ``kept_fraction`` is what ``--budget`` is a fraction of (the task's: channels' ``--cost``;
    None: a count of weights)."""

    def __init__(self, cfg: PruneConfig, data: datamod.Data, layout: MaskedModule,
                 batches: object, shard: distributed.Shard | None = None,
                 objective: Objective = CROSS_ENTROPY,
                 kept_fraction: schedules.KeptFraction | None = None) -> None:
        self.cfg, self.data, self.layout, self.batches = cfg, data, layout, batches
        self.shard, self.objective, self.kept_fraction = shard, objective, kept_fraction
        self.model = layout.module
        self.d = layout.d
        self.num_all = sum(p.numel() for p in self.model.parameters())
        self.has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                          for m in self.model.modules())
        self.mask: torch.Tensor | None = None

    def state(self) -> torch.Tensor | None:
        return None if self.mask is None else self.mask.cpu()

    def load_state(self, mask: torch.Tensor | None) -> None:
        self.mask = None if mask is None else mask.to(self.layout.device)

    def _mine(self, batches: Iterable) -> Iterable:
        """The batches this rank handles in a split evaluation (every K-th; all without a
        shard); the caller all-reduces the sums."""
        s = self.shard
        return (b for j, b in enumerate(batches) if s is None or j % s.world == s.rank)

    @torch.no_grad()
    def choose_mask(self, method: MaskMethod, batches: list,
                    sampled: bool | None = None) -> torch.Tensor:
        """The evaluation mask (d,): a method evaluated by sampling (or ``sampled=True``): the
        best of ``eval_masks`` masks it samples, by mean training loss on ``batches`` (each
        mask with its batch statistics, as in training); the others: their deterministic
        mask."""
        if not (method.eval_sampled if sampled is None else sampled):
            return method.mode_mask().detach()
        self.model.train()
        saved = {k: b.clone() for k, b in self.model.named_buffers()}
        best, best_loss, left = None, math.inf, self.cfg.eval_masks
        while left:  # a chunk of masks at a time: memory O(chunk d)
            k = min(method.chunk, left)
            z = method.sample_masks(k)
            losses = torch.zeros(k, device=z.device)
            for x, y in self._mine(batches):
                losses += self.layout.loss_fn(x, y, self.objective.per_mask)(z)
            if self.shard is not None:
                losses = distributed.all_sum(losses.cpu(), self.shard).to(losses)
            # a mask whose loss is NaN (diverged weights) is never the best; with none finite
            # the first is kept and the loop reports the divergence
            losses = torch.nan_to_num(losses, nan=math.inf, posinf=math.inf)
            i = int(torch.argmin(losses))
            if best is None or float(losses[i]) < best_loss:
                best, best_loss = z[i].clone(), float(losses[i])
            left -= k
        for k, b in self.model.named_buffers():  # scoring leaves running statistics alone
            b.copy_(saved[k])
        return best

    def frozen_mask(self, method: MaskMethod, generator: torch.Generator) -> torch.Tensor:
        """The mask frozen for the last epochs of a joint run: the evaluation rule's, within
        ``--budget`` where one is set (:func:`pbscale.methods.schedules.keep_budget` by the
        method's ``keep_scores()``: channels by the task's ``kept_fraction``, weights by
        count)."""
        z = self.choose_mask(method, self.batches.selection(generator))
        budget = self.cfg.budget
        if not budget:
            return z
        keep = schedules.keep_budget(z, method.keep_scores(), budget, self.kept_fraction)
        return keep.to(z)

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
    def score(self, params: dict, batches: Iterable) -> tuple[float, float]:
        """(mean loss, accuracy) of the network under ``params`` in eval mode (the run's
        :class:`pbscale.nets.objectives.Objective`; accuracy 0 where it has none; under torchrun
        each rank scores every K-th batch and the sums are all-reduced)."""
        self.model.eval()
        loss, correct, count = 0.0, 0, 0
        for x, y in self._mine(batches):
            out = self.layout.forward_single(params, x)
            batch_loss, batch_correct = self.objective.score(out, y)
            loss += batch_loss
            correct += batch_correct
            count += len(y)
        if self.shard is not None:
            loss, correct, count = distributed.all_sum([loss, correct, count], self.shard).tolist()
            correct, count = round(correct), round(count)
        return loss / max(count, 1), correct / max(count, 1)

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        """Metrics of the evaluation mask (the fixed mask of warm-up / frozen epochs, else
        :meth:`choose_mask`): train accuracy on the selection batches, validation and test
        loss and accuracy, weights remaining over the masked tensors, over all parameters and
        per layer; with a method that also reports sampled masks, the best sampled mask's
        accuracies and weights remaining (``sampled_*``)."""
        method = ctx.method
        batches = self.batches.selection(ctx.generator)
        z = ctx.mask if ctx.mask is not None else self.choose_mask(method, batches)
        self.mask = z.detach().clone()
        extra: dict[str, float] = {}
        acc = self.objective.accuracy
        # a metric of each evaluated mask: its accuracy, or its loss where it has none
        metric, name = (1, "acc") if acc else (0, "loss")
        if method.also_sampled:  # the best sampled mask beside the deterministic one
            zs = self.choose_mask(method, batches, sampled=True)
            ps = self.eval_params(zs)
            if self.has_bn:
                self.recalibrate_bn(ps, batches)
            extra = {f"sampled_val_{name}":
                     self.score(ps, self.data.batches("val", 1000))[metric],
                     f"sampled_test_{name}":
                     self.score(ps, self.data.batches("test", 1000))[metric],
                     "sampled_remaining": self.counts(zs)["remaining"]}
        params = self.eval_params(self.mask)
        if self.has_bn and method.recalibrate_bn:
            self.recalibrate_bn(params, batches)
        val_loss, val_acc = self.score(params, self.data.batches("val", 1000))
        test_loss, test_acc = self.score(params, self.data.batches("test", 1000))
        counts = self.counts(self.mask)
        # the loop's progress bar shows the first keys: accuracy (else loss) and weights
        # remaining
        row: dict[str, float]
        if acc:
            row = {"val_acc": val_acc, "remaining": counts.pop("remaining"),
                   "test_acc": test_acc, "train_acc": self.score(params, batches)[1],
                   "val_loss": val_loss, "test_loss": test_loss}
        else:
            row = {"val_loss": val_loss, "remaining": counts.pop("remaining"),
                   "test_loss": test_loss, "train_eval_loss": self.score(params, batches)[0]}
        row.update(counts)
        row.update(extra)
        return row

    def counts(self, z: torch.Tensor) -> dict[str, float]:
        """What mask z (d,) keeps: ``remaining`` (weight granularity: the masked weights kept;
        channel granularity: the ``--cost`` kept of the prunable part,
        :func:`pbscale.nets.channel_layout.channel_row`, with ``remaining_channels`` and
        ``remaining_macs``), ``remaining_all`` (parameters kept) and ``remaining_<layer>``
        per masked weight tensor."""
        groups = getattr(self.layout, "groups", None)
        if groups is not None:
            return channel_row(groups, z, self.cfg.cost, self.num_all)
        kept = int(z.count_nonzero())
        row = {"remaining": kept / self.d,
               "remaining_all": (self.num_all - self.d + kept) / self.num_all}
        for k, m in self.layout.split(z[None]).items():
            row[f"remaining_{k.removesuffix('.weight')}"] = int(m.count_nonzero()) / m.numel()
        return row
