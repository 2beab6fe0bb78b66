"""pbscale.prune: masks multiply exactly the intended tensors, MP/GMP fractions and zeros, hand
counts, the MC gradient against enumeration, resume, the exported files, every model end to
end and bad input."""

import itertools
import math
import os
from pathlib import Path

import pytest
import torch
from _plain_eval import plain_test_metrics
from torch import nn

from pbexact.errors import RunInterrupted
from pbexact.parametrizations import get_parametrization
from pbscale import prune as P
from pbscale.forward.folded import cross_entropy_per_mask
from pbscale.forward.masks import MaskedModule
from pbscale.forward.rescale import rescaled_weight
from pbscale.methods import mc_gradient, schedules
from pbscale.nets.models import MODELS
from pbscale.pruning import config as pconfig
from pbscale.pruning import outputs as poutputs
from pbscale.pruning import run as prun
from pbscale.pruning import task as ptask
from pbscale.runs.io import read_csv
from pbscale.runs.loop import EvalContext
from pbscale.runs.loop import run as loop_run


def tiny_cfg(**kw):
    base = dict(model="lenet", synthetic=48, epochs=2, max_batches=2, batch_size=8, n=2,
                val_size=16, gmp_every=1)
    base.update(kw)
    return pconfig.PruneConfig(**base)


def make_task(**kw):
    cfg, dev, data = prun.prepare(tiny_cfg(**kw))
    return ptask.PruneTask(cfg, data, dev)


def make_run(**kw):
    """(task, method, loop config, weight optimizer) of a tiny config."""
    cfg, dev, data = prun.prepare(tiny_cfg(**kw))
    return prun.build(cfg, data, dev)


# ------------------------------------------------------------------ masks hit the right tensors


@pytest.mark.parametrize("method", ["cp", "arms"])
def test_masks_multiply_exactly_the_masked_weights(method):
    task = make_task(method=method)
    g = torch.Generator().manual_seed(0)
    z = (torch.rand(task.d, generator=g) < 0.3).float()
    params = task.evaluation.eval_params(z)
    base = dict(task.model.named_parameters())
    assert task.names == ["fc1.weight", "fc2.weight"]
    start = 0
    for name in task.names:
        w = base[name]
        m = z[start:start + w.numel()].view_as(w)
        start += w.numel()
        scale = w.numel() / float(m.sum()) if method == "arms" else 1.0  # DWR for MC only
        assert torch.allclose(params[name], w * m * scale, rtol=1e-6, atol=0)
        assert torch.equal(params[name] == 0, (m == 0) | (w == 0))
    for name in ("fc1.bias", "fc2.bias", "fc3.weight", "fc3.bias"):
        assert torch.equal(params[name], base[name])


def test_batched_loss_equals_network_with_zeroed_weights():
    """f(z) of MC pruning on k masks equals the plain network with the masked weights zeroed
    and the rest of each layer rescaled by 1 / mean(mask), mask by mask (ResNet-20: the 3x3
    convolutions only)."""
    torch.manual_seed(0)
    task = make_task(model="resnet20", dataset="cifar10", method="arms", synthetic=8,
                     batch_size=4)
    assert len(task.names) == 19 and all("shortcut" not in k for k in task.names)
    x, y = next(task.data.batches("train", 4))
    z = (torch.rand(3, task.d) < 0.7).float()
    task.model.train()
    J = task.layout.loss_fn(x, y, cross_entropy_per_mask)(z)
    for i in range(3):
        net = type(task.model)()
        net.load_state_dict(task.model.state_dict())
        net.train()
        with torch.no_grad():
            for k, m in task.layout.split(z[i][None]).items():
                p = dict(net.named_parameters())[k]
                p.mul_(m[0] / m.mean())
        ce = nn.functional.cross_entropy(net(x), y)
        assert torch.allclose(J[i], ce, rtol=1e-4), (i, J[i], ce)


# ------------------------------------------------------------------ MP / GMP


