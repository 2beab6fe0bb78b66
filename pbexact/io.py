"""Atomic writes shared by every tool that saves results (analysis, pbscale), and the checks of
output paths that every tool makes before it computes anything.

Each file is written to a temporary name ``.NAME.<pid>.<random>.tmp`` in its folder, flushed to
disk and moved into place with ``os.replace``: a reader, or an interrupted run, sees the old file
or the new one, never half. The file gets the mode a plain ``open`` would give it (0666 less the
umask). A writer killed mid-write leaves its temporary file behind; the next write of the same
name removes those whose process is gone. A write that fails (disk full, quota, read-only folder)
raises :class:`WriteError`, an ``OSError`` that knows the file and how many bytes it needed:
:meth:`WriteError.one_line` is the one-line message every command-line tool prints.
"""

from __future__ import annotations

import csv
import errno
import glob
import io
import json
import os
import secrets
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .errors import PBInputError, format_bytes

#: errno values that mean "no room": the fix is to free space, not to fix permissions.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class WriteError(OSError):
    """An atomic write of ``path`` that failed (``errno`` and ``strerror`` of the cause;
    ``size``: the bytes the file needed, when known). Nothing was replaced: the previous version
    of the file, and every file written before, is intact."""

    def __init__(self, cause: OSError, path: Path, size: int | None = None) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause) or type(cause).__name__,
                         str(path))
        self.path = path
        self.size = size

    def one_line(self, flag: str = "--out") -> str:
        """``<problem>; <fix>``: the file, the cause, the folder and the space it needed."""
        folder = self.path.parent
        if self.errno in NO_SPACE:
            need = "" if self.size is None else f" {format_bytes(self.size)} more for it"
            return (f"cannot write {self.path} ({self.strerror}): {folder} needs{need or ' room'}"
                    f"; free disk space there or choose another {flag} (the files written "
                    "before are intact)")
        return (f"cannot write {self.path} ({self.strerror}); make {folder} writable or "
                f"choose another {flag} (the files written before are intact)")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # someone else's live process (or a nonsense number: treat as alive)
    return True


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Delete ``.NAME.<pid>.<random>.tmp`` files beside ``path`` whose writer process is gone
    (left by a writer killed mid-write); returns the removed paths."""
    path = Path(path)
    removed = []
    try:
        candidates = list(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))
    except OSError:
        return removed
    for tmp in candidates:
        middle = tmp.name[len(path.name) + 2 : -len(".tmp")].split(".")
        if len(middle) != 2 or not middle[0].isdigit():
            continue
        if not _pid_alive(int(middle[0])):
            try:
                tmp.unlink()
                removed.append(tmp)
            except OSError:
                pass
    return removed


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring); a failed write raises
    :class:`WriteError` and leaves no temporary file."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        # os.open with 0o666 applies the umask, as a plain open() does (mkstemp would force 0600)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except WriteError:
        raise
    except OSError as exc:
        raise WriteError(exc, path, len(data)) from exc
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """The text :func:`write_csv` writes."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def write_csv(path: str | Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Path:
    return atomic_write_text(path, csv_text(header, rows))


#: The longest file or folder name, in bytes (Linux and macOS file systems).
NAME_MAX = 255


def _path_max() -> int:
    try:
        return int(os.pathconf("/", "PC_PATH_MAX"))
    except (OSError, ValueError, AttributeError):
        return 4096


#: The longest path the system takes, in bytes (PATH_MAX: 4,096 on Linux, 1,024 on macOS).
PATH_MAX = _path_max()
#: Bytes of :data:`PATH_MAX` a path given to a tool leaves for what the tool writes below it (a
#: run folder's name, a group's folder, a file and the temporary name of its atomic write).
PATH_RESERVE = 512


