"""The steps of one schedule cycle of a ``Profiler`` block, folded as they are read.
Pure: no torch.

Each recorded step's event stream is walked and added to running totals at once
(:class:`~layerscope.attribute.combine.Accumulator`), so a long run keeps no raw events;
warm-up steps are dropped, and so is the step left open after the last ``step()`` call
when it ran nothing. Every step's figures are its own: times and detail come from the
same run, and nothing measured in one step stands for another. A block that details
only a cycle's first step (``detail="first"``) folds its other steps, timed lightly,
apart (``light``), and its profile takes each figure from the steps that measured it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from layerscope.attribute.combine import Accumulator
from layerscope.attribute.profile import build_from_light_steps, build_from_steps
from layerscope.attribute.walk import merge_shapes, shapes_in, walk_pass
from layerscope.model.raw import Enter, Event, ModuleInfo, Op, RawCapture
from layerscope.model.tree import Profile


def has_work(events: Sequence[Event]) -> bool:
    """Whether a step did anything (the step left open after the last ``step()`` did not)."""
    return any(isinstance(event, (Enter, Op)) for event in events)


class Cycle:
    """One cycle's recorded steps: ``add`` each as it is read, ``build`` the profile."""

    def __init__(
        self, modules: list[ModuleInfo], parents: list[int | None], *, collect_ops: bool,
        module_shapes: dict[int, tuple[Any, Any]] | None = None,
    ) -> None:
        self._modules = modules
        self._paths = [info.path for info in modules]
        self._parents = parents
        self._collect_ops = collect_ops
        #: The steps recorded in detail (every step, unless the block details only some).
        self.steps = Accumulator()
        #: The steps timed lightly (times only: no shapes, memory or op detail).
        self.light = Accumulator()
        #: Each module's shapes are read once per capture: a later cycle starts with those
        #: its block read before (``module_shapes``, see :meth:`next`).
        self.steps.total.module_shapes.update(module_shapes or {})
        #: The first and last step numbers recorded in the cycle.
        self.first: int | None = None
        self.last: int | None = None

    @property
    def empty(self) -> bool:
        return not (self.steps.steps or self.light.steps)

    @property
    def detailed(self) -> bool:
        """Whether a step was folded in with its detail."""
        return bool(self.steps.steps)

    def add(
        self, events: list[Event], number: int, *, warmup: bool, keep_empty: bool, has_device: bool,
        light: bool = False,
    ) -> None:
        """Fold step ``number`` in, unless it is a warm-up step or ran nothing
        (``keep_empty``: a block's only step is kept even so); a ``light`` step (timed
        lightly) gives its times only."""
        if warmup or not (has_work(events) or keep_empty):
            # Not walked, but a module's shapes may have been read in it (they are, once).
            merge_shapes(self.steps.total.module_shapes, shapes_in(events))
            return
        collect_ops = self._collect_ops and not light
        result = walk_pass(events, self._paths, has_device=has_device, collect_ops=collect_ops, parents=self._parents)
        (self.light if light else self.steps).add(result, number)
        self.first = number if self.first is None else min(self.first, number)
        self.last = number if self.last is None else max(self.last, number)

    def next(self) -> Cycle:
        """The block's next cycle: no step yet, the module shapes read so far."""
        return Cycle(
            self._modules, self._parents, collect_ops=self._collect_ops, module_shapes=self.steps.total.module_shapes
        )

    def build(self, raw: RawCapture) -> Profile:
        """The cycle's profile; ``raw`` holds the model's modules, static facts and meta."""
        if self.light.steps and self.steps.steps:
            return build_from_light_steps(raw, self.steps, self.light)
        only = self.steps if self.steps.steps else self.light
        return build_from_steps(raw, only, counted=self._collect_ops and only is self.steps)
