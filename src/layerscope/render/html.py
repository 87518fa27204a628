"""An interactive report: one self-contained HTML file (data and code inline, no network).

The page is ``assets/report.html``'s skeleton with ``assets/report.css`` and
``assets/page.js`` + ``assets/report.js`` inlined (:func:`html_page`, which the pages
of the other documents share: ``diff_html.py``, ``ranks_html.py``, ``bench_html.py``),
and the profile as one JSON document in a ``<script type="application/json">`` element, which the script reads with ``JSON.parse``.
The JSON holds raw numbers only (the page formats them, with one set of functions that
follow ``layerscope.base.fmt``); it is derived from the tree here and nothing is measured again:

``meta``           the profile's meta, as saved
``phase_fields``   the names of the numbers in each node's phase arrays (``PhaseStats``)
``nodes``          every node in ``Profile.nodes()`` order (the model, then the step's
                   parts), with its parent's index, and its phases as arrays
``ops``            the operator table grouped a few ways (``OP_GROUPINGS``), each with its
                   columns, its rows as arrays and its total
``memory``         ``Profile.memory`` (the step's peak, its culprit and the timeline)
``device``         ``Profile.device``, where the steps' device time went (busy = attributed
                   + unattributed, by reason), with the reasons' words

Safety: names come from the user's code. The JSON is escaped so that ``</script>`` or
``<!--`` in a name cannot end the element (``<``, ``>`` and ``&`` are written as
``\\u003c`` ...), and the script builds the page with ``textContent`` and
``setAttribute`` only, never ``innerHTML``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import fields
from html import escape as escape_html
from importlib import resources
from typing import Any

from layerscope.base import fmt
from layerscope.base.formats import register_renderer
from layerscope.model.ops import OpTableError, op_table
from layerscope.model.runfacts import meta_to_dict
from layerscope.model.sidedocs import UNATTRIBUTED_REASONS
from layerscope.model.tree import PHASES, PhaseStats, Profile
from layerscope.render.text import _inputs_text as inputs_text

#: The version of the embedded document; the page refuses another.
SCHEMA = "layerscope-html/1"

#: The op-table groupings the page can switch between (precomputed: the page does not
#: regroup). ``stack`` is left out: only profiles taken with ``with_stack`` have it.
OP_GROUPINGS: tuple[str, ...] = ("name", "module", "shape", "module_type")

PHASE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(PhaseStats))

# What a JSON string needs so that no HTML parser sees markup in it: inside a <script>
# element only "</script" and "<!--" matter, but escaping every <, > and & is simpler to
# check, and JSON.parse reads the escapes back as the same characters.
_SCRIPT_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026"}


def script_json(document: Any) -> str:
    """``document`` as JSON that is safe as the text of a ``<script>`` element."""
    return json.dumps(document, ensure_ascii=False, allow_nan=False, separators=(",", ":")).translate(_SCRIPT_ESCAPES)


def report_data(profile: Profile) -> dict[str, Any]:
    """The document the page embeds: raw numbers, derived from the tree only."""
    nodes = list(profile.nodes())
    index = {node.path: i for i, node in enumerate(nodes)}
    phases = [phase for phase in PHASES if getattr(profile.root, phase) is not None]
    return {
        "schema": SCHEMA,
        "meta": meta_to_dict(profile.meta, profile.figures),
        # A compiled model's block: its nodes are medians over the steps, those that
        # compiled and those with other calls than the FLOPs' count left out.
        "compiled_steps_left_out": (
            None if profile.compiled is None or profile.figures.steps is None
            else profile.compiled.left_out(profile.figures.step_numbers or [])[0]
        ),
        "other_input_steps_left_out": (
            None if profile.compiled is None or profile.figures.steps is None
            else profile.compiled.left_out(profile.figures.step_numbers or [])[1]
        ),
        # The inputs as the text header names them (shapes with dtypes, keywords by name).
        "inputs_text": _inputs(profile),
        "param_bytes": profile.param_bytes,
        "phase_fields": list(PHASE_FIELDS),
        "nodes": [
            {
                "path": node.path,
                "name": fmt.node_name(node.name),
                "type": node.type,
                "kind": node.kind,
                "parent": -1 if node.parent is None else index[node.parent],
                "calls": node.calls,
                "params": node.params,
                "params_total": node.params_total,
                "profiled": node.profiled,
                "phases": {
                    phase: [getattr(stats, name) for name in PHASE_FIELDS] for phase, stats in node.phases()
                },
                "unsupported_calls": sum(node.unsupported_ops.values()),
                "flops_partial": node.flops_partial,
            }
            for node in nodes
        ],
        "phases": phases,
        "unsupported_ops": profile.unsupported_ops(),
        "ops": _op_tables(profile, by_phase=len(phases) > 1),
        "memory": None if profile.memory is None else profile.memory.to_dict(),
        # The text footer's "Device busy" line, from the same ledger.
        "device": None if profile.device is None else profile.device.to_dict(),
        "unattributed_reasons": dict(UNATTRIBUTED_REASONS),
        "step_spread": _step_spread(profile),
        # How much the repeated passes (or steps) spread; None: one pass, noise unknown.
        "pass_spread": profile.pass_spread(),
        "passes": len(profile.figures.pass_cpu_time_ns or []),
    }


def _step_spread(profile: Profile) -> dict[str, Any] | None:
    """The steps' wall times: min, median, p90, max and the steps far from the median."""
    spread = profile.step_spread()
    if spread is None:
        return None
    return {
        "steps": len(spread.steps), "min_ns": spread.min_ns, "median_ns": spread.median_ns,
        "p90_ns": spread.p90_ns, "max_ns": spread.max_ns, "far": spread.far,
        "outliers": [list(item) for item in spread.outliers[:10]], "more": max(0, len(spread.outliers) - 10),
    }


