"""``python -m analysis.pareto``: the overlay of chosen series, settings a method does not use
left empty, damaged run folders skipped with a warning, and one-line errors for bad paths."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from _run_folders import write_prune

from analysis import pareto
from analysis.cli import run
from analysis.scale.pareto_overlay import parse_overlay
from analysis.scale.pareto_plots import plot_fronts
from analysis.scale.pareto_rows import average_seeds, find_runs, read_runs
from analysis.scale.plots import fraction_axis
from pbscale import prune as P
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun
from pbscale.runs.io import read_csv


def tiny_cfg(**kw):
    base = dict(model="lenet", synthetic=48, epochs=1, max_batches=1, batch_size=8, n=2,
                val_size=16, gmp_every=1)
    base.update(kw)
    return pconfig.PruneConfig(**base)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pareto") / "runs"
    for kw in (dict(method="cp", lam=1e-3), dict(method="cp", lam=1e-5),
               dict(method="gmp", mode="joint", target=0.3),
               dict(method="gmp", mode="joint", target=0.1),
               dict(method="dense", mode="joint")):
        prun.run(tiny_cfg(**kw), folder, quiet=True)
    return folder


def test_csvs_leave_settings_a_method_does_not_use_empty(runs, tmp_path):
    out = tmp_path / "out"
    assert run(pareto.main, [str(runs), "--out", str(out)]) == 0
    rows = read_csv(out / "runs.csv")
    by = {r["label"]: r for r in rows}
    assert by["cp"]["target"] == "" and by["cp"]["lam"] != "" and by["cp"]["mask_lr"] != ""
    assert by["gmp"]["lam"] == "" and by["gmp"]["mask_lr"] == "" and by["gmp"]["target"] != ""
    assert by["dense"]["lam"] == by["dense"]["target"] == by["dense"]["mask_lr"] == ""
    front = read_csv(out / "pareto.csv")
    assert {r["lam"] for r in front if r["label"] == "gmp"} == {""}
    assert {r["target"] for r in front if r["label"] == "cp"} == {""}


def test_overlay_draws_chosen_series_on_shared_axes(runs, tmp_path):
    out = tmp_path / "out"
    assert run(pareto.main, [str(runs), "--out", str(out),
                             "--overlay", "supermask:cp,joint:gmp"]) == 0
    assert (out / "overlay_lenet.png").stat().st_size > 5_000
    rows = read_csv(out / "overlay_lenet.csv")
    assert [(r["mode"], r["label"]) for r in rows] == [("supermask", "cp")] * 2 + [
        ("joint", "gmp")] * 2
    assert {r["lam"] for r in rows[:2]} == {1e-3, 1e-5} and {r["target"] for r in rows[:2]} == {
        ""}
    assert {r["lam"] for r in rows[2:]} == {""} and {r["target"] for r in rows[2:]} == {0.3, 0.1}
    # each point is flagged when it is on its series' Pareto front, as pareto.csv has it
    front = read_csv(out / "pareto.csv")
    for mode, lab in (("supermask", "cp"), ("joint", "gmp")):
        want = sorted(float(r["remaining"]) for r in front
                      if (r["mode"], r["label"]) == (mode, lab))
        got = sorted(float(r["remaining"]) for r in rows
                     if (r["mode"], r["label"]) == (mode, lab) and r["on_front"] == 1)
        assert got == want
    # all: every series; a mode alone: its labels
    assert run(pareto.main, [str(runs), "--out", str(out), "--overlay", "all"]) == 0
    assert {(r["mode"], r["label"]) for r in read_csv(out / "overlay_lenet.csv")} == {
        ("supermask", "cp"), ("joint", "gmp"), ("joint", "dense")}
    assert run(pareto.main, [str(runs), "--out", str(out), "--overlay", "joint"]) == 0
    assert {r["label"] for r in read_csv(out / "overlay_lenet.csv")} == {"gmp", "dense"}


@pytest.mark.parametrize("spec, message", [
    ("joint:nope", "matches no run; the runs have joint:dense"),
    ("supermask:", "expected all or MODE[:LABEL]"),
    (",", "expected all or MODE[:LABEL]"),
])
def test_overlay_of_nothing_is_one_line(runs, tmp_path, capsys, spec, message):
    assert run(pareto.main, [str(runs), "--out", str(tmp_path / "o"), "--overlay", spec]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0]


def test_damaged_runs_are_skipped_with_one_warning_each(runs, tmp_path, capsys):
    mine = tmp_path / "runs"
    shutil.copytree(runs, mine)
    folders = sorted(p for p in mine.iterdir() if p.is_dir())
    damage = {
        folders[0]: ("summary.json", '{"final_test_acc": 0.'),  # truncated
        folders[1]: ("summary.json", "[]"),  # wrong shape
        folders[2]: ("config.json", '{"task": []}'),
        folders[3]: ("summary.json", '{"final_test_acc": "high"}'),
    }
    for folder, (name, text) in damage.items():
        (folder / name).write_text(text)
    out = tmp_path / "out"
    assert run(pareto.main, [str(mine), "--out", str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == len(damage)
    for folder in damage:
        assert sum(line.startswith("warning: skipped the damaged run") and str(folder) in line
                   for line in err) == 1
    assert len(read_csv(out / "runs.csv")) == len(folders) - len(damage)
    # nothing readable: one error line
    (folders[4] / "summary.json").write_bytes(b"\xff\xfe")
    assert run(pareto.main, [str(mine), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: none of the 5 run(s) could be read")


def test_bad_paths_and_values_are_one_line(runs, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = [
        ([str(runs), "--out", str(afile)], "is a file"),
        ([str(runs), "--out", str(afile / "sub")], "lies under the file"),
        ([str(runs), "--out", "/proc/pbnn-not-creatable"], "cannot be created"),
        ([str(afile), "--out", str(tmp_path / "o")], "is a file; pass run folders"),
        ([str(runs), "--out", str(tmp_path / "o"), "--layer-max", "nan"], "--layer-max"),
        ([str(runs), "--out", str(tmp_path / "o"), "--layer-max", "0"], "--layer-max"),
    ]
    for argv, message in cases:
        assert run(pareto.main, argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and message in err[0], (argv, err)
    assert afile.read_text() == "x"


# ------------------------------------------------------------------ hand-written runs

SM = {"fc1": 0.0, "fc2": 0.0}


def sm_layers(r: float) -> dict[str, float]:
    return {k: r for k in SM}


def test_training_budgets_split_the_labels(tmp_path, capsys):
    """CP at 2 and 3 epochs (and one at 1 epoch x 20 batches): three fronts, never one, and a
    note says so; --overlay by the label's series selects all three."""
    root = tmp_path / "runs"
    for epochs, mb in ((2, 0), (3, 0), (1, 20)):
        for r in (0.5, 0.1):
            write_prune(root, "supermask", "cp", 0, r, 0.8 + epochs / 100 + r / 10,
                        sm_layers(r), lam=r, epochs=epochs, max_batches=mb, mask_head=False)
    out = tmp_path / "out"
    assert run(pareto.main, [str(root), "--out", str(out), "--overlay", "supermask:cp"]) == 0
    cap = capsys.readouterr()
    assert "note: lenet supermask: runs of 3 training budgets" in cap.err
    assert {r["label"] for r in read_csv(out / "runs.csv")} == {"cp-e1-b20", "cp-e2", "cp-e3"}
    front = read_csv(out / "pareto.csv")
    assert sorted((r["label"], r["remaining"]) for r in front) == sorted(
        (lab, r) for lab in ("cp-e1-b20", "cp-e2", "cp-e3") for r in (0.1, 0.5))
    assert {r["label"] for r in read_csv(out / "overlay_lenet.csv")} == {
        "cp-e1-b20", "cp-e2", "cp-e3"}


