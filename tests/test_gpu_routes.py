"""The GPU routes on a CUDA device (skipped without one, as in CI): each route against the
reference path it replaces (values, gradients, BatchNorm running statistics; the fused tail
compiled by torch.compile where Triton is available), the forward and the whole MC step replayed
from CUDA graphs, the copula sampler's GPU branch bit for bit its earlier form and fewer
kernels, and no host synchronization beyond the known read-back (none at all for a replayed
step). `benchmarks/gpu_session.sh` runs this file first whenever a session is lent a GPU.

Tolerances: fp32 with TF32 convolutions (cuDNN's default) rtol 5e-3 / atol 5e-3 against the
reference on the same device; bf16 autocast 5e-2; a replay against the eager call it captured
1e-6 (the same kernels)."""

from __future__ import annotations

import copy

import pytest
import torch
from _reference import earlier_stick_draw
from torch import nn
from torch.profiler import ProfilerActivity, profile

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from benchmarks import check_gpu_sync as cgs  # noqa: E402
from pbscale.execution.captured import CapturedStep  # noqa: E402
from pbscale.forward import route_ops  # noqa: E402
from pbscale.forward.backends import Folded, Graphed  # noqa: E402
from pbscale.forward.folded import cross_entropy_per_mask  # noqa: E402
from pbscale.forward.masks import MaskedModule  # noqa: E402
from pbscale.forward.routes import Routes  # noqa: E402
from pbscale.methods import CopulaSampler, MaskTrainer, MethodConfig  # noqa: E402
from pbscale.nets.models import build_model  # noqa: E402

DEV = torch.device("cuda")
FOLDED = {"shortcut_einsum": Routes(shortcut_einsum=True), "fused_bn": Routes(fused_bn=True),
          "channels_last": Routes(channels_last=True),
          "cudnn_benchmark": Routes(cudnn_benchmark=True),
          "all four": Routes(channels_last=True, shortcut_einsum=True, fused_bn=True,
                             cudnn_benchmark=True)}


def _resnet(amp: torch.dtype | None):
    gen = torch.Generator(device=DEV).manual_seed(0)
    net = build_model("resnet20", seed=0).to(DEV).train()
    layout = MaskedModule(net, net.masked_names(mask_shortcuts=True), train_weights=True,
                          amp=amp)
    z = 0.2 + 0.8 * torch.rand((4, layout.d), generator=gen, device=DEV)
    x = torch.randn((8, 3, 32, 32), generator=gen, device=DEV)
    return net, layout, z, x


@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("route", sorted(FOLDED))
def test_folded_route_equals_the_reference_on_the_gpu(route: str, amp):
    net, layout, z, x = _resnet(amp)
    start = [b.clone() for b in net.buffers()]
    tol = 5e-3 if amp is None else 5e-2
    results = []
    for r in (Routes(), FOLDED[route]):
        for b, s in zip(net.buffers(), start):
            b.copy_(s)
        zz = z.clone().requires_grad_(True)
        out = Folded(layout, routes=r)(zz, x)
        grads = torch.autograd.grad(out.float().tanh().sum(), [zz, *net.parameters()]) \
            if amp is None else ()
        results.append((out.detach().float(), grads, [b.clone() for b in net.buffers()]))
    (ref, ref_g, ref_b), (got, got_g, got_b) = results
    scale = ref.abs().max()
    assert float((got - ref).abs().max()) <= tol * float(scale), route
    for a, b in zip(got_g, ref_g):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * float(b.abs().max()))
    for a, b in zip(got_b, ref_b):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def test_the_fused_tail_compiles_and_equals_the_eager_tail():
    fn = route_ops.batch_norm_act_fn(DEV)
    assert (fn is not route_ops.batch_norm_act) == route_ops.compile_available()
    gen = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(8, 64, 8, 8, generator=gen, device=DEV)
    res = torch.randn(8, 64, 8, 8, generator=gen, device=DEV)
    w, b = torch.rand(64, device=DEV) + 0.5, torch.randn(64, device=DEV)
    stats = [torch.zeros(64, device=DEV), torch.ones(64, device=DEV)]
    twin = [s.clone() for s in stats]
    got = fn(x, *stats, w, b, True, 0.1, 1e-5, res, True)
    ref = route_ops.batch_norm_act(x, *twin, w, b, True, 0.1, 1e-5, res, True)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats, twin, rtol=1e-5, atol=1e-6)


def test_effective_routes_on_the_gpu():
    net = build_model("resnet20", 0).to(DEV)
    choice = MaskedModule(net, net.masked_names(), amp=torch.bfloat16, routes="all").choice
    taken = choice.effective_routes(DEV)
    assert taken.channels_last and taken.shortcut_einsum and taken.cudnn_benchmark
    assert taken.cuda_graph and taken.fused_bn == route_ops.compile_available()


