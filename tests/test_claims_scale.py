"""The supermask, pruning and NN-regression claims of analysis.scale.claims (SCALE_CLAIMS): each
criterion on synthetic run records where it must hold, where it must fail, and (where it has a
noise band) where the data cannot tell."""

import dataclasses
import math
import zlib

import numpy as np
import pytest

from analysis.microworld.claims import FAILS, HOLDS, NOISE
from analysis.scale import claims as C
from analysis.scale import fronts as F
from analysis.scale import runs as R
from analysis.scale.runs import MISSING, RunRecord
from pbscale.methods import REGISTRY

SIZES = {"fc1": 1000, "fc2": 500, "fc3": 100}
SEEDS = (0, 1, 2)


def claim(key: str) -> C.ScaleClaim:
    return next(c for c in C.SCALE_CLAIMS if c.key == key)


def jitter(sd, *key) -> float:
    """sd times a standard normal draw fixed by key (the method, setting and seed): seed noise
    that differs between methods, the same on every call."""
    return sd * float(np.random.default_rng(zlib.crc32(repr(key).encode())).standard_normal())


def prune(exp, method, remaining, acc, seed=0, layers=None, sd=0.001, **settings):
    """One pruning run; accuracy jittered by seed (a normal draw of s.d. sd fixed by the run)."""
    layers = layers or {k: remaining for k in SIZES}
    acc = acc + jitter(sd, exp, method, sorted(settings.items()), remaining, seed)
    return RunRecord(exp, method, {"model": "lenet", "epochs": 4, **settings}, seed,
                     remaining, acc, dict(layers), dict(SIZES))


def front_runs(exp, method, accs, remainings=(0.5, 0.2, 0.1, 0.05, 0.02, 0.01), seeds=SEEDS,
               layers_of=None, sd=0.001, **settings):
    """One setting per remaining fraction (lam indexes them), each run with every seed."""
    out = []
    for i, (r, a) in enumerate(zip(remainings, accs)):
        for s in seeds:
            layers = layers_of(r) if layers_of else None
            out.append(prune(exp, method, r, a, s, layers, sd, lam=10.0 ** -i, **settings))
    return out


def curve_acc(base, slope=0.02):
    """Accuracies falling with sparsity: base at 50% remaining, slope per halving."""
    rs = (0.5, 0.2, 0.1, 0.05, 0.02, 0.01)
    return [base - slope * math.log2(0.5 / r) for r in rs]


# ----------------------------------------------------------------------- fronts, generic


def test_front_gap_and_better_front_hold_fail_noise():
    a = front_runs("supermask", "arms", curve_acc(0.95), n=2, param="escort")
    b = front_runs("supermask", "loorf", curve_acc(0.93), n=2, param="escort")
    c, _ = F.front_gap(a, b, "A", "B")
    assert c.gap == pytest.approx(0.02, abs=0.002) and len(c.per_seed) == len(SEEDS)
    assert c.allowance == 0  # both sides' runs at the same budgets
    assert F.better_front(a, b, "A", "B").outcome == HOLDS
    assert F.better_front(b, a, "B", "A").outcome == FAILS
    # a 0.001 gap under a seed s.d. of 0.02 cannot be told
    a2 = front_runs("supermask", "arms", curve_acc(0.931), n=2, param="escort", sd=0.02)
    b2 = front_runs("supermask", "loorf", curve_acc(0.93), n=2, param="escort", sd=0.02)
    assert F.better_front(a2, b2, "A", "B").outcome == NOISE
    # "much better": a significant 1-point gap is not much; a 5-point gap is
    c = front_runs("supermask", "loorf", curve_acc(0.94), n=2, param="escort")
    assert F.better_front(a, c, "A", "C", much=True).outcome == FAILS
    a3 = front_runs("supermask", "cp", curve_acc(0.98), mask_opt="rmsprop")
    assert F.better_front(a3, b, "A", "B", much=True).outcome == HOLDS


