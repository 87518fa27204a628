"""torch.profiler's names on layerscope's ``Profiler`` block: ``layerscope.Profiler`` is
this module's :class:`Profiler`, the block (``layerscope.block.Profiler``) with
torch.profiler's arguments and reading calls added.

Change the import, keep the code::

    # from torch.profiler import profile
    from layerscope import Profiler as profile

    with profile(model, activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        model(inputs)
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10))
    prof.export_chrome_trace("trace.json")
    prof.export_stacks("stacks.txt", "self_cpu_time_total")   # flamegraph.pl input

The only other change: the model is the Profiler's first argument (it profiles a model,
module by module). ``schedule=torch.profiler.schedule(...)``, ``on_trace_ready``,
``step()`` and ``step_num`` work as in torch; ``activities``, ``record_shapes``,
``profile_memory`` and ``with_stack`` are accepted with their meanings (see
:class:`Profiler`). Everything reads the one profile the block built.

Differences (docs/migrating.md): ops are the aten ops seen below autograd (no nesting,
so an op's total equals its self time), ``record_function`` ranges are nodes of the tree
rather than rows of the table, ``group_by_stack_n`` is not capped at 5, and
``export_stacks`` writes the module tree's stacks, which work (torch's own come out
empty or malformed: pytorch#100253, #73556).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from layerscope import block
from layerscope.base.schedule import Schedule, schedule
from layerscope.compat.op_records import EventList, OpEvent
from layerscope.model.ops import TORCH_SORT_KEYS, OpTableError
from layerscope.model.tree import Profile

if TYPE_CHECKING:
    from torch import nn

    from layerscope.capture.recorder import Clock

#: ``ProfilerActivity`` names layerscope knows. CPU time is always measured; device time
#: whenever the model runs on a GPU.
ACTIVITIES = frozenset({"CPU", "CUDA", "XPU", "MTIA", "HPU", "PrivateUse1"})

#: ``export_stacks`` metrics and the folded renderer's metric each one is.
STACK_METRICS = {
    "self_cpu_time_total": "time",
    "self_cuda_time_total": "device_time",
    "self_device_time_total": "device_time",
}


def as_schedule(value: Callable[[int], Any] | None) -> Callable[[int], Any] | None:
    """A ``torch.profiler.schedule(...)`` as the same :class:`~layerscope.base.schedule.Schedule`
    (same steps, and a readable ``meta.schedule``); any other callable as it is (its
    actions are read by name)."""
    if value is None or isinstance(value, Schedule) or not str(getattr(value, "__module__", "")).startswith("torch."):
        return value
    from layerscope.capture import _torch

    settings = _torch.schedule_settings(value)
    if settings is None:
        return value  # a variant layerscope's schedule cannot express: ask it step by step
    return schedule(**settings)


def _activity_names(activities: Iterable[Any]) -> list[str]:
    names = []
    for activity in activities:
        name = getattr(activity, "name", activity)
        if not isinstance(name, str) or name not in ACTIVITIES:
            raise ValueError(f"unknown profiler activity {activity!r}; expected torch.profiler.ProfilerActivity members")
        names.append(name)
    return names


def _on_device(profile: Profile) -> bool:
    return str(profile.meta.device or "cpu").startswith("cuda")


class KeyAverages(EventList):
    """``key_averages()``: one :class:`~layerscope.compat.op_records.OpEvent` per op name
    (and input shapes, and stack), from ``Profile.ops()``; ``table(sort_by=...,
    row_limit=...)`` takes torch's sort keys and sorts through ``Profile.ops()`` too."""

    def __init__(self, profile: Profile, group_by: tuple[str, ...]) -> None:
        self.profile = profile
        self.group_by = group_by
        super().__init__(self._events(None))
        ops = [op for node in profile.nodes() for op in node.ops]
        self.times_known = not ops or any(op.cpu_time_ns is not None for op in ops)

    def _events(self, sort_by: str | None) -> list[OpEvent]:
        on_device = _on_device(self.profile)
        rows = self.profile.ops(sort_by=sort_by, group_by=self.group_by).rows
        return [OpEvent.from_row(row, on_device=on_device) for row in rows]

    def _ordered(self, sort_by: str | None) -> tuple[list[OpEvent], list[str]]:
        """Sorted by ``Profile.ops()`` for torch's sort keys (``cpu_time_total``,
        ``self_cpu_time_total``, ``cuda_time_total``, ``self_cuda_time_total``,
        ``cpu_memory_usage``, ``self_cpu_memory_usage``, ``count``, ...); any other
        attribute (an average) on the events themselves. A key this profile has no
        figures for (CUDA time on the CPU) keeps the default order and says so."""
        compiled = [] if self.profile.compiled is None else [
            "(a compiled model's ops ran fused into its kernels and have no times of their own: their times are "
            "not measured (?); prof.render(\"kernels\") times each kernel call)"
        ]
        if self.profile.figures.detailed_steps:
            compiled = [
                "(these ops are the block's detailed step's, whose times were not kept, and the modules' times are "
                "the light steps': their times are not measured (?); Profiler(detail='every') times every op)"
            ]
        if sort_by is not None and sort_by not in TORCH_SORT_KEYS:
            events, notes = super()._ordered(sort_by)
            return events, [*notes, *compiled]
        try:
            return self._events(sort_by), compiled
        except OpTableError as exc:
            return list(self), [f"({str(exc).split(';')[0]}; rows in the default order, by self CPU time)", *compiled]


