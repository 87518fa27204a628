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
parameters' shapes are among the shapes its ops were given. An instance of a class the
model has none of (a class renamed between versions of its library: transformers'
``BertSdpaSelfAttention`` is ``BertSelfAttention`` in later ones) takes, under its
parent, a free module of a class the trace has none of, whose parameters' shapes its ops
were given. An instance left (a module called from outside its owner) takes the first
unmatched module of its class anywhere. What was matched, and how, is said in the
profile's ``meta.modules_from``.

:func:`misfits` then checks the match against the trace's recorded shapes: a module
whose parameters' shapes are none of the shapes its instance's ops were given is not the
module that ran (a model of another size).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from layerscope.convert.ranges import MODULE_PREFIX
from layerscope.model.raw import ModuleInfo
from layerscope.model.runfacts import ModulesFrom
from layerscope.traces.ranges import MODULE_EVENT, ModuleCall, caller_module, module_of_frames


@dataclass(frozen=True)
class ModelTable:
    """The model a trace is read with, as the matching reads it (the caller reads it from
    the model, ``capture.modules.traced_model``; the model is never run or changed)."""

    #: The model's class.
    name: str
    #: Its modules, as a profile's tree has them.
    infos: list[ModuleInfo]
    #: Each module's own parameters, ``(name, shape)``.
    params: list[list[tuple[str, tuple[int, ...]]]]
    #: Each module's own parameters counted once (tied ones at their first module):
    #: ``(shape, elements, dtype)``.
    tensors: list[list[tuple[tuple[int, ...], int, Any]]]



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
    #: Its first call's outermost own ops and the shapes of their tensor inputs, in
    #: order (the first few): the evidence an error about its parameters shows.
    ops: list[tuple[str, tuple[tuple[int, ...], ...]]] = field(default_factory=list)
    #: The dtype of the first tensor of each shape its own ops were given, in call order
    #: (a parameter's first use is the parameter itself: under autocast, the cast's input).
    dtypes: dict[tuple[int, ...], Any] = field(default_factory=dict)


def instances(calls: list[ModuleCall], python_parent: dict[int, int | None]) -> dict[str, Instance]:
    """The trace's module instances, each with its parent instance and its children in
    the order they were first called; in the order each was first called."""
    found: dict[str, Instance] = {}
    module_of = module_of_frames(calls)
    for call in sorted(calls, key=lambda c: c.range.start_time_ns):
        name = call.instance
        if name in found:
            continue
        kind = name.rsplit("_", 1)[0] if "_" in name else name
        dtypes: dict[tuple[int, ...], Any] = {}
        shapes, ops = _own_inputs(call.range, dtypes)
        instance = found[name] = Instance(name, kind, call.range.start_time_ns, shapes=shapes, ops=ops, dtypes=dtypes)
        instance.parent = caller_module(call.python_parent, name, module_of, python_parent.get)
    # Parents first seen after their child (a recompute's chain) or missing: top level.
    for instance in found.values():
        parent = instance.parent
        if parent is not None and parent in found and not _cycles(found, instance.name):
            found[parent].children.append(instance.name)
        else:
            instance.parent = None
    return found


#: How many of an instance's outermost ops are kept as evidence.
_EVIDENCE_OPS = 4


