"""Every command-line tool's ``--help`` shows each option's default (`pbexact.cli`)."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from pathlib import Path

import pytest

from pbexact.cli import ArgumentParser, default_spellings, shows_default

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("analysis", "pbscale", "benchmarks")


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def cli_modules() -> list[str]:
    """Every module of the tool packages with a ``main`` (found by reading the source, so a tool
    that forgets ``build_parser`` is still walked)."""
    out = []
    for pkg in PACKAGES:
        for info in pkgutil.iter_modules([str(ROOT / pkg)]):
            # a module, or a package run with python -m (its __main__), read in full
            path = (ROOT / pkg / info.name / "cli.py" if info.ispkg
                    and (ROOT / pkg / info.name / "__main__.py").exists()
                    else ROOT / pkg / f"{info.name}.py")
            text = path.read_text() if path.exists() else ""
            if "def main(" in text or "def build_parser(" in text:
                out.append(f"{pkg}.{info.name}")
    return sorted(out)


def tool_parser(module: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser a tool builds: ``build_parser()`` when it has one, else the parser its
    ``main`` is about to parse with (caught before any work)."""
    mod = importlib.import_module(module)
    if hasattr(mod, "build_parser"):
        return mod.build_parser()

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Captured(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    try:
        mod.main([])
    except _Captured as got:
        return got.parser
    raise AssertionError(f"{module}.main([]) returned without parsing arguments")


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and its subcommands' parsers, recursively."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action.choices, dict) and all(
                isinstance(p, argparse.ArgumentParser) for p in action.choices.values()):
            for sub in action.choices.values():
                out += all_parsers(sub)
    return out


def action_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser.formatter_class(prog=parser.prog)
    formatter.add_argument(action)
    return " ".join(formatter.format_help().split())


def test_the_walk_finds_the_tools():
    mods = cli_modules()
    for name in ("analysis.report", "analysis.pareto", "analysis.variance", "analysis.theorems",
                 "pbscale.prune", "pbscale.sweep", "benchmarks.bench_prune"):
        assert name in mods


@pytest.mark.parametrize("module", cli_modules())
def test_every_default_is_shown_in_help(module, monkeypatch):
    parser = tool_parser(module, monkeypatch)
    checked = 0
    for p in all_parsers(parser):
        assert isinstance(p, ArgumentParser), f"{p.prog} does not use pbexact.cli.ArgumentParser"
        for action in p._actions:
            if not shows_default(action):
                continue
            text = action_help(p, action)
            spellings = [" ".join(s.split()) for s in default_spellings(action.default)]
            assert "default" in text.lower() and any(s in text for s in spellings), (
                f"{p.prog} {action.option_strings[0]}: help does not show its default "
                f"{action.default!r}: {text!r}")
            checked += 1
    p.format_help()  # every help renders
    assert checked or not any(shows_default(a) for p in all_parsers(parser) for a in p._actions)


def test_the_formatter_appends_defaults_once():
    p = ArgumentParser(prog="x")
    p.add_argument("--steps", type=int, default=10_000, help="SGD steps")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--n", type=int, default=4, help="samples (default 4)")
    p.add_argument("--keep", default="50%", help="share kept")
    p.add_argument("--flag", action="store_true", help="a flag")
    text = " ".join(p.format_help().split())
    assert "SGD steps (default: 10000)" in text
    assert "--lr LR default: 0.0001" in text
    assert "samples (default 4)" in text and "(default 4) (default" not in text
    assert "share kept (default: 50%)" in text
    assert "a flag (default" not in text


def test_descriptions_keep_their_line_breaks_and_long_lines_wrap():
    p = ArgumentParser(prog="x", description="first line\n  indented line\n" + "word " * 40)
    lines = p.format_help().splitlines()
    assert "first line" in lines and "  indented line" in lines
    assert max(len(line) for line in lines) <= 100


def test_seed_lists_are_bounded_before_they_are_expanded():
    from pbexact.cli import seed_list, seed_list_at_most

    assert seed_list_at_most(5)("0-3,9") == [0, 1, 2, 3, 9] == seed_list("9,0-3")
    with pytest.raises(argparse.ArgumentTypeError, match="at most 5 instances, got the range"):
        seed_list_at_most(5, "instances")("0-100000000000000")  # not expanded: no memory error
    with pytest.raises(argparse.ArgumentTypeError, match="at most 5 seeds, got more"):
        seed_list_at_most(5)("0-3,5-6")


@pytest.mark.parametrize("module", cli_modules())
def test_no_tool_takes_an_abbreviated_flag(module, monkeypatch):
    parser = tool_parser(module, monkeypatch)
    for p in all_parsers(parser):
        assert p.allow_abbrev is False, f"{p.prog} takes abbreviated flags"


def test_an_abbreviation_is_refused_in_one_line(capsys):
    p = ArgumentParser(prog="x")
    p.add_argument("--method", default="cp")
    assert p.parse_args_or_code(["--method", "arms"]).method == "arms"
    assert p.parse_args_or_code(["--meth", "arms"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: unrecognized arguments: --meth arms; see x --help"]


def test_the_shared_types_bound_what_torch_and_numpy_take():
    import numpy as np
    import torch

    from pbexact.cli import (
        MAX_FLOAT,
        MAX_INT,
        MAX_STEPS,
        MAX_THREADS,
        int_in_range,
        nonneg_int,
        positive_float,
        positive_int,
        seed_list,
        step_count,
        thread_count,
    )

    # the largest accepted seed is one torch and numpy take; one more is refused by the type
    assert nonneg_int(str(MAX_INT)) == MAX_INT
    torch.Generator().manual_seed(MAX_INT)
    np.random.default_rng(MAX_INT)
    for parse in (nonneg_int, positive_int, step_count(0)):
        with pytest.raises(argparse.ArgumentTypeError, match="at most"):
            parse(str(10**20))
    with pytest.raises(argparse.ArgumentTypeError, match=r"2\*\*63 - 1"):
        nonneg_int(str(MAX_INT + 1))
    with pytest.raises(argparse.ArgumentTypeError, match=r"2\*\*63 - 1"):
        seed_list(f"0-{10**20}")  # refused before the range is expanded
    # numbers: float32's range, torch's default dtype (a larger rate cannot become a step)
    assert positive_float(repr(MAX_FLOAT)) == MAX_FLOAT == float(np.finfo(np.float32).max)
    torch.tensor(-MAX_FLOAT, dtype=torch.float32)
    for text in ("1e39", "1e308", "nan", "inf", "-inf"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_float(text)
    assert thread_count(str(MAX_THREADS)) == MAX_THREADS == 1024
    with pytest.raises(argparse.ArgumentTypeError, match="at most 1,024"):
        thread_count("1025")
    assert step_count()(str(MAX_STEPS)) == MAX_STEPS
    with pytest.raises(argparse.ArgumentTypeError, match="at most 1,000,000,000"):
        step_count()(str(MAX_STEPS + 1))
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be an integer >= 1"):
        step_count()("0")
    assert step_count(0)("0") == 0
    limited = int_in_range(2, 5, "five is plenty")
    assert limited("5") == 5
    with pytest.raises(argparse.ArgumentTypeError, match=r"at most 5 \(five is plenty\), got 6"):
        limited("6")
