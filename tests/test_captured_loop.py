"""The captured MC step in the run loop (``python -m pbscale.prune --routes cuda_graph``): the
loop's ``masks_step`` hook, the steps' losses read once per epoch, the choice of runs that are
captured and the ``--routes`` flag. On the CPU the hook runs the captured step's data flow
eagerly (:class:`pbscale.execution.captured.CapturedStep` captures on CUDA only), which must give
the plain run's numbers; tests/test_gpu_routes.py checks the replayed run on a GPU."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch

from pbexact.errors import PBInputError, RunInterrupted
from pbscale import prune as P
from pbscale.execution.captured import CapturedSteps
from pbscale.forward.routes import ALL, NONE, Routes
from pbscale.methods.registry import REGISTRY, names
from pbscale.pruning import config as pconfig
from pbscale.pruning import run as prun
from pbscale.pruning import run as prune_run
from pbscale.runs.contracts import RunHooks
from pbscale.runs.io import read_csv
from pbscale.runs.loop import run as loop_run


def tiny_cfg(**kw) -> pconfig.PruneConfig:
    base = dict(model="lenet", synthetic=48, epochs=2, max_batches=3, batch_size=8, n=4,
                val_size=16, method="arms", mask_lr=0.05)
    base.update(kw)
    return pconfig.PruneConfig(**base)


def _run(tmp: Path, captured: bool, monkeypatch, **kw) -> Path:
    monkeypatch.setattr(prune_run, "captures_steps", lambda *a: captured)
    return Path(prun.run(tiny_cfg(**kw), tmp, quiet=True)["folder"])


@pytest.mark.parametrize("method", ["arms", "loorf", "disarm", "reinforce"])
def test_a_captured_run_on_the_cpu_equals_the_plain_run(tmp_path, monkeypatch, method):
    """The hook's flow (batch into static buffers, the trainer's step, the loss left a tensor
    until the epoch ends): same folder name, masks bit for bit, metrics equal except the mean
    training loss, which is the read-back sum over n in float64 (relative 1e-12)."""
    plain = _run(tmp_path / "plain", False, monkeypatch, method=method)
    hooked = _run(tmp_path / "hooked", True, monkeypatch, method=method)
    assert plain.name == hooked.name
    ma, mb = (torch.load(f / "masks.pt", weights_only=True) for f in (plain, hooked))
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    a, b = read_csv(plain / "metrics.csv"), read_csv(hooked / "metrics.csv")
    assert len(a) == len(b) == 3
    for ra, rb in zip(a, b):
        for k, v in ra.items():
            if k.endswith("seconds"):
                continue
            if k == "train_loss" and not math.isnan(v):
                assert rb[k] == pytest.approx(v, rel=1e-12), k
            else:
                assert rb[k] == v or (math.isnan(v) and math.isnan(rb[k])), k


def test_a_captured_run_cut_by_sigterm_resumes_to_the_same_numbers(tmp_path, monkeypatch):
    """SIGTERM mid-epoch: the losses of the steps taken so far (tensors) go into the
    checkpoint as floats; the resumed run ends with the uninterrupted run's metrics."""
    whole = _run(tmp_path / "whole", True, monkeypatch)
    out = tmp_path / "cut"
    monkeypatch.setattr(prune_run, "captures_steps", lambda *a: True)

    def hook(epoch: int, i: int) -> None:
        if (epoch, i) == (1, 1):  # seen before step 2
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunInterrupted):
        prun.run(tiny_cfg(), out, quiet=True, step_hook=hook)
    state = torch.load(next(out.glob("*/checkpoint.pt")), weights_only=True)
    assert all(isinstance(v, float) for v in state["position"]["losses"])
    folder = Path(prun.run(tiny_cfg(), out, quiet=True)["folder"])
    a, b = read_csv(whole / "metrics.csv"), read_csv(folder / "metrics.csv")
    assert [r["train_loss"] for r in a[1:]] == [r["train_loss"] for r in b[1:]]
    assert [r["test_acc"] for r in a] == [r["test_acc"] for r in b]


class _NanSteps(RunHooks):
    """Takes every mask-training step and reports a NaN loss from step ``bad`` on."""

    def __init__(self, bad: int) -> None:
        self.bad = bad

    def masks_step(self, order: torch.Tensor, i: int) -> torch.Tensor:
        return torch.tensor(math.nan if i >= self.bad else 1.0, dtype=torch.float64)


def test_a_hooked_step_whose_loss_is_nan_stops_the_run_naming_that_step(tmp_path):
    """The loop reads a hook's losses when the epoch ends, and names the first bad step as it
    names a diverged step of its own."""
    cfg, dev, data = prun.prepare(tiny_cfg())
    task, method, loop, _ = prun.build(cfg, data, dev)
    with pytest.raises(PBInputError, match=r"step 2 \(epoch 1, batch 2\).*--mask-lr"):
        loop_run(task, method, loop, tmp_path, device=dev, hooks=[task.evaluation,
                 _NanSteps(1)], lr_flags=task.lr_flags)
    assert not list(tmp_path.glob("*/summary.json"))


def test_which_runs_are_captured():
    """The cuda_graph route, a CUDA device, supermask mode and a family whose step captures:
    the MC estimators, by the registry's attribute (no name is listed here)."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    graph = Routes(cuda_graph=True)
    captured = []
    for name in names("prune-supermask"):
        cfg = tiny_cfg(method=name, param="")
        if prune_run.captures_steps(cfg, cuda, graph):
            captured.append(name)
        assert not prune_run.captures_steps(cfg, cpu, ALL)
        assert not prune_run.captures_steps(cfg, cuda, NONE)
        joint = tiny_cfg(method=name, param="", mode="joint")
        assert not prune_run.captures_steps(joint, cuda, graph)
    assert captured == [n for n in names("prune-supermask") if REGISTRY[n].caps.samples]
    assert captured  # the MC estimators


def test_captured_steps_refuse_a_method_whose_step_does_not_capture():
    cfg, dev, data = prun.prepare(tiny_cfg(method="cp", param=""))
    task, method, _, _ = prun.build(cfg, data, dev)
    with pytest.raises(PBInputError, match="cuda_graph"):
        CapturedSteps(task, method)


def test_routes_flag_on_the_cpu_is_the_plain_run_and_is_recorded(tmp_path, capsys):
    """No route applies off CUDA: ``--routes all`` trains the plain run's folder (same name,
    same metrics) and records the routes asked for in config.json's "info"."""
    args = ["--method", "arms", "--n", "2", "--synthetic", "48", "--epochs", "1",
            "--max-batches", "2", "--batch-size", "8", "--val-size", "16", "--quiet"]
    assert P.main([*args, "--out", str(tmp_path / "a")]) == 0
    assert P.main([*args, "--out", str(tmp_path / "b"), "--routes", "all"]) == 0
    (a,), (b,) = (list((tmp_path / s).glob("lenet-*")) for s in "ab")
    assert a.name == b.name
    assert read_csv(a / "metrics.csv")[-1]["test_acc"] == read_csv(b / "metrics.csv")[-1][
        "test_acc"]
    info = json.loads((b / "config.json").read_text())["info"]
    assert info["routes"] == str(ALL)
    assert "routes" not in json.loads((a / "config.json").read_text())["info"]


def test_routes_flag_refuses_an_unknown_route(capsys):
    assert P.main(["--routes", "warp", "--synthetic", "48"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown route 'warp'" in err[0] and "cuda_graph" in err[0]
