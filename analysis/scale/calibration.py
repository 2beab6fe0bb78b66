"""Is the front comparison calibrated against designs it did not choose? Simulated studies of two
*different* designs on one true accuracy-against-remaining curve
(:func:`analysis.scale.front_verdict.compare_fronts`, issue 49).

A :class:`Design` is one side of a comparison: its settings' remaining fractions, their seed
s.d. of log remaining and of accuracy about the curve, the share of their seeds that diverge,
and the number of seeds. A simulated study draws each (seed, setting) run's remaining fraction
log-normally about the design's, its accuracy as the true curve's value there (plus the side's
shift) with normal noise, and a diverged run with the design's share; both sides are judged by
the statistic exactly as the claims judge them.

The cells (:func:`cells`) pair designs with true curves (:data:`CURVES`, three shapes: a knee, a
slow power-law rise, a plateau with a cliff):

* **claims**: every pair of sides a claims study compares, each side at its real settings, noise
  and divergence (:func:`claim_cells`);
* **synthetic**: pairs the claims never had (:data:`SYNTHETIC`): a dense grid against a sparse
  one (both ways), offset grids, one side crowded at the sparse end, few settings against many,
  three runs of every setting against one (the best-of-several front), matched grids, and 3
  seeds against 5 (seeds not paired).

Each cell's null studies (both sides on the curve; a "much" row: A exactly MUCH_ACC above)
give its false holds and false fails; its studies with A shifted up by :data:`KNOWN_GAP` give
its power there. A cell's random numbers come from its name and the base seed alone
(:func:`cell_rng`), so any cell can be recomputed alone and gives the same numbers.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from analysis.microworld.claims import FAILS, HOLDS
from analysis.scale.front_verdict import compare_fronts
from analysis.scale.fronts import Group, recording
from analysis.scale.gap_test import MUCH_ACC
from analysis.scale.runs import CANNOT_TELL, RunRecord

#: The true gap at which power is stated for every cell (four points of accuracy).
KNOWN_GAP = 0.04


def _knee(r: np.ndarray) -> np.ndarray:
    """A knee: about 0.98 above 2% remaining, falling through 0.54 at 0.3% to chance."""
    return 0.1 + 0.88 / (1 + (0.003 / r) ** 1.5)


def _power_rise(r: np.ndarray) -> np.ndarray:
    """A slow power-law rise: 0.35 + 0.6 r^0.2 (0.54 at 0.3%, 0.73 at 10%, 0.95 dense)."""
    return 0.35 + 0.6 * r ** 0.2


def _cliff(r: np.ndarray) -> np.ndarray:
    """A plateau at 0.97 with a cliff at 1% remaining: 0.2 + 0.77 / (1 + exp(-ln(r / 1%) /
    0.2)), most of its drop within a factor 2.5 of 1%."""
    with np.errstate(over="ignore"):
        return 0.2 + 0.77 / (1 + np.exp(-(np.log(r) - math.log(0.01)) / 0.2))


#: The true curves: name -> accuracy as a function of the remaining fraction.
CURVES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "knee": _knee, "power rise": _power_rise, "cliff": _cliff}


@dataclass(frozen=True)
class Design:
    """One side: P settings' remaining fractions ``rem``, the seed s.d. of log remaining
    ``log_rem_sd`` and of accuracy ``acc_sd``, the share of seeds that diverge ``diverge``
    (each (P,)), and the number of seeds."""

    name: str
    rem: np.ndarray
    log_rem_sd: np.ndarray
    acc_sd: np.ndarray
    diverge: np.ndarray
    seeds: int


def design(name: str, rem: Sequence[float], seeds: int = 5, acc_sd: float = 0.01,
           log_rem_sd: float = 0.05, diverge: float = 0.0) -> Design:
    """A synthetic design: settings at ``rem`` with one noise level for all."""
    r = np.asarray(rem, dtype=float)
    return Design(name, r, np.full(r.size, log_rem_sd), np.full(r.size, acc_sd),
                  np.full(r.size, diverge), seeds)


def design_of(g: Group) -> Design:
    """The :class:`Design` of a claims group: each setting's geometric-mean remaining fraction,
    its seed s.d.s (0 with one finished seed) and its share of diverged seeds."""
    ok = np.isfinite(g.acc)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        log_rem = np.where(ok & (g.rem > 0), np.log(np.where(g.rem > 0, g.rem, 1.0)), np.nan)
        acc_sd = np.nan_to_num(np.nanstd(g.acc, axis=0, ddof=1))
        rem_sd = np.nan_to_num(np.nanstd(log_rem, axis=0, ddof=1))
        rem = np.exp(np.nanmean(log_rem, axis=0))
    attempted = np.isfinite(g.mean_rem)
    keep = attempted & np.isfinite(rem)
    return Design(g.label, rem[keep], rem_sd[keep], acc_sd[keep], (1 - ok.mean(axis=0))[keep],
                  int(ok.any(axis=1).sum()))


def draw(d: Design, curve: Callable[[np.ndarray], np.ndarray], draws: int,
         rng: np.random.Generator, shift: float = 0.0, common: np.ndarray | None = None,
         rho: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(remaining, accuracy), (draws, seeds, P) each: remaining log-normal about the design's,
    accuracy the curve there plus ``shift`` plus normal noise of the setting's s.d. (its share
    ``rho`` from the seed effect ``common`` (draws, seeds)), NaN for a diverged run."""
    shape = (draws, d.seeds, d.rem.size)
    rem = d.rem * np.exp(d.log_rem_sd * rng.standard_normal(shape))
    z = rng.standard_normal(shape)
    if common is not None and rho > 0:
        z = math.sqrt(rho) * common[..., None] + math.sqrt(1 - rho) * z
    acc = curve(rem) + shift + d.acc_sd * z
    gone = rng.random(shape) < d.diverge
    return np.where(gone, np.nan, rem), np.where(gone, np.nan, acc)


