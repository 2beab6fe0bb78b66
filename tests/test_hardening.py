"""Hardening: no code runs from a loaded file, nothing is written outside --out, every
bad input is a one-line error with exit code 2 before any work, and the exact core stays accurate
at the edges (tiny and near-one theta, huge n, the direct parametrization's clamp)."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_refusals import FORMAT

from pbexact import io as pio
from pbexact.errors import PBInputError
from pbscale import methods as M
from pbscale import regress
from pbscale.regression import run as regression_run
from pbscale.regression import run as rrun
from pbscale.regression.problem import make_problem
from pbscale.runs import io

ROOT = Path(__file__).resolve().parent.parent


def tiny_problem():
    return make_problem(0, n_train=300, n_valid=100, backbone_hidden=(6, 6),
                        target_hidden=(12, 12))


# ----------------------------------------------------------------------------------- security


class _Boom:
    """A pickled call: unpickling it would create the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_crafted_checkpoint_is_refused_without_running_it(tmp_path):
    prob = tiny_problem()
    cfg = M.MethodConfig(method="loorf", n=2)
    folder = rrun.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                           problem=prob)
    (folder / "summary.json").unlink()  # so that the next call resumes from the checkpoint
    marker = tmp_path / "pwned"
    with open(folder / "checkpoint.pt", "wb") as fh:
        torch.save({"method": _Boom(str(marker)), "history": [], "epoch": 0}, fh)
    with pytest.raises(PBInputError, match="damaged checkpoint .*delete the run folder"):
        rrun.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False, problem=prob)
    assert not marker.exists()  # the pickled call did not run
    # the plain-pickle route is refused the same way
    with open(folder / "checkpoint.pt", "wb") as fh:
        pickle.dump(_Boom(str(marker)), fh)
    with pytest.raises(PBInputError, match="damaged checkpoint"):
        io.load_checkpoint(folder / "checkpoint.pt")
    assert not marker.exists()
    # not vacuous: the unsafe load would have run the payload
    with open(folder / "checkpoint.pt", "rb") as fh:
        pickle.load(fh)
    assert marker.exists()


def test_our_checkpoints_load_with_weights_only(tmp_path):
    """Everything we save (optimizer and generator states, control variates, history) loads
    with weights_only=True, for every method."""
    prob = tiny_problem()
    for method in ("loorf", "arms", "cp", "relax"):
        cfg = M.MethodConfig(method=method, n=3, chunk=3)
        folder = rrun.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                               problem=prob)
        state = torch.load(folder / "checkpoint.pt", weights_only=True)
        assert state["epoch"] == 1 and state["generator"].dtype == torch.uint8


@pytest.mark.parametrize("damage", ["truncated", "empty", "random", "wrong_key", "folder",
                                    "bad_history"])
def test_damaged_checkpoint_is_a_one_line_error(tmp_path, damage, capsys):
    prob = tiny_problem()
    cfg = M.MethodConfig(method="loorf", n=2)
    folder = rrun.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                           problem=prob)
    (folder / "summary.json").unlink()
    ckpt = folder / "checkpoint.pt"
    data = ckpt.read_bytes()
    if damage == "truncated":
        ckpt.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        ckpt.write_bytes(b"")
    elif damage == "random":
        ckpt.write_bytes(np.random.default_rng(0).bytes(4096))
    elif damage == "wrong_key":
        torch.save({"weights": torch.zeros(3)}, ckpt)
    elif damage == "bad_history":
        state = torch.load(ckpt, weights_only=True)
        torch.save({**state, "method": {"r": torch.zeros(2)}}, ckpt)
    else:
        ckpt.unlink()
        ckpt.mkdir()
    with pytest.raises(PBInputError, match=r"checkpoint.pt.*delete the run folder or choose"):
        rrun.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False, problem=prob)


