"""The computations of the GPU routes (:mod:`pbscale.forward.routes`) that replace a reference op of
the folded forward (:func:`pbscale.forward.folded.forward_masked`), each the same math as the op it
replaces (to float rounding, gradients included; tested against it on the CPU):

* :func:`bn_act`: the one call the models make for "BatchNorm, then the residual add, then
  ReLU" (ResNet-20's stem and blocks). Off the fused route it IS that (``torch.relu(bn(x) +
  residual)``, bit for bit); a folded call with the fused route gives the BatchNorm module a
  ``fused_bn_act`` method for the duration of the call, which takes the whole tail.
* :func:`batch_norm_act`: that tail as one function (batch statistics, normalization, affine,
  residual add, ReLU; running statistics updated as ``F.batch_norm`` updates them), and
  :func:`batch_norm_act_fn`, the function to run on a device: ``torch.compile`` of it on a CUDA
  device where Triton is available (two kernels: one reduction, one elementwise; only this tail
  is compiled, never a convolution: Triton's grouped-convolution templates were 1.7-78x slower
  than cuDNN on the H100), else the eager function. Compiling raises dynamo's recompile limit
  to :data:`RECOMPILE_LIMIT` for the process (its variants would pass the default of 8).
* :func:`conv1x1_folded`: a 1x1 convolution (any stride, no padding) on folded activations
  (B, k Cin, H, W) with the k masks' kernels (k Cout, Cin, 1, 1) and groups k, as a strided
  slice and one ``einsum`` over the k masks; channels-last in, channels-last out.
* :func:`cudnn_benchmark`: ``torch.backends.cudnn.benchmark`` on for a block, restored after.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Callable, Iterator

import torch
from torch import nn

#: The attribute a folded call with the fused route sets on a BatchNorm module (and removes).
FUSED_ATTR = "fused_bn_act"
#: The profiler scope of an eager run of the fused tail (`benchmarks/op_count.py` counts the
#: operations inside it as the kernels the compiled tail launches).
FUSED_SCOPE = "pbscale.forward.route_ops.batch_norm_act"


def bn_act(bn: nn.Module, x: torch.Tensor, residual: torch.Tensor | None = None,
           relu: bool = True) -> torch.Tensor:
    """relu(bn(x) + residual) (no add without a residual, no ReLU with ``relu=False``): the
    reference computation op by op, or the whole tail at once inside a folded call that fuses it
    (the module then carries :data:`FUSED_ATTR`)."""
    fused = getattr(bn, FUSED_ATTR, None)
    if fused is not None:
        return fused(x, residual, relu)
    h = bn(x)
    if residual is not None:
        h = h + residual
    return torch.relu(h) if relu else h


def batch_norm_act(x: torch.Tensor, running_mean: torch.Tensor | None,
                   running_var: torch.Tensor | None, weight: torch.Tensor | None,
                   bias: torch.Tensor | None, training: bool, momentum: float, eps: float,
                   residual: torch.Tensor | None = None, relu: bool = True) -> torch.Tensor:
    """``F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)``
    followed by ``+ residual`` and ReLU, as one function: x (B, C, ...), per-channel (C,)
    statistics and affine parameters, residual of x's shape (or None). Training mode
    normalizes with the batch statistics (biased variance) and, when running statistics are
    given, updates them in place as ``F.batch_norm`` does (momentum, unbiased variance); eval
    mode uses the running statistics. Computed in float32 at least (a bf16 x is upcast, the
    result cast back to x's dtype once, after the ReLU)."""
    dims = [0, *range(2, x.dim())]
    shape = (1, -1) + (1,) * (x.dim() - 2)
    xs = x if x.dtype in (torch.float32, torch.float64) else x.float()
    if training:
        var, mean = torch.var_mean(xs, dim=dims, correction=0)
        if running_mean is not None and running_var is not None:
            count = x.numel() // x.shape[1]
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                running_var.mul_(1 - momentum).add_(var.detach(),
                                                    alpha=momentum * count / max(count - 1, 1))
    else:
        mean, var = running_mean, running_var
    scale = torch.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight
    y = (xs - mean.view(shape)) * scale.view(shape)
    if bias is not None:
        y = y + bias.view(shape)
    if residual is not None:
        y = y + residual
    if relu:
        y = torch.relu(y)
    return y.to(x.dtype)


def compile_available() -> bool:
    """Whether :func:`batch_norm_act_fn` compiles on a CUDA device: ``torch.compile`` and
    Triton importable, and a CUDA device visible."""
    return (hasattr(torch, "compile") and torch.cuda.is_available()
            and importlib.util.find_spec("triton") is not None)


#: Compiled variants of the tail dynamo may keep (its default, 8, is below the 2 residual
#: forms x 2 dtypes x 2 memory formats x train/eval x with/without autograd a run can meet).
RECOMPILE_LIMIT = 64


@functools.cache
def _compiled() -> Callable[..., torch.Tensor]:
    import torch._dynamo.config as dynamo

    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across versions
        if hasattr(dynamo, name):
            setattr(dynamo, name, max(getattr(dynamo, name), RECOMPILE_LIMIT))
    # dynamic shapes: one kernel pair for the layers' shapes and the last, shorter chunk
    return torch.compile(batch_norm_act, dynamic=True)


def _eager(*args: object) -> torch.Tensor:
    with torch.profiler.record_function(FUSED_SCOPE):
        return batch_norm_act(*args)


def batch_norm_act_fn(device: torch.device | str) -> Callable[..., torch.Tensor]:
    """The tail to run on ``device``: compiled on a CUDA device when :func:`compile_available`,
    else :func:`batch_norm_act` itself (eager, in a profiler scope of its own)."""
    if torch.device(device).type == "cuda" and compile_available():
        return _compiled()
    return _eager


def conv1x1_folded(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   stride: tuple[int, ...], k: int) -> torch.Tensor:
    """``F.conv2d(x, weight, bias, stride, groups=k)`` for a 1x1 kernel without padding: x
    (B, k Cin, H, W) folded (mask j's channels j Cin ... (j + 1) Cin - 1), weight (k Cout, Cin,
    1, 1), bias (k Cout,) or None -> (B, k Cout, H', W'), H' = ceil(H / stride). The strided
    slice keeps the input positions the kernel reads; one ``einsum`` contracts each mask's
    channels with its own kernel. A channels-last x gives a channels-last result."""
    sh, sw = stride
    xs = x[:, :, ::sh, ::sw]
    B, _, H, W = xs.shape
    cout, cin = weight.shape[0] // k, weight.shape[1]
    w = weight.reshape(k, cout, cin)
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        y = torch.einsum("bhwkc,koc->bhwko", xs.permute(0, 2, 3, 1).reshape(B, H, W, k, cin), w)
        y = y.reshape(B, H, W, k * cout).permute(0, 3, 1, 2)
    else:
        y = torch.einsum("bkchw,koc->bkohw", xs.reshape(B, k, cin, H, W), w)
        y = y.reshape(B, k * cout, H, W)
    return y if bias is None else y + bias.view(1, -1, 1, 1)


@contextlib.contextmanager
def cudnn_benchmark() -> Iterator[None]:
    """``torch.backends.cudnn.benchmark = True`` inside the block (cuDNN times its algorithms
    for each new shape once and keeps the fastest), the previous setting restored after."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before
