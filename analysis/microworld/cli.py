"""Microworld optimization experiments (`sec:microworld`): estimators, parametrizations and
approaches, each on one benchmark instance per d reused across methods and seeds.

    python -m analysis.microworld estimators   # fig:microworld_estimators
    python -m analysis.microworld params       # fig:microworld_params(_scatter)
    python -m analysis.microworld approaches   # fig:microworld_grad

Common setting: theta_0 = 0.5, plain SGD, all seeds of a method vectorized, curves are the exact
E_theta[J] (mean and standard error over seeds). Deterministic methods (true gradient, CP) run
once: every seed would repeat the same trajectory.

* estimators: sigmoid; REINFORCE (n = 1, 4, 10), LOORF, ARMS and DisARM (n = 4, 10), beta*
  (n = 1, 4, 10) and the true gradient; lr 0.1; ExponentialTabularLoss and NNLoss.
* params: REINFORCE (n = 1) and LOORF (n = 4, 10) with sigmoid, cosine, direct and escort; lr in
  {0.1, 0.01}, the one with the lowest final mean loss kept; both benchmarks, plus the per-seed
  final losses on NNLoss (runs that found z* marked).
* approaches: on NNLoss (CP, ST, REBAR and RELAX differentiate J): REINFORCE (sigmoid), CP, ST,
  REBAR, RELAX and the true gradient; lr in {0.1, 0.01} chosen by the mean loss from iteration 10
  on (`sec:microworld_exp_approaches`, `sec:app_microworld_hypers`).

Outputs, per (experiment, benchmark): ``microworld_<exp>_<bench>_d<d>.csv`` in --out (rows
``curve``: step, mean, stderr at every logged step; rows ``final``: per-seed final loss and
whether it found z*) and the same with the curve thinned to ~400 steps in --figures (only when
given: ``--figures figures`` regenerates the committed ones), the figure
``microworld_<exp>_d<d>.png`` in both, and a JSON summary (final means, wall time) in --out.

The settings of a run are recorded beside each results CSV (``..._settings.json``); a run on top
of results with other settings, and a --replot of results whose settings differ from the command's
or from each other, are refused (exit code 2) instead of mixing two runs.
"""

from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from analysis.cli import (
    check_settings,
    output_folders,
    save_figure,
    settings_path,
    write_csv,
    write_json,
)
from analysis.microworld.hybrid import TORCH_METHODS, check_torch_method, run_torch
from analysis.microworld.runs import (
    DETERMINISTIC,
    TRUE,
    Trajectory,
    check_method,
    check_run_memory,
    found_optimum,
    run_exact,
)
from pbexact.cli import ArgumentParser, nonneg_int, positive_float, positive_int, step_count
from pbexact.errors import PBInputError, check_d
from pbexact.estimators import REGISTRY
from pbexact.instances import BENCHMARKS, NNLoss, benchmark_table
from pbscale.methods import REGISTRY as METHOD_REGISTRY

EXPERIMENTS = ("estimators", "params", "approaches")
#: The approaches sweep picks lr by the mean loss from this iteration on.
SELECT_FROM_STEP = 10
#: Legend text and colour of every gradient source: the estimators' and pbscale's registries,
#: and the exact gradient.
LABELS = {
    **{name: spec.label for name, spec in REGISTRY.items()},
    **{name: METHOD_REGISTRY[name].label for name in TORCH_METHODS},
    TRUE: "true gradient",
}
COLORS = {
    **{name: spec.color or None for name, spec in REGISTRY.items()},
    **{name: METHOD_REGISTRY[name].color or None for name in TORCH_METHODS},
    TRUE: "k",
}
BENCH_LABELS = {"exponential": "ExponentialTabularLoss", "nnloss": "NNLoss"}


@dataclass(frozen=True)
class Config:
    """One curve of an experiment: a method (estimator or approach), samples per step, the
    parametrization and the learning rate."""

    method: str
    n: int
    param: str
    lr: float

    @property
    def group(self) -> tuple[str, int, str]:
        """Configs that differ only in lr: the sweep picks one of them."""
        return (self.method, self.n, self.param)

    def label(self, with_param: bool = False) -> str:
        name = LABELS[self.method]
        if self.method not in DETERMINISTIC:
            name += f" n={self.n}"
        return f"{name}, {self.param}" if with_param else name


