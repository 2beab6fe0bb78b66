"""Exact estimator variances along the true-gradient trajectory, the machinery of
``python -m analysis.variance``, ``analysis.variance_compare`` and ``analysis.variance_table``
(`sec:microworld_compare_estimators`, `fig:microworld_variance`).

From theta = 0.5 (sigmoid logits r = 0), follow the exact gradient of E[J] with SGD; at every
logged step compute the variance of every estimator of the registry
(`pbexact.estimators.REGISTRY`) by the chosen method (:data:`METHODS`: enumeration of the
multisets, the closed form of `pbexact.closed_form`, or Monte Carlo), the entropy of p_theta and
the expected loss (:func:`variance_trajectory`); the size and memory guards that refuse a
trajectory before any work (:func:`check_method`, :func:`check_estimators`,
:func:`check_log_memory`) and the names and digests that label its results
(:func:`table_name`, :func:`table_digest`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from tqdm import tqdm

from pbexact.closed_form import MAX_CLOSED_FORM_D, check_closed_form_size, closed_form_moments
from pbexact.errors import (
    ENUMERATION_MEMORY_LIMIT,
    PBInputError,
    check_d,
    check_learning_rate,
    format_bytes,
    multiset_count,
)
from pbexact.estimators import ESTIMATORS, check_estimator, estimators_for, get_estimator
from pbexact.parametrizations import Sigmoid
from pbexact.polynomial import entropy, expected_loss, true_gradient
from pbexact.variance import EstimatorMoments, exact_moments, mc_moments
from pbexact.vertices import check_enumeration

#: How the moments are computed (``--method``; auto: :func:`resolve_method`).
METHODS = ("auto", "enumerate", "closed", "mc")
#: auto enumerates up to this many multisets (the paper's d=4, n=4 has 3,876), else closed form.
AUTO_ENUMERATION_LIMIT = 10_000
#: Bytes per (draw, sample, bit) at the peak of one ``mc_moments`` call (measured with
#: tracemalloc: 41-42 at d = 6 and 10, n = 4 and 10, 20,000 draws; rounded up).
MC_BYTES_PER_ENTRY = 48


def moments_at(
    J: np.ndarray, r: np.ndarray, n: int, method: str, rng: np.random.Generator, draws: int
) -> dict[str, EstimatorMoments]:
    """Every estimator's moments at sigmoid logits r by the chosen method."""
    if method == "auto":
        method = resolve_method(method, int(np.log2(len(J))), n)
    if method == "enumerate":
        return exact_moments(J, r, n, "sigmoid", estimators_for(n))
    if method == "closed":
        return closed_form_moments(J, r, n, "sigmoid", estimators_for(n))
    if method == "mc":
        return mc_moments(J, r, n, draws, rng, "sigmoid", estimators_for(n))
    raise PBInputError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


def resolve_method(method: str, d: int, n: int) -> str:
    """The method ``auto`` stands for at this size; any other method unchanged."""
    if method != "auto":
        return method
    return "enumerate" if multiset_count(2**d, n) <= AUTO_ENUMERATION_LIMIT else "closed"


def mc_bytes(d: int, n: int, draws: int) -> int:
    """Peak memory of one logged step of ``--method mc``: the draws x n x d samples, their
    scores and the estimates, :data:`MC_BYTES_PER_ENTRY` bytes per (draw, sample, bit)."""
    return draws * n * d * MC_BYTES_PER_ENTRY


def check_method(method: str, d: int, n: int, draws: int = 1) -> None:
    """Fail before any work if the method cannot run at this size (``draws``: for mc)."""
    method = resolve_method(method, d, n)
    if method == "enumerate":
        check_enumeration(2**d, n)
    elif method == "closed":
        check_d(d, limit=MAX_CLOSED_FORM_D)
        check_closed_form_size(d, n)
    elif method == "mc":
        need = mc_bytes(d, n, draws)
        if need > ENUMERATION_MEMORY_LIMIT:
            most = ENUMERATION_MEMORY_LIMIT // mc_bytes(d, n, 1)
            raise PBInputError(
                f"--method mc with --draws {draws:,} at d={d}, n={n} needs about "
                f"{format_bytes(need)} per logged step, over the limit of "
                f"{format_bytes(ENUMERATION_MEMORY_LIMIT)}; use --draws {most:,} or fewer, or "
                "--method closed (exact)")
    elif method not in METHODS:
        raise PBInputError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


