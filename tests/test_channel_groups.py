"""Structured pruning's core (pbscale/nets/channels.py): the channel variables of Torch-Pruning's
coupled groups, masking them against removing them, and the exact parameter and MAC costs.

Over the zoo's networks with channels, one with a depthwise convolution, a grouped convolution
and a concatenation feeding it (ties across two coupled groups) and a ResNet-style network
(a strided block with a 1x1 shortcut and an identity block): for seeded random keep masks the
masked network computes what the pruned one computes (eval, and train mode with batch
statistics), the pruned network's parameters and MACs are what the cost table says (exactly),
each variable's cost is exactly what removing it alone saves, the head's outputs are never
pruned, leave_out is honoured, and networks Torch-Pruning cannot handle get one line naming
the layer."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

tp = pytest.importorskip("torch_pruning")

import _zoo  # noqa: E402

from pbexact.errors import PBInputError  # noqa: E402
from pbscale.nets import channels as C  # noqa: E402
from pbscale.nets.channel_costs import count, latency, positions  # noqa: E402


class Mixed(nn.Module):
    """A depthwise convolution, a concatenation of two branches and a grouped convolution
    (groups=2) over it: its blocks split one branch, so the ties cross coupled groups."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.bn_dw = nn.BatchNorm2d(8)
        self.pw = nn.Conv2d(8, 8, 1)
        self.branch = nn.Conv2d(8, 4, 3, padding=1)
        self.gc = nn.Conv2d(12, 12, 3, padding=1, groups=2, bias=False)
        self.bn_gc = nn.BatchNorm2d(12)
        self.head = nn.Linear(12, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(self.stem(x)))
        h = F.relu(self.bn_dw(self.dw(h)))
        h = torch.cat([F.relu(self.pw(h)), F.relu(self.branch(h))], 1)
        return self.head(F.relu(self.bn_gc(self.gc(h))).mean((2, 3)))


