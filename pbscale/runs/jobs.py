"""What a command tells a sweep about its runs (:mod:`pbscale.sweep` reads it through the
command's jobs module, :data:`pbscale.sweep.jobs.COMMANDS`): how its runs train together as a
group (:class:`Grouping`) and what a run would record of the user's files (:class:`Identity`).
A library type, so that the commands' jobs modules (:mod:`pbscale.pruning.jobs`,
:mod:`pbscale.regression.jobs`) and the sweep share it without importing each other."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pbexact.errors import PBInputError

__all__ = ["Grouping", "Identity", "listed_values"]


@dataclass(frozen=True)
class Grouping:
    """How runs of one command train together as a group in one child ``python -m MODULE``:
    ``shared`` (the options given once per group, as ``--flag value``), ``groupable(full)``
    (whether a run, every option filled in, can join a group), ``argv(full, values, defaults)``
    (the group's options after ``python -m MODULE``, without --out, --threads and --quiet;
    ``values``: each axis's sorted values, the group being their full product; ``defaults``:
    each option's default in the command's parser, by dest) and
    ``member_key(full)`` (a member's name in ``$PBSCALE_RUN_INFO``'s "sweep_ids"; it names
    every axis). ``axes``: the options the members of a group differ in, the seed first
    (regress: ``seed``, ``lr``; prune: ``seed``, ``lam``, ``mask_lr``)."""

    module: str
    shared: tuple[str, ...]
    groupable: Callable[[dict], bool]
    argv: Callable[[dict, Mapping[str, Sequence], Mapping[str, object]], list[str]]
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


def listed_values(value: float | list[float]) -> list[float]:
    """The values of a group axis as its option holds them (one value or a comma list, e.g.
    ``--lr 0.1,0.01``), as a list; a value listed twice is a one-line :class:`PBInputError`."""
    out = value if isinstance(value, list) else [value]
    if len(set(out)) != len(out):
        raise PBInputError(f"a value is listed twice in {','.join(map(str, out))}; list each "
                           "once")
    return out
