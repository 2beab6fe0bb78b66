"""One pruning run as the run loop's :class:`pbscale.runs.contracts.Task`: the network and its
masked layout (:class:`PruneTask`) and its training batches (:class:`Batches`: the epoch order,
augmentation, the batch split over torchrun ranks, the selection batches an evaluation scores
masks on). The evaluation is :class:`pbscale.pruning.evaluation.MaskEvaluation`, the files a
finished run leaves :mod:`pbscale.pruning.outputs`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from pbscale.execution import distributed
from pbscale.forward.folded import PerMaskLoss
from pbscale.forward.masks import MaskedModule, plain_weight
from pbscale.forward.rescale import rescaled_weight
from pbscale.methods.schedules import KeptFraction
from pbscale.nets import data as datamod
from pbscale.nets.channel_layout import ChannelLayout, l0_weights, weight_layers
from pbscale.nets.channel_types import ChannelGroups
from pbscale.nets.network import NetworkSource, masked_names, network_id, short_name, source_for
from pbscale.nets.objectives import Objective
from pbscale.nets.user_data import ARRAYS
from pbscale.pruning.config import SUMMARY_KEYS, PruneConfig
from pbscale.pruning.evaluation import MaskEvaluation
from pbscale.pruning.setup import channel_groups_of, objective, patterns
from pbscale.runs.contracts import BatchedLoss, EvalContext


class Batches:
    """The training batches of one run: each epoch a permutation of the training set from the
    run's generator; step i's batched loss f(z (k, d)) -> CE per mask (k,) on batch i (CIFAR:
    augmented on the device with the run's own augmentation generator, seeded with its seed and
    checkpointed); ``eval_batches`` training batches, not augmented, for an evaluation.

    Under torchrun (``shard``) the whole batch is augmented on every rank (the generator
    advances alike) and each rank evaluates its own rows (:class:`pbscale.execution.distributed.
    DataParallelLoss`); ``averager`` (:class:`pbscale.execution.distributed.GradAverage`) is armed
    once per step."""

    def __init__(self, cfg: PruneConfig, data: datamod.Data, layout: MaskedModule,
                 shard: distributed.Shard | None = None,
                 averager: distributed.GradAverage | None = None,
                 loss: PerMaskLoss | None = None) -> None:
        self.cfg, self.data, self.layout = cfg, data, layout
        self.shard, self.averager = shard, averager
        #: the per-mask loss of a batch (:attr:`pbscale.nets.objectives.Objective.per_mask`)
        self.per_mask = loss if loss is not None else objective(cfg, data).per_mask
        self.aug_gen = torch.Generator().manual_seed(cfg.seed)
        self.steps_per_epoch = math.ceil(len(data.train) / cfg.batch_size)
        if cfg.max_batches:
            self.steps_per_epoch = min(self.steps_per_epoch, cfg.max_batches)

    def epoch_order(self, generator: torch.Generator) -> torch.Tensor:
        return torch.randperm(len(self.data.train), generator=generator,
                              device=generator.device)

    def batch(self, order: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs and labels of step i of the epoch whose order is ``order`` (one process;
        CIFAR: augmented with the run's augmentation generator), the network in training mode:
        what :meth:`loss` evaluates masks on (pruning groups, :mod:`pbscale.pruning.group`,
        evaluate them on every member's batch at once)."""
        B, data = self.cfg.batch_size, self.data
        idx = order[i * B:(i + 1) * B].to(data.train.y.device)
        self.layout.module.train()
        x = data.train.x[idx]
        if data.augment:
            x = datamod.augment_batch(x, self.aug_gen)
        return data.prepare(x), data.train.y[idx]

    def loss(self, order: torch.Tensor, i: int) -> BatchedLoss:
        """The batched loss of step i of the epoch whose order is ``order``."""
        if self.shard is None:
            return self.layout.loss_fn(*self.batch(order, i), self.per_mask)
        B, data, layout = self.cfg.batch_size, self.data, self.layout
        idx = order[i * B:(i + 1) * B].to(data.train.y.device)
        layout.module.train()
        # torchrun: the whole batch is augmented on every rank (the generator advances alike),
        # each rank gathers and converts only the rows it evaluates
        aug = datamod.augment_batch(data.train.x[idx], self.aug_gen) if data.augment else None

        def make(rows: slice) -> BatchedLoss:
            x = aug[rows] if aug is not None else data.train.x[idx[rows]]
            return layout.loss_fn(data.prepare(x), data.train.y[idx[rows]], self.per_mask)

        if self.averager is not None:
            self.averager.new_step()
        return distributed.DataParallelLoss(
            make, len(idx), self.shard,
            on_split=self.averager.split if self.averager is not None else None)

    def selection(self, generator: torch.Generator) -> list:
        """``eval_batches`` training batches (no augmentation) drawn with ``generator``."""
        B, data = self.cfg.batch_size, self.data
        order = torch.randperm(len(data.train), generator=generator,
                               device=generator.device).to(data.train.y.device)
        out = []
        for j in range(min(self.cfg.eval_batches, math.ceil(len(data.train) / B))):
            idx = order[j * B:(j + 1) * B]
            out.append((data.prepare(data.train.x[idx]), data.train.y[idx]))
        return out


