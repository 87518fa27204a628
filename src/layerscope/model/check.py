"""Invariants of a profile tree, as code.

``check_tree`` is called by every test that builds or transforms a tree, and by
``layerscope.load`` on every file it reads: a profile that breaks one is a bug (or a
corrupted file), never something to render.
"""

from __future__ import annotations

from layerscope.base.comm import is_communication
from layerscope.model.sidedocs import Timeline
from layerscope.model.tree import ADDITIVE_PHASE_METRICS, NODE_KINDS, PHASES, ModuleNode, Profile, params_sum


class InvariantError(AssertionError):
    """A profile tree breaks one of its invariants; the message lists every breach."""


def _phase_problems(node: ModuleNode, phase: str) -> list[str]:
    problems: list[str] = []
    stats = getattr(node, phase)
    if stats is None:
        for child in node.children:
            if getattr(child, phase) is not None:
                problems.append(f"{node.path!r}: no {phase} stats but child {child.path!r} has")
        return problems
    for total_name, self_name in ADDITIVE_PHASE_METRICS:
        total = getattr(stats, total_name)
        own = getattr(stats, self_name)
        if total is None or own is None:
            if total is not None or own is not None:
                problems.append(f"{node.path!r} {phase}: {total_name}/{self_name} half missing")
            continue
        if total < 0 or own < 0:
            problems.append(f"{node.path!r} {phase}: negative {total_name}={total} {self_name}={own}")
        children_sum = 0
        for child in node.children:
            child_stats = getattr(child, phase)
            value = None if child_stats is None else getattr(child_stats, total_name)
            if value is None:
                problems.append(f"{node.path!r} {phase}: child {child.path!r} lacks {total_name}")
                continue
            children_sum += value
        if total != own + children_sum:
            problems.append(
                f"{node.path!r} {phase}: {total_name}={total} != {self_name}={own} "
                f"+ children {children_sum}"
            )
    return problems


#: Op figures that must not be negative (``calls`` must be positive).
_OP_FIGURES = (
    "cpu_time_ns", "self_cpu_time_ns", "device_time_ns", "self_device_time_ns", "flops", "macs", "bytes",
    "alloc_bytes", "self_alloc_bytes", "freed_bytes",
)

#: What a node's op rows add up to, per phase: (op field, the phase's self field).
_OP_SUMS = (("flops", "self_flops"), ("macs", "self_macs"), ("bytes", "self_bytes"))


def _op_problems(node: ModuleNode) -> list[str]:
    """Each op row is sound, and a phase's op rows add up to the node's self FLOPs, MACs
    and bytes in that phase (ops are the only source of those figures)."""
    problems: list[str] = []
    sums: dict[tuple[str, str], int | None] = {}
    for op in node.ops:
        where = f"{node.path!r}: op {op.name}"
        negative = [name for name in _OP_FIGURES if (getattr(op, name) or 0) < 0]
        if negative:
            problems.append(f"{where} has negative {', '.join(negative)}")
        if op.calls <= 0:
            problems.append(f"{where} has {op.calls} calls")
        if op.alloc_bytes is not None and op.self_alloc_bytes != op.alloc_bytes:
            problems.append(f"{where}: self alloc bytes != alloc bytes (ops do not nest)")
        if (op.self_cpu_time_ns is None) != (op.cpu_time_ns is None):
            problems.append(f"{where}: self time and total are not both known")
        elif op.self_cpu_time_ns is not None and op.cpu_time_ns is not None and op.self_cpu_time_ns > op.cpu_time_ns:
            problems.append(f"{where}: self time exceeds its total")
        if op.phase not in PHASES or getattr(node, op.phase) is None:
            problems.append(f"{where} is in phase {op.phase!r}, which the node lacks")
            continue
        comm = is_communication(op.name)
        for field, self_field in _OP_SUMS:
            value = getattr(op, field)
            if value is not None:
                # A collective's bytes are its payload: the node's communication bytes.
                key = (op.phase, "self_comm_bytes" if comm and field == "bytes" else self_field)
                sums[key] = (sums.get(key) or 0) + value
    for phase, stats in node.phases():
        for field, self_field in (*_OP_SUMS, ("bytes", "self_comm_bytes")):
            own = getattr(stats, self_field)
            ops_sum = sums.get((phase, self_field))
            if self_field == "self_comm_bytes" and own is None:
                continue  # no collective ran: none of its ops can be one
            if (own or 0) != (ops_sum or 0):
                where = "collectives'" if self_field == "self_comm_bytes" else "ops'"
                problems.append(f"{node.path!r} {phase}: {self_field}={own} != its {where} {field} ({ops_sum or 0})")
    return problems


