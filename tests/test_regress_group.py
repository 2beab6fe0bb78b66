"""Regression groups (``python -m pbscale.regress --seeds``): mc_gradient over leading
dimensions equals per-run calls; the grouped forward equals the masked backbone per group;
G runs stepped together through the run loop give the histories of the same runs made one
by one with pbscale.regress, to round-off, write the same run folders, resume after SIGTERM or
a kill to the same numbers, and skip finished runs."""

from __future__ import annotations

import math
import os
import signal

import pytest
import torch
from torch import nn

from pbexact.errors import PBInputError, RunInterrupted
from pbexact.parametrizations import get_parametrization
from pbscale.forward.masks import MaskedModule
from pbscale.forward.rescale import rescaled_weight
from pbscale.methods import (
    MC_METHODS,
    FixedSampler,
    MethodConfig,
    mc_gradient,
    mc_surrogate,
    names,
)
from pbscale.regress import main
from pbscale.regression import run as rrun
from pbscale.regression.group import train_group, train_unfinished
from pbscale.regression.problem import make_problem, mlp
from pbscale.runs import io
from pbscale.runs.records import GROUPS

TIMING = ("train_seconds", "val_seconds")


def tiny_problem():
    return make_problem(0, n_train=300, n_valid=100, backbone_hidden=(6, 6),
                        target_hidden=(12, 12))


@pytest.mark.parametrize("method, n", [("loorf", 4), ("arms", 3), ("disarm", 4)])
def test_batched_runs_equal_separate_runs(tmp_path, method, n):
    p = tiny_problem()
    configs = [MethodConfig(method, n, "sigmoid", lr, seed=seed)
               for lr in (0.1, 0.01) for seed in (0, 1)]
    batched = train_group(configs, 2, p, out=tmp_path / "b")
    for cfg, hist in zip(configs, batched):
        folder = rrun.train(cfg, epochs=2, out=tmp_path / "s", device="cpu", problem=p,
                               progress=False)
        ref = io.read_csv(folder / "history.csv")
        assert len(ref) == len(hist) == 3
        for r, h in zip(ref, hist):
            for key, v in h.items():
                if isinstance(v, float) and math.isnan(v):
                    assert math.isnan(r[key])
                else:
                    assert math.isclose(r[key], v, rel_tol=1e-5, abs_tol=1e-6), (cfg, key)
        # the batched run wrote the folder the separate run lives in (same hash)
        twin = tmp_path / "b" / folder.name
        assert (twin / "summary.json").exists()
        got = io.read_json(twin / "summary.json")["final_val_loss_chosen"]
        assert math.isclose(got, io.read_json(folder / "summary.json")["final_val_loss_chosen"],
                            rel_tol=1e-5)
    # runs differ from each other (different seeds / rates give different numbers)
    finals = {round(h[-1]["val_loss_chosen"], 9) for h in batched}
    assert len(finals) == len(configs)


def test_batched_refuses_mixed_n_settings_and_unbatched_methods():
    p = tiny_problem()
    with pytest.raises(PBInputError, match="share n"):
        train_group([MethodConfig("loorf", 2), MethodConfig("loorf", 4)], 1, p)
    with pytest.raises(PBInputError, match="share settings"):
        train_group([MethodConfig("cp", settings={"final_tau": 0.01}),
                       MethodConfig("cp", seed=1)], 1, p)
    with pytest.raises(PBInputError, match="do not train as a group; the runs of a regression "
                                           "group are runs of reinforce, loorf"):
        train_group([MethodConfig(next(m for m in names() if m not in names("regress-group")))],
                      1, p)


# --- mc_gradient over leading dimensions -----------------------------------------------------

G_RUNS, D_SMALL, N_SAMPLES = 3, 6, 4


def _run_losses():
    """A different nonlinear loss per run: f(z (k, G, d)) -> (k, G), and run g's alone."""
    w = torch.linspace(-1, 1, G_RUNS * D_SMALL, dtype=torch.float64).view(G_RUNS, D_SMALL)

    def batched(z):
        return torch.sin(3 * (z * w).sum(-1)) + z.sum(-1) ** 2 / D_SMALL

    def alone(g):
        return lambda z: torch.sin(3 * (z * w[g]).sum(-1)) + z.sum(-1) ** 2 / D_SMALL

    return batched, alone