def test_fronts_that_share_no_budget_cannot_tell_and_nothing_is_extrapolated():
    """CP's front ends at 5% (0.80), MC's runs from 45% to 50% reach 0.90: no budget has runs
    of both and the sparser side is the less accurate, so the verdict is cannot tell (the old
    statistic extended CP flat to 50% and read fails). With CP at 0.95 and MC at 0.70, CP's
    sparser front is the more accurate: that bounds the gap from below without extrapolating,
    and the row holds (and MC against CP fails)."""
    mc = front_runs("supermask", "arms", [0.90, 0.85], remainings=(0.5, 0.45), n=10, sd=0.0)
    cp = front_runs("supermask", "cp", [0.80, 0.79], remainings=(0.05, 0.02), sd=0.0)
    v = F.better_front(cp, mc, "CP", "MC")
    assert v.outcome == R.CANNOT_TELL and "share no budget" in v.detail
    cp = front_runs("supermask", "cp", [0.95, 0.94], remainings=(0.05, 0.02), sd=0.0)
    mc = front_runs("supermask", "arms", [0.70, 0.60], remainings=(0.5, 0.45), n=10, sd=0.0)
    v = F.better_front(cp, mc, "CP", "MC")
    assert v.outcome == HOLDS and "fewer remaining weights" in v.detail
    assert F.better_front(mc, cp, "MC", "CP").outcome == R.FAILS


def test_front_ignores_collapsed_runs_and_reports_missing():
    dead = [prune("supermask", "arms", 0.0, 0.098, s, n=2, lam=0.1) for s in SEEDS]
    below = R.ACC_FLOOR - 0.05  # above chance (0.1), under the floor of a useful front
    weak = front_runs("supermask", "arms", [below, below - 0.05], remainings=(0.5, 0.2), n=2)
    cp = front_runs("supermask", "cp", curve_acc(0.95))
    assert F.better_front(cp, dead + weak, "CP", "MC").outcome == MISSING
    assert F.better_front(cp, [], "CP", "MC").outcome == MISSING


def test_one_seed_cannot_tell():
    """One seed a side: a front would be chosen and measured on the same noise."""
    a = front_runs("supermask", "cp", curve_acc(0.95), seeds=(0,))
    b = front_runs("supermask", "cp", curve_acc(0.90), seeds=(0,))
    v = F.better_front(a, b, "a", "b")
    assert v.outcome == R.CANNOT_TELL and "two or more seeds" in v.detail


# ----------------------------------------------------------------------- supermask (1-4)


def quartet(arms_escort, arms_sigmoid, loorf_escort, loorf_sigmoid, n=2):
    runs = []
    for (m, p), base in {("arms", "escort"): arms_escort, ("arms", "sigmoid"): arms_sigmoid,
                         ("loorf", "escort"): loorf_escort,
                         ("loorf", "sigmoid"): loorf_sigmoid}.items():
        runs += front_runs("supermask", m, curve_acc(base), n=n, param=p, mask_opt="rmsprop")
    return runs


def test_claim1_arms_vs_loorf():
    c = claim("sm_arms_gt_loorf")
    assert c.bullet == 1
    assert c.evaluate(quartet(0.92, 0.91, 0.90, 0.89)).outcome == HOLDS
    assert c.evaluate(quartet(0.90, 0.89, 0.92, 0.91)).outcome == FAILS
    assert c.evaluate(front_runs("supermask", "cp", curve_acc(0.9))).outcome == MISSING
    # ARMS better at n=2 but worse at n=10: fails
    runs = quartet(0.92, 0.91, 0.90, 0.89) + quartet(0.90, 0.89, 0.92, 0.91, n=10)
    assert c.evaluate(runs).outcome == FAILS


def test_claim2_escort_vs_sigmoid():
    c = claim("sm_escort_gt_sigmoid")
    assert c.evaluate(quartet(0.92, 0.90, 0.91, 0.89)).outcome == HOLDS
    assert c.evaluate(quartet(0.90, 0.92, 0.89, 0.91)).outcome == FAILS


