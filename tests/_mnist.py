"""Where the tests find real MNIST: ``shared/data/mnist`` beside the checkout or beside any folder
above it (a git worktree sits deeper than the project root), and the mark of tests that need it."""

from __future__ import annotations

from pathlib import Path

import pytest


def _find() -> Path:
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "shared" / "data" / "mnist"
        if candidate.is_dir():
            return candidate
    return Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "mnist"


#: The four MNIST IDX files (gzip), or a path that does not exist.
MNIST_DIR = _find()
#: Skips a test where real MNIST is not present.
needs_mnist = pytest.mark.skipif(not MNIST_DIR.is_dir(), reason="shared MNIST not present")
