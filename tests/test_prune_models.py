"""Masked-weight counts of the pruning models against counts by hand from their architectures
and the counts of the paper's code."""

import pytest
import torch

from pbexact.errors import PBInputError
from pbscale.nets.models import INPUT_SHAPES, MODELS, build_model, masked_count


def conv(c_in, c_out, k=3):
    return c_in * c_out * k * k


def test_lenet_counts_by_hand():
    m = build_model("lenet")
    assert m.layer_counts() == {"fc1.weight": 784 * 300, "fc2.weight": 300 * 100}
    assert masked_count(m) == 265_200
    assert masked_count(m, m.masked_names(mask_head=True)) == 266_200
    assert m.num_parameters() == 266_200 + 300 + 100 + 10 == 266_610


def test_resnet20_counts_by_hand():
    m = build_model("resnet20")
    three_by_three = (conv(3, 16) + 6 * conv(16, 16) + conv(16, 32) + 5 * conv(32, 32)
                      + conv(32, 64) + 5 * conv(64, 64))
    assert masked_count(m) == three_by_three == 267_696
    assert len(m.masked_names()) == 19
    with_shortcuts = m.masked_names(mask_shortcuts=True)
    assert masked_count(m, with_shortcuts) == 267_696 + 16 * 32 + 32 * 64 == 270_256


def test_vgg19_counts_by_hand():
    m = build_model("vgg19")
    convs = (conv(3, 64) + conv(64, 64) + conv(64, 128) + conv(128, 128) + conv(128, 256)
             + 3 * conv(256, 256) + conv(256, 512) + 7 * conv(512, 512))
    assert masked_count(m) == convs == 20_018_880
    assert len(m.masked_names()) == 16


def test_conv6_counts_by_hand():
    m = build_model("conv6")
    convs = conv(3, 64) + conv(64, 64) + conv(64, 128) + conv(128, 128) + conv(128, 256) + conv(
        256, 256)
    assert masked_count(m) == convs + 4096 * 256 + 256 * 256
    assert masked_count(m, m.masked_names(mask_head=True)) == masked_count(m) + 2560


@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_forward_and_masked_names_are_weights(name):
    m = build_model(name)
    x = torch.randn(2, *INPUT_SHAPES[m.dataset])
    assert m(x).shape == (2, 10)
    params = dict(m.named_parameters())
    for k in m.masked_names():
        assert k.endswith(".weight") and params[k].dim() in (2, 4)
    assert m.head + ".weight" not in m.masked_names()


def test_same_seed_same_weights_and_unknown_model():
    a, b = build_model("lenet", seed=3), build_model("lenet", seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    c = build_model("lenet", seed=4)
    assert not torch.equal(a.fc1.weight, c.fc1.weight)
    s = build_model("lenet", init="signed_constant")
    assert torch.allclose(s.fc1.weight.abs(), torch.full_like(s.fc1.weight, (2 / 784) ** 0.5))
    with pytest.raises(PBInputError, match="unknown model"):
        build_model("alexnet")