def test_claim3_cp_vs_mc_needs_n100():
    c = claim("sm_cp_gt_mc")
    cp = front_runs("supermask", "cp", curve_acc(0.96), mask_opt="rmsprop")
    mc10 = front_runs("supermask", "arms", curve_acc(0.80), n=10, param="escort")
    v = c.evaluate(cp + mc10)
    assert v.outcome == MISSING and "n = 100" in v.detail
    mc100 = front_runs("supermask", "arms", [0.85], remainings=(0.05,), n=100, param="escort")
    assert c.evaluate(cp + mc10 + mc100).outcome == HOLDS
    mc100_good = front_runs("supermask", "arms", [0.99], remainings=(0.01,), n=100,
                            param="escort")
    assert c.evaluate(cp + mc10 + mc100_good).outcome == FAILS


def test_claim4_cp_rmsprop_much_better_than_sgd():
    c = claim("sm_cp_rmsprop_gt_sgd")
    rms = front_runs("supermask", "cp", curve_acc(0.95), mask_opt="rmsprop", mask_lr=0.1)
    sgd_bad = front_runs("supermask", "cp", curve_acc(0.85), mask_opt="sgd", mask_lr=0.1)
    sgd_close = front_runs("supermask", "cp", curve_acc(0.945), mask_opt="sgd", mask_lr=0.1)
    sgd_good = front_runs("supermask", "cp", curve_acc(0.97), mask_opt="sgd", mask_lr=0.1)
    assert c.evaluate(rms + sgd_bad).outcome == HOLDS
    assert c.evaluate(rms + sgd_close).outcome == FAILS  # better, but not much
    assert c.evaluate(rms + sgd_good).outcome == FAILS
    assert c.evaluate(rms).outcome == MISSING


# --------------------------------------------------------------------------- joint (5-8)


def test_claim5_cp_best_in_joint_pruning():
    c = claim("joint_cp_best")
    cp = front_runs("joint", "cp", curve_acc(0.98), mask_opt="sgd")
    others = (front_runs("joint", "arms", curve_acc(0.95), n=2)
              + front_runs("joint", "mp", curve_acc(0.96))
              + front_runs("joint", "gmp", curve_acc(0.97)))
    assert c.evaluate(cp + others).outcome == HOLDS
    better_gmp = front_runs("joint", "gmp", curve_acc(0.99), target=0.1)
    assert c.evaluate(cp + others[:-len(better_gmp)] + better_gmp).outcome == FAILS
    assert c.evaluate(cp).outcome == MISSING


def profile(weights):
    """Per-layer fractions min(1, c w_l) with c set so that the run keeps a fraction r of all
    masked weights (bisection): layers_of(r) for front_runs."""
    def layers_of(r):
        lo, hi = 0.0, 1e6
        for _ in range(200):
            c = (lo + hi) / 2
            kept = sum(min(1.0, c * w) * SIZES[k] for k, w in zip(SIZES, weights))
            lo, hi = (c, hi) if kept < r * sum(SIZES.values()) else (lo, c)
        return {k: min(1.0, lo * w) for k, w in zip(SIZES, weights)}
    return layers_of


uniform = profile((1, 1, 1))
first_layer_cut = profile((0.2, 1, 1))  # the big first layer gives up most
last_layers_cut = profile((1, 0.1, 0.1))  # the small last layers give up most


RS = (0.5, 0.3, 0.2, 0.15)
ACCS = [0.95, 0.94, 0.93, 0.92]
MC_ACCS = [a - 0.02 for a in ACCS]
GMP_ACCS = [a - 0.01 for a in ACCS]


def test_allocation_distance_is_zero_for_uniform_pruning():
    r = prune("joint", "gmp", 0.1, 0.9, layers=uniform(0.1))
    assert R.allocation_distance(r) == pytest.approx(0.0)
    r = prune("joint", "gmp", 0.3, 0.9, layers=first_layer_cut(0.3))
    assert sum(r.layers[k] * n for k, n in SIZES.items()) == pytest.approx(480)
    # kept (120, 300, 60): shares (1/4, 5/8, 1/8) against the dense (5/8, 5/16, 1/16)
    assert R.allocation_distance(r) == pytest.approx(0.375)