def tree_problems(profile: Profile) -> list[str]:
    """Every invariant the profile breaks, as readable lines (empty when sound)."""
    problems: list[str] = []
    root = profile.root
    if root.path != "" or root.parent is not None or root.depth != 0:
        problems.append("the root must have path '', parent null and depth 0")
    if root.kind != "module":
        problems.append("the root must be a module")
    seen: set[str] = set()
    all_self = 0
    for part in profile.parts:
        if part.parent is not None or part.depth != 0 or part.kind == "module":
            problems.append(f"step part {part.path!r} must be a top-level non-module node")
    for tree in [root, *profile.parts]:
        self_sums: dict[str, int] = {}
        for node in tree.walk():
            if node.path in seen:
                problems.append(f"duplicate path {node.path!r}")
            seen.add(node.path)
            if node.kind not in NODE_KINDS:
                problems.append(f"{node.path!r}: unknown kind {node.kind!r}")
            for child in node.children:
                if child.parent != node.path or child.depth != node.depth + 1:
                    problems.append(f"{child.path!r}: parent/depth do not match its place in the tree")
                if child.kind == "module" and node.kind not in ("module", "label"):
                    # A label may hold the modules it enclosed; a step part never does.
                    problems.append(f"{child.path!r}: a module cannot sit under a {node.kind} node")
            if node.calls < 0 or (node.params is not None and node.params < 0):
                problems.append(f"{node.path!r}: negative calls or params")
            if node.params_total != params_sum(node.params, [c.params_total for c in node.children]):
                # Known counts add up; unknown ones (None) stay unknown all the way up.
                problems.append(f"{node.path!r}: params_total != params + children")
            if not node.profiled and (node.calls or node.forward.self_cpu_time_ns or node.ops):
                problems.append(f"{node.path!r}: not profiled but carries figures")
            for phase in PHASES:
                problems.extend(_phase_problems(node, phase))
            for phase, stats in node.phases():
                if stats.peak_bytes is not None and stats.peak_bytes < 0:
                    problems.append(f"{node.path!r} {phase}: negative peak_bytes")
            problems.extend(_op_problems(node))
            if any(calls < 0 for calls in node.unsupported_ops.values()):
                problems.append(f"{node.path!r}: negative unsupported op calls")
            for phase, stats in node.phases():
                self_sums[phase] = self_sums.get(phase, 0) + stats.self_cpu_time_ns
        for phase, total in self_sums.items():
            tree_stats = getattr(tree, phase)
            all_self += total
            if tree_stats is not None and tree_stats.cpu_time_ns != total:
                problems.append(f"{tree.path!r} {phase} cpu_time_ns != sum of its tree's self times ({total})")
    problems.extend(_params_problems(profile))
    step = profile.figures.step_time_ns
    if step is not None and step != all_self:
        problems.append(f"step_time_ns={step} != sum of every node's self time ({all_self})")
    problems.extend(_wall_problems(profile))
    problems.extend(_memory_problems(profile))
    problems.extend(_trace_problems(profile))
    problems.extend(_device_problems(profile))
    return problems


def _wall_problems(profile: Profile) -> list[str]:
    """The step's time, which every node's own time adds up to, against a figure measured
    apart from them: the clock at each step's ends (``step_times_ns``). A block that sums
    its steps sums their wall times; one of light steps' means, their mean (``sum // n``);
    ``profile()``, its shown pass's. A node's time counted twice (work inside a label
    left in the label's own time) shows here, where the sum above cannot see it. A
    compiled block's per-node medians add up to no one step: not compared."""
    figures = profile.figures
    walls, step = figures.step_times_ns, figures.step_time_ns
    if step is None or not walls or profile.compiled is not None:
        return []
    if figures.shown_pass is not None:
        if figures.pass_cpu_time_ns is None or len(walls) != len(figures.pass_cpu_time_ns):
            return []
        expected, what = walls[figures.shown_pass], f"the shown pass's wall time (pass {figures.shown_pass})"
    elif figures.detailed_steps is not None:
        expected, what = sum(walls) // len(walls), f"the mean of the {len(walls)} light steps' wall times"
    elif figures.steps == len(walls):
        expected, what = sum(walls), f"the sum of the {len(walls)} steps' wall times"
    else:
        return []
    if step != expected:
        return [f"step_time_ns={step} != {what} ({expected}): time counted twice or lost"]
    return []


def _device_problems(profile: Profile) -> list[str]:
    """Every device nanosecond of the steps is in exactly one place: the busy time is the
    nodes' self device time plus what no node holds, by reason, none of them negative
    (a negative one is time counted twice); communication overlaps compute by no more
    than either ran."""
    ledger = profile.device
    if ledger is None:
        return []
    problems: list[str] = []
    attributed = sum(
        stats.self_device_time_ns or 0 for node in profile.nodes() for _, stats in node.phases()
    )
    if attributed != ledger.attributed_ns:
        problems.append(f"device: attributed_ns={ledger.attributed_ns} != the nodes' self device time ({attributed})")
    negative = {k: v for k, v in ledger.unattributed_ns_by_reason.items() if v < 0}
    if negative or min(ledger.busy_ns, ledger.attributed_ns, ledger.compute_ns, ledger.comm_ns, ledger.overlap_ns) < 0:
        problems.append(f"device: a negative figure (time counted twice?): {ledger.to_dict()}")
    if ledger.busy_ns != ledger.attributed_ns + ledger.unattributed_ns:
        problems.append(
            f"device: busy_ns={ledger.busy_ns} != attributed {ledger.attributed_ns} "
            f"+ unattributed {ledger.unattributed_ns_by_reason}"
        )
    if ledger.overlap_ns > min(ledger.compute_ns, ledger.comm_ns) or ledger.compute_ns + ledger.comm_ns - ledger.overlap_ns != ledger.busy_ns:
        problems.append(f"device: compute {ledger.compute_ns} + communication {ledger.comm_ns} - overlap {ledger.overlap_ns} != busy {ledger.busy_ns}")
    return problems


