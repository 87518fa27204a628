"""The layer-by-layer text tree: one row per module, its ops nested when asked.

Columns come from ``COLUMNS``; a column is shown only when the profile has its data
(device time only for accelerator runs), so later metrics slot into the same table.
Given a ``width``, the table fits it by hiding its lowest-priority columns, and says so;
``columns=`` picks them by key instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from layerscope.base import fmt
from layerscope.base.comm import is_communication
from layerscope.base.errors import RenderError
from layerscope.base.formats import Option, register_renderer
from layerscope.base.stats import observed_median
from layerscope.model.runfacts import RunFacts
from layerscope.model.sidedocs import UNATTRIBUTED_REASONS
from layerscope.model.tree import ModuleNode, OpStats, Profile, part_total
from layerscope.render.options import DEPTH, WIDTH
from layerscope.render.table import Column, draw, fit, hidden_line, wrap, wrap_lines


@dataclass(frozen=True)
class TreeColumn:
    """A column of the tree: ``module`` and ``op`` give a cell's text (None: leave blank).

    ``key`` names it for ``columns=`` (``--columns``). ``priority`` decides which columns
    stay when the table must fit a width: lower first (ties in table order). ``hidden_why``
    says why a profile has no data for it (when asked for by key)."""

    header: str
    key: str
    priority: int
    module: Callable[[ModuleNode, Profile], str]
    op: Callable[[OpStats, Profile], str] | None = None
    shown: Callable[[Profile], bool] = lambda profile: True
    align: str = ">"
    hidden_why: Callable[[Profile], str] | None = None
    #: Long cells may be cut to this many characters to fit a width (free text).
    min_width: int | None = None
    #: Whether the tree shows it without ``columns=`` (None: wherever it is ``shown``,
    #: which says whether the profile has its data at all).
    default: Callable[[Profile], bool] | None = None


def _has_device(profile: Profile) -> bool:
    return profile.root.forward.device_time_ns is not None


def _has_flops(profile: Profile) -> bool:
    return profile.root.forward.flops is not None


def _has_params(profile: Profile) -> bool:
    """Whether the parameter counts are known (not for a profile read from a trace
    recorded without the model): they are known on every node or on none."""
    return profile.root.params_total is not None


def _is_timed(profile: Profile) -> bool:
    return profile.timed


def _has_memory(profile: Profile) -> bool:
    return profile.root.forward.peak_bytes is not None


def _has_activations(profile: Profile) -> bool:
    return bool(profile.root.forward.activation_bytes)


def _mem(getter: Callable[[ModuleNode], int | None]) -> Callable[[ModuleNode, Profile], str]:
    return lambda node, profile: fmt.nbytes(getter(node)) if node.profiled else ""


def _peak_any_phase(node: ModuleNode) -> int | None:
    peaks = [stats.peak_bytes for _, stats in node.phases() if stats.peak_bytes is not None]
    return max(peaks) if peaks else None


def _op_alloc(o: OpStats, p: Profile) -> str:
    return fmt.nbytes(o.alloc_bytes) if o.alloc_bytes is not None else ""


def _timed(getter: Callable[[ModuleNode], int | None]) -> Callable[[ModuleNode, Profile], str]:
    return lambda node, profile: fmt.time_ns(getter(node)) if node.profiled else ""


def _phase_time(phase: str, total: bool) -> Callable[[ModuleNode, Profile], str]:
    def cell(node: ModuleNode, profile: Profile) -> str:
        stats = getattr(node, phase)
        if not node.profiled or stats is None:
            return ""
        return fmt.time_ns(stats.cpu_time_ns if total else stats.self_cpu_time_ns)

    return cell


def _op_phase_time(phase: str) -> Callable[[OpStats, Profile], str]:
    return lambda o, p: fmt.time_ns(o.cpu_time_ns) if o.phase == phase else ""


def _phase_flops(phase: str) -> Callable[[ModuleNode, Profile], str]:
    def cell(node: ModuleNode, profile: Profile) -> str:
        stats = getattr(node, phase)
        return fmt.counted(stats.flops, node.flops_partial) if node.profiled and stats is not None else ""

    return cell


def _op_phase_flops(phase: str) -> Callable[[OpStats, Profile], str]:
    def cell(o: OpStats, p: Profile) -> str:
        if o.phase != phase:
            return ""
        return fmt.count(o.flops) if o.flops is not None else "?"

    return cell


def _calls(node: ModuleNode, profile: Profile) -> str:
    # Modules always show their calls; the implicit parts (loss, other) have none.
    if not node.profiled or (node.kind != "module" and not node.calls):
        return ""
    return str(node.calls)


def _whole(profile: Profile) -> int:
    """What "CPU %" is a share of: the step when there is one, else the forward."""
    return profile.step_time_ns or profile.root.forward.cpu_time_ns


def _has_comm(profile: Profile) -> bool:
    """Whether a collective ran (its figures are None otherwise)."""
    return any(stats.comm_time_ns is not None for node in [profile.root, *profile.parts] for _, stats in node.phases())


def _has_recompute(profile: Profile) -> bool:
    return profile.root.recompute is not None


def _has_mfu(profile: Profile) -> bool:
    return _has_flops(profile) and _is_timed(profile) and bool(profile.meta.peak_flops_per_s)


def _why_no_mfu(profile: Profile) -> str:
    """Why MFU is unknown: no FLOPs, no times, or no peak to divide by."""
    if not _has_flops(profile):
        return "MFU needs FLOPs, unknown here" + (f": {profile.meta.flops_unknown}" if profile.meta.flops_unknown else "")
    if not _is_timed(profile):
        return "MFU needs times; this profile was counted, not timed"
    found = profile.meta.peak_from or "none was given, and the device is not one with a known datasheet peak"
    return f"MFU needs the hardware's peak FLOP/s: {found}; give --peak-tflops"


def _step_share(node: ModuleNode, profile: Profile) -> str:
    if not node.profiled:
        return ""
    return fmt.percent(part_total(node), profile.step_time_ns or 0)


def _step_rate(node: ModuleNode, profile: Profile) -> str:
    flops = sum(stats.flops or 0 for _, stats in node.phases())
    busy = sum(stats.busy_time_ns or 0 for _, stats in node.phases())
    return fmt.rate(flops, busy) if node.profiled else ""


def _step_mfu(node: ModuleNode, profile: Profile) -> str:
    """MFU over all of a node's phases: their FLOPs over their busy time, against the peak."""
    flops = sum(stats.flops or 0 for _, stats in node.phases())
    busy = sum(stats.busy_time_ns or 0 for _, stats in node.phases())
    return fmt.mfu(flops, busy, profile.meta.peak_flops_per_s) if node.profiled else ""


