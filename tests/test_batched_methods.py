"""Every regression method batches (``pbscale.regress --seeds``): for each method of the registry's
``regress`` command, runs of one setting with their own seeds, learning rates and optimizers
trained as one group give each member the history of the same run trained alone with
``pbscale.regress``, to round-off, in the folder the separate run writes (same name and hash,
same sections of config.json); a RELAX group (learned controls and their optimizers per member)
cut by SIGTERM and rerun equals the uninterrupted group; the autograd MLP path that CP, ST and
REBAR/RELAX differentiate through takes the group dimension in one call.

Tolerance: each member's numbers are its separate run's computed with the G runs' masks as one
stack (the first Linear one product batched over G instead of one per run), so float32 sums may
round differently. Measured 2026-11-27 on this CPU (AVX-512) and with
ATEN_CPU_CAPABILITY=default: at most 1.6e-7 relative (ST-theta, hard-concrete, edge-popup; the
others bit-identical here). REL = 1e-5, the tolerance of tests/test_regress_group.py and of
float32 training metrics in docs/measurements.md (kernels differ by up to 1.35e-6 relative
across CPUs), leaves room for other CPUs' kernels while a wrong member (another seed, another
rate, a control stepped twice) differs by far more (checked: the members' finals all differ).
On the paper's problem, over 100 steps an epoch, the methods that differentiate through the
network drift further: their grouped backward rounds differently and RMSprop amplifies it in
near-zero gradient entries (docs/measurements.md, "Batched seeds: runs per hour")."""

from __future__ import annotations

import math
import os
import signal

import pytest
import torch

from pbexact.errors import RunInterrupted
from pbscale.forward.masks import MaskedModule
from pbscale.methods import REGISTRY, MethodConfig, names
from pbscale.regression import run as rrun
from pbscale.regression.group import train_group
from pbscale.regression.problem import make_problem, mlp
from pbscale.runs import io
from pbscale.runs.records import GROUPS

REL, ABS = 1e-5, 1e-6
TIMING = ("train_seconds", "val_seconds")
#: config.json's sections that name the run (hashed into its folder name)
HASHED = ("task", "method", "loop")


def tiny_problem():
    """Two steps per epoch (200 points, batches of 100)."""
    return make_problem(0, n_train=200, n_valid=100, backbone_hidden=(6, 6),
                        target_hidden=(12, 12))


def configs(method: str) -> list[MethodConfig]:
    """Three runs of one setting: two seeds at one rate (RMSprop), one at another rate (SGD)."""
    n = max(2, REGISTRY[method].caps.min_samples or 1)
    return [MethodConfig(method, n, "sigmoid", lr, opt, seed=seed)
            for lr, opt, seed in ((0.1, "rmsprop", 0), (0.1, "rmsprop", 1), (0.03, "sgd", 0))]


def _close(a: float, b: float) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return math.isclose(a, b, rel_tol=REL, abs_tol=ABS)


def test_every_regress_method_batches():
    assert set(names("regress")) <= set(names("regress-group"))


@pytest.mark.parametrize("method", names("regress"))
def test_group_members_equal_separate_runs(tmp_path, method):
    p = tiny_problem()
    cfgs = configs(method)
    batched = train_group(cfgs, 2, p, out=tmp_path / "b")
    refs = []
    for cfg, hist in zip(cfgs, batched):
        folder = rrun.train(cfg, epochs=2, out=tmp_path / "s", device="cpu", problem=p,
                               progress=False)
        ref = [{k: v for k, v in r.items() if k not in TIMING}
               for r in io.read_csv(folder / "history.csv")]
        refs.append(ref)
        assert len(ref) == len(hist) == 3
        for r, h in zip(ref, hist):
            assert r.keys() == h.keys()
            for key, v in h.items():
                assert _close(v, r[key]), (cfg, key, v, r[key])
        twin = tmp_path / "b" / folder.name  # the same name and hash
        made = {f.name for f in twin.iterdir()}
        assert made == {f.name for f in folder.iterdir()} - {"checkpoint.pt"}, made
        got, want = (io.read_json(f / "config.json") for f in (twin, folder))
        assert {k: got[k] for k in HASHED} == {k: want[k] for k in HASHED}
        assert got["method_info"] == want["method_info"]
        assert got["info"]["grouped_runs"] == len(cfgs)
        assert _close(io.read_json(twin / "summary.json")["final_val_loss_chosen"],
                      io.read_json(folder / "summary.json")["final_val_loss_chosen"])
    # the members are as different as the separate runs (all three for every method but
    # edge-popup, whose regress runs keep every weight: target 1)
    def distinct(hists):
        return len({str([round(v, 6) for row in h for v in row.values()]) for h in hists})

    assert distinct(batched) == distinct(refs)


def _rows(folder):
    return [{k: v for k, v in r.items() if k not in TIMING}
            for r in io.read_csv(folder / "history.csv")]


def test_relax_group_cut_by_sigterm_resumes_to_the_same_numbers(tmp_path):
    """RELAX: each member's control network, log tau and both Adam optimizers are in the
    group's checkpoint; a group cut mid-epoch and rerun equals the uninterrupted one exactly."""
    p = tiny_problem()
    cfgs = configs("relax")[:2]
    whole = train_group(cfgs, 3, p, out=tmp_path / "whole")

    def cut(epoch, i):
        if (epoch, i) == (1, 0):  # mid-epoch: after the first of its two steps
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunInterrupted) as exc:
        train_group(cfgs, 3, p, out=tmp_path / "cut", step_hook=cut)
    assert exc.value.code == 143
    (group,) = (tmp_path / "cut" / GROUPS).iterdir()
    state = torch.load(group / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 1 and state["position"] is not None
    again = train_group(cfgs, 3, p, out=tmp_path / "cut")
    assert str(again) == str(whole)
    for f in (tmp_path / "whole").iterdir():
        if f.name != GROUPS:
            assert str(_rows(tmp_path / "cut" / f.name)) == str(_rows(f))


def test_autograd_mlp_path_takes_groups():
    """z (G, k, d) that requires grad, x (G, B, in): one call of the autograd MLP backend;
    outputs and gradients in z equal the per-group calls."""
    gen = torch.Generator().manual_seed(0)
    masked = MaskedModule(mlp((3, 5, 4, 1)).double())
    x = torch.rand((2, 7, 3), generator=gen, dtype=torch.float64)
    z = torch.rand((2, 4, masked.d), generator=gen, dtype=torch.float64).requires_grad_(True)
    assert masked.choice.choose(z, x).takes_groups
    out = masked.forward(z, x)
    assert out.shape == (2, 4, 7, 1)
    (grad,) = torch.autograd.grad((out ** 2).sum(), z)
    for g in range(2):
        zg = z[g].detach().requires_grad_(True)
        one = masked.forward(zg, x[g])
        torch.testing.assert_close(out[g], one, rtol=1e-12, atol=1e-12)
        (gg,) = torch.autograd.grad((one ** 2).sum(), zg)
        torch.testing.assert_close(grad[g], gg, rtol=1e-12, atol=1e-12)