def test_global_magnitude_exact_counts_with_ties():
    g = torch.Generator().manual_seed(1)
    w = {"a": torch.randint(-3, 4, (37, 11), generator=g).float(),
         "b": torch.randint(-3, 4, (5, 3, 3, 3), generator=g).float()}
    d = 37 * 11 + 135
    for frac in (1.0, 0.5, 0.1, 0.013, 1 / d):
        m = schedules.global_magnitude_masks(w, frac)
        kept, total = schedules.remaining(m)
        assert total == d and kept == max(1, round(frac * d))
        # every kept |w| >= every pruned |w|
        flat_w = torch.cat([w[k].abs().flatten() for k in w])
        flat_m = torch.cat([m[k].flatten() for k in w]).bool()
        assert flat_w[flat_m].min() >= flat_w[~flat_m].max() if kept < d else True
    # a pruned weight never comes back, even when it has grown
    m1 = schedules.global_magnitude_masks(w, 0.5)
    w2 = {k: v + 100 * (1 - m1[k]) for k, v in w.items()}
    m2 = schedules.global_magnitude_masks(w2, 0.25, m1)
    assert all(torch.all(m2[k] <= m1[k]) for k in w)
    assert schedules.remaining(m2)[0] == round(0.25 * d)


def test_gmp_schedule_cubic():
    assert schedules.gmp_fraction(0, 10, 110, 0.1) == 1.0
    assert schedules.gmp_fraction(110, 10, 110, 0.1) == pytest.approx(0.1)
    # halfway: s = s_f (1 - 1/8) with s_f = 0.9
    assert schedules.gmp_fraction(60, 10, 110, 0.1) == pytest.approx(1 - 0.9 * (1 - 0.125))
    vals = [schedules.gmp_fraction(t, 10, 110, 0.02) for t in range(0, 130)]
    assert all(a >= b for a, b in zip(vals, vals[1:]))


@pytest.mark.parametrize("method", ["mp", "gmp"])
def test_mp_gmp_reach_target_exactly_and_pruned_weights_stay_zero(tmp_path, method):
    task, meth, loop, wopt = make_run(mode="joint", method=method, target=0.02, epochs=4,
                                      max_batches=3, prune_at=0.25, gmp_start=0.1,
                                      gmp_end=0.6)
    seen = {"cut": None, "checks": 0}

    def hook(epoch, i):  # before every step: everything pruned so far is still exactly zero
        p = dict(task.model.named_parameters())
        masks = task.layout.split(meth.mask[None])
        if seen["cut"] is None and int(meth.mask.sum()) < task.d:
            seen["cut"] = {k: m[0].clone() for k, m in masks.items()}
        if seen["cut"] is not None:
            for k in task.names:
                assert torch.all(p[k][seen["cut"][k] == 0] == 0)
                assert torch.all(p[k][masks[k][0] == 0] == 0)
            seen["checks"] += 1

    folder = loop_run(task, meth, loop, tmp_path, weight_optimizer=wopt, progress=False,
                      step_hook=hook)
    assert seen["cut"] is not None and seen["checks"] >= 3
    assert int(meth.mask.sum()) == round(0.02 * task.d)
    rows = read_csv(folder / "metrics.csv")
    assert rows[-1]["remaining"] * task.d == pytest.approx(round(0.02 * task.d))
    if method == "gmp":  # the cubic schedule cuts several times, monotonically
        rem = [r["remaining"] for r in rows]
        assert len(set(rem)) >= 3 and all(a >= b for a, b in zip(rem, rem[1:]))


# ------------------------------------------------------------------ hand counts


def test_remaining_counts_by_hand():
    task, meth, loop, _ = make_run(method="cp")
    with torch.no_grad():
        meth.r.fill_(-1.0)
        meth.r[:1000] = 1.0          # 1000 weights of fc1 kept
        meth.r[235_200:235_230] = 1.0  # 30 weights of fc2
    row = task.evaluate(EvalContext(meth, torch.Generator().manual_seed(0), "train", None, 1))
    assert row["remaining"] == 1030 / 265_200
    assert row["remaining_fc1"] == 1000 / 235_200
    assert row["remaining_fc2"] == 30 / 30_000
    # all parameters: 266,610 of which 265,200 masked
    assert row["remaining_all"] == (266_610 - 265_200 + 1030) / 266_610