#: Columns of a forward-only profile.
#: The narrowest a width cuts shapes (``[[2, 16, 768], [7…``) to.
_SHAPES_MIN_WIDTH = 16


def _output_shape(node: ModuleNode, profile: Profile) -> str:
    """A module's output shape, its first call's (torchinfo's column)."""
    return fmt.shape(node.output_shapes) if node.profiled and node.calls and node.output_shapes is not None else ""


#: Each module's output shape: shown by default in a count (``flops``), as torchinfo's
#: summary shows it; ``--columns output_shape`` elsewhere. Hidden first to fit a width.
_OUTPUT = TreeColumn(
    "Output shape", "output_shape", 20, _output_shape, lambda o, p: "", align="<",
    shown=lambda p: any(n.output_shapes is not None for n in p.modules()),
    min_width=_SHAPES_MIN_WIDTH, default=lambda p: p.meta.mode == "count",
)


COLUMNS: list[TreeColumn] = [
    TreeColumn("Type", "type", 6, lambda n, p: n.type, lambda o, p: "", align="<"),
    TreeColumn(
        "Self CPU", "self_cpu", 0,
        _timed(lambda n: n.forward.self_cpu_time_ns),
        lambda o, p: fmt.time_ns(o.self_cpu_time_ns),
        shown=_is_timed,
    ),
    TreeColumn(
        "CPU total", "cpu_total", 2,
        _timed(lambda n: n.forward.cpu_time_ns),
        lambda o, p: fmt.time_ns(o.cpu_time_ns),
        shown=_is_timed,
    ),
    TreeColumn(
        "CPU %", "cpu_pct", 10,
        lambda n, p: fmt.percent(n.forward.cpu_time_ns, _whole(p)) if n.profiled else "",
        lambda o, p: fmt.percent(o.cpu_time_ns, _whole(p)),
        shown=_is_timed,
    ),
    TreeColumn(
        "Self Device", "self_device", 5,
        _timed(lambda n: n.forward.self_device_time_ns),
        lambda o, p: fmt.time_ns(o.self_device_time_ns),
        shown=_has_device,
    ),
    TreeColumn(
        "Device total", "device_total", 3,
        _timed(lambda n: n.forward.device_time_ns),
        lambda o, p: fmt.time_ns(o.device_time_ns),
        shown=_has_device,
    ),
    TreeColumn(
        "FLOPs", "flops", 4,
        lambda n, p: fmt.counted(n.forward.flops, n.flops_partial) if n.profiled else "",
        lambda o, p: fmt.count(o.flops) if o.flops is not None else "?",
        shown=_has_flops,
    ),
    TreeColumn(
        "MACs", "macs", 14,
        lambda n, p: fmt.counted(n.forward.macs, n.flops_partial) if n.profiled else "",
        lambda o, p: fmt.count(o.macs) if o.macs is not None else "?",
        shown=_has_flops,
    ),
    TreeColumn(
        "FLOP/s", "flop_rate", 11,
        lambda n, p: fmt.rate(n.forward.flops, n.forward.busy_time_ns) if n.profiled else "",
        lambda o, p: fmt.rate(o.flops, o.busy_time_ns),
        shown=lambda p: _has_flops(p) and _is_timed(p),
    ),
    TreeColumn(
        "MFU", "mfu", 9,
        lambda n, p: fmt.mfu(n.forward.flops, n.forward.busy_time_ns, p.meta.peak_flops_per_s) if n.profiled else "",
        lambda o, p: fmt.mfu(o.flops, o.busy_time_ns, p.meta.peak_flops_per_s),
        shown=_has_mfu, hidden_why=_why_no_mfu,
    ),
    TreeColumn("Alloc", "alloc", 15, _mem(lambda n: n.forward.alloc_bytes), _op_alloc, shown=_has_memory),
    TreeColumn("Peak mem", "peak_mem", 8, _mem(lambda n: n.forward.peak_bytes), lambda o, p: "", shown=_has_memory),
    TreeColumn("Activations", "activations", 13, _mem(lambda n: n.forward.activation_bytes), lambda o, p: "", shown=_has_activations),
    TreeColumn(
        "Params", "params", 7, lambda n, p: fmt.param_count(n.params_total) if n.kind == "module" else "", lambda o, p: "",
        shown=_has_params,
    ),
    TreeColumn("Calls", "calls", 12, _calls, lambda o, p: str(o.calls)),
    _OUTPUT,
]

