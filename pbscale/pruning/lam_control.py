"""A target fraction of weights for the methods with an L0 penalty (``pbscale.prune
--lam-target``): :class:`LamController` steers the L0 strength lambda of the objective
J(z) + lambda sum_i z_i (`sec:app_pruning_setup`) while masks train, so that the fraction of
masked weights kept ("remaining"; a channel run's: the ``--cost`` kept of the prunable part,
the measure its metrics report) reaches the target, then holds it.

When it acts: :data:`CHECKS` times per mask-training epoch (every ``steps // CHECKS`` steps,
at least every step), so that it acts while the masks can still move. A method's mask
learning rate decays by its schedule (CP: x 0.1 at 40% and again at 60% of the epochs); after
the first decay the masks barely move, so a rule that acted once per epoch ran out of epochs
in short runs and missed silently. Warm-up and frozen epochs of joint runs leave lambda alone
(their mask is fixed).

Rule, at a check with remaining m of the method's deterministic mask (its ``mode_mask``: the
evaluation mask of CP; for the sampled evaluations of MC, the most probable mask) and target
t, with m' the fraction :func:`foreseen` one epoch ahead: lambda <- lambda * clip(m' / t,
1 / STEP, STEP) (:data:`STEP`) at every check: more weights than wanted raise lambda, fewer
lower it, by at most a factor STEP per check (m' = 0 lowers it by STEP). The band |m - t| <=
:data:`BAND` t only judges the end (:func:`reached`); lambda never holds inside it.

The lambda in force at the end of each epoch is the run's "lam" column (row 0: the starting
``--lam``); lambda lives in the method's state, so it is checkpointed and a resumed run is
exact. Whether the run reached its target (the evaluation mask's remaining fraction within the
band) is the last line the run prints (:func:`target_line`), with the fix when it missed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pbscale.runs.contracts import LoopConfig, RunHooks

#: Relative half-width of the band around the target that counts as reached.
BAND = 0.1
#: Largest factor by which lambda changes at one check.
STEP = 1.25
#: Checks of the remaining fraction per mask-training epoch.
CHECKS = 8


def next_lam(lam: float, remaining: float, target: float) -> float:
    """The rule of the module docstring: lambda after a check that found ``remaining``."""
    return lam * min(max(remaining / target, 1.0 / STEP), STEP)


def reached(remaining: float, target: float) -> bool:
    """Whether a final remaining fraction meets the target (inside the band)."""
    return abs(remaining - target) <= BAND * target


class LamController(RunHooks):
    """Steers ``method.lam`` (a :class:`pbscale.methods.MaskTrainer`'s L0 strength) towards
    ``target`` remaining every ``steps // CHECKS`` steps of the mask-training epochs of
    ``loop`` (:func:`next_lam` of the :func:`foreseen` fraction), and records each epoch's
    lambda in the history (column ``prefix + "lam"``; a pruning group's member g:
    ``prefix="run<g>."``). ``measure``: the remaining fraction of a mask (d,), as the run's
    metrics report it (None: its nonzero entries over d). The fraction at the last check is
    its checkpointed state."""

    def __init__(self, method: object, target: float, loop: LoopConfig, steps: int,
                 prefix: str = "", measure: Callable[[torch.Tensor], float] | None = None
                 ) -> None:
        self.method, self.target, self.loop = method, float(target), loop
        self.measure = measure
        self.every = max(int(steps) // CHECKS, 1)
        self.start, self.key = float(method.lam), f"{prefix}lam"
        self.last: float | None = None

    def after_step(self, epoch: int, i: int) -> None:
        if (i + 1) % self.every or self.loop.phase(epoch) != "train":
            return
        mask = self.method.mode_mask()
        remaining = (float(mask.count_nonzero()) / self.method.d if self.measure is None
                     else float(self.measure(mask)))
        ahead = foreseen(remaining, self.last)
        self.method.lam = next_lam(self.method.lam, ahead, self.target)
        self.last = remaining

    def epoch_done(self, epoch: int, history: list[dict]) -> None:
        history[0].setdefault(self.key, self.start)
        for row in history[1:]:  # rows before the column existed: the lambda now
            row.setdefault(self.key, self.method.lam)

    def hook_state(self) -> dict:
        return {"last": self.last}

    def load_hook_state(self, state: dict) -> None:
        self.last = state["last"]


def foreseen(remaining: float, last: float | None) -> float:
    """The remaining fraction one epoch (:data:`CHECKS` checks) ahead if it keeps changing by
    the factor remaining / last of the last check (``remaining`` itself at the first check, or
    where either is 0): the masks follow lambda with a lag, and a rule that waits to see the
    target reached overshoots it (pruned weights barely return once the mask learning rate
    has decayed)."""
    if not last or not remaining:
        return remaining
    return remaining * (remaining / last) ** CHECKS


def moving_epochs(loop: LoopConfig) -> tuple[int, int]:
    """(first, end): the epochs [first, end) in which masks train at the full mask learning
    rate (before the schedule's first decay)."""
    warm, train, _ = loop.phase_epochs()
    end = warm + train
    if loop.mask_milestones:
        end = min(end, max(round(min(loop.mask_milestones) * loop.epochs), warm + 1))
    return warm, end


def target_line(target: float, rows: list[dict], loop: LoopConfig, key: str = "lam") -> str:
    """The last line of a ``--lam-target`` run whose metrics rows are ``rows`` (its column
    ``key`` the lambda of each epoch): the target, the remaining fraction reached and the final
    lambda; when it missed, a warning with the fix (more epochs, or a starting --lam: the
    lambda at the end of the full-rate epochs, :func:`moving_epochs`)."""
    remaining, lam = rows[-1]["remaining"], rows[-1][key]
    head = f"lam-target {target:.2%}: reached {remaining:.2%} (final lam {lam:.3g})"
    if reached(remaining, target):
        return head
    first, end = moving_epochs(loop)
    span = f"epoch {end}" if end == first + 1 else f"epochs {first + 1}-{end}"
    where = (f"the masks move at the full mask learning rate only in {span} of "
             f"{loop.epochs} (the method's mask-lr decay)" if end < loop.epochs else
             f"{loop.epochs} epochs were too few")
    start = rows[min(end, len(rows) - 1)][key]
    return (f"warning: {head}, outside the {BAND:.0%} band: {where}; give more epochs "
            f"(--epochs {2 * loop.epochs}) or start nearer with --lam {start:.3g}")