@dataclass(frozen=True)
class Cell:
    """A calibration cell: two designs on one true curve, "much" or not, and its kind (claims,
    synthetic) and the statistic's options (``safety``)."""

    name: str
    kind: str
    a: Design
    b: Design
    curve: str
    much: bool = False


def cell_rng(cell: Cell, seed: int, what: str) -> np.random.Generator:
    """The random numbers of one question (``null``, ``gap``) of one cell: from the cell's name,
    its curve and ``seed`` alone (blake2b), the same whatever else is computed."""
    key = f"{seed}|{cell.name}|{cell.curve}|{what}".encode()
    return np.random.default_rng(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(),
                                                "little"))


def simulate(cell: Cell, draws: int, rng: np.random.Generator, shift: float = 0.0,
             rho: float = 0.0, **options) -> np.ndarray:
    """The verdicts (draws,) of simulated studies of a cell with A shifted up by ``shift`` (a
    seed effect of share ``rho`` shared by both sides where they have as many seeds)."""
    curve = CURVES[cell.curve]
    paired = cell.a.seeds == cell.b.seeds
    common = rng.standard_normal((draws, cell.a.seeds)) if paired and rho > 0 else None
    ra, aa = draw(cell.a, curve, draws, rng, shift, common, rho)
    rb, ab = draw(cell.b, curve, draws, rng, 0.0, common, rho)
    return np.array([compare_fronts(ra[i], aa[i], rb[i], ab[i], cell.much, **options).verdict
                     for i in range(draws)])


@dataclass(frozen=True)
class Rates:
    """A cell's rates over ``draws`` null studies (false holds, false fails, cannot tell) and over
    studies with A ahead by :data:`KNOWN_GAP` (holds: the power there; cannot tell)."""

    cell: Cell
    draws: int
    false_holds: float
    false_fails: float
    null_cannot_tell: float
    power: float
    gap_cannot_tell: float

    def error(self, p: float) -> float:
        """The simulation's standard error of a rate near p."""
        return math.sqrt(max(p * (1 - p), 1.0 / self.draws) / self.draws)


