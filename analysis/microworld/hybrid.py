"""Vectorized microworld runs of the methods that differentiate J: the methods of pbscale's
registry that run in the microworld (CP, ST, REBAR and RELAX; `sec:microworld_exp_approaches`,
`ch:other`, `sec:app_microworld_hypers`).

The estimators are pbscale's, reached through each method's
:class:`pbscale.methods.registry.Family` (``make_control``, ``vector_gradient``, ``run_theta``)
with a leading seeds dimension: logits r of shape (seeds, d), uniforms of shape (n, seeds, d), and
a differentiable batched loss f: (..., d) -> (...) such as :class:`pbexact.instances.NNLoss`.
REBAR/RELAX use a control of separate weights per seed (:class:`pbscale.methods.PerSeedControl`,
from ``make_control``), so that the seeds stay independent runs. The loop is
:func:`pbexact.sgd.sgd`; this module only wires them to the J table and the logger.

Every run uses SGD on r from theta_0 = 0.5 (r = 0, sigmoid parametrization), a ``torch.Generator``
seeded once, and logs the exact E_theta[J] of each seed from the J table (for CP, J of its hard
mask 1[r > 0], as the paper reports).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from tqdm import tqdm

from analysis.microworld.runs import CurveLogger, Trajectory, check_run
from pbexact.continuation import CP_EVERY, CP_FINAL_TAU
from pbexact.errors import PBInputError, check_n, check_table
from pbexact.polynomial import expected_loss
from pbexact.sampling import vertex_index
from pbexact.sgd import sgd
from pbscale.methods import cp_temperature, get_family, names

#: Methods run here (pbscale's registry, command "microworld"); each needs f differentiable in z.
TORCH_METHODS = names("microworld")
#: Those that draw nothing (one seed; their logged loss is J of their hard mask).
DETERMINISTIC_TORCH = names("microworld", deterministic=True)
BatchedLoss = Callable[[torch.Tensor], torch.Tensor]


def check_torch_method(method: str, n: int) -> None:
    """A method of :data:`TORCH_METHODS` and its number of samples per step."""
    if method not in TORCH_METHODS:
        raise PBInputError(f"unknown method {method!r}; choose one of {', '.join(TORCH_METHODS)}")
    family = get_family(method)
    if family.caps.min_samples is not None:
        check_n(n, family.text, family.caps.min_samples)


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
    cp_every: int = CP_EVERY,
) -> Trajectory:
    """SGD on sigmoid logits r (seeds, d), r_0 = 0, with the gradients of ``method`` (one of
    :data:`TORCH_METHODS`) on the differentiable loss f, whose J table of shape (2^d,) gives the
    logged exact losses. CP anneals tau from 1 to ``cp_final_tau`` every ``cp_every``
    iterations and is deterministic, so it runs one seed; REBAR/RELAX train their controls
    with Adam on the single-sample variance proxy (pbscale's recipe), log tau and eta at the
    method's lr."""
    J = check_table(J)
    d = J.shape[0].bit_length() - 1
    check_run(steps, seeds, log_every, lr)
    check_torch_method(method, n)
    family = get_family(method)
    if family.caps.deterministic:
        seeds = 1
    gen = torch.Generator().manual_seed(seed)
    r = torch.zeros((seeds, d), dtype=torch.float64)
    control, control_opts = family.make_control(d, lr, gen, seeds=seeds)

    def losses(r: torch.Tensor) -> np.ndarray:
        theta = family.run_theta(r).numpy()
        if family.caps.deterministic:  # the exact losses of the hard mask come from J, not from f
            return J[vertex_index(theta)]
        return expected_loss(J, theta)

    def uniforms() -> torch.Tensor:
        return torch.rand((n, seeds, d), generator=gen, dtype=torch.float64)

    def gradient(step: int, r: torch.Tensor) -> torch.Tensor:
        tau = cp_temperature(step, steps, cp_final_tau, cp_every)
        return family.vector_gradient(f, r, uniforms, control, control_opts, tau)

    logger = CurveLogger(steps, log_every)
    bar = tqdm(range(steps + 1), desc=desc, leave=False, mininterval=1.0, disable=desc is None)
    r = sgd(r, gradient, lr, bar, project=torch.Tensor.detach, what=f"the logits of {method}",
            fix="lower --lrs",
            log=lambda step, r: logger.wants(step) and logger.log(step, losses(r)))
    return logger.trajectory(
        losses(r), family.run_theta(r).numpy(), method=method,
        n=n if family.caps.min_samples is not None else 0, param="sigmoid", lr=lr, seeds=seeds,
    )
