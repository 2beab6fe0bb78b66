"""The paper's counter-examples and illustrations, redrawn from code, each as a PNG in
--out (``--out figures`` for the committed ones) with its data as a CSV of the same stem.

    python -m analysis.counterexamples --out figures      # every figure
    python -m analysis.counterexamples --only deceiving_piecewise_runs theta_dep_ill

Figures (paper label -> file stem):
  fig:sig_per_temp            sig_per_temp
  fig:different_J             different_J
  fig:collapse_of_j           collapse_of_j
  sb:deceiving_piecewise/_squared (the second figure labelled fig:sig_per_temp)  deceiving_J
  fig:deceiving_piecewise_runs  deceiving_piecewise_runs   (ex:deceiving_piecewise)
  ex:deceiving_squared        deceiving_squared_runs
  fig:theta_dep_ill           theta_dep_ill
  tab:mc_bad_gen_2            tab_mc_bad_gen_2 (CSV and Markdown, no PNG)
  cor:mc_bad_gen_2            cor_mc_bad_gen_2 (the fit of the exact threshold)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from analysis.cli import atomic_write_text, run, save_figure, write_csv  # noqa: E402
from analysis.exact.bad_generalization_checks import check_corollary_sizes  # noqa: E402
from pbexact.bad_generalization import (  # noqa: E402
    corollary_fit,
    first_binding_d,
    mc_bad_gen_table,
)
from pbexact.cli import ArgumentParser, positive_float, positive_int
from pbexact.continuation import (  # noqa: E402
    CP_FINAL_TAU,
    DECEIVING_PIECEWISE,
    DECEIVING_SQUARED,
    exponential_schedule,
    logit,
    run_cp,
    sigmoid,
)
from pbexact.errors import PBInputError
from pbexact.io import check_out_dir  # noqa: E402
from pbexact.polynomial import expected_loss, true_gradient, vertex_probabilities  # noqa: E402
from pbexact.vertices import vertices  # noqa: E402

TAUS_SHOWN = (1.0, 0.5, 0.25, 0.1, 0.05)
ALPHAS = (0.5, 0.1, 0.05, 0.01)


def _save(fig: plt.Figure, out: Path, stem: str) -> None:
    save_figure(fig, [out / f"{stem}.png"])
    plt.close(fig)


def fig_sig_per_temp(out: Path) -> dict:
    """`fig:sig_per_temp`: sigmoid(x / tau) and its derivative sigmoid'(x / tau) / tau."""
    x = np.linspace(-5, 5, 1001)
    sig = {t: sigmoid(x / t) for t in TAUS_SHOWN}
    der = {t: sig[t] * (1 - sig[t]) / t for t in TAUS_SHOWN}
    header = ["x"] + [f"sigmoid_tau{t}" for t in TAUS_SHOWN] + [f"deriv_tau{t}" for t in TAUS_SHOWN]
    write_csv(out / "sig_per_temp.csv", header,
              np.column_stack([x] + [sig[t] for t in TAUS_SHOWN] + [der[t] for t in TAUS_SHOWN]))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    for t in TAUS_SHOWN:
        axes[0].plot(x, sig[t], label=f"tau = {t}")
        axes[1].plot(x, der[t], label=f"tau = {t}")
    axes[0].set_title("sigmoid(x / tau)")
    axes[1].set_title("d/dx sigmoid(x / tau)")
    for ax in axes:
        ax.set_xlabel("x")
        ax.grid(alpha=0.3)
    axes[1].legend()
    fig.suptitle("fig:sig_per_temp: lowering tau sharpens the step and concentrates the derivative "
                 "at x = 0", fontsize=10)
    _save(fig, out, "sig_per_temp")
    return {"max_derivative": {t: float(der[t].max()) for t in TAUS_SHOWN}}