def rates(cell: Cell, draws: int, seed: int = 0, rho: float = 0.0, **options) -> Rates:
    """Null studies (true gap 0; a much row at the edge, MUCH_ACC) and studies with the gap
    KNOWN_GAP (beyond the edge for a much row) of one cell."""
    base = MUCH_ACC if cell.much else 0.0
    null = simulate(cell, draws, cell_rng(cell, seed, "null"), base, rho, **options)
    gap = simulate(cell, draws, cell_rng(cell, seed, "gap"), base + KNOWN_GAP, rho, **options)
    return Rates(cell, draws, float(np.mean(null == HOLDS)), float(np.mean(null == FAILS)),
                 float(np.mean(null == CANNOT_TELL)), float(np.mean(gap == HOLDS)),
                 float(np.mean(gap == CANNOT_TELL)))


def _grid(lo: float, hi: float, k: int) -> np.ndarray:
    return np.exp(np.linspace(math.log(lo), math.log(hi), k))


#: Pairs of designs the claims never had: (name, A, B).
SYNTHETIC: tuple[tuple[str, Design, Design], ...] = (
    ("dense vs sparse", design("dense", _grid(0.003, 0.4, 10)),
     design("sparse", [0.005, 0.05, 0.5])),
    ("sparse vs dense", design("sparse", [0.005, 0.05, 0.5]),
     design("dense", _grid(0.003, 0.4, 10))),
    ("offset grids", design("offset a", [0.004, 0.016, 0.064, 0.256]),
     design("offset b", [0.008, 0.032, 0.128, 0.512])),
    ("crowded vs spread", design("crowded", [0.003, 0.0045, 0.007, 0.01, 0.015, 0.2]),
     design("spread", [0.003, 0.01, 0.03, 0.1, 0.3])),
    ("spread vs crowded", design("spread", [0.003, 0.01, 0.03, 0.1, 0.3]),
     design("crowded", [0.003, 0.0045, 0.007, 0.01, 0.015, 0.2])),
    ("few vs many", design("few", [0.01, 0.1]), design("many", _grid(0.003, 0.4, 10))),
    ("best of three vs one", design("three each", np.repeat([0.005, 0.02, 0.08, 0.3], 3)),
     design("one each", [0.005, 0.02, 0.08, 0.3])),
    ("matched", design("matched a", [0.003, 0.01, 0.03, 0.1, 0.3]),
     design("matched b", [0.003, 0.01, 0.03, 0.1, 0.3])),
    ("3 seeds vs 5", design("3 seeds", [0.003, 0.01, 0.03, 0.1, 0.3], seeds=3),
     design("5 seeds", [0.004, 0.012, 0.04, 0.12, 0.4])),
)
#: The synthetic cells whose grids are matched (power there is the issue's target).
MATCHED = ("matched",)


def synthetic_cells() -> list[Cell]:
    return [Cell(name, "synthetic", a, b, curve) for name, a, b in SYNTHETIC for curve in CURVES]


def claim_groups(records: Sequence[RunRecord], claims: Sequence) -> list[tuple[str, Group, Group,
                                                                               bool]]:
    """(name, A, B, much) of every front comparison the claims make on the records."""
    out = []
    for c in claims:
        with recording() as seen:
            c.evaluate(records)
        out += [(f"{c.bullet} {a.label} - {b.label}", a, b, much) for a, b, much in seen]
    return out


def claim_cells(records: Sequence[RunRecord], claims: Sequence) -> list[Cell]:
    """A cell per front comparison of the claims with two or more seeds on both sides, and
    curve."""
    out, seen = [], set()
    for name, a, b, much in claim_groups(records, claims):
        if not (a.per_seed and b.per_seed) or name in seen:
            continue
        seen.add(name)
        da, db = design_of(a), design_of(b)
        if da.rem.size and db.rem.size:
            out += [Cell(name, "claims", da, db, curve, much) for curve in CURVES]
    return out


def cells(records: Sequence[RunRecord], claims: Sequence) -> list[Cell]:
    """Every cell: the claims' comparisons, then the synthetic pairs, each on every curve."""
    return claim_cells(records, claims) + synthetic_cells()
