"""Batched seeds (pbscale.batched_seeds): the grouped forward equals the masked backbone per
group; G runs stepped together give the histories of the same runs made one by one with
pbscale.regress (the loop), to round-off, and write the same run folders."""

from __future__ import annotations

import math

import pytest
import torch

from pbexact.errors import PBInputError
from pbscale import io, regress
from pbscale.batched_seeds import grouped_loss, train_batched
from pbscale.methods import MethodConfig
from pbscale.regression import make_problem

TIMING = ("train_seconds", "val_seconds")


def tiny_problem():
    return make_problem(0, n_train=300, n_valid=100, backbone_hidden=(6, 6),
                        target_hidden=(12, 12))


def test_grouped_loss_equals_masked_module_per_group():
    p = tiny_problem()
    gen = torch.Generator().manual_seed(0)
    z = (torch.rand((3, 5, p.d), generator=gen) < 0.5).float()
    idx = torch.stack([torch.randperm(300, generator=gen)[:100] for _ in range(3)])
    J = grouped_loss(p, z, idx)
    assert J.shape == (3, 5)
    for g in range(3):
        ref = p.batch_loss(idx[g])(z[g])
        assert torch.allclose(J[g], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method, n", [("loorf", 4), ("arms", 3)])
def test_batched_runs_equal_separate_runs(tmp_path, method, n):
    p = tiny_problem()
    configs = [MethodConfig(method, n, "sigmoid", lr, seed=seed)
               for lr in (0.1, 0.01) for seed in (0, 1)]
    batched = train_batched(configs, 2, p, out=tmp_path / "b")
    for cfg, hist in zip(configs, batched):
        folder = regress.train(cfg, epochs=2, out=tmp_path / "s", device="cpu", problem=p,
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


def test_batched_refuses_mixed_n_and_non_mc():
    p = tiny_problem()
    with pytest.raises(PBInputError, match="share n"):
        train_batched([MethodConfig("loorf", 2), MethodConfig("loorf", 4)], 1, p)
    with pytest.raises(PBInputError, match="MC runs"):
        train_batched([MethodConfig("cp", 10)], 1, p)