def experiment_configs(experiment: str, lrs: Sequence[float], n: int) -> list[Config]:
    """The curves of an experiment (before lr selection); ``n`` is the samples per step of the
    approaches experiment."""
    out: list[Config] = []
    for lr in lrs:
        if experiment == "estimators":
            for method, ns in (("reinforce", (1, 4, 10)), ("loorf", (4, 10)), ("arms", (4, 10)),
                               ("disarm", (4, 10)), ("betastar", (1, 4, 10))):
                out += [Config(method, k, "sigmoid", lr) for k in ns]
            out.append(Config("true", 0, "sigmoid", lr))
        elif experiment == "params":
            for k in (1, 4, 10):
                for param in ("sigmoid", "cosine", "direct", "escort"):
                    out.append(Config("reinforce" if k == 1 else "loorf", k, param, lr))
        elif experiment == "approaches":
            out += [Config(m, n, "sigmoid", lr) for m in ("reinforce", "st", "rebar", "relax")]
            out += [Config("cp", 0, "sigmoid", lr), Config("true", 0, "sigmoid", lr)]
        else:
            raise PBInputError(
                f"unknown experiment {experiment!r}; choose one of {', '.join(EXPERIMENTS)}"
            )
    return out


def benchmarks_for(experiment: str, benchmark: str) -> tuple[str, ...]:
    """Benchmarks an experiment runs on: approaches needs a differentiable J (NNLoss only)."""
    names = BENCHMARKS if benchmark == "all" else (benchmark,)
    if experiment == "approaches":
        if "nnloss" not in names:
            raise PBInputError(
                "approaches differentiates J (CP, ST, REBAR, RELAX): ExponentialTabularLoss is "
                "not differentiable; use --benchmark nnloss or all"
            )
        return ("nnloss",)
    return names


def run_config(cfg: Config, J: np.ndarray, net: NNLoss | None, args: argparse.Namespace,
               desc: str) -> Trajectory:
    """Train one config for all seeds; methods that differentiate J use ``net``."""
    common = dict(lr=cfg.lr, steps=args.steps, seeds=args.seeds, seed=args.seed,
                  log_every=args.log_every, desc=desc)
    if cfg.method in TORCH_METHODS:
        return run_torch(net, J, cfg.method, max(cfg.n, 1), **common)
    return run_exact(J, cfg.method, max(cfg.n, 1), cfg.param, **common)


def select(experiment: str, results: dict[Config, Trajectory]) -> dict[Config, bool]:
    """Per group, the lr kept: lowest final mean loss (estimators, params) or lowest mean loss
    from iteration 10 on (approaches)."""
    def score(cfg: Config) -> float:
        t = results[cfg]
        return t.mean_from(SELECT_FROM_STEP) if experiment == "approaches" else float(t.mean[-1])

    groups: dict[tuple, list[Config]] = {}
    for cfg in results:
        groups.setdefault(cfg.group, []).append(cfg)
    chosen = {cfg: False for cfg in results}
    for members in groups.values():
        chosen[min(members, key=score)] = True
    return chosen


def found_flags(J: np.ndarray, t: Trajectory) -> np.ndarray:
    """Per seed, whether the run found z* (stored when the trajectory was read from a CSV)."""
    if "found" in t.meta:
        return t.meta["found"]
    return found_optimum(J, t.final_theta)


def load_results(path: Path) -> tuple[dict[Config, Trajectory], dict[Config, bool]]:
    """Trajectories and lr choices back from a results CSV of :func:`write_results` (for
    --replot); final_theta is not stored, the found-z* flags are."""
    if not path.exists():
        raise PBInputError(f"--replot needs {path}; run the experiment first")
    curves: dict[Config, list] = {}
    finals: dict[Config, list] = {}
    chosen: dict[Config, bool] = {}
    try:
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                cfg = Config(row["method"], int(row["n"]), row["param"], float(row["lr"]))
                chosen[cfg] = row["selected"] == "1"
                if row["record"] == "curve":
                    curves.setdefault(cfg, []).append(
                        (int(row["step"]), float(row["mean"]), float(row["stderr"])))
                else:
                    finals.setdefault(cfg, []).append(
                        (float(row["value"]), row["found_z_star"] == "1"))
        if not curves or set(curves) != set(finals):
            raise ValueError
    except (OSError, UnicodeDecodeError, KeyError, TypeError, ValueError):
        raise PBInputError(f"damaged results file {path}; run the experiment again or choose "
                           "another --out") from None
    results = {}
    for cfg, rows in curves.items():
        steps, mean, se = (np.array(col) for col in zip(*rows))
        value, found = (np.array(col) for col in zip(*finals[cfg]))
        results[cfg] = Trajectory(steps, mean, se, value, np.empty((value.size, 0)),
                                  {"found": found})
    return results, chosen