def test_per_layer_plot_takes_the_runs_nearest_a_common_fraction(tmp_path, capsys):
    """Hard-concrete reaches 21.5% at best, CP 5%: the per-layer plot shows CP's setting nearest
    21.5% (20%), not its most accurate, and names the runs it used."""
    root = tmp_path / "runs"
    for seed in (0, 1):
        for r, acc in ((0.5, 0.97), (0.2, 0.95), (0.05, 0.90)):
            write_prune(root, "supermask", "cp", seed, r, acc, sm_layers(r), lam=r,
                        mask_head=False)
        for r, acc in ((0.4, 0.93), (0.215, 0.91)):
            write_prune(root, "supermask", "hardconcrete", seed, r, acc, sm_layers(r), lam=r,
                        mask_head=False)
    out = tmp_path / "out"
    assert run(pareto.main, [str(root), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    layers = read_csv(out / "layers.csv")
    chosen = {r["label"]: r for r in layers}
    assert chosen["cp"]["run_remaining"] == 0.2
    assert chosen["hardconcrete"]["run_remaining"] == 0.215
    assert chosen["cp"]["runs"] == "supermask-cp-lam0.2-mask_headFalse-s0;" \
                                   "supermask-cp-lam0.2-mask_headFalse-s1"
    assert "per-layer plot lenet supermask: the settings nearest 21.50% remaining" in text
    assert "supermask-cp-lam0.2-mask_headFalse-s0" in text
    # --layer-at and --layer-max choose otherwise
    assert run(pareto.main, [str(root), "--out", str(out), "--layer-at", "0.05"]) == 0
    assert {r["label"]: r["run_remaining"] for r in read_csv(out / "layers.csv")} == {
        "cp": 0.05, "hardconcrete": 0.215}
    assert run(pareto.main, [str(root), "--out", str(out), "--layer-max", "1"]) == 0
    assert {r["label"]: r["run_remaining"] for r in read_csv(out / "layers.csv")} == {
        "cp": 0.5, "hardconcrete": 0.4}


def test_a_method_unknown_to_the_registry_plots_with_its_recorded_label(tmp_path):
    info = {"name": "randmask", "label": "Random supermask", "text": "random supermask",
            "color": "tab:olive", "samples": False, "deterministic": True,
            "settings": ["target"]}
    root = tmp_path / "runs"
    for r in (0.5, 0.2):
        write_prune(root, "supermask", "randmask", 0, r, 0.5, sm_layers(r), method_info=info,
                    target=r, mask_head=False)
        write_prune(root, "supermask", "cp", 0, r, 0.9, sm_layers(r), lam=r, mask_head=False)
    runs = read_runs(find_runs([root]))
    rand = [p for p in runs if p["method"] == "randmask"]
    assert rand[0]["label"] == "randmask" and rand[0]["legend"] == "Random supermask"
    assert rand[0]["lam"] == "" and rand[0]["target"] != ""  # its recorded settings
    fig = plot_fronts(average_seeds(runs), "t")
    legend = {t.get_text(): h for t, h in zip(fig.axes[0].get_legend().get_texts(),
                                              fig.axes[0].get_legend().legend_handles)}
    assert set(legend) == {"CP", "Random supermask"}
    from matplotlib.colors import to_rgba
    assert to_rgba(legend["Random supermask"].get_color()) == to_rgba("tab:olive")
    assert run(pareto.main, [str(root), "--out", str(tmp_path / "out")]) == 0


@pytest.mark.parametrize("lo, hi", [(1e-5, 1.0), (1e-3, 0.6), (0.02, 0.5), (0.3, 0.5),
                                    (0.45, 0.5)])
def test_fraction_axis_tick_labels_do_not_overlap(lo, hi):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for width in (6.0, 6.5):
        fig, ax = plt.subplots(figsize=(width, 4))
        ax.plot([lo, hi], [0.5, 0.9])
        fraction_axis(ax, [lo, hi])
        fig.canvas.draw()
        boxes = sorted((t.get_window_extent() for t in ax.get_xticklabels()
                        if t.get_visible() and t.get_text()), key=lambda b: b.x0)
        left, right = ax.get_window_extent().x0 - 30, ax.get_window_extent().x1 + 30
        boxes = [b for b in boxes if left <= b.x0 and b.x1 <= right]
        assert len(boxes) >= 2, (lo, hi)
        assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:])), (lo, hi, width)
        plt.close(fig)


