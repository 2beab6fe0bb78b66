"""Is the front statistic calibrated? Simulated studies with a study's real design
(:func:`analysis.scale_fronts.compare_groups` on per-seed fronts).

    python -m analysis.gap_calibration --study figures/claims20 --draws 4000

A :class:`Design` is one side of a comparison the claims make (captured with
:func:`analysis.scale_fronts.recording`): its settings' mean remaining fraction and test
accuracy, their measured seed s.d. (accuracy, and remaining in log), the share of their seeds
that diverged, and the number of seeds. A simulated study draws every (seed, setting) cell from
it (normal accuracy, log-normal remaining, a diverged cell with the measured probability), with
an optional seed effect shared by every cell of a seed on both sides (``rho``: its share of the
variance), and runs the statistic exactly as the claims do (:func:`analysis.front_curves
.compared_means`, :mod:`analysis.gap_test`).

* **Null studies**: both sides are the same design (a comparison's A against A, and B against
  B), so the true gap is 0 (for a "much" row: both sides' accuracies apart by exactly
  :data:`analysis.gap_test.MUCH_ACC`, the edge of the claim). A false holds or fails must occur
  at most at the interval's nominal rate (2.5% each way).
* **Known gaps**: one side shifted up by the gap the design states as detectable (the median of
  the null studies' stated gaps); it must read holds in about :data:`analysis.gap_test.POWER`
  of the studies.
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.claims import FAILS, HOLDS
from analysis.cli import run
from analysis.front_curves import compared_means
from analysis.gap_test import MUCH_ACC, POWER, detectable, outcome, paired
from analysis.scale_fronts import Group, recording
from analysis.scale_runs import ACC_FLOOR
from pbexact.cli import ArgumentParser, nonneg_int, positive_int

#: Simulated studies evaluated at once (memory: about 30 MB per 100 studies of 5 + 5 fronts of
#: 12 settings).
CHUNK = 250


@dataclass(frozen=True)
class Design:
    """One side of a comparison: P settings' mean remaining ``rem`` and accuracy ``acc``, the
    seed s.d. of accuracy ``acc_sd`` and of log remaining ``log_rem_sd``, the share of seeds that
    diverged ``diverge``, and the number of seeds."""

    name: str
    rem: np.ndarray
    acc: np.ndarray
    acc_sd: np.ndarray
    log_rem_sd: np.ndarray
    diverge: np.ndarray
    seeds: int


def design_of(g: Group) -> Design:
    """The :class:`Design` of a group with per-seed fronts (a setting whose seeds agree, or with
    one finished seed, gets s.d. 0)."""
    ok = np.isfinite(g.acc)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a setting with one finished seed
        log_rem = np.where(ok, np.log(np.where(ok & (g.rem > 0), g.rem, np.nan)), np.nan)
        acc_sd = np.nan_to_num(np.nanstd(g.acc, axis=0, ddof=1))
        rem_sd = np.nan_to_num(np.nanstd(log_rem, axis=0, ddof=1))
    return Design(g.label, np.nan_to_num(np.exp(np.nanmean(log_rem, axis=0))),
                  np.nan_to_num(np.nanmean(g.acc, axis=0)), acc_sd, rem_sd,
                  1 - ok.mean(axis=0), len(g.seeds))


def claim_designs(records: Sequence, claims: Sequence) -> list[tuple[str, Design, Design, bool]]:
    """(name, A, B, much) of every comparison the claims make on the records with per-seed
    fronts on both sides."""
    out = []
    for c in claims:
        with recording() as seen:
            c.evaluate(records)
        for a, b, much in seen:
            if a.per_seed and b.per_seed:
                out.append((f"{c.bullet} {a.label} - {b.label}", design_of(a), design_of(b),
                            much))
    return out


def draw(d: Design, draws: int, rng: np.random.Generator, shift: float = 0.0,
         common: np.ndarray | None = None, rho: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(remaining, accuracy), (draws, K, P) each, of simulated seeds of a design: accuracy
    normal about acc + shift with s.d. acc_sd (its share rho from the seed effect ``common``
    (draws, K)), remaining log-normal, a cell diverged (NaN) with probability ``diverge``."""
    shape = (draws, d.seeds, d.rem.size)
    z = rng.standard_normal(shape)
    if common is not None and rho > 0:
        z = math.sqrt(rho) * common[..., None] + math.sqrt(1 - rho) * z
    acc = d.acc + shift + d.acc_sd * z
    rem = d.rem * np.exp(d.log_rem_sd * rng.standard_normal(shape))
    gone = rng.random(shape) < d.diverge
    return np.where(gone, np.nan, rem), np.where(gone, np.nan, acc)


