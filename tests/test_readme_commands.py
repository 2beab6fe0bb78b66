"""Every command README.md names still runs where ``python -m`` names it: each answers
``--help`` (exit 0, a usage line), run in this process as ``python -m`` runs it
(:func:`runpy.run_module`, so a command package runs its ``__main__``); and the design card's
two commands run as a user types them, in a fresh process: ``python -m analysis.variance --d 4
--n 4`` to its results, and ``python -m pbscale.prune`` (its help, and one synthetic epoch)."""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def readme_commands(text: str) -> list[str]:
    """The modules of every ``python -m MODULE`` in README.md, in order of first mention."""
    return list(dict.fromkeys(re.findall(r"python -m ((?:analysis|pbscale|benchmarks)"
                                         r"(?:\.\w+)+)", text)))


COMMANDS = readme_commands(README.read_text())


def test_the_readme_names_the_commands():
    """The list is read from the README, and it is the whole tour: every package's commands."""
    assert {"pbscale.prune", "pbscale.regress", "pbscale.export",
            "pbscale.sweep", "analysis.variance", "analysis.microworld",
            "analysis.scale_report", "benchmarks.bench_prune"} <= set(COMMANDS)
    assert len(COMMANDS) >= 30


@pytest.mark.parametrize("module", COMMANDS)
def test_every_readme_command_answers_help(module, monkeypatch):
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module was imported before
        with pytest.raises(SystemExit) as done:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert done.value.code in (0, None), module
    assert "usage:" in out.getvalue() and "--help" in out.getvalue(), module


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "HOME": str(cwd)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_design_card_commands_run(tmp_path):
    done = _run(["-m", "analysis.variance", "--d", "4", "--n", "4"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    for bench in ("exponential", "nnloss"):
        assert (tmp_path / "results" / f"{bench}_d4_n4_variance.csv").stat().st_size > 0
    shown = _run(["-m", "pbscale.prune", "--help"], tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: python -m pbscale.prune")
    ran = _run(["-m", "pbscale.prune", "--synthetic", "64", "--epochs", "1", "--max-batches",
                "1", "--val-size", "16", "--quiet", "--out", "runs"], tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.startswith("test_acc ")
