"""Atomic writes and resumable run folders: every file is written to a temporary name in the same
folder and moved into place with ``os.replace``, so an interrupted run leaves either the old file
or the new one, never half of one."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import torch

from pbexact.io import atomic_write_bytes, atomic_write_text, write_json
from pbexact.io import write_csv as write_table

__all__ = ["atomic_write_text", "load_checkpoint", "read_csv", "read_json", "save_checkpoint",
           "write_csv", "write_json"]


def read_json(path: str | Path) -> Any:
    with open(path) as fh:
        return json.load(fh)


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


def load_checkpoint(path: str | Path) -> dict | None:
    path = Path(path)
    if not path.exists():
        return None
    # our own checkpoints hold optimizer states and generator states (tensors, dicts, numbers)
    return torch.load(path, map_location="cpu", weights_only=True)
