"""The spread of repeated measurements (``base.stats.spread``), by hand: ``(p90 - p10) /
median`` with numpy's linear percentiles."""

from __future__ import annotations

import pytest

from layerscope.base.stats import median_floor, spread


def test_the_spread_of_five_values_by_hand() -> None:
    # Sorted 10, 20, 30, 40, 100 (given unsorted). Rank of p10 = 0.1 * 4 = 0.4: 10 + 0.4 * 10
    # = 14; p90 = 3.6: 40 + 0.6 * 60 = 76; median 30: (76 - 14) / 30.
    assert spread([40, 10, 100, 30, 20]) == pytest.approx(62 / 30)


def test_the_spread_of_two_values_and_of_equal_ones() -> None:
    # Two values 2 and 4: p10 = 2.2, p90 = 3.8, median 3: 1.6 / 3.
    assert spread([4, 2]) == pytest.approx(1.6 / 3)
    assert spread([7, 7, 7]) == 0.0


def test_no_spread_from_fewer_than_two_values_or_a_median_of_zero() -> None:
    assert spread([]) is None and spread([5]) is None
    assert spread([0, 0, 1]) is None  # median 0
    assert spread([-1, 0, 3]) is None  # a median of 0 divides nothing


def test_the_median_of_whole_numbers_rounds_down() -> None:
    assert median_floor([1, 2]) == 1  # 1.5
    assert median_floor([3, 1, 2, 10]) == 2  # 2.5
    assert median_floor([5]) == 5


def test_medians_of_two_far_apart_whole_numbers_are_their_midpoint() -> None:
    from layerscope.base.stats import median_floor_without

    assert median_floor([0, 100]) == 50
    # 0, 10, 100 without the 10: 0 and 100.
    assert median_floor_without([0, 10, 100], 1) == 50


def test_a_spread_around_a_median_below_one() -> None:
    # 0.5, 0.5, 1.0: p10 = 0.5, p90 = 0.5 + 0.8 * 0.5 = 0.9, median 0.5: 0.4 / 0.5.
    assert spread([0.5, 1.0, 0.5]) == pytest.approx(0.8)


def test_no_values_have_no_percentile_or_median() -> None:
    from layerscope.base.stats import observed_median_index, percentile

    with pytest.raises(ValueError, match=r"^percentile of no values$"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"^median of no values$"):
        observed_median_index([])
