"""Passes combined into one: ``profile()``'s median pass, or running sums over a
``Profiler``'s steps (only self figures are summed; totals are derived later over the
static tree, so the invariants hold exactly: see docs/design.md).
"""

from __future__ import annotations

from layerscope.attribute.memory import MemoryResult
from layerscope.attribute.walk import PassResult, add_busy, merge_enclosing, merge_shapes
from layerscope.model.tree import OpStats


class Accumulator:
    """Sums training steps into one running total, so a long run keeps no raw events."""

    def __init__(self) -> None:
        self.total = PassResult()
        self.steps = 0
        self.step_times_ns: list[int] = []
        #: The number of each step with a wall time, as ``step_times_ns`` lists them.
        self.step_numbers: list[int] = []

    def add(self, result: PassResult, number: int | None = None) -> None:
        total = self.total
        for table, other in (
            (total.self_cpu, result.self_cpu),
            (total.self_dev, result.self_dev),
            (total.self_comm, result.self_comm),
        ):
            for k, v in other.items():
                table[k] = table.get(k, 0) + v
        for key, calls in result.calls.items():
            total.calls[key] = total.calls.get(key, 0) + calls
        for path, dyn in result.dynamic.items():
            total.dynamic.setdefault(path, dyn)
        merge_enclosing(total.enclosing, result.enclosing)
        merge_shapes(total.module_shapes, result.module_shapes)
        for k, op in result.ops.items():
            mine = total.ops.get(k)
            if mine is None:
                total.ops[k] = op
            else:
                _merge_op(mine, op)
        total.phases |= result.phases
        if result.trace is not None:
            # The trace is the last step's: a long run keeps one step of spans, and its
            # memory over time with it (the summed memory keeps the highest peak's step).
            total.trace, total.trace_start_ns = result.trace, result.trace_start_ns
            total.trace_step_ns = result.trace_step_ns
            total.trace_memory = None if result.memory is None else result.memory.timeline
        if result.memory is not None:
            if total.memory is None:
                total.memory = MemoryResult()
            total.memory.merge(result.memory)
        total.device_busy = add_busy(total.device_busy, result.device_busy)
        total.outside_ops += result.outside_ops
        total.top_level_ns += result.top_level_ns
        if result.wall_ns is not None:
            self.step_times_ns.append(result.wall_ns)
            if number is not None:
                self.step_numbers.append(number)
            total.wall_ns = (total.wall_ns or 0) + result.wall_ns
        self.steps += 1


def _merge_op(into: OpStats, other: OpStats) -> None:
    into.calls += other.calls
    into.cpu_time_ns = (into.cpu_time_ns or 0) + (other.cpu_time_ns or 0)
    into.self_cpu_time_ns = (into.self_cpu_time_ns or 0) + (other.self_cpu_time_ns or 0)
    if into.device_time_ns is not None:
        into.device_time_ns += other.device_time_ns or 0
        into.self_device_time_ns = (into.self_device_time_ns or 0) + (other.self_device_time_ns or 0)
    if into.flops is not None and other.flops is not None:
        into.flops += other.flops
        into.macs = (into.macs or 0) + (other.macs or 0)
    elif other.flops is None:
        into.flops = into.macs = None
    into.bytes = (into.bytes or 0) + (other.bytes or 0)
    if into.alloc_bytes is not None and other.alloc_bytes is not None:
        into.alloc_bytes += other.alloc_bytes
        into.self_alloc_bytes = (into.self_alloc_bytes or 0) + (other.self_alloc_bytes or 0)
        into.freed_bytes = (into.freed_bytes or 0) + (other.freed_bytes or 0)
