"""Do the paper's supermask, pruning and NN-regression conclusions hold? (`tab:app_results_summ`)

    python -m analysis.scale_report --runs runs/claims --out figures/claims
    python -m analysis.scale_report --replot --out figures/claims

Reads finished run folders of ``python -m pbscale.prune`` (supermask and joint) and
``python -m pbscale.regress`` (MaskedNNRegression) under --runs (at any depth; the sweeps
``sweeps/claims_*.toml`` write them), copies their small files (``config.json``, ``metrics.csv``
or ``history.csv``, ``summary.json``; not checkpoints or masks) to ``OUT/runs/<name of the --runs
folder>/`` and, from those
copies only, evaluates every claim of :data:`analysis.scale_claims.SCALE_CLAIMS`. ``--replot`` skips
the copy, so a fresh clone redraws the committed tables and figures from the committed files.
Writes, under --out:

* ``agreement.md`` / ``agreement.csv``: per claim the paper's wording, the criterion, the outcome
  (holds / fails / noise / no data) with its numbers, and the scale it was run at next to the
  paper's (model, data, epochs, seeds, n);
* ``claims/<claim>.csv``: the numbers behind each verdict;
* ``points_<experiment>.csv``: every pruning setting (seed means: remaining fraction, test
  accuracy, its seed s.d., on its group's Pareto front or not, distance of its per-layer
  allocation from the dense one) and ``points_regression.csv`` (final validation loss per
  setting);
* ``pareto_<experiment>.png``: test accuracy against weights remaining, one front per group;
* ``layers_over_training.png`` / ``.csv``: remaining weights per layer over training (left: the
  fraction left in each layer; right: each layer's share of the weights left) for one joint run
  of CP, MC and GMP at matched sparsity (`sec:sparsities_throughout`): the sparsest MC front run
  with accuracy >= ``ACC_FLOOR`` and the CP and GMP front runs nearest to it.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np

from analysis.cli import atomic_write_bytes, atomic_write_text, run, save_figure, write_csv
from analysis.scale_claims import MC_PRUNE, SCALE_CLAIMS, evaluate_scale, joint_fronts
from analysis.scale_runs import (
    ACC_FLOOR,
    SCALE_OUTCOMES,
    RunRecord,
    allocation_shares,
    front,
    points,
)
from pbexact.cli import ArgumentParser
from pbexact.errors import PBInputError

EXPERIMENTS = ("supermask", "joint", "regression")
#: The files of a run folder the report reads (and copies); checkpoints and masks stay behind.
SMALL_FILES = ("config.json", "metrics.csv", "history.csv", "summary.json")
#: The paper's scale of each experiment (`sec:app_supermask_setup`,
#: `sec:app_joint_pruning_setup`, `sec:app_maskednnregression`).
PAPER_SCALE = {
    "supermask": "LeNet/MNIST and Conv6/CIFAR-10; 200 epochs; 5 seeds; n in {2, 10, 100}; "
                 "lambda 1e-1..1e-5",
    "joint": "ResNet-20 and VGG-19/CIFAR-10; 200 epochs; 5 seeds; n in {2, 10, 100}; "
             "lambda 1e-1..1e-8 (CP to 1e-10)",
    "regression": "MaskedNNRegression (d = 8,050); 300 epochs; 10 seeds; n in {2, 10, 100, "
                  "1000}",
}


# ------------------------------------------------------------------------------- reading


def find_run_folders(roots: Sequence[Path]) -> list[Path]:
    """Finished run folders (``summary.json`` and ``config.json``) at any depth under roots,
    sorted."""
    found: set[Path] = set()
    for root in roots:
        if not root.exists():
            raise PBInputError(f"{root} does not exist; pass folders holding run folders")
        for s in root.rglob("summary.json"):
            if (s.parent / "config.json").exists():
                found.add(s.parent)
    return sorted(found)


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise PBInputError(f"damaged run file {path}; delete the run folder and run it "
                           "again") from None


@cache
def layer_sizes(model: str, mask_head: bool, mask_shortcuts: bool) -> dict[str, int]:
    """{layer: dense weights} of the masked tensors of a pruning run, keyed as its metrics'
    ``remaining_<layer>`` columns."""
    from pbscale.models import build_model

    net = build_model(model)
    counts = net.layer_counts(net.masked_names(mask_head, mask_shortcuts))
    return {k.removesuffix(".weight"): v for k, v in counts.items()}


def read_record(folder: Path) -> RunRecord | None:
    """The :class:`RunRecord` of one finished run folder; None for folders of other tools."""
    cfg, summ = _json(folder / "config.json"), _json(folder / "summary.json")
    task = cfg.get("task", {})
    if "mode" in task:
        settings = {k: v for k, v in task.items() if k != "seed"}
        layers = {k[len("final_remaining_"):]: float(v) for k, v in summ.items()
                  if k.startswith("final_remaining_") and k != "final_remaining_all"}
        return RunRecord(task["mode"], task["method"], settings, int(task["seed"]),
                         float(summ["final_remaining"]), float(summ["final_test_acc"]), layers,
                         layer_sizes(task["model"], bool(task.get("mask_head")),
                                     bool(task.get("mask_shortcuts"))))
    if task.get("name") == "regression":
        method = cfg["method"]
        settings = {k: v for k, v in method.items() if k not in ("seed", "chunk", "method")}
        settings.update(epochs=int(cfg["loop"]["epochs"]), data_seed=task.get("data_seed"))
        hist = _table(folder / "history.csv")
        return RunRecord("regression", method["method"], settings, int(method["seed"]),
                         final_loss=float(summ["final_val_loss_chosen"]),
                         epochs=np.array(hist["epoch"]), losses=np.array(hist["val_loss_chosen"]))
    return None


def _table(path: Path) -> dict[str, list[float]]:
    """Columns of a run's metrics CSV as floats."""
    import csv

    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
        return {k: [float(r[k]) for r in rows] for k in (rows[0] if rows else {})}
    except (OSError, ValueError, KeyError):
        raise PBInputError(f"damaged run file {path}; delete the run folder and run it "
                           "again") from None


