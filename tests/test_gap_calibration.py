"""Calibration of the claims' front statistic (issue 41, point 2): simulated studies with the
real design of the committed 20-epoch study (its settings, 5 seeds, the measured seed noise and
divergence; `analysis.gap_calibration`), run through the statistic the claims use.

Simulation error: each rate is a proportion over DRAWS = 1000 studies, s.e. sqrt(p (1 - p) /
1000): 0.0049 at p = 0.025, 0.0126 at p = 0.8. A design's rate must be within 4 s.e. of its
nominal value (a bound a calibrated statistic breaks with probability 6e-5 per rate), and the
mean over the designs within 3 s.e. of the mean (s.e. / sqrt(designs)). Fixed seeds: the numbers
are the same on every run.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from analysis import gap_calibration as GC
from analysis.microworld.claims import FAILS, HOLDS
from analysis.scale.claims import SCALE_CLAIMS
from analysis.scale.gap_test import MUCH_ACC, POWER
from analysis.scale_report import study_records

STUDY = Path(__file__).resolve().parent.parent / "figures" / "claims20"
DRAWS = 1000
NOMINAL = 0.025  # a false holds (or fails): half of the 95% interval's 5%


def se(p: float, n: int = DRAWS) -> float:
    return math.sqrt(p * (1 - p) / n)


@pytest.fixture(scope="module")
def designs() -> list[tuple[str, GC.Design, bool]]:
    """Every side of every per-seed comparison the claims make on the committed study, once."""
    records = study_records(STUDY, ("supermask", "joint"))
    out, seen = [], set()
    for name, a, b, much in GC.claim_designs(records, SCALE_CLAIMS):
        for d in (a, b):
            key = (d.name, much, d.rem.tobytes())
            if key not in seen:
                seen.add(key)
                out.append((name, d, much))
    return out


def test_the_designs_are_the_real_study(designs):
    """Rows 1-5 and 8 with 5 seeds (3 for MC n = 100), the diverged joint ARMS setting among
    them with its measured share of diverged seeds."""
    rows = {name.split()[0] for name, _, _ in designs}
    assert {"1", "2", "3", "4", "5", "8"} <= rows
    assert {d.seeds for _, d, _ in designs} == {3, 5}
    assert any(np.isclose(d.diverge, 0.4).any() for _, d, _ in designs)


@pytest.mark.parametrize("rho", [0.0, 0.5])
def test_null_studies_read_holds_or_fails_at_most_at_the_nominal_rate(designs, rho):
    """Both sides the same design (a much row: apart by exactly 0.02, the claim's edge): false
    holds and false fails each at most 2.5% (within the simulation's error), with independent
    seeds and with a seed effect shared by both sides (rho 0.5, which pairing removes)."""
    rng = np.random.default_rng(41)
    holds, fails = [], []
    for name, d, much in designs:
        out, _ = GC.simulate(d, d, DRAWS, rng, MUCH_ACC if much else 0.0, much, rho)
        holds.append(np.mean(out == HOLDS))
        fails.append(np.mean(out == FAILS))
        assert holds[-1] <= NOMINAL + 4 * se(NOMINAL), (name, d.name, holds[-1])
        assert fails[-1] <= NOMINAL + 4 * se(NOMINAL), (name, d.name, fails[-1])
    pooled = se(NOMINAL, DRAWS * len(designs))
    assert np.mean(holds) <= NOMINAL + 3 * pooled and np.mean(fails) <= NOMINAL + 3 * pooled


def test_studies_with_the_stated_gap_read_holds_at_the_stated_power(designs):
    """Each design shifted by the gap its null studies state as detectable (their median):
    holds in 80% of the studies, within the simulation's error; far above it, always."""
    rng = np.random.default_rng(42)
    powers = []
    for name, d, much in designs:
        c = GC.calibrate(name, d, DRAWS, rng, much)
        powers.append(c.power)
        assert abs(c.power - POWER) <= 4 * se(POWER), (name, d.name, c.power, c.detectable)
    assert abs(np.mean(powers) - POWER) <= 3 * se(POWER, DRAWS * len(designs))
    name, d, much = designs[0]
    out, _ = GC.simulate(d, d, 200, rng, 5 * GC.calibrate(name, d, 200, rng).detectable)
    assert np.mean(out == HOLDS) > 0.99


def test_a_design_is_drawn_with_its_measured_noise():
    """Draws of a two-setting design: mean, s.d. and divergence as measured (50,000 draws:
    within 4 of their s.e.)."""
    d = GC.Design("x", np.array([0.01, 0.1]), np.array([0.8, 0.9]), np.array([0.02, 0.0]),
                  np.array([0.1, 0.0]), np.array([0.0, 0.4]), 5)
    rem, acc = GC.draw(d, 10_000, np.random.default_rng(0))
    a = acc[..., 0].ravel()
    assert abs(a.mean() - 0.8) < 4 * 0.02 / math.sqrt(a.size)
    assert abs(a.std() - 0.02) < 4 * 0.02 / math.sqrt(2 * a.size)
    assert abs(np.log(rem[..., 0]).std() - 0.1) < 4 * 0.1 / math.sqrt(2 * a.size)
    gone = np.isnan(acc[..., 1]).mean()
    assert abs(gone - 0.4) < 4 * se(0.4, acc[..., 1].size)