def allocations(cp, mc, gmp, mc_rs=RS):
    """Joint CP, MC (ARMS n=2) and GMP fronts whose runs split their weights by these
    profiles."""
    return (front_runs("joint", "cp", ACCS, RS, layers_of=cp)
            + front_runs("joint", "arms", MC_ACCS[:len(mc_rs)], mc_rs, layers_of=mc, n=2)
            + front_runs("joint", "gmp", GMP_ACCS, RS, layers_of=gmp))


def test_claim6_per_method_solutions_differ():
    c = claim("joint_solutions_differ")
    v = c.evaluate(allocations(first_layer_cut, uniform, last_layers_cut))
    assert v.outcome == HOLDS, v.detail
    assert c.evaluate(allocations(uniform, uniform, uniform)).outcome == FAILS
    assert c.evaluate(front_runs("joint", "cp", ACCS, RS)).outcome == MISSING


def test_claim7_mc_changes_the_allocation_least():
    c = claim("joint_mc_allocation")
    v = c.evaluate(allocations(first_layer_cut, uniform, last_layers_cut))
    assert v.outcome == HOLDS, v.detail
    assert c.evaluate(allocations(uniform, first_layer_cut, uniform)).outcome == FAILS
    # MC runs far sparser than every CP and GMP run: nothing to match
    far = allocations(first_layer_cut, uniform, last_layers_cut, mc_rs=(0.01,))
    assert c.evaluate(far).outcome == MISSING


def test_claim8_cp_sgd_much_better_than_rmsprop():
    c = claim("joint_cp_sgd_gt_rmsprop")
    sgd = front_runs("joint", "cp", curve_acc(0.97), mask_opt="sgd")
    assert c.evaluate(sgd + front_runs("joint", "cp", curve_acc(0.90),
                                       mask_opt="rmsprop")).outcome == HOLDS
    assert c.evaluate(sgd + front_runs("joint", "cp", curve_acc(0.99),
                                       mask_opt="rmsprop")).outcome == FAILS


# ---------------------------------------------------------------------- regression (9-11)

EPOCHS = np.arange(0, 301, 10, dtype=float)


def reg(method, final, tau=30.0, seeds=SEEDS, sd=0.002, start=1.0, epochs=300, **settings):
    """Regression runs: loss(t) = final + (start - final) exp(-t / tau), final jittered by seed."""
    base = {"n": 10, "param": "sigmoid", "lr": 0.1, "optimizer": "rmsprop", "epochs": epochs}
    base.update(settings)
    t = EPOCHS * epochs / 300
    out = []
    for s in seeds:
        f = final + sd * (s - 1)
        losses = f + (start - f) * np.exp(-t / tau)
        out.append(RunRecord("regression", method, base, s, final_loss=float(losses[-1]),
                             epochs=t, losses=losses))
    return out


def test_claim9_reinforce_much_worse():
    c = claim("reg_reinforce_much_worse")
    good = reg("loorf", 0.20) + reg("arms", 0.19)
    assert c.evaluate(reg("reinforce", 0.40) + good).outcome == HOLDS
    assert c.evaluate(reg("reinforce", 0.205) + good).outcome == FAILS  # worse, not much
    assert c.evaluate(reg("reinforce", 0.10) + good).outcome == FAILS
    noisy = reg("reinforce", 0.21, sd=0.1) + reg("loorf", 0.20, sd=0.1)
    assert c.evaluate(noisy).outcome == NOISE
    assert c.evaluate(good).outcome == MISSING


def params(cosine=(0.30, 80.0), direct=(0.28, 5.0), sigmoid=(0.20, 30.0), escort=(0.20, 20.0)):
    runs = []
    for name, (final, tau) in {"cosine": cosine, "direct": direct, "sigmoid": sigmoid,
                               "escort": escort}.items():
        runs += reg("loorf", final, tau, param=name, lr=0.1)
        runs += reg("loorf", final + 0.05, tau, param=name, lr=0.01)  # the worse lr
    return runs


