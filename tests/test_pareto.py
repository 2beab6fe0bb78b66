"""``python -m analysis.pareto``: the overlay of chosen series, settings a method does not use
left empty, damaged run folders skipped with a warning, and one-line errors for bad paths."""

from __future__ import annotations

import shutil

import pytest

from analysis import pareto
from analysis.cli import run
from pbscale import prune as P
from pbscale.io import read_csv


def tiny_cfg(**kw):
    base = dict(model="lenet", synthetic=48, epochs=1, max_batches=1, batch_size=8, n=2,
                val_size=16, gmp_every=1)
    base.update(kw)
    return P.PruneConfig(**base)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pareto") / "runs"
    for kw in (dict(method="cp", lam=1e-3), dict(method="cp", lam=1e-5),
               dict(method="gmp", mode="joint", target=0.3),
               dict(method="gmp", mode="joint", target=0.1),
               dict(method="dense", mode="joint")):
        P.run(tiny_cfg(**kw), folder, quiet=True)
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
