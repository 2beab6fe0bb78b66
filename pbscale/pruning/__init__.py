"""Pruning as PB optimization (`sec:app_pruning_setup`), the machinery under
``python -m pbscale.prune``: :mod:`.config` (a run's settings, defaults, checks, what its method
reads), :mod:`.setup` (data and network checked against each other), :mod:`.task` (the network,
masked layout and batches), :mod:`.evaluation` (the evaluation mask and metrics),
:mod:`.outputs` (masks.pt and pruned.pt of a finished run), :mod:`.lam_control` (the
``--lam-target`` controller), :mod:`.run` (one run assembled and how it executes),
:mod:`.group` (pruning groups) and :mod:`.api` (``pbscale.prune_model``)."""