@pytest.mark.parametrize("name", ["config.json", "summary.json"])
@pytest.mark.parametrize("damage", ["truncated", "folder", "binary"])
def test_damaged_json_run_files_exit_2(tmp_path, name, damage, capsys, monkeypatch):
    prob = tiny_problem()
    monkeypatch.setattr(regression_run, "make_problem", lambda *a, **k: prob)
    args = ["--method", "loorf", "--n", "2", "--epochs", "1", "--out", str(tmp_path),
            "--device", "cpu", "--quiet"]
    assert regress.main(args) == 0
    folder = rrun.run_folder(M.MethodConfig(method="loorf", n=2), epochs=1, out=tmp_path,
                              problem=prob)
    path = folder / name
    if damage == "truncated":
        path.write_text(path.read_text()[:10])
    elif damage == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage")
    else:
        path.unlink()
        path.mkdir()
    capsys.readouterr()
    assert regress.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert name in err and "delete the run folder" in err


def test_atomic_write_mode_follows_the_umask(tmp_path):
    for umask in (0o022, 0o077, 0o002):
        old = os.umask(umask)
        try:
            pio.write_json(tmp_path / f"a{umask}.json", {"x": 1})
            with open(tmp_path / f"b{umask}.txt", "w") as fh:  # what a plain open gives
                fh.write("x")
        finally:
            os.umask(old)
        mode = (tmp_path / f"a{umask}.json").stat().st_mode & 0o777
        assert mode == (tmp_path / f"b{umask}.txt").stat().st_mode & 0o777 == 0o666 & ~umask


