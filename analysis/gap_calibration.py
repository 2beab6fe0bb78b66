"""Is the front statistic calibrated? Simulated studies with a study's real design
(:func:`analysis.scale.fronts.compare_groups` on per-seed fronts).

    python -m analysis.gap_calibration --study figures/claims20 --draws 4000
    python -m analysis.gap_calibration --study figures/claims --one-seed-draws 300

A :class:`Design` is one side of a comparison the claims make (captured with
:func:`analysis.scale.fronts.recording`): its settings' mean remaining fraction and test
accuracy, their measured seed s.d. (accuracy, and remaining in log), the share of their seeds
that diverged, and the number of seeds. A simulated study draws every (seed, setting) cell from
it (normal accuracy, log-normal remaining, a diverged cell with the measured probability), with
an optional seed effect shared by every cell of a seed on both sides (``rho``: its share of the
variance), and runs the statistic exactly as the claims do (:func:`analysis.scale.curves
.compared_means`, :mod:`analysis.scale.gap_test`).

* **Null studies**: both sides are the same design (a comparison's A against A, and B against
  B), so the true gap is 0 (for a "much" row: both sides' accuracies apart by exactly
  :data:`analysis.scale.gap_test.MUCH_ACC`, the edge of the claim). A false holds or fails must
  occur at most at the interval's nominal rate (2.5% each way).
* **Known gaps**: one side shifted up by the gap the design states as detectable (the median of
  the null studies' stated gaps); it must read holds in about :data:`analysis.scale.gap_test.POWER`
  of the studies.

A one-seed design (settings of 1-3 seeds: the 4-epoch study) is simulated through the claims'
own code (:func:`simulate_runs`; slower): each setting with its real number of seeds, its
measured s.d. (one seed: the group's pooled s.d.).
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.cli import run
from analysis.microworld.claims import FAILS, HOLDS
from analysis.scale.curves import compared_means
from analysis.scale.fronts import FALLBACK_SD, Group, front_gap, pooled_sd, recording
from analysis.scale.gap_test import MUCH_ACC, POWER, detectable, outcome, paired
from analysis.scale.outputs import check_in_folder
from analysis.scale.runs import ACC_FLOOR, RunRecord
from pbexact.cli import ArgumentParser, nonneg_int, positive_int
from pbexact.errors import PBInputError

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


def claim_groups(records: Sequence, claims: Sequence) -> list[tuple[str, Group, Group, bool]]:
    """(name, A, B, much) of every front comparison the claims make on the records."""
    out = []
    for c in claims:
        with recording() as seen:
            c.evaluate(records)
        out += [(f"{c.bullet} {a.label} - {b.label}", a, b, much) for a, b, much in seen]
    return out


def claim_designs(records: Sequence, claims: Sequence) -> list[tuple[str, Design, Design, bool]]:
    """(name, A, B, much) of every comparison the claims make on the records with per-seed
    fronts on both sides."""
    return [(name, design_of(a), design_of(b), much)
            for name, a, b, much in claim_groups(records, claims) if a.per_seed and b.per_seed]


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


def draw_runs(g: Group, rng: np.random.Generator, shift: float = 0.0,
              method: str = "sim") -> list[RunRecord]:
    """Simulated runs of a group's real design as the claims read them: each setting with its
    real number of finished seeds, accuracy normal about its mean (+ shift) with its seed s.d.
    (a setting of one seed: the pooled s.d. of the group's settings of several, else
    :data:`analysis.scale.fronts.FALLBACK_SD`), its remaining fraction as measured."""
    sd, _, n = pooled_sd((g,), (np.ones(len(g.names), dtype=bool),))
    sd = sd if n else FALLBACK_SD
    out = []
    for j, key in enumerate(g.names):
        settings = {k: v for k, v in json.loads(key).items() if k != "method"}
        s_j = g.sd[j] if g.count[j] > 1 else sd
        for seed in range(int(g.count[j])):
            acc = float(g.mean_acc[j] + shift + s_j * rng.standard_normal())
            out.append(RunRecord("supermask", method, settings, seed, float(g.mean_rem[j]), acc,
                                 {}, {}))
    return out


def simulate_runs(g: Group, draws: int, rng: np.random.Generator, shift: float = 0.0,
                  much: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Outcomes and stated detectable gaps of ``draws`` simulated studies of a group's design
    against itself (one side shifted up), through the claims' own code
    (:func:`analysis.scale.fronts.front_gap`, the experiment's runs as the s.d. pool): the
    one-seed designs' modelled s.e. is calibrated this way."""
    outs, dets = [], []
    for _ in range(draws):
        a = draw_runs(g, rng, shift, "a")
        b = draw_runs(g, rng, 0.0, "b")
        gap = front_gap(a, b, "a", "b", much, pool=a + b)
        if isinstance(gap, str):
            outs.append("noise")
            dets.append(np.nan)
            continue
        outs.append(outcome(gap.test, much))
        dets.append(gap.detectable)
    return np.array(outs), np.array(dets)


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