class ResNetish(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.layer1 = _zoo.BasicBlock(6, 6, 1)
        self.layer2 = _zoo.BasicBlock(6, 10, 2)
        self.fc = nn.Linear(10, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layer2(self.layer1(F.relu(self.bn(self.conv(x)))))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


class Up(nn.Module):
    """A strided convolution and a transposed one (MACs: input positions times weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.down, self.bn = nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8)
        self.up, self.bn2 = nn.ConvTranspose2d(8, 6, 4, 2, 1), nn.BatchNorm2d(6)
        self.mix, self.fc = nn.Conv2d(6, 4, 1), nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn2(self.up(F.relu(self.bn(self.down(x))))))
        return self.fc(F.relu(self.mix(h)).mean((2, 3)))


#: name -> (factory, example batch of 8, head layer)
MODELS = {
    "MLP": (_zoo.MLP, lambda: torch.randn(8, 1, 8, 8), "head"),
    "ResCNN": (_zoo.ResCNN, lambda: torch.randn(8, 1, 8, 8), "head"),
    "depthwise": (_zoo.depthwise, lambda: torch.randn(8, 3, 8, 8), "9"),
    "conv1d": (_zoo.conv1d, lambda: torch.randn(8, 2, 16), "6"),
    "Embed": (_zoo.Embed, lambda: torch.randint(0, 50, (8, 6)), "head"),
    "regressor": (_zoo.regressor, lambda: torch.randn(8, 5), "4"),
    "Mixed": (Mixed, lambda: torch.randn(8, 3, 8, 8), "head"),
    "ResNetish": (ResNetish, lambda: torch.randn(8, 3, 8, 8), "fc"),
    "Up": (Up, lambda: torch.randn(8, 3, 8, 8), "fc"),
}


def _build(name: str):
    factory, inputs, head = MODELS[name]
    torch.manual_seed(0)
    model = factory()
    for m in model.modules():  # BatchNorm away from the identity: the checks see it
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    x = inputs()
    return model, x, head, C.channel_groups(model, x[:1])


@pytest.fixture(scope="module", params=sorted(MODELS))
def built(request):
    return (request.param, *_build(request.param))


def _keeps(groups: C.ChannelGroups, n: int, seed: int) -> list[torch.Tensor]:
    """n random keep masks (half the variables), each coupled group keeping one at least."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        keep = torch.rand(groups.d, generator=gen) < 0.5
        for c in groups.coupled:
            if c.variables and not c.frozen and not keep[list(c.variables)].any():
                keep[c.variables[0]] = True
        out.append(keep)
    return out


def test_masked_equals_removed(built):
    name, model, x, _, groups = built
    assert groups.d > 0
    for keep in _keeps(groups, 4, seed=1):
        masked = copy.deepcopy(model)
        C.mask_parameters(masked, groups, keep)
        pruned = C.remove_channels(model, groups, keep)
        with torch.no_grad():
            for train in (False, True):  # BatchNorm with running, then batch statistics
                a, b = masked.train(train)(x), pruned.train(train)(x)
                assert a.shape == b.shape
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        if not bool(keep.all()):  # the tensors shrank
            assert count(pruned, x[:1])[0] < count(model, x[:1])[0]


def test_costs_exact(built):
    """The pruned network's parameters and MACs equal the cost table's, exactly; a variable's
    cost is what removing it alone saves; several removed variables save at most the sum."""
    name, model, x, _, groups = built
    dense = count(model, x[:1])
    assert dense == (groups.costs.dense_params, groups.costs.dense_macs)
    p_cost, m_cost = groups.cost("params"), groups.cost("macs")
    assert (p_cost > 0).all() and (m_cost > 0).all()
    for keep in _keeps(groups, 4, seed=2):
        pruned = count(C.remove_channels(model, groups, keep), x[:1])
        assert pruned == (int(groups.costs.kept(keep, "params")),
                          int(groups.costs.kept(keep, "macs")))
        gone = ~keep.numpy()
        assert dense[0] - pruned[0] <= p_cost[gone].sum()
        assert dense[1] - pruned[1] <= m_cost[gone].sum()
    for v in range(groups.d):
        keep = torch.ones(groups.d, dtype=torch.bool)
        keep[v] = False
        pruned = count(C.remove_channels(model, groups, keep), x[:1])
        assert (dense[0] - pruned[0], dense[1] - pruned[1]) == (p_cost[v], m_cost[v])
        assert (groups.groups[v].params, groups.groups[v].macs) == (p_cost[v], m_cost[v])


def test_macs_are_torch_pruning_counts_less_bias(built):
    """Per Conv/Linear layer at batch 1, Torch-Pruning's counter gives our MACs plus the bias
    additions; its parameter count is ours (dense and pruned). A transposed convolution is
    the exception: the counter takes its output positions (stride^2 times its input's), where
    each input position's weights multiply once (ours: input positions times the weight)."""
    name, model, x, _, groups = built
    for net in (model, C.remove_channels(model, groups, _keeps(groups, 1, seed=3)[0])):
        ops, params, layer_ops, _ = tp.utils.count_ops_and_params(net, x[:1], layer_wise=True)
        assert params == count(net, x[:1])[0]
        pos = positions(net, x[:1])
        mods = dict(net.named_modules())
        assert pos
        for n, p in pos.items():
            m = mods[n]
            if getattr(m, "transposed", False):
                p = p * int(np.prod(m.stride))
            bias = 0 if m.bias is None else (
                m.out_features if isinstance(m, nn.Linear) else m.out_channels * p)
            assert layer_ops[m] == p * m.weight.numel() + bias, n


def test_head_never_pruned(built):
    name, model, x, head, groups = built
    mods = dict(model.named_modules())
    assert all(not (m.module == head and m.kind == "out") for g in groups.groups
               for m in g.members)
    assert any(s.startswith(f"{head}:") and "output" in s for s in groups.skipped)
    keep = torch.zeros(groups.d, dtype=torch.bool)  # as little as allowed: one per group
    for c in groups.coupled:
        if c.variables and not c.frozen:
            keep[c.variables[0]] = True
    pruned = C.remove_channels(model, groups, keep)
    assert dict(pruned.named_modules())[head].weight.shape[0] == mods[head].weight.shape[0]
    with torch.no_grad():
        assert pruned.eval()(x).shape == model.eval()(x).shape


class TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c, self.h = nn.Conv2d(3, 8, 1), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.c(x)
        return f, self.h(f.mean((2, 3)))


def test_every_output_is_a_head():
    """Features returned next to the logits are an output too: nothing is pruned."""
    g = C.channel_groups(TwoOutputs(), torch.randn(1, 3, 4, 4))
    assert g.d == 0 and sorted(s.split(":")[0] for s in g.skipped) == ["c", "h"]


def test_named_head_and_leave_out():
    model, x, _, groups = _build("ResNetish")
    dense = {n: p.shape for n, p in model.named_parameters()}
    # a named head: layer2's output channels (coupled with fc's inputs) stay
    g2 = C.channel_groups(model, x[:1], head="layer2.conv2")
    assert g2.d == groups.d - 10 and all(
        not (m.module == "layer2.conv2" and m.kind == "out") for g in g2.groups
        for m in g.members)
    assert any(m.module == "layer2.conv2" and m.kind == "in" for g in g2.groups
               for m in g.members)  # its input channels still go with layer2.conv1's
    # leave out one layer (every group touching it) and a container (every layer in it)
    for leave, untouched in ((("layer1.conv1",), ["layer1.conv1", "layer1.bn1"]),
                             (("layer2",), [n for n in dense if n.startswith("layer2.")])):
        g = C.channel_groups(model, x[:1], leave_out=leave)
        assert 0 < g.d < groups.d
        touched = {m.module for v in g.groups for m in v.members}
        assert not any(t.startswith(leave[0]) for t in touched)
        keep = _keeps(g, 1, seed=4)[0]
        pruned = dict(C.remove_channels(model, g, keep).named_parameters())
        for n in untouched:
            n = n if n in dense else n + ".weight"
            assert pruned[n].shape == dense[n], n
        assert any(pruned[n].shape != dense[n] for n in dense)
    with pytest.raises(PBInputError, match="leave_out names no layer 'nope'"):
        C.channel_groups(model, x[:1], leave_out=("nope",))


def test_ties_of_grouped_convolutions():
    """Mixed: 8 depthwise-coupled channels; pw's 8 and branch's 4 channels feed a groups=2
    convolution in blocks (pw 0-5 | pw 6-7, branch 0-3), so pw[j] ties pw[j+6] and pw[2+j]
    ties branch[j]; the grouped convolution's 12 outputs tie in pairs (j, j+6): d = 20. The
    zoo's depthwise net: its groups=3 convolution's 6 outputs feed a groups=2 one, which ties
    all six together (left out); the groups=2 one's outputs tie in pairs: d = 3 + 8."""
    _, _, _, g = _build("Mixed")
    assert g.d == 20
    names = [v.name for v in g.groups]
    assert names[:2] == ["stem[0]", "stem[1]"]
    assert {"pw[0,6]", "pw[2]+branch[0]", "gc[0,6]"} <= set(names)
    v = g.groups[names.index("pw[2]+branch[0]")]
    assert {m.module for m in v.members} == {"pw", "branch", "gc"} and len(v.coupled) == 2
    gc_in = [s for s in v.slices if s.param == "gc.weight" and s.role == "in"]
    assert [(s.dim, s.index, s.rows) for s in gc_in] == [(1, 2, (0, 6)), (1, 2, (6, 12))]
    # hand counts: stem row 27, bn 2, dw row 9 + bias 1, bn_dw 2, pw column 8, branch
    # column 36 (params); times 64 positions for the convolution weights (MACs)
    dw0 = g.groups[names.index("stem[0]")]
    assert (dw0.params, dw0.macs) == (27 + 2 + 10 + 2 + 8 + 36, 64 * (27 + 9 + 8 + 36))
    _, _, _, z = _build("depthwise")
    assert z.d == 11 and any("tie all its channels" in s for s in z.skipped)


def test_hand_counted_costs():
    """ResCNN (8x8 images, 3x3 convolutions, 6 channels): conv_a's channel owns its row (6x9),
    bn_a's 2 and conv_b's column (6x9); conv's channel (tied to conv_b's by the residual sum)
    owns conv's row (1x9), bn's 2, conv_a's column (54), conv_b's row (54), bn_b's 2 and the
    head's column (10). MACs: 64 positions times the convolution weights, plus the head's."""
    _, _, _, g = _build("ResCNN")
    assert g.d == 12
    a = next(v for v in g.groups if v.name == "conv_a[0]")
    c = next(v for v in g.groups if v.name == "conv[0]")
    assert (a.params, a.macs) == (54 + 2 + 54, 64 * 108)
    assert (c.params, c.macs) == (9 + 2 + 54 + 54 + 2 + 10, 64 * (9 + 54 + 54) + 10)


def test_expansion_shapes_and_values():
    model, x, _, groups = _build("Mixed")
    z = (torch.rand(3, groups.d, generator=torch.Generator().manual_seed(5)) < 0.5).float()
    params = dict(model.named_parameters())
    masked = C.masked_parameters(model, groups, z)
    assert set(masked) >= {"stem.weight", "bn.weight", "bn.bias", "dw.bias", "gc.weight"}
    for i in range(3):
        net = copy.deepcopy(model)
        C.mask_parameters(net, groups, z[i])
        mine = dict(net.named_parameters())
        for n, t in masked.items():
            assert t.shape == (3, *params[n].shape)
            assert torch.equal(t[i], mine[n]), n
        for v in groups.groups:  # the out slices of a removed variable are zero, others not
            for sl in v.slices:
                if sl.role == "out":
                    part = mine[sl.param].select(sl.dim, sl.index)
                    assert bool((part == 0).all()) == (z[i, v.index] == 0), (v.name, sl)


def test_remove_refuses_every_channel():
    model, x, _, groups = _build("MLP")
    keep = torch.ones(groups.d, dtype=torch.bool)
    keep[list(groups.coupled[0].variables)] = False
    with pytest.raises(PBInputError, match="removes every channel of layer 'fc1'") as e:
        C.remove_channels(model, groups, keep)
    assert "\n" not in str(e.value)
    with pytest.raises(PBInputError, match="shape"):
        C.remove_channels(model, groups, keep[:-1])


class NoGrad(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c, self.h = nn.Conv2d(3, 8, 3), nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            h = self.c(x)
        return self.h(h.mean((2, 3)))


class Chunk(nn.Module):
    """torch.chunk into two consumers: Torch-Pruning 1.6 maps the first half's channels to
    the second consumer (and the removed network fails or differs)."""

    def __init__(self) -> None:
        super().__init__()
        self.c, self.d, self.e = nn.Conv2d(3, 8, 1), nn.Conv2d(4, 6, 1), nn.Conv2d(4, 6, 1)
        self.h = nn.Linear(12, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.c(x).chunk(2, 1)
        return self.h(torch.cat([self.d(a), self.e(b)], 1).mean((2, 3)))


class Sigmoid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.h = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.h(torch.sigmoid(self.a(x)))


class Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> float:
        return self.a(x).sum().item()


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.n, self.h = nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.h(self.n(self.a(x)))


@pytest.mark.parametrize("factory, x, match", [
    (NoGrad, (1, 3, 8, 8), "layer 'c' runs but Torch-Pruning's trace .*leave_out=\\('c',\\)"),
    (Scalar, (2, 4), "Torch-Pruning cannot trace the network \\(TypeError"),
    (Chunk, (1, 3, 8, 8), "removing channels of layer 'c' does not compute what masking .*"
                          "leave_out=\\('c',\\)"),
    (Sigmoid, (2, 4), "removing channels of layer 'a' does not compute .*leave_out"),
    (_zoo.Tied, (2, 1, 8, 8), "layer 'b' shares a parameter with 'a' \\(tied\\)"),
    (Norm, (2, 4), "layer 'n' is coupled to the channels of 'a' .*LayerNorm.*leave_out=\\('n',"),
])
def test_refusals_are_one_line(factory, x, match):
    torch.manual_seed(0)
    model = factory()
    with pytest.raises(PBInputError, match=match) as e:
        C.channel_groups(model, torch.randn(*x))
    assert "\n" not in str(e.value) and e.value.__cause__ is None
    assert e.value.__suppress_context__ or e.value.__context__ is None


def test_refused_layer_left_out_works():
    torch.manual_seed(0)
    g = C.channel_groups(Chunk(), torch.randn(1, 3, 8, 8), leave_out=("c",))
    assert {v.name.split("[")[0] for v in g.groups} == {"d", "e"}
    g = C.channel_groups(_zoo.Tied(), torch.randn(2, 1, 8, 8), leave_out=("a", "b"))
    assert g.d == 0 and any("left out" in s for s in g.skipped)


def test_groups_record(built):
    name, model, x, _, groups = built
    rec = json.loads(json.dumps(C.groups_record(groups)))
    assert rec["d"] == groups.d == len(rec["variables"])
    assert rec["totals"]["params"] == int(groups.cost("params").sum()) == sum(
        v["params"] for v in rec["variables"])
    assert rec["totals"]["macs"] == int(groups.cost("macs").sum()) == sum(
        v["macs"] for v in rec["variables"])
    assert (rec["dense"]["params"], rec["dense"]["macs"]) == count(model, x[:1])
    assert set(range(groups.d)) == {i for c in rec["coupled"] for i in c["variables"]}
    assert all(v["members"] and all(m["channels"] for m in v["members"])
               for v in rec["variables"])


def test_latency_is_a_median_of_positive_times():
    model, x, _, _ = _build("ResCNN")
    model.train()
    t = latency(model, x, repeats=3, warmup=1)
    assert 0 < t < 5 and model.training
    with pytest.raises(PBInputError, match="repeats >= 1"):
        latency(model, x, repeats=0)
    assert np.isfinite(t)
