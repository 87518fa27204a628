"""Derive the module tree from a raw capture. Pure: no torch, no clock.

One walk per pass (``walk_pass``) turns an event stream into self times per node and
phase, and op tables:

- **Forward.** A frame (module call or label) owns the time inside it minus the time of
  frames and backward work nested directly in it (its dynamic children).
- **Backward.** Each backward op belongs to the node whose forward created the autograd
  node being executed: autograd numbers the nodes it creates in order, and a module's
  forward creates the numbers between its ``Enter`` and ``Exit`` events. Gradient accumulation
  (nodes without a number) belongs to the module owning the parameter. An op's *slot*
  runs from its start to the next backward op's start, so the engine's work between ops
  is charged to the op before it.
- **Recompute.** Module calls during backward (activation checkpointing) are frames of
  phase ``recompute``, never counted as forward.
- **The step.** A pass with ``Step`` marks is a whole step: work outside the model becomes
  top-level *parts* (``<loss>``, ``<optimizer:NAME>``, ``<zero_grad>``, labels, and
  ``<other>`` for the rest), so every nanosecond of the step's wall time is in exactly
  one node.

Across passes, ``profile()`` takes each node's median self time (``median_low``, an
observed value) and a training-loop ``Profiler`` sums its steps; either way totals are
then derived as ``self + sum(children)`` over the static tree, so the invariants hold
exactly (see docs/design.md).
"""

from __future__ import annotations

import statistics
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

from layerscope.attribute.chain import BackwardChain
from layerscope.attribute.memory import MemoryResult, MemoryWalk, is_part, scan
from layerscope.raw import (
    MEMORY_NOTES,
    NO_SEQ,
    Adopt,
    DeviceMem,
    Enter,
    Event,
    Exit,
    Free,
    Grad,
    LabelEnter,
    LabelExit,
    Op,
    Optim,
    RawCapture,
    Step,
)
from layerscope.tree import ADDITIVE_PHASE_METRICS, PHASES, ModuleNode, OpStats, PhaseStats, Profile, link

#: A node while building: a module index, or the path of a label or step part.
Key = Union[int, str]

OTHER = "<other>"
LOSS = "<loss>"


@dataclass
class Dynamic:
    """A node that is not a module: a user label, or a part of the step."""

    path: str
    parent: Key | None
    kind: str
    name: str


@dataclass
class PassResult:
    """What one pass (or training step) adds up to, before any tree exists."""

    self_cpu: dict[tuple[Key, str], int] = field(default_factory=dict)
    self_dev: dict[tuple[Key, str], int] = field(default_factory=dict)
    calls: dict[Key, int] = field(default_factory=dict)
    dynamic: dict[str, Dynamic] = field(default_factory=dict)
    ops: dict[tuple[Any, ...], OpStats] = field(default_factory=dict)
    wall_ns: int | None = None
    top_level_ns: int = 0
    outside_ops: int = 0
    phases: set[str] = field(default_factory=set)
    memory: MemoryResult | None = None
    #: The pass as spans, when ops were collected: ``(t0, t1, key, phase, op_key)``, with
    #: ``op_key`` the op's table key for an op and None for a frame or backward span.
    trace: list[tuple[Any, ...]] | None = None
    trace_start_ns: int = 0


def _shape_key(shapes: Any) -> Any:
    # Captured shapes are tuples (hashable as they are); hand-written streams may use
    # lists, whose text is a faithful key.
    try:
        hash(shapes)
    except TypeError:
        return repr(shapes)
    return shapes


def _as_lists(shapes: Any) -> Any:
    """Shapes as JSON-ready nested lists of ints."""
    if isinstance(shapes, (tuple, list)):
        return [_as_lists(s) for s in shapes]
    return shapes


def _label_path(parent_path: str | None, name: str, kind: str) -> str:
    if kind == "optimizer":
        return f"<optimizer:{name}>"
    if kind in ("zero_grad", "loss"):
        return f"<{kind}>"
    if parent_path is None:
        return f"<{name}>"
    return f"{parent_path}[{name}]"


