"""docs/structured.md is executed: each ``python`` block is written to the file its first line
names (``# file: NAME.py``), then each command of the ``bash`` block runs in that folder, in
order, through the shell (as a user pastes them). What the page says they give is checked: the
API's run prints its smaller network's parameters and MACs (fewer than the dense network's) and
latency, the command line's run its structured.pt line, the exported files (the smaller
networks) give the runs' test accuracies with the pruned parameter counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from _doc_pages import walk_page

pytest.importorskip("torch_pruning")

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "structured.md"


@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """The folder where the page's files were written and its commands ran, with each
    command's output."""
    root = tmp_path_factory.mktemp("structured")
    return root, walk_page(DOC, root)


def _summary(root: Path, method: str) -> dict:
    (folder,) = (root / "runs/structured").glob(f"MyCNN-joint-{method}-*")
    return json.loads((folder / "summary.json").read_text())


def test_the_api_and_the_command_line_prune_channels(walked):
    root, outputs = walked
    assert "wrote mydata.npz" in outputs[0]
    cp = _summary(root, "cp")
    params = re.search(r"^params ([0-9,]+) -> ([0-9,]+), MACs ([0-9,]+) -> ([0-9,]+), CPU "
                       r"latency batch 128 [0-9.]+ -> [0-9.]+ ms$", outputs[1], re.M)
    assert params, outputs[1]
    dense, pruned, dense_macs, pruned_macs = (int(g.replace(",", "")) for g in params.groups())
    assert (dense, pruned) == (cp["dense_params"], cp["pruned_params"]) and pruned < dense
    assert pruned_macs == cp["pruned_macs"] < dense_macs
    # the residual addition ties stem's and conv2's output channels
    shapes = re.search(r"'stem.weight': \((\d+),.*'conv2.weight': \((\d+),", outputs[1])
    assert shapes and shapes.group(1) == shapes.group(2)
    assert outputs[2].startswith("test_acc ") and "structured.pt: params" in outputs[2]
    assert outputs[3].startswith("wrote mycnn_arms.pt2 (pt2")
    arms = _summary(root, "arms")
    assert arms["pruned_params"] < arms["dense_params"]


@pytest.mark.parametrize("method", ["cp", "arms"])
def test_the_exported_smaller_networks_reproduce_the_runs(walked, method):
    root, outputs = walked
    summary = _summary(root, method)
    net = torch.export.load(str(root / f"mycnn_{method}.pt2")).module()
    assert sum(p.numel() for p in net.parameters()) == summary["pruned_params"]
    with np.load(root / "mydata.npz") as f:
        x, y = torch.from_numpy(f["x_test"]), torch.from_numpy(f["y_test"])
    with torch.no_grad():
        acc = int((net(x).argmax(1) == y).sum()) / len(y)
    assert acc == summary["final_test_acc"]
    line = outputs[4 if method == "cp" else 5]
    assert line.startswith(f"mycnn_{method}.pt2: test accuracy {acc:.3f}, "
                           f"{summary['pruned_params']:,} parameters, batch 128 in ")
