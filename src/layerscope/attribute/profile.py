"""The tree: a :class:`~layerscope.model.tree.Profile` assembled from per-node self figures, with
every total derived bottom-up as ``self + sum(children)``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypedDict

from layerscope.attribute.chain import Key, key_path
from layerscope.attribute.combine import Accumulator
from layerscope.attribute.memory import MemoryResult, is_part
from layerscope.attribute.walk import (
    Dynamic,
    PassResult,
    merge_enclosing,
    merge_shapes,
    parent_indices,
    walk_pass,
)
from layerscope.base.comm import is_communication
from layerscope.base.stats import observed_median_index
from layerscope.model.compile_info import CompileInfo
from layerscope.model.raw import DeviceBusy, RawCapture
from layerscope.model.runfacts import RunFigures
from layerscope.model.sidedocs import DeviceLedger, Flows, MemorySummary, OptimizerState, PeakAt, Spans, Trace
from layerscope.model.tree import (
    ADDITIVE_PHASE_METRICS,
    PHASES,
    ModuleNode,
    OpStats,
    PhaseStats,
    Profile,
    params_sum,
)


def build_profile(raw: RawCapture) -> Profile:
    """The :class:`Profile` for ``raw``: its median timing pass, whole (with its op
    rows when the passes are detailed), or its op pass alone (an untimed count)."""
    paths = [info.path for info in raw.modules]
    passes = [walk_pass(events, paths, has_device=raw.has_device_time) for events in raw.timing_passes]
    if not passes:
        # An untimed count: no times, but it knows how often each module ran.
        counted = op_walk(raw)
        times = PassResult()
        if counted is not None:
            times.calls = dict(counted.calls)
            times.dynamic = dict(counted.dynamic)
            times.enclosing = dict(counted.enclosing)
            times.phases = set(counted.phases)
        return assemble(raw, times, counted, RunFigures())
    walls = [p.wall_ns for p in passes if p.wall_ns is not None]
    # The median pass, an observed one (the lower of two middles): every figure is that
    # run's, so the tree adds up to a measured time, op rows add up within their
    # modules and the trace is the tree's run.
    shown = observed_median_index([p.wall_ns if p.wall_ns is not None else p.top_level_ns for p in passes])
    figures = RunFigures(
        pass_cpu_time_ns=[p.top_level_ns for p in passes],
        step_times_ns=walls or None,
        # Passes are counted from 1, as the footer and the trace name the shown one.
        step_numbers=list(range(1, len(walls) + 1)) if walls else None,
        shown_pass=shown,
    )
    if not raw.detailed_passes:
        result = passes[shown]
        op_result = op_walk(raw)
    else:
        result = op_result = walk_pass(
            raw.timing_passes[shown], paths, has_device=raw.has_device_time, collect_ops=True,
            parents=parent_indices(raw.modules),
        )
    # A capture reads each module's shapes once, in whichever pass called it first.
    for other in passes:
        merge_shapes(result.module_shapes, other.module_shapes)
    return assemble(raw, result, op_result, figures)


def op_walk(raw: RawCapture) -> PassResult | None:
    """``raw``'s op pass walked (its op rows, calls, memory and spans); None without one."""
    if raw.op_pass is None:
        return None
    paths = [info.path for info in raw.modules]
    return walk_pass(
        raw.op_pass, paths, has_device=raw.has_device_time, collect_ops=True, parents=parent_indices(raw.modules)
    )


def build_from_steps(raw: RawCapture, steps: Accumulator, *, counted: bool = True) -> Profile:
    """The :class:`Profile` of training steps summed by an :class:`Accumulator`: every
    step carried its own times and whatever it recorded (``counted``: ops and FLOPs),
    so every figure is the steps' own sum."""
    times = list(steps.step_times_ns)
    if steps.steps <= 1:
        steps.total.trace_memory = None  # one step: the profile's own timeline is the traced one
    figures = RunFigures(
        steps=steps.steps,
        pass_cpu_time_ns=[steps.total.top_level_ns],
        step_times_ns=times or None,
        step_numbers=list(steps.step_numbers) if times and len(steps.step_numbers) == len(times) else None,
    )
    return assemble(raw, steps.total, steps.total if counted else None, figures)


