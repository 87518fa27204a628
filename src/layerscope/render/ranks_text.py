"""A merged run of many ranks (``layerscope.model.ranks.MergedRun``) as text and JSON.

The text report: which ranks were merged (and which are missing), the rank table (each
node and phase, its time on every rank, then median, max and imbalance; with many ranks,
the most imbalanced nodes only), the stragglers, and the waiting in collectives per rank.
Pure and deterministic: the same merged run gives the same bytes.
"""

from __future__ import annotations

import json

from layerscope.base import fmt
from layerscope.base.formats import register_renderer
from layerscope.model.diff import display_path
from layerscope.model.ranks import MergedRun, Spread
from layerscope.render.options import DEPTH, INDENT, LIMIT, WIDTH
from layerscope.render.table import Column, draw, draw_fitted, from_headers, wrap_lines

#: Up to this many ranks, the rank table has a column per rank.
MAX_RANK_COLUMNS = 8
#: With more ranks, the rank table lists this many of the most imbalanced nodes.
TOP_IMBALANCED = 20


def _imbalance(row: Spread) -> str:
    return "" if row.imbalance is None else f"x{row.imbalance:.2f}"


def _header(run: MergedRun) -> list[str]:
    first = ["Ranks", str(run.model or "model")]
    if run.run_id is not None:
        first.append(f"run {run.run_id}")
    if run.world_size is not None:
        first.append(f"world size {run.world_size}")
    if run.step_range is not None:
        first.append(f"steps {run.step_range[0]}-{run.step_range[1]}")
    first.append("device time" if run.time_metric == "device" else "CPU time")
    ranks = run.rank_numbers
    second = f"Merged {len(ranks)} rank{'s' if len(ranks) != 1 else ''}: {_ranges(ranks)}."
    missing = run.missing_ranks
    if missing:
        second += f" Missing {len(missing)} of {run.world_size}: {_ranges(missing)} (no file given)."
    median = run.median_rank
    step = run.step_time_ns(run.record(median))
    second += f" Median rank by step time: {median} ({fmt.time_ns(step)}); 'show --rank {median}' draws its tree."
    return ["  ·  ".join(first), second]


def _ranges(ranks: list[int]) -> str:
    """``0-3, 5, 7-8``."""
    out: list[str] = []
    start = previous = None
    for rank in [*ranks, None]:
        if rank is not None and previous is not None and rank == previous + 1:
            previous = rank
            continue
        if start is not None:
            out.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = rank
    return ", ".join(out) or "none"


def _module() -> Column:
    """The column of module paths: long ones lose their start to fit a width."""
    return Column("Module", "<", min_width=16, cut_start=True)


def _rank_table(run: MergedRun, depth: int | None, width: int | None) -> list[str]:
    shapes = {shape.path: shape for shape in run.nodes}
    rows = [
        row for row in run.spreads()
        if row.metric == "time_ns" and (depth is None or shapes[row.path].depth <= depth)
        and (row.max or row.phase == "forward")  # a phase no rank spent time in (a part's backward)
    ]
    ranks = run.rank_numbers
    if len(ranks) <= MAX_RANK_COLUMNS:
        title = "Time per rank (each node's total in the phase), median, slowest rank and max / median:"
        # A width hides the ranks' own columns together, before the summary of them.
        layout = [
            # Indented by depth: a long path loses its end, not its indent.
            Column("Module", "<", min_width=16), Column("Phase", "<", 3), *(Column(f"rank {r}", priority=4) for r in ranks),
            Column("Median", priority=2), Column("Max", priority=1), Column("Slowest", priority=1),
            Column("Imbalance", priority=0),
        ]
        cells: list[list[str]] = []
        for row in rows:
            by_rank = {rank: value for value, rank in run.values_by_rank(row.path, row.phase, "time_ns")}
            cells.append([
                _indented(shapes[row.path].depth, row.path), row.phase,
                *(fmt.time_ns(by_rank.get(r)) for r in ranks),
                fmt.time_ns(row.median), fmt.time_ns(row.max), f"rank {row.argmax_rank}", _imbalance(row),
            ])
        return ["", *wrap_lines([title], width), *draw_fitted(layout, cells, width)]
    floor = run.min_time_ns
    ranked = sorted(
        (row for row in rows if row.max >= floor and row.imbalance is not None),
        key=lambda row: (-(row.imbalance or 0.0), -row.max, row.path, row.phase),
    )
    shown = ranked[:TOP_IMBALANCED]
    title = (
        f"The {len(shown)} most imbalanced of {len(ranked)} node phases (max / median over the ranks; "
        f"those with a max of {fmt.time_ns(floor)} or more):"
    )
    cells = []
    for row in shown:
        cells.append([
            display_path(row.path), row.phase, fmt.time_ns(row.min), fmt.time_ns(row.median), fmt.time_ns(row.max),
            f"rank {row.argmax_rank}", _imbalance(row),
        ])
    layout = [
        _module(), Column("Phase", "<", 3), Column("Min", priority=4), Column("Median", priority=2),
        Column("Max", priority=1), Column("Slowest", priority=1), Column("Imbalance", priority=0),
    ]
    return ["", *wrap_lines([title], width), *draw_fitted(layout, cells, width)]


