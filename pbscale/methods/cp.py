"""CP, continuous relaxation of the mask (`sec:pb_application`): f(sigmoid(r / tau)) with tau
annealed exponentially from 1 to 1/200, updated every 100 iterations
(`sec:app_microworld_hypers`); evaluated with 1[r > 0]."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pbexact.continuation import CP_EVERY, CP_FINAL_TAU, exponential_temperature
from pbexact.errors import PBInputError
from pbexact.parametrizations import Parametrization
from pbscale.runs.contracts import BatchedLoss

from .estimate import Estimate, sample_mean
from .registry import CP_GAMMA, CP_MILESTONES, Capabilities, Pruning, Settings, register, setting
from .trainer import Gradient, LogitsFamily, MicroworldHooks, StepArgs


def cp_temperature(step: int, total_steps: int, final: float = CP_FINAL_TAU,
                   every: int = CP_EVERY) -> float:
    """tau at iteration ``step``: 1 at the start, multiplied by a constant every ``every``
    iterations so that the last update of training reaches ``final``: the schedule
    :func:`pbexact.continuation.exponential_temperature` over the updates."""
    updates = max((total_steps - 1) // every, 1)
    return exponential_temperature(min(step // every, updates), updates + 1, final)


def cp_relaxed_loss(f: BatchedLoss, r: torch.Tensor, tau: float) -> torch.Tensor:
    """f(sigmoid(r / tau)) (`eq:sigmoid_cp`), r of shape (..., d) -> (...), differentiable."""
    return f(torch.sigmoid(r / tau))


def cp_hard_mask(r: torch.Tensor) -> torch.Tensor:
    """The mask CP is evaluated with, 1[r > 0] (the tau -> 0 limit)."""
    return (r > 0).to(r.dtype)


@dataclass
class CPStep:
    """One CP evaluation at logits r (..., d): the relaxed losses f(sigmoid(r / tau)) (...), with
    their autograd graph back to the weights of f when asked for; their gradient over r (the
    shape of r); and the losses of the hard mask f(1[r > 0]) (...), detached, or None."""

    relaxed: torch.Tensor
    grad: torch.Tensor
    hard: torch.Tensor | None


def cp_step(f: BatchedLoss, r: torch.Tensor, tau: float, hard: bool = True,
            keep_graph: bool = False) -> CPStep:
    """CP's gradient (`eq:sigmoid_cp`, `sec:pb_application`): d/dr sum f(sigmoid(r / tau)) for r
    of any leading shape (..., d) (one problem, or one per seed), f: (..., d) -> (...). With
    ``hard``, f also evaluates 1[r > 0] in the same batched call (stacked in front: f sees
    (2, ..., d)), the loss CP reports. ``keep_graph`` keeps the relaxed losses' graph (to train
    the weights of f from them too). The one definition for `MaskTrainer` and the microworld."""
    rr = r.detach().requires_grad_(True)
    soft = torch.sigmoid(rr / tau)
    if hard:
        out = f(torch.stack([soft, cp_hard_mask(rr.detach())]))
        relaxed, hard_loss = out[0], out[1].detach()
    else:
        relaxed, hard_loss = cp_relaxed_loss(f, rr, tau), None
    (grad,) = torch.autograd.grad(relaxed.sum(), rr, retain_graph=keep_graph)
    return CPStep(relaxed, grad, hard_loss)



@dataclass(frozen=True)
class CPSettings(Settings):
    """CP's temperature schedule (:func:`cp_temperature`): tau falls from 1 to ``final_tau``,
    updated every ``every`` mask-training steps (`sec:app_microworld_hypers`). Hashed under
    the keys they had before families owned their settings (``cp_final_tau``, ``cp_every``)."""

    final_tau: float = setting(CP_FINAL_TAU, "the temperature tau falls to, from 1, in (0, 1]",
                               legacy="cp_final_tau")
    every: int = setting(CP_EVERY, "mask-training steps between temperature updates (>= 1)",
                         legacy="cp_every")

    def check(self, text: str) -> None:
        if not (isinstance(self.final_tau, (int, float)) and 0 < self.final_tau <= 1) or \
                isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise PBInputError(f"{text} needs 0 < final_tau <= 1 and a schedule period every >= "
                               f"1, got final_tau={self.final_tau!r}, every={self.every!r}; give "
                               "values in those ranges")


@register
class CPFamily(LogitsFamily, MicroworldHooks):
    """CP as a method: logits start at r = 0 (sigmoid(0 / tau) = 0.5); each step differentiates
    the relaxed loss at the step's temperature (:func:`cp_temperature` of the step's position,
    its :class:`CPSettings`), reports the loss of 1[r > 0] and gives the relaxed loss to the
    network weights; evaluated, sampled and frozen with 1[r > 0]; draws nothing (under torchrun
    its batches are split and the gradient of r averaged)."""

    name, label, text, color = "cp", "CP", "CP", "C4"
    caps = Capabilities(commands=("regress", "regress-group", "prune-supermask", "prune-joint",
                                  "microworld"),
                        uses=("lr", "optimizer", "lam"), deterministic=True,
                        pruning=Pruning(mask_schedule=(CP_MILESTONES, CP_GAMMA), channels=True))
    Settings = CPSettings

    def initial_logits(self, param: Parametrization, d: int,
                       generator: torch.Generator) -> torch.Tensor:
        return torch.zeros(d, dtype=torch.float64)

    def theta(self, r: torch.Tensor, at: StepArgs) -> torch.Tensor:
        return cp_hard_mask(r)

    def keep_score(self, r: torch.Tensor, at: StepArgs) -> torch.Tensor:
        """The logits r: CP keeps 1[r > 0] (its theta is that hard mask)."""
        return r.detach()

    def temperature(self, at: StepArgs) -> float:
        s = at.settings
        return cp_temperature(at.index, at.total, s.final_tau, s.every)

    def gradient(self, f: BatchedLoss, r: torch.Tensor, at: StepArgs) -> Gradient:
        tau = self.temperature(at)
        cp = cp_step(f, r, tau, hard=True, keep_graph=at.weights)

        def theta_fn(x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(x / tau)

        # the training loss CP reports is that of 1[r > 0], as the paper does (one "sample")
        return Gradient(Estimate(cp.grad, sample_mean(cp.hard[None])), theta_fn,
                        cp.relaxed if at.weights else None)

    def sample_masks(self, r: torch.Tensor, k: int, at: StepArgs) -> torch.Tensor:
        return cp_hard_mask(r.detach()).expand(k, at.d)

    def vector_gradient(self, f: BatchedLoss, r: torch.Tensor,
                        uniforms: Callable[[], torch.Tensor], control: Any,
                        control_opts: list[torch.optim.Optimizer], tau: float) -> torch.Tensor:
        return cp_step(f, r, tau, hard=False).grad

    def run_theta(self, r: torch.Tensor) -> torch.Tensor:
        return cp_hard_mask(r)
