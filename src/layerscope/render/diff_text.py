"""A :class:`~layerscope.model.diff.ProfileDiff` as text (the model's summary, then the nodes
and the changed ops, largest change in the diff's metric first) and as JSON
(``layerscope-diff/1``): the ``text`` and ``json`` formats of the registry's ``diff``
table. Like every renderer they are pure functions: the same diff gives the same bytes.

Both take what ``layerscope diff`` adds to a diff: ``imbalance`` (how each node's
imbalance moved, for two merged runs) and ``fail_above`` (the threshold whose
regressions the verdict names).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from layerscope.base import fmt
from layerscope.base.formats import Option, register_renderer
from layerscope.model.diff import METRICS, change_percent, display_path
from layerscope.render.options import LIMIT, WIDTH
from layerscope.render.table import Column, draw, draw_fitted, from_headers, wrap, wrap_lines

if TYPE_CHECKING:
    from layerscope.model.diff import DiffRow, ProfileDiff, Regression, ShapeCalls
    from layerscope.model.ranks import ImbalanceChange

Formatter = Callable[[int], str]


def signed(value: int | None, formatter: Formatter) -> str:
    """A change with its sign: ``+1.500ms``, ``-4.00K``; no sign on zero."""
    if value is None:
        return ""
    if value > 0:
        return "+" + formatter(value)
    if value < 0:
        return "-" + formatter(-value)
    return formatter(0)


def _shapes_cell(row: DiffRow) -> str:
    """An op's shapes; ``base -> new`` where they changed (the batch size did). A row
    that pairs several shapes, or calls of another count, lists each side's shapes
    with their calls (``[[128, 128]] x2 -> [[256, 128]] x1, [[128, 256]] x1``): its
    figures are the sums over them."""
    if row.new_input_shapes is None:
        return fmt.shape(row.input_shapes)
    one_each = len(row.shapes_base) == len(row.shapes_new) == 1
    if not row.shapes_base or (one_each and row.shapes_base[0].calls == row.shapes_new[0].calls):
        return f"{fmt.shape(row.input_shapes)} -> {fmt.shape(row.new_input_shapes)}"

    def side(shapes: Sequence[ShapeCalls]) -> str:
        return ", ".join(f"{fmt.shape(s.input_shapes)} x{s.calls}" for s in shapes)

    return f"{side(row.shapes_base)} -> {side(row.shapes_new)}"


#: The verdict names at most this many regressions, one per line; the JSON lists all.
REGRESSIONS_SHOWN = 10


def regressions_line(regressions: list[Regression], threshold: float) -> str:
    """The verdict the CLI prints after the table: one regression per line, the model's
    total first, then the nodes by how much time they gained (not by percentage),
    largest first; at most
    :data:`REGRESSIONS_SHOWN` of them, with the count."""
    limit = f"{100 * threshold:g}%"
    if not regressions:
        return f"No regression above {limit}."
    total = [r for r in regressions if r.path is None]
    nodes = sorted((r for r in regressions if r.path is not None), key=lambda r: -(r.change.delta or 0))
    ordered = total + nodes
    if len(ordered) == 1:
        return f"Regressed above {limit}: {ordered[0]}"
    what = " and ".join(
        part for part in ("the model's total" if total else "", f"{len(nodes)} node{'s' * (len(nodes) != 1)}" if nodes else "") if part
    )
    lines = [f"Regressed above {limit}: {len(ordered)} ({what}), the largest gain in time first:"]
    lines += [f"  {r}" for r in ordered[:REGRESSIONS_SHOWN]]
    if len(ordered) > REGRESSIONS_SHOWN:
        lines.append(f"  ... and {len(ordered) - REGRESSIONS_SHOWN} more (--format json lists them all)")
    return "\n".join(lines)


# -- tables ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DiffColumn:
    """A column of a diff's table: ``cell`` gives a row's text; ``shown`` says whether
    the diff has the data (both sides measured it somewhere). ``priority``,
    ``min_width`` and ``cut_start`` say how it fits a width (``table.Column``): the
    names that label the rows have no priority, and the change in the diff's metric
    the lowest."""

    header: str
    cell: Callable[[DiffRow], str]
    shown: Callable[[ProfileDiff, list[DiffRow]], bool] = lambda diff, rows: True
    align: str = ">"
    #: The row metric the column shows, if any.
    metric: str | None = None
    priority: int | None = None
    min_width: int | None = None
    cut_start: bool = False

    def layout(self) -> Column:
        return Column(self.header, self.align, self.priority, min_width=self.min_width, cut_start=self.cut_start)


def _measured(metric: str, *, moved: bool = False) -> Callable[[ProfileDiff, list[DiffRow]], bool]:
    """Shown when a row has the metric on either side; with ``moved``, only when some
    row's value changed (a column of changes that are all zero says nothing)."""

    def shown(diff: ProfileDiff, rows: list[DiffRow]) -> bool:
        changes = [row.metrics[metric] for row in rows]
        if moved:
            return any(c.delta for c in changes)
        return any(c.base is not None or c.new is not None for c in changes)

    return shown


