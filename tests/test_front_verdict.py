"""The front comparison every verdict comes from (issue 49, `analysis.compare_fronts`): its
pieces against hand computations (values between runs, fronts chosen on held-out seeds, the
interval and the allowance), the comparison of two groups of runs (`analysis.scale.fronts`), the
detectable gap's power by a direct simulation, and the mutants the issue names (flat
extrapolation, the best-of-several front) caught on calibration cells built for them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

import analysis
from analysis.microworld.claims import FAILS, HOLDS, NOISE
from analysis.scale import calibration as C
from analysis.scale import front_verdict as V
from analysis.scale import fronts as F
from analysis.scale import gap_test as GT
from analysis.scale.runs import CANNOT_TELL, MISSING, Reading, RunRecord

# ------------------------------------------------------------------ compare_fronts on arrays

GRID = np.array([0.002, 0.005, 0.02, 0.05, 0.2])


def line(r: np.ndarray) -> np.ndarray:
    """A front straight in log remaining: 0.8 + 0.05 log10(r / 1%)."""
    return 0.8 + 0.05 * np.log10(r / 0.01)


def seeds_of(rem: np.ndarray, f, shift: float, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r = np.broadcast_to(rem, noise.shape).copy()
    return r, f(r) + shift + noise


def test_compare_fronts_is_the_package_entry():
    assert analysis.compare_fronts is V.compare_fronts
    assert analysis.FrontComparison is V.FrontComparison


def test_runs_at_the_same_budgets_need_no_allowance_and_the_interval_is_the_paired_t():
    """Both sides at the same remaining fractions on every seed: every budget is a run of each,
    so the allowance is 0 and the interval is the paired t interval of the per-seed mean gaps
    (scipy's ttest_1samp)."""
    rng = np.random.default_rng(0)
    ra, aa = seeds_of(GRID, line, 0.03, 0.003 * rng.standard_normal((5, 5)))
    rb, ab = seeds_of(GRID, line, 0.0, 0.003 * rng.standard_normal((5, 5)))
    c = analysis.compare_fronts(ra, aa, rb, ab)
    d = (aa - ab).mean(axis=1)
    ci = stats.ttest_1samp(d, 0).confidence_interval(0.95)
    assert c.allowance == 0 and c.n_budgets == 5
    assert c.gap == pytest.approx(d.mean())
    assert c.ci == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert c.verdict == HOLDS and c.per_seed == pytest.approx(tuple(d))
    assert c.budgets == (pytest.approx(0.002), pytest.approx(0.2))
    assert c.p_value == pytest.approx(2 * stats.t(4).sf(d.mean() / (d.std(ddof=1) / math.sqrt(5))))
    assert analysis.compare_fronts(rb, ab, ra, aa).verdict == FAILS
    assert analysis.compare_fronts(ra, aa, rb, ab, much=True).verdict == HOLDS  # 0.03 > 0.02
    assert analysis.compare_fronts(ra, aa - 0.02, rb, ab, much=True).verdict == FAILS


def test_a_side_between_runs_is_read_through_parabolas_with_their_disagreement_allowed():
    """On a parabola in log remaining both parabolas are the curve: the value is exact and the
    allowance 0 where there are two; in the first interval only one: exact, with SAFETY times
    its departure from the line allowed. On a cubic they differ: the value is their mean, the
    allowance SAFETY times half their difference, and the true curve lies within it; a run
    beside an end of the interval (closer than SEPARATION widths) is not a parabola's third
    point; with no third run the allowance is inf (the budget is dropped)."""
    x = np.log(np.array([0.001, 0.004, 0.016, 0.064, 0.256]))
    q = np.log(np.array([0.002, 0.03]))
    quad = 0.9 - 0.01 * (x + 2) ** 2
    v, e = V._values(V._Side(x, quad), q, 3.0)  # noqa: SLF001 - the pieces, tested alone
    assert v == pytest.approx(0.9 - 0.01 * (q + 2) ** 2, abs=1e-12)
    t = (q[0] - x[0]) / (x[1] - x[0])
    assert e == pytest.approx([3.0 * abs(v[0] - (quad[0] + t * (quad[1] - quad[0]))), 0.0],
                              abs=1e-12)
    cubic = 0.5 + 0.002 * (x + 8) ** 3
    v, e = V._values(V._Side(x, cubic), q[1:], 3.0)  # noqa: SLF001
    left = V._parabola(x[1], x[2], x[3], cubic[1], cubic[2], cubic[3], q[1])  # noqa: SLF001
    right = V._parabola(x[2], x[3], x[4], cubic[2], cubic[3], cubic[4], q[1])  # noqa: SLF001
    assert v[0] == pytest.approx((left + right) / 2)
    assert e[0] == pytest.approx(1.5 * abs(left - right))
    assert abs(0.5 + 0.002 * (q[1] + 8) ** 3 - v[0]) <= e[0]
    near = np.log(np.array([0.0155, 0.016, 0.064]))  # 1.55% beside 1.6%: no parabola
    _, e = V._values(V._Side(near, np.array([0.5, 0.6, 0.7])), np.log(np.array([0.03])), 3.0)  # noqa: SLF001
    assert e[0] == math.inf
    runs = V._Side(x, quad)  # noqa: SLF001
    v, e = V._values(runs, x[2:3], 3.0)  # noqa: SLF001
    assert (v[0], e[0]) == (quad[2], 0.0)


def test_fronts_are_chosen_on_the_other_seeds_medians():
    """Setting 0 beats setting 1 only on seed 0 (0.9 there, 0.5 elsewhere): seed 0's front is
    chosen on seeds 1 and 2, where setting 1 (sparser, 0.6) beats it, so seed 0's lucky run is
    not read; seeds 1 and 2 keep both. A setting whose median is below the floor is on no
    front."""
    x = np.log(np.array([[0.05, 0.04, 0.3]] * 3))
    acc = np.array([[0.9, 0.6, 0.2], [0.5, 0.6, 0.2], [0.5, 0.6, 0.25]])
    on, mx, ma = V.held_out_fronts(x, acc, 0.3)
    assert on.tolist() == [[False, True, False], [True, True, False], [True, True, False]]
    assert ma[0].tolist() == pytest.approx([0.5, 0.6, 0.225])
    assert ma[1].tolist() == pytest.approx([0.7, 0.6, 0.225])
    nan = acc.copy()
    nan[1, 0] = np.nan  # a diverged run: no part of any median
    on, _, ma = V.held_out_fronts(x, nan, 0.3)
    assert ma[0, 0] == 0.5 and ma[2, 0] == pytest.approx(0.9)


def test_fronts_that_share_no_budget_or_have_one_seed_cannot_tell():
    rng = np.random.default_rng(1)
    noise = 0.003 * rng.standard_normal((2, 5, 3))
    ra, aa = seeds_of(np.array([0.001, 0.003, 0.01]), line, 0.0, noise[0])
    rb, ab = seeds_of(np.array([0.05, 0.2, 0.5]), line, 0.0, noise[1])
    c = analysis.compare_fronts(ra, aa, rb, ab)  # A sparser and less accurate: no bound decides
    assert c.verdict == CANNOT_TELL and not c.judged and "share no budget" in c.reason
    c = analysis.compare_fronts(ra[:1], aa[:1], ra, aa)
    assert c.verdict == CANNOT_TELL and "two or more seeds" in c.reason
    with pytest.raises(ValueError, match="one shape"):
        analysis.compare_fronts(ra, aa[:, :2], rb, ab)


def test_stalled_runs_are_no_points_and_grids_a_decade_apart_cannot_tell_a_bent_front():
    """A knee measured at 0.2%, 2% and 20% on one side and at 0.6% and 6% on the other: the
    parabolas disagree by more than the seeds decide, so the verdict is cannot tell although the
    point estimate is far from 0; a run at chance (0.1) on a chosen setting is left out of its
    seed's front rather than read as the front."""
    rng = np.random.default_rng(2)
    ra, aa = seeds_of(np.array([0.002, 0.02, 0.2]), C.CURVES["knee"], 0.0,
                      0.002 * rng.standard_normal((5, 3)))
    rb, ab = seeds_of(np.array([0.0006, 0.006, 0.06]), C.CURVES["knee"], 0.0,
                      0.002 * rng.standard_normal((5, 3)))
    c = analysis.compare_fronts(ra, aa, rb, ab)
    assert c.verdict == CANNOT_TELL and c.allowance > 0.01
    stalled = aa.copy()
    stalled[0, 1] = 0.1
    sides = V._sides(ra, stalled, 0.3)  # noqa: SLF001
    assert sides[0].x.size == 2 and sides[1].x.size == 3


def test_unpaired_sides_take_every_pair_of_seeds():
    """Three seeds against five (not paired): the gap is the mean over the 15 pairs, its s.e.
    the two-sample one from A's row means and B's column means, Welch's df."""
    rng = np.random.default_rng(3)
    ra, aa = seeds_of(GRID, line, 0.02, 0.003 * rng.standard_normal((3, 5)))
    rb, ab = seeds_of(GRID, line, 0.0, 0.003 * rng.standard_normal((5, 5)))
    c = analysis.compare_fronts(ra, aa, rb, ab)
    table = aa.mean(axis=1)[:, None] - ab.mean(axis=1)[None, :]
    ga, gb = table.mean(axis=1), table.mean(axis=0)
    se = math.sqrt(ga.var(ddof=1) / 3 + gb.var(ddof=1) / 5)
    assert c.gap == pytest.approx(table.mean()) and c.test.se == pytest.approx(se)
    assert c.test.how == "unpaired, 3 x 5 seeds" and c.per_seed == ()
    ci = stats.ttest_ind(aa.mean(axis=1), ab.mean(axis=1), equal_var=False).confidence_interval()
    assert (c.ci[0], c.ci[1]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    same = analysis.compare_fronts(rb, ab + 0.02, rb, ab, paired=False)
    assert same.test.how == "unpaired, 5 x 5 seeds"


@pytest.mark.parametrize("df, k", [(4.0, 5), (2.0, 3), (math.inf, 5)])
def test_the_detectable_gap_has_the_stated_power(df, k):
    """The gap stated from the median estimated s.e. (sigma 1, K seeds) is the noncentral t's for
    the true sigma: simulated paired studies (40,000; s.e. of a power near 0.8: 0.002) at that
    gap have their t interval above 0 in 80% of them (within 0.01). df inf: the normal test."""
    rng = np.random.default_rng(3)
    n = 40_000
    if math.isfinite(df):
        se_med = GT._median_ratio(df) / math.sqrt(k)  # noqa: SLF001 - the median estimated s.e.
        gap = GT.detectable(GT.GapTest(0.0, se_med, df, "paired"))
        assert gap == pytest.approx(GT._noncentrality(df, 0.95, 0.8) / math.sqrt(k))  # noqa: SLF001
        d = rng.normal(gap, 1.0, (n, k))
        low = d.mean(axis=1) - GT.t_quantile(df) * d.std(axis=1, ddof=1) / math.sqrt(k)
    else:
        gap = GT.detectable(GT.GapTest(0.0, 1 / math.sqrt(k), df, "model"))
        assert gap == pytest.approx((stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) / math.sqrt(k))
        low = rng.normal(gap, 1 / math.sqrt(k), n) - GT.t_quantile(df) / math.sqrt(k)
    assert np.mean(low > 0) == pytest.approx(0.8, abs=0.01)
    much = GT.detectable(GT.GapTest(0.0, 0.01, math.inf, "model"), much=True)
    assert much == pytest.approx(GT.MUCH_ACC + 0.01 * 2.8016, abs=1e-4)


# ---------------------------------------------------------- the mutants the issue names

def _cell(name: str, curve: str) -> C.Cell:
    return next(c for c in C.synthetic_cells() if c.name == name and c.curve == curve)


def _flat_overlap(sa, sb):
    """The old range: from the larger sparsest point to the LARGER densest one."""
    return max(sa.x[0], sb.x[0]), max(sa.x[-1], sb.x[-1])


def test_flat_extrapolation_brought_back_is_caught(monkeypatch):
    """Two settings (1%, 10%) against ten (0.3%..40%) on a front that keeps rising: compared only
    where both have runs, false verdicts stay under 5%; with the old range (flat beyond the
    sparser side's densest run, no allowance there) the few side reads fails nearly always."""
    cell = _cell("few vs many", "power rise")
    real = C.rates(cell, 200, 0)
    assert real.false_holds <= 0.05 and real.false_fails <= 0.05
    values = V._values  # noqa: SLF001

    def flat_values(side, q, safety):
        inside = (q >= side.x[0]) & (q <= side.x[-1])
        v, e = values(side, np.clip(q, side.x[0], side.x[-1]), safety)
        return np.where(inside, v, side.a[-1]), np.where(inside, e, 0.0)

    monkeypatch.setattr(V, "_overlap", _flat_overlap)
    monkeypatch.setattr(V, "_values", flat_values)
    mutant = C.rates(cell, 200, 0)
    assert mutant.false_fails > 0.5


def test_the_best_of_several_front_brought_back_is_caught(monkeypatch):
    """Three runs of every setting against one (all on one curve): fronts chosen on other seeds
    keep false holds under 5%; a front chosen on the seed it is measured with (the best of
    three noisy runs) reads holds far more often."""
    cell = _cell("best of three vs one", "power rise")
    real = C.rates(cell, 200, 0)
    assert real.false_holds <= 0.05
    held_out = V.held_out_fronts

    def in_sample(x, acc, floor):
        _, mx, ma = held_out(x, acc, floor)
        good = np.isfinite(x) & np.isfinite(acc) & (acc >= floor)
        xi, xj, ai, aj = x[:, :, None], x[:, None, :], acc[:, :, None], acc[:, None, :]
        with np.errstate(invalid="ignore"):
            beats = (good[:, :, None] & good[:, None, :] & (xi <= xj) & (ai >= aj)
                     & ((xi < xj) | (ai > aj)))
        return good & ~beats.any(axis=1), mx, ma

    monkeypatch.setattr(V, "held_out_fronts", in_sample)
    mutant = C.rates(cell, 200, 0)
    assert mutant.false_holds > 0.08


# ------------------------------------------------------------------ two groups of runs

SIZES = {"fc1": 100}


def run(method, seed, rem, acc, lam, **settings):
    return RunRecord("supermask", method, {"model": "lenet", "epochs": 4, "lam": lam,
                                           **settings}, seed, rem, acc, {"fc1": rem}, SIZES)


def diverged(method, seed, lam, **settings):
    return RunRecord("supermask", method, {"model": "lenet", "epochs": 4, "lam": lam,
                                           **settings}, seed,
                     diverged={"epoch": 3, "step": 1301, "where": "mask logits",
                               "reason": "nan", "last_metrics": {}})


def line_runs(method, seeds, shift, per_seed, rems=tuple(GRID), **settings):
    """One run per setting and seed on :func:`line`, plus shift and a per-seed offset."""
    return [run(method, s, r, float(line(np.array(r))) + shift + per_seed[s], 10.0 ** -i,
                **settings) for s in seeds for i, r in enumerate(rems)]


def test_groups_of_runs_compare_by_seed_and_say_how():
    da = {0: 0.0, 1: 0.004, 2: -0.002, 3: 0.001, 4: 0.003}
    db = {0: 0.001, 1: -0.003, 2: 0.0, 3: 0.002, 4: -0.001}
    a = line_runs("cp", range(5), 0.01, da)
    b = line_runs("arms", range(5), 0.0, db, n=2)
    c, text = F.front_gap(a, b, "A", "B")
    d = np.array([0.01 + da[s] - db[s] for s in range(5)])
    ci = stats.ttest_1samp(d, 0).confidence_interval(0.95)
    assert c.ci == (pytest.approx(ci.low), pytest.approx(ci.high)) and c.allowance == 0
    v = F.better_front(a, b, "A", "B")
    assert v.outcome == HOLDS and "paired over seeds 0-4" in v.detail
    assert v.values["ci_low"] == pytest.approx(ci.low) and v.values["p_value"] < 0.05
    w, _ = F.front_gap(a, b, "A", "B", reading=Reading(pooled=True))
    assert w.test.how == "unpaired, 5 x 5 seeds"
    noisy = line_runs("cp", range(5), 0.005, {0: 0.0, 1: 0.03, 2: -0.03, 3: 0.02, 4: -0.02})
    v = F.better_front(noisy, b, "A", "B")
    assert v.outcome == NOISE and f"a gap under {v.values['detectable']:.4f}" in v.detail


def test_a_diverged_run_is_no_point_and_is_counted():
    """Seeds 2 and 3 of B's sparsest setting diverged, seed 1's stalled: those seeds' fronts lack
    the run, every seed still pairs, and the words count them."""
    zero = dict.fromkeys(range(5), 0.0)
    a = line_runs("cp", range(5), 0.02, zero)
    b = [r for r in line_runs("arms", range(5), 0.0, zero, n=2)
         if not (r.seed in (1, 2, 3) and r.get("lam") == 1.0)]
    b += [diverged("arms", s, 1.0, n=2) for s in (2, 3)]
    b.append(run("arms", 1, 0.002, 0.11, 1.0, n=2))
    c, text = F.front_gap(a, b, "A", "B")
    assert sum(d == d for d in c.per_seed) == 5
    assert "arms n=2 lam 1: 2 of 5 seeds diverged, 1 stalled" in text


def test_missing_sides_read_no_data():
    zero = dict.fromkeys(range(3), 0.0)
    a = line_runs("cp", range(3), 0.0, zero)
    weak = [run("arms", s, 0.1, 0.2, 1.0, n=2) for s in range(3)]
    assert F.better_front(a, weak, "A", "B").outcome == MISSING
    assert F.better_front(a, [], "A", "B").outcome == MISSING
    assert F.better_front(a, [diverged("arms", 0, 1.0, n=2)], "A", "B").outcome == MISSING


def test_a_sparser_front_that_is_more_accurate_decides_one_way_only():
    """Fronts that share no budget: A's at 1-3%, B's at 20-50%. Where A is the more accurate
    (by 0.1, seed noise 0.01) A's densest setting's run bounds its front at B's budgets from
    below and B's best run bounds B's from above: holds, and the same fronts swapped fail; the
    interval is one-sided and nothing is interpolated. Where A is only level (by 0.005, within
    the noise), nothing decides: cannot tell. On a flat true curve (the case most favourable to
    a false verdict: the sparser side loses nothing) with A and B equal, 1000 studies give at
    most 2.5% + 3 s.e. holds (0.1% here); a mutant that takes A's best run of the seed (chosen
    on the noise it is measured with) against B's mean reads holds in about 10%."""
    from analysis.scale import front_verdict as FV

    rng = np.random.default_rng(5)
    ra = np.tile([0.01, 0.02, 0.03], (5, 1))
    rb = np.tile([0.2, 0.35, 0.5], (5, 1))

    def study(lead: float) -> tuple:
        aa = 0.8 + lead + 0.01 * rng.standard_normal((5, 3))
        ab = 0.8 + 0.01 * rng.standard_normal((5, 3))
        return ra, aa, rb, ab

    ra_, aa, rb_, ab = study(0.1)
    c = analysis.compare_fronts(ra_, aa, rb_, ab)
    assert c.verdict == HOLDS and c.judged and c.allowance == 0.0 and c.ci[1] == math.inf
    assert "fewer remaining weights" in c.reason and 0.07 < c.gap < 0.13
    assert analysis.compare_fronts(rb_, ab, ra_, aa).verdict == FAILS
    assert analysis.compare_fronts(*study(0.005)).verdict == CANNOT_TELL
    limit = 25 + 3 * math.sqrt(1000 * 0.025 * 0.975)
    holds = sum(analysis.compare_fronts(*study(0.0)).verdict == HOLDS for _ in range(1000))
    assert holds <= limit, holds

    def best_of_seed(rem, acc, floor):  # the mutant: (best of the seed's runs, mean of them)
        return acc.max(axis=1), acc.mean(axis=1)

    orig = FV._reach  # noqa: SLF001
    try:
        FV._reach = best_of_seed  # noqa: SLF001
        bad = sum(analysis.compare_fronts(*study(0.0)).verdict == HOLDS for _ in range(1000))
    finally:
        FV._reach = orig  # noqa: SLF001
    assert bad > limit, bad
