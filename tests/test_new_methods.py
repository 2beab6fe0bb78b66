"""The methods beyond the paper (pbscale.methods.beyond): ST-theta's gradient against the analytic
straight-through surrogate, hard-concrete's expected L0 against the Monte Carlo frequency of
non-zero gates and its test-time gate against the formula, edge-popup's per-layer counts at every
step and the gradient of its scores, resume, pruned.pt in plain PyTorch, every model end to end,
signed constant weights and bad input."""

import math
import os
import signal
from pathlib import Path

import pytest
import torch
from _plain_eval import plain_test_metrics
from torch import nn

from pbexact.errors import RunInterrupted
from pbscale import prune as P
from pbscale.methods import REGISTRY, MaskTrainer, MethodConfig, straight_through
from pbscale.methods.beyond import (
    HC_BETA,
    HC_GAMMA,
    HC_ZETA,
    hc_nonzero,
    hc_sample,
    hc_test_gate,
    st_theta,
)
from pbscale.methods.schedules import kept_per_layer, top_scores
from pbscale.nets.models import MODELS, build_model
from pbscale.pruning import config as pconfig
from pbscale.pruning import outputs as poutputs
from pbscale.pruning import run as prun
from pbscale.pruning import task as ptask
from pbscale.runs.io import read_csv

NEW = ("st-theta", "hardconcrete", "edgepopup")
#: (mode, method) pairs the new methods run in.
MODES = [("supermask", m) for m in NEW] + [("joint", "st-theta"), ("joint", "hardconcrete")]


def tiny_cfg(**kw):
    base = dict(model="lenet", synthetic=48, epochs=2, max_batches=2, batch_size=8, n=1,
                val_size=16, lam=1e-3, mask_lr=0.05, target=0.3, eval_masks=3,
                eval_batches=2)
    base.update(kw)
    return pconfig.PruneConfig(**base)


# ------------------------------------------------------------------ ST-theta


