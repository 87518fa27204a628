"""The options several formats share, declared once (one name, one meaning), and the
parsers of their command-line text. A format's own options live in its file."""

from __future__ import annotations

from layerscope.base.formats import Option


def count(text: str) -> int:
    """A whole number >= 0 (``--depth 0`` is the root alone)."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise ValueError(f"expected a number >= 0, got {value}")
    return value


DEPTH = Option("depth", "show modules down to this depth (the root is 0)", parse=count, metavar="N")
LIMIT = Option("limit", "at most N rows per table (0: all; totals still cover every row)", parse=count, metavar="N")
INDENT = Option("indent", "indent the JSON by N spaces (default: one line)", parse=count, metavar="N")
METRIC = Option(
    "metric", "what stacks are weighed by (default: time, or flops for an untimed count)", choices=("time", "flops")
)
TITLE = Option("title", "the picture's title", metavar="TEXT")
WIDTH = Option(
    "width", "fit the output to N characters: the least important columns are hidden first (a "
    "note under the table names them), long names and shapes cut with an ellipsis, notes wrapped "
    "(default: the terminal's width on a terminal, else no limit)", parse=count, metavar="N",
)
