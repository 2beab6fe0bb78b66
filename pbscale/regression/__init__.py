"""MaskedNNRegression (`sec:app_maskednnregression`), the machinery under
``python -m pbscale.regress`` and ``python -m pbscale.batched_seeds``: :mod:`.problem` (the data,
backbone and target, its task), :mod:`.run` (one run assembled) and :mod:`.group` (regression
groups: many seeds and learning rates in one process)."""

from pbexact.moved import moved_names

#: The names of this package's module before it became a package (an old import of one is told
#: where it is).
__getattr__ = moved_names(__name__, dict.fromkeys(
    ("RegressionProblem", "RegressionTask", "RegressionGroupTask", "make_problem",
     "task_config", "mlp", "IN_DIM", "BACKBONE_HIDDEN", "TARGET_HIDDEN", "N_TRAIN", "N_VALID",
     "BATCH", "SELECT_POINTS", "VALID_MASKS"), "pbscale.regression.problem"))
