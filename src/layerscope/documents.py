"""The strict reader of a saved ``layerscope/1`` profile (``layerscope.load`` reads every
document kind by its schema: :mod:`layerscope.loading`).

Every field is type-checked (:mod:`layerscope.schema`) and the tree's invariants are
checked (:mod:`layerscope.check`) before anything is built, so a damaged or hostile file
is refused with the place it went wrong.
"""

from __future__ import annotations

from typing import Any

from layerscope.check import summarize, tree_problems
from layerscope.compile_info import CompileInfo
from layerscope.errors import SchemaError
from layerscope.runfacts import RunFacts
from layerscope.schema import document_problems
from layerscope.sidedocs import DeviceLedger, MemorySummary, Trace
from layerscope.tree import SCHEMA, ModuleNode, OpStats, PhaseStats, Profile, link


def profile_from_dict(doc: Any, source: str = "document") -> Profile:
    """Rebuild a :class:`Profile` from a ``layerscope/1`` dict, checking the type of every
    field it reads and the tree's invariants."""
    if not isinstance(doc, dict) or "schema" not in doc:
        raise SchemaError(f"{source} is not a layerscope profile (no 'schema' field)")
    schema = doc["schema"]
    if schema != SCHEMA:
        raise SchemaError(
            f"{source} has schema {schema!r}; this layerscope reads {SCHEMA!r} only"
        )
    problems = document_problems(doc)
    if problems:
        raise SchemaError(f"{source} is a damaged layerscope profile: {summarize(problems)}")
    try:
        nodes = [_node_from_dict(entry) for entry in doc["modules"]]
        root = link(nodes)
        parts: list[ModuleNode] = []
        by_path: dict[str, ModuleNode] = {}
        for entry in doc.get("parts") or []:
            node = _node_from_dict(entry)
            if node.parent is None:
                parts.append(node)
            else:
                by_path[node.parent].children.append(node)
            by_path[node.path] = node
        meta = dict(doc.get("meta") or {})
        compiled = meta.pop("compile", None)
        profile = Profile(
            root=root,
            meta=RunFacts.from_dict(meta),
            param_bytes=doc["totals"]["param_bytes"],
            parts=parts,
            memory=None if doc.get("memory") is None else MemorySummary.from_dict(doc["memory"]),
            trace=None if doc.get("trace") is None else Trace.from_dict(doc["trace"]),
            compiled=None if compiled is None else CompileInfo.from_dict(compiled),
            device=None if doc.get("device") is None else DeviceLedger.from_dict(doc["device"]),
        )
        problems = tree_problems(profile)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SchemaError(f"{source} is a damaged layerscope profile: {type(exc).__name__}: {exc}") from None
    if problems:
        raise SchemaError(f"{source} is inconsistent: {summarize(problems)}")
    return profile


def _node_from_dict(entry: dict[str, Any]) -> ModuleNode:
    def phase(name: str) -> Any:
        data = entry.get(name)
        return None if data is None else PhaseStats.from_dict(data)

    return ModuleNode(
        path=entry["path"],
        type=entry["type"],
        parent=entry["parent"],
        depth=entry["depth"],
        calls=entry["calls"],
        params=entry["params"],
        params_total=entry["params_total"],
        profiled=entry.get("profiled", True),
        forward=PhaseStats.from_dict(entry["forward"]),
        backward=phase("backward"),
        recompute=phase("recompute"),
        kind=str(entry.get("kind") or "module"),
        ops=[OpStats.from_dict(op) for op in entry.get("ops", [])],
        unsupported_ops=dict(entry.get("unsupported_ops") or {}),
        extra_repr=str(entry.get("extra_repr") or ""),
        input_shapes=entry.get("input_shapes"),
        output_shapes=entry.get("output_shapes"),
    )
