"""Do the paper's supermask, pruning and NN-regression conclusions hold? (`tab:app_results_summ`)

    python -m analysis.scale_report --runs runs/claims --out figures/claims
    python -m analysis.scale_report --replot --out figures/claims
    python -m analysis.scale_report --runs my/runs --compare cp arms
    python -m analysis.scale_report --replot --out figures/claims20 --baseline figures/claims

Reads finished run folders of ``python -m pbscale.prune`` (supermask and joint) and
``python -m pbscale.regress`` (MaskedNNRegression) under --runs (at any depth; the sweeps
``sweeps/claims_*.toml`` write them), copies their small files (``config.json``, ``metrics.csv``
or ``history.csv``, ``summary.json``; not checkpoints or masks) to ``OUT/runs/<name of the --runs
folder>/`` (two --runs folders of one name: ``<parent>-<name>`` each; a different run already
under that name is refused, never overwritten) and, from those copies only, evaluates every claim
of :data:`analysis.scale.claims.SCALE_CLAIMS`, as reported and under each robustness reading
(:mod:`analysis.scale.robust`). ``--replot`` skips the copy, so a fresh clone redraws the
committed tables and figures from the committed files. A damaged run folder is skipped with one
warning line. Writes, under --out:

* ``agreement.md`` / ``agreement.csv``: per claim the paper's wording, the criterion, the outcome
  (holds / fails / noise / no data), its outcome under each reading and whether it is robust,
  each sub-verdict with its numbers on its own line, and the scale it was run at next to the
  paper's (model, data, epochs, seeds, n);
* ``claims/<claim>.csv``: the numbers behind each verdict;
* ``points_<experiment>.csv``: every pruning setting (seed means: remaining fraction, test
  accuracy, its seed s.d., on its group's Pareto front or not, distance of its per-layer
  allocation from the dense one) and ``points_regression.csv`` (final validation loss per
  setting);
* ``pareto_<experiment>.png``: test accuracy against weights remaining, one front per group;
* ``hyper_generalization.png`` / ``.csv``: supermask MC settings run at two or more n, linked
  across n (`fig:app_hyper_gen_scatter`, `fig:app_hyper_gen_parallel`), with the console's
  reading of the paper's observation (:mod:`analysis.scale.hyper`);
* ``layers_over_training.png`` / ``.csv``: remaining weights per layer over training (left: the
  fraction left in each layer; right: each layer's share of the weights left) for one joint run
  of CP, MC and GMP at matched sparsity (`sec:sparsities_throughout`): the sparsest MC front run
  with accuracy >= ``ACC_FLOOR`` and the CP and GMP front runs nearest to it;
* with ``--baseline STUDY...``: ``training_length.md`` / ``.csv``, rows 1-8's verdicts in each
  baseline study (its ``runs/`` folder) beside this one's, and the rows that changed.

``--compare A B`` answers "does A beat B on these runs at matched sparsity?" with the claims'
front criterion (A, B: a method name, a group such as ``cp rmsprop``, or a recorded label), per
experiment and training budget, with its robustness; it writes nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from analysis.cli import run
from analysis.pareto import fraction_axis
from analysis.scale.claims import joint_fronts
from analysis.scale.compare import compare
from analysis.scale.fronts import front
from analysis.scale.hyper import COLUMNS as HYPER_COLUMNS
from analysis.scale.hyper import carry_over, carry_over_text, generalization_rows
from analysis.scale.outputs import Outputs, check_in_folder, check_out, inside, out_folder
from analysis.scale.robust import by_study, judge
from analysis.scale.run_files import (
    DIVERGED,
    DamagedRun,
    DivergedRun,
    PruneRun,
    budget_text,
    finished_or_diverged,
    lam_text,
    read_columns,
    read_each,
    read_run,
)
from analysis.scale.runs import (
    ACC_FLOOR,
    STALLED_ACC,
    RunRecord,
    allocation_shares,
    by_budget,
    finished,
    group_label,
    legend_label,
    points,
    stalled,
)
from analysis.scale.tables import (
    agreement_rows,
    claim_rows,
    console_lines,
    fmt,
    length_markdown,
    length_rows,
    markdown,
    scale_text,
    warning_lines,
)
from pbexact.cli import ArgumentParser
from pbexact.errors import PBInputError

EXPERIMENTS = ("supermask", "joint", "regression")
#: The files of a run folder the report reads (and copies); checkpoints and masks stay behind.
SMALL_FILES = ("config.json", "metrics.csv", "history.csv", "summary.json", DIVERGED)


# ------------------------------------------------------------------------------- reading


def check_root(root: Path, flag: str = "--runs") -> Path:
    """A folder of run folders (``--runs``, a ``--baseline`` study): it must exist and be a
    folder (one line naming ``flag`` otherwise)."""
    fix = ("pass folders holding run folders" if flag == "--runs" else
           "pass a study's --out folder (it holds runs/)")
    return check_in_folder(root, f"{flag} ", fix)


def find_run_folders(roots: Sequence[Path]) -> list[Path]:
    """Run folders that ended (``config.json`` with ``summary.json``, or with the record of a
    diverged run) at any depth under roots, sorted."""
    found: set[Path] = set()
    for root in map(check_root, roots):
        try:
            for s in root.rglob("config.json"):
                if finished_or_diverged(s.parent):
                    found.add(s.parent)
        except OSError as exc:
            raise PBInputError(f"cannot list {root} ({exc.strerror}); pass a readable "
                               "folder") from None
    return sorted(found)


def prune_record(run: PruneRun) -> RunRecord:
    """The :class:`RunRecord` of a pruning run, whose accuracy must be a number and whose
    ``metrics.csv`` must hold every epoch's layers."""
    task = run.task
    if not math.isfinite(run.metrics["test_acc"]):
        raise DamagedRun(f"final_test_acc is {run.metrics['test_acc']}, not an accuracy")
    sizes = run.sizes
    read_columns(run.folder / "metrics.csv", ["epoch", *(f"remaining_{k}" for k in sizes)])
    settings = {k: v for k, v in task.items() if k != "seed"}
    return RunRecord(task["mode"], task["method"], settings, run.seed,
                     run.metrics["remaining"], run.metrics["test_acc"], dict(run.layers),
                     sizes, info=run.info)


