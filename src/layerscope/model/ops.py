"""The operator table: every node's aten ops, regrouped and sorted across the model.

A transform of the tree, like ``torch.profiler``'s ``key_averages()``: rows aggregate
the :class:`~layerscope.model.tree.OpStats` of all nodes (or of one subtree, or one phase) by
a key chosen with ``group_by``:

``name``          the op's name (``aten::addmm``)
``shape``         name and input shapes (torch's ``group_by_input_shape``)
``module``        name and the module path that ran it (its type comes along)
``module_type``   name and the module's class
``phase``         name and phase (forward, backward, recompute, or step: the forward
                  ops of the step's parts outside the model, an optimizer's, a loss's)
``stack:N``       name and the first N frames of the Python stack that called it
                  (innermost first; needs ``with_stack=True``). ``stack`` alone, or with
                  ``stack_depth=N``, uses the whole stack (or N frames).

Keys combine: ``group_by=("module", "shape")`` or ``"module,shape"``.

Rows are sorted by one metric, descending; ties go by name, then by key, so the order
is fully determined by the data. ``Total`` and percentages cover every row that matched,
also those cut by ``limit``.

FLOPs of a group: the sum over its calls that have a formula. Calls of ops with no
formula are counted in ``unsupported_calls`` (never as zero FLOPs); a group whose calls
all lack a formula has ``flops is None``. This is the tree's own rule (``PhaseStats.flops``
adds only counted ops), so the ops of the model in one phase add up to the root's
``flops`` exactly.

No torch here: a table is a pure function of a :class:`Profile`; the text table is drawn
by ``layerscope.render.ops_table``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from layerscope.base import formats
from layerscope.base.errors import RenderError
from layerscope.model.phases import PHASES

if TYPE_CHECKING:
    from layerscope.model.tree import ModuleNode, OpStats, Profile

GroupBy = str | Sequence[str]


class OpTableError(RenderError):
    """An operator table was asked for with an unknown key, or a metric this profile lacks."""


#: The keys a table can be grouped by, in the order their columns are drawn.
GROUP_KEYS: tuple[str, ...] = ("name", "phase", "module", "module_type", "shape", "stack")

#: Sort keys and the row field each sorts by. The fields themselves are accepted too.
SORT_KEYS: dict[str, str] = {
    "self_cpu_time": "self_cpu_time_ns",
    "cpu_time": "cpu_time_ns",
    "self_device_time": "self_device_time_ns",
    "device_time": "device_time_ns",
    "calls": "calls",
    "flops": "flops",
    "macs": "macs",
    "bytes": "bytes",
    "alloc_bytes": "alloc_bytes",
    "self_alloc_bytes": "self_alloc_bytes",
    "freed_bytes": "freed_bytes",
}

#: ``torch.profiler``'s ``sort_by`` names, so a key_averages() habit keeps working.
TORCH_SORT_KEYS: dict[str, str] = {
    "self_cpu_time_total": "self_cpu_time_ns",
    "cpu_time_total": "cpu_time_ns",
    "self_cuda_time_total": "self_device_time_ns",
    "cuda_time_total": "device_time_ns",
    "self_device_time_total": "self_device_time_ns",
    "device_time_total": "device_time_ns",
    "count": "calls",
    "cpu_memory_usage": "alloc_bytes",
    "self_cpu_memory_usage": "self_alloc_bytes",
}


@dataclass
class OpRow:
    """One row: the ops sharing a key, summed. Key fields outside ``group_by`` are None.

    ``modules`` counts the distinct nodes (modules, labels, step parts) whose ops are in
    the row; ``unsupported_calls`` the calls with no FLOP formula (not in ``flops``).
    """

    name: str
    phase: str | None = None
    module: str | None = None
    module_type: str | None = None
    input_shapes: list[Any] | None = None
    stack: list[str] | None = None
    calls: int = 0
    #: None when no op of the row has a time (a compiled model's eager op rows).
    self_cpu_time_ns: int | None = None
    cpu_time_ns: int | None = None
    self_device_time_ns: int | None = None
    device_time_ns: int | None = None
    flops: int | None = None
    macs: int | None = None
    bytes: int | None = None
    unsupported_calls: int = 0
    alloc_bytes: int | None = None
    self_alloc_bytes: int | None = None
    freed_bytes: int | None = None
    modules: int = 0

    @property
    def cpu_time_avg_ns(self) -> int | None:
        return self.cpu_time_ns // self.calls if self.calls and self.cpu_time_ns is not None else None

    @property
    def device_time_avg_ns(self) -> int | None:
        if self.device_time_ns is None or not self.calls:
            return None
        return self.device_time_ns // self.calls

    @property
    def busy_time_ns(self) -> int | None:
        """The time rates divide by: device time on an accelerator, else CPU time."""
        return self.device_time_ns if self.device_time_ns is not None else self.cpu_time_ns

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: Each key field of a row, and the group_by keys that fill it (a path has one type, so
#: grouping by module fills ``module_type`` too).
_KEY_FIELDS: dict[str, tuple[str, ...]] = {
    "name": ("name",),
    "phase": ("phase",),
    "module": ("module",),
    "module_type": ("module", "module_type"),
    "input_shapes": ("shape",),
    "stack": ("stack",),
}
_TIME_FIELDS = ("self_cpu_time_ns", "cpu_time_ns")
_DEVICE_FIELDS = ("self_device_time_ns", "device_time_ns")
_FLOP_FIELDS = ("flops", "macs", "bytes", "unsupported_calls")
_MEMORY_FIELDS = ("alloc_bytes", "self_alloc_bytes", "freed_bytes")


def _plus(total: int | None, value: int | None) -> int | None:
    if value is None:
        return total
    return (total or 0) + value


@dataclass
class _Group:
    row: OpRow
    paths: set[str] = field(default_factory=set)
    #: The phases its ops ran in (op_phase's names).
    phases: set[str] = field(default_factory=set)

    def add(self, op: OpStats, node: ModuleNode, flops_counted: bool, phase: str = "forward") -> None:
        self.phases.add(phase)
        row = self.row
        row.calls += op.calls
        row.self_cpu_time_ns = _plus(row.self_cpu_time_ns, op.self_cpu_time_ns)
        row.cpu_time_ns = _plus(row.cpu_time_ns, op.cpu_time_ns)
        row.self_device_time_ns = _plus(row.self_device_time_ns, op.self_device_time_ns)
        row.device_time_ns = _plus(row.device_time_ns, op.device_time_ns)
        row.flops = _plus(row.flops, op.flops)
        row.macs = _plus(row.macs, op.macs)
        row.bytes = _plus(row.bytes, op.bytes)
        if flops_counted and op.flops is None:
            row.unsupported_calls += op.calls
        row.alloc_bytes = _plus(row.alloc_bytes, op.alloc_bytes)
        row.self_alloc_bytes = _plus(row.self_alloc_bytes, op.self_alloc_bytes)
        row.freed_bytes = _plus(row.freed_bytes, op.freed_bytes)
        self.paths.add(node.path)
        row.modules = len(self.paths)


# -- options --------------------------------------------------------------------------


def parse_group_by(group_by: GroupBy | None, stack_depth: int | None = None) -> tuple[tuple[str, ...], int | None]:
    """``(keys, stack depth)`` from ``group_by``: a key, ``"a,b"`` or a sequence of keys.

    ``keys`` always starts with ``name`` and lists the others in :data:`GROUP_KEYS` order;
    the depth is None for the whole stack. None means ``name``."""
    if group_by is None:
        group_by = "name"
    items = group_by.split(",") if isinstance(group_by, str) else list(group_by)
    keys = {"name"}
    depth = None
    for item in items:
        key, sep, arg = str(item).strip().partition(":")
        if key not in GROUP_KEYS:
            raise OpTableError(
                f"unknown group_by key {item!r}; expected one of: {', '.join(GROUP_KEYS)}, stack:N "
                "(several may be combined, e.g. 'module,shape')"
            )
        if sep and key != "stack":
            raise OpTableError(f"group_by key {key!r} takes no ':' argument (only stack:N does)")
        if sep:
            try:
                depth = int(arg)
            except ValueError:
                raise OpTableError(f"stack:N needs a whole number of frames, got {item!r}") from None
        keys.add(key)
    if stack_depth is not None:
        if "stack" not in keys:
            raise OpTableError("stack_depth applies only with group_by='stack'")
        if depth is not None and depth != stack_depth:
            raise OpTableError(f"group_by={group_by!r} and stack_depth={stack_depth} disagree")
        depth = stack_depth
    if depth is not None and depth < 1:
        raise OpTableError(f"the stack depth must be at least 1 frame, got {depth}")
    return tuple(k for k in GROUP_KEYS if k in keys), depth


def sort_key(field: str) -> str:
    """The ``--sort-by`` key of a row field (``"self_cpu_time_ns"`` -> ``"self_cpu_time"``),
    as text for people names it: the unit-named fields are the data's (JSON, CSV)."""
    return next((key for key, name in SORT_KEYS.items() if name == field), field)


