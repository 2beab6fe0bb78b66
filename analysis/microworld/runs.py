"""Vectorized microworld training runs on an exact J table (`sec:microworld`).

Every run starts at theta_0 = 0.5 and takes plain SGD steps r <- project(r - lr g) on the logits;
all seeds of one run advance together as a leading batch dimension (seeds, ...), with one
``numpy.random.Generator`` drawing the samples of every seed at once, so a run is reproducible
bit for bit from its seed. The logged curve is the exact expected loss E_theta[J] of each seed
(`eq:equivalence`), computed by the exact core from the 2^d table.

Gradient sources ("methods") of the exact core:
* every estimator of the registry (`pbexact.estimators.REGISTRY`: ``reinforce``, ``loorf``,
  ``arms``, ``betastar``, ``disarm``): the score-function estimators of `ch:monte_carlo` from n
  samples per step and seed, drawn by the estimator's law (pbexact.estimators via
  pbexact.variance.apply_estimator);
* ``true``: the exact gradient (`eq:true_as_avg`), n -> infinity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from pbexact.errors import ENUMERATION_MEMORY_LIMIT, PBInputError, check_table, format_bytes
from pbexact.estimators import ESTIMATORS, check_estimator, get_estimator
from pbexact.parametrizations import Parametrization, get_parametrization
from pbexact.polynomial import expected_loss, true_gradient
from pbexact.sampling import sample_law, vertex_index
from pbexact.sgd import sgd
from pbexact.variance import apply_estimator, estimator_extra
from pbscale.methods import names

#: The exact gradient as a gradient source (`eq:true_as_avg`), beside the estimators.
TRUE = "true"
#: Gradient sources of the exact core: the MC estimators and the exact gradient.
EXACT_METHODS = (*ESTIMATORS, TRUE)
#: Methods whose runs draw no random numbers: every seed would follow the same trajectory (the
#: exact gradient and the deterministic methods of pbscale's registry).
DETERMINISTIC = (TRUE, *names("microworld", deterministic=True))


@dataclass
class Trajectory:
    """One method's run over all seeds.

    steps: logged iterations (T,); mean, stderr: mean and standard error over seeds of the exact
    expected loss at those steps (T,); final: per-seed loss after the last step (seeds,);
    final_theta: per-seed probabilities after the last step (seeds, d) (for CP its hard mask).
    """

    steps: np.ndarray
    mean: np.ndarray
    stderr: np.ndarray
    final: np.ndarray
    final_theta: np.ndarray
    meta: dict = field(default_factory=dict)

    def mean_from(self, step: int) -> float:
        """Average of the seed-mean curve over logged steps >= ``step`` (the selection rule of
        `sec:microworld_exp_approaches`)."""
        keep = self.steps >= step
        return float(self.mean[keep].mean())


class CurveLogger:
    """Collects the per-seed loss every ``log_every`` steps (and at the last) as mean and standard
    error, so memory is O(T + seeds) rather than O(T seeds)."""

    def __init__(self, steps: int, log_every: int) -> None:
        self.total = steps
        self.log_every = log_every
        self.steps: list[int] = []
        self.mean: list[float] = []
        self.stderr: list[float] = []

    def wants(self, step: int) -> bool:
        return step % self.log_every == 0 or step == self.total

    def log(self, step: int, losses: np.ndarray) -> None:
        losses = np.asarray(losses, dtype=np.float64).reshape(-1)
        self.steps.append(step)
        self.mean.append(float(losses.mean()))
        se = losses.std(ddof=1) / math.sqrt(losses.size) if losses.size > 1 else 0.0
        self.stderr.append(float(se))

    def trajectory(self, final: np.ndarray, final_theta: np.ndarray, **meta) -> Trajectory:
        return Trajectory(
            np.array(self.steps), np.array(self.mean), np.array(self.stderr),
            np.asarray(final, dtype=np.float64).reshape(-1), np.asarray(final_theta), dict(meta),
        )


def check_run(steps: int, seeds: int, log_every: int, lr: float) -> None:
    """Fail before any work on a bad run setting."""
    if not isinstance(steps, int) or steps < 0:
        raise PBInputError(f"the number of steps must be an integer >= 0, got {steps!r}; "
                           "give steps >= 0")
    if not isinstance(seeds, int) or seeds < 1:
        raise PBInputError(f"the number of seeds must be an integer >= 1, got {seeds!r}; "
                           "give seeds >= 1")
    if not isinstance(log_every, int) or log_every < 1:
        raise PBInputError(f"--log-every must be an integer >= 1, got {log_every!r}; give 1 "
                           "or more")
    if not (math.isfinite(lr) and lr > 0):
        raise PBInputError(f"the learning rate must be a positive number, got {lr!r}; give "
                           "e.g. 0.1")


#: Peak bytes per logged point of one run's curve (the curves held until the figures are drawn,
#: their CSV rows, the figure): measured with tracemalloc, about 300 for ``estimators`` at d = 3,
#: 5,000 steps logged at every step, 13 runs on 2 benchmarks; rounded up.
LOGGED_POINT_BYTES = 512
#: Bytes per (seed, sample, bit) of one step's samples: a lower bound, the samples, their scores
#: and the score-weighted losses are float64 arrays of that shape.
SAMPLE_BYTES = 24


def check_run_memory(steps: int, log_every: int, runs: int, seeds: int, n: int, d: int,
                     limit: int = ENUMERATION_MEMORY_LIMIT) -> None:
    """Refuse, before any work, ``runs`` runs of ``steps`` steps logged every ``log_every``
    (their curves are kept to the end) or steps of ``seeds`` x ``n`` samples of d bits whose
    memory passes ``limit``, naming what it would take and the flag that lowers it."""
    points = steps // log_every + 2
    need = points * runs * LOGGED_POINT_BYTES
    if need > limit:
        every = -(-steps * runs * LOGGED_POINT_BYTES // limit)
        raise PBInputError(
            f"--steps {steps:,} logged every {log_every:,} step(s) keeps {points:,} points of "
            f"each of {runs} curves, about {format_bytes(need)}, over the limit of "
            f"{format_bytes(limit)}; use --log-every {every:,} or more, or fewer --steps")
    need = seeds * n * d * SAMPLE_BYTES
    if need > limit:
        raise PBInputError(
            f"{seeds:,} seeds x n={n:,} samples of d={d} bits take at least "
            f"{format_bytes(need)} per step, over the limit of {format_bytes(limit)}; lower "
            "--n or --seeds")


def check_method(method: str, n: int) -> None:
    """A gradient source of the exact core and its number of samples."""
    if method == TRUE:
        return
    if method not in EXACT_METHODS:
        raise PBInputError(
            f"unknown method {method!r}; choose one of {', '.join(EXACT_METHODS)}"
        )
    check_estimator(method, n)


def exact_core_gradient(
    J: np.ndarray,
    r: np.ndarray,
    method: str,
    n: int,
    param: Parametrization,
    rng: np.random.Generator,
) -> np.ndarray:
    """One gradient estimate over the logits for every seed: r of shape (seeds, P) -> (seeds, P).

    MC estimators draw n samples per seed at once from ``rng`` by the estimator's law
    (`pbexact.sampling.sample_law`): ARMS from the Dirichlet copula (`alg:orig_arms`), DisARM in
    antithetic pairs, the others iid.
    """
    theta = param.theta(r)
    if method == TRUE:
        return param.chain(true_gradient(J, theta), r)
    z = sample_law(get_estimator(method).law, theta, n, (), rng)  # (seeds, n, d)
    S = param.score(z, r[..., None, :])  # (seeds, n, P)
    extra = estimator_extra(method, J, theta, n, param)
    return apply_estimator(method, J[vertex_index(z)], S, extra)


def run_exact(
    J: np.ndarray,
    method: str,
    n: int = 1,
    parametrization: str | Parametrization = "sigmoid",
    lr: float = 0.1,
    steps: int = 10_000,
    seeds: int = 100,
    seed: int = 0,
    log_every: int = 1,
    desc: str | None = None,
    theta0: float = 0.5,
) -> Trajectory:
    """SGD on the logits of ``parametrization`` with the gradients of ``method`` (an estimator of
    `ch:monte_carlo` from n samples, or ``true``) for all seeds at once, from theta = theta0.

    J: table of shape (2^d,). The curve is E_theta[J] per seed, logged every ``log_every`` steps.
    Deterministic methods (``true``) run a single seed: the others would repeat it.
    """
    J = check_table(J)
    d = J.shape[0].bit_length() - 1
    check_run(steps, seeds, log_every, lr)
    check_method(method, n)
    param = get_parametrization(parametrization)
    if method in DETERMINISTIC:
        seeds = 1
    rng = np.random.default_rng(seed)
    r = param.logits(np.full((seeds, d), theta0))
    logger = CurveLogger(steps, log_every)
    bar = tqdm(range(steps + 1), desc=desc, leave=False, mininterval=1.0, disable=desc is None)
    r = sgd(r, lambda step, r: exact_core_gradient(J, r, method, n, param, rng), lr, bar,
            project=param.project, what=f"the logits of {method} ({param.name})",
            fix="lower --lrs",
            log=lambda step, r: logger.wants(step) and logger.log(
                step, expected_loss(J, param.theta(r))))
    theta = param.theta(r)
    return logger.trajectory(
        expected_loss(J, theta), theta, method=method, n=n, param=param.name, lr=lr, seeds=seeds
    )


def found_optimum(J: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Whether each run's final distribution found z* = argmin J: p_theta(z*) > 1/2, i.e. z* is
    the vertex it samples more often than all others together. theta (seeds, d) -> (seeds,)."""
    J = check_table(J)
    d = theta.shape[-1]
    z_star = (int(np.argmin(J)) >> np.arange(d)) & 1
    p = np.prod(np.where(z_star == 1, theta, 1 - theta), axis=-1)
    return p > 0.5


