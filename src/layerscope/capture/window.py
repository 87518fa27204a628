"""What one window of torch's profiler recorded, as layerscope's own records: the seam
between torch's profiler and the conversion (``capture/kineto.py`` ``convert``).

Two adapters write these records: the live one (``capture/torch_events.py``, from
torch's in-memory events) and the trace import (``traces/ranges.py``, from a Kineto JSON
file). The conversion reads nothing else, so a window recorded on a GPU and saved
(:meth:`WindowCapture.to_dict`) replays through the same conversion on a machine
without one: that is how the CUDA path is checked on every commit.

- :class:`Range`: a host range (an op, a module range, a label, a step, an allocation
  ``[memory]``) and the ranges nested in it. ``correlation_id`` is the id torch links
  device work to, set for op ranges only (0 elsewhere: a launch's CUPTI id is another
  counter). ``stack`` holds the user's Python frames around an op when they were
  recorded (innermost first).
- :class:`KernelSpan`: one piece of device work (kernel, memcpy, memset) and the op
  range that launched it. Allocations and user annotations on the device are never
  device work and never a ``KernelSpan``.
- :class:`Detail`: what a detailed window adds (layerscope's notes, concrete inputs).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from layerscope.io import write_atomic

_CPU = torch.device("cpu")
#: ``RangeFields.scope`` of a ``record_function`` range (a user's label).
USER_SCOPE = "user"
#: The name torch gives an allocation or free.
MEMORY = "[memory]"
#: The format of a saved window, and of a recording (a list of windows with the model's
#: module table): bumped when a field changes meaning.
FORMAT = "layerscope-window/1"


class KernelSpan(NamedTuple):
    """A kernel, memcpy or memset on the device, and the op that launched it
    (``linked_correlation_id``: the launching op range's ``correlation_id``; 0 when no
    op range is known to have launched it)."""

    linked_correlation_id: int
    start_ns: int
    end_ns: int
    name: str = ""
    #: The device's stream (its track in a trace), or 0 when not known.
    stream: int = 0


@dataclass(frozen=True)
class TensorInput:
    """A tensor input of an op as recorded (its shape, dtype and device), read by the
    conversion as it would read torch's tensor metadata: ``sizes``, ``dtype``, ``device``."""

    sizes: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device = _CPU
    #: The allocation the tensor lives in (torch's ``allocation_id``), when recorded.
    allocation_id: int | None = None


@dataclass(slots=True)
class RangeFields:
    """The op fields of a :class:`Range` (``sequence_number``: autograd's, -1 for none;
    ``scope``: :data:`USER_SCOPE` for a label; ``inputs``: recorded inputs), and an
    allocation's (``alloc_size`` < 0 is a free; ``device``: ``"cpu"``, ``"cuda"``, ...)."""

    sequence_number: int = -1
    scope: str | None = None
    inputs: list[Any] = field(default_factory=list)
    ptr: int = 0
    alloc_size: int = 0
    allocation_id: int = 0
    total_allocated: int = 0
    total_reserved: int = 0
    device: str | None = None


@dataclass(slots=True)
class Range:
    """A host range with the ranges nested in it (see the module's docstring)."""

    name: str
    start_time_ns: int
    end_time_ns: int
    start_tid: int = 0
    correlation_id: int = 0
    children: list[Range] = field(default_factory=list)
    extra_fields: RangeFields = field(default_factory=RangeFields)
    overload_name: str = ""
    stack: tuple[str, ...] | None = None


@dataclass
class Detail:
    """What a detailed window hands the conversion besides its ranges: the notes its
    ``layerscope.note#K`` ranges point to, each op's concrete inputs (int lists) by
    correlation id, and whether Python frames were recorded (``stacks``: each op's
    ``Range.stack``)."""

    notes: list[list[tuple[Any, ...]]] = field(default_factory=list)
    concrete: dict[int, list[Any]] = field(default_factory=dict)
    stacks: bool | None = None


