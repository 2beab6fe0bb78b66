"""Data parallelism of ``pbscale.prune`` under torch.distributed (gloo, K = 2 ranks on this
CPU), run through ``tests/_distributed_prune_worker.py``: CP supermask and joint, dense, MP and
GMP runs of LeNet (synthetic images, batch 75 split 37 / 38) equal the single-process runs to
float round-off, the joint ARMS run (samples split, weight gradients summed) too over its first
MC steps; every rank holds bit-identical state (weights, masks, logits, optimizer state, buffers)
at every checkpoint and writes identical metrics and exported masks; BatchNorm ResNet-20 runs
(dense, CP) keep their ranks identical; a run stopped by SIGTERM on ONE rank stops on every
rank at the same step and resumes to the uninterrupted distributed run's exact state."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _launch import free_port, worker_env

from pbscale import io

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "_distributed_prune_worker.py")
TIMING = ("train_seconds", "val_seconds")
NEW = ["st-theta-joint", "hardconcrete-joint", "edgepopup"]
LENET = ["cp-supermask", "cp-joint", "dense", "mp", "gmp", "dense-tail", "arms-joint", *NEW]
#: whole runs equal to one process (the ARMS run: its first MC steps)
EQUAL = [*LENET[:6], *NEW]
ALL = [*LENET, "resnet-dense", "resnet-cp"]
#: per tensor, max |K=2 - K=1| <= TOL * max |K=1| (measured: 3.6e-5 CP (RMSprop on the logits
#: turns round-off in near-zero gradients into larger steps), 9e-7 dense / MP / GMP)
TOL = 1e-4


def _launch(out: Path, cases: list[str], *stops: str, ranks: int = 2) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    pre = ([] if ranks == 1 else
           ["-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_addr",
            "127.0.0.1", "--master_port", str(free_port())])
    return subprocess.Popen([sys.executable, *pre, WORKER, str(out), ",".join(cases), *stops],
                            env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _wait(proc: subprocess.Popen) -> None:
    text, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, text[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One single-process launch and one K = 2 launch of every case, side by side."""
    root = tmp_path_factory.mktemp("dp")
    single, two = _launch(root / "k1", ALL, ranks=1), _launch(root / "k2", ALL)
    _wait(single)
    _wait(two)
    return root


def _folder(out: Path, case: str, rank: int = 0) -> Path:
    """Rank 0's (or a single process's) run folder of ``case``, or rank i's copy."""
    (f,) = (out / case / (f".rank{rank}" if rank else "")).glob("*-*")
    return f


def _history(folder: Path) -> list[dict]:
    """Rows without timing columns, NaN as None (so that equal rows compare equal)."""
    return [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()
             if k not in TIMING} for r in io.read_csv(folder / "metrics.csv")]


def _tensors(state: dict) -> dict[str, torch.Tensor]:
    """The floating tensors of a checkpoint that define the run's state."""
    out = {f"weight{i}": w for i, w in enumerate(state["weights"])}
    out.update({f"method.{k}": v for k, v in state["method"].items()
                if isinstance(v, torch.Tensor) and v.is_floating_point()})
    out.update({f"model.{k}": v for k, v in state["task"]["model"].items()
                if v.is_floating_point()})
    if state["weight_opt"] is not None:
        for k, v in state["weight_opt"]["state"].items():
            out[f"momentum{k}"] = v["momentum_buffer"]
    return out


def _close(a: dict, b: dict, tol: float, what: str) -> None:
    ta, tb = _tensors(a), _tensors(b)
    assert ta.keys() == tb.keys(), what
    for k, x in ta.items():
        scale = float(x.abs().max()) if x.numel() else 0.0
        err = float((x.double() - tb[k].double()).abs().max()) if x.numel() else 0.0
        assert err <= tol * max(scale, 1e-12), (what, k, err, scale)


def test_ranks_identical_at_every_checkpoint(runs):
    r0 = json.loads((runs / "k2" / "ckpt0.json").read_text())
    r1 = json.loads((runs / "k2" / "ckpt1.json").read_text())
    for case in ALL:
        epochs = {"arms-joint": 10, "resnet-dense": 2, "resnet-cp": 2, "dense-tail": 1}.get(case, 5)
        assert sorted(r0[case], key=int) == [str(e) for e in range(1, epochs + 1)], case
        assert r0[case] == r1[case], case  # SHA-256 of every tensor of every checkpoint
        f0 = _folder(runs / "k2", case)
        f1 = _folder(runs / "k2", case, 1)
        assert f0.name == f1.name == _folder(runs / "k1", case).name
        assert _history(f0) == _history(f1), case
        m0, m1 = (torch.load(f / "masks.pt", weights_only=True) for f in (f0, f1))
        assert m0.keys() == m1.keys() and all(torch.equal(m0[k], m1[k]) for k in m0), case
    # the BatchNorm nets' running statistics trained (and agree, by the digests above)
    for case in ("resnet-dense", "resnet-cp"):
        state = torch.load(_folder(runs / "k2", case) / "checkpoint.pt", weights_only=True)
        means = [v for k, v in state["task"]["model"].items() if k.endswith("running_mean")]
        assert means and all(float(v.abs().max()) > 0 for v in means), case