def check_estimators(n: int) -> None:
    """Every estimator must take n, except those that need an even n (their column is blank)."""
    for name in ESTIMATORS:
        if not get_estimator(name).even:
            check_estimator(name, n)


def variance_trajectory(
    J: np.ndarray,
    n: int,
    steps: int = 10_000,
    log_every: int = 100,
    lr: float = 0.1,
    method: str = "auto",
    draws: int = 10_000,
    seed: int = 0,
    desc: str = "",
) -> list[dict[str, float]]:
    """Rows ``step, loss, entropy, var_<estimator>..., theta_1..theta_d`` along the trajectory;
    one var column per registered estimator, None (a blank CSV cell) where it is not defined for
    this n (DisARM at odd n)."""
    d = int(np.log2(len(J)))
    lr = check_learning_rate(lr)
    check_estimators(n)
    check_method(method, d, n, draws)
    method = resolve_method(method, d, n)
    param = Sigmoid()
    rng = np.random.default_rng(seed)
    r = np.zeros(d)
    rows = []
    # step 0's moments before the progress bar starts: the first call compiles the Numba
    # kernels (seconds), which would otherwise make the bar's rate and ETA absurd
    first = moments_at(J, r, n, method, rng, draws)
    for step in tqdm(range(steps + 1), desc=desc, leave=False, mininterval=0.5, disable=not desc):
        theta = param.theta(r)
        if step % log_every == 0 or step == steps:
            moments = first if step == 0 else moments_at(J, r, n, method, rng, draws)
            row = {
                "step": step,
                "loss": float(expected_loss(J, theta)),
                "entropy": float(entropy(theta)),
            }
            row.update({f"var_{k}": moments[k].total_variance if k in moments else None
                        for k in ESTIMATORS})
            row.update({f"theta_{i + 1}": float(t) for i, t in enumerate(theta)})
            rows.append(row)
        r = r - lr * param.chain(true_gradient(J, theta), r)
        if not np.all(np.isfinite(r)):
            raise PBInputError(
                f"the logits became NaN or inf at step {step + 1}: the learning rate {lr:g} is "
                f"too large for the table's values (max |J| = {np.abs(J).max():.3g}); lower --lr "
                "or rescale the table"
            )
    return rows


#: Peak bytes per logged row and bit (a dict of d + 8 Python floats, its CSV line, the figure's
#: arrays), a bound: the rows of every table are kept until its CSV is written.
ROW_BYTES_PER_COLUMN = 128


def check_log_memory(steps: int, log_every: int, d: int,
                     limit: int = ENUMERATION_MEMORY_LIMIT) -> None:
    """Refuse, before any work, a trajectory whose logged rows pass ``limit`` bytes, naming the
    --log-every that fits."""
    rows = steps // log_every + 2
    need = rows * (d + 8) * ROW_BYTES_PER_COLUMN
    if need > limit:
        every = -(-steps * (d + 8) * ROW_BYTES_PER_COLUMN // limit)
        raise PBInputError(
            f"--steps {steps:,} logged every {log_every:,} step(s) keeps {rows:,} rows of "
            f"{d + 8} values, about {format_bytes(need)}, over the limit of "
            f"{format_bytes(limit)}; use --log-every {every:,} or more, or fewer --steps")


def table_name(path: Path, d: int) -> str:
    """The name a ``--table`` file gives its results: its stem without a trailing ``_d{d}`` or
    ``_d{d}_table`` (``rand_d6.csv`` and ``rand_d6_table.csv`` give ``rand``, whose results are
    ``rand_d6_n4_variance.*``: d is not repeated; ``my_table.csv`` gives ``my_table``)."""
    for suffix in (f"_d{d}_table", f"_d{d}"):
        if path.stem.endswith(suffix) and path.stem != suffix:
            return path.stem.removesuffix(suffix)
    return path.stem


def table_digest(J: np.ndarray) -> str:
    """The first 16 hex digits of the SHA-256 of a J table's float64 bytes (recorded with the
    results it gave: another table, same settings otherwise, is refused)."""
    data = np.ascontiguousarray(J, dtype=np.float64).tobytes()
    return hashlib.sha256(data).hexdigest()[:16]
