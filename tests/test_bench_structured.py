"""benchmarks.bench_structured: bad input is one line and exit 2; the smoke run (PB and
Torch-Pruning arms on both models) writes the run table, the summary, the figures and the
settings, every pruned network has fewer MACs than the dense one, and the PB arms freeze masks
within the budget the magnitude arms are cut to."""

from __future__ import annotations

import json

import pytest

from analysis.cli import run
from benchmarks import bench_structured
from benchmarks.structured_models import make
from pbexact.errors import PBInputError
from pbscale.runs import io
from tests._mnist import MNIST_DIR, needs_mnist

pytest.importorskip("torch_pruning")


@pytest.mark.parametrize("argv,match", [
    (["--models", "alexnet"], "invalid model 'alexnet'"),
    (["--arms", "cp,hc"], "invalid arm 'hc'"),
    (["--targets", "1"], "MACs reductions > 1"),
    (["--targets", "2,x"], "MACs reductions > 1"),
    (["--lam", "cp:lenet5=1e-3"], "give ARM:MODEL:TARGET=LAM"),
    (["--lam", "l2:lenet5:2=1e-3"], "ARM one of cp, arms"),
    (["--seeds", "0"], "--seeds: must be a positive integer"),
    (["--width", "0"], "--width 0 is out of range"),
    (["--targets", "3"], "no lam for cp on lenet5 at 3x; give --lam cp:lenet5:3=LAM"),
    (["--data-dir", "/nonexistent/mnist", "--arms", "l2"], "is not a folder"),
    (["--summarize"], "runs.csv does not exist"),
    (["--arms", "arms", "--dense-epochs", "1", "--finetune-epochs", "1"],
     "2 epochs leave none frozen"),
])
def test_bad_input_is_one_line_exit_2(argv, match, capsys, tmp_path):
    out = tmp_path / "out"
    assert run(bench_structured.main, argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and match in err and "\n" not in err
    assert not out.exists()  # nothing written


@needs_mnist
def test_smoke_run_writes_every_output(tmp_path, capsys):
    argv = ["--smoke", "--data-dir", str(MNIST_DIR), "--out", str(tmp_path)]
    assert run(bench_structured.main, argv) == 0
    rows = io.read_csv(tmp_path / "runs.csv")
    arms = {(r["model"], r["arm"], float(r["target"])) for r in rows}
    for model in ("lenet5", "resnet18"):
        assert (model, "dense", 1.0) in arms
        for arm in bench_structured.ARMS:
            for target in (2.0, 4.0):
                assert (model, arm, target) in arms
    for r in rows:
        assert 0 <= float(r["acc"]) <= 1 and float(r["latency_b1"]) > 0
        if r["model"] == "lenet5":  # the head keeps its 10 outputs
            assert r["widths"].split()[-1] == "fc:10" and r["widths"].startswith("conv1:")
        if r["arm"] in bench_structured.ARMS:  # physically smaller than dense
            assert int(r["macs"]) < int(r["dense_macs"])
            assert int(r["params"]) < int(r["dense_params"])
        if r["arm"] in bench_structured.PB_ARMS:  # the smaller network scores as the run did
            assert float(r["acc"]) == pytest.approx(float(r["reported_acc"]), abs=1e-6)
            assert r["lam_target"] == ""  # lam fixed unless --steer
        if r["arm"] in bench_structured.MAG_ARMS:  # the smaller network scores as the run did
            assert float(r["acc"]) == pytest.approx(float(r["reported_acc"]), abs=1e-6)
        if r["arm"] in bench_structured.TP_ARMS and r["model"] == "resnet18":
            assert int(r["dense_macs"]) / int(r["macs"]) >= float(r["target"])
    budgets = {(r["model"], r["target"], r["arm"]): r["budget"] for r in rows}
    for (model, target, arm), budget in budgets.items():  # PB cut to MP's fraction of MACs
        if arm in bench_structured.PB_ARMS:
            assert budget == budgets[model, target, "mp"] and 0 < float(budget) < 1
    summary = io.read_csv(tmp_path / "summary.csv")
    assert {s["arm"] for s in summary} >= set(bench_structured.ARMS)
    table = (tmp_path / "summary.md").read_text()
    assert "| lenet5 | 4x | TP Taylor | 1 |" in table and "best PB" in table
    assert "best magnitude" in table
    for model in ("lenet5", "resnet18"):
        assert (tmp_path / f"accuracy_vs_macs_{model}.png").read_bytes()[:4] == b"\x89PNG"
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["smoke"] and settings["command"].startswith(
        "python -m benchmarks.bench_structured") and settings["date"]
    (tmp_path / "summary.md").unlink()
    assert run(bench_structured.main, ["--summarize", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "summary.md").read_text() == table


@pytest.mark.parametrize("model", ["lenet5", "resnet18", "resnet20"])
def test_the_steered_fraction_drops_the_whole_networks_macs_by_the_target(model, monkeypatch):
    """steer_fraction against the run's own counts (channel_row on masks of the groups the run
    builds): every mask's whole-network MACs fraction is an affine function of its
    prunable-part fraction, and at steer_fraction(t) that function gives 1 / t."""
    import torch

    from pbscale.nets.channel_layout import channel_row
    from pbscale.nets.channels import channel_groups

    cls = bench_structured.MODELS[model]
    net, example = make(model, 0.25), torch.zeros(1, *cls.input_shape)
    groups = channel_groups(net, example)
    g = torch.Generator().manual_seed(0)
    rows = [channel_row(groups, (torch.rand(groups.d, generator=g) < p).double(), "macs", 1)
            for p in (0.2, 0.5, 0.8, 1.0)]
    (r0, m0), (r1, m1) = [(r["remaining"], r["remaining_macs"]) for r in rows[:2]]
    slope = (m1 - m0) / (r1 - r0)
    for r in rows:
        assert r["remaining_macs"] == pytest.approx(m0 + slope * (r["remaining"] - r0), abs=1e-12)
    for target in (2.0, 4.0):
        f = bench_structured.steer_fraction(net, example, target)
        assert m0 + slope * (f - r0) == pytest.approx(1 / target, abs=1e-12)
    # a network whose prunable part is a tenth of its MACs cannot drop them 2x
    from pbscale.nets import channel_layout

    monkeypatch.setattr(channel_layout, "prunable", lambda gs, kind: gs.costs.dense_macs // 10)
    with pytest.raises(PBInputError, match="needs more than the prunable part"):
        bench_structured.steer_fraction(net, example, 2.0)


@needs_mnist
def test_steer_gives_each_pb_run_its_fraction(tmp_path):
    """--steer: each PB run starts from --lam and is steered (--lam-target) to the fraction of
    the prunable part's MACs that drops the whole network's by its target."""
    argv = ["--smoke", "--models", "lenet5", "--arms", "cp", "--steer", "--first-seed", "2",
            "--data-dir", str(MNIST_DIR), "--out", str(tmp_path)]
    assert run(bench_structured.main, argv) == 0
    rows = [r for r in io.read_csv(tmp_path / "runs.csv") if r["arm"] == "cp"]
    assert {int(r["seed"]) for r in rows} == {2}  # --first-seed 2, one seed
    net = make("lenet5", bench_structured.SMOKE["width"])
    import torch

    example = torch.zeros(1, *bench_structured.MODELS["lenet5"].input_shape)
    assert {float(r["target"]): float(r["lam_target"]) for r in rows} == {
        t: pytest.approx(bench_structured.steer_fraction(net, example, t), abs=1e-12)
        for t in (2.0, 4.0)}


def test_verdicts_need_equal_macs_and_a_paired_interval_clear_of_zero():
    """The best PB arm against the best Torch-Pruning arm: a verdict only where the winner
    removed at least as many MACs and the seeds' paired 95% t interval of the gap excludes 0
    (by hand: diffs 0.4, 0.5, 0.6 points, mean 0.5, s.d. 0.1, t_0.975(2) = 4.303); MACs within
    1% count as equal; a gap within the seeds' noise, or at unequal MACs, is no verdict."""
    from scipy import stats

    def rows(arm, accs, macs=100):
        return [{"model": "m", "target": 4.0, "arm": arm, "seed": k, "acc": a, "macs": macs,
                 "params": 1, "dense_macs": 400, "dense_latency_b1": 1.0, "latency_b1": 1.0,
                 "dense_latency_b128": 1.0, "latency_b128": 1.0} for k, a in enumerate(accs)]

    tp = rows("bn", [0.950, 0.960, 0.955])
    clear = rows("cp", [0.954, 0.965, 0.961])
    gap = bench_structured.paired_gap(clear, tp)
    assert gap.mean == pytest.approx(0.005) and gap.df == 2
    assert gap.half_width == pytest.approx(stats.t.ppf(0.975, 2) * 0.001 / 3 ** 0.5)
    (line,) = bench_structured.verdicts(bench_structured.summarize(clear + tp), clear + tp)
    assert "PB more accurate at at least as large a MACs reduction (gap +0.50 points" in line
    noisy = rows("cp", [0.960, 0.955, 0.956])  # diffs +1.0, -0.5, +0.1 points
    (line,) = bench_structured.verdicts(bench_structured.summarize(noisy + tp), noisy + tp)
    assert "within the seeds' noise" in line and "no verdict" in line
    fewer = rows("cp", [0.954, 0.965, 0.961], macs=120)  # more accurate, fewer MACs removed
    (line,) = bench_structured.verdicts(bench_structured.summarize(fewer + tp), fewer + tp)
    assert "no verdict at equal MACs" in line
    worse = rows("cp", [0.940, 0.950, 0.946])  # at the same MACs
    (line,) = bench_structured.verdicts(bench_structured.summarize(worse + tp), worse + tp)
    assert "Torch-Pruning more accurate at at least as large a MACs reduction (gap -" in line
    worse = rows("cp", [0.940, 0.950, 0.946], macs=99.5)  # 0.5% fewer MACs: equal
    (line,) = bench_structured.verdicts(bench_structured.summarize(worse + tp), worse + tp)
    assert "Torch-Pruning more accurate at at least as large a MACs reduction (gap -" in line
    worse = rows("cp", [0.940, 0.950, 0.946], macs=90)  # less accurate, more MACs removed
    (line,) = bench_structured.verdicts(bench_structured.summarize(worse + tp), worse + tp)
    assert "Torch-Pruning more accurate but with fewer MACs removed" in line


def test_resnet20_runs_on_cifar10_files_in_the_official_binary_format(tmp_path):
    """``--models resnet20`` reads CIFAR-10's binary version from --cifar-dir (small files in
    the official record format, written here), standardizes each channel with the training
    subset's statistics, and runs every arm on the paper's ResNet-20 (its widths, though the
    smoke run narrows the others): each pruned network is smaller, the PB arms score as their
    runs did; no MNIST is read."""
    import torch
    from test_prune_data import make_cifar

    make_cifar(tmp_path / "cifar", n=40)
    data = bench_structured.load_cifar(str(tmp_path / "cifar"), 0, 0)
    x = data["train"][0]
    assert x.shape[1:] == (3, 32, 32) and len(data["val"][0]) == 20
    assert torch.allclose(x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)
    assert torch.allclose(x.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-4)
    argv = ["--smoke", "--models", "resnet20", "--arms", "cp,mp,l2", "--targets", "2",
            "--cifar-dir", str(tmp_path / "cifar"), "--data-dir", str(tmp_path / "no-mnist"),
            "--out", str(tmp_path / "out")]
    assert run(bench_structured.main, argv) == 0
    rows = io.read_csv(tmp_path / "out" / "runs.csv")
    assert {r["arm"] for r in rows} == {"dense", "cp", "mp", "l2"}
    assert {int(r["dense_params"]) for r in rows} == {
        sum(p.numel() for p in make("resnet20", 0.125).parameters())}  # the paper's widths
    for r in rows:
        if r["arm"] != "dense":
            assert int(r["macs"]) < int(r["dense_macs"])
        if r["arm"] == "cp":
            assert float(r["acc"]) == pytest.approx(float(r["reported_acc"]), abs=1e-6)


def test_a_missing_cifar_folder_is_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--models", "resnet20", "--cifar-dir", str(tmp_path / "none"), "--out", str(out)]
    assert run(bench_structured.main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--cifar-dir" in err and "leave resnet20 out" in err and "\n" not in err
    assert not out.exists()
