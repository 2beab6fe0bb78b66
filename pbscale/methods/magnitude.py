"""Magnitude pruning baselines of the joint-pruning experiments (`sec:app_joint_pruning_setup`,
`tab:app_pruning_broad`): MP (Han et al., global one-shot) and GMP (Zhu and Gupta's cubic
schedule, global), and dense training, as methods of the registry (:class:`MagnitudeMethod`
drives all three in :mod:`pbscale.prune`).

Masks are dicts {parameter name: 0/1 tensor of the weight's shape}; "remaining" is counted over
the masked tensors only. :func:`global_magnitude_masks` keeps exactly ``round(fraction * d)``
weights (ties broken by position), never bringing back a weight already pruned; the caller keeps
pruned weights at zero with :func:`apply_masks_` after every optimizer step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from pbexact.errors import PBInputError

from ..distributed import RankSync, Shard
from ..loop_types import BatchedLoss, RunHooks
from .registry import Family, MethodConfig, Plan, register


def check_fraction(fraction: float) -> float:
    """A target fraction of remaining weights must lie in (0, 1]."""
    if not (isinstance(fraction, (int, float)) and math.isfinite(fraction)
            and 0 < fraction <= 1):
        raise PBInputError(f"target fraction of remaining weights must be in (0, 1], got "
                           f"{fraction}; e.g. --target 0.1 keeps 10%")
    return float(fraction)


def keep_count(fraction: float, d: int) -> int:
    """Number of weights kept at ``fraction`` of d: round(fraction * d), at least 1."""
    return max(1, min(d, int(round(check_fraction(fraction) * d))))


def global_magnitude_masks(weights: Mapping[str, torch.Tensor], fraction: float,
                           masks: Mapping[str, torch.Tensor] | None = None,
                           ) -> dict[str, torch.Tensor]:
    """Global magnitude masks keeping the ``keep_count(fraction, d)`` largest |w| over all
    tensors (d = total size); weights pruned in ``masks`` rank below every unpruned weight, so
    masks only shrink as long as the fraction does. Ties are broken towards the lower flat
    position (a stable sort), so the count is exact."""
    names = list(weights)
    flat = torch.cat([weights[k].detach().reshape(-1).abs().float() for k in names])
    if masks is not None:
        alive = torch.cat([masks[k].reshape(-1).bool() for k in names])
        flat = torch.where(alive, flat, torch.full_like(flat, -1.0))
    k = keep_count(fraction, flat.numel())
    order = torch.sort(flat, descending=True, stable=True).indices
    keep = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    keep[order[:k]] = True
    out, pos = {}, 0
    for name in names:
        n = weights[name].numel()
        out[name] = keep[pos:pos + n].view_as(weights[name]).to(weights[name].dtype)
        pos += n
    return out


def gmp_fraction(step: int, start: int, end: int, final: float, initial: float = 1.0) -> float:
    """Fraction of weights remaining at ``step`` under Zhu and Gupta's cubic schedule: sparsity
    s_t = s_f + (s_i - s_f) (1 - (t - t0) / (t_end - t0))^3 between ``start`` and ``end``
    (s = 1 - fraction), ``initial`` before ``start`` and ``final`` from ``end`` on."""
    check_fraction(final)
    if step <= start:
        return initial
    if step >= end or end <= start:
        return final
    s_i, s_f = 1.0 - initial, 1.0 - final
    s = s_f + (s_i - s_f) * (1.0 - (step - start) / (end - start)) ** 3
    return 1.0 - s


@torch.no_grad()
def apply_masks_(params: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> None:
    """Zero the pruned weights in place (after every optimizer step, so they stay zero)."""
    for k, m in masks.items():
        params[k].mul_(m)


def remaining(masks: Mapping[str, torch.Tensor]) -> tuple[int, int]:
    """(weights kept, weights masked) over all masked tensors."""
    kept = sum(int(m.count_nonzero()) for m in masks.values())
    return kept, sum(m.numel() for m in masks.values())


class MaskFamily(Family):
    """A method without mask logits: one binary mask over the masked weights
    (:class:`MagnitudeMethod`), which the family sets at the start (:meth:`initial_mask`, all
    ones by default) and cuts by magnitude on its schedule (:meth:`fraction_at`, no cut by
    default) while the weights train. The schedule comes from pruning's settings (those in
    :data:`uses`): MP cuts at round(prune_at E) epochs, GMP from gmp_start to gmp_end of the
    steps every gmp_every steps; every step index is at most the last step."""

    def make(self, config: MethodConfig, layout: Any, plan: Plan) -> MagnitudeMethod:
        total = plan.epochs * plan.steps_per_epoch
        end = min(round(plan.setting("gmp_end", 1.0) * total), total - 1)
        cut = min(round(plan.setting("prune_at", 0.0) * plan.epochs) * plan.steps_per_epoch,
                  total - 1)
        return MagnitudeMethod(self, layout, plan.setting("target", 1.0), cut=cut,
                               start=min(round(plan.setting("gmp_start", 0.0) * total), end),
                               end=end, every=plan.setting("gmp_every", 1),
                               seed=config.seed, weight_optimizer=plan.weight_optimizer)

    def check_prune(self, config: Any) -> None:
        if "target" in self.uses:
            check_fraction(config.target)

    def initial_mask(self, method: MagnitudeMethod, generator: torch.Generator
                     ) -> torch.Tensor:
        """The mask (d,) the run starts with (``generator``: a CPU generator seeded with the
        run's seed, for a random mask; the run's own stream is not touched)."""
        return torch.ones(method.d, dtype=torch.float64)

    def fraction_at(self, method: MagnitudeMethod, step: int) -> float | None:
        """The fraction of weights kept after a cut at ``step``, or None (no cut)."""
        return None


class MagnitudeFamily(MaskFamily):
    """MP, GMP and dense training: the mask starts all ones; MP and GMP cut it by magnitude."""


@register
class MPFamily(MagnitudeFamily):
    """MP: one global cut to ``target`` at step ``cut``."""

    name, label, text, color = "mp", "MP", "MP", "C7"
    commands = ("prune-joint",)
    uses = ("target", "prune_at")

    def fraction_at(self, method: MagnitudeMethod, step: int) -> float | None:
        return method.target if step == method.cut else None


@register
class GMPFamily(MagnitudeFamily):
    """GMP: a cut every ``every`` steps from ``start`` to ``end`` (and at ``end``) on the cubic
    schedule :func:`gmp_fraction`."""

    name, label, text, color = "gmp", "GMP", "GMP", "C3"
    commands = ("prune-joint",)
    uses = ("target", "gmp_start", "gmp_end", "gmp_every")

    def fraction_at(self, method: MagnitudeMethod, step: int) -> float | None:
        m = method
        if m.start <= step <= m.end and ((step - m.start) % m.every == 0 or step == m.end):
            return gmp_fraction(step, m.start, m.end, m.target)
        return None


@register
class DenseFamily(MagnitudeFamily):
    """Dense training: the mask stays all ones; the weights train in either mode."""

    name, label, text, color = "dense", "dense", "dense", "k"
    commands = ("prune-supermask", "prune-joint")
    dense_weights = True


class MagnitudeMethod:
    """MP, GMP or dense training as a :class:`pbscale.loop_types.Method`: one binary mask (d,)
    over the masked weights of ``layout`` (all ones for dense), no logits. ``apply`` (called by
    the loop after the backward pass and before the weight step) makes the cuts: at step ``cut``
    for MP, every ``every`` steps from ``start`` to ``end`` on :func:`gmp_fraction` for GMP. A
    cut zeroes the pruned weights, their gradients and their momentum buffers in
    ``weight_optimizer``, so with the mask in the forward pass (zero gradient) and weight decay
    on a zero weight they stay exactly zero. ``generator`` (seeded with ``seed``) is the run's
    stream (batch order, evaluation); the mask draws nothing."""

    #: evaluated with its mask, which training used (no BatchNorm recalibration)
    eval_sampled = also_sampled = recalibrate_bn = False

    def __init__(self, family: MaskFamily, layout: Any, target: float, cut: int,
                 start: int, end: int, every: int, seed: int = 0,
                 weight_optimizer: torch.optim.Optimizer | None = None) -> None:
        self.family, self.kind, self.layout = family, family.name, layout
        self.target, self.cut, self.start, self.end, self.every = target, cut, start, end, every
        self.d = layout.d
        self.mask = family.initial_mask(self, torch.Generator().manual_seed(seed)).to(
            device=layout.device, dtype=layout.dtype)
        self.generator = torch.Generator(device=layout.device).manual_seed(seed)
        self.weight_optimizer = weight_optimizer
        self.step_count = 0

    def distribute(self, shard: Shard) -> list[RunHooks]:
        """Data parallelism (the weights' gradients are averaged by the tool's strategy)."""
        return [RankSync()]

    def synced_params(self) -> list[torch.Tensor]:
        return []

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
        return self.family.fraction_at(self, step)

    @torch.no_grad()
    def apply(self) -> None:
        frac = self.fraction_at(self.step_count)
        self.step_count += 1
        if frac is None:
            return
        params = dict(self.layout.module.named_parameters())
        old = self.layout.split(self.mask[None])
        new = global_magnitude_masks({k: params[k] for k in self.layout.names}, frac,
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
        return {"method": self.kind, "target": self.target, "cut": self.cut,
                "start": self.start, "end": self.end, "every": self.every}

    def state_dict(self) -> dict:
        return {"mask": self.mask.cpu(), "step_count": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        self.mask = state["mask"].to(self.mask.device)
        self.step_count = int(state["step_count"])