def linear_problem(d=5, b=7, seed=0):
    """A tiny network (one linear unit, squared error) with its analytic dJ/dz."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, d, generator=g, dtype=torch.float64)
    y = torch.randn(b, generator=g, dtype=torch.float64)
    w = torch.randn(d, generator=g, dtype=torch.float64)

    def f(z):  # z (n, d) -> J (n,)
        return ((x @ (w * z).T - y[:, None]) ** 2).mean(0)

    def dJ_dz(z):  # analytic: (2/b) sum_b (x_b . (w z) - y_b) x_bi w_i, shape (n, d)
        res = x @ (w * z).T - y[:, None]  # (b, n)
        return 2 / b * (res.T @ x) * w

    return f, dJ_dz


@pytest.mark.parametrize("param", ["sigmoid", "escort"])
def test_st_theta_gradient_equals_analytic_straight_through(param):
    f, dJ_dz = linear_problem()
    cfg = MethodConfig(method="st-theta", n=4, param=param, seed=3, lam=0.0)
    trainer = MaskTrainer(cfg, 5, total_steps=10, dtype=torch.float64)
    theta0 = torch.tensor([0.2, 0.55, 0.5, 0.8, 0.4], dtype=torch.float64)
    with torch.no_grad():
        trainer.r.copy_(trainer.param.logits(theta0))
    u = torch.rand((4, 5), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    est = trainer.gradient(f)
    r = trainer.r.detach()
    theta = trainer.param.theta(r)
    z = (u < theta).to(torch.float64)
    # the chain dtheta/dr (d, P): diagonal for the sigmoid, (d, 2d) for the escort
    jac = torch.autograd.functional.jacobian(trainer.param.theta, r)
    expected = dJ_dz(z).mean(0) @ jac
    assert torch.allclose(est.grad, expected, atol=1e-12)
    assert est.loss == pytest.approx(float(f(z).mean()))
    if param == "sigmoid":  # the paper's ST passes dJ/dz to r: a factor theta (1 - theta) apart
        st = straight_through(f, r, u).grad
        th = torch.sigmoid(r)
        assert torch.allclose(est.grad, st * th * (1 - th), atol=1e-12)
        assert not torch.allclose(est.grad, st)


def test_st_theta_weights_train_on_the_sampled_loss():
    f, _ = linear_problem()
    J_ref = []
    u = torch.rand((2, 5), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    r = torch.zeros(5, dtype=torch.float64)
    from pbexact.parametrizations import get_parametrization

    est, J = st_theta(f, r, get_parametrization("sigmoid"), u, keep_graph=True)
    J_ref.append(J)
    assert J.shape == (2,) and est.grad.shape == (5,)
    z = (u < 0.5).to(torch.float64)
    assert torch.allclose(J.detach(), f(z))


# ------------------------------------------------------------------ hard concrete


def test_hard_concrete_expected_l0_matches_monte_carlo():
    """P(gate != 0) in closed form against the frequency of non-zero gates in N samples per
    log alpha: within 4 standard errors sqrt(p (1 - p) / N)."""
    la = torch.linspace(-4, 4, 9, dtype=torch.float64)
    N = 200_000
    u = torch.rand((N, 9), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    freq = (hc_sample(la, u) != 0).double().mean(0)
    p = hc_nonzero(la)
    se = (p * (1 - p) / N).sqrt()
    assert torch.all((freq - p).abs() <= 4 * se), (freq, p)
    # the closed form itself: sigmoid(log alpha - beta log(-gamma / zeta))
    assert torch.allclose(p, torch.sigmoid(la - HC_BETA * math.log(-HC_GAMMA / HC_ZETA)))
    # gates lie in [0, 1] and hit both ends with positive probability
    g = hc_sample(torch.zeros(9, dtype=torch.float64), u[:1000])
    assert float(g.min()) == 0.0 and float(g.max()) == 1.0


def test_hard_concrete_test_gate_is_the_formula_and_its_zeros_are_pruned():
    la = torch.tensor([-5.0, -2.5, -2.3, 0.0, 1.0, 2.4, 6.0], dtype=torch.float64)
    gate = hc_test_gate(la)
    by_hand = [min(1.0, max(0.0, 1 / (1 + math.exp(-a)) * (HC_ZETA - HC_GAMMA) + HC_GAMMA))
               for a in la.tolist()]
    assert gate.tolist() == pytest.approx(by_hand, abs=1e-15)
    # exact zeros where sigmoid(log alpha) <= -gamma / (zeta - gamma) = 1/12, ones at the top
    assert gate[0] == 0 and gate[1] == 0 and gate[2] > 0 and gate[-1] == 1
    cfg = MethodConfig(method="hardconcrete", n=1, seed=0)
    trainer = MaskTrainer(cfg, 7, total_steps=1, dtype=torch.float64)
    with torch.no_grad():
        trainer.r.copy_(la)
    assert torch.equal(trainer.mode_mask(), gate)
    assert torch.equal(trainer.theta(), hc_nonzero(la))


def test_hard_concrete_l0_gradient_is_lambda_times_expected_l0_derivative():
    cfg = MethodConfig(method="hardconcrete", n=1, seed=0, lam=0.3)
    trainer = MaskTrainer(cfg, 4, total_steps=1, dtype=torch.float64)
    est = trainer.gradient(lambda z: torch.zeros(z.shape[0], dtype=z.dtype) + 0 * z.sum(-1))
    p = hc_nonzero(torch.zeros(4, dtype=torch.float64))
    assert torch.allclose(est.grad, 0.3 * p * (1 - p))


# ------------------------------------------------------------------ edge-popup


def test_edge_popup_keeps_exact_counts_every_step_and_scores_get_gradient():
    layers, target = (10, 7, 3, 2), 0.3
    counts = kept_per_layer(layers, target)
    assert counts == [round(target * s) for s in layers] == [3, 2, 1, 1]
    cfg = MethodConfig(method="edgepopup", n=1, seed=2, lr=0.05)
    d = sum(layers)
    trainer = MaskTrainer(cfg, d, total_steps=20, dtype=torch.float64, layers=layers,
                          target=target)
    # the loss prefers the mask of the lowest scores of each layer (as many as kept)
    z0 = trainer.mode_mask()
    want = torch.cat([top_scores(-p, (s,), target) for p, s in
                      zip(torch.split(trainer.r.detach(), list(layers)), layers)])
    assert not torch.equal(want, z0)

    def f(z):
        return ((z - want) ** 2).sum(-1)

    seen_masks = set()
    for _ in range(30):
        z = trainer.mode_mask()
        est = trainer.gradient(f)
        assert torch.allclose(est.grad, 2 * (z - want), atol=1e-12)  # to every score
        trainer.step(f)
        z = trainer.mode_mask()
        parts = torch.split(z, list(layers))
        assert [int(p.sum()) for p in parts] == counts
        assert set(z.unique().tolist()) <= {0.0, 1.0}
        seen_masks.add(tuple(z.tolist()))
    assert len(seen_masks) > 1 and torch.equal(trainer.mode_mask(), want)  # scores move it
    assert bool(((z0 == 0) & (want == 1)).any())  # unkept scores got gradient and rose


def test_edge_popup_prune_run_keeps_round_target_per_layer_at_every_step(tmp_path):
    cfg, dev, data = prun.prepare(tiny_cfg(method="edgepopup", target=0.37, epochs=2))
    task, meth, loop, wopt = prun.build(cfg, data, dev)
    sizes = task.layout.sizes
    checks = []

    def hook(epoch, i):
        parts = torch.split(meth.mode_mask(), sizes)
        assert [int(p.sum()) for p in parts] == [round(0.37 * s) for s in sizes]
        checks.append((epoch, i))

    from pbscale.runs.loop import run as loop_run

    r0, z0 = meth.r.detach().clone(), meth.mode_mask()
    folder = loop_run(task, meth, loop, tmp_path, progress=False, step_hook=hook)
    assert len(checks) == cfg.epochs * task.steps_per_epoch
    # scores move whether kept or not (a score stays where dJ/dz = 0: dead units, zero inputs)
    moved = meth.r.detach() != r0
    assert float(moved[z0 == 0].double().mean()) > 0.5
    assert float(moved[z0 == 1].double().mean()) > 0.5
    row = read_csv(folder / "metrics.csv")[-1]
    for k, s in zip(task.names, sizes):
        assert row[f"remaining_{k.removesuffix('.weight')}"] == round(0.37 * s) / s


# ------------------------------------------------------------------ shared: resume, export


def _rows(folder):
    drop = ("train_seconds", "val_seconds")
    return [{k: ("nan" if isinstance(v, float) and math.isnan(v) else v)
             for k, v in r.items() if k not in drop} for r in read_csv(folder / "metrics.csv")]


@pytest.mark.parametrize("mode,method", MODES)
def test_resume_equals_uninterrupted(tmp_path, mode, method):
    cfg = tiny_cfg(mode=mode, method=method, epochs=5, max_batches=3)
    a = prun.run(cfg, tmp_path / "a", quiet=True)
    out = tmp_path / "b"
    for stop_at in ((1, 1), (3, 2)):
        def hook(epoch, i, stop_at=stop_at):
            if (epoch, i) == stop_at:
                os.kill(os.getpid(), signal.SIGTERM)

        with pytest.raises(RunInterrupted) as exc:
            prun.run(cfg, out, quiet=True, step_hook=hook)
        assert exc.value.code == 143
    b = prun.run(cfg, out, quiet=True)
    assert _rows(Path(a["folder"])) == _rows(Path(b["folder"]))
    ma = torch.load(Path(a["folder"]) / "masks.pt", weights_only=True)
    mb = torch.load(Path(b["folder"]) / "masks.pt", weights_only=True)
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)


@pytest.mark.parametrize("mode,method", MODES)
def test_pruned_pt_loads_in_plain_pytorch_to_reported_accuracy(tmp_path, mode, method):
    cfg = tiny_cfg(mode=mode, method=method, synthetic=24, epochs=2, max_batches=2)
    summary = prun.run(cfg, tmp_path, quiet=True)
    folder = Path(summary["folder"])
    _, _, data = prun.prepare(cfg)
    net = poutputs.load_pruned("lenet", folder / "pruned.pt")
    acc, loss = plain_test_metrics(net, data)
    assert acc == summary["final_test_acc"]
    assert loss == pytest.approx(summary["final_test_loss"], rel=1e-5)
    blob = torch.load(folder / "masks.pt", weights_only=True)
    state = torch.load(folder / "pruned.pt", weights_only=True)
    kept = 0
    for k in (k[len("mask."):] for k in blob if k.startswith("mask.")):
        m = blob[f"mask.{k}"]
        assert set(m.unique().tolist()) <= {0.0, 1.0}
        layer = k.removesuffix(".weight")
        assert torch.equal(state[f"{layer}.weight_mask"], m)
        gate = blob.get(f"gate.{k}")
        if method == "hardconcrete":  # gate values folded into weight_orig, zeros pruned
            assert gate is not None and torch.equal(gate != 0, m != 0)
            assert torch.allclose(state[f"{layer}.weight_orig"], blob[f"weight.{k}"] * gate)
        else:
            assert gate is None
        kept += int(m.sum())
    assert kept / summary["masked"] == summary["final_remaining"]
    if method == "st-theta":  # both evaluations reported
        assert 0 <= summary["final_sampled_test_acc"] <= 1
        assert 0 <= summary["final_sampled_remaining"] <= 1


# ------------------------------------------------------------------ every model


SLOW = os.environ.get("PBNN_SLOW_TESTS") == "1"


@pytest.mark.parametrize("model", ["lenet", "conv6", "resnet20", "vgg19"])
@pytest.mark.parametrize("mode,method", MODES)
def test_every_model_end_to_end(tmp_path, model, mode, method):
    if model == "vgg19" and not SLOW:
        pytest.skip("VGG-19: run with PBNN_SLOW_TESTS=1")
    ds = "mnist" if model == "lenet" else "cifar10"
    epochs = 5 if model == "lenet" else 2
    cfg = tiny_cfg(model=model, dataset=ds, mode=mode, method=method, synthetic=8,
                   batch_size=4, epochs=epochs, max_batches=1, val_size=4, target=0.5,
                   lr=0.01, eval_masks=2, eval_batches=1)
    s = prun.run(cfg, tmp_path, quiet=True)
    rows = read_csv(Path(s["folder"]) / "metrics.csv")
    assert len(rows) == epochs + 1
    for r in rows:
        assert 0 <= r["test_acc"] <= 1 and math.isfinite(r["test_loss"])
        assert 0 <= r["remaining"] <= 1
    if method == "edgepopup":
        task = ptask.PruneTask(prun.prepare(cfg)[0], prun.prepare(cfg)[2], torch.device("cpu"))
        expect = sum(round(0.5 * s) for s in task.layout.sizes)
        assert s["final_remaining"] * s["masked"] == pytest.approx(expect)
    assert (Path(s["folder"]) / "pruned.pt").exists()


# ------------------------------------------------------------------ signed constant init


def test_signed_constant_weights_are_kaiming_std_with_random_signs():
    net = build_model("lenet", seed=4, init="signed_constant")
    for m in net.modules():
        if isinstance(m, nn.Linear):
            std = math.sqrt(2.0 / m.weight.shape[1])
            assert torch.allclose(m.weight.abs(), torch.full_like(m.weight, std))
            frac = float((m.weight > 0).double().mean())
            assert 0.4 < frac < 0.6
    again = build_model("lenet", seed=4, init="signed_constant")
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), again.parameters()))


@pytest.mark.parametrize("method", NEW)
def test_every_new_method_runs_on_signed_constant_weights(tmp_path, method):
    s = prun.run(tiny_cfg(method=method, init="signed_constant", epochs=1, max_batches=1),
              tmp_path, quiet=True)
    assert math.isfinite(s["final_test_loss"])


# ------------------------------------------------------------------ defaults and bad input


def test_defaults_and_families():
    assert pconfig.PruneConfig(method="st-theta").resolved().param == "sigmoid"
    assert pconfig.PruneConfig(method="arms").resolved().param == "escort"
    for name in NEW:
        assert name in pconfig.PRUNE_METHODS and REGISTRY[name].color


def test_st_theta_prunes_with_one_mask_a_step_whatever_n():
    """ST-theta's caps.pruning.prune_n = 1 (Zhou et al.): a pruning run draws one mask a step and
    lists --n as unused; regression takes its n. The MC estimators take --n in pruning."""
    from pbscale.methods import Capabilities, Pruning

    cfg = pconfig.PruneConfig(method="st-theta", n=10).resolved()
    assert cfg.method_config().n == 1 and "n" in cfg.unused()
    assert MethodConfig(method="st-theta", n=10).n == 10
    arms = pconfig.PruneConfig(method="arms", n=10).resolved()
    assert arms.method_config().n == 10 and "n" not in arms.unused()
    with pytest.raises(ValueError, match="prune_n needs n in uses"):
        Capabilities(commands=("prune-supermask",), uses=("lr",), pruning=Pruning(prune_n=1))
    with pytest.raises(ValueError, match="needs a pruning tool in commands"):
        Capabilities(commands=("regress",), pruning=Pruning(rescale=True))


@pytest.mark.parametrize("args,match", [
    (["--method", "edgepopup", "--mode", "joint"], "does not run in --mode joint"),
    (["--method", "edgepopup", "--target", "0"], "--target: must be a number > 0"),
    (["--method", "edgepopup", "--target", "1.5"], r"\(0, 1\]"),
    (["--method", "hardconcrete", "--lam", "-1"], "lam"),
    (["--method", "st-theta", "--param", "cubic"], "--param: invalid choice: 'cubic'"),
    (["--method", "hardconcrete", "--mask-lr", "0"], "mask-lr"),
    (["--method", "st-theta", "--init", "zeros"], "--init: invalid choice: 'zeros'"),
])
def test_bad_input_exit_2_one_line(tmp_path, capsys, args, match):
    import re

    rc = P.main(args + ["--data-dir", str(tmp_path), "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(match, lines[0])
    assert not (tmp_path / "o").exists()


def test_models_are_all_covered():
    assert set(MODELS) == {"lenet", "conv6", "resnet20", "vgg19"}


def test_left_out_param_takes_the_methods_default_and_the_parser_default_stays_escort():
    """The parser's --param default (what sweeps name their runs by) stays escort; a --param
    left out on the command line becomes the method's own default (sigmoid for st-theta)."""
    parser = P.build_parser()
    assert parser.get_default("param") == "escort"
    left_out = parser.parse_args(["--method", "st-theta"])
    given = parser.parse_args(["--method", "st-theta", "--param", "escort"])
    assert "param" not in left_out.given and "param" in given.given
