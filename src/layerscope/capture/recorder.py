"""Where time is measured: module enter/exit hooks and an op-recording dispatch mode.

Two kinds of pass:

- a *timing pass* installs two global module hooks that append an ``Enter`` / ``Exit``
  record (``layerscope.model.raw``) and nothing else, so the measured forward stays close to
  the plain one;
- a *detail pass* also records each module's input/output shapes on its first call
  (a ``ModuleShapes`` record, once per recorder), and enters a ``TorchDispatchMode``
  that times every aten op and keeps its input shapes as plain lists.

Backward work is seen by the same dispatch mode (autograd's engine runs ops under it
too): for each op it notes the autograd node being executed, which ``attribute`` traces back
to the module whose forward created it. A *light* mode does only that, and sees labels
(``record_function`` ranges, which reach the dispatcher as ``profiler::`` ops), without
shapes or FLOPs.

Everything is undone in ``finally`` blocks: the hook handles are removed and the mode
is exited even when the model raises. State lives here, never on the user's modules.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from layerscope.base.errors import ProfilerStateError
from layerscope.capture import _torch
from layerscope.capture._torch import current_autograd_node as _current_node
from layerscope.capture._torch import graph_task_id as _graph_task
from layerscope.capture._torch import next_sequence_nr as _next_seq
from layerscope.capture.inputs import op_input_shapes, shapes_of
from layerscope.capture.memory import StorageTracker, optimizer_hooks, storage_bytes
from layerscope.convert.ranges import label_kind
from layerscope.flops import count_op
from layerscope.model.raw import NO_SEQ, Enter, Event, Exit, LabelEnter, LabelExit, ModuleShapes, Op, Step

Clock = Callable[[], int]

#: Ops returning a tensor made outside the dispatcher (``torch.tensor(...)``): new memory.
_FRESH = frozenset({"aten::lift_fresh", "aten::lift_fresh_copy"})

#: Records that carry a CUDA mark in ``device_t_ns`` until the pass ends.
_MARKED = (Enter, Exit, LabelEnter, LabelExit)

# Models a recorder is attached to right now, by id; nesting two on one model would
# make each see the other's hooks and double-count, so it is refused.
_ACTIVE: dict[int, weakref.ref[nn.Module]] = {}


@contextmanager
def exclusive(model: nn.Module) -> Iterator[None]:
    """Claim ``model`` for one profiler at a time."""
    key = id(model)
    held = _ACTIVE.get(key)
    if held is not None and held() is model:
        raise ProfilerStateError(
            f"a layerscope profiler is already running on this {type(model).__name__}; "
            "profilers cannot be nested on the same model: finish the outer one first"
        )
    _ACTIVE[key] = weakref.ref(model)
    try:
        yield
    finally:
        _ACTIVE.pop(key, None)


class CudaTimer:
    """Device timestamps from CUDA events, resolved after one synchronize at the end.

    Events are recorded on the current stream as the hooks run; nothing synchronizes
    inside a pass, so the run being measured is not serialised by the measuring.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._events: list[torch.cuda.Event] = []

    def mark(self) -> int:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._events.append(event)
        return len(self._events) - 1

    def resolve(self) -> list[int]:
        """Nanoseconds of every mark since the first one."""
        if not self._events:
            return []
        torch.cuda.synchronize(self.device)
        base = self._events[0]
        offsets = [round(base.elapsed_time(e) * 1e6) for e in self._events]
        self._events = []
        return offsets


_SKIPPED_ROOTS = tuple(
    os.path.dirname(module.__file__) + os.sep for module in (torch, sys.modules[__name__.split(".")[0]]) if module.__file__
)


