"""Methods without mask logits: one binary mask over the masked weights (or, with
``--granularity channel``, over the channel variables), set at the start and cut by magnitude
on a schedule while the weights train (:class:`MaskFamily`, whose hooks take the run's explicit
:class:`CutSchedule`; :class:`MagnitudeMethod`, the run loop's method of every such family). MP,
GMP and dense training (:mod:`pbscale.methods.magnitude`) are such families; the cuts
themselves are in :mod:`pbscale.methods.schedules`.

The magnitude of a channel variable i (:meth:`MagnitudeMethod.channel_scores`) is that of the
parameters removing it removes, per unit of its cost: s_i = ||W_i||_2^2 / c_i, with
||W_i||_2^2 the sum of squares over every parameter slice of its coupled group (its Conv/Linear
weight rows and bias, BatchNorm weight and bias, the consumers' input slices:
:func:`pbscale.nets.channel_layout.squared_norms`) and c_i its ``--cost`` (the parameters or
MACs per example removing it alone saves) normalised to mean 1, the L0 term's weight
(:func:`pbscale.nets.channel_layout.l0_weights`). ``--target`` is then a budget of that cost:
a cut keeps the variables of largest s_i, in that order, as long as the exact cost they keep
(:func:`pbscale.nets.channel_layout.remaining_cost`, the evaluation's ``remaining``) stays
within the fraction of the prunable part's cost (:func:`pbscale.methods.schedules.
keep_within`), the greedy rule of a knapsack: the most magnitude per unit of parameters
(``--cost params``) or of MACs (``--cost macs``). A cut never empties a coupled group (the
floor of :func:`pbscale.methods.schedules.keep_within`): where the fill would switch off every
channel of one (a layer of a chain, or a residual stream with every block reading it), the
group's best-scored variable is kept first whatever its cost and the fill redone; only then can
the kept cost exceed ``--target``, by those variables. With ``--cost params``, s_i is up to the
mean cost the mean square of the parameters variable i removes, so channels of wide and narrow
layers compare as single weights do in weight pruning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pbscale.runs.contracts import BatchedLoss

from . import schedules
from .registry import Family, MethodConfig, Plan, Settings
from .schedules import KeptFraction, check_fraction


@dataclass(frozen=True)
class CutSchedule:
    """Everything a method without logits reads of its run, explicit: the d variables (masked
    weights, or channel variables), the kept fraction it cuts to (``target``: of the weights,
    or of the channels' cost), MP's one cut at step ``cut``, GMP's cuts every ``every`` steps
    from ``start`` to ``end`` (step indices, each at most the last step), the family's own
    settings (``settings``) and, for channel variables, their costs normalised to mean 1
    (``costs``, float64 (d,), the plan's ``l0_weights``; None for weights) and what ``target``
    is a fraction of (``kept_fraction``, the plan's: the ``--cost`` kept; None for weights)
    and the coupled groups a cut never empties (``coupled``, the plan's; None for weights)."""

    d: int
    target: float
    cut: int
    start: int
    end: int
    every: int
    settings: Settings
    costs: torch.Tensor | None = None
    kept_fraction: KeptFraction | None = None
    coupled: torch.Tensor | None = None


class MaskFamily(Family):
    """A method without mask logits: one binary mask over the masked weights
    (:class:`MagnitudeMethod`), which the family sets at the start (:meth:`initial_mask`, all
    ones by default) and cuts by magnitude on its schedule (:meth:`fraction_at`, no cut by
    default) while the weights train, each hook given the run's :class:`CutSchedule`. The
    schedule comes from pruning's settings: MP cuts at round(prune_at E) epochs, GMP from
    gmp_start to gmp_end of the steps every gmp_every steps."""

    def make(self, config: MethodConfig, layout: Any, plan: Plan) -> MagnitudeMethod:
        total = plan.epochs * plan.steps_per_epoch
        end = min(round(plan.setting("gmp_end", 1.0) * total), total - 1)
        cut = min(round(plan.setting("prune_at", 0.0) * plan.epochs) * plan.steps_per_epoch,
                  total - 1)
        cuts = CutSchedule(d=layout.d, target=plan.setting("target", 1.0), cut=cut,
                           start=min(round(plan.setting("gmp_start", 0.0) * total), end),
                           end=end, every=plan.setting("gmp_every", 1),
                           settings=config.settings, costs=plan.l0_weights,
                           kept_fraction=plan.kept_fraction, coupled=plan.coupled)
        return MagnitudeMethod(self, layout, cuts, seed=config.seed,
                               weight_optimizer=plan.weight_optimizer)

    def check_prune(self, config: Any) -> None:
        if "target" in self.caps.uses:
            check_fraction(config.target)

    def initial_mask(self, cuts: CutSchedule, generator: torch.Generator) -> torch.Tensor:
        """The mask (d,) the run starts with (``generator``: a CPU generator seeded with the
        run's seed, for a random mask; the run's own stream is not touched)."""
        return torch.ones(cuts.d, dtype=torch.float64)

    def fraction_at(self, step: int, cuts: CutSchedule) -> float | None:
        """The fraction kept after a cut at ``step`` (of the d weights; of the cost, for
        channel variables), or None (no cut)."""
        return None


class MagnitudeMethod:
    """MP, GMP or dense training as a :class:`pbscale.runs.contracts.Method`: one binary mask (d,)
    over the masked weights of ``layout`` (all ones for dense), or over its channel variables
    (a :class:`pbscale.nets.channel_layout.ChannelLayout`, ``per_weight`` False), no logits.
    ``apply`` (called by the loop after the backward pass and before the weight step) makes the
    cuts: at step ``cut`` for MP, every ``every`` steps from ``start`` to ``end`` on
    :func:`gmp_fraction` for GMP, each keeping the largest |w| (weights) or
    :meth:`channel_scores` (channels). A cut zeroes the pruned weights (a channel's: every
    tensor slice its mask multiplies), their gradients and their momentum buffers in
    ``weight_optimizer``, so with the mask in the forward pass (zero gradient) and weight decay
    on a zero weight they stay exactly zero. ``generator`` (seeded with ``seed``) is the run's
    stream (batch order, evaluation); the mask draws nothing."""

    #: evaluated with its mask, which training used (no BatchNorm recalibration)
    eval_sampled = also_sampled = recalibrate_bn = False

    def __init__(self, family: MaskFamily, layout: Any, cuts: CutSchedule, seed: int = 0,
                 weight_optimizer: torch.optim.Optimizer | None = None) -> None:
        self.family, self.kind, self.layout, self.cuts = family, family.name, layout, cuts
        self.d = layout.d
        self.mask = family.initial_mask(cuts, torch.Generator().manual_seed(seed)).to(
            device=layout.device, dtype=layout.dtype)
        self.generator = torch.Generator(device=layout.device).manual_seed(seed)
        self.weight_optimizer = weight_optimizer
        self.step_count = 0

    def info(self) -> dict:
        return {}

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return []

    def zero_grad(self) -> None:
        pass

    def surrogate(self, f: BatchedLoss, weights: bool = False) -> tuple[torch.Tensor, float]:
        J = f(self.mask[None])[0]
        return J, float(J.detach())

    def fraction_at(self, step: int) -> float | None:
        """The fraction kept after a cut at ``step`` (of the d weights; of the cost, for
        channel variables), or None (no cut)."""
        return self.family.fraction_at(step, self.cuts)

    @torch.no_grad()
    def channel_scores(self) -> torch.Tensor:
        """The score s_i = ||W_i||_2^2 / c_i of every channel variable, float64 (d,) on the
        layout's device (the module's docstring): the squared L2 norm of the parameters
        removing variable i removes (:meth:`pbscale.nets.channel_layout.ChannelLayout.
        squared_norms`) over its ``--cost`` normalised to mean 1 (``cuts.costs``; all 1 where
        the schedule has none; every variable costs something: its root layer's weight
        rows)."""
        norms = self.layout.squared_norms().to(self.mask.device)
        costs = self.cuts.costs
        if costs is None:
            return norms
        return norms / costs.to(norms)

    @torch.no_grad()
    def apply(self) -> None:
        frac = self.fraction_at(self.step_count)
        self.step_count += 1
        if frac is None:
            return
        params = dict(self.layout.module.named_parameters())
        if self.layout.per_weight:
            old = self.layout.split(self.mask[None])
            new = schedules.global_magnitude_masks({k: params[k] for k in self.layout.names},
                                                   frac, {k: m[0] for k, m in old.items()})
            self.mask = torch.cat([new[k].reshape(-1) for k in self.layout.names])
        else:  # channel variables: the top of their scores within the cost budget
            keep = schedules.keep_within(self.channel_scores(), frac, self.cuts.kept_fraction,
                                         self.mask != 0, self.cuts.coupled)
            self.mask = keep.to(self.mask.dtype)
            new = {k: m[0] for k, m in self.layout.split(self.mask[None]).items()}
        for k, m in new.items():
            p = params[k]
            p.mul_(m)
            if p.grad is not None:
                p.grad.mul_(m)
            if self.weight_optimizer is not None:
                buf = self.weight_optimizer.state.get(p, {}).get("momentum_buffer")
                if buf is not None:
                    buf.mul_(m)

    def sample_masks(self, k: int) -> torch.Tensor:
        return self.mask.expand(k, self.d)

    def mode_mask(self) -> torch.Tensor:
        return self.mask

    @property
    def dtype(self) -> torch.dtype:
        return self.mask.dtype

    def check_finite(self, where: str, flags: dict[str, str]) -> None:
        """No logits to check (the weights' optimizer is the task's)."""

    def config_dict(self) -> dict:
        """The hashed method section: the schedule, and the family's own settings that differ
        from their defaults under its name (none for MP, GMP and dense)."""
        c = self.cuts
        out = {"method": self.kind, "target": c.target, "cut": c.cut, "start": c.start,
               "end": c.end, "every": c.every}
        own = c.settings.changed()
        if own:
            out[self.kind] = own
        return out

    def state_dict(self) -> dict:
        return {"mask": self.mask.cpu(), "step_count": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        self.mask = state["mask"].to(self.mask.device)
        self.step_count = int(state["step_count"])
