"""The networks of the pruning experiments (`sec:app_pruning_setup`), one class per row of
:data:`MODELS`, and the rule that names their masked tensors.

=========  =======================================================  =============  ==========
name       architecture                                             input          masked
=========  =======================================================  =============  ==========
lenet      LeNet-300-100 (784-300-100-10, Zhou et al.'s MNIST-FC)    (B, 784)       265,200
conv6      Conv6: 64,64,pool,128,128,pool,256,256,pool; FC 256,256   (B, 3, 32, 32) 2,258,624
resnet20   ResNet-20: 16/32/64 channels, 3 blocks/stage, 1x1 proj.   (B, 3, 32, 32) 267,696
vgg19      VGG-19 with BatchNorm (Frankle & Carbin, fig. 2)          (B, 3, 32, 32) 20,018,880
=========  =======================================================  =============  ==========

Masked tensors (:meth:`PrunableNet.masked_names`): the weights of the Linear and Conv layers,
except the classifier (the last Linear, ``head``) and, for ResNet-20, the 1x1 projection
shortcuts. That is the rule of the paper's code, as counted from it: ResNet-20 267,696
masked (3x3 convolutions only), VGG 20,018,880 (convolutions only) and LeNet 265,200 (the
784x300 and 300x100 layers; the 100x10 output layer unmasked). One rule for every model is why
LeNet defaults to 265,200 rather than Zhou et al.'s 266,200 (all three layers masked);
``mask_head=True`` gives 266,200 and ``mask_shortcuts=True`` gives ResNet-20's 270,256 (3x3 and
1x1 convolutions, the masks `benchmarks.bench_prune` times).

LeNet is an ``nn.Sequential`` (subclass) of Linear and ReLU layers fed flat images (B, 784), so
:class:`pbscale.forward.masks.MaskedModule` runs its k masks as batched matrix products (the
"folded" backend; the MLP fast path takes plain ``nn.Sequential`` instances only). The classes with
their own ``forward`` (ResNet-20 and its blocks, VGG-19) set ``channelwise_forward = True``: their
forwards join layers by channel-wise operations only, which lets
:func:`pbscale.forward.folded.forward_masked` run k masks of them as one network. ResNet-20 writes
"BatchNorm, residual add, ReLU" as one call, :func:`pbscale.forward.route_ops.bn_act`: op by op as
before, or one fused tail in a folded call on the ``fused_bn`` route
(:mod:`pbscale.forward.routes`).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from pbexact.errors import PBInputError
from pbscale.forward.route_ops import bn_act

#: Input shape (without the batch dimension) of each data set the models accept.
INPUT_SHAPES = {"mnist": (784,), "cifar10": (3, 32, 32)}
NUM_CLASSES = 10


class PrunableNet:
    """Mixin: the masked-tensor rule and weight counts shared by every model.

    ``head`` is the name of the classifier Linear module; ``shortcut_prefix`` marks parameter
    names of 1x1 projection shortcuts (ResNet only)."""

    head: str = ""
    shortcut_marker: str | None = None
    dataset: str = ""

    def masked_names(self, mask_head: bool = False, mask_shortcuts: bool = False) -> list[str]:
        """Names of the masked weight tensors, in ``named_parameters`` order: every Linear and
        Conv weight except the head (unless ``mask_head``) and the projection shortcuts
        (unless ``mask_shortcuts``)."""
        names = []
        for mname, m in self.named_modules():  # type: ignore[attr-defined]
            if not isinstance(m, (nn.Linear, nn.Conv2d)):
                continue
            if mname == self.head and not mask_head:
                continue
            if (self.shortcut_marker is not None and self.shortcut_marker in mname
                    and not mask_shortcuts):
                continue
            names.append(f"{mname}.weight")
        return names

    def layer_counts(self, names: list[str] | None = None) -> dict[str, int]:
        """Number of weights of each masked tensor {name: numel}."""
        params = dict(self.named_parameters())  # type: ignore[attr-defined]
        names = self.masked_names() if names is None else names
        return {k: params[k].numel() for k in names}

    def num_parameters(self) -> int:
        """All trainable parameters (weights, biases, BatchNorm affine parameters)."""
        return sum(p.numel() for p in self.parameters())  # type: ignore[attr-defined]


class LeNet300100(nn.Sequential, PrunableNet):
    """LeNet-300-100: x (B, 784) -> logits (B, 10); Linear layers with biases and ReLU."""

    head = "fc3"
    dataset = "mnist"

    def __init__(self) -> None:
        super().__init__(OrderedDict([
            ("fc1", nn.Linear(784, 300)), ("relu1", nn.ReLU()),
            ("fc2", nn.Linear(300, 100)), ("relu2", nn.ReLU()),
            ("fc3", nn.Linear(100, 10)),
        ]))


class Conv6(nn.Sequential, PrunableNet):
    """Conv6 of Zhou et al. (after Frankle & Carbin): x (B, 3, 32, 32) -> logits (B, 10).

    3x3 convolutions (padding 1, biases) with ReLU: 64, 64, max-pool, 128, 128, max-pool, 256,
    256, max-pool; then Linear 4096-256, 256-256, 256-10 with ReLU between."""

    head = "fc3"
    dataset = "cifar10"

    def __init__(self) -> None:
        layers: list[tuple[str, nn.Module]] = []
        c_in, i = 3, 0
        for stage, width in enumerate((64, 128, 256), start=1):
            for _ in range(2):
                i += 1
                layers += [(f"conv{i}", nn.Conv2d(c_in, width, 3, padding=1)),
                           (f"relu{i}", nn.ReLU())]
                c_in = width
            layers.append((f"pool{stage}", nn.MaxPool2d(2)))
        layers += [("flatten", nn.Flatten()),
                   ("fc1", nn.Linear(256 * 4 * 4, 256)), ("relu_fc1", nn.ReLU()),
                   ("fc2", nn.Linear(256, 256)), ("relu_fc2", nn.ReLU()),
                   ("fc3", nn.Linear(256, NUM_CLASSES))]
        super().__init__(OrderedDict(layers))


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with ReLU and a residual connection; a 1x1 conv-BN projection
    shortcut where the shape changes (stride 2 or more channels)."""

    #: forward chains the layers with channel-wise operations only (pbscale.forward.folded.foldable)
    channelwise_forward = True

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(OrderedDict([
                ("conv", nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)),
                ("bn", nn.BatchNorm2d(c_out)),
            ]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # relu(bn(.)) and relu(bn(.) + shortcut) through bn_act: op by op (plain forward), or
        # one fused tail inside a folded call on the fused route (pbscale.forward.routes)
        h = bn_act(self.bn1, self.conv1(x))
        return bn_act(self.bn2, self.conv2(h), self.shortcut(x))


class ResNet20(nn.Module, PrunableNet):
    """ResNet-20 for CIFAR-10 (He et al.): x (B, 3, 32, 32) -> logits (B, 10).

    3x3 conv 16 + BN + ReLU; three stages of 3 basic blocks with 16, 32, 64 channels (stride 2 at
    the start of stages 2 and 3, with 1x1 projection shortcuts); global average pool; Linear
    64-10."""

    #: forward chains the layers with channel-wise operations only (pbscale.forward.folded.foldable)
    channelwise_forward = True

    head = "fc"
    shortcut_marker = "shortcut"
    dataset = "cifar10"

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        blocks: list[nn.Module] = []
        c_in = 16
        for stage, width in enumerate((16, 32, 64)):
            for b in range(3):
                blocks.append(BasicBlock(c_in, width, 2 if (stage > 0 and b == 0) else 1))
                c_in = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = bn_act(self.bn, self.conv(x))
        h = self.blocks(h)
        return self.fc(h.mean(dim=(2, 3)))


#: VGG-19 plan of Frankle & Carbin's figure 2: channels, "M" = 2x2 max-pool.
VGG19_PLAN = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
              512, 512, 512, 512, "M", 512, 512, 512, 512)


