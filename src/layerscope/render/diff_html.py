"""A :class:`~layerscope.model.diff.ProfileDiff` as one self-contained HTML page (the ``html``
format of the registry's ``diff`` table): the model's summary (base, new, change, %),
then the modules and the changed ops, largest change in the diff's metric first and
sortable by any column, the regressions highlighted (each with its phase and metric). The page machinery (shared CSS and helpers,
escaped JSON, the policy with the script's hash) is ``html.py``'s; the data holds raw
numbers only, derived from the diff here:

``summary``      ``[metric, base, new]`` for each model-level metric either side has
``rows``/``ops`` each node and each changed op, its values as ``[base, new]`` pairs in
                 the order of ``node_metrics``/``op_metrics``
``regressions``  ``ProfileDiff.regressions(threshold)`` at the diff's own noise floor
                 (``--min-time``): ``threshold`` is ``fail_above`` when given, else 10%
                 (``regressions()``'s default), so the page marks what a 10% gate would
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from layerscope.base.formats import register_renderer
from layerscope.model.diff import METRICS, NODE_METRICS, OP_METRICS, DiffRow, ProfileDiff
from layerscope.render.diff_text import FAIL_ABOVE, IMBALANCE
from layerscope.render.html import html_page

if TYPE_CHECKING:
    from layerscope.model.ranks import ImbalanceChange

SCHEMA = "layerscope-diff-html/1"

#: What the page marks as a regression without ``fail_above``: ``regressions()``'s default.
DEFAULT_THRESHOLD = 0.1


def _values(row: DiffRow, metrics: Sequence[str]) -> list[list[int | None]]:
    return [[row.metrics[name].base, row.metrics[name].new] for name in metrics]


def diff_data(
    diff: ProfileDiff, *, fail_above: float | None = None, imbalance: Sequence[ImbalanceChange] | None = None
) -> dict[str, Any]:
    """The document the page embeds."""
    threshold = DEFAULT_THRESHOLD if fail_above is None else fail_above
    doc = diff.to_dict()
    return {
        "schema": SCHEMA,
        "base": doc["base"],
        "new": doc["new"],
        "warnings": list(diff.warnings),
        "phases": list(diff.phases),
        "total_kind": diff.total_kind,
        "timed": diff.timed,
        "min_time_ns": diff.min_time_ns,
        "metric": diff.metric,
        "metric_label": METRICS[diff.metric].label,
        "metric_fields": {"node": METRICS[diff.metric].node_field, "op": METRICS[diff.metric].op_field},
        "noise": doc["noise"],
        "threshold": threshold,
        "gated": fail_above is not None,
        "summary": [[name, change.base, change.new] for name, change in diff.summary.items()],
        "node_metrics": list(NODE_METRICS),
        "rows": [
            {"path": row.path, "kind": row.kind, "status": row.status, "type_base": row.type_base,
             "type_new": row.type_new, "noise": row.noise, "values": _values(row, NODE_METRICS)}
            for row in diff.rows
        ],
        "op_metrics": list(OP_METRICS),
        "ops": [
            {"path": row.path, "op": row.op, "phase": row.phase, "input_shapes": row.input_shapes,
             "new_input_shapes": row.new_input_shapes,
             "shapes_base": [shape.to_dict() for shape in row.shapes_base],
             "shapes_new": [shape.to_dict() for shape in row.shapes_new],
             "status": row.status, "noise": row.noise, "values": _values(row, OP_METRICS)}
            for row in diff.changed_ops()
        ],
        "ops_total": len(diff.op_rows),
        "regressions": [r.to_dict() for r in diff.regressions(threshold)],
        "imbalance": None if imbalance is None else [row.to_dict() for row in imbalance],
    }


@register_renderer(
    "html", document="diff", extensions=(".html", ".htm"),
    description="the diff as one self-contained HTML page: summary, modules and ops by change, regressions",
    options=(FAIL_ABOVE, IMBALANCE),
)
def render_diff_html(
    diff: ProfileDiff, *, fail_above: float | None = None, imbalance: Sequence[ImbalanceChange] | None = None
) -> str:
    data = diff_data(diff, fail_above=fail_above, imbalance=imbalance)
    return html_page("diff.js", f"diff {data['base']['model']} → {data['new']['model']}", data)
