"""One step's estimate over mask logits and the two ways every method hands it to autograd: the
surrogate loss whose gradient is the estimate, and the closed-form dense (L0) regularizer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Estimate:
    """One step's gradient over the logits, shape (..., P) (the shape of r), and the mean sampled
    loss: a float for r of shape (P,), else a float64 CPU tensor of shape (...), one per run."""

    grad: torch.Tensor
    loss: float | torch.Tensor


def sample_mean(J: torch.Tensor) -> float | torch.Tensor:
    """The training loss a step reports from the losses J (n, ...) of its n masks, their mean
    over the masks: a float for one run (J (n,)), else a CPU tensor (...), one per run (the
    leading run dimension of a group, :class:`pbscale.regression.group.MaskTrainerGroup`)."""
    J = J.detach()
    return float(J.mean()) if J.dim() <= 1 else J.mean(0).cpu()


def surrogate_loss(g: torch.Tensor, r: torch.Tensor, value: torch.Tensor | float = 0.0
                   ) -> torch.Tensor:
    """A scalar whose value is ``value`` and whose autograd gradient in r is the estimate g
    (shape of r), the convention of the field's estimator libraries:

        L(r) = value + sum_p g_p (r_p - stop_grad(r_p)),

    so L = value and dL/dr = g exactly (g is detached: the estimate is a constant to autograd;
    its dependence on r through the samples and the scores is already inside g). It composes:
    L + R(r) backpropagates g + grad R, and through r into whatever produced r (a network that
    outputs the logits, a shared parameter). Equivalent to the score-weighted log-probability
    form sum_s w_s log p(z_s; theta(r)) with w_s the estimator's sample weights, except that it
    also carries per-parameter constants (ARMS's 1 / (1 - rho), beta*) exactly.
    """
    return value + (g.detach() * (r - r.detach())).sum()


def dense_regularizer(r: torch.Tensor, theta_fn: Callable[[torch.Tensor], torch.Tensor],
                      lam: float, weights: torch.Tensor | None = None
                      ) -> tuple[float, torch.Tensor]:
    """lambda * sum_i theta_i(r) in closed form and its exact gradient over r, shape (P,);
    with ``weights`` c (shape (P,)), lambda * sum_i c_i theta_i(r) (structured pruning: each
    channel variable weighted by its cost, normalised to mean 1). Without weights the
    computation is the unweighted sum's, bit for bit.

    For MC methods theta_fn is the parametrization's theta (E[sum z] = sum theta); for CP it is
    r -> sigmoid(r / tau). Used by pruning (`sec:app_pruning_setup`); lambda = 0 here.
    """
    rr = r.detach().requires_grad_(True)
    theta = theta_fn(rr)
    value = lam * (theta.sum() if weights is None else (weights.to(theta) * theta).sum())
    (grad,) = torch.autograd.grad(value, rr)
    return float(value.detach()), grad
