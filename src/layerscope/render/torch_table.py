"""torch.profiler's event table (``key_averages().table()``), drawn from op records.

The layout users of the recipe know: right-aligned columns two spaces apart between
rules of dashes, a name column as wide as the longest name (at most
``max_name_column_width``), 12 characters for each figure, shares of the summed self CPU
time, device columns when any op has device time, memory columns when memory was
tracked, ``Input Shapes`` when grouped by shape and ``Source Location`` (one frame per
line) when grouped by stack, then ``Self CPU time total``. The rows come from
``layerscope.compat``'s :class:`~layerscope.compat.op_records.OpEvent` (the tree's op rows
under torch's names); this file only draws them. Lines carry no trailing spaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from layerscope.base import fmt
from layerscope.render.table import Column, Style, measure

if TYPE_CHECKING:
    from layerscope.compat.op_records import OpEvent

_FIGURE_WIDTH = 12
#: Two spaces between columns, on the rules too.
_STYLE = Style("  ", "  ")
_DEVICE = "CUDA"


def _clip_tail(text: str, width: int) -> str:
    """A long file path keeps its end, marked with ``...``."""
    if len(text) <= width:
        return text
    return "..." + text[len(text) - width + 3 :]


def format_events(
    events: Sequence[OpEvent],
    *,
    row_limit: int = 100,
    max_src_column_width: int = 75,
    max_name_column_width: int = 55,
    max_shapes_column_width: int = 80,
    header: str | None = None,
    notes: Sequence[str] = (),
    times_known: bool = True,
) -> str:
    """``events`` (already sorted) as torch's table; ``notes`` go under the totals. Without
    ``times_known`` (ops whose times were not measured: a compiled model's, a light-step
    block's) the time cells and the total read ``?``, never 0."""
    if not events:
        return ""
    device = any(e.self_device_time_total > 0 for e in events)
    memory = any(e.cpu_memory_usage is not None for e in events)
    device_memory = memory and any(e.self_device_memory_usage for e in events)
    shapes = any(e.input_shapes for e in events)
    stacks = any(e.stack for e in events)
    self_cpu_sum = sum(e.self_cpu_time_total for e in events)
    self_device_sum = sum(e.self_device_time_total for e in events)

    # Every width is fixed, as torch's are: a longer header ("Self CUDA Mem") overflows.
    name_width = min(max(len(e.key) for e in events) + 4, max_name_column_width)
    columns = [Column("Name", width=name_width)]
    headers = ["Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if device:
        headers += [f"Self {_DEVICE}", f"Self {_DEVICE} %", f"{_DEVICE} total", f"{_DEVICE} time avg"]
    if memory:
        headers += ["CPU Mem", "Self CPU Mem"] + ([f"{_DEVICE} Mem", f"Self {_DEVICE} Mem"] if device_memory else [])
    headers.append("# of Calls")
    columns += [Column(h, width=_FIGURE_WIDTH) for h in headers]
    shapes_width = min(max(len(str(e.input_shapes)) for e in events) + 4, max_shapes_column_width)
    if shapes:
        columns.append(Column("Input Shapes", width=shapes_width))
    src_width = 0
    if stacks:
        src_width = min(max(len(frame) for e in events for frame in e.stack) + 4, max_src_column_width)
        columns.append(Column("Source Location", "<", width=src_width))

    grid = measure(columns, [], _STYLE)  # every width is fixed: no cell changes them
    rule = grid.rule()
    out: list[str] = []
    if header is not None:
        out += ["=" * len(rule), header]
    out += [rule, *grid.lines([column.header for column in columns]), rule]
    for event in events[: max(row_limit, 0)]:
        name = event.key
        if len(name) >= max_name_column_width - 3:
            name = name[: max_name_column_width - 3] + "..."
        cells = [
            name,
            fmt.profiler_share(event.self_cpu_time_total, self_cpu_sum),
            fmt.profiler_time(event.self_cpu_time_total),
            fmt.profiler_share(event.cpu_time_total, self_cpu_sum),
            fmt.profiler_time(event.cpu_time_total),
            fmt.profiler_time(event.cpu_time),
        ] if times_known else [name, *["?"] * 5]
        if device:
            cells += [
                fmt.profiler_time(event.self_device_time_total),
                fmt.profiler_share(event.self_device_time_total, self_device_sum),
                fmt.profiler_time(event.device_time_total),
                fmt.profiler_time(event.device_time),
            ]
        if memory:
            cells += [fmt.profiler_memory(event.cpu_memory_usage), fmt.profiler_memory(event.self_cpu_memory_usage)]
            if device_memory:
                cells += [
                    fmt.profiler_memory(event.device_memory_usage),
                    fmt.profiler_memory(event.self_device_memory_usage),
                ]
        cells.append(str(event.count))
        if shapes:
            cells.append(str(event.input_shapes)[:shapes_width])
        if stacks:
            # One frame per line, and a blank line after each op.
            cells.append("\n".join(_clip_tail(frame, src_width) for frame in event.stack or [""]))
        out += grid.lines(cells)
        if stacks:
            out.append("")
    out += [rule, f"Self CPU time total: {fmt.profiler_time(self_cpu_sum) if times_known else '?'}"]
    if device:
        out.append(f"Self {_DEVICE} time total: {fmt.profiler_time(self_device_sum)}")
    out += list(notes)
    return "\n".join(out) + "\n"