def test_claim10_parametrizations():
    cos, dirc, well = (claim(k) for k in ("reg_cosine_slow_worse", "reg_direct_fast_poor",
                                          "reg_escort_sigmoid_well"))
    assert {cos.bullet, dirc.bullet, well.bullet} == {10}
    paper = params()
    assert cos.evaluate(paper).outcome == HOLDS
    assert dirc.evaluate(paper).outcome == HOLDS
    assert well.evaluate(paper).outcome == HOLDS
    other = params(cosine=(0.15, 5.0), direct=(0.10, 80.0))
    assert cos.evaluate(other).outcome == FAILS
    assert dirc.evaluate(other).outcome == FAILS
    assert well.evaluate(other).outcome == FAILS
    assert cos.evaluate(reg("loorf", 0.2)).outcome == MISSING


def approaches(reinforce=0.40, loorf=0.25, st=0.24, rebar=0.30, cp_sgd=0.15, cp_rms=0.35):
    runs = []
    for m, f in (("reinforce", reinforce), ("loorf", loorf), ("st", st), ("rebar", rebar)):
        runs += reg(m, f, lr=0.1) + reg(m, f + 0.05, lr=0.01)
    runs += reg("cp", cp_sgd, optimizer="sgd") + reg("cp", cp_rms, optimizer="rmsprop")
    return runs


def test_claim11_approaches():
    grad, best, sgd = (claim(k) for k in ("reg_grad_helps", "reg_cp_best", "reg_cp_sgd"))
    paper = approaches()
    assert grad.evaluate(paper).outcome == HOLDS
    assert best.evaluate(paper).outcome == HOLDS
    assert sgd.evaluate(paper).outcome == HOLDS
    other = approaches(reinforce=0.2, st=0.3, cp_sgd=0.5, cp_rms=0.1)
    assert grad.evaluate(other).outcome == FAILS
    assert best.evaluate(other).outcome == FAILS
    assert sgd.evaluate(other).outcome == FAILS


def test_regression_selection_keeps_epochs_apart():
    """A REBAR comparison at 30 epochs is judged against REINFORCE at 30 epochs only."""
    runs = (reg("reinforce", 0.4) + reg("st", 0.2)
            + reg("reinforce", 0.6, epochs=30) + reg("rebar", 0.5, epochs=30))
    v = claim("reg_grad_helps").evaluate(runs)
    assert v.outcome == HOLDS and "30 ep rebar" in v.detail and "300 ep st" in v.detail


def test_beyond_the_paper_rows_set_each_new_method_against_cp():
    cp = front_runs("supermask", "cp", curve_acc(0.95), mask_opt="rmsprop")
    for method, label, _ in C.BEYOND:
        assert method in REGISTRY, method
        row = claim(f"sm_{method.replace('-', '_')}_vs_cp")
        assert row.beyond and row.bullet > 11
        better = front_runs("supermask", method, curve_acc(0.98))
        worse = front_runs("supermask", method, curve_acc(0.90))
        assert row.evaluate(cp + better).outcome == HOLDS, label
        assert row.evaluate(cp + worse).outcome == FAILS, label
        assert row.evaluate(cp).outcome == MISSING, label


def test_every_scale_claim_has_a_bullet_and_evaluates_on_nothing():
    paper = [c for c in C.SCALE_CLAIMS if not c.beyond]
    assert sorted({c.bullet for c in paper}) == list(range(1, 12))
    for c in C.SCALE_CLAIMS:
        assert c.evaluate([]).outcome == MISSING, c.key


# ------------------------------------------- known answers (each fails on its mutant, issue 33)


