"""The deterministic continuation-path (CP) algorithm `alg:cp_alg` for scalar examples, with the
sigmoid homotopy of `eq:sigmoid_cp`, and the two 1-d counter-examples of `sec:cp_drawbacks`.

This is the small exact version used to reproduce `ex:deceiving_piecewise` and
`ex:deceiving_squared`: one real x, z = sigmoid(x / tau), plain gradient descent on
J(sigmoid(x / tau)) for a fixed number of iterations per temperature. The stochastic,
neural-network-scale CP lives in ``pbscale``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .errors import PBInputError

ScalarFn = Callable[[np.ndarray], np.ndarray]


def sigmoid(x: np.ndarray | float) -> np.ndarray:
    """Logistic sigmoid, computed without overflow for large |x|."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def logit(p: float) -> float:
    """Inverse of the sigmoid, log(p / (1 - p))."""
    return float(np.log(p) - np.log1p(-p))


@dataclass(frozen=True)
class PiecewiseFunction:
    """A continuous piecewise-polynomial J on the real line: piece k holds on
    [breaks[k-1], breaks[k]) and is sum_j coeffs[k][j] (z - centers[k])^j."""

    breaks: tuple[float, ...]
    centers: tuple[float, ...]
    coeffs: tuple[tuple[float, ...], ...]

    def _piece(self, z: np.ndarray) -> np.ndarray:
        return np.searchsorted(np.asarray(self.breaks), z, side="right")

    def __call__(self, z: np.ndarray | float) -> np.ndarray:
        z = np.asarray(z, dtype=np.float64)
        k = self._piece(z)
        out = np.zeros_like(z)
        for piece, (c0, cs) in enumerate(zip(self.centers, self.coeffs)):
            val = sum(c * (z - c0) ** j for j, c in enumerate(cs))
            out = np.where(k == piece, val, out)
        return out

    def derivative(self, z: np.ndarray | float) -> np.ndarray:
        z = np.asarray(z, dtype=np.float64)
        k = self._piece(z)
        out = np.zeros_like(z)
        for piece, (c0, cs) in enumerate(zip(self.centers, self.coeffs)):
            val = sum(j * c * (z - c0) ** (j - 1) for j, c in enumerate(cs) if j > 0)
            out = np.where(k == piece, val, out)
        return out


#: `ex:deceiving_piecewise`, the function commented out in the paper's source: J(0) = -1 < J(1) = 1,
#: yet J' = -2 (pointing descent toward z = 1) except on [0.125, 0.13) and [0.87, 0.875), where
#: J' = 398.
DECEIVING_PIECEWISE = PiecewiseFunction(
    breaks=(0.125, 0.13, 0.87, 0.875),
    centers=(0.0, 0.0, 0.0, 0.0, 0.0),
    coeffs=((-1.0, -2.0), (-51.0, 398.0), (1.0, -2.0), (-347.0, 398.0), (3.0, -2.0)),
)

#: `ex:deceiving_squared`, also from the source: J(0) = 0 < J(1) = 1, but J' < 0 for z > 0.4.
DECEIVING_SQUARED = PiecewiseFunction(
    breaks=(0.4,),
    centers=(0.4, 0.4),
    coeffs=((2.0, 0.0, -12.5), (2.0, 0.0, -1 / 0.36)),
)


#: CP's last temperature (`sec:app_microworld_hypers`: exponential decay from 1 to 1/200); the one
#: definition every CP schedule (pbexact, pbscale, analysis) takes its default from.
CP_FINAL_TAU = 1 / 200
#: Iterations between two updates of CP's temperature in the trained runs
#: (`sec:app_microworld_hypers`): tau is updated every CP_EVERY mask-training steps.
CP_EVERY = 100


def exponential_temperature(k: int, count: int, final: float = CP_FINAL_TAU) -> float:
    """tau_k = final^(k / (K - 1)) of K = ``count`` temperatures (1 for K = 1): the one
    definition of CP's exponential schedule (`sec:app_microworld_hypers`)."""
    return 1.0 if count == 1 else final ** (k / (count - 1))


def exponential_schedule(num_temperatures: int, final: float = CP_FINAL_TAU) -> np.ndarray:
    """tau_k = final^(k / (K - 1)), k = 0, ..., K - 1, from 1 down to ``final``
    (:func:`exponential_temperature`, shape (K,))."""
    if num_temperatures < 1:
        raise PBInputError(f"need at least one temperature, got {num_temperatures}; "
                           "give 1 or more")
    if not 0 < final <= 1:
        raise PBInputError(f"the final temperature must be in (0, 1], got {final}; "
                           "give e.g. 1/200")
    return np.array([exponential_temperature(k, num_temperatures, final)
                     for k in range(num_temperatures)])


@dataclass(frozen=True)
class CPRun:
    """Runs of `alg:cp_alg`; arrays have shape (steps,) + shape of x0, one entry per gradient
    step (after the step)."""

    x: np.ndarray
    tau: np.ndarray  # shape (steps,)
    z_relaxed: np.ndarray  # sigmoid(x / tau)
    loss_discrete: np.ndarray  # J(1[x > 0]), what the paper plots


def run_cp(
    J: PiecewiseFunction,
    x0: float | np.ndarray,
    lr: float,
    taus: np.ndarray,
    iters_per_temperature: int = 100,
) -> CPRun:
    """`alg:cp_alg` with H(x, tau) = d/dx J(sigmoid(x / tau)) (`eq:sigmoid_cp`): for each tau,
    ``iters_per_temperature`` steps of gradient descent x <- x - lr J'(z) z (1 - z) / tau, warm
    started from the previous temperature's x. An array x0 runs independent starts at once."""
    if iters_per_temperature < 1:
        raise PBInputError(
            f"need at least one iteration per temperature, got {iters_per_temperature}; give 1 "
            "or more"
        )
    if not np.isfinite(lr) or lr <= 0:
        raise PBInputError(f"the learning rate must be positive, got {lr}; give a finite "
                           "number > 0")
    x = np.array(x0, dtype=np.float64)
    xs, ts = [], []
    for tau in np.asarray(taus, dtype=np.float64):
        for _ in range(iters_per_temperature):
            z = sigmoid(x / tau)
            x = x - lr * J.derivative(z) * z * (1 - z) / tau
            xs.append(x)
            ts.append(tau)
    xs_arr, ts_arr = np.array(xs), np.array(ts)
    return CPRun(
        x=xs_arr,
        tau=ts_arr,
        z_relaxed=sigmoid(xs_arr / ts_arr.reshape((-1,) + (1,) * x.ndim)),
        loss_discrete=J((xs_arr > 0) * 1.0),
    )