def walk_pass(
    events: list[Event],
    paths: list[str],
    *,
    has_device: bool = False,
    collect_ops: bool = False,
    parents: list[int | None] | None = None,
) -> PassResult:
    """Self times, calls and (with ``collect_ops``) op tables of one event stream, and
    its memory when it holds memory events. ``parents`` (each module's parent index)
    lets backward memory peaks cover a module's ancestors too."""
    result = PassResult()
    self_cpu = result.self_cpu
    self_dev = result.self_dev
    calls = result.calls
    dynamic = result.dynamic
    # Each frame: [key, t_enter, child ns, device t_enter, child device ns, phase,
    #              live bytes at enter, highest live bytes while open]
    frames: list[list[Any]] = []
    seq_starts: list[int] = []
    seq_owners: list[Key] = []
    model_ran = False
    backward_ran = False
    t_first: int | None = None
    t_last: int | None = None
    accounted = 0

    def path_of(key: Key) -> str:
        return paths[key] if isinstance(key, int) else key

    chain = BackwardChain(_ancestry(parents))
    # Backward spans end where their last op's slot ends, not at the event that closes them.
    last_backward_end = 0
    trace: list[tuple[Any, ...]] | None = [] if collect_ops else None
    if trace is not None:
        chain.closers.append(lambda entry, t, _open: trace.append((entry[1], t, entry[0], "backward", None)))
    facts = scan(events)
    mem = None if facts is None else MemoryWalk(facts, chain, _span_rule(parents, calls))
    pending_frees: list[tuple[int, int]] = []

    def end_backward() -> None:
        if chain.entries:
            chain.close(last_backward_end)

    # Ops outside every frame charged to one part in a row (a loss written inline in a
    # Profiler block) make one span of that part: ``[key, t_start, t_end]`` while open.
    part_run: list[Any] = []

    def close_part_run() -> None:
        if part_run:
            key, t0, t1 = part_run
            part_run.clear()
            if trace is not None:
                trace.append((t0, t1, key, "forward", None))
            if mem is not None:
                mem.part_span(key, t0, t1)

    def live() -> int:
        return mem.live if mem is not None else 0

    def top_site(create: bool = True) -> tuple[Key, str] | None:
        # Where work outside any frame or backward chain is charged: the step's parts.
        # A free alone does not make a <loss> part; it goes to <other> instead.
        if t_first is None:
            return None
        key = top_owner()
        if key not in dynamic:
            if not create:
                key = OTHER
            dynamic.setdefault(key, Dynamic(key, None, "loss" if key == LOSS else "other", key[1:-1]))
        return (key, "forward")

    def site_now() -> tuple[Key, str] | None:
        if frames:
            return (frames[-1][0], frames[-1][5])
        owner = chain.owner
        if owner is not None:
            return (owner, "backward")
        return top_site(create=False)

    def charge(key: Key, phase: str, ns: int, dev: int | None) -> None:
        result.phases.add(phase)
        self_cpu[(key, phase)] = self_cpu.get((key, phase), 0) + ns
        if dev is not None:
            self_dev[(key, phase)] = self_dev.get((key, phase), 0) + dev

    def top_owner() -> str:
        return LOSS if model_ran and not backward_ran else OTHER

    def note_seq(seq: int | None, owner: Key) -> None:
        # Autograd nodes numbered from ``seq`` on are created by ``owner`` (until the
        # next note). Numbers from another thread's counter (lower) are ignored.
        if seq is None:
            return
        if seq_starts and seq_starts[-1] == seq:
            seq_owners[-1] = owner
        elif not seq_starts or seq > seq_starts[-1]:
            seq_starts.append(seq)
            seq_owners.append(owner)

    def close(t: int, dev_t: int | None) -> None:
        nonlocal accounted, model_ran
        frame = frames.pop()
        key, t_enter, child_cpu, dev_enter, child_dev, phase = frame[:6]
        if mem is not None:
            mem.frame_closed(frame, t, frames)
        if trace is not None:
            trace.append((t_enter, t, key, phase, None))
        duration = max(0, t - t_enter)
        dev_duration = None
        if dev_enter is not None and dev_t is not None:
            dev_duration = max(0, dev_t - dev_enter)
        charge(key, phase, max(0, duration - child_cpu), None if dev_duration is None else max(0, dev_duration - child_dev))
        if frames:
            frames[-1][2] += duration
            frames[-1][4] += dev_duration or 0
        else:
            accounted += duration
            if isinstance(key, int) and phase == "forward":
                model_ran = True
                result.top_level_ns += duration

    def ensure_dynamic(parent: Key | None, name: str, kind: str) -> str:
        path = _label_path(None if parent is None else path_of(parent), name, kind)
        if path not in dynamic:
            # Step parts sit at the top level, wherever they were entered from.
            top = kind in ("optimizer", "zero_grad", "loss") or parent is None
            dynamic[path] = Dynamic(path, None if top else parent, kind, name)
        return path

    def backward_owner(grad: tuple[int, int | None]) -> Key:
        seq, owner = grad
        if owner is not None:
            return owner
        if seq is None or seq < 0 or seq == NO_SEQ:
            return OTHER
        at = bisect_right(seq_starts, seq) - 1
        return seq_owners[at] if at >= 0 else OTHER

    def op_memory(site: tuple[Key, str] | None, event: Op) -> tuple[int, int]:
        """Bytes the op allocated, and bytes freed while it ran."""
        if mem is None:
            return 0, 0
        freed = 0
        if pending_frees:
            freed = sum(n for t, n in pending_frees if t >= event.t0_ns)
            pending_frees.clear()
        if not event.allocs:
            return 0, freed
        return mem.allocate(event.allocs, site, event.t1_ns, frames), freed

    def add_op(key: Key, phase: str, event: Op, memory: tuple[int, int] = (0, 0)) -> None:
        t0, t1, name, shapes, dev_ns = event.t0_ns, event.t1_ns, event.name, event.input_shapes, event.device_time_ns
        if name is None:
            return
        flops, macs, nbytes, stack = event.flops, event.macs, event.bytes, event.stack
        table_key = (key, phase, name, _shape_key(shapes), stack)
        if trace is not None:
            trace.append((t0, t1, key, phase, table_key))
        op = result.ops.get(table_key)
        if op is None:
            op = result.ops[table_key] = OpStats(
                name=name,
                phase=phase,
                input_shapes=_as_lists(shapes),
                device_time_ns=0 if has_device else None,
                self_device_time_ns=0 if has_device else None,
                flops=None if flops is None else 0,
                macs=None if macs is None else 0,
                bytes=0,
                alloc_bytes=0 if mem is not None else None,
                self_alloc_bytes=0 if mem is not None else None,
                freed_bytes=0 if mem is not None else None,
                stack=None if stack is None else list(stack),
            )
        op.calls += 1
        if mem is not None:
            op.alloc_bytes = (op.alloc_bytes or 0) + memory[0]
            op.self_alloc_bytes = (op.self_alloc_bytes or 0) + memory[0]
            op.freed_bytes = (op.freed_bytes or 0) + memory[1]
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

    n_events = len(events)
    for i in range(n_events):
        event = events[i]
        kind = type(event)
        if kind is Enter:
            index = event.module
            in_bwd = event.in_backward
            note_seq(event.seq, index)
            if not in_bwd:
                calls[index] = calls.get(index, 0) + 1
                if not frames:
                    end_backward()
                    close_part_run()
            frames.append([index, event.t_ns, 0, event.device_t_ns, 0, "recompute" if in_bwd else "forward", live(), live()])
        elif kind is Exit:
            index = event.module
            # Exits match their enters (forward hooks run even when forward raises). If
            # one did not, a frame left open is closed at the same time as its caller,
            # and an exit with no open frame is ignored.
            if not any(frame[0] == index for frame in frames):
                continue
            while frames[-1][0] != index:
                close(event.t_ns, event.device_t_ns)
            close(event.t_ns, event.device_t_ns)
            note_seq(event.seq, frames[-1][0] if frames else top_owner())
        elif kind is LabelEnter:
            path = ensure_dynamic(frames[-1][0] if frames else None, event.name, event.kind)
            note_seq(event.seq, path)
            in_bwd = event.in_backward
            if not in_bwd:
                calls[path] = calls.get(path, 0) + 1
                if not frames:
                    end_backward()
                    close_part_run()
            frames.append([path, event.t_ns, 0, event.device_t_ns, 0, "recompute" if in_bwd else "forward", live(), live()])
        elif kind is LabelExit:
            if not any(isinstance(frame[0], str) for frame in frames):
                continue
            while not isinstance(frames[-1][0], str):
                close(event.t_ns, event.device_t_ns)
            close(event.t_ns, event.device_t_ns)
            note_seq(event.seq, frames[-1][0] if frames else top_owner())
        elif kind is Op:
            grad = event.grad
            if grad is not None and not (frames and frames[-1][5] == "recompute"):
                # Backward work: owned by whoever created the autograd node.
                backward_ran = True
                close_part_run()
                key = backward_owner(grad)
                if isinstance(key, str) and key not in dynamic:
                    dynamic[key] = Dynamic(key, None, "loss" if key == LOSS else "other", key[1:-1])
                if not frames:
                    chain.move(key, event.t0_ns)
                memory = op_memory((key, "backward"), event)
                t0 = event.t0_ns
                # The next event that is not a memory note (frees happen between ops).
                j = i + 1
                while j < n_events and isinstance(events[j], MEMORY_NOTES):
                    j += 1
                following = events[j] if j < n_events else None
                if type(following) is Op and following.grad is not None:
                    end = max(following.t0_ns, event.t1_ns)
                else:
                    end = event.t1_ns
                slot = max(0, end - t0)
                last_backward_end = max(last_backward_end, end)
                charge(key, "backward", slot, event.device_time_ns if has_device else None)
                if frames:
                    frames[-1][2] += slot
                    if has_device:
                        frames[-1][4] += event.device_time_ns or 0
                else:
                    accounted += slot
                if collect_ops:
                    add_op(key, "backward", event, memory)
            elif frames:
                memory = op_memory((frames[-1][0], frames[-1][5]), event)
                if collect_ops:
                    add_op(frames[-1][0], frames[-1][5], event, memory)
            else:
                # Forward work outside every frame: the loss (after the model's forward,
                # before backward) or other glue. Without step marks it is outside the tree.
                end_backward()
                site = top_site()
                memory = op_memory(site, event)
                if site is None:
                    result.outside_ops += 1
                    continue
                key = site[0]
                if part_run and part_run[0] == key:
                    part_run[2] = event.t1_ns
                else:
                    close_part_run()
                    part_run.extend((key, event.t0_ns, event.t1_ns))
                elapsed = max(0, event.t1_ns - event.t0_ns)
                charge(key, "forward", elapsed, event.device_time_ns if has_device else None)
                accounted += elapsed
                if collect_ops:
                    add_op(key, "forward", event, memory)
        elif kind is Step:
            close_part_run()
            if t_first is None:
                t_first = event.t_ns
            t_last = event.t_ns
        elif mem is not None:
            if kind is Free:
                nbytes = mem.free(event.serial, site_now(), event.t_ns)
                if nbytes:
                    pending_frees.append((event.t_ns, nbytes))
            elif kind is Adopt:
                mem.adopt(event, site_now(), frames)
            elif kind is Grad:
                mem.grad(event)
            elif kind is Optim:
                mem.optimizer(event)
            elif kind is DeviceMem:
                mem.device(event)
    end_backward()
    close_part_run()
    if frames and t_last is not None:
        while frames:
            close(t_last, None)
    t_base = t_first if t_first is not None else _first_time(events)
    if mem is not None:
        result.memory = mem.finish(t_base, path_of)
    if trace is not None:
        trace.sort(key=_span_order)
        result.trace = trace
        result.trace_start_ns = t_base
    if t_first is not None and t_last is not None:
        result.wall_ns = t_last - t_first
        dynamic.setdefault(OTHER, Dynamic(OTHER, None, "other", "other"))
        charge(OTHER, "forward", max(0, result.wall_ns - accounted), None)
    return result


