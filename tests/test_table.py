"""The text table engine (``layerscope.render.table``), with hand-built cells and the
lines expected written out in full."""

from __future__ import annotations

import textwrap

import pytest

from layerscope.render.table import PIPES, SPACES, Column, Style, cut, draw, fit, from_headers, measure


def _text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("columns", "rows", "expected"),
    [
        # No trailing spaces: the last column is padded, then each line is stripped.
        pytest.param([Column("Name", "<"), Column("Calls"), Column("Note", "<")], [["conv", "1", "first"], ["a_long_op_name", "12345", ""]], """
            Name           | Calls | Note
            ---------------|-------|------
            conv           |     1 | first
            a_long_op_name | 12345 |
            """, id="as-wide-as-the-widest-cell"),
        pytest.param([Column("Self CPU total"), Column("x", "<")], [["1ms", "y"]], """
            Self CPU total | x
            ---------------|--
                       1ms | y
            """, id="a-wide-header-sets-the-width"),
        pytest.param([Column("Name", "<"), Column("Calls"), Column("Stack", "<")], [["mul", "2", "f.py:3 g\nf.py:10 forward"], ["add", "1", "f.py:4 h"]], """
            Name | Calls | Stack
            -----|-------|----------------
            mul  |     2 | f.py:3 g
                 |       | f.py:10 forward
            add  |     1 | f.py:4 h
            """, id="a-cell-with-newlines-takes-several-lines"),
        pytest.param([Column("Module", "<"), Column("Params")], [["features.0.block.1.attention.query_key_value_projection", "1.05M"]], """
            Module                                                  | Params
            --------------------------------------------------------|-------
            features.0.block.1.attention.query_key_value_projection |  1.05M
            """, id="wide-cells-are-never-cut"),
    ],
)
def test_drawn_tables(columns: list[Column], rows: list[list[str]], expected: str) -> None:
    assert _text(draw(columns, rows)) == textwrap.dedent(expected).lstrip("\n")


def test_a_total_row_goes_under_a_second_rule_and_counts_in_the_widths() -> None:
    columns = from_headers(["Op", "Time"], left=1)
    lines = draw(columns, [["mm", "5us"], ["add", "1us"]], total=["Total", "1000.000us"])
    assert _text(lines) == (
        "Op    |       Time\n"
        "------|-----------\n"
        "mm    |        5us\n"
        "add   |        1us\n"
        "------|-----------\n"
        "Total | 1000.000us\n"
    )


def test_no_rows_give_the_header_alone_or_the_empty_note() -> None:
    columns = from_headers(["Module", "Time"], left=1)
    assert draw(columns, []) == ["Module | Time", "-------|-----"]
    assert draw(columns, [], empty="(nothing measured)") == ["Module | Time", "-------|-----", "(nothing measured)"]
    # The note is for an empty table only.
    assert draw(columns, [["a", "1"]], empty="(nothing measured)") == ["Module | Time", "-------|-----", "a      |    1"]
    assert draw(columns, [], total=["Total", "0"], empty="(none)") == [
        "Module | Time",
        "-------|-----",
        "(none)",
        "-------|-----",
        "Total  |    0",
    ]


def test_two_spaces_and_no_rule() -> None:
    lines = draw(from_headers(["batch", "p50", "verdict"]), [["1", "1.000ms", "slower"]], style=SPACES)
    assert lines == ["batch      p50  verdict", "    1  1.000ms   slower"]
    empty = draw(from_headers(["batch", "p50"]), [], empty="(no batch size)", style=SPACES)
    assert empty == ["batch  p50", "(no batch size)"]


