"""A trace's events as the live capture's ranges: one host tree per thread, the device
events with the op that launched each, and the modules the Python tracer saw.

torch.profiler writes the same events it hands the live capture, flattened: each
``cpu_op``, ``user_annotation`` and ``python_function`` is a complete event (``ph: X``)
with its thread; allocations are ``[memory]`` instants; a launch (``cuda_runtime`` /
``cuda_driver``) and the kernels, copies and memsets it started share
``args.correlation``. Nesting is rebuilt from time on each thread (the Python tracer's
``Python parent id`` crosses threads: a hook run by autograd's thread names a parent on
the main thread), into the :class:`~layerscope.capture.kineto.Range` trees the live
conversion reads. A device event is linked to the innermost range open on its launch's
thread when the launch ran (correlation ids join them: ``ac2g`` flows lack a start for
some launches on ROCm).

Times are integer nanoseconds (timestamps near 10^12 µs with three decimals do not fit a
float's precision in ns).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from layerscope.base.errors import SchemaError
from layerscope.base.kineto_json import us_to_ns
from layerscope.convert.ranges import (
    NOT_RECORDED,
    SCALAR,
    SCALARS,
    STEP_NAME,
    TENSOR,
    TENSORS,
    UNKNOWN,
    USER_SCOPE,
    KernelSpan,
    Range,
    RangeFields,
    TensorInput,
)

#: A module call recorded by torch's Python tracer: ``nn.Module: ClassName_k``.
MODULE_EVENT = "nn.Module: "
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_OP, _LABEL, _PYTHON, _DEVICE, _LAUNCH = range(5)
#: What each event category torch's releases have written is, matched without regard to
#: case: Kineto's names since torch 1.10, the names before them (``Operator``,
#: ``Kernel``, ``Memcpy``, ``Memset``, ``Runtime``, ``Python``), and other backends'
#: runtimes and drivers (ROCm writes CUDA's names). The categories torch's profiler
#: viewer has read (kineto's ``tb_plugin``) are all here.
CATEGORY_KINDS: dict[str, int] = {
    "cpu_op": _OP, "operator": _OP,
    "user_annotation": _LABEL,
    "python_function": _PYTHON,
    "kernel": _DEVICE, "gpu_memcpy": _DEVICE, "memcpy": _DEVICE, "gpu_memset": _DEVICE, "memset": _DEVICE,
    "cuda_runtime": _LAUNCH, "cuda_driver": _LAUNCH, "runtime": _LAUNCH, "xpu_runtime": _LAUNCH,
    "xpu_driver": _LAUNCH, "mtia_runtime": _LAUNCH, "privateuse1_runtime": _LAUNCH,
    "privateuse1_driver": _LAUNCH,
}
#: Categories of events on a device's tracks that are not device work (a label drawn on
#: the device's timeline, a stream or event synchronization the host waited on, the
#: flows and instants), never counted as unread work.
_NOT_DEVICE_WORK = frozenset({"gpu_user_annotation", "cuda_sync", "ac2g", "fwdbwd", "cpu_instant_event", "gpu_instant_event", "overhead", "trace"})

#: torch's names for dtypes in ``Input type`` (``c10::toString(ScalarType)``), each
#: with the name of its ``torch`` dtype. Names alone: a trace without shapes (no
#: ``Input type``) is read without importing torch.
_DTYPE_NAMES: dict[str, str] = {
    "float": "float32",
    "double": "float64",
    "c10::Half": "float16",
    "c10::BFloat16": "bfloat16",
    "long int": "int64",
    "int": "int32",
    "short int": "int16",
    "signed char": "int8",
    "unsigned char": "uint8",
    "bool": "bool",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
    "c10::complex<c10::Half>": "complex32",
    **{f"c10::{name}": name.lower() for name in ("Float8_e4m3fn", "Float8_e5m2", "Float8_e4m3fnuz", "Float8_e5m2fnuz")},
}


@functools.cache
def _dtypes() -> dict[str, Any]:
    """``Input type`` -> ``torch.dtype``, for the dtypes this torch has (imported here:
    only a trace with recorded shapes asks)."""
    import torch

    found = {kind: getattr(torch, name, None) for kind, name in _DTYPE_NAMES.items()}
    return {kind: dtype for kind, dtype in found.items() if isinstance(dtype, torch.dtype)}


_KINDS = {"TensorList": TENSORS, "Scalar": SCALAR, "ScalarList": SCALARS}
#: The ops that run on the matrix units a datasheet's peak is for (matrix products,
#: convolutions, attention): the dtype of their inputs says which peak the trace's
#: model ran against. Nested ones (``aten::linear`` over ``aten::addmm``) each count.
MATRIX_OPS = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
    "aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::miopen_convolution",
    "aten::convolution_backward", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_flash_attention_backward", "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention_backward",
})


#: The fields of ranges that carry none of their own (labels, modules, steps, ops with
#: no sequence number or inputs): shared, as the conversion only reads them.
_NO_FIELDS = RangeFields()
_LABEL_FIELDS = RangeFields(scope=USER_SCOPE)
#: A module call's: the same values as :data:`_NO_FIELDS`, another object (which tells
#: a module's range from an op's in ``_rank``).
MODULE_FIELDS = RangeFields()
#: The children of a range with none, and the inputs of an allocation: shared, for the
#: same reason (``_Builder.finish`` gives a range its own list at its first child).
_NONE: list[Any] = []


class Allocation:
    """An allocation or free (a ``[memory]`` instant) as the conversion reads a
    :class:`Range` with its :class:`RangeFields`, in one object: what every allocation
    has alike (its name, no children, no inputs) is the class's. A trace holds about one
    per op."""

    __slots__ = (
        "alloc_size",
        "allocation_id",
        "device",
        "end_time_ns",
        "ptr",
        "start_tid",
        "start_time_ns",
        "total_allocated",
        "total_reserved",
    )
    name = "[memory]"
    correlation_id = 0
    children: list[Any] = _NONE
    overload_name = ""
    stack = None
    sequence_number = -1
    scope = None
    inputs: list[Any] = _NONE

    def __init__(
        self, t: int, tid: int, ptr: int, alloc_size: int, allocation_id: int, total_allocated: int,
        total_reserved: int, device: str,
    ) -> None:
        self.start_time_ns = self.end_time_ns = t
        self.start_tid = tid
        self.ptr = ptr
        self.alloc_size = alloc_size
        self.allocation_id = allocation_id
        self.total_allocated = total_allocated
        self.total_reserved = total_reserved
        self.device = device

    @property
    def extra_fields(self) -> Allocation:
        return self


@dataclass
class DeviceEvent:
    """A kernel, copy or memset on the device, and what launched it."""

    name: str
    category: str
    start_ns: int
    end_ns: int
    correlation: int
    stream: Any


@dataclass
class ModuleCall:
    """One ``nn.Module: ClassName_k`` event: a call of module instance ``instance``."""

    instance: str
    range: Range
    python_id: int | None
    python_parent: int | None


@dataclass
class TraceRanges:
    """What a trace holds, as the live conversion reads it."""

    #: Each thread's root ranges (steps, modules, labels, ops), by thread id.
    roots: dict[int, list[Range]] = field(default_factory=dict)
    #: Device events and the range each was launched from (``linked_correlation_id``).
    kernels: list[KernelSpan] = field(default_factory=list)
    device_events: list[DeviceEvent] = field(default_factory=list)
    #: Each launch's correlation, the range it ran in (0: none) and when it ran.
    launched_in: dict[int, int] = field(default_factory=dict)
    launched_at: dict[int, int] = field(default_factory=dict)
    modules: list[ModuleCall] = field(default_factory=list)
    #: Each Python tracer frame's parent frame (``Python id`` -> ``Python parent id``),
    #: for the frames on a module call's chain up to its caller's module.
    python_parent: dict[int, int | None] = field(default_factory=dict)
    #: Whether the trace holds Python tracer frames with ids (``with_stack=True``).
    has_stack: bool = False
    #: ``ProfilerStep#N`` ranges: the step's range and ``N`` (not in ``roots``).
    steps: list[tuple[Range, int]] = field(default_factory=list)
    has_shapes: bool = False
    has_memory: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    #: Calls of :data:`MATRIX_OPS` by the dtype of their first tensor input (``float32``).
    matrix_dtypes: dict[str, int] = field(default_factory=dict)
    #: Device work of categories layerscope does not read: per category, the count and
    #: the spans (start, end ns).
    unread_device: dict[str, tuple[int, list[tuple[int, int]]]] = field(default_factory=dict)


class _Builder:
    def __init__(self, inputs: bool = True) -> None:
        self.out = TraceRanges()
        #: Whether ops' recorded inputs are read (torch's dtypes and schemas: imported
        #: only when they are).
        self.read_inputs = inputs
        #: Host events per thread, unnested, in the file's order: ranges, and launches as
        #: (start, end, correlation).
        self.by_thread: dict[int, list[Any]] = {}
        self.next_id = 1
        self.live_alloc: dict[int, int] = {}  # address -> allocation id
        self.tensors: dict[tuple[Any, ...], TensorInput] = {}
        # One object per distinct value read from many events: names, thread ids, inputs
        # (keyed by their recorded text) and the fields of ops without a sequence number.
        self.strings: dict[str, str] = {}
        self.tids: dict[int, int] = {}
        self.inputs_of: dict[tuple[Any, ...], list[Any]] = {}
        self.fields_of: dict[int, RangeFields] = {}
        self.own_steps = 0  # layerscope's step ranges seen so far
        #: Each category seen and what it is (None: not one layerscope reads).
        self.kinds: dict[Any, int | None] = {}

    def add(self, event: dict[str, Any]) -> None:
        ph = event.get("ph")
        cat = event.get("cat")
        counts = self.out.counts
        counts[cat or ""] = counts.get(cat or "", 0) + 1
        if ph == "X":
            kind = self.kinds.get(cat, -1)
            if kind == -1:
                kind = self.kinds[cat] = CATEGORY_KINDS.get(str(cat).lower())
            if kind == _OP:
                self.op(event)
            elif kind == _LABEL:
                self.annotation(event)
            elif kind == _PYTHON:
                self.python(event)
            elif kind == _DEVICE:
                self.device(event)
            elif kind == _LAUNCH:
                self.launch(event)
            elif kind is None:
                self.unknown(event, cat)
        elif ph == "i" and event.get("name") == "[memory]":
            self.memory(event)

    # -- one method per kind of event ---------------------------------------------------
    def _tid(self, event: dict[str, Any]) -> int | None:
        tid = event.get("tid")
        return self.tids.setdefault(tid, tid) if type(tid) is int else None

    def _name(self, event: dict[str, Any]) -> str:
        name = str(event.get("name", ""))
        return self.strings.setdefault(name, name)

    def _span(self, event: dict[str, Any]) -> tuple[int, int]:
        start = us_to_ns(event["ts"])
        return start, start + max(0, us_to_ns(event.get("dur", 0)))

    def _push(self, tid: int, item: Any) -> None:
        self.by_thread.setdefault(tid, []).append(item)

    def step_mark(self, tid: int, start: int, end: int, number: int) -> None:
        rng = Range(STEP_NAME, start, end, tid, self._id(), extra_fields=_NO_FIELDS)
        self.out.steps.append((rng, number))

    def op(self, event: dict[str, Any]) -> None:
        tid = self._tid(event)
        if tid is None:
            return
        start, end = self._span(event)
        if event.get("name") == STEP_NAME:
            # torch's own trace of a layerscope block: its steps are layerscope's
            # ranges (recorded as ops), numbered in order.
            self.step_mark(tid, start, end, self.own_steps)
            self.own_steps += 1
            return
        args = event.get("args") or {}
        sequence_number = _int(args.get("Sequence number"), -1)
        inputs = _NONE
        name = self._name(event)
        overload = ""
        types = args.get("Input type")
        if isinstance(types, list):
            self.out.has_shapes = True
            if self.read_inputs:
                dims = args.get("Input Dims") or args.get("Input dims") or []  # torch before 1.10: "Input dims"
                inputs = self.shared_inputs(types, dims, args.get("Concrete Inputs") or [])
                overload = self.overload(name, types)
            if name in MATRIX_OPS:
                key = next((_DTYPE_NAMES[t] for t in types if t in _DTYPE_NAMES), None)
                if key is not None:
                    self.out.matrix_dtypes[key] = self.out.matrix_dtypes.get(key, 0) + 1
        if sequence_number != -1:
            fields = RangeFields(sequence_number=sequence_number, inputs=inputs)
        elif inputs is _NONE:
            fields = _NO_FIELDS
        else:
            shared = self.fields_of.get(id(inputs))
            if shared is None:
                shared = self.fields_of[id(inputs)] = RangeFields(inputs=inputs)
            fields = shared
        rng = Range(name, start, end, tid, self._id(), _NONE, fields, overload)
        self._push(tid, rng)

    def annotation(self, event: dict[str, Any]) -> None:
        tid = self._tid(event)
        if tid is None:
            return
        start, end = self._span(event)
        name = self._name(event)
        step = _STEP.match(name)
        if step is not None:
            # Steps are marks on the timeline, not ranges the others nest in: a
            # framework may step the profiler in the middle of a range of its own.
            self.step_mark(tid, start, end, int(step.group(1)))
            return
        rng = Range(name, start, end, tid, self._id(), _NONE, _LABEL_FIELDS)
        self._push(tid, rng)

    def python(self, event: dict[str, Any]) -> None:
        args = event.get("args") or {}
        ident = _int(args.get("Python id"), None)
        parent = _int(args.get("Python parent id"), None)
        if ident is not None:
            self.out.has_stack = True
            self.out.python_parent[ident] = parent
        name = str(event.get("name", ""))
        if not name.startswith(MODULE_EVENT):
            return
        name = self.strings.setdefault(name, name)
        tid = self._tid(event)
        if tid is None or tid == 0:
            return  # a Python-only thread's frame: no op of the trace ran on it
        start, end = self._span(event)
        rng = Range(name, start, end, tid, self._id(), _NONE, MODULE_FIELDS)
        self.out.modules.append(ModuleCall(name[len(MODULE_EVENT) :], rng, ident, parent))
        self._push(tid, rng)

    def memory(self, event: dict[str, Any]) -> None:
        tid = self._tid(event)
        if tid is None:
            return
        self.out.has_memory = True
        args = event.get("args") or {}
        t = us_to_ns(event["ts"])
        size = _int(args.get("Bytes"), 0)
        ptr = _int(args.get("Addr"), 0)
        # Allocation ids are not written to the file: each allocation at an address is a
        # new storage until that address is freed.
        if size > 0:
            ident = self.live_alloc[ptr] = self._id()
        else:
            ident = self.live_alloc.pop(ptr, None) or self._id()
        self._push(tid, Allocation(
            t, tid, ptr, size, ident, _int(args.get("Total Allocated"), 0), _int(args.get("Total Reserved"), 0),
            "cpu" if _int(args.get("Device Type"), 0) == 0 else "cuda",
        ))

    def launch(self, event: dict[str, Any]) -> None:
        tid = self._tid(event)
        correlation = _int((event.get("args") or {}).get("correlation"), None)
        if tid is None or correlation is None:
            return
        start, end = self._span(event)
        self._push(tid, (start, end, correlation))

    def unknown(self, event: dict[str, Any], cat: Any) -> None:
        """An event of a category layerscope does not read: counted as unread device
        work when it is on a device's stream (its args name one), so the ledger never
        leaves device work out silently."""
        args = event.get("args")
        if not isinstance(args, dict) or "stream" not in args or str(cat).lower() in _NOT_DEVICE_WORK:
            return
        name = str(cat)
        start, end = self._span(event)
        unread = self.out.unread_device
        count, spans = unread.get(name, (0, []))
        spans.append((start, end))
        unread[name] = (count + 1, spans)

    def device(self, event: dict[str, Any]) -> None:
        args = event.get("args") or {}
        correlation = _int(args.get("correlation"), None)
        start, end = self._span(event)
        category = str(event.get("cat"))
        self.out.device_events.append(DeviceEvent(
            self._name(event), self.strings.setdefault(category, category), start, end, correlation or 0,
            args.get("stream"),
        ))

    # -- helpers ------------------------------------------------------------------------
    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def shared_inputs(self, types: list[Any], dims: list[Any], concrete: list[Any]) -> list[Any]:
        """:meth:`inputs`, one list for each distinct recorded text (the conversion only
        reads them): most ops of a model are called many times with the same inputs."""
        try:
            key = (tuple(types), _frozen(dims), tuple(concrete))
            found = self.inputs_of.get(key)
        except TypeError:  # a value that is not JSON's own (unhashable): not shared
            return self.inputs(types, dims, concrete)
        if found is None:
            found = self.inputs_of[key] = self.inputs(types, dims, concrete)
        return found

    def inputs(self, types: list[Any], dims: list[Any], concrete: list[Any]) -> list[Any]:
        """Each recorded input as the conversion reads it: tensors as :class:`TensorInput`,
        scalars and int lists as values (``Concrete Inputs``), anything else None."""
        values: list[Any] = []
        dtypes = _dtypes()
        first_dtype = next((dtypes[t] for t in types if t in dtypes), dtypes["float"])
        for i, kind in enumerate(types):
            shape = dims[i] if i < len(dims) else []
            known = concrete[i] if i < len(concrete) else ""
            dtype = dtypes.get(kind)
            if dtype is not None:
                values.append(self.tensor(shape, dtype))
            elif kind == "TensorList":
                tensors = [self.tensor(s, first_dtype) for s in shape if isinstance(s, list)]
                # Written as [] (its shapes left out): not an empty list, an unknown one.
                values.append(tensors if tensors else NOT_RECORDED)
            elif kind == "Scalar":
                values.append(_scalar(known))
            elif kind == "ScalarList":
                values.append(_scalar_list(known))
            else:
                values.append(None)
        return values

    def overload(self, name: str, types: list[Any]) -> str:
        """The overload the recorded inputs fit (the file names none)."""
        if "::" not in name:
            return ""
        from layerscope.flops import recorded  # torch's schemas: only a trace with shapes asks

        dtypes = _dtypes()
        kinds = tuple(TENSOR if t in dtypes else _KINDS.get(t, UNKNOWN) for t in types)
        return recorded.overload_for(name, kinds)

    def tensor(self, shape: Any, dtype: Any) -> TensorInput:
        key = (tuple(shape) if isinstance(shape, list) else (), dtype)
        found = self.tensors.get(key)
        if found is None:
            found = self.tensors[key] = TensorInput(key[0], dtype)
        return found

    # -- nesting ------------------------------------------------------------------------
    def finish(self) -> TraceRanges:
        out = self.out
        for tid, items in self.by_thread.items():
            # By start, then the longer first, then modules, labels, ops, allocations,
            # launches, then the file's order: three stable sorts keyed by what each item
            # holds already (one key tuple per event would double the read's memory).
            items.sort(key=_rank)
            items.sort(key=_end, reverse=True)
            items.sort(key=_start)
            roots: list[Range] = []
            stack: list[Range] = []
            for item in items:
                if type(item) is tuple:  # a launch: its device events belong to the range open now
                    start, _, correlation = item
                    while stack and stack[-1].end_time_ns <= start:
                        stack.pop()
                    out.launched_in[correlation] = stack[-1].correlation_id if stack else 0
                    out.launched_at[correlation] = start
                    continue
                start, end = item.start_time_ns, item.end_time_ns
                while stack and stack[-1].end_time_ns <= start:
                    stack.pop()
                if not stack:
                    roots.append(item)
                else:
                    parent = stack[-1]
                    if end > parent.end_time_ns:
                        # Ends after the range it starts in (clocks of two recorders): kept inside.
                        item.end_time_ns = max(item.start_time_ns, parent.end_time_ns)
                    if parent.children is _NONE:
                        parent.children = [item]
                    else:
                        parent.children.append(item)
                if item.name != "[memory]":
                    stack.append(item)
            out.roots[tid] = roots
        self.by_thread = {}
        out.python_parent = _chains(out.python_parent, out.modules)
        for event in out.device_events:
            link = out.launched_in.get(event.correlation, 0)
            stream = event.stream if type(event.stream) is int else 0
            out.kernels.append(KernelSpan(link, event.start_ns, event.end_ns, event.name, stream))
        return out


def read_ranges(events: Iterable[dict[str, Any]], *, inputs: bool = True) -> TraceRanges:
    """The trace's events (dicts, as the file holds them) as host range trees per thread,
    device events linked to the ranges that launched them, and module calls. With
    ``inputs=False`` ops keep no recorded inputs (``has_shapes`` still says whether the
    file has them), and torch is not imported."""
    builder = _Builder(inputs)
    for at, event in enumerate(events):
        if isinstance(event, dict):
            try:
                builder.add(event)
            except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
                raise DamagedEvent(_damage(at, event, exc)) from None
    return builder.finish()


class DamagedEvent(SchemaError):
    """An event of a trace that cannot be read: its place, name and field, and why
    (the trace reader names the file)."""


def _damage(at: int, event: dict[str, Any], exc: Exception) -> str:
    """``event 12 ('aten::mm', cpu_op): 'ts' is 'abc', not a number of microseconds``:
    which event, and the field that broke it where a time field is not a number."""
    what = f"event {at} ({str(event.get('name', ''))!r}, {event.get('cat')})"
    for field_name in ("ts", "dur"):
        if field_name in event:
            try:
                us_to_ns(event[field_name])
            except (TypeError, ValueError):
                return f"{what}: {field_name!r} is {event[field_name]!r}, not a number of microseconds"
    return f"{what}: {type(exc).__name__}: {exc}"


def _start(item: Any) -> int:
    return item[0] if type(item) is tuple else item.start_time_ns


def _end(item: Any) -> int:
    return item[1] if type(item) is tuple else item.end_time_ns


def _rank(item: Any) -> int:
    """Which of a thread's items that start and end together holds the others: a module
    call (1), a label (2), an op (3), an allocation (4), a launch (5)."""
    if type(item) is tuple:
        return 5
    fields = item.extra_fields
    if fields is MODULE_FIELDS:
        return 1
    if fields is _LABEL_FIELDS:
        return 2
    return 3 if fields.device is None else 4


def module_of_frames(calls: list[ModuleCall]) -> dict[int, str]:
    """Each module call's Python tracer frame, and the instance it called (the latest
    call's, where frames repeat)."""
    module_of: dict[int, str] = {}
    for call in sorted(calls, key=lambda c: c.range.start_time_ns):
        if call.python_id is not None:
            module_of[call.python_id] = call.instance
    return module_of


