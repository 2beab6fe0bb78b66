"""Checks of the microworld experiments (`sec:microworld`): reproducibility, the saddle of
`ex:mc_bad_gen_1`, a separable quadratic with a known optimum, the hybrid estimators' wiring and
the command line. Tiny sizes only; speed goals live in benchmarks/bench_microworld.py."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from analysis.cli import run
from analysis.microworld import main
from analysis.microworld.hybrid import run_torch
from analysis.microworld.runs import found_optimum, run_exact
from pbexact.parametrizations import Sigmoid
from pbexact.polynomial import true_gradient
from pbexact.sampling import sample_arms
from pbexact.vertices import vertices
from pbscale.methods import PerSeedControl, cp_relaxed_loss, rebar_relax

torch.set_num_threads(1)

MC = (("reinforce", 1), ("loorf", 4), ("arms", 4), ("betastar", 1))


def multilinear(J: np.ndarray):
    """The multilinear extension of a J table (`eq:multi_poly`) as a differentiable torch loss
    f: (..., d) -> (...)."""
    table = torch.as_tensor(J, dtype=torch.float64)
    V = torch.as_tensor(vertices(int(np.log2(len(J))))).bool()

    def f(z: torch.Tensor) -> torch.Tensor:
        p = torch.where(V, z[..., None, :], 1 - z[..., None, :]).prod(-1)
        return p @ table

    return f


def bad_gen(m: float, M: float) -> np.ndarray:
    """`ex:mc_bad_gen_1`: [[J(zeta_2), J(zeta_3)], [J(zeta_0), J(zeta_1)]] = [[m, M], [M, m]]."""
    return np.array([M, m, m, M])


C = np.array([0.2, 0.7, 0.4, 0.9])
QUAD = ((vertices(4) - C) ** 2).sum(-1)  # J(z) = sum_i (z_i - c_i)^2, z* = 1[c > 1/2]


def quad_f(z: torch.Tensor) -> torch.Tensor:
    return ((z - torch.as_tensor(C)) ** 2).sum(-1)


def test_runs_are_reproducible_bit_for_bit():
    J = QUAD
    for method, n, param in (("arms", 4, "escort"), ("reinforce", 1, "direct")):
        a = run_exact(J, method, n, param, 0.1, 40, 6, seed=3)
        b = run_exact(J, method, n, param, 0.1, 40, 6, seed=3)
        assert np.array_equal(a.mean, b.mean) and np.array_equal(a.final_theta, b.final_theta)
        c = run_exact(J, method, n, param, 0.1, 40, 6, seed=4)
        assert not np.array_equal(a.final_theta, c.final_theta)
    for method in ("st", "rebar", "relax"):
        a = run_torch(quad_f, J, method, 2, 0.1, 15, 4, seed=3)
        b = run_torch(quad_f, J, method, 2, 0.1, 15, 4, seed=3)
        assert np.array_equal(a.mean, b.mean) and np.array_equal(a.final_theta, b.final_theta)


def test_seeds_are_independent_runs():
    """The seeds of one vectorized run draw their own samples (their trajectories differ) and all
    start at the common theta_0 = 0.5."""
    t = run_exact(QUAD, "loorf", 4, "sigmoid", 0.5, 20, 5, seed=0)
    assert len({tuple(row) for row in t.final_theta.tolist()}) == 5
    assert t.mean[0] == pytest.approx(((0.5 - C) ** 2).sum() + 4 * 0.25)


def test_true_gradient_and_cp_stay_at_the_saddle():
    """`ex:mc_bad_gen_1`: the exact gradient at theta_0 = 0.5 is zero, so SGD never moves; CP's
    relaxed gradient at r = 0 is zero too (the multilinear extension is flat there)."""
    J = bad_gen(-1.0, 1.0)
    t = run_exact(J, "true", 1, "sigmoid", 0.5, 200, 1)
    assert np.all(t.final_theta == 0.5) and np.all(t.mean == 0.0)
    r = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(cp_relaxed_loss(multilinear(J), r, 1.0).sum(), r)
    assert torch.all(g == 0)
    cp = run_torch(multilinear(J), J, "cp", 1, 0.5, 200, 1)
    assert np.all(cp.mean == 1.0)  # hard mask 1[r > 0] = (0, 0) throughout: J = M


def test_reinforce_single_sample_stays_on_the_diagonal_when_J_is_nonnegative():
    """With m = 0, a one-sample REINFORCE step is zero at the optimal corners and moves both
    logits equally at the others, so theta_1 = theta_2 forever: E[J] >= 1/2, never m."""
    t = run_exact(bad_gen(0.0, 1.0), "reinforce", 1, "sigmoid", 0.5, 300, 8)
    assert np.array_equal(t.final_theta[:, 0], t.final_theta[:, 1])
    assert np.all(t.final >= 0.5)


@pytest.mark.parametrize("method,n", MC)
def test_mc_estimators_leave_the_saddle_and_reach_the_optimum(method, n):
    J = bad_gen(-1.0, 1.0)
    t = run_exact(J, method, n, "sigmoid", 0.5, 500, 10)
    assert np.all(t.final < -0.95)


def test_hybrids_leave_the_saddle():
    """ST and REBAR reach m from every seed; RELAX (Adam lr 1 on its control network, as in
    `sec:app_microworld_hypers`) in the median: a minority of seeds end in a worse corner."""
    J = bad_gen(-1.0, 1.0)
    f = multilinear(J)
    assert np.all(run_torch(f, J, "st", 1, 0.5, 300, 10).final < -0.95)
    assert np.all(run_torch(f, J, "rebar", 1, 0.5, 300, 10).final < -0.95)
    assert np.median(run_torch(f, J, "relax", 1, 0.1, 300, 10).final) < -0.9


def test_disarm_cannot_leave_the_symmetric_saddle():
    """`ex:mc_bad_gen_1` has J(z) = J(1 - z); at theta = 0.5 DisARM's pair is (z, 1 - z), so every
    estimate is exactly zero and no seed moves (unlike the estimators above). A step off the
    saddle (theta_0 = 0.45) and it reaches m like them."""
    J = bad_gen(-1.0, 1.0)
    t = run_exact(J, "disarm", 4, "sigmoid", 0.5, 500, 10)
    assert np.all(t.final_theta == 0.5) and np.all(t.final == 0.0)
    assert np.all(run_exact(J, "disarm", 4, "sigmoid", 0.5, 500, 10, theta0=0.45).final < -0.95)


@pytest.mark.parametrize("method,n", (*MC, ("disarm", 4), ("true", 1)))
def test_separable_quadratic_mc_and_true_gradient(method, n):
    t = run_exact(QUAD, method, n, "sigmoid", 0.5, 500, 10)
    assert np.all(found_optimum(QUAD, t.final_theta))
    assert t.final.max() < QUAD.min() + 0.05


@pytest.mark.parametrize("param", ("cosine", "direct", "escort"))
def test_separable_quadratic_other_parametrizations(param):
    t = run_exact(QUAD, "loorf", 4, param, 0.05, 300, 10)
    assert np.all(found_optimum(QUAD, t.final_theta))


def test_separable_quadratic_hybrids():
    """CP and REBAR reach z*. ST's expected step is 2 (theta - c) (sigmoid derivative dropped,
    `ch:other`), so it settles at the biased point theta = c, whose mode is z*. RELAX (Adam lr 1
    on its control network) is noisier: we only require the mode of most seeds to be z*."""
    cp = run_torch(quad_f, QUAD, "cp", 1, 0.5, 500, 1)
    assert cp.final[0] == QUAD.min()
    rebar = run_torch(quad_f, QUAD, "rebar", 1, 0.5, 300, 10)
    assert np.all(found_optimum(QUAD, rebar.final_theta))
    st = run_torch(quad_f, QUAD, "st", 1, 0.05, 500, 10)
    np.testing.assert_allclose(st.final_theta.mean(0), C, atol=0.05)
    relax = run_torch(quad_f, QUAD, "relax", 1, 0.1, 500, 10)
    assert (np.round(relax.final_theta) == (C > 0.5)).all(1).sum() >= 5


def test_rebar_and_relax_with_per_seed_controls_are_unbiased():
    """The mean of many one-sample REBAR/RELAX estimates (each replica its own control) equals the
    exact gradient, to 5 standard errors."""
    reps = 40_000
    gen = torch.Generator().manual_seed(0)
    r0 = np.array([0.3, -0.5, 1.0, 0.2])
    exact = Sigmoid().chain(true_gradient(QUAD, Sigmoid().theta(r0)), r0)
    r = torch.as_tensor(r0).expand(reps, 4).clone()
    for kind in ("rebar", "relax"):
        control = PerSeedControl(kind, 4, reps, gen)
        u, v = (torch.rand((1, reps, 4), generator=gen, dtype=torch.float64) for _ in range(2))
        g = rebar_relax(quad_f, r, u, v, control)[0].grad
        se = g.std(0) / reps**0.5
        assert np.all(np.abs(g.mean(0).numpy() - exact) < 5 * se.numpy()), kind


def test_batched_arms_sampling_keeps_each_rows_marginals():
    rng = np.random.default_rng(0)
    theta = np.array([[0.2, 0.5, 0.9], [0.7, 0.3, 0.6]])
    z = sample_arms(theta, 4, (20_000,), rng)
    assert z.shape == (20_000, 2, 4, 3)
    np.testing.assert_allclose(z.mean((0, 2)), theta, atol=0.01)


def test_cli_writes_csv_and_figures(tmp_path):
    for exp in ("estimators", "params", "approaches"):
        argv = [exp, "--d", "3", "--seeds", "3", "--steps", "12", "--out", str(tmp_path),
                "--figures", str(tmp_path / "fig")]
        assert run(main, argv) == 0
    with open(tmp_path / "microworld_params_nnloss_d3.csv") as fh:
        rows = list(csv.DictReader(fh))
    finals = [r for r in rows if r["record"] == "final"]
    assert len(finals) == 3 * 4 * 2 * 3  # n values x parametrizations x lrs x seeds
    assert {r["selected"] for r in rows} == {"0", "1"}
    for name in ("estimators", "params", "params_scatter", "grad"):
        assert (tmp_path / "fig" / f"microworld_{name}_d3.png").exists()


@pytest.mark.parametrize("argv", [
    ["approaches", "--benchmark", "exponential"],
    ["estimators", "--steps", "0"],
    ["params", "--lrs", "-0.1"],
    ["estimators", "--d", "0"],
    ["approaches", "--n", "0"],
])
def test_cli_bad_input_is_a_one_line_error(argv, capsys, tmp_path):
    assert run(main, [*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
