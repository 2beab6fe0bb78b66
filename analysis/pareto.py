"""``python -m analysis.pareto RUNS... --out DIR``: Pareto fronts and per-layer sparsity of
pruning runs (`fig:supermask_results`, `fig:joint_pruning_results`,
`fig:joint_pruning_per_layer`).

RUNS are run folders of ``python -m pbscale.prune`` (with ``config.json`` and ``summary.json``)
or folders holding them. Runs that differ only in their seed are averaged (test accuracy and
weights remaining; the seed count is reported). A method's label is its name (``cp``, ``mp``,
``gmp``, ``dense``) or, for MC, ``<estimator>-<param>-n<n>``, with ``-<init>`` when the weights
are not ``kaiming_normal``; its colour is its method's in the method registry. For every (model,
mode) this writes ``pareto_<model>_<mode>.png`` (test accuracy against weights remaining over
the masked tensors, log axis; each label's points and its Pareto front: the points no other
point of the label beats in both accuracy and sparsity) and ``layers_<model>_<mode>.png`` (per
layer fraction remaining of each label's most accurate run at most ``--layer-max`` remaining),
with ``runs.csv``, ``pareto.csv`` and ``layers.csv`` holding the plotted numbers.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from analysis.cli import atomic_write_text, save_figure, write_csv
from analysis.cli import run as cli_run
from pbexact.cli import ArgumentParser
from pbexact.errors import PBInputError
from pbscale.methods import REGISTRY, names

#: The methods whose runs are labelled with their parametrization and n (the MC estimators).
MC = names(samples=True)


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """Finished run folders (``summary.json`` present) at or directly under ``paths``."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise PBInputError(f"{p} does not exist; pass run folders or folders holding them")
        if (p / "summary.json").exists():
            found.append(p)
        else:
            found += sorted(q for q in p.iterdir() if (q / "summary.json").exists())
    if not found:
        raise PBInputError("no finished runs (folders with summary.json) under "
                           f"{', '.join(map(str, paths))}; run python -m pbscale.prune first")
    return found


#: The weight initialization runs are labelled with when it is not this one.
DEFAULT_INIT = "kaiming_normal"
#: Marker and line style of a method's 1st, 2nd, ... label (its colour is the registry's).
STYLES = [("o", "-"), ("s", "--"), ("^", ":"), ("v", "-."), ("D", "--")]


def label(task: dict) -> str:
    m = task["method"]
    base = f"{m}-{task['param']}-n{task['n']}" if m in MC else m
    init = task.get("init", DEFAULT_INIT)
    return base if init == DEFAULT_INIT else f"{base}-{init}"


def styles(labels: Sequence[str], methods: dict[str, str]) -> dict[str, dict]:
    """Plot keywords per label: the colour of its method in the method registry, and a marker
    and line style that tell apart the labels of one method (in the order given)."""
    out, seen = {}, defaultdict(int)
    for lab in labels:
        m = methods[lab]
        marker, ls = STYLES[seen[m] % len(STYLES)]
        seen[m] += 1
        fam = REGISTRY.get(m)
        out[lab] = {"marker": marker, "linestyle": ls,
                    **({"color": fam.color} if fam is not None else {})}
    return out


def read_run(folder: Path) -> dict:
    cfg = json.loads((folder / "config.json").read_text())
    summ = json.loads((folder / "summary.json").read_text())
    task = cfg["task"]
    layers = {k[len("final_remaining_"):]: v for k, v in summ.items()
              if k.startswith("final_remaining_") and k != "final_remaining_all"}
    return {"run": folder.name, "model": task["model"], "mode": task["mode"],
            "label": label(task), "method": task["method"], "lam": task["lam"],
            "target": task["target"], "mask_lr": task["mask_lr"], "epochs": task["epochs"],
            "seed": task["seed"], "test_acc": summ["final_test_acc"],
            "val_acc": summ["final_val_acc"], "remaining": summ["final_remaining"],
            "remaining_all": summ["final_remaining_all"],
            "seconds_per_epoch": summ["seconds_per_epoch"], "layers": layers,
            "key": json.dumps({k: v for k, v in task.items() if k != "seed"}, sort_keys=True),
            "command": command(task)}


def command(task: dict) -> str:
    """The shortest ``python -m pbscale.prune`` command line of a run's configuration: the
    options that differ from the defaults (``--data-dir`` left out)."""
    from pbscale.prune import PruneConfig

    default = PruneConfig(model=task["model"], mode=task["mode"]).resolved()
    parts = ["python -m pbscale.prune"]
    for k, v in task.items():
        if getattr(default, k, None) != v or k in ("model", "mode", "method"):
            if isinstance(v, bool):
                if v:
                    parts.append(f"--{k.replace('_', '-')}")
            else:
                parts.append(f"--{k.replace('_', '-')} {v}")
    return " ".join(parts)


