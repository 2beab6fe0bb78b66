"""Which code ran: the pbnn package's version, the folder its modules were imported from and the
git commit of that folder with a dirty flag (:func:`code_provenance`); every run's
``config.json`` records it in "info" ("code", not hashed: a run folder's name does not change
with the code), and every tool prints it with ``--version`` (:class:`pbexact.cli.
ArgumentParser`).
"""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

#: The distribution name of this repository's packages (pyproject.toml).
DISTRIBUTION = "pbnn"
#: Seconds a git query may take before the commit is recorded as unknown.
GIT_TIMEOUT = 10.0


def source_root() -> Path:
    """The folder the packages (pbexact, pbscale, analysis) were imported from."""
    return Path(__file__).resolve().parent.parent


def package_version() -> str:
    """The installed distribution's version ("unknown" when pbnn is not installed, e.g. run from
    a checkout on PYTHONPATH alone). An editable install elsewhere reports its own version; the
    import path and the commit say which code this is."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                             timeout=GIT_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def code_provenance() -> dict:
    """{"version", "path" (:func:`source_root`), "commit" (the checkout's HEAD, or None),
    "dirty" (tracked files differ from HEAD; None without a commit), "git" (what was found:
    "checkout", "not a git checkout" or "git not found")}. Untracked files do not count as
    dirty (run folders and results live in the checkout)."""
    root = source_root()
    info: dict = {"version": package_version(), "path": str(root), "commit": None,
                  "dirty": None}
    if not (root / ".git").exists():
        return {**info, "git": "not a git checkout"}
    head = _git(root, "rev-parse", "HEAD")
    if head is None:
        found = _git(root, "--version") is not None
        return {**info, "git": "not a git checkout" if found else "git not found"}
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {**info, "commit": head.strip(), "dirty": None if status is None else bool(
        status.strip()), "git": "checkout"}


def version_text(prog: str = "pbnn") -> str:
    """The ``--version`` line: program, version, import path, commit (+dirty) or why none."""
    c = code_provenance()
    if c["commit"] is None:
        commit = c["git"]
    else:
        commit = f"commit {c['commit'][:12]}{' (dirty)' if c['dirty'] else ''}"
    return f"{prog} {c['version']} from {c['path']}, {commit}"
