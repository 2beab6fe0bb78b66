"""Atomic writes and resumable run folders: every file is written to a temporary name in the same
folder and moved into place with ``os.replace``, so an interrupted run leaves either the old file
or the new one, never half of one."""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import stat
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from pbexact import io as exact_io
from pbexact.errors import PBInputError
from pbexact.io import atomic_write_bytes, atomic_write_text

__all__ = ["DAMAGED_FIX", "DIVERGED", "WRITE_FIXES", "atomic_write_text", "check_output_file",
           "checkpoint_bytes", "load_checkpoint", "read_csv", "read_diverged", "read_json",
           "read_summary", "regular_file", "save_checkpoint", "summary_problem", "write_csv",
           "write_diverged", "write_json", "write_output", "writing"]


#: What to do about a damaged run file (named in every such error).
DAMAGED_FIX = "delete the run folder or choose another --out"


def regular_file(path: str | Path) -> bool:
    """Whether ``path`` is there, as a regular file (a symlink to one counts); a FIFO, socket or
    device there, which a read would block on or never finish, raises a one-line
    :class:`PBInputError` naming it (a folder is left to the caller's own message)."""
    path = Path(path)
    if path.is_file():
        return True
    if path.exists() and not path.is_dir():
        raise PBInputError(f"damaged run file {path} (not a regular file: a FIFO, socket or "
                           f"device); {DAMAGED_FIX}")
    return False


def read_json(path: str | Path) -> Any:
    """A JSON file of a run folder; a damaged one (truncated, not JSON, a folder, not a regular
    file) raises a one-line :class:`PBInputError` naming the file and the fix."""
    regular_file(path)
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not valid JSON"
        raise PBInputError(f"damaged run file {path} ({why}); {DAMAGED_FIX}") from None


def summary_problem(summary: dict) -> str | None:
    """Why the values of a ``summary.json`` object cannot be read back, or None: every
    ``final_*`` entry (a metric of the last epoch) and the seconds must be numbers (not
    strings, booleans or null), the fractions (``final_remaining*``, ``final_*acc``) in
    [0, 1] (an accuracy may be NaN: no test set), the seconds not negative."""
    for key, value in summary.items():
        if not (key.startswith("final_") or key in ("train_seconds", "seconds_per_epoch")):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{key} is {value!r}, not a number"
        remaining = key.startswith("final_remaining")
        if (remaining or key.endswith("acc")) and not 0 <= value <= 1 and not (
                math.isnan(value) and not remaining):
            return f"{key} is {value!r}, not a fraction in [0, 1]"
        if "seconds" in key and value < 0:
            return f"{key} is {value!r}, a negative time"
    return None


def read_summary(path: str | Path, keys: tuple[str, ...] = ()) -> dict:
    """The ``summary.json`` of a finished run: a JSON object holding ``keys``, its values
    readable (:func:`summary_problem`); anything else (``[]``, ``{}``, entries missing,
    ``"final_test_acc": "NaN"``, a fraction of -3, truncated) raises a one-line
    :class:`PBInputError` naming the file and the fix."""
    summary = read_json(path)
    missing = [k for k in keys if not isinstance(summary, dict) or k not in summary]
    if not isinstance(summary, dict) or not summary or missing:
        what = "not a JSON object" if not isinstance(summary, dict) else (
            f"no {missing[0]!r} entry" if missing else "empty")
        raise PBInputError(f"damaged run file {path} ({what}); {DAMAGED_FIX}")
    problem = summary_problem(summary)
    if problem:
        raise PBInputError(f"damaged run file {path} ({problem}); {DAMAGED_FIX}")
    return summary


#: What to do about a failed write, by errno (:func:`writing`); the rest: free disk space.
WRITE_FIXES = {
    errno.EISDIR: f"a folder is where a file belongs; {DAMAGED_FIX}",
    errno.ENOTDIR: f"a file is where a folder belongs; {DAMAGED_FIX}",
    errno.EEXIST: f"a file is where a folder belongs; {DAMAGED_FIX}",
    errno.EACCES: "make the folder writable or choose another --out",
    errno.EPERM: "make the folder writable or choose another --out",
    errno.EROFS: "the file system is read-only: choose another --out",
    errno.ENAMETOOLONG: "the path is too long: choose a shorter --out",
    errno.EFBIG: "the file is larger than the file-size limit (ulimit -f) allows: raise the "
                 "limit, free disk space or choose another --out",
}


#: The record a diverged run leaves in its folder (:func:`write_diverged`).
DIVERGED = "diverged.json"


def write_diverged(folder: str | Path, record: dict) -> None:
    """``diverged.json`` in ``folder``, atomically: the record of
    :meth:`pbscale.runs.records.Diverged.record` (keys "epoch", "step", "where", "reason",
    "last_metrics")."""
    write_json(Path(folder) / DIVERGED, record)


def read_diverged(folder: str | Path) -> dict | None:
    """The folder's ``diverged.json`` record, or None when there is none. A damaged one (not a
    JSON object with a "reason", truncated, a folder or FIFO) raises a one-line
    :class:`PBInputError` naming the file and the fix (it is never taken for "not diverged")."""
    path = Path(folder) / DIVERGED
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_dir():
        raise PBInputError(f"damaged run file {path} (a folder); {DAMAGED_FIX}")
    record = read_json(path)
    if not isinstance(record, dict) or not isinstance(record.get("reason"), str):
        raise PBInputError(f"damaged run file {path} (not a divergence record); {DAMAGED_FIX}")
    return record


