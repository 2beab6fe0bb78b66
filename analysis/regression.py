"""``python -m analysis.regression``: the MaskedNNRegression comparisons of the paper
(`fig:maskednnregression_est`, `fig:maskednnregression_param`, `fig:maskednnregression_approaches`).

* estimators: REINFORCE, LOORF, ARMS with n in {2, 10, 100, 1000}, sigmoid, lr 0.1;
* parametrizations: LOORF n = 10 with sigmoid, cosine, direct, escort, lr in {0.1, 0.01};
* approaches: REINFORCE, LOORF, ST, REBAR (n = 10) and CP (RMSprop and SGD), lr in {0.1, 0.01};
all with RMSprop unless said otherwise and 10 seeds. Among the settings of one curve (lr, CP's
optimizer) the one with the lowest mean validation loss over the second half of training is
shown (`sec:app_maskednnregression`); curves are means over seeds with standard errors, and a
scatter shows each seed's final loss.

Runs already finished are collected, not rerun (each is a resumable ``pbscale.regress`` run), so
the full sweep on a GPU is one command; ``--epochs``, ``--seeds`` and ``--ns`` shrink it for a CPU.
``--collect`` only draws what exists.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from analysis.scale.regression import best_setting
from pbexact.cli import ArgumentParser, positive_int, positive_int_list, thread_count
from pbexact.errors import PBInputError
from pbexact.io import check_out_dir
from pbscale.methods import MethodConfig
from pbscale.regression.problem import make_problem
from pbscale.regression.run import run_folder, run_name, train
from pbscale.runs import io
from pbscale.runs.runtime import resolve_device, set_threads

FIGURES = ("est", "param", "approaches")


def plan(which: str, ns: list[int], seeds: int) -> list[tuple[str, str, MethodConfig]]:
    """(figure, curve label, config) for every run of one comparison."""
    out = []
    for seed in range(seeds):
        if which == "est":
            for est in ("reinforce", "loorf", "arms"):
                for n in ns:
                    out.append(("est", f"{est} n={n}", MethodConfig(est, n, "sigmoid", 0.1,
                                                                    seed=seed)))
        elif which == "param":
            for param in ("sigmoid", "cosine", "direct", "escort"):
                for lr in (0.1, 0.01):
                    out.append(("param", param, MethodConfig("loorf", 10, param, lr, seed=seed)))
        else:
            for lr in (0.1, 0.01):
                for method in ("reinforce", "loorf", "st", "rebar"):
                    out.append(("approaches", method, MethodConfig(method, 10, lr=lr, seed=seed)))
                for opt in ("rmsprop", "sgd"):
                    out.append(("approaches", "cp", MethodConfig("cp", 10, lr=lr, optimizer=opt,
                                                                 seed=seed)))
    return out


def load_history(folder: Path) -> dict[str, np.ndarray] | None:
    if not (folder / "summary.json").exists():
        return None
    try:
        rows = io.read_csv(folder / "history.csv")
        out = {k: np.array([float(r[k]) for r in rows]) for k in ("epoch", "val_loss_chosen")}
        if not rows:
            raise ValueError
    except (OSError, UnicodeDecodeError, KeyError, TypeError, ValueError):
        raise PBInputError(f"damaged run file {folder / 'history.csv'}; {io.DAMAGED_FIX}") from None
    return out


def collect(which: str, items, out: Path, epochs: int) -> dict:
    """{label: (setting, [histories])} of the finished runs, best setting per label."""
    grouped: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    optimizers: dict[str, set[str]] = defaultdict(set)
    for _, label, cfg in items:
        optimizers[label].add(cfg.optimizer)
    for _, label, cfg in items:
        h = load_history(run_folder(cfg, epochs, out))
        if h is not None:  # the optimizer is named where a label's runs try several
            several = len(optimizers[label]) > 1
            setting = f"lr={cfg.lr:g}" + (f" {cfg.optimizer}" if several else "")
            grouped[label][setting].append(h)
    result = {}
    for label, runs in grouped.items():
        lengths = {len(h["epoch"]) for hs in runs.values() for h in hs}
        if len(lengths) > 1:
            raise PBInputError(f"runs of {label!r} have different numbers of epochs; "
                               "use one --epochs per --out folder")
        result[label] = best_setting(runs)
    return result


def draw(which: str, curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, finals = [], []
    if which == "est":
        panels = sorted({int(lbl.split("n=")[1]) for lbl in curves})
        groups = {f"n={n}": [lbl for lbl in curves if lbl.endswith(f"n={n}")] for n in panels}
    else:
        groups = {"": list(curves)}
    fig, axes = plt.subplots(1, len(groups) + 1, figsize=(4.2 * (len(groups) + 1), 3.4),
                             squeeze=False)
    axes = axes[0]
    for ax, (title, labels) in zip(axes, groups.items()):
        for lbl in sorted(labels):
            setting, hs = curves[lbl]
            y = np.stack([h["val_loss_chosen"] for h in hs])
            x = hs[0]["epoch"]
            mean = y.mean(0)
            se = y.std(0, ddof=1) / math.sqrt(len(hs)) if len(hs) > 1 else 0 * mean
            line = ax.plot(x, mean, label=f"{lbl} ({setting}, {len(hs)} seeds)")[0]
            ax.fill_between(x, mean - se, mean + se, alpha=0.2, color=line.get_color())
            for e, m, s in zip(x, mean, se):
                rows.append({"figure": which, "curve": lbl, "setting": setting, "epoch": int(e),
                             "mean_val_loss": m, "se": s, "seeds": len(hs)})
        ax.set_title(title or which)
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation loss (MAE)")
        ax.legend(fontsize=6)
    ax = axes[-1]
    for i, lbl in enumerate(sorted(curves)):
        setting, hs = curves[lbl]
        vals = [float(h["val_loss_chosen"][-1]) for h in hs]
        ax.scatter(np.full(len(vals), i), vals, s=12)
        finals += [{"figure": which, "curve": lbl, "setting": setting, "seed_index": j,
                    "final_val_loss": v} for j, v in enumerate(vals)]
    ax.set_xticks(range(len(curves)), sorted(curves), rotation=60, fontsize=6)
    ax.set_title("final loss per seed")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    io.write_csv(path.with_suffix(".csv"), rows)
    io.write_csv(path.with_name(path.stem + "_final.csv"), finals)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m analysis.regression", description=__doc__)
    ap.add_argument("--figures", default=",".join(FIGURES), help="subset of est,param,approaches")
    ap.add_argument("--epochs", type=positive_int, default=300)
    ap.add_argument("--seeds", type=positive_int, default=10)
    ap.add_argument("--ns", type=positive_int_list, default=[2, 10, 100, 1000],
                    help="n values of the estimator comparison (default 2,10,100,1000)")
    ap.add_argument("--out", default="runs/regression", help="folder of the runs")
    ap.add_argument("--fig-dir", default=None,
                    help="where the figures go (default: --out; --fig-dir figures regenerates "
                    "the committed ones)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--collect", action="store_true", help="only draw the finished runs")
    ap.add_argument("--threads", type=thread_count, default=None, help="torch CPU threads")
    args = ap.parse_args(argv)
    try:
        set_threads(args.threads)
        which = [w for w in args.figures.split(",") if w]
        bad = [w for w in which if w not in FIGURES]
        if bad:
            raise PBInputError(f"unknown figure {bad[0]!r}; choose from {', '.join(FIGURES)}")
        ns = args.ns
        items = {w: plan(w, ns, args.seeds) for w in which}
        for its in items.values():
            for _, _, cfg in its:
                cfg.validate()
        out = Path(args.out) / f"epochs{args.epochs}"
        fig_dir = check_out_dir(args.fig_dir if args.fig_dir is not None else args.out,
                                "--fig-dir")
        if not args.collect:
            check_out_dir(out, "--out")
        if not args.collect:
            dev = resolve_device(args.device)
            problem = make_problem(0, dev)  # drawn once, shared by every run
            todo = [cfg for its in items.values() for _, _, cfg in its]
            for i, cfg in enumerate(todo):
                print(f"[{i + 1}/{len(todo)}] {run_name(cfg)}", file=sys.stderr, flush=True)
                train(cfg, epochs=args.epochs, out=out, device=str(dev), problem=problem,
                      progress=False)
        for w, its in items.items():
            curves = collect(w, its, out, args.epochs)
            if not curves:
                print(f"{w}: no finished runs in {out}", file=sys.stderr)
                continue
            path = fig_dir / f"maskednnregression_{w}.png"
            draw(w, curves, path)
            print(f"wrote {path}")
    except PBInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
