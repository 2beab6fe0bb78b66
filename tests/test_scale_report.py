"""python -m analysis.scale_report: reading real pruning and regression run folders, the tables
and figures from hand-written run folders, --replot redrawing them byte for byte, bad input."""

import csv
import json
from pathlib import Path

import pytest
from _run_folders import LENET, layers_for, write_prune

from analysis import scale_report as S
from analysis.microworld.claims import FAILS, HOLDS
from analysis.scale.claims import SCALE_CLAIMS
from analysis.scale.runs import READINGS, RunRecord, group_label, legend_label
from analysis.scale.study import copy_small_files, find_run_folders, load
from pbscale.methods import MethodConfig
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun
from pbscale.regression import run as rrun
from pbscale.regression.problem import make_problem


def test_reads_real_prune_and_regress_run_folders(tmp_path):
    cfg = pconfig.PruneConfig(model="lenet", mode="joint", method="gmp", target=0.1, mask_head=True,
                        synthetic=48, epochs=2, max_batches=2, batch_size=8, val_size=16,
                        gmp_every=1)
    summary = prun.run(cfg, tmp_path / "runs" / "prune", "cpu", quiet=True)
    prob = make_problem(0, n_train=300, n_valid=100, backbone_hidden=(6, 6),
                        target_hidden=(12, 12))
    folder = rrun.train(MethodConfig("loorf", n=2, seed=3), epochs=2,
                           out=tmp_path / "runs" / "reg", device="cpu", progress=False,
                           problem=prob)
    loaded = load(tmp_path / "runs")
    assert len(loaded) == 2
    by_exp = {r.experiment: r for r, _ in loaded}
    p = by_exp["joint"]
    assert p.method == "gmp" and p.seed == 0 and "seed" not in p.settings
    assert p.layer_sizes == LENET
    assert p.remaining == pytest.approx(summary["final_remaining"])
    kept = sum(p.layers[k] * n for k, n in LENET.items()) / sum(LENET.values())
    assert kept == pytest.approx(p.remaining)
    r = by_exp["regression"]
    hist = list(csv.DictReader(open(folder / "history.csv")))
    assert r.method == "loorf" and r.seed == 3 and r.get("epochs") == 2 and r.get("n") == 2
    assert r.final_loss == pytest.approx(float(hist[-1]["val_loss_chosen"]))
    assert list(r.epochs) == [0, 1, 2] and r.losses.size == 3
    # copying takes the small files only
    n = copy_small_files([tmp_path / "runs"], tmp_path / "out")
    copied = sorted(q.name for q in (tmp_path / "out" / "runs").rglob("*") if q.is_file())
    assert n == 2 and "checkpoint.pt" not in copied and "masks.pt" not in copied
    assert copied.count("summary.json") == 2 and "history.csv" in copied


def write_study(root: Path) -> None:
    """Joint runs: CP with SGD far better than with RMSprop; supermask CP with RMSprop only a
    little better than with SGD; regression runs where REINFORCE is much worse."""
    dense_share = LENET["fc1"] / sum(LENET.values())
    for seed in (0, 1):
        j = 0.001 * seed
        for i, r in enumerate((0.2, 0.1, 0.05)):
            lam = 10.0 ** -(i + 3)
            write_prune(root / "joint", "joint", "cp", seed, r, 0.97 - 0.01 * i + j,
                        layers_for(r, 0.5), lam=lam, mask_opt="sgd")
            write_prune(root / "joint", "joint", "cp", seed, r, 0.90 - 0.01 * i + j,
                        layers_for(r, 0.5), lam=lam, mask_opt="rmsprop")
            write_prune(root / "joint", "joint", "arms", seed, 2 * r, 0.93 - 0.01 * i + j,
                        layers_for(2 * r, dense_share), lam=lam, n=2)
            write_prune(root / "joint", "joint", "gmp", seed, r, 0.95 - 0.01 * i + j,
                        layers_for(r, 0.6), target=r)
            write_prune(root / "joint", "joint", "mp", seed, r, 0.94 - 0.01 * i + j,
                        layers_for(r, 0.6), target=r)
            sm = dict(mask_head=False)
            write_prune(root / "supermask", "supermask", "cp", seed, r, 0.95 - 0.01 * i + j,
                        {"fc1": r, "fc2": r}, lam=lam, mask_opt="rmsprop", **sm)
            write_prune(root / "supermask", "supermask", "cp", seed, r, 0.945 - 0.01 * i + j,
                        {"fc1": r, "fc2": r}, lam=lam, mask_opt="sgd", **sm)
    for seed in (0, 1, 2):
        for method, final in (("reinforce", 0.5), ("loorf", 0.2), ("arms", 0.19)):
            folder = root / "reg" / f"{method}-s{seed}"
            folder.mkdir(parents=True)
            m = {"method": method, "n": 10, "param": "sigmoid", "lr": 0.1,
                 "optimizer": "rmsprop", "seed": seed, "chunk": None, "lam": 0.0}
            (folder / "config.json").write_text(json.dumps(
                {"task": {"name": "regression", "data_seed": 0}, "method": m,
                 "loop": {"epochs": 3}}))
            f = final + 0.001 * seed
            (folder / "summary.json").write_text(json.dumps({"final_val_loss_chosen": f}))
            (folder / "history.csv").write_text(
                "epoch,val_loss_chosen\n0,1.0\n1,0.6\n2,0.4\n" + f"3,{f}\n")