def copy_small_files(roots: Sequence[Path], dest: Path) -> int:
    """Copy the small files of every finished run folder under roots (not those already under
    dest) to dest/<root's name>/<path relative to the root>; returns the number of run folders
    copied."""
    folders = 0
    dest_abs = dest.resolve()
    for root in roots:
        for folder in find_run_folders([root]):
            if folder.resolve().is_relative_to(dest_abs):
                continue
            rel = Path(root.resolve().name) / folder.relative_to(root)
            for name in SMALL_FILES:
                src = folder / name
                if src.exists():
                    atomic_write_bytes(dest / rel / name, src.read_bytes())
            folders += 1
    return folders


def load(runs_dir: Path) -> list[tuple[RunRecord, Path]]:
    """(record, folder) of every run folder under runs_dir, sorted by folder."""
    out = []
    for folder in find_run_folders([runs_dir]):
        r = read_record(folder)
        if r is not None:
            out.append((r, folder))
    return out


# ------------------------------------------------------------------------------- tables


def group_label(r: RunRecord) -> str:
    """The curve a run belongs to: ``cp rmsprop``, ``arms escort n=10``, ``gmp``, ``loorf
    sigmoid n=10 lr=0.1`` ..."""
    if r.experiment == "regression":
        if r.method == "cp":
            return f"cp {r.get('optimizer')}"
        return f"{r.method} {r.get('param')} n={r.get('n')}"
    if r.method == "cp":
        return f"cp {r.get('mask_opt')}"
    if r.method in MC_PRUNE:
        return f"{r.method} {r.get('param')} n={r.get('n')}"
    return r.method


def _scale(records: Sequence[RunRecord], experiment: str) -> str:
    rs = [r for r in records if r.experiment == experiment]
    if not rs:
        return "not run"
    seeds: dict[str, set[int]] = {}
    for r in rs:
        seeds.setdefault(r.setting, set()).add(r.seed)
    k = sorted({len(s) for s in seeds.values()})
    epochs = sorted({int(r.get("epochs")) for r in rs})
    if experiment == "regression":
        model = "MaskedNNRegression (d = 8,050)"
        ns = sorted({int(r.get("n")) for r in rs if r.method != "cp"})
    else:
        model = ", ".join(sorted({f"{r.get('model')}/{r.get('dataset')}" for r in rs}))
        if any(r.get("mask_head") for r in rs):
            model += " (head masked)"
        ns = sorted({int(r.get("n")) for r in rs if r.method in MC_PRUNE})
        lams = sorted({float(r.get("lam")) for r in rs if r.method in ("cp", *MC_PRUNE)})
    text = (f"{model}; {'/'.join(map(str, epochs))} epochs; "
            f"{'-'.join(map(str, sorted({k[0], k[-1]})))} seeds per setting; "
            + (f"n in {{{', '.join(map(str, ns))}}}" if ns else "no MC runs"))
    if experiment != "regression" and lams:
        text += f"; lambda {lams[-1]:g}..{lams[0]:g}"
    return f"{text}; {len(rs)} runs"