def test_fixed_widths_pad_and_let_longer_cells_overflow() -> None:
    columns = [Column("Name", width=8), Column("Self CUDA Mem", width=12), Column("Calls", width=6)]
    grid = measure(columns, [["aten::mm", "1 Kb", "1"]], Style("  ", "  "))
    assert grid.widths == [8, 12, 6]
    assert grid.rule() == "--------  ------------  ------"
    # Too long for 12, the header pushes the rest of its line right, as torch's table does.
    assert grid.lines(["Name", "Self CUDA Mem", "Calls"]) == ["    Name  Self CUDA Mem   Calls"]
    assert grid.lines(["aten::mm", "1 Kb", "1"]) == ["aten::mm          1 Kb       1"]


def test_grid_width_counts_the_separators() -> None:
    grid = measure(from_headers(["ab", "cde", "f"]), [])
    assert grid.width == 2 + 3 + 1 + 2 * len(PIPES.separator)
    assert measure(from_headers(["ab", "cde", "f"]), [], SPACES).width == 2 + 3 + 1 + 2 * 2


# -- fitting a width -------------------------------------------------------------------

_FIT_COLUMNS = [
    Column("Module", "<"),  # no priority: never hidden
    Column("Self", priority=0),
    Column("Total", priority=1),
    Column("Params", priority=4),
    Column("Calls", priority=2),
]
_FIT_ROWS = [["net", "1.0ms", "2.0ms", "1.00M", "1"]]
# Widths: Module 6, Self 5, Total 5, Params 6, Calls 5; 3 characters between columns.
_FULL_WIDTH = 6 + 5 + 5 + 6 + 5 + 4 * 3


def _kept(columns: list[Column], rows: list[list[str]], width: int) -> list[int]:
    return fit(columns, rows, width).kept


def test_a_table_that_fits_keeps_every_column() -> None:
    assert _kept(_FIT_COLUMNS, _FIT_ROWS, _FULL_WIDTH) == [0, 1, 2, 3, 4]
    wide = fit(_FIT_COLUMNS, _FIT_ROWS, 1000)
    assert wide.kept == [0, 1, 2, 3, 4] and wide.hidden == [] and wide.rows == _FIT_ROWS


def test_the_highest_priority_number_is_hidden_first() -> None:
    # One character short: Params (priority 4) goes, though it is not the last column.
    fitted = fit(_FIT_COLUMNS, _FIT_ROWS, _FULL_WIDTH - 1)
    assert fitted.kept == [0, 1, 2, 4] and fitted.hidden == [3]
    assert fitted.rows == [["net", "1.0ms", "2.0ms", "1"]]
    # Without Params the table is 6 + 5 + 5 + 5 + 3 * 3 = 30 wide; one less, Calls (2) goes,
    assert _kept(_FIT_COLUMNS, _FIT_ROWS, 30) == [0, 1, 2, 4]
    assert _kept(_FIT_COLUMNS, _FIT_ROWS, 29) == [0, 1, 2]
    # then Total (1).
    assert _kept(_FIT_COLUMNS, _FIT_ROWS, 6 + 5 + 5 + 2 * 3 - 1) == [0, 1]
    fitted = fit(_FIT_COLUMNS, _FIT_ROWS, 20)
    assert _text(draw(fitted.columns, fitted.rows)) == (
        "Module |  Self\n"
        "-------|------\n"
        "net    | 1.0ms\n"
    )


def test_the_most_important_column_and_unprioritised_ones_always_stay() -> None:
    assert _kept(_FIT_COLUMNS, _FIT_ROWS, 1) == [0, 1]
    assert _kept([Column("Only", priority=3)], [["x"]], 1) == [0]
    assert _kept([Column("Label", "<"), Column("Note", "<")], [["a", "b"]], 1) == [0, 1]


def test_columns_of_one_priority_are_hidden_together_and_the_lowest_stay() -> None:
    # A training table: forward and backward self times share the lowest number, so a
    # width never keeps one phase's and hides the other's.
    columns = [Column("A", priority=1), Column("B", priority=5), Column("C", priority=5), Column("D", priority=0)]
    rows = [["aaaa", "bbbb", "cccc", "dddd"]]
    assert _kept(columns, rows, 4 * 4 + 3 * 3) == [0, 1, 2, 3]
    assert _kept(columns, rows, 4 * 4 + 3 * 3 - 1) == [0, 3]
    assert _kept(columns, rows, 1) == [3]
    pair = [Column("Label", "<"), Column("Fwd self", priority=0), Column("Bwd self", priority=0)]
    assert _kept(pair, [["net", "1ms", "2ms"]], 1) == [0, 1, 2]