def parent_indices(modules: list[Any]) -> list[int | None]:
    """Each module's parent as an index into ``modules`` (None for the root)."""
    index = {info.path: n for n, info in enumerate(modules)}
    return [None if info.parent is None else index.get(info.parent) for info in modules]


def _first_time(events: list[Event]) -> int:
    for event in events:
        if isinstance(event, Op):
            return event.t0_ns
        if isinstance(event, (Enter, Exit, LabelEnter, LabelExit, Step)):
            return event.t_ns
    return 0


def _span_order(span: tuple[Any, ...]) -> tuple[int, int, int]:
    # By start; an enclosing span (longer) before the spans it holds; ops after frames.
    return (span[0], -span[1], 0 if span[4] is None else 1)


def _ancestry(parents: list[int | None] | None) -> Callable[[Key], list[Key]]:
    """``key`` and its ancestors, outermost first (a part or label stands alone)."""
    memo: dict[Key, list[Key]] = {}

    def chain(key: Key) -> list[Key]:
        found = memo.get(key)
        if found is None:
            found = [key]
            if isinstance(key, int) and parents is not None:
                up = parents[key]
                while up is not None:
                    found.append(up)
                    up = parents[up]
            found.reverse()
            memo[key] = found
        return found

    return chain


def _span_rule(parents: list[int | None] | None, calls: dict[Key, int]) -> Callable[[Key, bool], bool]:
    """Which frames the memory timeline draws: the step's parts, the model, and the
    modules right under it, counting only modules that were called (the blocks of a
    ``ModuleList`` the model loops over are right under it)."""
    def worthy(key: Key, top_level: bool) -> bool:
        if not isinstance(key, int):
            return top_level
        if parents is None:
            return top_level
        if not calls.get(key):
            return False
        called_above = 0
        up = parents[key]
        while up is not None:
            called_above += 1 if calls.get(up) else 0
            up = parents[up]
        return called_above <= 1

    return worthy


