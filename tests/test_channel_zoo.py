"""Issue 52's zoo: every network of tests/_zoo.py with channels to prune, and one with a
depthwise and a grouped (groups=2) convolution, prunes by channels (``granularity="channel"``)
with CP and ARMS in supermask and joint mode through ``prune_model``; structured.pt rebuilds a
network with fewer parameters than the dense one whose test accuracy (the regressor: test loss)
is the run's reported one; the export (pbscale.export) writes that smaller network in each
format (torch.export, TorchScript, ONNX, the sparse file), raw inputs in, and it gives the
run's test accuracy with the pruned parameter count; ``--masked-network`` keeps the
dense-shaped network. A network whose channels cannot be removed (tied weights) is refused in
one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

from pbexact.errors import PBInputError
from pbscale import export as X
from pbscale.nets.channel_costs import count_params
from pbscale.pruning.api import PruneResult, prune_model

pytest.importorskip("torch_pruning")

import _zoo  # noqa: E402  (tests/ is on sys.path)


def depthwise_grouped() -> nn.Module:
    """A stem, a depthwise conv (groups = channels = 8), a grouped conv (groups=2), each with
    BatchNorm, pooling and a head; RGB images (B, 3, 8, 8)."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


#: the networks pruned here (every layer may change; the zoo's --masked patterns are weight
#: pruning's): name -> (factory, data kind)
NETS = {name: (getattr(_zoo, name), kind) for name, (kind, _) in _zoo.ZOO.items()
        if name != "Tied"}
NETS["depthwise_grouped"] = (depthwise_grouped, "rgb")
#: L0 strengths that remove channels within two steps
LAMS = {"cp": 0.1, "arms": 1.0}


def _run(name: str, method: str, mode: str, out: Path) -> tuple[PruneResult, dict]:
    factory, kind = NETS[name]
    arrays = _zoo.arrays(kind, n_train=48, n_test=24)
    settings = dict(n=4, eval_masks=3, eval_batches=2) if method == "arms" else {}
    result = prune_model(factory, (arrays["x_train"], arrays["y_train"]),
                         (arrays["x_test"], arrays["y_test"]), method=method, mode=mode,
                         lam=LAMS[method], epochs=2 if mode == "joint" else 1,
                         granularity="channel", out=out, progress=False, max_batches=2,
                         batch_size=8, val_size=16, threads=1, **settings)
    return result, arrays


def _check_score(net, arrays: dict, summary: dict) -> None:
    """``net`` (raw inputs in) scores the run's reported test accuracy (the regressor: its test
    loss, the mean squared error)."""
    x, y = torch.from_numpy(arrays["x_test"]), torch.from_numpy(arrays["y_test"])
    with torch.no_grad():
        out = torch.as_tensor(net(x))
    if "final_test_acc" in summary:
        assert int((out.argmax(1) == y).sum()) / len(y) == summary["final_test_acc"]
    else:
        assert float(((out - y) ** 2).mean()) == pytest.approx(summary["final_test_loss"],
                                                                 rel=1e-5)


def _onnx(path: Path):
    if importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime as ort

        sess = ort.InferenceSession(str(path))
        return lambda x: torch.from_numpy(sess.run(None, {"images": x.numpy()})[0])
    from onnx.reference import ReferenceEvaluator

    ev = ReferenceEvaluator(str(path))
    return lambda x: torch.from_numpy(ev.run(None, {"images": x.numpy()})[0])


@pytest.mark.parametrize("mode", ["supermask", "joint"])
@pytest.mark.parametrize("method", ["cp", "arms"])
@pytest.mark.parametrize("name", list(NETS))
def test_each_zoo_network_prunes_channels_and_exports_the_smaller_network(tmp_path, name,
                                                                           method, mode):
    result, arrays = _run(name, method, mode, tmp_path / "runs")
    summary = result.summary
    assert summary["channels_kept"] < summary["channels"]  # these lams remove channels
    net = result.structured()
    assert count_params(net) == summary["pruned_params"] < summary["dense_params"]
    # the export: raw inputs in, the smaller network, the run's score
    exported = torch.export.load(str(X.export(result, "pt2", tmp_path / "n.pt2"))).module()
    assert sum(p.numel() for p in exported.parameters()) == summary["pruned_params"]
    _check_score(exported, arrays, summary)


