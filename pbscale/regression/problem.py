"""MaskedNNRegression (`sec:app_maskednnregression`): learn a target network's input-output map by
masking the weights of a smaller fixed backbone.

Backbone 10 -> 50 x 4 -> 1, target 10 -> 500 x 5 -> 1; Linear layers without bias, each hidden
Linear followed by BatchNorm1d without affine parameters or running statistics, then LeakyReLU.
Backbone weights are Xavier-normal, target weights +-1 with probability 1/2. The target is run on
the whole training set at once (its normalization statistics), and the same statistics are used
for the validation inputs; its outputs are min-max normalized to [0, 1] with the training range.
d = 10*50 + 3*50*50 + 50 = 8,050 masked weights. Everything here is drawn on the CPU from a
seed of its own (``data_seed``), so CPU and GPU runs see the same data and backbone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pbscale.execution.group import MemberLosses
from pbscale.forward.masks import MaskedModule, mean_absolute_error
from pbscale.runs.contracts import BatchedLoss

IN_DIM = 10
BACKBONE_HIDDEN = (50, 50, 50, 50)
TARGET_HIDDEN = (500, 500, 500, 500, 500)
N_TRAIN, N_VALID, BATCH = 10_000, 5_000, 100
#: Training points on which the best of VALID_MASKS sampled masks is chosen (MC validation).
SELECT_POINTS, VALID_MASKS = 500, 5


def mlp(widths: tuple[int, ...]) -> nn.Sequential:
    """Linear (no bias) -> BatchNorm1d (no affine, batch statistics always) -> LeakyReLU for each
    hidden layer, then a plain Linear to one output."""
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-2], widths[1:-1]):
        layers += [nn.Linear(a, b, bias=False),
                   nn.BatchNorm1d(b, affine=False, track_running_stats=False),
                   nn.LeakyReLU()]
    layers.append(nn.Linear(widths[-2], widths[-1], bias=False))
    return nn.Sequential(*layers)


def _target_forward(weights: list[torch.Tensor], x_train: torch.Tensor,
                    x_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target network on x_train and on x_valid, each hidden layer normalized with the
    statistics of x_train's activations; the normalization and LeakyReLU in place (the
    values of ``leaky_relu((h - mean) * norm)``), so one activation of each set is held."""
    h_train, h_valid = x_train, x_valid
    for i, w in enumerate(weights):
        h_train, h_valid = h_train @ w.T, h_valid @ w.T
        if i < len(weights) - 1:
            mean, var = h_train.mean(0), h_train.var(0, unbiased=False)
            norm = torch.rsqrt(var + 1e-5)
            for h in (h_train, h_valid):
                nn.functional.leaky_relu_(h.sub_(mean).mul_(norm))
    return h_train, h_valid


@dataclass
class RegressionProblem:
    """Data and backbone of MaskedNNRegression, on one device."""

    backbone: nn.Sequential
    masked: MaskedModule
    x_train: torch.Tensor  # (N_TRAIN, 10)
    y_train: torch.Tensor  # (N_TRAIN, 1) in [0, 1]
    x_valid: torch.Tensor  # (N_VALID, 10)
    y_valid: torch.Tensor  # (N_VALID, 1)

    @property
    def d(self) -> int:
        return self.masked.d

    def batch_loss(self, idx: torch.Tensor):
        """J(z) = MAE of the masked backbone on training points idx, batched f(z (k, d)) -> (k,)."""
        return self.masked.loss_fn(self.x_train[idx], self.y_train[idx], mean_absolute_error)

    def valid_loss(self):
        """J(z) on the whole validation set at once (its own batch statistics)."""
        return self.masked.loss_fn(self.x_valid, self.y_valid, mean_absolute_error)

    def bytes_per_sample(self, batch: int = BATCH) -> int:
        """Working memory of one mask in a chunk: mask, masked weights and score (d each) and the
        activations of the batch (a few copies per hidden unit), float32."""
        itemsize = torch.tensor([], dtype=self.x_train.dtype).element_size()
        return itemsize * (4 * self.d + 8 * batch * sum(BACKBONE_HIDDEN))


def make_problem(data_seed: int = 0, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, n_train: int = N_TRAIN,
                 n_valid: int = N_VALID, backbone_hidden: tuple[int, ...] = BACKBONE_HIDDEN,
                 target_hidden: tuple[int, ...] = TARGET_HIDDEN) -> RegressionProblem:
    """Draw data, target and backbone from ``data_seed`` on the CPU in float64, then move them.

    Sizes can be shrunk for tests; the defaults are the paper's.
    """
    gen = torch.Generator().manual_seed(data_seed)
    x_train = torch.rand((n_train, IN_DIM), generator=gen, dtype=torch.float64) * 2 - 1
    x_valid = torch.rand((n_valid, IN_DIM), generator=gen, dtype=torch.float64) * 2 - 1
    widths = (IN_DIM, *target_hidden, 1)
    target_w = [
        1 - 2 * (torch.rand((b, a), generator=gen, dtype=torch.float64) < 0.5).to(torch.float64)
        for a, b in zip(widths[:-1], widths[1:])
    ]
    y_train, y_valid = _target_forward(target_w, x_train, x_valid)
    lo, hi = y_train.min(), y_train.max()
    y_train, y_valid = (y_train - lo) / (hi - lo), (y_valid - lo) / (hi - lo)

    backbone = mlp((IN_DIM, *backbone_hidden, 1)).to(torch.float64)
    with torch.no_grad():
        for m in backbone:
            if isinstance(m, nn.Linear):
                # nn.init.xavier_normal_ takes no generator; this is its formula
                std = (2.0 / (m.in_features + m.out_features)) ** 0.5
                w = torch.randn(m.weight.shape, generator=gen, dtype=torch.float64)
                m.weight.copy_(w * std)
    backbone.requires_grad_(False)
    backbone = backbone.to(device=device, dtype=dtype)
    masked = MaskedModule(backbone)

    def put(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype)

    return RegressionProblem(backbone, masked, put(x_train), put(y_train), put(x_valid),
                             put(y_valid))