def sort_field(sort_by: str) -> str:
    """The row field ``sort_by`` names (``"self_cpu_time"`` -> ``"self_cpu_time_ns"``)."""
    if sort_by in SORT_KEYS:
        return SORT_KEYS[sort_by]
    if sort_by in SORT_KEYS.values():
        return sort_by
    if sort_by in TORCH_SORT_KEYS:
        return TORCH_SORT_KEYS[sort_by]
    raise OpTableError(
        f"unknown sort_by key {sort_by!r}; expected one of: {', '.join(SORT_KEYS)} "
        "(or the field names, e.g. self_cpu_time_ns)"
    )


def check_options(*, sort_by: str | None = None, group_by: GroupBy | None = "name", limit: int | None = None) -> None:
    """Raise :class:`OpTableError` for option values no profile could satisfy (checked
    before a long run; whether this profile has the metric is checked by ``op_table``)."""
    if sort_by is not None:
        sort_field(sort_by)
    parse_group_by(group_by)
    if limit is not None and limit < 0:
        raise OpTableError(f"limit must be a number >= 0, got {limit}")


def _available(profile: Profile, ops: list[OpStats]) -> dict[str, str | None]:
    """Each metric field, mapped to None if this profile has it, else to why not."""
    untimed = None if profile.timed else "the profile was not timed (count_flops)"
    if untimed is None and ops and all(op.cpu_time_ns is None for op in ops):
        untimed = (
            "its ops have no times (they are the block's detailed step's, and its times the light steps'; "
            "op times: Profiler(detail='every'), the default)" if profile.figures.detailed_steps
            else "its ops have no times (a compiled model's ops are its eager pass's; kernel times: --format kernels)"
        )
    no_device = "the profile has no device time (it ran on the CPU)"
    if any(op.device_time_ns is not None for op in ops):
        no_device = untimed
    no_flops: str | None = "the profile has no FLOP counts" + (f": {profile.meta.flops_unknown}" if profile.meta.flops_unknown else "")
    no_memory: str | None = "the profile has no memory figures (profiled with memory=False)"
    if not ops:
        no_flops = no_memory = "the profile has no ops (profiled with record_ops=False)"
    if profile.root.forward.flops is not None or any(op.flops is not None for op in ops):
        no_flops = None
    if any(op.alloc_bytes is not None for op in ops):
        no_memory = None
    why: dict[str, str | None] = {"calls": None}
    for names, reason in (
        (_TIME_FIELDS, untimed), (_DEVICE_FIELDS, no_device), (_FLOP_FIELDS, no_flops), (_MEMORY_FIELDS, no_memory)
    ):
        why.update(dict.fromkeys(names, reason))
    return why


