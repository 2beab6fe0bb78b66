"""Run by tests/test_distributed.py under ``torch.distributed.run`` (gloo, K ranks) or alone
(K = 1, no process group): tiny MaskedNNRegression runs of several MC estimators through
pbscale.runs.loop with the samples split over the ranks; writes each rank's run folder and the
logits r before every step (``trace<rank>.pt``). argv: OUT [interrupt_at_step]."""

from __future__ import annotations

import os
import signal
import sys

import torch

from pbscale.execution import distributed
from pbscale.methods import MaskTrainer, MethodConfig, mc_gradient
from pbscale.regression.problem import RegressionTask, make_problem
from pbscale.runs.loop import LoopConfig, run

#: (estimator, n, chunk): chunks of uneven size across ranks, pairs for DisARM
CASES = [("loorf", 7, 3), ("arms", 5, 5), ("disarm", 6, 4), ("reinforce", 4, 1)]


def main() -> None:
    out = sys.argv[1]
    interrupt = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    torch.set_num_threads(1)
    shard = distributed.from_env("cpu")
    rank = 0 if shard is None else shard.rank
    problem = make_problem(0, n_train=300, n_valid=100, backbone_hidden=(6, 6),
                           target_hidden=(12, 12))
    # one step's estimate from the same generator state, with the samples split over ranks
    grads = {}
    idx = torch.arange(100)
    for method, n, chunk in CASES:
        cfg = MethodConfig(method, n, "sigmoid", 0.1, chunk=chunk, seed=3)
        trainer = MaskTrainer(cfg, problem.d, 1)
        est = mc_gradient(problem.batch_loss(idx), trainer.r, trainer.param, method, n,
                          torch.Generator().manual_seed(5), chunk, shard=shard)
        grads[method] = (est.grad, est.loss)
    torch.save(grads, os.path.join(out, f"grads{rank}.pt"))
    traces = {}
    for method, n, chunk in CASES:
        task = RegressionTask(problem, 0)
        task.name = method
        trainer = MaskTrainer(MethodConfig(method, n, "sigmoid", 0.1, chunk=chunk, seed=3),
                              task.d, 2 * task.steps_per_epoch)
        # the samples split over the ranks (its strategy); alone: no strategy
        hooks = distributed.rank_strategy(trainer, shard)[0] if shard is not None else []
        trace = traces.setdefault(method, [])
        step = {"i": 0}

        def hook(epoch: int, i: int, trainer=trainer, trace=trace, step=step) -> None:
            if step["i"] == interrupt:
                os.kill(os.getpid(), signal.SIGTERM)  # the loop checkpoints before the next step
            step["i"] += 1
            trace.append(trainer.r.detach().clone())

        path = os.path.join(out, f"trace{rank}.pt")
        if os.path.exists(path):  # a resumed launch: the steps before the interruption
            done = torch.load(path, weights_only=True)
            trace.extend(done.get(method, []))
            traces[method] = trace
        try:
            run(task, trainer, LoopConfig(epochs=2, seed=3), distributed.rank_out(out, shard),
                progress=False, step_hook=hook, hooks=hooks)
        finally:
            torch.save(traces, path)
    distributed.shutdown()


if __name__ == "__main__":
    main()
