"""The exact bias of the biased estimators (`pbexact.bias`, `pbexact.relaxations`,
`python -m analysis.bias`): enumeration against closed forms, exact against Monte Carlo within a
stated tolerance (4.5 standard errors per coordinate), pbscale's torch estimators against numpy
formulas on the same vertices, the command's outputs and refusals, and docs/bias.md against the
generated tables."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from test_docs_links import agrees_to_printed_digits, table_after

from analysis import bias as B
from analysis.cli import run
from analysis.exact import bias as EB
from pbexact.bias import (
    BiasSummary,
    Moments,
    MultilinearExtension,
    QuadraticLoss,
    UnbiasedVariance,
    break_even_n,
    mc_moments,
    quadrature_moments,
    st_quadratic_bias,
    st_quadratic_moments,
    stratified_moments,
    tempered_true_gradient,
    vertex_uniforms,
    weighted_moments,
)
from pbexact.closed_form import closed_form_moments
from pbexact.errors import PBInputError
from pbexact.instances import NNLoss, exponential_tabular_loss
from pbexact.parametrizations import PARAMETRIZATIONS, get_parametrization
from pbexact.polynomial import expected_loss, true_gradient, vertex_probabilities
from pbexact.relaxations import (
    HC_BETA,
    Relaxation,
    coordinate_rule,
    gate_and_derivative,
    get_relaxation,
    logistic_noise,
    multilinear_relaxed_moments,
    relaxed_gradients,
    tensor_rule,
)
from pbexact.variance import exact_moments
from pbexact.vertices import vertices

ROOT = Path(__file__).resolve().parent.parent
#: Monte Carlo means must lie within this many standard errors of the exact value (per
#: coordinate; with a handful of coordinates per test, a false alarm has odds below 1e-4).
Z = 4.5
SIGMOID = get_parametrization("sigmoid")


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Many small autograd calls: one torch thread, as the tool runs them (its --threads)."""
    with EB.torch_threads(1):
        yield


@pytest.fixture(scope="module")
def net() -> NNLoss:
    return NNLoss(3, 0)


def moments_of(name: str, f, J, r, param=SIGMOID, **setting) -> Moments:
    return EB.estimator_moments(B.BIASED[name], f, J, np.asarray(r, dtype=float), param,
                               B.Setting(**setting))


# ------------------------------------------------------------------------ laws and moments


def test_vertex_uniforms_visit_every_vertex_with_its_probability():
    theta = np.array([0.0, 0.3, 1.0, 0.5])
    u, p = vertex_uniforms(theta)
    z = (u < theta).astype(float)
    live = p > 0
    assert np.array_equal(z[live], vertices(4)[live])
    assert np.array_equal(p, vertex_probabilities(theta)) and p.sum() == pytest.approx(1)


def test_weighted_quadrature_and_mc_moments():
    g = np.array([[1.0, 2.0], [3.0, -2.0]])
    m = weighted_moments(g, np.array([0.25, 0.75]))
    assert np.allclose(m.mean, [2.5, -1.0]) and np.allclose(m.variance, [0.75, 3.0])
    assert m.kind == "exact" and m.error is None
    q = quadrature_moments(m, Moments(m.mean + [0.1, -0.2], m.variance))
    assert q.kind == "quadrature" and np.allclose(q.error, [0.1, 0.2])
    draws = g[(rng().random(40_000) < 0.75).astype(int)]
    mc = mc_moments(draws)
    assert mc.kind == "mc" and mc.samples == 40_000
    assert np.allclose(mc.error, np.sqrt(mc.variance / 40_000))
    assert np.all(np.abs(mc.mean - m.mean) <= Z * mc.error)
    assert np.allclose(mc.variance, m.variance, rtol=0.05)
    with pytest.raises(PBInputError, match="at least 2 draws"):
        mc_moments(g[:1])