# ------------------------------------------------------------------ MC gradient vs enumeration


@pytest.mark.parametrize("estimator,param", [("arms", "escort"), ("loorf", "sigmoid")])
def test_mc_gradient_matches_enumeration(estimator, param):
    """Mean of M estimates of the MC pruning gradient of a 2-2-2 network (d = 8 masked
    weights, dynamic weight rescaling) against the exact gradient of E[J] by enumerating the
    256 masks; each coordinate within 4.5 standard errors of the mean."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    layout = MaskedModule(net, ["0.weight", "2.weight"], weight_hook=rescaled_weight)
    x, y = torch.randn(6, 2), torch.randint(0, 2, (6,))
    f = layout.loss_fn(x, y, cross_entropy_per_mask)  # the loss PruneTask.batch_loss gives
    pz = get_parametrization(param)
    theta0 = torch.tensor([0.3, 0.6, 0.5, 0.8, 0.4, 0.7, 0.55, 0.35], dtype=torch.float64)
    r = pz.logits(theta0).float()
    Z = torch.tensor(list(itertools.product([0.0, 1.0], repeat=8)))
    J = f(Z).double()
    rr = r.double().requires_grad_(True)
    th = pz.theta(rr)
    prob = (Z.double() * th + (1 - Z.double()) * (1 - th)).prod(1)
    (exact,) = torch.autograd.grad((prob * J).sum(), rr)
    gen = torch.Generator().manual_seed(0)
    M = 3000
    G = torch.stack([mc_gradient(f, r, pz, estimator, 4, gen).grad.double() for _ in range(M)])
    se = G.std(0) / math.sqrt(M)
    z_scores = (G.mean(0) - exact).abs() / se
    assert float(z_scores.max()) < 4.5, (G.mean(0), exact, se)
    assert float(exact.abs().max()) > 5 * float(se.max())  # the test can see a wrong gradient


# ------------------------------------------------------------------ resume and exports


def _rows(folder):
    drop = ("train_seconds", "val_seconds")
    def same(v):  # nan (row 0 has no training loss) compares equal to itself as text
        return "nan" if isinstance(v, float) and math.isnan(v) else v

    return [{k: same(v) for k, v in r.items() if k not in drop}
            for r in read_csv(folder / "metrics.csv")]


@pytest.mark.parametrize("method", ["arms", "gmp"])
def test_resume_equals_uninterrupted(tmp_path, method):
    import os
    import signal

    cfg = tiny_cfg(mode="joint", method=method, epochs=5, max_batches=3)
    a = prun.run(cfg, tmp_path / "a", quiet=True)
    out = tmp_path / "b"
    for stop_at in ((1, 1), (3, 2)):  # SIGTERM mid epoch 2, then mid epoch 4 (frozen masks)
        def hook(epoch, i, stop_at=stop_at):
            if (epoch, i) == stop_at:
                os.kill(os.getpid(), signal.SIGTERM)

        with pytest.raises(RunInterrupted) as exc:
            prun.run(cfg, out, quiet=True, step_hook=hook)
        assert exc.value.code == 143
    b = prun.run(cfg, out, quiet=True)
    fa, fb = a["folder"], b["folder"]
    assert _rows(Path(fa)) == _rows(Path(fb))
    assert a["final_test_acc"] == b["final_test_acc"]
    ma = torch.load(Path(fa) / "masks.pt", weights_only=True)
    mb = torch.load(Path(fb) / "masks.pt", weights_only=True)
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    # a finished run is read back, not retrained
    assert prun.run(cfg, out, quiet=True)["final_test_acc"] == b["final_test_acc"]


@pytest.mark.parametrize("model,method,mode", [("lenet", "arms", "supermask"),
                                               ("resnet20", "cp", "joint"),
                                               ("resnet20", "loorf", "supermask"),
                                               ("lenet", "gmp", "joint")])
def test_pruned_pt_loads_in_plain_pytorch_to_reported_accuracy(tmp_path, model, method, mode):
    ds = "mnist" if model == "lenet" else "cifar10"
    cfg = tiny_cfg(model=model, dataset=ds, method=method, mode=mode, synthetic=24,
                   batch_size=8, epochs=2, max_batches=1)
    summary = prun.run(cfg, tmp_path, quiet=True)
    folder = Path(summary["folder"])
    cfg2, dev, data = prun.prepare(cfg)
    state = torch.load(folder / "pruned.pt", weights_only=True)
    assert any(k.endswith("weight_orig") for k in state)
    net = poutputs.load_pruned(model, folder / "pruned.pt")
    acc, loss = plain_test_metrics(net, data)
    assert acc == summary["final_test_acc"]
    assert loss == pytest.approx(summary["final_test_loss"], rel=1e-5)
    # masks.pt: binary masks, rescaling constants and weights reproduce the same network
    blob = torch.load(folder / "masks.pt", weights_only=True)
    plain = MODELS[model]()
    plain.load_state_dict({k[len("weight."):]: v for k, v in blob.items()
                           if k.startswith("weight.")})
    with torch.no_grad():
        for k, p in plain.named_parameters():
            if f"mask.{k}" in blob:
                assert set(blob[f"mask.{k}"].unique().tolist()) <= {0.0, 1.0}
                scale = blob.get(f"scale.{k}", torch.tensor(1.0))
                p.copy_(p * blob[f"mask.{k}"] * scale)
    plain.eval()
    assert plain_test_metrics(plain, data)[0] == summary["final_test_acc"]
    kept = sum(int(blob[k].sum()) for k in blob if k.startswith("mask."))
    assert kept / summary["masked"] == summary["final_remaining"]


# ------------------------------------------------------------------ every model, mode, method


COMBOS = [("supermask", m) for m in ("cp", "arms", "loorf", "disarm", "dense")] + [
    ("joint", m) for m in ("cp", "arms", "loorf", "disarm", "mp", "gmp", "dense")]


#: VGG-19 (20M masked weights) writes ~0.5 GB of checkpoints and exports per run; its joint
#: ARMS run took 185 s and joint GMP 76 s on the loaded 2-core machine. The default suite runs
#: supermask CP; the full matrix runs with PBNN_SLOW_TESTS=1.
VGG_DEFAULT = {("supermask", "cp")}
SLOW = os.environ.get("PBNN_SLOW_TESTS") == "1"


@pytest.mark.parametrize("model", ["lenet", "conv6", "resnet20", "vgg19"])
@pytest.mark.parametrize("mode,method", COMBOS)
def test_every_model_mode_method_end_to_end(tmp_path, model, mode, method):
    if model == "vgg19" and (mode, method) not in VGG_DEFAULT and not SLOW:
        pytest.skip("VGG-19 beyond the default combinations: run with PBNN_SLOW_TESTS=1")
    ds = "mnist" if model == "lenet" else "cifar10"
    # 5 epochs pass through every phase of a joint run (dense warm-up, masks, frozen masks);
    # the two large CIFAR nets take 2 (warm-up and mask training) to keep the suite fast
    epochs = 5 if model in ("lenet", "resnet20") else 2
    cfg = tiny_cfg(model=model, dataset=ds, mode=mode, method=method, synthetic=8,
                   batch_size=4, epochs=epochs, max_batches=1, val_size=4, target=0.5,
                   lr=0.01, eval_masks=2)
    s = prun.run(cfg, tmp_path, quiet=True)
    rows = read_csv(Path(s["folder"]) / "metrics.csv")
    assert len(rows) == epochs + 1  # row 0: before training
    for r in rows:
        assert 0 <= r["test_acc"] <= 1 and math.isfinite(r["test_loss"])
        assert 0 <= r["remaining"] <= 1 and r["remaining_all"] >= r["remaining"] - 1e-12
    if method == "dense":
        assert s["final_remaining"] == 1.0
    if method in ("mp", "gmp"):
        assert s["final_remaining"] * s["masked"] == round(0.5 * s["masked"])
    assert (Path(s["folder"]) / "pruned.pt").exists()


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("args,match", [
    (["--model", "alexnet"], "--model: unknown model 'alexnet'.*package.module:factory"),
    (["--data-dir", "{tmp}/nothing"], "not found in"),
    (["--lam", "-1"], "lam"),
    (["--method", "arms", "--n", "1"], "n >= 2"),
    (["--method", "loorf", "--n", "1"], "n >= 2"),
    (["--method", "disarm", "--n", "3"], "even"),
    (["--mode", "joint", "--method", "mp", "--target", "0"], "--target: must be a number > 0"),
    (["--mode", "joint", "--method", "gmp", "--target", "1.5"], r"\(0, 1\]"),
    (["--method", "mp"], "--mode joint"),
    (["--dataset", "cifar10"], "use --dataset mnist"),
    (["--epochs", "0"], "epochs"),
])
def test_bad_input_exit_2_one_line_before_training(tmp_path, capsys, args, match):
    import re

    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--data-dir" not in args:
        args += ["--data-dir", str(tmp_path)]
    out = tmp_path / "out"
    rc = P.main(args + ["--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(match, lines[0])
    assert "Traceback" not in err
    assert not out.exists()  # nothing written: it failed before training


# ------------------------------------------------------------------ analysis.pareto


def test_pareto_front_by_hand():
    from analysis.scale.fronts import pareto_front

    pts = [{"remaining": r, "test_acc": a} for r, a in
           [(0.1, 0.90), (0.05, 0.92), (0.2, 0.95), (0.3, 0.94), (0.01, 0.5), (0.05, 0.91)]]
    front = pareto_front(pts)
    assert [(p["remaining"], p["test_acc"]) for p in front] == [(0.01, 0.5), (0.05, 0.92),
                                                               (0.2, 0.95)]


def test_pareto_cli_writes_figures_and_csvs(tmp_path, capsys):
    from analysis import pareto
    from analysis.cli import run as cli_run

    runs = tmp_path / "runs"
    for kw in (dict(method="cp", lam=1e-3), dict(method="cp", lam=1e-5),
               dict(method="gmp", mode="joint", target=0.3), dict(method="dense"),
               dict(method="dense", seed=1)):
        prun.run(tiny_cfg(epochs=1, max_batches=1, **kw), runs, quiet=True)
    out = tmp_path / "fig"
    assert pareto.main([str(runs), "--out", str(out)]) == 0
    for name in ("runs.csv", "runs.md", "pareto.csv", "layers.csv", "pareto_lenet_supermask.png",
                 "pareto_lenet_joint.png", "layers_lenet_supermask.png"):
        assert (out / name).exists(), name
    rows = read_csv(out / "runs.csv")
    assert len(rows) == 4  # the two dense seeds are averaged into one point
    dense = [r for r in rows if r["label"] == "dense"]
    assert dense[0]["seeds"] == 2 and dense[0]["remaining"] == 1.0
    assert "`python -m pbscale.prune --model lenet --mode supermask --method gmp" not in (
        out / "runs.md").read_text()  # gmp ran in joint mode
    gmp_line = [ln for ln in (out / "runs.md").read_text().splitlines() if "gmp" in ln][0]
    assert "--mode joint --method gmp" in gmp_line and "--target 0.3" in gmp_line
    layers = read_csv(out / "layers.csv")
    assert {r["layer"] for r in layers} == {"fc1", "fc2"}
    assert cli_run(pareto.main, [str(tmp_path / "none"), "--out", str(out)]) == 2