@pytest.mark.parametrize("name", ["ResCNN", "depthwise_grouped", "Embed", "regressor"])
def test_every_format_exports_the_smaller_network(tmp_path, name):
    result, arrays = _run(name, "arms", "joint", tmp_path / "runs")
    summary = result.summary
    ts = torch.jit.load(str(X.export(result, "torchscript", tmp_path / "n.ts")))
    assert sum(p.numel() for p in ts.parameters()) == summary["pruned_params"]
    _check_score(ts, arrays, summary)
    sparse = X.load_sparse(X.export(result, "sparse", tmp_path / "n.sparse.pt"),
                           model=result.source)
    assert count_params(sparse) == summary["pruned_params"]
    _check_score(sparse, arrays, summary)
    blob = torch.load(tmp_path / "n.sparse.pt", weights_only=True)
    assert blob["format"] == X.STRUCTURED_FORMAT
    if importlib.util.find_spec("onnx") and importlib.util.find_spec("onnxscript"):
        import onnx

        path = X.export(result, "onnx", tmp_path / "n.onnx")
        weights = sum(int(torch.tensor(t.dims).prod()) for t in onnx.load(str(path))
                      .graph.initializer if t.name.startswith("net.")
                      and not t.name.endswith(("running_mean", "running_var")))
        # the network's own parameters (torch's exporter may fold BatchNorm into convs)
        assert weights <= summary["pruned_params"] < summary["dense_params"]
        _check_score(_onnx(path), arrays, summary)
    # --masked-network: the dense-shaped network, channel masks folded in; the same score
    masked = torch.export.load(str(X.export(result, "pt2", tmp_path / "m.pt2",
                                            masked=True))).module()
    assert sum(p.numel() for p in masked.parameters()) == summary["dense_params"]
    _check_score(masked, arrays, summary)


def test_the_command_line_exports_the_smaller_network(tmp_path, capsys):
    result, arrays = _run("ResCNN", "cp", "joint", tmp_path / "runs")
    out = tmp_path / "n.pt2"
    args = [str(result.folder), "--model", "_zoo:ResCNN", "--out", str(out)]
    assert X.main(args) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out} (pt2")
    net = torch.export.load(str(out)).module()
    assert sum(p.numel() for p in net.parameters()) == result.summary["pruned_params"]
    _check_score(net, arrays, result.summary)
    assert X.main([*args[:3], "--masked-network", "--out", str(tmp_path / "m.pt2")]) == 0
    dense = torch.export.load(str(tmp_path / "m.pt2")).module()
    assert sum(p.numel() for p in dense.parameters()) == result.summary["dense_params"]


def test_a_damaged_structured_file_is_one_line(tmp_path, capsys):
    result, _ = _run("MLP", "cp", "supermask", tmp_path / "runs")
    (result.folder / "structured.pt").write_bytes(b"not a torch file")
    capsys.readouterr()
    code = X.main([str(result.folder), "--model", "_zoo:MLP", "--out", str(tmp_path / "n.pt2")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "structured.pt" in err
    assert not (tmp_path / "n.pt2").exists()


def test_a_network_without_removable_channels_is_refused_in_one_line(tmp_path):
    arrays = _zoo.arrays("gray", n_train=48, n_test=24)
    with pytest.raises(PBInputError) as err:
        prune_model(_zoo.Tied, (arrays["x_train"], arrays["y_train"]),
                    (arrays["x_test"], arrays["y_test"]), method="cp", lam=0.1,
                    granularity="channel", out=tmp_path, progress=False, max_batches=2,
                    batch_size=8, val_size=16, threads=1)
    assert len(str(err.value).splitlines()) == 1 and "tied" in str(err.value)