def path_problem(text: str) -> str | None:
    """Why ``text`` cannot name a path (empty: the current folder, which no tool means; a NUL; a
    name over :data:`NAME_MAX` bytes; an absolute path that leaves less than
    :data:`PATH_RESERVE` of :data:`PATH_MAX` for the files below it), or None."""
    if not text.strip():
        return "is empty"
    if "\0" in text:
        return "holds a NUL character"
    long = [p for p in Path(text).parts if len(os.fsencode(p)) > NAME_MAX]
    if long:
        return f"has a name of {len(os.fsencode(long[0]))} bytes (at most {NAME_MAX})"
    full = len(os.fsencode(os.path.abspath(text)))
    if full > PATH_MAX - PATH_RESERVE:
        return (f"is {full:,} bytes long as an absolute path (at most "
                f"{PATH_MAX - PATH_RESERVE:,}: the system's limit is {PATH_MAX:,} and the files "
                f"below it need room)")
    return None


def inside(path: str | Path, root: str | Path, flag: str = "--out") -> Path:
    """``path`` if it resolves inside ``root`` (symlinks followed); else a one-line refusal, so
    that a tool writes only where the user pointed it (a run folder under ``--out`` that is a
    symlink to elsewhere)."""
    path, root = Path(path), Path(root)
    real_root = root.resolve()
    real = path.resolve()
    if real != real_root and not real.is_relative_to(real_root):
        raise PBInputError(f"{path} resolves to {real}, outside {root} (a symlink?); remove the "
                           f"link or choose another {flag}")
    return path


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        if p.is_symlink():  # a dangling link: its target's folder decides
            break
        p = p.parent
    return p


def check_out_dir(path: str | Path, flag: str = "--out") -> Path:
    """Check, before any work, that ``path`` is a writable folder, creating it (the user named it)
    if need be. Raises :class:`PBInputError` when it is a file, lies under a file, or cannot be
    created or written, and when given as text, when it is empty (the current folder) or holds
    a name too long for the file system (:func:`path_problem`)."""
    problem = path_problem(path) if isinstance(path, str) else None
    if problem:
        raise PBInputError(f"{flag} {path[:60]!r} {problem}; name another folder")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise PBInputError(f"{flag} {path} is a file, not a folder; choose a folder")
    base = _nearest_existing(path)
    if base != path and not base.is_dir():
        raise PBInputError(f"{flag} {path} lies under the file {base}; choose a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PBInputError(
            f"{flag} {path} cannot be created ({exc.strerror}); choose another folder"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PBInputError(f"{flag} {path} is not writable; choose another folder")
    return path


def check_out_file(path: str | Path, flag: str = "--json") -> Path:
    """Check, before any work, that ``path`` can be written as a file (not a folder, not under a
    file, in a writable folder)."""
    path = Path(path)
    if path.is_dir():
        raise PBInputError(f"{flag} {path} is a folder; give a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise PBInputError(f"{flag} {path} cannot be written; choose another file")
    check_out_dir(path.parent, flag=f"the folder of {flag}")
    return path


def new_partial_folder(path: str | Path) -> Path:
    """A fresh empty folder ``.NAME.<pid>.<random>.partial`` beside ``path`` to build a result
    in; :func:`replace_folder` swaps it in once complete. Partial folders of processes that are
    gone (killed mid-build) are removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob(f".{glob.escape(path.name)}.*.partial"):
        middle = old.name[len(path.name) + 2 : -len(".partial")].split(".")
        if len(middle) == 2 and middle[0].isdigit() and not _pid_alive(int(middle[0])):
            shutil.rmtree(old, ignore_errors=True)
    work = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.partial"
    work.mkdir()
    return work


def replace_folder(new: str | Path, path: str | Path) -> Path:
    """Move the complete folder ``new`` to ``path``, replacing the folder there. The old folder
    is first renamed aside (``.NAME.<pid>.<random>.old``) and deleted only after ``new`` is in
    place: at every moment ``path`` holds the old result, the new one, or (between two renames)
    nothing while the old one is still on disk beside it."""
    new, path = Path(new), Path(path)
    aside = None
    if path.exists():
        aside = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.old"
        os.replace(path, aside)
    try:
        os.replace(new, path)
    except BaseException:
        if aside is not None:
            os.replace(aside, path)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return path