#: Settings that change what a results CSV holds; --replot must match those marked True (it
#: rebuilds the table, the configs and the figure from them), the others only across benchmarks.
SETTINGS_REPLOT = {"experiment": True, "d": True, "instance": True, "lrs": True, "n": True,
                   "seeds": False, "steps": False, "seed": False, "log_every": False}


def run_settings(args: argparse.Namespace, d: int, lrs: list[float]) -> dict:
    """The settings recorded beside each results CSV (see :data:`SETTINGS_REPLOT`)."""
    return {"experiment": args.experiment, "d": d, "instance": args.instance,
            "lrs": [float(x) for x in lrs], "n": args.n, "seeds": args.seeds,
            "steps": args.steps, "seed": args.seed, "log_every": args.log_every}


def check_run_settings(stem_path: Path, settings: dict, replot: bool) -> dict | None:
    """`analysis.cli.check_settings` on the settings a run (all of them) or a --replot (those
    marked True in :data:`SETTINGS_REPLOT`) must share with the recorded ones."""
    keys = [k for k, needed in SETTINGS_REPLOT.items() if needed or not replot]
    return check_settings(stem_path, settings, keys, replot)


def write_results(path: Path, J: np.ndarray, results: dict[Config, Trajectory],
                  chosen: dict[Config, bool]) -> None:
    """Long-format CSV: ``curve`` rows (step, mean, stderr) and ``final`` rows (seed, value,
    found_z_star) for every config."""
    header = ["record", "method", "n", "param", "lr", "selected", "step", "mean", "stderr",
              "seed", "value", "found_z_star"]
    rows = []
    for cfg, t in results.items():
        key = [cfg.method, cfg.n, cfg.param, cfg.lr, int(chosen[cfg])]
        for s, m, e in zip(t.steps.tolist(), t.mean.tolist(), t.stderr.tolist()):
            rows.append(["curve", *key, s, repr(m), repr(e), "", "", ""])
        found = found_optimum(J, t.final_theta)
        for seed, (v, ok) in enumerate(zip(t.final.tolist(), found.tolist())):
            rows.append(["final", *key, int(t.steps[-1]), "", "", seed, repr(v), int(ok)])
    write_csv(path, header, rows)


def thin_steps(last: int, points: int = 200) -> set[int]:
    """Steps kept in the figure CSV: about ``points`` log-spaced and ``points`` evenly spaced
    iterations, plus the first and the last."""
    grid = np.unique(np.round(np.logspace(0, np.log10(max(last, 1)), points)).astype(int))
    even = np.linspace(0, last, points + 1).round().astype(int)
    return {0, last, *grid.tolist(), *even.tolist()}


def write_figure_csv(results_csv: Path, figure_csv: Path) -> None:
    """The CSV beside a figure (figures/ is tracked, results/ is not): the full results CSV with
    its curve rows thinned to :func:`thin_steps`; the per-seed final rows are all kept."""
    with open(results_csv, newline="") as fh:
        rows = list(csv.reader(fh))
    header, body = rows[0], rows[1:]
    step_col = header.index("step")
    last = max(int(r[step_col]) for r in body)
    keep = thin_steps(last)
    write_csv(figure_csv, header,
              [r for r in body if r[0] != "curve" or int(r[step_col]) in keep])


def summary_rows(results: dict[Config, Trajectory], chosen: dict[Config, bool],
                 J: np.ndarray) -> list[dict]:
    out = []
    for cfg, t in results.items():
        out.append({
            "method": cfg.method, "n": cfg.n, "param": cfg.param, "lr": cfg.lr,
            "selected": chosen[cfg], "seeds": int(t.final.size),
            "final_mean": float(t.mean[-1]), "final_stderr": float(t.stderr[-1]),
            "mean_from_10": t.mean_from(SELECT_FROM_STEP),
            "found_z_star": int(found_flags(J, t).sum()),
        })
    return out


