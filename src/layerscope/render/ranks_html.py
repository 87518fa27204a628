"""A merged run (``layerscope.model.ranks.MergedRun``) as one self-contained HTML page (the
``html`` format of the registry's ``ranks`` table): the nodes by ranks as a heat map
(each node and phase a row, each rank a column, a cell coloured by its time over the
row's median), the stragglers, and the waiting per rank. The page machinery is
``html.py``'s; the data holds raw numbers only, taken from the run's own methods:

``heat``        per node and phase: each rank's total and self time (``values_by_rank``,
                None where the rank lacks the node) and their medians (as ``spread``'s)
``stragglers``  ``MergedRun.stragglers()`` at the run's threshold and floor
``waiting``     ``MergedRun.waiting()``
"""

from __future__ import annotations

from typing import Any

from layerscope.base.formats import register_renderer
from layerscope.base.stats import median_floor
from layerscope.model.ranks import MergedRun
from layerscope.model.tree import PHASES, ModuleNode
from layerscope.render.html import html_page

SCHEMA = "layerscope-ranks-html/1"


def _name(shape: Any) -> str:
    """A node's name as the tree draws it (``ModuleNode.name``): a label's own text, a
    step part's whole path, a module's last path component (the root's type)."""
    return ModuleNode(path=shape.path, type=shape.type, kind=shape.kind).name


def ranks_data(run: MergedRun) -> dict[str, Any]:
    """The document the page embeds."""
    ranks = run.rank_numbers
    column = {rank: i for i, rank in enumerate(ranks)}
    metric = run.time_metric
    heat = []
    for index, shape in enumerate(run.nodes):
        for phase in PHASES:
            row: dict[str, Any] = {"node": index, "phase": phase}
            for key, name in (("time", "time_ns"), ("self", "self_time_ns")):
                found = run.values_by_rank(shape.path, phase, name, metric)
                if not found:
                    break
                values: list[int | None] = [None] * len(ranks)
                for value, rank in found:
                    values[column[rank]] = value
                row[key] = values
                row[key + "_median"] = median_floor([value for value, _ in found])
            else:
                if phase == "forward" or any(row["time"]):  # not a phase no rank spent time in
                    heat.append(row)
    return {
        "schema": SCHEMA,
        "run": {
            "model": run.model, "run_id": run.run_id, "world_size": run.world_size, "step_range": run.step_range,
            "ranks": ranks, "missing_ranks": run.missing_ranks, "median_rank": run.median_rank,
            "time_metric": metric, "threshold": run.threshold, "min_time_ns": run.min_time_ns,
            "step_time_ns": [run.step_time_ns(record) for record in run.ranks],
        },
        "nodes": [
            {"path": shape.path, "name": _name(shape), "type": shape.type, "depth": shape.depth, "kind": shape.kind}
            for shape in run.nodes
        ],
        "heat": heat,
        "stragglers": [row.to_dict() for row in run.stragglers()],
        "waiting": [row.to_dict() for row in run.waiting()],
    }


@register_renderer(
    "html", document="ranks", extensions=(".html", ".htm"),
    description="the merged ranks as one self-contained HTML page: heat map, stragglers, waiting",
)
def render_ranks_html(run: MergedRun) -> str:
    return html_page("ranks.js", f"{run.model or 'model'} · {len(run.ranks)} ranks", ranks_data(run))
