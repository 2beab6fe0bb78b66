"""The committed sweep files name no path of one machine: every path in ``sweeps/*.toml`` is
relative (``data_dir`` is resolved from the folder the sweep is run in, ``[sweep] out`` from the
sweep file's folder: docs/sweeps.md), and no value or comment names a home or machine folder
(``/work/``, ``/root/``, ``/home/``, ``~``, ...), so that the files run on any checkout."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="sweep files need Python >= 3.11")

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = sorted((ROOT / "sweeps").glob("*.toml"))
#: folders that exist on one machine only (a value or a comment naming one is refused)
MACHINE = re.compile(r"(?<![\w.])(/work/|/root/|/home/|/Users/|/mnt/|/tmp/|/scratch/|~/|"
                     r"[A-Za-z]:\\)")


def _strings(value, where: str) -> Iterator[tuple[str, str]]:
    """(where, string) for every string in a parsed TOML value, lists and tables included."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{where}.{k}" if where else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{where}[{i}]")


def path_problems(text: str) -> list[str]:
    """What in a sweep file's text names a machine's path: an absolute (or home-relative)
    string value, or any value or comment line naming a machine folder."""
    problems = []
    for where, s in _strings(tomllib.loads(text), ""):
        if s.startswith(("/", "~")) or re.match(r"^[A-Za-z]:[\\/]", s):
            problems.append(f"{where} = {s!r} is an absolute path; use one relative to the "
                            "folder the sweep is run in (e.g. data_dir = \"data/mnist\")")
    for n, line in enumerate(text.splitlines(), 1):
        if MACHINE.search(line):
            problems.append(f"line {n} names a machine's folder: {line.strip()}")
    return problems


def test_sweeps_exist():
    assert len(SWEEPS) >= 10


@pytest.mark.parametrize("path", SWEEPS, ids=[p.name for p in SWEEPS])
def test_sweep_file_names_no_machine_path(path):
    assert path_problems(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("text,problems", [
    ('[base]\ndata_dir = "data/mnist"\nepochs = 4\n', 0),
    ('# run: python -m pbscale.sweep run sweeps/x.toml --out runs/x\n[base]\nseed = 0\n', 0),
    ('[base]\ndata_dir = "/work/shared/data/mnist"\n', 2),  # absolute, and a machine folder
    ('[base]\ndata_dir = "/data/mnist"\n', 1),
    ('[sweep]\nout = "~/runs"\n', 2),
    ('[[grid]]\ndata_dir = ["data/a", "/srv/b"]\n', 1),
    ('[base]\ndata_dir = "C:\\\\data"\n', 2),
    ('# python -m pbscale.sweep run x.toml --out /root/study/runs\n[base]\nseed = 0\n', 1),
    ('[base]\ndata_dir = "../shared/data/mnist"\n', 0),
])
def test_path_problems_finds_machine_paths(text, problems):
    assert len(path_problems(text)) == problems
