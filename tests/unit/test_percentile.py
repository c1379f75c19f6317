"""The nearest-rank percentile the benchmarks and plots share."""

from __future__ import annotations

import math

import pytest

from evaluation.percentile import percentile


@pytest.mark.parametrize(
    ("samples", "fraction", "expected"),
    [
        pytest.param([3.0, 1.0, 2.0], 1.0, 3.0, id="the-largest"),
        pytest.param([4.0, 1.0, 3.0, 2.0], 0.5, 2.0, id="median-of-four-is-the-lower"),
        pytest.param([float(i) for i in range(1, 101)], 0.99, 99.0, id="p99-of-100"),
        pytest.param(
            [float(i) for i in range(1, 101)], 0.07, 7.0, id="no-rank-skipped-by-rounding"
        ),
        pytest.param([float(i) for i in range(1, 11)], 0.01, 1.0, id="tiny-fraction-is-the-least"),
        pytest.param([1.0, math.inf], 0.99, math.inf, id="a-lost-query-shows"),
        pytest.param([5.0], 0.5, 5.0, id="one-sample"),
    ],
)
def test_percentile(samples: list[float], fraction: float, expected: float) -> None:
    assert percentile(samples, fraction) == expected


def test_no_samples_have_no_percentile() -> None:
    assert math.isnan(percentile([], 0.5))


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5, 99])
def test_a_fraction_outside_0_1_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="fraction"):
        percentile([1.0], fraction)
