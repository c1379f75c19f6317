"""Percentiles of measured samples: the one definition the benchmarks and the plots share.

Nearest rank: the ``fraction`` percentile of ``n`` samples is the smallest sample that at least
``fraction * n`` of them do not exceed. It is always one of the samples (never interpolated), so
a lost query counted as ``inf`` shows as ``inf`` once it reaches the percentile asked for.
A histogram's percentile is :meth:`evaluation.columns.ResponseStats.percentile`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(samples: Iterable[float], fraction: float) -> float:
    """The nearest-rank ``fraction`` percentile (0 < ``fraction`` <= 1) of ``samples``;
    ``nan`` when there are none."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction {fraction!r} is not in (0, 1]")
    ordered = sorted(samples)
    if not ordered:
        return math.nan
    # round: 0.07 * 100 is 7.000000000000001, whose ceiling would skip a rank
    rank = math.ceil(round(fraction * len(ordered), 9))
    return ordered[max(0, rank - 1)]
