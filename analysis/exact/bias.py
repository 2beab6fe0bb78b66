"""The exact bias and mean squared error of the biased gradient estimators along the
true-gradient trajectory (``python -m analysis.bias`` is its command line and its figures):
each estimator as a rule over pbscale's own code (:data:`BIASED`: ST-theta, ST, CP, the
concrete relaxations, REBAR/RELAX as a check), its exact moments at a point (:func:`per_sample`,
:func:`estimator_moments`: every vertex with its probability, quadrature nodes or Monte Carlo
draws), the rows of a study at a logged step beside the unbiased estimators' exact variances
(:func:`rows_at`, :func:`bias_study`) and the break-even n (:func:`break_even_rows`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from pbexact.bias import (
    BiasSummary,
    Moments,
    UnbiasedVariance,
    break_even_n,
    quadrature_moments,
    stratified_moments,
    vertex_uniforms,
    weighted_moments,
)
from pbexact.continuation import CP_EVERY, CP_FINAL_TAU
from pbexact.errors import PBInputError
from pbexact.estimators import get_estimator
from pbexact.parametrizations import Parametrization
from pbexact.polynomial import entropy, expected_loss, true_gradient, vertex_probabilities
from pbexact.relaxations import (
    HC_BETA,
    MAX_TENSOR_D,
    Relaxation,
    coordinate_rule,
    get_relaxation,
    multilinear_relaxed_moments,
    relaxed_gradients,
    tensor_rule,
)
from pbexact.sgd import sgd
from pbexact.vertices import vertices
from pbscale.methods import (
    RELAX_HIDDEN,
    HybridControl,
    cp_step,
    cp_temperature,
    rebar_relax,
    straight_through,
)
from pbscale.methods.beyond import st_theta

#: Largest d: the exact rows enumerate the 2^d vertices (the issue's d <= 12).
MAX_BIAS_D = 12
#: The unbiased estimators set beside the biased ones, at their exact variances.
UNBIASED = ("loorf", "arms", "disarm")
#: How each law of noise is integrated (the ``kind`` of a row, `pbexact.bias.KINDS`).
NOISES = ("none", "vertices", "uniform", "uniform2")
#: Gauss-Legendre nodes per panel of the 1-D integrals of a relaxation on a multilinear
#: extension (d of them, so they are cheap; the error bar compares with half as many).
MULTILINEAR_NODES = 64


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``count`` inside the block, restored after (the
    estimators here make many small autograd calls, which more threads only slow down)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Setting:
    """What the estimators need beyond J, r and the parametrization: CP's temperature at this
    step (``tau``), the relaxations' temperature ``beta``, the REBAR/RELAX controls (fixed, at
    their initialization from ``control_seed``: unbiased for any control), the quadrature nodes
    per panel (``nodes`` for tensor products, ``nodes_1d`` for the one-dimensional integrals of
    a multilinear extension; each error bar compares with half as many) and the Monte Carlo
    draws and generator."""

    tau: float = 1.0
    beta: float = HC_BETA
    nodes: int = 4
    nodes_1d: int = MULTILINEAR_NODES
    mc_samples: int = 4000
    seed: int = 0
    control_seed: int = 0
    generator: torch.Generator = field(default_factory=torch.Generator)
    controls: dict[str, HybridControl] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.generator.manual_seed(self.seed)

    def control(self, kind: str, d: int) -> HybridControl:
        if kind not in self.controls:
            gen = torch.Generator().manual_seed(self.control_seed)
            self.controls[kind] = HybridControl(kind, d, hidden=RELAX_HIDDEN, generator=gen
                                                ).to(torch.float64)
        return self.controls[kind]

    def relaxation(self, name: str) -> Relaxation:
        return get_relaxation(name, self.beta)

    def uniforms(self, rows: int, d: int) -> torch.Tensor:
        return torch.rand((rows, d), generator=self.generator, dtype=torch.float64)


#: A per-sample rule: (f, logits r (P,) as a tensor, parametrization, setting, uniforms u and
#: v (N, d) or None) -> one estimate per row, (N, P) (one row when deterministic).
Rule = Callable[..., torch.Tensor]


def st_theta_rule(f: Any, r: torch.Tensor, param: Parametrization, setting: Setting,
                  u: torch.Tensor, v: Any = None) -> torch.Tensor:
    """pbscale's ``st_theta`` (Zhou et al.) on the rows of u: one logit row per sample, and
    st_theta's mean over the rows' losses undone."""
    est, _ = st_theta(f, r.expand(u.shape[0], r.shape[-1]).clone(), param, u)
    return est.grad * u.shape[0]


def st_rule(f: Any, r: torch.Tensor, param: Parametrization, setting: Setting,
            u: torch.Tensor, v: Any = None) -> torch.Tensor:
    """pbscale's ``straight_through`` (`ch:other`), one sample per row of u."""
    return straight_through(f, r, u[None]).grad