def _params_problems(profile: Profile) -> list[str]:
    """Parameter counts are known on every node or on none (a profile from a trace
    recorded without the model): a mix would show gaps beside counts, and a total that
    leaves out what it does not know."""
    known: list[str] = []
    unknown: list[str] = []
    for node in profile.nodes():
        (unknown if node.params is None or node.params_total is None else known).append(node.path)
    if not (known and unknown):
        return []

    def listed(paths: list[str]) -> str:
        return f"{len(paths)} node{'s' if len(paths) != 1 else ''} ({paths[0]!r}{', ...' if len(paths) > 1 else ''})"

    return [f"params known for {listed(known)} and unknown for {listed(unknown)}: a profile knows every count or none"]


def _trace_problems(profile: Profile) -> list[str]:
    """Spans are sorted, last no negative time, and name nodes and ops that exist; flows
    lead from a forward span to a later backward span."""
    trace = profile.trace
    if trace is None:
        return []
    problems: list[str] = []
    previous = None
    spans = trace.spans
    starts, phases = spans.start_ns, spans.phase
    for i, (start, duration, path, phase, index) in enumerate(
        zip(starts, spans.duration_ns, spans.path, phases, spans.op_index)
    ):
        if duration < 0 or start < 0:
            problems.append(f"trace: span {list(spans[i])} has a negative start or duration")
        if previous is not None and start < previous:
            problems.append("trace: spans are not sorted by start")
        previous = start
        if path not in profile or phase not in PHASES:
            problems.append(f"trace: span {list(spans[i])} names no node or phase of this profile")
        elif index >= len(profile[path].ops):
            problems.append(f"trace: span {list(spans[i])} names op {index} of {path!r}, which has {len(profile[path].ops)}")
        if len(problems) > 20:
            break
    for forward, backward in zip(trace.flows.forward, trace.flows.backward):
        if not (0 <= forward < len(spans) and 0 <= backward < len(spans)):
            problems.append(f"trace: flow {[forward, backward]} names a span this trace does not have")
        elif phases[forward] != "forward" or phases[backward] != "backward" or starts[forward] > starts[backward]:
            problems.append(f"trace: flow {[forward, backward]} does not lead from a forward op to a later backward op")
    return problems


def _memory_problems(profile: Profile) -> list[str]:
    """The step's peak is the sum of its categories, is reached on the timeline, and is
    at least every phase's peak and the live memory at the start."""
    memory = profile.memory
    if memory is None:
        return []
    problems: list[str] = []
    peak = memory.peak_bytes
    categories = memory.peak_categories
    if any(v < 0 for v in categories.values()) or sum(categories.values()) != peak:
        problems.append(f"memory: peak_bytes={peak} != sum of peak_categories {categories}")
    for where, value in memory.peak_by_phase.items():
        if value > peak:
            problems.append(f"memory: peak of {where} ({value}) exceeds the step's peak ({peak})")
    if memory.baseline_bytes > peak:
        problems.append("memory: the live memory at the start exceeds the peak")
    timeline = memory.timeline or Timeline()
    if timeline.bytes and max(timeline.bytes) != peak:
        problems.append(f"memory: the timeline's highest point ({max(timeline.bytes)}) is not the peak ({peak})")
    if len(timeline.bytes) != len(timeline.t_ns):
        problems.append("memory: timeline t_ns and bytes differ in length")
    split = timeline.categories
    if split:
        series = list(split.values())
        if any(len(s) != len(timeline.bytes) for s in series):
            problems.append("memory: a timeline category has another number of points than bytes")
        elif any(sum(values) != total or min(values) < 0 for total, values in zip(timeline.bytes, zip(*series))):
            problems.append("memory: the timeline's categories do not add up to its bytes at every point")
    root = profile.root.forward
    if root.peak_bytes is not None and root.peak_bytes > peak:
        problems.append("memory: the forward's peak exceeds the step's")
    return problems


def summarize(problems: list[str], shown: int = 5) -> str:
    """The first ``shown`` problems on one line, and how many more there are."""
    listed = "; ".join(problems[:shown])
    more = f"; and {len(problems) - shown} more" if len(problems) > shown else ""
    return f"{len(problems)} problem{'s' if len(problems) != 1 else ''}: {listed}{more}"


def check_tree(profile: Profile) -> Profile:
    """Raise :class:`InvariantError` if ``profile`` breaks an invariant; else return it."""
    problems = tree_problems(profile)
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise InvariantError(f"profile breaks {len(problems)} invariant(s):\n  {shown}{more}")
    return profile
