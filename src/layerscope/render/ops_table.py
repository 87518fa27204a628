"""The operator table as text, like ``torch.profiler``'s ``key_averages().table()``.

The rows come from ``layerscope.model.ops.op_table``; this file only draws them. A column is
shown when the profile has its data (device time on an accelerator, memory when it was
tracked) and when it says something another column does not: ops do not nest, so an
op's total time equals its self time, and "CPU total" appears only if that ever differs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from layerscope.base import fmt
from layerscope.base.formats import Option, register_renderer
from layerscope.model.ops import (
    GROUP_KEYS,
    SORT_KEYS,
    STEP_PHASE,
    GroupBy,
    OpRow,
    OpTable,
    op_table,
    parse_group_by,
    sort_field,
    sort_key,
)
from layerscope.model.tree import PHASES, Profile
from layerscope.render.options import LIMIT, WIDTH
from layerscope.render.table import Column, draw, fit, hidden_line, wrap, wrap_lines
from layerscope.render.text import _header_lines


@dataclass(frozen=True)
class OpColumn:
    """A column of the op table: ``cell`` gives a row's text (the Total row's too),
    ``shown`` whether the table has it at all.

    ``priority`` decides what a width hides first (the highest number; see
    ``table.fit``); a column showing a key the rows are grouped by (``key``) labels
    them and is never hidden. ``min_width`` lets a width cut its long cells, at the
    start with ``cut_start``."""

    header: str
    cell: Callable[[OpRow, OpTable], str]
    shown: Callable[[OpTable], bool]
    align: str = ">"
    priority: int | None = None
    key: str | None = None
    min_width: int | None = None
    cut_start: bool = False

    def layout(self, table: OpTable) -> Column:
        """How the column is laid out in ``table``: a group key's column as a label."""
        priority = None if self.key in table.group_by else self.priority
        return Column(self.header, self.align, priority, min_width=self.min_width, cut_start=self.cut_start)


def _has(*names: str) -> Callable[[OpTable], bool]:
    return lambda table: all(name in table.columns for name in names)


def _differs(total_field: str, self_field: str) -> Callable[[OpTable], bool]:
    # Totals add up from rows with total >= self, so they are equal only if every row's are.
    return lambda table: total_field in table.columns and (
        getattr(table.total, total_field) != getattr(table.total, self_field)
    )


def _flops(value: Callable[[OpRow], int | None]) -> Callable[[OpRow, OpTable], str]:
    def cell(row: OpRow, table: OpTable) -> str:
        if row is table.total:
            return fmt.count(value(row) or 0)
        if value(row) is None:
            return "?"  # no formula for any call: unknown, never zero
        # Some calls had no formula: the figure is a lower bound.
        return fmt.count(value(row)) + ("+?" if row.unsupported_calls else "")

    return cell


def _key(text: Callable[[OpRow], str]) -> Callable[[OpRow, OpTable], str]:
    return lambda row, table: "" if row is table.total else text(row)


def _module_path(row: OpRow) -> str:
    # The root's path is "", which reads as a gap: show its type, as the tree does.
    return row.module if row.module else str(row.module_type)


_TIMED = _has("self_cpu_time_ns")
_DEVICE = _has("self_device_time_ns")
_FLOPS = _has("flops")
_MEMORY = _has("alloc_bytes")

