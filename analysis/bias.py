"""The exact bias and mean squared error of the biased gradient estimators along the
true-gradient trajectory, beside the exact variances of LOORF, ARMS and DisARM (beyond the
paper, which never measures how biased ST, CP or the relaxations are).

    python -m analysis.bias --d 10                        # both benchmarks, sigmoid, results/
    python -m analysis.bias --d 4 --benchmark nnloss      # a smaller instance
    python -m analysis.bias --d 10 --parametrization escort   # ST-theta only, beside MC

From theta = 0.5, follow the exact gradient of E[J] with SGD (as `analysis.variance` does);
at every logged step compute, for one sample of each biased estimator, E[g] and tr Cov[g]
(`pbexact.bias`), then the bias norm ||E[g] - grad||, the cosine between E[g] and the true
gradient, and the MSE ||b||^2 + tr Cov / n at each n of --n; the unbiased estimators' rows hold
their exact variance at n (`pbexact.closed_form`). The estimators are pbscale's own
(`pbscale.methods`: ``st_theta``, ``straight_through``, ``cp_step``, ``rebar_relax``; the
relaxations of `pbexact.relaxations`), evaluated on every vertex with its probability (exact),
on quadrature nodes, or on Monte Carlo draws (with a standard error). J's extension to the
hypercube is the network itself for NNLoss and the multilinear polynomial P_J for the tabular
ExponentialTabularLoss (which the paper calls not differentiable).

Writes under --out: ``B_dD_PARAM_bias.csv`` (one row per step and estimator) and ``.png``, and
``B_dD_PARAM_break_even.csv`` and ``.md``: at each of --table-steps, the n at which LOORF, ARMS
and DisARM reach each biased estimator's MSE at each n.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from analysis.cli import atomic_write_text, output_folders, run, save_figure, write_csv
from pbexact.bias import (
    BiasSummary,
    Moments,
    MultilinearExtension,
    UnbiasedVariance,
    break_even_n,
    quadrature_moments,
    stratified_moments,
    vertex_uniforms,
    weighted_moments,
)
from pbexact.cli import (
    ArgumentParser,
    int_at_least,
    nonneg_int,
    positive_float,
    positive_int,
    positive_int_list,
)
from pbexact.continuation import CP_EVERY, CP_FINAL_TAU
from pbexact.errors import PBInputError, check_d, check_learning_rate
from pbexact.estimators import get_estimator
from pbexact.instances import BENCHMARKS, NNLoss, exponential_tabular_loss
from pbexact.parametrizations import PARAMETRIZATIONS, Parametrization, get_parametrization
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
from pbscale.runs.runtime import set_threads

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
    for step, r in tqdm(logged, desc=desc, leave=False, disable=desc is None):
        setting.tau = cp_temperature(step, steps, cp_final_tau, cp_every)
        step_rows, summaries, variances = rows_at(step, f, J, r, param, setting, names, ns)
        rows += step_rows
        if step in table_steps:
            table += break_even_rows(step, summaries, variances, ns)
    return rows, table


#: Bias norms below this fraction of the smallest ||grad|| (relative MSE below its square) are
#: drawn on the bottom edge of the figure: zeros to round-off.
PLOT_FLOOR = 1e-4


#: How each unbiased estimator's exact variance is drawn: its own colour, line and marker.
UNBIASED_STYLE = {"loorf": dict(color="0.1", ls="--", marker="x"),
                  "arms": dict(color="tab:brown", ls="-.", marker="+"),
                  "disarm": dict(color="tab:olive", ls=(0, (1, 1.5)), marker="1")}


def plot_bias(rows: list[dict], ns: Sequence[int], title: str,
              table: Sequence[dict] = ()) -> Any:
    """Bias norm (with each estimated row's error level dotted) and cosine of each biased
    estimator against the step, E[J], the MSE at each n relative to ||grad||^2 (1 = as far
    off as a zero gradient) beside the unbiased estimators' exact variance, log axes, and the
    break-even n of LOORF at the ``table`` rows' steps (:func:`break_even_rows`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["estimator"] for r in rows))
    panels = 3 + len(ns) + (1 if table else 0)
    cols = 3
    fig, axes = plt.subplots((panels + cols - 1) // cols, cols, figsize=(13, 3.3 * (
        (panels + cols - 1) // cols)), squeeze=False)
    axes = axes.ravel()
    steps = sorted({r["step"] for r in rows})
    x = np.array([max(s, 0.5) for s in steps])

    def series(name: str, column: str) -> np.ndarray:
        by = {r["step"]: r[column] for r in rows if r["estimator"] == name}
        return np.array([np.nan if by[s] in ("", None) else float(by[s]) for s in steps])

    grad2 = series(names[0], "grad_norm") ** 2
    # zeros to round-off (an exact, unbiased row) sit on the bottom edge, not 20 decades down
    bias_floor = PLOT_FLOOR * np.sqrt(np.nanmin(grad2))
    for name in names:
        if name in BIASED:
            spec = BIASED[name]
            style = dict(color=spec.color, marker=spec.marker, ms=4, lw=1.2, mfc="none",
                         label=spec.label, markevery=max(1, len(steps) // 12),
                         ls="--" if name == "cp-anneal" else "-")
            b, e = series(name, "bias_norm"), series(name, "bias_error")
            axes[0].plot(x, np.maximum(b, bias_floor), **style)
            # below its dotted line a bias is not told from zero; error levels under the floor
            # (a quadrature error of 1e-17) are not drawn, so they do not stretch the axis
            level = np.where(2 * e > bias_floor, 2 * e, np.nan)
            if np.any(np.isfinite(level)):
                axes[0].plot(x, level, color=spec.color, ls=":", lw=0.9)
            axes[1].plot(x, series(name, "cosine"), **style)
        else:
            est = get_estimator(name)
            style = dict(**UNBIASED_STYLE.get(name, dict(color="0.35", ls="--", marker=".")),
                         lw=1.1, ms=5, markevery=max(1, len(steps) // 8),
                         label=f"{est.label} (exact variance)")
        for k, n in enumerate(ns):
            m = series(name, f"mse_n{n}") / grad2
            axes[3 + k].plot(x, np.maximum(m, PLOT_FLOOR**2), **style)
    axes[0].plot(x, np.sqrt(grad2), "k-", lw=2, alpha=0.3, label="||true gradient||")
    axes[0].set_ylim(bottom=bias_floor / 2)
    axes[2].plot(x, [r["loss"] for r in rows if r["estimator"] == names[0]], "k-", lw=1.2)
    axes[0].set(yscale="log", ylabel="||E[g] - grad||",
                title="bias norm (dotted: 2 error bars; grey: ||grad||)")
    axes[1].set(ylabel="cos(E[g], grad)", title="cosine with the true gradient",
                ylim=(-1.05, 1.05))
    axes[2].set(ylabel="E_theta[J]", title="expected loss along the trajectory")
    for k, n in enumerate(ns):
        axes[3 + k].axhline(1.0, color="k", lw=0.6)
        axes[3 + k].set(yscale="log", ylabel="MSE / ||grad||^2",
                        title=f"relative MSE at n = {n}")
    for ax in axes[:3 + len(ns)]:
        ax.set(xscale="log", xlabel="step (log; step 0 at 1/2)")
    if table:
        plot_break_even(axes[3 + len(ns)], table, ns)
    for ax in axes[panels:]:
        ax.axis("off")
    handles, labels = axes[3].get_legend_handles_labels()
    extra = axes[0].get_legend_handles_labels()
    fig.legend(handles + extra[0][-1:], labels + extra[1][-1:], loc="lower center",
               ncol=6, fontsize=8, frameon=False)
    fig.suptitle(f"{title}\n(zero to round-off: on the bottom edge, {PLOT_FLOOR:g} of "
                 "||grad|| or of ||grad||^2)")
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    return fig


def plot_break_even(ax: Any, table: Sequence[dict], ns: Sequence[int]) -> None:
    """The break-even n of LOORF (:func:`break_even_rows`) for each biased estimator: one
    marker per (table step, n), log axis; a Monte Carlo row's range as a bar; an MSE of 0 or
    one not reached by n = 10^6 is left out (the tables say which)."""
    names = list(dict.fromkeys(r["estimator"] for r in table))
    table_steps = list(dict.fromkeys(r["step"] for r in table))
    markers = "osD^v"
    for i, step in enumerate(table_steps):
        for k, n in enumerate(ns):
            pts = [(j, r) for j, name in enumerate(names) for r in table
                   if r["estimator"] == name and r["step"] == step and r["n"] == n
                   and r["loorf"] != ""]
            if not pts:
                continue
            xs = [j + 0.12 * (k - (len(ns) - 1) / 2) + 0.04 * i for j, _ in pts]
            ys = [float(r["loorf"]) for _, r in pts]
            low = [float(r["loorf_low"]) if r.get("loorf_low") not in ("", None) else y
                   for (_, r), y in zip(pts, ys)]
            high = [float(r["loorf_high"]) if r.get("loorf_high") not in ("", None) else y
                    for (_, r), y in zip(pts, ys)]
            ax.errorbar(xs, ys, yerr=[np.subtract(ys, low), np.subtract(high, ys)],
                        fmt=markers[k % len(markers)], ms=4, lw=0.8, capsize=2,
                        color=f"C{i}", mfc="none" if i else None,
                        label=f"step {step:,}, n = {n}")
    ax.set_xticks(range(len(names)), [BIASED[n].label for n in names], rotation=45,
                  fontsize=7, ha="right")
    ax.set(yscale="log", ylabel="LOORF samples",
           title="break-even n: LOORF samples for the same MSE (2 is the fewest)")
    ax.legend(fontsize=6, ncol=2)


def step_list(text: str) -> list[int]:
    """argparse type: comma-separated steps (integers >= 0), e.g. ``0,1000``."""
    parts = [x.strip() for x in text.split(",")]
    if not text.strip() or not all(parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated steps like 0,1000, got "
                                         f"{text!r}")
    return [nonneg_int(x) for x in parts]


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m analysis.bias",
        description="Exact bias, cosine and MSE of the biased estimators (ST-theta, ST, CP, "
        "concrete, hard concrete; REBAR and RELAX as an unbiased check) along the "
        "true-gradient trajectory, beside the exact variances of LOORF, ARMS and DisARM, and "
        "the n at which those match them.",
    )
    p.add_argument("--benchmark", choices=(*BENCHMARKS, "all"), default="all",
                   help="the instance (default all: exponential and nnloss)")
    p.add_argument("--d", type=positive_int, default=10,
                   help=f"number of bits, at most {MAX_BIAS_D} (default 10)")
    p.add_argument("--seed", type=nonneg_int, default=0,
                   help="seed of the benchmark instance (default 0)")
    p.add_argument("--parametrization", choices=tuple(PARAMETRIZATIONS), default="sigmoid",
                   help="theta(r) of tab:alternative_param; all but ST-theta need sigmoid")
    p.add_argument("--estimators", default="all",
                   help="comma-separated biased estimators among " + ", ".join(BIASED)
                   + " (default all that run under the parametrization)")
    p.add_argument("--n", type=positive_int_list, default=[1, 10, 100],
                   help="samples per estimate of the MSE columns (default 1,10,100)")
    p.add_argument("--steps", type=nonneg_int, default=10_000, help="SGD steps (default 10,000)")
    p.add_argument("--log-every", type=positive_int, default=1000,
                   help="steps between logged points, besides 1, 2, 5, 10, 20, 50, ... "
                   "(default 1000)")
    p.add_argument("--lr", type=positive_float, default=0.1, help="SGD learning rate")
    p.add_argument("--table-steps", type=step_list, default=[0, 1000],
                   help="logged steps of the break-even table (default 0,1000)")
    p.add_argument("--beta", type=positive_float, default=HC_BETA,
                   help="temperature of the concrete and hard-concrete relaxations "
                   "(default 2/3 = 0.666667, Louizos et al.)")
    p.add_argument("--cp-final-tau", type=positive_float, default=CP_FINAL_TAU,
                   help="CP's last temperature, the paper's 1/200")
    p.add_argument("--cp-every", type=positive_int, default=CP_EVERY,
                   help="steps between CP temperature updates")
    p.add_argument("--nodes", type=int_at_least(2), default=4,
                   help="Gauss-Legendre nodes per panel of the relaxations' tensor-product "
                   "quadrature (smooth extensions, d <= 4); the "
                   "error bar compares with half as many (default 4)")
    p.add_argument("--mc-samples", type=int_at_least(2), default=4000,
                   help="Monte Carlo draws per step where no exact rule applies (default 4000)")
    p.add_argument("--mc-seed", type=nonneg_int, default=0,
                   help="seed of the Monte Carlo draws and of the RELAX control (default 0)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch CPU threads (default 1: the work is many small autograd calls, "
                   "which more threads slow down)")
    p.add_argument("--out", default="results", help="output folder")
    p.add_argument("--figures", default=None,
                   help="also copy the figures, CSVs and tables here (docs/bias.md: --figures "
                   "figures/bias; default: only --out)")
    return p


#: Peak memory of one Monte Carlo draw per bit of d (the estimates and their autograd graph;
#: measured: REBAR on NNLoss at d = 12 peaks at 24-33 KB a draw, concrete at 5.4 KB).
BYTES_PER_DRAW_BIT = 3000


def check_draw_memory(mc_samples: int, d: int) -> None:
    """Refuse (one line, before any work) --mc-samples whose draws cannot be held in memory:
    a row evaluates all its draws at once (REBAR and RELAX: at least 2 per vertex more), about
    :data:`BYTES_PER_DRAW_BIT` x d bytes each, which must fit in the free memory."""
    from pbexact.errors import format_bytes
    from pbscale.methods.samplers import free_memory

    free = free_memory("cpu")
    per_draw = BYTES_PER_DRAW_BIT * d
    draws = mc_samples + 2 * 2 ** d
    if draws * per_draw <= free:
        return
    largest = max(free // per_draw - 2 * 2 ** d, 0)
    raise PBInputError(f"--mc-samples {mc_samples:,} draws at d = {d} need about "
                       f"{format_bytes(draws * per_draw)} (about {format_bytes(per_draw)} a "
                       f"draw), more than the {format_bytes(free)} free; lower --mc-samples to "
                       f"at most {largest:,}")


def parse_estimators(text: str, param: Parametrization) -> tuple[str, ...]:
    if text.strip() == "all":
        return applicable(tuple(BIASED), param)
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if not names:
        raise PBInputError("--estimators is empty; name some of " + ", ".join(BIASED))
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PBInputError(f"--estimators names {twice[0]} more than once; name each once")
    check_estimators(names, param, explicit=True)
    return names


def check_table_steps(table_steps: Sequence[int], steps: int, log_every: int) -> None:
    """Each step of the break-even table must be a logged one."""
    logged = logged_steps(steps, log_every)
    for s in table_steps:
        if s not in logged:
            raise PBInputError(f"--table-steps {s} is not a logged step; use one of 0, 1, 2, 5, "
                               f"10, ... or a multiple of --log-every {log_every} up to --steps "
                               f"{steps}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    d = check_d(args.d)
    if d > MAX_BIAS_D:
        raise PBInputError(f"--d {d} is above {MAX_BIAS_D}: the exact rows enumerate the 2^d "
                           f"vertices; use --d {MAX_BIAS_D} or less")
    check_learning_rate(args.lr)
    param = get_parametrization(args.parametrization)
    names = parse_estimators(args.estimators, param)
    check_table_steps(args.table_steps, args.steps, args.log_every)
    if not 0 < args.cp_final_tau <= 1:
        raise PBInputError(f"--cp-final-tau must be in (0, 1], got {args.cp_final_tau}; use a "
                           f"temperature at most 1 (the paper's {CP_FINAL_TAU:g})")
    check_draw_memory(args.mc_samples, d)
    folders = output_folders(args.out, args.figures)
    set_threads(args.threads)
    benches = BENCHMARKS if args.benchmark == "all" else (args.benchmark,)
    for bench in benches:
        if bench == "nnloss":
            f: Any = NNLoss(d, args.seed)
            J = f.table()
        else:
            J = exponential_tabular_loss(d, args.seed)
            f = MultilinearExtension(J)
        setting = Setting(beta=args.beta, nodes=args.nodes, mc_samples=args.mc_samples,
                          seed=args.mc_seed, control_seed=args.mc_seed)
        start, cpu = time.perf_counter(), time.process_time()
        rows, table = bias_study(f, J, param, names, args.n, args.steps, args.log_every,
                                 args.lr, args.table_steps, setting, args.cp_final_tau,
                                 args.cp_every, desc=f"{bench} d={d}")
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        stem = f"{bench}_d{d}_{param.name}"
        title = (f"{bench}, d={d}, {param.name}: bias and MSE of one-sample estimators along "
                 f"the true-gradient trajectory (beta={args.beta:.3g})")
        md = break_even_markdown(
            table, args.n, f"Break-even n of LOORF / ARMS / DisARM (`python -m analysis.bias "
            f"--benchmark {bench} --d {d} --parametrization {param.name}`):")
        fig = plot_bias(rows, args.n, title, table)
        for folder in folders:
            write_csv(folder / f"{stem}_bias.csv", list(rows[0]),
                      [list(r.values()) for r in rows])
            write_csv(folder / f"{stem}_break_even.csv", list(table[0]) if table else ["step"],
                      [list(r.values()) for r in table])
            atomic_write_text(folder / f"{stem}_break_even.md", md)
        save_figure(fig, [folder / f"{stem}_bias.png" for folder in folders])
        first = {r["estimator"]: r for r in rows if r["step"] == 0}
        print(f"{bench}: at step 0, bias norm " + ", ".join(
            f"{k}={first[k]['bias_norm']:.3g}" for k in names) + f" (||grad|| = "
            f"{first[names[0]]['grad_norm']:.3g})" if names else f"{bench}: no biased rows")
        logged = len({r["step"] for r in rows})
        print(f"  {logged} logged steps (trajectory, rows and break-even table) in "
              f"{seconds:.1f} s ({cpu:.1f} s CPU); wrote {folders[0] / (stem + '_bias.csv')}, "
              ".png, and _break_even.csv/.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))