def agreement(records: Sequence[RunRecord], experiments: Sequence[str]) -> list[dict]:
    rows = []
    for claim, v in evaluate_scale(records, experiments):
        rows.append({"bullet": claim.bullet, "claim": claim.key, "row": claim.row,
                     "paper": claim.paper, "criterion": claim.criterion, "outcome": v.outcome,
                     "detail": v.detail, "our_scale": _scale(records, claim.experiment),
                     "paper_scale": PAPER_SCALE[claim.experiment], "values": v.values})
    return rows


def markdown(rows: list[dict], n_runs: int) -> str:
    """agreement.md: the verdicts, the scale of each experiment next to the paper's, and the
    criteria."""
    beyond = {c.key for c in SCALE_CLAIMS if c.beyond}
    paper = [r for r in rows if r["claim"] not in beyond]
    extra = [r for r in rows if r["claim"] in beyond]
    counts = {o: sum(r["outcome"] == o for r in paper) for o in SCALE_OUTCOMES}
    lines = ["# Supermask, pruning and NN-regression rows of tab:app_results_summ",
             "",
             f"Generated by `python -m analysis.scale_report` from {n_runs} finished runs "
             "(`runs/` next to this file). The paper's rows: "
             + ", ".join(f"{v} {k}" for k, v in counts.items()) + "."]

    def table(rs: list[dict], head: str) -> list[str]:
        return ["", f"| # | {head} | outcome | numbers |", "| --- | --- | --- | --- |"] + [
            f"| {r['bullet']} | {r['paper']} | **{r['outcome']}** | "
            f"{r['detail'].replace('|', '/')} |" for r in rs]

    lines += table(paper, "paper")
    if extra:
        lines += ["", "## Beyond the paper", "",
                  "Methods the paper does not run (docs/beyond.md), each front set against CP's."]
        lines += table(extra, "statement")
    lines += ["", "## Scale", "", "| experiment | ours | paper's |", "| --- | --- | --- |"]
    seen = []
    for r in rows:
        exp = next(c.experiment for c in SCALE_CLAIMS if c.key == r["claim"])
        if exp not in seen:
            seen.append(exp)
            lines.append(f"| {exp} | {r['our_scale']} | {r['paper_scale']} |")
    lines += ["", "## Criteria", ""]
    lines += [f"- {r['bullet']} `{r['claim']}`: {r['criterion']}" for r in rows]
    return "\n".join(lines) + "\n"


def _fmt(x) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def write_tables(out: Path, rows: list[dict], n_runs: int) -> None:
    cols = ["bullet", "claim", "row", "paper", "criterion", "outcome", "detail", "our_scale",
            "paper_scale"]
    write_csv(out / "agreement.csv", cols, [[r[c] for c in cols] for r in rows])
    atomic_write_text(out / "agreement.md", markdown(rows, n_runs))
    for r in rows:
        body = [["outcome", r["outcome"]], ["detail", r["detail"]],
                ["criterion", r["criterion"]]]
        body += [[k, _fmt(float(v))] for k, v in sorted(r["values"].items())]
        write_csv(out / "claims" / f"{r['claim']}.csv", ["name", "value"], body)


