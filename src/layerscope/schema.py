"""The types of a ``layerscope/1`` document, checked before a tree is built from it.

``check_tree`` says whether the numbers of a tree agree; this says whether each field
holds the kind of value it must (a whole number, a string, a list of spans), so that a
damaged or hostile file is refused at the door with the place it went wrong, never
deep in a renderer as a ``TypeError``. Fields not named here (most of ``meta``) are
kept as they are and read by no one. Unknown keys are allowed: later versions may add
fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from layerscope.tree import PHASES

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

_PHASE = {name: Opt(INT) for name in (
    "device_time_ns", "self_device_time_ns", "flops", "self_flops", "macs", "self_macs", "bytes", "self_bytes",
    "alloc_bytes", "self_alloc_bytes", "freed_bytes", "self_freed_bytes", "peak_bytes", "activation_bytes",
    "self_activation_bytes", "grad_bytes", "self_grad_bytes", "comm_time_ns", "self_comm_time_ns", "comm_bytes",
    "self_comm_bytes",
)}
PHASE_STATS = Obj({**_PHASE, "cpu_time_ns": INT, "self_cpu_time_ns": INT}, frozenset({"cpu_time_ns", "self_cpu_time_ns"}))

OP_STATS = Obj(
    {
        "name": STR, "phase": OneOf(PHASES), "calls": INT, "cpu_time_ns": Opt(INT), "self_cpu_time_ns": Opt(INT),
        "device_time_ns": Opt(INT), "self_device_time_ns": Opt(INT), "input_shapes": ListOf(SHAPE),
        "flops": Opt(INT), "macs": Opt(INT), "bytes": Opt(INT), "alloc_bytes": Opt(INT),
        "self_alloc_bytes": Opt(INT), "freed_bytes": Opt(INT), "stack": Opt(ListOf(STR)),
    },
    frozenset({"name"}),
)

NODE = Obj(
    {
        "path": STR, "type": STR, "parent": Opt(STR), "depth": INT, "calls": INT, "params": Opt(INT),
        "params_total": Opt(INT), "profiled": BOOL, "forward": PHASE_STATS, "backward": Opt(PHASE_STATS),
        "recompute": Opt(PHASE_STATS), "kind": Opt(STR), "ops": ListOf(OP_STATS), "unsupported_ops": Opt(DictOf(INT)),
        "extra_repr": Opt(STR), "input_shapes": Opt(SHAPE), "output_shapes": Opt(SHAPE),
    },
    frozenset({"path", "type", "parent", "depth", "calls", "params", "params_total", "forward"}),
)

#: A compiled model's run (``meta["compile"]``: ``Profile.compiled``).
COMPILE = Obj(
    {
        "backend": STR, "rule": STR, "compile_time_ns": INT, "frames": INT, "graphs": INT,
        "graph_breaks": ListOf(Obj({"where": STR, "reason": STR}, frozenset({"where", "reason"}))),
        "step_time_ns": INT, "kernel_time_ns": INT,
        "kernels": ListOf(Obj(
            {"graph": STR, "call": STR, "time_ns": INT, "modules": DictOf(NUMBER)},
            frozenset({"graph", "call", "time_ns", "modules"}),
        )),
    },
    frozenset({
        "backend", "rule", "compile_time_ns", "frames", "graphs", "graph_breaks", "step_time_ns", "kernel_time_ns",
        "kernels",
    }),
)

#: Every field of ``meta`` (``layerscope.runfacts.RunFacts``, and ``compile``); keys a
#: newer version wrote are kept as they are.
META = Obj(
    {
        "model": STR, "layerscope_version": Opt(STR), "torch_version": Opt(STR), "python_version": Opt(STR),
        "device": STR, "dtype": Opt(STR), "training": Opt(BOOL), "torch_api_missing": Opt(DictOf(STR)),
        "mode": STR, "warmup": Opt(INT), "repeat": Opt(INT), "no_grad": Opt(BOOL), "backward": Opt(BOOL),
        "paths": Opt(ListOf(STR)), "inputs": Opt(Row((ListOf(SHAPE), DictOf(SHAPE)))),
        "input_dtypes": Opt(Row((ListOf(DTYPES), DictOf(DTYPES)))), "autocast": Opt(STR),
        "peak_flops_per_s": Opt(NUMBER), "peak_from": Opt(STR), "ops_from": Opt(STR), "times_from": Opt(STR), "timed": Opt(BOOL),
        "step_range": Opt(Row((INT, INT))), "complete": Opt(BOOL), "schedule": Opt(STR), "detail_step": Opt(INT),
        "rank": Opt(INT), "world_size": Opt(INT), "local_rank": Opt(INT), "host": Opt(STR), "run_id": Opt(STR),
        "backend": Opt(STR), "steps": Opt(INT), "step_numbers": Opt(ListOf(INT)), "step_times_ns": Opt(ListOf(INT)),
        "pass_cpu_time_ns": Opt(ListOf(INT)), "shown_pass": Opt(INT), "unattributed_ops": Opt(INT), "step_time_ns": Opt(INT),
        "spec": Opt(STR),
        "source": Opt(Obj(
            {
                "kind": STR, "file": STR, "device_names": ListOf(STR), "schema_version": Opt(INT), "record_shapes": BOOL,
                "profile_memory": BOOL, "with_stack": BOOL,
            },
            frozenset({"kind", "file", "device_names", "record_shapes", "profile_memory", "with_stack"}),
        )),
        "modules_from": Opt(Obj(
            {
                "method": STR, "instances": INT, "matched": INT, "unmatched": ListOf(STR), "renamed": DictOf(STR),
                "shapes": STR, "uncalled": ListOf(STR),
            },
            frozenset({"method", "instances", "matched"}),
        )),
        "flops_unknown": Opt(STR),
        "device_events": Opt(Obj(
            {name: INT for name in (
                "events", "time_ns", "outside_steps", "outside_steps_time_ns", "orphans", "orphans_time_ns",
            )},
            frozenset({"events", "time_ns", "outside_steps", "outside_steps_time_ns", "orphans", "orphans_time_ns"}),
        )),
        "from_merged_run": Opt(Obj({"rank": INT, "not_kept": STR}, frozenset({"rank", "not_kept"}))),
        "compile": Opt(COMPILE),
    }
)

MEMORY = Obj(
    {
        "peak_bytes": INT, "baseline_bytes": INT, "peak_categories": Opt(DictOf(INT)),
        "peak_by_phase": Opt(DictOf(INT)), "param_bytes_by_dtype": Opt(DictOf(INT)),
        "buffer_bytes_by_dtype": Opt(DictOf(INT)),
        "optimizer_state_bytes": Opt(DictOf(Obj({"total": INT, "by_key": DictOf(INT)}, frozenset({"total"})))),
        "peak_at": Opt(Obj({"path": STR, "phase": Opt(STR), "t_ns": Opt(INT)}, frozenset({"path", "phase"}))),
        "timeline": Opt(Obj({
            "t_ns": ListOf(INT), "bytes": ListOf(INT), "points_recorded": INT,
            "spans": ListOf(Row((INT, INT, STR, Opt(STR)))), "categories": Opt(DictOf(ListOf(INT))),
        })),
        "device": Opt(Obj(
            {"allocated_peak_bytes": INT, "reserved_at_peak_bytes": INT},
            frozenset({"allocated_peak_bytes", "reserved_at_peak_bytes"}),
        )),
    },
    frozenset({"peak_bytes"}),
)

TRACE = Obj(
    {"spans": ListOf(Row((INT, INT, STR, OneOf(PHASES), INT))), "flows": ListOf(Row((INT, INT))), "step_ns": Opt(INT)},
    frozenset({"spans"}),
)

#: Where the steps' device time went (``Profile.device``: ``sidedocs.DeviceLedger``).
DEVICE = Obj(
    {
        "busy_ns": INT, "attributed_ns": INT, "unattributed_ns_by_reason": DictOf(INT), "compute_ns": INT,
        "comm_ns": INT, "overlap_ns": INT,
    },
    frozenset({"busy_ns", "attributed_ns", "unattributed_ns_by_reason"}),
)

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
