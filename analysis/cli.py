"""What every `python -m analysis.*` entry point shares: one-line errors and atomic writes."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Sequence
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
    "output_folders", "read_table", "run", "save_figure", "write_csv", "write_json",
]


def run(
    main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None
) -> int:
    """Call ``main`` through :func:`pbexact.cli.run_main`: bad input becomes ``error: ...`` on
    stderr and exit code 2 (argparse's own errors, already printed as one line by
    `pbexact.cli.ArgumentParser`, return their code), Ctrl-C one line and 130."""
    return run_main(lambda: main(argv))


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
        raise PBInputError(f"cannot read the J table {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise PBInputError(
            f"the J table {path} is not a text file; give a CSV with columns h,J"
        ) from None
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or [c.strip() for c in rows[0]] != ["h", "J"]:
        raise PBInputError(f"corrupt J table {path}: the first line must be the header 'h,J'")
    values: dict[int, float] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != 2:
            raise PBInputError(
                f"corrupt J table {path}, line {line}: expected the two columns h,J, got "
                f"{len(row)} values {row!r}"
            )
        try:
            h, j = int(row[0]), float(row[1])
        except ValueError:
            raise PBInputError(
                f"corrupt J table {path}, line {line}: expected 'h,J' numbers, got {row!r}"
            ) from None
        if h in values or h < 0:
            raise PBInputError(f"corrupt J table {path}, line {line}: h={h} repeated or < 0")
        values[h] = j
    if sorted(values) != list(range(len(values))):
        raise PBInputError(f"corrupt J table {path}: the h column must cover 0..{len(values) - 1}")
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