def test_bias_summary_norm_cosine_mse_and_zero_test():
    true = np.array([1.0, 0.0, 1.0])
    s = BiasSummary(Moments(np.array([1.0, 1.0, 1.0]), np.array([2.0, 0.0, 1.0])), true)
    assert s.bias_norm == 1.0 and s.bias_norm_error == 0.0 and s.trace == 3.0
    assert s.cosine == pytest.approx(2 / math.sqrt(6))
    assert s.mse(1) == 4.0 and s.mse(10) == pytest.approx(1.3)
    assert s.zero_bias_pvalue == 0.0
    assert BiasSummary(Moments(true + 1e-17, true), true).zero_bias_pvalue == 1.0
    assert math.isnan(BiasSummary(Moments(np.zeros(3), true), true).cosine)
    se = np.array([0.1, 0.1, 0.1])
    mc = BiasSummary(Moments(true + [0.05, 0.0, 0.0], np.ones(3), "mc", se, 100), true)
    assert mc.bias_squared == pytest.approx(0.05**2 - 0.03)  # unbiased for ||b||^2
    assert mc.bias_norm_error == pytest.approx(math.sqrt(0.03))
    assert mc.zero_bias_pvalue == 1.0  # z = 0.5: Bonferroni 3 x 0.62 -> capped at 1
    near = BiasSummary(Moments(true + [0.3, 0, 0], np.ones(3), "mc", se, 100), true)
    assert near.zero_bias_pvalue == pytest.approx(3 * math.erfc(3 / math.sqrt(2)))
    far = BiasSummary(Moments(true + [1.0, 0, 0], np.ones(3), "mc", se, 100), true)
    assert far.zero_bias_pvalue < 1e-20


def test_break_even_n_bisects_a_decreasing_variance():
    for c, target in ((3.0, 1.0), (100.0, 0.01), (12.0, 0.07)):
        assert break_even_n(target, lambda n, c=c: c / n, 2) == max(2, math.ceil(c / target))
    assert break_even_n(0.07, lambda n: 12.0 / n, 2, step=2) == 172  # 171.4 -> even
    assert break_even_n(1e-9, lambda n: 1.0 / n, 2) is None
    assert break_even_n(0.0, lambda n: 1.0 / n, 2) is None
    assert break_even_n(5.0, lambda n: 1.0 / n, 2) == 2
    J, r = rng(1).normal(size=16), rng(2).normal(size=4)
    for name in EB.UNBIASED:
        var = UnbiasedVariance(name, J, r, SIGMOID)
        spec = B.get_estimator(name)
        step = 2 if spec.even else 1
        n = break_even_n(var(2) / 7.3, var, 2, step)
        assert var(n) <= var(2) / 7.3 < var(n - step)


def test_unbiased_variance_is_the_closed_form_and_the_enumeration():
    J, r = rng(3).normal(size=8), rng(4).normal(size=3)
    for name in EB.UNBIASED:
        var = UnbiasedVariance(name, J, r, SIGMOID)
        for n in (2, 4):
            exact = exact_moments(J, r, n, "sigmoid", (name,))[name].total_variance
            closed = closed_form_moments(J, r, n, "sigmoid", (name,))[name].total_variance
            assert var(n) == closed and var(n) == pytest.approx(exact, rel=1e-10)


# ---------------------------------------------------------------------------------- ST


@pytest.mark.parametrize("name", list(PARAMETRIZATIONS))
def test_st_theta_torch_against_numpy_differences_and_unbiased_on_p_j(name):
    """pbscale's st_theta on P_J at every vertex = the numpy difference table
    J(z_i = 1) - J(z_i = 0) chained through d theta / d r; its mean is the true gradient."""
    param = get_parametrization(name)
    g = rng(5)
    d = 4
    J = g.normal(size=2**d)
    theta = g.uniform(0.1, 0.9, size=d)
    r = param.logits(theta)
    u, p = vertex_uniforms(theta)
    est = EB.per_sample(B.BIASED["st-theta"], MultilinearExtension(J), r, param, B.Setting(),
                       torch.as_tensor(u))
    h, bits = np.arange(2**d), 1 << np.arange(d)
    diff = (J[h[:, None] | bits] - J[h[:, None] & ~bits])  # (2^d, d)
    assert np.allclose(est, param.chain(diff, r), rtol=1e-12, atol=1e-12)
    m = moments_of("st-theta", MultilinearExtension(J), J, r, param)
    assert np.allclose(m.mean, param.chain(true_gradient(J, theta), r), atol=1e-13)


def test_microworld_st_is_st_theta_without_the_sigmoid_derivative():
    J, r = rng(6).normal(size=8), rng(7).normal(size=3)
    f, theta = MultilinearExtension(J), SIGMOID.theta(r)
    u = torch.as_tensor(vertex_uniforms(theta)[0])
    st = EB.per_sample(B.BIASED["st"], f, r, SIGMOID, B.Setting(), u)
    st_theta = EB.per_sample(B.BIASED["st-theta"], f, r, SIGMOID, B.Setting(), u)
    assert np.allclose(st * theta * (1 - theta), st_theta, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["sigmoid", "escort"])
