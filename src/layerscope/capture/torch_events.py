"""The live adapter: torch's profiler result (its event tree and its flat Kineto events)
turned into layerscope's own records (``convert/ranges.py``), once, when a window
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
  left out of the tree (their time is inside the op that called them), and what torch
  nested in them (by time: a module range that began inside a runtime call's span)
  counts as nested in their parent.
- **Python frames** (``with_stack``) are see-through: their ranges count as nested
  directly, and each op keeps the user's frames around it (``Range.stack``).
- **Pruning.** Without a device and without detail, the conversion never reads below a
  namespaced op (``aten::mm``: it runs no module), so those subtrees are not copied.
  With detail, the ops nested in a leaf op (a dispatcher op that is not a composite:
  one row) keep their kernels and allocations but not their inputs, and concrete inputs
  are read only for ops that have an int list among their inputs.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import torch

from layerscope.capture import _torch
from layerscope.convert.ranges import (
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
from layerscope.flops import recorded

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


def read_flat(result: Any, *, kernels: bool, wanted: set[int]) -> tuple[list[KernelSpan], dict[int, list[Any]]]:
    """One pass over torch's flat events: with ``kernels`` the device work (kernels,
    memcpys, memsets), each with the op that launched it (0 when none is known), and
    the concrete inputs (int lists, which the event tree does not hold) of the ops in
    ``wanted`` (by correlation id) that have any."""
    cpu = _torch.CPU_DEVICE
    found: list[KernelSpan] = []
    concrete: dict[int, list[Any]] = {}
    asking = bool(wanted)
    if not kernels and not asking:
        return found, concrete
    for e in result.events():
        if kernels and e.device_type() != cpu:
            if not e.is_user_annotation():
                name = e.name()
                if name != MEMORY:
                    found.append(KernelSpan(
                        max(0, e.linked_correlation_id()), e.start_ns(), e.end_ns(), name, e.device_resource_id()
                    ))
            continue
        if not asking:
            if not kernels:
                break
            continue
        # Every call into an event costs: the id first (most events are not wanted).
        correlation = e.correlation_id()
        if correlation not in wanted or (not kernels and e.device_type() != cpu):
            continue
        try:
            values = _torch.concrete_inputs(e)
        except RuntimeError:
            values = None
        if values is None:  # a torch that records none (said in the profile's meta)
            asking = False
        elif any(isinstance(v, list) for v in values):
            concrete[correlation] = list(values)
    return found, concrete


def _input(value: Any) -> Any:
    """A recorded input as a record: tensor metadata becomes a :class:`TensorInput`."""
    if isinstance(value, list):
        return [_input(v) for v in value]
    sizes = getattr(value, "sizes", None)
    if sizes is not None:
        return TensorInput(tuple(sizes), value.dtype, value.device, getattr(value, "allocation_id", None))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return None


class _Reader:
    def __init__(self, deep: bool, detail: bool, stacks: bool, kernels: bool) -> None:
        self.deep = deep
        #: Whether device work is read (by the correlation id of the op that launched it).
        self.kernels = kernels
        self.detail = detail
        self.stacks = stacks
        #: Ops whose concrete inputs are to be read (an int list among their inputs).
        self.wanted: set[int] = set()

    def ranges(self, events: list[Any], frames: tuple[str, ...], in_leaf: bool = False) -> list[Range]:
        out: list[Range] = []
        for event in events:
            tag = event.tag
            if tag == _TORCH_OP:
                out.append(self.op(event, frames, in_leaf))
            elif tag == _ALLOCATION:
                out.append(self.allocation(event))
            elif tag in _PYTHON:
                inner = frames
                if self.stacks and tag == _PY_CALL:
                    frame = user_frame(event.name)
                    if frame is not None:
                        inner = (frame, *frames)
                out.extend(self.ranges(event.children, inner, in_leaf))
            elif event.children:
                # Kineto's own host events (a launch, a runtime call) are left out, but
                # not what torch's tree nests in them: it nests by time, and a module's
                # range can begin inside a runtime call's span on the host.
                out.extend(self.ranges(event.children, frames, in_leaf))
        return out

    def op(self, event: Any, frames: tuple[str, ...], in_leaf: bool) -> Range:
        name = event.name
        if in_leaf:
            # Inside a leaf op the conversion reads only the nested ops' kernels (by
            # correlation id) and allocations: no fields, overload or thread.
            rng = Range(name, event.start_time_ns, event.end_time_ns, 0, event.correlation_id)
            rng.children = self.ranges(event.children, frames, True)
            return rng
        ef = event.extra_fields
        fields = RangeFields(
            sequence_number=getattr(ef, "sequence_number", -1),
            scope=USER_SCOPE if getattr(ef, "scope", None) == _USER else None,
        )
        overload = getattr(event, "overload_name", "") or ""
        correlation = event.correlation_id
        if self.detail and not in_leaf:
            inputs = fields.inputs = [_input(v) for v in getattr(ef, "inputs", ())]
            if None in inputs:  # an int list, recorded only among the concrete inputs
                self.wanted.add(correlation)
        rng = Range(
            name, event.start_time_ns, event.end_time_ns, event.start_tid, correlation,
            extra_fields=fields, overload_name=overload, stack=frames if self.stacks else None,
        )
        if self.deep or "::" not in name or not op_like(name):
            leaf = in_leaf or (self.detail and _leaf(name, overload))
            if leaf and not self.kernels:
                # Without device work a leaf's nested ops are read for their
                # allocations alone: those, in the order they happened, are its children.
                rng.children = self.allocations(event.children, [])
            else:
                rng.children = self.ranges(event.children, frames, leaf)
        return rng

    def allocations(self, events: list[Any], out: list[Range]) -> list[Range]:
        """The allocations under ``events``, depth first (in the order they happened)."""
        for event in events:
            if event.tag == _ALLOCATION:
                out.append(self.allocation(event))
            else:
                children = event.children
                if children:
                    self.allocations(children, out)
        return out

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
    reader = _Reader(deep=has_device or detail, detail=detail, stacks=with_stack and detail, kernels=has_device)
    roots = [r for r in reader.ranges(_torch.event_tree(result), ()) if r.name != MEMORY]
    kernels, concrete = read_flat(result, kernels=has_device, wanted=reader.wanted)
    found = WindowCapture(roots, kernels, has_device)
    if detail:
        found.detail = Detail(notes=list(notes or []), concrete=concrete, stacks=reader.stacks or None)
    return found


def _leaf(name: str, overload: str) -> bool:
    """Whether the conversion reads an op as one row, never the ops nested in it: a
    dispatcher op that is not a composite. Inside one only the nested ops' kernels and
    allocations are read, so their inputs are not copied."""
    return "::" in name and recorded.is_dispatcher_op(name) and not recorded.is_composite(name, overload)


# -- recording torch's events as the adapter reads them, and replaying them --------------
#
# A recorded result holds exactly the fields :func:`read_window` reads, of every event it
# looks at: the event tree (each node's kind, name, times, thread, correlation id,
# overload and kind's fields; Python frames and Kineto's launches included, so the
# adapter's own choices are replayed too), and the flat events that are not the CPU's
# (kernels, copies, memsets, the device's allocations and annotations) or that carry
# concrete inputs. A replayed result answers the same calls with the same values.

RECORD_FORMAT = "layerscope-torch-events/1"


def value_to_json(value: Any) -> Any:
    """A recorded input as JSON: a tensor as ``{"t": sizes, "d": dtype, "v": device}``
    (and ``"a"``, its allocation id, when known); lists as lists; other values as they
    are, or None where JSON has no form for them."""
    if isinstance(value, TensorInput):
        found: dict[str, Any] = {"t": list(value.sizes), "d": str(value.dtype).removeprefix("torch."), "v": str(value.device)}
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


def dump_result(result: Any) -> dict[str, Any]:
    """What :func:`read_window` reads of a profiler result, as JSON-ready lists."""
    cpu = _torch.CPU_DEVICE
    flat: list[list[Any]] = []
    for e in result.events():
        if e.device_type() != cpu:
            flat.append([
                e.device_type().name, bool(e.is_user_annotation()), e.name(), e.linked_correlation_id(),
                e.start_ns(), e.end_ns(), e.device_resource_id(), e.correlation_id(), None,
            ])
            continue
        values = _torch.concrete_inputs(e)
        if values and any(isinstance(v, list) for v in values):
            flat.append(["CPU", False, e.name(), 0, e.start_ns(), e.end_ns(), 0, e.correlation_id(), list(values)])
    return {"format": RECORD_FORMAT, "tree": [_node_out(n) for n in _torch.event_tree(result)], "events": flat}


def _node_out(event: Any) -> list[Any]:
    tag = event.tag
    ef = event.extra_fields
    fields: Any = None
    if tag == _TORCH_OP:
        scope = getattr(ef, "scope", None)
        fields = [getattr(ef, "sequence_number", -1), None if scope is None else scope.name,
                  [value_to_json(_input(v)) for v in getattr(ef, "inputs", ())]]
    elif tag == _ALLOCATION:
        device = getattr(ef, "device", None)
        fields = [ef.ptr, ef.alloc_size, ef.allocation_id, ef.total_allocated, ef.total_reserved,
                  None if device is None else str(device)]
    return [
        tag.name, event.name, event.start_time_ns, event.end_time_ns, event.start_tid, event.correlation_id,
        getattr(event, "overload_name", "") or "", fields, [_node_out(c) for c in event.children],
    ]


class _Node:
    """A replayed node of the event tree: the attributes :func:`read_window` reads."""

    __slots__ = ("children", "correlation_id", "end_time_ns", "extra_fields", "name", "overload_name",
                 "start_tid", "start_time_ns", "tag")

    def __init__(self, item: list[Any], tags: dict[str, Any], scopes: dict[str, Any]) -> None:
        import torch

        tag, self.name, self.start_time_ns, self.end_time_ns, self.start_tid, self.correlation_id, \
            self.overload_name, fields, children = item
        self.tag = tags.get(tag, tag)
        if fields is None:
            self.extra_fields = SimpleNamespace()
        elif tag == "Allocation":
            ptr, size, ident, allocated, reserved, device = fields
            self.extra_fields = SimpleNamespace(
                ptr=ptr, alloc_size=size, allocation_id=ident, total_allocated=allocated, total_reserved=reserved,
                device=None if device is None else torch.device(device),
            )
        else:
            seq, scope, inputs = fields
            self.extra_fields = SimpleNamespace(
                sequence_number=seq, scope=None if scope is None else scopes[scope], inputs=[value_from_json(v) for v in inputs]
            )
        self.children = [_Node(c, tags, scopes) for c in children]


class _Flat:
    """A replayed flat event: the methods :func:`read_window` calls."""

    __slots__ = ("_item", "_kind")

    def __init__(self, item: list[Any], kinds: dict[str, Any]) -> None:
        self._item = item
        self._kind = kinds[item[0]]

    def device_type(self) -> Any:
        return self._kind

    def is_user_annotation(self) -> bool:
        return bool(self._item[1])

    def name(self) -> str:
        return str(self._item[2])

    def linked_correlation_id(self) -> int:
        return int(self._item[3])

    def start_ns(self) -> int:
        return int(self._item[4])

    def end_ns(self) -> int:
        return int(self._item[5])

    def device_resource_id(self) -> int:
        return int(self._item[6])

    def correlation_id(self) -> int:
        return int(self._item[7])

    def concrete_inputs(self) -> list[Any]:
        return list(self._item[8] or [])


class ReplayedResult:
    """A profiler result read back from :func:`dump_result`'s output: it answers
    ``events()`` and ``experimental_event_tree()`` as torch's result did."""

    def __init__(self, data: dict[str, Any]) -> None:
        if data.get("format") != RECORD_FORMAT:
            raise ValueError(f"not recorded torch events: format {data.get('format')!r}, expected {RECORD_FORMAT!r}")
        tags = dict(type(_TORCH_OP).__members__)
        scopes = dict(type(_USER).__members__)
        kinds = dict(type(_torch.CPU_DEVICE).__members__)
        self._tree = [_Node(n, tags, scopes) for n in data["tree"]]
        self._events = [_Flat(e, kinds) for e in data["events"]]

    def events(self) -> list[_Flat]:
        return self._events

    def experimental_event_tree(self) -> list[_Node]:
        return self._tree
