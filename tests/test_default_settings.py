"""Every method's default settings finish on its task (issue 53, item 3).

Each regression method of ``python -m pbscale.regress`` with its defaults, seeds 0-4 trained
together as one regression group (``--seeds 0-4``: each member's numbers its separate run's),
for 1 of the 300 epochs (RELAX, which
stopped in epoch 2 on a3f3b10, for 2); and each pruning method in each mode it runs in, with
the defaults of ``python -m pbscale.prune`` (LeNet-300-100 on MNIST), seeds 0-4 as one pruning
group, 3 epochs of 2 batches (so a joint run has its dense warm-up, mask-training and frozen
epochs). Every run must finish with finite numbers: no divergence.

RELAX's (and REBAR's) divergence was numerical, not its learning rate: in float32 the
logistic reparametrization's v' theta + 1 - theta rounds to 1 where theta (1 - v') is under half
an ulp of 1 (a small theta, v' near 1), and log1p(-1) = -inf made the gradient NaN (RELAX at
lr 0.1 in epoch 2; REBAR at lr 0.1 at step 969, epoch 10; lr 0.01 only makes such thetas rarer).
:func:`test_the_reparametrization_stays_finite_where_one_minus_v_rounds_away` pins that case.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _mnist import MNIST_DIR, needs_mnist

from pbscale import prune as P
from pbscale import regress
from pbscale.methods import REGISTRY, names
from pbscale.pruning.config import prune_methods

SEEDS = "0-4"


def summaries(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*/summary.json"))]


def test_the_reparametrization_stays_finite_where_one_minus_v_rounds_away():
    """REBAR and RELAX at a small theta (r = -6, theta 0.0025) with b = 1 and v' at its largest
    (1 - 1e-6): theta (1 - v') is under half an ulp of 1 in float32, so v' theta + 1 - theta
    rounds to 1; the estimate stays finite (a3f3b10: NaN)."""
    import torch

    from pbscale.methods.hybrids import HybridControl, rebar_relax

    def f(z: torch.Tensor) -> torch.Tensor:
        return (z * torch.linspace(-1, 1, z.shape[-1])).sum(-1)

    r = torch.tensor([-6.0, 0.3, 2.0])
    u = torch.tensor([[0.9999, 0.5, 0.2]])  # b = 1 everywhere: z = r + logit(u) > 0
    for kind in ("rebar", "relax"):
        control = HybridControl(kind, 3, generator=torch.Generator().manual_seed(0))
        est, _ = rebar_relax(f, r, u, torch.ones(1, 3), control)
        assert bool(torch.isfinite(est.grad).all()), (kind, est.grad)


@pytest.mark.parametrize("method", names("regress"))
def test_every_regression_method_finishes_with_its_defaults(method, tmp_path, capsys):
    out = tmp_path / "runs"
    epochs = "2" if method == "relax" else "1"
    code = regress.main(["--method", method, "--seeds", SEEDS, "--epochs", epochs,
                         "--device", "cpu", "--threads", "1", "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    done = summaries(out)
    assert len(done) == 5
    for s in done:
        assert math.isfinite(s["final_val_loss_chosen"]), s


def _prune_cases() -> list[tuple[str, str]]:
    return [(m, mode) for m in prune_methods() for mode in ("supermask", "joint")
            if f"prune-{mode}" in REGISTRY[m].caps.commands]


@needs_mnist
@pytest.mark.parametrize("method,mode", _prune_cases())
def test_every_pruning_method_finishes_with_its_defaults(method, mode, tmp_path, capsys):
    out = tmp_path / "runs"
    code = P.main(["--model", "lenet", "--mode", mode, "--method", method, "--seeds", SEEDS,
                   "--epochs", "3", "--max-batches", "2", "--data-dir", str(MNIST_DIR),
                   "--threads", "1", "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    done = summaries(out)
    assert len(done) == 5
    for s in done:
        assert math.isfinite(s["final_test_acc"]) and 0 <= s["final_remaining"] <= 1, s
