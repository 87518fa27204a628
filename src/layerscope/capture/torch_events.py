"""The live adapter: torch's profiler result (its event tree and its flat Kineto events)
turned into layerscope's own records (``capture/window.py``), once, when a window
stops. This is the only module that reads torch's profiler events; the conversion reads
the records, so a recorded window replays through it without torch's profiler.

What is read, and what is left (each rule is where a wrong device time once came from):

- **Device work** is a kernel, memcpy or memset: a flat event on a device that is not an
  allocation (``[memory]``, linked id 0) and not a user annotation (a
  ``record_function`` range shown on the device, such as an optimizer's step). Its
  ``linked_correlation_id`` is the correlation id of the op that launched it.
- **Op ranges** keep torch's ``correlation_id``, the id device work is linked to.
  Kineto's own host events in the tree (``cudaLaunchKernel``, ``cudaMemsetAsync``)
  carry CUPTI's correlation id, another counter that collides with op ids: they are
  left out of the tree (their time is inside the op that called them).
- **Python frames** (``with_stack``) are see-through: their ranges count as nested
  directly, and each op keeps the user's frames around it (``Range.stack``).
- **Pruning.** Without a device and without detail, the conversion never reads below a
  namespaced op (``aten::mm``: it runs no module), so those subtrees are not copied.
"""

from __future__ import annotations

import re
from typing import Any

from layerscope.capture import _torch
from layerscope.capture.window import (
    MEMORY,
    USER_SCOPE,
    Detail,
    KernelSpan,
    Range,
    RangeFields,
    TensorInput,
    WindowCapture,
    op_like,
)

_TORCH_OP: Any = _torch.EVENT_TORCH_OP
_ALLOCATION: Any = _torch.EVENT_ALLOCATION
_PY_CALL: Any = _torch.EVENT_PY_CALL
_PYTHON: Any = _torch.PYTHON_EVENTS
_USER: Any = _torch.USER_SCOPE

#: "file(line): function", as torch's Python tracer names a frame.
_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")
_LIBRARIES = ("torch/", "layerscope/", "<")


def user_frame(name: str) -> str | None:
    """A recorded Python frame as ``"file:line function"``; None for torch's and
    layerscope's own frames, modules' names and built-ins."""
    found = _FRAME.match(name)
    if found is None:
        return None
    path, line, function = found.groups()
    if path.startswith(_LIBRARIES) or "/torch/" in path or "/layerscope/" in path:
        return None
    return f"{path}:{line} {function}"


def read_kernels(result: Any) -> list[KernelSpan]:
    """The device work of a profiler result (kernels, memcpys, memsets), each with the
    op that launched it (0 when none is known)."""
    cpu = _torch.CPU_DEVICE
    found = []
    for e in result.events():
        if e.device_type() == cpu or e.is_user_annotation():
            continue
        name = e.name()
        if name == MEMORY:
            continue
        found.append(KernelSpan(max(0, e.linked_correlation_id()), e.start_ns(), e.end_ns(), name, e.device_resource_id()))
    return found


def concrete_inputs(result: Any) -> dict[int, list[Any]]:
    """Each op's concrete inputs (the int lists the event tree does not hold), by
    correlation id; only for ops that have one."""
    found: dict[int, list[Any]] = {}
    for event in result.events():
        try:
            values = _torch.concrete_inputs(event)
        except RuntimeError:
            return found
        if values is None:  # a torch that records none (said in the profile's meta)
            return found
        if values and any(isinstance(v, list) for v in values):
            found[event.correlation_id()] = list(values)
    return found


def _input(value: Any) -> Any:
    """A recorded input as a record: tensor metadata becomes a :class:`TensorInput`."""
    if isinstance(value, list):
        return [_input(v) for v in value]
    sizes = getattr(value, "sizes", None)
    if sizes is not None:
        return TensorInput(tuple(sizes), value.dtype, value.device)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return None


class _Reader:
    def __init__(self, deep: bool, detail: bool, stacks: bool) -> None:
        self.deep = deep
        self.detail = detail
        self.stacks = stacks
        self.inputs: dict[int, Any] = {}  # recorded tensor metadata read once per object

    def ranges(self, events: list[Any], frames: tuple[str, ...]) -> list[Range]:
        out: list[Range] = []
        for event in events:
            tag = event.tag
            if tag == _TORCH_OP:
                out.append(self.op(event, frames))
            elif tag == _ALLOCATION:
                out.append(self.allocation(event))
            elif tag in _PYTHON:
                inner = frames
                if self.stacks and tag == _PY_CALL:
                    frame = user_frame(event.name)
                    if frame is not None:
                        inner = (frame, *frames)
                out.extend(self.ranges(event.children, inner))
            # Kineto's own host events (launches) and any other kind: left out.
        return out

    def op(self, event: Any, frames: tuple[str, ...]) -> Range:
        name = event.name
        ef = event.extra_fields
        fields = RangeFields(
            sequence_number=getattr(ef, "sequence_number", -1),
            scope=USER_SCOPE if getattr(ef, "scope", None) == _USER else None,
        )
        if self.detail:
            fields.inputs = [_input(v) for v in getattr(ef, "inputs", ())]
        rng = Range(
            name, event.start_time_ns, event.end_time_ns, event.start_tid, event.correlation_id,
            extra_fields=fields, overload_name=getattr(event, "overload_name", "") or "",
            stack=frames if self.stacks else None,
        )
        if self.deep or "::" not in name or not op_like(name):
            rng.children = self.ranges(event.children, frames)
        return rng

    def allocation(self, event: Any) -> Range:
        ef = event.extra_fields
        device = getattr(ef, "device", None)
        t = event.start_time_ns
        return Range(
            MEMORY, t, event.end_time_ns, event.start_tid, 0,
            extra_fields=RangeFields(
                ptr=ef.ptr, alloc_size=ef.alloc_size, allocation_id=ef.allocation_id,
                total_allocated=ef.total_allocated, total_reserved=ef.total_reserved,
                device=None if device is None else str(device.type),
            ),
        )


def read_window(
    result: Any, *, has_device: bool, detail: bool, notes: list[list[tuple[Any, ...]]] | None = None,
    with_stack: bool = False,
) -> WindowCapture:
    """A stopped profiler's result as a :class:`WindowCapture`: every thread's root op
    ranges (the roots of torch's event tree that are ops, Python frames seen through),
    the device work, and with ``detail`` the notes and concrete inputs."""
    reader = _Reader(deep=has_device or detail, detail=detail, stacks=with_stack and detail)
    roots = [r for r in reader.ranges(_torch.event_tree(result), ()) if r.name != MEMORY]
    found = WindowCapture(roots, read_kernels(result) if has_device else [], has_device)
    if detail:
        found.detail = Detail(notes=list(notes or []), concrete=concrete_inputs(result), stacks=reader.stacks or None)
    return found
