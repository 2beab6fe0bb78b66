"""``python -m analysis.variance``: size guards that cannot overflow, the MC memory guard, the
strict ``h,J`` table, the help's bit order, the log-x figure with distinct styles, and the
progress bar started after the first (compiling) step."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_refusals import FORMAT

from analysis import variance as V
from analysis.cli import read_table, run
from pbexact.errors import ENUMERATION_MEMORY_LIMIT, PBInputError, format_count
from pbexact.sampling import vertex_index
from pbexact.vertices import vertices


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    assert FORMAT.match(err[0]), f"not 'error: <problem>; <fix>': {err[0]}"
    return err[0]


def test_enumeration_guard_of_a_huge_count_is_one_line(tmp_path, capsys):
    assert run(V.main, ["--d", "20", "--n", "100", "--method", "enumerate",
                        "--out", str(tmp_path)]) == 2
    count = math.comb(2**20 - 1 + 100, 100)  # past the float range
    assert f"{format_count(count)} 100-multisets" in _one_line(capsys)
    assert format_count(count) == f"{int(str(count)[:4]) / 1000:.3g}e+{len(str(count)) - 1}"
    assert format_count(10**400) == "1e+400" and format_count(12345) == "1.23e+04"


def test_mc_draws_beyond_memory_are_refused_up_front(tmp_path, capsys):
    d, n = 10, 10
    most = ENUMERATION_MEMORY_LIMIT // V.mc_bytes(d, n, 1)
    V.check_method("mc", d, n, most)  # the largest allowed passes
    with pytest.raises(PBInputError, match=f"--draws {most:,} or fewer"):
        V.check_method("mc", d, n, most + 1)
    assert run(V.main, ["--d", str(d), "--n", str(n), "--method", "mc", "--draws", "10" * 6,
                        "--out", str(tmp_path / "o")]) == 2
    assert "--draws" in _one_line(capsys) and not (tmp_path / "o").exists()


def test_table_rows_must_have_exactly_h_and_j(tmp_path, capsys):
    good = tmp_path / "good.csv"
    good.write_text("h,J\n0,1.0\n1,2.0\n")
    assert read_table(good).tolist() == [1.0, 2.0]
    bad = tmp_path / "bad.csv"
    bad.write_text("h,J\n0,1.0,7\n1,2.0\n")
    with pytest.raises(PBInputError, match="line 2: expected the two columns h,J, got 3"):
        read_table(bad)
    assert run(V.main, ["--table", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "two columns" in _one_line(capsys)


def test_help_says_how_h_maps_to_bits():
    text = " ".join(V.build_parser().format_help().split())
    assert "z_i = bit i-1 of h" in text
    # and that is the project's order: vertex h has z_i = bit i-1 of h
    z = vertices(3)
    assert vertex_index(z).tolist() == list(range(8))
    assert z[1].tolist() == [1.0, 0.0, 0.0]


def test_logx_figure_with_a_distinct_style_per_estimator(tmp_path):
    import matplotlib.pyplot as plt

    J = np.random.default_rng(0).standard_normal(8)
    rows = V.variance_trajectory(J, 4, steps=20, log_every=2)
    fig = V.plot_variances(rows, "t", logx=True)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    styles = [(line.get_linestyle(), line.get_marker()) for line in ax.lines]
    assert len(styles) == 5 and len(set(styles)) == 5
    assert min(ax.lines[0].get_xdata()) == 0.5  # step 0 drawn at 1/2
    plt.close(fig)
    assert run(V.main, ["--d", "3", "--n", "4", "--steps", "4", "--log-every", "2", "--logx",
                        "--benchmark", "nnloss", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "nnloss_d3_n4_variance.png").stat().st_size > 10_000


def test_first_moments_are_computed_before_the_progress_bar(monkeypatch):
    events = []
    real_moments, real_tqdm = V.moments_at, V.tqdm

    def moments(*args, **kwargs):
        events.append("moments")
        return real_moments(*args, **kwargs)

    def bar(*args, **kwargs):
        events.append("bar")
        return real_tqdm(*args, **kwargs)

    monkeypatch.setattr(V, "moments_at", moments)
    monkeypatch.setattr(V, "tqdm", bar)
    J = np.random.default_rng(1).standard_normal(8)
    rows = V.variance_trajectory(J, 3, steps=6, log_every=3, desc="x")
    assert events[:2] == ["moments", "bar"]
    assert events.count("moments") == len(rows) == 3  # step 0 is not computed twice
    monkeypatch.undo()
    again = V.variance_trajectory(J, 3, steps=6, log_every=3)
    assert again == rows


def test_estimator_names_and_sizes_are_checked_by_the_parsers(tmp_path, capsys):
    from analysis import arms_table, variance_table

    afile = tmp_path / "afile"
    afile.write_text("x")
    for argv, message in ((["--estimator", "nope"], "--estimator: invalid choice"),
                          (["--against", "loorf", "nope"], "--against: invalid choice"),
                          (["--seed", "-1"], "--seed"), (["--d", "0"], "--d"),
                          (["--out", str(afile)], "is a file")):
        assert run(variance_table.main, [*argv, "--out", str(tmp_path / "o")][
            : None if "--out" not in argv else len(argv)]) == 2, argv
        assert message in _one_line(capsys)
    assert not (tmp_path / "o").exists()
    assert run(arms_table.main, ["--n", "1"]) == 2
    assert "--n: must be an integer >= 2" in _one_line(capsys)
