"""Input checks shared by the exact core, pbscale and the command-line tools (whose argparse
types and parser live in :mod:`pbexact.cli`).

Every check raises :class:`PBInputError`, whose message names the problem and the fix in one line;
the command-line tools turn it into ``error: ...`` and exit code 2.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Largest enumeration the exact core accepts, in bytes of working memory.
ENUMERATION_MEMORY_LIMIT = 4 * 2**30
#: Largest d whose 2^d-vertex table the exact core tabulates.
MAX_TABLE_D = 26


class PBInputError(ValueError):
    """Bad input to a pbnn function: the message names the problem and the fix."""


class RunInterrupted(Exception):  # noqa: N818 - what happened, not an error
    """A run stopped by a signal (SIGTERM, or SIGINT: Ctrl-C) after writing its checkpoint; the
    message says where. ``code`` is the exit code a tool ends with (128 + the signal's number:
    143, 130), :func:`pbexact.cli.run_main` adds how to resume."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = int(signum)
        self.code = 128 + self.signum


def check_d(d: int, limit: int = MAX_TABLE_D) -> int:
    if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 1:
        raise PBInputError(f"d must be a positive integer, got {d!r}; give d >= 1")
    if d > limit:
        need = 2**d * 8
        raise PBInputError(
            f"d={d} is too large to tabulate: a table of 2^{d} float64 values needs "
            f"{format_bytes(need)}; the limit is d={limit}"
        )
    return int(d)


def check_n(n: int, estimator: str = "", minimum: int = 1) -> int:
    """n samples; LOORF and ARMS need ``minimum=2`` (leave-one-out and pairwise copula)."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise PBInputError(f"n must be a positive integer number of samples, got {n!r}; "
                           "give n >= 1")
    if n < minimum:
        who = f"{estimator} " if estimator else ""
        raise PBInputError(
            f"{who}needs n >= {minimum} samples, got n={n}; use n >= {minimum} "
            "or REINFORCE, which works with n=1"
        )
    return int(n)


def check_theta(theta: Any, d: int | None = None) -> np.ndarray:
    """Probabilities theta in [0, 1], shape (..., d); returns a float64 array."""
    arr = np.asarray(theta, dtype=np.float64)
    if arr.ndim == 0:
        arr = arr[None]
    # one min and one max settle the common case (NaN fails both comparisons); only a failure
    # pays for the diagnosis
    if not (arr.size and 0.0 <= arr.min() and arr.max() <= 1.0):
        if not np.all(np.isfinite(arr)):
            raise PBInputError(
                "theta contains NaN or inf; every theta_i must be a number in [0, 1]"
            )
        bad = (arr < 0) | (arr > 1)
        if np.any(bad):
            raise PBInputError(
                f"theta must lie in [0, 1]; got {float(arr[bad].ravel()[0])!r} "
                "(clip it, or pass logits through a parametrization)"
            )
    if d is not None and arr.shape[-1] != d:
        raise PBInputError(f"theta has {arr.shape[-1]} entries but the problem has d={d}; "
                           "give one theta per bit")
    return arr


def check_table(J: Any, d: int | None = None) -> np.ndarray:
    """A J table of 2^d finite values, indexed by h (z_i is bit i-1 of h, `sec:pb_basics`)."""
    arr = np.asarray(J, dtype=np.float64)
    if arr.ndim != 1:
        raise PBInputError(f"a J table must be one-dimensional, got shape {arr.shape}; "
                           "flatten it to 2^d values")
    size = arr.shape[0]
    if size < 2 or size & (size - 1):
        raise PBInputError(
            f"a J table must have 2^d entries, got {size}; pad or trim it to a power of two"
        )
    table_d = size.bit_length() - 1
    if d is not None and table_d != d:
        raise PBInputError(f"the J table has {size} = 2^{table_d} entries, but d={d} needs {2**d}; "
                           "give a table of that length")
    # min and max propagate NaN and show any inf: two reductions settle the common case
    if not (np.isfinite(arr.min()) and np.isfinite(arr.max())):
        where = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise PBInputError(f"the J table has a NaN or inf at h={where}; every J(z) must be finite")
    return arr


def format_count(n: float, digits: int = 3) -> str:
    """A count in ``%g`` form ('7.66e+62'), also an integer past the float range, which cannot
    be converted to a float ('1.23e+444', from its logarithm)."""
    try:
        return f"{float(n):.{digits}g}"
    except OverflowError:
        log = math.log10(n)
        exponent = math.floor(log)
        return f"{10 ** (log - exponent):.{digits}g}e+{exponent}"


def format_bytes(n: float) -> str:
    """Human-readable size: '3.0 GiB', or '2.9e+25 bytes' past the binary prefixes."""
    if n >= 1024**6:
        return f"{format_count(n, 2)} bytes"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} EiB"


def multiset_count(num_items: int, n: int) -> int:
    """Number of n-multisets of ``num_items`` items, C(num_items - 1 + n, n) (`eq:n_multisets`)."""
    return math.comb(num_items - 1 + n, n)


def check_learning_rate(lr: Any, name: str = "learning rate") -> float:
    """A learning rate must be a finite number > 0 (zero does nothing, a negative one ascends)."""
    try:
        value = float(lr)
    except (TypeError, ValueError):
        raise PBInputError(f"the {name} must be a number > 0, got {lr!r}; give e.g. 0.1") from None
    if not (math.isfinite(value) and value > 0):
        raise PBInputError(f"the {name} must be a finite number > 0, got {lr!r}; give e.g. "
                           "0.1")
    return value