@pytest.mark.parametrize("param_name", ["sigmoid", "escort", "direct"])
@pytest.mark.parametrize("estimator", MC_METHODS)
def test_batched_mc_gradient_equals_per_run_calls(estimator, param_name):
    """r (G, P) with one generator per run: run g's estimate and loss are those of a separate
    call with run g's generator (own samples, own stream), chunked differently on purpose."""
    param = get_parametrization(param_name)
    theta = torch.rand((G_RUNS, D_SMALL), generator=torch.Generator().manual_seed(5),
                       dtype=torch.float64) * 0.8 + 0.1
    r = param.logits(theta)
    batched, alone = _run_losses()
    gens = [torch.Generator().manual_seed(10 + g) for g in range(G_RUNS)]
    est = mc_gradient(batched, r, param, estimator, N_SAMPLES, gens, chunk=2)
    assert est.grad.shape == r.shape and est.loss.shape == (G_RUNS,)
    for g in range(G_RUNS):
        one = mc_gradient(alone(g), r[g], param, estimator, N_SAMPLES,
                          torch.Generator().manual_seed(10 + g), chunk=N_SAMPLES)
        torch.testing.assert_close(est.grad[g], one.grad, rtol=1e-12, atol=1e-12)
        assert float(est.loss[g]) == pytest.approx(one.loss, rel=1e-12)
    # runs differ (their own generators): no two rows of the estimate are equal
    assert len({tuple(row.tolist()) for row in est.grad}) == G_RUNS


@pytest.mark.parametrize("estimator", MC_METHODS)
def test_batched_mc_gradient_on_given_samples_and_as_surrogate(estimator):
    """Replayed samples (n, G, d): each run's estimate is the separate call's on its slice;
    the surrogate's gradient in r (G, P) is the estimate, row by row."""
    param = get_parametrization("sigmoid")
    r = torch.linspace(-1, 1, G_RUNS * D_SMALL, dtype=torch.float64).view(G_RUNS, D_SMALL)
    z = (torch.rand((N_SAMPLES, G_RUNS, D_SMALL), generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64) < 0.5).double()
    batched, alone = _run_losses()
    est = mc_gradient(batched, r, param, estimator, N_SAMPLES, sampler=FixedSampler(z))
    for g in range(G_RUNS):
        one = mc_gradient(alone(g), r[g], param, estimator, N_SAMPLES,
                          sampler=FixedSampler(z[:, g]))
        torch.testing.assert_close(est.grad[g], one.grad, rtol=1e-12, atol=1e-12)
    rr = r.clone().requires_grad_(True)
    gens = [torch.Generator().manual_seed(g) for g in range(G_RUNS)]
    value, est2 = mc_surrogate(batched, rr, param, estimator, N_SAMPLES, gens)
    value.backward()
    torch.testing.assert_close(rr.grad, est2.grad)
    assert float(value.detach()) == pytest.approx(float(est2.loss.sum()))
    with pytest.raises(PBInputError, match="one generator per run"):
        mc_gradient(batched, r, param, estimator, N_SAMPLES, gens[:2])