def key_averages(profile: Profile, group_by_input_shape: bool = False, group_by_stack_n: int = 0) -> KeyAverages:
    """The profile's ops averaged by name, like ``torch.profiler``'s ``key_averages``:
    also by input shapes with ``group_by_input_shape``, and by the innermost
    ``group_by_stack_n`` frames of their Python stack (any number; needs
    ``with_stack=True``)."""
    group_by: tuple[str, ...] = ("name",)
    if group_by_input_shape:
        group_by += ("shape",)
    if group_by_stack_n:
        group_by += (f"stack:{group_by_stack_n}",)
    return KeyAverages(profile, group_by)


def export_chrome_trace(profile: Profile, path: str | os.PathLike[str]) -> None:
    """The profile's trace (its last step) as a Chrome trace, for Perfetto or
    ``chrome://tracing``."""
    profile.save(os.fspath(path), fmt="chrome")


def export_stacks(profile: Profile, path: str | os.PathLike[str], metric: str = "self_cpu_time_total") -> None:
    """Folded stacks for ``flamegraph.pl`` (``frame;frame;leaf VALUE`` lines, whole
    microseconds of ``metric``): the module tree down to each aten op."""
    try:
        chosen = STACK_METRICS[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r}; expected one of: {', '.join(STACK_METRICS)}") from None
    profile.save(os.fspath(path), fmt="folded", metric=chosen)


class Profiler(block.Profiler):
    """layerscope's ``Profiler`` block (:class:`layerscope.block.Profiler`: its arguments
    and its reading of the profile) that also answers to torch.profiler's names, so the
    torch.profiler recipe runs with the import changed and the model given first.

    torch.profiler's arguments, with their meanings here:

    - ``profile_memory`` sets ``memory`` when given (torch's default leaves it off; here
      memory is tracked unless asked not to).
    - ``schedule`` may be ``torch.profiler.schedule(...)`` (:func:`as_schedule`).
    - ``on_trace_ready(profiler)`` is called where ``on_ready(profile)`` would be, with the
      Profiler itself, as torch calls it: ``p.key_averages()``, ``p.step_num`` and
      ``p.export_chrome_trace(...)`` read the cycle just delivered.
    - ``activities`` are checked: CPU time is always measured, device time whenever the
      model runs on a GPU.
    - ``record_shapes`` changes nothing: input shapes are always recorded (torch's
      profiler keeps them as plain lists, never the tensors).

    and its reading calls: ``key_averages``, ``export_chrome_trace``, ``export_stacks``
    and ``step_num``.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        paths: Sequence[str] | None = None,
        record_ops: bool = True,
        memory: bool = True,
        with_stack: bool = False,
        clock: Clock | None = None,
        schedule: Callable[[int], Any] | None = None,
        on_ready: Callable[[Profile], Any] | None = None,
        activities: Iterable[Any] | None = None,
        record_shapes: bool | None = None,
        profile_memory: bool | None = None,
        on_trace_ready: Callable[[Profiler], Any] | None = None,
        peak_tflops: float | None = None,
        detail: str = "every",
        hooks: str | None = None,
    ) -> None:
        del record_shapes  # shapes are always recorded
        if activities is not None:
            _activity_names(activities)
        if profile_memory is not None:
            memory = bool(profile_memory)
        if on_trace_ready is not None:
            if on_ready is not None:
                raise TypeError("give on_ready or on_trace_ready (torch.profiler's name), not both")
            if not callable(on_trace_ready):
                raise TypeError(f"on_trace_ready must be a callable taking the profiler, got {on_trace_ready!r}")
            handler = on_trace_ready

            def hand_over(profile: Profile) -> Any:
                return handler(self)  # torch hands its handler the profiler, which reads `profile`

            on_ready = hand_over
        super().__init__(
            model, paths=paths, record_ops=record_ops, memory=memory, with_stack=with_stack, clock=clock,
            schedule=as_schedule(schedule), on_ready=on_ready, peak_tflops=peak_tflops, detail=detail, hooks=hooks,
        )

    @property
    def step_num(self) -> int:
        """How many steps ``step()`` has ended (torch.profiler's name)."""
        return self._step

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0) -> KeyAverages:
        """The ops averaged by name (and shapes, and stack), printed by ``.table(sort_by=...)``:
        :func:`key_averages` of the profile."""
        return key_averages(self.profile, group_by_input_shape, group_by_stack_n)

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """The Chrome trace of the profile (its last step): :func:`export_chrome_trace`."""
        export_chrome_trace(self.profile, path)

    def export_stacks(self, path: str | os.PathLike[str], metric: str = "self_cpu_time_total") -> None:
        """Folded stacks for flamegraph.pl, in whole microseconds of ``metric``: :func:`export_stacks`."""
        export_stacks(self.profile, path, metric)

