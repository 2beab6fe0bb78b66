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
* ``edgepopup``: r real scores; the forward keeps, in each layer of the step's ``layers``
  sizes, the round(target d_layer) weights of largest score (over channel variables, with the
  step's ``kept_fraction``: those of largest score, in that order, that fit within the target
  fraction of the ``--cost``, as MP's cut does); the backward passes dJ/dz to every score. Its
  count is fixed, so it has no L0 term.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from pbexact.errors import PBInputError
from pbexact.parametrizations import Parametrization
from pbexact.relaxations import HC_BETA, HC_GAMMA, HC_ZETA, get_relaxation
from pbscale.runs.contracts import BatchedLoss

from .estimate import Estimate, sample_mean
from .registry import Capabilities, Pruning, register
from .schedules import check_fraction, keep_within, top_scores
from .trainer import Gradient, LogitsFamily, StepArgs

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


class BeyondFamily(LogitsFamily):
    """The shared part: one mask per step trains the network weights (joint) on its loss; no
    torchrun sample split (data parallel, gradient of the logits averaged over ranks)."""

    def weight_loss(self, J: torch.Tensor, at: StepArgs) -> torch.Tensor | None:
        """The loss the weights train on: the mean of the step's losses J, when asked for."""
        return J.mean() if at.weights else None


#: The tools the methods beyond the paper run in.
BEYOND_COMMANDS = ("regress", "regress-group", "prune-supermask", "prune-joint")


@register
class STThetaFamily(BeyondFamily):
    """Straight-through Bernoulli masks of Zhou et al. 2019 (:func:`st_theta`); every
    parametrization; n masks per step (pruning: n = 1, as in their paper). Evaluated with the
    deterministic mask 1[theta > 1/2]; pruning also reports the best of ``--eval-masks`` sampled
    masks (``sampled_*`` metrics)."""

    name, label, text, color = "st-theta", "ST-θ (Zhou)", "ST-theta", "navy"
    caps = Capabilities(commands=BEYOND_COMMANDS,
                        uses=("n", "param", "lr", "optimizer", "chunk", "lam"), min_samples=1,
                        pruning=Pruning(also_sampled=True, prune_param="sigmoid", prune_n=1,
                                        channels=True))

    def gradient(self, f: BatchedLoss, r: torch.Tensor, at: StepArgs) -> Gradient:
        est, J = st_theta(f, r, at.param, at.uniforms(at.n), keep_graph=at.weights)
        return Gradient(est, at.param.theta, self.weight_loss(J, at))


@register
class HardConcreteFamily(BeyondFamily):
    """L0 regularization with hard-concrete gates (Louizos et al. 2018): logits r = log alpha,
    starting at 0 (their drop rate 1/2); one gate sample per weight per step; the dense
    regularizer is lambda * sum P(gate != 0) (:func:`hc_nonzero`); evaluated with the test-time
    gate (:func:`hc_test_gate`), whose non-zero entries count as remaining."""

    name, label, text, color = "hardconcrete", "Hard concrete L0", "hard-concrete", "goldenrod"
    caps = Capabilities(commands=BEYOND_COMMANDS, uses=("lr", "optimizer", "lam"),
                        pruning=Pruning(channels=True))

    def initial_logits(self, param: Parametrization, d: int,
                       generator: torch.Generator) -> torch.Tensor:
        return torch.zeros(d, dtype=torch.float64)

    def theta(self, r: torch.Tensor, at: StepArgs) -> torch.Tensor:
        return hc_nonzero(r)

    def eval_mask(self, r: torch.Tensor, at: StepArgs) -> torch.Tensor:
        return hc_test_gate(r.detach())

    def sample_masks(self, r: torch.Tensor, k: int, at: StepArgs) -> torch.Tensor:
        """k masks of non-zero sampled gates (0/1)."""
        return (hc_sample(r.detach(), at.uniforms(k)) != 0).to(r.dtype)

    def gradient(self, f: BatchedLoss, r: torch.Tensor, at: StepArgs) -> Gradient:
        rr = r.detach().requires_grad_(True)
        J = f(hc_sample(rr, at.uniforms(1)))
        (g,) = torch.autograd.grad(J.sum(), rr, retain_graph=at.weights)
        return Gradient(Estimate(g, sample_mean(J)), hc_nonzero, self.weight_loss(J, at))


@register
class EdgePopupFamily(BeyondFamily):
    """Edge-popup (Ramanujan et al. 2020): real scores r, uniform on (0, 1) from the run's seed;
    the forward keeps the top ``at.target`` fraction of scores per layer of ``at.layers``
    (:func:`pbscale.methods.schedules.top_scores`; regress: one layer, target 1) or, over
    channel variables (``at.kept_fraction`` set), the budgeted top of the scores within the
    ``at.target`` fraction of the cost (:func:`pbscale.methods.schedules.keep_within`, MP's
    channel cut, with its floor: no coupled group of ``at.coupled`` emptied); straight-through
    gradient dJ/dz to every score. Supermask only (their method trains no weights). Its count
    is fixed, so it has no L0 term (``lam`` is not among its uses)."""

    name, label, text, color = "edgepopup", "Edge-popup", "edge-popup", "teal"
    caps = Capabilities(commands=("regress", "regress-group", "prune-supermask"),
                        uses=("lr", "optimizer", "target"), deterministic=True,
                        pruning=Pruning(channels=True))

    def initial_logits(self, param: Parametrization, d: int,
                       generator: torch.Generator) -> torch.Tensor:
        return torch.rand(d, generator=generator, dtype=torch.float64)

    def check_prune(self, config: Any) -> None:
        try:
            check_fraction(config.target)
        except PBInputError:
            raise PBInputError(f"edge-popup keeps the --target fraction of each layer (over "
                               f"channels: of the --cost), which must be in (0, 1], got "
                               f"{config.target}; e.g. --target 0.5") from None

    def theta(self, r: torch.Tensor, at: StepArgs) -> torch.Tensor:
        """The 0/1 mask (d,) (or (G, d) for a group's scores (G, d)) of the top scores r:
        per layer (:func:`top_scores`), or within the cost budget where ``at.kept_fraction``
        is set (:func:`keep_within`, never emptying a group of ``at.coupled``), in r's
        dtype."""
        r = r.detach()
        if at.kept_fraction is None:
            return top_scores(r, at.layers, at.target)
        if r.dim() > 1:
            return torch.stack([self.theta(row, at) for row in r])
        return keep_within(r, at.target, at.kept_fraction, None, at.coupled).to(r.dtype)

    def eval_mask(self, r: torch.Tensor, at: StepArgs) -> torch.Tensor:
        return self.theta(r, at)

    def sample_masks(self, r: torch.Tensor, k: int, at: StepArgs) -> torch.Tensor:
        return self.theta(r, at).expand(k, at.d)

    def gradient(self, f: BatchedLoss, r: torch.Tensor, at: StepArgs) -> Gradient:
        rr = r.detach().requires_grad_(True)
        z = self.theta(rr, at)
        J = f((z + rr - rr.detach())[None])  # value z, d(.)/dr = 1
        (g,) = torch.autograd.grad(J.sum(), rr)
        return Gradient(Estimate(g, sample_mean(J)), None)