def _value(metric: str, formatter: Formatter, side: str) -> Callable[[DiffRow], str]:
    def cell(row: DiffRow) -> str:
        value = getattr(row.metrics[metric], side)
        return "" if value is None else formatter(value)

    return cell


def _delta(metric: str, formatter: Formatter) -> Callable[[DiffRow], str]:
    return lambda row: signed(row.metrics[metric].delta, formatter)


def _percent(metric: str) -> Callable[[DiffRow], str]:
    return lambda row: change_percent(row.metrics[metric])


def _type(row: DiffRow) -> str:
    return row.type_new if row.type_new is not None else (row.type_base or "")


def _note(row: DiffRow) -> str:
    if row.status != "matched":
        return row.status
    if row.type_base != row.type_new:
        return f"was {row.type_base}"
    return "noise" if row.noise else ""


def _full_columns(metric: str, label: str, formatter: Formatter) -> list[DiffColumn]:
    """Base, new, change and relative change of one metric, the diff's own: a width
    hides its change last."""
    shown = _measured(metric)
    return [
        DiffColumn(f"{label} base", _value(metric, formatter, "base"), shown, metric=metric, priority=3),
        DiffColumn(f"{label} new", _value(metric, formatter, "new"), shown, metric=metric, priority=3),
        DiffColumn(f"{label} Δ", _delta(metric, formatter), shown, metric=metric, priority=0),
        DiffColumn(f"{label} Δ%", _percent(metric), shown, metric=metric, priority=0),
    ]


#: How much less a metric's columns weigh when another metric leads the diff.
_NOT_THE_METRIC = 4


_FLOPS_SHOWN = _measured("flops")

#: What both tables share after their first columns: time, device time, FLOPs.
_METRIC_COLUMNS: list[DiffColumn] = [
    *_full_columns("self_time_ns", "Self", fmt.time_ns),
    DiffColumn("Total base", _value("time_ns", fmt.time_ns, "base"), _measured("time_ns"), metric="time_ns", priority=7),
    DiffColumn("Total new", _value("time_ns", fmt.time_ns, "new"), _measured("time_ns"), metric="time_ns", priority=7),
    DiffColumn("Total Δ%", _percent("time_ns"), _measured("time_ns"), metric="time_ns", priority=4),
    DiffColumn(
        "Device Δ", _delta("device_time_ns", fmt.time_ns), _measured("device_time_ns", moved=True),
        metric="device_time_ns", priority=2,
    ),
    DiffColumn(
        "Device Δ%", _percent("device_time_ns"), _measured("device_time_ns", moved=True),
        metric="device_time_ns", priority=5,
    ),
    DiffColumn("FLOPs base", _value("flops", fmt.count, "base"), _FLOPS_SHOWN, metric="flops", priority=9),
    DiffColumn("FLOPs new", _value("flops", fmt.count, "new"), _FLOPS_SHOWN, metric="flops", priority=9),
    DiffColumn("FLOPs Δ", _delta("flops", fmt.count), _FLOPS_SHOWN, metric="flops", priority=5),
]

#: The header of the diff's metric's own columns, shown first after the names.
_METRIC_LABELS = {
    "self_cpu": "Self", "total_cpu": "Total", "self_device": "Self dev", "total_device": "Device",
    "self_flops": "Self FLOPs", "total_flops": "FLOPs", "self_alloc": "Self alloc", "total_alloc": "Alloc",
}

_FORMATTERS: dict[str, Formatter] = {"time": fmt.time_ns, "count": fmt.count, "bytes": fmt.nbytes}

_ALLOC_DELTA = DiffColumn(
    "Alloc Δ", _delta("alloc_bytes", fmt.nbytes), _measured("alloc_bytes", moved=True), metric="alloc_bytes", priority=10
)
# What a row is (added, removed, noise) matters next to its change.
_NOTE = DiffColumn("Note", _note, align="<", priority=1)

NODE_COLUMNS: list[DiffColumn] = [
    DiffColumn("Module", lambda row: display_path(row.path), align="<", min_width=16, cut_start=True),
    DiffColumn("Type", _type, align="<", priority=6),
    *_METRIC_COLUMNS,
    DiffColumn("Peak mem Δ", _delta("peak_bytes", fmt.nbytes), _measured("peak_bytes", moved=True), priority=8),
    DiffColumn(
        "Activations Δ", _delta("activation_bytes", fmt.nbytes), _measured("activation_bytes", moved=True), priority=10
    ),
    _ALLOC_DELTA,
    _NOTE,
]

