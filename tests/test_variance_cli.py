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
from analysis.exact import variance as EV
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
    most = ENUMERATION_MEMORY_LIMIT // EV.mc_bytes(d, n, 1)
    EV.check_method("mc", d, n, most)  # the largest allowed passes
    with pytest.raises(PBInputError, match=f"--draws {most:,} or fewer"):
        EV.check_method("mc", d, n, most + 1)
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
    rows = EV.variance_trajectory(J, 4, steps=20, log_every=2)
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
    real_moments, real_tqdm = EV.moments_at, EV.tqdm

    def moments(*args, **kwargs):
        events.append("moments")
        return real_moments(*args, **kwargs)

    def bar(*args, **kwargs):
        events.append("bar")
        return real_tqdm(*args, **kwargs)

    monkeypatch.setattr(EV, "moments_at", moments)
    monkeypatch.setattr(EV, "tqdm", bar)
    J = np.random.default_rng(1).standard_normal(8)
    rows = EV.variance_trajectory(J, 3, steps=6, log_every=3, desc="x")
    assert events[:2] == ["moments", "bar"]
    assert events.count("moments") == len(rows) == 3  # step 0 is not computed twice
    monkeypatch.undo()
    again = EV.variance_trajectory(J, 3, steps=6, log_every=3)
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


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_results_of_other_settings_are_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "out"
    base = ["--d", "2", "--n", "2", "--steps", "2", "--log-every", "1", "--out", str(out)]
    assert run(V.main, base) == 0
    first = _files(out)
    assert {"exponential_d2_n2_variance_settings.json", "nnloss_d2_table.csv"} <= set(first)
    capsys.readouterr()
    # another seed (another instance), steps or learning rate: refused, nothing touched
    for extra, key in ((["--seed", "1"], "seed = 0, asked 1"), (["--steps", "3"], "steps"),
                       (["--lr", "0.2"], "lr")):
        assert run(V.main, [*base, *extra]) == 2
        assert key in _one_line(capsys)
        assert _files(out) == first
    # the same settings rerun; enumerate and closed are both exact: one result, rerun too
    assert run(V.main, base) == 0
    assert run(V.main, [*base, "--method", "closed"]) == 0
    # Monte Carlo estimates sit beside the exact results
    exact = (out / "nnloss_d2_n2_variance.csv").read_bytes()
    assert run(V.main, [*base, "--method", "mc", "--draws", "50"]) == 0
    assert (out / "nnloss_d2_n2_variance_mc.csv").exists()
    assert (out / "nnloss_d2_n2_variance.csv").read_bytes() == exact
    # a huge seed is refused by the parser before the table is written
    other = tmp_path / "other"
    capsys.readouterr()
    assert run(V.main, [*base[:-1], str(other), "--seed", str(10**20)]) == 2
    assert "2**63 - 1" in _one_line(capsys) and not other.exists()
    # a table of another instance in --out is refused too (a folder from before settings)
    (out / "nnloss_d2_n2_variance_settings.json").unlink()
    capsys.readouterr()
    assert run(V.main, base) == 2
    assert "has no recorded settings" in _one_line(capsys)


def test_a_random_instance_and_table_names_without_a_repeated_d(tmp_path, capsys):
    from pbexact.instances import random_table

    out = tmp_path / "out"
    argv = ["--benchmark", "random", "--d", "3", "--seed", "3", "--steps", "0", "--out",
            str(out)]
    assert run(V.main, argv) == 0
    assert read_table(out / "random_d3_table.csv").tolist() == random_table(3, 3).tolist()
    assert (out / "random_d3_n4_variance.csv").exists()
    J = random_table(3, 3)
    assert not np.array_equal(J, random_table(3, 4)) and J.shape == (8,)
    # one's own table, named by its file: d is not repeated
    for name, stem in (("rand_d3.csv", "rand_d3_n4"), ("rand_d3_table.csv", "rand_d3_n4"),
                       ("my_table.csv", "my_table_d3_n4"), ("_d3.csv", "_d3_d3_n4")):
        (tmp_path / name).write_text((out / "random_d3_table.csv").read_text())
        mine = tmp_path / f"o_{name}"
        assert run(V.main, ["--table", str(tmp_path / name), "--steps", "0", "--out",
                            str(mine)]) == 0
        assert (mine / f"{stem}_variance.csv").exists(), sorted(p.name for p in mine.iterdir())


def test_variance_table_takes_tables_and_the_random_instance(tmp_path, capsys):
    import csv

    from analysis import variance_table

    table = tmp_path / "mine_d2.csv"
    table.write_text("h,J\n0,1.0\n1,-2.0\n2,0.5\n3,3.0\n")
    out = tmp_path / "out"
    assert run(variance_table.main, ["--table", str(table), "--n", "2", "4", "--steps", "3",
                                     "--against", "loorf", "--out", str(out)]) == 0
    with open(out / "variance_table_disarm.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["benchmark"], r["d"], r["n"]) for r in rows] == [("mine", "2", "2"),
                                                                ("mine", "2", "4")]
    # the ratios are those of analysis.variance on the same table
    traj = EV.variance_trajectory(read_table(table), 4, steps=3, log_every=100,
                                 method="closed")
    assert float(rows[1]["ratio_step0"]) == traj[0]["var_disarm"] / traj[0]["var_loorf"]
    assert run(variance_table.main, ["--benchmark", "random", "--d", "3", "--n", "2",
                                     "--steps", "0", "--out", str(tmp_path / "r")]) == 0
    assert run(variance_table.main, ["--table", str(table), "--d", "2"]) == 2
    assert "leave --d out" in _one_line(capsys)