# ---------------------------------------------------------------------------------------------
# Figures


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _curve(ax, t: Trajectory, label: str, **style) -> None:
    line, = ax.plot(t.steps, t.mean, label=label, lw=1.2, **style)
    if np.any(t.stderr > 0):
        ax.fill_between(t.steps, t.mean - t.stderr, t.mean + t.stderr, color=line.get_color(),
                        alpha=0.2, lw=0)


def _axes_style(ax, title: str, J: np.ndarray, last: int) -> None:
    ax.axhline(J.min(), color="k", lw=0.8, ls=":", label=r"$J(z^*)$")
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(0, last)
    ax.set_xlabel("iteration")
    ax.set_ylabel(r"$E_\theta[J]$")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)


def _last(results: dict[Config, Trajectory]) -> int:
    return max(int(t.steps[-1]) for t in results.values())


N_STYLES = {1: ":", 4: "--", 10: "-", 0: "-"}
PARAM_COLORS = {"sigmoid": "C0", "cosine": "C1", "direct": "C2", "escort": "C3"}


def plot_estimators(per_bench: dict[str, tuple[np.ndarray, dict, dict]], d: int):
    plt = _plt()
    fig, axes = plt.subplots(1, len(per_bench), figsize=(6.0 * len(per_bench), 4.2), squeeze=False)
    for ax, (bench, (J, results, chosen)) in zip(axes[0], per_bench.items()):
        for cfg, t in results.items():
            if chosen[cfg]:
                _curve(ax, t, cfg.label(), color=COLORS[cfg.method], ls=N_STYLES[cfg.n])
        _axes_style(ax, f"{BENCH_LABELS[bench]}, d={d}", J, _last(results))
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=6, loc="lower center", bbox_to_anchor=(0.5, 0))
    fig.suptitle("Estimators (sigmoid, SGD): exact loss along each trajectory", fontsize=11)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def plot_params(per_bench: dict[str, tuple[np.ndarray, dict, dict]], d: int):
    plt = _plt()
    ns = (1, 4, 10)
    fig, axes = plt.subplots(len(per_bench), 3, figsize=(15, 3.8 * len(per_bench)), squeeze=False)
    for row, (bench, (J, results, chosen)) in enumerate(per_bench.items()):
        for col, k in enumerate(ns):
            ax = axes[row][col]
            for cfg, t in results.items():
                if chosen[cfg] and cfg.n == k:
                    _curve(ax, t, f"{cfg.param} (lr {cfg.lr:g})", color=PARAM_COLORS[cfg.param])
            est = "REINFORCE" if k == 1 else "LOORF"
            _axes_style(ax, f"{BENCH_LABELS[bench]}, d={d}: {est} n={k}", J, _last(results))
            ax.legend(fontsize=7, loc="lower left")
    fig.suptitle("Parametrizations (best lr of {0.1, 0.01} by final loss)", fontsize=11)
    fig.tight_layout()
    return fig


def plot_params_scatter(J: np.ndarray, results: dict, chosen: dict, d: int):
    """Per-seed final losses on NNLoss, runs whose final p_theta(z*) > 1/2 marked."""
    plt = _plt()
    ns = (1, 4, 10)
    params = ("sigmoid", "cosine", "direct", "escort")
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), sharey=True)
    jitter = np.random.default_rng(0)  # for display only
    for ax, k in zip(axes, ns):
        for x, param in enumerate(params):
            cfg = next(c for c in results if chosen[c] and c.n == k and c.param == param)
            t = results[cfg]
            found = found_flags(J, t)
            xs = x + jitter.uniform(-0.25, 0.25, size=t.final.size)
            color = PARAM_COLORS[param]
            ax.scatter(xs[~found], t.final[~found], s=16, facecolors="none", edgecolors=color,
                       lw=0.8)
            ax.scatter(xs[found], t.final[found], s=16, color=color, edgecolors="k", lw=0.6,
                       label=r"found $z^*$ (filled)" if x == 0 else None)
            ax.text(x, 1.01, f"{found.sum()}/{found.size} found\nlr {cfg.lr:g}",
                    transform=ax.get_xaxis_transform(), ha="center", fontsize=7)
        ax.axhline(J.min(), color="k", lw=0.8, ls=":")
        ax.set_xticks(range(len(params)), params)
        ax.set_title(f"{'REINFORCE' if k == 1 else 'LOORF'} n={k}", fontsize=10, pad=24)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("final $E_\\theta[J]$ per seed")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        axes[0].legend(handles, labels, fontsize=8, loc="upper left")
    fig.suptitle(f"NNLoss, d={d}: final loss per seed (dotted: $J(z^*)$; found $z^*$: "
                 r"final $p_\theta(z^*) > 1/2$)", fontsize=11)
    fig.tight_layout()
    return fig


