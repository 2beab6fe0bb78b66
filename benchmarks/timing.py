"""Wall-clock timing shared by the benchmarks."""
from __future__ import annotations

import math
import time
from collections.abc import Callable


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of ``repeats`` calls of ``fn``, in seconds (the call least disturbed by other
    processes); ``inf`` when ``repeats`` is 0."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
