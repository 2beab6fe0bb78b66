"""python -m analysis.scale_report: reading real pruning and regression run folders, the tables
and figures from hand-written run folders, --replot redrawing them byte for byte, bad input."""

import csv
import json
from pathlib import Path

import pytest

from analysis import scale_report as S
from analysis.claims import FAILS, HOLDS
from analysis.scale_claims import SCALE_CLAIMS
from pbscale import prune as P
from pbscale import regress
from pbscale.methods import MethodConfig
from pbscale.regression import make_problem

LENET = {"fc1": 235200, "fc2": 30000, "fc3": 1000}


def test_reads_real_prune_and_regress_run_folders(tmp_path):
    cfg = P.PruneConfig(model="lenet", mode="joint", method="gmp", target=0.1, mask_head=True,
                        synthetic=48, epochs=2, max_batches=2, batch_size=8, val_size=16,
                        gmp_every=1)
    summary = P.run(cfg, tmp_path / "runs" / "prune", "cpu", quiet=True)
    prob = make_problem(0, n_train=300, n_valid=100, backbone_hidden=(6, 6),
                        target_hidden=(12, 12))
    folder = regress.train(MethodConfig("loorf", n=2, seed=3), epochs=2,
                           out=tmp_path / "runs" / "reg", device="cpu", progress=False,
                           problem=prob)
    loaded = S.load(tmp_path / "runs")
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
    n = S.copy_small_files([tmp_path / "runs"], tmp_path / "out" / "runs")
    copied = sorted(q.name for q in (tmp_path / "out" / "runs").rglob("*") if q.is_file())
    assert n == 2 and "checkpoint.pt" not in copied and "masks.pt" not in copied
    assert copied.count("summary.json") == 2 and "history.csv" in copied


def write_prune(root: Path, mode: str, method: str, seed: int, remaining: float, acc: float,
                layers: dict[str, float], **task) -> None:
    """A hand-written pruning run folder (config.json, summary.json, metrics.csv)."""
    t = {"model": "lenet", "dataset": "mnist", "mode": mode, "method": method, "param": "escort",
         "n": 10, "lam": 1e-4, "mask_opt": "rmsprop", "mask_lr": 0.01, "target": 0.1,
         "epochs": 4, "seed": seed, "mask_head": True, "mask_shortcuts": False, **task}
    name = f"{mode}-{method}-" + "-".join(f"{k}{v}" for k, v in sorted(task.items())) + f"-s{seed}"
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"task": t}))
    summ = {"final_remaining": remaining, "final_test_acc": acc, "final_remaining_all": remaining}
    summ.update({f"final_remaining_{k}": v for k, v in layers.items()})
    (folder / "summary.json").write_text(json.dumps(summ))
    rows = ["epoch,test_acc,remaining," + ",".join(f"remaining_{k}" for k in layers)]
    for e in range(5):
        w = e / 4
        rows.append(f"{e},{acc * w:.4f},{1 - w + w * remaining}," + ",".join(
            f"{1 - w + w * v}" for v in layers.values()))
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")


def layers_for(remaining: float, big_share: float) -> dict[str, float]:
    """Per-layer fractions with fc1 holding ``big_share`` of the weights left and fc2, fc3 the
    rest in proportion to their sizes."""
    total = remaining * sum(LENET.values())
    small = LENET["fc2"] + LENET["fc3"]
    return {"fc1": big_share * total / LENET["fc1"],
            "fc2": (1 - big_share) * total / small, "fc3": (1 - big_share) * total / small}


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


def test_the_committed_study_replots_to_its_committed_tables(tmp_path):
    """figures/claims holds the study's run files: --replot from a copy of it rewrites every
    committed table (agreement, per-claim and per-setting CSVs) byte for byte."""
    import shutil

    committed = Path(__file__).resolve().parent.parent / "figures" / "claims"
    assert (committed / "runs").is_dir(), "figures/claims/runs (the study's run files) is missing"
    copy = tmp_path / "claims"
    shutil.copytree(committed, copy)
    tables = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*")
              if p.suffix in (".csv", ".md") and "runs" not in p.relative_to(copy).parts}
    assert S.main(["--replot", "--out", str(copy)]) == 0
    for rel, data in tables.items():
        assert (copy / rel).read_bytes() == data, rel