def test_st_bias_on_a_quadratic_is_the_closed_form(name):
    param = get_parametrization(name)
    g = rng(8)
    A, b = g.normal(size=(3, 3)), g.normal(size=3)
    theta = g.uniform(0.1, 0.9, size=3)
    r = param.logits(theta)
    f = QuadraticLoss(A, b)
    J = f.table()
    m = moments_of("st-theta", f, J, r, param)
    truth = param.chain(true_gradient(J, theta), r)
    assert np.allclose(m.mean - truth, param.chain(st_quadratic_bias(A, theta), r), atol=1e-12)
    mean, cov = st_quadratic_moments(A, b, theta)
    assert np.allclose(m.mean, param.chain(mean, r), atol=1e-12)
    assert np.allclose(m.variance, param.expand(np.diag(cov)) * param.dtheta_dr(r) ** 2,
                       atol=1e-12)
    assert not f.multilinear and QuadraticLoss(A - np.diag(np.diag(A)), b).multilinear


def test_st_exact_against_monte_carlo_on_nnloss(net):
    J = net.table()
    r = rng(9).normal(size=3)
    exact = moments_of("st-theta", net, J, r)
    setting = B.Setting(seed=3)
    u = setting.uniforms(20_000, 3)
    mc = mc_moments(EB.per_sample(B.BIASED["st-theta"], net, r, SIGMOID, setting, u))
    assert np.all(np.abs(mc.mean - exact.mean) <= Z * mc.error)
    assert np.allclose(mc.variance, exact.variance, rtol=0.1)
    truth = SIGMOID.chain(true_gradient(J, SIGMOID.theta(r)), r)
    assert BiasSummary(exact, truth).bias_norm > 1e-3 * np.linalg.norm(truth)


# ---------------------------------------------------------------------------------- CP


def test_cp_is_the_true_gradient_of_its_tempered_sigmoid_on_p_j():
    g = rng(10)
    J, r = g.normal(size=16), g.normal(scale=2, size=4)
    f = MultilinearExtension(J)
    truth = SIGMOID.chain(true_gradient(J, SIGMOID.theta(r)), r)
    for tau in (1.0, 0.3, 0.02):
        setting = B.Setting(tau=tau)
        anneal = EB.per_sample(B.BIASED["cp-anneal"], f, r, SIGMOID, setting)[0]
        assert np.allclose(anneal, tempered_true_gradient(J, r, tau), rtol=1e-10, atol=1e-300)
        at_theta = EB.per_sample(B.BIASED["cp"], f, r, SIGMOID, setting)[0]
        assert np.allclose(at_theta, truth, rtol=1e-10, atol=1e-15)


# ------------------------------------------------------------------------- relaxations


def test_relaxation_gates_are_pbscales_hard_concrete_and_rebar_relaxation():
    """The one definition pbscale should import: at pbscale's constants the hard-concrete gate
    equals pbscale's hc_sample, and the concrete sample REBAR/RELAX's control relaxation."""
    from pbscale.methods import HybridControl
    from pbscale.methods.beyond import hc_sample

    g = torch.Generator().manual_seed(0)
    r = torch.randn(5, dtype=torch.float64, generator=g)
    u = torch.rand((64, 5), dtype=torch.float64, generator=g)
    hard = get_relaxation("hardconcrete")
    assert torch.allclose(hard.gate(r, u, eps=1e-6), hc_sample(r, u), rtol=0, atol=1e-15)
    control = HybridControl("rebar", 5).to(torch.float64)
    beta = float(control.log_tau.detach().exp())
    concrete = get_relaxation("concrete", beta)
    assert torch.allclose(concrete.gate(r, u), control.relax(r + logistic_noise(u)),
                          rtol=0, atol=1e-15)


@pytest.mark.parametrize("name", ["concrete", "hardconcrete"])
def test_relaxed_moments_product_formula_tensor_quadrature_and_monte_carlo(name):
    g = rng(11)
    J, r = g.normal(size=8), g.normal(size=3)
    relax = get_relaxation(name)
    mean, var = multilinear_relaxed_moments(J, r, relax, 8)
    f = MultilinearExtension(J)
    u, w = tensor_rule(*coordinate_rule(relax, r, 8))  # the same 1-D rules, multiplied out
    est = relaxed_gradients(f, torch.as_tensor(r), torch.as_tensor(u), relax).numpy()
    tensor = weighted_moments(est, w)
    assert np.allclose(tensor.mean, mean, atol=1e-13)
    assert np.allclose(tensor.variance, var, atol=1e-13)
    draws = torch.as_tensor(g.random((40_000, 3)))
    mc = mc_moments(relaxed_gradients(f, torch.as_tensor(r), draws, relax).numpy())
    assert np.all(np.abs(mc.mean - mean) <= Z * mc.error)
    assert np.allclose(mc.variance, var, rtol=0.05)
    truth = SIGMOID.chain(true_gradient(J, SIGMOID.theta(r)), r)
    assert np.linalg.norm(mean - truth) > 1e-3 * np.linalg.norm(truth)  # biased