def outputs(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and not p.relative_to(out).parts[0] == "runs"}


def test_report_tables_figures_and_replot(tmp_path, capsys):
    write_study(tmp_path / "runs")
    out = tmp_path / "report"
    assert S.main(["--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    first = outputs(out)
    for name in ("agreement.md", "agreement.csv", "points_joint.csv", "points_supermask.csv",
                 "points_regression.csv", "pareto_joint.png", "pareto_supermask.png",
                 "layers_over_training.png", "layers_over_training.csv"):
        assert name in first, name
    assert len([k for k in first if k.startswith("claims/")]) == len(SCALE_CLAIMS)
    rows = {r["claim"]: r for r in csv.DictReader(open(out / "agreement.csv"))}
    assert rows["joint_cp_sgd_gt_rmsprop"]["outcome"] == HOLDS
    assert rows["sm_cp_rmsprop_gt_sgd"]["outcome"] == FAILS  # better, but by 0.5 points
    assert rows["joint_cp_best"]["outcome"] == HOLDS
    assert rows["joint_mc_allocation"]["outcome"] == HOLDS
    assert rows["reg_reinforce_much_worse"]["outcome"] == HOLDS
    assert "3 epochs" in rows["reg_reinforce_much_worse"]["our_scale"]
    assert "300 epochs; 10 seeds" in rows["reg_reinforce_much_worse"]["paper_scale"]
    md = (out / "agreement.md").read_text()
    assert "| 8 | CP performed much better with SGD than with RMSprop | **holds** |" in md
    layers = list(csv.DictReader(open(out / "layers_over_training.csv")))
    assert {r["method"] for r in layers} == {"CP", "MC", "GMP"}
    # --replot redraws the same tables (figures: same files) from OUT/runs alone
    for name in first:
        (out / name).unlink()
    assert S.main(["--replot", "--out", str(out)]) == 0
    second = outputs(out)
    assert set(second) == set(first)
    for name in first:
        if not name.endswith(".png"):
            assert second[name] == first[name], name
    # only the experiments asked for
    sub = tmp_path / "sub"
    assert S.main(["--runs", str(tmp_path / "runs" / "reg"), "--out", str(sub),
                   "--experiments", "regression"]) == 0
    assert {r["claim"] for r in csv.DictReader(open(sub / "agreement.csv"))} == {
        c.key for c in SCALE_CLAIMS if c.experiment == "regression"}


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    from analysis.cli import run

    assert run(S.main, ["--replot", "--out", str(tmp_path / "none")]) == 2
    assert run(S.main, ["--out", str(tmp_path)]) == 2
    assert run(S.main, ["--runs", str(tmp_path), "--experiments", "pruning"]) == 2
    assert run(S.main, ["--runs", str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(e.startswith("error: ") for e in err)


def test_analysis_report_selects_the_scale_rows(tmp_path):
    """python -m analysis.report --experiments regression runs only the scale report (no
    microworld unit is trained), from --scale-runs or, without it, from --scale-out/runs."""
    from analysis import report

    write_study(tmp_path / "runs")
    out = tmp_path / "claims"
    assert report.main(["--experiments", "regression", "joint", "--scale-runs",
                        str(tmp_path / "runs"), "--scale-out", str(out),
                        "--results", str(tmp_path / "micro")]) == 0
    claims = {r["claim"] for r in csv.DictReader(open(out / "agreement.csv"))}
    assert claims == {c.key for c in SCALE_CLAIMS if c.experiment in ("regression", "joint")}
    assert not (tmp_path / "micro").exists()
    (out / "agreement.csv").unlink()
    assert report.main(["--experiments", "regression", "--scale-out", str(out)]) == 0
    assert {r["claim"] for r in csv.DictReader(open(out / "agreement.csv"))} == {
        c.key for c in SCALE_CLAIMS if c.experiment == "regression"}


FIGURES = Path(__file__).resolve().parent.parent / "figures"
#: The committed studies: figures/claims (4 epochs) and each study set beside it (claims20: 20
#: epochs, replotted with --baseline figures/claims, which writes its training_length tables).
STUDIES = ["claims"] + sorted(p.parent.name for p in FIGURES.glob("claims*/training_length.md"))


@pytest.mark.parametrize("study", STUDIES)
def test_the_committed_study_replots_to_its_committed_tables(tmp_path, monkeypatch, study):
    """figures/<study> holds the study's run files: --replot from a copy of it (and of
    figures/claims, its baseline) rewrites every committed table (agreement, training length,
    per-claim and per-setting CSVs) byte for byte."""
    import shutil

    committed = FIGURES / study
    assert (committed / "runs").is_dir(), f"figures/{study}/runs (its run files) is missing"
    for name in {"claims", study}:
        shutil.copytree(FIGURES / name, tmp_path / "figures" / name)
    copy = tmp_path / "figures" / study
    tables = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*")
              if p.suffix in (".csv", ".md") and "runs" not in p.relative_to(copy).parts}
    monkeypatch.chdir(tmp_path)  # the tables name the folders as the command line gave them
    baseline = ["--baseline", "figures/claims"] if study != "claims" else []
    assert S.main(["--replot", "--out", f"figures/{study}", *baseline]) == 0
    for rel, data in tables.items():
        assert (copy / rel).read_bytes() == data, rel


# ------------------------------------------------------------------ robustness, sub-verdicts


def test_agreement_shows_robustness_and_every_sub_verdict_on_its_own_line(tmp_path, capsys):
    """The header counts robust and fragile rows; each reading has a column; a row made of
    parts (claim 5: MC, MP, GMP) shows each on its own line of the numbers table and of the
    console, in full."""
    write_study(tmp_path / "runs")
    out = tmp_path / "report"
    assert S.main(["--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    console = capsys.readouterr().out
    md = (out / "agreement.md").read_text()
    head = next(line for line in md.splitlines() if line.startswith("Generated by"))
    rows = list(csv.DictReader(open(out / "agreement.csv")))
    paper = [r for r in rows if int(r["bullet"]) <= 11]
    kinds = [r["robustness"] for r in paper]
    assert set(kinds) <= {"robust", "fragile", "unjudged"}
    assert f"{kinds.count('robust')} robust, {kinds.count('fragile')} fragile" in head
    assert all((r["robustness"] == "unjudged") == (r["outcome"] == "no data" and all(
        r[f"reading_{x.key}"] in ("no data", "n/a") for x in READINGS)) for r in paper)
    for reading in READINGS:
        assert reading.title in md and f"reading_{reading.key}" in rows[0]
    by = {r["claim"]: r for r in rows}
    # regression rows: no front reading acts on them (their numbers do not change: n/a); the
    # front rows are read again with seeds not paired
    for key in ("floor_0.5", "safety_2", "safety_4", "pooled"):
        assert by["reg_reinforce_much_worse"][f"reading_{key}"] == "n/a", key
    assert by["joint_cp_best"]["reading_pooled"] == "holds"
    assert by["joint_cp_best"]["family_wise"] == "holds"
    for part in ("MC", "MP", "GMP"):
        assert any(line.startswith(f"| 5 | {part} | holds | CP - {part} accuracy")
                   for line in md.splitlines()), part
        assert any(line.strip().startswith(f"{part}: holds: CP - {part} accuracy")
                   and "95% CI" in line and "paired over seeds 0, 1" in line
                   for line in console.splitlines())
        assert any(line.startswith(f"| 5 | {part} | holds | +0.") for line in md.splitlines())
    # the detail of claim 5 is longer than a console line used to be cut at: it is whole
    assert all(len(line) < 400 for line in console.splitlines())
    assert by["joint_cp_best"]["detail"].count("|") == 2


def test_robust_and_fragile_rows():
    """A gap far beyond the noise under every reading is robust; a front that only clears the
    floor of 0.3 (no data at 0.5) is fragile."""
    from analysis.scale.robust import judge_claim

    claim = next(c for c in SCALE_CLAIMS if c.key == "sm_cp_rmsprop_gt_sgd")

    def runs(rms: float, sgd: float) -> list:
        out = []
        for seed in (0, 1, 2):
            for i, r in enumerate((0.2, 0.1, 0.05)):
                for opt, acc in (("rmsprop", rms), ("sgd", sgd)):
                    out.append(RunRecord("supermask", "cp", {"model": "lenet", "epochs": 4,
                                                               "mask_opt": opt, "lam": i},
                                           seed, r, acc - 0.01 * i + 0.002 * seed,
                                           {"fc1": r}, {"fc1": 100}))
        return out

    robust = judge_claim(claim, runs(0.95, 0.85))
    assert robust.verdict.outcome == HOLDS and robust.robust
    assert all(o in (HOLDS, None) for o in robust.readings.values())
    assert robust.readings["leave_one_out"] == HOLDS and robust.readings["floor_0.5"] is None
    fragile = judge_claim(claim, runs(0.45, 0.35))  # above 0.3, below 0.5
    assert fragile.verdict.outcome == HOLDS and not fragile.robust
    assert fragile.readings["floor_0.5"] == "no data" and fragile.disagreeing() == ["floor_0.5"]
    assert (robust.robustness, fragile.robustness) == ("robust", "fragile")
    empty = judge_claim(claim, [])  # no reading has data: neither robust nor fragile
    assert empty.verdict.outcome == "no data" and empty.robustness == "unjudged"


def test_compare_answers_a_against_b_on_ones_own_runs(tmp_path, capsys):
    from analysis.cli import run

    write_study(tmp_path / "runs")
    assert S.main(["--runs", str(tmp_path / "runs"), "--compare", "cp sgd", "gmp"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("does cp sgd beat gmp at matched sparsity?")
    assert lines[1].startswith("cp sgd = ") and "joint: cp sgd (6 runs)" in lines[1]
    joint = lines.index(next(x for x in lines if x.startswith("joint: ")))
    assert lines[joint].startswith("joint: holds, robust")
    assert "cp sgd - gmp accuracy at matched budgets" in lines[joint + 1]
    assert not (tmp_path / "results").exists()  # writes nothing
    assert S.main(["--runs", str(tmp_path / "runs"), "--compare", "gmp", "cp sgd"]) == 0
    assert any(x.startswith("joint: fails") for x in capsys.readouterr().out.splitlines())
    assert run(S.main, ["--runs", str(tmp_path / "runs"), "--compare", "cp", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no finished pruning runs in one experiment; choose from" in err[0]


# ------------------------------------------------------------------ training budgets


def test_budgets_are_never_pooled_and_a_mixed_comparison_warns(tmp_path, capsys):
    """CP and GMP at 2 and 3 epochs: two fronts each, compared budget by budget; a row whose
    groups share no budget warns."""
    root = tmp_path / "runs"
    for epochs, base in ((2, 0.90), (3, 0.95)):
        for seed in (0, 1):
            for r in (0.2, 0.1, 0.05):
                write_prune(root, "joint", "cp", seed, r, base + 0.01 * r + 0.001 * seed,
                            layers_for(r, 0.5), lam=r, mask_opt="sgd", epochs=epochs)
                write_prune(root, "joint", "cp", seed, r, base - 0.02 + 0.001 * seed,
                            layers_for(r, 0.5), lam=r, mask_opt="rmsprop", epochs=epochs)
    for seed in (0, 1):
        for r in (0.2, 0.1, 0.05):
            write_prune(root, "joint", "gmp", seed, r, 0.5 + 0.001 * seed, layers_for(r, 0.6),
                        target=r, epochs=7)
    out = tmp_path / "report"
    assert S.main(["--runs", str(root), "--out", str(out), "--experiments", "joint"]) == 0
    cap = capsys.readouterr()
    md = (out / "agreement.md").read_text()
    assert "| 8 | 2 ep | holds | CP sgd - CP rmsprop" in md
    assert "| 8 | 3 ep | holds | CP sgd - CP rmsprop" in md
    assert "budgets differ: CP 3 ep, GMP 7 ep" in md
    assert "warning: row 5: CP against GMP: budgets differ" in cap.err
    groups = {r["group"] for r in csv.DictReader(open(out / "points_joint.csv"))}
    assert {"cp sgd (2 ep)", "cp sgd (3 ep)", "gmp (7 ep)"} <= groups


# ------------------------------------------------------------------ training length


def test_training_length_table_sets_two_studies_side_by_side(tmp_path, capsys):
    """Rows 1-8 of a 4-epoch and a 20-epoch study (each study its own folder), verdicts side
    by side; the row that changed is named."""
    short, long = tmp_path / "claims", tmp_path / "claims20"
    write_study(short / "runs" / "s")
    for seed in (0, 1):  # at 20 epochs CP with RMSprop catches up with SGD (row 8: fails)
        for i, r in enumerate((0.2, 0.1, 0.05)):
            for opt, acc in (("sgd", 0.97), ("rmsprop", 0.975)):
                write_prune(long / "runs" / "s", "joint", "cp", seed, r,
                            acc - 0.01 * i + 0.001 * seed, layers_for(r, 0.5), lam=10.0 ** -i,
                            mask_opt=opt, epochs=20)
    assert S.main(["--replot", "--out", str(short)]) == 0
    assert S.main(["--replot", "--out", str(long), "--baseline", str(short)]) == 0
    capsys.readouterr()
    rows = {r["claim"]: r for r in csv.DictReader(open(long / "training_length.csv"))}
    assert len(rows) == 11  # rows 1-8 and 12-14
    row8 = rows["joint_cp_sgd_gt_rmsprop"]
    assert (row8["claims_outcome"], row8["claims_epochs"]) == (HOLDS, "4 ep")
    assert (row8["claims20_outcome"], row8["claims20_epochs"]) == (FAILS, "20 ep")
    assert row8["changed"] == "1" and rows["sm_arms_gt_loorf"]["claims20_epochs"] == "not run"
    md = (long / "training_length.md").read_text()
    assert "| # | paper | claims | claims20 | changed |" in md
    assert "| 8 | CP performed much better with SGD than with RMSprop | holds, " in md
    assert "Rows whose verdict changed: " in md and "8 (claims holds, claims20 fails)" in md
    # a row one study has no data for is not compared (not "changed"), and is unjudged there
    row1 = rows["sm_arms_gt_loorf"]
    assert (row1["claims20_outcome"], row1["claims20_robustness"]) == ("no data", "unjudged")
    assert row1["changed"] == ""
    line1 = next(x for x in md.splitlines() if x.startswith("| 1 |"))
    assert line1.endswith("| no data (not run) | not compared |")
    assert "Rows not compared (fewer than two studies have data for them): 1, " in md


# ------------------------------------------------------------------ runs describe themselves


def test_a_run_of_a_method_unknown_to_the_registry_reads_with_its_recorded_label(tmp_path):
    info = {"name": "randmask", "label": "Random supermask", "text": "random supermask",
            "color": "tab:olive", "samples": False, "deterministic": True,
            "settings": ["target"]}
    root = tmp_path / "runs"
    for seed in (0, 1):
        for r in (0.5, 0.2):
            write_prune(root, "supermask", "randmask", seed, r, 0.5 + r / 10,
                        {"fc1": r, "fc2": r}, method_info=info, target=r, mask_head=False)
            write_prune(root, "supermask", "cp", seed, r, 0.9 + r / 10, {"fc1": r, "fc2": r},
                        lam=r, mask_head=False)
    loaded = load(root)
    rand = [r for r, _ in loaded if r.method == "randmask"]
    assert len(rand) == 4 and rand[0].info.label == "Random supermask"
    assert rand[0].info.source == "run" and rand[0].info.color == "tab:olive"
    assert group_label(rand[0]) == "randmask" and legend_label(rand[0]) == "Random supermask"
    out = tmp_path / "report"
    assert S.main(["--runs", str(root), "--out", str(out), "--experiments", "supermask"]) == 0
    groups = {r["group"] for r in csv.DictReader(open(out / "points_supermask.csv"))}
    assert groups == {"randmask", "cp rmsprop"}
    assert S.main(["--replot", "--out", str(out), "--compare", "cp", "Random supermask"]) == 0


def test_no_branch_on_a_method_name_in_the_claims_analysis():
    import re

    from pbexact.estimators import REGISTRY as ESTIMATORS
    from pbscale.methods import REGISTRY

    root = Path(__file__).resolve().parent.parent / "analysis"
    words = "|".join(re.escape(n) for n in (*REGISTRY, *ESTIMATORS))
    compare = re.compile(rf"""(==|!=)\s*["']({words})["']""")
    member = re.compile(rf"""\b(if|elif|and|or|not)\b.*\bin\s*\([^)]*["']({words})["']""")
    files = ["pareto.py", "scale_report.py", "scale/run_files.py", "scale/claims.py",
             "scale/runs.py", "scale/fronts.py", "scale/regression.py", "scale/robust.py",
             "scale/tables.py", "scale/study.py", "scale/plots.py", "scale/study_report.py",
             "scale/compare.py", "scale/pareto_rows.py", "scale/pareto_overlay.py",
             "scale/pareto_plots.py"]
    found = [f"{f}:{i}" for f in files
             for i, line in enumerate((root / f).read_text().splitlines(), 1)
             if compare.search(line) or member.search(line)]
    assert found == []
    assert compare.search('if r.method == "cp":') and member.search('if m in ("arms", "x"):')


# ------------------------------------------------------------------ where it writes


def test_two_runs_folders_of_one_name_are_both_kept(tmp_path, capsys):
    """a/runs and b/runs: both copied (a-runs, b-runs), the count is what is there; a different
    run already under the same name in OUT/runs is refused, never overwritten."""
    for side, acc in (("a", 0.9), ("b", 0.8)):
        for seed in (0, 1):
            write_prune(tmp_path / side / "runs", "joint", "gmp", seed, 0.1, acc + 0.01 * seed,
                        layers_for(0.1, 0.6), target=0.1)
    out = tmp_path / "out"
    assert S.main(["--runs", str(tmp_path / "a" / "runs"), str(tmp_path / "b" / "runs"),
                   "--out", str(out), "--experiments", "joint"]) == 0
    assert "copied the small files of 4 run folders" in capsys.readouterr().out
    copied = sorted(p.parent.relative_to(out / "runs").parts[0]
                    for p in (out / "runs").rglob("config.json"))
    assert copied == ["a-runs"] * 2 + ["b-runs"] * 2
    assert len(load(out / "runs")) == 4
    # the same root again (also spelled differently): the same 2 folders, nothing doubled
    assert S.main(["--runs", str(tmp_path / "a" / "runs"), str(tmp_path / "a" / "." / "runs"),
                   "--out", str(tmp_path / "out2"), "--experiments", "joint"]) == 0
    assert "copied the small files of 2 run folders" in capsys.readouterr().out
    # another run under a name already taken in OUT/runs
    other = tmp_path / "c" / "runs"
    folder = write_prune(other, "joint", "gmp", 0, 0.1, 0.9, layers_for(0.1, 0.6), target=0.1)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["task"]["lr"] = 0.5
    (folder / "config.json").write_text(json.dumps(cfg))
    (out / "runs" / "runs").mkdir()
    target = out / "runs" / "runs" / folder.name
    import shutil
    shutil.copytree(tmp_path / "a" / "runs" / folder.name, target)
    before = (target / "config.json").read_bytes()
    from analysis.cli import run
    assert run(S.main, ["--runs", str(other), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds another run than" in err[0]
    assert (target / "config.json").read_bytes() == before


def test_paths_that_resolve_outside_out_are_refused(tmp_path, capsys):
    from analysis.cli import run

    write_study(tmp_path / "runs")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "runs" / "runs").symlink_to(elsewhere)  # the copies of --runs runs would land there
    assert run(S.main, ["--runs", str(tmp_path / "runs"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "outside" in err[0] and "symlink" in err[0]
    assert list(elsewhere.iterdir()) == []
    # a table's folder that links out
    (out / "runs" / "runs").unlink()
    assert S.main(["--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    capsys.readouterr()
    import shutil
    shutil.rmtree(out / "claims")
    (out / "claims").symlink_to(elsewhere)
    assert run(S.main, ["--replot", "--out", str(out)]) == 2
    assert "outside" in capsys.readouterr().err and list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("argv, message", [
    (["--out", "", "--replot"], "is empty"),
    (["--out", "x" * 300, "--replot"], "at most 255"),
    (["--runs", "y" * 300, "--out", "o"], "at most 255"),
    (["--out", "AFILE", "--replot"], "is a file"),
    (["--runs", "AFILE", "--out", "o"], "is a file"),
    (["--runs", "EMPTY", "--out", "o", "--baseline", "AFILE"], "is a file"),
    (["--runs", "EMPTY", "--out", "o"], "holds no finished run folders"),
    (["--replot", "--out", "o", "--compare", "cp", "gmp", "--baseline", "EMPTY"], "--baseline"),
])
def test_bad_paths_are_one_line_and_write_nothing(tmp_path, capsys, monkeypatch, argv, message):
    from analysis.cli import run

    monkeypatch.chdir(tmp_path)
    (tmp_path / "AFILE").write_text("x")
    (tmp_path / "EMPTY").mkdir()
    (tmp_path / "o" / "runs").mkdir(parents=True)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert run(S.main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    assert "; " in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "AFILE").read_text() == "x"


def test_a_full_disk_is_one_line_and_keeps_every_earlier_file(tmp_path, capsys, monkeypatch):
    import errno

    from analysis.cli import run
    from analysis.scale import outputs as out_files

    write_study(tmp_path / "runs")
    out = tmp_path / "out"
    assert S.main(["--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    capsys.readouterr()
    earlier = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    real, calls = out_files.atomic_write_bytes, []

    def full_after_three(path, data):
        calls.append(path)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(out_files, "atomic_write_bytes", full_after_three)
    (tmp_path / "runs" / "joint" / next(iter(sorted(p.name for p in (
        tmp_path / "runs" / "joint").iterdir()))) / "summary.json").write_text(json.dumps(
            {"final_remaining": 0.3, "final_test_acc": 0.5, "final_remaining_all": 0.3,
             **{f"final_remaining_{k}": 0.3 for k in LENET}}))
    assert run(S.main, ["--runs", str(tmp_path / "runs"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: no space left in {out}")
    assert "bytes" in err[0] and "free some space" in err[0]
    for p, data in earlier.items():  # each file is its old version or a whole new one
        assert p.read_bytes() == data or p in calls[:3], p
    assert not [p for p in out.rglob("*.tmp")]
    # pareto too
    calls.clear()
    from analysis import pareto
    assert run(pareto.main, [str(tmp_path / "runs" / "joint"), "--out", str(tmp_path / "p")]
               ) == 2
    assert capsys.readouterr().err.startswith(f"error: no space left in {tmp_path / 'p'}")
    # a disk with too little room is refused before anything is written
    monkeypatch.setattr(out_files, "atomic_write_bytes", real)
    monkeypatch.setattr(out_files.shutil, "disk_usage", lambda p: type("U", (), {"free": 10})())
    assert run(S.main, ["--replot", "--out", str(out)]) == 2
    assert "the disk has 10 B free" in capsys.readouterr().err


# ------------------------------------------------------------------ damaged run folders


def _summary(**kw):
    base = {"final_remaining": 0.1, "final_test_acc": 0.9, "final_remaining_all": 0.1,
            **{f"final_remaining_{k}": 0.1 for k in LENET}}
    base.update(kw)
    return json.dumps(base).replace('"NAN"', "NaN")


def _task(**kw):
    t = {"model": "lenet", "dataset": "mnist", "mode": "joint", "method": "gmp", "target": 0.1,
         "epochs": 4, "seed": 0, "mask_head": True}
    t.update(kw)
    return json.dumps({"task": {k: v for k, v in t.items() if v != "DROP"}})


GOOD_METRICS = ("epoch,test_acc,remaining," + ",".join(f"remaining_{k}" for k in LENET)
                + "\n0,0.1,1,1,1,1\n1,0.9,0.1,0.1,0.1,0.1\n")
DAMAGE = {
    "config truncated": ("config.json", '{"task": {"mode"'),
    "config a list": ("config.json", "[]"),
    "config not utf-8": ("config.json", b"\xff\xfe{"),
    "task a string": ("config.json", '{"task": "joint"}'),
    "no method": ("config.json", _task(method="DROP")),
    "method a number": ("config.json", _task(method=3)),
    "seed not a number": ("config.json", _task(seed="zero")),
    "seed not whole": ("config.json", _task(seed=1.5)),
    "epochs not a number": ("config.json", _task(epochs="four")),
    "lam a string": ("config.json", _task(lam="small")),
    "unknown model": ("config.json", _task(model="nonet")),
    "method_info a string": ("config.json", json.dumps({**json.loads(_task()),
                                                        "method_info": "gmp"})),
    "summary empty": ("summary.json", ""),
    "summary a list": ("summary.json", "[1]"),
    "no final_remaining": ("summary.json", _summary(final_remaining="DROP").replace(
        '"final_remaining": "DROP", ', "")),
    "string accuracy": ("summary.json", _summary(final_test_acc="high")),
    "nan accuracy": ("summary.json", _summary(final_test_acc="NAN")),
    "nan layer": ("summary.json", _summary(final_remaining_fc1="NAN")),
    "layer above 1": ("summary.json", _summary(final_remaining_fc2=1.5)),
    "negative remaining": ("summary.json", _summary(final_remaining=-0.1)),
    "layers of another model": ("summary.json", _summary(final_remaining_conv1=0.1)),
    "metrics truncated": ("metrics.csv", GOOD_METRICS[:-8]),
    "metrics header only": ("metrics.csv", GOOD_METRICS.splitlines()[0] + "\n"),
    "metrics not numbers": ("metrics.csv", GOOD_METRICS.replace("0.9", "x")),
    "metrics missing": ("metrics.csv", None),
}
REGRESSION_DAMAGE = {
    "history truncated": ("history.csv", "epoch,val_loss_chosen\n0,1.0\n1,"),
    "history not numbers": ("history.csv", "epoch,val_loss_chosen\n0,one\n"),
    "no loop epochs": ("config.json", json.dumps({"task": {"name": "regression"},
                                                  "method": {"method": "loorf", "seed": 0},
                                                  "loop": {}})),
    "no final loss": ("summary.json", "{}"),
    "regression seed a string": ("config.json", json.dumps(
        {"task": {"name": "regression"}, "method": {"method": "loorf", "seed": "a"},
         "loop": {"epochs": 3}})),
}


def test_each_kind_of_damage_skips_its_run_with_one_warning(tmp_path, capsys):
    """Every kind of damage (config, summary, metrics and history files) skips that run with one
    warning line naming it; the report is made from the others (exit 0)."""
    import shutil

    write_study(tmp_path / "good")
    root = tmp_path / "runs"
    shutil.copytree(tmp_path / "good", root)
    joint = sorted(p for p in (root / "joint").iterdir())
    reg = sorted(p for p in (root / "reg").iterdir())
    damaged = {}
    for folder, (kind, (name, text)) in zip(joint, DAMAGE.items()):
        damaged[folder] = kind
        if text is None:
            (folder / name).unlink()
        else:
            (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    for folder, (kind, (name, text)) in zip(reg, REGRESSION_DAMAGE.items()):
        damaged[folder] = kind
        (folder / name).write_text(text)
    assert len(damaged) == len(DAMAGE) + len(REGRESSION_DAMAGE)
    loaded = load(root)
    err = capsys.readouterr().err.strip().splitlines()
    for folder, kind in damaged.items():
        hits = [e for e in err if e.startswith("warning: skipped the damaged run")
                and f"{folder}:" in e]
        assert len(hits) == 1, (kind, err)
    assert len(err) == len(damaged)
    assert len(loaded) == len(find_run_folders([root])) - len(damaged)
    out = tmp_path / "out"
    assert S.main(["--runs", str(root), "--out", str(out)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    # pareto's reader is the same: the pruning kinds it reads are skipped there too
    from analysis import pareto
    assert pareto.main([str(root / "joint"), "--out", str(tmp_path / "p")]) == 0
    warned = capsys.readouterr().err
    for folder, kind in damaged.items():
        if kind in DAMAGE and not kind.startswith(("metrics", "nan accuracy")):
            assert f"{folder}:" in warned, kind


def test_baseline_and_replot_refusals_name_the_right_flag_and_create_nothing(tmp_path, capsys):
    """Issue 38: `--baseline missing` named --runs; `--replot --out new` created new/ while
    refusing."""
    from analysis.cli import run

    write_study(tmp_path / "runs")
    assert S.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    capsys.readouterr()
    assert run(S.main, ["--replot", "--out", str(tmp_path / "rep"), "--baseline",
                        str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --baseline {tmp_path / 'missing'} does")
    assert "--runs" not in err[0]
    new = tmp_path / "new"
    assert run(S.main, ["--replot", "--out", str(new)]) == 2
    assert "run without --replot and with --runs first" in capsys.readouterr().err
    assert not new.exists()


def test_compare_names_families_budgets_and_what_it_left_out(tmp_path, capsys):
    """Issue 42: `--compare cp mc` (mc: every MC estimator) says what each name covers, the
    budget compared and the runs left out; `--experiments supermask` is honoured."""
    root = tmp_path / "runs"
    for seed in (0, 1):
        for i, r in enumerate((0.2, 0.1, 0.05)):
            write_prune(root, "supermask", "cp", seed, r, 0.95 - 0.01 * i + 0.001 * seed,
                        {"fc1": r, "fc2": r, "fc3": r}, lam=10.0 ** -i, mask_opt="rmsprop")
            write_prune(root, "supermask", "arms", seed, 2 * r, 0.80 - 0.01 * i + 0.002 * seed,
                        {"fc1": 2 * r, "fc2": 2 * r, "fc3": 2 * r}, lam=10.0 ** -i, n=2)
            write_prune(root, "joint", "loorf", seed, 2 * r, 0.9 - 0.01 * i + 0.002 * seed,
                        layers_for(2 * r, 0.8), lam=10.0 ** -i, n=2)
            write_prune(root, "joint", "cp", seed, r, 0.95 - 0.01 * i + 0.001 * seed,
                        layers_for(r, 0.5), lam=10.0 ** -i)
        write_prune(root, "supermask", "arms", seed, 0.1, 0.85 + 0.001 * seed,
                    {"fc1": 0.1, "fc2": 0.1, "fc3": 0.1}, lam=1e-3, n=100, epochs=10)
    assert S.main(["--runs", str(root), "--compare", "cp", "mc"]) == 0
    out = capsys.readouterr().out
    assert "mc = every MC estimator" in out and "arms escort n=100 rmsprop" in out
    assert "supermask: holds" in out and "joint: holds" in out
    assert "compared at 4 ep" in out
    assert "left out: mc at 10 ep (2 runs: arms escort n=100 rmsprop): cp has no run" in out
    assert S.main(["--runs", str(root), "--compare", "cp", "mc", "--experiments",
                   "supermask"]) == 0
    out = capsys.readouterr().out
    assert "supermask: holds" in out and "joint:" not in out
    assert S.main(["--runs", str(root), "--compare", "arms", "cp"]) == 0
    out = capsys.readouterr().out  # arms has no joint run: said, not skipped silently
    assert "joint: not compared (arms has no finished joint run)" in out


def test_diverged_runs_are_read_copied_counted_and_a_bad_record_is_skipped(tmp_path, capsys):
    """Issue 41 point 4: a diverged run (config.json and diverged.json) is copied with the small
    files, counted in the scale and in the verdict of a row that reads its setting ("2 of 3 seeds
    diverged"); a record of the wrong shape is a damaged run, skipped with one warning."""
    from _run_folders import write_diverged

    from analysis.scale.run_files import DIVERGED

    root = tmp_path / "runs"
    write_study(root)
    for seed in (0, 1):
        write_diverged(root / "joint", "joint", "arms", seed + 5, lam=1e-3, n=2)
    bad = write_diverged(root / "joint", "joint", "arms", 9, lam=1e-3, n=2)
    (bad / DIVERGED).write_text(json.dumps({"epoch": "seven"}))
    out = tmp_path / "rep"
    assert S.main(["--runs", str(root), "--out", str(out), "--experiments", "joint"]) == 0
    cap = capsys.readouterr()
    damaged = [x for x in cap.err.splitlines() if "skipped the damaged run" in x]
    assert len(damaged) == 1 and f"{bad.name}/diverged.json (not a divergence record)" in \
        damaged[0]
    copied = list((out / "runs").rglob(DIVERGED))
    assert len(copied) == 3  # the damaged one too: copying keeps every small file
    md = (out / "agreement.md").read_text()
    assert "(2 diverged)" in md
    assert "arms escort n=2 rmsprop lr 0.01 lam 0.001: 2 of 4 seeds diverged" in md
    points = {(r["lam"], r["method"]): r for r in csv.DictReader(open(out / "points_joint.csv"))}
    assert points[("0.001", "arms")]["diverged"] == "2"


def test_a_comparison_that_cannot_tell_names_the_budgets_to_run(capsys):
    """CP run at 1% and 10%, GMP at 3% and 30% (every pair a decade apart, no shared budget
    inside both spans' bends): the answer lists the budgets both fronts name and, per side, a
    command for the ones it lacks: --lam-target for CP (from its lam), --target for GMP."""
    from analysis.scale.compare import matched_budget_lines

    def rec(method, seed, r, acc, **kw):
        return RunRecord("joint", method, {"model": "lenet", "mode": "joint", "epochs": 20,
                                             "batch_size": 128, "mask_head": True,
                                             "dataset": "mnist", **kw}, seed, r, acc,
                           {"fc1": r}, {"fc1": 100})

    cp = [rec("cp", s, r, 0.9 + r / 10, lam=r / 1000, mask_opt="sgd", mask_lr=0.1)
          for s in range(3) for r in (0.01, 0.1)]
    gmp = [rec("gmp", s, r, 0.9 + r / 10, target=r) for s in range(3) for r in (0.03, 0.3)]
    lines = matched_budget_lines(cp, gmp, "cp", "gmp")
    assert "(0.01, 0.03, 0.1, 0.3)" in lines[0]
    assert lines[1].startswith("  cp: for t in 0.03 0.3; do python -m pbscale.prune --model "
                               "lenet --mode joint --method cp")
    assert "--mask-opt sgd" in lines[1] and "--lam 0.0001 --lam-target $t --seeds 0-2" in lines[1]
    assert "--mask-head" in lines[1] and lines[1].endswith("--data-dir DATA_DIR; done")
    assert lines[2].startswith("  gmp: for t in 0.01 0.1; do") and "--target $t" in lines[2]
    assert "--lam-target" not in lines[2]


def test_hyperparameters_across_n_are_linked_and_read(tmp_path, capsys):
    """Supermask ARMS at three settings, each at n = 2 and n = 10 (two seeds): the report writes
    hyper_generalization.png and .csv (a row per setting and n) and reads the paper's
    observation (`sec:app_supermask_hypers`): at n = 10 two of the three became sparser and more
    accurate, the third failed (chance accuracy), and the rank correlation is stated."""
    root = tmp_path / "runs"
    cases = {1e-2: ((0.10, 0.60), (0.08, 0.70)), 1e-3: ((0.30, 0.70), (0.29, 0.80)),
             1e-4: ((0.45, 0.75), (0.45, 0.09))}
    for lam, ((r2, a2), (r10, a10)) in cases.items():
        for seed in (0, 1):
            for n, r, a in ((2, r2, a2), (10, r10, a10)):
                write_prune(root, "supermask", "arms", seed, r, a + 0.001 * seed,
                            {"fc1": r, "fc2": r}, lam=lam, n=n, mask_head=False)
    out = tmp_path / "report"
    assert S.main(["--runs", str(root), "--out", str(out), "--experiments", "supermask"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("hyperparameters")]
    assert (out / "hyper_generalization.png").stat().st_size > 0
    rows = list(csv.DictReader(open(out / "hyper_generalization.csv")))
    assert len(rows) == 6 and {r["n"] for r in rows} == {"2", "10"}
    assert lines == ["hyperparameters across n: arms escort n=2 -> n=10: 3 settings at both; 2 of "
                     "2 not failed became sparser or kept their sparsity and gained accuracy; 1 "
                     "failed at n=10; 2 of 3 front settings at n=2 stay on the front; rank "
                     "correlation of accuracy -0.50"]