def read_record(folder: Path) -> RunRecord | None:
    """The :class:`RunRecord` of one finished run folder; None for folders of other tools;
    :class:`~analysis.scale.run_files.DamagedRun` with the reason for a damaged one."""
    import numpy as np

    run = read_run(folder)
    if run is None:
        return None
    if isinstance(run, DivergedRun):
        return RunRecord(run.experiment, run.method, run.settings, run.seed, info=run.info,
                         diverged=run.record)
    if isinstance(run, PruneRun):
        return prune_record(run)
    return RunRecord("regression", run.method, run.settings, run.seed,
                     final_loss=run.final_loss, epochs=np.array(run.epochs),
                     losses=np.array(run.losses), info=run.info)


def load(runs_dir: Path) -> list[tuple[RunRecord, Path]]:
    """(record, folder) of every readable run folder under runs_dir, sorted by folder; a
    damaged one is skipped with one warning line."""
    def pair(folder: Path) -> tuple[RunRecord, Path] | None:
        r = read_record(folder)
        return None if r is None else (r, folder)
    return read_each(find_run_folders([runs_dir]), pair)


# ------------------------------------------------------------------------------- copying


def copy_names(roots: Sequence[Path]) -> dict[Path, str]:
    """The folder under OUT/runs of each --runs root (roots that resolve to one folder taken
    once): its name, or, where two roots share one, enough of their parents' names to tell them
    apart (``a-runs``, ``b-runs``)."""
    real: dict[Path, tuple[str, ...]] = {}
    for root in roots:
        parts = root.resolve().parts[1:]
        if parts not in real.values():
            real[root] = parts
    depth = dict.fromkeys(real, 1)
    while True:
        out = {r: "-".join(p[-depth[r]:]) or "root" for r, p in real.items()}
        clash = {n for n in out.values() if list(out.values()).count(n) > 1}
        if not clash:
            return out
        grow = [r for r in real if out[r] in clash and depth[r] < len(real[r])]
        if not grow:
            return {r: f"{n}-{i}" if n in clash else n for i, (r, n) in enumerate(out.items())}
        for r in grow:
            depth[r] += 1


