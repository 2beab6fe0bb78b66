"""MaskedModule's backends for conv nets: the folded network of grouped convolutions
(pbscale.forward.folded.forward_masked) and the loop over masks equal the vmap path on every model
of pbscale.nets.models (VGG-19 with PBNN_SLOW_TESTS=1): outputs, gradients to soft masks and to the
weights, BatchNorm running statistics after the call, training and eval mode, with and without
dynamic weight rescaling; the backend choice per device; networks only vmap can run; bf16
autocast and channels-last against float32."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from _masked_reference import forward_one, randomize_bn
from torch import nn

from pbexact.errors import PBInputError
from pbscale.forward.folded import foldable, forward_masked
from pbscale.forward.masks import MaskedModule
from pbscale.forward.rescale import rescaled_weight
from pbscale.nets.models import INPUT_SHAPES, MODELS, build_model

SLOW = os.environ.get("PBNN_SLOW_TESTS") == "1"




def _run(net: nn.Module, names: list[str], backend: str, z: torch.Tensor, x: torch.Tensor,
         hook, train: bool):
    """Outputs, gradients (soft masks, then every weight) and buffers after one forward."""
    net = copy.deepcopy(net).train(train)
    layout = MaskedModule(net, names, train_weights=True, weight_hook=hook, backend=backend)
    zz = z.clone().requires_grad_(True)
    out = layout.forward(zz, x)
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    grads = torch.autograd.grad((out.tanh() * w).sum(), [zz, *net.parameters()])
    return out.detach(), grads, {n: b.clone() for n, b in net.named_buffers()}


MODEL_CASES = [m for m in MODELS if m != "lenet"] + ["lenet"]


@pytest.mark.parametrize("name", MODEL_CASES)
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("hook", [None, rescaled_weight], ids=["plain", "rescaled"])
def test_folded_and_loop_equal_vmap_on_every_model(name, train, hook):
    if name == "vgg19" and not SLOW:
        pytest.skip("VGG-19 (20M masked weights): run with PBNN_SLOW_TESTS=1")
    gen = torch.Generator().manual_seed(3)
    net = build_model(name, seed=0).double()
    randomize_bn(net, gen)
    assert foldable(net)
    names = net.masked_names(mask_shortcuts=True)
    x = torch.randn((3, *INPUT_SHAPES[net.dataset]), generator=gen, dtype=torch.float64)
    d = sum(dict(net.named_parameters())[n].numel() for n in names)
    z = 0.2 + 0.8 * torch.rand((3, d), generator=gen, dtype=torch.float64)  # soft masks
    ref_out, ref_grads, ref_buf = _run(net, names, "vmap", z, x, hook, train)
    for backend in ("folded", "loop"):
        out, grads, buf = _run(net, names, backend, z, x, hook, train)
        torch.testing.assert_close(out, ref_out, rtol=1e-9, atol=1e-10)
        assert not torch.allclose(out[0], out[1])  # the masks differ, so do the outputs
        for a, b in zip(grads, ref_grads):
            assert a.abs().max() > 0 or b.abs().max() == 0
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
        for n, b in ref_buf.items():  # running statistics: the same update (or none in eval)
            torch.testing.assert_close(buf[n], b, rtol=1e-12, atol=1e-12, msg=n)
    changed = any(not torch.equal(ref_buf[n], b) for n, b in net.named_buffers())
    assert changed == (train and name != "lenet" and name != "conv6")  # models with BN


def test_supermask_outputs_carry_no_weight_graph():
    net = build_model("resnet20", seed=0)
    layout = MaskedModule(net, net.masked_names())
    assert layout.backend_for("cpu") == "loop"
    z = torch.ones(2, layout.d, requires_grad=True)
    out = layout.forward(z, torch.randn(2, 3, 32, 32))
    (g,) = torch.autograd.grad(out.sum(), z)  # only the masks are leaves of the graph
    assert g.abs().max() > 0 and all(p.grad is None for p in net.parameters())
    with torch.no_grad():
        assert not layout.forward(z, torch.randn(2, 3, 32, 32)).requires_grad


class Cat(nn.Module):
    """Concatenates two conv branches along channels: not channel-wise, vmap only."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(2, 3, 3), nn.Conv2d(2, 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x)], 1).flatten(1)