def build_from_light_steps(raw: RawCapture, detailed: Accumulator, light: Accumulator) -> Profile:
    """The :class:`Profile` of a block that recorded some steps in detail and timed the
    others lightly (``Profiler(detail="first")``), each figure from the steps that
    measured it, never scaled from one kind of step to the other: per step, each node's
    time (CPU, device, communication) is its mean over the ``light`` steps, and its
    calls, FLOPs, MACs, bytes, memory, op rows and shapes are the ``detailed`` steps'
    (one step: a cycle details its first). The op rows' times are None: the detailed
    step's carry the cost of recording every op's shapes and memory, and a light step's
    ops have no shapes to match them by. No trace: no one run holds both."""
    n = light.steps
    counted, timed = detailed.total, light.total
    # layerscope's own time in the detailed step (its notes) is no node of the light steps'.
    dynamic = {path: dyn for path, dyn in counted.dynamic.items() if dyn.kind != "overhead" or path in timed.dynamic}
    times = PassResult(
        self_cpu=_mean(timed.self_cpu, n), self_dev=_mean(timed.self_dev, n), self_comm=_mean(timed.self_comm, n),
        calls=dict(counted.calls), dynamic=dynamic, enclosing=dict(counted.enclosing),
        phases=set(counted.phases) | timed.phases, module_shapes=dict(counted.module_shapes),
        top_level_ns=timed.top_level_ns // n,
        device_busy=None if timed.device_busy is None else _mean_busy(timed.device_busy, n),
    )
    for path, dyn in timed.dynamic.items():
        times.dynamic.setdefault(path, dyn)
    merge_enclosing(times.enclosing, timed.enclosing)
    untimed = replace(
        counted, trace=None, dynamic=dict(times.dynamic),
        ops={
            key: replace(op, cpu_time_ns=None, self_cpu_time_ns=None, device_time_ns=None, self_device_time_ns=None)
            for key, op in counted.ops.items()
        },
    )
    walls = list(light.step_times_ns)
    figures = RunFigures(
        steps=n,
        pass_cpu_time_ns=[times.top_level_ns],
        step_times_ns=walls or None,
        step_numbers=list(light.step_numbers) if walls and len(light.step_numbers) == len(walls) else None,
        detailed_steps=list(detailed.step_numbers),
    )
    return assemble(raw, times, untimed, figures)


def _mean(sums: dict[Any, int], n: int) -> dict[Any, int]:
    """Each figure's mean over ``n`` steps, in whole ns, adding up to the mean of their
    sum (``sum // n``): the remainders' ns go to the largest remainders (the first of
    equal ones), so a tree of means adds up as its steps did."""
    means: dict[Any, int] = {}
    rests: list[tuple[int, int, Any]] = []
    for order, (key, value) in enumerate(sums.items()):
        means[key], rest = divmod(value, n)
        rests.append((-rest, order, key))
    extra = sum(sums.values()) // n - sum(means.values())
    for _, _, key in sorted(rests)[:extra]:
        means[key] += 1
    return means