# -- combining passes ---------------------------------------------------------------------


def _median(values: list[int]) -> int:
    if len(values) == 1:
        return values[0]
    return int(statistics.median_low(values)) if values else 0


class Accumulator:
    """Sums training steps into one running total, so a long run keeps no raw events."""

    def __init__(self) -> None:
        self.total = PassResult()
        self.steps = 0
        self.step_times_ns: list[int] = []

    def add(self, result: PassResult) -> None:
        total = self.total
        for table, other in ((total.self_cpu, result.self_cpu), (total.self_dev, result.self_dev)):
            for k, v in other.items():
                table[k] = table.get(k, 0) + v
        for k, v in result.calls.items():
            total.calls[k] = total.calls.get(k, 0) + v
        for path, dyn in result.dynamic.items():
            total.dynamic.setdefault(path, dyn)
        for k, op in result.ops.items():
            mine = total.ops.get(k)
            if mine is None:
                total.ops[k] = op
            else:
                _merge_op(mine, op)
        total.phases |= result.phases
        if result.trace is not None:
            # The trace is the last step's: a long run keeps one step of spans.
            total.trace, total.trace_start_ns = result.trace, result.trace_start_ns
        if result.memory is not None:
            if total.memory is None:
                total.memory = MemoryResult()
            total.memory.merge(result.memory)
        total.outside_ops += result.outside_ops
        total.top_level_ns += result.top_level_ns
        if result.wall_ns is not None:
            self.step_times_ns.append(result.wall_ns)
            total.wall_ns = (total.wall_ns or 0) + result.wall_ns
        self.steps += 1


