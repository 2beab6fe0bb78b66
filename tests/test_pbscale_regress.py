"""pbscale end to end: bad input fails before training, runs are deterministic and resume
exactly, CP's schedule, the regularizer, and peak memory that does not grow with n."""

from __future__ import annotations

import math
import os
import shutil

import pytest
import torch
from _masked_reference import forward_one

from pbexact.errors import PBInputError
from pbscale import methods as M
from pbscale import regress
from pbscale.forward.masks import MaskedModule
from pbscale.regression import run as rrun
from pbscale.regression.problem import BACKBONE_HIDDEN, make_problem, mlp
from pbscale.runs import io


def tiny_problem():
    return make_problem(0, n_train=300, n_valid=100, backbone_hidden=(6, 6),
                        target_hidden=(12, 12))


def test_full_size_problem_has_the_papers_d():
    net = mlp((10, *BACKBONE_HIDDEN, 1))
    assert MaskedModule(net).d == 8050


def test_data_is_fixed_by_data_seed():
    a, b, c = tiny_problem(), tiny_problem(), make_problem(1, n_train=300, n_valid=100,
                                                           backbone_hidden=(6, 6),
                                                           target_hidden=(12, 12))
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_valid, b.y_valid)
    assert not torch.equal(a.y_train, c.y_train)
    assert float(a.y_train.min()) == 0.0 and float(a.y_train.max()) == pytest.approx(1.0)


def test_target_is_the_two_pass_forward():
    """The target network runs once on the training inputs, in place: the same values, bit for
    bit, as running it on the training and validation inputs beside the statistics' own pass
    out of place (the code before), at a size where the products are blocked."""
    from torch import nn

    p = make_problem(3, n_train=2000, n_valid=700, backbone_hidden=(6, 6),
                     target_hidden=(300, 300, 300))
    gen = torch.Generator().manual_seed(3)
    x_train = torch.rand((2000, 10), generator=gen, dtype=torch.float64) * 2 - 1
    x_valid = torch.rand((700, 10), generator=gen, dtype=torch.float64) * 2 - 1
    widths = (10, 300, 300, 300, 1)
    weights = [1 - 2 * (torch.rand((b, a), generator=gen, dtype=torch.float64) < 0.5).double()
               for a, b in zip(widths[:-1], widths[1:])]
    h_train, hs = x_train, [x_train, x_valid]
    for i, w in enumerate(weights):
        h_train, hs = h_train @ w.T, [h @ w.T for h in hs]
        if i < len(weights) - 1:
            mean, var = h_train.mean(0), h_train.var(0, unbiased=False)
            norm = torch.rsqrt(var + 1e-5)
            h_train = nn.functional.leaky_relu((h_train - mean) * norm)
            hs = [nn.functional.leaky_relu((h - mean) * norm) for h in hs]
    lo, hi = hs[0].min(), hs[0].max()
    assert torch.equal(p.y_train, ((hs[0] - lo) / (hi - lo)).float())
    assert torch.equal(p.y_valid, ((hs[1] - lo) / (hi - lo)).float())


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"method": "loorf", "n": 1}, "n >= 2"),
        ({"method": "arms", "n": 1}, "n >= 2"),
        ({"lr": -0.1}, "learning rate"),
        ({"method": "adam"}, "unknown method"),
        ({"param": "tanh"}, "unknown parametrization"),
        ({"method": "st", "param": "escort"}, "sigmoid"),
        ({"optimizer": "adam"}, "unknown optimizer"),
    ],
)
def test_bad_method_settings(kwargs, words):
    with pytest.raises(PBInputError, match=words):
        M.MethodConfig(**kwargs).validate()


def test_mask_over_missing_tensor():
    with pytest.raises(PBInputError, match="no such parameter"):
        MaskedModule(mlp((3, 4, 1)), names=["0.weight", "7.weight"])


def test_cli_errors_before_training(tmp_path, capsys):
    rc = regress.main(["--method", "loorf", "--n", "1", "--out", str(tmp_path), "--quiet"])
    assert rc == 2
    assert capsys.readouterr().err.startswith("error: LOORF needs n >= 2")
    assert not any(tmp_path.iterdir())  # nothing was trained or written
    assert regress.main(["--lr", "-1", "--out", str(tmp_path), "--quiet"]) == 2
    assert regress.main(["--method", "foo", "--out", str(tmp_path), "--quiet"]) == 2