def _tied() -> nn.Module:
    lin = nn.Linear(4, 4)
    return nn.Sequential(lin, nn.ReLU(), lin)


@pytest.mark.parametrize("make,xshape", [
    (Cat, (3, 2, 5, 5)),
    (lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.LayerNorm([3, 3, 3])), (3, 2, 5, 5)),
    (lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(2)), (3, 2, 5, 5)),
    (lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect")), (3, 2, 5, 5)),
])
def test_networks_only_vmap_runs(make, xshape):
    torch.manual_seed(0)
    net = make().double()
    assert not foldable(net)
    layout = MaskedModule(net)
    assert layout.backend_for("cpu") == layout.backend_for("cuda") == "vmap"
    z = (torch.rand(2, layout.d, dtype=torch.float64) < 0.5).double()
    x = torch.randn(xshape, dtype=torch.float64)
    ref = torch.stack([forward_one(layout, zi, x) for zi in z])
    torch.testing.assert_close(layout.forward(z, x), ref)
    for backend in ("folded", "loop"):
        with pytest.raises(PBInputError, match="cannot run this network"):
            MaskedModule(net, backend=backend)
    with pytest.raises(PBInputError, match="amp and channels_last"):
        MaskedModule(net, amp=torch.bfloat16)


def test_foldable_needs_the_forward_vouched_by_its_own_class():
    """A subclass overriding a vouched forward is not trusted until it vouches itself; an
    nn.Sequential subclass keeping Sequential's forward is."""
    from pbscale.nets.models import BasicBlock

    class Mixer(BasicBlock):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # mixes channels: roll
            return super().forward(x).roll(1, dims=1)

    assert foldable(BasicBlock(2, 4, 1)) and not foldable(Mixer(2, 4, 1))
    Mixer.channelwise_forward = True  # its author's promise (here false: this is the check)
    assert foldable(Mixer(2, 4, 1))
    assert foldable(build_model("lenet"))  # an nn.Sequential subclass


def test_tied_parameters_are_not_foldable():
    """A module used twice: a mask on its one parameter name must reach both uses, which the
    per-layer folding cannot promise; MaskedModule refuses such a network on every backend."""
    net = _tied()
    assert not foldable(net)
    for backend in ("loop", "auto", "vmap"):
        with pytest.raises(PBInputError, match="reused layer"):
            MaskedModule(net, backend=backend)


def test_backend_choice_and_bad_backend():
    net = build_model("resnet20", seed=0)
    layout = MaskedModule(net, net.masked_names())
    assert (layout.backend_for("cpu"), layout.backend_for("cuda")) == ("loop", "folded")
    assert MaskedModule(net, backend="folded").backend_for("cpu") == "folded"
    assert MaskedModule(net, backend="vmap").backend_for("cuda") == "vmap"
    lenet = build_model("lenet", seed=0)
    # no convolution: the k-mask batched products of the folded backend also win on a CPU
    assert MaskedModule(lenet, lenet.masked_names()).backend_for("cpu") == "folded"
    with pytest.raises(PBInputError, match="unknown backend 'grouped'"):
        MaskedModule(net, backend="grouped")


def test_named_backend_or_amp_bypasses_the_mlp_fast_path():
    """An MLP the fast path takes under "auto" runs the named backend instead (same values)."""
    from pbscale.regression.problem import mlp

    torch.manual_seed(0)
    net = mlp((3, 5, 4, 1)).double()
    x = torch.rand(6, 3, dtype=torch.float64)
    auto = MaskedModule(net)
    assert auto._plan is not None
    z = (torch.rand(4, auto.d, generator=torch.Generator().manual_seed(1)) < 0.7).double()
    ref = auto.forward(z, x)
    for backend in ("folded", "loop", "vmap"):
        layout = MaskedModule(net, backend=backend)
        assert layout._plan is None
        torch.testing.assert_close(layout.forward(z, x), ref)
    assert MaskedModule(net, amp=torch.bfloat16)._plan is None


