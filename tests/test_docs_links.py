"""The documentation's links resolve: every relative link in README.md and docs/*.md points to a
file or folder of the repository and, with a ``#anchor``, to a heading of the target Markdown
file (GitHub's slugs); README.md stays a front door of at most 250 lines whose first code block
holds exactly the two set-up commands (CI runs the second one's test command)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_README_LINES = 250
SETUP_COMMANDS = [
    "pip install torch==2.13.0 && pip install -e . && python -m pbscale.prune --model lenet "
    "--mode supermask --method cp --lam 1e-5 --epochs 2 --data-dir ../shared/data/mnist",
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