#: Columns of a profile with backward: forward, backward (and recompute) side by side.
#: Their self times (and recompute's time) share the lowest priority: a width hides a
#: phase's figures only with the other phases', so no phase ever loses all its columns.
STEP_COLUMNS: list[TreeColumn] = [
    TreeColumn("Type", "type", 6, lambda n, p: n.type, lambda o, p: "", align="<"),
    TreeColumn("Fwd self", "fwd_self", 0, _phase_time("forward", False), _op_phase_time("forward"), shown=_is_timed),
    TreeColumn("Fwd total", "fwd_total", 4, _phase_time("forward", True), _op_phase_time("forward"), shown=_is_timed),
    TreeColumn("Bwd self", "bwd_self", 0, _phase_time("backward", False), _op_phase_time("backward"), shown=_is_timed),
    TreeColumn("Bwd total", "bwd_total", 4, _phase_time("backward", True), _op_phase_time("backward"), shown=_is_timed),
    TreeColumn(
        "Recompute", "recompute", 0,
        _phase_time("recompute", True),
        _op_phase_time("recompute"),
        shown=lambda p: _is_timed(p) and _has_recompute(p),
    ),
    TreeColumn(
        "Step %", "step_pct", 2,
        _step_share,
        lambda o, p: fmt.percent(o.cpu_time_ns, p.step_time_ns or 0),
        shown=lambda p: _is_timed(p) and bool(p.step_time_ns),
    ),
    TreeColumn(
        "Device total", "device_total", 3,
        lambda n, p: fmt.time_ns(sum(s.device_time_ns or 0 for _, s in n.phases())) if n.profiled else "",
        lambda o, p: fmt.time_ns(o.device_time_ns),
        shown=_has_device,
    ),
    TreeColumn(
        "Comm", "comm", 8,
        lambda n, p: fmt.time_ns(sum(s.comm_time_ns or 0 for _, s in n.phases())) if n.profiled else "",
        lambda o, p: fmt.time_ns(o.cpu_time_ns) if is_communication(o.name) else "",
        shown=lambda p: _is_timed(p) and _has_comm(p),
    ),
    TreeColumn(
        "Comm bytes", "comm_bytes", 10,
        _mem(lambda n: _known_sum([s.comm_bytes for _, s in n.phases()])),
        lambda o, p: fmt.nbytes(o.bytes) if is_communication(o.name) and o.bytes is not None else "",
        shown=lambda p: _has_comm(p) and any(s.comm_bytes is not None for n in p.nodes() for _, s in n.phases()),
    ),
    TreeColumn("Fwd FLOPs", "fwd_flops", 5, _phase_flops("forward"), _op_phase_flops("forward"), shown=_has_flops),
    TreeColumn("Bwd FLOPs", "bwd_flops", 5, _phase_flops("backward"), _op_phase_flops("backward"), shown=_has_flops),
    TreeColumn(
        "FLOP/s", "flop_rate", 11,
        _step_rate,
        lambda o, p: fmt.rate(o.flops, o.busy_time_ns),
        shown=lambda p: _has_flops(p) and _is_timed(p),
    ),
    TreeColumn(
        "MFU", "mfu", 12,
        _step_mfu,
        lambda o, p: fmt.mfu(o.flops, o.busy_time_ns, p.meta.peak_flops_per_s),
        shown=_has_mfu, hidden_why=_why_no_mfu,
    ),
    TreeColumn(
        "Activations", "activations", 13, _mem(lambda n: n.forward.activation_bytes), lambda o, p: "",
        shown=lambda p: _has_memory(p) and p.root.forward.activation_bytes is not None,
    ),
    TreeColumn("Peak mem", "peak_mem", 9, _mem(_peak_any_phase), lambda o, p: "", shown=_has_memory),
    TreeColumn(
        "Alloc", "alloc", 15,
        _mem(lambda n: sum(s.alloc_bytes or 0 for _, s in n.phases())),
        _op_alloc,
        shown=_has_memory,
    ),
    TreeColumn(
        "Params", "params", 7, lambda n, p: fmt.param_count(n.params_total) if n.kind == "module" else "", lambda o, p: "",
        shown=_has_params,
    ),
    TreeColumn("Calls", "calls", 14, _calls, lambda o, p: str(o.calls)),
    _OUTPUT,
]

#: The narrowest a width cuts the tree's names to.
_NAMES_MIN_WIDTH = 24
#: The width the tree's names are abbreviated to before any column is hidden or the
#: shapes are cut: a deep tree's op names (``│   │   ├── aten::scaled_dot_product_…``).
_NAMES_SOFT_WIDTH = 40

# With --show-ops the shapes tell rows of one op apart (aten::t three times): of the
# columns a width may hide, they go last but for the self times, and long ones are cut.
_SHAPES = TreeColumn("Input shapes", "shapes", 1, lambda n, p: fmt.shape(n.input_shapes), lambda o, p: fmt.shape(o.input_shapes), align="<",
    min_width=_SHAPES_MIN_WIDTH,
)


def _rows(
    profile: Profile, columns: list[TreeColumn], depth: int | None, show_ops: bool
) -> list[list[str]]:
    rows: list[list[str]] = []
    op_cells = [c.op for c in columns]

    def visit(node: ModuleNode, prefix: str, is_last: bool, is_root: bool) -> None:
        branch = "" if is_root else ("└── " if is_last else "├── ")
        rows.append([prefix + branch + fmt.node_name(node.name)] + [c.module(node, profile) for c in columns])
        inner = prefix if is_root else prefix + ("    " if is_last else "│   ")
        children = node.children if depth is None or node.depth < depth else []
        if show_ops:
            op_prefix = inner + ("│   " if children else "    ")
            for op in node.ops:
                rows.append([op_prefix + op.name] + [cell(op, profile) if cell else "" for cell in op_cells])
        for n, child in enumerate(children):
            visit(child, inner, n == len(children) - 1, False)

    visit(profile.root, "", True, True)
    for part in profile.parts:
        visit(part, "", True, True)
    return rows


#: Inputs the header names one by one; the rest are counted.
HEADER_INPUTS = 4


_HEADER_SEPARATOR = "  ·  "


def _header_lines(profile: Profile, width: int | None) -> list[str]:
    """The header, broken between its parts to fit ``width`` (a part longer than the
    width is wrapped itself); continuation lines are indented."""
    parts = _header_parts(profile)
    if width is None:
        return [_HEADER_SEPARATOR.join(parts)]
    lines = [parts[0]]
    for part in parts[1:]:
        if len(lines[-1]) + len(_HEADER_SEPARATOR) + len(part) <= width:
            lines[-1] += _HEADER_SEPARATOR + part
        else:
            lines.extend(wrap("  " + part, width))
    return lines


def _header_parts(profile: Profile) -> list[str]:
    """Model, device, the model's dtype, autocast's when it was on (ops ran in it), the
    inputs' shapes and dtypes, and how the figures were taken."""
    meta = profile.meta
    parts = [str(meta.model or profile.root.type), str(meta.device or "cpu")]
    if meta.dtype:
        parts.append(str(meta.dtype))
    if meta.autocast:
        parts.append(f"autocast {meta.autocast}")
    inputs = _inputs_text(meta.inputs, meta.input_dtypes)
    if inputs:
        parts.append(inputs)
    # The model's mode where it matters: a training step in eval() runs no dropout and
    # BatchNorm's running statistics; an inference in train() the opposite.
    if meta.training is not None and (meta.training or profile.has_backward):
        parts.append("train mode" if meta.training else "eval mode")
    if meta.mode == "profile":
        repeat = meta.repeat
        passes = "1 measured pass" if repeat == 1 else f"median of {repeat} passes"
        parts.append(f"{passes} after {meta.warmup} warm-up")
    elif meta.mode == "context" and _step_medians(profile):
        steps = profile.figures.steps
        parts.append(f"median of {steps} step{'s' if steps != 1 else ''}")
    elif meta.mode == "context" and profile.figures.detailed_steps:
        steps = profile.figures.steps
        parts.append(f"times: mean of {steps} light step{'s' if steps != 1 else ''}")
    elif meta.mode == "context":
        steps = profile.figures.steps
        parts.append(f"{steps} steps summed" if steps and steps > 1 else "one profiled run")
    elif meta.mode == "count":
        parts.append("counted in one pass, not timed")
    return parts