def test_relaxations_rules_and_refusals():
    r = np.array([-3.0, 0.0, 2.5])
    for name in ("concrete", "hardconcrete"):
        relax = get_relaxation(name, 0.5)
        nodes, w = coordinate_rule(relax, r, 5)
        assert np.allclose(w.sum(-1), 1.0) and np.all(np.diff(nodes, axis=-1) > 0)
        assert np.all((nodes > 0) & (nodes < 1))
        gate, dgate = gate_and_derivative(relax, r[:, None], nodes)
        assert np.all((gate >= 0) & (gate <= 1))
        if relax.stretched:  # constant 0 or 1, zero derivative, on the outer panels
            assert np.all(gate[:, 0] == 0) and np.all(gate[:, -1] == 1)
            assert np.all(dgate[:, [0, -1]] == 0)
    with pytest.raises(PBInputError, match="beta must be > 0"):
        Relaxation("concrete", beta=0.0)
    with pytest.raises(PBInputError, match="stretch interval"):
        Relaxation("x", HC_BETA, gamma=0.1)
    with pytest.raises(PBInputError, match="unknown relaxation"):
        get_relaxation("gumbel")
    with pytest.raises(PBInputError, match="up to d=4"):
        tensor_rule(np.zeros((5, 2)), np.ones((5, 2)) / 2)
    with pytest.raises(PBInputError, match="at least one node"):
        coordinate_rule(get_relaxation("concrete"), r, 0)


def test_rebar_and_relax_rows_are_unbiased_within_their_error(net):
    J = net.table()
    r = rng(12).normal(size=3)
    truth = SIGMOID.chain(true_gradient(J, SIGMOID.theta(r)), r)
    for name in ("rebar", "relax"):
        m = moments_of(name, net, J, r, mc_samples=8000, seed=1)
        assert m.kind == "mc" and np.all(np.abs(m.mean - truth) <= Z * m.error)
    concrete = moments_of("concrete", net, J, r, mc_samples=8000)
    assert concrete.kind == "mc"  # NNLoss's dJ/dz jumps: Monte Carlo, not quadrature
    assert np.linalg.norm(concrete.mean - truth) > 5 * np.linalg.norm(concrete.error)


def test_tensor_quadrature_on_a_smooth_extension_against_monte_carlo():
    g = rng(13)
    f = QuadraticLoss(g.normal(size=(3, 3)), g.normal(size=3))
    J, r = f.table(), g.normal(size=3)
    for name in ("concrete", "hardconcrete"):
        quad = moments_of(name, f, J, r, nodes=6)  # smooth f at d <= 4: tensor quadrature
        assert quad.kind == "quadrature"
        assert np.all(quad.error < 1e-3 * np.abs(quad.mean).max())
        setting = B.Setting(seed=2)
        draws = mc_moments(EB.per_sample(B.BIASED[name], f, r, SIGMOID, setting,
                                        setting.uniforms(40_000, 3)))
        assert np.all(np.abs(draws.mean - quad.mean) <= Z * draws.error + quad.error)
        assert np.allclose(draws.variance, quad.variance, rtol=0.05)


# --------------------------------------------------------------------------------- CLI


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def break_even_table_from_csv(path: Path, ns: list[int]) -> str:
    """The break-even Markdown table rebuilt from its CSV (the tool's own formatter)."""
    rows = []
    for r in _rows(path):
        row: dict = {**r, "step": int(r["step"]), "n": int(r["n"])}
        for k in EB.UNBIASED:
            for col in (k, f"{k}_low", f"{k}_high"):
                row[col] = int(r[col]) if r.get(col) else ""
        rows.append(row)
    return B.break_even_markdown(rows, ns, "")


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_cli_writes_csv_figure_and_table_under_out_only(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--benchmark", "exponential", "--d", "3", "--steps", "20", "--log-every", "10",
            "--mc-samples", "200", "--table-steps", "0,20", "--n", "1,10", "--out", str(out)]
    assert run(B.main, argv) == 0
    stem = out / "exponential_d3_sigmoid"
    files = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert files == sorted(f"exponential_d3_sigmoid_{s}" for s in (
        "bias.csv", "bias.png", "break_even.csv", "break_even.md"))
    rows = _rows(Path(f"{stem}_bias.csv"))
    assert sorted({int(r["step"]) for r in rows}) == [0, 1, 2, 5, 10, 20]
    names = {r["estimator"] for r in rows}
    assert names == set(B.BIASED) | set(EB.UNBIASED)
    kinds = {r["estimator"]: r["kind"] for r in rows}
    assert kinds["st-theta"] == "exact" and kinds["concrete"] == "quadrature"
    assert kinds["rebar"] == "mc"
    st_theta = [r for r in rows if r["estimator"] == "st-theta"]
    assert all(float(r["bias_norm"]) < 1e-12 for r in st_theta)  # P_J: unbiased
    for r in rows:
        if r["estimator"] in B.BIASED:
            mse1, mse10 = float(r["mse_n1"]), float(r["mse_n10"])
            b2 = float(r["bias_norm"]) ** 2
            if r["kind"] != "mc":
                assert mse1 == pytest.approx(b2 + float(r["trace_cov"]))
                assert mse10 == pytest.approx(b2 + float(r["trace_cov"]) / 10)
        else:
            assert r["mse_n1"] == ""  # LOORF, ARMS, DisARM need n >= 2
    md = Path(f"{stem}_break_even.md").read_text()
    assert table_lines(md) == table_lines(break_even_table_from_csv(
        Path(f"{stem}_break_even.csv"), [1, 10]))
    assert "20" in md and "ST-θ" in md
    cap = capsys.readouterr()
    assert "logged steps" in cap.out
    assert "exponential d=3" not in cap.err  # no progress bar off a terminal (a pipe, a log)


