"""CSV: one row per node, or with ``ops=True`` one row per op, for spreadsheets and pandas.

Node rows come in ``Profile.nodes()`` order (the model depth first, then the step's
parts), with the node's identity and parameters, then every ``PhaseStats`` field of each
phase the profile has, prefixed by the phase (``forward_self_cpu_time_ns``,
``backward_flops``). Op rows come in the same node order, each node's ops in their
stored order. Numbers are raw integers in the unit their column names; an empty cell
means "not measured" (None), never zero. Input shapes are compact JSON (a tensor's shape
is a list of ints; a non-tensor argument is null); a Python stack is its frames joined
with `` <- ``, innermost first.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import fields
from typing import Any

from layerscope.base.formats import Option, register_renderer
from layerscope.model.tree import PHASES, ModuleNode, OpStats, PhaseStats, Profile

NODE_COLUMNS = ("path", "name", "type", "kind", "depth", "parent", "profiled", "calls", "params", "params_total")
PHASE_FIELDS = tuple(f.name for f in fields(PhaseStats))
OP_COLUMNS = (
    "path", "type", "phase", "op", "calls", "cpu_time_ns", "self_cpu_time_ns", "device_time_ns",
    "self_device_time_ns", "flops", "macs", "bytes", "alloc_bytes", "freed_bytes", "input_shapes", "stack",
)


def _cell(value: Any) -> Any:
    # csv writes None as "" already; booleans read back as true/false in any tool.
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _node_row(node: ModuleNode, phases: list[str]) -> list[Any]:
    row = [getattr(node, column) for column in NODE_COLUMNS]
    for phase in phases:
        stats = getattr(node, phase)
        row.extend(None if stats is None else getattr(stats, name) for name in PHASE_FIELDS)
    return row


def _op_row(node: ModuleNode, op: OpStats) -> list[Any]:
    shapes = json.dumps(op.input_shapes, separators=(",", ":"), ensure_ascii=False, default=str)
    stack = None if op.stack is None else " <- ".join(op.stack)
    values = {"path": node.path, "type": node.type, "op": op.name, "input_shapes": shapes, "stack": stack}
    return [values[column] if column in values else getattr(op, column) for column in OP_COLUMNS]


OPS = Option("ops", "one row per aten op instead of per module", parse=None)


@register_renderer("csv", extensions=(".csv",), description="one row per module (or per op, with ops=True)", options=(OPS,))
def render_csv(profile: Profile, *, ops: bool = False) -> str:
    """A CSV table: one row per node, or one per op with ``ops=True``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if ops:
        writer.writerow(OP_COLUMNS)
        for node in profile.nodes():
            writer.writerows([_cell(v) for v in _op_row(node, op)] for op in node.ops)
        return out.getvalue()
    phases = [phase for phase in PHASES if any(getattr(node, phase) is not None for node in profile.nodes())]
    writer.writerow([*NODE_COLUMNS, *(f"{phase}_{name}" for phase in phases for name in PHASE_FIELDS)])
    for node in profile.nodes():
        writer.writerow([_cell(v) for v in _node_row(node, phases)])
    return out.getvalue()
