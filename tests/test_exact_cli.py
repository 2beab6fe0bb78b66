"""The exact core's command-line tools and microworld benchmarks."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest
import sympy as sp
import torch
from _reference import D1_TABLE, D1_VARIANCES

from analysis import arms_table, variance
from analysis.exact.variance import variance_trajectory
from pbexact.errors import PBInputError
from pbexact.estimators import REGISTRY
from pbexact.instances import NNLoss, benchmark_table, exponential_tabular_loss
from pbexact.vertices import vertices


def test_variance_cli_writes_the_documented_files(tmp_path):
    rc = variance.main(["--d", "3", "--n", "3", "--steps", "40", "--log-every", "10",
                        "--out", str(tmp_path), "--figures", str(tmp_path / "fig")])
    assert rc == 0
    for bench in ("exponential", "nnloss"):
        with open(tmp_path / f"{bench}_d3_n3_variance.csv") as fh:
            rows = list(csv.DictReader(fh))
        # one var column per registered estimator, in registry order
        assert list(rows[0]) == ["step", "loss", "entropy", *(f"var_{k}" for k in REGISTRY),
                                 "theta_1", "theta_2", "theta_3"]
        paired = [k for k, spec in REGISTRY.items() if spec.even]
        assert paired  # DisARM takes antithetic pairs
        for k in REGISTRY:  # n = 3 is odd: blank exactly for the estimators that take pairs
            assert all((r[f"var_{k}"] == "") == (k in paired) for r in rows), k
        assert [int(r["step"]) for r in rows] == [0, 10, 20, 30, 40]
        assert float(rows[0]["entropy"]) == pytest.approx(3 * np.log(2))
        assert all(float(r[f"var_{k}"]) >= 0 for r in rows for k in ("reinforce", "loorf"))
        # the true-gradient trajectory descends
        assert float(rows[-1]["loss"]) < float(rows[0]["loss"])
        with open(tmp_path / f"{bench}_d3_table.csv") as fh:
            table = list(csv.DictReader(fh))
        np.testing.assert_allclose([float(r["J"]) for r in table], benchmark_table(bench, 3, 0))
        assert (tmp_path / "fig" / f"{bench}_d3_n3_variance.png").stat().st_size > 0


def test_variance_cli_mc_is_close_to_exact(tmp_path):
    exact = variance_trajectory(exponential_tabular_loss(3, 1), 3, steps=0)
    mc = variance_trajectory(exponential_tabular_loss(3, 1), 3, steps=0, method="mc",
                                      draws=50_000, seed=2)
    for k in ("reinforce", "loorf", "arms", "betastar"):
        assert mc[0][f"var_{k}"] == pytest.approx(exact[0][f"var_{k}"], rel=0.1)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--d", "10", "--n", "10", "--method", "enumerate"], "--method closed"),
        (["--n", "1"], "needs n >= 2"),
        (["--d", "40"], "too large"),
        (["--log-every", "0"], "--log-every"),
    ],
)
def test_variance_cli_bad_input_is_one_line_exit_2(args, message, tmp_path):
    cmd = [sys.executable, "-m", "analysis.variance", *args, "--out", str(tmp_path),
           "--figures", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert err[-1].startswith("error:") and message in err[-1]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "content,message",
    [
        ("h,J\n0,1.0\n1,nan\n", "NaN or inf at h=1"),
        ("h,J\n0,1.0\n1,2.0\n2,3.0\n", "2^d entries"),
        ("h,J\n0,1.0\n1,abc\n", "line 3"),
        ("z,loss\n0,1.0\n1,2.0\n", "header"),
        ("h,J\n0,1.0\n2,2.0\n", "cover 0..1"),
    ],
)
def test_variance_cli_rejects_bad_tables(content, message, tmp_path, capsys):
    table = tmp_path / "mine.csv"
    table.write_text(content)
    from analysis.cli import run

    assert run(variance.main, ["--table", str(table), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err


def test_variance_cli_studies_a_given_table(tmp_path):
    table = tmp_path / "quad.csv"
    J = D1_TABLE
    table.write_text("h,J\n" + "".join(f"{h},{j!r}\n" for h, j in enumerate(J)))
    args = ["--table", str(table), "--n", "4", "--steps", "0", "--out", str(tmp_path),
            "--figures", str(tmp_path)]
    assert variance.main(args) == 0
    with open(tmp_path / "quad_d1_n4_variance.csv") as fh:
        row = next(csv.DictReader(fh))
    # the d=1 reference values at theta = 0.5 (exact-core issue)
    assert float(row["var_loorf"]) == pytest.approx(D1_VARIANCES[0.5][("loorf", 4)], rel=1e-4)
    assert float(row["var_arms"]) == pytest.approx(D1_VARIANCES[0.5][("arms", 4)], rel=1e-4)


def test_arms_table_json(tmp_path):
    out = tmp_path / "t.json"
    assert arms_table.main(["--n", "4", "--json", str(out), "--latex"]) == 0
    data = json.loads(out.read_text())
    assert data["n"] == 4 and data["variable"] == "c"
    assert [row["ones"] for row in data["rows"]] == [0, 1, 2, 3, 4]
    c = sp.Symbol("c")
    row3 = data["rows"][3]["pieces"]
    assert [(p["lo"], p["hi"]) for p in row3] == [("0", "1/4"), ("1/4", "1/3"), ("1/3", "1/2"),
                                                 ("1/2", "1")]
    assert sp.expand(sp.sympify(row3[-1]["expr"]) - (1 - c) ** 3) == 0


def test_exponential_benchmark_is_seeded_and_normalized():
    a = exponential_tabular_loss(6, 3)
    np.testing.assert_array_equal(a, exponential_tabular_loss(6, 3))
    assert not np.array_equal(a, exponential_tabular_loss(6, 4))
    assert a.min() == -1.0 and a.max() == 1.0
    assert np.median(a) > 0  # most vertices near 1, a few rare ones near -1


def test_nnloss_is_seeded_fixed_and_batch_independent():
    m = NNLoss(4, 0)
    table = m.table()
    np.testing.assert_array_equal(table, NNLoss(4, 0).table())
    m.train()  # must not unfreeze the normalization statistics
    single = torch.stack([m(torch.from_numpy(v)[None])[0] for v in vertices(4)]).numpy()
    np.testing.assert_allclose(single, table, rtol=1e-12)
    z = torch.full((4,), 0.3, dtype=torch.float64, requires_grad=True)
    m(z).backward()
    assert torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0
    with pytest.raises(PBInputError):
        benchmark_table("quadratic", 4)
