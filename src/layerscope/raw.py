"""The raw capture: what the capture layer recorded, before any tree exists.

Plain data only (ints, strings, lists), so a capture can be built by hand in tests, kept,
or serialised, and ``layerscope.attribute`` derives the tree from it without torch.

An event stream is a list of tuples, one of:

- ``(ENTER, t_ns, module_index, device_t_ns, seq, in_backward)``
- ``(EXIT, t_ns, module_index, device_t_ns, seq, in_backward)``
- ``(OP, t0_ns, t1_ns, op_name, input_shapes, device_time_ns, flops, macs, bytes, grad, allocs[, stack])``
- ``(LABEL_ENTER, t_ns, name, kind, device_t_ns, seq, in_backward)``
- ``(LABEL_EXIT, t_ns, device_t_ns, seq, in_backward)``
- ``(STEP, t_ns)``: the first and last events of a pass or training step

With memory tracking, also:

- ``(FREE, t_ns, serial)``: a tracked storage was freed
- ``(SAVED, serial)``: autograd saved storage ``serial`` for backward (an activation)
- ``(GRAD, t_ns, owner, nbytes, serial)``: a gradient of ``nbytes`` was written for a
  parameter of module ``owner``; ``serial`` is the gradient's storage (None if untracked)
- ``(ADOPT, t_ns, serial, nbytes, category, since_start)``: memory that was live before
  it was seen (parameters, existing gradients, optimizer state, inputs); ``serial`` is
  None for memory that is not tracked further; ``since_start`` says it was live from the
  first event of the pass on
- ``(OPTIM, t_ns, name, state_bytes_by_key, ident)``: an optimizer's state after its
  step (``ident`` tells two optimizers of one class apart)
- ``(DEVICE_MEM, allocated_peak_bytes, reserved_at_peak_bytes)``: the accelerator's
  caching allocator at its highest point of the pass, sampled after each op

``seq`` is autograd's sequence number when the event happened: the autograd nodes a
module's forward creates have numbers in ``[seq at ENTER, seq at EXIT)``, which is how
backward work is traced back to the module that caused it. ``in_backward`` is true when
the event happened while autograd's engine ran (a checkpointed module recomputing).

``grad`` is None for an op run in forward; in backward it is ``(node_seq, owner)``: the
sequence number of the autograd node being executed, and for a node that accumulates a
parameter's gradient (which has no sequence number) the index of the module owning the
parameter. Label kinds are ``label`` (``record_function``/``layerscope.label``),
``optimizer``, ``zero_grad`` and ``loss``.

``allocs`` lists ``(serial, nbytes)`` for each storage the op allocated (its outputs'
storages that were neither inputs nor already tracked); storages are numbered by a
``serial`` unique within the pass, and counted at their full size, once, however many
views share them.

``input_shapes`` holds one shape per tensor argument (a tuple of ints, ``torch.Size``
as captured, or a list), nested for a list of tensors.

``stack`` (only with ``with_stack``) is the user's Python frames calling the op,
innermost first, as ``"file:line function"`` strings.

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
FREE = 6
SAVED = 7
GRAD = 8
ADOPT = 9
OPTIM = 10
DEVICE_MEM = 11

#: Memory categories of the live bytes at the step's peak.
MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")

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
    #: Model-level memory known without running it: bytes by dtype of parameters and buffers.
    memory_static: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