def _inputs(profile: Profile) -> str | None:
    """``[8, 16] float32, ...``: the text header's words, without its "input(s) " lead."""
    text = inputs_text(profile.meta.inputs, profile.meta.input_dtypes)
    return None if text is None else text.split(" ", 1)[1]


def _op_tables(profile: Profile, *, by_phase: bool) -> dict[str, Any]:
    """The op table per grouping. By module, ops are told apart by phase too when the
    run had more than one (a forward ``addmm`` and its backward ``mm`` are other work),
    and the columns that add nothing to a module's row are left out (``modules``, one
    per row; ``module_type``, the tree's and the module-type grouping's), so that a
    transformer's fits a 1400 px window."""
    tables: dict[str, Any] = {}
    for grouping in OP_GROUPINGS:
        keys = ("module", "phase") if grouping == "module" and by_phase else grouping
        try:
            table = op_table(profile, group_by=keys)
        except OpTableError:  # nothing to sort by: a profile without ops
            continue
        columns = [c for c in table.columns if not (grouping == "module" and c in ("modules", "module_type"))]
        tables[grouping] = {
            "sort_by": table.sort_by,
            "columns": columns,
            "rows": [[getattr(row, name) for name in columns] for row in table.rows],
            "total": [getattr(table.total, name) for name in columns],
        }
    return tables


def _asset(name: str) -> str:
    return resources.files("layerscope.render").joinpath("assets", name).read_text(encoding="utf-8")


def _fill(page: str, values: list[tuple[str, str]]) -> str:
    """``page`` with each marker replaced, in the order given: the text already filled in
    (which may come from the profile) is never searched for a marker again."""
    out = []
    for marker, value in values:
        before, page = page.split(marker, 1)
        out += [before, value]
    return "".join([*out, page])


def html_page(script: str, title: str, data: Any) -> str:
    """A self-contained page: ``assets/report.html``'s skeleton with the shared
    ``report.css``, ``data`` as escaped JSON, and the shared ``page.js`` (formats, DOM
    helpers, sortable tables, the tooltip) followed by the asset ``script`` as the one
    inline script, the only code the page's policy lets run."""
    code = _asset("page.js") + _asset(script)
    # The policy lets only this script run (by its hash) and loads nothing from anywhere:
    # a name that did reach the page as markup could neither run code nor fetch.
    digest = base64.b64encode(hashlib.sha256(code.encode("utf-8")).digest()).decode("ascii")
    policy = f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{digest}'"
    return _fill(_asset("report.html"), [
        ("/*@CSP@*/", policy),
        ("@TITLE@", escape_html(f"{title} · layerscope")),
        ("/*@CSS@*/", _asset("report.css")),
        ("@DATA@", script_json(data)),
        ("/*@JS@*/", code),
    ])


@register_renderer(
    "html", extensions=(".html", ".htm"),
    description="an interactive report in one self-contained HTML file (tree, icicle, ops, memory)",
)
def render_html(profile: Profile) -> str:
    return html_page("report.js", str(profile.meta.model or profile.root.type), report_data(profile))