def _inputs_text(shapes: Any, dtypes: Any) -> str | None:
    """``input [2, 16] int64``, or ``inputs input_ids [2, 16] int64, ...`` for keyword
    inputs; arguments that hold no tensor are left out. None without dtypes (a
    ``Profiler`` block, or a profile saved before they were kept)."""
    if not (isinstance(shapes, list) and isinstance(dtypes, list) and len(shapes) == len(dtypes) == 2):
        return None
    (arg_shapes, kw_shapes), (arg_dtypes, kw_dtypes) = shapes, dtypes
    named = [(None, shape, dtype) for shape, dtype in zip(arg_shapes, arg_dtypes)]
    named += [(name, kw_shapes.get(name), dtype) for name, dtype in kw_dtypes.items()]
    entries = []
    for name, shape, dtype in named:
        dtype_names = _leaves(dtype)
        if dtype_names:
            entries.append(" ".join(filter(None, [name, fmt.shape(shape), "/".join(dtype_names)])))
    if not entries:
        return None
    shown = entries[:HEADER_INPUTS] + [f"+{len(entries) - HEADER_INPUTS} more"] * (len(entries) > HEADER_INPUTS)
    return ("input " if len(entries) == 1 else "inputs ") + ", ".join(shown)


def _leaves(nested: Any) -> list[str]:
    """The distinct strings in nested lists and dicts, in order."""
    found: list[str] = []
    stack = [nested]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if item not in found:
                found.append(item)
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return found


def compile_lines(profile: Profile) -> list[str]:
    """A compiled model's run: graphs, breaks, compile time, the kernels' share of the
    step and the rule that split them (nothing for an eager profile)."""
    info = profile.compiled
    if info is None:
        return []
    kernels = info.kernels
    shared = sum(1 for k in kernels if k.shared)
    breaks = info.graph_breaks
    lines = [
        f"Compiled ({info.backend}): {info.graphs} graph(s), {len(breaks)} graph break(s); "
        f"compile {fmt.time_ns(info.compile_time_ns)}, not in the times above. "
        f"{len(kernels)} kernel calls ({shared} shared by several modules) took "
        f"{fmt.time_ns(info.kernel_time_ns)} of the {fmt.time_ns(info.step_time_ns)} call; "
        f"times: {info.rule}. FLOPs, memory and op rows are the eager module's "
        "(--format kernels lists the kernels)."
    ]
    backward = [k for k in kernels if k.phase == "backward"]
    if backward:
        lines.append(
            f"Backward: {len(backward)} of the kernel calls, "
            f"{sum(1 for k in backward if not k.modules)} of them with no module's node: unattributed "
            f"{fmt.time_ns(info.unattributed_time_ns('backward'))}"
            + (f" (device {fmt.time_ns(device)})" if (device := info.unattributed_device_ns("backward")) is not None else "")
            + f", counted in {profile.root.path or profile.root.type}'s Bwd self."
        )
    if info.replay_device_ns:
        said = ", ".join(f"{phase} {fmt.time_ns(ns)}" for phase, ns in sorted(info.replay_device_ns.items()))
        lines.append(
            f"CUDA-graph replays (device work the graphs launched outside their kernel calls): {said}; "
            f"unattributed, counted in {profile.root.path or profile.root.type}'s self device time."
        )
    if not info.graphs and profile.figures.steps is not None:
        lines.append(
            "No compiled graph ran in the block (Dynamo ran the model eagerly: its recompile limit was reached, or "
            "it skipped every frame): the calls' time is the root's"
        )
    if info.step_compiles:
        said = ", ".join(
            f"step {c.step} {fmt.time_ns(c.time_ns)} ({c.frames} frame{'s' if c.frames != 1 else ''}"
            + (f", {c.graph_breaks} graph break{'s' if c.graph_breaks != 1 else ''})" if c.graph_breaks else ")")
            for c in info.step_compiles[:_OUTLIERS_NAMED]
        )
        more = len(info.step_compiles) - _OUTLIERS_NAMED
        lines.append(
            f"Compiled in the block: {said}" + (f" and {len(info.step_compiles) - _OUTLIERS_NAMED} more" if more > 0 else "")
            + "; a step that compiled is left out of the medians while other steps ran"
        )
    if info.other_input_steps:
        numbers = profile.figures.step_numbers or []
        kept = set(info.median_steps(numbers))
        named = ", ".join(str(n) for n in info.other_input_steps[:_OUTLIERS_NAMED])
        more = len(info.other_input_steps) - _OUTLIERS_NAMED
        steps = f"step{'s' if len(info.other_input_steps) != 1 else ''} {named}" + (f" and {more} more" if more > 0 else "")
        if any(n not in info.other_input_steps for n in kept):
            lines.append(
                f"Other model calls than the eager count's step (other input shapes, or another number of calls; the "
                f"FLOPs', shapes' and memory's step) in {steps}: left out of the medians, so each node's FLOPs and "
                "times are of the same calls"
            )
        else:
            lines.append(
                f"No step in the medians made the eager count's calls ({steps} made others: other input shapes, or "
                "another number of calls): the FLOPs, shapes and memory are the count's, the times those steps', so "
                "FLOP/s and MFU set one against the other"
            )
    lines += [f"Graph break at {b.where or '?'}: {b.reason}" for b in breaks]
    return lines


def _left_out(profile: Profile) -> str:
    """Which of a compiled block's steps its medians leave out, and why ("" for none)."""
    assert profile.compiled is not None
    compiled, other = profile.compiled.left_out(profile.figures.step_numbers or [])
    said = [
        f"the {count} {why}" for count, why in (
            (compiled, "that compiled"), (other, "with other calls than the FLOPs' count"),
        ) if count
    ]
    return f", {' and '.join(said)} left out" if said else ""