OP_COLUMNS: list[DiffColumn] = [
    DiffColumn("Op", lambda row: row.op or "", align="<", min_width=24),
    DiffColumn("Module", lambda row: display_path(row.path), align="<", priority=2, min_width=16, cut_start=True),
    DiffColumn("Phase", lambda row: row.phase or "", lambda diff, rows: len(diff.phases) > 1, align="<", priority=2),
    DiffColumn("Input shapes", lambda row: _shapes_cell(row), align="<", priority=4, min_width=16),
    *_METRIC_COLUMNS,
    _ALLOC_DELTA,
    _NOTE,
]


def _with_metric_first(columns: list[DiffColumn], metric_name: str, field_name: str) -> list[DiffColumn]:
    """``columns`` with the diff's metric's base, new, change and % right after the
    names, and its other columns dropped: the figures the rows are ordered by, first.
    The self CPU time's are there already."""
    if field_name == "self_time_ns":
        return columns
    metric = METRICS[metric_name]
    first = next(i for i, c in enumerate(columns) if c.metric is not None)
    rest = [
        replace(c, priority=c.priority + _NOT_THE_METRIC) if c.metric == "self_time_ns" and c.priority is not None else c
        for c in columns[first:] if c.metric != field_name
    ]
    return columns[:first] + _full_columns(field_name, _METRIC_LABELS[metric_name], _FORMATTERS[metric.unit]) + rest


def _table(
    columns: list[DiffColumn], rows: list[DiffRow], diff: ProfileDiff, field_name: str, width: int | None
) -> list[str]:
    """The table, fitted to ``width`` (a line under it names what was hidden)."""
    columns = _with_metric_first(columns, diff.metric, field_name)
    shown = [c for c in columns if c.shown(diff, rows)]
    return draw_fitted([c.layout() for c in shown], [[c.cell(row) for c in shown] for row in rows], width)


# -- the whole report --------------------------------------------------------------------

_SUMMARY_LABELS: dict[str, tuple[str, Formatter]] = {
    "time_ns": ("Time", fmt.time_ns),
    "device_time_ns": ("Device time", fmt.time_ns),
    "flops": ("FLOPs", fmt.count),
    "params": ("Params", fmt.count),
    "peak_bytes": ("Peak memory", fmt.nbytes),
}


def _summary_lines(diff: ProfileDiff) -> list[str]:
    rows: list[list[str]] = []
    for metric, change in diff.summary.items():
        if change.base is None and change.new is None:
            continue
        label, formatter = _SUMMARY_LABELS[metric]
        if metric == "time_ns":
            label = "Step time" if diff.total_kind == "step" else "Forward time"
        rows.append([
            label,
            "" if change.base is None else formatter(change.base),
            "" if change.new is None else formatter(change.new),
            signed(change.delta, formatter),
            change_percent(change),
        ])
    return draw(from_headers(["Model", "Base", "New", "Change", "Δ%"], left=1), rows)


def _side(diff: ProfileDiff, side: str) -> str:
    from layerscope.model.diff import profile_kind

    profile = diff.base if side == "base" else diff.new
    parts = [str(profile.meta.model or profile.root.type), str(profile.meta.device or "cpu")]
    parts.append(profile_kind(profile) if profile.timed else "not timed")
    return f"{side}: " + ", ".join(parts)


def _counts(rows: list[DiffRow]) -> str:
    by_status = {status: sum(1 for r in rows if r.status == status) for status in ("matched", "added", "removed")}
    return ", ".join(f"{n} {status}" for status, n in by_status.items())


def render_diff(diff: ProfileDiff, *, limit: int | None = None, width: int | None = None) -> str:
    """The summary, then up to ``limit`` node rows and ``limit`` changed-op rows
    (None: all), each largest change in the diff's metric first; given ``width``, each
    table hides its least important columns to fit it, and the notes are wrapped."""
    head = [f"Diff  ·  {_side(diff, 'base')}  ·  {_side(diff, 'new')}", *(f"Warning: {w}" for w in diff.warnings)]
    out = [*wrap_lines(head, width), "", *_summary_lines(diff)]

    metric = METRICS[diff.metric]
    notes: list[str] = []
    for title, noun, columns, rows, field_name in (
        ("Modules", "module", NODE_COLUMNS, diff.rows, metric.node_field),
        ("Changed ops", "changed op", OP_COLUMNS, diff.changed_ops(), metric.op_field),
    ):
        if not rows:
            continue
        shown = rows[:limit] if limit else rows
        out += [
            "", *wrap(f"{title}, largest change in {metric.label} first:", width),
            *_table(columns, shown, diff, field_name, width),
        ]
        if len(shown) < len(rows):
            notes.append(f"{len(rows) - len(shown)} more {noun} rows not shown (limit {limit})")

    notes.insert(0, f"Modules: {_counts(diff.rows)}. Ops: {_counts(diff.op_rows)}.")
    if diff.timed:
        notes.extend(noise_lines(diff))
    out += ["", *wrap_lines(notes, width)]
    return "\n".join(out) + "\n"


