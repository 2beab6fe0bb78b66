"""What every check of ``python -m analysis.theorems`` shares: the row it returns
(:class:`CheckResult`, :func:`error_result` for a check of an error against a tolerance), the
family-wise level of the statistical checks (:data:`ALPHA`), the type of a formula under test
(:data:`TableFn`) and the random J tables the checks draw (:func:`random_table`).

Every check takes the formula or object under test as an argument, so the tests can feed it a
wrong one (a perturbed formula, a wrong rho, a non-multilinear polynomial) and see it fail; each
takes its random generator and sizes, and returns one :class:`CheckResult` or a list of them.
The checks, one function per claim (its paper label in each :class:`CheckResult`), by the part
of the paper they serve: :mod:`analysis.exact.polynomial_checks`,
:mod:`analysis.exact.estimator_checks`, :mod:`analysis.exact.bad_generalization_checks` and
:mod:`analysis.exact.bias_checks`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TableFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


#: Family-wise significance level of the statistical checks (Bonferroni over each check's tests).
ALPHA = 1e-3


@dataclass
class CheckResult:
    """One row of the table: ``worst`` is an error (pass if <= tolerance) or, for statistical
    checks, the smallest p-value (pass if >= tolerance, the Bonferroni level)."""

    label: str
    check: str
    sizes: str
    worst: float
    tolerance: float
    kind: str  # "error" or "p-value"
    passed: bool
    detail: dict[str, Any] = field(default_factory=dict)


def error_result(label: str, check: str, sizes: str, worst: float, tol: float, **detail: Any):
    return CheckResult(label, check, sizes, float(worst), tol, "error", bool(worst <= tol), detail)


def random_table(rng: np.random.Generator, d: int) -> np.ndarray:
    """A J table on a random scale from 1e-2 to 1e3, so relative tolerances are exercised."""
    return rng.normal(size=2**d) * 10 ** rng.uniform(-2, 3)