def average_seeds(runs: list[dict]) -> list[dict]:
    """One point per configuration: means over its seeds."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        groups[r["key"]].append(r)
    out = []
    for rs in groups.values():
        p = dict(rs[0])
        for k in ("test_acc", "val_acc", "remaining", "remaining_all", "seconds_per_epoch"):
            p[k] = sum(r[k] for r in rs) / len(rs)
        p["seeds"] = len(rs)
        p["layers"] = {k: sum(r["layers"][k] for r in rs) / len(rs) for k in rs[0]["layers"]}
        out.append(p)
    return out


def pareto_front(points: list[dict]) -> list[dict]:
    """Points not dominated (another point with remaining <= and test_acc >=, one strictly),
    sorted by remaining."""
    front = []
    for p in points:
        dominated = any(q["remaining"] <= p["remaining"] and q["test_acc"] >= p["test_acc"]
                        and (q["remaining"] < p["remaining"] or q["test_acc"] > p["test_acc"])
                        for q in points)
        if not dominated:
            front.append(p)
    return sorted(front, key=lambda p: p["remaining"])


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m analysis.pareto", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders or folders holding them")
    ap.add_argument("--out", required=True, help="folder for the figures and CSVs")
    ap.add_argument("--layer-max", type=float, default=1.0,
                    help="per-layer plot: each label's most accurate run at most this remaining")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [read_run(f) for f in find_runs(args.runs)]
    points = average_seeds(runs)
    out = Path(args.out)
    cols = ["model", "mode", "label", "lam", "target", "mask_lr", "epochs", "seeds",
            "test_acc", "val_acc", "remaining", "remaining_all", "seconds_per_epoch"]
    pts = sorted(points, key=lambda p: (p["model"], p["mode"], p["label"], p["remaining"]))
    write_csv(out / "runs.csv", cols, [[p[c] for c in cols] for p in pts])
    lines = ["| command | epochs | seeds | test acc | remaining (masked) | remaining (all) | "
             "s/epoch |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for p in pts:
        lines.append(f"| `{p['command']}` | {p['epochs']} | {p['seeds']} | "
                     f"{p['test_acc']:.4f} | {p['remaining']:.4%} | {p['remaining_all']:.4%} | "
                     f"{p['seconds_per_epoch']:.1f} |")
    atomic_write_text(out / "runs.md", "\n".join(lines) + "\n")
    pareto_rows, layer_rows = [], []
    for (model, mode) in sorted({(p["model"], p["mode"]) for p in points}):
        sel = [p for p in points if (p["model"], p["mode"]) == (model, mode)]
        fig, ax = plt.subplots(figsize=(6, 4))
        fig2, ax2 = plt.subplots(figsize=(6, 4))
        labs = sorted({p["label"] for p in sel})
        look = styles(labs, {p["label"]: p["method"] for p in sel})
        for lab in labs:
            group = [p for p in sel if p["label"] == lab]
            front = pareto_front(group)
            line = ax.plot([p["remaining"] for p in front], [p["test_acc"] for p in front],
                           label=lab, **look[lab])[0]
            ax.scatter([p["remaining"] for p in group], [p["test_acc"] for p in group],
                       color=line.get_color(), alpha=0.35, s=12)
            for p in front:
                pareto_rows.append([model, mode, lab, p["lam"], p["target"], p["remaining"],
                                    p["test_acc"], p["seeds"]])
            eligible = [p for p in group if p["remaining"] <= args.layer_max]
            if eligible:
                best = max(eligible, key=lambda p: p["test_acc"])
                names = list(best["layers"])
                ax2.plot(range(len(names)), [best["layers"][n] for n in names], **look[lab],
                         label=f"{lab} ({best['remaining']:.2%}, acc {best['test_acc']:.3f})")
                for n in names:
                    layer_rows.append([model, mode, lab, best["remaining"], n,
                                       best["layers"][n]])
        ax.set_xscale("log")
        ax.set_xlabel("weights remaining (fraction of masked weights, log)")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{model}, {mode}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        save_figure(fig, [out / f"pareto_{model}_{mode}.png"])
        if ax2.lines:
            ax2.set_xticks(range(len(names)), names, rotation=60, fontsize=7)
            ax2.set_yscale("log")
            ax2.set_ylabel("fraction remaining in the layer")
            ax2.set_title(f"{model}, {mode}: per layer")
            ax2.legend(fontsize=7)
            save_figure(fig2, [out / f"layers_{model}_{mode}.png"])
        plt.close(fig)
        plt.close(fig2)
    write_csv(out / "pareto.csv", ["model", "mode", "label", "lam", "target", "remaining",
                                   "test_acc", "seeds"], pareto_rows)
    write_csv(out / "layers.csv", ["model", "mode", "label", "run_remaining", "layer",
                                   "remaining"], layer_rows)
    print(f"{len(runs)} runs ({len(points)} configurations) -> {out}")
    for r in pareto_rows:
        print(f"  {r[0]} {r[1]} {r[2]:<22} remaining {r[5]:.4%}  test_acc {r[6]:.4f}")
    if any(math.isnan(p["test_acc"]) for p in points):
        print("warning: some runs have no test accuracy (nan)")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli_run(main))
