"""The GPU routes of the masked forward (`pbscale/forward/routes.py`,
`pbscale/forward/route_ops.py`, `pbscale/forward/graphs.py`) against the reference path on the CPU,
where they are applied explicitly: outputs, gradients to soft masks and to the weights, and
BatchNorm running statistics, in float64 (tolerances of float rounding: rtol 1e-9) and float32
channels-last (rtol 1e-5); the models' plain forward through ``bn_act`` bit for bit the old one; the
CUDA-graph route's static-buffer data flow; and the copula sampler's fewer-kernel stick-breaking bit
for bit the earlier form on every CPU path and on its GPU branch (one cumprod) run on CPU
tensors."""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch
from _masked_reference import randomize_bn
from _reference import earlier_stick_draw
from torch import nn
from torch.nn import functional as F

from pbexact.errors import PBInputError
from pbscale.forward import route_ops, routes
from pbscale.forward.backends import BackendChoice, Folded, Graphed, MlpInplace
from pbscale.forward.folded import forward_masked
from pbscale.forward.masks import MaskedModule
from pbscale.forward.routes import ALL, NONE, ROUTES, Routes
from pbscale.methods import CopulaSampler, samplers, uniform_bits24
from pbscale.nets.models import INPUT_SHAPES, build_model

FOLDED_ROUTES = {"shortcut_einsum": Routes(shortcut_einsum=True),
                 "fused_bn": Routes(fused_bn=True),
                 "channels_last": Routes(channels_last=True),
                 "all three": Routes(channels_last=True, shortcut_einsum=True, fused_bn=True)}




