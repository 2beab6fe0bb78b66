"""The one rule that picks a masked-forward backend (pbscale.forward.backends.BackendChoice): which
backend each kind of network, input, device and autograd need gets, that MaskedModule.forward
runs exactly the chosen one, and that every backend states its contract."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pbscale.forward import backends as B
from pbscale.forward.masks import MaskedModule
from pbscale.nets.models import INPUT_SHAPES, build_model


def mlp(bn_running: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7, track_running_stats=bn_running),
                         nn.ReLU(), nn.Linear(7, 3))


def conv() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 2))


class Gate(nn.Module):
    """A custom forward that pbscale.forward.folded.foldable does not vouch for."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.lin(x), x], dim=1)


def test_mlp_paths_in_place_without_graph_and_with_autograd_otherwise():
    layout = MaskedModule(mlp())
    z, x = torch.rand(4, layout.d), torch.randn(6, 5)
    with torch.no_grad():
        assert type(layout.backend(z, x)) is B.MlpInplace
    assert type(layout.backend(z, x)) is B.MlpInplace  # nothing requires grad
    zg = z.clone().requires_grad_()
    assert type(layout.backend(zg, x)) is B.MlpAutograd
    joint = MaskedModule(mlp(), train_weights=True)
    assert type(joint.backend(z, x)) is B.MlpAutograd
    with torch.no_grad():
        assert type(joint.backend(z, x)) is B.MlpInplace
    # grouped masks: both MLP paths take all groups at once (the batched regression groups)
    assert layout.backend(z[None].expand(2, -1, -1), x[None].expand(2, -1, -1)).takes_groups
    assert layout.backend(zg[None].expand(2, -1, -1), x[None].expand(2, -1, -1)).takes_groups


def test_off_the_mlp_paths_by_input_network_and_device():
    layout = MaskedModule(mlp())
    x = torch.randn(6, 5)
    # one input row, no masks, another dtype: off the MLP paths (no convolution: folded)
    assert type(layout.backend(torch.rand(4, layout.d), x[:1])) is B.Folded
    assert type(layout.backend(torch.rand(0, layout.d), x)) is B.Vmap
    assert type(layout.backend(torch.rand(4, layout.d, dtype=torch.float64), x)) is B.Folded
    # running statistics: no MLP plan
    running = MaskedModule(mlp(bn_running=True))
    assert running.choice.plan is None
    assert type(running.backend(torch.rand(4, running.d), x)) is B.Folded
    # a conv net: loop on a CPU, folded on a GPU; a backend by name wins everywhere
    cnn = MaskedModule(conv())
    xc = torch.randn(3, 2, 6, 6)
    assert type(cnn.backend(torch.rand(2, cnn.d), xc)) is B.Loop
    assert type(cnn.choice.for_device("cuda")) is B.Folded
    assert type(MaskedModule(conv(), backend="vmap").choice.for_device("cuda")) is B.Vmap
    by_name = MaskedModule(mlp(), backend="loop")
    assert by_name.choice.plan is None
    assert type(by_name.backend(torch.rand(4, by_name.d), x)) is B.Loop
    # a forward the folded code cannot vouch for: vmap everywhere
    gate = MaskedModule(Gate())
    assert type(gate.choice.for_device("cpu")) is type(gate.choice.for_device("cuda")) is B.Vmap
    # autocast needs the folded code: no MLP plan
    assert MaskedModule(mlp(), amp=torch.bfloat16).choice.plan is None


def test_forward_runs_the_chosen_backend(monkeypatch):
    """MaskedModule.forward calls exactly the backend choose() returns (per group when that
    backend does not take groups)."""
    calls = []
    for cls in (B.MlpInplace, B.MlpAutograd, B.Folded, B.Vmap):
        orig = cls.__call__

        def spy(self, z, x, _orig=orig):
            calls.append((type(self).__name__, tuple(z.shape)))
            return _orig(self, z, x)

        monkeypatch.setattr(cls, "__call__", spy)
    layout = MaskedModule(mlp())
    z, x = torch.rand(2, 3, layout.d), torch.randn(2, 6, 5)
    with torch.no_grad():
        out = layout.forward(z, x)
    assert calls == [("MlpInplace", (2, 3, layout.d))] and out.shape == (2, 3, 6, 3)
    calls.clear()
    layout.forward(z.requires_grad_(), x)
    assert calls == [("MlpAutograd", (2, 3, layout.d))]
    calls.clear()
    cnn = MaskedModule(conv())
    cnn.forward(torch.rand(2, cnn.d), torch.randn(3, 2, 6, 6))
    assert calls == [("Loop", (2, cnn.d))]


@pytest.mark.parametrize("model", ["lenet", "conv6"])
def test_the_backends_agree_on_the_models(model):
    """Every backend that can run a model gives the vmap backend's output (float64)."""
    net = build_model(model, 0).double().eval()
    layout = MaskedModule(net, net.masked_names())
    gen = torch.Generator().manual_seed(0)
    z = (torch.rand(3, layout.d, generator=gen, dtype=torch.float64) < 0.5).double()
    x = torch.randn((4, *INPUT_SHAPES[net.dataset]), generator=gen, dtype=torch.float64)
    with torch.no_grad():
        ref = B.Vmap(layout)(z, x)
        for backend in (B.Folded(layout), B.Loop(layout), layout.backend(z, x)):
            torch.testing.assert_close(backend(z, x), ref, rtol=1e-10, atol=1e-12)


def test_every_backend_states_its_contract():
    """Each backend's docstring says which networks it runs, the shapes, gradients and
    BatchNorm statistics (the contract is written once, on the class)."""
    backends = [B.MlpInplace, B.MlpAutograd, B.Folded, B.Loop, B.Vmap, B.Graphed]
    assert {c.name for c in backends} == {"mlp_inplace", "mlp_autograd", "folded", "loop",
                                          "vmap", "graphed"}
    for cls in backends:
        doc = (cls.__doc__ or "").lower()
        assert "gradient" in doc and "batchnorm" in doc or cls is B.Loop, cls
        assert "k, d)" in doc or cls is B.Loop, cls
    assert "same contract as" in B.Loop.__doc__.lower()