class PruneTask:
    """One pruning run as a :class:`pbscale.runs.contracts.Task`: the network of ``cfg`` (built by
    its :class:`pbscale.nets.network.NetworkSource`, ``source``, from its seed and initialization),
    the masked layout over :attr:`names` (:func:`pbscale.nets.network.masked_names`; masks are flat
    (d,) vectors, through dynamic weight rescaling for methods that rescale), its loss
    (:attr:`objective`), its :class:`Batches` and its :class:`MaskEvaluation`. Its state is
    the network's, the augmentation generator's and the evaluation mask's.

    ``shard`` (torchrun): batches and evaluation split over the ranks; :meth:`share_gradients`
    then averages the gradients of the weights (and of a method's logits) over the ranks."""

    #: The flags named when a run diverges (:func:`pbscale.runs.loop.run`).
    lr_flags = {"masks": "--mask-lr", "optimizer": "--mask-opt", "weights": "--lr"}

    def __init__(self, cfg: PruneConfig, data: datamod.Data, device: torch.device,
                 shard: distributed.Shard | None = None,
                 source: NetworkSource | None = None) -> None:
        self.cfg, self.data, self.device, self.shard = cfg, data, device, shard
        self.source = source or source_for(cfg.model)
        self.model = self.source.build(cfg.seed, cfg.init).to(device)
        #: the identity of the user's network as built (None for a built-in model)
        self.network_id = (None if self.source.builtin
                           else network_id(self.model, self.source.spec, cfg.init))
        self.objective: Objective = objective(cfg, data)
        self.trains_weights = cfg.trains_weights
        #: the channel variables (``--granularity channel``), else None
        self.groups: ChannelGroups | None = None
        self.layout: MaskedModule
        if cfg.granularity == "channel":
            self.groups = channel_groups_of(self.model, cfg, data, device)
            self.names = list(weight_layers(self.groups))
        else:
            self.names = masked_names(self.model, cfg.mask_head, cfg.mask_shortcuts,
                                      patterns(cfg))
        for p in self.model.parameters():
            p.requires_grad_(self.trains_weights)
        if self.groups is not None:  # plain w * z: rescaling is defined per weight
            self.layout = ChannelLayout(self.model, self.groups,
                                        train_weights=self.trains_weights)
        else:
            self.layout = MaskedModule(self.model, self.names,
                                       train_weights=self.trains_weights,
                                       weight_hook=rescaled_weight if self.rescales
                                       else plain_weight)
        self.name = f"{short_name(cfg.model)}-{cfg.mode}-{cfg.method}"
        self.d = self.layout.d
        self.num_all = sum(p.numel() for p in self.model.parameters())
        #: the run's :class:`pbscale.execution.distributed.GradAverage` under torchrun (its
        #: parameters come with :meth:`share_gradients`)
        self.averager = (distributed.GradAverage(shard, [], list(self.model.buffers()))
                         if shard is not None else None)
        self.batches = Batches(cfg, data, self.layout, shard, self.averager,
                               self.objective.per_mask)
        self.steps_per_epoch = self.batches.steps_per_epoch
        self.total_steps = self.steps_per_epoch * cfg.epochs
        self.evaluation = MaskEvaluation(cfg, data, self.layout, self.batches, shard,
                                         self.objective, self.kept_fraction())

    def share_gradients(self, params: list[torch.Tensor],
                        optimizers: list[torch.optim.Optimizer]) -> None:
        """Under torchrun: the gradients of the trained weights and of ``params`` averaged over
        the ranks by one flat all-reduce per step, before the first of ``optimizers`` steps
        (nothing without a shard, or with nothing to average)."""
        if self.averager is not None:
            self.averager.track([*self.weights(), *params], optimizers)

    @property
    def rescales(self) -> bool:
        """Whether the masked weights are rescaled dynamically (the family's ``rescale``, for
        weight granularity only)."""
        return self.cfg.family.caps.pruning.rescale and self.cfg.granularity == "weight"

    def l0_weights(self) -> torch.Tensor | None:
        """The L0 term's per-variable weights (d,): channel granularity's costs ``--cost``
        normalised to mean 1 (:func:`pbscale.nets.channel_layout.l0_weights`); None for weight
        granularity (every weight 1)."""
        return None if self.groups is None else l0_weights(self.groups, self.cfg.cost)

    def kept_fraction(self) -> KeptFraction | None:
        """What a method's ``--target`` is a fraction of (:data:`pbscale.methods.schedules.
        KeptFraction`): channel granularity's ``--cost`` kept of the prunable part, bool keep
        masks (n, d) -> fractions (n,) (:meth:`ChannelLayout.kept_fractions`, the
        evaluation's ``remaining``); None for weight granularity (a count of weights)."""
        if self.groups is None:
            return None
        layout, kind = self.layout, self.cfg.cost
        return lambda keeps: layout.kept_fractions(keeps, kind)

    def coupled_index(self) -> torch.Tensor | None:
        """The coupled groups a cut to ``--target`` never empties (:meth:`ChannelLayout.
        coupled_index`, int64 (m, L)); None for weight granularity."""
        return None if self.groups is None else self.layout.coupled_index()

    def bytes_per_sample(self) -> int | None:
        """The memory of one sampled mask in a chunk for the method's memory check: channel
        granularity 16 bytes per element of the masked tensors (the masked weights of a
        sample are materialized, not its d channel entries); None for weight granularity
        (the method's 16 d)."""
        if self.groups is None:
            return None
        params = dict(self.model.named_parameters())
        return 16 * sum(params[k].numel() for k in self.layout.names)

    # ------------------------------------------------------------------ Task protocol

    @property
    def summary_keys(self) -> tuple[str, ...]:
        """The entries of a finished run's summary.json that pruning reads:
        :data:`~pbscale.pruning.config.SUMMARY_KEYS`, with the test loss in place of the
        accuracy where the run's loss has none (float targets)."""
        if self.objective.accuracy:
            return SUMMARY_KEYS
        return tuple(k.replace("test_acc", "test_loss") for k in SUMMARY_KEYS)

    def config(self) -> dict:
        """The run's hashed task: the settings it reads (:meth:`PruneConfig.hashed`), and for
        the user's own network or data their identity (:func:`pbscale.nets.network.network_id`,
        the data's fingerprint), so that a changed network or other data is another run
        folder."""
        return self.identified(self.cfg.hashed())

    def legacy_config(self) -> dict:
        """The hashed task of config.json format 1 (:meth:`PruneConfig.legacy_hashed`, with
        the same identities): what a run folder made before format 2 is named by."""
        return self.identified(self.cfg.legacy_hashed())

    def identified(self, out: dict) -> dict:
        """``out`` with the identities of the user's own network and data."""
        if self.network_id is not None:
            out["network_id"] = self.network_id
        if self.cfg.dataset == ARRAYS:
            out["data_id"] = self.data.fingerprint
        return out

    def weights(self) -> list[nn.Parameter]:
        return list(self.model.parameters()) if self.trains_weights else []

    def epoch_order(self, generator: torch.Generator) -> torch.Tensor:
        return self.batches.epoch_order(generator)

    def batch_loss(self, order: torch.Tensor, i: int) -> BatchedLoss:
        return self.batches.loss(order, i)

    def batch(self, order: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step i's inputs and labels (:meth:`Batches.batch`): what :meth:`batch_loss` builds
        its loss on."""
        return self.batches.batch(order, i)

    def evaluate(self, ctx: EvalContext) -> dict[str, float]:
        return self.evaluation.evaluate(ctx)

    def state_dict(self) -> dict:
        return {"model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                "aug_gen": self.batches.aug_gen.get_state(),
                "eval_mask": self.evaluation.state()}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                v.copy_(state["model"][k].to(v.device))
        self.batches.aug_gen.set_state(state["aug_gen"])
        self.evaluation.load_state(state["eval_mask"])