@dataclass
class WindowCapture:
    """One window: every thread's root ranges, the device work, and the detail."""

    roots: list[Range]
    kernels: list[KernelSpan] = field(default_factory=list)
    has_device: bool = False
    detail: Detail | None = None

    # -- saving and reading back ---------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        detail = self.detail
        return {
            "format": FORMAT,
            "has_device": self.has_device,
            "roots": [_range_out(r) for r in self.roots],
            "kernels": [list(k) for k in self.kernels],
            "detail": None if detail is None else {
                "notes": [[list(item) for item in note] for note in detail.notes],
                "concrete": [[key, value_to_json(values)] for key, values in detail.concrete.items()],
                "stacks": detail.stacks,
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WindowCapture:
        if data.get("format") != FORMAT:
            raise ValueError(f"not a saved window: format {data.get('format')!r}, expected {FORMAT!r}")
        raw = data.get("detail")
        detail = None
        if raw is not None:
            detail = Detail(
                notes=[[_note_in(item) for item in note] for note in raw["notes"]],
                concrete={int(key): value_from_json(values) for key, values in raw["concrete"]},
                stacks=raw["stacks"],
            )
        return cls(
            roots=[_range_in(r) for r in data["roots"]],
            kernels=[KernelSpan(*k) for k in data["kernels"]],
            has_device=bool(data["has_device"]),
            detail=detail,
        )


def _note_in(item: list[Any]) -> tuple[Any, ...]:
    """A note read back: the bytes-by-key dict of an ``optim`` note keeps its keys."""
    return tuple(tuple(v) if isinstance(v, list) else v for v in item)


# -- ranges as compact lists: [name, start, end, tid, correlation, overload, fields, children, stack]


def _range_out(r: Range) -> list[Any]:
    f = r.extra_fields
    if r.name == MEMORY:
        fields: Any = ["m", f.ptr, f.alloc_size, f.allocation_id, f.total_allocated, f.total_reserved, f.device]
    elif f.sequence_number == -1 and f.scope is None and not f.inputs:
        fields = None
    else:
        fields = [f.sequence_number, f.scope, [value_to_json(v) for v in f.inputs]]
    return [
        r.name, r.start_time_ns, r.end_time_ns, r.start_tid, r.correlation_id, r.overload_name, fields,
        [_range_out(c) for c in r.children], None if r.stack is None else list(r.stack),
    ]


def _range_in(item: list[Any]) -> Range:
    name, start, end, tid, correlation, overload, fields, children, stack = item
    if fields is None:
        extra = RangeFields()
    elif fields and fields[0] == "m":
        extra = RangeFields(
            ptr=fields[1], alloc_size=fields[2], allocation_id=fields[3], total_allocated=fields[4],
            total_reserved=fields[5], device=fields[6],
        )
    else:
        extra = RangeFields(sequence_number=fields[0], scope=fields[1], inputs=[value_from_json(v) for v in fields[2]])
    return Range(
        name, start, end, tid, correlation, [_range_in(c) for c in children], extra, overload,
        None if stack is None else tuple(stack),
    )


def value_to_json(value: Any) -> Any:
    """A recorded input as JSON: a tensor as ``{"t": sizes, "d": dtype, "v": device}``
    (and ``"a"``, its allocation id, when known); lists as lists; other values as they
    are, or None where JSON has no form for them."""
    if isinstance(value, TensorInput):
        found = {"t": list(value.sizes), "d": str(value.dtype).removeprefix("torch."), "v": str(value.device)}
        if value.allocation_id is not None:
            found["a"] = value.allocation_id
        return found
    if isinstance(value, (list, tuple)):
        return [value_to_json(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return None


def value_from_json(value: Any) -> Any:
    """What :func:`value_to_json` wrote, read back (tensors as :class:`TensorInput`)."""
    if isinstance(value, dict):
        return TensorInput(tuple(value["t"]), getattr(torch, value["d"]), torch.device(value["v"]), value.get("a"))
    if isinstance(value, list):
        return [value_from_json(v) for v in value]
    return value


def op_like(name: str) -> bool:
    """Whether a namespaced name reads as an op's (``aten::mm``, ``c10d::allreduce_``):
    a lower-case namespace and no spaces. ``record_function`` ranges named like
    ``FSDP::pre_forward (0)`` are told apart by their scope instead."""
    namespace = name.split("::", 1)[0]
    return " " not in name and namespace == namespace.lower()


def save_json(data: dict[str, Any], path: str | Path) -> None:
    """Write ``data`` as JSON, gzipped when ``path`` ends in ``.gz`` (atomically)."""
    text = json.dumps(data, separators=(",", ":")).encode()
    write_atomic(Path(path), gzip.compress(text, mtime=0) if str(path).endswith(".gz") else text)


def load_json(path: str | Path) -> Any:
    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
