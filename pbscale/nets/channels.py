"""Structured (channel) pruning's core: the pseudo-Boolean variables are the channels of the
coupled groups that Torch-Pruning's dependency graph finds, masked during optimisation and
physically removed at the end.

A *coupled group* is a Conv/Linear layer's output channels together with everything they are
tied to: its BatchNorm, the next layers' input channels, channels tied by residual additions,
depthwise convolutions and concatenations. :func:`channel_groups` gives one binary variable per
channel of each coupled group (:class:`ChannelGroup`); a grouped convolution (groups g > 1,
not depthwise) can only lose the same positions in each of its g blocks, so the channels at one
position of every block share one variable (a variable then holds g channels, possibly of
several coupled groups). A coupled group whose channels reach the network's output (the head)
is never pruned, nor one touching a layer named in ``leave_out``, nor one whose ties leave a
single variable (removing it would remove every channel).

Masking the variables with z = 0 (:func:`mask_parameters`, :func:`masked_parameters`) zeroes
their output slices (Conv/Linear weight rows and bias, BatchNorm weight and bias and running
mean); :func:`remove_channels` removes them with Torch-Pruning's pruning functions (the tensors
shrink, input slices of the consumers included). The two compute the same outputs wherever the
operations between a producer and its consumers map 0 to 0 (ReLU, tanh, GELU, pooling, sums and
concatenations of masked channels, BatchNorm in eval or train mode); :func:`channel_groups`
checks that on the example inputs and refuses, in one line, a layer for which it fails.

Costs (parameters, MACs per example) follow :mod:`.channel_costs`; masking, removal and the
groups.json record live in :mod:`.channel_ops` (re-exported here). Torch-Pruning is imported
inside the functions (the ``structured`` extra): importing this module does not need it.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from pbexact.errors import PBInputError

from .channel_costs import CostTable, Inputs, TensorCost, as_args, axis, count, positions
from .channel_ops import (
    flat_outputs,
    groups_record,
    mask_parameters,
    masked_parameters,
    multiplier,
    remove_channels,
    same_outputs,
)
from .channel_types import ChannelGroup, ChannelGroups, Coupled, Expansion, Member, RemovalOp, Slice

__all__ = ["ChannelGroup", "ChannelGroups", "Coupled", "Expansion", "Member", "Slice",
           "channel_groups", "groups_record", "mask_parameters", "masked_parameters",
           "multiplier", "remove_channels", "same_outputs"]


def _slots(module: nn.Module, kind: str) -> list[tuple[str, int, str, int]]:
    """(tensor attribute, dim, role, divisor) that the channels of ``module`` on side ``kind``
    index; divisor g: g channels make one slice (a grouped convolution's input)."""
    conv = isinstance(module, nn.modules.conv._ConvNd)
    if isinstance(module, nn.Linear) or conv:
        bias = [("bias", 0, "out", 1)] if module.bias is not None else []
        if kind == "out":
            return [("weight", 1 if conv and module.transposed else 0, "out", 1)] + bias
        if conv and module.transposed:
            return [("weight", 0, "in", 1)]
        return [("weight", 1, "in", module.groups if conv else 1)]
    if isinstance(module, (nn.modules.batchnorm._BatchNorm,
                           nn.modules.instancenorm._InstanceNorm)):
        out = [(s, 0, "out", 1) for s in ("weight", "bias") if module.affine]
        return out + [(s, 0, "buffer", 1) for s in ("running_mean", "running_var")
                      if getattr(module, s, None) is not None]
    if isinstance(module, nn.PReLU):
        return [("weight", 0, "out", 1)] if module.num_parameters > 1 else []
    return []


def _fix(name: str) -> str:
    return f"leave it out: --masked without it (leave_out=('{name}',))"


def _check_layer(name: str, module: nn.Module, root: str) -> None:
    """Refuse, in one line, a layer whose channels this module cannot remove exactly."""
    conv = isinstance(module, nn.modules.conv._ConvNd)
    ok = conv or isinstance(module, (nn.Linear, nn.modules.batchnorm._BatchNorm, nn.PReLU,
                                     nn.modules.instancenorm._InstanceNorm))
    why = f"{type(module).__name__} is not supported"
    if isinstance(module, (nn.LayerNorm, nn.GroupNorm)):
        why = f"{type(module).__name__} normalises over the channels, so masking != removing"
        ok = False
    if conv and module.transposed and module.groups > 1:
        ok, why = False, "a grouped transposed convolution is not supported"
    if (conv and module.groups == module.out_channels and module.groups > 1
            and module.in_channels != module.groups):
        ok, why = False, "a depthwise convolution with several inputs per group is not supported"
    if not ok:
        raise PBInputError(f"layer '{name}' is coupled to the channels of '{root}' and they "
                           f"cannot be removed ({why}); {_fix(name)}")


class _Union:
    def __init__(self) -> None:
        self.parent: dict = {}

    def find(self, k):
        self.parent.setdefault(k, k)
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def union(self, a, b) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb, key=repr)] = min(ra, rb, key=repr)


