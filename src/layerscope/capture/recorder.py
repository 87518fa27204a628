"""Where time is measured: module enter/exit hooks and an op-recording dispatch mode.

Two kinds of pass:

- a *timing pass* installs two global module hooks that append ``(kind, clock(),
  index)`` and nothing else, so the measured forward stays close to the plain one;
- a *detail pass* also records each module's input/output shapes on its first call,
  and enters a ``TorchDispatchMode`` that times every aten op and keeps its input
  shapes as plain lists.

Everything is undone in ``finally`` blocks: the hook handles are removed and the mode
is exited even when the model raises. State lives here, never on the user's modules.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module
from torch.utils._python_dispatch import TorchDispatchMode

from layerscope.capture.inputs import op_input_shapes, shapes_of
from layerscope.errors import ProfilerStateError
from layerscope.flops import count_op
from layerscope.raw import ENTER, EXIT, OP

Clock = Callable[[], int]

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


class _OpMode(TorchDispatchMode):
    """Times each aten op and records its name, input shapes, FLOPs, MACs and bytes."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps __torch_dispatch__ in a dynamo-disable guard that costs
        # a few µs per op, as much as a small op itself. This mode is never compiled
        # (it reads a clock and appends to a list), so the guard buys nothing.
        return False

    def __init__(self, append: Callable[[tuple[Any, ...]], None], clock: Clock, timer: CudaTimer | None):
        super().__init__()
        self._append = append
        self._clock = clock
        self._timer = timer
        self._names: dict[Any, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        shapes = op_input_shapes(args)
        timer = self._timer
        mark0 = timer.mark() if timer is not None else None
        t0 = self._clock()
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        t1 = self._clock()
        device = (mark0, timer.mark()) if timer is not None else None
        name = self._names.get(func)
        if name is None:
            name = self._names[func] = func._schema.name
        flops, macs, nbytes = count_op(name, args, kwargs, out)
        self._append((OP, t0, t1, name, shapes, device, flops, macs, nbytes))
        return out


class Recorder:
    """Records module and op events for one model, one pass at a time."""

    def __init__(
        self,
        modules: list[nn.Module],
        selected: list[bool],
        *,
        device: torch.device,
        clock: Clock | None = None,
    ) -> None:
        self._index = {id(m): i for i, (m, keep) in enumerate(zip(modules, selected)) if keep}
        self._clock: Clock = clock or time.perf_counter_ns
        self._timer = CudaTimer(device) if device.type == "cuda" else None
        self.timing_passes: list[list[tuple[Any, ...]]] = []
        self.op_pass: list[tuple[Any, ...]] | None = None
        self.module_shapes: dict[int, tuple[Any, Any]] = {}

    @property
    def has_device_time(self) -> bool:
        return self._timer is not None

    # -- hooks ---------------------------------------------------------------------
    def _timing_hooks(self, events: list[tuple[Any, ...]]) -> tuple[Callable[..., None], Callable[..., None]]:
        index_get = self._index.get
        append = events.append
        clock = self._clock
        timer = self._timer
        if timer is None:

            def pre(module: nn.Module, args: Any) -> None:
                i = index_get(id(module))
                if i is not None:
                    append((ENTER, clock(), i, None))

            def post(module: nn.Module, args: Any, output: Any) -> None:
                i = index_get(id(module))
                if i is not None:
                    append((EXIT, clock(), i, None))

        else:
            mark = timer.mark

            def pre(module: nn.Module, args: Any) -> None:
                i = index_get(id(module))
                if i is not None:
                    append((ENTER, clock(), i, mark()))

            def post(module: nn.Module, args: Any, output: Any) -> None:
                i = index_get(id(module))
                if i is not None:
                    append((EXIT, clock(), i, mark()))

        return pre, post

    def _detail_post(self, timed_post: Callable[..., None]) -> Callable[..., None]:
        index_get = self._index.get
        shapes = self.module_shapes

        def post(module: nn.Module, args: Any, kwargs: Any, output: Any = None) -> None:
            timed_post(module, args, output)
            i = index_get(id(module))
            if i is not None and i not in shapes:
                inputs = shapes_of(list(args))
                if kwargs:
                    inputs.append(shapes_of(kwargs))
                shapes[i] = (inputs, shapes_of(output))

        return post

    @contextmanager
    def _pass(self, detailed: bool) -> Iterator[list[tuple[Any, ...]]]:
        events: list[tuple[Any, ...]] = []
        pre, post = self._timing_hooks(events)
        if detailed:
            post = self._detail_post(post)
        with ExitStack() as stack:
            pre_handle = nn_module.register_module_forward_pre_hook(pre)
            stack.callback(pre_handle.remove)
            # always_call so a forward that raises still closes its frame; with_kwargs
            # (detail passes only: it costs time) so keyword inputs' shapes are seen.
            post_handle = nn_module.register_module_forward_hook(post, with_kwargs=detailed, always_call=True)
            stack.callback(post_handle.remove)
            if detailed:
                # torch sets the with_kwargs flag outside the handle, so remove() leaves
                # it behind in the global table: take it out ourselves.
                flags = getattr(nn_module, "_global_forward_hooks_with_kwargs", None)
                if flags is not None:
                    stack.callback(flags.pop, post_handle.id, None)
            if detailed:
                stack.enter_context(_OpMode(events.append, self._clock, self._timer))
            try:
                yield events
            finally:
                # Keep what was captured even if the pass raised: results are never lost.
                stack.close()
                self._resolve_device(events)

    def _resolve_device(self, events: list[tuple[Any, ...]]) -> None:
        if self._timer is None:
            return
        offsets = self._timer.resolve()
        for n, event in enumerate(events):
            if event[0] == OP:
                start, end = event[5]
                events[n] = (*event[:5], max(0, offsets[end] - offsets[start]), *event[6:])
            else:
                events[n] = (*event[:3], offsets[event[3]])

    @contextmanager
    def warm_detail_pass(self) -> Iterator[None]:
        """An unrecorded detail pass: the first ops under a dispatch mode run several
        times slower than later ones, so a warm-up pass takes that cost instead."""
        shapes = self.module_shapes
        self.module_shapes = {}
        try:
            with self._pass(detailed=True):
                yield
        finally:
            self.module_shapes = shapes

    @contextmanager
    def timing_pass(self) -> Iterator[None]:
        with self._pass(detailed=False) as events:
            try:
                yield
            finally:
                self.timing_passes.append(events)

    @contextmanager
    def detail_pass(self, *, also_timing: bool = False) -> Iterator[None]:
        """A pass that records ops and shapes; ``also_timing`` makes it the timed pass too
        (a ``Profiler`` block runs the user's code once, so it is both)."""
        with self._pass(detailed=True) as events:
            try:
                yield
            finally:
                self.op_pass = events
                if also_timing:
                    self.timing_passes.append(events)