#: `fig:different_J`: functions that all equal J(0) = 1, J(1) = 2 at the vertices.
Curve = Callable[[np.ndarray], np.ndarray]
DIFFERENT_J: dict[str, tuple[Curve, Curve]] = {
    "P_J(z) = 1 + z (multilinear)": (lambda z: 1 + z, lambda z: np.ones_like(z)),
    "1 + z - 8 z(1-z)(z-1/2)": (
        lambda z: 1 + z - 8 * z * (1 - z) * (z - 0.5),
        lambda z: 1 - 8 * (-3 * z**2 + 3 * z - 0.5),
    ),
    "1 + z + 0.3 sin(4 pi z)": (
        lambda z: 1 + z + 0.3 * np.sin(4 * np.pi * z),
        lambda z: 1 + 1.2 * np.pi * np.cos(4 * np.pi * z),
    ),
    "1 + z^4": (lambda z: 1 + z**4, lambda z: 4 * z**3),
}


def fig_different_J(out: Path) -> dict:
    """`fig:different_J`: different J(.) with the same vertex values, whose derivatives at
    z = 0.5 disagree in sign: the descent direction inside [0, 1] depends on the choice of J."""
    z = np.linspace(0, 1, 501)
    write_csv(out / "different_J.csv", ["z"] + list(DIFFERENT_J),
              np.column_stack([z] + [f(z) for f, _ in DIFFERENT_J.values()]))
    fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
    slopes = {}
    for k, (name, (f, df)) in enumerate(DIFFERENT_J.items()):
        (line,) = ax.plot(z, f(z), label=name)
        s = float(df(np.array(0.5)))
        slopes[name] = s
        y = float(f(np.array(0.5))) + 0.04 * k  # stacked: three curves cross at z = 0.5
        ax.annotate("", xy=(0.5 - np.sign(s) * 0.12, y), xytext=(0.5, y),
                    arrowprops={"arrowstyle": "->", "color": line.get_color(), "lw": 2})
    ax.plot([0, 1], [1, 2], "ko", ms=8, zorder=5, label="J(0) = 1, J(1) = 2")
    ax.set_xlabel("z")
    ax.set_ylabel("J(z), four choices")
    ax.set_title("fig:different_J: same vertex values; arrows = descent direction at z = 0.5",
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, out, "different_J")
    return {"slope_at_half": slopes}


def _wiggly(z: np.ndarray) -> np.ndarray:
    return DIFFERENT_J["1 + z + 0.3 sin(4 pi z)"][0](z)


def fig_collapse_of_j(out: Path) -> dict:
    """`fig:collapse_of_j`: J(z) on [0, 1] and J(sigmoid(r / tau)) over r: the active range
    (-Delta r, Delta r) where the critical points live shrinks to the origin as tau -> 0."""
    z = np.linspace(0, 1, 501)
    r = np.linspace(-6, 6, 1201)
    taus = (1.0, 0.3, 0.1, 0.03)
    chained = {t: _wiggly(sigmoid(r / t)) for t in taus}
    write_csv(out / "collapse_of_j.csv", ["r"] + [f"J_sigmoid_r_over_tau{t}" for t in taus],
              np.column_stack([r] + [chained[t] for t in taus]))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    axes[0].plot(z, _wiggly(z), "k")
    axes[0].set_title("J(z) = 1 + z + 0.3 sin(4 pi z)")
    axes[0].set_xlabel("z")
    for t in taus:
        axes[1].plot(r, chained[t], label=f"tau = {t}")
    axes[1].set_title("J(sigmoid(r / tau))")
    axes[1].set_xlabel("r")
    axes[1].legend()
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle("fig:collapse_of_j: annealing collapses J's critical points toward r = 0",
                 fontsize=10)
    _save(fig, out, "collapse_of_j")
    # width of the active range: where sigmoid(r / tau) is in [0.01, 0.99]
    return {"active_half_width": {t: float(t * logit(0.99)) for t in taus}}


