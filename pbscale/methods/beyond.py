"""Mask methods outside the paper's comparison (`ch:other` mentions the hybrids; the pruning
experiments leave them out): straight-through Bernoulli masks (Zhou et al. 2019), hard-concrete
L0 gates (Louizos, Welling and Kingma 2018) and edge-popup (Ramanujan et al. 2020), each one
registered :class:`pbscale.methods.registry.Family` over logits r of shape (d,).

* ``st-theta``: z ~ Bern(theta), theta = theta(r) of the parametrization; the forward uses z and
  the backward passes dJ/dz to theta as if dz/dtheta = 1, then through dtheta/dr (Zhou et al.'s
  supermask rule). The registry's ``st`` (:func:`pbscale.methods.hybrids.straight_through`, the
  paper's ST of `ch:other`) passes dJ/dz to r itself, without dtheta/dr: for the sigmoid the two
  differ by the factor sigmoid'(r) = theta (1 - theta) per weight, so both exist.
* ``hardconcrete``: r = log alpha; one gate per weight per step,
  g = min(1, max(0, sigmoid((log u - log(1 - u) + log alpha) / beta) (zeta - gamma) + gamma)),
  u ~ U(0, 1), (gamma, zeta) = (-0.1, 1.1), beta = 2/3; the L0 term lambda * sum_i
  P(g_i != 0) = lambda * sum_i sigmoid(log alpha_i - beta log(-gamma / zeta)) in closed form;
  at test time g = min(1, max(0, sigmoid(log alpha)(zeta - gamma) + gamma)), whose exact zeros
  are the pruned weights.
* ``edgepopup``: r real scores; the forward keeps, in each layer of ``trainer.layers`` sizes, the
  round(target d_layer) weights of largest score; the backward passes dJ/dz to every score.
  Its count is fixed, so the L0 term is constant and adds no gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from pbexact.errors import PBInputError
from pbexact.parametrizations import Parametrization
from pbexact.relaxations import HC_BETA, HC_GAMMA, HC_ZETA, get_relaxation

from ..loop_types import BatchedLoss
from .estimate import Estimate, sample_mean
from .magnitude import check_fraction
from .registry import register
from .trainer import LogitsFamily, MaskTrainer

#: The hard-concrete gate, one definition with the exact side (`pbexact.relaxations`).
HARD_CONCRETE = get_relaxation("hardconcrete")
#: Keeps log(u) and log(1 - u) finite in the hard-concrete sample.
HC_EPS = 1e-6


def st_theta(f: BatchedLoss, r: torch.Tensor, param: Parametrization, u: torch.Tensor,
             keep_graph: bool = False) -> tuple[Estimate, torch.Tensor]:
    """Zhou et al.'s straight-through estimate over logits r (d,) from uniforms u (n, d):
    z = 1[u < theta(r)], forward J(z) (n,), gradient mean_s dJ/dz_s * dtheta/dr. Returns the
    estimate and J (n,) (with its graph into the network weights when ``keep_graph``). A
    group's logits r (G, d) with u (n, G, d): J (n, G), each run's own mean."""
    rr = r.detach().requires_grad_(True)
    theta = param.theta(rr)
    z = (u < theta.detach()).to(theta.dtype)
    J = f(z + theta - theta.detach())  # value z, d(.)/dtheta = 1
    mean = J.mean() if J.dim() == 1 else J.mean(0).sum()
    (g,) = torch.autograd.grad(mean, rr, retain_graph=keep_graph)
    return Estimate(g, sample_mean(J)), J


def hc_sample(log_alpha: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Hard-concrete gates (..., d) from uniforms u (..., d), differentiable in log alpha:
    :meth:`pbexact.relaxations.Relaxation.gate` of :data:`HARD_CONCRETE`, u clamped to
    [HC_EPS, 1 - HC_EPS]."""
    return HARD_CONCRETE.gate(log_alpha, u, eps=HC_EPS)


def hc_test_gate(log_alpha: torch.Tensor) -> torch.Tensor:
    """min(1, max(0, sigmoid(log alpha)(zeta - gamma) + gamma)), shape of log alpha."""
    return (torch.sigmoid(log_alpha) * (HC_ZETA - HC_GAMMA) + HC_GAMMA).clamp(0.0, 1.0)


def hc_nonzero(log_alpha: torch.Tensor) -> torch.Tensor:
    """P(gate != 0) = sigmoid(log alpha - beta log(-gamma / zeta)): the expected L0 per weight."""
    return torch.sigmoid(log_alpha - HC_BETA * math.log(-HC_GAMMA / HC_ZETA))


def layer_counts(layers: Sequence[int], target: float) -> list[int]:
    """Weights kept per layer by edge-popup: round(target * d_layer) for each layer size."""
    return [round(target * size) for size in layers]


def top_scores(scores: torch.Tensor, layers: Sequence[int], target: float) -> torch.Tensor:
    """0/1 mask (d,) keeping the round(target d_layer) largest scores of each layer (layers:
    sizes summing to d, in the order of the flat vector); scores (G, d) give each row's."""
    if scores.dim() > 1:
        return torch.stack([top_scores(s, layers, target) for s in scores])
    z = torch.zeros_like(scores)
    start = 0
    for size, k in zip(layers, layer_counts(layers, target)):
        if k:
            idx = torch.topk(scores[start:start + size], k, sorted=False).indices
            z[start + idx] = 1.0
        start += size
    return z