# -- the table ------------------------------------------------------------------------


def _freeze(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=repr)


def op_table(
    profile: Profile,
    *,
    sort_by: str | None = None,
    group_by: GroupBy | None = "name",
    limit: int | None = None,
    module: str | None = None,
    phase: str | None = None,
    stack_depth: int | None = None,
) -> OpTable:
    """The profile's ops grouped by ``group_by`` and sorted by ``sort_by``, descending.

    ``sort_by`` is a key of :data:`SORT_KEYS` (``self_cpu_time``, ``flops``,
    ``self_alloc_bytes``, ...), a row field name, or a ``torch.profiler`` name; the
    default is ``self_cpu_time``, or ``flops`` for an untimed count. ``module`` keeps
    the ops of that node's subtree, ``phase`` those of one phase; ``limit`` keeps the
    first rows (the total still covers all). Raises :class:`OpTableError` (a
    ValueError) naming the problem for unknown keys, paths, or a metric the profile
    lacks.
    """
    keys, depth = parse_group_by(group_by, stack_depth)
    check_options(sort_by=sort_by, limit=limit)
    if phase is not None and phase not in (*PHASES, STEP_PHASE):
        raise OpTableError(f"unknown phase {phase!r}; expected one of: {', '.join((*PHASES, STEP_PHASE))}")
    if module is None:
        nodes = list(profile.nodes())
    else:
        try:
            nodes = list(profile.node(module).walk())
        except KeyError as exc:
            raise OpTableError(exc.args[0]) from None
    every_op = [op for node in profile.nodes() for op in node.ops]
    available = _available(profile, every_op)
    if sort_by is None:
        sort_by = "self_cpu_time_ns" if available["self_cpu_time_ns"] is None else "flops"
        if available[sort_by] is not None:
            sort_by = "calls"
    metric = sort_field(sort_by)
    if available[metric] is not None:
        valid = [key for key, name in SORT_KEYS.items() if available[name] is None]
        raise OpTableError(
            f"cannot sort by {sort_by!r}: {available[metric]}; sort by one of: {', '.join(valid)}"
        )
    if "stack" in keys and not any(op.stack is not None for op in every_op):
        raise OpTableError(
            "cannot group by stack: this profile has no Python stacks; "
            "profile with with_stack=True (--with-stack on the command line)"
        )
    flops_counted = available["flops"] is None

    groups: dict[str, _Group] = {}
    total = _Group(OpRow("Total", self_cpu_time_ns=0, cpu_time_ns=0))
    in_parts = {id(inner) for part in profile.parts for inner in part.walk()}
    for node in nodes:
        outside = id(node) in in_parts
        for op in node.ops:
            if phase is not None and op_phase(op, outside) != phase:
                continue
            key = _key_row(op, node, keys, depth, outside)
            frozen = _freeze([getattr(key, name) for name in _KEY_FIELDS])
            group = groups.get(frozen)
            if group is None:
                group = groups[frozen] = _Group(key)
            shown_phase = op_phase(op, outside)
            group.add(op, node, flops_counted, shown_phase)
            total.add(op, node, flops_counted, shown_phase)

    def order(item: tuple[str, _Group]) -> tuple[Any, ...]:
        frozen, group = item
        value = getattr(group.row, metric)
        return (value is None, -(value or 0), group.row.name, frozen)

    rows = [group.row for _, group in sorted(groups.items(), key=order)]
    columns = [name for name, by in _KEY_FIELDS.items() if set(by) & set(keys)]
    if "phase" not in keys and len(total.phases) > 1:
        # Rows that sum ops of several phases say which: lm_head's three aten::mm (the
        # forward's, the input's gradient, the weight's) apart by more than their shapes.
        for group in groups.values():
            group.row.phase = "+".join(p for p in (*PHASES, STEP_PHASE) if p in group.phases)
        columns.insert(1, "phase")
    columns += [f.name for f in fields(OpRow) if f.name not in _KEY_FIELDS and available.get(f.name, None) is None]
    return OpTable(
        rows=rows if limit is None else rows[:limit],
        total=total.row,
        matched=len(rows),
        columns=columns,
        group_by=keys,
        stack_depth=depth,
        sort_by=metric,
        module=module,
        phase=phase,
        profile=profile,
    )