def fig_deceiving_J(out: Path) -> dict:
    """`sb:deceiving_piecewise` and `sb:deceiving_squared` (both in the figure the paper also
    labels fig:sig_per_temp): the two J(.) of the CP counter-examples on [0, 1]."""
    z = np.linspace(0, 1, 2001)
    write_csv(out / "deceiving_J.csv", ["z", "J_piecewise", "J_squared"],
              np.column_stack([z, DECEIVING_PIECEWISE(z), DECEIVING_SQUARED(z)]))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    axes[0].plot(z, DECEIVING_PIECEWISE(z), "k")
    axes[0].set_title("ex:deceiving_piecewise: J(0) = -1 < J(1) = 1")
    axes[1].plot(z, DECEIVING_SQUARED(z), "k")
    axes[1].axvline(0.4, color="gray", ls="--", label="z = 0.4")
    axes[1].set_title("ex:deceiving_squared: J(0) = 0 < J(1) = 1")
    axes[1].legend()
    for ax in axes:
        ax.set_xlabel("z")
        ax.grid(alpha=0.3)
    _save(fig, out, "deceiving_J")
    return {}


def fig_deceiving_piecewise_runs(out: Path, taus: np.ndarray, iters: int) -> dict:
    """`fig:deceiving_piecewise_runs`: CP (`alg:cp_alg`) on `ex:deceiving_piecewise` from x0 = 0,
    ``iters`` gradient steps per temperature, plotting J(1[x > 0]) at every step, for each
    learning rate alpha."""
    runs = {a: run_cp(DECEIVING_PIECEWISE, 0.0, a, taus, iters) for a in ALPHAS}
    step = np.arange(1, len(runs[ALPHAS[0]].x) + 1)
    cols, header = [step, runs[ALPHAS[0]].tau], ["step", "tau"]
    for a in ALPHAS:
        cols += [runs[a].x, runs[a].loss_discrete]
        header += [f"x_alpha{a}", f"J_discrete_alpha{a}"]
    write_csv(out / "deceiving_piecewise_runs.csv", header, np.column_stack(cols))
    fig, axes = plt.subplots(2, 4, figsize=(14, 5.5), sharey="row", sharex=True,
                             layout="constrained")
    for k, a in enumerate(ALPHAS):
        axes[0, k].plot(step, runs[a].loss_discrete, "k", lw=1.5)
        axes[1, k].plot(step, runs[a].z_relaxed, "tab:blue", lw=1)
        for ax in axes[:, k]:
            for j in range(1, len(taus)):
                ax.axvline(j * iters, color="gray", lw=0.5, alpha=0.5)
            ax.grid(alpha=0.3)
        axes[0, k].set_title(f"alpha = {a}: final J = {runs[a].loss_discrete[-1]:g}")
        axes[1, k].set_xlabel("step (gray: tau update)")
        axes[1, k].set_xscale("symlog", linthresh=100)
    axes[0, 0].set_ylim(-1.3, 1.3)
    axes[0, 0].set_ylabel("J(1[x > 0])")
    axes[1, 0].set_ylabel("sigmoid(x / tau)")
    fig.suptitle(f"fig:deceiving_piecewise_runs: CP from x0 = 0, {iters} steps per tau, "
                 f"tau = 1 -> {taus[-1]:.3g} in {len(taus)} steps", fontsize=10)
    _save(fig, out, "deceiving_piecewise_runs")
    return {f"final_J_alpha{a}": float(runs[a].loss_discrete[-1]) for a in ALPHAS}


