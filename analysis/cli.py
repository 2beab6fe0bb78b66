"""What every `python -m analysis.*` entry point shares: one-line errors, atomic writes, the J
table reader and the settings recorded beside a tool's results."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pbexact.cli import run_main
from pbexact.errors import PBInputError
from pbexact.io import (
    atomic_write_bytes,
    atomic_write_text,
    check_out_dir,
    check_out_file,
    write_csv,
    write_json,
)

__all__ = [
    "atomic_write_bytes", "atomic_write_text", "check_out_dir", "check_out_file",
    "Interrupted", "check_settings", "output_folders", "read_table", "run", "save_figure",
    "settings_path", "stop_signals", "write_csv", "write_json",
]


def run(
    main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None
) -> int:
    """Call ``main`` through :func:`pbexact.cli.run_main`: bad input becomes ``error: ...`` on
    stderr and exit code 2 (argparse's own errors, already printed as one line by
    `pbexact.cli.ArgumentParser`, return their code), a failed write
    (`pbexact.io.WriteError`) one line and 2, Ctrl-C one line and 130 (SIGTERM under
    :func:`stop_signals`: 143); files are written atomically, so what was written before is
    intact."""
    return run_main(lambda: main(argv))


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGINT) received under :func:`stop_signals`: a KeyboardInterrupt that knows
    its signal, so that a tool ends like Ctrl-C, with exit code 128 + ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Within the block SIGTERM and SIGINT raise :class:`Interrupted` in the main thread (so
    ``finally`` clauses run and a tool can stop its workers and say how to resume). A SIGINT the
    process inherited as ignored stays ignored; outside the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    old = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, was in old.items():
            signal.signal(sig, was)


def read_table(path: str | Path) -> Any:
    """A J table from a CSV file with exactly the two columns ``h, J`` (as ``analysis.variance``
    writes them), rows in any order; every h in 0..2^d-1 exactly once, row h the loss of the
    vertex with z_i = bit i-1 of h. Returns a float64 array (2^d,)."""
    import numpy as np

    from pbexact.errors import check_table

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PBInputError(f"cannot read the J table {path}: {exc.strerror}; give a "
                           "readable CSV with columns h,J") from None
    except UnicodeDecodeError:
        raise PBInputError(
            f"the J table {path} is not a text file; give a CSV with columns h,J"
        ) from None
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or [c.strip() for c in rows[0]] != ["h", "J"]:
        raise PBInputError(f"corrupt J table {path}: the first line must be the header 'h,J'; "
                           "add that header")
    values: dict[int, float] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != 2:
            raise PBInputError(
                f"corrupt J table {path}, line {line}: expected the two columns h,J, got "
                f"{len(row)} values {row!r}; give one h,J pair per line"
            )
        try:
            h, j = int(row[0]), float(row[1])
        except ValueError:
            raise PBInputError(
                f"corrupt J table {path}, line {line}: expected 'h,J' numbers, got {row!r}; fix "
                "that line"
            ) from None
        if h in values or h < 0:
            raise PBInputError(f"corrupt J table {path}, line {line}: h={h} repeated or < 0; "
                               "give each h in 0..2^d-1 once")
        values[h] = j
    if sorted(values) != list(range(len(values))):
        raise PBInputError(f"corrupt J table {path}: the h column must cover "
                           f"0..{len(values) - 1}; give each h in 0..2^d-1 once")
    return check_table(np.array([values[h] for h in range(len(values))]))


def output_folders(out: str | Path, figures: str | Path | None = None) -> list[Path]:
    """The folders a tool writes to: ``--out``, and ``--figures`` only when the user named it
    (nothing lands in the repository's figures/ unless asked). Both are checked before any work
    (`pbexact.io.check_out_dir`)."""
    folders = [check_out_dir(out, "--out")]
    if figures is not None and Path(figures).resolve() != folders[0].resolve():
        folders.append(check_out_dir(figures, "--figures"))
    return folders


def save_figure(fig: Any, paths: Iterable[str | Path]) -> list[Path]:
    """Save a matplotlib figure as PNG to each path, atomically."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130, bbox_inches="tight")
    return [atomic_write_bytes(p, buf.getvalue()) for p in paths]


def settings_path(stem: str | Path) -> Path:
    """``STEM_settings.json``: the settings recorded beside the results ``STEM.csv``."""
    stem = Path(stem)
    return stem.with_name(stem.name + "_settings.json")


def check_settings(stem: str | Path, settings: dict, keys: Iterable[str] | None = None,
                   replot: bool = False) -> dict | None:
    """Refuse, before any work, results ``STEM.csv`` recorded with other settings than
    ``settings`` (compared on ``keys``, default all): a run on top of another run's results, or
    a ``--replot`` of a mix. Results without recorded settings (``STEM_settings.json``, written
    before the results it labels) and a damaged settings file are refused too. Returns the
    recorded settings (None when there are none yet)."""
    stem = Path(stem)
    csv_path = stem.with_name(stem.name + ".csv")
    path = settings_path(stem)
    if not path.exists():
        if csv_path.exists() or replot:
            raise PBInputError(
                f"{csv_path} has no recorded settings ({path.name} is missing); delete it or "
                "choose another --out" + ("" if not replot else ", then run the experiment")
            )
        return None
    try:
        with open(path) as fh:
            old = json.load(fh)
        if not isinstance(old, dict):
            raise ValueError
    except (OSError, UnicodeDecodeError, ValueError):
        raise PBInputError(f"damaged settings file {path}; delete it with its results or "
                           "choose another --out") from None
    diff = [k for k in (settings if keys is None else keys) if old.get(k) != settings[k]]
    if diff:
        k = diff[0]
        raise PBInputError(
            f"{csv_path.parent} holds results with other settings ({k} = {old.get(k)!r}, "
            f"asked {settings[k]!r}); choose another --out, delete them"
            + (", or replot with the recorded settings" if replot else "")
        )
    return old
