"""The front statistic of the claims study (issue 41): fronts as curves
(`analysis.scale.curves`), the gap test (`analysis.scale.gap_test`) and the comparison of two groups
of runs (`analysis.scale.fronts`), each against a known answer or a second computation (a fine grid,
scipy's own t tests, a direct simulation of the test's power)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis.microworld.claims import FAILS, HOLDS, NOISE
from analysis.scale import curves as FC
from analysis.scale import fronts as F
from analysis.scale import gap_test as GT
from analysis.scale.runs import MISSING, Reading, RunRecord

# ------------------------------------------------------------------------ fronts as curves

REM = np.array([0.01, 0.1, 0.05, 0.5, 0.2])
ACC = np.array([0.5, 0.9, 0.6, 0.95, 0.85])  # (0.2, 0.85) is dominated by (0.1, 0.9)


def test_interpolated_and_step_fronts_by_hand():
    x = np.array([0.005, 0.01, np.sqrt(0.01 * 0.05), 0.05, 0.2, 0.5, 0.9])
    inter = FC.front_values(REM, ACC, x)
    step = FC.front_values(REM, ACC, x, step=True)
    assert math.isnan(inter[0]) and math.isnan(step[0])  # below the sparsest point
    # halfway in log between (1%, 0.5) and (5%, 0.6); the dominated point is skipped
    assert inter[1:] == pytest.approx([0.5, 0.55, 0.6, 0.9 + 0.05 * math.log(2) / math.log(5),
                                       0.95, 0.95])
    assert step[1:] == pytest.approx([0.5, 0.5, 0.6, 0.9, 0.95, 0.95])
    for s in (False, True):
        v, coef = FC.front_values(REM, ACC, x, step=s, coefficients=True)
        assert np.allclose(coef[1:] @ ACC, v[1:]) and np.allclose(coef[1:].sum(axis=1), 1)
        assert np.all(coef[0] == 0) and np.all(coef[:, 4] == 0)  # nothing below / dominated


def test_points_without_weights_or_numbers_are_no_points():
    rem = np.array([0.0, 0.1, np.nan, 0.3])
    acc = np.array([0.1, 0.8, 0.99, np.nan])
    assert FC.valid_points(rem, acc).tolist() == [False, True, False, False]
    assert FC.front_values(rem, acc, np.array([0.5]))[0] == 0.8


def test_exact_range_mean_against_a_fine_grid():
    """The exact mean over [lo, hi] in log remaining equals the mean on 200,001 log-spaced
    budgets (within 1e-5: the grid's own error) for interpolated and step fronts."""
    rng = np.random.default_rng(0)
    rem = np.exp(rng.uniform(np.log(0.002), np.log(0.6), (3, 7)))
    acc = rng.uniform(0.2, 0.97, (3, 7))
    lo, hi, ok = FC.common_range(rem, acc, 0.3)
    assert ok and lo < hi
    for step in (False, True):
        exact = FC.range_means(rem, acc, lo, hi, step)
        fine = FC.range_means(rem, acc, lo, hi, step, grid=200_001)
        assert np.allclose(exact, fine, atol=1e-5), step
    coarse = FC.range_means(rem, acc, lo, hi, grid=3)  # the grid reading: three budgets
    xs = np.geomspace(lo, hi, 3)
    assert np.allclose(coarse, FC.front_values(rem, acc, xs[None]).mean(axis=1))


def test_range_weights_reproduce_the_means():
    rng = np.random.default_rng(1)
    rem = np.exp(rng.uniform(np.log(0.002), np.log(0.6), (4, 6)))
    acc = rng.uniform(0.2, 0.97, (4, 6))
    lo, hi, _ = FC.common_range(rem, acc, 0.3)
    for step in (False, True):
        means, w = FC.range_means(rem, acc, lo, hi, step, weights=True)
        assert np.allclose((w * acc).sum(axis=1), means) and np.allclose(w.sum(axis=1), 1)


def test_common_range_floor_and_a_front_without_a_useful_point():
    rem = np.array([[0.01, 0.05, 0.3], [0.02, 0.1, 0.4]])
    acc = np.array([[0.2, 0.8, 0.9], [0.35, 0.85, 0.92]])
    lo, hi, ok = FC.common_range(rem, acc, 0.3)
    assert (lo, hi, ok) == (pytest.approx(0.05), pytest.approx(0.4), True)
    lo5, _, _ = FC.common_range(rem, acc, 0.5)
    assert lo5 == pytest.approx(0.1)
    # a third front below the floor everywhere, sparsest point 20%: the range starts there
    rem3 = np.vstack([rem, [0.2, 0.3, 0.5]])
    acc3 = np.vstack([acc, [0.11, 0.12, 0.13]])
    assert FC.common_range(rem3, acc3, 0.3)[0] == pytest.approx(0.2)


# ------------------------------------------------------------------------------ the test


def test_paired_and_welch_intervals_are_scipys():
    rng = np.random.default_rng(2)
    a, b = rng.normal(0.9, 0.01, 5), rng.normal(0.88, 0.02, 5)
    t = GT.paired(a - b)
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert (t.low, t.high) == (pytest.approx(ci.low), pytest.approx(ci.high)) and t.df == 4
    w = GT.welch(a, b[:4])
    ci = stats.ttest_ind(a, b[:4], equal_var=False).confidence_interval(0.95)
    assert (w.low, w.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    # vectorized: rows are studies
    many = GT.paired(np.vstack([a - b, b - a]))
    assert many.mean.tolist() == pytest.approx([t.mean, -t.mean])


@pytest.mark.parametrize("mean, half, much, want", [
    (0.05, 0.01, False, HOLDS), (-0.05, 0.01, False, FAILS), (0.005, 0.01, False, NOISE),
    (0.05, 0.01, True, HOLDS), (0.025, 0.01, True, NOISE), (0.005, 0.004, True, FAILS),
    (-0.05, 0.01, True, FAILS)])
def test_outcome_of_the_interval(mean, half, much, want):
    se = half / float(GT.t_quantile(math.inf))
    assert GT.outcome(GT.modelled(mean, se, math.inf), much) == want


@pytest.mark.parametrize("df, k", [(4.0, 5), (2.0, 3), (math.inf, 5)])
def test_the_detectable_gap_has_the_stated_power(df, k):
    """The gap a study states from the median estimated s.e. (sigma 1, K seeds) is the one
    the noncentral t gives for the true sigma; simulated paired studies (40,000: the
    simulation's s.e. of a power near 0.8 is 0.002) at that gap read holds in 80% of them
    (within 0.01, 5 s.e.). With df inf the s.e. is known: the normal test."""
    rng = np.random.default_rng(3)
    n = 40_000
    if math.isfinite(df):
        se_med = GT._median_ratio(df) / math.sqrt(k)  # noqa: SLF001 - the median estimated s.e.
        gap = GT.detectable(GT.GapTest(0.0, se_med, df, "paired"))
        assert gap == pytest.approx(GT._noncentrality(df, 0.95, 0.8) / math.sqrt(k))  # noqa: SLF001
        d = rng.normal(gap, 1.0, (n, k))
        test = GT.paired(d)
    else:
        gap = GT.detectable(GT.modelled(0.0, 1 / math.sqrt(k), df))
        assert gap == pytest.approx((stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) / math.sqrt(k))
        test = GT.modelled(rng.normal(gap, 1 / math.sqrt(k), n), 1 / math.sqrt(k), df)
    power = np.mean(GT.outcome(test) == HOLDS)
    assert power == pytest.approx(0.8, abs=0.01)
    much = GT.detectable(GT.modelled(0.0, 0.01, math.inf), much=True)
    assert much == pytest.approx(GT.MUCH_ACC + 0.01 * 2.8016, abs=1e-4)


# ------------------------------------------------------------------------ two groups of runs

SIZES = {"fc1": 100}


def run(method, seed, rem, acc, lam, **settings):
    return RunRecord("supermask", method, {"model": "lenet", "epochs": 4, "lam": lam,
                                           **settings}, seed, rem, acc, {"fc1": rem}, SIZES)


def diverged(method, seed, lam, **settings):
    return RunRecord("supermask", method, {"model": "lenet", "epochs": 4, "lam": lam,
                                           **settings}, seed,
                     diverged={"epoch": 3, "step": 1301, "where": "mask logits",
                               "reason": "nan", "last_metrics": {}})


def line_front(method, seeds, shift, per_seed, rems=(0.01, 0.1), **settings):
    """Two settings per seed on the line acc = 0.8 + 0.05 log10(r / 0.01) + shift +
    per_seed[seed]: each seed's interpolated front is that line, so its mean over [1%, 10%] in
    log remaining is 0.825 + shift + per_seed[seed]."""
    out = []
    for s in seeds:
        for i, r in enumerate(rems):
            out.append(run(method, s, r, 0.8 + 0.05 * math.log10(r / 0.01) + shift + per_seed[s],
                           10.0 ** -i, **settings))
    return out


def test_paired_gap_of_per_seed_fronts_by_hand():
    da = {0: 0.0, 1: 0.004, 2: -0.002, 3: 0.001, 4: 0.003}
    db = {0: 0.001, 1: -0.003, 2: 0.0, 3: 0.002, 4: -0.001}
    a = line_front("cp", range(5), 0.01, da)
    b = line_front("arms", range(5), 0.0, db, n=2)
    g = F.front_gap(a, b, "A", "B")
    d = np.array([0.01 + da[s] - db[s] for s in range(5)])
    assert (g.lo, g.hi) == (pytest.approx(0.01), pytest.approx(0.1))
    assert g.per_seed == pytest.approx(dict(enumerate(d)))
    ci = stats.ttest_1samp(d, 0).confidence_interval(0.95)
    assert (g.test.low, g.test.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    v = F.better_front(a, b, "A", "B")
    assert v.outcome == HOLDS and "paired over seeds 0-4" in v.detail
    assert v.values["ci_low"] == pytest.approx(ci.low)
    # unpaired: Welch over the two groups' per-seed means
    w = F.front_gap(a, b, "A", "B", reading=Reading(pooled=True))
    ma = np.array([0.835 + da[s] for s in range(5)])
    mb = np.array([0.825 + db[s] for s in range(5)])
    ci = stats.ttest_ind(ma, mb, equal_var=False).confidence_interval(0.95)
    assert (w.test.low, w.test.high) == (pytest.approx(ci.low), pytest.approx(ci.high))


def test_noise_states_the_detectable_gap_and_much_needs_the_interval_above_002():
    noise = {0: 0.0, 1: 0.03, 2: -0.03, 3: 0.02, 4: -0.02}
    zero = dict.fromkeys(range(5), 0.0)
    a = line_front("cp", range(5), 0.005, noise)
    b = line_front("arms", range(5), 0.0, zero, n=2)
    v = F.better_front(a, b, "A", "B")
    assert v.outcome == NOISE and v.values["detectable"] > 0.005
    assert f"a gap under {v.values['detectable']:.4f} could not be told" in v.detail
    small = line_front("cp", range(5), 0.01, {s: 1e-4 * s for s in range(5)})
    assert F.better_front(small, b, "A", "B").outcome == HOLDS
    assert F.better_front(small, b, "A", "B", much=True).outcome == FAILS  # clearly below 0.02
    big = line_front("cp", range(5), 0.05, {s: 1e-4 * s for s in range(5)})
    assert F.better_front(big, b, "A", "B", much=True).outcome == HOLDS


def test_one_seed_design_models_the_se_from_the_settings_the_gap_reads():
    """One setting per side (A 0.9 at 10% with seeds 0-2 of s.d. 0.01 ... B 0.8, one seed):
    the gap is the means' difference, its s.e. sigma sqrt(1/3 + 1/1) with sigma the pooled s.d.
    of the settings the gap reads (A's only), df 2: the s.d. over MODEL_DRAWS = 400 draws of the
    means (an s.d. from 400 normal draws is within 3.5% of the true one at 1 s.e.; 15% allowed).
    A noisy setting outside the range (B at 0.5% with accuracy 0.2 and 0.25: below the floor)
    leaves the s.d. and df as they were."""
    a = [run("cp", s, 0.1, x, 1.0) for s, x in enumerate((0.89, 0.90, 0.91))]
    b = [run("arms", 0, 0.1, 0.8, 1.0, n=2)]
    g = F.front_gap(a, b, "A", "B")
    assert g.mean == pytest.approx(0.1) and g.test.how == "model" and g.test.df == 2
    assert g.test.se == pytest.approx(0.01 * math.sqrt(1 / 3 + 1), rel=0.15)
    outside = b + [run("arms", s, 0.005, x, 2.0, n=2) for s, x in ((0, 0.2), (1, 0.25))]
    g2 = F.front_gap(a, outside, "A", "B")
    assert g2.mean == pytest.approx(g.mean) and g2.test.df == g.test.df
    assert g2.test.se == pytest.approx(g.test.se, rel=0.05)  # other draws, the same model
    # no setting the gap reads has two seeds: the experiment's settings inside the range
    single = [run("cp", 0, 0.1, 0.9, 1.0)]
    pool = single + b + [run("gmp", s, 0.1, 0.9 + 0.02 * s, 0.0, target=0.1) for s in range(2)]
    g3 = F.front_gap(single, b, "A", "B", pool=pool)
    assert g3.test.se == pytest.approx(0.02 / math.sqrt(2) * math.sqrt(2), rel=0.15)
    assert g3.test.df == 1 and "1 setting of the experiment inside the range" in g3.text
    g4 = F.front_gap(single, b, "A", "B")
    assert g4.test.se == pytest.approx(F.FALLBACK_SD * math.sqrt(2), rel=0.15)
    assert g4.test.df == math.inf


def test_one_seed_se_sees_a_front_point_that_changes():
    """Two A settings at the same remaining fraction, accuracies 0.90 and 0.90 (one seed each,
    sigma 0.01 from a replicated B setting): the front takes the better of two noisy means, so
    the gap's s.e. is that of a maximum of two normals, sqrt(1 - 1/pi) sigma for A (0.825
    sigma), not the linear propagation's; with B's mean of 3 seeds the s.e. is
    sigma sqrt(1 - 1/pi + 1/3) = 0.998 sigma (400 draws: 15%)."""
    a = [run("cp", 0, 0.1, 0.9, 1.0), run("cp", 0, 0.1, 0.9, 2.0)]
    b = [run("arms", s, 0.1, x, 1.0, n=2) for s, x in enumerate((0.79, 0.80, 0.81))]
    g = F.front_gap(a, b, "A", "B")
    assert g.test.se == pytest.approx(0.01 * math.sqrt(1 - 1 / math.pi + 1 / 3), rel=0.15)


def test_a_seed_with_a_diverged_run_stays_complete_and_is_counted():
    """Seeds 2 and 3 of B's sparse setting diverged, seed 1's stalled: B's complete seeds are
    still 0-4 (a diverged run is an outcome, not a missing run), and the detail counts them."""
    zero = dict.fromkeys(range(5), 0.0)
    a = line_front("cp", range(5), 0.02, zero)
    b = [r for r in line_front("arms", range(5), 0.0, zero, n=2)
         if not (r.seed in (1, 2, 3) and r.get("lam") == 1.0)]
    b += [diverged("arms", s, 1.0, n=2) for s in (2, 3)]
    b.append(run("arms", 1, 0.01, 0.11, 1.0, n=2))
    g = F.front_gap(a, b, "A", "B")
    assert sorted(g.per_seed) == [0, 1, 2, 3, 4]
    assert "arms n=2 lam 1: 2 of 5 seeds diverged, 1 stalled" in g.text
    # without the records the seeds would not be complete: only 0, 1 and 4 pair
    g2 = F.front_gap(a, [r for r in b if r.diverged is None], "A", "B")
    assert sorted(g2.per_seed) == [0, 1, 4]


def test_missing_sides_read_no_data():
    zero = dict.fromkeys(range(3), 0.0)
    a = line_front("cp", range(3), 0.0, zero)
    weak = [run("arms", s, 0.1, 0.2, 1.0, n=2) for s in range(3)]
    assert F.better_front(a, weak, "A", "B").outcome == MISSING
    assert F.better_front(a, [], "A", "B").outcome == MISSING
    assert F.better_front(a, [diverged("arms", 0, 1.0, n=2)], "A", "B").outcome == MISSING
