"""The job interface of :mod:`pbscale.sweep`: what a sweep knows of the commands it runs.

A command (:class:`Command`) is a module run as ``python -m MODULE`` whose ``build_parser()``
gives its options (the sweep checks every value with it and names a run by them), whose
``check_options(options, given)`` refuses a run's options as the run itself would before it
trains (:func:`checker`; the sweep checks every run with it before launching any) and which
takes ``--out``, ``--threads`` and ``--quiet``. A command whose runs can train together as a
group (G runs in one process) names a grouping module whose ``GROUPING`` (:class:`Grouping`)
says which runs group (those that differ only in its axes, e.g. seed and learning rate, and
that it accepts), the command line of a group, and how a member is named in
``$PBSCALE_RUN_INFO``. A command whose runs read the user's files (a data file, a network's
module) may say what a run of given options would record of them now (``run_identity(options)``:
a list of :class:`Identity`, :func:`identity`), so that the sweep can tell a finished run
trained on a file since changed (:mod:`pbscale.sweep.identity`). The modules are found by name
(:func:`parser`, :func:`grouping`, :func:`identity`), so the sweep depends on this interface, not
on any command's internals.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Grouping:
    """How runs of one command train together as a group in one child ``python -m MODULE``:
    ``shared`` (the options given once per group, as ``--flag value``), ``groupable(full)``
    (whether a run, every option filled in, can join a group), ``argv(full, values)`` (the
    group's options after ``python -m MODULE``, without --out, --threads and --quiet;
    ``values``: each axis's sorted values, the group being their full product) and
    ``member_key(full)`` (a member's name in ``$PBSCALE_RUN_INFO``'s "sweep_ids"; it names
    every axis). ``axes``: the options the members of a group differ in, the seed first
    (regress: ``seed``, ``lr``; prune: ``seed``, ``lam``, ``mask_lr``)."""

    module: str
    shared: tuple[str, ...]
    groupable: Callable[[dict], bool]
    argv: Callable[[dict, Mapping[str, Sequence]], list[str]]
    member_key: Callable[[dict], str]
    axes: tuple[str, ...] = ("seed", "lr")


@dataclass(frozen=True)
class Identity:
    """What a run of given options would record now of one file it reads: ``what`` ("data",
    "network"), the file's ``name`` (as the options name it), where its config.json records
    it (``where``: section and key, e.g. ("task", "data_id")) and the ``value`` it would record
    (None where it cannot be known without running the user's code, or the file cannot be
    read: the run's child then says why when it starts)."""

    what: str
    name: str
    where: tuple[str, str]
    value: str | None


@dataclass(frozen=True)
class Command:
    """A command a sweep runs: ``module`` (``python -m MODULE``) and the module whose
    ``GROUPING`` groups its runs (None: its runs are single children)."""

    module: str
    grouping: str | None = None


#: The sweep commands (``[sweep] command``).
COMMANDS: dict[str, Command] = {
    "regress": Command("pbscale.regress", grouping="pbscale.batched_seeds"),
    "prune": Command("pbscale.prune", grouping="pbscale.prune"),
}


def parser(command: str) -> argparse.ArgumentParser:
    """The argparse parser of a command (its module's ``build_parser()``)."""
    return importlib.import_module(COMMANDS[command].module).build_parser()


def checker(command: str) -> Callable[[dict, Collection[str]], None] | None:
    """The command's own check of one run, ``check_options(options, given)`` of its module
    (the options as its parser holds them, defaults filled in; ``given``: those the sweep sets):
    what the run would refuse before it trains, as a one-line ``PBInputError``; None where the
    module has none."""
    return getattr(importlib.import_module(COMMANDS[command].module), "check_options", None)


def grouping(command: str) -> Grouping | None:
    """How the runs of a command group (its grouping module's ``GROUPING``), or None."""
    name = COMMANDS[command].grouping
    return None if name is None else importlib.import_module(name).GROUPING


def identity(command: str) -> Callable[[Mapping], list[Identity]] | None:
    """What a run of ``command`` with given options (defaults filled in) would record now of the
    user's files it reads (its module's ``run_identity(options)``: :class:`Identity` s), or
    None where the command reads none."""
    return getattr(importlib.import_module(COMMANDS[command].module), "run_identity", None)
