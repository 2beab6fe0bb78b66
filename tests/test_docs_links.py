"""The documentation holds together: every relative link in README.md and docs/*.md points to a
file or folder of the repository and, with a ``#anchor``, to a heading of the target Markdown
file (GitHub's slugs); README.md stays a front door of at most 250 lines whose first code block
holds exactly the two set-up commands (CI runs the second one's test command) and whose tour
names every ``python -m`` entry point; and the tables of docs/measurements.md that a tool also
wrote to a file under figures/ agree with that file to their printed digits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_README_LINES = 250
SETUP_COMMANDS = [
    "pip install torch==2.13.0 && pip install -e . && python -m pbscale.prune --model lenet "
    "--mode supermask --method cp --lam 1e-5 --epochs 2 --threads 1 "
    "--data-dir ../shared/data/mnist",
    'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -q',
]

_FENCE = re.compile(r"^(```|~~~)")
# [text](target) and ![alt](target); the target ends at whitespace or ')'
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"`[^`]*`")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, markup and punctuation other than '-' and '_'
    dropped, each space a '-'."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    """The relative link targets of a Markdown file (no URLs, no mailto, not in code)."""
    targets = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        for m in _LINK.finditer(_CODE_SPAN.sub("", line)):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue
            targets.append(target)
    return targets


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of ``path`` that names no file or folder inside ``root``, or a
    heading its target does not have, as 'target (why)'."""
    bad = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        try:
            dest.relative_to(root.resolve())
        except ValueError:
            bad.append(f"{target} (outside the repository)")
            continue
        if not dest.exists():
            bad.append(f"{target} (no such file)")
            continue
        if anchor:
            if dest.suffix != ".md" or dest.is_dir():
                bad.append(f"{target} (anchor into a file that is not Markdown)")
            elif anchor not in anchors(dest):
                bad.append(f"{target} (no heading with this anchor)")
    return bad


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    assert path.exists()
    assert broken_links(path) == []


def test_docs_pages_exist_and_are_linked_from_readme() -> None:
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert len(pages) >= 8
    readme_targets = {t.partition("#")[0] for t in relative_links(ROOT / "README.md")}
    for page in pages:
        assert f"docs/{page.name}" in readme_targets, f"README does not link {page.name}"


def test_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= MAX_README_LINES
    assert lines[0].startswith("# ")
    # the first line after the title opens the block of the two set-up commands
    body = [line for line in lines[1:] if line.strip()]
    assert body[0] == "```bash"
    end = body.index("```")
    assert body[1:end] == SETUP_COMMANDS
    assert "python -m pytest -q" in SETUP_COMMANDS[1]


def entry_points(root: Path = ROOT) -> list[str]:
    """Every ``python -m`` entry point of the packages: a package's ``__main__.py`` or a module
    with a ``__main__`` guard."""
    out = []
    for package in ("pbexact", "pbscale", "analysis", "benchmarks"):
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if path.name == "__main__.py":
                out.append(".".join(parts[:-1]))
            elif re.search(r"""__name__\s*==\s*["']__main__["']""", path.read_text()):
                out.append(".".join(parts))
    return out


def test_readme_tour_names_every_entry_point() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = entry_points()
    assert "pbscale.prune" in found and "analysis.theorems" in found
    missing = [m for m in found if f"`python -m {m}`" not in readme]
    assert missing == [], f"README's tour lacks {missing}"


