"""Dynamic weight rescaling (:mod:`pbscale.forward.rescale`): the writer the CPU's in-place MLP
path uses forms :func:`rescaled_weight`'s values bit for bit, straight into the forward's flat
buffer, for 0/1 masks of any density (none and all kept included) in float32 and float64; it
declines what it cannot do exactly (soft masks, mixed dtypes); and a pruning forward through it
equals the hook's own path bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pbscale.forward.masks import MaskedModule
from pbscale.forward.mlp import MlpInplace
from pbscale.forward.rescale import HOOK_WRITERS, rescaled_weight, write_rescaled

SHAPES = [(300, 784), (100, 300), (10, 100), (7,), (3, 5, 5)]


def _masks(shape, k, p, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand((k, *shape), generator=g, dtype=dtype) < p).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_writer_forms_the_hooks_values_bit_for_bit(dtype, shape):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(shape, generator=g, dtype=dtype)
    n, k, off = w.numel(), 6, 5
    for seed, p in enumerate((0.0, 1e-3, 0.3, 0.9, 1.0)):
        m = _masks(shape, k, p, dtype, seed)
        want = rescaled_weight("w", w, m).reshape(k, n)
        z = torch.zeros(k, n + 17, dtype=dtype)
        z[:, off:off + n] = m.reshape(k, n)
        out = torch.full((k, n + 17), -7.0, dtype=dtype)
        assert write_rescaled(w, z, off, out)
        assert torch.equal(out[:, off:off + n], want), p
        assert (out[:, :off] == -7).all() and (out[:, off + n:] == -7).all()  # only its columns
        if 0 < p < 1 and n > 100:  # not vacuous: a reciprocal times w z differs somewhere
            scale = m.reshape(k, n).mean(1, keepdim=True)
            assert not torch.equal(w.reshape(1, n) * m.reshape(k, n) * (1 / scale), want)


def test_the_writer_declines_what_it_cannot_do_exactly():
    w = torch.randn(4, 6)
    soft = torch.full((3, 24), 0.5)
    out = torch.empty(3, 24)
    assert not write_rescaled(w, soft, 0, out)  # soft masks: torch's mean order matters
    assert not write_rescaled(w.double(), torch.ones(3, 24), 0, out)  # mixed dtypes
    assert write_rescaled(w, torch.ones(3, 24), 0, out)
    assert HOOK_WRITERS[rescaled_weight] is write_rescaled


def test_a_rescaled_pruning_forward_through_the_writer_equals_the_hooks_path():
    """The in-place MLP path's writer against the same masks through the hook and its
    concatenation (:meth:`MlpWeights.hooked`), and a whole forward against one whose hook has no
    writer (a wrapper of the same function: the hook's path)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(),
                        nn.Linear(8, 3))
    layout = MaskedModule(net, weight_hook=rescaled_weight)
    x = torch.randn(32, 20)
    z = _masks((layout.d,), 5, 0.4, torch.float32, 3)
    with torch.no_grad():
        fast = layout.forward(z, x)
        backend = layout.backend(z, x)
        assert isinstance(backend, MlpInplace)  # the in-place MLP path was chosen
        ref = backend.weights.hooked(z)
        w = backend.workspace("w", z.shape, z)
    assert backend.weights.write_hooked(z, w) and torch.equal(w, ref)
    with torch.no_grad():
        plain = MaskedModule(net, weight_hook=lambda n, wt, m: rescaled_weight(n, wt, m))
        assert torch.equal(plain.forward(z, x), fast)  # a hook with no writer: the hook's path