def noise_lines(diff: ProfileDiff) -> list[str]:
    """What the diff counts as noise: the floor, and the spread measured on each side;
    for a metric that is counted, not timed (FLOPs, bytes), that neither applies."""
    metric = METRICS[diff.metric]
    if not metric.timed:
        return [f"Metric {metric.name}: counted, not timed; no noise floor or band applies to it."]
    lines = [
        f"Noise floor: {fmt.time_ns(diff.min_time_ns)}; a module whose {metric.label} is below it "
        "in both profiles is never counted as a regression."
    ]

    def spread(value: float | None) -> str:
        return "not measured (one pass)" if value is None else f"{100 * value:.1f}%"

    if diff.noise is None:
        lines.append("Noise: not measured (each side ran one pass or step); only the floor applies.")
    else:
        lines.append(
            f"Noise: repeated passes spread by {spread(diff.noise_base)} (base) and {spread(diff.noise_new)} (new); "
            f"a {metric.label} that moved by at most {100 * diff.noise:.1f}% is marked noise, not a regression."
        )
    return lines


def imbalance_lines(rows: list[ImbalanceChange], *, limit: int | None = None, width: int | None = None) -> list[str]:
    """Two merged runs: how each node's imbalance (max / median over the ranks) moved,
    largest move first; appended to the diff of their median ranks' trees."""

    def ratio(value: float | None) -> str:
        return "" if value is None else f"x{value:.2f}"

    shown = rows[:limit] if limit else rows
    cells: list[list[str]] = []
    for row in shown:
        delta = "" if row.delta is None else f"{row.delta:+.2f}"
        cells.append([display_path(row.path), row.phase, ratio(row.base), ratio(row.new), delta])
    out = ["", "Imbalance over the ranks (max / median time), largest change first:"]
    layout = [
        Column("Module", "<", min_width=16, cut_start=True), Column("Phase", "<", 1), Column("Imbalance base", priority=1),
        Column("Imbalance new", priority=1), Column("Change", priority=0),
    ]
    out += draw_fitted(layout, cells, width)
    if len(shown) < len(rows):
        out.append(f"{len(rows) - len(shown)} more imbalance rows not shown (limit {limit})")
    return out


IMBALANCE = Option(
    "imbalance", "two merged runs' changes in imbalance (ranks.imbalance_changes), shown after the diff", flag=False
)
FAIL_ABOVE = Option(
    "fail_above", "the regression threshold (0.1: 10%): the verdict and the regressions above it", flag=False
)


@register_renderer(
    "text", document="diff", extensions=(".txt",), description="the diff as text tables",
    options=(LIMIT, IMBALANCE, FAIL_ABOVE, WIDTH),
)
def render_diff_text(
    diff: ProfileDiff, *, limit: int | None = None, imbalance: Sequence[ImbalanceChange] | None = None,
    fail_above: float | None = None, width: int | None = None,
) -> str:
    """:func:`render_diff`, then the changes in imbalance and the verdict when given,
    all fitted to ``width`` when given."""
    text = render_diff(diff, limit=limit, width=width)
    if imbalance is not None:
        text += "".join(line + "\n" for line in imbalance_lines(list(imbalance), limit=limit, width=width))
    if fail_above is not None:
        verdict = regressions_line(diff.regressions(fail_above), fail_above)
        text += "\n" + "".join(line + "\n" for line in wrap_lines(verdict.split("\n"), width))
    return text


@register_renderer(
    "json", document="diff", extensions=(".json",), description="the layerscope-diff/1 JSON document",
    options=(IMBALANCE, FAIL_ABOVE),
)
def render_diff_json(
    diff: ProfileDiff, *, imbalance: Sequence[ImbalanceChange] | None = None, fail_above: float | None = None
) -> str:
    """``diff.to_dict()``, with ``imbalance`` and, given ``fail_above``, the threshold and
    its regressions."""
    doc = diff.to_dict()
    if imbalance is not None:
        doc["imbalance"] = [row.to_dict() for row in imbalance]
    if fail_above is not None:
        doc["fail_above"] = fail_above
        doc["regressions"] = [r.to_dict() for r in diff.regressions(fail_above)]
    return json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