def task_config(data_seed: int = 0, d: int = 8050, n_train: int = N_TRAIN,
                n_valid: int = N_VALID) -> dict:
    """The JSON configuration of a MaskedNNRegression task (the defaults: the paper's sizes)."""
    return {"name": "regression", "data_seed": data_seed, "d": d, "n_train": n_train,
            "n_valid": n_valid, "batch": BATCH}


class RegressionTask:
    """MaskedNNRegression as a :class:`pbscale.runs.contracts.Task`: batches of BATCH training
    points in an
    order drawn each epoch (``torch.randperm`` from the loop's generator), J = MAE of the masked
    backbone, and the validation of `sec:app_maskednnregression`: MC and hybrid methods sample
    VALID_MASKS masks, pick the one with the lowest loss on SELECT_POINTS random training points
    and report its loss on the validation set (``val_loss_chosen``; ``val_loss`` is the mean
    over the masks); CP uses 1[r > 0]. Also reports the mean theta and CP's temperature."""

    name = "regression"

    def __init__(self, problem: RegressionProblem, data_seed: int = 0) -> None:
        self.problem = problem
        self.data_seed = data_seed
        self.d = problem.d
        self.n_train = problem.x_train.shape[0]
        self.steps_per_epoch = self.n_train // BATCH

    def config(self) -> dict:
        return task_config(self.data_seed, self.d, self.n_train, int(self.problem.x_valid.shape[0]))

    def weights(self) -> list:
        return []

    def epoch_order(self, generator: torch.Generator) -> torch.Tensor:
        return torch.randperm(self.n_train, generator=generator, device=generator.device)

    def batch_loss(self, order: torch.Tensor, i: int) -> BatchedLoss:
        return self.problem.batch_loss(order[i * BATCH : (i + 1) * BATCH])

    def evaluate(self, ctx) -> dict[str, float]:
        trainer, p = ctx.method, self.problem
        with torch.no_grad():
            if trainer.family.caps.deterministic:  # one mask (CP: 1[r > 0])
                masks = trainer.sample_masks(1)
                val = p.valid_loss()(masks)
                out = {"val_loss": float(val[0]), "val_loss_chosen": float(val[0])}
            else:
                masks = trainer.sample_masks(VALID_MASKS)
                pick = torch.randperm(self.n_train, generator=ctx.generator,
                                      device=ctx.generator.device)[:SELECT_POINTS]
                best = int(torch.argmin(p.batch_loss(pick)(masks)))
                val = p.valid_loss()(masks)
                out = {"val_loss": float(val.mean()), "val_loss_chosen": float(val[best])}
        out["theta_mean"] = float(trainer.theta().mean())
        out["tau"] = trainer.temperature()
        return out

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class RegressionGroupTask:
    """G MaskedNNRegression runs that share the problem and the epochs, as one
    :class:`pbscale.runs.contracts.Task` paired with a
    :class:`pbscale.regression.group.MaskTrainerGroup`:
    each epoch's order is (G, N_TRAIN), row g drawn by member g's :class:`RegressionTask` from
    member g's generator (the loop's generator is not used); the batched loss of step i holds each
    member's own (:class:`pbscale.execution.group.MemberLosses`: member g's
    :meth:`RegressionTask.batch_loss` on its own BATCH points); the evaluation is each member's
    :meth:`RegressionTask.evaluate` (its trainer, its generator) with its training loss of the
    epoch, the keys prefixed ``run<g>.`` (:meth:`member_row` splits a row back)."""

    def __init__(self, problem: RegressionProblem, group, data_seed: int = 0,
                 names: list[str] | None = None) -> None:
        self.problem = problem
        self.group = group
        self.members = [RegressionTask(problem, data_seed) for _ in group.members]
        for t, name in zip(self.members, names or []):
            t.name = name
        m = group.members[0].config
        self.name = f"group-{m.method}-n{m.n}-{m.param}-{len(self.members)}runs"
        self.d = problem.d
        self.steps_per_epoch = self.members[0].steps_per_epoch

    def config(self) -> dict:
        return self.members[0].config()

    def weights(self) -> list:
        return []

    def epoch_order(self, generator: torch.Generator) -> torch.Tensor:
        return torch.stack([t.epoch_order(m.generator)
                            for t, m in zip(self.members, self.group.members)])

    def batch_loss(self, order: torch.Tensor, i: int) -> MemberLosses:
        return MemberLosses([t.batch_loss(order[g], i) for g, t in enumerate(self.members)])

    def evaluate(self, ctx) -> dict[str, float]:
        losses = self.group.pop_epoch_losses()
        out: dict[str, float] = {}
        for g, (t, m) in enumerate(zip(self.members, self.group.members)):
            sub = type(ctx)(m, m.generator, ctx.phase, None, ctx.epoch)
            row = {"train_loss": losses[g], **t.evaluate(sub)}
            out.update({f"run{g}.{k}": v for k, v in row.items()})
        return out

    def member_row(self, row: dict, g: int) -> dict:
        """Member g's history row from a row of the group's history: epoch, its training loss
        and metrics, and the group's seconds divided by G."""
        G, prefix = len(self.members), f"run{g}."
        out = {"epoch": row["epoch"]}
        out.update({k[len(prefix):]: v for k, v in row.items() if k.startswith(prefix)})
        for k in ("train_seconds", "val_seconds"):
            if k in row:
                out[k] = row[k] / G
        return out

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
