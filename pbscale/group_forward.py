"""The masks of G pruning runs through their own networks in one computation
(:class:`GroupForward`), and the probe-and-replay step that lets every method of the registry
feed it (:class:`ReplayStep`).

Each run of a group (:mod:`pbscale.prune_group`) has its own network weights (its seed's
initialization, trained in joint mode), its own minibatch and its own masks. For networks the
MLP paths run (:func:`pbscale.backends.mlp_plan`: LeNet-300-100) :class:`GroupForward` evaluates
the K masks of each of the G runs as one stack of G K masked networks: the first Linear is one
product batched over the G runs (each run's K masked weights on its own inputs, (G, K out, in) @
(G, in, B)), every later Linear one product batched over the G K masks, biases and BatchNorm per
run; the cross-entropy of all G K B rows is one call. Other networks (conv nets) run the members'
forwards one after another (:meth:`pbscale.masks.MaskedModule.loss_fn` each), so a group of
them shares the process but not the forward.

A method's step (:meth:`pbscale.loop_types.Method.surrogate`) calls its batched loss f itself,
one or more times (MC: n / chunk calls; CP: soft and hard mask stacked; ST-theta: n relaxed
masks), so the G methods' masks are collected first: :class:`ReplayStep`

1. *probes* each member: its surrogate runs with a stand-in f that records the masks it is given
   and answers zeros, its random generator saved before and restored after (every method draws
   its masks from its own generator and r only, never from J); a member whose family
   ``replays_samples`` (the MC estimators) keeps the advanced generator instead, and its replay
   takes the recorded masks (:data:`pbscale.loop_types.SAMPLES_ATTR`) rather than drawing them
   a second time;
2. evaluates all recorded masks of all members in one :class:`GroupForward` (rows of one call
   are independent: each mask's loss depends on that mask alone), and, where a mask was
   differentiable (relaxed masks), the gradient of each row's loss in its mask by one backward
   pass;
3. *replays* each member's surrogate with an f that checks it is given the recorded masks
   (bitwise) and answers the computed losses, with the graph into the network weights (joint)
   and, for a differentiable mask z, the term sum((z - stop_grad(z)) * dJ/dz), whose value is 0
   and whose gradient in z is the computed one.

So each member's estimate, loss and weight gradient are those of the separate run, to the
round-off of the grouped products.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn import functional as F

from pbscale.batched import PerMaskLoss, cross_entropy_per_mask
from pbscale.loop_types import SAMPLES_ATTR
from pbscale.masks import MaskedModule

#: A member's batch: inputs (B, ...) and labels (B,).
Batch = tuple[torch.Tensor, torch.Tensor]


class GroupForward:
    """The loss per mask of G runs (``loss``: their task's, cross-entropy by default):
    ``self(zs, batches)`` with zs[g] (K_g, d) and batches[g] (x (B, ...), y (B, ...)) ->
    [(K_g,)], run g's masks through run g's layout (its weights, weight hook and training
    mode). One grouped computation when the loss is cross-entropy, every layout has an MLP plan
    and the K_g, the batch shapes and dtypes agree; else one forward per run."""

    def __init__(self, layouts: Sequence[MaskedModule],
                 loss: PerMaskLoss = cross_entropy_per_mask) -> None:
        self.layouts = list(layouts)
        self.loss = loss
        self.plans = [lay.choice.plan for lay in self.layouts]

    def members(self, part: slice) -> GroupForward:
        """The forward of the runs ``part`` of the group only (a memory-guard slice)."""
        return GroupForward(self.layouts[part], self.loss)

    def grouped(self, zs: Sequence[torch.Tensor], batches: Sequence[Batch]) -> bool:
        """Whether :meth:`__call__` takes the one grouped computation for these inputs."""
        x0 = batches[0][0]
        return (self.loss is cross_entropy_per_mask and all(p is not None for p in self.plans)
                and len({tuple(z.shape) for z in zs}) == 1 and zs[0].shape[0] > 0
                and all(x.shape == x0.shape and x.dim() == 2 and x.shape[0] > 1
                        and x.dtype == lay.dtype and z.dtype == lay.dtype
                        for (x, _), z, lay in zip(batches, zs, self.layouts)))

    def __call__(self, calls: Sequence[Sequence[torch.Tensor]], batches: Sequence[Batch]
                 ) -> list[torch.Tensor]:
        """calls[g]: the mask tensors (..., d) run g's step evaluates, in order -> each run's
        losses of all their rows, (K_g,). Off the grouped path each call is its own forward of
        its run's layout (as the separate run makes it: BatchNorm running statistics are
        updated once per call)."""
        zs = [torch.cat([c.reshape(-1, c.shape[-1]) for c in cs]) for cs in calls]
        if not self.grouped(zs, batches):
            return [torch.cat([lay.loss_fn(x, y, self.loss)(
                        c.reshape(-1, c.shape[-1])) for c in cs])
                    for lay, cs, (x, y) in zip(self.layouts, calls, batches)]
        G, K = len(zs), zs[0].shape[0]
        out = self.mlp(zs, torch.stack([x for x, _ in batches]))  # (G K, B, C)
        B = out.shape[1]
        y = torch.stack([y for _, y in batches])[:, None, :].expand(G, K, B).reshape(-1)
        per = F.cross_entropy(out.reshape(G * K * B, -1).float(), y, reduction="none")
        return list(per.view(G, K, B).mean(2).unbind(0))

    def mlp(self, zs: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The MLP plan over G runs: masks zs[g] (K, d), inputs x (G, B, in) -> (G K, B, out),
        autograd through masks and (trained) weights as :class:`pbscale.backends.MlpAutograd`."""
        lays = self.layouts
        G, K, B = len(zs), zs[0].shape[0], x.shape[1]
        mws = [lay.choice.mlp_autograd.weights for lay in lays]
        w_all = [mw.hooked(z) if lay.weight_hook is not None else z * mw.flat_base()
                 for mw, lay, z in zip(mws, lays, zs)]
        h = None  # (G K, B, features) once past the first Linear
        for j, step in enumerate(self.plans[0]):
            kind = step[0]
            if kind == "linear":
                w = torch.stack([mw.linear_weight(mw.plan[j], wa, K)
                                 for mw, wa in zip(mws, w_all)])  # (G, K, out, in)
                out_f, in_f = w.shape[2:]
                if h is None:  # each run's inputs shared by its K masks
                    h = torch.bmm(x, w.reshape(G, K * out_f, in_f).transpose(1, 2))
                    h = h.view(G, B, K, out_f).transpose(1, 2).reshape(G * K, B, out_f)
                else:
                    h = torch.bmm(h, w.reshape(G * K, out_f, in_f).transpose(1, 2))
                bname = step[3]
                if bname is not None:
                    bias = torch.stack([lay.base[bname] for lay in lays])  # (G, out)
                    h = h + bias.repeat_interleave(K, 0)[:, None, :]
            elif kind == "bn":
                m = step[1]
                C = h.shape[2]
                weight = bias = None
                if m.affine:
                    mods = [dict(lay.module.named_modules())[_module_name(lay, m)]
                            for lay in lays]
                    ws = [(q.weight, q.bias) if lays[0].train_weights
                          else (q.weight.detach(), q.bias.detach()) for q in mods]
                    weight = torch.cat([a.repeat(K) for a, _ in ws])
                    bias = torch.cat([b.repeat(K) for _, b in ws])
                flat = h.transpose(0, 1).reshape(B, G * K * C)
                h = F.batch_norm(flat, None, None, weight, bias, True, 0.0, m.eps)
                h = h.view(B, G * K, C).transpose(0, 1)
            else:
                h = step[1](h)
        return h


