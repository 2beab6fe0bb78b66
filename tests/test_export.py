"""pbscale.export: a finished pruning run exported as TorchScript, ONNX (when onnx, onnxscript
and onnxruntime or onnx's reference evaluator are importable) and the sparse .pt gives the
run's summary.json test accuracy on raw uint8 test images, and the logits of the plain-PyTorch
network of pruned.pt; the sparse form stores masks as bits; bad input is one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from pbscale import export as X
from pbscale.pruning import config as pconfig
from pbscale.pruning import outputs as poutputs
from pbscale.pruning import run as prun


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """(run folder, summary, test images uint8, labels, reference logits) of a tiny CP run."""
    cfg = pconfig.PruneConfig(model="lenet", synthetic=48, epochs=2, max_batches=2, batch_size=8,
                        val_size=16, method="cp")
    summary = prun.run(cfg, tmp_path_factory.mktemp("runs"), quiet=True)
    _, _, data = prun.prepare(cfg)
    net = poutputs.load_pruned("lenet", Path(summary["folder"]) / "pruned.pt")
    with torch.no_grad():  # the run's own transform, then plain PyTorch
        ref = net(data.prepare(data.test.x))
    return Path(summary["folder"]), summary, data.test.x, data.test.y, ref


def _accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    return int((logits.argmax(1) == y).sum()) / len(y)


def _onnx_runner(path: Path):
    """The ONNX file as a function of uint8 images: onnxruntime, else onnx's reference
    evaluator, else skip (the export extra is not installed)."""
    if importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime as ort

        sess = ort.InferenceSession(str(path))
        return lambda x: torch.from_numpy(sess.run(None, {"images": x.numpy()})[0])
    from onnx.reference import ReferenceEvaluator

    ev = ReferenceEvaluator(str(path))
    return lambda x: torch.from_numpy(ev.run(None, {"images": x.numpy()})[0])


def test_torchscript_and_sparse_reproduce_the_run(finished, tmp_path, capsys):
    folder, summary, x, y, ref = finished
    assert X.main([str(folder), "--format", "torchscript", "--out", str(tmp_path / "n.pt")]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'n.pt'} (torchscript")
    ts = torch.jit.load(str(tmp_path / "n.pt"))
    with torch.no_grad():
        out = ts(x)
    assert torch.equal(out, ref)  # the same float32 operations
    assert _accuracy(out, y) == summary["final_test_acc"]
    X.export(folder, "sparse", tmp_path / "s.pt")
    sparse = X.load_sparse(tmp_path / "s.pt")
    with torch.no_grad():
        assert torch.equal(sparse(x), ref)
    blob = torch.load(tmp_path / "s.pt", weights_only=True)
    d = 784 * 300
    assert blob["bits.fc1.weight"].dtype == torch.uint8 and blob["bits.fc1.weight"].numel() == \
        d // 8
    kept = round(summary["final_remaining_fc1"] * d)
    assert blob["values.fc1.weight"].numel() == kept


def test_onnx_reproduces_the_run(finished, tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    folder, summary, x, y, ref = finished
    X.export(folder, "onnx", tmp_path / "n.onnx")
    out = _onnx_runner(tmp_path / "n.onnx")(x)
    assert torch.allclose(out, ref, atol=1e-4, rtol=1e-4)
    assert _accuracy(out, y) == summary["final_test_acc"]


def test_bad_input_is_one_line(finished, tmp_path, capsys):
    folder = finished[0]
    (tmp_path / "afile").write_text("")
    for args in ([str(tmp_path), "--out", str(tmp_path / "x")],  # not a run folder
                 [str(folder), "--out", str(tmp_path)],  # a folder as --out
                 [str(folder), "--out", str(tmp_path / "afile" / "x")]):  # under a file
        # (--out in a folder that does not exist yet is created: issue 53)
        assert X.main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    with pytest.raises(X.PBInputError, match="not a pbnn-sparse-1 file"):
        X.load_sparse(folder / "pruned.pt")


@pytest.mark.parametrize("fmt", X.FORMATS)
def test_a_successful_export_prints_only_its_result(finished, tmp_path, fmt):
    """``python -m pbscale.export`` in a fresh process (where torch's ONNX exporter logs that
    torchvision is missing, once per detection op, and warns about its own pytree code) prints
    the one line of its result and nothing on stderr."""
    import os
    import subprocess
    import sys

    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxscript")
    out = tmp_path / f"n.{fmt}"
    env = {**os.environ, "PYTHONPATH": str(Path(X.__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "pbscale.export", str(finished[0]), "--format",
                           fmt, "--out", str(out)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout == f"wrote {out} ({fmt}, {out.stat().st_size:,} bytes)\n"


def test_only_the_onnx_notes_are_dropped():
    """Inside the export, torch.onnx's other log records and other FutureWarnings still show."""
    import logging
    import warnings

    class Kept(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    log = logging.getLogger(X.ONNX_NOTE_LOGGER)
    # a handler of its own on the exporter's logger, where the filter acts: whether torch's
    # "torch" logger propagates to the root depends on whether torch has set up its logging yet,
    # so a root handler (caplog's) would see each record once or not at all
    kept, level = Kept(), log.level
    log.addHandler(kept)
    log.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with X.onnx_notes_dropped():
                log.warning("torchvision is not installed. Skipping torchvision::nms")
                log.warning("another note")
                warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning,
                              stacklevel=1)
                warnings.warn("something else", FutureWarning, stacklevel=1)
    finally:
        log.removeHandler(kept)
        log.setLevel(level)
    assert [r.getMessage() for r in kept.records] == ["another note"]
    assert [str(w.message) for w in seen] == ["something else"]
