"""Methods without mask logits: one binary mask over the masked weights, set at the start and
cut by magnitude on a schedule while the weights train (:class:`MaskFamily`, whose hooks take
the run's explicit :class:`CutSchedule`; :class:`MagnitudeMethod`, the run loop's method of
every such family). MP, GMP and dense training (:mod:`pbscale.methods.magnitude`) are such
families; the cuts themselves are in :mod:`pbscale.methods.schedules`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pbscale.runs.contracts import BatchedLoss

from . import schedules
from .registry import Family, MethodConfig, Plan, Settings
from .schedules import check_fraction


@dataclass(frozen=True)
class CutSchedule:
    """Everything a method without logits reads of its run, explicit: the d masked weights, the
    kept fraction it cuts to (``target``), MP's one cut at step ``cut``, GMP's cuts every
    ``every`` steps from ``start`` to ``end`` (step indices, each at most the last step), and
    the family's own settings (``settings``)."""

    d: int
    target: float
    cut: int
    start: int
    end: int
    every: int
    settings: Settings


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
                           settings=config.settings)
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
        """The fraction of weights kept after a cut at ``step``, or None (no cut)."""
        return None


class MagnitudeMethod:
    """MP, GMP or dense training as a :class:`pbscale.runs.contracts.Method`: one binary mask (d,)
    over the masked weights of ``layout`` (all ones for dense), no logits. ``apply`` (called by
    the loop after the backward pass and before the weight step) makes the cuts: at step ``cut``
    for MP, every ``every`` steps from ``start`` to ``end`` on :func:`gmp_fraction` for GMP. A
    cut zeroes the pruned weights, their gradients and their momentum buffers in
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
        """The fraction of weights kept after a cut at ``step``, or None (no cut)."""
        return self.family.fraction_at(step, self.cuts)

    @torch.no_grad()
    def apply(self) -> None:
        frac = self.fraction_at(self.step_count)
        self.step_count += 1
        if frac is None:
            return
        params = dict(self.layout.module.named_parameters())
        old = self.layout.split(self.mask[None])
        new = schedules.global_magnitude_masks({k: params[k] for k in self.layout.names}, frac,
                                               {k: m[0] for k, m in old.items()})
        self.mask = torch.cat([new[k].reshape(-1) for k in self.layout.names])
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
