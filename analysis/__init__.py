"""analysis: the command-line tools that verify the paper numerically and draw its figures.

The top level holds the commands (each ``python -m analysis.<tool>``) and their shared plumbing
(:mod:`analysis.cli`); the machinery is in sub-packages, lowest first: :mod:`analysis.exact`
(exact checks and biases) and :mod:`analysis.microworld` (the microworld's runs and claims, with
its command), then :mod:`analysis.scale` (the claims at scale from run folders). A sub-package
imports no command (``tests/test_architecture.py``). A module imported from where it was before
this layout is told its new place in one line (:mod:`pbexact.moved`).

:func:`compare_fronts` (from :mod:`analysis.scale.front_verdict`) is the one comparison of two
methods' accuracy/sparsity fronts every command uses: ``analysis.compare_fronts(rem_a, acc_a,
rem_b, acc_b)`` on arrays (seeds, settings).
"""

from analysis.scale.front_verdict import FrontComparison, compare_fronts
from pbexact.moved import install

__all__ = ["FrontComparison", "compare_fronts"]

#: The modules of analysis that moved into its sub-packages, old name -> new.
install({
    "analysis.microworld_runs": "analysis.microworld.runs",
    "analysis.microworld_hybrid": "analysis.microworld.hybrid",
    "analysis.claims": "analysis.microworld.claims",
    "analysis.report_units": "analysis.microworld.units",
    "analysis.report_plots": "analysis.microworld.plots",
    "analysis.theorem_checks": "analysis.exact.theorem_checks",
    "analysis.run_files": "analysis.scale.run_files",
    "analysis.out_files": "analysis.scale.outputs",
    "analysis.scale_runs": "analysis.scale.runs", "analysis.scale_fronts": "analysis.scale.fronts",
    "analysis.front_curves": "analysis.scale.curves",
    "analysis.gap_test": "analysis.scale.gap_test",
    "analysis.scale_claims": "analysis.scale.claims",
    "analysis.scale_regression": "analysis.scale.regression",
    "analysis.scale_robust": "analysis.scale.robust",
    "analysis.scale_compare": "analysis.scale.compare",
    "analysis.scale_tables": "analysis.scale.tables",
})
