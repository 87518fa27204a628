"""The raw capture: what the capture layer recorded, before any tree exists.

Plain data only (ints, strings, lists), so a capture can be built by hand in tests, kept,
or serialised, and ``layerscope.build`` derives the tree from it without torch.

An event stream is a list of tuples, one of:

- ``(ENTER, t_ns, module_index, device_t_ns)``
- ``(EXIT, t_ns, module_index, device_t_ns)``
- ``(OP, t0_ns, t1_ns, op_name, input_shapes, device_time_ns, flops, macs, bytes)``

``flops``/``macs`` are None for an op with no FLOP formula (unsupported); an event
written without the last three fields counts as an op without FLOP information.

``t_ns`` come from one monotonic host clock; ``device_t_ns`` are offsets on the device
timeline (``None`` when nothing ran on an accelerator).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ENTER = 0
EXIT = 1
OP = 2


@dataclass
class ModuleInfo:
    """A unique module of the profiled model, in ``named_modules()`` order."""

    path: str
    type: str
    parent: str | None
    depth: int
    params: int
    selected: bool = True
    extra_repr: str = ""


@dataclass
class RawCapture:
    """Everything one profiling session recorded.

    ``timing_passes`` are the measured passes (module enter/exit only); ``op_pass`` is
    the stream that also holds op events (it may be one of the timing passes, when the
    run was a single ``Profiler`` block). ``module_shapes`` maps a module index to its
    ``(input_shapes, output_shapes)`` from the first call.
    """

    modules: list[ModuleInfo]
    timing_passes: list[list[tuple[Any, ...]]] = field(default_factory=list)
    op_pass: list[tuple[Any, ...]] | None = None
    module_shapes: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    has_device_time: bool = False
    param_bytes: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