def _footer(profile: Profile) -> list[str]:
    root = profile.root
    flops = ""
    none_ran = _no_module_ran(profile)
    if none_ran:
        # No module call in the tree (a trace without module events): the model's
        # figures are not known, not 0; the step's parts hold what was counted.
        flops = "   FLOPs: ? (no module call in the tree)"
    elif root.forward.flops is not None:
        partial = root.flops_partial
        flops = f"   FLOPs: {fmt.counted(root.forward.flops, partial)}   MACs: {fmt.counted(root.forward.macs, partial)}"
    lines = [
        f"Params: {fmt.params(root.params_total, profile.param_bytes)}{_frozen(profile)}"
        f"{flops}"
        + (f"   Forward CPU total: {'?' if none_ran else fmt.time_ns(root.forward.cpu_time_ns)}" if _is_timed(profile) else "")
        + (
            f"   Device total: {fmt.time_ns(sum(s.device_time_ns or 0 for _, s in root.phases()))}"
            if root.forward.device_time_ns is not None
            else ""
        )
    ]
    lines.extend(_step_lines(profile))
    lines.extend(device_lines(profile))
    lines.extend(_comm_lines(profile))
    lines.extend(_detail_lines(profile))
    lines.extend(_peak_lines(profile))
    lines.extend(_memory_lines(profile))
    lines.extend(compile_lines(profile))
    passes = sorted(profile.figures.pass_cpu_time_ns or [])
    if len(passes) > 1 and profile.step_time_ns is None:
        lines.append(
            f"Whole forward over {len(passes)} passes: min {fmt.time_ns(passes[0])}, "
            f"median {fmt.time_ns(observed_median(passes))}, max {fmt.time_ns(passes[-1])}"
            + _shown_pass(profile)
        )
    unsupported = profile.unsupported_ops()
    if unsupported:
        listed = ", ".join(f"{name} x{calls}" for name, calls in unsupported.items())
        lines.append(f"Ops not counted in FLOPs (no formula, or their shapes not recorded): {listed}")
    unseen = profile.meta.unseen
    if unseen:
        lines.append(
            f"Not seen: {len(unseen)} module{'s' if len(unseen) != 1 else ''} called from TorchScript "
            f"({', '.join(unseen[:4])}{' and more' if len(unseen) > 4 else ''}): no hook sees into scripted code, "
            "so their figures are unknown and their work is their scripted caller's"
        )
    outside = profile.figures.unattributed_ops or 0
    if outside:
        lines.append(f"Ops run outside the profiled modules (not in the tree): {outside}")
    return lines


def _frozen(profile: Profile) -> str:
    """``: 1.18M trainable, 123.26M frozen`` where some parameters do not train; nothing
    where all do, or where it is not known."""
    total, trainable = profile.root.params_total, profile.meta.trainable_params
    if total is None or trainable is None or trainable >= total:
        return ""
    return f": {fmt.param_count(trainable)} trainable, {fmt.param_count(total - trainable)} frozen"


def _no_module_ran(profile: Profile) -> bool:
    """Whether no module of the tree was called (a trace without module events, read
    without its model): its model figures are unknown."""
    return not any(node.calls for node in profile.modules())


def _step_lines(profile: Profile) -> list[str]:
    root = profile.root
    flops: list[str] = []
    if _no_module_ran(profile):
        ran = {ph for part in profile.parts for ph, _ in part.phases()}
        counted = [
            (phase, sum(stats.flops or 0 for part in profile.parts for ph, stats in part.phases() if ph == phase))
            for phase in ("forward", "backward") if phase in ran
        ]
        if any(n for _, n in counted):
            flops.append(
                "Model FLOPs: ? (no module call in the tree); the step's parts hold "
                + ", ".join(f"{phase} {fmt.count(n)}" for phase, n in counted)
            )
    elif root.backward is not None and root.backward.flops is not None:
        flops.append(
            f"Model FLOPs: forward {fmt.counted(root.forward.flops, root.flops_partial)}, "
            f"backward {fmt.counted(root.backward.flops, root.flops_partial)}"
            + (f", recompute {fmt.counted(root.recompute.flops, root.flops_partial)}" if root.recompute is not None else "")
        )
    step = profile.step_time_ns
    if step is None:
        return flops
    shares = [("forward", root.forward.cpu_time_ns)]
    if root.backward is not None:
        shares.append(("backward", root.backward.cpu_time_ns))
    if root.recompute is not None:
        shares.append(("recompute", root.recompute.cpu_time_ns))
    shares.extend((fmt.node_name(part.name), part_total(part)) for part in profile.parts)
    parts = " + ".join(f"{name} {fmt.time_ns(ns)}" for name, ns in shares)
    steps = profile.figures.steps
    if steps is not None and _step_medians(profile):
        assert profile.compiled is not None
        head = f"Median step of {steps} (each node's median{_left_out(profile)}): {fmt.time_ns(step)} = {parts}"
    elif steps is not None and profile.figures.detailed_steps:
        head = f"Mean step of {steps} light step{'s' if steps != 1 else ''} (each node's mean): {fmt.time_ns(step)} = {parts}"
    elif steps is not None:
        head = f"{steps} step{'s' if steps != 1 else ''} (summed): {fmt.time_ns(step)} = {parts}"
    else:
        head = f"Step{_shown_pass(profile)}: {fmt.time_ns(step)} = {parts}"
    lines = [head, *flops, *light_step_lines(profile)]
    lines.extend(step_spread_lines(profile))
    if profile.meta.complete is False:
        lines.append("Incomplete: the run stopped before this cycle's last active step")
    return lines


def light_step_lines(profile: Profile) -> list[str]:
    """Which steps gave which figures, in a block that detailed some steps and timed the
    others lightly (``Profiler(detail="first")``)."""
    figures = profile.figures
    if not figures.detailed_steps:
        return []
    detailed = ", ".join(str(n) for n in figures.detailed_steps)
    numbers = figures.step_numbers or []
    light = f"steps {numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else f"step {numbers[0]}" if numbers else "the light steps"
    plural = "s" if len(figures.detailed_steps) > 1 else ""
    lines = [
        f"Times from {light}, timed lightly (torch's profiler without shapes or memory); FLOPs, calls, shapes, "
        f"memory and op rows from step{plural} {detailed}, recorded in detail (its times not used: op rows have none)"
    ]
    how = profile.meta.modules_from
    placed = how.placement if how is not None else None
    if placed is not None:
        lines.append(
            f"Light steps without module hooks (hooks='first'): {placed.ops} forward ops of {placed.passes} model "
            f"calls aligned to the hooked step's {placed.template_ops}: {placed.aligned} aligned, "
            f"{placed.by_neighbours} placed by neighbours, {placed.unplaced} in no module; module CPU times run "
            "from a call's first op to its last"
        )
        if placed.unaligned:
            lines.append(f"Not aligned (their ops left with the step): {'; '.join(placed.unaligned[:3])}")
    return lines


