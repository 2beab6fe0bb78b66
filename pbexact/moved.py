"""Modules and names that moved: importing one from its old place fails with one line naming
the new place (an :class:`ImportError`), so code written against an older layout learns the
fix instead of a bare "No module named". The moves are listed where they happened: a package's
``__init__`` installs its module moves (:func:`install`), a module its name moves
(:func:`moved_names` as its ``__getattr__``).
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["MovedModules", "install", "moved_names"]


class MovedModules(importlib.abc.MetaPathFinder):
    """A finder, first on ``sys.meta_path``, that answers an import of a moved module with a
    one-line :class:`ModuleNotFoundError` naming its new place (first: an editable install's
    finder would otherwise find the old file in another checkout)."""

    def __init__(self) -> None:
        self.moves: dict[str, str] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        new = self.moves.get(fullname)
        if new is not None:
            raise ModuleNotFoundError(f"{fullname} moved to {new}; import {new} instead",
                                      name=fullname)
        return None


def _finder() -> MovedModules:
    for f in sys.meta_path:
        if isinstance(f, MovedModules):
            return f
    f = MovedModules()
    sys.meta_path.insert(0, f)
    return f


def install(moves: Mapping[str, str]) -> None:
    """Answer imports of the modules ``moves`` names ({old dotted name: new}) with their new
    place."""
    _finder().moves.update(moves)


def moved_names(module: str, moves: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module`` whose names ``moves`` lists ({name: the module
    that holds it now, or ``module:new_name`` where it was renamed too}): ``from module import
    name`` then fails with one line naming the new import; any other missing name is the
    usual :class:`AttributeError`."""

    def __getattr__(name: str) -> Any:
        if name in moves:
            where, _, new = moves[name].partition(":")
            raise ImportError(f"{name} moved from {module} to {where}; write "
                              f"from {where} import {new or name}", name=module)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