def same_run(a: bytes, b: bytes) -> bool:
    """Whether two config.json files describe the same run (their ``info`` aside)."""
    try:
        ja, jb = json.loads(a), json.loads(b)
    except ValueError:
        return a == b
    if isinstance(ja, dict) and isinstance(jb, dict):
        ja.pop("info", None)
        jb.pop("info", None)
    return ja == jb


def plan_copies(roots: Sequence[Path], out: Path) -> tuple[Outputs, int]:
    """The small files of every finished run folder under roots (not those already under
    OUT/runs) as files of OUT/runs/<root's folder>/<path under the root>, and the number of run
    folders. A folder there that holds another run (config.json differs) is refused."""
    dest = out / "runs"
    dest_real = dest.resolve()
    names = copy_names(roots)
    files = Outputs(out)
    seen: set[Path] = set()
    for root, name in names.items():
        found = find_run_folders([root])
        if not found:
            raise PBInputError(f"--runs {root} holds no finished run folders (config.json and "
                               "summary.json); pass folders holding run folders")
        for folder in found:
            real = folder.resolve()
            if real.is_relative_to(dest_real) or real in seen:
                continue
            seen.add(real)
            rel = Path("runs") / name / folder.relative_to(root)
            inside(out / rel, out)
            try:
                data = {n: (folder / n).read_bytes() for n in SMALL_FILES
                        if (folder / n).is_file()}
            except OSError as exc:
                print(f"warning: skipped the unreadable run {folder} ({exc.strerror})",
                      file=sys.stderr)
                continue
            old = out / rel / "config.json"
            if old.is_file() and not same_run(old.read_bytes(), data.get("config.json", b"")):
                raise PBInputError(f"{out / rel} holds another run than {folder} (config.json "
                                   "differs); choose another --out or move that folder away")
            for n, b in data.items():
                files.add(rel / n, b)
    return files, len(seen)


def copy_small_files(roots: Sequence[Path], out: Path) -> int:
    """Copy the small files of every finished run under roots to OUT/runs
    (:func:`plan_copies`); returns the number of run folders copied."""
    files, n = plan_copies(roots, out)
    files.write()
    return n


# ------------------------------------------------------------------------------- groups


def write_points(files: Outputs, records: Sequence[RunRecord], experiment: str) -> list[dict]:
    """points_<experiment>.csv; returns the rows (for the Pareto figure)."""
    import numpy as np

    every = [r for r in records if r.experiment == experiment]
    rs = finished(every)
    diverged: dict[str, int] = {}
    for r in every:
        diverged[r.setting] = diverged.get(r.setting, 0) + (r.diverged is not None)
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
                         s.get("optimizer"), s.get("epochs"), len(g), fmt(float(f.mean())),
                         fmt(float(f.std(ddof=1) / math.sqrt(len(f))) if len(f) > 1 else "")])
        files.csv("points_regression.csv", ["method", "n", "param", "lr", "optimizer",
                                            "epochs", "seeds", "final_val_loss", "stderr"], rows)
        return []
    budgets = by_budget(rs)
    by_label: dict[str, list[RunRecord]] = {}
    legends: dict[str, str] = {}
    for r in every:
        lab = group_label(r)
        if len(budgets) > 1:  # runs of several budgets: a curve per budget
            lab += f" ({budget_text(r.budget, budgets)})"
        by_label.setdefault(lab, []).append(r)
        legends.setdefault(lab, legend_label(r) + lab[len(group_label(r)):])
    table, plotted = [], []
    for lab in sorted(by_label):
        pts = points(by_label[lab])
        on = {id(p) for p in front(pts)}
        for p in sorted(pts, key=lambda p: (p.remaining, p.accuracy)):
            s = p.settings
            dist = sum(abs(p.shares[k] - p.dense[k]) for k in p.dense) / 2 if p.dense else 0.0
            key = p.runs[0].setting
            table.append([lab, p.method, lam_text(s), s.get("mask_opt"), s.get("mask_lr"),
                          s.get("target"), s.get("n"), s.get("param"), s.get("epochs"),
                          p.seeds, diverged.get(key, 0), sum(stalled(r) for r in p.runs),
                          fmt(p.remaining), fmt(p.rem_sd) if p.seeds > 1 else "",
                          fmt(p.accuracy), fmt(p.acc_sd) if p.seeds > 1 else "",
                          int(id(p) in on), fmt(dist)])
            plotted.append({"label": lab, "legend": legends[lab], "remaining": p.remaining,
                            "accuracy": p.accuracy, "front": id(p) in on,
                            "acc_sd": p.acc_sd if p.seeds > 1 else 0.0,
                            "rem_sd": p.rem_sd if p.seeds > 1 else 0.0})
    files.csv(f"points_{experiment}.csv",
              ["group", "method", "lam", "mask_opt", "mask_lr", "target", "n", "param", "epochs",
               "seeds", "diverged", "stalled", "remaining", "remaining_sd", "test_acc",
               "test_acc_sd", "on_front", "allocation_distance"], table)
    return plotted