def _indented(depth: int, path: str) -> str:
    return "  " * depth + display_path(path)


def _stragglers(run: MergedRun, limit: int | None, width: int | None) -> list[str]:
    found = run.stragglers()
    test = f"self time over the other ranks' median by more than {100 * run.threshold:g}% and {fmt.time_ns(run.min_time_ns)}"
    if len(run.ranks) < 2:
        return ["", "Stragglers: one rank only, nothing to compare."]
    if not found:
        return ["", f"No stragglers ({test})."]
    shown = found[:limit] if limit else found
    cells: list[list[str]] = []
    for row in shown:
        relative = "" if row.relative is None else f"+{100 * row.relative:.1f}%"
        cells.append([
            display_path(row.path), row.phase, str(row.rank), fmt.time_ns(row.self_time_ns),
            fmt.time_ns(row.others_median_ns), "+" + fmt.time_ns(row.excess_ns), relative,
        ])
    layout = [
        _module(), Column("Phase", "<", 3), Column("Rank", priority=0), Column("Self time", priority=1),
        Column("Others' median", priority=2), Column("Excess", priority=0), Column("Excess %", priority=1),
    ]
    title = f"Stragglers ({test}), largest excess first:"
    out = ["", *wrap_lines([title], width), *draw_fitted(layout, cells, width)]
    if len(shown) < len(found):
        out.append(f"{len(found) - len(shown)} more straggler rows not shown (limit {limit})")
    return out


def _waiting(run: MergedRun, width: int | None) -> list[str]:
    cells: list[list[str]] = []
    for row in run.waiting():
        cells.append([
            str(row.rank), fmt.time_ns(row.step_time_ns), fmt.time_ns(row.wait_ns),
            fmt.percent(row.wait_ns, row.step_time_ns),
        ])
    title = (
        "Waiting in collectives per rank (the <communication> part); the fast ranks wait for "
        "the slow one, so a straggler shows as its peers' waiting:"
    )
    return ["", *wrap_lines([title], width), *draw(from_headers(["Rank", "Step", "Waiting", "% of step"]), cells)]


@register_renderer(
    "text", document="ranks", extensions=(".txt",), description="the merged ranks as a text report",
    options=(DEPTH, LIMIT, WIDTH),
)
def render_ranks_text(run: MergedRun, *, depth: int | None = None, limit: int | None = 20, width: int | None = None) -> str:
    """The header, the rank table (down to ``depth``), up to ``limit`` stragglers (None:
    all), and the waiting per rank; given ``width``, each table fits it (a line under it
    names the columns hidden) and the text is wrapped."""
    out = wrap_lines(_header(run), width)
    out += _rank_table(run, depth, width)
    out += _stragglers(run, limit, width)
    out += _waiting(run, width)
    return "\n".join(out) + "\n"


@register_renderer(
    "json", document="ranks", extensions=(".json",), description="the layerscope-ranks/1 JSON document",
    options=(INDENT,),
)
def render_ranks_json(run: MergedRun, *, indent: int | None = None) -> str:
    return json.dumps(run.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False) + "\n"
