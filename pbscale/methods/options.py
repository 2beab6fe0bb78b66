"""Every family's own settings on the command line, and the help texts that name methods, both
generated from the registry when a tool builds its parser (so a family a plugin registers has
them too).

A field ``x`` of a family's :class:`pbscale.methods.registry.Settings` is the option
``--<family>-<x>`` (``--cp-final-tau 0.01``, dest ``cp_final_tau``), typed by its default
(true/false, an integer, a finite number or text), its help the field's
(:func:`pbscale.methods.registry.setting`) with its default. A sweep checks its keys with the
command's parser (:mod:`pbscale.sweep.file`), so each option is a sweep key too
(``cp_final_tau = 0.01``); it enters a sweep run's id only when set (``id_when_changed``) and a
run's hash only when its value differs from the default
(:meth:`pbscale.methods.registry.Settings.changed`), so adding a setting renames no run. A
run reads the options of its own method (:func:`settings_of`); those of other methods given
on its command line are ignored with a warning (:func:`foreign`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pbexact.cli import boolean, finite_float, integer

from .registry import REGISTRY, Family

#: The argparse type and metavar of a setting, by the type of its default.
TYPES: dict[type, tuple[Callable[[str], Any], str]] = {
    bool: (boolean, "true|false"), int: (integer, "N"), float: (finite_float, "X"),
    str: (str, "TEXT")}


@dataclass(frozen=True)
class Option:
    """One generated option: the family's name, the setting's field, its argparse dest and its
    flag."""

    method: str
    field: str
    dest: str
    flag: str


def option_dest(method: str, setting: str) -> str:
    """The argparse dest (and sweep key, and a pruning run's config.json key) of ``method``'s
    own ``setting``: ``cp``, ``final_tau`` -> ``cp_final_tau``."""
    return f"{method}_{setting}".replace("-", "_")


def option(family: Family, field: dataclasses.Field) -> Option:
    """The option of one setting of ``family``."""
    return Option(family.name, field.name, option_dest(family.name, field.name),
                  f"--{family.name}-{field.name}".replace("_", "-"))


def families(commands: Collection[str]) -> list[Family]:
    """The registered families that run in one of ``commands``, in registration order."""
    return [f for f in REGISTRY.values() if set(f.caps.commands) & set(commands)]


def options(commands: Collection[str]) -> list[Option]:
    """The options of every setting of the families that run in ``commands``."""
    return [option(f, field) for f in families(commands)
            for field in dataclasses.fields(f.Settings)]


def add_options(parser: argparse.ArgumentParser, commands: Collection[str]) -> list[Option]:
    """Add to ``parser`` one option per setting of each family that runs in ``commands``
    (module docstring); returns them. A setting whose default is not a bool, int, float or
    str, and an option that clashes with one the parser has, are a ValueError naming the
    family."""
    group = parser.add_argument_group(
        "each method's own settings",
        "--METHOD-SETTING; read by runs of that method only (docs/adding_a_method.md)")
    taken = {a.dest for a in parser._actions}  # noqa: SLF001 - argparse has no public list
    out = []
    for family in families(commands):
        for field in dataclasses.fields(family.Settings):
            opt = option(family, field)
            typed = TYPES.get(type(field.default))
            if typed is None:
                raise ValueError(f"{family.name}: setting {field.name} needs a default that is "
                                 f"a bool, int, float or str, got {field.default!r}")
            if opt.dest in taken:
                raise ValueError(f"{family.name}: the option {opt.flag} of its setting "
                                 f"{field.name} clashes with another option; rename the "
                                 "setting")
            taken.add(opt.dest)
            help_text = field.metadata.get("help", field.name)
            action = group.add_argument(opt.flag, dest=opt.dest, type=typed[0],
                                        default=field.default, metavar=typed[1],
                                        help=f"{family.text}: {help_text}")
            action.id_when_changed = True  # a sweep's existing run ids do not change
            out.append(opt)
    return out


def settings_of(values: Mapping[str, Any], method: str) -> dict[str, Any]:
    """{field: value} of ``method``'s own settings from parsed options (``vars(args)``; a
    setting without an option there keeps its default)."""
    family = REGISTRY[method]
    out = {}
    for field in dataclasses.fields(family.Settings):
        dest = option(family, field).dest
        if dest in values:
            out[field.name] = values[dest]
    return out


def foreign(given: Iterable[str], method: str, commands: Collection[str]) -> list[str]:
    """The options in ``given`` (dests) that are settings of families other than ``method``
    (the run ignores them)."""
    others = {o.dest for o in options(commands) if o.method != method}
    return sorted(d for d in given if d in others)


def users(setting: str, commands: Collection[str]) -> list[str]:
    """The texts of the families that run in ``commands`` and read the shared ``setting``
    (:attr:`pbscale.methods.registry.Capabilities.uses`), for help texts."""
    return [f.text for f in families(commands) if setting in f.caps.uses]


def listed(texts: Iterable[str]) -> str:
    """Method texts as one phrase: ``a``, ``a and b``, ``a, b and c``."""
    items = list(texts)
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"