def plot_approaches(J: np.ndarray, results: dict, chosen: dict, d: int):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for cfg, t in results.items():
        if chosen[cfg]:
            _curve(ax, t, f"{cfg.label()} (lr {cfg.lr:g})", color=COLORS[cfg.method])
    _axes_style(ax, f"NNLoss, d={d}: approaches (lr by mean loss from iteration "
                f"{SELECT_FROM_STEP})", J, _last(results))
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m analysis.microworld",
        description="Microworld optimization experiments of sec:microworld (exact expected loss "
        "along each trajectory, all seeds vectorized). Experiments: estimators "
        "(fig:microworld_estimators), params (fig:microworld_params and "
        "fig:microworld_params_scatter), approaches (fig:microworld_grad, NNLoss only).",
    )
    p.add_argument("experiment", choices=EXPERIMENTS,
                   help="estimators, params (parametrizations) or approaches")
    p.add_argument("--d", type=positive_int, default=10,
                   help="number of bits (default 10; paper: 4, 10)")
    p.add_argument("--seeds", type=positive_int, default=100, help="seeds per method (default 100)")
    p.add_argument("--steps", type=step_count(), default=10_000,
                   help="SGD steps (default 10,000)")
    p.add_argument("--benchmark", choices=(*BENCHMARKS, "all"), default="all",
                   help="exponential, nnloss or all (default); approaches uses nnloss only")
    p.add_argument("--lrs", type=positive_float, nargs="+", default=None,
                   help="learning rates swept (default: 0.1 for estimators, 0.1 0.01 otherwise)")
    p.add_argument("--n", type=positive_int, default=1,
                   help="samples per step of REINFORCE, ST, REBAR, RELAX in approaches (default 1)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="random seed of the runs (default 0)")
    p.add_argument("--instance", type=nonneg_int, default=0,
                   help="seed of the benchmark instance, shared by all methods (default 0)")
    p.add_argument("--log-every", type=positive_int, default=1,
                   help="iterations between logged losses (default 1)")
    p.add_argument("--out", type=Path, default=Path("results"), help="output folder")
    p.add_argument("--figures", type=Path, default=None,
                   help="also copy figures and thinned CSVs here (--figures figures regenerates "
                   "the committed ones; default: only --out)")
    p.add_argument("--replot", action="store_true",
                   help="redraw the figures from the results CSVs in --out without training")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    d = check_d(args.d, limit=16)
    if args.steps < 1 or args.seeds < 1 or args.log_every < 1:
        raise PBInputError("--steps, --seeds and --log-every must be >= 1; give 1 or more")
    lrs = args.lrs or ([0.1] if args.experiment == "estimators" else [0.1, 0.01])
    if any(not lr > 0 for lr in lrs):
        raise PBInputError(f"learning rates must be positive, got {lrs}; give --lrs > 0")
    configs = experiment_configs(args.experiment, lrs, args.n)
    for cfg in configs:  # fail on a bad setting before hours of training
        if cfg.method in DETERMINISTIC:
            continue  # n = 0 marks "no samples" for the true gradient and CP
        if cfg.method in TORCH_METHODS:
            check_torch_method(cfg.method, cfg.n)
        else:
            check_method(cfg.method, cfg.n)
    benches = benchmarks_for(args.experiment, args.benchmark)
    check_run_memory(args.steps, args.log_every, len(configs) * len(benches), args.seeds,
                     max(cfg.n for cfg in configs), d)
    if args.replot and not args.out.is_dir():
        raise PBInputError(
            f"--replot needs the results folder {args.out}; run the experiment first"
        )
    folders = output_folders(args.out, args.figures)
    settings = run_settings(args, d, lrs)
    recorded = [check_run_settings(args.out / f"microworld_{args.experiment}_{bench}_d{d}",
                                   settings, args.replot)
                for bench in benches]  # before any work
    if args.replot and any(r != recorded[0] for r in recorded):
        raise PBInputError(f"{args.out} mixes results of two runs (their settings differ); "
                           "run the experiment again or choose another --out")
    # small tensors: one thread avoids the synchronization cost of two
    torch.set_num_threads(1)
    start = time.perf_counter()
    per_bench: dict[str, tuple[np.ndarray, dict, dict]] = {}
    summary: dict = {"experiment": args.experiment, "d": d, "seeds": args.seeds,
                     "steps": args.steps, "seed": args.seed, "instance": args.instance,
                     "lrs": lrs, "benchmarks": {}}
    bar = tqdm(total=len(configs) * len(benches), desc=f"microworld {args.experiment}")
    for bench in benches:
        t0 = time.perf_counter()
        net = NNLoss(d, args.instance) if bench == "nnloss" else None
        J = net.table() if net is not None else benchmark_table(bench, d, args.instance)
        stem = f"microworld_{args.experiment}_{bench}_d{d}"
        if args.replot:
            results, chosen = load_results(args.out / f"{stem}.csv")
            bar.update(len(configs))
        else:
            results = {}
            for cfg in configs:
                bar.set_postfix_str(f"{bench} {cfg.method} n={cfg.n} {cfg.param} lr={cfg.lr:g}")
                results[cfg] = run_config(cfg, J, net, args, desc=f"{cfg.method} n={cfg.n}")
                bar.update()
            chosen = select(args.experiment, results)
        per_bench[bench] = (J, results, chosen)
        if not args.replot:
            write_json(settings_path(args.out / stem), settings)  # before the results it labels
            write_results(args.out / f"{stem}.csv", J, results, chosen)
        for folder in folders[1:]:  # --figures, when named and not --out itself
            write_figure_csv(args.out / f"{stem}.csv", folder / f"{stem}.csv")
        summary["benchmarks"][bench] = {
            "min_J": float(J.min()), "wall_s": time.perf_counter() - t0,
            "configs": summary_rows(results, chosen, J),
        }
    bar.close()
    figs = []
    if args.experiment == "estimators":
        figs.append(("microworld_estimators", plot_estimators(per_bench, d)))
    elif args.experiment == "params":
        figs.append(("microworld_params", plot_params(per_bench, d)))
        if "nnloss" in per_bench:
            figs.append(("microworld_params_scatter", plot_params_scatter(*per_bench["nnloss"], d)))
    else:
        figs.append(("microworld_grad", plot_approaches(*per_bench["nnloss"], d)))
    for name, fig in figs:
        save_figure(fig, [folder / f"{name}_d{d}.png" for folder in folders])
    summary["wall_s"] = time.perf_counter() - start
    if args.replot:
        print(f"replotted from {args.out}; figures in {', '.join(map(str, folders))}")
        return 0
    write_json(args.out / f"microworld_{args.experiment}_d{d}_summary.json", summary)
    print(f"{args.experiment}, d={d}, {args.seeds} seeds, {args.steps} steps: "
          f"{summary['wall_s']:.1f} s")
    for bench, info in summary["benchmarks"].items():
        print(f"  {BENCH_LABELS[bench]} (J(z*) = {info['min_J']:.4f}), final mean +- s.e.:")
        for row in info["configs"]:
            if row["selected"]:
                print(f"    {row['method']:9s} n={row['n']:<2d} {row['param']:7s}"
                      f" lr={row['lr']:<5g}"
                      f" {row['final_mean']:+.4f} +- {row['final_stderr']:.4f}"
                      f"  (mean from it. 10: {row['mean_from_10']:+.4f};"
                      f" found z*: {row['found_z_star']}/{row['seeds']})")
    print(f"  wrote {args.out}/microworld_{args.experiment}_*_d{d}.csv and figures in "
          f"{', '.join(map(str, folders))}")
    return 0