def _own_inputs(
    rng: Any, dtypes: dict[tuple[int, ...], Any]
) -> tuple[set[tuple[int, ...]], list[tuple[str, tuple[tuple[int, ...], ...]]]]:
    """The shapes of the tensor inputs of the ops in a module call, outside its
    children, and its first outermost ops (not those nested in another op) with theirs;
    into ``dtypes``, the dtype each shape was first given in."""
    found: set[tuple[int, ...]] = set()
    ops: list[tuple[str, tuple[tuple[int, ...], ...]]] = []
    pending = [(item, False) for item in reversed(rng.children)]
    while pending:
        item, in_op = pending.pop()
        if item.name.startswith(MODULE_EVENT) or item.name.startswith(MODULE_PREFIX):
            continue
        tensors = [value for value in item.extra_fields.inputs or () if getattr(value, "sizes", None) is not None]
        sizes = tuple(tuple(value.sizes) for value in tensors)
        for value in tensors:
            dtypes.setdefault(tuple(value.sizes), value.dtype)
        found.update(sizes)
        if sizes and not in_op and len(ops) < _EVIDENCE_OPS:
            ops.append((item.name, sizes))
        pending.extend((child, in_op or bool(sizes)) for child in reversed(item.children))
    return found, ops


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
) -> tuple[dict[str, int], ModulesFrom]:
    """Each instance's index in the model's table (``infos``, ``named_modules()`` order),
    and how the match was made (the instances left unmatched are not frames: their work
    stays with the frame they ran in). ``param_shapes`` (each module's own parameters'
    shapes) prefers, among modules of one class, one whose parameters' shapes the
    instance's ops were given (BERT's position and token-type embeddings, called in the
    other order than registered); for a module with no parameters of its own, its
    submodules' parameters among the shapes given to its instance's and its callees' ops
    (OWLv2's box and objectness heads, one class of three Linears, called in the other
    order than registered)."""
    shapes_of = param_shapes or [set() for _ in infos]
    model_types = {info.type for info in infos}
    trace_types = {instance.type for instance in found.values()}
    renamed: dict[str, str] = {}

    model_kids: dict[int, list[int]] = {}
    at_path = {info.path: i for i, info in enumerate(infos)}
    for i, info in enumerate(infos):
        if info.parent is not None and info.parent in at_path:
            model_kids.setdefault(at_path[info.parent], []).append(i)
    model_below: dict[int, set[tuple[int, ...]]] = {}
    trace_below: dict[str, set[tuple[int, ...]]] = {}

    def below_model(at: int) -> set[tuple[int, ...]]:
        """The parameter shapes of module ``at`` and its submodules."""
        if at not in model_below:
            model_below[at] = set(shapes_of[at]).union(*(below_model(k) for k in model_kids.get(at, [])))
        return model_below[at]

    def below_trace(name: str, depth: int = 0) -> set[tuple[int, ...]]:
        """The shapes the ops of instance ``name`` and of those it called were given."""
        if name not in trace_below:
            kids = found[name].children if depth < 64 else []
            trace_below[name] = set(found[name].shapes).union(*(below_trace(k, depth + 1) for k in kids if k in found))
        return trace_below[name]

    def fits(instance: Instance, at: int) -> bool:
        if shapes_of[at]:
            return not instance.shapes or shapes_of[at] <= instance.shapes
        # A module without parameters of its own (a head of Linears): by its submodules'.
        mine, theirs = below_model(at), below_trace(instance.name)
        return not mine or not theirs or mine <= theirs

    def pick(instance: Instance, candidates: list[int], *, under_parent: bool = False) -> int | None:
        same = [i for i in candidates if infos[i].type == instance.type and i not in taken]
        if not same and under_parent and instance.type not in model_types:
            # A renamed class: only a fitting module of a class the trace never names.
            other = [i for i in candidates if infos[i].type not in trace_types and i not in taken and fits(instance, i)]
            if other:
                renamed[instance.name] = infos[other[0]].type
                return other[0]
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
            at = pick(found[child], candidates, under_parent=True)
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
    how = ModulesFrom(
        method="instances matched to the model's modules by class, parameter shapes and first-call order under each parent",
        instances=len(found),
        matched=len(index),
        unmatched=tuple(unmatched),
        renamed={name: renamed[name] for name in sorted(renamed) if name in index} if renamed else None,
    )
    return index, how


@dataclass
class Misfit:
    """A matched module whose parameters' shapes are none of the shapes its instance's
    ops were given: ``params`` its parameters (name, shape), ``instance`` the trace's."""

    at: int
    params: list[tuple[str, tuple[int, ...]]]
    instance: Instance