class VGG19(nn.Module, PrunableNet):
    """VGG-19 with BatchNorm (Frankle & Carbin, fig. 2): x (B, 3, 32, 32) -> logits (B, 10).

    3x3 conv-BN-ReLU layers as in :data:`VGG19_PLAN`, 2x2 average pool of the final 2x2 map,
    Linear 512-10. Convolutions carry no bias (a BatchNorm follows each one); the masked-weight
    count (20,018,880) does not depend on that."""

    #: forward chains the layers with channel-wise operations only (pbscale.forward.folded.foldable)
    channelwise_forward = True

    head = "fc"
    dataset = "cifar10"

    def __init__(self) -> None:
        super().__init__()
        layers: list[tuple[str, nn.Module]] = []
        c_in, i, p = 3, 0, 0
        for v in VGG19_PLAN:
            if v == "M":
                p += 1
                layers.append((f"pool{p}", nn.MaxPool2d(2)))
                continue
            i += 1
            layers += [(f"conv{i}", nn.Conv2d(c_in, int(v), 3, padding=1, bias=False)),
                       (f"bn{i}", nn.BatchNorm2d(int(v))), (f"relu{i}", nn.ReLU())]
            c_in = int(v)
        self.features = nn.Sequential(OrderedDict(layers))
        self.fc = nn.Linear(512, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        return self.fc(h.mean(dim=(2, 3)))


#: Registry: model name -> class (the CLI's --model choices).
MODELS: dict[str, type] = {
    "lenet": LeNet300100,
    "conv6": Conv6,
    "resnet20": ResNet20,
    "vgg19": VGG19,
}

#: Weight initializations: kaiming_normal (fan-in, ReLU gain; biases zero) and
#: signed_constant (each weight +-sqrt(2 / fan_in) with a random sign: Zhou et al.'s signed
#: Kaiming constant, the weights of their 98.0% LeNet supermask).
INITS = ("kaiming_normal", "signed_constant")


def init_weights(model: nn.Module, scheme: str = "kaiming_normal",
                 generator: torch.Generator | None = None) -> nn.Module:
    """Initialize every Linear and convolution weight of ``model`` in place (fan-in:
    ``weight[0].numel()``; biases to zero; BatchNorm to weight 1, bias 0) from ``generator``,
    module by module in ``modules()`` order; other layers (e.g. embeddings) keep their own
    initialization. Returns ``model``."""
    if scheme not in INITS:
        raise PBInputError(f"unknown init {scheme!r}; choose one of {', '.join(INITS)}")
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)):
                w = m.weight
                fan_in = w[0].numel()
                std = math.sqrt(2.0 / fan_in)
                if scheme == "kaiming_normal":
                    w.copy_(torch.randn(w.shape, generator=generator) * std)
                else:
                    sign = torch.randint(0, 2, w.shape, generator=generator) * 2 - 1
                    w.copy_(sign.to(w.dtype) * std)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.modules.batchnorm._BatchNorm) and m.affine:
                m.weight.fill_(1.0)
                m.bias.zero_()
    return model


def build_model(name: str, seed: int = 0, init: str = "kaiming_normal") -> nn.Module:
    """The model ``name`` of :data:`MODELS` with weights from ``init`` drawn with ``seed``
    (same seed, same weights, on the CPU; move it to a device afterwards)."""
    if name not in MODELS:
        raise PBInputError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    model = MODELS[name]()
    return init_weights(model, init, torch.Generator().manual_seed(seed))


def masked_count(model: nn.Module, names: list[str] | None = None) -> int:
    """Total number of masked weights."""
    return sum(model.layer_counts(names).values())  # type: ignore[attr-defined]