#: A width hides the highest priority first: MACs, then the allocator's details and
#: FLOP/s, ...; the self times stay, then the calls and FLOPs.
COLUMNS: list[OpColumn] = [
    OpColumn("Name", lambda r, t: r.name, lambda t: True, "<", key="name", min_width=24),
    OpColumn("Phase", _key(lambda r: str(r.phase)), _has("phase"), "<", 3, key="phase"),
    OpColumn("Module", _key(_module_path), _has("module"), "<", 3, key="module", min_width=16, cut_start=True),
    OpColumn("Type", _key(lambda r: str(r.module_type)), _has("module_type"), "<", 7, key="module_type"),
    OpColumn("Self CPU", lambda r, t: fmt.time_ns(r.self_cpu_time_ns), _TIMED, priority=0),
    OpColumn("Self CPU %", lambda r, t: fmt.percent(r.self_cpu_time_ns, t.total.self_cpu_time_ns), _TIMED, priority=6),
    OpColumn("CPU total", lambda r, t: fmt.time_ns(r.cpu_time_ns), _differs("cpu_time_ns", "self_cpu_time_ns"), priority=5),
    OpColumn("CPU avg", lambda r, t: fmt.time_ns(r.cpu_time_avg_ns), _TIMED, priority=9),
    OpColumn("Self Device", lambda r, t: fmt.time_ns(r.self_device_time_ns), _DEVICE, priority=0),
    OpColumn(
        "Self Device %",
        lambda r, t: fmt.percent(r.self_device_time_ns, t.total.self_device_time_ns),
        _DEVICE, priority=6,
    ),
    OpColumn(
        "Device total",
        lambda r, t: fmt.time_ns(r.device_time_ns),
        _differs("device_time_ns", "self_device_time_ns"), priority=5,
    ),
    OpColumn("Device avg", lambda r, t: fmt.time_ns(r.device_time_avg_ns), _DEVICE, priority=9),
    OpColumn("Calls", lambda r, t: str(r.calls), lambda t: True, priority=1),
    # Grouped by module, every row is one module: the count would always read 1.
    OpColumn("Modules", lambda r, t: str(r.modules), lambda t: "module" not in t.group_by, priority=10),
    OpColumn("FLOPs", _flops(lambda r: r.flops), _FLOPS, priority=2),
    OpColumn("MACs", _flops(lambda r: r.macs), _FLOPS, priority=13),
    OpColumn("FLOP/s", lambda r, t: fmt.rate(r.flops, r.busy_time_ns), lambda t: _FLOPS(t) and _TIMED(t), priority=11),
    OpColumn("Alloc", lambda r, t: fmt.nbytes(r.alloc_bytes), _MEMORY, priority=8),
    OpColumn(
        "Self Alloc", lambda r, t: fmt.nbytes(r.self_alloc_bytes), _differs("alloc_bytes", "self_alloc_bytes"), priority=12
    ),
    # Frees land between ops, rarely inside one: a column of zeros would be noise.
    OpColumn(
        "Freed", lambda r, t: fmt.nbytes(r.freed_bytes), lambda t: _MEMORY(t) and bool(t.total.freed_bytes), priority=12
    ),
    # Free text last, so long shapes and file paths don't push the numbers apart.
    OpColumn(
        "Input shapes", _key(lambda r: fmt.shape(r.input_shapes)), _has("input_shapes"), "<", 4, key="shape", min_width=16
    ),
    # One frame per line, innermost first, as torch.profiler prints its stacks.
    OpColumn(
        "Stack", _key(lambda r: "\n".join(r.stack or [])), _has("stack"), "<", 4, key="stack", min_width=24, cut_start=True
    ),
]


def _title(table: OpTable) -> str:
    parts = [f"Ops grouped by {', '.join(table.group_by)}"]
    if table.stack_depth is not None:
        parts[0] += f" (stack: {table.stack_depth} frame{'s' if table.stack_depth != 1 else ''})"
    parts.append(f"sorted by {sort_key(table.sort_by)}, descending")
    if table.module is not None:
        parts.append(f"module {table.module or table.profile.root.type}")
    if table.phase is not None:
        parts.append(f"phase {table.phase}")
    return "  ·  ".join(parts)