def _step_medians(profile: Profile) -> bool:
    """Whether the tree holds each node's median over a block's steps (a compiled
    model's block), not their sums."""
    return profile.compiled is not None and profile.figures.steps is not None


def _shown_pass(profile: Profile) -> str:
    """Which of ``profile()``'s passes the tree is, said after a figure of the passes."""
    shown, passes = profile.figures.shown_pass, profile.figures.pass_cpu_time_ns or []
    if shown is None or len(passes) < 2:
        return ""
    return f" (the tree is the median pass, pass {shown + 1} of {len(passes)})"


def device_lines(profile: Profile) -> list[str]:
    """Where the steps' device time went (``Profile.device``): busy = the nodes' time +
    what no node holds, by reason; and communication's overlap with compute."""
    ledger = profile.device
    if ledger is None:
        return []
    # What the step parts hold, said where they hold any: the footer's "Device total" is
    # the model's alone.
    in_parts = sum(stats.device_time_ns or 0 for part in profile.parts for _, stats in part.phases())
    held = f" (model {fmt.time_ns(ledger.attributed_ns - in_parts)} + step parts {fmt.time_ns(in_parts)})" if in_parts else ""
    line = (
        f"Device busy {fmt.time_ns(ledger.busy_ns)} = attributed {fmt.time_ns(ledger.attributed_ns)}{held} "
        f"+ unattributed {fmt.time_ns(ledger.unattributed_ns)}"
    )
    reasons = [
        f"{UNATTRIBUTED_REASONS.get(key, key)} {fmt.time_ns(ns)}" for key, ns in ledger.unattributed_ns_by_reason.items()
    ]
    if reasons:
        line += f" ({'; '.join(reasons)})"
    lines = [line]
    if ledger.comm_ns:
        lines.append(
            f"Device communication {fmt.time_ns(ledger.comm_ns)}, of which {fmt.time_ns(ledger.overlap_ns)} "
            "overlapped with compute"
        )
    return lines


def _comm_lines(profile: Profile) -> list[str]:
    """Who this rank is, and what its collectives moved and cost it."""
    if not _has_comm(profile):
        return []
    meta = profile.meta
    trees = [profile.root, *profile.parts]
    moved = _known_sum([stats.comm_bytes for node in trees for _, stats in node.phases()])
    has_ops = any(n.ops for node in trees for n in node.walk())
    calls = sum(op.calls for node in trees for n in node.walk() for op in n.ops if is_communication(op.name)) if has_ops else None
    spent = sum(stats.comm_time_ns or 0 for node in trees for _, stats in node.phases())
    wait = sum(part.forward.cpu_time_ns for part in profile.parts if part.kind == "communication")
    who = ""
    if meta.world_size is not None:
        who = f"rank {meta.rank or 0} of {meta.world_size}" + (f" on {meta.host}" if meta.host else "") + ": "
    if calls is None and moved is None:  # no op rows: neither the calls nor their bytes
        said = "collective calls (their count and bytes not recorded)"
    elif calls is None:
        said = f"{fmt.nbytes(moved)} in collective calls (their count not recorded)"
    else:
        said = f"{'bytes not known' if moved is None else fmt.nbytes(moved)} in {calls} collective call{'s' * (calls != 1)}"
    line = f"Communication: {who}{said}, {fmt.time_ns(spent)} in them"
    step = profile.step_time_ns
    if wait and step:
        line += f", of which {fmt.time_ns(wait)} waiting outside the model ({fmt.percent(wait, step)} of the step)"
    return [line]


#: At most this many steps far from the median are named.
_OUTLIERS_NAMED = 5


def step_spread_lines(profile: Profile) -> list[str]:
    """How the steps' wall times vary, and the steps far from the median by name."""
    spread = profile.step_spread()
    if spread is None:
        return []
    n = len(spread.steps)
    # profile()'s timed passes are medians' inputs; a Profiler's steps are summed.
    unit, units, role = (
        ("pass", "passes", "the tree is the median pass") if profile.meta.mode == "profile"
        else ("step", "steps", "a step that compiled is not in the medians") if _step_medians(profile)
        else ("step", "steps", "in the means above") if profile.figures.detailed_steps
        else ("step", "steps", "in the sums above")
    )
    lines = [
        f"Step wall time over {n} {units}: min {fmt.time_ns(spread.min_ns)}, median {fmt.time_ns(spread.median_ns)}, "
        f"p90 {fmt.time_ns(spread.p90_ns)}, max {fmt.time_ns(spread.max_ns)}"
    ]
    if spread.outliers:
        named = ", ".join(
            f"{unit} {number} {fmt.time_ns(ns)} (x{ns / spread.median_ns:.2g})"
            for number, ns in spread.outliers[:_OUTLIERS_NAMED]
        )
        more = len(spread.outliers) - _OUTLIERS_NAMED
        lines.append(
            f"{units.capitalize()} far from the median (x{spread.far:g} or more away, {role}): {named}"
            + (f" and {more} more" if more > 0 else "")
        )
    return lines