@pytest.mark.parametrize("case", EQUAL)
def test_two_ranks_equal_one_process(runs, case):
    fa, fb = _folder(runs / "k1", case), _folder(runs / "k2", case)
    a = torch.load(fa / "checkpoint.pt", weights_only=True)
    b = torch.load(fb / "checkpoint.pt", weights_only=True)
    _close(a, b, TOL, case)
    ma, mb = (torch.load(f / "masks.pt", weights_only=True) for f in (fa, fb))
    for k in ma:
        if k.startswith("mask."):
            assert torch.equal(ma[k], mb[k]), (case, k)
    for ra, rb in zip(_history(fa), _history(fb), strict=True):
        for k, v in ra.items():
            if isinstance(v, float):
                assert math.isclose(rb[k], v, rel_tol=1e-5, abs_tol=1e-7), (case, k)
    if case == "mp":  # the cut happened, at the target
        assert math.isclose(_history(fa)[-1]["remaining"], 0.1, rel_tol=1e-3)


def test_joint_arms_two_ranks_equal_one_process_first_steps(runs):
    """Warm-up epoch (dense, batch split) and the first two MC steps (samples split, weight
    gradients summed): measured max |r| difference 0 after one MC step and 1.9e-4 after two
    (RMSprop), weights within 4.5e-7 relative. Later the runs are equal in law, not in value
    (a round-off difference in theta flips a sampled bit)."""
    fa, fb = _folder(runs / "k1", "arms-joint"), _folder(runs / "k2", "arms-joint")
    for epoch in (1, 2, 3):
        a = torch.load(fa / f"ckpt{epoch}.pt", weights_only=True)
        b = torch.load(fb / f"ckpt{epoch}.pt", weights_only=True)
        assert float((a["method"]["r"] - b["method"]["r"]).abs().max()) < 1e-3
        for x, y in zip(a["weights"], b["weights"], strict=True):
            assert float((x - y).abs().max()) <= 1e-5 * float(x.abs().max())
    a = torch.load(fa / "ckpt2.pt", weights_only=True)
    assert not torch.equal(a["method"]["r"], torch.load(fa / "ckpt1.pt", weights_only=True)
                           ["method"]["r"])  # the masks trained in epoch 1


def test_resume_after_sigterm_on_one_rank(runs, tmp_path):
    """SIGTERM on rank 1 only mid epoch 2 of the joint CP run, on rank 0 only in the frozen
    epochs of the joint ARMS run: both ranks checkpoint before the same step, and the relaunch
    (rank 1's checkpoint of the GMP run deleted in between) ends with the uninterrupted K = 2
    run's state bit for bit."""
    cases = ["cp-joint", "arms-joint", "gmp"]
    first = _launch(tmp_path, cases, "cp-joint:1:2:1", "arms-joint:0:8:0", "gmp:1:3:1")
    _wait(first)
    r0 = json.loads((tmp_path / "ckpt0.json").read_text())
    r1 = json.loads((tmp_path / "ckpt1.json").read_text())
    for case in cases:
        assert r0[case]["stopped"] == r1[case]["stopped"] == 143, case
        for f in (_folder(tmp_path, case), _folder(tmp_path, case, 1)):
            assert not (f / "summary.json").exists()
        pos = [torch.load(_folder(tmp_path, case, r) / "checkpoint.pt", weights_only=True)
               for r in (0, 1)]
        assert pos[0]["position"]["step"] == pos[1]["position"]["step"]
        assert pos[0]["epoch"] == pos[1]["epoch"]
    # rank 1 lost its copy of one run (a rank killed before writing it, a new node): it takes
    # rank 0's checkpoint at the relaunch
    (_folder(tmp_path, "gmp", 1) / "checkpoint.pt").unlink()
    _wait(_launch(tmp_path, cases))
    for case in cases:
        for rank in (0, 1):
            fa, fb = _folder(runs / "k2", case, rank), _folder(tmp_path, case, rank)
            a = torch.load(fa / "checkpoint.pt", weights_only=True)
            b = torch.load(fb / "checkpoint.pt", weights_only=True)
            _close(a, b, 0.0, case)
            assert _history(fa) == _history(fb), case


@pytest.mark.parametrize("args,msg", [(["--dp-methods", "dense,foo"], "unknown pruning method"),
                                      (["--dp-steps", "1"], "--dp-steps"),
                                      (["--ks", "1,0"], "--ks")])
def test_bench_distributed_bad_input_is_one_line(args, msg):
    cp = subprocess.run([sys.executable, "-m", "benchmarks.bench_distributed", *args],
                        env=worker_env(), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert cp.returncode == 2
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], cp.stderr
