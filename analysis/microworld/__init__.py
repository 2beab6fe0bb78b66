"""The microworld (`sec:microworld`): exact-gradient and Monte Carlo runs on one benchmark
instance's J table (:mod:`.runs`), the vectorized torch runs of the methods that differentiate J
(:mod:`.hybrid`), the microworld conclusions of `tab:app_results_summ` as predicates
(:mod:`.claims`) and the instance study's units and plots (:mod:`.units`, :mod:`.plots`).

``python -m analysis.microworld`` is its command (:mod:`.cli`); the command's names (``main``,
``LABELS``, ``COLORS`` ...) are read from this package as before, imported on first use so that
the machinery does not load the command.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

#: The modules of this package (imported by the import system, never through the command).
MODULES = ("cli", "runs", "hybrid", "claims", "units", "plots", "__main__")


def __getattr__(name: str) -> Any:
    if name in MODULES or name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cli = import_module(f"{__name__}.cli")
    try:
        return getattr(cli, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