def _merge_op(into: OpStats, other: OpStats) -> None:
    into.calls += other.calls
    into.cpu_time_ns += other.cpu_time_ns
    into.self_cpu_time_ns += other.self_cpu_time_ns
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


def _median_result(passes: list[PassResult]) -> PassResult:
    """Per node and phase, the median self time over passes (0 where a pass lacked it)."""
    out = PassResult()
    keys = {k for p in passes for k in p.self_cpu}
    for k in keys:
        out.self_cpu[k] = _median([p.self_cpu.get(k, 0) for p in passes])
    dev_keys = {k for p in passes for k in p.self_dev}
    for k in dev_keys:
        out.self_dev[k] = _median([p.self_dev.get(k, 0) for p in passes])
    call_keys = {k for p in passes for k in p.calls}
    for k in call_keys:
        out.calls[k] = _median([p.calls.get(k, 0) for p in passes])
    for p in passes:
        for path, dyn in p.dynamic.items():
            out.dynamic.setdefault(path, dyn)
        out.phases |= p.phases
    return out


# -- the tree ------------------------------------------------------------------------------


def build_profile(raw: RawCapture) -> Profile:
    """The :class:`Profile` for ``raw`` (median over its timing passes)."""
    paths = [info.path for info in raw.modules]
    passes = [walk_pass(events, paths, has_device=raw.has_device_time) for events in raw.timing_passes]
    op_result = None
    if raw.op_pass is not None:
        op_result = walk_pass(
            raw.op_pass, paths, has_device=raw.has_device_time, collect_ops=True, parents=parent_indices(raw.modules)
        )
    times = _median_result(passes) if passes else PassResult()
    # An untimed capture (count_flops) still knows how often each module ran.
    if not passes and op_result is not None:
        times.calls = dict(op_result.calls)
        times.dynamic = dict(op_result.dynamic)
        times.phases = set(op_result.phases)
    meta = dict(raw.meta)
    if passes:
        meta["pass_cpu_time_ns"] = [p.top_level_ns for p in passes]
        walls = [p.wall_ns for p in passes if p.wall_ns is not None]
        if walls:
            meta["step_times_ns"] = walls
    return assemble(raw, times, op_result, meta)


