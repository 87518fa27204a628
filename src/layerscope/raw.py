"""The raw capture: what the capture layer recorded, before any tree exists.

Plain data only (ints, strings, lists), so a capture can be built by hand in tests, kept,
or serialised, and ``layerscope.build`` derives the tree from it without torch.

An event stream is a list of tuples, one of:

- ``(ENTER, t_ns, module_index, device_t_ns, seq, in_backward)``
- ``(EXIT, t_ns, module_index, device_t_ns, seq, in_backward)``
- ``(OP, t0_ns, t1_ns, op_name, input_shapes, device_time_ns, flops, macs, bytes, grad)``
- ``(LABEL_ENTER, t_ns, name, kind, device_t_ns, seq, in_backward)``
- ``(LABEL_EXIT, t_ns, device_t_ns, seq, in_backward)``
- ``(STEP, t_ns)``: the first and last events of a pass or training step

``seq`` is autograd's sequence number when the event happened: the autograd nodes a
module's forward creates have numbers in ``[seq at ENTER, seq at EXIT)``, which is how
backward work is traced back to the module that caused it. ``in_backward`` is true when
the event happened while autograd's engine ran (a checkpointed module recomputing).

``grad`` is None for an op run in forward; in backward it is ``(node_seq, owner)``: the
sequence number of the autograd node being executed, and for a node that accumulates a
parameter's gradient (which has no sequence number) the index of the module owning the
parameter. Label kinds are ``label`` (``record_function``/``layerscope.label``),
``optimizer``, ``zero_grad`` and ``loss``.

``flops``/``macs`` are None for an op with no FLOP formula (unsupported); an event
written without the trailing fields counts as a forward op without FLOP information.

``t_ns`` come from one monotonic host clock; ``device_t_ns`` are offsets on the device
timeline (``None`` when nothing ran on an accelerator).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ENTER = 0
EXIT = 1
OP = 2
LABEL_ENTER = 3
LABEL_EXIT = 4
STEP = 5

#: Autograd's sequence number for nodes that have none (gradient accumulation).
NO_SEQ = 2**64 - 1


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