def test_empty_out_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_prune(tmp_path / "runs", "supermask", "cp", 0, 0.5, 0.9, sm_layers(0.5),
                mask_head=False)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert run(pareto.main, [str(tmp_path / "runs"), "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is empty; name a folder" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_seed_means_sds_and_diverged_runs_are_reported(tmp_path, capsys):
    """Issue 41 point 7: three seeds of a setting give its mean +- s.d. and seed count in
    runs.csv, runs.md and the console; a diverged run (diverged.json, no summary.json) is counted,
    not averaged; a setting whose every seed diverged is named."""
    from _run_folders import LENET, layers_for, write_diverged

    root = tmp_path / "runs"
    for seed, acc in enumerate((0.90, 0.92, 0.94)):
        write_prune(root, "joint", "cp", seed, 0.1 + 0.01 * seed, acc, layers_for(0.1, 0.5),
                    lam=1e-4)
    write_diverged(root, "joint", "cp", 3, lam=1e-4)
    write_diverged(root, "joint", "cp", 0, lam=1e-2)
    out = tmp_path / "out"
    assert run(pareto.main, [str(root), "--out", str(out)]) == 0
    console = capsys.readouterr().out
    rows = read_csv(out / "runs.csv")
    assert len(rows) == 1 and rows[0]["seeds"] == 3 and rows[0]["diverged"] == 1
    assert float(rows[0]["test_acc"]) == pytest.approx(0.92)
    assert float(rows[0]["test_acc_sd"]) == pytest.approx(0.02)
    assert float(rows[0]["remaining_sd"]) == pytest.approx(0.01)
    assert "0.9200 +- 0.0200" in (out / "runs.md").read_text()
    assert "5 runs (1 configurations), 2 of them diverged" in console
    assert "test_acc 0.9200 +- 0.0200 (3 seeds)" in console
    assert "every seed diverged: cp (1 seeds)" in console
    assert LENET  # the layers above are LeNet's


def test_a_folder_named_twice_counts_once_and_overlay_all_twice_is_all(runs, tmp_path, capsys):
    """Issue 38: `pareto D D` counted every run twice; `--overlay all,all` said that all
    matched no run."""
    out = tmp_path / "o"
    assert run(pareto.main, [str(runs), str(runs), "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("5 runs (5 configurations)")
    assert all(r["seeds"] == 1 for r in read_csv(out / "runs.csv"))
    assert parse_overlay("all,all") == [] == parse_overlay("supermask, all")
    assert parse_overlay("joint,joint") == [("joint", None)]
    assert run(pareto.main, [str(runs), "--out", str(out), "--overlay", "all,all"]) == 0
    assert "overlays:" in capsys.readouterr().out


def test_fronts_are_drawn_with_their_seed_spread():
    points = [{"label": "cp", "legend": "CP", "method": "cp", "color": "C0", "remaining": r,
               "test_acc": a, "remaining_sd": 0.001, "test_acc_sd": 0.01, "seeds": 3}
              for r, a in ((0.05, 0.9), (0.1, 0.95))]
    fig = plot_fronts(points, "t")
    bars = [c for c in fig.axes[0].containers if c.__class__.__name__ == "ErrorbarContainer"]
    assert len(bars) == 1 and "s.d." in fig.axes[0].get_ylabel()


def test_a_lam_target_run_is_labelled_by_its_target(tmp_path):
    """A --lam-target run is "target 30%" in runs.csv, pareto.csv and points_<mode>.csv (and
    a series of its own, cp-target30%), not its starting --lam; a fixed-lam run keeps its lam."""
    from analysis import scale_report

    folder = tmp_path / "runs"
    prun.run(tiny_cfg(method="cp", lam=1e-3, lam_target=0.3), folder, quiet=True)
    prun.run(tiny_cfg(method="cp", lam=1e-3), folder, quiet=True)
    out = tmp_path / "out"
    assert run(pareto.main, [str(folder), "--out", str(out)]) == 0
    by = {r["label"]: r for r in read_csv(out / "runs.csv")}
    assert by["cp-target30%"]["lam"] == "target 30%" and by["cp"]["lam"] == 0.001
    assert {r["lam"] for r in read_csv(out / "pareto.csv")} == {"target 30%", 0.001}
    rep = tmp_path / "report"
    assert scale_report.main(["--runs", str(folder), "--out", str(rep)]) == 0
    assert {r["lam"] for r in read_csv(rep / "points_supermask.csv")} == {"target 30%", 0.001}


def test_a_rows_command_trains_exactly_its_runs(tmp_path, capsys):
    """runs.md's command of a 4-seed row is ``--seeds 0-3`` (not the ``--seed 1`` of one of its
    runs): run again, it names exactly the row's four runs, all finished, and trains nothing."""
    import shlex

    root = tmp_path / "runs"
    tiny = ["--model", "lenet", "--synthetic", "48", "--epochs", "1", "--max-batches", "1",
            "--batch-size", "8", "--val-size", "16", "--method", "cp", "--quiet"]
    assert P.main([*tiny, "--seeds", "0-3", "--out", str(root)]) == 0
    before = sorted(p.name for p in root.iterdir())
    out = tmp_path / "out"
    assert run(pareto.main, [str(root), "--out", str(out)]) == 0
    (row,) = [ln for ln in (out / "runs.md").read_text().splitlines() if "pbscale.prune" in ln]
    cmd = shlex.split(row.split("`")[1])
    assert cmd[:3] == ["python", "-m", "pbscale.prune"] and "--seed" not in cmd
    assert cmd[cmd.index("--seeds") + 1] == "0-3" and row.split("|")[3].strip() == "4"
    capsys.readouterr()
    assert P.main([*cmd[3:], "--out", str(root), "--quiet"]) == 0
    assert "(4 of these runs had finished before" in capsys.readouterr().err
    assert sorted(p.name for p in root.iterdir()) == before


TINYNET = """
from torch import nn


def make():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 3))
"""


def test_a_user_network_rows_command_can_be_pasted(tmp_path, capsys, monkeypatch, request):
    """runs.md's command of a run of the user's network and data file is the command the user
    ran (``--model tinynet:make --data d.npz``, the method's own setting as its flag, a pattern
    quoted for the shell), not ``--dataset arrays --network-id ... --data-id ...``: pasted in
    the same folder, it names the same run, finished, and trains nothing."""
    import shlex
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "tinynet.py").write_text(TINYNET)
    # the module this test imports is dropped when it ends: a later test's tinynet.py (another
    # folder, another network) must not find this one in sys.modules
    monkeypatch.delitem(sys.modules, "tinynet", raising=False)
    request.addfinalizer(lambda: sys.modules.pop("tinynet", None))
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (120, 1, 8, 8)).astype(np.uint8), rng.integers(0, 3, 120)
    np.savez(tmp_path / "d.npz", x_train=x[:90], y_train=y[:90], x_test=x[90:], y_test=y[90:])
    ran = ["--model", "tinynet:make", "--data", "d.npz", "--mode", "joint", "--method", "cp",
           "--epochs", "1", "--max-batches", "2", "--batch-size", "16", "--cp-final-tau", "0.01",
           "--masked", "*.weight", "--out", "runs", "--quiet"]
    assert P.main(ran) == 0
    before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert run(pareto.main, ["runs", "--out", "fig"]) == 0
    (row,) = [ln for ln in (tmp_path / "fig" / "runs.md").read_text().splitlines()
              if "pbscale.prune" in ln]
    text = row.split("`")[1]
    for absent in ("--dataset", "--network-id", "--data-id", "--settings"):
        assert absent not in text, text
    cmd = shlex.split(text)
    assert cmd[cmd.index("--model") + 1] == "tinynet:make" and cmd[cmd.index("--data") + 1] == \
        "d.npz", text
    assert cmd[cmd.index("--cp-final-tau") + 1] == "0.01" and "'*.weight'" in text, text
    capsys.readouterr()
    assert P.main([*cmd[3:], "--out", "runs", "--quiet"]) == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == before


def test_compare_judges_two_series_with_the_one_front_comparison(tmp_path, capsys):
    """--compare A B: in each model and mode both series have, analysis.compare_fronts's verdict
    (the same numbers as calling it on the runs' arrays), on the console and in compare.csv;
    series at the same budgets 2 points apart read holds; an unknown series is one line."""
    from analysis import compare_fronts

    root = tmp_path / "runs"
    rs = (0.02, 0.05, 0.2)
    acc = {}
    for seed in range(4):
        for r in rs:
            for method, base in (("cp", 0.92), ("hardconcrete", 0.90)):
                a = base + 0.03 * math.log10(r / 0.02) + 0.002 * ((seed * 7 + len(method)) % 3)
                acc[method, seed, r] = a
                write_prune(root, "supermask", method, seed, r, a, sm_layers(r), lam=r,
                            mask_head=False)
    out = tmp_path / "out"
    assert pareto.main([str(root), "--out", str(out), "--compare", "cp", "hardconcrete"]) == 0
    console = capsys.readouterr().out
    rows = read_csv(out / "compare.csv")
    assert len(rows) == 1 and rows[0]["verdict"] == "holds"
    want = compare_fronts(np.array([rs] * 4), np.array([[acc["cp", s, r] for r in rs]
                                                         for s in range(4)]),
                          np.array([rs] * 4), np.array([[acc["hardconcrete", s, r] for r in rs]
                                                         for s in range(4)]))
    assert float(rows[0]["gap"]) == pytest.approx(want.gap)
    assert float(rows[0]["ci_low"]) == pytest.approx(want.ci[0])
    assert "lenet supermask: does cp beat hardconcrete? holds: gap +0.02" in console
    assert run(pareto.main, [str(root), "--out", str(out), "--compare", "cp", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no series 'nope'" in err[0]


def test_a_label_names_every_budget_setting_that_differs(tmp_path, capsys):
    """Batch 128 and batch 32 with the same epochs and max batches (issue 53): two labels that
    say so (cp-e3-b10-bs128, cp-e3-b10-bs32), one front each, on the console and in every
    file, never one label for both."""
    root = tmp_path / "runs"
    for bs, base in ((128, 0.9), (32, 0.6)):
        for r in (0.5, 0.1):
            write_prune(root, "supermask", "cp", 0, r, base + r / 10, sm_layers(r), lam=r,
                        epochs=3, max_batches=10, batch_size=bs, mask_head=False)
    out = tmp_path / "out"
    assert run(pareto.main, [str(root), "--out", str(out)]) == 0
    cap = capsys.readouterr()
    labels = {"cp-e3-b10-bs128", "cp-e3-b10-bs32"}
    assert {r["label"] for r in read_csv(out / "runs.csv")} == labels
    assert {r["label"] for r in read_csv(out / "pareto.csv")} == labels
    assert "-bs<batch size>" in cap.err
    assert all(lab in cap.out for lab in labels)