def build_from_steps(raw: RawCapture, steps: Accumulator, *, counted: bool = True) -> Profile:
    """The :class:`Profile` of training steps summed by an :class:`Accumulator`;
    ``counted`` says whether ops (and FLOPs) were recorded."""
    meta = dict(raw.meta)
    meta["steps"] = steps.steps
    meta["pass_cpu_time_ns"] = [steps.total.top_level_ns]
    if steps.step_times_ns:
        meta["step_times_ns"] = list(steps.step_times_ns)
    return assemble(raw, steps.total, steps.total if counted else None, meta)


def assemble(raw: RawCapture, times: PassResult, op_result: PassResult | None, meta: dict[str, Any]) -> Profile:
    """Nodes from per-node self figures, totals derived bottom-up."""
    has_device = raw.has_device_time
    counted = op_result is not None
    memory = op_result.memory if op_result is not None else None
    phases = set(times.phases) | (op_result.phases if op_result is not None else set())
    if op_result is not None:
        for path, dyn in op_result.dynamic.items():
            times.dynamic.setdefault(path, dyn)

    ops_by_key: dict[Key, list[OpStats]] = {}
    op_index: dict[tuple[Any, ...], int] = {}
    if op_result is not None:
        for table_key, op in op_result.ops.items():
            listed = ops_by_key.setdefault(table_key[0], [])
            op_index[table_key] = len(listed)
            listed.append(op)

    def phase_stats(key: Key, phase: str, selected: bool) -> PhaseStats | None:
        if phase != "forward" and phase not in phases:
            return None
        own_ops = [op for op in ops_by_key.get(key, []) if op.phase == phase] if selected else []
        self_dev = times.self_dev.get((key, phase), 0) if has_device and selected else None
        mem: dict[str, int | None] = {}
        if memory is not None:
            site = (key, phase)
            mem = {
                "self_alloc_bytes": memory.alloc.get(site, 0),
                "alloc_bytes": 0,
                "self_freed_bytes": memory.freed.get(site, 0),
                "freed_bytes": 0,
                "peak_bytes": memory.peak.get(site, 0),
                "self_activation_bytes": memory.activation.get(site, 0),
                "activation_bytes": 0,
                "self_grad_bytes": memory.grad.get(site, 0),
                "grad_bytes": 0,
            }
        return PhaseStats(
            **mem,
            self_cpu_time_ns=times.self_cpu.get((key, phase), 0) if selected else 0,
            self_device_time_ns=self_dev,
            device_time_ns=0 if has_device else None,
            self_flops=sum(op.flops or 0 for op in own_ops) if counted else None,
            self_macs=sum(op.macs or 0 for op in own_ops) if counted else None,
            self_bytes=sum(op.bytes or 0 for op in own_ops) if counted else None,
        )

    def make(key: Key, **fields: Any) -> ModuleNode:
        selected = fields.pop("selected", True)
        ops = ops_by_key.get(key, []) if selected else []
        node = ModuleNode(
            calls=times.calls.get(key, 0) if selected else 0,
            profiled=selected,
            forward=phase_stats(key, "forward", selected) or PhaseStats(),
            backward=phase_stats(key, "backward", selected),
            recompute=phase_stats(key, "recompute", selected),
            ops=ops,
            unsupported_ops=_unsupported(ops),
            **fields,
        )
        return node

    nodes: list[ModuleNode] = []
    for index, info in enumerate(raw.modules):
        shapes = raw.module_shapes.get(index, (None, None))
        nodes.append(
            make(
                index,
                selected=info.selected,
                path=info.path,
                type=info.type,
                parent=info.parent,
                depth=info.depth,
                params=info.params,
                extra_repr=info.extra_repr,
                input_shapes=shapes[0],
                output_shapes=shapes[1],
            )
        )
    # Labels hang under the module (or label) they ran in, after its modules; step parts
    # are top-level trees of their own.
    paths = [info.path for info in raw.modules]
    model_nodes = {node.path: node for node in nodes}
    dynamic_nodes: dict[str, ModuleNode] = {}
    parts: list[ModuleNode] = []
    model_labels: set[str] = set()
    pending = list(times.dynamic.values())
    while pending:
        waiting = []
        for dyn in pending:
            parent_path = None
            if dyn.parent is not None:
                parent_path = paths[dyn.parent] if isinstance(dyn.parent, int) else dyn.parent
            parent_node = None
            if parent_path is not None:
                parent_node = model_nodes.get(parent_path) or dynamic_nodes.get(parent_path)
                if parent_node is None:
                    waiting.append(dyn)
                    continue
            node = make(
                dyn.path,
                path=dyn.path,
                type=dyn.name if dyn.kind == "optimizer" else dyn.kind,
                kind=dyn.kind,
                parent=parent_path,
                depth=0 if parent_node is None else parent_node.depth + 1,
            )
            dynamic_nodes[dyn.path] = node
            if parent_node is None:
                parts.append(node)
            elif parent_path in model_nodes or parent_path in model_labels:
                nodes.append(node)
                model_labels.add(dyn.path)
            else:
                parent_node.children.append(node)
        if len(waiting) == len(pending):  # orphans (a walk never makes them): top level
            for dyn in waiting:
                dyn.parent = None
        pending = waiting
    root = link(nodes)
    parts.sort(key=_part_order)
    for tree in [root, *parts]:
        _sum_up(tree)

    meta["unattributed_ops"] = times.outside_ops if op_result is None else op_result.outside_ops
    if parts and meta.get("timed", True):
        meta["step_time_ns"] = sum(
            stats.self_cpu_time_ns for tree in [root, *parts] for node in tree.walk() for _, stats in node.phases()
        )
    return Profile(
        root=root,
        meta=meta,
        param_bytes=raw.param_bytes,
        parts=parts,
        memory=_memory_summary(raw, memory, paths),
        trace=_trace(op_result, op_index, paths),
    )


