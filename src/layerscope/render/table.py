"""Text tables: the one layout every text renderer draws its tables with.

A caller decides which columns exist and what their cells say (strings, made by
:mod:`layerscope.base.fmt`); this module only lays them out: each column as wide as its
widest cell (or a fixed width), cells padded left or right, a separator between
columns, a rule under the header and above a total row, and no trailing spaces. A cell
holding newlines takes several lines, the row's other cells blank below their first.
Given a width, :func:`fit` hides the least important columns and cuts long cells, and
:func:`wrap` breaks the lines of text around a table.

Widths count characters, as a monospace terminal shows the text layerscope prints (the
tree's box-drawing characters and ``Δ`` are one character wide each).

Pure: no I/O, no torch; the same cells give the same lines.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

#: A row: one string per column.
Cells = Sequence[str]


@dataclass(frozen=True)
class Column:
    """How one column is laid out.

    ``align`` is ``"<"`` (left) or ``">"`` (right). ``priority`` decides which columns
    :func:`fit` hides: the highest number first, columns of one number together (a
    training table's forward and backward self times); None, never. ``width`` fixes the
    column's width (torch's table): its cells are padded to it, and a longer cell is
    neither cut nor widens the column, it pushes the rest of its line right.

    ``min_width`` lets :func:`fit` cut the column's long cells (free text: shapes,
    paths, a tree's names) down to that many characters, an ellipsis marking the cut:
    at the end, or at the start with ``cut_start`` (a path's last parts say the most)."""

    header: str
    align: str = ">"
    priority: int | None = None
    width: int | None = None
    min_width: int | None = None
    cut_start: bool = False
    #: A label column's width that :func:`fit` cuts it to before it hides any column or
    #: cuts another's cells (a tree's long names abbreviated before its shapes are cut or
    #: its figures hidden); None: no such step.
    soft_width: int | None = None


def from_headers(headers: Sequence[str], *, left: int = 0) -> list[Column]:
    """Columns for ``headers``: the first ``left`` of them left-aligned (the labels),
    the others right-aligned (the figures)."""
    return [Column(header, "<" if i < left else ">") for i, header in enumerate(headers)]


@dataclass(frozen=True)
class Style:
    """What goes between columns: ``separator`` on a row, ``rule_joint`` on the rule of
    dashes under the header (None: no rule)."""

    separator: str
    rule_joint: str | None


#: ``Name | Calls`` over ``-----|------``: the tables of layerscope's own formats.
PIPES = Style(" | ", "-|-")
#: Two spaces between columns, no rule (the benchmark's table).
SPACES = Style("  ", None)


@dataclass(frozen=True)
class Grid:
    """Columns whose widths are settled: draws rows and rules."""

    columns: Sequence[Column]
    widths: Sequence[int]
    style: Style = PIPES

    @property
    def width(self) -> int:
        """The width of a row whose every cell fills its column."""
        return sum(self.widths) + len(self.style.separator) * max(len(self.widths) - 1, 0)

    def rule(self) -> str:
        """Dashes the width of each column, joined by the style's ``rule_joint``."""
        return (self.style.rule_joint or self.style.separator).join("-" * width for width in self.widths)

    def lines(self, cells: Cells) -> list[str]:
        """One row: a line per line of its tallest cell, each without trailing spaces."""
        parts = [cell.split("\n") for cell in cells]
        height = max((len(lines) for lines in parts), default=1)
        out = []
        for i in range(height):
            padded = (
                _pad(lines[i] if i < len(lines) else "", width, column.align)
                for lines, width, column in zip(parts, self.widths, self.columns)
            )
            out.append(self.style.separator.join(padded).rstrip())
        return out


def _pad(text: str, width: int, align: str) -> str:
    return text.ljust(width) if align == "<" else text.rjust(width)


def measure(columns: Sequence[Column], rows: Sequence[Cells], style: Style = PIPES) -> Grid:
    """The grid of ``columns`` wide enough for their headers and the cells of ``rows``
    (every line of a cell that holds several)."""
    texts = [[column.header for column in columns], *rows]
    widths = [
        column.width if column.width is not None
        else max(len(line) for cells in texts for line in cells[i].split("\n"))
        for i, column in enumerate(columns)
    ]
    return Grid(columns, widths, style)


def draw(
    columns: Sequence[Column],
    rows: Sequence[Cells],
    *,
    total: Cells | None = None,
    empty: str | None = None,
    style: Style = PIPES,
) -> list[str]:
    """The table's lines: the header, a rule, the rows (``empty`` instead when there are
    none and it is given), then a rule and the ``total`` row when there is one."""
    grid = measure(columns, [*rows, total] if total is not None else rows, style)
    out = grid.lines([column.header for column in columns])
    if style.rule_joint is not None:
        out.append(grid.rule())
    if not rows and empty is not None:
        out.append(empty)
    for cells in rows:
        out.extend(grid.lines(cells))
    if total is not None:
        if style.rule_joint is not None:
            out.append(grid.rule())
        out.extend(grid.lines(total))
    return out


#: What marks a cell cut to fit a width.
ELLIPSIS = "…"


def cut(text: str, width: int, *, at_start: bool = False) -> str:
    """``text`` in at most ``width`` characters, each of its lines: a longer line loses
    its end (or its start) to an ellipsis."""

    def line(part: str) -> str:
        if len(part) <= width:
            return part
        if width < 1:
            return ""
        return ELLIPSIS + part[len(part) - width + 1 :] if at_start else part[: width - 1] + ELLIPSIS

    return "\n".join(line(part) for part in text.split("\n"))


@dataclass(frozen=True)
class Fitted:
    """A table fitted to a width by :func:`fit`: the ``kept`` columns' indexes in the
    table, those ``columns`` and ``rows`` of their cells (long ones cut), and the
    indexes of the ``hidden`` columns."""

    kept: list[int]
    columns: list[Column]
    rows: list[list[str]]
    hidden: list[int]


def fit(columns: Sequence[Column], rows: Sequence[Cells], width: int, style: Style = PIPES) -> Fitted:
    """The table made at most ``width`` wide, in this order of means:

    - columns with a priority and a ``min_width`` count at that width (their long cells
      will be cut: they are free text, worth less whole than another column);
    - labels with a ``soft_width`` count at that width (a tree's long names are
      abbreviated before any figure is given up);
    - columns with a priority are hidden, the highest number first, all columns of one
      number at once, until the table fits; the columns of the lowest number always stay,
      as do those without a priority;
    - then cells are cut, as little as needed: the labels down to their soft width, then
      the columns with a priority (right to left), and only then the labels further.

    A table that cannot fit even so is wider than ``width``. Headers are never cut."""
    widths = measure(columns, rows, style).widths
    narrowest = [
        widths[i] if column.min_width is None else min(widths[i], max(column.min_width, len(column.header)))
        for i, column in enumerate(columns)
    ]
    priorities = sorted({column.priority for column in columns if column.priority is not None})
    kept = list(range(len(columns)))

    def table_width(sizes: Sequence[int]) -> int:
        return Grid([columns[i] for i in kept], [sizes[i] for i in kept], style).width

    soft = [
        min(widths[i], max(column.soft_width, narrowest[i])) if column.soft_width is not None else widths[i]
        for i, column in enumerate(columns)
    ]
    early = [narrowest[i] if column.priority is not None else soft[i] for i, column in enumerate(columns)]
    while len(priorities) > 1 and table_width(early) > width:
        dropped = priorities.pop()
        kept = [i for i in kept if columns[i].priority != dropped]
    sizes = list(widths)
    excess = table_width(sizes) - width
    # Cut the labels to their soft width first, then the hideable columns, right to
    # left, then the labels to their narrowest.
    labels = [i for i in reversed(kept) if columns[i].priority is None]
    steps = [(i, soft[i]) for i in labels]
    steps += [(i, narrowest[i]) for i in reversed(kept) if columns[i].priority is not None]
    steps += [(i, narrowest[i]) for i in labels]
    for i, floor in steps:
        if excess <= 0:
            break
        give = max(0, min(excess, sizes[i] - floor))
        sizes[i] -= give
        excess -= give
    fitted_rows = [
        [cut(cells[i], sizes[i], at_start=columns[i].cut_start) if sizes[i] < widths[i] else cells[i] for i in kept]
        for cells in rows
    ]
    hidden = [i for i in range(len(columns)) if i not in kept]
    return Fitted(kept, [columns[i] for i in kept], fitted_rows, hidden)


def wrap(text: str, width: int | None) -> list[str]:
    """A line of text around a table (a header, a footer note) broken to ``width``, its
    continuation lines indented; one line without a width."""
    if width is None:
        return [text]
    return textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False) or [text]


def wrap_lines(lines: Sequence[str], width: int | None) -> list[str]:
    """Each of ``lines`` broken by :func:`wrap`."""
    return [part for line in lines for part in wrap(line, width)]


def hidden_line(width: int, names: Sequence[str], how: str) -> str:
    """The note under a fitted table naming the columns :func:`fit` hid, and ``how`` to
    see them."""
    return f"Hidden to fit a width of {width}: {', '.join(names)} ({how})"


def draw_fitted(
    columns: Sequence[Column], rows: Sequence[Cells], width: int | None, style: Style = PIPES
) -> list[str]:
    """The table :func:`fit` to ``width`` (None: as wide as it needs), with a line under
    it naming the columns it hid: for a report of several tables, each says its own."""
    if width is None:
        return draw(columns, rows, style=style)
    fitted = fit(columns, rows, width, style)
    lines = draw(fitted.columns, fitted.rows, style=style)
    if fitted.hidden:
        lines += wrap(hidden_line(width, [columns[i].header for i in fitted.hidden], "a wider --width shows them"), width)
    return lines