def _footer(table: OpTable) -> list[str]:
    lines = []
    if table.matched > len(table.rows):
        lines.append(f"Showing {len(table.rows)} of {table.matched} rows; Total and % cover all {table.matched}.")
    if _TIMED(table):
        lines.append("Percentages are shares of the ops' total in this table, not of the model's time.")
    unsupported: dict[str, int] = {}
    for row in table.rows:
        if row.unsupported_calls:
            unsupported[row.name] = unsupported.get(row.name, 0) + row.unsupported_calls
    if unsupported:
        listed = ", ".join(f"{name} x{calls}" for name, calls in sorted(unsupported.items()))
        lines.append(f"Ops not counted in FLOPs (no formula, or their shapes not recorded): {listed}")
    return lines


@register_renderer("text", document="op-table", description="the operator table as text", options=(WIDTH,))
def format_table(table: OpTable, *, width: int | None = None) -> str:
    """The table as text: a title, the rows, a Total row and notes. Given ``width``, the
    least important columns are hidden to fit it (the notes name them) and long names,
    paths and shapes cut."""
    columns = [c for c in COLUMNS if c.shown(table)]
    empty = None
    if not table.matched:
        recorded = any(node.ops for node in table.profile.nodes())
        empty = "(no op matches module / phase)" if recorded else "(no ops: profiled with record_ops=False)"
    layout = [c.layout(table) for c in columns]
    rows = [[c.cell(row, table) for c in columns] for row in [*table.rows, table.total]]
    footer = _footer(table)
    if width is not None:
        fitted = fit(layout, rows, width)
        layout, rows = fitted.columns, fitted.rows
        if fitted.hidden:
            footer.append(hidden_line(width, [columns[i].header for i in fitted.hidden], "a wider --width shows them"))
    lines = draw(layout, rows[:-1], total=rows[-1], empty=empty)
    out = [*_header_lines(table.profile, width), *wrap(_title(table), width), "", *lines, "", *wrap_lines(footer, width)]
    return "\n".join(out) + "\n"


def _sort_key(text: str) -> str:
    sort_field(text)
    return text


def _group_key(text: str) -> str:
    parse_group_by(text)
    return text


SORT_BY = Option(
    "sort_by", "sort rows by this metric, descending ('--sort-by list' lists them; default self_cpu_time, "
    "or flops for an untimed count)", parse=_sort_key, metavar="METRIC",
    listing=lambda: "Sort keys of the operator table (--sort-by), descending:\n" + "".join(f"  {key}\n" for key in SORT_KEYS),
)
GROUP_BY = Option(
    "group_by", "one row per name (default), shape, module, module_type, phase or stack:N "
    "(N frames of the Python stack); combine with commas: module,shape", parse=_group_key, metavar="KEY",
    listing=lambda: "Group keys of the operator table (--group-by), comma-separated:\n"
    + "".join(f"  {key}\n" for key in GROUP_KEYS if key != "stack") + "  stack:N\n",
)
MODULE = Option("module", "only the ops of this module's subtree (its named_modules() path)", metavar="PATH")
PHASE = Option("phase", "only the ops of one phase (step: the step's parts outside the model)", choices=(*PHASES, STEP_PHASE))
STACK_DEPTH = Option("stack_depth", "frames of the Python stack per row (group_by stack)", flag=False)


@register_renderer(
    "ops", description="aten ops grouped and sorted in one table, like torch.profiler's key_averages",
    options=(SORT_BY, GROUP_BY, LIMIT, MODULE, PHASE, STACK_DEPTH, WIDTH),
)
def render_ops(
    profile: Profile, *, sort_by: str | None = None, group_by: GroupBy | None = "name", limit: int | None = None,
    module: str | None = None, phase: str | None = None, stack_depth: int | None = None, width: int | None = None,
) -> str:
    """The operator table; the options as in ``Profile.ops`` (``limit`` 0: every row),
    fitted to ``width`` as :func:`format_table` does."""
    table = op_table(
        profile, sort_by=sort_by, group_by=group_by, limit=limit or None, module=module, phase=phase,
        stack_depth=stack_depth,
    )
    return format_table(table, width=width)