def _trace(op_result: PassResult | None, op_index: dict[tuple[Any, ...], int], paths: list[str]) -> dict[str, Any] | None:
    """``Profile.trace``: the op pass (a ``Profiler``'s last step) as spans."""
    if op_result is None or op_result.trace is None:
        return None
    base = op_result.trace_start_ns
    spans = []
    for t0, t1, key, phase, op_key in op_result.trace:
        path = paths[key] if isinstance(key, int) else key
        index = -1 if op_key is None else op_index.get(op_key, -1)
        spans.append([t0 - base, max(0, t1 - t0), path, phase, index])
    return {"spans": spans}


def _memory_summary(raw: RawCapture, memory: MemoryResult | None, paths: list[str]) -> dict[str, Any] | None:
    """The model-level memory of a profile (``Profile.memory``)."""
    if memory is None:
        return None
    at = memory.peak_at
    return {
        **raw.memory_static,
        "optimizer_state_bytes": {
            name: {"total": sum(by_key.values()), "by_key": dict(sorted(by_key.items()))}
            for name, by_key in sorted(memory.optimizers.items())
        },
        "baseline_bytes": memory.baseline_bytes,
        "peak_bytes": memory.peak_bytes,
        "peak_at": None if at is None else {
            "path": paths[at[0]] if isinstance(at[0], int) else at[0],
            # A step part (<optimizer:Adam>, ...) has no forward: only its backward work
            # (the loss's) names a phase.
            "phase": None if is_part(at[0]) and at[1] == "forward" else at[1],
            "t_ns": memory.peak_t_ns,
        },
        "peak_categories": dict(memory.peak_categories),
        "peak_by_phase": dict(sorted(memory.peak_by_phase.items())),
        "timeline": memory.timeline,
        "device": memory.device,
    }


_PART_RANK = {"label": 0, "loss": 1, "optimizer": 2, "zero_grad": 3, "other": 4}


def _part_order(node: ModuleNode) -> int:
    # Labels first, in the order they ran (the sort is stable), then the fixed parts.
    return _PART_RANK.get(node.kind, 0)


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
        for phase in PHASES:
            stats = getattr(node, phase)
            if stats is None:
                continue
            for total_name, self_name in ADDITIVE_PHASE_METRICS:
                own = getattr(stats, self_name)
                if own is None:
                    setattr(stats, total_name, None)
                    continue
                kids = 0
                for child in node.children:
                    child_stats = getattr(child, phase)
                    if child_stats is not None:
                        kids += getattr(child_stats, total_name) or 0
                setattr(stats, total_name, own + kids)