_FROZEN = (-1, -1)


def _trace(model: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[object, list]:
    """Torch-Pruning's dependency graph of ``model`` and its coupled groups rooted at Conv and
    Linear layers (parameters are made trainable, and the mode restored, around the trace)."""
    import torch_pruning as tp

    saved = [(p, p.requires_grad) for p in model.parameters()]
    was = model.training
    try:
        for p, _ in saved:
            p.requires_grad_(True)
        with warnings.catch_warnings(), torch.enable_grad():
            warnings.simplefilter("ignore")
            dg = tp.DependencyGraph().build_dependency(
                model, example_inputs=args, forward_fn=lambda m, a: m(*a), verbose=False)
            found = list(dg.get_all_groups(
                root_module_types=(tp.ops.TORCH_CONV, tp.ops.TORCH_LINEAR)))
    except Exception as e:  # Torch-Pruning's own errors name no layer, only the problem
        what = (str(e).strip().splitlines() or [""])[0][:200]
        raise PBInputError(f"Torch-Pruning cannot trace the network ({type(e).__name__}: "
                           f"{what}); make forward return the output tensors, computed from the "
                           "inputs with gradients (no torch.no_grad, .detach(), .item())") from None
    finally:
        for p, r in saved:
            p.requires_grad_(r)
        model.train(was)
    return dg, found


def _output_layers(model: nn.Module, args: tuple[torch.Tensor, ...]) -> set[str]:
    """Layers whose output tensor is (one of) the network's outputs."""
    seen: dict[int, str] = {}
    alive: list[torch.Tensor] = []  # held, so that no id is reused within the pass
    names = {m: n for n, m in model.named_modules()}

    def hook(module: nn.Module, inputs: tuple, output: object) -> None:
        if isinstance(output, torch.Tensor):
            alive.append(output)
            seen.setdefault(id(output), names[module])

    handles = [m.register_forward_hook(hook) for m in model.modules() if m is not model]
    was = model.training
    try:
        with torch.no_grad():
            outs = flat_outputs(model.eval()(*args))
        return {seen[id(t)] for t in outs if id(t) in seen}
    finally:
        model.train(was)
        for h in handles:
            h.remove()


def _names(model: nn.Module, given: str | Sequence[str] | None, what: str) -> tuple[str, ...]:
    if given is None:
        return ()
    given = (given,) if isinstance(given, str) else tuple(given)
    mods = dict(model.named_modules())
    params = dict(model.named_parameters())
    out = []
    for g in given:
        if g in params and g not in mods:
            g = g.rpartition(".")[0]
        if g not in mods or g == "":
            some = ", ".join(n for n, _ in list(model.named_modules())[1:6])
            raise PBInputError(f"{what} names no layer '{g}' of the network; give module "
                               f"names such as {some}")
        out.append(g)
    return tuple(out)


def channel_groups(model: nn.Module, example_inputs: Inputs, *,
                   head: str | Sequence[str] | None = None, leave_out: Sequence[str] = (),
                   check: bool = True) -> ChannelGroups:
    """The channel variables of ``model`` traced on ``example_inputs`` (a tensor or a tuple of
    the forward's positional tensors, batch first; a batch of 1 gives MACs per example as
    any other).

    ``head``: layer name(s) whose output channels are never pruned, on top of every group
    that reaches the network's output (found from the graph). ``leave_out``: layer (or
    parameter) names whose tensors stay untouched: every coupled group touching them is left
    out (a container's name leaves out every layer in it). ``check``: remove a fixed random
    half of each group's variables and compare, on the example inputs, the masked network
    with the pruned one; a mismatch or an error raises :class:`PBInputError` naming the root
    layer of the group (the fix: leave it out).
    Raises :class:`PBInputError` (one line, naming the layer and the fix) for a network
    Torch-Pruning cannot trace or a layer whose channels cannot be removed."""
    from torch_pruning.ops import OPTYPE

    args = as_args(example_inputs)
    heads = _names(model, head, "head")
    leave = _names(model, leave_out, "leave_out")
    names = {m: n for n, m in model.named_modules()}
    mods = dict(model.named_modules())
    ran = positions(model, args)
    at_output = _output_layers(model, args)
    dg, found = _trace(model, args)

    def left(n: str) -> bool:
        return any(n == g or n.startswith(g + ".") for g in leave)

    for n in ran:
        if mods[n] not in dg.module2node and not left(n):
            raise PBInputError(
                f"layer '{n}' runs but Torch-Pruning's trace from the output does not reach it "
                "(torch.no_grad, .detach() or a non-differentiable output such as argmax in "
                f"forward); return the differentiable output, or {_fix(n)}")
    shared: dict[int, list[str]] = {}
    for pn, p in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(p), []).append(pn.rpartition(".")[0])
    tied = {m: ms for ms in shared.values() if len(set(ms)) > 1 for m in ms}
    kept: list[tuple[str, list]] = []
    skipped: list[str] = []
    rank = {n: i for i, n in enumerate(mods)}
    for g in found:
        outs = [names[it.dep.target.module] for it in g
                if isinstance(it.dep.target.module, (nn.Linear, nn.modules.conv._ConvNd))
                and it.dep.handler.__name__ == "prune_out_channels"]
        root = min(outs, key=rank.__getitem__) if outs else "?"
        items, reach = [], False
        for it in g:
            node, m = it.dep.target, it.dep.target.module
            if node.type == OPTYPE.OUTPUT:
                reach = True
                continue
            if isinstance(m, nn.Parameter):
                raise PBInputError(f"a parameter of shape {tuple(m.shape)} used outside a "
                                   f"layer is coupled to the channels of '{root}'; "
                                   f"{_fix(root)}")
            if m not in names:
                continue
            kind = "in" if it.dep.handler.__name__ == "prune_in_channels" else "out"
            reach = reach or (kind == "out" and (not node.outputs or names[m] in at_output))
            items.append((names[m], kind, list(it.idxs), list(it.root_idxs)))
        touched = {n for n, *_ in items}
        if reach or any(n in heads and k == "out" for n, k, *_ in items):
            skipped.append(f"{root}: its channels are the network's output (head)")
        elif any(left(n) for n in touched):
            skipped.append(f"{root}: left out ({', '.join(n for n in sorted(touched) if left(n))})")
        else:
            for n in sorted(touched):
                _check_layer(n, mods[n], root)
                if n in tied:
                    raise PBInputError(
                        f"layer '{n}' shares a parameter with '{[t for t in tied[n] if t != n][0]}'"
                        f" (tied) and removing channels would untie them; {_fix(n)}")
            kept.append((root, items))
    kept.sort(key=lambda ri: rank.get(ri[0], len(rank)))
    return _assemble(model, args, kept, skipped, heads, leave, ran, check)


