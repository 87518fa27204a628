"""torchprof's table: the module tree with its time, memory and call columns.

Columns ``Module | Self CPU total | CPU total | Self CUDA total | CUDA total | Self CPU Mem
| CPU Mem | Self CUDA Mem | CUDA Mem | Number of Calls``, left-aligned, ``" | "`` between
them; the CUDA columns only with ``use_cuda``, the memory ones only with
``profile_memory``. Rows are the model's modules in ``named_modules()`` order, named by
the root's class and then each module's own name, drawn with torchprof's characters
(``├── ``, ``└── ``, and ``│`` or a space for each enclosing level). As in torchprof,
only the measured modules carry figures (the leaves, or the ``paths`` chosen); a module
that only holds others has a blank row. With ``show_events`` each measured module's
aten ops (its submodules' included) hang under it, one row per op name, and the
module's own row is blank.

The figures are layerscope's: "Self" excludes submodules, "total" is the wall time
(torchprof summed nested op events, counting time twice); times print as torch 1.x did
(``1.808ms``), memory as torchprof showed it (``756.50 Kb``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from layerscope.base import fmt
from layerscope.base.formats import Option, register_renderer
from layerscope.model.tree import ModuleNode, OpStats, Profile
from layerscope.render.table import Column, draw

HEADINGS = (
    "Module",
    "Self CPU total",
    "CPU total",
    "Self CUDA total",
    "CUDA total",
    "Self CPU Mem",
    "CPU Mem",
    "Self CUDA Mem",
    "CUDA Mem",
    "Number of Calls",
)


@dataclass(frozen=True)
class Measure:
    """One row's figures in ns and bytes (None: not measured)."""

    self_cpu_ns: int
    cpu_ns: int
    self_device_ns: int | None
    device_ns: int | None
    self_alloc_bytes: int | None
    alloc_bytes: int | None
    calls: int


_NOTHING = Measure(0, 0, None, None, None, None, 0)


def _node_measure(node: ModuleNode) -> Measure:
    fwd = node.forward
    return Measure(
        fwd.self_cpu_time_ns, fwd.cpu_time_ns, fwd.self_device_time_ns, fwd.device_time_ns,
        fwd.self_alloc_bytes, fwd.alloc_bytes, node.calls,
    )


def _plus(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def _op_measures(node: ModuleNode) -> list[tuple[str, Measure]]:
    """The forward ops of the node and its submodules (torchprof's events of a call
    included theirs), one per name, in the order they first ran."""
    grouped: dict[str, Measure] = {}
    for inner in node.walk():
        for op in inner.ops:
            if op.phase == "forward":
                grouped[op.name] = _add(grouped.get(op.name, _NOTHING), op)
    return list(grouped.items())


def _add(measure: Measure, op: OpStats) -> Measure:
    return Measure(
        measure.self_cpu_ns + (op.self_cpu_time_ns or 0),
        measure.cpu_ns + (op.cpu_time_ns or 0),
        _plus(measure.self_device_ns, op.self_device_time_ns),
        _plus(measure.device_ns, op.device_time_ns),
        _plus(measure.self_alloc_bytes, op.self_alloc_bytes),
        _plus(measure.alloc_bytes, op.alloc_bytes),
        measure.calls + op.calls,
    )


def _cells(measure: Measure | None, on_device: bool) -> list[str]:
    if measure is None:
        return [""] * (len(HEADINGS) - 1)

    def time(ns: int | None) -> str:
        return "" if ns is None else fmt.profiler_time(ns / 1000)

    def memory(nbytes: int | None, device: bool) -> str:
        # Memory is counted on the model's device only: the other side's is not measured
        # (CUDA memory of a CPU run is blank, never "0 b").
        if nbytes is None or device != on_device:
            return ""
        return fmt.profiler_memory(nbytes, legacy=True)

    return [
        time(measure.self_cpu_ns),
        time(measure.cpu_ns),
        time(measure.self_device_ns),
        time(measure.device_ns),
        memory(measure.self_alloc_bytes, False),
        memory(measure.alloc_bytes, False),
        memory(measure.self_alloc_bytes, True),
        memory(measure.alloc_bytes, True),
        str(measure.calls),
    ]


def _modules(node: ModuleNode) -> list[ModuleNode]:
    """The module children of ``node``, a label seen through: torchprof knows modules
    only, and the modules a label encloses (DDP's forward range) are the node's."""
    found: list[ModuleNode] = []
    for child in node.children:
        if child.kind == "module":
            found.append(child)
        elif child.kind == "label":
            found.extend(_modules(child))
    return found


def _rows(profile: Profile, measured: Collection[str] | None, show_events: bool, on_device: bool) -> list[list[str]]:
    rows: list[list[str]] = []

    def visit(name: str, measure: Measure | None, children: list[Any], prefix: str, last: bool, root: bool) -> None:
        branch = "" if root else ("└── " if last else "├── ")
        rows.append([prefix + branch + name, *_cells(measure, on_device)])
        inner = "" if root else prefix + (" " if last else "│")
        for n, (child_name, child_measure, grandchildren) in enumerate(children):
            visit(child_name, child_measure, grandchildren, inner, n == len(children) - 1, False)

    def entry(node: ModuleNode) -> tuple[str, Measure | None, list[Any]]:
        children = _modules(node)
        is_measured = (not children) if measured is None else node.path in measured
        name = node.type if node.parent is None else node.name
        if is_measured and node.profiled and show_events:
            ops: list[tuple[str, Measure | None, list[Any]]] = [(op_name, m, []) for op_name, m in _op_measures(node)]
            return name, None, ops + [entry(child) for child in children]
        measure = _node_measure(node) if is_measured and node.profiled else None
        return name, measure, [entry(child) for child in children]

    visit(*entry(profile.root), "", True, True)
    return rows


SHOW_EVENTS = Option("show_events", "list each module's aten ops under it", parse=None)
#: torchprof's other keywords, for the Python API.
_API = tuple(
    Option(name, f"as display()'s {name}", flag=False) for name in ("use_cuda", "profile_memory", "paths")
)


@register_renderer(
    "torchprof", description="torchprof's module tree table: self and total time, memory, calls",
    options=(SHOW_EVENTS, *_API),
)
def render_torchprof(
    profile: Profile,
    *,
    show_events: bool = False,
    use_cuda: bool | None = None,
    profile_memory: bool | None = None,
    paths: Collection[str] | None = None,
) -> str:
    """torchprof's ``display()``: ``paths`` (``named_modules()`` paths) are the modules
    with figures, by default the leaves; ``use_cuda`` and ``profile_memory`` add their
    columns (by default when the profile has device time, memory)."""
    root = profile.root
    if use_cuda is None:
        use_cuda = root.forward.device_time_ns is not None
    if profile_memory is None:
        profile_memory = root.forward.alloc_bytes is not None
    on_device = str(profile.meta.device or "cpu").startswith("cuda")
    rows = _rows(profile, None if paths is None else set(paths), show_events, on_device)
    keep = [0, 1, 2, 9]
    if profile_memory:
        keep += [5, 6]
    if use_cuda:
        keep += [3, 4] + ([7, 8] if profile_memory else [])
    keep.sort()
    columns = [Column(HEADINGS[i], "<") for i in keep]
    return "\n".join(draw(columns, [[row[i] for i in keep] for row in rows])) + "\n"
