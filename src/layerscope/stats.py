"""Order statistics shared by the benchmark and the tree: no torch, standard library only."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of already sorted values, interpolated linearly
    between the two nearest ranks (numpy's default, "linear")."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    position = (len(sorted_values) - 1) * q / 100.0
    lower = math.floor(position)
    upper = min(lower + 1, len(sorted_values) - 1)
    weight = position - lower
    return sorted_values[lower] * (1.0 - weight) + sorted_values[upper] * weight


def spread(values: Sequence[float]) -> float | None:
    """How much repeated measurements of the same work spread, relative: ``(p90 - p10) /
    median``, the middle 80% of them (one outlier among many moves it little); None with
    fewer than two, or a median of 0."""
    ordered = sorted(values)
    if len(ordered) < 2:
        return None
    middle = percentile(ordered, 50)
    return (percentile(ordered, 90) - percentile(ordered, 10)) / middle if middle > 0 else None
