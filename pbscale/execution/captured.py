"""A whole MC pruning step (`alg:iter_arms`: sampling, the masked forward of n masks, the
accumulator, the surrogate's backward and the optimizer update of the mask logits) replayed from
one captured CUDA graph: the ``cuda_graph`` route at the level of the step.

LeNet-300-100's ARMS n = 100 step on an H100 is host-bound: 3.7 ms of wall time for 1.4 ms of
kernels over 130 launches (``figures/gpu/h100-2026-11-26/floor_eager.txt``); replaying the step
launches them at once. :class:`CapturedStep` runs a trainer's step on static copies of the batch
(the loss is built once on those buffers), eagerly at its first call (which also creates the
optimizer's state) and from a graph captured at its second; each call returns the value the
step reads back to the host, as a device tensor (MC: the sum of the n sampled losses; the step's
own return value is it / n), so a captured step makes no host synchronization at all.

What a capture needs, and how it is met: no host read-back inside (the step's one read-back is
given a stand-in during the capture and its tensor kept: a graph output); the optimizer's step
counter on the device (``capturable=True``, set before the first step); the trainer's generator
registered with the graph (the copula sampler's draws advance at each replay); scratch buffers
allocated by the capture itself (the copula sampler's and the MLP backend's are dropped first, so
the graph's own pool holds them); Python state of the step redone on the host after a replay
(the step counter). Anything that changes what the step computes makes a new graph at the next
call but one: the learning rates, the method's temperature, the weights (storage or version),
the network's train/eval mode. A failed capture leaves eager steps, with one warning.
Supermask only: the weights must not train (:class:`pbscale.forward.masks.MaskedModule` with
``train_weights=False``); the nested forward graphs of :class:`pbscale.forward.backends.Graphed` are
off inside a capture. The eager path (``capture=False``, or off CUDA) is the same data flow, which
is how the CPU tests check it against the plain step.

:class:`CapturedSteps` puts it in the run loop (:func:`pbscale.runs.loop.run`): ``python -m
pbscale.prune --routes cuda_graph`` on a GPU takes every step of a supermask run of a method
that :attr:`pbscale.methods.registry.Family.captures_step` (the MC estimators) through one
:class:`CapturedStep`, and the loop reads the steps' losses once per epoch.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pbexact.errors import PBInputError
from pbscale.forward.folded import PerMaskLoss, cross_entropy_per_mask
from pbscale.forward.graphs import SCOPE
from pbscale.methods.samplers import release_scratch
from pbscale.runs.contracts import RunHooks

_READ = torch.ops.aten._local_scalar_dense.default


class ReadBacks(TorchDispatchMode):
    """Records the tensors read back to the host (``.item()``, ``float(t)``) on ``device``;
    with ``stand_in`` their values are not read: 0 (of the dtype) is returned instead (inside a
    capture, where a read-back is not allowed). :attr:`loss`: the first floating-point one (a
    step's loss; a CPU step also reads booleans back, e.g. the parametrizations' host-only
    shortcuts)."""

    def __init__(self, device: torch.device, stand_in: bool) -> None:
        super().__init__()
        self.device, self.stand_in = device, stand_in
        self.tensors: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _READ and args[0].device == self.device:
            self.tensors.append(args[0])
            if self.stand_in:
                t = args[0]
                return False if t.dtype == torch.bool else (0.0 if t.is_floating_point() else 0)
        return func(*args, **kwargs)

    @property
    def loss(self) -> torch.Tensor | None:
        return next((t for t in self.tensors if t.is_floating_point()), None)


class CapturedStep:
    """``trainer.step`` on the loss ``layout.loss_fn(x, y, loss)`` of static batch buffers,
    captured into a CUDA graph at the second call and replayed after (module docstring).

    ``trainer``: a mask trainer (:class:`pbscale.methods.MaskTrainer`: ``step(f)``, ``r``,
    ``optimizers``, ``generator``, ``step_count``, ``temperature()``); ``layout`` the
    supermask :class:`pbscale.forward.masks.MaskedModule`; ``x``, ``y`` an example batch (shapes,
    dtypes, device). ``capture=False``: every call eager on the static buffers. Each call copies
    the batch in and returns the step's read-back value as a 0-dim tensor on the device."""

    def __init__(self, trainer: Any, layout: Any, x: torch.Tensor, y: torch.Tensor,
                 loss: PerMaskLoss = cross_entropy_per_mask, capture: bool = True) -> None:
        if layout.train_weights:
            raise PBInputError("a captured step needs a supermask (train_weights=False): trained "
                               "weights change the graph's inputs each step; run steps eagerly")
        self.trainer, self.layout = trainer, layout
        self.x, self.y = torch.empty_like(x), torch.empty_like(y)
        self.f = layout.loss_fn(self.x, self.y, loss)
        self.device = trainer.r.device
        self.capture = capture and self.device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.readback: torch.Tensor | None = None
        self.key: tuple | None = None
        self.failed: str | None = None
        if self.capture:
            for opt in trainer.optimizers:  # the step counter on the device, from the start
                for group in opt.param_groups:
                    if "capturable" in group:
                        group["capturable"] = True
                for p, state in opt.state.items():
                    if torch.is_tensor(state.get("step")) and state["step"].device != p.device:
                        state["step"] = state["step"].to(p.device)

    def _key(self) -> tuple:
        tr, lay = self.trainer, self.layout
        return (tuple(g["lr"] for opt in tr.optimizers for g in opt.param_groups),
                repr(float(tr.temperature())),
                tuple((t.data_ptr(), t._version) for t in lay.base.values()),
                tuple(m.training for m in lay.module.modules()))

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.x.copy_(x)
        self.y.copy_(y)
        key = self._key() if self.capture and self.failed is None else None
        if self.graph is not None and key != self.key:
            self.graph = None  # what the step computes changed: eager once, then a new graph
        if key is not None and key == self.key and (self.graph is not None or self._capture()):
            self.graph.replay()
            self.trainer.step_count += 1  # what the step's Python part does
            return self.readback.clone()
        self.key = key
        return self._eager()

    def _eager(self) -> torch.Tensor:
        mode = ReadBacks(self.device, stand_in=False)
        with mode, torch.profiler.record_function(SCOPE):  # what a capture would hold
            self.trainer.step(self.f)
        if mode.loss is None:
            raise PBInputError("the step read no loss back to the host; CapturedStep returns "
                               "the step's read-back value (its loss)")
        return mode.loss.clone()

    def _capture(self) -> bool:
        release_scratch()
        mlp = getattr(self.layout.choice, "mlp_inplace", None)
        if mlp is not None:
            mlp.scratch = {}
        graph = torch.cuda.CUDAGraph()
        mode = ReadBacks(self.device, stand_in=True)
        count = self.trainer.step_count
        try:
            if hasattr(graph, "register_generator_state"):  # torch >= 2.5
                graph.register_generator_state(self.trainer.generator)
            with torch.cuda.graph(graph), mode:
                self.trainer.step(self.f)
            if mode.loss is None:
                raise RuntimeError("the step read no loss back")
        except Exception as e:  # noqa: BLE001 - any capture failure leaves eager steps
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self.failed = f"{type(e).__name__}: {first}"
            warnings.warn(f"CUDA graph capture of the step failed, running it eagerly: "
                          f"{self.failed}", RuntimeWarning, stacklevel=3)
            return False
        finally:
            self.trainer.step_count = count  # the capture ran the Python part once, no kernels
        self.graph, self.readback = graph, mode.loss
        return True


