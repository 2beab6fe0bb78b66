"""CP written once (`eq:sigmoid_cp`): `pbscale.methods.cp_step` against the gradient in closed
form, over any leading shape, and as used by `MaskTrainer` and the microworld's `run_torch`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from analysis.microworld.hybrid import run_torch
from analysis.microworld.runs import DETERMINISTIC
from pbexact.sampling import vertex_index
from pbscale import methods as M

W = torch.tensor([1.5, -2.0, 0.25, -0.5], dtype=torch.float64)


def quadratic(z: torch.Tensor) -> torch.Tensor:
    """f(z) = w.z + z_0 z_1 over (..., 4) -> (...)."""
    return (z * W).sum(-1) + z[..., 0] * z[..., 1]


def closed_form_grad(r: torch.Tensor, tau: float) -> torch.Tensor:
    """d/dr f(sigmoid(r / tau)) by hand: (w + (z_1, z_0, 0, 0)) sigma' / tau."""
    z = torch.sigmoid(r / tau)
    df = W + torch.stack([z[..., 1], z[..., 0], 0 * z[..., 0], 0 * z[..., 0]], -1)
    return df * z * (1 - z) / tau


@pytest.mark.parametrize("shape", [(4,), (3, 4), (2, 3, 4)])
@pytest.mark.parametrize("hard", [True, False])
def test_cp_step_is_the_relaxed_gradient_for_any_leading_shape(shape, hard):
    r = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    tau = 0.3
    cp = M.cp_step(quadratic, r, tau, hard=hard)
    torch.testing.assert_close(cp.grad, closed_form_grad(r, tau), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cp.relaxed.detach(), quadratic(torch.sigmoid(r / tau)))
    assert cp.grad.shape == r.shape and cp.relaxed.shape == shape[:-1]
    if hard:
        assert torch.equal(cp.hard, quadratic((r > 0).double()))
    else:
        assert cp.hard is None
    # one row at a time gives the same numbers
    rows = r.reshape(-1, 4)
    each = torch.stack([M.cp_step(quadratic, row, tau, hard=hard).grad for row in rows])
    torch.testing.assert_close(each.reshape(shape), cp.grad, rtol=0, atol=1e-15)


def test_mask_trainer_cp_gradient_is_cp_step():
    tr = M.MaskTrainer(M.MethodConfig(method="cp", lr=0.5), 4, 300, dtype=torch.float64)
    with torch.no_grad():
        tr.r.copy_(torch.tensor([0.4, -0.2, 1.0, -3.0], dtype=torch.float64))
    tr.step_count = 150
    est = tr.gradient(quadratic)
    ref = M.cp_step(quadratic, tr.r, tr.temperature())
    assert torch.equal(est.grad, ref.grad) and est.loss == float(ref.hard)
    torch.testing.assert_close(est.grad, closed_form_grad(tr.r.detach(), tr.temperature()))
    assert tr.temperature() < 1  # past the first temperature update: not the tau = 1 case only


def test_run_torch_cp_is_sgd_on_cp_step():
    # the microworld's CP run (one seed, r_0 = 0) is plain SGD with cp_step's gradient; J is f
    # on the vertices, so the logged losses are f of the hard mask
    d, steps, lr = 4, 120, 0.5
    from pbexact.vertices import vertices

    J = quadratic(torch.as_tensor(vertices(d), dtype=torch.float64)).numpy()
    assert "cp" in DETERMINISTIC
    t = run_torch(quadratic, J, "cp", 1, lr, steps, 1, cp_every=10)
    r = torch.zeros((1, d), dtype=torch.float64)
    curve = []
    for step in range(steps + 1):
        curve.append(J[vertex_index(M.cp_hard_mask(r).numpy())][0])
        if step < steps:
            r = r - lr * M.cp_step(quadratic, r, M.cp_temperature(step, steps, every=10),
                                   hard=False).grad
    np.testing.assert_array_equal(t.mean, np.array(curve))
    np.testing.assert_array_equal(t.final_theta, M.cp_hard_mask(r).numpy())
    assert len(set(curve)) > 1  # the hard mask moved: not a flat run
