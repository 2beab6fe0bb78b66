"""The job interface of :mod:`pbscale.sweep`: what a sweep knows of the commands it runs.

A command (:class:`Command`) is a module run as ``python -m MODULE`` whose ``build_parser()``
gives its options (the sweep checks every value with it and names a run by them) and which
takes ``--out``, ``--threads`` and ``--quiet``; its jobs module (a library module, e.g.
:mod:`pbscale.pruning.jobs`) holds ``check_options(options, given)``, which refuses a run's
options as the run itself would before it trains (:func:`checker`; the sweep checks every run
with it before launching any). A command whose runs can train together as a group (G runs in
one process) has a ``GROUPING`` (:class:`Grouping`) there, which says which runs group (those
that differ only in its axes, e.g. seed and learning rate, and
that it accepts), the command line of a group, and how a member is named in
``$PBSCALE_RUN_INFO``. A command whose runs read the user's files (a data file, a network's
module) may say what a run of given options would record of them now (``run_identity(options)``:
a list of :class:`Identity`, :func:`identity`), so that the sweep can tell a finished run
trained on a file since changed (:mod:`pbscale.sweep.identity`). The modules are found by name
(:func:`parser`, :func:`checker`, :func:`grouping`, :func:`identity`), so the sweep depends on
this interface, not on any command's internals.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pbscale.runs.jobs import Grouping, Identity


@dataclass(frozen=True)
class Command:
    """A command a sweep runs: ``module`` (``python -m MODULE``: its ``build_parser()``) and
    ``jobs``, the library module that says what the command's runs need of a sweep: its
    ``check_options``, ``run_identity`` and ``GROUPING`` (each optional)."""

    module: str
    jobs: str | None = None


#: The sweep commands (``[sweep] command``).
COMMANDS: dict[str, Command] = {
    "regress": Command("pbscale.regress", jobs="pbscale.regression.jobs"),
    "prune": Command("pbscale.prune", jobs="pbscale.pruning.jobs"),
}


def parser(command: str) -> argparse.ArgumentParser:
    """The argparse parser of a command (its module's ``build_parser()``)."""
    return importlib.import_module(COMMANDS[command].module).build_parser()


def jobs_attribute(command: str, name: str) -> Any:
    """``name`` of the command's jobs module, or None (no jobs module, or no such name)."""
    module = COMMANDS[command].jobs
    return None if module is None else getattr(importlib.import_module(module), name, None)


def checker(command: str) -> Callable[[dict, Collection[str]], None] | None:
    """The command's own check of one run, ``check_options(options, given)`` of its jobs module
    (the options as its parser holds them, defaults filled in; ``given``: those the sweep sets):
    what the run would refuse before it trains, as a one-line ``PBInputError``; None where the
    module has none."""
    return jobs_attribute(command, "check_options")


def grouping(command: str) -> Grouping | None:
    """How the runs of a command group (its jobs module's ``GROUPING``), or None."""
    return jobs_attribute(command, "GROUPING")


def identity(command: str) -> Callable[[Mapping], list[Identity]] | None:
    """What a run of ``command`` with given options (defaults filled in) would record now of the
    user's files it reads (its jobs module's ``run_identity(options)``: :class:`Identity` s), or
    None where the command reads none."""
    return jobs_attribute(command, "run_identity")