def write_points(out: Path, records: Sequence[RunRecord], experiment: str) -> list[dict]:
    """points_<experiment>.csv; returns the rows (for the Pareto figure)."""
    rs = [r for r in records if r.experiment == experiment]
    rows = []
    if experiment == "regression":
        groups: dict[str, list[RunRecord]] = {}
        for r in rs:
            groups.setdefault(r.setting, []).append(r)
        for key in sorted(groups):
            g = groups[key]
            f = np.array([r.final_loss for r in g])
            s = g[0].settings
            rows.append([g[0].method, s.get("n"), s.get("param"), s.get("lr"),
                         s.get("optimizer"), s.get("epochs"), len(g), _fmt(float(f.mean())),
                         _fmt(float(f.std(ddof=1) / math.sqrt(len(f))) if len(f) > 1 else "")])
        write_csv(out / "points_regression.csv", ["method", "n", "param", "lr", "optimizer",
                                                  "epochs", "seeds", "final_val_loss",
                                                  "stderr"], rows)
        return []
    by_label: dict[str, list[RunRecord]] = {}
    for r in rs:
        by_label.setdefault(group_label(r), []).append(r)
    table, plotted = [], []
    for lab in sorted(by_label):
        pts = points(by_label[lab])
        on = {id(p) for p in front(pts)}
        for p in sorted(pts, key=lambda p: (p.remaining, p.accuracy)):
            s = p.settings
            dist = sum(abs(p.shares[k] - p.dense[k]) for k in p.dense) / 2 if p.dense else 0.0
            table.append([lab, p.method, s.get("lam"), s.get("mask_opt"), s.get("mask_lr"),
                          s.get("target"), s.get("n"), s.get("param"), s.get("epochs"),
                          p.seeds, _fmt(p.remaining), _fmt(p.accuracy),
                          _fmt(p.acc_sd) if p.seeds > 1 else "", int(id(p) in on), _fmt(dist)])
            plotted.append({"label": lab, "remaining": p.remaining, "accuracy": p.accuracy,
                            "front": id(p) in on})
    write_csv(out / f"points_{experiment}.csv",
              ["group", "method", "lam", "mask_opt", "mask_lr", "target", "n", "param", "epochs",
               "seeds", "remaining", "test_acc", "test_acc_sd", "on_front",
               "allocation_distance"], table)
    return plotted


# ------------------------------------------------------------------------------- figures


