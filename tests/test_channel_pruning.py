"""Structured (channel) pruning end to end (``--granularity channel``, issue 52): CP and ARMS in
supermask and joint mode on LeNet-300-100 (the command) and on a small CNN with BatchNorm and a
residual block (the Python API, tests/_zoo.py's ResCNN) finish; groups.json states the
variables with costs that add up; structured.pt loads with ``weights_only=True`` and rebuilds a
network with the reported (fewer) parameters and MACs whose test accuracy is the run's reported
test accuracy (exactly: the logits agree to float32 round-off, rtol 1e-4 / atol 1e-5 of the
largest, and no prediction flips on these examples); the L0 term weighs each channel by its cost
(``--cost``); methods that do not take channels, and layers that cannot be removed, are one
line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from pbexact.errors import PBInputError
from pbscale import prune as P
from pbscale.methods import dense_regularizer
from pbscale.nets import user_data
from pbscale.nets.channel_costs import count, count_params
from pbscale.nets.channel_layout import ChannelLayout, structured_network
from pbscale.nets.channel_ops import remove_channels
from pbscale.nets.channels import channel_groups
from pbscale.nets.models import LeNet300100
from pbscale.pruning import run as prun
from pbscale.pruning import setup
from pbscale.pruning.api import prune_model
from pbscale.pruning.config import PruneConfig
from pbscale.pruning.lam_control import target_line
from pbscale.pruning.outputs import load_pruned, load_structured
from pbscale.runs import io as runio

pytest.importorskip("torch_pruning")

import _zoo  # noqa: E402  (tests/ is on sys.path)

TINY = ["--synthetic", "48", "--epochs", "1", "--max-batches", "2", "--batch-size", "8",
        "--val-size", "16", "--quiet", "--threads", "1"]
#: L0 strengths that prune channels within two steps (CP's hard mask; ARMS samples at 0.5)
LAMS = {"cp": "1e-2", "arms": "1e-1"}


def _accuracy(net: nn.Module, batches) -> tuple[float, list[torch.Tensor]]:
    correct, count_, outs = 0, 0, []
    with torch.no_grad():
        for x, y in batches:
            out = net(x.cpu())
            outs.append(out)
            correct += int((out.argmax(1) == y.cpu()).sum())
            count_ += len(y)
    return correct / count_, outs


def _check_folder(folder: Path, cfg: PruneConfig) -> None:
    """groups.json, structured.pt and the summary of a finished channel run agree."""
    summary = runio.read_summary(folder / "summary.json")
    record = json.loads((folder / "groups.json").read_text())
    d = record["d"]
    assert d == summary["channels"] == len(record["variables"]) > 0
    for kind in ("params", "macs"):
        assert record["totals"][kind] == sum(v[kind] for v in record["variables"])
        assert all(v[kind] > 0 for v in record["variables"])
    assert record["dense"]["params"] == summary["dense_params"]
    saved = torch.load(folder / "structured.pt", map_location="cpu", weights_only=True)
    assert saved["keep"].dtype == torch.bool and saved["keep"].shape == (d,)
    net = load_structured(cfg.model, folder / "structured.pt")
    data = setup.load_data(cfg.resolved(), torch.device("cpu"))
    x1 = data.prepare(data.train.x[:1])
    params, macs = count(net, x1)
    assert params == summary["pruned_params"] == count_params(net)
    assert macs == summary["pruned_macs"]
    assert summary["final_remaining_all"] == pytest.approx(params / summary["dense_params"],
                                                           rel=1e-12)
    if summary["channels_kept"] < d:
        assert params < summary["dense_params"] and macs < summary["dense_macs"]
    for b in (1, 128):
        assert summary[f"dense_latency_b{b}"] > 0 and summary[f"pruned_latency_b{b}"] > 0
    acc, _ = _accuracy(net, data.batches("test", 1000))
    assert acc == summary["final_test_acc"]


@pytest.mark.parametrize("mode", ["supermask", "joint"])
@pytest.mark.parametrize("method", ["cp", "arms"])
def test_lenet_channel_run_removes_channels_and_keeps_its_accuracy(tmp_path, method, mode,
                                                                   capsys):
    extra = ["--n", "4", "--eval-masks", "3", "--eval-batches", "2"] if method == "arms" else []
    epochs = ["--epochs", "2"] if mode == "joint" else []
    args = ["--model", "lenet", "--method", method, "--mode", mode, "--granularity", "channel",
            "--lam", LAMS[method], "--out", str(tmp_path), *TINY, *extra, *epochs]
    assert P.main(args) == 0
    line = capsys.readouterr().out
    assert "channel variables" in line and "parameters" in line
    assert "structured.pt: params" in line and "CPU latency batch 1" in line
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    cfg = PruneConfig(model="lenet", synthetic=48, val_size=16)
    _check_folder(folder, cfg)
    summary = runio.read_summary(folder / "summary.json")
    assert summary["channels_kept"] < summary["channels"]  # these lams prune


@pytest.mark.parametrize("mode", ["supermask", "joint"])
@pytest.mark.parametrize("method,lam", [("st-theta", "1e-3"), ("hardconcrete", "1e-2")])
def test_st_theta_and_hard_concrete_prune_channels(tmp_path, method, lam, mode):
    """ST-theta (straight-through Bernoulli masks) and hard-concrete (gates in [0, 1]) over
    channels: the run's files agree (:func:`_check_folder`), and the smaller network computes
    what the masked network of pruned.pt computes (a gate's value folded into its channel's
    weights), on inputs it never saw."""
    args = ["--model", "lenet", "--method", method, "--mode", mode, "--granularity", "channel",
            "--lam", lam, "--mask-lr", "0.1", "--out", str(tmp_path), *TINY, "--epochs", "2"]
    assert P.main(args) == 0
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    _check_folder(folder, PruneConfig(model="lenet", synthetic=48, val_size=16))
    small = load_structured("lenet", folder / "structured.pt")
    masked = load_pruned("lenet", folder / "pruned.pt")
    x = torch.randn(64, 784, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(small(x), masked(x), rtol=1e-5, atol=1e-5)
    if mode == "supermask":  # these lams prune within the run
        summary = runio.read_summary(folder / "summary.json")
        assert summary["channels_kept"] < summary["channels"]


@pytest.mark.parametrize("mode", ["supermask", "joint"])
@pytest.mark.parametrize("method", ["cp", "arms"])
def test_cnn_with_batchnorm_and_residual_block_through_the_api(tmp_path, method, mode):
    arrays = _zoo.arrays("gray", n_train=48, n_test=24)
    settings = dict(n=4, eval_masks=3, eval_batches=2) if method == "arms" else {}
    result = prune_model(_zoo.ResCNN, (arrays["x_train"], arrays["y_train"]),
                         (arrays["x_test"], arrays["y_test"]), method=method, mode=mode,
                         lam=float(LAMS[method]) * 10, epochs=2 if mode == "joint" else 1,
                         granularity="channel", out=tmp_path, progress=False, max_batches=2,
                         batch_size=8, val_size=16, threads=1, **settings)
    summary = result.summary
    record = json.loads((result.folder / "groups.json").read_text())
    # the residual block ties conv's and conv_b's outputs into one coupled group
    assert any({"conv", "conv_b"} <= {m["module"] for m in c["members"]}
               for c in record["coupled"])
    assert any("head" in s for s in record["skipped"])
    net = result.structured()
    assert count_params(net) == summary["pruned_params"]
    # the run's test split as the API made it from the arrays
    data = user_data.arrays_data(user_data.object_arrays(
        (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])),
        "cpu", 16, 0)
    acc, _ = _accuracy(net, data.batches("test", 1000))
    assert acc == summary["final_test_acc"]
    if summary["channels_kept"] < summary["channels"]:
        assert summary["pruned_params"] < summary["dense_params"]


def test_variable_costs_are_what_removing_one_channel_saves():
    """groups.json's per-variable params and MACs: the dense counts minus those of the network
    with that variable alone removed (ResCNN, every variable)."""
    net = _zoo.ResCNN()
    x = torch.zeros(1, 1, 8, 8)
    groups = channel_groups(net, x)
    dense = count(net, x)
    for g in groups.groups:
        keep = torch.ones(groups.d, dtype=torch.bool)
        keep[g.index] = False
        p, m = count(remove_channels(net, groups, keep), x)
        assert (dense[0] - p, dense[1] - m) == (g.params, g.macs)


def test_cost_macs_changes_the_l0_weights(tmp_path):
    """--cost macs weighs the channel variables by their MACs, --cost params by their
    parameters, each normalised to mean 1; weight granularity has no weights."""
    weights = {}
    for cost in ("params", "macs"):
        cfg = PruneConfig(model="_zoo:ResCNN", method="cp", granularity="channel", cost=cost,
                          data=str(_gray(tmp_path)), epochs=1, batch_size=8, val_size=16)
        c, dev, data = prun.prepare(cfg)
        task, method, _, _ = prun.build(c, data, dev)
        w = method.l0_weights
        assert w.shape == (task.d,) and float(w.mean()) == pytest.approx(1.0)
        c_raw = torch.as_tensor(task.groups.cost(cost), dtype=torch.float64)
        assert torch.allclose(w.cpu(), c_raw / c_raw.mean())
        weights[cost] = w
    assert not torch.allclose(weights["params"], weights["macs"])
    c, dev, data = prun.prepare(PruneConfig(model="lenet", synthetic=48, val_size=16))
    _, method, _, _ = prun.build(c, data, dev)
    assert method.l0_weights is None


def _gray(tmp_path: Path) -> Path:
    path = tmp_path / "gray.npz"
    if not path.exists():
        np.savez(path, **_zoo.arrays("gray", n_train=48, n_test=24))
    return path


def test_dense_regularizer_weights():
    """Without weights the L0 term is the unweighted one bit for bit; weights c scale each
    variable's gradient by c_i."""
    r = torch.randn(7, dtype=torch.float64)
    value, grad = dense_regularizer(r, torch.sigmoid, 0.3)
    rr = r.clone().requires_grad_(True)
    (expect,) = torch.autograd.grad(0.3 * torch.sigmoid(rr).sum(), rr)
    assert torch.equal(grad, expect) and value == float(0.3 * torch.sigmoid(r).sum())
    c = torch.arange(1.0, 8.0, dtype=torch.float64)
    _, weighted = dense_regularizer(r, torch.sigmoid, 0.3, c)
    assert torch.allclose(weighted, c * expect)


