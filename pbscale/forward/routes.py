"""The GPU routes of the masked forward: faster ways to compute what the reference path
computes, each on or off, chosen per call by :class:`pbscale.forward.backends.BackendChoice`.

The H100 profile of the ARMS step at n = 100 (``figures/gpu/h100-2026-11-26/``) names where the
time goes; each route answers one finding:

===================  ===========================================================================
``channels_last``    bf16/fp16 conv nets: activations and the masked kernels in channels-last
                     memory format end to end (cuDNN's bf16 grouped convolutions are 2-5x faster
                     in NHWC, and an NCHW tensor costs a transpose on each side)
``shortcut_einsum``  a 1x1 convolution on the k folded masks (ResNet's projection shortcut) as
                     a strided slice and one ``einsum`` (0.35 against 0.73 ms fp32, 0.19 against
                     0.56 ms bf16 for the grouped convolution)
``fused_bn``         BatchNorm with the ReLU and the residual add after it as one function,
                     compiled (``torch.compile``, Triton; never the convolutions) where available
                     (train-mode BatchNorm and the separate ReLU/add kernels: 17 of the 37 ms of
                     the bf16 forward)
``cudnn_benchmark``  cuDNN autotuning (``torch.backends.cudnn.benchmark``) during the folded
                     call: the shapes of a run are fixed
``cuda_graph``       the masked forward of a chunk replayed from a captured CUDA graph (fixed
                     shapes, no autograd: the supermask MC step), which spares the host the
                     launches of a host-bound step (LeNet: 130 launches, 3.7 ms of wall time
                     against 1.4 ms of kernels)
===================  ===========================================================================

Every route is a GPU route: off the CUDA device none applies, and :meth:`BackendChoice
.effective_routes` also drops one that does not fit the network or setting (then the reference
path runs: the clean fallback). The routes compute the reference's function to float rounding,
with the same gradients and BatchNorm running statistics (tested on the CPU, where the routes are
applied explicitly, and on a GPU by ``tests/test_gpu_routes.py``).

The routes asked for: :class:`pbscale.forward.masks.MaskedModule` ``routes=``, else the process
default, :func:`default`: the environment variable ``PBNN_ROUTES`` ("off", the default; "all"; or
names, comma-separated), or what :func:`use` sets for a block of code.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass

from pbexact.errors import PBInputError

#: The environment variable that sets the process default (:func:`default`).
ENV = "PBNN_ROUTES"


@dataclass(frozen=True)
class Routes:
    """Which routes are on (all off: the reference path)."""

    channels_last: bool = False
    shortcut_einsum: bool = False
    fused_bn: bool = False
    cudnn_benchmark: bool = False
    cuda_graph: bool = False

    @property
    def on(self) -> tuple[str, ...]:
        """The names of the routes that are on, in :data:`ROUTES` order."""
        return tuple(n for n in ROUTES if getattr(self, n))

    def __str__(self) -> str:
        return ",".join(self.on) or "off"


#: Every route, by name.
ROUTES = tuple(f.name for f in dataclasses.fields(Routes))
NONE = Routes()
ALL = Routes(**dict.fromkeys(ROUTES, True))


def parse(text: str | Routes) -> Routes:
    """Routes from "off" (or "" / "none"), "all" (or "on"), or route names comma-separated;
    anything else is a one-line :class:`PBInputError` listing the names."""
    if isinstance(text, Routes):
        return text
    words = [w.strip() for w in str(text).split(",") if w.strip()]
    if not words or words in (["off"], ["none"]):
        return NONE
    if words in (["all"], ["on"]):
        return ALL
    bad = [w for w in words if w not in ROUTES]
    if bad:
        raise PBInputError(f"unknown route {bad[0]!r}; choose off, all or from "
                           f"{', '.join(ROUTES)} (comma-separated)")
    return Routes(**dict.fromkeys(words, True))


def argument(text: str) -> Routes:
    """argparse type of a ``--routes`` option: :func:`parse`, its refusal as argparse's."""
    try:
        return parse(text)
    except PBInputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_DEFAULT: list[Routes] = []  # what use() set, innermost last


def default() -> Routes:
    """The process default: the innermost :func:`use`, else ``PBNN_ROUTES`` (unset: off)."""
    if _DEFAULT:
        return _DEFAULT[-1]
    try:
        return parse(os.environ.get(ENV, "off"))
    except PBInputError as e:
        raise PBInputError(f"{ENV}: {e}") from None


@contextlib.contextmanager
def use(routes: str | Routes) -> Iterator[Routes]:
    """Make ``routes`` the process default inside the block (what layouts without routes of
    their own follow at each call)."""
    r = parse(routes)
    _DEFAULT.append(r)
    try:
        yield r
    finally:
        _DEFAULT.pop()