def test_claim6_cut_follows_the_seed_spread():
    """Seeds that scatter: CP profiles (0.3,1,1), (1,1,1), (1,0.3,0.3) and GMP (1,0.7,0.7),
    (1,0.4,0.4), (0.6,0.4,0.4), one per seed: the CP/GMP distance (about 0.14) is above 0.10 but
    below twice the seed spread (about 0.11), so the row reads noise, not holds."""
    cp = [(0.3, 1, 1), (1, 1, 1), (1, 0.3, 0.3)]
    gmp = [(1, 0.7, 0.7), (1, 0.4, 0.4), (0.6, 0.4, 0.4)]
    runs = []
    for s, (pc, pg) in enumerate(zip(cp, gmp)):
        for i, (r, a) in enumerate(zip(RS, ACCS)):
            runs.append(prune("joint", "cp", r, a, s, profile(pc)(r), lam=10.0 ** -i))
            runs.append(prune("joint", "gmp", r, a - 0.01, s, profile(pg)(r), target=r))
    v = claim("joint_solutions_differ").evaluate(runs)
    assert v.values["tv[CP-GMP]"] == pytest.approx(0.14, abs=0.005)
    assert v.values["within_seed_tv"] == pytest.approx(0.11, abs=0.005)
    assert C.VERY_TV < v.values["tv[CP-GMP]"] < 2 * v.values["within_seed_tv"]
    assert v.outcome == NOISE, v.detail


def test_a_setting_below_the_floor_is_on_no_front():
    """A's sparsest setting is below the floor (0.2 at 1%), B's too (0.25 at 2%): the budgets
    compared start where both fronts have runs above it (10%), not at 2%; with a floor of 0.15
    they start at 2%."""
    a = front_runs("supermask", "cp", [0.2, 0.8, 0.9], remainings=(0.01, 0.05, 0.2))
    b = front_runs("supermask", "arms", [0.25, 0.85, 0.88], remainings=(0.02, 0.1, 0.3), n=2)
    assert R.ACC_FLOOR > 0.25
    c, _ = F.front_gap(a, b, "A", "B")
    assert c.budgets == (pytest.approx(0.1), pytest.approx(0.2))
    low, _ = F.front_gap(a, b, "A", "B", reading=R.Reading(acc_floor=0.15))
    assert low.budgets[0] == pytest.approx(0.02)


def test_claim7_standard_error_divides_by_the_root_of_the_pairs():
    """One seed per setting: each group's allocation s.e. is the fallback 0.02, and the mean
    difference over k matched pairs has s.e. sqrt(0.02^2 + 0.02^2) / sqrt(k)."""
    runs = (front_runs("joint", "cp", ACCS, RS, seeds=(0,), layers_of=first_layer_cut)
            + front_runs("joint", "arms", MC_ACCS, RS, seeds=(0,), layers_of=uniform, n=2)
            + front_runs("joint", "gmp", GMP_ACCS, RS, seeds=(0,), layers_of=last_layers_cut))
    v = claim("joint_mc_allocation").evaluate(runs)
    for name, part in v.parts:
        pairs = int(part.detail.split(" over ")[1].split()[0])
        assert pairs == len(RS)
        want = math.hypot(C.FALLBACK_TV_SE, C.FALLBACK_TV_SE) / math.sqrt(pairs)
        assert part.values["se"] == pytest.approx(want, rel=1e-12), name
    assert C.allocation_se(0.03, 0.04, 4) == pytest.approx(0.025)


# ------------------------------------------------------------------ budgets


def test_fronts_of_different_budgets_are_compared_apart():
    a = (front_runs("supermask", "cp", curve_acc(0.95), mask_opt="rmsprop")
         + [dataclasses.replace(r, settings={**r.settings, "epochs": 20})
            for r in front_runs("supermask", "cp", curve_acc(0.97), mask_opt="rmsprop")])
    b = (front_runs("supermask", "arms", curve_acc(0.90), n=2)
         + [dataclasses.replace(r, settings={**r.settings, "epochs": 20})
            for r in front_runs("supermask", "arms", curve_acc(0.96), n=2)])
    v = F.better_front(a, b, "CP", "ARMS")
    assert [name for name, _ in v.parts] == ["4 ep", "20 ep"]
    assert v.parts[0][1].values["gap_mean"] == pytest.approx(0.05, abs=0.002)
    assert v.parts[1][1].values["gap_mean"] == pytest.approx(0.01, abs=0.002)
    # no shared budget: compared across budgets, with a warning
    mixed = F.better_front(a[:18], b[18:], "CP", "ARMS")
    assert mixed.detail.startswith("budgets differ: CP 4 ep, ARMS 20 ep")
    assert R.warnings_of(mixed) and "mixes budgets" in R.warnings_of(mixed)[0]