@pytest.mark.parametrize("method", ["loorf", "arms", "cp", "st", "rebar", "relax"])
def test_every_method_trains_and_is_deterministic(tmp_path, method):
    prob = tiny_problem()
    cfg = M.MethodConfig(method=method, n=4, chunk=3, seed=5)
    rows = []
    for sub in ("a", "b"):
        folder = rrun.train(cfg, epochs=2, out=tmp_path / sub, device="cpu", progress=False,
                               problem=prob)
        rows.append(io.read_csv(folder / "history.csv"))
    assert len(rows[0]) == 3  # the initial evaluation and two epochs
    for ra, rb in zip(*rows):
        for key in ("train_loss", "val_loss", "val_loss_chosen", "theta_mean"):
            a, b = ra[key], rb[key]
            assert (math.isnan(a) and math.isnan(b)) or a == b
    assert all(0 <= r["val_loss_chosen"] <= 1 for r in rows[0])


def test_interrupted_run_resumes_exactly(tmp_path, monkeypatch):
    prob = tiny_problem()
    cfg = M.MethodConfig(method="arms", n=3, seed=1)
    whole = rrun.train(cfg, epochs=3, out=tmp_path / "whole", device="cpu", progress=False,
                          problem=prob)
    calls = {"k": 0}
    real_step = M.MaskTrainer.surrogate

    def failing_step(self, f, weights=False):
        calls["k"] += 1
        if calls["k"] == 5:  # epoch 2 of 3 steps each
            raise KeyboardInterrupt
        return real_step(self, f, weights)

    monkeypatch.setattr(M.MaskTrainer, "surrogate", failing_step)
    with pytest.raises(KeyboardInterrupt):
        rrun.train(cfg, epochs=3, out=tmp_path / "cut", device="cpu", progress=False,
                      problem=prob)
    monkeypatch.setattr(M.MaskTrainer, "surrogate", real_step)
    folder = rrun.run_folder(cfg, 3, tmp_path / "cut", problem=prob)
    assert not (folder / "summary.json").exists()
    assert len(io.read_csv(folder / "history.csv")) == 2
    rrun.train(cfg, epochs=3, out=tmp_path / "cut", device="cpu", progress=False, problem=prob)
    def rows(path):
        drop = ("train_seconds", "val_seconds")
        return [{k: v for k, v in r.items() if k not in drop} for r in io.read_csv(path)]

    assert str(rows(folder / "history.csv")) == str(rows(whole / "history.csv"))
    assert not [p for p in os.listdir(folder) if p.endswith(".tmp")]


def test_rerun_with_other_config_in_same_folder_is_refused(tmp_path):
    prob = tiny_problem()
    cfg = M.MethodConfig(method="loorf", n=2)
    first = rrun.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                          problem=prob)
    # the folder is named by a hash of the full configuration: another epoch count is another
    # folder; a folder holding another configuration (here copied over) is refused
    other = rrun.run_folder(cfg, 2, tmp_path, problem=prob)
    assert other != first and other.name.startswith(rrun.run_name(cfg))
    shutil.copytree(first, other)
    with pytest.raises(PBInputError, match="another configuration"):
        rrun.train(cfg, epochs=2, out=tmp_path, device="cpu", progress=False, problem=prob)


def test_cp_temperature_schedule():
    taus = [M.cp_temperature(t, 1000) for t in range(1000)]
    assert taus[0] == 1.0 and taus[99] == 1.0 and taus[100] < 1.0
    assert taus[-1] == pytest.approx(1 / 200)
    assert all(a >= b for a, b in zip(taus, taus[1:]))
    assert len(set(taus)) == 10  # updated every 100 iterations


def test_dense_regularizer_closed_form():
    r = torch.linspace(-2, 2, 5, dtype=torch.float64)
    value, grad = M.dense_regularizer(r, torch.sigmoid, 0.3)
    t = torch.sigmoid(r)
    assert value == pytest.approx(0.3 * float(t.sum()))
    torch.testing.assert_close(grad, 0.3 * t * (1 - t))