def plot_pareto(out: Path, plotted: list[dict], experiment: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    colors = plt.get_cmap("tab20").colors  # one color per group: more groups than tab10 has
    labels = sorted({p["label"] for p in plotted})
    for i, lab in enumerate(labels):
        g = [p for p in plotted if p["label"] == lab and p["remaining"] > 0]
        if not g:
            continue
        fr = sorted((p for p in g if p["front"]), key=lambda p: p["remaining"])
        line = ax.plot([p["remaining"] for p in fr], [p["accuracy"] for p in fr],
                       marker="os^D"[i // len(colors) % 4], ms=3, label=lab,
                       color=colors[(2 * i + i // 10) % len(colors)])[0]
        ax.scatter([p["remaining"] for p in g], [p["accuracy"] for p in g], s=8, alpha=0.3,
                   color=line.get_color())
    ax.axhline(ACC_FLOOR, color="grey", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("weights remaining (fraction of the masked weights)")
    ax.set_ylabel("test accuracy (seed mean)")
    ax.set_title(f"{experiment}: Pareto fronts")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    save_figure(fig, [out / f"pareto_{experiment}.png"])
    plt.close(fig)


def chosen_runs(loaded: Sequence[tuple[RunRecord, Path]]) -> list[tuple[str, RunRecord, Path]]:
    """One joint run each of MC, CP and GMP at matched sparsity: the sparsest MC front setting
    with accuracy >= ACC_FLOOR (else the median CP front setting) and the CP and GMP front
    settings nearest to it in log remaining; the lowest seed of each setting."""
    joint = [(r, f) for r, f in loaded if r.experiment == "joint"]
    fronts = joint_fronts([r for r, _ in joint])
    if fronts["MC"]:
        target = fronts["MC"][0].remaining
    elif fronts["CP"]:
        target = fronts["CP"][len(fronts["CP"]) // 2].remaining
    else:
        return []
    out = []
    for name in ("CP", "MC", "GMP"):
        if not fronts[name]:
            continue
        p = min(fronts[name], key=lambda p: abs(math.log(p.remaining / target)))
        r, f = min(((r, f) for r, f in joint if r.method == p.method
                    and r.settings == p.settings), key=lambda rf: rf[0].seed)
        out.append((name, r, f))
    return out


def plot_layers(out: Path, chosen: list[tuple[str, RunRecord, Path]]) -> None:
    """layers_over_training.png / .csv (`fig:joint_pruning_per_layer`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    fig, axes = plt.subplots(len(chosen), 2, figsize=(9, 2.6 * len(chosen)), squeeze=False)
    for (name, r, folder), (ax1, ax2) in zip(chosen, axes):
        hist = _table(folder / "metrics.csv")
        layers = list(r.layer_sizes)
        ep = hist["epoch"]
        frac = {k: hist[f"remaining_{k}"] for k in layers}
        shares = [allocation_shares({k: frac[k][i] for k in layers}, r.layer_sizes)
                  for i in range(len(ep))]
        kept = [i for i in range(len(ep)) if any(frac[k][i] > 0 for k in layers)]
        for k in layers:  # log axis: a layer with nothing left is not drawn at that epoch
            ax1.plot(ep, [x if x > 0 else math.nan for x in frac[k]], marker="o", ms=3, label=k)
        # shares only where some weight is left (CP's epoch 0: theta = 1/2 rounds to no weight)
        ax2.stackplot([ep[i] for i in kept], *[[shares[i][k] for i in kept] for k in layers],
                      labels=layers, alpha=0.8)
        for i, e in enumerate(ep):
            for k in layers:
                rows.append([name, folder.name, int(e), k, _fmt(frac[k][i]), _fmt(shares[i][k])])
        title = (f"{name}: {group_label(r)}, {r.remaining:.2%} left, acc {r.accuracy:.3f}")
        ax1.set_title(title, fontsize=8)
        ax1.set_yscale("log")
        ax1.set_ylabel("fraction left in layer", fontsize=7)
        ax2.set_ylabel("share of weights left", fontsize=7)
        ax2.set_ylim(0, 1)
        ax1.legend(fontsize=6)
        for ax in (ax1, ax2):
            ax.set_xlabel("epoch", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.tight_layout()
    save_figure(fig, [out / "layers_over_training.png"])
    plt.close(fig)
    write_csv(out / "layers_over_training.csv", ["method", "run", "epoch", "layer", "remaining",
                                                 "share"], rows)


# ------------------------------------------------------------------------------- main


def report(out: Path, experiments: Sequence[str]) -> list[dict]:
    """Everything under ``out`` from the run files in ``out/runs``; returns the agreement rows."""
    runs_dir = out / "runs"
    if not runs_dir.is_dir():
        raise PBInputError(f"{runs_dir} does not exist; run without --replot and with --runs "
                           "first")
    loaded = load(runs_dir)
    records = [r for r, _ in loaded if r.experiment in experiments]
    rows = agreement(records, experiments)
    write_tables(out, rows, len(records))
    for exp in experiments:
        if any(r.experiment == exp for r in records):
            plotted = write_points(out, records, exp)
            if exp != "regression":
                plot_pareto(out, plotted, exp)
    if "joint" in experiments:
        chosen = chosen_runs([(r, f) for r, f in loaded if r.experiment == "joint"])
        if chosen:
            plot_layers(out, chosen)
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m analysis.scale_report",
                       description=__doc__.split("\n\n")[0],
                       epilog="The run folders come from python -m pbscale.sweep run "
                              "sweeps/claims_*.toml (see each file's header for its cost).")
    p.add_argument("--runs", type=Path, nargs="+", default=None,
                   help="folders holding finished run folders (searched at any depth)")
    p.add_argument("--out", type=Path, default=Path("results/claims"),
                   help="folder for the tables, figures and the copied run files (the "
                        "committed study: figures/claims)")
    p.add_argument("--experiments", default=",".join(EXPERIMENTS),
                   help="comma-separated subset of " + ", ".join(EXPERIMENTS))
    p.add_argument("--replot", action="store_true",
                   help="only redraw from OUT/runs (no --runs, nothing copied)")
    return p


def parse_experiments(text: str) -> list[str]:
    chosen = [e.strip() for e in text.split(",") if e.strip()]
    bad = [e for e in chosen if e not in EXPERIMENTS]
    if bad or not chosen:
        raise PBInputError(f"unknown experiment {bad[0] if bad else text!r}; choose from "
                           f"{', '.join(EXPERIMENTS)}")
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    experiments = parse_experiments(args.experiments)
    if args.replot and args.runs:
        raise PBInputError("--replot redraws from OUT/runs only; drop --runs")
    if not args.replot:
        if not args.runs:
            raise PBInputError("no --runs given; pass the folders holding the run folders, or "
                               "--replot")
        n = copy_small_files(args.runs, args.out / "runs")
        print(f"copied the small files of {n} run folders to {args.out / 'runs'}")
    rows = report(args.out, experiments)
    for r in rows:
        print(f"{r['bullet']:>2} {r['claim']:<26} {r['outcome']:<8} {r['detail'][:150]}")
    print(f"-> {args.out / 'agreement.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