def calibrate(name: str, d: Design | Group, draws: int, rng: np.random.Generator,
              much: bool = False, rho: float = 0.0) -> Calibration:
    """Null studies of a design against itself (at the 'much' edge for a much row) and studies
    with the stated detectable gap: vectorized for a :class:`Design` (per-seed fronts), through
    :func:`simulate_runs` for a one-seed :class:`~analysis.scale.fronts.Group`."""
    base = MUCH_ACC if much else 0.0
    if isinstance(d, Design):
        out, det = simulate(d, d, draws, rng, base, much, rho)
    else:
        out, det = simulate_runs(d, draws, rng, base, much)
    gap = float(np.nanmedian(det))
    if isinstance(d, Design):
        hits, _ = simulate(d, d, draws, rng, gap, much, rho)
    else:
        hits, _ = simulate_runs(d, draws, rng, gap, much)
    return Calibration(name, float(np.mean(out == HOLDS)), float(np.mean(out == FAILS)),
                       gap, float(np.mean(hits == HOLDS)), draws)


def share(text: str) -> float:
    """argparse type: a share of variance in [0, 1)."""
    x = float(text)
    if not 0 <= x < 1:
        raise argparse.ArgumentTypeError(f"expected a share in [0, 1), got {text!r}")
    return x


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m analysis.gap_calibration",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--study", type=Path, default=Path("figures/claims20"),
                   help="a claims study's folder (its runs/; default figures/claims20)")
    p.add_argument("--draws", type=positive_int, default=4000,
                   help="simulated studies per design and question (default 4000)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the simulation")
    p.add_argument("--rho", type=share, default=0.0,
                   help="share of the seed variance shared by every cell of a seed (default 0)")
    p.add_argument("--one-seed-draws", type=nonneg_int, default=300,
                   help="simulated studies of each one-seed design (run through the claims' own "
                        "code, about 20 ms each; default 300, 0: none)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from analysis.scale.claims import SCALE_CLAIMS
    from analysis.scale_report import study_records

    args = build_parser().parse_args(argv)
    check_in_folder(args.study, "--study ", "pass a claims study's folder (it holds runs/)")
    records = study_records(args.study, ("supermask", "joint"))
    if not records:
        raise PBInputError(f"--study {args.study} holds no pruning runs; pass a claims study's "
                           "folder (figures/claims20)")
    rng = np.random.default_rng(args.seed)
    print(f"{args.study}: nominal false holds and false fails 2.5% each, power {POWER:.0%} at "
          f"the stated gap; rho {args.rho:g} (per-seed designs)")
    print(f"{'design':<44} {'fronts':<9} {'draws':>6} {'holds':>6} {'fails':>6} {'gap':>7} "
          f"{'power':>6}")
    seen = set()
    for name, a, b, much in claim_groups(records, SCALE_CLAIMS):
        for g in (a, b):
            key = (g.label, g.names, much)
            if key in seen:
                continue
            seen.add(key)
            label = f"{name.split()[0]} {g.label}" + (" (much)" if much else "")
            if g.per_seed:
                c = calibrate(label, design_of(g), args.draws, rng, much, args.rho)
            elif args.one_seed_draws:
                c = calibrate(label, g, args.one_seed_draws, rng, much)
            else:
                continue
            print(f"{c.name:<44} {'per seed' if g.per_seed else 'one seed':<9} {c.draws:>6} "
                  f"{c.false_holds:>6.3f} {c.false_fails:>6.3f} {c.detectable:>7.4f} "
                  f"{c.power:>6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