@pytest.mark.parametrize("model", ["lenet", "resnet20"])
def test_graphed_forward_replays_the_backend(model: str):
    net = build_model(model, 0).to(DEV).train()
    a, b = copy.deepcopy(net), copy.deepcopy(net)
    backend = "auto" if model == "lenet" else "folded"
    la = MaskedModule(a, a.masked_names(), backend=backend, routes="cuda_graph")
    lb = MaskedModule(b, b.masked_names(), backend=backend)
    gen = torch.Generator(device=DEV).manual_seed(2)
    shape = (784,) if model == "lenet" else (3, 32, 32)
    with torch.no_grad():
        for _ in range(4):
            z = (torch.rand((6, la.d), generator=gen, device=DEV) < 0.5).float()
            x = torch.randn((16, *shape), generator=gen, device=DEV)
            backend_a = la.choice.choose(z, x)
            assert type(backend_a) is Graphed
            torch.testing.assert_close(la.forward(z, x), lb.forward(z, x), rtol=1e-6,
                                       atol=1e-6)
        assert all(c.graph is not None for c in backend_a.calls.values())  # captured
        for p, q in zip(a.buffers(), b.buffers()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
        # a replay makes no host sync
        assert cgs.gpu_check(lambda: la.forward(z, x)).describe() == "no sync"


@pytest.mark.parametrize("model", ["lenet", "resnet20"])
def test_captured_step_equals_the_eager_step_and_syncs_nothing(model: str):
    net = build_model(model, 0).to(DEV).train()
    a, b = copy.deepcopy(net), copy.deepcopy(net)
    backend = "auto" if model == "lenet" else "folded"
    la = MaskedModule(a, a.masked_names(), backend=backend)
    lb = MaskedModule(b, b.masked_names(), backend=backend)
    gen = torch.Generator(device=DEV).manual_seed(3)
    shape = (784,) if model == "lenet" else (3, 32, 32)
    x = torch.randn((16, *shape), generator=gen, device=DEV)
    y = torch.randint(0, 10, (16,), generator=gen, device=DEV)

    def trainer() -> MaskTrainer:
        return MaskTrainer(MethodConfig(method="arms", n=10, chunk=10, seed=0), la.d, 100, DEV)

    ta, tb = trainer(), trainer()
    step = CapturedStep(ta, la, x, y)
    for _ in range(4):
        got = step(x, y)
        loss = tb.step(lb.loss_fn(x, y, cross_entropy_per_mask))
        assert float(got) / 10 == pytest.approx(loss, rel=1e-6)
    assert step.graph is not None, step.failed  # the capture worked
    torch.testing.assert_close(ta.r, tb.r, rtol=1e-6, atol=1e-6)
    assert ta.step_count == tb.step_count == 4
    assert cgs.gpu_check(lambda: step(x, y)).describe() == "no sync"  # not even the loss


def test_copula_gpu_branch_is_its_earlier_form_with_fewer_kernels():
    n, d = 20, 5000
    theta = torch.rand(d, generator=torch.Generator(device=DEV).manual_seed(0), device=DEV)

    def uniforms(shape, gen):
        return torch.rand(shape, generator=gen, device=DEV)

    for sizes in ([20], [5, 5, 10]):
        s = CopulaSampler(theta, n, torch.Generator(device=DEV).manual_seed(4))
        new = torch.cat([s.next(k) for k in sizes])
        old = earlier_stick_draw(theta, n, torch.Generator(device=DEV).manual_seed(4), sizes,
                                 False, uniforms)
        assert torch.equal(new, old), sizes
    gen = torch.Generator(device=DEV).manual_seed(5)
    CopulaSampler(theta, n, gen).next(n)  # the exponents cached
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        CopulaSampler(theta, n, gen).next(n)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) <= 20, [e.name for e in kernels]  # 28 in the earlier form


def test_an_eager_step_with_every_route_syncs_only_the_known_readback():
    net = build_model("resnet20", 0).to(DEV).train()
    layout = MaskedModule(net, net.masked_names(), routes="all", amp=torch.bfloat16)
    gen = torch.Generator(device=DEV).manual_seed(6)
    x = torch.randn((16, 3, 32, 32), generator=gen, device=DEV)
    y = torch.randint(0, 10, (16,), generator=gen, device=DEV)
    tr = MaskTrainer(MethodConfig(method="arms", n=8, chunk=8, seed=0), layout.d, 100, DEV)
    f = layout.loss_fn(x, y, cross_entropy_per_mask)
    tr.step(f)  # compilation, capture of the forward, autotuning: outside the check
    v = cgs.gpu_check(lambda: tr.step(f), {cgs.LOSS_READBACK: 1}, 1)
    assert v.clean, v.describe()


def test_no_module_keeps_the_fused_attribute():
    net, layout, z, x = _resnet(None)
    with torch.no_grad():
        Folded(layout, routes=Routes(fused_bn=True))(z, x)
    assert not any(hasattr(m, route_ops.FUSED_ATTR) for m in net.modules()
                   if isinstance(m, nn.BatchNorm2d))


def test_a_prune_run_with_the_captured_step_equals_the_plain_run(tmp_path):
    """``python -m pbscale.prune --routes cuda_graph`` on the GPU: the run's steps replayed from
    a CUDA graph (no capture warning) give the plain run's folder name, masks (at least 99.9%
    of the bits: the same kernels, so in practice all) and metrics (relative 1e-4)."""
    import warnings

    from pbscale import prune as P
    from pbscale.runs.io import read_csv

    args = ["--method", "arms", "--n", "10", "--synthetic", "256", "--epochs", "2",
            "--max-batches", "8", "--batch-size", "32", "--val-size", "64", "--device", "cuda",
            "--quiet"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a failed capture warns
        assert P.main([*args, "--out", str(tmp_path / "graph"), "--routes", "cuda_graph"]) == 0
    assert P.main([*args, "--out", str(tmp_path / "plain")]) == 0
    (a,), (b,) = (list((tmp_path / s).glob("lenet-*")) for s in ("plain", "graph"))
    assert a.name == b.name
    ma, mb = (torch.load(f / "masks.pt", weights_only=True) for f in (a, b))
    for k in ma:
        if k.startswith("mask."):
            assert (ma[k] == mb[k]).float().mean() >= 0.999, k
    for ra, rb in zip(read_csv(a / "metrics.csv"), read_csv(b / "metrics.csv")):
        for k in ("train_loss", "val_loss", "test_loss"):
            if k in ra and ra[k] == ra[k]:
                assert rb[k] == pytest.approx(ra[k], rel=1e-4), k