def cp_rule(f: Any, r: torch.Tensor, param: Parametrization, setting: Setting,
            u: Any = None, v: Any = None) -> torch.Tensor:
    """pbscale's ``cp_step`` at CP's logits x = tau r, whose relaxed mask sigmoid(x / tau) is
    theta, times tau: the gradient in the sigmoid logits r (the same at every tau)."""
    tau = setting.tau
    return tau * cp_step(f, tau * r[None], tau, hard=False).grad


def cp_anneal_rule(f: Any, r: torch.Tensor, param: Parametrization, setting: Setting,
                   u: Any = None, v: Any = None) -> torch.Tensor:
    """pbscale's ``cp_step`` on the trajectory's logits r at the step's temperature tau."""
    return cp_step(f, r[None], setting.tau, hard=False).grad


def relaxation_rule(name: str) -> Rule:
    """The pathwise gradient through the relaxation ``name`` at the setting's beta
    (`pbexact.relaxations.relaxed_gradients`), one sample per row of u."""

    def rule(f: Any, r: torch.Tensor, param: Parametrization, setting: Setting,
             u: torch.Tensor, v: Any = None) -> torch.Tensor:
        return relaxed_gradients(f, r, u, setting.relaxation(name))

    return rule


def hybrid_rule(f: Any, r: torch.Tensor, param: Parametrization, setting: Setting,
                u: torch.Tensor, v: torch.Tensor, kind: str = "rebar") -> torch.Tensor:
    """pbscale's ``rebar_relax`` with the setting's control of ``kind``: one logit row per
    sample, so each row's gradient sees its own sample only."""
    rows = r.expand(u.shape[0], r.shape[-1]).clone()
    return rebar_relax(f, rows, u[None], v[None], setting.control(kind, r.shape[-1]))[0].grad


@dataclass(frozen=True)
class BiasedEstimator:
    """One biased (or hybrid) estimator: its per-sample ``rule``, its noise (``none``:
    deterministic; ``vertices``: z ~ Bern(theta), enumerated; ``uniform``: u ~ U(0, 1)^d, by
    quadrature or Monte Carlo; ``uniform2``: two such, Monte Carlo), whether it runs on sigmoid
    logits only, its relaxation (concrete or hard concrete) if any, its paper label or
    reference, colour and marker. Adding one is one entry of :data:`BIASED`."""

    name: str
    label: str
    rule: Rule
    noise: str
    sigmoid_only: bool = True
    relaxation: str | None = None
    reference: str = ""
    color: str = ""
    marker: str = "o"


#: Every biased estimator, by name, in table order.
BIASED: dict[str, BiasedEstimator] = {
    spec.name: spec
    for spec in (
        BiasedEstimator("st-theta", "ST-θ (Zhou)", st_theta_rule, "vertices",
                        sigmoid_only=False, reference="Zhou et al. 2019; pbscale st-theta",
                        color="C9", marker="P"),
        BiasedEstimator("st", "ST", st_rule, "vertices", reference="ch:other", color="C5",
                        marker="s"),
        BiasedEstimator("cp", "CP (mask θ)", cp_rule, "none", reference="eq:sigmoid_cp",
                        color="C4", marker="D"),
        BiasedEstimator("cp-anneal", "CP (τ path)", cp_anneal_rule, "none",
                        reference="eq:sigmoid_cp", color="C3", marker="d"),
        BiasedEstimator("concrete", "concrete", relaxation_rule("concrete"), "uniform",
                        relaxation="concrete", reference="ch:other (Gumbel-softmax)",
                        color="C7", marker="^"),
        BiasedEstimator("hardconcrete", "hard concrete", relaxation_rule("hardconcrete"),
                        "uniform", relaxation="hardconcrete", reference="Louizos et al. 2018",
                        color="C8", marker="v"),
        BiasedEstimator("rebar", "REBAR", functools.partial(hybrid_rule, kind="rebar"),
                        "uniform2", reference="ch:other", color="C6", marker="X"),
        BiasedEstimator("relax", "RELAX", functools.partial(hybrid_rule, kind="relax"),
                        "uniform2", reference="ch:other", color="C2", marker="*"),
    )
}


