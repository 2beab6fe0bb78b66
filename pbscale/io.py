"""Atomic writes and resumable run folders: every file is written to a temporary name in the same
folder and moved into place with ``os.replace``, so an interrupted run leaves either the old file
or the new one, never half of one."""

from __future__ import annotations

import csv
import io
import json
import warnings
from pathlib import Path
from typing import Any

import torch

from pbexact.errors import PBInputError
from pbexact.io import atomic_write_bytes, atomic_write_text, write_json
from pbexact.io import write_csv as write_table

__all__ = ["DAMAGED_FIX", "atomic_write_text", "load_checkpoint", "read_csv", "read_json",
           "save_checkpoint", "write_csv", "write_json"]


#: What to do about a damaged run file (named in every such error).
DAMAGED_FIX = "delete the run folder or choose another --out"


def read_json(path: str | Path) -> Any:
    """A JSON file of a run folder; a damaged one (truncated, not JSON, a folder) raises a
    one-line :class:`PBInputError` naming the file and the fix."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not valid JSON"
        raise PBInputError(f"damaged run file {path} ({why}); {DAMAGED_FIX}") from None


def write_csv(path: str | Path, rows: list[dict]) -> None:
    """Rows of equal keys as CSV with a header (nothing is written for no rows)."""
    if rows:
        write_table(path, list(rows[0]), [list(r.values()) for r in rows])


def read_csv(path: str | Path) -> list[dict]:
    with open(path, newline="") as fh:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def _number(v: str) -> Any:
    try:
        f = float(v)
    except ValueError:
        return v
    return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f


def save_checkpoint(path: str | Path, state: dict) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(path, buf.getvalue())


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