def _mean_busy(busy: DeviceBusy, n: int) -> DeviceBusy:
    """The steps' device work per step: each figure's mean, the busy time derived as the
    steps' is (``compute + comm - overlap``), so the ledger of means adds up exactly and
    none of its rests is negative."""
    compute, comm, overlap, unlinked = (busy.compute_ns // n, busy.comm_ns // n, busy.overlap_ns // n, busy.unlinked_ns // n)
    return DeviceBusy(compute + comm - overlap, compute, comm, overlap, unlinked)


class _CommFigures(TypedDict, total=False):
    """A node's own communication figures, where collectives ran: :class:`PhaseStats` fields."""

    self_comm_time_ns: int
    self_comm_bytes: int | None


class _MemoryFigures(TypedDict, total=False):
    """A node's own memory figures, when memory was tracked: :class:`PhaseStats` fields
    (None where the capture could not know them)."""

    self_alloc_bytes: int
    alloc_bytes: int
    self_freed_bytes: int
    freed_bytes: int
    peak_bytes: int
    self_activation_bytes: int | None
    activation_bytes: int | None
    self_grad_bytes: int | None
    grad_bytes: int | None


def assemble(
    raw: RawCapture, times: PassResult, op_result: PassResult | None, figures: RunFigures,
    compiled: CompileInfo | None = None,
) -> Profile:
    """Nodes from per-node self figures, totals derived bottom-up; ``figures``: the
    passes' or steps' figures, to which the step's time and the ops outside the tree are
    added; ``compiled``: the run of a compiled model whose times these are. A new
    profile, with a copy of ``raw``'s facts: what it is given (``times``,
    ``op_result``, ``figures``) is left as it was."""
    phases = set(times.phases) | (op_result.phases if op_result is not None else set())
    # The made nodes and enclosing labels of both walks (the timed one's first).
    dynamic = dict(times.dynamic)
    enclosing = dict(times.enclosing)
    if op_result is not None:
        for path, dyn in op_result.dynamic.items():
            dynamic.setdefault(path, dyn)
        if op_result is not times:
            merge_enclosing(enclosing, op_result.enclosing)
    maker = _NodeMaker(raw, times, op_result, phases)
    # Each module's shapes, as the walks read them from the streams' records.
    module_shapes = dict(times.module_shapes)
    if op_result is not None:
        merge_shapes(module_shapes, op_result.module_shapes)

    # Counts are known for every module or for none (a module table read from a trace
    # recorded without the model): one unknown makes the whole profile's unknown, so a
    # tree never mixes counts with gaps that would read as 0.
    params_known = all(info.params is not None for info in raw.modules)
    no_params = 0 if params_known else None  # what labels and step parts own
    nodes: list[ModuleNode] = []
    for index, info in enumerate(raw.modules):
        shapes = module_shapes.get(index, (None, None))
        nodes.append(
            maker.node(
                index,
                selected=info.selected,
                path=info.path,
                type=info.type,
                parent=info.parent,
                depth=info.depth,
                params=info.params if params_known else None,
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
    # Each made node's parent; an orphan's is None (below).
    made_parents: dict[str, Key | None] = {path: dyn.parent for path, dyn in dynamic.items()}
    pending = list(dynamic.values())
    while pending:
        waiting = []
        for dyn in pending:
            parent_path = None
            parent = made_parents[dyn.path]
            if parent is not None:
                parent_path = key_path(parent, paths)
            parent_node = None
            if parent_path is not None:
                parent_node = model_nodes.get(parent_path) or dynamic_nodes.get(parent_path)
                if parent_node is None:
                    waiting.append(dyn)
                    continue
            node = maker.node(
                dyn.path,
                path=dyn.path,
                type=dyn.name if dyn.kind == "optimizer" else dyn.kind,
                kind=dyn.kind,
                params=no_params,
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
                made_parents[dyn.path] = None
        pending = waiting
    # A module whose every call ran directly in one label of its parent module (the
    # label enclosed it) sits under that label; its path stays the model's.
    for index, info in enumerate(raw.modules):
        label = enclosing.get(index)
        if (
            label is not None and info.parent is not None and label in model_labels
            and _label_owner(label, dynamic, made_parents, paths) == info.parent
        ):
            nodes[index].parent = label
    root = _nest(nodes)
    parts.sort(key=_part_order)
    for tree in [root, *parts]:
        _sum_up(tree)
    for node in root.walk():
        if node.kind == "module" and node.calls == 0 and node.profiled:
            # A container never called (a ModuleList its parent indexes) ran no interval of
            # its own: no peak of its own either, unknown, not its children's or 0.
            for _, stats in node.phases():
                if stats.peak_bytes is not None:
                    stats.peak_bytes = None

    step_time_ns = None
    if parts and raw.meta.timed is not False:
        step_time_ns = sum(
            stats.self_cpu_time_ns for tree in [root, *parts] for node in tree.walk() for _, stats in node.phases()
        )
    return Profile(
        root=root,
        meta=raw.meta.copy(),  # the profile's own
        figures=replace(
            figures, unattributed_ops=times.outside_ops if op_result is None else op_result.outside_ops,
            step_time_ns=step_time_ns,
        ),
        param_bytes=raw.param_bytes if params_known else None,
        parts=parts,
        memory=_memory_summary(raw, maker.memory, paths),
        trace=_trace(op_result, maker.op_index, paths),
        compiled=compiled,
        device=device_ledger(times.device_busy, [root, *parts]) if raw.has_device_time else None,
    )


class _NodeMaker:
    """The tree's nodes from the walks' self figures, one node at a time: times and calls
    from the timed walk (``times``), op rows, FLOPs, bytes and memory from the op walk
    (``op_result``; None: no op rows, and those figures unknown)."""

    def __init__(self, raw: RawCapture, times: PassResult, op_result: PassResult | None, phases: set[str]) -> None:
        self.times = times
        self.phases = phases
        self.has_device = raw.has_device_time
        self.counted = op_result is not None
        self.counts = self.counted and raw.counts_known
        self.memory = op_result.memory if op_result is not None else None
        self.memory_notes = raw.memory_notes
        #: Each node's op rows, in the op walk's order, and each row's place in its node's.
        self.ops_by_key: dict[Key, list[OpStats]] = {}
        self.op_index: dict[tuple[Any, ...], int] = {}
        for table_key, op in (op_result.ops.items() if op_result is not None else ()):
            listed = self.ops_by_key.setdefault(table_key[0], [])
            self.op_index[table_key] = len(listed)
            # Ops read without their inputs (a trace without shapes) have no counts:
            # unknown, never 0.
            listed.append(op if self.counts else replace(op, flops=None, macs=None, bytes=None))
        # Communication figures exist only where a collective ran (timed, or in the op rows).
        self.has_comm = bool(times.self_comm) or any(
            is_communication(op.name) for op in (op_result.ops.values() if op_result else ())
        )

    def node(self, key: Key, *, selected: bool = True, **fields: Any) -> ModuleNode:
        """The node of ``key`` (a module's index or a made node's path); one not
        ``selected`` (outside ``paths``) has no figures of its own."""
        ops = self.ops_by_key.get(key, []) if selected else []
        return ModuleNode(
            calls=self.times.calls.get(key, 0) if selected else 0,
            profiled=selected,
            forward=self.phase_stats(key, "forward", selected) or PhaseStats(),
            backward=self.phase_stats(key, "backward", selected),
            recompute=self.phase_stats(key, "recompute", selected),
            ops=ops,
            unsupported_ops=_unsupported(ops) if self.counts else {},
            **fields,
        )

    def phase_stats(self, key: Key, phase: str, selected: bool) -> PhaseStats | None:
        """The node's own figures in ``phase``; None for a phase the run did not have."""
        if phase != "forward" and phase not in self.phases:
            return None
        times, site = self.times, (key, phase)
        own_ops = [op for op in self.ops_by_key.get(key, []) if op.phase == phase] if selected else []
        comm: _CommFigures = {}
        if self.has_comm:
            comm_ops = [op for op in own_ops if is_communication(op.name)]
            comm = {
                "self_comm_time_ns": times.self_comm.get(site, 0) if selected else 0,
                "self_comm_bytes": sum(op.bytes or 0 for op in comm_ops) if self.counts else None,
            }
            own_ops = [op for op in own_ops if not is_communication(op.name)] if comm_ops else own_ops
        counts = self.counts
        return PhaseStats(
            **self._memory_figures(site),
            **comm,
            self_cpu_time_ns=times.self_cpu.get(site, 0) if selected else 0,
            self_device_time_ns=times.self_dev.get(site, 0) if self.has_device and selected else None,
            device_time_ns=0 if self.has_device else None,
            self_flops=sum(op.flops or 0 for op in own_ops) if counts else None,
            self_macs=sum(op.macs or 0 for op in own_ops) if counts else None,
            self_bytes=sum(op.bytes or 0 for op in own_ops) if counts else None,
        )

    def _memory_figures(self, site: tuple[Key, str]) -> _MemoryFigures:
        """A node's own memory in a phase; none without memory tracked, and activations
        and gradients unknown without notes (a trace file's capture)."""
        memory = self.memory
        if memory is None:
            return {}
        notes = self.memory_notes
        return {
            "self_alloc_bytes": memory.alloc.get(site, 0),
            "alloc_bytes": 0,
            "self_freed_bytes": memory.freed.get(site, 0),
            "freed_bytes": 0,
            "peak_bytes": memory.peak.get(site, 0),
            "self_activation_bytes": memory.activation.get(site, 0) if notes else None,
            "activation_bytes": 0 if notes else None,
            "self_grad_bytes": memory.grad.get(site, 0) if notes else None,
            "grad_bytes": 0 if notes else None,
        }


def device_ledger(busy: DeviceBusy | None, trees: list[ModuleNode]) -> DeviceLedger | None:
    """Where the steps' device work went: the nodes' self device time (every phase), and
    the rest by reason. What no node holds and is neither communication nor launched
    outside every op range was launched from an op range that is in no node (another
    thread's, or a custom op's own kernels no record carries); a negative rest would be
    time counted twice, which ``check_tree`` reports."""
    if busy is None:
        return None
    attributed = sum(stats.self_device_time_ns or 0 for tree in trees for node in tree.walk() for _, stats in node.phases())
    comm_alone = busy.busy_ns - busy.compute_ns
    reasons = {"communication": comm_alone, "no_op_range": busy.unlinked_ns}
    reasons["no_node"] = busy.busy_ns - attributed - comm_alone - busy.unlinked_ns
    return DeviceLedger(
        busy_ns=busy.busy_ns, attributed_ns=attributed,
        unattributed_ns_by_reason={k: v for k, v in reasons.items() if v},
        compute_ns=busy.compute_ns, comm_ns=busy.comm_ns, overlap_ns=busy.overlap_ns,
    )


def _trace(op_result: PassResult | None, op_index: dict[tuple[Any, ...], int], paths: list[str]) -> Trace | None:
    """``Profile.trace``: the op pass (a ``Profiler``'s last step) as spans, and flows:
    ``(forward op span, backward op span)`` for each autograd node a forward op created,
    to the first op that ran for it in backward; ``step_ns``, the run's step, from its
    first step mark (time 0) to its last, when it had step marks."""
    if op_result is None or op_result.trace is None:
        return None
    base = op_result.trace_start_ns
    # Straight into the columns: no object per span (one per op call; measured: as fast
    # as the lists of old, where a NamedTuple per span was 20-30% slower).
    spans, flows = Spans(), Flows()
    starts = spans.start_ns
    add_start, add_duration, add_path = starts.append, spans.duration_ns.append, spans.path.append
    add_phase, add_index = spans.phase.append, spans.op_index.append
    created: dict[int, int] = {}
    for t0, t1, key, phase, op_key, node_seq in op_result.trace:
        path = key_path(key, paths)
        index = -1 if op_key is None else op_index.get(op_key, -1)
        if node_seq is not None and index >= 0:
            if phase == "backward":
                start = created.pop(node_seq, None)
                if start is not None:
                    flows.forward.append(start)
                    flows.backward.append(len(starts))
            elif phase == "forward":
                created[node_seq] = len(starts)
        add_start(t0 - base)
        add_duration(max(0, t1 - t0))
        add_path(path)
        add_phase(phase)
        add_index(index)
    # A run with step marks starts at its first (time 0) and ends at its last; with its
    # memory over time where steps were summed (build_from_steps keeps it for two or more).
    return Trace(spans, flows, op_result.trace_step_ns, op_result.trace_memory)


def _memory_summary(raw: RawCapture, memory: MemoryResult | None, paths: list[str]) -> MemorySummary | None:
    """The model-level memory of a profile (``Profile.memory``)."""
    if memory is None:
        return None
    at = memory.peak_at
    static = raw.memory_static
    return MemorySummary(
        param_bytes_by_dtype=static.get("param_bytes_by_dtype"),
        buffer_bytes_by_dtype=static.get("buffer_bytes_by_dtype"),
        optimizer_state_bytes={
            name: OptimizerState(sum(by_key.values()), dict(sorted(by_key.items())))
            for name, by_key in sorted(memory.optimizers.items())
        },
        baseline_bytes=memory.baseline_bytes,
        peak_bytes=memory.peak_bytes,
        peak_at=None if at is None else PeakAt(
            path=key_path(at[0], paths),
            # A step part (<optimizer:Adam>, ...) has no forward: only its backward work
            # (the loss's) names a phase.
            phase=None if is_part(at[0]) and at[1] == "forward" else at[1],
            t_ns=memory.peak_t_ns,
        ),
        peak_categories=dict(memory.peak_categories),
        peak_by_phase=dict(sorted(memory.peak_by_phase.items())),
        timeline=memory.timeline,
        device=memory.device,
    )


def _label_owner(
    label: str, dynamic: dict[str, Dynamic], parents: dict[str, Key | None], paths: list[str]
) -> str | None:
    """The path of the module a label (or the labels it ran in) ran in; None for a label
    outside the model or a step part. ``parents``: each made node's parent."""
    dyn = dynamic.get(label)
    while dyn is not None and dyn.kind == "label":
        up = parents[dyn.path]
        if up is None:
            return None
        if isinstance(up, int):  # a module's index
            return paths[up]
        dyn = dynamic.get(up)
    return None


def _nest(nodes: list[ModuleNode]) -> ModuleNode:
    """The model's tree from ``nodes`` (the root first, then every module in table order,
    then the labels in the order they ran), each under its ``parent``, with depths to
    match. Children come in table order; a label that holds modules takes the place of
    the first of them, one that holds none comes after the modules, as it ran."""
    by_path = {node.path: node for node in nodes}
    rank: dict[str, int] = {}
    for order, node in enumerate(nodes):
        node.children = []
        if node.kind == "module":
            rank[node.path] = order
            up = node.parent
            # Modules come in table order, so the first to reach a label is its first.
            while up is not None and up not in rank and by_path[up].kind != "module":
                rank[up] = order
                up = by_path[up].parent
    for order, node in enumerate(nodes):
        rank.setdefault(node.path, len(nodes) + order)
        if node.parent is not None:
            by_path[node.parent].children.append(node)
    root = nodes[0]
    for node in root.walk():
        node.children.sort(key=lambda child: rank[child.path])
        for child in node.children:
            child.depth = node.depth + 1
    return root


_PART_RANK = {"label": 0, "loss": 1, "optimizer": 2, "zero_grad": 3, "communication": 4, "overhead": 5, "other": 6}


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
        node.params_total = params_sum(node.params, [child.params_total for child in node.children])
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
