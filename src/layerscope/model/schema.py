"""The types of a ``layerscope/1`` document, checked before a tree is built from it.

``check_tree`` says whether the numbers of a tree agree; this says whether each field
holds the kind of value it must (a whole number, a string, a list of spans), so that a
damaged or hostile file is refused at the door with the place it went wrong, never
deep in a renderer as a ``TypeError``. Unknown keys are allowed: later versions may add
fields.

The document's shape is declared once, by the types that hold it: :func:`spec_of` reads
a dataclass's (or a NamedTuple's) type hints (``int``, ``float``, ``str``, ``bool``,
``X | None``, ``list``, ``tuple``, ``dict[str, X]``, nested records) and gives the check
of its object in a file. What a type cannot say is declared in :data:`DECLARED`, one entry
per class: a string's choices, the nested data of shapes, a list's fixed length, the
keys a reader needs though Python has a default for them, the nulls a reader takes for
the default, a document key that is not the field's name, and the fields not saved.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from layerscope.model.compile_info import CompileInfo, KernelTime
from layerscope.model.runfacts import RunFacts, RunFigures
from layerscope.model.sidedocs import DeviceLedger, Flow, MemorySummary, OptimizerState, Span, Trace
from layerscope.model.tree import PHASES, ModuleNode, OpStats, PhaseStats

#: Shapes nest (a tuple of lists of tensors) but never this deep; deeper ones would make
#: the recursive shape formatting overflow the stack.
MAX_SHAPE_DEPTH = 32


@dataclass(frozen=True)
class Opt:
    """``spec`` or null."""

    spec: Any


@dataclass(frozen=True)
class ListOf:
    spec: Any


@dataclass(frozen=True)
class DictOf:
    """An object with string keys and values of ``spec``."""

    spec: Any


@dataclass(frozen=True)
class Row:
    """A list of fixed length, one spec per item (a trace span)."""

    specs: tuple[Any, ...]


@dataclass(frozen=True)
class Obj:
    """An object whose keys in ``fields`` have those specs; ``required`` must be there."""

    fields: dict[str, Any]
    required: frozenset[str] = frozenset()


@dataclass(frozen=True)
class OneOf:
    """A string from ``choices``."""

    choices: tuple[str, ...]


INT, STR, BOOL, NUMBER = "a 64-bit whole number", "a string", "true or false", "a number"
#: Nested data, as shapes nest: whole numbers (a shape) or strings (dtype names) at the
#: leaves, null for what is not a tensor.
SHAPE, DTYPES = "a shape", "dtype names"


# -- the shape derived from the types --------------------------------------------------


@dataclass(frozen=True)
class Declared:
    """What a class's types cannot say of its object in a document: ``fields``, the
    spec of a field declared by hand (a string's choices, nested shapes, a fixed
    length); ``required``, keys a reader needs beyond the fields Python has no default
    for; ``nullable``, fields whose null a reader takes for their default; ``keys``,
    a field's key in the document where it is not the field's name; ``not_saved``,
    fields that are not in the document (private ones never are)."""

    fields: dict[str, Any] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    nullable: frozenset[str] = frozenset()
    keys: dict[str, str] = field(default_factory=dict)
    not_saved: frozenset[str] = frozenset()

    def names(self) -> set[str]:
        return {*self.fields, *self.required, *self.nullable, *self.keys, *self.not_saved}


_SCALARS: dict[Any, str] = {int: INT, float: NUMBER, str: STR, bool: BOOL}


def spec_of(hint: Any, declared: dict[type, Declared] | None = None) -> Any:
    """The check of a value of type ``hint`` in a document: a scalar's, ``X | None``'s,
    a list's or tuple's, a ``dict[str, X]``'s, or a record's object (a dataclass's) or
    row (a NamedTuple's), with ``declared``'s entry for it (:data:`DECLARED` by
    default). A type it cannot read (``Any``) is a TypeError: declare that field."""
    table = DECLARED if declared is None else declared
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SCALARS:
        return _SCALARS[hint]
    if origin in (types.UnionType, typing.Union) and type(None) in args:
        rest = [arg for arg in args if arg is not type(None)]
        if len(rest) == 1:
            return Opt(spec_of(rest[0], table))
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return ListOf(spec_of(args[0], table))
    if origin is tuple:
        return Row(tuple(spec_of(arg, table) for arg in args))
    if origin is dict and args and args[0] is str:
        return DictOf(spec_of(args[1], table))
    if isinstance(hint, type) and (dataclasses.is_dataclass(hint) or _is_named_tuple(hint)):
        return _record_spec(hint, table)
    raise TypeError(f"no document check for the type {hint!r}: declare it (schema.DECLARED)")


def _is_named_tuple(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def _record_spec(cls: type, table: dict[type, Declared]) -> Any:
    hints = typing.get_type_hints(cls)
    said = table.get(cls, Declared())
    unknown = said.names() - hints.keys()
    if unknown:
        raise TypeError(f"schema.DECLARED names fields {cls.__name__} does not have: {', '.join(sorted(unknown))}")
    if _is_named_tuple(cls):  # a row: one item per field, in order
        return Row(tuple(said.fields[name] if name in said.fields else spec_of(hints[name], table) for name in cls._fields))
    specs: dict[str, Any] = {}
    required = set()
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or f.name in said.not_saved:
            continue
        try:
            spec = said.fields[f.name] if f.name in said.fields else spec_of(hints[f.name], table)
        except TypeError as exc:
            raise TypeError(f"{cls.__name__}.{f.name}: {exc}") from None
        if f.name in said.nullable and not isinstance(spec, Opt):
            spec = Opt(spec)
        key = said.keys.get(f.name, f.name)
        specs[key] = spec
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if no_default or f.name in said.required:
            required.add(key)
    return Obj(specs, frozenset(required))


#: A trace's span as a document row has it: a phase is one of the tree's.
_SPAN = Declared(fields={"phase": OneOf(PHASES)})

#: What the types cannot say, one entry per class (see :class:`Declared`).
DECLARED: dict[type, Declared] = {
    # A file always has a phase's CPU times; the rest is None where not measured.
    PhaseStats: Declared(required=frozenset({"cpu_time_ns", "self_cpu_time_ns"})),
    # None: the shapes were not recorded (a trace read without them, --no-shapes).
    OpStats: Declared(fields={"phase": OneOf(PHASES), "input_shapes": Opt(ListOf(SHAPE))}),
    ModuleNode: Declared(
        fields={"input_shapes": Opt(SHAPE), "output_shapes": Opt(SHAPE)},
        required=frozenset({"parent", "depth", "calls", "params", "params_total", "forward"}),
        nullable=frozenset({"kind", "unsupported_ops", "extra_repr"}),
        not_saved=frozenset({"children"}),  # the document links nodes by parent path
    ),
    RunFacts: Declared(
        fields={
            "inputs": Opt(Row((ListOf(SHAPE), DictOf(SHAPE)))),
            "input_dtypes": Opt(Row((ListOf(DTYPES), DictOf(DTYPES)))),
            "step_range": Opt(Row((INT, INT))),  # [first, last]
        },
        not_saved=frozenset({"extra"}),  # keys a newer version wrote: kept as they are
    ),
    CompileInfo: Declared(required=frozenset({"graph_breaks", "step_time_ns", "kernel_time_ns", "kernels"})),
    KernelTime: Declared(fields={"phase": OneOf(PHASES)}),
    MemorySummary: Declared(nullable=frozenset({"peak_categories", "peak_by_phase", "optimizer_state_bytes"})),
    OptimizerState: Declared(keys={"total_bytes": "total", "bytes_by_key": "by_key"}),
    # A trace keeps its spans and flows as columns; a document, as rows of Span and Flow.
    Trace: Declared(
        fields={"spans": ListOf(spec_of(Span, {Span: _SPAN})), "flows": ListOf(spec_of(Flow, {}))},
        required=frozenset({"spans"}),
    ),
    Span: _SPAN,
    DeviceLedger: Declared(required=frozenset({"unattributed_ns_by_reason"})),
}

PHASE_STATS = spec_of(PhaseStats)
OP_STATS = spec_of(OpStats)
NODE = spec_of(ModuleNode)
#: A compiled model's run (``meta["compile"]``: ``Profile.compiled``).
COMPILE = spec_of(CompileInfo)
#: The ``meta`` object: the run's facts, the profile's figures among them, and a
#: compiled model's run; keys a newer version wrote are kept as they are.
META = Obj({**spec_of(RunFacts).fields, **spec_of(RunFigures).fields, "compile": Opt(COMPILE)})
MEMORY = spec_of(MemorySummary)
TRACE = spec_of(Trace)
#: Where the steps' device time went (``Profile.device``: ``sidedocs.DeviceLedger``).
DEVICE = spec_of(DeviceLedger)

#: The document (``Profile.to_dict``): its parts, as the profile lays them out.
DOCUMENT = Obj(
    {
        "schema": STR, "meta": META, "totals": Obj({"param_bytes": Opt(INT)}, frozenset({"param_bytes"})),
        "modules": ListOf(NODE), "parts": Opt(ListOf(NODE)), "memory": Opt(MEMORY), "trace": Opt(TRACE),
        "device": Opt(DEVICE),
    },
    frozenset({"schema", "totals", "modules"}),
)


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(value: Any) -> bool:
    """A whole number that fits in 64 bits, as every count, size and time does; a larger
    one would overflow the float arithmetic of the renderers."""
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def _nested_problem(value: Any, leaf: Any) -> str | None:
    """Why ``value`` is not nested data with ``leaf`` values (and nulls, in lists or
    objects), or None. Walked with an explicit stack: the document may nest deeply."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_SHAPE_DEPTH:
            return f"nested deeper than {MAX_SHAPE_DEPTH}"
        if isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif item is not None and not leaf(item):
            return f"holds {_describe(item)}"
    return None


def _check(value: Any, spec: Any, where: str, problems: list[str]) -> None:
    if isinstance(spec, Opt):
        if value is not None:
            _check(value, spec.spec, where, problems)
        return
    expected: str | None = None
    if spec == INT:
        expected = None if _is_int(value) else INT
    elif spec == STR:
        expected = None if isinstance(value, str) else STR
    elif spec == BOOL:
        expected = None if isinstance(value, bool) else BOOL
    elif spec == NUMBER:
        expected = None if isinstance(value, (int, float)) and not isinstance(value, bool) else NUMBER
    elif spec in (SHAPE, DTYPES):
        why = _nested_problem(value, _is_int if spec == SHAPE else lambda item: isinstance(item, str))
        if why is not None:
            problems.append(f"{where}: not {spec} ({why})")
        return
    elif isinstance(spec, OneOf):
        expected = None if value in spec.choices else f"one of {', '.join(map(repr, spec.choices))}"
    elif isinstance(spec, ListOf):
        if not isinstance(value, list):
            expected = "a list"
        else:
            for index, item in enumerate(value):
                _check(item, spec.spec, f"{where}[{index}]", problems)
    elif isinstance(spec, Row):
        if not isinstance(value, list) or len(value) != len(spec.specs):
            expected = f"a list of {len(spec.specs)} items"
        else:
            for index, (item, item_spec) in enumerate(zip(value, spec.specs)):
                _check(item, item_spec, f"{where}[{index}]", problems)
    elif isinstance(spec, DictOf):
        if not isinstance(value, dict):
            expected = "an object"
        else:
            for key, item in value.items():
                _check(item, spec.spec, f"{where}.{key}", problems)
    elif isinstance(spec, Obj):
        if not isinstance(value, dict):
            expected = "an object"
        else:
            for key in sorted(spec.required - value.keys()):
                problems.append(f"{where}: no {key!r}")
            for key, field_spec in spec.fields.items():
                if key in value:
                    _check(value[key], field_spec, f"{where}.{key}" if where else key, problems)
    if expected is not None:
        problems.append(f"{where}: expected {expected}, got {_describe(value)}")


def check_value(value: Any, spec: Any, where: str = "") -> list[str]:
    """Each field of ``value`` that does not fit ``spec`` (built from the classes above),
    as ``place: what``: for documents other than a profile (a merged run of ranks)."""
    problems: list[str] = []
    _check(value, spec, where, problems)
    return problems


def document_problems(doc: Any) -> list[str]:
    """Each field of ``doc`` that holds the wrong kind of value, as ``place: what``."""
    problems: list[str] = []
    _check(doc, DOCUMENT, "", problems)
    return problems
