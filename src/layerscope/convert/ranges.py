"""The ranges one window of torch's profiler recorded, as layerscope's own records: the
seam between the two adapters that write them and the conversion that reads them
(:mod:`layerscope.convert.streams`).

Two adapters write these records: the live one (``capture/torch_events.py``, from
torch's in-memory events) and the trace import (``traces/ranges.py``, from a Kineto JSON
file). The conversion reads nothing else, so torch's events recorded on a GPU
(``capture/replay.py``) replay through the same adapter and conversion on a machine
without one: that is how the CUDA path is checked on every commit.

- :class:`Range`: a host range (an op, a module range, a label, a step, an allocation
  ``[memory]``) and the ranges nested in it. ``correlation_id`` is the id torch links
  device work to, set for op ranges only (0 elsewhere: a launch's CUPTI id is another
  counter). ``stack`` holds the user's Python frames around an op when they were
  recorded (innermost first).
- :class:`KernelSpan`: one piece of device work (kernel, memcpy or memset) and the op
  range that launched it. Allocations and user annotations on the device are never
  device work and never a ``KernelSpan``.
- :class:`Detail`: what a detailed window adds (layerscope's notes, concrete inputs).

The names of the ranges layerscope opens itself (a module call, a step, a part, a note)
are here too: the live window writes them, the conversion reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

#: ``RangeFields.scope`` of a ``record_function`` range (a user's label).
USER_SCOPE = "user"
#: The name torch gives an allocation or free.
MEMORY = "[memory]"

MODULE_PREFIX = "layerscope.module#"
PART_PREFIX = "layerscope.part#"
STEP_NAME = "layerscope.step"
#: A zero-length range marking when a note of layerscope's (memory live before the step,
#: activations saved by a forward, optimizer state) was taken: ``layerscope.note#K``.
NOTE_PREFIX = "layerscope.note#"
#: The step part holding layerscope's own work inside a step (its notes): ``<layerscope>``.
OVERHEAD_NAME = "layerscope"
#: A zero-length range marking that a checkpoint stopped recomputing in a module's
#: forward (in a detailed window).
RAISED_NAME = "layerscope.raised"
EVALUATE = "autograd::engine::evaluate_function: "
ACCUMULATE = "torch::autograd::AccumulateGrad"
#: How torch's optimizers label their ``step`` and ``zero_grad``.
OPTIMIZER_STEP = "Optimizer.step#"
OPTIMIZER_ZERO_GRAD = "Optimizer.zero_grad#"


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


#: What a trace file says an input was, as the overload lookup reads it
#: (``flops.recorded.overload_for``).
TENSOR, TENSORS, SCALAR, SCALARS, UNKNOWN = "tensor", "tensors", "scalar", "scalars", "?"


class _NotRecorded:
    """An input whose shapes a trace did not record although it recorded the op's
    others: a list of tensors written as ``[]`` (Kineto leaves long lists out, as an
    optimizer's ``_foreach_*`` parameters): the op's count is unknown, never 0."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_RECORDED"


NOT_RECORDED = _NotRecorded()


@dataclass(frozen=True)
class TensorInput:
    """A tensor input of an op as recorded (its shape, dtype and device), read by the
    conversion as it would read torch's tensor metadata: ``sizes``, ``dtype``, ``device``."""

    sizes: tuple[int, ...]
    #: torch's dtype as the adapter read it (``torch.float32``); a catalog reads it.
    dtype: Any
    #: torch's device as the adapter read it; None where it was not recorded.
    device: Any = None
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


def label_kind(name: str) -> tuple[str, str]:
    """``(kind, name)`` of a ``record_function`` range: torch's optimizers label their
    ``step`` and ``zero_grad`` (``"Optimizer.step#Adam.step"``); the rest are labels."""
    if name.startswith(OPTIMIZER_STEP):
        return "optimizer", name[len(OPTIMIZER_STEP) :].split(".", 1)[0]
    if name.startswith(OPTIMIZER_ZERO_GRAD):
        return "zero_grad", "zero_grad"
    return "label", name


def op_like(name: str) -> bool:
    """Whether a namespaced name reads as an op's (``aten::mm``, ``c10d::allreduce_``):
    a lower-case namespace and no spaces. ``record_function`` ranges named like
    ``FSDP::pre_forward (0)`` are told apart by their scope instead."""
    namespace = name.split("::", 1)[0]
    return " " not in name and namespace == namespace.lower()


def input_shapes(inputs: list[Any]) -> tuple[Any, ...]:
    """One shape per tensor input (a tuple per list of tensors), as the op rows show them."""
    shapes: list[Any] = []
    for value in inputs:
        sizes = getattr(value, "sizes", None)
        if sizes is not None:
            shapes.append(tuple(sizes))
        elif isinstance(value, list) and value and getattr(value[0], "sizes", None) is not None:
            shapes.append(tuple(tuple(t.sizes) for t in value if getattr(t, "sizes", None) is not None))
    return tuple(shapes)
