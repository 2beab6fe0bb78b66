"""The mask schedules and top-k rules every mask method shares, one definition each: the kept
fraction and its count (:func:`check_fraction`, :func:`keep_count`), the global top-k of MP and
GMP (:func:`ranking`; :func:`keep_top`, a count: of weight magnitudes in
:func:`global_magnitude_masks`, `sec:app_joint_pruning_setup`; :func:`keep_within`, a budget:
of channel scores, :class:`pbscale.methods.cuts.MagnitudeMethod`; :func:`keep_budget`, the mask
a joint L0 run freezes under ``--budget``), GMP's cubic schedule
(:func:`gmp_fraction`, Zhu and Gupta), the per-layer top-k of edge-popup over weights
(:func:`kept_per_layer`, :func:`top_scores`; over channels: :func:`keep_within`), and the
bookkeeping of binary masks over weights (:func:`apply_masks_`, :func:`remaining`).

Masks here are dicts {parameter name: 0/1 tensor of the weight's shape} or flat vectors (d,);
"remaining" is counted over the masked tensors only. :func:`global_magnitude_masks` keeps
exactly ``round(fraction * d)`` weights (ties broken by position), never bringing back a weight
already pruned; the caller keeps pruned weights at zero with :func:`apply_masks_` after every
optimizer step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch

from pbexact.errors import PBInputError


def check_fraction(fraction: float) -> float:
    """A target fraction of remaining weights must lie in (0, 1]."""
    if not (isinstance(fraction, (int, float)) and math.isfinite(fraction)
            and 0 < fraction <= 1):
        raise PBInputError(f"target fraction of remaining weights must be in (0, 1], got "
                           f"{fraction}; e.g. --target 0.1 keeps 10%")
    return float(fraction)


def keep_count(fraction: float, d: int) -> int:
    """Number of weights kept at ``fraction`` of d: round(fraction * d), at least 1."""
    return max(1, min(d, int(round(check_fraction(fraction) * d))))


def ranking(scores: torch.Tensor, alive: torch.Tensor | None = None) -> torch.Tensor:
    """The order MP, GMP and edge-popup keep entries in: the positions of the ``scores`` (d,)
    (nonnegative where ``alive`` is given) from the largest down, those off in ``alive`` (bool
    (d,); None: all on) after every one on, ties towards the lower position (a stable sort);
    int64 (d,)."""
    if alive is not None:
        scores = torch.where(alive, scores, torch.full_like(scores, -1.0))
    return torch.sort(scores, descending=True, stable=True).indices


def _prefix(order: torch.Tensor, k: int) -> torch.Tensor:
    keep = torch.zeros(order.numel(), dtype=torch.bool, device=order.device)
    keep[order[:k]] = True
    return keep


def keep_top(scores: torch.Tensor, fraction: float, alive: torch.Tensor | None = None
             ) -> torch.Tensor:
    """The global top-k of MP and GMP: a bool mask (d,) keeping the first
    ``keep_count(fraction, d)`` of :func:`ranking` (the largest |w| where ``scores`` are weight
    magnitudes), so the count is exact; entries off in ``alive`` come last, so a mask cut
    again only shrinks as long as the fraction does."""
    return _prefix(ranking(scores, alive), keep_count(fraction, scores.numel()))


#: What a budget of a cost is measured by: bool keep masks (n, d) -> the fraction (n,) of the
#: cost each keeps, float64, nondecreasing as entries are added (over channel variables
#: :meth:`pbscale.nets.channel_layout.ChannelLayout.kept_fractions` of the run's ``--cost``).
KeptFraction = Callable[[torch.Tensor], torch.Tensor]
#: Round-off allowed when a kept fraction is compared with its budget (:func:`fill_within`).
FRACTION_ROUNDOFF = 1e-12
#: Entries of the keep masks :func:`fill_within` tries at once (chunk x d).
FILL_CELLS = 1 << 20


def keep_within(scores: torch.Tensor, fraction: float, kept_fraction: KeptFraction,
                alive: torch.Tensor | None = None, groups: torch.Tensor | None = None
                ) -> torch.Tensor:
    """The budgeted top of MP, GMP and edge-popup over channel variables: a bool mask (d,)
    filled along :func:`ranking` of ``scores`` within ``fraction`` of a cost
    (:func:`fill_within`), never keeping one off in ``alive`` (so a mask cut again only
    shrinks).

    ``groups`` (int64 (m, L): the variables of m coupled groups, each row padded with d; see
    :meth:`pbscale.nets.channel_layout.ChannelLayout.coupled_index`) sets a floor: the cut never
    empties a group that has a variable on in ``alive``. Where the fill would, that group's
    first variable in the ranking is kept whatever its cost, ahead of the fill, which is redone
    (:func:`fill_within`'s ``forced``), until no group is emptied (at most m redos). A fill
    that empties no group is returned as it is, so the floor changes no cut that needs none."""
    order = ranking(scores, alive)
    candidates = order.numel() if alive is None else int(alive.sum())
    keep = fill_within(order, candidates, fraction, kept_fraction)
    if groups is None or not groups.numel():
        return keep
    d = order.numel()
    pad = torch.zeros(1, dtype=torch.bool, device=keep.device)
    on = torch.ones(d, dtype=torch.bool, device=keep.device) if alive is None else alive
    held = torch.cat([on, pad])[groups].any(-1)  # groups the floor protects
    rank = torch.empty(d + 1, dtype=torch.int64, device=order.device)
    rank[order] = torch.arange(d, device=order.device)
    rank[d] = d  # the padding ranks last
    floor = torch.zeros(d, dtype=torch.bool, device=keep.device)
    while True:
        empty = held & ~torch.cat([keep, pad])[groups].any(-1)
        if not bool(empty.any()):
            return keep
        rows = groups[empty]
        floor[rows.gather(1, rank[rows].argmin(1, keepdim=True)).squeeze(1)] = True
        first = torch.sort((~floor[order]).to(torch.int8), stable=True).indices
        keep = fill_within(order[first], candidates, fraction, kept_fraction,
                           forced=int(floor.sum()))


def fill_within(order: torch.Tensor, candidates: int, fraction: float,
                kept_fraction: KeptFraction, forced: int = 1) -> torch.Tensor:
    """The greedy rule of a knapsack: a bool mask (d,) that takes the first ``candidates``
    positions of ``order`` (int64 (d,)) in that order, each one whose addition keeps
    ``kept_fraction`` at most ``fraction``, and skips the others; the first ``forced`` (at
    least 1) are kept whatever they cost. ``kept_fraction`` maps bool keep masks (n, d) to the
    fraction (n,) of a cost each keeps, nondecreasing as entries are added: so an entry that
    does not fit never fits later, and one pass decides. The longest prefix that fits is found
    by bisection (about log2 d calls), the rest in chunks of masks (one call per chunk and per
    entry taken; memory O(:data:`FILL_CELLS`))."""
    check_fraction(fraction)
    budget = fraction + FRACTION_ROUNDOFF

    def fits(keep: torch.Tensor) -> bool:
        return bool(kept_fraction(keep[None])[0] <= budget)

    hi = max(1, candidates)
    lo = min(max(1, forced), hi)
    while lo < hi:  # the longest fitting (or forced) prefix lies in [lo, hi]; lo qualifies
        mid = (lo + hi + 1) // 2
        if fits(_prefix(order, mid)):
            lo = mid
        else:
            hi = mid - 1
    keep = _prefix(order, lo)
    rest = order[lo + 1:candidates]  # order[lo] did not fit (or there is none)
    chunk = max(1, FILL_CELLS // max(1, order.numel()))
    while rest.numel():
        part = rest[:chunk]
        trial = keep.expand(part.numel(), -1).clone()
        trial[torch.arange(part.numel(), device=trial.device), part] = True
        ok = (kept_fraction(trial) <= budget).nonzero()
        if ok.numel():  # the first that fits is taken; those before it never fit again
            j = int(ok[0, 0])
            keep[part[j]] = True
            rest = rest[j + 1:]
        else:
            rest = rest[part.numel():]
    return keep


def budget_order(mask: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """The order ``--budget`` keeps variables in: the positions on in ``mask`` (d,) by
    ``scores`` (d,) from the largest down, then those off, by ``scores`` too; ties towards the
    lower position. int64 (d,)."""
    by_score = torch.sort(scores, descending=True, stable=True).indices
    on_first = torch.sort((mask[by_score] != 0).to(torch.int8), descending=True,
                          stable=True).indices
    return by_score[on_first]


def keep_budget(mask: torch.Tensor, scores: torch.Tensor, fraction: float,
                kept_fraction: KeptFraction | None = None) -> torch.Tensor:
    """The mask (d,) that ``--budget`` freezes, bool: ``mask``'s variables and then the others,
    each group by ``scores`` (:func:`budget_order`), taken while they fit within ``fraction``
    (:func:`fill_within` of ``kept_fraction``, the channels' cost) or, without
    ``kept_fraction`` (weights, one cost each), the first :func:`keep_count` of them. So a
    mask within the budget keeps its variables and gains the best-scored others that fit, one
    over it loses its worst-scored."""
    order = budget_order(mask, scores)
    if kept_fraction is None:
        return _prefix(order, keep_count(fraction, order.numel()))
    return fill_within(order, order.numel(), fraction, kept_fraction)


def global_magnitude_masks(weights: Mapping[str, torch.Tensor], fraction: float,
                           masks: Mapping[str, torch.Tensor] | None = None,
                           ) -> dict[str, torch.Tensor]:
    """Global magnitude masks keeping the ``keep_count(fraction, d)`` largest |w| over all
    tensors (d = total size; :func:`keep_top` of the flat |w| in float32); weights pruned in
    ``masks`` rank below every unpruned weight, so masks only shrink as long as the fraction
    does. Ties are broken towards the lower flat position (a stable sort), so the count is
    exact."""
    names = list(weights)
    flat = torch.cat([weights[k].detach().reshape(-1).abs().float() for k in names])
    alive = (None if masks is None
             else torch.cat([masks[k].reshape(-1).bool() for k in names]))
    keep = keep_top(flat, fraction, alive)
    out, pos = {}, 0
    for name in names:
        n = weights[name].numel()
        out[name] = keep[pos:pos + n].view_as(weights[name]).to(weights[name].dtype)
        pos += n
    return out


def gmp_fraction(step: int, start: int, end: int, final: float, initial: float = 1.0) -> float:
    """Fraction of weights remaining at ``step`` under Zhu and Gupta's cubic schedule: sparsity
    s_t = s_f + (s_i - s_f) (1 - (t - t0) / (t_end - t0))^3 between ``start`` and ``end``
    (s = 1 - fraction), ``initial`` before ``start`` and ``final`` from ``end`` on."""
    check_fraction(final)
    if step <= start:
        return initial
    if step >= end or end <= start:
        return final
    s_i, s_f = 1.0 - initial, 1.0 - final
    s = s_f + (s_i - s_f) * (1.0 - (step - start) / (end - start)) ** 3
    return 1.0 - s


@torch.no_grad()
def apply_masks_(params: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> None:
    """Zero the pruned weights in place (after every optimizer step, so they stay zero)."""
    for k, m in masks.items():
        params[k].mul_(m)


def remaining(masks: Mapping[str, torch.Tensor]) -> tuple[int, int]:
    """(weights kept, weights masked) over all masked tensors."""
    kept = sum(int(m.count_nonzero()) for m in masks.values())
    return kept, sum(m.numel() for m in masks.values())


def kept_per_layer(layers: Sequence[int], target: float) -> list[int]:
    """Weights kept per layer by edge-popup: round(target * d_layer) for each layer size."""
    return [round(target * size) for size in layers]


def top_scores(scores: torch.Tensor, layers: Sequence[int], target: float) -> torch.Tensor:
    """0/1 mask (d,) keeping the round(target d_layer) largest scores of each layer (layers:
    sizes summing to d, in the order of the flat vector); scores (G, d) give each row's."""
    if scores.dim() > 1:
        return torch.stack([top_scores(s, layers, target) for s in scores])
    z = torch.zeros_like(scores)
    start = 0
    for size, k in zip(layers, kept_per_layer(layers, target)):
        if k:
            idx = torch.topk(scores[start:start + size], k, sorted=False).indices
            z[start + idx] = 1.0
        start += size
    return z
