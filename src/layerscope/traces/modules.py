"""The module tree of a trace: its ``nn.Module: ClassName_k`` instances, nested as the
Python tracer saw them called, and (given the model) mapped to their real paths.

A trace names module *instances* (the k-th ``ClassName`` the tracer saw), not places in
a tree: one instance may be called several times, and from several parents (a rotary
embedding shared by every layer). An instance's parent is the instance whose call its
first call ran in, found through the Python tracer's ``Python parent id`` chain. Without
the model, a module's path is its ancestors' instance names joined by dots
(``BertModel_0.BertEncoder_0.BertLayer_3``) and its parameters are unknown.

Given the model, each instance is matched to a module of ``named_modules()``: the root to
the model (or, under a wrapper such as DDP, the first instance of the model's class);
then, under each matched instance, its child instances of a class in the order they were
first called to that module's unmatched submodules of the class, direct children first
in registration order, then deeper ones in ``named_modules()`` order, preferring one whose
parameters' shapes are among the shapes its ops were given; an instance left
(a module called from outside its owner) takes the first unmatched module of its class
anywhere. What was matched, and how, is said in the profile's ``meta.modules_from``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from layerscope.raw import ModuleInfo
from layerscope.traces.events import MODULE_EVENT, ModuleCall


@dataclass
class Instance:
    """A module instance of the trace."""

    name: str
    type: str
    first_ns: int
    parent: str | None = None
    children: list[str] = field(default_factory=list)
    #: Shapes of the tensors its own ops (outside its child modules) were given: its
    #: parameters' among them, which tell two submodules of one class apart.
    shapes: set[tuple[int, ...]] = field(default_factory=set)


def instances(calls: list[ModuleCall], python_parent: dict[int, int | None]) -> dict[str, Instance]:
    """The trace's module instances, each with its parent instance and its children in
    the order they were first called; in the order each was first called."""
    found: dict[str, Instance] = {}
    module_of: dict[int, str] = {}
    for call in sorted(calls, key=lambda c: c.range.start_time_ns):
        if call.python_id is not None:
            module_of[call.python_id] = call.instance
    for call in sorted(calls, key=lambda c: c.range.start_time_ns):
        name = call.instance
        if name in found:
            continue
        kind = name.rsplit("_", 1)[0] if "_" in name else name
        instance = found[name] = Instance(name, kind, call.range.start_time_ns, shapes=_own_shapes(call.range))
        # The nearest module up the Python call chain (bounded: a damaged chain may loop).
        up = call.python_parent
        for _ in range(10_000):
            if up is None:
                break
            owner = module_of.get(up)
            if owner is not None and owner != name:
                instance.parent = owner
                break
            up = python_parent.get(up)
    # Parents first seen after their child (a recompute's chain) or missing: top level.
    for instance in found.values():
        parent = instance.parent
        if parent is not None and parent in found and not _cycles(found, instance.name):
            found[parent].children.append(instance.name)
        else:
            instance.parent = None
    return found


def _own_shapes(rng: Any) -> set[tuple[int, ...]]:
    """The shapes of the tensor inputs of the ops in a module call, outside its children."""
    found: set[tuple[int, ...]] = set()
    pending = list(rng.children)
    while pending:
        item = pending.pop()
        if item.name.startswith(MODULE_EVENT):
            continue
        for value in item.extra_fields.inputs or ():
            sizes = getattr(value, "sizes", None)
            if sizes is not None:
                found.add(tuple(sizes))
        pending.extend(item.children)
    return found


def _cycles(found: dict[str, Instance], name: str) -> bool:
    seen = {name}
    up = found[name].parent
    while up is not None and up in found:
        if up in seen:
            return True
        seen.add(up)
        up = found[up].parent
    return False


def table_without_model(found: dict[str, Instance]) -> tuple[list[ModuleInfo], dict[str, int]]:
    """A module table of the instances (paths of instance names; parameters unknown) and
    each instance's index. Several top-level instances hang from a root of type
    ``Trace`` that ran nothing itself."""
    tops = [i for i in found.values() if i.parent is None]
    infos: list[ModuleInfo] = []
    index: dict[str, int] = {}

    def add(name: str, path: str, parent: str | None, depth: int) -> None:
        instance = found[name]
        index[name] = len(infos)
        infos.append(ModuleInfo(path=path, type=instance.type, parent=parent, depth=depth, params=None))
        for child in instance.children:
            add(child, f"{path}.{child}" if path else child, path, depth + 1)

    if len(tops) == 1:
        add(tops[0].name, "", None, 0)
    else:
        infos.append(ModuleInfo(path="", type="Trace", parent=None, depth=0, params=None))
        for top in tops:
            add(top.name, top.name, "", 1)
    return infos, index


def map_to_model(
    found: dict[str, Instance], infos: list[ModuleInfo], param_shapes: list[set[tuple[int, ...]]] | None = None
) -> tuple[dict[str, int], dict[str, Any]]:
    """Each instance's index in the model's table (``infos``, ``named_modules()`` order),
    and how the match was made (the instances left unmatched are not frames: their work
    stays with the frame they ran in). ``param_shapes`` (each module's own parameters'
    shapes) prefers, among modules of one class, one whose parameters' shapes the
    instance's ops were given (BERT's position and token-type embeddings, called in the
    other order than registered)."""
    shapes_of = param_shapes or [set() for _ in infos]

    def fits(instance: Instance, at: int) -> bool:
        return not instance.shapes or shapes_of[at] <= instance.shapes

    def pick(instance: Instance, candidates: list[int]) -> int | None:
        same = [i for i in candidates if infos[i].type == instance.type and i not in taken]
        return next((i for i in same if fits(instance, i)), same[0] if same else None)

    by_path = {info.path: i for i, info in enumerate(infos)}
    children: dict[str, list[int]] = {}
    for i, info in enumerate(infos):
        if info.parent is not None:
            children.setdefault(info.parent, []).append(i)
    taken: set[int] = set()
    index: dict[str, int] = {}

    def descendants(path: str) -> list[int]:
        prefix = f"{path}." if path else ""
        direct = children.get(path, [])
        deeper = [i for i, info in enumerate(infos) if info.path.startswith(prefix) and info.path and i not in direct]
        return direct + deeper

    def match(name: str, at: int) -> None:
        index[name] = at
        taken.add(at)
        path = infos[at].path
        pending = [c for c in found[name].children if c not in index]
        if not pending:
            return
        candidates = [i for i in descendants(path) if i not in taken]
        for child in pending:
            at = pick(found[child], candidates)
            if at is not None:
                match(child, at)

    root_type = infos[0].type
    order = sorted(found.values(), key=lambda i: i.first_ns)
    root = next((i for i in order if i.parent is None and i.type == root_type), None)
    if root is None:
        root = next((i for i in order if i.type == root_type), None)
    if root is not None:
        match(root.name, by_path[""])
    # Instances called from outside their owner: the first free module of their class.
    for instance in order:
        if instance.name in index:
            continue
        at = pick(instance, list(range(len(infos))))
        if at is not None:
            match(instance.name, at)
    unmatched = sorted(name for name in found if name not in index)
    how = {
        "method": "instances matched to the model's modules by class, parameter shapes and first-call order under each parent",
        "instances": len(found),
        "matched": len(index),
        "unmatched": unmatched,
    }
    return index, how
