"""MaskedNNRegression (`sec:app_maskednnregression`), the machinery under
``python -m pbscale.regress`` (one run, or a group with ``--seeds``): :mod:`.problem` (the data,
backbone and target, its task), :mod:`.run` (one run assembled) and :mod:`.group` (regression
groups: many seeds and learning rates in one process)."""
