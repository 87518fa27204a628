"""base/stats.py: the one percentile rule, its whole-number form, and the observed median."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from layerscope.base.stats import (
    median,
    median_floor,
    median_floor_without,
    observed_median,
    observed_median_index,
    percentile,
    percentile_floor,
)


def test_percentile_interpolates_between_the_two_nearest_ranks() -> None:
    # Sorted 90, 100, 105, 110, 400: p90 at position 0.9 * 4 = 3.6 -> 110 + 0.6 * 290.
    values = [90, 100, 105, 110, 400]
    assert percentile(values, 90) == pytest.approx(284)
    assert percentile(values, 10) == pytest.approx(94)  # 90 + 0.4 * 10
    assert (percentile(values, 0), percentile(values, 100)) == (90, 400)
    assert percentile_floor([1, 2], 50) == 1  # 1.5, rounded down
    assert percentile_floor([7, 7, 7], 33) == 7  # equal neighbours give their value exactly
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_the_median_is_the_50th_percentile_as_statistics_median() -> None:
    for values in ([3], [4, 1], [5, 1, 3], [10, 2, 2, 7]):
        assert median(values) == statistics.median(values)
        assert median_floor(values) == math.floor(statistics.median(values))
    # Whole numbers stay exact past a float's 53 bits: (2**60 + 1 + 2**60 + 4) // 2.
    assert median_floor([2**60 + 1, 2**60 + 4]) == 2**60 + 2


def test_median_without_one_item_is_the_median_of_the_others() -> None:
    for size in range(2, 7):
        for values in itertools.product([0, 3, 8], repeat=size):
            ordered = sorted(values)
            for index in range(size):
                others = ordered[:index] + ordered[index + 1:]
                assert median_floor_without(ordered, index) == median_floor(others)


def test_the_observed_median_is_the_lower_middle_and_the_first_of_equals() -> None:
    assert observed_median_index([30, 10, 20, 40]) == 2  # 20: the lower of 20 and 30
    assert observed_median_index([5, 5, 5]) == 1
    assert observed_median_index([7, 1, 7]) == 0  # sorted 1, 7, 7: the first 7
    assert observed_median([4, 1]) == 1