def _known_sum(values: list[int | None]) -> int | None:
    """The sum of the figures measured; None when none was (unknown, never 0)."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _detail_lines(profile: Profile) -> list[str]:
    """Where a profile's times come from, when not from torch's profiler."""
    merged = profile.meta.from_merged_run
    if merged is not None:
        return [
            f"Rank {merged.rank} of a merged run: {merged.not_kept} are not kept there "
            "(the rank's own file has them)"
        ]
    if profile.meta.times_from == "dispatch mode":
        return [
            "Times from steps recorded under a dispatch mode (torch's profiler was already running, "
            "and only one can): op recording inflates small modules"
        ]
    if profile.meta.mode == "trace":
        return trace_lines(profile.meta)
    return []


def _peak_lines(profile: Profile) -> list[str]:
    """The peak MFU is against and where it came from, or why MFU is unknown, when the
    profile says (a trace file's GPU, a peak given to ``show``) and has FLOPs to divide."""
    meta = profile.meta
    if meta.peak_from is None or not _has_flops(profile):
        return []
    if meta.peak_flops_per_s:
        return [f"MFU against a peak of {fmt.rate(int(meta.peak_flops_per_s), 10**9)}: {meta.peak_from}"]
    return [f"MFU unknown: {meta.peak_from} (--peak-tflops gives one)"]


def trace_lines(meta: RunFacts) -> list[str]:
    """Where a profile read from a torch.profiler trace came from, and what it lacks."""
    source = meta.source
    where = (", ".join(source.device_names) if source is not None else "") or "no accelerator"
    rank = f", rank {meta.rank} of {meta.world_size}" if meta.world_size is not None else ""
    lines = [f"From the torch.profiler trace {source.file if source is not None else '?'} ({where}{rank})"]
    how = meta.modules_from
    placed = how.placement if how is not None else None
    if how is not None and placed is not None:
        lines.append(
            f"Modules: {how.method}: {placed.ops} forward ops in {placed.passes} "
            f"pass{'es' if placed.passes != 1 else ''} of a {placed.template_ops}-op template: "
            f"{placed.aligned} aligned, {placed.by_neighbours} placed by neighbours, {placed.unplaced} in no module"
        )
        if placed.unaligned:
            lines.append(
                f"Not aligned (ops left with their labels and steps): {'; '.join(placed.unaligned[:3])}"
                + (f" and {len(placed.unaligned) - 3} more" if len(placed.unaligned) > 3 else "")
            )
        if placed.guesses:
            lines.append(
                f"Template guesses (a meta run has no data): {'; '.join(placed.guesses[:3])}"
                + (f" and {len(placed.guesses) - 3} more" if len(placed.guesses) > 3 else "")
            )
        if how.shapes:
            lines.append(f"Model: {how.shapes}")
    elif how is not None and how.instances:
        line = f"Modules: {how.method}: {how.matched} of {how.instances} instances"
        unmatched = how.unmatched
        if unmatched:
            line += f"; not matched (their work stays with their caller): {', '.join(unmatched[:5])}"
            line += f" and {len(unmatched) - 5} more" if len(unmatched) > 5 else ""
        lines.append(line)
        checked = [how.shapes] if how.shapes else []
        not_run = how.uncalled or ()
        if not_run:
            checked.append(
                f"modules of the model that ran in no instance: {', '.join(not_run[:5])}"
                + (f" and {len(not_run) - 5} more" if len(not_run) > 5 else "")
            )
        if checked:
            lines.append("Model: " + "; ".join(checked))
    elif source is not None and source.with_stack:
        lines.append(
            "Modules: none recorded (the trace has Python events but no nn.Module call: no module's forward "
            "ran while it recorded, as around loss.backward() alone)"
        )
    else:
        lines.append(
            "Modules: none recorded (the trace has no nn.Module events: read it with its model and inputs, "
            "--model SPEC --input SHAPE, or record it with with_stack=True)"
        )
    if meta.flops_unknown:
        lines.append(f"FLOPs unknown: {meta.flops_unknown}")
    device = meta.device_events
    if device is not None:
        line = f"Device events: {device.events}, busy {fmt.time_ns(device.time_ns)}"
        if device.outside_steps:
            line += f"; {device.outside_steps} launched outside the steps ({fmt.time_ns(device.outside_steps_time_ns)}, in no node)"
        if device.orphans:
            line += (
                f"; {device.orphans} launched before the trace began "
                f"({fmt.time_ns(device.orphans_time_ns)}, in no node)"
            )
        if device.unread:
            kinds = ", ".join(f"{count} {category}" for category, count in device.unread.items())
            line += f"; not read (categories layerscope does not know): {kinds} ({fmt.time_ns(device.unread_time_ns or 0)}, in no node)"
        lines.append(line)
    return lines


def _memory_lines(profile: Profile) -> list[str]:
    memory = profile.memory
    if not memory:
        return []

    def by_dtype(table: dict[str, int]) -> str:
        return ", ".join(f"{fmt.nbytes(n)} {dtype}" for dtype, n in table.items())

    param_table = memory.param_bytes_by_dtype
    if param_table is not None:
        held = [f"parameters {by_dtype(param_table) or '0 B'}"]
    elif _has_params(profile) and profile.param_bytes is not None:
        # A trace read with its model: the bytes Params counts, with no table by dtype
        # (the trace holds the run's memory, not the model's storages).
        held = [f"parameters {fmt.nbytes(profile.param_bytes)}"]
    else:
        held = [f"parameters {fmt.params(None)}"]  # recorded without the model: unknown, not 0 B
    if memory.buffer_bytes_by_dtype:
        held.append(f"buffers {by_dtype(memory.buffer_bytes_by_dtype)}")
    for name, state in memory.optimizer_state_bytes.items():
        held.append(f"{name} state {fmt.nbytes(state.total_bytes)}")
    lines = ["Memory: " + "; ".join(held)]
    at = memory.peak_at
    where = ""
    if at:
        where = f" in {at.path or profile.root.type}" + (f" ({at.phase})" if at.phase else "")
    categories = memory.peak_categories
    split = " + ".join(f"{fmt.memory_category(name, bool(memory.buffer_bytes_by_dtype))} {fmt.nbytes(n)}" for name, n in categories.items() if n)
    lines.append(f"Peak memory: {fmt.nbytes(memory.peak_bytes)}{where}" + (f" = {split}" if split else ""))
    device = memory.device
    if device:
        lines.append(
            f"Caching allocator at its peak: {fmt.nbytes(device.allocated_peak_bytes)} allocated, "
            f"{fmt.nbytes(device.reserved_at_peak_bytes)} reserved"
        )
    return lines


def column_keys() -> dict[str, list[str]]:
    """The keys ``columns=`` accepts, per table: the forward table, the step table (a
    profile with backward), and ``shapes`` (with ``show_ops``)."""
    return {
        "forward": [c.key for c in COLUMNS],
        "step": [c.key for c in STEP_COLUMNS],
        "show_ops": [_SHAPES.key],
    }


#: A name of the other table's, and what it means in this one: one ``--columns`` works
#: on a forward profile and on a training step (``self_cpu``: the self time of every
#: phase; ``fwd_self``: the forward's, which is all a forward profile has).
_SAME_IN: dict[str, dict[str, tuple[str, ...]]] = {
    "step": {
        "self_cpu": ("fwd_self", "bwd_self", "recompute"),
        "cpu_total": ("fwd_total", "bwd_total", "recompute"),
        "cpu_pct": ("step_pct",),
        "flops": ("fwd_flops", "bwd_flops"),
    },
    "forward": {"fwd_self": ("self_cpu",), "fwd_total": ("cpu_total",), "step_pct": ("cpu_pct",), "fwd_flops": ("flops",)},
}


def _chosen_columns(profile: Profile, table: list[TreeColumn], keys: list[str], show_ops: bool) -> list[TreeColumn]:
    """The columns named by ``keys``, in that order (a name of the other table's as
    ``_SAME_IN`` reads it); an unknown name, or one for which this profile has no
    data, is a :class:`RenderError` listing what it has."""
    available = [c for c in table if c.shown(profile)] + ([_SHAPES] if show_ops else [])
    by_key = {c.key: c for c in available}
    same = _SAME_IN["step" if profile.has_backward else "forward"]
    keys = list(dict.fromkeys(
        meant for key in keys
        for meant in ([k for k in same[key] if k in by_key] or [key] if key in same else [key])
    ))
    missing = [key for key in keys if key not in by_key]
    if missing:
        own = {c.key: c for c in table}
        kind = "a training-step" if profile.has_backward else "a forward-only"

        def why(key: str) -> str:
            column = own.get(key)
            if key == _SHAPES.key:
                return "only with show_ops"
            if column is None:
                return f"not in the table of {kind} profile" + (": it has no backward" if key.startswith("bwd_") else "")
            return column.hidden_why(profile) if column.hidden_why else "this profile has no data for it"

        raise RenderError(f"no column {', '.join(f'{key!r} ({why(key)})' for key in missing)}; it has: {', '.join(by_key)}")
    return [by_key[key] for key in keys]


def parse_columns(text: str) -> list[str]:
    """``self_cpu,flops``: the column keys of ``--columns``, each one known."""
    keys = [key.strip() for key in text.split(",")]
    known = list(dict.fromkeys(key for table in column_keys().values() for key in table))
    unknown = [key for key in keys if key and key not in known]
    if unknown:
        raise ValueError(
            f"unknown column {', '.join(map(repr, unknown))}; expected some of: {', '.join(known)} "
            "('--columns list' says what each is)"
        )
    if not all(keys):
        raise ValueError(f"an empty column name in {text!r}; '--columns list' lists them")
    return keys


def columns_listing() -> str:
    """The column keys, for ``--columns list``."""

    def listed(columns: list[TreeColumn]) -> str:
        return "".join(f"  {c.key:<14}{c.header}\n" for c in columns)

    return (
        "Columns of the text table, for --columns (comma-separated, in the order to show):\n"
        f"a forward pass:\n{listed(COLUMNS)}"
        f"a training step (--backward, or a Profiler block with backward):\n{listed(STEP_COLUMNS)}"
        f"with --show-ops:\n{listed([_SHAPES])}"
        "Either table's names work on both: on a training step self_cpu, cpu_total and flops\n"
        "show each phase's (cpu_pct: step_pct); on a forward pass fwd_self, fwd_total and\n"
        "fwd_flops are self_cpu, cpu_total and flops.\n"
        "A column exists only when the profile has its data (device time on CUDA, MFU with\n"
        "a peak: --peak-tflops, or a GPU in the datasheet table). Without --columns every\n"
        "column is shown, and on a terminal the lowest-priority ones are hidden to fit its\n"
        "width (the footer names them).\n"
    )


SHOW_OPS = Option("show_ops", "nest each module's aten ops under it, with their input shapes", parse=None)
COLUMNS_OPTION = Option(
    "columns", "the table's columns, comma-separated, e.g. self_cpu,flops,params; '--columns list' "
    "lists them (default: all, with the least important hidden to fit a terminal's width)",
    parse=parse_columns, metavar="COLS", listing=columns_listing,
)


@register_renderer(
    "text", extensions=(".txt",), description="the module tree as a text table",
    options=(DEPTH, SHOW_OPS, WIDTH, COLUMNS_OPTION),
)
def render_text(
    profile: Profile,
    *,
    depth: int | None = None,
    show_ops: bool = False,
    width: int | None = None,
    columns: list[str] | None = None,
) -> str:
    """The module tree as a table; ``depth`` hides deeper modules, ``show_ops`` nests ops.

    ``columns`` names the columns to show, in order (see :func:`column_keys`). Else every
    column the profile has data for is shown, unless ``width`` (characters; the CLI passes
    the terminal's) is too narrow: then the lowest-priority columns are hidden, and a
    footer line names them. Without ``width`` the table is as wide as it needs.
    """
    table = STEP_COLUMNS if profile.has_backward else COLUMNS
    if columns is not None:
        shown = _chosen_columns(profile, table, list(columns), show_ops)
    else:
        shown = [c for c in table if c.shown(profile) and (c.default is None or c.default(profile))]
        shown += [_SHAPES] if show_ops else []
    rows = _rows(profile, shown, depth, show_ops)
    # The tree's column has no priority: it is never hidden, and its names are cut last.
    layout = [Column("Module", "<", min_width=_NAMES_MIN_WIDTH, soft_width=_NAMES_SOFT_WIDTH)]
    layout += [Column(c.header, c.align, c.priority, min_width=c.min_width) for c in shown]
    hidden: list[TreeColumn] = []
    if width is not None and columns is None:
        fitted = fit(layout, rows, width)
        hidden = [shown[i - 1] for i in fitted.hidden]
        layout, rows = fitted.columns, fitted.rows

    out = [*_header_lines(profile, width), "", *draw(layout, rows), ""]
    footer = _footer(profile)
    if hidden and width is not None:
        footer.append(hidden_line(width, [c.key for c in hidden], "choose columns with --columns, or columns= in Python"))
    if width is not None:
        footer = wrap_lines(footer, width)
    out.extend(footer)
    return "\n".join(out) + "\n"


