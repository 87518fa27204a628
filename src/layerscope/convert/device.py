"""Device work shared out: each step's busy time, and the pieces of time each op's
kernels hold alone, so that no instant of device time is counted twice (streams that
overlap, a collective beside compute) and every instant sits in one step.
"""

from __future__ import annotations

from bisect import bisect_right

from layerscope.base.comm import is_communication_kernel
from layerscope.base.intervals import merged
from layerscope.convert.ranges import KernelSpan, Range
from layerscope.model.raw import DeviceBusy


def launch_times(roots: list[Range]) -> dict[int, int]:
    """When each range of the window began, by its correlation id: the launch of the
    kernels linked to it."""
    out: dict[int, int] = {}
    pending = list(roots)
    while pending:
        item = pending.pop()
        if item.correlation_id:
            out[item.correlation_id] = item.start_time_ns
        pending.extend(item.children)
    return out


def kernel_steps(kernels: list[KernelSpan], steps: list[tuple[int, int]], launched: dict[int, int]) -> list[int | None]:
    """The step (an index into ``steps``, sorted host windows) each kernel belongs to, or
    None. A kernel is its launch's: the step whose window holds the start of the op range
    that launched it, whole, however long after the step it ran (a kernel never straddles
    two steps). Work launched from no op range known (link 0) belongs to the step whose
    window holds its own start on the device, or, in a gap, to the step before the gap."""
    starts = [s for s, _ in steps]
    out: list[int | None] = []
    for k in kernels:
        link = k.linked_correlation_id
        at: int | None
        if link > 0:
            t = launched.get(link)
            at = None if t is None else bisect_right(starts, t) - 1
            if at is not None and (at < 0 or t is None or t > steps[at][1]):
                at = None
        else:
            at = bisect_right(starts, k.start_ns) - 1
            if at < 0 or (at == len(steps) - 1 and k.start_ns > steps[at][1]):
                at = None
        out.append(at)
    return out


def share_device_time(
    kernels: list[KernelSpan], steps: list[tuple[int, int]], launched: dict[int, int]
) -> tuple[dict[int, DeviceBusy], dict[int, list[tuple[int, int]]]]:
    """Each step's :class:`DeviceBusy` by the step's start, and the pieces of time the
    kernels of each op (by correlation id) hold alone.

    Every instant the steps' device work ran is given to one kernel, so nothing is
    counted twice when streams overlap, within a step or across two: compute work before
    a collective's kernel (communication that overlaps compute is shown as overlap,
    never as a module's time), then the kernel that started first. A step's busy time is
    what its own kernels (:func:`kernel_steps`) hold, so the steps add up to the union of
    their work. A collective's kernels are never an op's (their time is the step's
    communication); compute work launched from no op range is ``unlinked_ns``. Work in
    no step is in neither."""
    at_step = kernel_steps(kernels, steps, launched)
    compute = sorted(
        (k.start_ns, k.end_ns, k.linked_correlation_id, at)
        for k, at in zip(kernels, at_step)
        if at is not None and not is_communication_kernel(k.name)
    )
    comm = sorted(
        (k.start_ns, k.end_ns, at) for k, at in zip(kernels, at_step) if at is not None and is_communication_kernel(k.name)
    )
    figures = {at: [0, 0, 0, 0] for at in range(len(steps))}  # compute, comm, comm alone, unlinked
    pieces: dict[int, list[tuple[int, int]]] = {}
    reach: int | None = None
    for start, end, link, at in compute:
        begin = start if reach is None else max(start, reach)
        if end > begin:
            figures[at][0] += end - begin
            if link > 0:
                pieces.setdefault(link, []).append((begin, end))
            else:
                figures[at][3] += end - begin
        reach = end if reach is None else max(reach, end)
    busy_compute = merged((s, e) for s, e, _, _ in compute)
    ends = [e for _, e in busy_compute]
    reach = None
    for start, end, at in comm:
        begin = start if reach is None else max(start, reach)
        if end > begin:
            figures[at][1] += end - begin
            figures[at][2] += (end - begin) - _covered(busy_compute, ends, begin, end)
        reach = end if reach is None else max(reach, end)
    busy: dict[int, DeviceBusy] = {}
    for at, (start, _) in enumerate(steps):
        compute_ns, comm_ns, alone, unlinked = figures[at]
        busy[start] = DeviceBusy(compute_ns + alone, compute_ns, comm_ns, comm_ns - alone, unlinked)
    return busy, pieces


def _covered(spans: list[tuple[int, int]], ends: list[int], start: int, end: int) -> int:
    """How much of ``[start, end)`` the merged ``spans`` (``ends``: their ends) cover."""
    total = 0
    at = bisect_right(ends, start)
    while at < len(spans) and spans[at][0] < end:
        total += max(0, min(end, spans[at][1]) - max(start, spans[at][0]))
        at += 1
    return total
