"""Numerical checks of every analytical claim of the paper, on many random instances, and,
beyond the paper, of the bias of ST, CP, REBAR and RELAX (`analysis.bias`).

    python -m analysis.theorems                       # full sizes, table on stdout
    python -m analysis.theorems --out results/        # also results/theorems.json and .md
    python -m analysis.theorems --instances 20 --max-d 4 --samples 4000   # quick
    python -m analysis.theorems --only thm:bStarOne cor:mc_bad_gen_2   # only these checks

Each check (:mod:`analysis.exact.polynomial_checks`, :mod:`analysis.exact.estimator_checks`,
:mod:`analysis.exact.bad_generalization_checks`, :mod:`analysis.exact.bias_checks`) returns a
:class:`analysis.exact.check_result.CheckResult` (paper label, what was checked, sizes, the worst
error or the smallest p-value, pass or fail). The exit code is 1 if
any check fails, 2 on bad input.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from analysis.cli import atomic_write_text, run, write_json
from analysis.exact.bad_generalization_checks import (
    check_cor_mc_bad_gen_2,
    check_corollary_sizes,
    check_ex_mc_bad_gen_1,
    check_mc_bad_gen_2,
)
from analysis.exact.bias_checks import check_cp_relaxation, check_hybrid_unbiased, check_st_bias
from analysis.exact.check_result import CheckResult
from analysis.exact.estimator_checks import (
    check_arms_correlation,
    check_arms_iterative,
    check_arms_unbiased,
    check_bstar,
    check_multisets,
)
from analysis.exact.polynomial_checks import (
    check_equivalence,
    check_equivalence_mc,
    check_multilinear_hessian_numeric,
    check_multilinear_hessian_symbolic,
)
from pbexact.cli import ArgumentParser, int_at_least, nonneg_int, positive_float, positive_int
from pbexact.errors import PBInputError
from pbexact.io import check_out_dir

# ---------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------


@dataclass
class Sizes:
    """Instance sizes of the full command; the tests use small ones."""

    instances: int = 500
    max_d: int = 8
    max_n: int = 4
    samples: int = 50_000
    cor_max_d: int = 20
    epsilon: float = 0.25
    runs: int = 200
    seed: int = 0

    def validate(self) -> Sizes:
        for name in ("instances", "max_d", "samples", "runs"):
            if getattr(self, name) < 1:
                raise PBInputError(f"--{name.replace('_', '-')} must be at least 1")
        if self.seed < 0:
            raise PBInputError(f"--seed must be >= 0, got {self.seed}")
        if self.max_n < 2:
            raise PBInputError("--max-n must be at least 2 (ARMS needs n >= 2)")
        check_corollary_sizes(self.cor_max_d, self.epsilon)
        if self.max_d > 16:
            raise PBInputError("--max-d above 16 would tabulate 2^d values per instance; use <= 16")
        return self


@dataclass(frozen=True)
class Check:
    """One job of the command: the paper labels its results carry and how to run it at the given
    sizes with its own generator (the k-th of :data:`CHECKS` always gets the k-th generator, so
    ``--only`` reproduces the full run's numbers)."""

    labels: tuple[str, ...]
    run: Callable[[Sizes, np.random.Generator], CheckResult | list[CheckResult]]


#: Every check, in table order.
CHECKS: tuple[Check, ...] = (
    Check(("eq:equivalence",), lambda s, g: check_equivalence(g, s.instances, s.max_d)),
    Check(("eq:equivalence",),
          lambda s, g: check_equivalence_mc(g, min(s.instances, 50), s.max_d, s.samples)),
    Check(("thm:multilinear_hessian",),
          lambda s, g: check_multilinear_hessian_symbolic(g, min(s.instances, 40), s.max_d)),
    Check(("thm:multilinear_hessian",),
          lambda s, g: check_multilinear_hessian_numeric(g, s.instances, s.max_d)),
    Check(("thm:bStarOne", "thm:bStarTwo"),
          lambda s, g: check_bstar(g, min(s.instances, 60), s.max_d, s.max_n)),
    Check(("thm:mc_bad_gen_2",), lambda s, g: check_mc_bad_gen_2(g, s.instances, s.max_d)),
    Check(("cor:mc_bad_gen_2",),
          lambda s, g: check_cor_mc_bad_gen_2(s.cor_max_d, s.epsilon, seed=s.seed)),
    Check(("ex:mc_bad_gen_1",), lambda s, g: check_ex_mc_bad_gen_1(g, s.runs)),
    Check(("sec:arms_iter_proof",), lambda s, g: check_arms_iterative(g, s.samples)),
    Check(("alg:orig_arms",),
          lambda s, g: check_arms_correlation(g, s.instances, max(s.max_n, 8))),
    Check(("alg:orig_arms",),
          lambda s, g: check_arms_unbiased(g, min(s.instances, 60), s.max_d, s.max_n)),
    Check(("eq:n_multisets",), lambda s, g: check_multisets(g, s.max_d, s.max_n)),
    # beyond the paper: the bias of the estimators that differentiate J (analysis.bias)
    Check(("ch:other",), lambda s, g: check_st_bias(g, min(s.instances, 40), min(s.max_d, 6))),
    Check(("eq:sigmoid_cp",),
          lambda s, g: check_cp_relaxation(g, min(s.instances, 40), min(s.max_d, 6))),
    Check(("ch:other",), lambda s, g: check_hybrid_unbiased(g, min(s.instances, 6),
                                                            min(s.max_d, 3), s.samples)),
)
#: Every label a check reports, in table order (the choices of ``--only``).
LABELS: tuple[str, ...] = tuple(dict.fromkeys(lab for c in CHECKS for lab in c.labels))


def run_all(sizes: Sizes, progress: bool = True, only: Sequence[str] | None = None
            ) -> list[CheckResult]:
    """Every check at the given sizes (``only``: those reporting one of these labels), each with
    its own seeded generator (so one check's sizes do not change another's random instances)."""
    s = sizes.validate()
    unknown = [lab for lab in only or () if lab not in LABELS]
    if unknown:
        raise PBInputError(f"--only {unknown[0]}: no such check; choose from {', '.join(LABELS)}")
    seeds = np.random.SeedSequence(s.seed).spawn(len(CHECKS))
    todo = [(c, np.random.default_rng(x)) for c, x in zip(CHECKS, seeds)
            if not only or set(c.labels) & set(only)]
    results: list[CheckResult] = []
    for check, g in tqdm(todo, desc="checks", disable=not progress, file=sys.stderr):
        out = check.run(s, g)
        results.extend(out if isinstance(out, list) else [out])
    return [r for r in results if not only or r.label in only]


def _fmt(x: float) -> str:
    return f"{x:.3g}" if x else "0"


#: Width of the console table when the terminal's is not known (a pipe, a file).
TABLE_WIDTH = 100


def format_table(results: Sequence[CheckResult], markdown: bool = False,
                 width: int | None = None) -> str:
    """The results as a Markdown table, or as a console table at most ``width`` columns wide
    (default: the terminal's, else :data:`TABLE_WIDTH`; at least 72) whose check and sizes
    columns wrap onto further lines, nothing cut."""
    header = ["label", "check", "sizes", "worst", "criterion", "result"]
    rows = []
    for r in results:
        crit = f"{'p' if r.kind == 'p-value' else 'err'} {'>=' if r.kind == 'p-value' else '<='} "
        rows.append([r.label, r.check, r.sizes, _fmt(r.worst), crit + _fmt(r.tolerance),
                     "pass" if r.passed else "FAIL"])
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines) + "\n"
    if width is None:
        width = shutil.get_terminal_size((TABLE_WIDTH, 24)).columns
    width = max(width, 72)
    widths = [max(len(h), *(len(row[k]) for row in rows)) for k, h in enumerate(header)]
    fixed = sum(widths[k] for k in (0, 3, 4, 5)) + 2 * (len(header) - 1)
    room = max(width - fixed, 20)
    widths[2] = min(widths[2], max(room * 2 // 5, 8))
    widths[1] = min(widths[1], room - widths[2])

    def lines(cells: Sequence[str]) -> list[str]:
        wrapped = [textwrap.wrap(c, w) or [""] if k in (1, 2) else [c]
                   for k, (c, w) in enumerate(zip(cells, widths))]
        return ["  ".join((col[i] if i < len(col) else "").ljust(w)
                          for col, w in zip(wrapped, widths)).rstrip()
                for i in range(max(len(col) for col in wrapped))]

    out = lines(header) + lines(["-" * w for w in widths])
    for r in rows:
        out += lines(r)
    return "\n".join(out)


def _cor_fit_table(result: CheckResult) -> str:
    det = result.detail
    lines = ["cor:mc_bad_gen_2: largest m that keeps -grad E[J] aligned with z* "
             f"(M0=0, dM=1, fit log(d (M0 - m*)) = {det['intercept']:.6f} + d log "
             f"{det['c_fit']:.6f}, R^2 = {det['r_squared']:.9f}); the bound is below "
             f"M0 - dM (so it constrains a valid m) from d = {det['binding_from_d']}",
             f"{'d':>3}  {'exact m*':>14}  {'-1/(d (1-eps)^(d-1))':>22}"]
    for d, e, f in zip(det["d"], det["exact_m"], det["formula_m"]):
        lines.append(f"{d:>3}  {e:>14.6g}  {f:>22.6g}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m analysis.theorems",
        description="Check every analytical claim of the paper numerically on random instances; "
        "exit 1 if any check fails.",
    )
    d = Sizes()
    parser.add_argument("--instances", type=positive_int, default=d.instances,
                        help="random instances per check (default %(default)s; sympy and "
                        "enumeration-heavy checks use at most 40-60)")
    parser.add_argument("--max-d", type=positive_int, default=d.max_d,
                        help="largest d of random tables (default %(default)s; sympy, beta* and "
                        "ARMS enumeration cap it at 4, thm:mc_bad_gen_2, ST and CP at 6, "
                        "REBAR/RELAX at 3)")
    parser.add_argument("--max-n", type=int_at_least(2), default=d.max_n,
                        help="largest number of samples n for enumerations (default %(default)s, "
                        "capped at 4)")
    parser.add_argument("--samples", type=positive_int, default=d.samples,
                        help="Monte Carlo samples per statistical test (default %(default)s)")
    parser.add_argument("--cor-max-d", type=positive_int, default=d.cor_max_d,
                        help="cor:mc_bad_gen_2 is computed for d=2..this (default %(default)s)")
    parser.add_argument("--epsilon", type=positive_float, default=d.epsilon,
                        help="error epsilon of cor:mc_bad_gen_2 (default %(default)s)")
    parser.add_argument("--runs", type=positive_int, default=d.runs,
                        help="REINFORCE runs for ex:mc_bad_gen_1 (default %(default)s)")
    parser.add_argument("--seed", type=nonneg_int, default=d.seed, help="random seed (default 0)")
    parser.add_argument("--out", type=Path, help="write DIR/theorems.json and DIR/theorems.md")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--only", nargs="+", choices=LABELS, metavar="LABEL",
                        help="run only the checks of these paper labels: " + ", ".join(LABELS))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    sizes = Sizes(args.instances, args.max_d, args.max_n, args.samples, args.cor_max_d,
                  args.epsilon, args.runs, args.seed)
    sizes.validate()
    if args.out is not None:
        check_out_dir(args.out)
    results = run_all(sizes, progress=not args.no_progress, only=args.only)
    print(format_table(results))
    cor = next((r for r in results if r.label == "cor:mc_bad_gen_2"), None)
    if cor is not None:
        print()
        print(_cor_fit_table(cor))
    if args.out is not None:
        write_json(args.out / "theorems.json", [asdict(r) for r in results])
        md = "# Theorem checks (`python -m analysis.theorems`)\n\n" + format_table(results, True)
        if cor is not None:
            md += "\n```\n" + _cor_fit_table(cor) + "\n```\n"
        atomic_write_text(args.out / "theorems.md", md)
    failed = [r.label for r in results if not r.passed]
    if failed:
        print(f"\nFAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