def test_weight_granularity_keeps_its_run_names():
    """granularity and cost enter the hash only when changed: weight runs keep their folders."""
    hashed = PruneConfig().hashed()
    assert "granularity" not in hashed and "cost" not in hashed
    assert PruneConfig(granularity="channel").hashed()["granularity"] == "channel"


@pytest.mark.parametrize("method,mode", [("dense", "supermask"), ("dense", "joint")])
def test_a_method_without_channels_is_one_line(tmp_path, capsys, method, mode):
    args = ["--model", "lenet", "--method", method, "--mode", mode, "--granularity", "channel",
            "--out", str(tmp_path), *TINY]
    assert P.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--granularity channel runs with" in err[0]
    assert "cp" in err[0] and "arms" in err[0] and "--granularity weight" in err[0]
    assert "mp, gmp" in err[0] and "edgepopup" in err[0]
    assert not list(tmp_path.iterdir())


def test_bad_granularity_cost_and_lam_target_are_one_line(tmp_path, capsys):
    for extra, text in ((["--granularity", "filter"], "invalid choice"),
                        (["--cost", "flops"], "invalid choice"),
                        (["--granularity", "channel", "--lam-target", "1.5"],
                         "--lam-target is a fraction of masked weights (channels: of the "
                         "--cost) in (0, 1]")):
        assert P.main(["--model", "lenet", "--out", str(tmp_path), *TINY, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and text in err[0], err
    with pytest.raises(PBInputError, match="unknown --cost"):
        PruneConfig(granularity="channel", cost="flops", synthetic=48).resolved().validate()


@pytest.mark.parametrize("cost", ["params", "macs"])
def test_lam_target_steers_a_channel_run_by_its_cost(tmp_path, capsys, cost):
    """--lam-target in channel mode: the controller measures a mask as the run's metrics do
    (the --cost kept of the prunable part, exact: not the channels kept, not a sum of the L0
    weights), raises lambda while more is kept than the target, and the run ends with its
    target line."""
    cfg = PruneConfig(model="lenet", synthetic=48, val_size=16, epochs=4, max_batches=4,
                      batch_size=8, method="cp", granularity="channel", cost=cost, lam=1e-4,
                      lam_target=0.2)
    c, dev, data = prun.prepare(cfg)
    a = prun.assemble(c, data, dev)
    z = (torch.rand(a.task.d, generator=torch.Generator().manual_seed(0)) < 0.5).double()
    got = a.controller.measure(z)
    assert got == a.task.evaluation.counts(z)["remaining"]
    assert got != float(z.count_nonzero()) / a.task.d  # the cost, not the variables
    summary = prun.run(cfg, tmp_path, quiet=True)
    said = capsys.readouterr()
    rows = runio.read_csv(Path(summary["folder"]) / "metrics.csv")
    lams = [float(r["lam"]) for r in rows]
    assert lams[0] == 1e-4 and lams[-1] != 1e-4
    first = next(i for i, r in enumerate(rows[1:], 1) if float(r["remaining"]) > 0.2)
    assert lams[first] > lams[first - 1]  # more kept than the target: lambda rises
    line = target_line(0.2, rows, a.loop)  # a miss warns on stderr, with the fix
    assert line.endswith(said.err.strip().splitlines()[-1]) if line.startswith("warning") \
        else "lam-target 20.00%: reached" in line


class GroupNormNet(nn.Module):
    """A convolution normalised over its channels by GroupNorm: masking != removing."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.head = nn.Linear(6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.gn(self.conv(x)))
        return self.head(torch.relu(self.conv2(h)).mean(dim=(2, 3)))


def test_a_layer_that_cannot_be_removed_is_one_line_with_the_fix(tmp_path):
    arrays = _zoo.arrays("gray", n_train=48, n_test=24)
    train, test = (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])
    with pytest.raises(PBInputError, match=r"layer 'gn'.*--masked") as e:
        prune_model(GroupNormNet, train, test, granularity="channel", epochs=1, out=tmp_path,
                    progress=False, max_batches=1, batch_size=8, val_size=16)
    assert "\n" not in str(e.value)
    # the fix: leave gn (and so its coupled group) out; conv2's channels are still pruned
    result = prune_model(GroupNormNet, train, test, granularity="channel", epochs=1,
                         out=tmp_path, progress=False, max_batches=1, batch_size=8,
                         val_size=16, masked="conv.*,conv2.*,head.*", lam=1e-1)
    record = json.loads((result.folder / "groups.json").read_text())
    assert record["leave_out"] == ["gn"] and record["d"] == 6
    assert count_params(result.structured()) == result.summary["pruned_params"]


def test_a_channel_group_writes_each_members_structured_network(tmp_path, capsys):
    args = ["--model", "lenet", "--method", "cp", "--granularity", "channel", "--lam",
            "1e-2,1e-3", "--out", str(tmp_path), *TINY]
    assert P.main(args) == 0
    folders = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(folders) == 2
    for folder in folders:
        _check_folder(folder, PruneConfig(model="lenet", synthetic=48, val_size=16))


def _depthwise_bn() -> nn.Module:
    """An nn.Sequential (the folded path) with grouped convolutions and BatchNorm."""
    return _zoo.depthwise()


@pytest.mark.parametrize("factory,shape", [(LeNet300100, (5, 784)),
                                           (_depthwise_bn, (5, 3, 8, 8))])
def test_channel_layout_backends_agree(factory, shape):
    """The folded, loop and vmap backends compute the same outputs and gradients to soft
    channel masks; the MLP paths (one mask entry per weight) are never taken."""
    torch.manual_seed(0)
    net = factory().train()
    x = torch.randn(*shape)
    groups = channel_groups(net, x[:1])
    z = torch.rand(3, groups.d, dtype=torch.float32)
    outs, grads = {}, {}
    for backend in ("folded", "loop", "vmap"):
        layout = ChannelLayout(net, groups, backend=backend)
        assert layout.path_for("cpu") == backend and layout.choice.plan is None
        zz = z.clone().requires_grad_(True)
        out = layout.forward(zz, x)
        out.square().sum().backward()
        outs[backend], grads[backend] = out.detach(), zz.grad
    assert ChannelLayout(net, groups).path_for("cpu") != "mlp_fast"
    for b in ("loop", "vmap"):
        assert torch.allclose(outs[b], outs["folded"], rtol=1e-4, atol=1e-5)
        assert torch.allclose(grads[b], grads["folded"], rtol=1e-4, atol=1e-5)


def test_a_coupled_group_with_every_channel_off_keeps_one_zeroed_channel():
    """A mask that switches off every variable of a coupled group: removal keeps one channel
    of it, zeroed, so the smaller network computes what the masked one computes."""
    net = _zoo.ResCNN().eval()
    x = torch.randn(4, 1, 8, 8)
    groups = channel_groups(net, x[:1])
    c = next(c for c in groups.coupled if c.root == "conv_a")
    z = torch.ones(groups.d)
    z[list(c.variables)] = 0
    layout = ChannelLayout(net, groups)
    masked = {k: w[0] for k, w in layout.masked_weights(z[None]).items()}
    pruned, keep, held = structured_network(net, groups, z, masked)
    assert int(keep.sum()) == int(z.sum()) + 1 and held == ["conv_a"]
    with torch.no_grad():
        expect = layout.forward_single(masked, x)
        assert torch.allclose(pruned.eval()(x), expect, rtol=1e-4, atol=1e-5)
    assert count_params(pruned) < count_params(net)


def test_sweep_keys_granularity_and_cost(tmp_path, capsys):
    """granularity and cost are sweep keys: at their defaults run ids stay as they were, set
    they name another run; a sweep of a method without channels is refused before it runs."""
    from pbscale import sweep

    head = '[sweep]\ncommand = "prune"\nout = "o"\n[[grid]]\nseed = [0]\nsynthetic = 48\n'
    ids = []
    for i, extra in enumerate(("", 'granularity = "weight"\ncost = "params"\n',
                               'granularity = "channel"\n',
                               'granularity = "channel"\ncost = "macs"\n')):
        path = tmp_path / f"{i}.toml"
        path.write_text(head + extra)
        ids.append(sweep.load(path).runs[0].id)
    assert ids[0] == ids[1] and len(set(ids[1:])) == 3
    path = tmp_path / "bad.toml"
    path.write_text(head + 'granularity = "channel"\nmethod = "dense"\nmode = "joint"\n')
    assert sweep.main(["status", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--granularity channel runs with" in err


def test_extreme_channel_masks_warn_with_the_fix():
    cfg = PruneConfig(granularity="channel", lam=1e-3)
    base = {"masked": 400, "final_remaining": 0.2, "final_remaining_channels": 0.3}
    assert prun.extremes_line(base, cfg) is None
    line = prun.extremes_line({**base, "zeroed_groups": ["fc2"]}, cfg)
    assert "every channel of layer 'fc2' is off" in line and "lower --lam" in line
    line = prun.extremes_line({**base, "final_remaining_channels": 0.0}, cfg)
    assert "every channel variable is off (0 of 400 remain)" in line
    line = prun.extremes_line({**base, "final_remaining_channels": 1}, cfg)
    assert "no channel variable was pruned" in line and "\n" not in line


def test_an_interrupted_channel_run_resumes_to_the_same_numbers(tmp_path):
    import os
    import signal

    from pbexact.errors import RunInterrupted

    cfg = PruneConfig(model="lenet", synthetic=48, val_size=16, epochs=3, max_batches=2,
                      batch_size=8, method="arms", mode="joint", n=4, eval_masks=3,
                      eval_batches=2, lam=0.1, granularity="channel", cost="macs")
    whole = prun.run(cfg, tmp_path / "whole", quiet=True)

    def hook(epoch: int, i: int) -> None:
        if (epoch, i) == (1, 1):
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunInterrupted):
        prun.run(cfg, tmp_path / "cut", quiet=True, step_hook=hook)
    resumed = prun.run(cfg, tmp_path / "cut", quiet=True)
    for k, v in whole.items():
        if k.startswith("final_") and not k.endswith("_seconds"):
            assert resumed[k] == v, k
    a, b = (torch.load(Path(s["folder"]) / "structured.pt", weights_only=True)
            for s in (whole, resumed))
    assert torch.equal(a["keep"], b["keep"])
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])


def test_pareto_draws_channel_runs_as_their_own_series(tmp_path):
    """analysis.pareto labels a channel run apart from the weight runs of its method (its
    remaining fraction is of a cost, not of weights)."""
    from analysis.scale.pareto_rows import find_runs, label
    from analysis.scale.run_files import read_prune

    args = ["--model", "lenet", "--method", "cp", "--out", str(tmp_path), *TINY]
    assert P.main(args) == 0 and P.main([*args, "--granularity", "channel"]) == 0
    labels = sorted(label(read_prune(f)) for f in find_runs([tmp_path]))
    assert labels == ["cp", "cp-channel-params"]


@pytest.mark.parametrize("method", ["loorf", "reinforce", "disarm"])
def test_the_other_mc_estimators_prune_channels(tmp_path, method):
    args = ["--model", "lenet", "--method", method, "--granularity", "channel", "--lam", "1e-1",
            "--n", "4", "--eval-masks", "3", "--eval-batches", "2", "--out", str(tmp_path),
            *TINY]
    assert P.main(args) == 0
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    _check_folder(folder, PruneConfig(model="lenet", synthetic=48, val_size=16))


# -- MP and GMP over channels: group norms per unit of cost, --target a budget of the cost ------


class SelfTied(nn.Module):
    """A grouped convolution whose output is added to its own input (h + conv(h)): a variable
    owns an input and an output slice of one weight, which cross."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.conv = nn.Conv2d(4, 4, 3, padding=1, groups=2)
        self.head = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        return self.head(torch.relu(h + self.conv(h)).mean(dim=(2, 3)))


@pytest.mark.parametrize("factory,shape", [(_zoo.ResCNN, (1, 1, 8, 8)),
                                           (_zoo.depthwise, (1, 3, 8, 8)),
                                           (SelfTied, (1, 1, 8, 8))])
def test_squared_norms_are_what_removing_one_channel_removes(factory, shape):
    """ChannelLayout.squared_norms, read from the variables' slices, against Torch-Pruning's
    removal: the sum of squares of the dense network's parameters minus that of the network
    with variable i alone removed, for every i (BatchNorm's affine parameters randomised; a
    grouped convolution's partial input slices and a variable's crossing slices included)."""
    torch.manual_seed(0)
    net = factory()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.weight.normal_()
                m.bias.normal_()
    groups = channel_groups(net, torch.rand(*shape))

    def energy(model: nn.Module) -> float:
        return sum(float(p.detach().double().square().sum()) for p in model.parameters())

    dense = energy(net)
    removed = []
    for g in groups.groups:
        keep = torch.ones(groups.d, dtype=torch.bool)
        keep[g.index] = False
        removed.append(dense - energy(remove_channels(net, groups, keep)))
    norms = ChannelLayout(net, groups).squared_norms()
    assert torch.allclose(norms, torch.tensor(removed, dtype=torch.float64), rtol=1e-10,
                          atol=1e-12)


def _two_conv(tmp_path: Path, cost: str, target: float = 0.5):
    cfg = PruneConfig(model="_zoo:TwoConv", method="mp", mode="joint", granularity="channel",
                      cost=cost, target=target, data=str(_gray(tmp_path)), epochs=2,
                      batch_size=8, val_size=16)
    c, dev, data = prun.prepare(cfg)
    task, method, _, _ = prun.build(c, data, dev)
    return task, method


@pytest.mark.parametrize("cost", ["params", "macs"])
def test_mp_channel_scores_and_cut_by_hand(tmp_path, cost):
    """TwoConv (conv1 4 channels, conv2 6, max pooling, a flatten into fc), scored with plain
    torch: channel i's squared L2 norm over every parameter slice it removes, over its cost
    (parameters or MACs, counted from the shapes) normalised to mean 1; the cut keeps the
    best-scored channels, in order, while the parameters (MACs) they keep stay within the
    target, zeroes the slices of the others and never brings one back."""
    task, method = _two_conv(tmp_path, cost)
    net = task.model
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # BatchNorm's weight and bias away from 1 and 0
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    w = {k: p.detach().double() for k, p in net.named_parameters()}

    def sq(t: torch.Tensor) -> float:
        return float(t.square().sum())

    hand, unit = {}, {}
    for j in range(4):  # conv1[j]: its row and bias, bn1's entries, conv2's input slice
        hand[f"conv1[{j}]"] = (sq(w["conv1.weight"][j]) + sq(w["conv1.bias"][j])
                               + sq(w["bn1.weight"][j]) + sq(w["bn1.bias"][j])
                               + sq(w["conv2.weight"][:, j]))
        # 8x8 positions for conv1, 4x4 for conv2 (after pooling)
        unit[f"conv1[{j}]"] = {"params": 9 + 1 + 2 + 6 * 9, "macs": 9 * 64 + 6 * 9 * 16}[cost]
    for k in range(6):  # conv2[k]: its row, bn2's entries, fc's four flattened inputs
        hand[f"conv2[{k}]"] = (sq(w["conv2.weight"][k]) + sq(w["bn2.weight"][k])
                               + sq(w["bn2.bias"][k]) + sq(w["fc.weight"][:, 4 * k:4 * k + 4]))
        unit[f"conv2[{k}]"] = {"params": 4 * 9 + 2 + 10 * 4, "macs": 4 * 9 * 16 + 10 * 4}[cost]
    names = [g.name for g in task.groups.groups]
    assert sorted(names) == sorted(hand)
    c = torch.tensor([unit[n] for n in names], dtype=torch.float64)
    expect = torch.tensor([hand[n] for n in names], dtype=torch.float64) / (c / c.mean())
    scores = method.channel_scores().cpu()
    assert torch.allclose(scores, expect, rtol=1e-12, atol=0)

    def kept(a1: int, a2: int) -> int:  # parameters or MACs of the prunable part left
        if cost == "params":
            return a1 * (9 + 1 + 2) + a1 * a2 * 9 + a2 * 2 + a2 * 10 * 4
        return a1 * 9 * 64 + a1 * a2 * 9 * 16 + a2 * 10 * 4

    order = sorted(range(len(names)), key=lambda i: -float(expect[i]))
    a, taken, skipped = [0, 0], [], []
    for i in order:  # in order, each channel that still fits (the first always)
        layer = 0 if names[i].startswith("conv1") else 1
        a[layer] += 1
        if kept(*a) <= 0.5 * kept(4, 6) or not taken:
            taken.append(i)
        else:
            a[layer] -= 1
            skipped.append(i)
    want = torch.zeros(len(names), dtype=torch.bool)
    want[taken] = True
    assert 0 < len(taken) < len(names) and skipped
    method.step_count = method.cuts.cut
    method.apply()
    assert torch.equal(method.mask.cpu() != 0, want)
    for i, n in enumerate(names):
        layer, ch = n[:5], int(n[6])
        rows = [net.get_parameter(f"{layer}.weight")[ch],
                net.get_parameter(f"bn{layer[-1]}.weight")[ch]]
        assert all(bool((r == 0).all()) != bool(want[i]) for r in rows), n
    from pbscale.methods import schedules
    again = schedules.keep_within(method.channel_scores(), 1.0,
                                  lambda z: task.layout.kept_fractions(z, cost), method.mask != 0)
    assert torch.equal(again.cpu(), want)  # a pruned channel never comes back


def _lenet_kept(a1: int, a2: int) -> int:
    """LeNet-300-100's prunable parameters left with a1 channels of fc1 and a2 of fc2: fc1's
    rows and bias, fc2's rows (a1 inputs each) and bias, fc3's inputs."""
    return a1 * (784 + 1) + a2 * (a1 + 1) + 10 * a2


def test_mp_channel_run_keeps_the_expected_channels(tmp_path, capsys, monkeypatch):
    """An MP run over LeNet's channels (--target 0.3 of the parameters) keeps the channels of
    the best scores at its cut while their parameters fit (counted from the layers' shapes);
    structured.pt holds exactly those, its network has the widths and parameters that follow
    and computes what the masked network (pruned.pt) computes, at the run's accuracy."""
    from pbscale.methods import schedules
    from pbscale.nets.channel_ops import same_outputs
    from pbscale.pruning.outputs import load_pruned

    real, seen = schedules.keep_within, []

    def spy(scores, fraction, kept_fraction, alive=None, groups=None):
        keep = real(scores, fraction, kept_fraction, alive, groups)
        assert groups is not None and groups.shape == (2, 300)  # fc1's and fc2's channels
        seen.append((scores.cpu().clone(), fraction, keep.cpu().clone()))
        return keep

    monkeypatch.setattr(schedules, "keep_within", spy)
    args = ["--model", "lenet", "--method", "mp", "--mode", "joint", "--granularity", "channel",
            "--target", "0.3", "--out", str(tmp_path), *TINY, "--epochs", "2", "--prune-at",
            "0.5"]
    assert P.main(args) == 0
    line = capsys.readouterr().out
    assert "channel variables" in line and "structured.pt: params" in line
    (scores, fraction, keep), = seen  # MP cuts once
    assert fraction == 0.3
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    names = [v["name"] for v in json.loads((folder / "groups.json").read_text())["variables"]]
    order = np.argsort(-scores.numpy(), kind="stable")
    taken, a = [], {"fc1": 0, "fc2": 0}
    for i in order:  # in order, each channel that still fits
        layer = names[i][:3]
        a[layer] += 1
        if _lenet_kept(a["fc1"], a["fc2"]) > 0.3 * _lenet_kept(300, 100):
            a[layer] -= 1
        else:
            taken.append(int(i))
    k = len(taken)
    want = torch.zeros(len(names), dtype=torch.bool)
    want[taken] = True
    assert torch.equal(keep, want)
    summary = runio.read_summary(folder / "summary.json")
    assert summary["channels_kept"] == k == a["fc1"] + a["fc2"] and summary["zeroed_groups"] == []
    assert summary["final_remaining"] == pytest.approx(
        _lenet_kept(a["fc1"], a["fc2"]) / _lenet_kept(300, 100), rel=1e-12)
    assert summary["final_remaining"] <= 0.3
    saved = torch.load(folder / "structured.pt", map_location="cpu", weights_only=True)
    assert torch.equal(saved["keep"], want)
    cfg = PruneConfig(model="lenet", synthetic=48, val_size=16)
    _check_folder(folder, cfg)
    small = load_structured("lenet", folder / "structured.pt")
    shapes = [tuple(small.get_parameter(f"fc{i}.weight").shape) for i in (1, 2, 3)]
    assert shapes == [(a["fc1"], 784), (a["fc2"], a["fc1"]), (10, a["fc2"])]
    masked = load_pruned("lenet", folder / "pruned.pt")
    data = setup.load_data(cfg.resolved(), torch.device("cpu"))
    x = data.prepare(data.test.x)
    with torch.no_grad():
        assert same_outputs(small(x), masked(x))


def test_gmp_channel_run_follows_its_schedule(tmp_path):
    """GMP over LeNet's channels: after each epoch the parameters kept (metrics.csv's
    remaining) lie at most one channel below the cubic schedule at its last cut, never above
    it, and the channels only go."""
    cfg = PruneConfig(model="lenet", synthetic=48, val_size=16, epochs=5, max_batches=3,
                      batch_size=8, method="gmp", mode="joint", target=0.2,
                      granularity="channel", gmp_start=0.1, gmp_end=0.8, gmp_every=2)
    summary = prun.run(cfg, tmp_path, quiet=True)
    rows = runio.read_csv(Path(summary["folder"]) / "metrics.csv")
    S, total = 3, 15
    start, end = round(0.1 * total), round(0.8 * total)  # steps 2 and 12, a cut every 2
    cuts = [t for t in range(start, end + 1) if (t - start) % 2 == 0 or t == end]

    def fraction(t: int) -> float:  # Zhu and Gupta's cubic, by hand
        return 0.2 + 0.8 * (1 - (t - start) / (end - start)) ** 3

    one = (784 + 1 + 100) / _lenet_kept(300, 100)  # the costliest channel: an fc1 row
    assert [r["epoch"] for r in rows] == list(range(6))
    before = 1.0
    for r in rows:
        done = [t for t in cuts if t <= r["epoch"] * S - 1]
        f = fraction(done[-1]) if done else 1.0
        assert f - one < r["remaining"] <= f + 1e-12, (r["epoch"], f, r["remaining"])
        assert r["remaining_channels"] <= before
        before = r["remaining_channels"]
    assert rows[1]["remaining"] == 1 and rows[2]["remaining_channels"] < 1  # cuts from step 4
    assert rows[-1]["remaining"] <= 0.2


def test_gmp_channel_run_on_a_residual_cnn_by_macs(tmp_path):
    """GMP over ResCNN's channels (BatchNorm, a residual addition) with --cost macs: the MACs
    kept stay within the target, and the smaller network computes what the masked one does."""
    from pbscale.nets.channel_ops import same_outputs

    arrays = _zoo.arrays("gray", n_train=48, n_test=24)
    result = prune_model(_zoo.ResCNN, (arrays["x_train"], arrays["y_train"]),
                         (arrays["x_test"], arrays["y_test"]), method="gmp", mode="joint",
                         target=0.4, cost="macs", granularity="channel", epochs=3,
                         out=tmp_path, progress=False, max_batches=2, batch_size=8,
                         val_size=16, threads=1, gmp_every=1)
    s = result.summary
    assert s["final_remaining"] <= 0.4 and s["channels_kept"] < s["channels"]
    assert s["pruned_macs"] < s["dense_macs"]
    x = torch.as_tensor(arrays["x_test"]).float()
    x = (x - x.mean()) / x.std()  # any inputs: the two networks compute the same function
    with torch.no_grad():
        assert same_outputs(result.structured()(x), result.pruned()(x))


def test_mp_channel_cut_never_empties_a_coupled_group(tmp_path, monkeypatch):
    """MP over ResCNN's channels at 10% of the MACs: the best-scored fill alone would switch off
    every channel of the residual branch (conv_a), which the smaller network then holds at one
    zeroed channel outside the budget (23% of the MACs, measured). The cut's floor keeps one of
    its channels instead, so no group is held and the smaller network's MACs are the budget the
    run reports (within 10%)."""
    from pbscale.methods import schedules

    real, emptied = schedules.keep_within, []

    def spy(scores, fraction, kept_fraction, alive=None, groups=None):
        plain = real(scores, fraction, kept_fraction, alive)
        emptied.append([bool(not plain[[i for i in r if i < plain.numel()]].any())
                        for r in groups.tolist()])
        return real(scores, fraction, kept_fraction, alive, groups)

    monkeypatch.setattr(schedules, "keep_within", spy)
    arrays = _zoo.arrays("gray", n_train=48, n_test=24)
    result = prune_model(_zoo.ResCNN, (arrays["x_train"], arrays["y_train"]),
                         (arrays["x_test"], arrays["y_test"]), method="mp", mode="joint",
                         target=0.1, cost="macs", granularity="channel", epochs=3,
                         out=tmp_path, progress=False, max_batches=2, batch_size=8,
                         val_size=16, threads=1)
    assert emptied == [[False, True]]  # one cut; without the floor, conv_a's group empties
    s = result.summary
    assert s["zeroed_groups"] == []
    keep = torch.load(result.folder / "structured.pt", weights_only=True)["keep"]
    assert bool(keep[:6].any()) and bool(keep[6:].any())
    assert s["final_remaining"] <= 0.1
    assert s["pruned_macs"] / s["dense_macs"] == pytest.approx(s["final_remaining"], rel=1e-12)


@pytest.mark.parametrize("method,mode", [("mp", "joint"), ("gmp", "joint"),
                                         ("edgepopup", "supermask")])
def test_every_cut_to_target_over_channels_keeps_each_coupled_group(tmp_path, monkeypatch,
                                                                    method, mode):
    """The three methods that cut to --target over channels, on ResCNN at 10% of the MACs:
    with the floor no group is held at a zeroed channel and the smaller network's MACs are the
    run's `remaining`; with the coupled groups taken away from the plan (no floor), each of
    them switches off the residual branch (conv_a), and the smaller network, holding a zeroed
    channel there, has more MACs than the run reports."""
    from pbscale.pruning.task import PruneTask

    arrays = _zoo.arrays("gray", n_train=48, n_test=24)

    def run(out):
        return prune_model(_zoo.ResCNN, (arrays["x_train"], arrays["y_train"]),
                           (arrays["x_test"], arrays["y_test"]), method=method, mode=mode,
                           target=0.1, cost="macs", granularity="channel", epochs=3,
                           out=out, progress=False, max_batches=2, batch_size=8, val_size=16,
                           threads=1, gmp_every=1).summary

    s = run(tmp_path / "floor")
    assert s["zeroed_groups"] == [] and s["final_remaining"] <= 0.1
    assert s["pruned_macs"] / s["dense_macs"] == pytest.approx(s["final_remaining"], rel=1e-12)
    monkeypatch.setattr(PruneTask, "coupled_index", lambda self: None)
    s = run(tmp_path / "plain")
    assert s["zeroed_groups"] == ["conv_a"] and s["final_remaining"] <= 0.1
    assert s["pruned_macs"] / s["dense_macs"] > 2 * s["final_remaining"]


# ------------------------------------------------------------------ edge-popup over channels


def test_edge_popup_keeps_the_budgeted_top_of_its_scores_over_channels():
    """Edge-popup given a kept-fraction function (channel variables): each step's mask is the
    budgeted top of its scores within --target of that cost (schedules.keep_within), no
    variable left out would still fit, the straight-through gradient reaches every score;
    a group's scores (G, d) give each row's mask; without one (weights) it is the per-layer
    top-k as before."""
    from pbscale.methods import MaskTrainer, MethodConfig, StepArgs
    from pbscale.methods.registry import REGISTRY
    from pbscale.methods.schedules import keep_within, top_scores

    d, target = 12, 0.4
    costs = torch.arange(1, d + 1, dtype=torch.float64)

    def kept_fraction(keeps: torch.Tensor) -> torch.Tensor:
        return (keeps.to(torch.float64) * costs).sum(-1) / costs.sum()

    trainer = MaskTrainer(MethodConfig(method="edgepopup", n=1, seed=3, lr=0.05), d,
                          total_steps=20, dtype=torch.float64, target=target,
                          kept_fraction=kept_fraction)
    want = torch.zeros(d, dtype=torch.float64)
    want[:4] = 1.0  # the cheapest four: cost 10 of 78, within 40%

    def f(z: torch.Tensor) -> torch.Tensor:
        return ((z - want) ** 2).sum(-1)

    for _ in range(30):
        z = trainer.mode_mask()
        r = trainer.r.detach()
        assert torch.equal(z, keep_within(r, target, kept_fraction).to(z.dtype))
        assert float(kept_fraction(z[None] != 0)[0]) <= target
        for i in (z == 0).nonzero().flatten().tolist():  # no left-out variable would fit
            more = z.clone()
            more[i] = 1.0
            assert float(kept_fraction(more[None] != 0)[0]) > target
        est = trainer.gradient(f)
        assert torch.allclose(est.grad, 2 * (z - want), atol=1e-12)  # to every score
        trainer.step(f)
    assert bool((trainer.mode_mask()[:4] == 1).all())  # the scores moved the mask
    family = REGISTRY["edgepopup"]
    at = trainer.args()
    rows = torch.rand(3, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.equal(family.theta(rows, at),
                       torch.stack([family.theta(row, at) for row in rows]))
    weights = StepArgs(**{**vars(at), "kept_fraction": None, "layers": (5, 7)})
    assert torch.equal(family.theta(rows[0], weights), top_scores(rows[0], (5, 7), target))


def _lenet_groups(cost: str):
    """The channel variables of a tiny LeNet channel run (as the run finds them)."""
    cfg = PruneConfig(model="lenet", synthetic=48, val_size=16, method="edgepopup",
                      granularity="channel", cost=cost)
    c, dev, data = prun.prepare(cfg)
    return prun.build(c, data, dev)[0].groups


@pytest.mark.parametrize("cost", ["params", "macs"])
def test_edge_popup_channel_run_fills_its_target(tmp_path, capsys, cost):
    """Edge-popup over LeNet's channels (--target 0.3 of the --cost): the run finishes, keeps
    at most 30% of the prunable part's cost, no channel it left out would still fit in the
    budget, and its files agree (:func:`_check_folder`: the structured network has the run's
    accuracy)."""
    from pbscale.nets.channel_layout import remaining_cost

    args = ["--model", "lenet", "--method", "edgepopup", "--mode", "supermask",
            "--granularity", "channel", "--target", "0.3", "--cost", cost,
            "--out", str(tmp_path), *TINY]
    assert P.main(args) == 0
    line = capsys.readouterr().out
    assert "channel variables" in line and "structured.pt: params" in line
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = runio.read_summary(folder / "summary.json")
    assert 0 < summary["final_remaining"] <= 0.3
    assert summary["channels_kept"] < summary["channels"]
    keep = torch.load(folder / "structured.pt", map_location="cpu", weights_only=True)["keep"]
    groups = _lenet_groups(cost)
    assert remaining_cost(groups, keep, cost) == pytest.approx(summary["final_remaining"],
                                                               rel=1e-12)
    for i in (~keep).nonzero().flatten().tolist():
        more = keep.clone()
        more[i] = True
        assert remaining_cost(groups, more, cost) > 0.3, i
    _check_folder(folder, PruneConfig(model="lenet", synthetic=48, val_size=16))


def test_edge_popup_prunes_a_residual_cnn_by_macs_through_the_api(tmp_path):
    """Edge-popup over ResCNN's channels (BatchNorm, a residual addition) with --cost macs:
    the MACs kept stay within the target, the smaller network computes what the masked one
    does and has the run's accuracy."""
    from pbscale.nets.channel_ops import same_outputs

    arrays = _zoo.arrays("gray", n_train=48, n_test=24)
    train, test = (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])
    result = prune_model(_zoo.ResCNN, train, test, method="edgepopup", mode="supermask",
                         target=0.4, cost="macs", granularity="channel", epochs=1,
                         out=tmp_path, progress=False, max_batches=2, batch_size=8,
                         val_size=16, threads=1)
    s = result.summary
    assert 0 < s["final_remaining"] <= 0.4 and s["channels_kept"] < s["channels"]
    assert s["pruned_macs"] < s["dense_macs"]
    net = result.structured()
    data = user_data.arrays_data(user_data.object_arrays(train, test), "cpu", 16, 0)
    acc, _ = _accuracy(net, data.batches("test", 1000))
    assert acc == s["final_test_acc"]
    x = torch.as_tensor(arrays["x_test"]).float()
    x = (x - x.mean()) / x.std()  # any inputs: the two networks compute the same function
    with torch.no_grad():
        assert same_outputs(net(x), result.pruned()(x))


@pytest.mark.parametrize("method", ["edgepopup", "mp"])
def test_a_channel_group_of_budgeted_methods_equals_its_separate_runs(tmp_path, method):
    """Edge-popup and MP over channels (each member's mask within --target of the cost) in a
    group of two seeds: every member's folder is its separate run's."""
    from test_prune_group import same_folder

    mode = "supermask" if method == "edgepopup" else "joint"
    cfgs = [PruneConfig(model="lenet", synthetic=48, val_size=16, epochs=2, max_batches=2,
                        batch_size=8, method=method, mode=mode, granularity="channel",
                        target=0.3, seed=s) for s in (0, 1)]
    assert prun.run_group(cfgs, tmp_path / "grp", quiet=True) == (0, 2)
    for c in cfgs:
        sep = Path(prun.run(c, tmp_path / "sep", quiet=True)["folder"])
        same_folder(sep, tmp_path / "grp" / sep.name)
        assert runio.read_summary(sep / "summary.json")["final_remaining"] <= 0.3
