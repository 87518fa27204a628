"""Derive the module tree from a raw capture. Pure: no torch, no clock.

Per pass, a module's *self* time is the time inside its calls minus the time of the
module calls nested directly in them (its dynamic children). Across passes the self
times' median is taken per module, and every *total* is then derived as
``self + sum(children totals)`` over the static ``named_modules()`` tree. So the
invariants hold exactly, and a module called from outside its structural parent is
still counted under its structural parent (see docs/design.md).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from layerscope.raw import ENTER, EXIT, OP, RawCapture
from layerscope.tree import ADDITIVE_PHASE_METRICS, ModuleNode, OpStats, PhaseStats, Profile, link


@dataclass
class _PassTotals:
    calls: list[int]
    self_cpu_ns: list[int]
    self_device_ns: list[int]
    top_level_cpu_ns: int


def _walk_pass(events: list[tuple[Any, ...]], n_modules: int) -> _PassTotals:
    calls = [0] * n_modules
    self_cpu = [0] * n_modules
    self_dev = [0] * n_modules
    top_level = 0
    # Each frame: [module index, t_enter, child cpu ns, device t_enter, child device ns]
    stack: list[list[Any]] = []

    def close(t: int, dev_t: int | None) -> None:
        nonlocal top_level
        index, t_enter, child_cpu, dev_enter, child_dev = stack.pop()
        duration = max(0, t - t_enter)
        calls[index] += 1
        self_cpu[index] += max(0, duration - child_cpu)
        dev_duration = 0
        if dev_enter is not None and dev_t is not None:
            dev_duration = max(0, dev_t - dev_enter)
            self_dev[index] += max(0, dev_duration - child_dev)
        if stack:
            stack[-1][2] += duration
            stack[-1][4] += dev_duration
        else:
            top_level += duration

    for event in events:
        kind = event[0]
        if kind == ENTER:
            stack.append([event[2], event[1], 0, event[3], 0])
        elif kind == EXIT:
            index = event[2]
            # Exits match their enters (forward hooks run even when forward raises). If
            # one did not, a frame left open is closed at the same time as its caller,
            # and an exit with no open frame is ignored.
            if not any(frame[0] == index for frame in stack):
                continue
            while stack[-1][0] != index:
                close(event[1], event[3])
            close(event[1], event[3])
    return _PassTotals(calls, self_cpu, self_dev, top_level)


def _shape_key(shapes: Any) -> str:
    # Shapes are nested lists of ints: their text is a faithful, fast, hashable key.
    return repr(shapes)


def _attribute_ops(
    events: list[tuple[Any, ...]], n_modules: int, has_device: bool
) -> tuple[list[list[OpStats]], int]:
    """Aggregate op events per innermost running module; count those outside any."""
    per_module: list[dict[tuple[str, Any], OpStats]] = [{} for _ in range(n_modules)]
    stack: list[int] = []
    outside = 0
    for event in events:
        kind = event[0]
        if kind == ENTER:
            stack.append(event[2])
        elif kind == EXIT:
            if event[2] in stack:
                while stack.pop() != event[2]:
                    pass
        elif kind == OP:
            if not stack:
                outside += 1
                continue
            t0, t1, name, shapes, dev_ns = event[1:6]
            flops, macs, nbytes = event[6:9] if len(event) >= 9 else (None, None, 0)
            table = per_module[stack[-1]]
            key = (name, _shape_key(shapes))
            op = table.get(key)
            if op is None:
                op = table[key] = OpStats(
                    name=name,
                    input_shapes=shapes,
                    device_time_ns=0 if has_device else None,
                    self_device_time_ns=0 if has_device else None,
                    flops=None if flops is None else 0,
                    macs=None if macs is None else 0,
                    bytes=0,
                )
            op.calls += 1
            if flops is not None and op.flops is not None:
                op.flops += flops
                op.macs = (op.macs or 0) + (macs or 0)
            op.bytes = (op.bytes or 0) + (nbytes or 0)
            elapsed = max(0, t1 - t0)
            # Ops are seen at the dispatcher, one level deep: self time is total time.
            op.cpu_time_ns += elapsed
            op.self_cpu_time_ns += elapsed
            if has_device and dev_ns is not None:
                op.device_time_ns = (op.device_time_ns or 0) + dev_ns
                op.self_device_time_ns = (op.self_device_time_ns or 0) + dev_ns
    return [list(table.values()) for table in per_module], outside


def _median(values: list[int]) -> int:
    if len(values) == 1:
        return values[0]
    return int(statistics.median_low(values)) if values else 0


def build_profile(raw: RawCapture) -> Profile:
    """The :class:`Profile` for ``raw``; its invariants hold by construction."""
    n = len(raw.modules)
    passes = [_walk_pass(events, n) for events in raw.timing_passes]
    # An untimed capture (count_flops) still knows how often each module ran.
    call_passes = passes or ([_walk_pass(raw.op_pass, n)] if raw.op_pass is not None else [])
    if raw.op_pass is not None:
        ops, outside = _attribute_ops(raw.op_pass, n, raw.has_device_time)
    else:
        ops, outside = [[] for _ in range(n)], 0

    nodes: list[ModuleNode] = []
    for index, info in enumerate(raw.modules):
        self_cpu = _median([p.self_cpu_ns[index] for p in passes])
        self_dev = _median([p.self_device_ns[index] for p in passes]) if raw.has_device_time else None
        shapes = raw.module_shapes.get(index, (None, None))
        module_ops = ops[index] if info.selected else []
        counted = raw.op_pass is not None
        nodes.append(
            ModuleNode(
                path=info.path,
                type=info.type,
                parent=info.parent,
                depth=info.depth,
                calls=_median([p.calls[index] for p in call_passes]) if info.selected else 0,
                params=info.params,
                profiled=info.selected,
                forward=PhaseStats(
                    self_cpu_time_ns=self_cpu if info.selected else 0,
                    self_device_time_ns=(self_dev if info.selected else 0) if raw.has_device_time else None,
                    device_time_ns=0 if raw.has_device_time else None,
                    self_flops=sum(op.flops or 0 for op in module_ops) if counted else None,
                    self_macs=sum(op.macs or 0 for op in module_ops) if counted else None,
                    self_bytes=sum(op.bytes or 0 for op in module_ops) if counted else None,
                ),
                ops=module_ops,
                unsupported_ops=_unsupported(module_ops),
                extra_repr=info.extra_repr,
                input_shapes=shapes[0],
                output_shapes=shapes[1],
            )
        )
    root = link(nodes)
    _sum_up(root)

    meta = dict(raw.meta)
    meta["unattributed_ops"] = outside
    if passes:
        meta["pass_cpu_time_ns"] = [p.top_level_cpu_ns for p in passes]
    return Profile(root=root, meta=meta, param_bytes=raw.param_bytes)


def _unsupported(ops: list[OpStats]) -> dict[str, int]:
    found: dict[str, int] = {}
    for op in ops:
        if op.flops is None:
            found[op.name] = found.get(op.name, 0) + op.calls
    return found


def _sum_up(root: ModuleNode) -> None:
    """Derive totals bottom-up (iteratively: real models nest deeper than recursion likes)."""
    for node in reversed(list(root.walk())):
        node.params_total = node.params + sum(c.params_total for c in node.children)
        fwd = node.forward
        fwd.cpu_time_ns = fwd.self_cpu_time_ns + sum(c.forward.cpu_time_ns for c in node.children)
        for total_name, self_name in ADDITIVE_PHASE_METRICS[1:]:
            own = getattr(fwd, self_name)
            if own is not None:
                setattr(fwd, total_name, own + sum(getattr(c.forward, total_name) or 0 for c in node.children))
