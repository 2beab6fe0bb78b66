"""analysis: the command-line tools that verify the paper numerically and draw its figures.

The top level holds the commands (each ``python -m analysis.<tool>``) and their shared plumbing
(:mod:`analysis.cli`); the machinery is in sub-packages, lowest first: :mod:`analysis.exact`
(exact checks and biases) and :mod:`analysis.microworld` (the microworld's runs and claims, with
its command), then :mod:`analysis.scale` (the claims at scale from run folders). A sub-package
imports no command (``tests/test_architecture.py``).

:func:`compare_fronts` (from :mod:`analysis.scale.front_verdict`) is the one comparison of two
methods' accuracy/sparsity fronts every command uses: ``analysis.compare_fronts(rem_a, acc_a,
rem_b, acc_b)`` on arrays (seeds, settings).
"""

from analysis.scale.front_verdict import FrontComparison, compare_fronts

__all__ = ["FrontComparison", "compare_fronts"]