def test_long_cells_are_cut_before_a_column_is_hidden_and_labels_last() -> None:
    columns = [
        Column("Name", "<", min_width=6),
        Column("Self", priority=0),
        Column("Shapes", "<", priority=1, min_width=8),
        Column("Path", "<", priority=1, min_width=6, cut_start=True),
        Column("Calls", priority=2),
    ]
    rows = [["aten::addmm", "1ms", "[[2, 16], [16, 32]]", "encoder.layers.0.fc", "3"]]
    # Whole: 11 + 4 + 19 + 19 + 5 + 4 * 3 = 70. Cut to 8 and 6, Shapes and Path leave room
    # for Calls down to 70 - 11 - 13 = 46; above that they are cut as little as needed,
    # right to left (at 60, Path loses 10).
    fitted = fit(columns, rows, 60)
    assert fitted.kept == [0, 1, 2, 3, 4]
    assert fitted.rows == [["aten::addmm", "1ms", "[[2, 16], [16, 32]]", "…ers.0.fc", "3"]]
    assert max(len(line) for line in draw(fitted.columns, fitted.rows)) == 60
    assert fit(columns, rows, 46).rows == [["aten::addmm", "1ms", "[[2, 16…", "….0.fc", "3"]]
    # Narrower, Calls goes; then Shapes and Path; only then is the label cut.
    assert fit(columns, rows, 45).kept == [0, 1, 2, 3]
    assert fit(columns, rows, 20).rows == [["aten::addmm", "1ms"]]
    assert fit(columns, rows, 11 + 4 + 3).rows == [["aten::addmm", "1ms"]]
    assert fit(columns, rows, 17).rows == [["aten::add…", "1ms"]]
    assert fit(columns, rows, 1).rows == [["aten:…", "1ms"]]  # never below min_width: wider than asked


def test_cut_marks_each_line_of_a_cell() -> None:
    assert cut("abcdef", 4) == "abc…" and cut("abcdef", 4, at_start=True) == "…def"
    assert cut("abc\nabcdef", 5) == "abc\nabcd…" and cut("abc", 3) == "abc"


def test_fitting_measures_cells_with_newlines_by_their_longest_line() -> None:
    columns = [Column("Name", "<"), Column("Stack", "<", priority=9), Column("Calls", priority=1)]
    rows = [["mul", "a.py:1\nb.py:2", "3"]]
    # Name 4 + Stack 6 + Calls 5 + 2 separators = 21.
    assert _kept(columns, rows, 21) == [0, 1, 2]
    assert _kept(columns, rows, 20) == [0, 2]


def test_long_names_are_abbreviated_to_their_soft_width_before_a_column_is_hidden() -> None:
    """A 60-character name, a 10-wide figure (priority 2) and a 20-wide shape (priority 1):
    full width 60 + 10 + 20 + 2 * 3 = 96. At 70 the name gives up 26 characters (down to
    its soft width, 34) and every column stays; without a soft width the figure would be
    hidden first."""
    name = "n" * 60
    rows = [[name, "1234567890", "s" * 20]]
    columns = [Column("Name", "<", min_width=16, soft_width=34), Column("Figure", priority=2),
               Column("Shape", "<", priority=1, min_width=8)]
    fitted = fit(columns, rows, 70)
    assert fitted.kept == [0, 1, 2] and fitted.hidden == []
    assert [len(cell) for cell in fitted.rows[0]] == [34, 10, 20]
    assert fit([Column("Name", "<", min_width=16), *columns[1:]], rows, 70).hidden == [1]