def simulate(a: Design, b: Design, draws: int, rng: np.random.Generator, shift: float = 0.0,
             much: bool = False, rho: float = 0.0, floor: float = ACC_FLOOR
             ) -> tuple[np.ndarray, np.ndarray]:
    """Outcomes (draws,) and stated detectable gaps (draws,) of simulated studies of A (shifted
    up by ``shift``) against B, seeds paired (A and B must have as many seeds); a study where a
    side has no point at or above the floor reads noise."""
    if a.seeds != b.seeds:
        raise ValueError("paired designs need as many seeds on both sides")
    outs, dets = [], []
    for start in range(0, draws, CHUNK):
        n = min(CHUNK, draws - start)
        common = rng.standard_normal((n, a.seeds))
        ra, aa = draw(a, n, rng, shift, common, rho)
        rb, ab = draw(b, n, rng, 0.0, common, rho)
        ma, mb, _, _ = compared_means(ra, aa, rb, ab, floor)
        test = paired(ma - mb)
        o = outcome(test, much)
        bad = ~np.isfinite(test.mean) | ~np.isfinite(test.se)
        outs.append(np.where(bad, "noise", o))
        dets.append(np.where(bad, np.nan, detectable(test, much)))
    return np.concatenate(outs), np.concatenate(dets)


@dataclass(frozen=True)
class Calibration:
    """Rates over simulated studies of one design: false holds and false fails under the null,
    the median stated detectable gap, and the share reading holds at that gap; ``draws``."""

    name: str
    false_holds: float
    false_fails: float
    detectable: float
    power: float
    draws: int

    def error(self, p: float) -> float:
        """The simulation's standard error of a rate near p."""
        return math.sqrt(p * (1 - p) / self.draws)


def calibrate(name: str, d: Design, draws: int, rng: np.random.Generator, much: bool = False,
              rho: float = 0.0) -> Calibration:
    """Null studies of d against itself (at the 'much' edge for a much row) and studies with
    the stated detectable gap."""
    base = MUCH_ACC if much else 0.0
    out, det = simulate(d, d, draws, rng, base, much, rho)
    gap = float(np.nanmedian(det))
    hits, _ = simulate(d, d, draws, rng, gap, much, rho)
    return Calibration(name, float(np.mean(out == HOLDS)), float(np.mean(out == FAILS)),
                       gap, float(np.mean(hits == HOLDS)), draws)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m analysis.gap_calibration",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--study", type=Path, default=Path("figures/claims20"),
                   help="a claims study's folder (its runs/; default figures/claims20)")
    p.add_argument("--draws", type=positive_int, default=4000,
                   help="simulated studies per design and question (default 4000)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the simulation")
    p.add_argument("--rho", type=float, default=0.0,
                   help="share of the seed variance shared by every cell of a seed (default 0)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from analysis.scale_claims import SCALE_CLAIMS
    from analysis.scale_report import study_records

    args = build_parser().parse_args(argv)
    records = study_records(args.study, ("supermask", "joint"))
    rng = np.random.default_rng(args.seed)
    print(f"{args.draws} simulated studies per line; nominal: false holds and false fails "
          f"2.5% each, power {POWER:.0%} at the stated gap; rho {args.rho:g}")
    print(f"{'design':<58} {'holds':>6} {'fails':>6} {'gap':>7} {'power':>6}")
    seen = set()
    for name, a, b, much in claim_designs(records, SCALE_CLAIMS):
        for d in (a, b):
            key = (d.name, much, d.rem.tobytes())
            if key in seen:
                continue
            seen.add(key)
            c = calibrate(f"{name.split()[0]} {d.name}" + (" (much)" if much else ""), d,
                          args.draws, rng, much, args.rho)
            print(f"{c.name:<58} {c.false_holds:>6.3f} {c.false_fails:>6.3f} "
                  f"{c.detectable:>7.4f} {c.power:>6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