def _constant(r: torch.Tensor) -> torch.Tensor:
    """A theta map with zero gradient (edge-popup's L0 term is a constant)."""
    return r * 0


class BeyondFamily(LogitsFamily):
    """The shared part: the tools they run in; one mask per step trains the network weights
    (joint) on its loss; no torchrun sample split (data parallel, gradient of the logits
    averaged over ranks)."""

    commands = ("regress", "batched", "prune-supermask", "prune-joint")

    def weight_loss(self, record: list[torch.Tensor], n: int) -> torch.Tensor:
        return record[0].mean()


@register
class STThetaFamily(BeyondFamily):
    """Straight-through Bernoulli masks of Zhou et al. 2019 (:func:`st_theta`); every
    parametrization; n masks per step (pruning: n = 1, as in their paper). Evaluated with the
    deterministic mask 1[theta > 1/2]; pruning also reports the best of ``--eval-masks`` sampled
    masks (``sampled_*`` metrics)."""

    name, label, text, color = "st-theta", "ST-θ (Zhou)", "ST-theta", "navy"
    uses = ("n", "param", *LogitsFamily.uses)
    also_sampled = True
    prune_param = "sigmoid"

    def gradient(self, trainer: MaskTrainer, f: BatchedLoss, record: list | None
                 ) -> tuple[Estimate, Callable[[torch.Tensor], torch.Tensor]]:
        est, J = st_theta(f, trainer.r, trainer.param, trainer.uniforms(trainer.config.n),
                          keep_graph=record is not None)
        if record is not None:
            record.append(J)
        return est, trainer.param.theta


@register
class HardConcreteFamily(BeyondFamily):
    """L0 regularization with hard-concrete gates (Louizos et al. 2018): logits r = log alpha,
    starting at 0 (their drop rate 1/2); one gate sample per weight per step; the dense
    regularizer is lambda * sum P(gate != 0) (:func:`hc_nonzero`); evaluated with the test-time
    gate (:func:`hc_test_gate`), whose non-zero entries count as remaining."""

    name, label, text, color = "hardconcrete", "Hard concrete L0", "hard-concrete", "goldenrod"

    def initial_logits(self, param: Parametrization, d: int,
                       generator: torch.Generator) -> torch.Tensor:
        return torch.zeros(d, dtype=torch.float64)

    def theta(self, trainer: MaskTrainer) -> torch.Tensor:
        return hc_nonzero(trainer.r)

    def eval_mask(self, trainer: MaskTrainer) -> torch.Tensor:
        return hc_test_gate(trainer.r.detach())

    def sample_masks(self, trainer: MaskTrainer, k: int) -> torch.Tensor:
        """k masks of non-zero sampled gates (0/1)."""
        u = torch.rand((k, trainer.d), generator=trainer.generator, dtype=trainer.r.dtype,
                       device=trainer.device)
        return (hc_sample(trainer.r.detach(), u) != 0).to(trainer.r.dtype)

    def gradient(self, trainer: MaskTrainer, f: BatchedLoss, record: list | None
                 ) -> tuple[Estimate, Callable[[torch.Tensor], torch.Tensor]]:
        rr = trainer.r.detach().requires_grad_(True)
        J = f(hc_sample(rr, trainer.uniforms(1)))
        (g,) = torch.autograd.grad(J.sum(), rr, retain_graph=record is not None)
        if record is not None:
            record.append(J)
        return Estimate(g, sample_mean(J)), hc_nonzero


@register
class EdgePopupFamily(BeyondFamily):
    """Edge-popup (Ramanujan et al. 2020): real scores r, uniform on (0, 1) from the run's seed;
    the forward keeps the top ``trainer.target`` fraction of scores per layer of
    ``trainer.layers`` (:func:`top_scores`; regress: one layer, target 1); straight-through
    gradient dJ/dz to every score. Supermask only (their method trains no weights)."""

    name, label, text, color = "edgepopup", "Edge-popup", "edge-popup", "teal"
    commands = ("regress", "batched", "prune-supermask")
    uses = (*LogitsFamily.uses, "target")
    deterministic = True

    def initial_logits(self, param: Parametrization, d: int,
                       generator: torch.Generator) -> torch.Tensor:
        return torch.rand(d, generator=generator, dtype=torch.float64)

    def check_prune(self, config: Any) -> None:
        try:
            check_fraction(config.target)
        except PBInputError:
            raise PBInputError(f"edge-popup keeps the --target fraction of each layer, which "
                               f"must be in (0, 1], got {config.target}; e.g. --target 0.5"
                               ) from None

    def theta(self, trainer: MaskTrainer) -> torch.Tensor:
        return top_scores(trainer.r.detach(), trainer.layers, trainer.target)

    def eval_mask(self, trainer: MaskTrainer) -> torch.Tensor:
        return self.theta(trainer)

    def sample_masks(self, trainer: MaskTrainer, k: int) -> torch.Tensor:
        return self.theta(trainer).expand(k, trainer.d)

    def gradient(self, trainer: MaskTrainer, f: BatchedLoss, record: list | None
                 ) -> tuple[Estimate, Callable[[torch.Tensor], torch.Tensor]]:
        rr = trainer.r.detach().requires_grad_(True)
        z = top_scores(rr.detach(), trainer.layers, trainer.target)
        J = f((z + rr - rr.detach())[None])  # value z, d(.)/dr = 1
        (g,) = torch.autograd.grad(J.sum(), rr)
        return Estimate(g, sample_mean(J)), _constant