def misfits(
    found: dict[str, Instance], index: dict[str, int], params: list[list[tuple[str, tuple[int, ...]]]]
) -> tuple[list[Misfit], int]:
    """The matched modules (``index``) whose own parameters (``params``, per module of
    the table) do not fit the trace, in table order, and how many could be checked: a
    module with parameters whose instance's ops were given tensors. One of its
    parameters' shapes among those is a fit (a bias tied to another module's, or a
    parameter this forward did not use, is not asked to appear)."""
    checked = 0
    bad: list[Misfit] = []
    for name, at in index.items():
        instance = found[name]
        own = params[at]
        if not own or not instance.shapes:
            continue
        checked += 1
        if not any(shape in instance.shapes for _, shape in own):
            bad.append(Misfit(at, own, instance))
    return sorted(bad, key=lambda misfit: misfit.at), checked


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def aligned_misfits(
    steps: list[Any], infos: list[ModuleInfo], params: list[list[tuple[str, tuple[int, ...]]]]
) -> tuple[list[Misfit], int]:
    """:func:`misfits` of the module calls an alignment put into ``steps`` (their
    ``layerscope.module#K`` ranges): each module's first call, its own ops' shapes."""
    found: dict[str, Instance] = {}
    index: dict[str, int] = {}
    pending = list(steps)
    while pending:
        rng = pending.pop(0)
        if rng.name.startswith(MODULE_PREFIX):
            at = int(rng.name[len(MODULE_PREFIX) :])
            key = f"ops aligned to {infos[at].path or '(the root)'}"
            if key not in found:
                shapes, ops = _own_inputs(rng, {})
                found[key] = Instance(key, infos[at].type, rng.start_time_ns, shapes=shapes, ops=ops)
                index[key] = at
        pending.extend(child for child in rng.children if child.children)
    return misfits(found, index, params)


def misfit_evidence(misfit: Misfit, path: str, type_name: str) -> str:
    """``path (Type) has weight [768, 768], bias [768], but the trace's Linear_3 ran
    aten::linear on [1, 141, 512], [512, 512], [512]``."""
    params = ", ".join(f"{name} {_dims(shape)}" for name, shape in misfit.params)
    ops = "; ".join(f"{op} on {', '.join(map(_dims, shapes))}" for op, shapes in misfit.instance.ops[:2])
    return f"{path or '(the root)'} ({type_name}) has {params}, but the trace's {misfit.instance.name} ran {ops}"


def uncalled(
    found: dict[str, Instance], index: dict[str, int], infos: list[ModuleInfo], param_shapes: list[set[tuple[int, ...]]]
) -> list[str]:
    """The tops of the model's subtrees that hold parameters and of which no module ran
    in the trace, in table order (the layers a deeper model has beyond those the trace
    ran). A module ran when an instance was matched to it, when its parent's instance
    ran an op on one of its parameters (``nn.MultiheadAttention`` uses its ``out_proj``'s
    weight without calling it), or when a module in it ran (a ``ModuleList`` is never
    called itself)."""
    shapes_at = {at: found[name].shapes for name, at in index.items()}
    at_of = {info.path: i for i, info in enumerate(infos)}
    ran: dict[str, bool] = {}
    holds: dict[str, bool] = {}
    for i in range(len(infos) - 1, -1, -1):  # children come after their parent in the table
        info = infos[i]
        parent_shapes = shapes_at.get(at_of[info.parent], set()) if info.parent is not None else set()
        used_by_parent = any(shape in parent_shapes for shape in param_shapes[i])
        ran[info.path] = ran.get(info.path, False) or i in shapes_at or used_by_parent
        holds[info.path] = holds.get(info.path, False) or bool(info.params)
        if info.parent is not None:
            ran[info.parent] = ran.get(info.parent, False) or ran[info.path]
            holds[info.parent] = holds.get(info.parent, False) or holds[info.path]
    return [
        info.path
        for info in infos
        if not ran[info.path] and holds[info.path] and (info.parent is None or ran[info.parent])
    ]
