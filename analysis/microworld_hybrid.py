"""Vectorized microworld runs of the methods that differentiate J: CP, ST, REBAR and RELAX
(`sec:microworld_exp_approaches`, `ch:other`, `sec:app_microworld_hypers`).

The estimators themselves are pbscale's (:mod:`pbscale.methods`: ``cp_temperature``,
``cp_relaxed_loss``, ``cp_hard_mask``, ``straight_through``, ``rebar_relax``, ``HybridControl``),
called here with a leading seeds dimension: logits r of shape (seeds, d), uniforms of shape
(n, seeds, d), and a differentiable batched loss f: (..., d) -> (...) such as
:class:`pbexact.benchmarks.NNLoss`. What this module adds is only the batched training loop and a
RELAX control network with separate weights per seed (:class:`PerSeedMLP`), so that the seeds
stay independent runs.

Every run uses SGD on r from theta_0 = 0.5 (r = 0, sigmoid parametrization), a ``torch.Generator``
seeded once, and logs the exact E_theta[J] of each seed from the J table (for CP, J of its hard
mask 1[r > 0], as the paper reports).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from analysis.microworld_runs import DETERMINISTIC, CurveLogger, Trajectory, check_run
from pbexact.continuation import CP_FINAL_TAU
from pbexact.errors import PBInputError, check_n, check_table
from pbexact.polynomial import expected_loss
from pbexact.sampling import vertex_index
from pbscale.methods import (
    HybridControl,
    cp_hard_mask,
    cp_relaxed_loss,
    cp_temperature,
    rebar_relax,
    straight_through,
)

#: Methods run here; each needs f differentiable in z.
TORCH_METHODS = ("cp", "st", "rebar", "relax")
#: RELAX control network (`sec:app_microworld_hypers`): one tanh hidden layer of 10 units,
#: Adam with lr 1 and weight decay 1e-3.
RELAX_HIDDEN = 10
RELAX_LR = 1.0
RELAX_WEIGHT_DECAY = 1e-3

BatchedLoss = Callable[[torch.Tensor], torch.Tensor]


class PerSeedMLP(nn.Module):
    """d -> hidden (tanh) -> 1 with separate weights for each of ``seeds`` runs: input
    (..., seeds, d), output (..., seeds, 1). Initialized like ``nn.Linear`` (uniform in
    +-1/sqrt(fan_in)) from ``generator``, so it is reproducible."""

    def __init__(self, seeds: int, d: int, hidden: int, generator: torch.Generator,
                 dtype: torch.dtype = torch.float64) -> None:
        super().__init__()

        def uniform(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:
            bound = 1 / math.sqrt(fan_in)
            u = torch.rand(shape, generator=generator, dtype=dtype)
            return nn.Parameter((2 * u - 1) * bound)

        self.w1 = uniform((seeds, d, hidden), d)
        self.b1 = uniform((seeds, hidden), d)
        self.w2 = uniform((seeds, hidden, 1), hidden)
        self.b2 = uniform((seeds, 1), hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(torch.einsum("...sd,sdh->...sh", x, self.w1) + self.b1)
        return torch.einsum("...sh,sho->...so", h, self.w2) + self.b2


class PerSeedControl(HybridControl):
    """pbscale's REBAR/RELAX control with log tau and eta of shape (seeds,) and, for RELAX, a
    :class:`PerSeedMLP` in place of the shared network, so no parameter couples two seeds."""

    def __init__(self, kind: str, d: int, seeds: int, generator: torch.Generator) -> None:
        super().__init__(kind, d, shape=(seeds,), hidden=RELAX_HIDDEN)
        if self.net is not None:
            self.net = PerSeedMLP(seeds, d, RELAX_HIDDEN, generator)
        self.to(torch.float64)


def check_torch_method(method: str, n: int) -> None:
    if method not in TORCH_METHODS:
        raise PBInputError(f"unknown method {method!r}; choose one of {', '.join(TORCH_METHODS)}")
    if method != "cp":
        check_n(n, method.upper(), 1)


def run_torch(
    f: BatchedLoss,
    J: np.ndarray,
    method: str,
    n: int = 1,
    lr: float = 0.1,
    steps: int = 10_000,
    seeds: int = 100,
    seed: int = 0,
    log_every: int = 1,
    desc: str | None = None,
    cp_final_tau: float = CP_FINAL_TAU,
    cp_every: int = 100,
) -> Trajectory:
    """SGD on sigmoid logits r (seeds, d), r_0 = 0, with the gradients of ``method`` (cp, st,
    rebar, relax) on the differentiable loss f, whose J table of shape (2^d,) gives the logged
    exact losses. CP anneals tau from 1 to ``cp_final_tau`` every ``cp_every`` iterations and is
    deterministic, so it runs one seed; REBAR/RELAX train their controls with Adam on the
    single-sample variance proxy (pbscale's recipe), log tau and eta at the method's lr."""
    J = check_table(J)
    d = J.shape[0].bit_length() - 1
    check_run(steps, seeds, log_every, lr)
    check_torch_method(method, n)
    if method in DETERMINISTIC:
        seeds = 1
    gen = torch.Generator().manual_seed(seed)
    r = torch.zeros((seeds, d), dtype=torch.float64)
    control: PerSeedControl | None = None
    control_opts: list[torch.optim.Optimizer] = []
    if method in ("rebar", "relax"):
        control = PerSeedControl(method, d, seeds, gen)
        control_opts.append(torch.optim.Adam(control.scalar_parameters(), lr=lr))
        if control.net is not None:
            control_opts.append(torch.optim.Adam(
                control.surrogate_parameters(), lr=RELAX_LR, weight_decay=RELAX_WEIGHT_DECAY
            ))

    def losses(r: torch.Tensor) -> np.ndarray:
        if method == "cp":
            return J[vertex_index(cp_hard_mask(r).numpy())]
        return expected_loss(J, torch.sigmoid(r).numpy())

    def uniforms() -> torch.Tensor:
        return torch.rand((n, seeds, d), generator=gen, dtype=torch.float64)

    logger = CurveLogger(steps, log_every)
    bar = tqdm(range(steps + 1), desc=desc, leave=False, mininterval=1.0, disable=desc is None)
    for step in bar:
        if logger.wants(step):
            logger.log(step, losses(r))
        if step == steps:
            break
        if method == "cp":
            rr = r.detach().requires_grad_(True)
            tau = cp_temperature(step, steps, cp_final_tau, cp_every)
            (grad,) = torch.autograd.grad(cp_relaxed_loss(f, rr, tau).sum(), rr)
        elif method == "st":
            grad = straight_through(f, r, uniforms()).grad
        else:
            est, var = rebar_relax(f, r, uniforms(), uniforms(), control)
            params = control.scalar_parameters() + control.surrogate_parameters()
            # var sums the seeds' own proxies, so each seed's parameters get their own gradient
            grads = torch.autograd.grad(var, params, allow_unused=True)
            for p, g in zip(params, grads):
                p.grad = g
            for opt in control_opts:
                opt.step()
            grad = est.grad
        r = (r - lr * grad).detach()
    final_theta = cp_hard_mask(r) if method == "cp" else torch.sigmoid(r)
    return logger.trajectory(
        losses(r), final_theta.numpy(), method=method, n=n if method != "cp" else 0,
        param="sigmoid", lr=lr, seeds=seeds,
    )
