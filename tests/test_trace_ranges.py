"""What ``traces/ranges.read_ranges`` keeps of a trace's events, on hand-built events:
one object for what repeats, allocations as ranges with their own fields, and of the
Python tracer's frames those a module instance's parent is looked up through."""

from __future__ import annotations

from typing import Any

import torch

from layerscope.traces.modules import instances
from layerscope.traces.ranges import read_ranges


def _op(name: str, ts: int, dur: int, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": 7, "args": args}


def _frame(name: str, ts: int, dur: int, ident: int, parent: int | None) -> dict[str, Any]:
    args = {"Python id": ident, "Python parent id": parent}
    return {"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur, "tid": 7, "args": args}


def test_ops_called_alike_share_their_inputs_and_fields() -> None:
    recorded = {"Input type": ["float", "float"], "Input Dims": [[2, 3], [3, 4]], "Concrete Inputs": ["", ""]}
    events = read_ranges([
        _op("aten::mm", 0, 10, **recorded),
        _op("aten::mm", 20, 10, **recorded),
        _op("aten::mm", 40, 10, **recorded, **{"Sequence number": 5}),
        _op("aten::relu", 60, 10),
    ])
    first, second, numbered, bare = events.roots[7]
    assert first.extra_fields is second.extra_fields
    assert [(t.sizes, t.dtype) for t in first.extra_fields.inputs] == [((2, 3), torch.float32), ((3, 4), torch.float32)]
    assert numbered.extra_fields.sequence_number == 5 and first.extra_fields.sequence_number == -1
    assert numbered.extra_fields.inputs is first.extra_fields.inputs
    assert bare.extra_fields.inputs == [] and bare.extra_fields.sequence_number == -1
    assert first.name is second.name
    assert first.children == [] and first.correlation_id != second.correlation_id


def test_an_allocation_is_a_range_that_is_its_own_fields() -> None:
    memory = {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 5, "tid": 7,
              "args": {"Bytes": 64, "Addr": 1000, "Total Allocated": 64, "Total Reserved": 128, "Device Type": 0}}
    events = read_ranges([_op("aten::empty", 5, 10), memory])
    (op,) = events.roots[7]
    (alloc,) = op.children
    assert alloc.name == "[memory]" and alloc.children == [] and alloc.extra_fields is alloc
    assert (alloc.start_time_ns, alloc.end_time_ns, alloc.start_tid) == (5000, 5000, 7)
    fields = alloc.extra_fields
    assert (fields.ptr, fields.alloc_size, fields.total_allocated, fields.total_reserved, fields.device) == (
        1000, 64, 64, 128, "cpu"
    )
    assert fields.allocation_id != 0 and fields.sequence_number == -1 and list(fields.inputs) == []


def test_the_python_frames_kept_find_each_instance_s_parent() -> None:
    # Model_0 (frame 1) calls helper frames 2 and 3, then Layer_0 (frame 4), which calls
    # itself (frame 6): an instance's parent is looked up from its first call. Frames 10
    # and 11 lead to no module.
    frames = [
        _frame("nn.Module: Model_0", 0, 100, 1, None),
        _frame("model.py(3): forward", 1, 90, 2, 1),
        _frame("model.py(9): helper", 2, 80, 3, 2),
        _frame("nn.Module: Layer_0", 3, 70, 4, 3),
        _frame("layer.py(5): forward", 4, 60, 5, 4),
        _frame("nn.Module: Layer_0", 5, 50, 6, 5),
        _frame("other.py(1): f", 200, 10, 10, None),
        _frame("other.py(2): g", 201, 5, 11, 10),
    ]
    events = read_ranges(frames)
    full = {f["args"]["Python id"]: f["args"]["Python parent id"] for f in frames}
    assert events.has_stack
    assert set(events.python_parent) <= set(full) and 10 not in events.python_parent and 11 not in events.python_parent
    kept = {name: i.parent for name, i in instances(events.modules, events.python_parent).items()}
    assert kept == {name: i.parent for name, i in instances(events.modules, full).items()}
    assert kept == {"Model_0": None, "Layer_0": "Model_0"}
