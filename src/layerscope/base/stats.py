"""Order statistics, the one place a percentile or a median is taken: no torch, standard
library only.

**One rule.** A percentile is interpolated linearly between the two nearest ranks
(numpy's default, "linear"; Hyndman and Fan's type 7), and the median is its 50th
percentile: the middle value, or the mean of the middle two (``statistics.median``).
Whole-unit figures (nanoseconds, bytes) round it down: :func:`median_floor`.

**An observed median** is another question, asked where one run stands for many and is
shown whole (``profile()``'s median pass, a merged run's median rank, the median step
the others are compared with): :func:`observed_median_index` picks the lower of the two
middle values, the first of equals, so the figure is one that was measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypeVar

#: A number, kept whole where it was whole.
_Number = TypeVar("_Number", int, float)


def _between(count: int, q: float) -> tuple[int, int, float]:
    """Where the ``q``-th percentile of ``count`` sorted values lies: the two nearest
    ranks and the weight of the upper one."""
    if count == 0:
        raise ValueError("percentile of no values")
    position = (count - 1) * q / 100.0
    lower = math.floor(position)
    return lower, min(lower + 1, count - 1), position - lower


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of already sorted values, interpolated linearly
    between the two nearest ranks (numpy's default, "linear"). Equal neighbours give
    their value exactly."""
    lower, upper, weight = _between(len(sorted_values), q)
    low = sorted_values[lower]
    return low + (sorted_values[upper] - low) * weight


def percentile_floor(sorted_values: Sequence[int], q: float) -> int:
    """:func:`percentile` of whole numbers (ns, bytes), rounded down: they stay whole."""
    lower, upper, weight = _between(len(sorted_values), q)
    low = sorted_values[lower]
    # The step between the neighbours rounded down, not their blend: exact for big values.
    return low + math.floor((sorted_values[upper] - low) * weight)


def median(values: Iterable[float]) -> float:
    """The 50th :func:`percentile`: the middle value, or the mean of the middle two."""
    return percentile(sorted(values), 50)


def median_floor(values: Iterable[int]) -> int:
    """The :func:`median` of whole numbers (ns, bytes), rounded down."""
    return percentile_floor(sorted(values), 50)


class _Without(Sequence[int]):
    """Sorted ``ordered`` less its item at ``index``, by position: no copy."""

    __slots__ = ("_index", "_ordered")

    def __init__(self, ordered: Sequence[int], index: int) -> None:
        self._ordered, self._index = ordered, index

    def __len__(self) -> int:
        return len(self._ordered) - 1

    def __getitem__(self, k: int) -> int:  # type: ignore[override]  # positions only, no slices
        return self._ordered[k if k < self._index else k + 1]


def median_floor_without(ordered: Sequence[int], index: int) -> int:
    """:func:`median_floor` of sorted ``ordered`` without its item at ``index``, by
    position: no copy per item, so "each one against the others" costs O(n) in all."""
    return percentile_floor(_Without(ordered, index), 50)


def observed_median_index(values: Sequence[_Number]) -> int:
    """The index of the observed median of ``values``: the lower of the two middle values
    for an even count, the first of equals. For a median that must be one that was
    measured (a run shown whole), not a figure between two."""
    if not values:
        raise ValueError("median of no values")
    return sorted(range(len(values)), key=lambda n: (values[n], n))[(len(values) - 1) // 2]


def observed_median(values: Sequence[_Number]) -> _Number:
    """The value at :func:`observed_median_index`."""
    return values[observed_median_index(values)]


def spread(values: Sequence[float]) -> float | None:
    """How much repeated measurements of the same work spread, relative: ``(p90 - p10) /
    median``, the middle 80% of them (one outlier among many moves it little); None with
    fewer than two, or a median of 0."""
    ordered = sorted(values)
    if len(ordered) < 2:
        return None
    middle = percentile(ordered, 50)
    return (percentile(ordered, 90) - percentile(ordered, 10)) / middle if middle > 0 else None