_PEAK_SCRIPT = """
import json, torch
from pbexact.parametrizations import get_parametrization
from pbscale import methods as M
from pbscale.runs.memory import peak_memory
from pbscale.regression.problem import make_problem
prob = make_problem(0, n_train=200, n_valid=10, target_hidden=(8, 8))  # d = 8,050
f = prob.batch_loss(torch.arange(100))
param = get_parametrization("sigmoid")
r = torch.zeros(prob.d)
gen = torch.Generator().manual_seed(0)
def grow(n, chunk):
    return peak_memory(lambda: M.mc_gradient(f, r, param, "loorf", n, gen, chunk))
grow(64, 8), grow(256, 256)  # warm up allocator pools
small, large = grow(16, 8), grow(1024, 8)
print(json.dumps([small, large, grow(1024, 1024)]))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_peak_memory_does_not_grow_with_n():
    # a fresh process: the resident-set meter cannot see allocations that earlier tests' freed
    # (but retained) memory absorbs
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT], capture_output=True, text=True,
                          check=True, timeout=300)
    small, large, one_shot = json.loads(proc.stdout.strip().splitlines()[-1])
    # the meter sees O(n d) when there is one: one-shot n = 1024 holds at least the masks,
    # the masked weights and the scores, 3 x 31.4 MiB in float32
    assert one_shot - small > 80 * 2**20
    assert large - small < 20 * 2**20


def _fast_path_nets():
    torch.manual_seed(0)
    plain = mlp((10, 7, 5, 1))
    with_bias = torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6, track_running_stats=False),
        torch.nn.ReLU(), torch.nn.Linear(6, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    with torch.no_grad():  # non-trivial affine BatchNorm parameters
        with_bias[1].weight.uniform_(0.5, 1.5)
        with_bias[1].bias.uniform_(-0.5, 0.5)
    ends_in_act = torch.nn.Sequential(torch.nn.Linear(3, 5, bias=False), torch.nn.LeakyReLU(0.2),
                                      torch.nn.Linear(5, 4, bias=False), torch.nn.Sigmoid(),
                                      torch.nn.Linear(4, 2), torch.nn.ReLU())
    return [(plain, 10, None), (with_bias, 4, None), (with_bias, 4, ["3.weight"]),
            (ends_in_act, 3, None)]


@pytest.mark.parametrize("case", range(4))
def test_fast_batched_forward_matches_vmap(case):
    net, n_in, names = _fast_path_nets()[case]
    masked = MaskedModule(net, names=names)
    assert masked._plan is not None
    gen = torch.Generator().manual_seed(case)
    x = torch.randn(13, n_in, generator=gen)
    z = (torch.rand(5, masked.d, generator=gen) < 0.6).float()
    fast, ref = masked.forward(z, x), masked.forward_vmap(z, x)
    assert fast.shape == ref.shape
    with torch.no_grad():
        kept = fast.clone()
        masked.forward(1 - z, x)  # another call must not overwrite an earlier result
    torch.testing.assert_close(fast, kept, rtol=0, atol=0)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)
    for i in range(z.shape[0]):  # and the plain per-mask forward of the loop baseline
        torch.testing.assert_close(fast[i], forward_one(masked, z[i], x), rtol=1e-5, atol=1e-6)
    # soft masks, differentiated (CP and the hybrid estimators)
    zs = torch.rand(4, masked.d, generator=gen).requires_grad_(True)
    (g_fast,) = torch.autograd.grad(masked.forward(zs, x).square().sum(), zs)
    (g_ref,) = torch.autograd.grad(masked.forward_vmap(zs, x).square().sum(), zs)
    torch.testing.assert_close(g_fast, g_ref, rtol=1e-4, atol=1e-6)


def test_fast_forward_on_the_regression_backbone_is_exact_and_falls_back():
    prob = tiny_problem()
    z = (torch.rand(6, prob.d, generator=torch.Generator().manual_seed(1)) < 0.5).float()
    x = prob.x_train[:50]
    torch.testing.assert_close(prob.masked.forward(z, x), prob.masked.forward_vmap(z, x))
    # modules the fast path does not know go through vmap
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.0), torch.nn.Linear(4, 1))
    assert MaskedModule(net)._plan is None
    assert MaskedModule(torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1)))._plan is None


def test_bernoulli_sampler_frequencies_edges_and_determinism():
    theta = torch.tensor([0.0, 1.0, 0.3, 0.5, 1e-9, 1 - 2**-24, 0.9])
    for dtype in (torch.float32, torch.float64):
        th = theta.to(dtype)
        s = M.BernoulliSampler(th, torch.Generator().manual_seed(0))
        z = s.next(40_000)
        assert z.dtype == dtype and z.shape == (40_000, 7)
        assert set(z.unique().tolist()) <= {0.0, 1.0}
        freq = z.mean(0)
        assert freq[0] == 0 and freq[1] == 1 and freq[4] == 0
        torch.testing.assert_close(freq[2:4], th[2:4], atol=0.01, rtol=0)
        assert abs(float(freq[6]) - 0.9) < 0.01
        a = M.BernoulliSampler(th, torch.Generator().manual_seed(3)).next(5)
        b = M.BernoulliSampler(th, torch.Generator().manual_seed(3)).next(5)
        assert torch.equal(a, b)
    # odd k * d: the last int64 word is only half used
    assert M.BernoulliSampler(theta[:3], torch.Generator().manual_seed(0)).next(3).shape == (3, 3)


def test_pinned_defaults_escort_power_direct_clamp_cp_final_tau():
    # escort's default P = 4 (Mei et al.), as docs/exact.md states
    from pbexact.parametrizations import get_parametrization

    assert get_parametrization("escort").power == 4.0
    # the direct parametrization is clamped to [eps, 1 - eps] after every optimizer step
    direct = get_parametrization("direct")
    trainer = M.MaskTrainer(M.MethodConfig(method="loorf", n=2, param="direct", lr=10.0,
                                           optimizer="sgd"), 6, 10)

    trainer.r.grad = torch.tensor([1.0, -1, 1, -1, 0.01, -0.01])  # steps of -10, +10, ...
    trainer.apply()
    r = trainer.r.detach()
    expected = torch.tensor([direct.eps, 1 - direct.eps] * 2 + [0.4, 0.6])
    torch.testing.assert_close(r, expected)
    # CP's final temperature 1/200 is defined once and is every schedule's default
    import inspect

    from analysis import counterexamples
    from analysis.microworld import hybrid as microworld_hybrid
    from pbexact import continuation

    assert continuation.CP_FINAL_TAU == 1 / 200
    for fn, arg in [(continuation.exponential_schedule, "final"),
                    (M.cp_temperature, "final"),
                    (microworld_hybrid.run_torch, "cp_final_tau")]:
        assert inspect.signature(fn).parameters[arg].default is continuation.CP_FINAL_TAU
    assert M.CPSettings().final_tau is continuation.CP_FINAL_TAU
    # ... and written nowhere else in the code (as a value: = 1 / 200, default=0.005, ...)
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    literal = re.compile(r"[=(,]\s*(1\s*/\s*200|0\.005)\b")
    places = [str(p.relative_to(root)) for pkg in ("pbexact", "pbscale", "analysis")
              for p in (root / pkg).rglob("*.py") if literal.search(p.read_text())]
    assert places == ["pbexact/continuation.py"], places
    assert "default=CP_FINAL_TAU" in Path(counterexamples.__file__).read_text()
    taus = continuation.exponential_schedule(5)
    assert taus[0] == 1 and taus[-1] == continuation.CP_FINAL_TAU


def test_run_folder_is_found_without_training_and_matches_train(tmp_path):
    # the hashed folder is found from the settings alone (what analysis.regression --collect
    # does), for a given problem and for the paper's sizes without drawing the data
    prob = tiny_problem()
    cfg = M.MethodConfig(method="loorf", n=2)
    folder = rrun.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                           problem=prob)
    assert rrun.run_folder(cfg, 1, tmp_path, problem=prob) == folder
    full = rrun.run_folder(cfg, 1, tmp_path)
    assert full != folder and full.name.startswith(rrun.run_name(cfg))
    from pbscale.regression.problem import task_config
    from pbscale.runs.loop import config_hash

    assert full.name.endswith(config_hash({
        "task": task_config(0), "method": cfg.to_dict(),
        "loop": {"epochs": 1, "seed": 0, "mask_milestones": [], "mask_gamma": 0.1,
                 "weight_milestones": [], "weight_gamma": 0.1, "mask_warmup": 0.0,
                 "freeze_masks": None, "metrics_file": "history.csv"}}))


def test_fast_path_takes_sequential_subclasses_but_not_reused_layers():
    """LeNet-300-100 (an nn.Sequential subclass keeping Sequential's forward) runs on the MLP
    fast path and matches vmap; a network that reuses one Linear twice is refused with one line
    (the fast path would list it once, vmap's functional_call leaks its tensors)."""
    from pbscale.nets.models import build_model

    net = build_model("lenet").double()
    masked = MaskedModule(net)
    assert masked._plan is not None
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, 784, generator=gen, dtype=torch.float64)
    z = (torch.rand(3, masked.d, generator=gen) < 0.5).double()
    torch.testing.assert_close(masked.forward(z, x), masked.forward_vmap(z, x))

    lin = torch.nn.Linear(4, 4, bias=False)
    with pytest.raises(PBInputError, match="reused layer"):
        MaskedModule(torch.nn.Sequential(lin, torch.nn.ReLU(), lin))
