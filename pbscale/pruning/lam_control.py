"""A target fraction of weights for the methods with an L0 penalty (``pbscale.prune
--lam-target``): :class:`LamController` steers the L0 strength lambda of the objective
J(z) + lambda sum_i z_i (`sec:app_pruning_setup`) after every mask-training epoch, so that the
fraction of masked weights the evaluation mask keeps ("remaining") reaches the target, then
holds it.

Rule, after mask-training epoch e with remaining m and target t: inside the band
|m - t| <= :data:`BAND` t, lambda stays; otherwise lambda <- lambda * clip(m / t, 1 / STEP,
STEP) (:data:`STEP`): more weights than wanted raise lambda, fewer lower it, by at most a
factor STEP per epoch (m = 0 lowers it by STEP). Warm-up and frozen epochs of joint runs leave
lambda alone (their mask is fixed). The lambda of each epoch is the run's "lam" column
(row 0: the starting ``--lam``), and lambda lives in the method's state, so it is checkpointed
with the epoch and a resumed run is exact.
"""

from __future__ import annotations

from pbscale.runs.contracts import LoopConfig, RunHooks

#: Relative half-width of the band around the target inside which lambda holds.
BAND = 0.1
#: Largest factor by which lambda changes after one epoch.
STEP = 2.0


def next_lam(lam: float, remaining: float, target: float) -> float:
    """The rule of the module docstring: lambda after an epoch that left ``remaining``."""
    if abs(remaining - target) <= BAND * target:
        return lam
    return lam * min(max(remaining / target, 1.0 / STEP), STEP)


class LamController(RunHooks):
    """Steers ``method.lam`` (a :class:`pbscale.methods.MaskTrainer`'s L0 strength) towards
    ``target`` remaining after every mask-training epoch of ``loop`` (:func:`next_lam`), and
    records each epoch's lambda in the history ("lam")."""

    def __init__(self, method: object, target: float, loop: LoopConfig) -> None:
        self.method, self.target, self.loop = method, float(target), loop

    def epoch_done(self, epoch: int, history: list[dict]) -> None:
        for row in history:  # row 0 (and rows before the column existed): the lambda then
            row.setdefault("lam", self.method.lam)
        if self.loop.phase(epoch) == "train":
            self.method.lam = next_lam(self.method.lam, history[-1]["remaining"], self.target)
