"""docs/own_network.md is executed: each ``python`` block is written to the file its first line
names (``# file: NAME.py``), then each command of the ``bash`` block runs in that folder, in
order, through the shell (as a user pastes them); the ``toml`` block is a sweep file the sweep
accepts (its runs planned: ``--dry-run``). What the page says its commands give is checked: the
comparison prints both methods, the command-line run reads back the finished ARMS run of the
Python API, the export reproduces the run's test accuracy, pareto draws the runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _doc_pages import blocks, walk_page

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "own_network.md"


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """The folder where the page's files were written and its commands ran, with each
    command's output."""
    root = tmp_path_factory.mktemp("own")
    return root, walk_page(DOC, root)


def test_the_python_blocks_and_the_commands_run(walked):
    root, outputs = walked
    assert "wrote mydata.npz" in outputs[0]
    cp, arms = (re.search(rf"^{m}: test accuracy ([0-9.]+) with ([0-9.]+)% of the masked",
                          outputs[1], re.M) for m in ("cp", "arms"))
    assert cp and arms, outputs[1]
    assert "['conv1.weight', 'conv2.weight', 'stem.weight']" in outputs[1]
    # the command line found the API's ARMS run finished: one folder per method
    folders = sorted(p.name.rsplit("-", 1)[0] for p in (root / "runs/mine").iterdir())
    assert folders == ["SmallResNet-joint-arms", "SmallResNet-joint-cp"]
    assert outputs[2].startswith(f"test_acc {float(arms.group(1)):.4f}")


def test_the_export_reproduces_the_run(walked):
    root, _ = walked
    (folder,) = (root / "runs/mine").glob("SmallResNet-joint-arms-*")
    summary = json.loads((folder / "summary.json").read_text())
    net = torch.export.load(str(root / "mine.pt2")).module()
    with np.load(root / "mydata.npz") as f:
        x, y = torch.from_numpy(f["x_test"]), torch.from_numpy(f["y_test"])
    with torch.no_grad():
        acc = int((net(x).argmax(1) == y).sum()) / len(y)
    assert acc == summary["final_test_acc"]
    assert list((root / "figures/mine").glob("pareto_mynet-SmallResNet_joint.png"))


def test_the_sweep_block_is_a_valid_sweep(walked):
    root, _ = walked
    (toml,) = blocks(DOC, "toml")
    (root / "mine.toml").write_text(toml)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)])}
    res = subprocess.run([sys.executable, "-m", "pbscale.sweep", "run", "mine.toml",
                          "--dry-run"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if "pbscale.prune" in ln]
    assert len(lines) == 12 and all("--model mynet:SmallResNet" in ln and "--data mydata.npz"
                                    in ln for ln in lines)
