"""Issue 10 (hardening): no code runs from a loaded file, nothing is written outside --out, every
bad input is a one-line error with exit code 2 before any work, and the exact core stays accurate
at the edges (tiny and near-one theta, huge n, the direct parametrization's clamp)."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pbexact import io as pio
from pbexact.errors import PBInputError
from pbscale import io, regress
from pbscale import methods as M
from pbscale.regression import make_problem

ROOT = Path(__file__).resolve().parent.parent


def tiny_problem():
    return make_problem(0, n_train=300, n_valid=100, backbone_hidden=(6, 6),
                        target_hidden=(12, 12))


# ----------------------------------------------------------------------------------- security


class _Boom:
    """A pickled call: unpickling it would create the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_crafted_checkpoint_is_refused_without_running_it(tmp_path):
    prob = tiny_problem()
    cfg = M.MethodConfig(method="loorf", n=2)
    folder = regress.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                           problem=prob)
    (folder / "summary.json").unlink()  # so that the next call resumes from the checkpoint
    marker = tmp_path / "pwned"
    with open(folder / "checkpoint.pt", "wb") as fh:
        torch.save({"trainer": _Boom(str(marker)), "history": [], "epoch": 0}, fh)
    with pytest.raises(PBInputError, match="damaged checkpoint .*delete the run folder"):
        regress.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False, problem=prob)
    assert not marker.exists()  # the pickled call did not run
    # the plain-pickle route is refused the same way
    with open(folder / "checkpoint.pt", "wb") as fh:
        pickle.dump(_Boom(str(marker)), fh)
    with pytest.raises(PBInputError, match="damaged checkpoint"):
        io.load_checkpoint(folder / "checkpoint.pt")
    assert not marker.exists()
    # not vacuous: the unsafe load would have run the payload
    with open(folder / "checkpoint.pt", "rb") as fh:
        pickle.load(fh)
    assert marker.exists()


def test_our_checkpoints_load_with_weights_only(tmp_path):
    """Everything we save (optimizer and generator states, control variates, history) loads
    with weights_only=True, for every method."""
    prob = tiny_problem()
    for method in ("loorf", "arms", "cp", "relax"):
        cfg = M.MethodConfig(method=method, n=3, chunk=3)
        folder = regress.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                               problem=prob)
        state = torch.load(folder / "checkpoint.pt", weights_only=True)
        assert state["epoch"] == 1 and state["trainer"]["generator"].dtype == torch.uint8


@pytest.mark.parametrize("damage", ["truncated", "empty", "random", "wrong_key", "folder",
                                    "bad_history"])
def test_damaged_checkpoint_is_a_one_line_error(tmp_path, damage, capsys):
    prob = tiny_problem()
    cfg = M.MethodConfig(method="loorf", n=2)
    folder = regress.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False,
                           problem=prob)
    (folder / "summary.json").unlink()
    ckpt = folder / "checkpoint.pt"
    data = ckpt.read_bytes()
    if damage == "truncated":
        ckpt.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        ckpt.write_bytes(b"")
    elif damage == "random":
        ckpt.write_bytes(np.random.default_rng(0).bytes(4096))
    elif damage == "wrong_key":
        torch.save({"weights": torch.zeros(3)}, ckpt)
    elif damage == "bad_history":
        state = torch.load(ckpt, weights_only=True)
        torch.save({**state, "trainer": {"r": torch.zeros(2)}}, ckpt)
    else:
        ckpt.unlink()
        ckpt.mkdir()
    with pytest.raises(PBInputError, match=r"checkpoint.pt.*delete the run folder or choose"):
        regress.train(cfg, epochs=1, out=tmp_path, device="cpu", progress=False, problem=prob)


@pytest.mark.parametrize("name", ["config.json", "summary.json"])
@pytest.mark.parametrize("damage", ["truncated", "folder", "binary"])
def test_damaged_json_run_files_exit_2(tmp_path, name, damage, capsys, monkeypatch):
    prob = tiny_problem()
    monkeypatch.setattr(regress, "make_problem", lambda *a, **k: prob)
    args = ["--method", "loorf", "--n", "2", "--epochs", "1", "--out", str(tmp_path),
            "--device", "cpu", "--quiet"]
    assert regress.main(args) == 0
    folder = tmp_path / regress.run_name(M.MethodConfig(method="loorf", n=2))
    path = folder / name
    if damage == "truncated":
        path.write_text(path.read_text()[:10])
    elif damage == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage")
    else:
        path.unlink()
        path.mkdir()
    capsys.readouterr()
    assert regress.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert name in err and "delete the run folder" in err


def test_atomic_write_mode_follows_the_umask(tmp_path):
    for umask in (0o022, 0o077, 0o002):
        old = os.umask(umask)
        try:
            pio.write_json(tmp_path / f"a{umask}.json", {"x": 1})
            with open(tmp_path / f"b{umask}.txt", "w") as fh:  # what a plain open gives
                fh.write("x")
        finally:
            os.umask(old)
        mode = (tmp_path / f"a{umask}.json").stat().st_mode & 0o777
        assert mode == (tmp_path / f"b{umask}.txt").stat().st_mode & 0o777 == 0o666 & ~umask


def test_stale_temporary_of_a_killed_writer_is_removed(tmp_path):
    target = tmp_path / "result.json"
    # a writer that SIGKILLs itself in the middle of an atomic write
    code = (
        "import os, signal, sys\n"
        "from pbexact import io\n"
        "real = os.replace\n"
        "def die(*a): os.kill(os.getpid(), signal.SIGKILL)\n"
        "os.replace = die\n"
        f"io.write_json({str(target)!r}, {{'x': 1}})\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == -signal.SIGKILL
    stale = list(tmp_path.glob(".result.json.*.tmp"))
    assert len(stale) == 1 and not target.exists()
    # a live writer's temporary (this process) must survive the clean-up
    live = tmp_path / f".result.json.{os.getpid()}.abcd1234.tmp"
    live.write_text("in progress")
    pio.write_json(target, {"x": 2})
    assert not stale[0].exists() and live.exists()
    assert target.read_text().strip().endswith("}")