def test_stale_temporary_of_a_killed_writer_is_removed(tmp_path):
    target = tmp_path / "result.json"
    # a writer that SIGKILLs itself in the middle of an atomic write
    code = (
        "import os, signal, sys\n"
        "from pbexact import io\n"
        "real = os.replace\n"
        "def die(*a): os.kill(os.getpid(), signal.SIGKILL)\n"
        "os.replace = die\n"
        f"io.write_json({str(target)!r}, {{'x': 1}})\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == -signal.SIGKILL
    stale = list(tmp_path.glob(".result.json.*.tmp"))
    assert len(stale) == 1 and not target.exists()
    # a live writer's temporary (this process) must survive the clean-up
    live = tmp_path / f".result.json.{os.getpid()}.abcd1234.tmp"
    live.write_text("in progress")
    pio.write_json(target, {"x": 2})
    assert not stale[0].exists() and live.exists()
    assert target.read_text().strip().endswith("}")


# ------------------------------------------------------------------ accuracy at the edges


def _mp_arms_reference(theta, n, J, i):
    """Mean and variance of ARMS for logit i (sigmoid) in 50-digit mpmath, written from the
    definition: the copula law of m <= 4 samples per bit by inclusion-exclusion over the tails
    P(t given samples beyond c) = (1 - t c)_+^(n-1), every joint bit pattern of the samples over
    all d bits enumerated, and E[U^2] by the three overlap classes of sample pairs."""
    import itertools
    import math

    import mpmath as mp

    mp.mp.dps = 50
    d = len(theta)

    def law(th, m):
        th = mp.mpf(th)
        upper = th > mp.mpf(1) / 2
        side = 1 - th if upper else th
        c = 1 - side ** (mp.mpf(1) / (n - 1))
        out = {}
        for w in itertools.product((0, 1), repeat=m):
            beyond = sum(1 for b in w if (b == 1) != upper)
            below = m - beyond
            out[w] = sum((-1) ** s * math.comb(below, s) * max(1 - (beyond + s) * c, 0) ** (n - 1)
                         for s in range(below + 1))
        return out, (max(1 - 2 * c, 0) ** (n - 1) - side**2) / (th * (1 - th))

    laws = {m: [law(t, m) for t in theta] for m in (2, 3, 4)}
    Jm = [mp.mpf(float(x)) for x in J]

    def expect(m, f):
        total = mp.mpf(0)
        for combo in itertools.product(*[list(laws[m][j][0].items()) for j in range(d)]):
            p = mp.fprod(q for _, q in combo)
            if p:
                xs = [sum(combo[j][0][k] << j for j in range(d)) for k in range(m)]
                total += p * f(xs)
        return total

    def h(xs, a, b):
        return (Jm[xs[a]] - Jm[xs[b]]) * (((xs[a] >> i) & 1) - ((xs[b] >> i) & 1)) / 2

    mh = expect(2, lambda xs: h(xs, 0, 1))
    p2 = expect(2, lambda xs: h(xs, 0, 1) ** 2)
    p3 = expect(3, lambda xs: h(xs, 0, 1) * h(xs, 0, 2))
    p4 = expect(4, lambda xs: h(xs, 0, 1) * h(xs, 2, 3))
    pairs = mp.mpf(n) * (n - 1) / 2
    var_u = (pairs * (p2 - mh**2) + mp.mpf(n) * (n - 1) * (n - 2) * (p3 - mh**2)
             + pairs * mp.mpf(n - 2) * (n - 3) / 2 * (p4 - mh**2))
    scale = 1 - laws[2][i][1]
    return mh / scale, var_u / pairs**2 / scale**2


@pytest.mark.parametrize("t", [1e-10, 1e-15, 1e-17, 1e-100, 1e-300, 0.3, 1 - 1e-12, 1 - 1e-16])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_exact_arms_mean_is_the_true_gradient_at_extreme_theta(t, n):
    """Before the expm1/log1p thresholds the relative error was 8e-8 at 1e-10, 8e-4 at 1e-15 and
    100% at 1e-17; LOORF, which has no copula, is the control."""
    from pbexact.closed_form import closed_form_moments
    from pbexact.parametrizations import Sigmoid
    from pbexact.polynomial import true_gradient
    from pbexact.variance import exact_moments

    J = np.random.default_rng(3).normal(size=4)
    r = np.log([t, 0.4]) - np.log1p(-np.array([t, 0.4]))
    theta = Sigmoid().theta(r)  # the float64 theta the logits stand for (1 - t is rounded)
    t = theta[0]
    # the true gradient in closed form for d = 2 (z_1 is bit 0 of h)
    grad = t * (1 - t) * ((1 - theta[1]) * (J[1] - J[0]) + theta[1] * (J[3] - J[2]))
    np.testing.assert_allclose(Sigmoid().chain(true_gradient(J, theta), r)[0], grad,
                               rtol=1e-13)
    for moments in (exact_moments(J, r, n), closed_form_moments(J, r, n)):
        for name in ("arms", "loorf"):
            assert moments[name].mean[0] == pytest.approx(grad, rel=1e-13, abs=0), name
            assert np.isfinite(moments[name].variance).all()


def test_copula_patterns_at_extreme_theta_against_mpmath():
    import mpmath as mp

    from pbexact.copula import arms_correlation, pattern_probabilities

    mp.mp.dps = 60
    for t in (1e-300, 1e-17, 1 - 1e-16):
        q = pattern_probabilities(np.array([t]), 3)[0]
        side = min(mp.mpf(t), 1 - mp.mpf(t))
        # one sample beyond c, two below: side - 2 (1 - 2c)^2 + (1 - 3c)^2, the last two zero
        beyond_one = q[1] if t < 0.5 else q[2]
        assert beyond_one == pytest.approx(float(side), rel=1e-15)
        rho = arms_correlation(np.array([t]), 3)[0]
        assert rho == pytest.approx(float(-side**2 / (mp.mpf(t) * (1 - mp.mpf(t)))), rel=1e-14)


@pytest.mark.parametrize("n", [10, 10**4, 10**6])
def test_closed_form_arms_variance_for_large_n_against_mpmath(n):
    from pbexact.closed_form import closed_form_moments

    J = np.random.default_rng(1).normal(size=4)
    for theta in ([0.5, 0.5], [0.3, 0.8]):
        r = np.log(theta) - np.log1p(-np.array(theta))
        got = closed_form_moments(J, r, n, "sigmoid", ("arms",))["arms"]
        for i in range(2):
            mean, var = _mp_arms_reference(theta, n, J, i)
            assert got.mean[i] == pytest.approx(float(mean), rel=1e-12)
            # measured: <= 4e-10 at n = 10^6; before the fix 2e-5 at 10^6 and 100% at 10^9
            assert got.variance[i] == pytest.approx(float(var), rel=1e-8)


def test_closed_form_arms_refuses_n_beyond_its_accurate_range():
    from pbexact.closed_form import MAX_ARMS_CLOSED_FORM_N, closed_form_moments

    J = np.random.default_rng(1).normal(size=4)
    r = np.zeros(2)
    assert np.isfinite(closed_form_moments(J, r, MAX_ARMS_CLOSED_FORM_N)["arms"].variance).all()
    with pytest.raises(PBInputError, match="accurate up to n=1,000,000"):
        closed_form_moments(J, r, MAX_ARMS_CLOSED_FORM_N + 1)
    # the other estimators have no such limit
    big = closed_form_moments(J, r, 10**12, "sigmoid", ("reinforce", "loorf", "betastar"))
    small = closed_form_moments(J, r, 10**6, "sigmoid", ("reinforce", "loorf", "betastar"))
    for k in big:
        np.testing.assert_allclose(big[k].variance * 10**12, small[k].variance * 10**6,
                                   rtol=1e-5)


@pytest.mark.parametrize("t", [1e-300, 1e-305, 1 - 1e-16, 1e-3])
def test_direct_parametrization_near_zero_closed_form_equals_enumeration(t):
    from pbexact.closed_form import closed_form_moments
    from pbexact.variance import exact_moments

    J = np.random.default_rng(0).normal(size=4)
    r = np.array([t, 0.4])
    e, c = exact_moments(J, r, 3, "direct"), closed_form_moments(J, r, 3, "direct")
    for k in e:
        assert np.isfinite(c[k].variance).all() and np.isfinite(c[k].mean).all()
        # the second logit's variances are O(1) or exactly 0: round-off below 1e-14 there
        np.testing.assert_allclose(c[k].mean, e[k].mean, rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(c[k].variance, e[k].variance, rtol=1e-12, atol=1e-14)


def test_direct_parametrization_refused_where_its_score_overflows():
    from pbexact.closed_form import closed_form_moments
    from pbexact.variance import exact_moments

    J = np.random.default_rng(0).normal(size=4)
    r = np.array([1e-310, 0.4])  # 1 / theta overflows float64
    for f in (exact_moments, closed_form_moments):
        with pytest.raises(PBInputError, match="overflows float64"):
            f(J, r, 3, "direct")
    # theta = 0 exactly has score 0 and stays accepted
    assert np.isfinite(closed_form_moments(J, np.array([0.0, 0.4]), 3, "direct")["loorf"]
                       .variance).all()


def test_closed_form_d_limit_is_the_same_in_api_cli_and_readme():
    from pbexact.closed_form import MAX_CLOSED_FORM_D, closed_form_moments

    readme = (ROOT / "README.md").read_text()
    assert f"d <= {MAX_CLOSED_FORM_D}" in readme
    with pytest.raises(PBInputError, match=f"up to d={MAX_CLOSED_FORM_D}"):
        closed_form_moments(np.zeros(2 ** (MAX_CLOSED_FORM_D + 1)),
                            np.zeros(MAX_CLOSED_FORM_D + 1), 2)
    proc = subprocess.run(
        [sys.executable, "-m", "analysis.variance", "--d", str(MAX_CLOSED_FORM_D + 1),
         "--method", "closed", "--out", "/nonexistent-never-written"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and f"the limit is d={MAX_CLOSED_FORM_D}" in proc.stderr
    assert not Path("/nonexistent-never-written").exists()


# ------------------------------------------- one-line errors, exit code 2, before any work


def _call(module: str, argv: list[str]) -> int:
    """Run a tool's main in-process as its ``__main__`` would: PBInputError -> 2, argparse's
    errors -> SystemExit(2)."""
    import importlib

    from analysis.cli import run

    mod = importlib.import_module(module)
    try:
        if module in ("pbscale.regress", "analysis.regression"):
            return int(mod.main(argv) or 0)  # these catch PBInputError themselves
        return run(mod.main, argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _bad_cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    afile = tmp / "a_file"
    binary = tmp / "table.bin"
    return [
        # learning rates: zero, negative, NaN, infinite, in every tool that takes one
        ("analysis.variance", ["--lr", "0"], "--lr: must be a number > 0"),
        ("analysis.variance", ["--lr", "-0.1"], "--lr: must be a number > 0"),
        ("analysis.variance", ["--lr", "nan"], "--lr: must be a finite number"),
        ("analysis.variance", ["--lr", "inf"], "--lr: must be a finite number"),
        ("analysis.variance_compare", ["--lr", "0"], "--lr"),
        ("analysis.microworld", ["estimators", "--lrs", "0.1", "-1"], "--lrs"),
        ("analysis.microworld", ["params", "--lrs", "nan"], "--lrs"),
        ("pbscale.regress", ["--lr", "nan"], "--lr"),
        ("pbscale.regress", ["--lr", "0"], "--lr"),
        ("pbscale.regress", ["--lam", "inf"], "--lam"),
        ("pbscale.regress", ["--lam", "-1"], "--lam"),
        ("analysis.counterexamples", ["--final-tau", "0"], "--final-tau"),
        ("analysis.counterexamples", ["--final-tau", "2"], "--final-tau"),
        ("analysis.theorems", ["--epsilon", "inf"], "--epsilon"),
        # seeds and instances
        ("analysis.variance", ["--seed", "-1"], "--seed: must be an integer >= 0"),
        ("analysis.microworld", ["estimators", "--seed", "-3"], "--seed"),
        ("analysis.microworld", ["estimators", "--instance", "-1"], "--instance"),
        ("analysis.theorems", ["--seed", "-1"], "--seed"),
        ("pbscale.regress", ["--seed", "-1"], "--seed"),
        ("pbscale.regress", ["--data-seed", "-1"], "--data-seed"),
        # lists and counts
        ("analysis.regression", ["--ns", "2,x"], "--ns"),
        ("analysis.regression", ["--ns", "0,10"], "--ns"),
        ("analysis.regression", ["--ns", ""], "--ns"),
        ("analysis.regression", ["--seeds", "0"], "--seeds"),
        ("analysis.regression", ["--seeds", "two"], "--seeds"),
        ("analysis.variance", ["--steps", "-1"], "--steps"),
        ("analysis.microworld", ["estimators", "--steps", "0"], "--steps"),
        ("analysis.counterexamples", ["--iters", "0"], "--iters"),
        ("benchmarks.bench_microworld", ["--steps", "0"], "--steps"),
        ("benchmarks.bench_microworld", ["--repeats", "0"], "--repeats"),
        ("benchmarks.bench_microworld", ["--bogus"], "unrecognized arguments"),
        ("benchmarks.bench_pbscale", ["--ns", "1"], "n >= 2"),
        ("benchmarks.bench_pbscale", ["--bogus"], "unrecognized arguments"),
        ("benchmarks.bench_closed_form", ["--bogus"], "unrecognized arguments"),
        ("benchmarks.bench_variance", ["--bogus"], "unrecognized arguments"),
        # a --table that is not text
        ("analysis.variance", ["--table", str(binary)], "not a text file"),
        # sizes beyond what the method handles
        ("analysis.arms_table", ["--n", "40"], "goes up to n=20"),
        ("analysis.variance", ["--d", "21", "--method", "closed"], "the limit is d=20"),
        ("analysis.variance", ["--n", "1000001", "--d", "3", "--method", "closed"],
         "accurate up to n=1,000,000"),
        # output paths: a file, under a file, not creatable
        ("analysis.variance", ["--out", str(afile)], "is a file"),
        ("analysis.variance", ["--out", str(afile / "sub")], "lies under the file"),
        ("analysis.variance", ["--figures", str(afile)], "--figures"),
        ("analysis.variance_compare", ["--out", str(afile)], "is a file"),
        ("analysis.microworld", ["estimators", "--out", str(afile)], "is a file"),
        ("analysis.microworld", ["estimators", "--figures", str(afile / "x")], "--figures"),
        ("analysis.counterexamples", ["--out", str(afile)], "is a file"),
        ("analysis.theorems", ["--out", str(afile)], "is a file"),
        ("analysis.arms_table", ["--json", str(tmp)], "is a folder"),
        ("analysis.arms_table", ["--json", str(afile / "t.json")], "is a file, not a folder"),
        ("analysis.regression", ["--collect", "--fig-dir", str(afile)], "is a file"),
        ("pbscale.regress", ["--out", str(afile)], "is a file"),
        ("benchmarks.bench_microworld", ["--out", str(afile)], "is a file"),
        ("analysis.variance", ["--out", "/proc/version/x"], "--out"),
        ("analysis.variance", ["--out", "/proc/pbnn-not-creatable"], "cannot be created"),
    ]


def test_every_bad_input_is_one_line_exit_2_before_any_work(tmp_path, capsys):
    (tmp_path / "a_file").write_text("keep me")
    (tmp_path / "table.bin").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00")
    before = sorted(p.name for p in tmp_path.iterdir())
    for module, argv, words in _bad_cases(tmp_path):
        capsys.readouterr()
        rc = _call(module, argv)
        err = capsys.readouterr().err
        assert rc == 2, (module, argv, rc, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (module, argv, err)
        assert words in lines[0], (module, argv, lines[0])
        assert FORMAT.match(lines[0]), f"not 'error: <problem>; <fix>': {lines[0]}"
    # nothing was computed or written: the folder is as it was, the file untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "a_file").read_text() == "keep me"


def test_exit_codes_of_the_theorems_tool(tmp_path, monkeypatch):
    """2 for bad input, 1 for a failed check, 0 otherwise."""
    import analysis.theorems as th
    from analysis.exact.check_result import CheckResult

    small = ["--instances", "5", "--max-d", "3", "--samples", "2000", "--cor-max-d", "4",
             "--runs", "5", "--no-progress"]
    assert _call("analysis.theorems", ["--max-n", "1", *small]) == 2
    failing = CheckResult("eq:equivalence", "forced failure", "-", 1.0, 0.1, "error", False)
    monkeypatch.setattr(th, "run_all", lambda *a, **k: [failing, *_cor_only()])
    assert _call("analysis.theorems", small) == 1
    passing = CheckResult("eq:equivalence", "forced pass", "-", 0.0, 0.1, "error", True)
    monkeypatch.setattr(th, "run_all", lambda *a, **k: [passing, *_cor_only()])
    assert _call("analysis.theorems", small) == 0


def _cor_only():
    from analysis.exact.bad_generalization_checks import check_cor_mc_bad_gen_2

    return [check_cor_mc_bad_gen_2(4, 0.25)]


def test_runaway_learning_rate_names_its_cause(tmp_path, capsys):
    from analysis.exact.variance import variance_trajectory
    from analysis.microworld.runs import run_exact
    from pbexact.instances import benchmark_table

    # past float32 the command line refuses a rate up front (torch could not take a step)
    argv = ["params", "--d", "3", "--seeds", "2", "--steps", "3", "--lrs", "1e308", "--out",
            str(tmp_path)]
    assert _call("analysis.microworld", argv) == 2
    assert "--lrs: must be at most 3.403e+38" in capsys.readouterr().err
    # below it, a run that diverges names the rate (the API takes any float64)
    J = benchmark_table("exponential", 3, 0)
    with pytest.raises(PBInputError, match="the learning rate 1e\\+308 is too large"):
        run_exact(J, "reinforce", 1, "cosine", lr=1e308, steps=3, seeds=2)

    J = np.random.default_rng(0).normal(size=8) * 1e300
    with pytest.raises(PBInputError, match="the learning rate 1e\\+10 is too large"):
        variance_trajectory(J, 3, steps=50, log_every=10, lr=1e10, method="enumerate")
    with pytest.raises(PBInputError, match="learning rate"):
        variance_trajectory(J, 3, steps=5, lr=float("nan"))


# ---------------------------------------------------- nothing written where the user did not ask


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir()}


def test_tools_write_under_out_only_unless_figures_is_named(tmp_path, monkeypatch):
    figures = ROOT / "figures"
    before = _snapshot(figures)
    monkeypatch.chdir(tmp_path)  # a relative default (results/) lands here, not in the repo
    out = tmp_path / "out"
    assert _call("analysis.variance", ["--d", "3", "--n", "3", "--steps", "4", "--log-every",
                                       "2", "--lr", "0.5", "--out", str(out)]) == 0
    assert _call("analysis.variance_compare", ["--d", "3", "--n", "3", "--steps", "2",
                                               "--draws", "50", "--benchmark", "nnloss",
                                               "--out", str(out)]) == 0
    assert _call("analysis.microworld", ["estimators", "--d", "3", "--seeds", "2", "--steps",
                                         "3", "--out", str(out)]) == 0
    assert _call("analysis.counterexamples", ["--only", "sig_per_temp", "--no-progress"]) == 0
    assert _snapshot(figures) == before  # the committed figures were not touched
    assert (out / "exponential_d3_n3_variance.png").exists()
    assert (out / "microworld_estimators_d3.png").exists()
    assert (tmp_path / "results" / "sig_per_temp.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "results"]
    # --figures DIR adds the copies there
    fig = tmp_path / "fig"
    assert _call("analysis.variance", ["--d", "3", "--n", "3", "--steps", "2", "--benchmark",
                                       "nnloss", "--out", str(tmp_path / "out2"),
                                       "--figures", str(fig)]) == 0
    assert sorted(p.name for p in fig.iterdir()) == ["nnloss_d3_n3_variance.csv",
                                                      "nnloss_d3_n3_variance.png"]


def test_microworld_refuses_to_mix_runs_and_replot_a_mix(tmp_path, capsys):
    out = tmp_path / "res"
    base = ["estimators", "--d", "3", "--seeds", "2", "--out", str(out)]
    assert _call("analysis.microworld", [*base, "--steps", "3"]) == 0
    files = _snapshot(out)
    # another run with other settings on top of it: refused before any work
    capsys.readouterr()
    assert _call("analysis.microworld", [*base, "--steps", "5"]) == 2
    assert "other settings (steps = 3, asked 5)" in capsys.readouterr().err
    assert _snapshot(out) == files
    # the same settings rerun fine, and replot works (steps are not needed to replot)
    assert _call("analysis.microworld", [*base, "--steps", "3"]) == 0
    assert _call("analysis.microworld", [*base, "--replot"]) == 0
    # simulate a run killed after its first CSV on top of an older run with other settings
    other = tmp_path / "other"
    assert _call("analysis.microworld", ["estimators", "--d", "3", "--seeds", "3", "--steps",
                                         "4", "--out", str(other)]) == 0
    for suffix in (".csv", "_settings.json"):
        name = f"microworld_estimators_nnloss_d3{suffix}"
        (out / name).write_bytes((other / name).read_bytes())
    capsys.readouterr()
    assert _call("analysis.microworld", [*base, "--replot"]) == 2
    assert "mixes results of two runs" in capsys.readouterr().err
    # a replot asking for other figure-defining settings is refused too
    assert _call("analysis.microworld", [*base, "--replot", "--instance", "1"]) == 2
    # results without recorded settings (an older version's folder) are refused
    (out / "microworld_estimators_nnloss_d3_settings.json").unlink()
    assert _call("analysis.microworld", [*base, "--replot"]) == 2
    assert _call("analysis.microworld", [*base, "--steps", "3"]) == 2
    # a damaged results CSV is a one-line error
    (other / "microworld_estimators_nnloss_d3.csv").write_text("record,method\ncurve,x\n")
    capsys.readouterr()
    assert _call("analysis.microworld", ["estimators", "--d", "3", "--seeds", "3", "--steps",
                                         "4", "--out", str(other), "--replot"]) == 2
    assert "damaged results file" in capsys.readouterr().err
