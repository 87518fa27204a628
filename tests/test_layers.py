"""The architecture as a test: imports flow one way, from the layer that runs things down
to the one data model and the files below it.

    app        session, block, cli, compat, handlers, integrations, bench.measure, the package
    capture    capture/*, flops/*, zoo, specs, traces/*
    render     render/*, plot               attribute   attribute/*       convert   convert/*
    model      tree, sidedocs, compile_info, ops, check, schema, transforms, diff, ranks, documents, bench.result
    base       errors, fmt, io, formats (the output registry), comm, raw, runfacts, schedule, stats, intervals,
               peaks, traces.reader

A module imports its own layer or lower ones; render, attribute and convert never each other, and
capture never render; no modules import each other round a circle, in any layer (the app
layer's included: ``layerscope.Profiler`` is the block with torch.profiler's names added
in ``compat``, and the block imports nothing of ``compat``). The four lower layers are pure: none imports torch, so a tree can
be attributed, checked and rendered from events or files alone. Every import counts, the
ones inside functions too (``if TYPE_CHECKING`` blocks aside): a document's
``render()``/``save()`` reach the renderers through the registry in ``base``, which the
renderers fill, never by importing them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import layerscope

SRC = Path(layerscope.__file__).parent

LAYERS = {
    "base": (
        "errors", "fmt", "io", "formats", "comm", "raw", "runfacts", "schedule", "stats", "intervals", "traces.reader", "peaks",
    ),
    "model": (
        "tree", "sidedocs", "compile_info", "ops", "check", "schema", "transforms", "diff", "ranks", "documents",
        "bench.result",
    ),
    "convert": ("convert",),
    "attribute": ("attribute",),
    "render": ("render", "plot"),
    "capture": ("capture", "flops", "zoo", "specs", "traces"),
    "app": ("session", "block", "cli", "__main__", "compat", "handlers", "integrations", "bench", "examples", ""),
}
RANK = {"base": 0, "model": 1, "convert": 2, "attribute": 2, "render": 2, "capture": 3, "app": 4}
#: Lower-ranked pairs that still must not import each other (importer, imported).
APART = {("capture", "render")}
#: The layers that run without torch.
PURE = ("base", "model", "convert", "attribute", "render")

#: ``Profile.ops()`` builds the op table, a view of the same tree that needs the tree's
#: phases: the one cycle, inside the model.
ALLOWED_CYCLES = [{"layerscope.tree", "layerscope.ops"}]


def _modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(("layerscope", *parts))
        found[name.removesuffix(".__init__")] = path
    return found


def _layer(module: str) -> str:
    """The layer of ``module``: the longest prefix named in LAYERS."""
    rest = module.removeprefix("layerscope").removeprefix(".")
    best, found = -1, ""
    for layer, prefixes in LAYERS.items():
        for prefix in prefixes:
            if (rest == prefix or rest.startswith(prefix + ".") or prefix == "") and len(prefix) > best:
                best, found = len(prefix), layer
    return found


def _imports(path: Path, modules: dict[str, Path] | None) -> set[str]:
    """The modules ``path`` imports: those in ``modules`` (layerscope's own), or with
    ``modules=None`` every top-level or dotted name it imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(inner) for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body for inner in ast.walk(statement)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found.update(name for name in names if (modules is None or name in modules) and name != "layerscope")
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_every_module_has_a_layer():
    assert [m for m in _modules() if not _layer(m)] == []


def test_imports_go_down_or_across_their_own_layer():
    wrong = []
    for module, imported in _graph().items():
        here = _layer(module)
        for target in sorted(imported):
            there = _layer(target)
            if RANK[there] > RANK[here] or (RANK[there] == RANK[here] and there != here) or (here, there) in APART:
                wrong.append(f"{module} ({here}) imports {target} ({there})")
    assert wrong == []


def _imports_torch(path: Path) -> list[str]:
    """The torch modules ``path`` imports, anywhere in it (``TYPE_CHECKING`` blocks aside)."""
    return sorted(name for name in _imports(path, None) if name == "torch" or name.startswith("torch."))


def test_the_pure_layers_never_import_torch():
    wrong = [
        f"{module} ({_layer(module)}) imports {', '.join(_imports_torch(path))}"
        for module, path in _modules().items()
        if _layer(module) in PURE and _imports_torch(path)
    ]
    assert wrong == []


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that import each other round a circle, those allowed aside."""
    cycles = [c for c in _strongly_connected(graph) if len(c) > 1 and not _only_a_package(c)]
    return [c for c in cycles if c not in ALLOWED_CYCLES]


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def _only_a_package(component: set[str]) -> bool:
    """A registry package and the files that fill it (``flops`` and its formulas)."""
    roots = {m for m in component if all(other == m or other.startswith(m + ".") for other in component)}
    return bool(roots)


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                found.append(component)
    return found


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The checker itself: a model module importing a renderer is reported."""
    modules = {"layerscope.tree": tmp_path / "tree.py", "layerscope.render.text": tmp_path / "text.py"}
    (tmp_path / "tree.py").write_text("def f():\n    from layerscope.render.text import render_text\n")
    assert _imports(modules["layerscope.tree"], modules) == {"layerscope.render.text"}
    assert RANK[_layer("layerscope.render.text")] > RANK[_layer("layerscope.tree")]
    assert sorted(map(sorted, _strongly_connected({"a": {"b"}, "b": {"a"}, "c": set()}))) == [["a", "b"], ["c"]]
    # A circle in the app layer counts too (the block and torch.profiler's adapter were one).
    block, adapter = "layerscope.block", "layerscope.compat.torch_profiler"
    assert _cycles({block: {adapter}, adapter: {block}}) == [{block, adapter}]


def test_the_purity_check_sees_torch_and_capture_from_attribute(tmp_path):
    """The checker itself: an attribute module reaching for torch, or for capture/, fails."""
    walk = tmp_path / "walk.py"
    walk.write_text("def f():\n    import torch.nn\n    from layerscope.capture.kineto import convert\n")
    assert _imports_torch(walk) == ["torch.nn"]
    modules = {"layerscope.attribute.walk": walk, "layerscope.capture.kineto": tmp_path / "kineto.py"}
    assert _imports(walk, modules) == {"layerscope.capture.kineto"}
    assert _layer("layerscope.attribute.walk") in PURE
    assert RANK[_layer("layerscope.capture.kineto")] > RANK[_layer("layerscope.attribute.walk")]
    assert ("capture", "render") in APART and _layer("layerscope.render.text") == "render"
