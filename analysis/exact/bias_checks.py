"""The checks of the estimators that differentiate J (``python -m analysis.theorems``; beyond
the paper, `ch:other`, `eq:sigmoid_cp`): ST's bias (:func:`check_st_bias`), CP's relaxed
gradient (:func:`check_cp_relaxation`) and REBAR's and RELAX's unbiasedness
(:func:`check_hybrid_unbiased`), each estimator as :mod:`analysis.exact.bias` computes it. Each
returns a :class:`analysis.exact.check_result.CheckResult` or a list of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from analysis.exact.check_result import ALPHA, CheckResult, error_result, random_table
from pbexact.parametrizations import PARAMETRIZATIONS, get_parametrization
from pbexact.polynomial import true_gradient

# ---------------------------------------------------------------------------------------------
# ch:other, eq:sigmoid_cp: the bias of ST, CP, REBAR and RELAX (beyond the paper)
# ---------------------------------------------------------------------------------------------


#: ST's relative bias must be at least this on a non-multilinear extension (NNLoss).
ST_BIAS_FLOOR = 1e-3


def st_theta_moments(f: Any, J: np.ndarray, r: np.ndarray, param: Any) -> Any:
    """Exact moments of one ST-theta estimate (pbscale's ``st_theta``, Zhou et al.) on the
    extension f at logits r, by enumerating the 2^d vertices (`pbexact.bias`)."""
    from analysis.exact.bias import BIASED, Setting, estimator_moments

    return estimator_moments(BIASED["st-theta"], f, J, r, param, Setting())


def _st_variance_closed_form(A: np.ndarray, theta: np.ndarray, r: np.ndarray, param: Any
                             ) -> np.ndarray:
    """Per-logit variance of ST-theta on z^T A z + b^T z: diag(S diag(theta (1-theta)) S)
    (`pbexact.bias.st_quadratic_moments`) times (d theta / d r)^2."""
    from pbexact.bias import st_quadratic_moments

    _, cov = st_quadratic_moments(A, np.zeros(theta.shape), theta)
    return param.expand(np.diag(cov)) * param.dtheta_dr(r) ** 2


def _one_thread(check: Callable[..., Any]) -> Callable[..., Any]:
    """Run a check with one torch thread (`analysis.exact.bias.torch_threads`): its many small
    autograd calls run fastest that way."""
    import functools

    @functools.wraps(check)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        from analysis.exact.bias import torch_threads

        with torch_threads(1):
            return check(*args, **kwargs)

    return wrapped


@_one_thread
def check_st_bias(
    rng: np.random.Generator,
    instances: int,
    max_d: int,
    nets: int = 2,
    moments: Callable[..., Any] = st_theta_moments,
    closed_form: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> list[CheckResult]:
    """ST (`ch:other`) on theta, exact by enumeration over the vertices, three ways:
    (1) unbiased when J's extension is multilinear (random tables, every parametrization);
    (2) biased on NNLoss, a non-multilinear extension: ||b|| / ||grad|| >= ST_BIAS_FLOOR on
    ``nets`` networks (d = 2, 3, ...) at random theta; ``worst`` counts the instances below;
    (3) on J(z) = z^T A z + b^T z its bias equals ``closed_form`` (default
    `pbexact.bias.st_quadratic_bias`, A_kk (2 theta_k - 1)) times d theta / d r, and its
    variance the closed form S diag(theta (1 - theta)) S (S = A + A^T). ``moments``: the
    estimator's exact moments (f, J, r, param) -> `pbexact.bias.Moments`."""
    from pbexact.bias import MultilinearExtension, QuadraticLoss, st_quadratic_bias
    from pbexact.instances import NNLoss

    closed_form = closed_form or st_quadratic_bias
    names = list(PARAMETRIZATIONS)
    worst_ml = worst_quad = 0.0
    for _ in range(instances):
        d = int(rng.integers(1, max_d + 1))
        param = get_parametrization(names[int(rng.integers(len(names)))])
        theta = rng.uniform(0.05, 0.95, size=d)
        r = param.logits(theta)
        J = random_table(rng, d)
        truth = param.chain(true_gradient(J, theta), r)
        m = moments(MultilinearExtension(J), J, r, param)
        worst_ml = max(worst_ml, float(np.abs(m.mean - truth).max() / np.abs(J).max()))
        A, b = rng.normal(size=(d, d)), rng.normal(size=d)
        quad = QuadraticLoss(A, b)
        Jq = quad.table()
        m = moments(quad, Jq, r, param)
        bias = m.mean - param.chain(true_gradient(Jq, theta), r)
        scale = np.abs(A).max() + np.abs(b).max()
        err = max(np.abs(bias - param.chain(closed_form(A, theta), r)).max(),
                  np.abs(m.variance - _st_variance_closed_form(A, theta, r, param)).max()
                  / scale)
        worst_quad = max(worst_quad, float(err / scale))
    below, ratios = 0, []
    param = get_parametrization("sigmoid")
    for k in range(nets):
        net = NNLoss(2 + k, int(rng.integers(2**31)))
        J = net.table()
        theta = rng.uniform(0.1, 0.9, size=net.d)
        r = param.logits(theta)
        truth = param.chain(true_gradient(J, theta), r)
        m = moments(net, J, r, param)
        ratio = float(np.linalg.norm(m.mean - truth) / np.linalg.norm(truth))
        ratios.append(ratio)
        below += int(ratio < ST_BIAS_FLOOR)
    sizes = f"{instances} instances, d=1..{max_d}, 4 parametrizations"
    return [
        error_result("ch:other", "ST on theta unbiased on the multilinear extension: exact "
                      "E[g] (vertex enumeration) = true gradient", sizes, worst_ml, 1e-12),
        error_result("ch:other", f"ST on theta biased on NNLoss (not multilinear): "
                      f"||b|| / ||grad|| >= {ST_BIAS_FLOOR:g} (worst: instances below)",
                      f"{nets} networks, d=2..{nets + 1}", below, 0, ratios=ratios),
        error_result("ch:other", "ST bias on J = z^T A z + b^T z: enumeration = closed form "
                      "A_kk (2 theta_k - 1) dtheta/dr; variance = diag(S diag(theta(1-theta)) S)",
                      sizes, worst_quad, 1e-12),
    ]


def cp_relaxed_gradient(f: Any, r: np.ndarray, tau: float) -> np.ndarray:
    """CP's gradient d/dr f(sigmoid(r / tau)) at logits r (d,) (pbscale's ``cp_step``)."""
    from analysis.exact.bias import BIASED, Setting, per_sample

    return per_sample(BIASED["cp-anneal"], f, r, get_parametrization("sigmoid"),
                      Setting(tau=tau))[0]


def deceiving_squared_loss(z: Any) -> Any:
    """`ex:deceiving_squared` (`pbexact.continuation.DECEIVING_SQUARED`) as a batched torch loss
    (..., 1) -> (...), differentiable: 2 - 12.5 (z - 0.4)^2 below 0.4, 2 - (z - 0.4)^2 / 0.36
    above."""
    import torch

    from pbexact.continuation import DECEIVING_SQUARED

    (brk,), (c_lo, c_hi) = DECEIVING_SQUARED.breaks, DECEIVING_SQUARED.coeffs
    x = z[..., 0] - brk
    return torch.where(x < 0, c_lo[0] + c_lo[2] * x * x, c_hi[0] + c_hi[2] * x * x)


@_one_thread
def check_cp_relaxation(
    rng: np.random.Generator,
    instances: int,
    max_d: int,
    temperatures: int = 8,
    reference: Callable[[np.ndarray, np.ndarray, float], np.ndarray] | None = None,
    counter_example: Callable[[Any], Any] = deceiving_squared_loss,
) -> list[CheckResult]:
    """CP's relaxed gradient against the true gradient (`eq:sigmoid_cp`, `sec:pb_application`).

    (1) With the multilinear extension P_J, f(sigmoid(r / tau)) = E_{Bern(sigmoid(r/tau))}[J]
    (`eq:equivalence`), so CP's gradient equals ``reference`` (default
    `pbexact.bias.tempered_true_gradient`: the true gradient at theta = sigmoid(r / tau), by
    enumeration) at every tau of CP's schedule (1 to 1/200), on random tables and logits;
    the paper's limit J(sigmoid(x / tau)) -> J(1[x > 0]) is the tau -> 0 end of it.
    (2) The counter-example where J's extension is not multilinear: `ex:deceiving_squared`
    (``counter_example``) from CP's start r = 0 has sigmoid(0 / tau) = 1/2 > 0.4 for every tau,
    where its derivative is negative while J(1) - J(0) = 1 > 0: the relaxed gradient points
    against the true one (cosine -1) at every tau; ``worst`` counts the tau where it does not."""
    import torch

    from pbexact.bias import MultilinearExtension, tempered_true_gradient
    from pbexact.continuation import exponential_schedule

    reference = reference or tempered_true_gradient
    taus = exponential_schedule(temperatures)
    worst = 0.0
    for _ in range(instances):
        d = int(rng.integers(1, max_d + 1))
        J = random_table(rng, d)
        r = rng.normal(scale=2.0, size=d)
        f = MultilinearExtension(J)
        for tau in taus:
            want = reference(J, r, tau)
            got = cp_relaxed_gradient(f, r, tau)
            scale = np.abs(J).max() / (4 * tau)  # the largest the gradient can be
            worst = max(worst, float(np.abs(got - want).max() / scale))
    table = counter_example(torch.tensor([[0.0], [1.0]], dtype=torch.float64)).numpy()
    r = np.zeros(1)
    cosines = []
    for tau in taus:
        got = cp_relaxed_gradient(counter_example, r, tau)
        want = tempered_true_gradient(table, r, tau)
        cosines.append(float(np.sign(got @ want)))
    wrong_way = sum(c != -1.0 for c in cosines)
    return [
        error_result("eq:sigmoid_cp", "CP's relaxed gradient d/dr P_J(sigmoid(r/tau)) = "
                      "grad_r E_{sigmoid(r/tau)}[J] (multilinear extension), every tau of the "
                      "schedule; error relative to max|J| / (4 tau)",
                      f"{instances} instances, d=1..{max_d}, {temperatures} tau from 1 to 1/200",
                      worst, 1e-12),
        error_result("eq:sigmoid_cp", "counter-example ex:deceiving_squared (not multilinear):"
                      " from r = 0 the relaxed gradient opposes the true one at every tau "
                      "(worst: tau where it does not)", f"{temperatures} tau", wrong_way, 0,
                      cosines=cosines),
    ]


def rebar_relax_estimates(kind: str, f: Any, r: np.ndarray, u: Any, v: Any,
                          log_tau: float, eta: float) -> np.ndarray:
    """One REBAR or RELAX estimate per row of u, v (M, d) (pbscale's ``rebar_relax``) with its
    control's log tau and eta set (RELAX's network from seed 0): shape (M, d)."""
    import torch

    from analysis.exact.bias import BIASED, Setting, per_sample

    setting = Setting()
    control = setting.control(kind, r.shape[-1])
    with torch.no_grad():
        control.log_tau.fill_(log_tau)
        if control.eta is not None:
            control.eta.fill_(eta)
    return per_sample(BIASED[kind], f, r, get_parametrization("sigmoid"), setting, u, v)


@_one_thread
def check_hybrid_unbiased(
    rng: np.random.Generator,
    instances: int,
    max_d: int,
    samples: int,
    estimates: Callable[..., np.ndarray] = rebar_relax_estimates,
) -> CheckResult:
    """REBAR and RELAX (`ch:other`) are unbiased for any control: the mean of ``samples``
    estimates against the exact true gradient, per-coordinate z-tests with the sample standard
    error, Bonferroni over instances, coordinates and the two estimators; random multilinear
    tables, logits and control temperatures (log tau in [-1, 1], eta in [0.5, 1.5])."""
    import torch

    from pbexact.bias import BiasSummary, MultilinearExtension, mc_moments

    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    pvals = []
    for _ in range(instances):
        d = int(rng.integers(1, max_d + 1))
        J = random_table(rng, d)
        r = rng.normal(size=d)
        sigmoid = get_parametrization("sigmoid")
        truth = sigmoid.chain(true_gradient(J, sigmoid.theta(r)), r)
        for kind in ("rebar", "relax"):
            u = torch.rand((samples, d), generator=gen, dtype=torch.float64)
            v = torch.rand((samples, d), generator=gen, dtype=torch.float64)
            g = estimates(kind, MultilinearExtension(J), r, u, v, rng.uniform(-1, 1),
                          rng.uniform(0.5, 1.5))
            pvals.append(BiasSummary(mc_moments(g), truth).zero_bias_pvalue)
    level = ALPHA / len(pvals)
    p = float(min(pvals))
    return CheckResult("ch:other", "REBAR and RELAX unbiased: Monte Carlo mean = true gradient "
                       "(z-tests, Bonferroni over coordinates)",
                       f"{instances} instances x 2 estimators, d=1..{max_d}, {samples} samples",
                       p, level, "p-value", p >= level)
