"""pbscale.forward.folded: k masked copies of a conv net as one network equal the per-mask loop
(functional_call per mask), forward and gradients (to masks and to weights), BatchNorm in
training and eval mode, residual blocks, unmasked layers; the batched loss feeds mc_gradient."""

from __future__ import annotations

import pytest
import torch
from _masked_reference import forward_masked_loop, masked_loss
from _zoo import BasicBlock
from torch import nn
from torch.nn import functional as F

from pbexact.errors import PBInputError
from pbexact.parametrizations import get_parametrization
from pbscale.forward.folded import cross_entropy_per_mask, forward_masked
from pbscale.forward.masks import MaskedModule
from pbscale.forward.rescale import rescaled_weight
from pbscale.methods import FixedSampler, mc_gradient
from pbscale.nets.models import INPUT_SHAPES, MODELS, build_model


class TinyResNet(nn.Module):
    """ResNet-20's structure (stem, three stages, pooling, linear head) with `blocks` blocks per
    stage and widths w, 2w, 4w."""

    def __init__(self, w: int = 4, blocks: int = 1, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, w, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(w)
        layers, cin = [], w
        for i, cout in enumerate((w, 2 * w, 4 * w)):
            for j in range(blocks):
                layers.append(BasicBlock(cin, cout, 2 if (i and not j) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers(F.relu(self.bn(self.stem(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def conv_net() -> nn.Module:
    """Conv6-like: conv, conv, pool, grouped conv with bias, pool, flatten, linear, linear."""
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 8, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.BatchNorm2d(8), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 2 * 2, 12), nn.BatchNorm1d(12), nn.ReLU(),
        nn.Linear(12, 5))


def lenet() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(20, 12), nn.ReLU(), nn.Linear(12, 7), nn.ReLU(),
                         nn.Linear(7, 3))


def weight_masks(net: nn.Module, k: int, soft: bool, gen: torch.Generator,
                 names=None) -> dict[str, torch.Tensor]:
    if names is None:
        names = [n for n, p in net.named_parameters() if n.endswith("weight") and p.dim() >= 2]
    params = dict(net.named_parameters())
    out = {}
    for n in names:
        shape = (k, *params[n].shape)
        u = torch.rand(shape, generator=gen, dtype=params[n].dtype)
        out[n] = u if soft else (u < 0.6).to(u.dtype)
    return out


CASES = {
    "conv_net": (conv_net, (6, 3, 8, 8)),
    "tiny_resnet": (lambda: TinyResNet(4, 1), (5, 3, 8, 8)),
    "lenet": (lenet, (6, 4, 5)),
}


def _setup(case: str, k: int, train: bool, seed: int = 0):
    make, xshape = CASES[case]
    torch.manual_seed(seed)
    net = make().double()
    for m in net.modules():  # non-trivial running statistics and affine BN parameters
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    net.train(train)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(xshape, generator=gen, dtype=torch.float64)
    return net, x, gen


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("k", [1, 3])
def test_forward_equals_loop(case, train, k):
    net, x, gen = _setup(case, k, train)
    masks = weight_masks(net, k, soft=False, gen=gen)
    before = {n: b.clone() for n, b in net.named_buffers()}
    fast = forward_masked(net, masks, x)
    ref = forward_masked_loop(net, masks, x)
    assert fast.shape == ref.shape == (k, x.shape[0], ref.shape[-1])
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-10)
    for n, b in net.named_buffers():  # running statistics untouched
        assert torch.equal(b, before[n]), n
    # the network itself is restored: a plain call is the plain forward again
    assert type(net).forward is not None and "forward" not in vars(net)
    for m in net.modules():
        assert "forward" not in vars(m)
    # and differs between masks (a real test of per-mask weights)
    if k > 1:
        assert not torch.allclose(fast[0], fast[1])


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("train", [True, False])
def test_gradients_equal_loop(case, train):
    """Soft masks and weights both require grad (CP through soft masks, joint training)."""
    k = 3
    net, x, gen = _setup(case, k, train, seed=3)
    masks = {n: m.requires_grad_(True) for n, m in weight_masks(net, k, True, gen).items()}
    params = [p for p in net.parameters()]
    grads = {}
    for name, fn in (("fast", forward_masked), ("loop", forward_masked_loop)):
        out = fn(net, masks, x)
        w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
        loss = (out.tanh() * w).sum()
        grads[name] = torch.autograd.grad(loss, list(masks.values()) + params)
    assert len(grads["fast"]) == len(masks) + len(params)
    for a, b in zip(grads["fast"], grads["loop"]):
        assert a.abs().max() > 0 or b.abs().max() == 0
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_unmasked_layers_and_biases():
    """Masks on some weights and on a bias only; unmasked layers (the stem here) share work."""
    net, x, gen = _setup("tiny_resnet", 2, True, seed=5)
    names = ["layers.1.conv1.weight", "layers.2.short.0.weight", "fc.weight", "fc.bias"]
    params = dict(net.named_parameters())
    masks = {n: (torch.rand((2, *params[n].shape), generator=gen, dtype=torch.float64) < 0.5)
             .double() for n in names}
    torch.testing.assert_close(forward_masked(net, masks, x), forward_masked_loop(net, masks, x),
                               rtol=1e-10, atol=1e-10)
    # a mask on an unmasked-before-then-masked BatchNorm weight
    masks = {"bn.weight": torch.rand((2, 4), generator=gen, dtype=torch.float64)}
    torch.testing.assert_close(forward_masked(net, masks, x), forward_masked_loop(net, masks, x),
                               rtol=1e-10, atol=1e-10)


def test_all_ones_masks_equal_plain_forward():
    net, x, gen = _setup("tiny_resnet", 4, False, seed=7)
    masks = {n: torch.ones((4, *p.shape), dtype=p.dtype) for n, p in net.named_parameters()
             if p.dim() >= 2}
    out = forward_masked(net, masks, x, channels_last=True)
    for i in range(4):
        torch.testing.assert_close(out[i], net(x), rtol=1e-10, atol=1e-10)


def test_bf16_autocast_close_to_float():
    net, x, gen = _setup("tiny_resnet", 3, True, seed=9)
    net, x = net.float(), x.float()
    masks = {n: m.float() for n, m in weight_masks(net, 3, False, gen).items()}
    ref = forward_masked(net, masks, x)
    low = forward_masked(net, masks, x, amp=torch.bfloat16, channels_last=True)
    assert low.shape == ref.shape
    # bf16 has an 8-bit mantissa: agreement to a few percent of the output scale
    assert (low.float() - ref).abs().max() < 0.05 * ref.abs().max() + 0.05


def test_masked_loss_feeds_mc_gradient():
    """f(z) of masked_loss equals the loop's per-mask cross-entropy, and mc_gradient on replayed
    samples gives the same ARMS gradient with the fast f and the loop f."""
    net, x, gen = _setup("conv_net", 4, True, seed=11)
    y = torch.randint(0, 5, (x.shape[0],), generator=gen)
    layout = MaskedModule(net)
    f = masked_loss(net, x, y)
    z = (torch.rand((8, layout.d), generator=gen, dtype=torch.float64) < 0.5).double()

    def f_loop(zz: torch.Tensor) -> torch.Tensor:
        return cross_entropy_per_mask(forward_masked_loop(net, layout.split(zz), x), y)

    torch.testing.assert_close(f(z), f_loop(z), rtol=1e-10, atol=1e-10)
    param = get_parametrization("escort")
    r = param.logits(torch.full((layout.d,), 0.5, dtype=torch.float64))
    g_fast = mc_gradient(f, r, param, "arms", 8, chunk=3, sampler=FixedSampler(z)).grad
    g_loop = mc_gradient(f_loop, r, param, "arms", 8, chunk=8, sampler=FixedSampler(z)).grad
    assert g_fast.abs().max() > 0
    torch.testing.assert_close(g_fast, g_loop, rtol=1e-9, atol=1e-12)


def test_bad_input():
    net, x, gen = _setup("conv_net", 2, True)
    with pytest.raises(PBInputError, match="no such parameter"):
        forward_masked(net, {"nope.weight": torch.ones(2, 3)}, x)
    with pytest.raises(PBInputError, match="must have shape"):
        forward_masked(net, {"0.weight": torch.ones(2, 6, 3, 3)}, x)
    with pytest.raises(PBInputError, match="same k"):
        forward_masked(net, {"0.weight": torch.ones(2, 6, 3, 3, 3),
                             "13.weight": torch.ones(3, 5, 12)}, x)
    with pytest.raises(PBInputError, match="at least one mask"):
        forward_masked(net, {}, x)
    ln = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    with pytest.raises(PBInputError, match="cannot batch layer"):
        forward_masked(ln, {"0.weight": torch.ones(2, 4, 4)}, torch.ones(3, 4))
    assert all("forward" not in vars(m) for m in ln.modules())  # restored after the error


@pytest.mark.parametrize("name", list(MODELS))
def test_repository_models_equal_loop(name):
    """Every model of the pruning registry, its masked tensors (plus the head and shortcuts;
    VGG-19: four of them), tiny batch, float64: forward in training and eval mode; gradients
    for ResNet-20 and LeNet."""
    net = build_model(name, seed=0).double()
    gen = torch.Generator().manual_seed(1)
    shape = INPUT_SHAPES[net.dataset]
    x = torch.randn((2, *shape), generator=gen, dtype=torch.float64)
    names = net.masked_names(mask_head=True, mask_shortcuts=True)
    if name == "vgg19":  # 20M masked weights: the first two and last two tensors keep it quick
        names = names[:2] + names[-2:]
    for train in (True, False):
        net.train(train)
        soft = train and name in ("resnet20", "lenet")
        masks = weight_masks(net, 2, soft=soft, gen=gen, names=names)
        if soft:
            masks = {n: m.requires_grad_(True) for n, m in masks.items()}
        fast = forward_masked(net, masks, x)
        ref = forward_masked_loop(net, masks, x)
        torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-9)
        assert not torch.allclose(fast[0], fast[1])
        if soft:
            params = list(net.parameters())
            w = torch.randn(fast.shape, generator=gen, dtype=fast.dtype)
            ga = torch.autograd.grad((fast * w).sum(), list(masks.values()) + params)
            gb = torch.autograd.grad((ref * w).sum(), list(masks.values()) + params)
            for a, b in zip(ga, gb):
                torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_weight_hook_dynamic_rescaling_equals_loop():
    """forward_masked with pbscale.forward.rescale.rescaled_weight (dynamic weight rescaling) equals
    the loop with the same hook, values and gradients to soft masks and weights."""
    net, x, gen = _setup("tiny_resnet", 3, True, seed=13)
    masks = {n: m.requires_grad_(True) for n, m in weight_masks(net, 3, True, gen).items()}
    fast = forward_masked(net, masks, x, weight_hook=rescaled_weight)
    ref = forward_masked_loop(net, masks, x, weight_hook=rescaled_weight)
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-10)
    plain = forward_masked(net, masks, x)
    assert not torch.allclose(fast, plain)  # the hook changes the function
    params = list(net.parameters())
    ga = torch.autograd.grad(fast.sin().sum(), list(masks.values()) + params)
    gb = torch.autograd.grad(ref.sin().sum(), list(masks.values()) + params)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
