"""The magnitude pruning baselines of the joint-pruning experiments
(`sec:app_joint_pruning_setup`, `tab:app_pruning_broad`) as methods without logits
(:class:`pbscale.methods.cuts.MaskFamily`): MP (Han et al., global one-shot), GMP (Zhu and
Gupta's cubic schedule, :func:`pbscale.methods.schedules.gmp_fraction`, global) and dense
training.

MP and GMP also prune channels (``--granularity channel``, beyond the paper): the same
schedules over the d channel variables, each scored by the squared L2 norm of the parameters
it removes per unit of its ``--cost`` (:meth:`pbscale.methods.cuts.MagnitudeMethod.
channel_scores`), ``--target`` the fraction of the prunable part's cost kept (a budget the
best-scored channels fill, :func:`pbscale.methods.schedules.keep_within`, never emptying a
coupled group). Dense training stays weight-only.
"""

from __future__ import annotations

from .cuts import CutSchedule, MaskFamily
from .registry import Capabilities, Pruning, register
from .schedules import gmp_fraction


class MagnitudeFamily(MaskFamily):
    """MP, GMP and dense training: the mask starts all ones; MP and GMP cut it by magnitude."""


@register
class MPFamily(MagnitudeFamily):
    """MP: one global cut to ``target`` at step ``cut`` (of weights, or of channel
    variables)."""

    name, label, text, color = "mp", "MP", "MP", "C7"
    caps = Capabilities(commands=("prune-joint",), uses=("target", "prune_at"),
                        pruning=Pruning(channels=True))

    def fraction_at(self, step: int, cuts: CutSchedule) -> float | None:
        return cuts.target if step == cuts.cut else None


@register
class GMPFamily(MagnitudeFamily):
    """GMP: a cut every ``every`` steps from ``start`` to ``end`` (and at ``end``) on the cubic
    schedule :func:`gmp_fraction` (of weights, or of channel variables)."""

    name, label, text, color = "gmp", "GMP", "GMP", "C3"
    caps = Capabilities(commands=("prune-joint",),
                        uses=("target", "gmp_start", "gmp_end", "gmp_every"),
                        pruning=Pruning(channels=True))

    def fraction_at(self, step: int, cuts: CutSchedule) -> float | None:
        c = cuts
        if c.start <= step <= c.end and ((step - c.start) % c.every == 0 or step == c.end):
            return gmp_fraction(step, c.start, c.end, c.target)
        return None


@register
class DenseFamily(MagnitudeFamily):
    """Dense training: the mask stays all ones; the weights train in either mode."""

    name, label, text, color = "dense", "dense", "dense", "k"
    caps = Capabilities(commands=("prune-supermask", "prune-joint"),
                        pruning=Pruning(dense_weights=True))
