"""Issue 10 (hardening): no code runs from a loaded file, nothing is written outside --out, every
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

from pbexact import io as pio
from pbexact.errors import PBInputError
from pbscale import io, regress
from pbscale import methods as M
from pbscale.regression import make_problem

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
    folder = regress.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                           problem=prob)
    (folder / "summary.json").unlink()  # so that the next call resumes from the checkpoint
    marker = tmp_path / "pwned"
    with open(folder / "checkpoint.pt", "wb") as fh:
        torch.save({"trainer": _Boom(str(marker)), "history": [], "epoch": 0}, fh)
    with pytest.raises(PBInputError, match="damaged checkpoint .*delete the run folder"):
        regress.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False, problem=prob)
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
        folder = regress.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                               problem=prob)
        state = torch.load(folder / "checkpoint.pt", weights_only=True)
        assert state["epoch"] == 1 and state["trainer"]["generator"].dtype == torch.uint8


@pytest.mark.parametrize("damage", ["truncated", "empty", "random", "wrong_key", "folder",
                                    "bad_history"])
def test_damaged_checkpoint_is_a_one_line_error(tmp_path, damage, capsys):
    prob = tiny_problem()
    cfg = M.MethodConfig(method="loorf", n=2)
    folder = regress.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
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
        torch.save({**state, "trainer": {"r": torch.zeros(2)}}, ckpt)
    else:
        ckpt.unlink()
        ckpt.mkdir()
    with pytest.raises(PBInputError, match=r"checkpoint.pt.*delete the run folder or choose"):
        regress.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False, problem=prob)


@pytest.mark.parametrize("name", ["config.json", "summary.json"])
@pytest.mark.parametrize("damage", ["truncated", "folder", "binary"])
def test_damaged_json_run_files_exit_2(tmp_path, name, damage, capsys, monkeypatch):
    prob = tiny_problem()
    monkeypatch.setattr(regress, "make_problem", lambda *a, **k: prob)
    args = ["--method", "loorf", "--n", "2", "--epochs", "1", "--out", str(tmp_path),
            "--device", "cpu", "--quiet"]
    assert regress.main(args) == 0
    folder = tmp_path / regress.run_name(M.MethodConfig(method="loorf", n=2))
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