def test_checker_finds_broken_links(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title A\n\n## Some `code` heading: here\n")
    page = tmp_path / "docs" / "b.md"
    page.write_text(
        "# B\n\n"
        "[ok](a.md) [ok anchor](a.md#some-code-heading-here) [self](#b)\n"
        "[missing](nothere.md) [bad anchor](a.md#no-such-heading)\n"
        "[outside](../../elsewhere.md) [url](https://example.org/x.md)\n"
        "`[in code](ignored.md)`\n"
        "```\n[in a fence](ignored_too.md)\n```\n"
    )
    assert broken_links(page, tmp_path) == [
        "nothere.md (no such file)",
        "a.md#no-such-heading (no heading with this anchor)",
        "../../elsewhere.md (outside the repository)",
    ]
    page.write_text("[ok](a.md#title-a)\n")
    assert broken_links(page, tmp_path) == []


def test_github_slugs() -> None:
    assert github_slug("`python -m analysis.variance`") == "python--m-analysisvariance"
    assert github_slug("K = 1 against K = 2 processes") == "k--1-against-k--2-processes"
    assert github_slug("The paper's Monte Carlo variance") == "the-papers-monte-carlo-variance"
    assert github_slug("`python -m analysis.arms_table`") == "python--m-analysisarms_table"


# ------------------------------------ typed tables of docs/measurements.md against their files


def table_after(text: str, heading: str) -> list[list[str]]:
    """The body rows (cells stripped) of the first Markdown table after the heading ``heading``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if _HEADING.match(line) and _HEADING.match(line).group(2) == heading)
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # header and separator


def agrees_to_printed_digits(printed: str, value: float) -> bool:
    """``value`` rounds to ``printed`` (e.g. '6.2e-5', '0.00394', '-12.17', '1,000', '16%')."""
    text = printed.replace(",", "").strip()
    scale = 1.0
    if text.endswith("%"):
        text, scale = text[:-1], 100.0
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    unit = 10.0 ** (int(exponent or 0) - decimals)
    return abs(float(text) - value * scale) <= unit / 2 * (1 + 1e-9) + 1e-15


def _csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_agrees_to_printed_digits() -> None:
    assert agrees_to_printed_digits("6.2e-5", 6.1988e-5)
    assert agrees_to_printed_digits("-12.17", -12.1658)
    assert agrees_to_printed_digits("16%", 0.1584)
    assert not agrees_to_printed_digits("6.2e-5", 6.26e-5)
    assert not agrees_to_printed_digits("0.0104", 0.01046)
    assert not agrees_to_printed_digits("1%", 0.016)


MEASUREMENTS = ROOT / "docs" / "measurements.md"


def test_exact_variance_table_matches_its_csv() -> None:
    rows = table_after(MEASUREMENTS.read_text(encoding="utf-8"),
                       "Exact variances along the trajectory")
    assert len(rows) == 6
    columns = ["loss", "entropy", "var_reinforce", "var_loorf", "var_arms", "var_betastar"]
    for bench, step, *printed in rows:
        data = _csv_rows(ROOT / "figures" / f"{bench}_d4_n4_variance.csv")
        row = next(r for r in data if int(r["step"]) == int(step.replace(",", "")))
        for text, column in zip(printed, columns, strict=True):
            assert agrees_to_printed_digits(text, float(row[column])), (bench, step, column)


def test_disarm_table_matches_its_csv() -> None:
    rows = table_after(MEASUREMENTS.read_text(encoding="utf-8"), "DisARM against LOORF and ARMS")
    data = _csv_rows(ROOT / "figures" / "variance_table_disarm.csv")
    assert len(rows) == 4
    for label, *cells in rows:
        bench, d = (s.strip() for s in label.split(","))
        for n, cell in zip((2, 4, 10), cells, strict=True):
            at_half, median, lower = (s.strip() for s in cell.split("/"))
            row = next(r for r in data if (r["benchmark"], r["d"], r["n"], r["other"])
                       == (bench, d, str(n), "loorf"))
            assert agrees_to_printed_digits(at_half, float(row["ratio_step0"]))
            assert agrees_to_printed_digits(median, float(row["ratio_median"]))
            assert agrees_to_printed_digits(lower, float(row["lower_fraction"]))


def test_bench_pbscale_table_matches_its_csv() -> None:
    rows = table_after(MEASUREMENTS.read_text(encoding="utf-8"), "Chunked step against a loop")
    data = {int(r["n"]): r for r in _csv_rows(ROOT / "figures" / "bench_pbscale_cpu.csv")
            if r["threads"] == "1"}
    one_thread = [r for r in rows if r[1] == "1"]
    assert {int(r[0]) for r in one_thread} == set(data)
    for n, _, chunked, loop, speedup, peak_chunked, peak_one_shot in one_thread:
        row = data[int(n)]
        assert agrees_to_printed_digits(chunked.split()[0], float(row["batched_ms"]))
        assert agrees_to_printed_digits(loop.split()[0], float(row["loop_ms"]))
        assert agrees_to_printed_digits(speedup.split()[0].rstrip("x"), float(row["speedup"]))
        peak, chunk = peak_chunked.split()
        assert agrees_to_printed_digits(peak, float(row["batched_peak_mib"]))
        assert chunk.strip("()") == row["batched_chunk"]
        assert agrees_to_printed_digits(peak_one_shot, float(row["one_shot_peak_mib"]))


def _tables(text: str) -> list[list[str]]:
    """The Markdown tables of ``text``: each a list of its lines (header and rule included)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line.rstrip())
        elif current:
            tables.append(current)
            current = []
    return tables


def test_claims_page_quotes_the_generated_agreement_tables() -> None:
    """docs/claims.md quotes every table of figures/claims/agreement.md verbatim (the paper's
    rows, those beyond the paper, the scale): the generated numbers are never typed by hand."""
    generated = _tables((ROOT / "figures" / "claims" / "agreement.md").read_text(encoding="utf-8"))
    quoted = _tables((ROOT / "docs" / "claims.md").read_text(encoding="utf-8"))
    assert len(generated) >= 2
    for table in generated:
        assert table in quoted, f"docs/claims.md does not quote: {table[0]}"


def test_claims_page_quotes_the_training_length_tables() -> None:
    """docs/claims.md quotes verbatim the training-length table of every study set beside the
    4-epoch one (figures/claims*/training_length.md) and that study's verdicts of the paper's
    rows (the first table of its agreement.md)."""
    quoted = _tables((ROOT / "docs" / "claims.md").read_text(encoding="utf-8"))
    studies = sorted(ROOT.glob("figures/claims*/training_length.md"))
    for path in studies:
        for source in (path, path.parent / "agreement.md"):
            table = _tables(source.read_text(encoding="utf-8"))[0]
            assert table in quoted, f"docs/claims.md does not quote {source}: {table[0]}"


def test_claims_page_quotes_the_calibration_table() -> None:
    """docs/claims.md quotes figures/calibration/calibration.md's table verbatim (which
    tests/test_gap_calibration.py checks against the code)."""
    quoted = _tables((ROOT / "docs" / "claims.md").read_text(encoding="utf-8"))
    table = _tables((ROOT / "figures" / "calibration" / "calibration.md").read_text(
        encoding="utf-8"))[0]
    assert table in quoted, "docs/claims.md does not quote figures/calibration/calibration.md"


def test_tables_finds_each_table() -> None:
    text = "x\n| a | b |\n| - | - |\n| 1 | 2 |\n\ny\n| c |\n"
    assert _tables(text) == [["| a | b |", "| - | - |", "| 1 | 2 |"], ["| c |"]]