# ------------------------------------------------------------------------------- figures


def plot_pareto(files: Outputs, plotted: list[dict], experiment: str) -> None:
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
                       marker="os^D"[i // len(colors) % 4], ms=3, label=g[0]["legend"],
                       color=colors[(2 * i + i // 10) % len(colors)])[0]
        ax.scatter([p["remaining"] for p in g], [p["accuracy"] for p in g], s=8, alpha=0.3,
                   color=line.get_color())
        spread = [p for p in fr if p["acc_sd"] > 0 or p["rem_sd"] > 0]
        if spread:  # the seed spread of each front point: +-1 s.d. over its seeds
            ax.errorbar([p["remaining"] for p in spread], [p["accuracy"] for p in spread],
                        xerr=[p["rem_sd"] for p in spread], yerr=[p["acc_sd"] for p in spread],
                        fmt="none", lw=0.7, capsize=1.5, color=line.get_color(), alpha=0.8)
    ax.axhline(ACC_FLOOR, color="grey", lw=0.6, ls=":",
               label=f"accuracy floor {ACC_FLOOR:g} (a setting below it is on no front)")
    fraction_axis(ax, [p["remaining"] for p in plotted])
    ax.set_xlabel("weights remaining (fraction of the masked weights)")
    ax.set_ylabel("test accuracy (seed mean; bars: +-1 seed s.d.)")
    ax.set_title(f"{experiment}: Pareto fronts")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    files.figure(f"pareto_{experiment}.png", fig)
    plt.close(fig)


def plot_hyper(files: Outputs, rows: list[dict]) -> list[str]:
    """hyper_generalization.png / .csv (`fig:app_hyper_gen_scatter`,
    `fig:app_hyper_gen_parallel`): left, each (setting, n)'s seed means, the same setting's
    points linked across n, chance accuracy shaded; right, one line per (setting, n) across the
    hyperparameters, its remaining fraction and accuracy, coloured by remaining (red: sparse)
    and faded off its n's front. Returns :func:`analysis.scale.hyper.carry_over`'s lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files.csv("hyper_generalization.csv", list(HYPER_COLUMNS),
              [[r[k] for k in HYPER_COLUMNS] for r in rows])
    fig, (ax, par) = plt.subplots(1, 2, figsize=(11, 4.2))
    markers = dict(zip(sorted({r["n"] for r in rows}), "os^Dv"))
    colors = plt.get_cmap("tab10").colors
    for i, key in enumerate(sorted({(r["method"], r["param"], r["key"]) for r in rows})):
        mine = sorted((r for r in rows if (r["method"], r["param"], r["key"]) == key),
                      key=lambda r: r["n"])
        c = colors[i % len(colors)]
        ax.plot([r["remaining"] for r in mine], [r["test_acc"] for r in mine], color=c, lw=0.8)
        for r in mine:
            ax.scatter(r["remaining"], r["test_acc"], marker=markers[r["n"]], color=c, s=22)
    for n, mk in markers.items():
        ax.scatter([], [], marker=mk, color="grey", label=f"n = {n}")
    ax.axhspan(0, STALLED_ACC, color="red", alpha=0.12, label="chance (failed runs)")
    fraction_axis(ax, [r["remaining"] for r in rows])
    ax.set_xlabel("weights remaining")
    ax.set_ylabel("test accuracy (seed mean)")
    ax.set_title("one setting at several n (linked)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    axes = ["log10 lam", "log10 mask lr", "log10 n", "log10 remaining", "test acc"]
    vals = [[math.log10(r["lam"]), math.log10(r["mask_lr"]), math.log10(r["n"]),
             math.log10(r["remaining"]), r["test_acc"]] for r in rows]
    lo = [min(v[i] for v in vals) for i in range(len(axes))]
    hi = [max(v[i] for v in vals) for i in range(len(axes))]
    scaled = [[(v[i] - lo[i]) / (hi[i] - lo[i]) if hi[i] > lo[i] else 0.5
               for i in range(len(axes))] for v in vals]
    cmap = plt.get_cmap("RdYlGn")
    for r, y in zip(rows, scaled):
        par.plot(range(len(axes)), y, color=cmap(y[3]), alpha=0.9 if r["on_front"] else 0.25,
                 lw=1.2 if r["on_front"] else 0.8)
    par.set_xticks(range(len(axes)), [f"{a}\n{lo[i]:.3g}..{hi[i]:.3g}"
                                      for i, a in enumerate(axes)], fontsize=7)
    par.set_yticks([0, 1], ["min", "max"])
    par.set_title("each (setting, n): colour = remaining (red sparse); faded off its n's front",
                  fontsize=8)
    files.figure("hyper_generalization.png", fig)
    plt.close(fig)
    return [carry_over_text(c) for c in carry_over(rows)]


def chosen_runs(loaded: Sequence[tuple[RunRecord, Path]]) -> list[tuple[str, RunRecord, Path]]:
    """One joint run each of MC, CP and GMP at matched sparsity, from the largest training
    budget: the sparsest MC front setting with accuracy >= ACC_FLOOR (else the median CP front
    setting) and the CP and GMP front settings nearest to it in log remaining; the lowest seed
    of each setting."""
    joint = [(r, f) for r, f in loaded if r.experiment == "joint" and r.diverged is None]
    if not joint:
        return []
    largest = list(by_budget(r for r, _ in joint))[-1]
    joint = [(r, f) for r, f in joint if r.budget == largest]
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


def plot_layers(files: Outputs, chosen: list[tuple[str, RunRecord, Path]]) -> None:
    """layers_over_training.png / .csv (`fig:joint_pruning_per_layer`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    fig, axes = plt.subplots(len(chosen), 2, figsize=(9, 2.6 * len(chosen)), squeeze=False)
    for (name, r, folder), (ax1, ax2) in zip(chosen, axes):
        hist = read_columns(folder / "metrics.csv")
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
                rows.append([name, folder.name, int(e), k, fmt(frac[k][i]), fmt(shares[i][k])])
        title = f"{name}: {legend_label(r)}, {r.remaining:.2%} left, acc {r.accuracy:.3f}"
        ax1.set_title(title, fontsize=8)
        fraction_axis(ax1, [x for k in layers for x in frac[k]], axis="y")
        ax1.set_ylabel("fraction left in layer", fontsize=7)
        ax2.set_ylabel("share of weights left", fontsize=7)
        ax2.set_ylim(0, 1)
        ax1.legend(fontsize=6)
        for ax in (ax1, ax2):
            ax.set_xlabel("epoch", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.tight_layout()
    files.figure("layers_over_training.png", fig)
    plt.close(fig)
    files.csv("layers_over_training.csv", ["method", "run", "epoch", "layer", "remaining",
                                           "share"], rows)


# ------------------------------------------------------------------------------- main


def study_records(folder: Path, experiments: Sequence[str]) -> list[RunRecord]:
    """The records of a study: its ``runs/`` folder (or the folder itself when it has none)."""
    runs = folder / "runs"
    return [r for r, _ in load(runs if runs.is_dir() else check_root(folder, "--baseline"))
            if r.experiment in experiments]


def report(out: Path, experiments: Sequence[str], baselines: Sequence[Path] = ()) -> list:
    """Everything under ``out`` from the run files in ``out/runs`` (and, with ``baselines``,
    the training-length table); returns the judged claims
    (:class:`analysis.scale.robust.Judged`)."""
    runs_dir = out / "runs"
    if not runs_dir.is_dir():
        raise PBInputError(f"{runs_dir} does not exist; run without --replot and with --runs "
                           "first")
    loaded = load(runs_dir)
    records = [r for r, _ in loaded if r.experiment in experiments]
    judged = judge(records, experiments)
    scales = {e: scale_text(records, e) for e in EXPERIMENTS}
    files = Outputs(out)
    cols, rows = agreement_rows(judged, scales)
    files.csv("agreement.csv", cols, rows)
    files.text("agreement.md", markdown(judged, scales, len(records),
                                        sum(r.diverged is not None for r in records)))
    for j in judged:
        files.csv(Path("claims") / f"{j.claim.key}.csv", ["name", "value"], claim_rows(j))
    for exp in experiments:
        if any(r.experiment == exp for r in records):
            plotted = write_points(files, records, exp)
            if exp != "regression":
                plot_pareto(files, plotted, exp)
    hyper = generalization_rows(records) if "supermask" in experiments else []
    if hyper:
        for line in plot_hyper(files, hyper):
            print(f"hyperparameters across n: {line}")
    if "joint" in experiments:
        chosen = chosen_runs([(r, f) for r, f in loaded if r.experiment == "joint"])
        if chosen:
            plot_layers(files, chosen)
    if baselines:
        studies = [(b.resolve().name, study_records(b, experiments)) for b in baselines]
        studies.append((out.resolve().name, records))
        names = [s for s, _ in studies]
        if len(set(names)) < len(names):
            raise PBInputError(f"--baseline and --out folders share a name ({', '.join(names)}); "
                               "give each study a folder of its own name")
        sources = [(b.resolve().name, str(b / "runs" if (b / "runs").is_dir() else b), len(rs))
                   for b, (_, rs) in zip(baselines, studies)]
        sources.append((out.resolve().name, str(runs_dir), len(records)))
        length = by_study(studies, {out.resolve().name: judged})
        files.text("training_length.md", length_markdown(length, sources))
        files.csv("training_length.csv", *length_rows(length))
    files.write()
    return judged


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m analysis.scale_report",
                       description=__doc__.split("\n\n")[0],
                       epilog="The run folders come from python -m pbscale.sweep run "
                              "sweeps/claims_*.toml (see each file's header for its cost).")
    p.add_argument("--runs", type=out_folder, nargs="+", default=None,
                   help="folders holding finished run folders (searched at any depth)")
    p.add_argument("--out", type=out_folder, default=Path("results/claims"),
                   help="folder for the tables, figures and the copied run files (the "
                        "committed study: figures/claims)")
    p.add_argument("--experiments", default=",".join(EXPERIMENTS),
                   help="comma-separated subset of " + ", ".join(EXPERIMENTS))
    p.add_argument("--replot", action="store_true",
                   help="only redraw from OUT/runs (no --runs, nothing copied)")
    p.add_argument("--baseline", type=out_folder, nargs="+", default=(), metavar="STUDY",
                   help="other studies' --out folders (their runs/): write "
                        "training_length.md/.csv, rows 1-8 of each beside this one's")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                   help="only answer: does A beat B at matched sparsity on the --runs (or, "
                        "with --replot, OUT/runs)? A, B: a method, a group (\"cp rmsprop\") "
                        "or a label; writes nothing")
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
    if not args.replot and not args.runs:
        raise PBInputError("no --runs given; pass the folders holding the run folders, or "
                           "--replot")
    if args.compare:
        if args.baseline:
            raise PBInputError("--compare writes nothing; drop --baseline")
        roots = args.runs or [args.out / "runs"]
        records = [r for root in roots for r, _ in load(check_root(root))
                   if r.experiment in experiments]
        for line in compare(records, *args.compare):
            print(line)
        return 0
    for b in args.baseline:
        check_root(b, "--baseline")
    if args.replot and not (args.out / "runs").is_dir():  # before --out is created
        if args.out.exists() or args.out.is_symlink():
            check_out(args.out, "--out")  # a file, a link out: its own message
        raise PBInputError(f"{args.out / 'runs'} does not exist; run without --replot and with "
                           "--runs first")
    out = check_out(args.out, "--out")
    if not args.replot:
        n = copy_small_files(args.runs, out)
        print(f"copied the small files of {n} run folders to {out / 'runs'}")
    judged = report(out, experiments, args.baseline)
    for line in console_lines(judged):
        print(line)
    for line in warning_lines(judged):
        print(line, file=sys.stderr)
    print(f"-> {out / 'agreement.md'}"
          + (f", {out / 'training_length.md'}" if args.baseline else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