def test_cli_nnloss_under_escort_runs_st_theta_only(tmp_path):
    argv = ["--benchmark", "nnloss", "--d", "2", "--parametrization", "escort", "--steps", "5",
            "--table-steps", "0", "--out", str(tmp_path)]
    assert run(B.main, argv) == 0
    rows = _rows(tmp_path / "nnloss_d2_escort_bias.csv")
    assert {r["estimator"] for r in rows} == {"st-theta", *EB.UNBIASED}


@pytest.mark.parametrize("argv, fragment", [
    (["--d", "13"], "--d 13 is above 12"),
    (["--estimators", "nope"], "unknown biased estimator 'nope'"),
    (["--estimators", "cp", "--parametrization", "cosine"], "cp runs on sigmoid logits only"),
    (["--table-steps", "7"], "--table-steps 7 is not a logged step"),
    (["--table-steps", "0,x"], "argument --table-steps"),
    (["--n", "0"], "argument --n"),
    (["--nodes", "1"], "argument --nodes"),
    (["--cp-final-tau", "2"], "--cp-final-tau must be in (0, 1], got 2.0; use a temperature"),
    (["--estimators", " , "], "--estimators is empty"),
    (["--estimators", "cp,cp"], "--estimators names cp more than once; name each once"),
    (["--mc-samples", "100000000"], "; lower --mc-samples to at most"),
])
def test_cli_refusals_are_one_line_exit_2_and_write_nothing(argv, fragment, tmp_path, capsys):
    out = tmp_path / "o"
    assert run(B.main, [*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fragment in err[0], err
    assert not out.exists()


def test_cli_refuses_an_out_that_is_a_file(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("keep")
    assert run(B.main, ["--d", "2", "--out", str(target)]) == 2
    assert capsys.readouterr().err.startswith("error: ") and target.read_text() == "keep"


def test_help_shows_the_defaults(capsys):
    assert run(B.main, ["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for fragment in ("default 10", "default 1,10,100", "default 4000", "0.666667",
                     "default 0,1000", "1/200", "default 1:"):
        assert fragment in text


# -------------------------------------------------------------------------------- docs


DOC = ROOT / "docs" / "bias.md"
FIGURES = ROOT / "figures" / "bias"


def test_docs_quote_the_generated_break_even_tables_and_those_match_their_csv():
    quoted = DOC.read_text(encoding="utf-8")
    tables = sorted(FIGURES.glob("*_break_even.md"))
    assert len(tables) >= 2
    for md in tables:
        lines = table_lines(md.read_text(encoding="utf-8"))
        assert "\n".join(lines) in quoted, f"docs/bias.md does not quote {md.name}"
        rebuilt = break_even_table_from_csv(md.with_suffix(".csv"), [1, 10, 100])
        assert lines == table_lines(rebuilt), md.name


def test_docs_step_table_matches_the_bias_csvs():
    rows = table_after(DOC.read_text(encoding="utf-8"), "At the start of the trajectory")
    assert len(rows) == 2 * (len(B.BIASED) + len(EB.UNBIASED))
    columns = ["bias_norm", "bias_error", "cosine", "mse_n1", "mse_n10", "mse_n100"]
    for bench, name, kind, *printed in rows:
        data = _rows(FIGURES / f"{bench}_d10_sigmoid_bias.csv")
        row = next(r for r in data if r["step"] == "0" and r["estimator"] == name)
        assert kind == row["kind"], (bench, name)
        for text, column in zip(printed, columns, strict=True):
            if text in ("", "—"):
                assert row[column] in ("", "nan"), (bench, name, column)
            else:
                assert agrees_to_printed_digits(text, float(row[column])), (bench, name, column)


def test_committed_rows_show_no_rebar_relax_bias_and_small_quadrature_errors():
    """What docs/bias.md says of the committed study: REBAR and RELAX are never biased at the
    family-wise level 1e-3 of `analysis.theorems`; the relaxations' quadrature error bars on
    P_J stay below 1e-3 of ||grad||."""
    rows = [r for bench in ("exponential", "nnloss")
            for r in _rows(FIGURES / f"{bench}_d10_sigmoid_bias.csv")]
    hybrid = [float(r["zero_bias_p"]) for r in rows if r["estimator"] in ("rebar", "relax")]
    assert len(hybrid) == 80 and min(hybrid) >= 1e-3 / len(hybrid)
    quad = [float(r["bias_error"]) / float(r["grad_norm"]) for r in rows
            if r["kind"] == "quadrature"]
    assert quad and max(quad) < 1e-3


# ------------------------------------------- Monte Carlo rows under heavy tails (issue 41)


def test_stratified_moments_against_direct_formulas():
    """Two strata (p = 0.3, 0.7) of 3 and 4 draws: the mean, the unbiased variance, the
    covariance of the mean and the trace's error, each by its definition."""
    g = np.array([[1.0, 2.0], [2.0, 0.0], [4.0, 1.0], [0.0, 1.0], [1.0, 1.0], [0.5, 3.0],
                  [2.5, 2.0]])
    h = np.array([0, 0, 0, 1, 1, 1, 1])
    p = np.array([0.3, 0.7])
    m = stratified_moments(g, h, p)
    groups = [g[h == k] for k in (0, 1)]
    mean = sum(pk * gk.mean(0) for pk, gk in zip(p, groups))
    cov = sum(pk ** 2 * np.cov(gk.T) / len(gk) for pk, gk in zip(p, groups))
    var = sum(pk * ((gk - mean) ** 2).mean(0) for pk, gk in zip(p, groups)) + np.diag(cov)
    q = [((gk - mean) ** 2).sum(1) for gk in groups]
    trace_var = sum(pk ** 2 * qk.var(ddof=1) / len(qk) for pk, qk in zip(p, q))
    cross = sum(pk ** 2 * np.array([np.cov(gk[:, i], qk)[0, 1] for i in range(2)]) / len(gk)
                for pk, gk, qk in zip(p, groups, q))
    assert np.allclose(m.mean, mean) and np.allclose(m.variance, var)
    assert np.allclose(m.sampling.mean_cov, cov) and np.allclose(m.error, np.sqrt(np.diag(cov)))
    assert m.sampling.trace_var == pytest.approx(trace_var)
    assert np.allclose(m.sampling.cross, cross)
    # one stratum is plain Monte Carlo: the sample variance, s.e. sqrt(var / M)
    one = mc_moments(g)
    assert np.allclose(one.variance, g.var(0, ddof=1)) and one.samples == 7
    with pytest.raises(PBInputError, match="at least 2 draws in every stratum"):
        stratified_moments(g[:4], h[:4], p)


def test_a_rare_heavy_draw_is_weighted_not_missed():
    """g = 1000 1[u < 0.001] (mean 1, skewness 32): 4000 plain draws miss or over-count the rare
    value; strata on either side of 0.001 give the mean exactly, with s.e. 0."""
    u = rng(5).random(4000)
    plain = mc_moments((1000.0 * (u < 0.001))[:, None])
    theta = np.array([0.001])  # the stratum u > 1 - theta is the rare side
    setting = B.Setting(mc_samples=4000, seed=5)
    w, stratum, prob = EB.vertex_strata(theta, setting)
    g = 1000.0 * (w.numpy() > 1 - theta)
    strat = stratified_moments(g, stratum, prob)
    assert strat.mean[0] == pytest.approx(1.0) and strat.error[0] == 0.0
    assert abs(plain.mean[0] - 1.0) > 0.2  # 4000 draws hold 0 to 9 rare ones


@pytest.fixture(scope="module")
def vertex_point():
    """NNLoss at d = 10 at the end of its 10,000-step trajectory: theta within 1.4e-4 of a
    vertex, where one REBAR estimate in 7,000 is large (skewness about 77)."""
    f = NNLoss(10, 0)
    J = f.table()
    r = dict(EB.trajectory(J, SIGMOID, 10_000, 10_000, 0.1))[10_000]
    return f, J, r, SIGMOID.chain(true_gradient(J, SIGMOID.theta(r)), r)


def test_rebar_relax_unbiasedness_test_holds_for_any_seed_near_a_vertex(vertex_point):
    """20 Monte Carlo seeds of REBAR and RELAX (1000 draws a row, stratified): no false alarm
    at the family-wise level 0.05 / 40, and p < 0.05 in at most 5% + 3 s.e. (0.15) of them.
    Plain draws (the earlier tool's) fail the first: their z-test is not valid there. A bias
    of the row's stated detectable size along its noisiest coordinate is found (p < 0.05) in at
    least 70% of the rows (80% stated; 40 rows: 0.7 is 1.6 s.e. below)."""
    f, J, r, truth = vertex_point
    pvals, found, plain = [], [], []
    for seed in range(20):
        for name in ("rebar", "relax"):
            m = moments_of(name, f, J, r, mc_samples=1000, seed=seed)
            s = BiasSummary(m, truth)
            pvals.append(s.zero_bias_pvalue)
            k = int(np.argmax(m.error))
            shifted = truth.copy()
            shifted[k] -= s.detectable_bias()
            found.append(BiasSummary(m, shifted).zero_bias_pvalue < 0.05)
        if seed < 10:
            setting = B.Setting(mc_samples=4000, seed=seed)
            u, v = setting.uniforms(4000, 10), setting.uniforms(4000, 10)
            g = EB.per_sample(B.BIASED["rebar"], f, r, SIGMOID, setting, u, v)
            plain.append(BiasSummary(mc_moments(g), truth).zero_bias_pvalue)
    assert min(pvals) >= 0.05 / len(pvals), min(pvals)
    assert np.mean(np.array(pvals) < 0.05) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / len(pvals))
    assert min(plain) < 0.05 / len(pvals)
    assert np.mean(found) >= 0.7


def test_monte_carlo_trace_error_bars_are_right_and_not_biased_low(vertex_point):
    """Concrete at the same point (15 seeds of 4000 draws): the trace estimates scatter by
    their stated error bar (ratio 0.5 to 1.5) and their median sits within 2 s.e. of their mean
    (no heavy-tail skew: plain draws read 15% low there)."""
    f, J, r, truth = vertex_point
    traces, errors = [], []
    for seed in range(15):
        s = BiasSummary(moments_of("concrete", f, J, r, mc_samples=4000, seed=seed), truth)
        traces.append(s.trace)
        errors.append(s.trace_error)
    traces = np.array(traces)
    assert 0.5 <= traces.std(ddof=1) / np.mean(errors) <= 1.5
    assert abs(np.median(traces) - traces.mean()) <= 2 * np.mean(errors) / math.sqrt(15) * 1.25
    s = BiasSummary(moments_of("concrete", f, J, r, mc_samples=4000, seed=0), truth)
    for n in (1, 10):
        assert s.mse_error(n) > 0 and s.mse_error(n) >= s.trace_error / n - 1e-15


def test_mse_of_a_monte_carlo_row_subtracts_the_noise_of_its_bias():
    """An unbiased estimator drawn 200 times (normal, s.d. 1 per coordinate, 50 draws a
    row): the row's MSE at n, ||b_hat||^2 - sum SE^2 + tr / n, averages the true tr / n
    (within 4 s.e. of the 200 rows), where ||b_hat||^2 + tr / n is off by sum SE^2 = 0.06."""
    g = rng(7).standard_normal((200, 50, 3))
    truth = np.zeros(3)
    rows = [BiasSummary(mc_moments(x), truth) for x in g]
    mse = np.array([s.mse(10) for s in rows])
    assert abs(mse.mean() - 0.3) <= 4 * mse.std(ddof=1) / math.sqrt(200)
    s = rows[0]
    assert s.mse(10) == pytest.approx(s.bias_norm ** 2 - s.bias_norm_error ** 2 + s.trace / 10)


def test_unbiased_rows_hold_the_variance_of_the_n_sample_estimate():
    """LOORF's MSE column at n is tr Var of its n-sample estimate: the closed form, and the
    spread of 20,000 simulated n-sample LOORF estimates (within 5%: the simulation's s.e. of a
    variance sum is under 2%), not that divided by n."""
    from pbexact.variance import mc_moments as estimator_draws

    J = rng(3).normal(size=16)
    r = rng(4).normal(size=4)
    f = MultilinearExtension(J)
    rows, _, variances = EB.rows_at(0, f, J, r, SIGMOID, B.Setting(), ("st-theta",), [2, 10])
    loorf = next(x for x in rows if x["estimator"] == "loorf")
    for n in (2, 10):
        closed = closed_form_moments(J, r, n, SIGMOID, ("loorf",))["loorf"].total_variance
        assert loorf[f"mse_n{n}"] == pytest.approx(closed)
        sim = estimator_draws(J, r, n, 20_000, rng(n), "sigmoid", ("loorf",))["loorf"]
        assert loorf[f"mse_n{n}"] == pytest.approx(float(sim.variance.sum()), rel=0.05)


def test_the_trajectory_descends_the_true_gradient():
    """The logged E[J] falls from step 0 to the last step, and the first steps are SGD with the
    exact gradient (r - lr grad, by hand)."""
    J = exponential_tabular_loss(4, 0)
    logged = EB.trajectory(J, SIGMOID, 50, 10, 0.1)
    losses = [expected_loss(J, SIGMOID.theta(r)) for _, r in logged]
    assert losses[-1] < losses[0] and losses[1] < losses[0]
    r = SIGMOID.logits(np.full(4, 0.5))
    by_hand = {}
    for step in range(3):
        by_hand[step] = r.copy()
        r = r - 0.1 * SIGMOID.chain(true_gradient(J, SIGMOID.theta(r)), r)
    got = dict(logged)
    for step in (0, 1, 2):
        assert np.allclose(got[step], by_hand[step])


def test_bias_figure_keeps_round_off_off_the_axis_and_tells_the_unbiased_apart(tmp_path):
    """The exponential instance's hard-concrete error bar (about 1e-17) does not pull the bias
    axis below the plot floor; LOORF, ARMS and DisARM are drawn in three styles; the
    break-even n has its own panel; the tables say that 2 is the fewest samples."""
    argv = ["--benchmark", "exponential", "--d", "3", "--steps", "20", "--log-every", "10",
            "--mc-samples", "200", "--table-steps", "0,20", "--n", "1,10", "--out",
            str(tmp_path)]
    assert run(B.main, argv) == 0
    rows = _rows(tmp_path / "exponential_d3_sigmoid_bias.csv")
    table = [{**r, "step": int(r["step"]), "n": int(r["n"])}
             for r in _rows(tmp_path / "exponential_d3_sigmoid_break_even.csv")]
    data = [{**r, "step": int(r["step"])} for r in rows]
    fig = B.plot_bias(data, [1, 10], "t", table)
    axes = fig.axes
    floor = B.PLOT_FLOOR * min(float(r["grad_norm"]) for r in rows)
    assert axes[0].get_ylim()[0] >= floor / 2 * (1 - 1e-9)
    styles = {(str(line.get_color()), str(line.get_linestyle()), line.get_marker())
              for line in axes[3].lines if "exact variance" in line.get_label()}
    assert len(styles) == 3
    assert any("break-even" in ax.get_title() for ax in axes)
    md = (tmp_path / "exponential_d3_sigmoid_break_even.md").read_text()
    assert "2 is the fewest they take" in md


def test_cli_refuses_an_empty_out_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run(B.main, ["--d", "2", "--steps", "2", "--table-steps", "0", "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out '' is empty; name another folder" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_docs_ordering_statements_match_the_csvs():
    """docs/bias.md: at step 0 on NNLoss CP has the largest MSE at n = 10 and 100 and ST at
    n = 1 (247); from step 500 the relative MSE at n = 10 of CP and ST-theta is 0.68 to 1.09, of
    the other estimators but ST 8.5 to 674, ST's 3.0e4 to 2.4e7."""
    rows = _rows(FIGURES / "nnloss_d10_sigmoid_bias.csv")
    start = [r for r in rows if r["step"] == "0"]
    for n, top in ((1, {"st"}), (10, {"cp", "cp-anneal"}), (100, {"cp", "cp-anneal"})):
        mse = {r["estimator"]: float(r[f"mse_n{n}"]) for r in start if r[f"mse_n{n}"]}
        assert {k for k, v in mse.items() if v == max(mse.values())} == top, n
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    late = [r for r in rows if int(r["step"]) >= 500]
    for names, lo, hi in ((("cp", "cp-anneal", "st-theta"), "0.68", "1.09"),
                          (("concrete", "hardconcrete", "rebar", "relax", "loorf", "arms",
                            "disarm"), "8.5", "674"), (("st",), "3.0e4", "2.4e7")):
        rel = [float(r["mse_n10"]) / float(r["grad_norm"]) ** 2 for r in late
               if r["estimator"] in names]
        assert agrees_to_printed_digits(lo, min(rel)) and agrees_to_printed_digits(hi, max(rel))
        assert f"{lo} to {hi}" in text
