"""A function of fixed-shape tensors replayed from a captured CUDA graph: the ``cuda_graph`` route
of :mod:`pbscale.forward.routes`, which :class:`pbscale.forward.backends.Graphed` applies to a
masked forward.

A host-bound step (LeNet-300-100, ARMS n = 100 on an H100: 3.7 ms of wall time for 1.4 ms of
kernels, 130 launches) spends its time launching kernels; a CUDA graph launches the recorded
kernels of a call at once. The graph reads and writes fixed addresses, so :class:`StaticFunction`
runs the function on static buffers: each call copies its arguments in, runs (or replays) the
function on them, and returns a copy of the output. Capturing runs only on a CUDA device; the
data flow around it (``capture=False``) is the same on any device, which is how the CPU tests
check it against the function itself.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch

#: Eager runs on a side stream before a capture (lazy initializations, cuDNN autotuning).
WARMUP = 2
#: The profiler scope of an uncaptured run of what a CUDA graph would hold (here and in
#: :class:`pbscale.execution.captured.CapturedStep`; `benchmarks/op_count.py` counts the operations
#: inside it as the one launch of a replay).
SCOPE = "pbscale.forward.graphs.uncaptured"


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class StaticFunction:
    """``fn(*args) -> Tensor`` on static copies of its tensor arguments.

    The first call allocates the buffers (each argument's shape, dtype, strides and device;
    :meth:`matches` tells whether other arguments fit them). Every call copies the arguments
    in, then replays a CUDA graph of ``fn`` on the buffers (``capture=True``, a CUDA device:
    captured at the first call after :data:`WARMUP` eager runs on a side stream, whose effects
    on the tensors of ``state``, e.g. BatchNorm running statistics, are undone, so the first
    call updates them once, as an eager call does) or runs ``fn`` eagerly on them
    (``capture=False``). A capture that fails (an operation that cannot be captured) leaves the
    eager run, with one warning. Returns a copy of the output (the graph's output buffer is
    overwritten by the next replay). No autograd: the outputs of a replay carry no graph."""

    def __init__(self, fn: Callable[..., torch.Tensor], state: Sequence[torch.Tensor] = (),
                 capture: bool = False) -> None:
        self.fn = fn
        self.state = list(state)
        self.capture = capture
        self.static: list[torch.Tensor] | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        self.failed: str | None = None

    def matches(self, *args: torch.Tensor) -> bool:
        """Whether ``args`` fit the static buffers (True before the first call)."""
        return self.static is None or all(
            a.shape == s.shape and a.dtype == s.dtype and a.stride() == s.stride()
            and a.device == s.device for a, s in zip(args, self.static, strict=True))

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        if not self.matches(*args):
            raise ValueError("StaticFunction: arguments of another shape, dtype, layout or "
                             "device than its static buffers; make one per shape")
        first = self.static is None
        if first:
            self.static = [torch.empty_like(a) for a in args]
        for s, a in zip(self.static, args):
            s.copy_(a)
        if first and self.capture:
            self._capture()
        if self.graph is None:
            with torch.profiler.record_function(SCOPE):  # what a capture would hold
                out = self.fn(*self.static)
            return out.clone()
        self.graph.replay()
        return self.out.clone()

    def _capture(self) -> None:
        saved = [t.clone() for t in self.state]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                self.fn(*self.static)
        torch.cuda.current_stream().wait_stream(side)
        for t, v in zip(self.state, saved):
            t.copy_(v)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                out = self.fn(*self.static)
        except Exception as e:  # noqa: BLE001 - any capture failure leaves the eager run
            self.failed = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"
            warnings.warn(f"CUDA graph capture failed, running eagerly: {self.failed}",
                          RuntimeWarning, stacklevel=3)
            return
        self.graph, self.out = graph, out
