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
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from analysis.cli import atomic_write_text, output_folders, run, save_figure, write_csv
from analysis.exact.bias import (
    BIASED,
    MAX_BIAS_D,
    Setting,
    applicable,
    bias_study,
    break_even_markdown,
    check_estimators,
    logged_steps,
)
from pbexact.bias import MultilinearExtension
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
from pbexact.relaxations import HC_BETA
from pbscale.runs.runtime import set_threads

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