def _assemble(model, args, kept, skipped, heads, leave, ran, check) -> ChannelGroups:
    """Ties, variables, slices, costs and masks of the kept coupled groups."""
    mods = dict(model.named_modules())
    uf = _Union()
    side: dict[tuple[str, str], list[tuple[int, tuple[int, int]]]] = {}
    for gi, (_, items) in enumerate(kept):
        for n, kind, idxs, roots in items:
            for a, r in zip(idxs, roots):
                uf.find((gi, r))
                side.setdefault((n, kind), []).append((a, (gi, r)))
    for (n, kind), pairs in side.items():
        if len({a for a, _ in pairs}) != len(pairs):
            raise PBInputError(f"layer '{n}': Torch-Pruning maps two coupled channels to one "
                               f"of its {kind}put channels; {_fix(n)}")
        m = mods[n]
        if (isinstance(m, nn.modules.conv._ConvNd) and m.groups > 1
                and not m.groups == m.out_channels == m.in_channels):
            size = m.out_channels if kind == "out" else m.in_channels
            block = size // m.groups
            cls: dict[int, list] = {}
            for a, k in pairs:
                cls.setdefault(a % block, []).append(k)
            for c in range(block):
                ks = cls.get(c, [])
                for k in ks[1:]:
                    uf.union(ks[0], k)
                if len(ks) < m.groups:
                    for k in ks:
                        uf.union(k, _FROZEN)
    keys = [sorted({(gi, r) for _, _, _, roots in items for r in roots})
            for gi, (_, items) in enumerate(kept)]
    changed = True
    while changed:
        changed = False
        for ks in keys:
            cl = {uf.find(k) for k in ks}
            if len(cl) == 1 and uf.find(_FROZEN) not in cl:
                uf.union(ks[0], _FROZEN)
                changed = True
    frozen = uf.find(_FROZEN)
    order: dict = {}
    for ks in keys:
        for k in ks:
            c = uf.find(k)
            if c != frozen and c not in order:
                order[c] = len(order)
    d = len(order)
    var = {k: order[uf.find(k)] for ks in keys for k in ks if uf.find(k) != frozen}
    # members per variable, removal ops, slices
    per_var: list[dict[tuple[str, str], list[int]]] = [{} for _ in range(d)]
    var_coupled: list[set[int]] = [set() for _ in range(d)]
    roots_of: list[list[tuple[str, int]]] = [[] for _ in range(d)]
    coupled = []
    for gi, (root, items) in enumerate(kept):
        vs = sorted({var[k] for k in keys[gi] if k in var})
        if not vs:
            skipped.append(f"{root}: grouped convolutions tie all its channels together")
        members = tuple(Member(n, kind, tuple(idxs)) for n, kind, idxs, _ in items)
        coupled.append(Coupled(root, members, tuple(vs), any(k not in var for k in keys[gi])))
        for n, kind, idxs, roots in items:
            for a, r in zip(idxs, roots):
                v = var.get((gi, r))
                if v is None:
                    continue
                per_var[v].setdefault((n, kind), []).append(a)
                var_coupled[v].add(gi)
                if n == root and kind == "out":
                    roots_of[v].append((root, a))
    ops = tuple(RemovalOp(n, kind, tuple(a for a, k in pairs if k in var),
                    tuple(var[k] for a, k in pairs if k in var))
                for (n, kind), pairs in side.items() if any(k in var for _, k in pairs))
    costs = _costs(model, mods, ops, d, ran, args)
    p_cost, m_cost = costs.single("params"), costs.single("macs")
    groups = []
    for v in range(d):
        slices = []
        for (n, kind), chans in sorted(per_var[v].items()):
            m = mods[n]
            for a in sorted(chans):
                for attr, dim, role, div in _slots(m, kind):
                    rows = None
                    if div > 1:
                        per_in, per_out = m.in_channels // div, m.out_channels // div
                        rows = (a // per_in * per_out, (a // per_in + 1) * per_out)
                        a_ = a % per_in
                    else:
                        a_ = a
                    slices.append(Slice(f"{n}.{attr}", dim, a_, role, rows))
        by_root: dict[str, list[int]] = {}
        for r, a in roots_of[v]:
            by_root.setdefault(r, []).append(a)
        name = "+".join(f"{r}[{','.join(map(str, sorted(a)))}]" for r, a in by_root.items())
        groups.append(ChannelGroup(
            v, name, tuple(sorted(var_coupled[v])),
            tuple(Member(n, k, tuple(sorted(c))) for (n, k), c in sorted(per_var[v].items())),
            tuple(slices), int(p_cost[v]), int(m_cost[v])))
    expansions, buffers = _expansions(model, mods, ops, d)
    out = ChannelGroups(tuple(groups), tuple(coupled), tuple(skipped), heads, leave,
                        expansions, buffers, ops, costs)
    if check and d:
        _verify(model, out, args)
    return out


def _costs(model, mods, ops, d, ran, args) -> CostTable:
    dense_params, dense_macs = count(model, args)
    axes: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for op in ops:
        m = mods[op.module]
        for attr, dim, role, div in _slots(m, op.kind):
            if role == "buffer":
                continue
            acc: dict[int, int] = {}
            for v in op.variables:
                acc[v] = acc.get(v, 0) + 1
            for v, c in acc.items():
                if c % div:
                    raise PBInputError(f"layer '{op.module}': a variable holds {c} input "
                                       f"channels of its {div} groups; {_fix(op.module)}")
                axes.setdefault((f"{op.module}.{attr}", dim), []).append((v, c // div))
    params = dict(model.named_parameters())
    tensors = []
    for pn in sorted({pn for pn, _ in axes}):
        p = params[pn]
        dims = sorted(dm for q, dm in axes if q == pn)
        full = [p.shape[dm] for dm in dims]
        mod, _, attr = pn.rpartition(".")
        pos = ran.get(mod, 0) if attr == "weight" and isinstance(
            mods[mod], (nn.Linear, nn.modules.conv._ConvNd)) else 0
        tensors.append(TensorCost(pn, p.numel() // int(np.prod(full)),
                                  tuple(axis(f, axes[(pn, dm)]) for f, dm in zip(full, dims)),
                                  1, int(pos)))
    return CostTable(d, dense_params, dense_macs, tuple(tensors))


def _expansions(model, mods, ops, d) -> tuple[tuple[Expansion, ...], tuple[Expansion, ...]]:
    tensors = dict(model.named_parameters())
    tensors.update(dict(model.named_buffers()))
    idx: dict[tuple[str, int, bool], torch.Tensor] = {}
    for op in ops:
        for attr, dim, role, _ in _slots(mods[op.module], op.kind):
            if role == "in" or attr == "running_var":
                continue
            key = (f"{op.module}.{attr}", dim, role == "buffer")
            if key not in idx:
                idx[key] = torch.full((tensors[key[0]].shape[dim],), d, dtype=torch.int64)
            idx[key][list(op.channels)] = torch.tensor(op.variables, dtype=torch.int64)
    ex = tuple(Expansion(p, dm, i) for (p, dm, b), i in idx.items() if not b)
    bu = tuple(Expansion(p, dm, i) for (p, dm, b), i in idx.items() if b)
    return ex, bu


def _verify(model: nn.Module, groups: ChannelGroups, args: tuple[torch.Tensor, ...]) -> None:
    """Masked == removed on the example inputs, for a fixed random keep mask; the first coupled
    group that fails alone is named."""
    gen = torch.Generator().manual_seed(0)
    base = torch.rand(groups.d, generator=gen) < 0.5
    for c in groups.coupled:
        if c.variables and not bool(base[list(c.variables)].any()):
            base[c.variables[0]] = True

    def fails(keep: torch.Tensor) -> bool:
        was = model.training
        try:
            masked = copy.deepcopy(model)
            mask_parameters(masked, groups, keep)
            pruned = remove_channels(model, groups, keep)
            with torch.no_grad():
                return not same_outputs(masked.eval()(*args), pruned.eval()(*args))
        except PBInputError:
            raise
        except Exception:
            return True
        finally:
            model.train(was)

    if not fails(base):
        return
    for c in groups.coupled:
        if not c.variables:
            continue
        keep = torch.ones(groups.d, dtype=torch.bool)
        keep[list(c.variables)] = base[list(c.variables)]
        if fails(keep):
            raise PBInputError(
                f"removing channels of layer '{c.root}' does not compute what masking them "
                "computes (an operation between it and its consumers maps 0 to nonzero, or "
                f"Torch-Pruning maps its channels wrongly); {_fix(c.root)}")
    raise PBInputError("removing channels does not compute what masking them computes, "
                       "though each coupled group alone does; leave some layers out "
                       "(--masked, leave_out=)")


