"""Vectorized microworld runs of the methods that differentiate J: CP, ST, REBAR and RELAX
(`sec:microworld_exp_approaches`, `ch:other`, `sec:app_microworld_hypers`).

The estimators themselves are pbscale's (:mod:`pbscale.methods`: ``cp_temperature``,
``cp_step``, ``cp_hard_mask``, ``straight_through``, ``rebar_relax``, ``HybridControl``),
called here with a leading seeds dimension: logits r of shape (seeds, d), uniforms of shape
(n, seeds, d), and a differentiable batched loss f: (..., d) -> (...) such as
:class:`pbexact.benchmarks.NNLoss`. The loop is :func:`pbscale.loop.sgd`, the REBAR/RELAX set-up and
step :func:`pbscale.methods.make_control` and :func:`pbscale.methods.hybrid_gradient` (with a
control of separate weights per seed, :class:`pbscale.methods.PerSeedControl`, so that the seeds
stay independent runs); this module only wires them to the J table and the logger.

Every run uses SGD on r from theta_0 = 0.5 (r = 0, sigmoid parametrization), a ``torch.Generator``
seeded once, and logs the exact E_theta[J] of each seed from the J table (for CP, J of its hard
mask 1[r > 0], as the paper reports).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from tqdm import tqdm

from analysis.microworld_runs import DETERMINISTIC, CurveLogger, Trajectory, check_run
from pbexact.continuation import CP_FINAL_TAU
from pbexact.errors import PBInputError, check_n, check_table
from pbexact.polynomial import expected_loss
from pbexact.sampling import vertex_index
from pbexact.sgd import sgd
from pbscale.methods import (  # noqa: F401 (PerSeedMLP, RELAX_*: re-exported, moved to pbscale)
    RELAX_HIDDEN,
    RELAX_LR,
    RELAX_WEIGHT_DECAY,
    PerSeedControl,
    PerSeedMLP,
    cp_hard_mask,
    cp_step,
    cp_temperature,
    hybrid_gradient,
    make_control,
)

#: Methods run here; each needs f differentiable in z.
TORCH_METHODS = ("cp", "st", "rebar", "relax")
BatchedLoss = Callable[[torch.Tensor], torch.Tensor]


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
    control, control_opts = None, []
    if method in ("rebar", "relax"):
        control, control_opts = make_control(method, d, lr, gen, seeds=seeds)

    def losses(r: torch.Tensor) -> np.ndarray:
        if method == "cp":
            return J[vertex_index(cp_hard_mask(r).numpy())]
        return expected_loss(J, torch.sigmoid(r).numpy())

    def uniforms() -> torch.Tensor:
        return torch.rand((n, seeds, d), generator=gen, dtype=torch.float64)

    def gradient(step: int, r: torch.Tensor) -> torch.Tensor:
        if method == "cp":  # the exact losses of 1[r > 0] come from J, not from f
            tau = cp_temperature(step, steps, cp_final_tau, cp_every)
            return cp_step(f, r, tau, hard=False).grad
        return hybrid_gradient(method, f, r, uniforms, control, control_opts).grad

    logger = CurveLogger(steps, log_every)
    bar = tqdm(range(steps + 1), desc=desc, leave=False, mininterval=1.0, disable=desc is None)
    r = sgd(r, gradient, lr, bar, project=torch.Tensor.detach, what=f"the logits of {method}",
        fix="lower --lrs",
            log=lambda step, r: logger.wants(step) and logger.log(step, losses(r)))
    final_theta = cp_hard_mask(r) if method == "cp" else torch.sigmoid(r)
    return logger.trajectory(
        losses(r), final_theta.numpy(), method=method, n=n if method != "cp" else 0,
        param="sigmoid", lr=lr, seeds=seeds,
    )