@contextmanager
def writing(path: str | Path, output: bool = False) -> Iterator[None]:
    """Turns an OSError while ``path`` is written into a one-line :class:`PBInputError` naming
    the file and the fix its cause asks for (:data:`WRITE_FIXES`; disk full or quota: free
    disk space and rerun, which resumes a run). The writes are atomic, so the file's previous
    version, and with it a run's last checkpoint, is intact. ``output``: ``path`` is a file a
    command was asked to write (an export's ``--out``), not a run's: the line says that a file
    already there is intact and to run the command again (nothing resumes)."""
    try:
        yield
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        if output:
            fix = WRITE_FIXES.get(exc.errno, "free disk space or choose another --out, then "
                                             "run the command again")
            raise PBInputError(f"cannot write {path} ({why}); a file already there is intact: "
                               f"{fix}") from None
        fix = WRITE_FIXES.get(exc.errno, "free disk space and rerun the same command to resume")
        raise PBInputError(
            f"cannot write {path} ({why}); the files written before, a run's last checkpoint "
            f"included, are intact: {fix}") from None


def check_output_file(path: str | Path, flag: str = "--out") -> Path:
    """Check, before any work, a file a tool is asked to write (an export's ``--out``): a path
    that can name a file (:func:`pbexact.io.path_problem`), not a folder, under folders only
    (those that do not exist yet are created by :func:`write_output`, under a folder that can
    be written), and, when it exists, a regular file (a device node, FIFO, socket or symlink
    there is refused: the atomic write would replace the node, or a write follow the link)."""
    problem = exact_io.path_problem(str(path))
    if problem:
        raise PBInputError(f"{flag} {str(path)[:60]!r} {problem}; name another file")
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()
                             and not stat.S_ISREG(path.lstat().st_mode)):
        what = "a symlink" if path.is_symlink() else "not a regular file (a device, FIFO or socket)"
        raise PBInputError(f"{flag} {path} is {what}; name a new or regular file")
    if path.is_dir():
        raise PBInputError(f"{flag} {path} is a folder; give a file name, e.g. {path / 'net'}")
    parent = path.absolute().parent
    above = next((p for p in (parent, *parent.parents) if p.exists() or p.is_symlink()), None)
    if above is not None and not above.is_dir():
        raise PBInputError(f"{flag} {path} is under {above}, which is a file, not a folder; "
                           "name a file in a folder")
    if not parent.is_dir() and above is not None and not os.access(above, os.W_OK | os.X_OK):
        raise PBInputError(f"{flag} {path}: folder {parent} does not exist and {above} cannot "
                           "be written (permission denied); choose a writable place")
    return path


def write_output(path: str | Path, data: bytes, flag: str = "--out") -> Path:
    """``data`` written to the file ``path`` a tool was asked to write, checked
    (:func:`check_output_file`) and atomically (a temporary file, then a rename: a failed write,
    e.g. a full disk or ``ulimit -f``, is one line and leaves a file already there intact); the
    folders of ``path`` that do not exist yet are created first."""
    path = check_output_file(path, flag)
    with writing(path, output=True):
        path.parent.mkdir(parents=True, exist_ok=True)  # --out in a new folder: as other tools
        atomic_write_bytes(path, data)
    return path


def checkpoint_bytes(state: dict) -> bytes:
    """``torch.save`` of ``state`` as bytes (what :func:`save_checkpoint` writes)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def write_json(path: str | Path, obj: Any) -> None:
    """``obj`` as JSON, atomically (a failed write: one line, see :func:`writing`)."""
    with writing(path):
        exact_io.write_json(path, obj)


def write_csv(path: str | Path, rows: list[dict]) -> None:
    """Rows of equal keys as CSV with a header (nothing is written for no rows), atomically."""
    if rows:
        with writing(path):
            exact_io.write_csv(path, list(rows[0]), [list(r.values()) for r in rows])


def read_csv(path: str | Path) -> list[dict]:
    """The rows of a CSV file with a header, numbers parsed (a FIFO or device refused, see
    :func:`regular_file`)."""
    regular_file(path)
    with open(path, newline="") as fh:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def _number(v: str) -> Any:
    try:
        f = float(v)
    except ValueError:
        return v
    return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f


def save_checkpoint(path: str | Path, state: dict) -> None:
    """``torch.save`` of ``state`` (tensors, numbers, strings, containers), atomically (a
    failed write: one line, see :func:`writing`); checkpoints and exported networks."""
    data = checkpoint_bytes(state)
    with writing(path):
        atomic_write_bytes(path, data)


def load_checkpoint(path: str | Path, keys: tuple[str, ...] = ()) -> dict | None:
    """The checkpoint at ``path``, or None when there is none.

    Loaded with ``weights_only=True``: only tensors, numbers, strings and containers come back,
    a file holding any other pickled object (which could run code) is refused. Our checkpoints
    hold nothing else (optimizer states, generator states as uint8 tensors, histories of
    numbers). A damaged file, or one without the ``keys`` expected, raises a one-line
    :class:`PBInputError` naming the file and the fix.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    regular_file(path)  # a FIFO would block torch.load forever
    try:
        with warnings.catch_warnings():  # a foreign file's pickle protocol: refused below anyway
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # truncated, random bytes, a folder, or a refused pickled object
        why = "is a folder" if path.is_dir() else (
            "unreadable, or holds objects other than tensors and numbers, which are refused")
        raise PBInputError(f"damaged checkpoint {path} ({why}); {DAMAGED_FIX}") from None
    missing = [k for k in keys if not isinstance(state, dict) or k not in state]
    if missing:
        raise PBInputError(
            f"damaged checkpoint {path} (no {missing[0]!r} entry); {DAMAGED_FIX}"
        )
    return state
