"""Every option of every command says what it does: each argparse action of each command's
parser (and of its sub-commands), positional arguments included, has help text, so ``--help``
lists none bare (issue 42: ``prune --help`` showed ``--threads`` without a word)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pbexact", "pbscale", "analysis", "benchmarks")


def command_modules() -> list[str]:
    """The modules that define ``build_parser`` (found by reading the source, not importing
    every module)."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "def build_parser(" in path.read_text():
                rel = path.relative_to(ROOT).with_suffix("")
                found.append(".".join(rel.parts))
    return found


def parsers(p: argparse.ArgumentParser, name: str):
    yield name, p
    for a in p._actions:  # noqa: SLF001
        if isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
            for sub, sp in a.choices.items():
                yield from parsers(sp, f"{name} {sub}")


def bare_options(module: str) -> list[str]:
    parser = importlib.import_module(module).build_parser()
    bare = []
    for name, p in parsers(parser, module):
        for a in p._actions:  # noqa: SLF001
            if isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
                continue
            if not (a.help and a.help.strip()) and a.help != argparse.SUPPRESS:
                bare.append(f"{name}: {'/'.join(a.option_strings) or a.dest}")
    return bare


def test_commands_are_found() -> None:
    mods = command_modules()
    assert {"pbscale.prune", "pbscale.export", "pbscale.sweep.cli",
            "analysis.scale_report"} <= set(mods)


@pytest.mark.parametrize("module", command_modules())
def test_every_option_has_help(module: str) -> None:
    assert bare_options(module) == []

