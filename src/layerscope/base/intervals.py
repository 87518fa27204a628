"""Time intervals ``[start, end)`` in ns: merged, and the length of their union. Kernels on
several streams overlap, and collectives overlap each other; each is counted once.
Standard library only."""

from __future__ import annotations

from collections.abc import Iterable


def merged(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The intervals sorted and merged where they overlap or touch; empty ones dropped."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def union_ns(intervals: Iterable[tuple[int, int]]) -> int:
    """The length of the union of the intervals: the time any of them ran."""
    return sum(end - start for start, end in merged(intervals))
