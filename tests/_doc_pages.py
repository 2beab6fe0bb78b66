"""Executing a docs page as a reader would (tests/test_own_network_doc.py,
tests/test_structured_doc.py): its ``python`` blocks written as the files their first line names
(``# file: NAME.py``), then each line of its one ``bash`` block run in that folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def blocks(doc: Path, kind: str) -> list[str]:
    """The page's fenced blocks of ``kind`` (``python``, ``bash``, ``toml``), in order."""
    return re.findall(rf"```{kind}\n(.*?)```", doc.read_text(), re.S)


def walk_page(doc: Path, root: Path) -> list[str]:
    """Write the page's python blocks under ``root`` and run its bash block's lines there (one
    torch thread, the checkout and ``root`` on PYTHONPATH); each line must exit 0. Returns
    each line's stdout."""
    for code in blocks(doc, "python"):
        first, _, rest = code.partition("\n")
        match = re.fullmatch(r"# file: (\w+\.py)", first.strip())
        assert match, f"a python block of {doc.name} does not start with '# file: NAME.py'"
        (root / match.group(1)).write_text(rest)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)]),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    (bash,) = blocks(doc, "bash")
    outputs = []
    for line in bash.strip().splitlines():
        cmd = line.replace("python ", f"{sys.executable} ", 1)
        res = subprocess.run(cmd, shell=True, cwd=root, env=env, capture_output=True,
                             text=True, timeout=600)
        assert res.returncode == 0, (line, res.stderr[-2000:])
        outputs.append(res.stdout)
    return outputs