def fig_deceiving_squared_runs(out: Path, taus: np.ndarray, iters: int) -> dict:
    """`ex:deceiving_squared`: CP from x0 = 0 ends at z = 1 (J = 1) for every learning rate,
    while x0 < logit(0.4) ends at z = 0 (J = 0). Also the final J over a grid of x0, whose switch
    point is compared with logit(0.4)."""
    lrs = (0.5, 0.1, 0.01)
    starts = {"x0 = 0": 0.0, "x0 = logit(0.4) - 0.01": logit(0.4) - 0.01,
              "x0 = logit(0.4) + 0.01": logit(0.4) + 0.01}
    runs = {(name, a): run_cp(DECEIVING_SQUARED, x0, a, taus, iters)
            for name, x0 in starts.items() for a in lrs}
    step = np.arange(1, len(taus) * iters + 1)
    header, cols = ["step", "tau"], [step, next(iter(runs.values())).tau]
    for (name, a), r in runs.items():
        header += [f"z_{name}_alpha{a}", f"J_discrete_{name}_alpha{a}"]
        cols += [r.z_relaxed, r.loss_discrete]
    write_csv(out / "deceiving_squared_runs.csv", header, np.column_stack(cols))
    grid = np.linspace(-1.0, 0.5, 301)
    final = np.stack([run_cp(DECEIVING_SQUARED, grid, a, taus, iters).loss_discrete[-1]
                      for a in lrs], axis=1)
    write_csv(out / "deceiving_squared_x0_grid.csv", ["x0"] + [f"final_J_alpha{a}" for a in lrs],
              np.column_stack([grid, final]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    for (name, a), r in runs.items():
        if a == 0.1:
            axes[0].plot(step, r.z_relaxed, label=name)
    axes[0].axhline(0.4, color="gray", ls="--", lw=0.8)
    axes[0].set_title("sigmoid(x / tau) during CP (alpha = 0.1)")
    axes[0].set_xlabel("step")
    axes[0].legend(fontsize=8)
    for k, a in enumerate(lrs):
        axes[1].plot(grid, final[:, k] + 0.02 * k, label=f"alpha = {a} (offset {0.02 * k:g})")
    axes[1].axvline(logit(0.4), color="gray", ls="--", label="logit(0.4)")
    axes[1].set_title("final J(1[x > 0]) vs x0")
    axes[1].set_xlabel("x0")
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle("ex:deceiving_squared: from x0 = 0 CP never reaches z = 0; from x0 < logit(0.4) "
                 "it always does (small alpha also from some x0 > logit(0.4))",
                 fontsize=10)
    _save(fig, out, "deceiving_squared_runs")
    switch = {}
    for k, a in enumerate(lrs):
        bad = grid[final[:, k] > 0.5]
        switch[f"alpha{a}"] = float(bad.min()) if bad.size else None
    return {"final_J": {f"{n} alpha={a}": float(r.loss_discrete[-1]) for (n, a), r in runs.items()},
            "smallest_failing_x0_on_grid": switch, "logit_0.4": logit(0.4)}


#: J and theta of `sub:theta_dep_sampled` / `sub:theta_dep_true`: z* = zeta_2 is unlikely.
THETA_DEP_J = np.array([1.0, 1.0, -2.0, 1.0])
THETA_DEP_THETA = np.array([0.7, 0.2])
#: The n = 2 samples of `sub:theta_dep_sampled`: zeta_1 and zeta_0, the two likeliest vertices.
THETA_DEP_SAMPLES = (1, 0)


def _grad_p(theta: np.ndarray) -> np.ndarray:
    """grad_theta p_theta(zeta_h) for every h, shape (2^d, d): the exact gradient of
    E[1[z = zeta_h]]."""
    eye = np.eye(2 ** theta.size)
    return np.stack([true_gradient(e, theta) for e in eye])


def _contour(ax: plt.Axes, J: np.ndarray) -> None:
    g = np.linspace(0, 1, 201)
    t1, t2 = np.meshgrid(g, g)
    EJ = expected_loss(J, np.stack([t1, t2], -1))
    cs = ax.contourf(t1, t2, EJ, levels=20, cmap="RdBu_r")
    plt.colorbar(cs, ax=ax, shrink=0.8, label="E[J]")
    for h, v in enumerate(vertices(2)):
        ax.annotate(f"zeta_{h}\nJ={J[h]:g}", v, xytext=(v[0] * 0.8 + 0.1, v[1] * 0.84 + 0.06),
                    fontsize=8, ha="center")
    ax.set_xlabel("theta_1")
    ax.set_ylabel("theta_2")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")


def _arrows(ax: plt.Axes, origin: np.ndarray, vecs: dict[str, np.ndarray], total: np.ndarray,
            length: float = 0.22) -> None:
    scale = length / max(np.linalg.norm(v) for v in [*vecs.values(), total])
    for name, v in vecs.items():
        ax.annotate("", xy=origin + scale * v, xytext=origin,
                    arrowprops={"arrowstyle": "->", "color": "k", "lw": 1.2})
        ax.text(*(origin + scale * v * 1.15), name, fontsize=8, ha="center", va="center",
                bbox={"boxstyle": "round,pad=0.1", "fc": "white", "alpha": 0.7, "lw": 0})
    ax.annotate("", xy=origin + scale * total, xytext=origin,
                arrowprops={"arrowstyle": "->", "color": "limegreen", "lw": 2.5})
    ax.plot(*origin, "ko", ms=4)


def fig_theta_dep_ill(out: Path) -> dict:
    """`fig:theta_dep_ill`: contour plots of E[J] for d = 2 (blue = low). (a) the descent
    directions -(n_h / n)(1 / p(zeta_h)) J(zeta_h) grad p(zeta_h) of `eq:mc_as_avg` for n = 2
    samples that miss z* = zeta_2, and their sum (green); (b) the descent directions
    -J(zeta_h) grad p(zeta_h) of `eq:true_as_avg` and their sum, -grad E[J]; (c) the field
    -grad E[J] of `ex:mc_bad_gen_1` (m = 0, M = 1), darker arrows = smaller magnitude."""
    J, theta = THETA_DEP_J, THETA_DEP_THETA
    gp = _grad_p(theta)
    p = vertex_probabilities(theta)
    counts = np.bincount(THETA_DEP_SAMPLES, minlength=4)
    mc = {f"zeta_{h}": -(counts[h] / 2) / p[h] * J[h] * gp[h] for h in range(4) if counts[h]}
    true = {f"zeta_{h}": -J[h] * gp[h] for h in range(4)}
    mc_sum, true_sum = sum(mc.values()), sum(true.values())
    J1 = np.array([1.0, 0.0, 0.0, 1.0])
    g = np.linspace(0.05, 0.95, 13)
    t1, t2 = np.meshgrid(g, g)
    field = -true_gradient(J1, np.stack([t1, t2], -1))
    mag = np.linalg.norm(field, axis=-1)
    rows = [["a", f"zeta_{h}", *theta, *mc[f"zeta_{h}"]] for h in range(4) if counts[h]]
    rows += [["a", "sum", *theta, *mc_sum]]
    rows += [["b", f"zeta_{h}", *theta, *true[f"zeta_{h}"]] for h in range(4)]
    rows += [["b", "sum", *theta, *true_sum]]
    rows += [["c", "field", a, b, *f] for a, b, f in zip(t1.ravel(), t2.ravel(),
                                                           field.reshape(-1, 2))]
    write_csv(out / "theta_dep_ill.csv", ["panel", "arrow", "theta_1", "theta_2", "u", "v"], rows)
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5), layout="constrained")
    _contour(axes[0], J)
    _arrows(axes[0], theta, mc, mc_sum)
    axes[0].set_title("(a) eq:mc_as_avg, n = 2, samples zeta_1, zeta_0\n"
                      "(descent directions; green = sum)", fontsize=9)
    _contour(axes[1], J)
    _arrows(axes[1], theta, true, true_sum)
    axes[1].set_title("(b) eq:true_as_avg\n(descent directions; green = -grad E[J])", fontsize=9)
    _contour(axes[2], J1)
    axes[2].quiver(t1, t2, field[..., 0] / (mag + 1e-12), field[..., 1] / (mag + 1e-12), mag,
                   cmap="Greys_r", clim=(0, mag.max() * 1.3), scale=25, width=0.006)
    axes[2].plot(0.5, 0.5, "k*", ms=12)
    axes[2].set_title("(c) ex:mc_bad_gen_1: -grad E[J] (darker = smaller);\n"
                      "star: saddle at (0.5, 0.5) with zero gradient", fontsize=9)
    fig.suptitle("fig:theta_dep_ill (blue = low E[J])", fontsize=10)
    _save(fig, out, "theta_dep_ill")
    return {"mc_sum": mc_sum.tolist(), "true_sum": true_sum.tolist(),
            "toward_z_star": {"mc": bool(mc_sum[0] < 0 and mc_sum[1] > 0),
                              "true": bool(true_sum[0] < 0 and true_sum[1] > 0)},
            "grad_at_center": true_gradient(J1, np.array([0.5, 0.5])).tolist()}