def _resnet(dtype: torch.dtype) -> tuple[nn.Module, list[str], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    net = build_model("resnet20", seed=0).to(dtype)
    randomize_bn(net, gen)
    names = net.masked_names(mask_shortcuts=True)
    d = sum(dict(net.named_parameters())[n].numel() for n in names)
    z = (0.2 + 0.8 * torch.rand((2, d), generator=gen)).to(dtype)  # soft masks
    x = torch.randn((3, *INPUT_SHAPES["cifar10"]), generator=gen).to(dtype)
    return net, names, z, x


def _run(net: nn.Module, names: list[str], z: torch.Tensor, x: torch.Tensor, r: Routes,
         train: bool) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Folded backend with routes r: outputs, gradients (soft masks, then every parameter) and
    the buffers after the call (joint layout: the weights get gradients too)."""
    net = copy.deepcopy(net).train(train)
    layout = MaskedModule(net, names, train_weights=True)
    if r.channels_last:
        net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    zz = z.clone().requires_grad_(True)
    out = Folded(layout, routes=r)(zz, x)
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    grads = torch.autograd.grad((out.tanh() * w).sum(), [zz, *net.parameters()])
    return out.detach(), list(grads), [b.clone() for b in net.buffers()]


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("route", sorted(FOLDED_ROUTES))
def test_folded_routes_equal_the_reference_path(route: str, train: bool):
    """ResNet-20 (1x1 projection shortcuts masked too, 270,256 weights), soft masks: each route
    of the folded forward gives the reference's outputs, gradients and running statistics:
    float64 to rtol 1e-9 (float rounding); with channels-last, float32 to rtol 1e-5 / atol
    1e-5 (gradients rtol 1e-3: float32 sums over the batch)."""
    r = FOLDED_ROUTES[route]
    cases = ((torch.float32, 1e-5, 1e-5),) if r.channels_last else ((torch.float64, 1e-9, 1e-10),)
    for dtype, rtol, atol in cases:
        net, names, z, x = _resnet(dtype)
        ref_out, ref_grads, ref_buf = _run(net, names, z, x, NONE, train)
        out, grads, buf = _run(net, names, z, x, r, train)
        torch.testing.assert_close(out, ref_out, rtol=rtol, atol=atol)
        assert not torch.allclose(out[0], out[1])
        for a, b in zip(grads, ref_grads):
            assert b.abs().max() > 0
            torch.testing.assert_close(a, b, rtol=100 * rtol, atol=atol)
        for a, b in zip(buf, ref_buf):
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
        changed = any(not torch.equal(a, b) for a, b in zip(ref_buf, net.buffers()))
        assert changed == train


def test_channels_last_route_keeps_every_activation_and_kernel_channels_last(monkeypatch):
    """The network and its input in the default (NCHW) format: the route alone makes the
    folded call's activations and masked kernels channels-last."""
    net, names, z, x = _resnet(torch.float32)
    net.train()
    layout = MaskedModule(net, names)
    seen: list[tuple[str, bool]] = []
    for name, m in net.named_modules():
        if isinstance(m, (nn.Conv2d, nn.BatchNorm2d)):
            m.register_forward_hook(lambda m, i, o, name=name: seen.append(
                (name, o.is_contiguous(memory_format=torch.channels_last))))
    kernels: list[bool] = []
    conv2d = F.conv2d

    def spy(x, w, *args):
        if w.shape[-1] > 1:  # a 1x1 kernel is both contiguous and channels-last
            kernels.append(w.is_contiguous(memory_format=torch.channels_last))
        return conv2d(x, w, *args)

    import pbscale.forward.folded as batched
    monkeypatch.setitem(batched._CONV_FN, 2, spy)
    with torch.no_grad():
        Folded(layout, routes=Routes(channels_last=True))(z, x)
    assert len(seen) == 2 * 21 and all(cl for _, cl in seen), seen  # 21 convs, 21 BNs
    assert len(kernels) == 19 and all(kernels)  # the 3x3 ones
    seen.clear()
    kernels.clear()
    with torch.no_grad():  # and the reference keeps NCHW kernels (the route is what changed)
        Folded(layout)(z, x)
    assert not any(kernels) and not any(cl for _, cl in seen)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("stride", [1, 2])
def test_conv1x1_folded_equals_the_grouped_convolution(stride: int, channels_last: bool):
    gen = torch.Generator().manual_seed(0)
    k, cin, cout = 3, 4, 5
    x = torch.randn(2, k * cin, 7, 6, generator=gen, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(k * cout, cin, 1, 1, generator=gen, dtype=torch.float64)
    b = torch.randn(k * cout, generator=gen, dtype=torch.float64)
    for bias in (None, b):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        ref = F.conv2d(xr, wr, bias, (stride, stride), 0, 1, k)
        xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
        got = route_ops.conv1x1_folded(xe, we, bias, (stride, stride), k)
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
        assert got.is_contiguous(memory_format=torch.channels_last) == channels_last
        g = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
        torch.testing.assert_close(torch.autograd.grad(got, [xe, we], g),
                                   torch.autograd.grad(ref, [xr, wr], g), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_act_equals_batch_norm_add_relu(train: bool):
    gen = torch.Generator().manual_seed(1)
    C = 6
    x = torch.randn(4, C, 5, 5, generator=gen, dtype=torch.float64) * 3 + 1
    res = torch.randn(4, C, 5, 5, generator=gen, dtype=torch.float64)
    w, b = torch.rand(C, generator=gen, dtype=torch.float64) + 0.5, torch.randn(
        C, generator=gen, dtype=torch.float64)
    stats = torch.rand(C, generator=gen, dtype=torch.float64), torch.rand(
        C, generator=gen, dtype=torch.float64) + 0.5
    for residual, relu in ((None, True), (res, True), (res, False), (None, False)):
        rm_a, rv_a = (s.clone() for s in stats)
        rm_b, rv_b = (s.clone() for s in stats)
        xa, wa, ba = (t.clone().requires_grad_() for t in (x, w, b))
        xb, wb, bb = (t.clone().requires_grad_() for t in (x, w, b))
        ref = F.batch_norm(xa, rm_a, rv_a, wa, ba, train, 0.1, 1e-5)
        ref = ref if residual is None else ref + residual
        ref = torch.relu(ref) if relu else ref
        got = route_ops.batch_norm_act(xb, rm_b, rv_b, wb, bb, train, 0.1, 1e-5, residual, relu)
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close((rm_b, rv_b), (rm_a, rv_a), rtol=1e-14, atol=1e-14)
        g = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
        torch.testing.assert_close(torch.autograd.grad(got, [xb, wb, bb], g),
                                   torch.autograd.grad(ref, [xa, wa, ba], g), rtol=1e-10,
                                   atol=1e-12)
    # bf16 input: statistics in float32, one rounding at the end (the reference rounds twice)
    xh = x.to(torch.bfloat16)
    ref = torch.relu(F.batch_norm(xh, None, None, w.bfloat16(), b.bfloat16(), True, 0.1, 1e-5))
    got = route_ops.batch_norm_act(xh, None, None, w.float(), b.float(), True, 0.1, 1e-5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref.float(), rtol=0.02, atol=0.02)


def test_bn_act_outside_a_fused_call_is_the_old_forward_bit_for_bit():
    """ResNet-20's plain forward through bn_act equals the forward it replaced (relu(bn(conv))
    and relu(bn(conv) + shortcut)), bit for bit, in training and eval mode."""
    from pbscale.nets.models import BasicBlock

    def old_block(m: BasicBlock, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(m.bn1(m.conv1(x)))
        h = m.bn2(m.conv2(h))
        return torch.relu(h + m.shortcut(x))

    def old_forward(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(net.bn(net.conv(x)))
        for blk in net.blocks:
            h = old_block(blk, h)
        return net.fc(h.mean(dim=(2, 3)))

    net, _, _, x = _resnet(torch.float32)
    for train in (True, False):
        a, b = copy.deepcopy(net).train(train), copy.deepcopy(net).train(train)
        assert torch.equal(a(x), old_forward(b, x))
        assert all(torch.equal(p, q) for p, q in zip(a.buffers(), b.buffers()))
    assert not any(hasattr(m, route_ops.FUSED_ATTR) for m in net.modules())


def test_the_fused_attribute_is_removed_after_the_call_even_on_error():
    net, names, z, x = _resnet(torch.float32)
    masks = MaskedModule(net, names).split(z)
    forward_masked(net, masks, x, routes=Routes(fused_bn=True))
    assert not any(hasattr(m, route_ops.FUSED_ATTR) for m in net.modules())
    with pytest.raises(PBInputError):
        forward_masked(net, masks, x[:, :2], routes=Routes(fused_bn=True))  # 2 channels
    assert not any(hasattr(m, route_ops.FUSED_ATTR) for m in net.modules())


def test_routes_parse_and_the_process_default(monkeypatch: pytest.MonkeyPatch):
    assert routes.parse("off") == routes.parse("") == NONE and routes.parse("all") == ALL
    assert routes.parse("fused_bn, cuda_graph").on == ("fused_bn", "cuda_graph")
    assert str(ALL) == ",".join(ROUTES) and str(NONE) == "off"
    with pytest.raises(PBInputError, match="unknown route 'fused'; choose off, all or from"):
        routes.parse("fused")
    monkeypatch.delenv(routes.ENV, raising=False)
    assert routes.default() == NONE
    monkeypatch.setenv(routes.ENV, "shortcut_einsum")
    assert routes.default() == Routes(shortcut_einsum=True)
    with routes.use("all"):
        assert routes.default() == ALL
        with routes.use("off"):
            assert routes.default() == NONE
        assert routes.default() == ALL
    assert routes.default() == Routes(shortcut_einsum=True)
    monkeypatch.setenv(routes.ENV, "bogus")
    with pytest.raises(PBInputError, match="PBNN_ROUTES: unknown route 'bogus'"):
        routes.default()


def test_effective_routes_follow_device_network_and_setting(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(route_ops, "compile_available", lambda: True)
    resnet = build_model("resnet20", 0)
    names = resnet.masked_names()
    fp32 = MaskedModule(resnet, names, routes="all").choice
    assert fp32.effective_routes("cpu") == NONE  # GPU routes only
    assert fp32.effective_routes("cuda") == Routes(
        shortcut_einsum=True, fused_bn=True, cudnn_benchmark=True, cuda_graph=True)
    bf16 = MaskedModule(resnet, names, amp=torch.bfloat16, routes="all").choice
    assert bf16.effective_routes("cuda") == ALL  # channels-last under autocast only
    joint = MaskedModule(resnet, names, train_weights=True, routes="all").choice
    assert not joint.effective_routes("cuda").cuda_graph  # weights change: no graph
    conv6 = MaskedModule(build_model("conv6", 0), routes="all").choice
    assert conv6.effective_routes("cuda") == Routes(cudnn_benchmark=True, cuda_graph=True)
    lenet = MaskedModule(build_model("lenet", 0), routes="all").choice
    assert lenet.effective_routes("cuda") == Routes(cuda_graph=True)
    monkeypatch.setattr(route_ops, "compile_available", lambda: False)
    assert not fp32.effective_routes("cuda").fused_bn  # no Triton: the reference BatchNorm
    # the meta device stands for a GPU (op counts, the emulated sync check): the eager tail
    assert fp32.effective_routes("meta") == Routes(
        shortcut_einsum=True, fused_bn=True, cudnn_benchmark=True, cuda_graph=True)
    # no routes asked: the process default, read at each call
    default = MaskedModule(resnet, names).choice
    assert default.effective_routes("cuda") == NONE
    with routes.use("shortcut_einsum"):
        assert default.effective_routes("cuda") == Routes(shortcut_einsum=True)


def test_the_choice_wraps_in_graphs_on_cuda_only_where_eligible(monkeypatch):
    lenet = MaskedModule(build_model("lenet", 0), routes="cuda_graph")
    choice = lenet.choice
    z, x = torch.rand(3, lenet.d), torch.randn(4, 784)
    with torch.no_grad():
        assert type(choice.choose(z, x)) is MlpInplace  # on the CPU: no route
    monkeypatch.setattr(BackendChoice, "effective_routes",
                        lambda self, device: Routes(cuda_graph=True))
    with torch.no_grad():
        graphed = choice.choose(z, x)
        assert type(graphed) is Graphed and graphed is choice.choose(z, x)
    assert type(choice.choose(z.requires_grad_(), x)).__name__ == "MlpAutograd"
    resnet = build_model("resnet20", 0)
    layout = MaskedModule(resnet, resnet.masked_names(), backend="folded", routes="cuda_graph")
    zr, xr = torch.rand(2, layout.d), torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert type(layout.choice.choose(zr, xr)) is Graphed
        resnet.bn.momentum = None  # a cumulative average reads the batch count on the host
        assert type(layout.choice.choose(zr, xr)) is Folded


@pytest.mark.parametrize("model", ["lenet", "resnet20"])
def test_graphed_static_buffers_equal_the_backend(model: str):
    """The CUDA-graph route's data flow (static buffers in, the wrapped backend's own instance
    on them, a copy out) run eagerly: outputs and running statistics equal the backend's over
    calls with new masks and inputs, one entry per shape, the latest two kept."""
    net = build_model(model, 0).train()
    names = net.masked_names()
    a, b = copy.deepcopy(net), copy.deepcopy(net)
    la, lb = MaskedModule(a, names, backend="folded"), MaskedModule(b, names, backend="folded")
    if model == "lenet":
        la, lb = MaskedModule(a, names), MaskedModule(b, names)
    gen = torch.Generator().manual_seed(0)
    shape = INPUT_SHAPES[net.dataset]
    with torch.no_grad():
        ref_backend = lb.choice.choose(torch.rand(2, lb.d), torch.randn(3, *shape))
        graphed = la.choice.graphed_for(la.choice.choose(torch.rand(2, la.d),
                                                         torch.randn(3, *shape)), capture=False)
        for k in (2, 2, 3, 2):
            z = (torch.rand(k, la.d, generator=gen) < 0.6).float()
            x = torch.randn(3, *shape, generator=gen)
            out = graphed(z, x)
            assert torch.equal(out, ref_backend(z, x))
            assert all(torch.equal(p, q) for p, q in zip(a.buffers(), b.buffers()))
    assert len(graphed.calls) == 2  # k = 2 and k = 3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_copula_stick_breaking_is_bit_for_bit_the_earlier_form(dtype, monkeypatch):
    """CPU float64 and CPU float32 with stick-breaking forced: the same bits as before, chunk
    by chunk (the exponents cached with inf for the last draw, the running product from the
    row above the chunk)."""
    monkeypatch.setattr(samplers, "_ALL_DRAWS_ELEMENTS", 0)
    n, d = 9, 501
    theta = torch.rand(d, generator=torch.Generator().manual_seed(0), dtype=dtype)
    theta[:3] = torch.tensor([0.0, 1.0, 0.5], dtype=dtype)
    if dtype == torch.float32:
        def uniforms(shape, gen):
            return uniform_bits24(shape, gen).mul_(2.0**-24)
    else:
        def uniforms(shape, gen):
            return torch.rand(shape, generator=gen, dtype=dtype)
    for sizes in ([9], [2, 3, 4], [1] * 9):
        s = CopulaSampler(theta, n, torch.Generator().manual_seed(3))
        assert not s._ints
        new = torch.cat([s.next(k) for k in sizes])
        old = earlier_stick_draw(theta, n, torch.Generator().manual_seed(3), sizes, True, uniforms)
        assert torch.equal(new, old), sizes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_break_sticks_gpu_branch_on_cpu_tensors_equals_the_row_loop_and_the_earlier_form(dtype):
    """The GPU branch (one cumprod along the rows) run on CPU tensors: the same sign D and last
    Q as the CPU row loop and as the earlier form (its cumprod after a first-row product), bit
    for bit in float64; in float32 to rounding, as the CPU's cumprod accumulates float32 in
    float64 (CUDA's in float32, where tests/test_gpu_routes.py checks the bits)."""
    gen = torch.Generator().manual_seed(4)
    k, d, n = 7, 300, 7
    L = torch.rand(k, d, generator=gen, dtype=dtype).log_() / torch.arange(
        n - 1, n - k - 1, -1, dtype=dtype).clamp_min(1)[:, None]
    L[-1] = -math.inf
    prev = torch.where(torch.rand(d, generator=gen) < 0.5, 1.0, -1.0).to(dtype)
    prev = prev * torch.rand(d, generator=gen, dtype=dtype)
    a, b = L.clone(), L.clone()
    qa = samplers.break_sticks(a, prev, row_loop=False)
    qb = samplers.break_sticks(b, prev, row_loop=True)
    q = torch.exp(L)
    q[0].mul_(prev)
    loop = q.clone()
    for i in range(1, k):
        loop[i].mul_(loop[i - 1])
    q.cumprod_(0)
    ref = torch.cat([(prev - q[0])[None], q[:-1] - q[1:]])
    ref_loop = torch.cat([(prev - loop[0])[None], loop[:-1] - loop[1:]])
    assert torch.equal(b, ref_loop) and torch.equal(qb, loop[-1])  # the CPU path: exact
    if dtype == torch.float64:
        assert torch.equal(a, b) and torch.equal(a, ref) and torch.equal(qa, qb)
    else:
        torch.testing.assert_close(a, ref, rtol=1e-6, atol=1e-7)
        assert not torch.equal(a, b)  # not vacuous: the CPU cumprod does differ in float32
    assert (qa == 0).all() and (qb == 0).all()  # the last draw took the whole stick


def _lenet_step(seed: int = 0):
    """A small MLP classifier (the LeNet path: nn.Sequential of Linear and ReLU), supermask,
    and an ARMS n = 6 trainer."""
    from pbscale.methods import MaskTrainer, MethodConfig

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 10))
    layout = MaskedModule(net)
    tr = MaskTrainer(MethodConfig(method="arms", n=6, chunk=6, seed=seed), layout.d, 10, "cpu")
    return layout, tr


def _batches(k: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(9)
    return [(torch.randn(5, 20, generator=gen), torch.randint(0, 10, (5,), generator=gen))
            for _ in range(k)]


def test_captured_step_static_flow_equals_the_plain_step():
    """The captured step's data flow run eagerly (the CPU): batch copied into static buffers,
    the loss built once on them, the trainer's own step; the logits after three steps equal a
    twin trainer's plain steps bit for bit, and each call returns the step's read-back (the sum
    of the n sampled losses: the plain step's loss times n)."""
    from pbscale.execution.captured import CapturedStep
    from pbscale.forward.folded import cross_entropy_per_mask

    layout, tr = _lenet_step()
    twin_layout, twin = _lenet_step()
    step = CapturedStep(tr, layout, *_batches(1)[0])
    assert not step.capture  # no capture off CUDA
    for x, y in _batches():
        got = step(x, y)
        loss = twin.step(twin_layout.loss_fn(x, y, cross_entropy_per_mask))
        assert got.dtype == torch.float64 and got.dim() == 0
        assert float(got) / 6 == loss
        assert torch.equal(tr.r, twin.r)
    assert tr.step_count == twin.step_count == 3
    with pytest.raises(PBInputError, match="supermask"):
        CapturedStep(tr, MaskedModule(layout.module, train_weights=True), *_batches(1)[0])


def test_captured_step_captures_at_the_second_call_and_again_after_a_change(monkeypatch):
    """The capture schedule, with the capture emulated by a stand-in graph that replays the
    eager step: eager at the first call, captured at the second and replayed after (the step
    counter advanced on the host), eager again once the learning rate changes, then a new
    graph."""
    from pbscale.execution.captured import CapturedStep

    layout, tr = _lenet_step()
    step = CapturedStep(tr, layout, *_batches(1)[0])
    step.capture = True
    events: list[str] = []

    orig = step._eager

    class FakeGraph:
        def replay(self) -> None:
            events.append("replay")
            count = tr.step_count
            step.readback = orig()
            tr.step_count = count  # a replay runs kernels only; __call__ counts the step

    def fake_capture() -> bool:
        events.append("capture")
        step.graph = FakeGraph()
        return True

    monkeypatch.setattr(step, "_capture", fake_capture)

    def eager() -> torch.Tensor:
        events.append("eager")
        return orig()

    monkeypatch.setattr(step, "_eager", eager)
    batches = _batches(6)
    for i, (x, y) in enumerate(batches):
        if i == 3:
            for g in tr.opt.param_groups:
                g["lr"] *= 0.5
        step(x, y)
    assert events == ["eager", "capture", "replay", "replay",  # calls 1, 2, 3
                      "eager", "capture", "replay", "replay"]  # the rate changed: 4, 5, 6
    assert tr.step_count == 6


def test_read_backs_are_recorded_and_stood_in():
    from pbscale.execution.captured import ReadBacks

    t = torch.tensor(2.5)
    with ReadBacks(torch.device("cpu"), stand_in=True) as mode:
        assert float(t * 2) == 0.0 and (t > 0).item() is False
    assert [float(v) for v in mode.tensors] == [5.0, 1.0]
    with ReadBacks(torch.device("cpu"), stand_in=False) as mode:
        assert float(t * 2) == 5.0
    assert len(mode.tensors) == 1


@pytest.mark.skipif(os.environ.get("PBNN_SLOW_TESTS") != "1",
                    reason="torch.compile on the CPU (inductor, C++): about 2 min; "
                    "PBNN_SLOW_TESTS=1")
def test_the_fused_tail_compiles_whole_and_equals_the_eager_tail():
    """The function the fused route compiles on a GPU compiles as one graph (fullgraph: no
    break) and gives the eager tail's values, running statistics and gradients (float32,
    rtol 1e-5), with and without a residual, in training and eval mode; here by inductor's CPU
    backend."""
    fn = torch.compile(route_ops.batch_norm_act, dynamic=True, fullgraph=True)
    gen = torch.Generator().manual_seed(0)
    for shape in ((4, 6, 5, 5), (4, 12, 3, 3)):
        x = torch.randn(shape, generator=gen, requires_grad=True)
        res = torch.randn(shape, generator=gen)
        w = (torch.rand(shape[1], generator=gen) + 0.5).requires_grad_()
        b = torch.randn(shape[1], generator=gen)
        for residual in (None, res):
            for train in (True, False):
                s1 = [torch.zeros(shape[1]), torch.ones(shape[1])]
                s2 = [t.clone() for t in s1]
                got = fn(x, *s1, w, b, train, 0.1, 1e-5, residual, True)
                ref = route_ops.batch_norm_act(x, *s2, w, b, train, 0.1, 1e-5, residual, True)
                torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(torch.autograd.grad(got.sum(), [x, w]),
                                           torch.autograd.grad(ref.sum(), [x, w]),
                                           rtol=1e-5, atol=1e-5)
