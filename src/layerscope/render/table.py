"""Text tables: the one layout every text renderer draws its tables with.

A caller decides which columns exist and what their cells say (strings, made by
:mod:`layerscope.fmt`); this module only lays them out: each column as wide as its
widest cell (or a fixed width), cells padded left or right, a separator between
columns, a rule under the header and above a total row, and no trailing spaces. A cell
holding newlines takes several lines, the row's other cells blank below their first.

Widths count characters, as a monospace terminal shows the text layerscope prints (the
tree's box-drawing characters and ``Δ`` are one character wide each).

Pure: no I/O, no torch; the same cells give the same lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: A row: one string per column.
Cells = Sequence[str]


@dataclass(frozen=True)
class Column:
    """How one column is laid out.

    ``align`` is ``"<"`` (left) or ``">"`` (right). ``priority`` decides which columns
    :func:`fit` hides: the highest number first; None, never. ``width`` fixes the
    column's width (torch's table): its cells are padded to it, and a longer cell is
    neither cut nor widens the column, it pushes the rest of its line right."""

    header: str
    align: str = ">"
    priority: int | None = None
    width: int | None = None


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


def fit(columns: Sequence[Column], rows: Sequence[Cells], width: int, style: Style = PIPES) -> list[int]:
    """The indexes of the columns to keep so the table is at most ``width`` wide.

    Columns with a priority are hidden one by one, the highest number first (of equal
    ones, the one further right), until the table fits. Columns with no priority always
    stay, and so does the most important of the others: a table that cannot fit keeps
    them and is wider than ``width``."""
    widths = measure(columns, rows, style).widths
    priorities = {i: column.priority for i, column in enumerate(columns) if column.priority is not None}
    # Most important first; sorted() keeps equal priorities in table order.
    hideable = sorted(priorities, key=priorities.__getitem__)
    kept = [i for i in range(len(columns)) if i not in priorities] + hideable

    def kept_width() -> int:
        return Grid([columns[i] for i in kept], [widths[i] for i in kept], style).width

    while len(hideable) > 1 and kept_width() > width:
        kept.remove(hideable.pop())
    return sorted(kept)