def tab_mc_bad_gen_2(out: Path) -> dict:
    """`tab:mc_bad_gen_2`: J of `thm:mc_bad_gen_2` for d = 3 and z* = 1, from the code
    (`pbexact.bad_generalization.mc_bad_gen_table`), with the symbolic entries read back from its
    numbers."""
    import sympy as sp

    d, z_star = 3, np.ones(3)
    m, M0, dM = sp.symbols("m M_0 DeltaM")
    # two numeric evaluations pin down the affine form J = M0 + a dM (or m) of every entry
    base = mc_bad_gen_table(d, z_star, -7.0, 0.0, 1.0)
    shifted = mc_bad_gen_table(d, z_star, -7.0, 1.0, 1.0)
    groups: dict[int, list[str]] = {}
    entries: dict[int, object] = {}
    for h, v in enumerate(vertices(d)):
        dist = int(np.abs(v - z_star).sum())
        groups.setdefault(dist, []).append("[" + " ".join(str(int(x)) for x in v) + "]")
        if dist == 0:
            entries[dist] = m
        else:
            assert shifted[h] - base[h] == 1.0  # the entry moves one for one with M0
            entries[dist] = M0 + sp.nsimplify(base[h]) * dM
    rows = [["; ".join(groups[k]), k, str(entries[k])] for k in sorted(groups, reverse=True)]
    write_csv(out / "tab_mc_bad_gen_2.csv", ["z", "d_H(z, z*)", "J(z)"], rows)
    md = "| z | d_H(z, z*) | J(z) |\n|---|---|---|\n"
    md += "".join(f"| {a} | {b} | {c} |\n" for a, b, c in rows)
    atomic_write_text(out / "tab_mc_bad_gen_2.md", md)
    return {"rows": rows}


