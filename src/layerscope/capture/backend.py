"""The seam between the capture assembly (``capture/assembly.py``) and the backends.

A backend records steps (a ``profile`` pass, or a training step of a ``Profiler``)
and hands back one typed event stream per step (``layerscope.model.raw``). Two kinds exist:

- :class:`RecorderSteps` over the dispatch-mode :class:`~layerscope.capture.recorder.Recorder`:
  the *detail* capture (ops with shapes, FLOPs, memory, activations, stacks), or module
  hooks alone (the leanest forward timing);
- :class:`KinetoSteps`: *timed* steps through torch's own profiler, module ranges
  included (``capture/kineto.py``), with nothing Python per op.

A new backend is a new class with these five methods.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Protocol

import torch
from torch import nn

from layerscope.capture.kineto import KinetoWindow, PendingRead, available
from layerscope.capture.recorder import Recorder
from layerscope.convert.align import combined
from layerscope.model.raw import Event, Step
from layerscope.model.runfacts import OpPlacement


class Backend(Protocol):
    """What the assembly drives, one step at a time, for the entry points."""

    @property
    def has_device_time(self) -> bool:
        """Whether its streams carry device (accelerator) time."""

    def begin_step(self) -> None:
        """Start recording a step (starting the capture first if it is not running)."""

    def end_step(self) -> None:
        """Finish the running step."""

    def part(self, kind: str, name: str) -> AbstractContextManager[None]:
        """Mark a part of the step run by layerscope itself (the loss of ``profile``)."""

    def backward(self) -> AbstractContextManager[None]:
        """Around a ``backward()`` that layerscope calls itself."""

    def collect(self) -> list[list[Event]]:
        """Stop capturing; the streams of the steps finished since the last collect."""


class RecorderSteps:
    """Steps recorded by the dispatch-mode recorder: ``detailed`` ones (ops, shapes,
    FLOPs, memory), or module hooks alone. ``steps`` marks each stream's start and end
    (a whole step, whose parts add up to its wall time)."""

    def __init__(self, recorder: Recorder, *, detailed: bool, steps: bool = True) -> None:
        self._recorder = recorder
        self._detailed = detailed
        self._steps = steps
        self._running: ExitStack | None = None
        self._events: list[Event] | None = None
        self._finished: list[list[Event]] = []

    @property
    def has_device_time(self) -> bool:
        return self._recorder.has_device_time

    def begin_step(self) -> None:
        stack = ExitStack()
        self._events = stack.enter_context(self._recorder.step_pass(detailed=self._detailed, steps=self._steps))
        self._running = stack

    def end_step(self) -> None:
        stack, events = self._running, self._events
        self._running = self._events = None
        if stack is None or events is None:
            return
        try:
            stack.close()
        finally:
            # Kept even if closing raised: results already captured are never lost.
            self._finished.append(events)

    def part(self, kind: str, name: str) -> AbstractContextManager[None]:
        return self._recorder.part(kind, name)

    def backward(self) -> AbstractContextManager[None]:
        return self._recorder.backward_ops()

    def collect(self) -> list[list[Event]]:
        self.end_step()
        finished, self._finished = self._finished, []
        return finished


class KinetoSteps:
    """Timed steps through torch's profiler: started at the first step, stopped (and
    read back once) at ``collect``."""

    def __init__(self, window: KinetoWindow, *, steps: bool = True) -> None:
        self._window = window
        self._steps = steps
        self.has_device_time = window.has_device

    def begin_step(self) -> None:
        if not self._window.running:
            self._window.start()
        self._window.begin_step()

    def end_step(self) -> None:
        self._window.end_step()

    def part(self, kind: str, name: str) -> AbstractContextManager[None]:
        return self._window.part(name)

    @contextmanager
    def backward(self) -> Iterator[None]:
        # The profiler sees autograd's engine by itself.
        yield

    @property
    def running(self) -> bool:
        """Whether torch's profiler is recording for it now (a session started)."""
        return self._window.running

    @property
    def autocast(self) -> set[str | None]:
        """The autocast dtype of each forward of the model seen so far (None: off)."""
        return self._window.autocast

    def light(self, light: bool) -> None:
        """Record the next session's steps lightly (times only) or as made (see
        :meth:`KinetoWindow.light`); between sessions only."""
        self._window.light(light)

    def placement(self) -> OpPlacement | None:
        """How the ops of the steps recorded without module hooks were placed, summed over
        the windows read since the last call (a cycle's); None where no step was."""
        placements, self._window.placements = self._window.placements, []
        return combined(placements)

    def collect_later(self) -> PendingRead[list[list[Event]]]:
        """Stop capturing now; the streams of the finished steps when first asked for
        (whole steps only: a block's)."""
        assert self._steps, "only whole steps are read later"
        return self._window.stop_later()

    def collect(self) -> list[list[Event]]:
        streams = self._window.stop()
        if not self._steps:
            # Passes, not whole steps (profile's forward): no step marks, so nothing
            # outside the model becomes a part of a step.
            streams = [[event for event in stream if type(event) is not Step] for stream in streams]
        return streams


# -- the backends the assembly chooses from ---------------------------------------------


def timed_steps(
    modules: list[nn.Module], selected: list[bool], device: torch.device, *, steps: bool = True
) -> Backend | None:
    """Timed steps through torch's profiler, or None where it cannot run (a user's own
    ``torch.profiler`` is already running: only one can)."""
    if not available():
        return None
    index = {id(m): i for i, (m, keep) in enumerate(zip(modules, selected)) if keep}
    return KinetoSteps(KinetoWindow(index, device=device), steps=steps)


def detailed_steps(
    model: nn.Module, modules: list[nn.Module], selected: list[bool], device: torch.device,
    *, state_tensors: list[torch.Tensor], memory: bool, with_stack: bool, steps: bool = True,
    inputs: Sequence[torch.Tensor] = (), hooks: str = "every",
) -> Backend | None:
    """Steps timed *and* detailed by one run of torch's profiler (shapes, overloads and,
    with ``memory``, allocations), or None where it cannot run. ``state_tensors``: the
    model's parameters and buffers (memory live through every step)."""
    if not available():
        return None
    index = {id(m): i for i, (m, keep) in enumerate(zip(modules, selected)) if keep}
    owners: dict[int, tuple[torch.Tensor, int]] = {}
    for i, (m, keep) in enumerate(zip(modules, selected)):
        if keep:
            for p in m.parameters(recurse=False):
                owners.setdefault(id(p), (p, i))
    window = KinetoWindow(
        index, device=device, detail=True, memory=memory, with_stack=with_stack, root=model,
        owners=list(owners.values()), state_tensors=state_tensors, inputs=inputs, hooks=hooks,
    )
    return KinetoSteps(window, steps=steps)
