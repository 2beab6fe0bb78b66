"""Dynamic weight rescaling (the pruning loss of the MC methods, `sec:app_pruning_setup`): the
mask-to-weight hook :func:`rescaled_weight`, w z / mean(z) per mask and tensor, and its writer
for the CPU's in-place MLP path, :func:`write_rescaled`, which forms the same values in one Numba
pass per tensor straight into the forward's flat weight buffer (no (k, *shape) temporaries, no
concatenation). :data:`HOOK_WRITERS` maps a hook to its writer."""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np
import torch


def rescaled_weight(name: str, weight: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Dynamic weight rescaling, a mask-to-weight hook: w * z / mean(z) per mask and layer, the
    mean taken over this tensor's mask and treated as a constant in the backward pass (detached);
    an all-zero mask keeps scale 1 (its masked weights are all zero anyway).
    weight (*shape), mask (k, *shape) -> (k, *shape)."""
    dims = tuple(range(1, mask.dim()))
    mean = mask.detach().mean(dim=dims, keepdim=True)
    scale = torch.where(mean > 0, mean, torch.ones_like(mean))
    return weight * mask / scale


@numba.njit(cache=True, error_model="numpy")
def _rescale_rows(w, z, off, exact, out):
    """out[s, off:off + n] = w z[s, off:off + n] / scale_s, scale_s = (ones of that row) / n (1
    if none), in out's dtype, for 0/1 masks (n = w's size; z, out (k, d)); False (out partly
    written) where a value is neither 0 nor 1 or n is ``exact`` or more (the count is then not
    exact in that dtype). Row slices of C-contiguous arrays: the loops vectorize."""
    k = z.shape[0]
    n = w.shape[0]
    if n >= exact:
        return False
    t = np.empty_like(out[0, :1])
    for s in range(k):
        zr = z[s, off:off + n]
        orow = out[s, off:off + n]
        ones = 0
        bad = False
        for i in range(n):
            v = zr[i]
            ones += v == 1
            bad |= (v != 0) & (v != 1)
        if bad:
            return False
        t[0] = ones
        total = t[0]
        t[0] = n
        mean = total / t[0]
        t[0] = 1
        scale = mean if mean > 0 else t[0]
        for i in range(n):
            orow[i] = w[i] * zr[i] / scale
    return True


def write_rescaled(weight: torch.Tensor, masks: torch.Tensor, off: int, out: torch.Tensor) -> bool:
    """:func:`rescaled_weight`'s values for one tensor of n weights, written into columns
    off, ..., off + n - 1 of ``out`` (k, d) from its flat weight (n,) and the same columns of the
    flat masks (k, d), on the CPU, without autograd: the same values bit for bit where every
    mask value is 0 or 1 (the count of ones is then exact, and torch's CPU mean is that sum
    divided by n). Returns False, leaving ``out`` to be overwritten, where it cannot (soft
    masks, mixed dtypes, another device)."""
    if not (weight.dtype == masks.dtype == out.dtype and out.dtype in (torch.float32,
            torch.float64) and weight.device.type == masks.device.type == "cpu"):
        return False
    exact = 2**24 if out.dtype == torch.float32 else 2**53
    return bool(_rescale_rows(weight.detach().reshape(-1).numpy(), masks.detach().numpy(), off,
                              exact, out.numpy()))


#: Hooks whose values can be written into a given buffer by a writer(weight (*shape), masks
#: (k, d), off, out (k, d)) -> bool, the tensor's columns off, ..., off + numel - 1 of the flat
#: masks and buffer (False: call the hook instead): the CPU's in-place MLP path uses it.
HOOK_WRITERS: dict[Callable, Callable[[torch.Tensor, torch.Tensor, int, torch.Tensor], bool]] = {
    rescaled_weight: write_rescaled,
}
