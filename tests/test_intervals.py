"""``layerscope.base.intervals``: merged intervals and the length of their union, by hand."""

from __future__ import annotations

from layerscope.base.intervals import merged, union_ns


def test_overlapping_and_touching_intervals_merge_and_empty_ones_drop() -> None:
    # Two streams' kernels: [0, 10) and [5, 20) overlap, [20, 25) touches, [30, 30) is empty.
    spans = [(20, 25), (5, 20), (0, 10), (30, 30), (40, 50)]
    assert merged(spans) == [(0, 25), (40, 50)]
    assert union_ns(spans) == 35  # 25 + 10, each instant once
    assert union_ns([]) == 0 and merged([]) == []
    assert union_ns([(0, 10), (2, 3)]) == 10  # one inside another