def _module_name(layout: MaskedModule, module: torch.nn.Module) -> str:
    """The name of ``module`` in the first layout's network (the same position in every run's
    network: the runs share the model)."""
    for name, m in layout.module.named_modules():
        if m is module:
            return name
    return ""


class _Probe:
    """A stand-in batched loss that records the masks it is given and answers zeros (with the
    masks' graph, so that a method's autograd calls run)."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []
        self.relaxed = False  # some mask it was given carries a gradient

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        self.calls.append(z.detach().clone())
        self.relaxed = self.relaxed or z.requires_grad
        return (z * 0).sum(-1)


class _Replay:
    """The batched loss a member's surrogate is replayed with: call c gets the losses of the
    masks recorded in call c (checked bitwise), with their graph into the weights and, for a
    differentiable mask, a zero-valued term carrying dJ/dz."""

    def __init__(self, calls: list[torch.Tensor], J: torch.Tensor,
                 grad: torch.Tensor | None, hand_over: bool = False) -> None:
        self.calls, self.J, self.grad = calls, J, grad
        self.index, self.row = 0, 0
        if hand_over:  # the masks, for a method that takes them instead of drawing
            setattr(self, SAMPLES_ATTR, torch.cat([c.reshape(-1, c.shape[-1]) for c in calls]))

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        if self.index >= len(self.calls) or not torch.equal(z.detach(), self.calls[self.index]):
            raise RuntimeError("a method's step drew other masks when replayed than when "
                               "probed; it cannot train in a pruning group")
        k = z.reshape(-1, z.shape[-1]).shape[0]
        rows = slice(self.row, self.row + k)
        self.index, self.row = self.index + 1, self.row + k
        J = self.J[rows].reshape(z.shape[:-1])
        if z.requires_grad and self.grad is not None:
            g = self.grad[rows].reshape(z.shape)
            J = J + ((z - z.detach()) * g).sum(-1)
        return J


class ReplayStep:
    """One training step of G methods with one :class:`GroupForward` (see the module
    docstring): ``self(methods, batches, weights)`` -> [(surrogate value, training loss)], each
    member's as its separate run computes it. ``rows``: the most masks evaluated at once (the
    memory guard: members are split into slices of whole members when G K exceeds it)."""

    def __init__(self, forward: GroupForward, rows: int) -> None:
        self.forward, self.rows = forward, max(int(rows), 1)

    def __call__(self, methods: Sequence, batches: Sequence[Batch], weights: bool
                 ) -> list[tuple[torch.Tensor, float]]:
        probes, relaxed = [], []
        hand_over = [m.family.replays_samples for m in methods]
        for m, keep in zip(methods, hand_over):
            probe, state = _Probe(), m.generator.get_state()
            m.surrogate(probe, weights=weights)
            if not keep:
                m.generator.set_state(state)
            probes.append(probe.calls)
            relaxed.append(probe.relaxed)
        J, grads = self.evaluate(probes, batches, relaxed, weights)
        return [m.surrogate(_Replay(calls, j, g, keep), weights=weights)
                for m, calls, j, g, keep in zip(methods, probes, J, grads, hand_over)]

    def evaluate(self, calls: list[list[torch.Tensor]], batches: Sequence[Batch],
                 relaxed: list[bool], weights: bool
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """Losses (K_g,) of every member's masks, with their graph into the weights when
        ``weights``, and dJ/dz (K_g, d) for the members whose masks are ``relaxed``."""
        K = sum(c.reshape(-1, c.shape[-1]).shape[0] for c in calls[0])
        per = max(self.rows // max(K, 1), 1)
        J: list[torch.Tensor] = []
        grads: list[torch.Tensor | None] = []
        for s in range(0, len(calls), per):
            part = slice(s, s + per)
            leaves = [[c.requires_grad_(r) for c in cs]
                      for cs, r in zip(calls[part], relaxed[part])]
            with torch.set_grad_enabled(weights or any(relaxed[part])):
                out = self.forward.members(part)(leaves, batches[part])
            g: list[torch.Tensor | None] = [None] * len(out)
            need = [i for i, r in enumerate(relaxed[part]) if r]
            if need:
                total = sum(out[i].sum() for i in need)
                found = torch.autograd.grad(total, [c for i in need for c in leaves[i]],
                                            retain_graph=weights)
                pos = 0
                for i in need:
                    n = len(leaves[i])
                    g[i] = torch.cat([v.reshape(-1, v.shape[-1]) for v in found[pos:pos + n]])
                    pos += n
            J += [o if weights else o.detach() for o in out]
            grads += g
        return J, grads