def per_sample(spec: BiasedEstimator, f: Any, r: np.ndarray, param: Parametrization,
               setting: Setting, u: torch.Tensor | None = None,
               v: torch.Tensor | None = None) -> np.ndarray:
    """The estimates of ``spec`` (one per row of the uniforms u, v (N, d); one row when
    deterministic) at logits r (P,), by its rule (pbscale's implementation); shape (N, P)."""
    rt = torch.as_tensor(r, dtype=torch.float64)
    return spec.rule(f, rt, param, setting, u, v).detach().numpy()


def estimator_moments(spec: BiasedEstimator, f: Any, J: np.ndarray, r: np.ndarray,
                      param: Parametrization, setting: Setting) -> Moments:
    """Mean and variance of one sample of ``spec`` at logits r (P,): exact over the vertices
    or for a deterministic estimate; for a relaxation exact up to 1-D quadrature when f is
    multilinear (`pbexact.relaxations.multilinear_relaxed_moments`), by tensor quadrature up to
    d = MAX_TENSOR_D when f is smooth (``f.smooth``), else Monte Carlo (NNLoss: its dJ/dz
    jumps where a LeakyReLU changes side, so Gauss-Legendre rules converge slowly and their
    error estimate |Q_k - Q_{k/2}| is not a bound, while a standard error is); REBAR and RELAX
    by Monte Carlo."""
    d = J.shape[0].bit_length() - 1
    if spec.noise == "none":
        return weighted_moments(per_sample(spec, f, r, param, setting), np.ones(1))
    if spec.noise == "vertices":
        u, p = vertex_uniforms(param.theta(r))
        g = per_sample(spec, f, r, param, setting, torch.as_tensor(u))
        return weighted_moments(g, p)
    if spec.noise == "uniform" and spec.relaxation is not None:
        relax = setting.relaxation(spec.relaxation)
        if getattr(f, "multilinear", False):
            fine, coarse = (Moments(*multilinear_relaxed_moments(J, r, relax, k), "quadrature")
                            for k in (setting.nodes_1d, max(setting.nodes_1d // 2, 1)))
            return quadrature_moments(fine, coarse)
        if d <= MAX_TENSOR_D and getattr(f, "smooth", False):
            rules = []
            for k in (setting.nodes, max(setting.nodes // 2, 1)):
                u, w = tensor_rule(*coordinate_rule(relax, r, k))
                g = per_sample(spec, f, r, param, setting, torch.as_tensor(u))
                rules.append(weighted_moments(g, w, "quadrature"))
            return quadrature_moments(*rules)
    u, stratum, prob = vertex_strata(param.theta(r), setting)
    v = setting.uniforms(u.shape[0], d) if spec.noise == "uniform2" else None
    return stratified_moments(per_sample(spec, f, r, param, setting, u, v), stratum, prob)


def vertex_strata(theta: np.ndarray, setting: Setting
                  ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """Uniforms u (N, d) drawn by strata, one per vertex h of the hypercube (`pbexact.vertices`
    order): u_i uniform on (1 - theta_i, 1) where h_i = 1 and on (0, 1 - theta_i) where h_i = 0,
    so that the discrete sample b = 1[u > 1 - theta] of REBAR and RELAX is h (and a relaxed
    sample falls on h's side of 1/2). Any function of u has the mean sum_h p_h E[. | stratum h],
    so every Monte Carlo row is drawn this way. A vertex of
    probability p_h gets max(2, ceil(M p_h)) draws (M = ``mc_samples``): a rare sample (theta
    near a vertex), whose estimate is large, is always drawn and weighted by p_h, instead of
    appearing in 4000 draws once or never (the skewness that made a z-test on plain draws
    invalid there). Returns u, each row's stratum and the strata's probabilities."""
    theta = np.asarray(theta, dtype=np.float64)
    d = theta.shape[-1]
    prob = vertex_probabilities(theta)
    counts = np.where(prob > 0, np.maximum(2, np.ceil(setting.mc_samples * prob)), 0)
    stratum = np.repeat(np.arange(prob.size), counts.astype(int))
    w = setting.uniforms(stratum.size, d).numpy()
    h = vertices(d)[stratum]
    u = np.where(h == 1, (1 - theta) + theta * w, (1 - theta) * w)
    return torch.as_tensor(u), stratum, prob


def applicable(names: Sequence[str], param: Parametrization) -> tuple[str, ...]:
    """The biased estimators of ``names`` that run under ``param`` (all but ST-theta need
    sigmoid logits)."""
    return tuple(k for k in names if param.name == "sigmoid" or not BIASED[k].sigmoid_only)


def check_estimators(names: Sequence[str], param: Parametrization, explicit: bool) -> None:
    """Unknown names, and sigmoid-only estimators asked for by name under another
    parametrization, are refused."""
    for name in names:
        if name not in BIASED:
            raise PBInputError(f"unknown biased estimator {name!r}; choose from "
                               f"{', '.join(BIASED)} (or all)")
        if explicit and BIASED[name].sigmoid_only and param.name != "sigmoid":
            raise PBInputError(f"{name} runs on sigmoid logits only; use --parametrization "
                               f"sigmoid or leave {name} out of --estimators")


def rows_at(step: int, f: Any, J: np.ndarray, r: np.ndarray, param: Parametrization,
            setting: Setting, names: Sequence[str], ns: Sequence[int]
            ) -> tuple[list[dict[str, Any]], dict[str, BiasSummary], dict[str, UnbiasedVariance]]:
    """The CSV rows of one logged step (one per biased and unbiased estimator), the biased
    estimators' summaries and the unbiased estimators' variances as functions of n."""
    theta = param.theta(r)
    true = param.chain(true_gradient(J, theta), r)
    base = {"step": step, "tau": setting.tau, "loss": float(expected_loss(J, theta)),
            "entropy": float(entropy(theta)), "grad_norm": float(np.linalg.norm(true))}
    rows, summaries = [], {}
    for name in names:
        s = BiasSummary(estimator_moments(BIASED[name], f, J, r, param, setting), true)
        summaries[name] = s
        mc = s.moments.kind == "mc"
        rows.append({**base, "estimator": name, "kind": s.moments.kind,
                     "samples": s.moments.samples, "bias_norm": s.bias_norm,
                     "bias_error": s.bias_norm_error, "cosine": s.cosine, "trace_cov": s.trace,
                     "trace_error": s.trace_error if mc else "",
                     **{f"mse_n{n}": s.mse(n) for n in ns},
                     **{f"mse_error_n{n}": s.mse_error(n) if mc else "" for n in ns},
                     "zero_bias_p": s.zero_bias_pvalue,
                     "bias_detectable": s.detectable_bias() if mc else ""})
    variances = {name: UnbiasedVariance(name, J, r, param) for name in UNBIASED}
    for name, var in variances.items():
        spec = get_estimator(name)
        rows.append({**base, "estimator": name, "kind": "exact", "samples": "",
                     "bias_norm": 0.0, "bias_error": 0.0, "cosine": 1.0, "trace_cov": "",
                     "trace_error": "",
                     **{f"mse_n{n}": var(n) if spec.accepts(n) else "" for n in ns},
                     **{f"mse_error_n{n}": "" for n in ns},
                     "zero_bias_p": "", "bias_detectable": ""})
    return rows, summaries, variances


def break_even_rows(step: int, summaries: dict[str, BiasSummary],
                    variances: dict[str, UnbiasedVariance], ns: Sequence[int]
                    ) -> list[dict[str, Any]]:
    """For each biased estimator and n: its MSE and the smallest n at which each unbiased
    estimator's exact variance is at most that MSE (blank: not by n = 10^6, or never for an
    MSE of 0); for a Monte Carlo row also that n at the MSE plus and minus two of its error
    bars (``<name>_low``, ``<name>_high``: the range the row's sampling error allows)."""
    def found(target: float, spec: Any, var: UnbiasedVariance) -> int | str:
        if not target > 0:
            return ""
        first = spec.min_samples + (spec.min_samples % 2 if spec.even else 0)
        n_found = break_even_n(target, var, first, 2 if spec.even else 1)
        return "" if n_found is None else n_found

    out = []
    for name, s in summaries.items():
        mc = s.moments.kind == "mc"
        for n in ns:
            target, err = s.mse(n), s.mse_error(n)
            row = {"step": step, "estimator": name, "kind": s.moments.kind, "n": n,
                   "mse": target, "mse_error": err if mc else ""}
            for other, var in variances.items():
                spec = get_estimator(other)
                row[other] = found(target, spec, var)
                row[f"{other}_low"] = found(target + 2 * err, spec, var) if mc else ""
                row[f"{other}_high"] = found(target - 2 * err, spec, var) if mc else ""
            out.append(row)
    return out


#: What the break-even tables' numbers mean, under their title.
BREAK_EVEN_NOTE = ("Each cell: the fewest samples at which LOORF / ARMS / DisARM, at their exact "
                   "variance, reach the biased estimator's MSE at that n. 2 is the fewest they "
                   "take (a 2: two samples or fewer would do); — : the MSE is 0 or not reached "
                   "by n = 10^6; (a-b) on a Monte Carlo row: the same n at its MSE plus and "
                   "minus two error bars.")


def break_even_markdown(rows: list[dict[str, Any]], ns: Sequence[int], title: str) -> str:
    """The break-even table as Markdown: one row per step and estimator, one column per n,
    each cell 'LOORF / ARMS / DisARM' (— where not reached by n = 10^6 or the MSE is 0; a
    Monte Carlo row's cell with each n's range over the MSE +- 2 error bars)."""
    head = ["step", "estimator", "kind"] + [f"n = {n}" for n in ns]
    lines = [f"{title}\n", BREAK_EVEN_NOTE + "\n", "| " + " | ".join(head) + " |",
             "|" + " --- |" * len(head)]
    keyed = {(r["step"], r["estimator"], r["n"]): r for r in rows}

    def text(r: dict, k: str) -> str:
        if r[k] == "":
            return "—"
        low, high = r.get(f"{k}_low", ""), r.get(f"{k}_high", "")
        if r["kind"] != "mc" or (low, high) in ((r[k], r[k]), ("", "")):
            return f"{r[k]:,}"
        return f"{r[k]:,} ({low:,}-{high:,})" if low != "" and high != "" else (
            f"{r[k]:,} ({low or '—'}-{high or '—'})")

    for step, name in dict.fromkeys((r["step"], r["estimator"]) for r in rows):
        cells = []
        for n in ns:
            r = keyed[(step, name, n)]
            cells.append(" / ".join(text(r, k) for k in UNBIASED))
        lines.append(f"| {step:,} | {BIASED[name].label} | {keyed[(step, name, ns[0])]['kind']} "
                     f"| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def logged_steps(steps: int, log_every: int) -> list[int]:
    """The steps a study logs: 0, 1, 2, 5, 10, 20, 50, ... (the early steps, where the
    estimators differ most, on the figure's log axis), every ``log_every``, and the last."""
    early = {m * 10**e for e in range(len(str(steps))) for m in (1, 2, 5)}
    grid = early | set(range(0, steps + 1, log_every)) | {0, steps}
    return sorted(s for s in grid if s <= steps)


def trajectory(J: np.ndarray, param: Parametrization, steps: int, log_every: int, lr: float
               ) -> list[tuple[int, np.ndarray]]:
    """The logged (step, logits) of SGD with the exact gradient of E[J] from theta = 0.5
    (:func:`logged_steps`)."""
    logged: list[tuple[int, np.ndarray]] = []
    wanted = set(logged_steps(steps, log_every))
    d = J.shape[0].bit_length() - 1

    def log(step: int, r: np.ndarray) -> None:
        if step in wanted:
            logged.append((step, r.copy()))

    sgd(param.logits(np.full(d, 0.5)), lambda step, r: param.chain(
        true_gradient(J, param.theta(r)), r), lr, steps, project=param.project, log=log,
        what=f"the logits ({param.name})", fix="lower --lr")
    return logged


def bias_study(f: Any, J: np.ndarray, param: Parametrization, names: Sequence[str],
               ns: Sequence[int], steps: int, log_every: int, lr: float, table_steps: Sequence[int],
               setting: Setting, cp_final_tau: float = CP_FINAL_TAU, cp_every: int = CP_EVERY,
               desc: str | None = None) -> tuple[list[dict], list[dict]]:
    """The rows of the bias CSV along the trajectory and of the break-even table."""
    rows, table = [], []
    logged = trajectory(J, param, steps, log_every, lr)
    for step, r in tqdm(logged, desc=desc, leave=False,  # a bar on a terminal only
                        disable=True if desc is None else None):
        setting.tau = cp_temperature(step, steps, cp_final_tau, cp_every)
        step_rows, summaries, variances = rows_at(step, f, J, r, param, setting, names, ns)
        rows += step_rows
        if step in table_steps:
            table += break_even_rows(step, summaries, variances, ns)
    return rows, table