def fig_cor_mc_bad_gen_2(out: Path, max_d: int, epsilon: float) -> dict:
    """`cor:mc_bad_gen_2`: the exact largest m (M0 = 0, dM = 1, every p(z*_i) = 1 - epsilon)
    that keeps the descent direction aligned with z*, the closed form, and the exponential fit
    log(d (M0 - m*)) = a + d log c."""
    fit = corollary_fit(range(2, max_d + 1), epsilon)
    write_csv(out / "cor_mc_bad_gen_2.csv", ["d", "exact_m_star", "closed_form"],
              np.column_stack([fit.ds, fit.exact, fit.formula]))
    fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
    ax.semilogy(fit.ds, -fit.exact, "ko", label="exact -m* (from exact gradients)")
    dd = np.linspace(fit.ds[0], fit.ds[-1], 200)
    ax.semilogy(dd, np.exp(fit.intercept + dd * np.log(fit.c_fit)) / dd, "r-",
                label=f"fit exp({fit.intercept:.3f}) c^d / d, c = {fit.c_fit:.4f}")
    ax.axhline(1.0, color="gray", ls="--", label="M0 - dM (second-lowest value)")
    ax.set_xlabel("d")
    ax.set_ylabel("-m*  (m must be <= m*)")
    ax.set_title(f"cor:mc_bad_gen_2: eps = {epsilon}, 1/(1-eps) = {fit.c_expected:.4f}, "
                 f"R^2 = {fit.r_squared:.9f}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    _save(fig, out, "cor_mc_bad_gen_2")
    return {"c_fit": fit.c_fit, "c_expected": fit.c_expected, "r_squared": fit.r_squared,
            "binding_from_d": first_binding_d(epsilon)}


#: The figures and tables :func:`build_all` draws, by file stem (the choices of ``--only``).
FIGURES = ("sig_per_temp", "different_J", "collapse_of_j", "deceiving_J",
           "deceiving_piecewise_runs", "deceiving_squared_runs", "theta_dep_ill",
           "tab_mc_bad_gen_2", "cor_mc_bad_gen_2")


def build_all(out: Path, only: Sequence[str] | None, temperatures: int, final_tau: float,
              iters: int, cor_max_d: int, epsilon: float, progress: bool = True) -> dict:
    """Draw the requested figures into ``out``; returns the numbers each one reports."""
    taus = exponential_schedule(temperatures, final_tau)
    makers: dict[str, Callable[[], dict]] = {
        "sig_per_temp": lambda: fig_sig_per_temp(out),
        "different_J": lambda: fig_different_J(out),
        "collapse_of_j": lambda: fig_collapse_of_j(out),
        "deceiving_J": lambda: fig_deceiving_J(out),
        "deceiving_piecewise_runs": lambda: fig_deceiving_piecewise_runs(out, taus, iters),
        "deceiving_squared_runs": lambda: fig_deceiving_squared_runs(out, taus, iters),
        "theta_dep_ill": lambda: fig_theta_dep_ill(out),
        "tab_mc_bad_gen_2": lambda: tab_mc_bad_gen_2(out),
        "cor_mc_bad_gen_2": lambda: fig_cor_mc_bad_gen_2(out, cor_max_d, epsilon),
    }
    assert tuple(makers) == FIGURES
    names = list(only) if only else list(makers)
    unknown = [n for n in names if n not in makers]
    if unknown:
        raise PBInputError(f"unknown figure {unknown[0]!r}; choose from {', '.join(makers)}")
    out.mkdir(parents=True, exist_ok=True)
    return {n: makers[n]() for n in tqdm(names, desc="figures", disable=not progress,
                                         file=sys.stderr)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m analysis.counterexamples",
        description="Redraw the paper's counter-examples and illustrations as PNG + CSV.",
    )
    parser.add_argument("--out", type=Path, default=Path("results"),
                        help="output folder (default results/; --out figures regenerates the "
                        "committed figures)")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=FIGURES,
                        help="draw only these (file stems: " + ", ".join(FIGURES) + ")")
    parser.add_argument("--temperatures", type=positive_int, default=10,
                        help="CP temperatures, exponential from 1 to --final-tau (default 10)")
    parser.add_argument("--final-tau", type=positive_float, default=CP_FINAL_TAU,
                        help="last CP temperature (default 1/200, as in the paper's appendix)")
    parser.add_argument("--iters", type=positive_int, default=100,
                        help="CP gradient steps per temperature (default 100, as in the paper)")
    parser.add_argument("--cor-max-d", type=positive_int, default=20,
                        help="cor:mc_bad_gen_2 for d = 2..this (default 20)")
    parser.add_argument("--epsilon", type=positive_float, default=0.25,
                        help="error epsilon of cor:mc_bad_gen_2 (default 0.25)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)
    if args.iters < 1:
        raise PBInputError("--iters must be at least 1; give --iters 1 or more")
    check_corollary_sizes(args.cor_max_d, args.epsilon)
    if args.final_tau > 1:
        raise PBInputError(f"--final-tau must be in (0, 1], got {args.final_tau}; give e.g. "
                           "--final-tau 0.005")
    check_out_dir(args.out)
    report = build_all(args.out, args.only, args.temperatures, args.final_tau, args.iters,
                       args.cor_max_d, args.epsilon, progress=not args.no_progress)
    for name, numbers in report.items():
        print(f"{name}: {numbers}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
