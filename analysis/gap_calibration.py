"""Is the front comparison calibrated against designs it did not choose? Null studies and studies
with a known gap, two different designs on one true curve (:mod:`analysis.scale.calibration`).

    python -m analysis.gap_calibration --draws 1000 --out figures/calibration
    python -m analysis.gap_calibration --draws 200 --only matched

Every pair of sides the study's claims compare (each at its real settings, noise, divergence and
seeds) and the synthetic pairs (dense against sparse, offset grids, one side crowded, few
settings against many, the best of three runs against one, matched grids, 3 seeds against 5),
each on three true curves (a knee, a slow power-law rise, a plateau with a cliff). Per cell: the
share of null studies reading holds and fails (each should be at most 2.5%, and 5% in every
cell), the share reading cannot tell, and the share reading holds with A ahead by 0.04 (the
power there). With --out, the table as calibration.csv and calibration.md.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from analysis.cli import run
from analysis.scale.calibration import KNOWN_GAP, MATCHED, Rates, cells, rates
from analysis.scale.outputs import Outputs, check_in_folder, check_out
from analysis.scale.runs import RunRecord
from pbexact.cli import ArgumentParser, nonneg_int, positive_int
from pbexact.errors import PBInputError

#: The columns of calibration.csv.
COLUMNS = ("kind", "comparison", "curve", "much", "draws", "false_holds", "false_fails",
           "null_cannot_tell", "power", "gap_cannot_tell")
#: The nominal rate of a false holds (or fails): half the 95% interval's 5%; and the most any
#: one cell may show.
NOMINAL, CELL_MAX = 0.025, 0.05


def row_of(r: Rates) -> dict:
    """One cell's line of calibration.csv."""
    return {"kind": r.cell.kind, "comparison": r.cell.name, "curve": r.cell.curve,
            "much": int(r.cell.much), "draws": r.draws, "false_holds": r.false_holds,
            "false_fails": r.false_fails, "null_cannot_tell": r.null_cannot_tell,
            "power": r.power, "gap_cannot_tell": r.gap_cannot_tell}


def summary(rows: Sequence[dict]) -> list[str]:
    """The worst cells, the means over cells with their simulation s.e., and the power on the
    matched grids."""
    n = sum(r["draws"] for r in rows)
    out = []
    for what in ("false_holds", "false_fails"):
        x = np.array([r[what] for r in rows])
        worst = rows[int(np.argmax(x))]
        se = math.sqrt(NOMINAL * (1 - NOMINAL) / n)
        out.append(f"{what.replace('_', ' ')}: mean {x.mean():.4f} over {len(rows)} cells "
                   f"(simulation s.e. {se:.4f} at {NOMINAL:g}); worst {x.max():.3f} "
                   f"({worst['comparison']}, {worst['curve']}); cells above {CELL_MAX:.0%}: "
                   f"{int((x > CELL_MAX).sum())}")
    matched = [r for r in rows if r["comparison"] in MATCHED]
    if matched:
        out.append(f"power at a gap of {KNOWN_GAP:g} on matched grids: " + ", ".join(
            f"{r['curve']} {r['power']:.3f}" for r in matched))
    return out


def markdown(rows: Sequence[dict], title: str) -> str:
    """calibration.md: the cells' table and the summary lines."""
    lines = [f"# Calibration of the front comparison: {title}", "",
             f"False holds and false fails under the null (each nominally {NOMINAL:.1%}, at most "
             f"{CELL_MAX:.0%} in every cell), cannot tell under the null, and holds (power) and "
             f"cannot tell with A ahead by {KNOWN_GAP:g}; {rows[0]['draws'] if rows else 0} "
             "studies a cell and question.", "",
             "| kind | comparison | curve | false holds | false fails | cannot tell (null) | "
             f"power at {KNOWN_GAP:g} | cannot tell (gap) |",
             "|" + " --- |" * 8]
    for r in rows:
        name = r["comparison"] + (" (much)" if r["much"] else "")
        lines.append(f"| {r['kind']} | {name} | {r['curve']} | {r['false_holds']:.3f} | "
                     f"{r['false_fails']:.3f} | {r['null_cannot_tell']:.3f} | {r['power']:.3f} | "
                     f"{r['gap_cannot_tell']:.3f} |")
    lines += ["", *(f"- {line}" for line in summary(rows))]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m analysis.gap_calibration",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--study", type=Path, default=Path("figures/claims20"),
                   help="a claims study's folder (its runs/; default figures/claims20)")
    p.add_argument("--draws", type=positive_int, default=1000,
                   help="simulated studies per cell and question (default 1000; about 5 ms "
                        "each)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the simulation")
    p.add_argument("--rho", type=share, default=0.0,
                   help="share of the seed variance shared by both sides' runs of a seed "
                        "(paired designs; default 0)")
    p.add_argument("--only", default=None, metavar="TEXT",
                   help="only the cells whose comparison contains TEXT (e.g. 'matched', '4 CP')")
    p.add_argument("--out", type=Path, default=None,
                   help="write calibration.csv and calibration.md into this folder")
    return p


def share(text: str) -> float:
    """argparse type: a share of variance in [0, 1)."""
    x = float(text)
    if not 0 <= x < 1:
        raise argparse.ArgumentTypeError(f"expected a share in [0, 1), got {text!r}")
    return x


def study_cells(study: Path) -> list:
    """Every calibration cell of a claims study's comparisons and the synthetic pairs."""
    from analysis.scale.claims import SCALE_CLAIMS
    from analysis.scale.study import study_records

    check_in_folder(study, "--study ", "pass a claims study's folder (it holds runs/)")
    records: list[RunRecord] = study_records(study, ("supermask", "joint"))
    if not records:
        raise PBInputError(f"--study {study} holds no pruning runs; pass a claims study's "
                           "folder (figures/claims20)")
    return cells(records, SCALE_CLAIMS)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.out is not None:
        check_out(args.out)
    chosen = [c for c in study_cells(args.study)
              if args.only is None or args.only in c.name]
    if not chosen:
        raise PBInputError(f"--only {args.only!r} matches no cell; pass part of a comparison's "
                           "name (e.g. 'matched', 'dense')")
    print(f"{args.study}: {len(chosen)} cells, {args.draws} studies each per question; "
          f"nominal false holds and fails {NOMINAL:.1%} each (at most {CELL_MAX:.0%} a cell); "
          f"power at a gap of {KNOWN_GAP:g}; rho {args.rho:g}")
    print(f"{'kind':<9} {'comparison':<46} {'curve':<10} {'holds':>6} {'fails':>6} "
          f"{'ct':>5} {'power':>6} {'ct':>5}")
    rows = []
    for c in chosen:
        r = row_of(rates(c, args.draws, args.seed, args.rho))
        rows.append(r)
        print(f"{r['kind']:<9} {r['comparison'][:46]:<46} {r['curve']:<10} "
              f"{r['false_holds']:>6.3f} {r['false_fails']:>6.3f} {r['null_cannot_tell']:>5.2f} "
              f"{r['power']:>6.3f} {r['gap_cannot_tell']:>5.2f}", flush=True)
    for line in summary(rows):
        print(line)
    if args.out is not None:
        files = Outputs(args.out)
        files.csv("calibration.csv", list(COLUMNS), [[r[k] for k in COLUMNS] for r in rows])
        files.text("calibration.md", markdown(rows, f"{args.study}, seed {args.seed}"))
        files.write()
        print(f"-> {args.out / 'calibration.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