def caller_module(
    up: int | None, name: str, module_of: dict[int, str], parent_of: Callable[[int], int | None]
) -> str | None:
    """The nearest module instance other than ``name`` up the Python call chain from
    frame ``up`` (``parent_of``: a frame's parent frame); None when there is none (the
    walk is bounded: a damaged chain may loop)."""
    for _ in range(10_000):
        if up is None:
            return None
        owner = module_of.get(up)
        if owner is not None and owner != name:
            return owner
        up = parent_of(up)
    return None


def _chains(python_parent: dict[int, int | None], calls: list[ModuleCall]) -> dict[int, int | None]:
    """``python_parent`` cut to the frames ``modules.instances`` looks up: each
    instance's first call's chain, up to the frame of another instance's call."""
    module_of = module_of_frames(calls)
    kept: dict[int, int | None] = {}

    def parent_of(frame: int) -> int | None:
        parent = kept[frame] = python_parent.get(frame)
        return parent

    seen: set[str] = set()
    for call in sorted(calls, key=lambda c: c.range.start_time_ns):
        if call.instance not in seen:
            seen.add(call.instance)
            caller_module(call.python_parent, call.instance, module_of, parent_of)
    return kept


def _frozen(value: Any) -> Any:
    """A JSON value's lists as tuples, for a key."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def _int(value: Any, default: Any) -> Any:
    if type(value) is int:
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    return default


def _scalar(text: Any) -> Any:
    if not isinstance(text, str) or not text:
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _scalar_list(text: Any) -> list[Any] | None:
    if not isinstance(text, str) or not (text.startswith("[") and text.endswith("]")):
        return None
    inner = text[1:-1].strip()
    if not inner:
        return []
    values = [_scalar(part.strip()) for part in inner.split(",")]
    return None if any(v is None for v in values) else values