class CumulativeBN(nn.Module):
    """Conv, BN with momentum=None (cumulative average), a BN on the shared input first."""

    channelwise_forward = True

    def __init__(self) -> None:
        super().__init__()
        self.bn0 = nn.BatchNorm2d(2)
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4, momentum=None)
        self.fc = nn.Linear(4 * 5 * 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(self.bn0(x)))).flatten(1))


def _per_mask_copies(net: nn.Module, masks: dict, x: torch.Tensor) -> torch.Tensor:
    """The reference: one copy of the network per mask, its weights masked in place, a plain
    forward each; then ``net``'s running statistics := the mean of the copies' (one more batch
    tracked). Returns the outputs (k, B, ...)."""
    k = next(iter(masks.values())).shape[0]
    copies = [copy.deepcopy(net) for _ in range(k)]
    outs = []
    for j, c in enumerate(copies):
        with torch.no_grad():
            params = dict(c.named_parameters())
            for n, m in masks.items():
                params[n].mul_(m[j])
        outs.append(c(x))
    with torch.no_grad():
        for name, b in net.named_buffers():
            vals = torch.stack([dict(c.named_buffers())[name] for c in copies])
            b.copy_(vals.double().mean(0).to(b.dtype) if b.is_floating_point() else vals[0])
    return torch.stack(outs)


def test_running_statistics_over_calls_and_groups_equal_per_mask_copies():
    """Three forward calls (momentum=None: the factor depends on num_batches_tracked, which
    vmap cannot run), k = 5 masks in groups of 2, 5 and 1: running statistics and outputs equal
    one network copy per mask with the copies' statistics averaged after each call."""
    torch.manual_seed(0)
    net = CumulativeBN().double().train()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 2, 5, 5, generator=gen, dtype=torch.float64)
    nets = {g: copy.deepcopy(net) for g in ("ref", 2, 5, 1)}
    for _ in range(3):
        z = (torch.rand(5, 4 * 2 * 9 + 3 * 100, generator=gen) < 0.7).double()
        ref = _per_mask_copies(nets["ref"], MaskedModule(nets["ref"]).split(z), x)
        for g in (2, 5, 1):
            out = MaskedModule(nets[g]).forward_folded(z, x, per_call=g)
            torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for g in (2, 5, 1):
        for (name, a), b in zip(nets[g].named_buffers(), nets["ref"].buffers()):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)
    assert int(nets[1].bn.num_batches_tracked) == 3
    assert not torch.equal(nets[1].bn.running_mean, net.bn.running_mean)
    with pytest.raises(PBInputError, match="per_call must be"):
        forward_masked(net, MaskedModule(net).split(z), x, per_call=0)


@pytest.mark.parametrize("backend", ["folded", "loop"])
def test_bf16_autocast_and_channels_last_close_to_float32(backend):
    """bf16 autocast (CPU) and channels-last through MaskedModule: within bf16 precision of the
    float32 outputs, on ResNet-20; channels-last alone in float32 agrees to float rounding."""
    gen = torch.Generator().manual_seed(5)
    net = build_model("resnet20", seed=0)
    randomize_bn(net, gen)
    net.eval()  # eval mode: the outputs do not depend on the batch, a stricter comparison
    names = net.masked_names()
    x = torch.randn(4, 3, 32, 32, generator=gen)
    ref_layout = MaskedModule(net, names, backend=backend)
    z = (torch.rand(3, ref_layout.d, generator=gen) < 0.6).float()
    with torch.no_grad():
        ref = ref_layout.forward(z, x)
        cl = MaskedModule(net, names, backend=backend, channels_last=True).forward(z, x)
        low = MaskedModule(net, names, backend=backend, amp=torch.bfloat16,
                           channels_last=True).forward(z, x)
    torch.testing.assert_close(cl, ref, rtol=1e-4, atol=1e-4)
    assert low.shape == ref.shape
    scale = ref.abs().max()
    err = (low.float() - ref).abs().max()
    assert err < 0.05 * scale  # an 8-bit mantissa through 20 layers: a few percent
    assert err > 0  # it did run in bf16
