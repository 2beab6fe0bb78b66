"""The paths of ``analysis.pareto`` and ``analysis.scale_report``: the folders they read
(:func:`check_in_folder`) and the report files they write under ``--out``, every one built in
memory first (:class:`Outputs`), then each written atomically
(:func:`pbexact.io.atomic_write_bytes`).

What that guards: a path under ``--out`` that resolves outside it (a symlink to elsewhere) is
refused before anything is written; a disk without the room for the files is refused before
anything is written, and one that fills up during the writes (another writer took the room) is
one line naming the folder and the bytes still to write, every file written so far whole and
every older file as it was. ``--out ''`` and a path component longer than the file system allows
are refused as ``--out`` values (:func:`out_folder`, :func:`check_out`).
"""

from __future__ import annotations

import csv
import errno
import io
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pbexact.cli import out_folder
from pbexact.errors import PBInputError, format_bytes
from pbexact.io import NAME_MAX, atomic_write_bytes, check_out_dir, inside, path_problem

# the path checks are pbexact's, shared with pbscale's tools
__all__ = ["FULL", "NAME_MAX", "Outputs", "check_in_folder", "check_out", "csv_bytes",
           "figure_bytes", "inside", "out_folder", "path_problem"]

#: Errors of a full disk or quota.
FULL = (errno.ENOSPC, errno.EDQUOT)


def check_out(path: Path, flag: str = "--out") -> Path:
    """:func:`pbexact.io.check_out_dir` with the cases it lets through as one line: a bad path
    (:func:`path_problem`) and any other OS error while looking at it."""
    problem = path_problem(str(path))
    if problem:
        raise PBInputError(f"{flag} {str(path)[:60]!r} {problem}; name another folder")
    try:
        return check_out_dir(path, flag)
    except OSError as exc:
        raise PBInputError(f"{flag} {path} cannot be used ({exc.strerror}); choose another "
                           "folder") from None


def check_in_folder(path: Path, flag: str, fix: str) -> Path:
    """A folder a tool reads from (``--runs``, run folders): a bad path (:func:`path_problem`),
    one that cannot be looked at, does not exist or is a file is one line ending in ``fix``."""
    problem = path_problem(str(path))
    if problem:
        raise PBInputError(f"{flag}{str(path)[:60]!r} {problem}; {fix}")
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except OSError as exc:
        raise PBInputError(f"cannot look at {flag}{path} ({exc.strerror}); {fix}") from None
    if not exists:
        raise PBInputError(f"{flag}{path} does not exist; {fix}")
    if not is_dir:
        raise PBInputError(f"{flag}{path} is a file; {fix}")
    return path


def csv_bytes(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> bytes:
    """A CSV file as :func:`pbexact.io.write_csv` writes it."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue().encode()


def figure_bytes(fig: Any) -> bytes:
    """A matplotlib figure as the PNG :func:`analysis.cli.save_figure` writes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130, bbox_inches="tight")
    return buf.getvalue()


class Outputs:
    """The files a tool writes under ``root``, collected (path relative to root -> bytes) and
    written together by :meth:`write`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.files: dict[Path, bytes] = {}

    def add(self, rel: str | Path, data: bytes) -> None:
        self.files[Path(rel)] = data

    def text(self, rel: str | Path, text: str) -> None:
        self.add(rel, text.encode())

    def csv(self, rel: str | Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        self.add(rel, csv_bytes(header, rows))

    def figure(self, rel: str | Path, fig: Any) -> None:
        self.add(rel, figure_bytes(fig))

    def needed(self) -> int:
        """Bytes the writes take beyond what the files they replace hold, plus room for the
        largest file's temporary copy."""
        total, largest = 0, 0
        for rel, data in self.files.items():
            try:
                old = (self.root / rel).stat().st_size
            except OSError:
                old = 0
            total += len(data) - old
            largest = max(largest, len(data))
        return max(total, 0) + largest

    def write(self) -> list[Path]:
        """Write every file (checked to lie inside root, then atomically, in order); a full
        disk or another OS error is one line (:class:`PBInputError`)."""
        paths = [inside(self.root / rel, self.root) for rel in self.files]
        need = self.needed()
        try:
            free = shutil.disk_usage(self.root).free
        except OSError:
            free = need
        if free < need:
            raise PBInputError(
                f"no space for the {len(paths)} files in {self.root}: they need "
                f"{format_bytes(need)}, the disk has {format_bytes(free)} free; free some space "
                "or choose another --out")
        done: list[Path] = []
        for path, data in zip(paths, self.files.values()):
            try:
                atomic_write_bytes(path, data)
            except OSError as exc:
                left = sum(len(d) for d in list(self.files.values())[len(done):])
                if exc.errno in FULL:
                    raise PBInputError(
                        f"no space left in {self.root} while writing {path.name}: the "
                        f"{len(paths) - len(done)} files still to write need "
                        f"{format_bytes(left)} ({left} bytes); the files written are whole, "
                        "the older ones untouched; free some space or choose another --out"
                    ) from None
                raise PBInputError(f"cannot write {path} ({exc.strerror}); choose another "
                                   "--out") from None
            done.append(path)
        return done
