"""The ARMS Dirichlet-copula table (`tab:integral_closed`) for any n >= 2, in sympy.

Row k is the probability of one given ordered assignment of bits to the n samples in which k
samples have z = 1 (d < c), as a piecewise polynomial in c = F^{-1}(theta) = 1 - (1-theta)^(1/(n-1))
for theta > 0.5; for theta <= 0.5 read row n - k at c = F^{-1}(1 - theta).

    python -m analysis.arms_table --n 4 [--latex] [--json FILE]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import sympy as sp

from analysis.cli import check_out_file, run, write_json
from pbexact.cli import ArgumentParser, int_at_least
from pbexact.copula import MAX_SYMBOLIC_N, symbolic_pattern_table


def multiset_label(n: int, ones: int) -> str:
    return "{" + ",".join(["0"] * (n - ones) + ["1"] * ones) + "}"


def table_json(n: int, rows: list[dict]) -> dict:
    """The table as ``{"n", "variable": "c", "rows": [{"ones", "pieces": [{"lo", "hi", "expr"}]}]}``
    with sympy-parsable strings."""
    return {
        "n": n,
        "variable": "c",
        "rows": [
            {
                "ones": row["ones"],
                "pieces": [
                    {"lo": str(p["lo"]), "hi": str(p["hi"]), "expr": str(p["expr"])}
                    for p in row["pieces"]
                ],
            }
            for row in rows
        ],
    }


def table_text(n: int, rows: list[dict]) -> str:
    lines = [f"ARMS copula table, n={n}: P(one ordered assignment) as a polynomial in c", ""]
    for row in rows:
        label = multiset_label(n, row["ones"])
        for j, p in enumerate(row["pieces"]):
            head = label if j == 0 else ""
            close = "]" if p["hi"] == 1 else ")"
            rel = "<" if close == ")" else "<="
            lines.append(
                f"{head:<{2 * n + 2}} {str(p['lo']):>5} <= c {rel} {str(p['hi']):<5} {p['expr']}"
            )
    return "\n".join(lines)


def table_latex(n: int, rows: list[dict]) -> str:
    out = [
        r"\begin{tabular}{ | c | l | }",
        r"\hline",
        r"Multiset & $\int p((d^{(s)})_{s=1}^n) \prod_{s=1}^n \ind[(d^{(s)} < c) \oplus "
        r"(\tilde z^{(s)} = 0)] \diff d^{(s)}$ \\",
        r"\hline",
    ]
    for row in rows:
        cases = []
        for p in row["pieces"]:
            rel = r"\leq" if p["hi"] == 1 else "<"
            lo, hi = sp.latex(p["lo"]), sp.latex(p["hi"])
            cases.append(f"{sp.latex(p['expr'])} & {lo} \\leq c {rel} {hi}")
        body = r" \\ ".join(cases)
        label = multiset_label(n, row["ones"]).replace("{", r"\{").replace("}", r"\}")
        out.append(f"${label}$ & $f(c) = \\begin{{cases}} {body} \\end{{cases}}$ \\\\")
    out += [r"\hline", r"\end{tabular}"]
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m analysis.arms_table",
        description="Symbolic ARMS Dirichlet-copula probabilities (tab:integral_closed) for any n.",
    )
    p.add_argument("--n", type=int_at_least(2), default=4,
                   help=f"number of samples, 2 <= n <= {MAX_SYMBOLIC_N} (default 4)")
    p.add_argument("--latex", action="store_true", help="also print the table as LaTeX")
    p.add_argument("--json", type=Path, default=None, help="write the table as JSON to FILE")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.json is not None:
        check_out_file(args.json, "--json")
    rows = symbolic_pattern_table(args.n, progress=args.n >= 10)
    print(table_text(args.n, rows))
    if args.latex:
        print()
        print(table_latex(args.n, rows))
    if args.json is not None:
        write_json(args.json, table_json(args.n, rows))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