def python_stack() -> tuple[str, ...]:
    """The user's Python frames calling the current op, innermost first, as
    ``"file:line function"`` (frames inside torch and layerscope are left out)."""
    frames = []
    frame: Any = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(_SKIPPED_ROOTS):
            frames.append(f"{code.co_filename}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return tuple(frames)


class _OpMode(_torch.UnwrappedDispatchMode):
    """Times each aten op; with ``record`` also its input shapes, FLOPs, MACs and bytes.

    It also turns ``record_function`` ranges into label events, and tags each op run by
    autograd's engine with the node being executed (see ``layerscope.model.raw``).

    Without torch's dynamo-disable wrapper around ``__torch_dispatch__``, which costs a
    few µs per op, as much as a small op itself: this mode is never compiled (it reads a
    clock and appends to a list), so the wrapper buys nothing.
    """

    def __init__(
        self,
        append: Callable[[Event], None],
        clock: Clock,
        timer: CudaTimer | None,
        *,
        record: bool = True,
        param_owner: dict[int, int] | None = None,
        tracker: StorageTracker | None = None,
        with_stack: bool = False,
    ):
        super().__init__()
        self._with_stack = with_stack
        self._append = append
        self._clock = clock
        self._timer = timer
        self._record = record
        self._param_owner = param_owner or {}
        self._tracker = tracker
        self._names: dict[Any, str] = {}
        self._last_seq: int | None = _next_seq()

    def _name(self, func: Any) -> str:
        name = self._names.get(func)
        if name is None:
            name = self._names[func] = _torch.op_name(func)
        return name

    def _label(self, name: str, func: Any, args: Any, kwargs: Any) -> Any:
        timer = self._timer
        if name.startswith("profiler::_record_function_enter"):
            out = func(*args, **kwargs)
            kind, label = label_kind(str(args[0]))
            mark = timer.mark() if timer is not None else None
            node = _current_node()
            grad = None if node is None else self._node_grad(node)[0]
            self._append(LabelEnter(self._clock(), label, kind, mark, _next_seq(), _graph_task() != -1, grad))
            return out
        mark = timer.mark() if timer is not None else None
        self._append(LabelExit(self._clock(), mark, _next_seq(), _graph_task() != -1))
        return func(*args, **kwargs)

    def _node_grad(self, node: Any) -> tuple[tuple[int, int | None], Any]:
        """``(Op.grad, variable)`` for the autograd node being executed: its number, or
        for a gradient accumulation (no number) the module owning its parameter."""
        seq = _torch.node_sequence_nr(node)
        owner = variable = None
        if seq == NO_SEQ:
            variable = getattr(node, "variable", None)
            owner = self._param_owner.get(id(variable))
        return (seq, owner), variable

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = self._names.get(func) or self._name(func)
        if name.startswith("profiler::_record_function_"):
            return self._label(name, func, args, kwargs)
        node = _current_node()
        grad = None
        tracker = self._tracker
        variable = None
        if node is not None:
            grad, variable = self._node_grad(node)
            if tracker is not None:
                tracker.backward_node(node, _graph_task())
        shapes = op_input_shapes(args) if self._record else None
        timer = self._timer
        mark0 = timer.mark() if timer is not None else None
        # Autograd creates an op's node before the op reaches this mode: if the counter
        # moved since the last op ended, this op's node is the last number taken (the
        # link from the op to its backward work, for flow arrows in the trace).
        fwd_seq = None
        if node is None and self._record:
            now = _next_seq()
            if now is not None and self._last_seq is not None and now > self._last_seq:
                fwd_seq = now - 1
        t0 = self._clock()
        out = func(*args, **kwargs)
        t1 = self._clock()
        if self._record:
            self._last_seq = _next_seq()
        # Until the pass ends, an op's device time is the pair of CUDA marks around it.
        device = (mark0, timer.mark()) if timer is not None else None
        if self._record:
            flops, macs, nbytes = count_op(name, args, kwargs, out)
        else:
            flops = macs = None
            nbytes = 0
        allocs = tracker.allocated(out, args, kwargs, name in _FRESH) if tracker is not None else None
        stack = python_stack() if self._with_stack else None
        self._append(Op(t0, t1, name, shapes, device, flops, macs, nbytes, grad, allocs, stack, fwd_seq))  # type: ignore[arg-type]
        if variable is not None and tracker is not None and grad is not None and grad[1] is not None:
            tracker.gradient(grad[1], variable, out)
        return out


class Recorder:
    """Records module, label and op events for one model, one pass at a time."""

    def __init__(
        self,
        modules: list[nn.Module],
        selected: list[bool],
        *,
        device: torch.device,
        clock: Clock | None = None,
        memory: bool = False,
        with_stack: bool = False,
        inputs: Sequence[torch.Tensor] = (),
    ) -> None:
        self._with_stack = with_stack
        self._index = {id(m): i for i, (m, keep) in enumerate(zip(modules, selected)) if keep}
        self._device = device
        self.memory = memory
        #: Tensors live before each memory pass that are not the model's (profile's inputs).
        self._inputs = list(inputs)
        self._params = [p for m in modules for p in m.parameters(recurse=False)]
        #: The model's parameters and buffers: memory live through every pass.
        self.state_tensors = self._params + [b for m in modules for b in m.buffers(recurse=False)]
        self._tracker: StorageTracker | None = None
        # Gradient accumulation has no sequence number: its work goes to the parameter's owner.
        self._param_owner: dict[int, int] = {}
        for i, (m, keep) in enumerate(zip(modules, selected)):
            if keep:
                for p in m.parameters(recurse=False):
                    self._param_owner.setdefault(id(p), i)
        self._clock: Clock = clock or time.perf_counter_ns
        self._timer = CudaTimer(device) if device.type == "cuda" else None
        #: Modules whose shapes were read (a ``ModuleShapes`` record, once per capture).
        self._shapes_read: set[int] = set()
        self._events: list[Event] | None = None
        self._mode_depth = 0

    @property
    def has_device_time(self) -> bool:
        return self._timer is not None

    # -- hooks ---------------------------------------------------------------------
    def _timing_hooks(self, events: list[Event]) -> tuple[Callable[..., None], Callable[..., None]]:
        index_get = self._index.get
        append = events.append
        clock = self._clock
        timer = self._timer
        seq = _next_seq
        task = _graph_task
        # Global hooks fire for every thread: only the thread that opened the pass, and
        # autograd's engine (a checkpoint recomputing in backward), are recorded. A
        # serving thread calling the same model meanwhile is not this pass's work.
        owner = threading.get_ident()
        get_ident = threading.get_ident
        # The hooks run twice per module call, inside the times they measure: records are
        # made by tuple.__new__, which skips the NamedTuple's Python-level __new__ (half
        # the cost). The fields are the records' own, in their order.
        new = tuple.__new__
        mark = timer.mark if timer is not None else None

        def pre(module: nn.Module, args: Any) -> None:
            i = index_get(id(module))
            if i is not None:
                in_backward = task() != -1
                if in_backward or get_ident() == owner:
                    append(new(Enter, (clock(), i, mark and mark(), seq(), in_backward)))

        def post(module: nn.Module, args: Any, output: Any) -> None:
            i = index_get(id(module))
            if i is not None:
                in_backward = task() != -1
                if in_backward or get_ident() == owner:
                    append(new(Exit, (clock(), i, mark and mark(), seq(), in_backward)))

        return pre, post

    def _detail_post(self, timed_post: Callable[..., None], events: list[Event]) -> Callable[..., None]:
        index_get = self._index.get
        read = self._shapes_read
        owner = threading.get_ident()

        def post(module: nn.Module, args: Any, kwargs: Any, output: Any = None) -> None:
            timed_post(module, args, output)
            i = index_get(id(module))
            if i is None or (threading.get_ident() != owner and _graph_task() == -1):
                return
            tracker = self._tracker
            if tracker is not None and torch.is_grad_enabled():
                tracker.module_output(output)
            if i not in read:
                read.add(i)
                inputs = shapes_of(list(args))
                if kwargs:
                    inputs.append(shapes_of(kwargs))
                events.append(ModuleShapes(i, inputs, shapes_of(output)))

        return post

    def _mode(self, events: list[Event], *, record: bool) -> _OpMode:
        return _OpMode(
            events.append,
            self._clock,
            self._timer,
            record=record,
            param_owner=self._param_owner,
            tracker=self._tracker if record else None,
            with_stack=self._with_stack and record,
        )

    def _start_memory(self, stack: ExitStack, events: list[Event]) -> None:
        """Track storages for this pass: what is live already, then every op's."""
        tracker = StorageTracker(events.append, self._clock, self._device)
        self._tracker = tracker
        stack.callback(setattr, self, "_tracker", None)
        stack.callback(tracker.close)
        tracker.begin(_next_seq())
        tracker.constant(storage_bytes(self.state_tensors), "parameters")
        tracker.adopt((p.grad for p in self._params if p.grad is not None), "gradients", since_start=True)
        tracker.adopt(self._inputs, "other", since_start=True)
        optimizer_hooks(stack, tracker.optimizer_pre, tracker.optimizer_post)

    @contextmanager
    def _pass(self, detailed: bool, *, steps: bool = False) -> Iterator[list[Event]]:
        events: list[Event] = []
        pre, post = self._timing_hooks(events)
        if detailed:
            post = self._detail_post(post, events)
        outer_events = self._events
        with ExitStack() as stack:
            self._events = events
            stack.callback(setattr, self, "_events", outer_events)
            pre_handle = nn_module.register_module_forward_pre_hook(pre)
            stack.callback(pre_handle.remove)
            # always_call so a forward that raises still closes its frame; with_kwargs
            # (detail passes only: it costs time) so keyword inputs' shapes are seen.
            post_handle = nn_module.register_module_forward_hook(post, with_kwargs=detailed, always_call=True)
            stack.callback(post_handle.remove)
            if detailed:
                # torch sets the with_kwargs flag outside the handle, so remove() leaves
                # it behind in the global table: take it out ourselves.
                _torch.forget_hook_kwargs_flag(stack, post_handle)
            if steps:
                events.append(Step(self._clock()))
            if detailed and self.memory:
                self._start_memory(stack, events)
            if detailed:
                stack.enter_context(self._mode(events, record=True))
                self._mode_depth += 1
                stack.callback(self._leave_mode)
            try:
                yield events
            finally:
                # Keep what was captured even if the pass raised: results are never lost.
                stack.close()
                if steps:
                    events.append(Step(self._clock()))
                self._resolve_device(events)

    def _leave_mode(self) -> None:
        self._mode_depth -= 1

    @contextmanager
    def backward_ops(self) -> Iterator[None]:
        """See backward work (and labels) in a timing pass: a light op mode, unless the
        pass already runs the full one."""
        if self._mode_depth or self._events is None:
            yield
            return
        self._mode_depth += 1
        try:
            with self._mode(self._events, record=False):
                yield
        finally:
            self._mode_depth -= 1

    @contextmanager
    def part(self, kind: str, name: str) -> Iterator[None]:
        """Mark a part of the step run by layerscope itself (the loss of ``profile``)."""
        events = self._events
        if events is None:
            yield
            return
        timer = self._timer
        mark = timer.mark if timer is not None else None
        events.append(LabelEnter(self._clock(), name, kind, mark and mark(), _next_seq(), _graph_task() != -1))
        try:
            yield
        finally:
            events.append(LabelExit(self._clock(), mark and mark(), _next_seq(), _graph_task() != -1))

    def _resolve_device(self, events: list[Event]) -> None:
        """Turn the CUDA marks the pass recorded into nanosecond offsets."""
        if self._timer is None:
            return
        offsets = self._timer.resolve()

        def at(mark: int | None) -> int | None:
            return None if mark is None else offsets[mark]

        for n, event in enumerate(events):
            if type(event) is Op:
                start, end = event.device_time_ns  # type: ignore[misc]  # the marks until now
                events[n] = event._replace(device_time_ns=max(0, offsets[end] - offsets[start]))
            elif type(event) in _MARKED:
                events[n] = event._replace(device_t_ns=at(event.device_t_ns))  # type: ignore[union-attr]

    @contextmanager
    def warm_detail_pass(self) -> Iterator[None]:
        """An unrecorded detail pass: the first ops under a dispatch mode run several
        times slower than later ones, so a warm-up pass takes that cost instead."""
        read = self._shapes_read
        self._shapes_read = set()  # its events are dropped, its shapes with them
        try:
            with self._pass(detailed=True):
                yield
        finally:
            self._shapes_read = read

    @contextmanager
    def step_pass(self, *, detailed: bool, steps: bool = True) -> Iterator[list[Event]]:
        """One pass or training step: its events (``steps`` marks it as a whole step)."""
        with self._pass(detailed=detailed, steps=steps) as events:
            yield events