class CapturedSteps(RunHooks):
    """The run loop's mask-training steps taken by one :class:`CapturedStep` (a hook of
    :func:`pbscale.runs.loop.run`, :meth:`pbscale.runs.contracts.RunHooks.masks_step`): step i's
    batch from ``task.batch(order, i)`` copied into the static buffers, the step replayed from its
    graph, and its training loss, the read-back sum of the n sampled losses over n, returned as
    a 0-dim device tensor that the loop reads when the epoch ends.

    ``task``: a task with ``batch(order, i)`` and ``layout`` (:class:`pbscale.pruning.task.
    PruneTask`, supermask); ``trainer``: its MC :class:`pbscale.methods.MaskTrainer`. The
    :class:`CapturedStep` is made at the first step, after a resumed run's checkpoint has been
    loaded (it moves the optimizer's step counter to the device). ``capture=False``: the same
    flow, eagerly (how the CPU tests check it)."""

    def __init__(self, task: Any, trainer: Any, capture: bool = True) -> None:
        if not trainer.family.caps.captures_step:
            raise PBInputError(f"{trainer.family.text} steps are not captured (its step reads "
                               f"back more than its sampled losses); run it without the "
                               f"cuda_graph route")
        self.task, self.trainer, self.capture = task, trainer, capture
        self.step: CapturedStep | None = None

    def masks_step(self, order: torch.Tensor, i: int) -> torch.Tensor:
        x, y = self.task.batch(order, i)
        if self.step is None:
            self.step = CapturedStep(self.trainer, self.task.layout, x, y,
                                     self.task.objective.per_mask, capture=self.capture)
        return self.step(x, y) / self.trainer.config.n