def test_masked_module_group_dimension_fast_and_generic_paths():
    """forward(z (G, k, d), x (G, B, in)) equals the per-group forward: MLP fast path (with and
    without a weight hook) and the generic vmap path."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand((2, 7, 3), generator=gen, dtype=torch.float64)
    for hook in (None, rescaled_weight):
        net = mlp((3, 5, 4, 1)).double()
        for module in (net, nn.Sequential(nn.Sequential(*net))):  # fast, then generic path
            masked = MaskedModule(module, weight_hook=hook)
            z = (torch.rand((2, 4, masked.d), generator=gen, dtype=torch.float64) < 0.6).double()
            out = masked.forward(z, x)
            assert out.shape == (2, 4, 7, 1)
            for g in range(2):
                torch.testing.assert_close(out[g], masked.forward(z[g], x[g]), rtol=1e-12,
                                           atol=1e-12)
    with pytest.raises(PBInputError, match="same G"):
        masked.forward(z, x[:1])


# --- groups through the run loop -------------------------------------------------------------


def _rows(folder):
    return [{k: v for k, v in r.items() if k not in TIMING}
            for r in io.read_csv(folder / "history.csv")]


def _configs(method="loorf", n=4):
    return [MethodConfig(method, n, "sigmoid", lr, seed=seed) for lr in (0.1, 0.03)
            for seed in (0, 2)]


@pytest.mark.parametrize("how", ["sigterm", "kill"])
def test_group_interrupted_then_rerun_equals_uninterrupted(tmp_path, how):
    """A group cut mid-epoch by SIGTERM (checkpoint mid-epoch, exit 143) or killed outright
    (nothing saved since the last epoch) and rerun gives each member the uninterrupted group's
    history; the cut group left each member's progress in its run folder."""
    p = tiny_problem()
    whole = train_group(_configs(), 3, p, out=tmp_path / "whole")

    def cut(epoch, i):
        if (epoch, i) == (1, 1):
            if how == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                raise KeyboardInterrupt

    with pytest.raises(RunInterrupted if how == "sigterm" else KeyboardInterrupt) as exc:
        train_group(_configs(), 3, p, out=tmp_path / "cut", step_hook=cut)
    if how == "sigterm":
        assert exc.value.code == 143
    (group,) = (tmp_path / "cut" / GROUPS).iterdir()
    state = torch.load(group / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 1 and (state["position"] is not None) == (how == "sigterm")
    members = sorted(f for f in (tmp_path / "cut").iterdir() if f.name != GROUPS)
    assert len(members) == 4
    for f in members:  # progress: epoch 0 and 1, not finished
        assert [r["epoch"] for r in _rows(f)] == [0, 1]
        assert not (f / "summary.json").exists()
    again = train_group(_configs(), 3, p, out=tmp_path / "cut")
    assert str(again) == str(whole)
    for f in members:
        assert (f / "summary.json").exists()
        assert str(_rows(f)) == str(_rows(tmp_path / "whole" / f.name))


def test_finished_members_are_skipped_and_runs_read_like_regress_runs(tmp_path):
    """Settings whose run folder is finished (here by pbscale.regress) are left out of the
    group; the others are trained as one group whose folders pbscale.regress then finds
    finished (it returns at once, same numbers); a group of finished runs trains nothing."""
    p = tiny_problem()
    configs = _configs()
    done = rrun.train(configs[0], epochs=2, out=tmp_path, device="cpu", problem=p,
                         progress=False)
    before = (done / "history.csv").read_bytes()
    skipped, trained = train_unfinished(configs, 2, p, out=tmp_path)
    assert (skipped, trained) == (1, 3)
    assert (done / "history.csv").read_bytes() == before
    (group,) = (tmp_path / GROUPS).iterdir()
    assert group.name.startswith("group-loorf-n4-sigmoid-3runs-")
    for c in configs[1:]:
        folder = rrun.run_folder(c, 2, tmp_path, problem=p)
        stamp = (folder / "summary.json").stat().st_mtime_ns
        assert rrun.train(c, epochs=2, out=tmp_path, device="cpu", problem=p,
                             progress=False) == folder
        assert (folder / "summary.json").stat().st_mtime_ns == stamp  # not trained again
        assert io.read_json(folder / "summary.json")["grouped_runs"] == 3
        assert io.read_json(folder / "config.json")["info"]["group"] == f"{GROUPS}/{group.name}"
    assert train_unfinished(configs, 2, p, out=tmp_path) == (4, 0)


def test_group_nan_check_names_the_member():
    """The loop's NaN check (the method's check_finite) names the member that diverged."""
    from pbscale.regression.group import MaskTrainerGroup

    configs = [MethodConfig("loorf", 2, "sigmoid", 0.1, seed=0),
               MethodConfig("loorf", 2, "sigmoid", 30.0, seed=1)]
    group = MaskTrainerGroup.flat(configs, 5, 10)
    flags = {"masks": "--lr", "optimizer": "--optimizer", "weights": "--lr"}
    group.check_finite("epoch 1", flags)  # all finite: passes
    with torch.no_grad():
        group.members[1].r[2] = math.nan
    with pytest.raises(PBInputError, match="lr=30.0, seed=1 became NaN or inf in epoch 4.*--lr"):
        group.check_finite("epoch 4", flags)


@pytest.mark.parametrize("argv, words", [
    (["--method", "mp"], "invalid choice: 'mp'"),
    (["--method", "loorf", "--n", "1"], "n"),
    (["--lr", "0.1,-1"], "--lr: must be a number > 0"),
    (["--lr", "0.1,fast"], "--lr: expected a number"),
    (["--lr", "0.1,0.1"], "listed twice"),
    (["--chunk", "2"], "does not take --chunk"),
])
def test_cli_refuses_bad_groups_before_any_work(tmp_path, capsys, argv, words):
    assert main([*argv, "--seeds", "0-1", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_a_groups_folder_that_leads_outside_out_is_refused(tmp_path, capsys):
    """``OUT/.groups`` as a symlink to another folder: one line, exit 2, nothing written
    there."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / GROUPS).symlink_to(elsewhere)
    assert main(["--method", "loorf", "--n", "2", "--seeds", "0,1", "--epochs", "1",
                 "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "outside" in err
    assert not any(elsewhere.iterdir())