#: The phase of the ops a step runs outside the model's forward and backward (its
#: parts: ``<optimizer:AdamW>``, ``<zero_grad>``, the loss's forward, ``<other>``...).
STEP_PHASE = "step"


def op_phase(op: OpStats, outside: bool) -> str:
    """An op's phase as the op tables name it: its own, except the forward ops of a step
    part (``outside`` the model), which are the step's (:data:`STEP_PHASE`); a loss's
    backward ops stay ``backward``."""
    return STEP_PHASE if outside and op.phase == "forward" else op.phase


def _key_row(op: OpStats, node: ModuleNode, keys: tuple[str, ...], depth: int | None, outside: bool) -> OpRow:
    row = OpRow(op.name)
    if "phase" in keys:
        row.phase = op_phase(op, outside)
    if "module" in keys:
        row.module = node.path
    if "module" in keys or "module_type" in keys:
        row.module_type = node.type
    if "shape" in keys:
        row.input_shapes = op.input_shapes
    if "stack" in keys:
        row.stack = list((op.stack or [])[:depth])
    return row


@dataclass
class OpTable:
    """Ops grouped and sorted: ``rows`` (after ``limit``), ``total`` (over all matched
    rows), and ``columns``, the row fields this profile has data for.

    ``render()``/``str()`` draw it like ``torch.profiler``'s ``key_averages().table()``;
    ``to_dict()`` is JSON-ready and ``to_dataframe()`` gives a pandas DataFrame.
    """

    rows: list[OpRow]
    total: OpRow
    #: How many rows matched before ``limit``.
    matched: int
    columns: list[str]
    group_by: tuple[str, ...]
    stack_depth: int | None
    sort_by: str
    module: str | None
    phase: str | None
    profile: Profile = field(repr=False)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[OpRow]:
        return iter(self.rows)

    DOCUMENT = "op-table"  # its table in the output registry

    def render(self, fmt: str = "text", **options: Any) -> str:
        """The table in a registered format (``layerscope.base.formats.formats("op-table")``)."""
        return formats.render(self, fmt, **options)

    def __str__(self) -> str:
        return formats.display_text(self)

    def to_dict(self) -> dict[str, Any]:
        """The options, the rows and the total, with only ``columns`` in each row."""

        def row_dict(row: OpRow) -> dict[str, Any]:
            return {name: getattr(row, name) for name in self.columns}

        return {
            "group_by": list(self.group_by),
            "stack_depth": self.stack_depth,
            "sort_by": self.sort_by,
            "module": self.module,
            "phase": self.phase,
            "matched": self.matched,
            "columns": list(self.columns),
            "rows": [row_dict(row) for row in self.rows],
            "total": row_dict(self.total),
        }

    def to_dataframe(self) -> Any:
        """The rows as a ``pandas.DataFrame``, one column per entry of ``columns``."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "OpTable.to_dataframe needs pandas: pip install 'layerscope[pandas]'"
            ) from None
        return pd.DataFrame(
            [[getattr(row, name) for name in self.columns] for row in self.rows], columns=self.columns
        )
