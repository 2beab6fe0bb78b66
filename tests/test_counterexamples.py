"""`python -m analysis.counterexamples` and the scalar CP of `pbexact.continuation`: the
counter-examples behave as the paper says (deterministic, so exact assertions), and every figure
is written with its CSV."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from analysis import counterexamples as ce
from pbexact.continuation import (
    DECEIVING_PIECEWISE,
    DECEIVING_SQUARED,
    exponential_schedule,
    logit,
    run_cp,
)
from pbexact.errors import PBInputError


def test_counterexample_functions_match_the_paper_source():
    # ex:deceiving_piecewise: continuous, J(0) = -1 < J(1) = 1, slope -2 except the two spikes
    knots = np.array([0.125, 0.13, 0.87, 0.875])
    assert DECEIVING_PIECEWISE(knots - 1e-12) == pytest.approx(DECEIVING_PIECEWISE(knots), abs=1e-9)
    assert DECEIVING_PIECEWISE(np.array([0.0, 1.0])).tolist() == [-1.0, 1.0]
    slopes = DECEIVING_PIECEWISE.derivative(np.array([0.05, 0.127, 0.5, 0.872, 0.95]))
    assert slopes.tolist() == [-2.0, 398.0, -2.0, 398.0, -2.0]
    # ex:deceiving_squared: J(0) = 0 < J(1) = 1, derivative < 0 exactly for z > 0.4
    assert DECEIVING_SQUARED(np.array([0.0, 1.0])) == pytest.approx([0.0, 1.0], abs=1e-12)
    z = np.linspace(0, 1, 101)
    assert np.all((DECEIVING_SQUARED.derivative(z) < 0) == (z > 0.4))


def test_cp_piecewise_only_large_learning_rates_solve_it():
    taus = exponential_schedule(10)
    final = {a: run_cp(DECEIVING_PIECEWISE, 0.0, a, taus, 100).loss_discrete[-1]
             for a in ce.ALPHAS}
    assert final == {0.5: -1.0, 0.1: -1.0, 0.05: 1.0, 0.01: 1.0}


def test_cp_squared_needs_x0_below_logit_04():
    taus = exponential_schedule(10)
    for lr in (0.5, 0.1, 0.01):
        assert run_cp(DECEIVING_SQUARED, 0.0, lr, taus).loss_discrete[-1] == 1.0
        below = run_cp(DECEIVING_SQUARED, logit(0.4) - 0.01, lr, taus).loss_discrete[-1]
        assert below == pytest.approx(0.0, abs=1e-12)


def test_cp_rejects_bad_input():
    with pytest.raises(PBInputError):
        run_cp(DECEIVING_SQUARED, 0.0, -1.0, exponential_schedule(3))
    with pytest.raises(PBInputError):
        exponential_schedule(0)


def test_all_figures_and_csvs_are_written(tmp_path):
    report = ce.build_all(tmp_path, None, temperatures=4, final_tau=0.01, iters=20,
                          cor_max_d=8, epsilon=0.25, progress=False)
    for stem in ("sig_per_temp", "different_J", "collapse_of_j", "deceiving_J",
                 "deceiving_piecewise_runs", "deceiving_squared_runs", "theta_dep_ill",
                 "cor_mc_bad_gen_2"):
        assert (tmp_path / f"{stem}.png").stat().st_size > 10_000
        with open(tmp_path / f"{stem}.csv") as fh:
            assert len(list(csv.reader(fh))) > 2
    # fig:theta_dep_ill: the true descent direction points toward z* = zeta_2, the sampled not
    assert report["theta_dep_ill"]["toward_z_star"] == {"mc": False, "true": True}
    assert report["theta_dep_ill"]["grad_at_center"] == [0.0, 0.0]
    # fig:different_J: the same vertex values, descent directions of both signs at z = 0.5
    slopes = report["different_J"]["slope_at_half"].values()
    assert min(slopes) < 0 < max(slopes)
    # tab:mc_bad_gen_2 for d = 3, z* = 1, read from the code
    rows = report["tab_mc_bad_gen_2"]["rows"]
    assert [r[1] for r in rows] == [3, 2, 1, 0]
    assert [r[2] for r in rows] == ["-DeltaM + M_0", "-2*DeltaM/3 + M_0", "-DeltaM/3 + M_0", "m"]
    assert (tmp_path / "tab_mc_bad_gen_2.md").read_text().startswith("| z |")


def test_cli_unknown_figure_is_exit_2(tmp_path, capsys):
    assert ce.run(ce.main, ["--out", str(tmp_path), "--only", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: argument --only: invalid choice: 'nope'") and \
        err.count("\n") == 1
    with pytest.raises(PBInputError, match="unknown figure 'nope'"):  # the API's own check
        ce.build_all(tmp_path, ["nope"], 2, 0.5, 1, 3, 0.25, progress=False)


@pytest.mark.parametrize("args,words", [
    (["--epsilon", "1.5"], "--epsilon must be in (0, 1)"),
    (["--cor-max-d", "30"], "--cor-max-d must be in 2..24"),
])
def test_cli_bad_corollary_sizes_are_exit_2(tmp_path, capsys, args, words):
    assert ce.run(ce.main, ["--out", str(tmp_path), *args]) == 2
    assert capsys.readouterr().err.startswith(f"error: {words}")
