"""Op records under torch.profiler's names, for code that reads its events.

``key_averages()`` and torchprof's ``raw()`` hand their users objects with torch's
attribute names (``key``, ``count``, ``self_cpu_time_total``, ``cpu_memory_usage``,
...). :class:`OpEvent` has them, filled from the tree (an ``OpRow`` of ``Profile.ops()``,
or one call of an op in ``Profile.trace``), and :class:`EventList` prints them in torch's
table layout. No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from layerscope.model.ops import OpRow


def _us(ns: int | None) -> float:
    return (ns or 0) / 1000


@dataclass(frozen=True)
class OpEvent:
    """One op, or a group of calls of it, under torch's names.

    NB: torch's names, torch's units: times are float microseconds, memory is bytes
    (None where memory was not tracked). ``*_cuda_*`` names are torch's older aliases of
    the ``*_device_*`` ones.
    """

    key: str
    count: int = 1
    self_cpu_time_total: float = 0.0
    cpu_time_total: float = 0.0
    self_device_time_total: float = 0.0
    device_time_total: float = 0.0
    cpu_memory_usage: int | None = None
    self_cpu_memory_usage: int | None = None
    device_memory_usage: int | None = None
    self_device_memory_usage: int | None = None
    input_shapes: list[Any] = field(default_factory=list)
    stack: list[str] = field(default_factory=list)
    flops: int = 0

    @property
    def name(self) -> str:
        return self.key

    @property
    def cpu_time(self) -> float:
        """Average CPU time per call (µs)."""
        return self.cpu_time_total / self.count if self.count else 0.0

    @property
    def device_time(self) -> float:
        return self.device_time_total / self.count if self.count else 0.0

    @property
    def self_cuda_time_total(self) -> float:
        return self.self_device_time_total

    @property
    def cuda_time_total(self) -> float:
        return self.device_time_total

    @property
    def cuda_time(self) -> float:
        return self.device_time

    @property
    def cuda_memory_usage(self) -> int | None:
        return self.device_memory_usage

    @property
    def self_cuda_memory_usage(self) -> int | None:
        return self.self_device_memory_usage

    @classmethod
    def from_figures(
        cls,
        key: str,
        count: int,
        *,
        self_cpu_ns: int,
        cpu_ns: int,
        self_device_ns: int | None,
        device_ns: int | None,
        alloc_bytes: int | None,
        self_alloc_bytes: int | None,
        on_device: bool,
        input_shapes: list[Any] | None,
        stack: list[str] | None,
        flops: int | None,
    ) -> OpEvent:
        """An event from layerscope's figures (ns, bytes); memory counts on the model's
        device (``on_device``), the other side allocated nothing."""
        tracked = alloc_bytes is not None
        return cls(
            key=key,
            count=count,
            self_cpu_time_total=_us(self_cpu_ns),
            cpu_time_total=_us(cpu_ns),
            self_device_time_total=_us(self_device_ns),
            device_time_total=_us(device_ns),
            cpu_memory_usage=(0 if on_device else alloc_bytes) if tracked else None,
            self_cpu_memory_usage=(0 if on_device else self_alloc_bytes) if tracked else None,
            device_memory_usage=(alloc_bytes if on_device else 0) if tracked else None,
            self_device_memory_usage=(self_alloc_bytes if on_device else 0) if tracked else None,
            input_shapes=list(input_shapes or []),
            stack=list(stack or []),
            flops=flops or 0,
        )

    @classmethod
    def from_row(cls, row: OpRow, *, on_device: bool) -> OpEvent:
        """The event of an op-table row."""
        return cls.from_figures(
            row.name,
            row.calls,
            self_cpu_ns=row.self_cpu_time_ns or 0,  # None: the op has no time (a compiled model's)
            cpu_ns=row.cpu_time_ns or 0,
            self_device_ns=row.self_device_time_ns,
            device_ns=row.device_time_ns,
            alloc_bytes=row.alloc_bytes,
            self_alloc_bytes=row.self_alloc_bytes,
            on_device=on_device,
            input_shapes=row.input_shapes,
            stack=row.stack,
            flops=row.flops,
        )


#: torch's ``sort_by`` names for the attribute they sort on (``cuda`` reads ``device``).
def sort_attribute(sort_by: str) -> str:
    return sort_by.replace("cuda", "device")


class EventList(list[OpEvent]):
    """A list of :class:`OpEvent` that prints as torch.profiler's table."""

    #: Whether the events' times were measured (False: they read 0 as torch's float
    #: fields must, and the table shows ``?``).
    times_known = True

    def __init__(self, events: Iterable[OpEvent] = ()) -> None:
        super().__init__(events)

    def table(
        self,
        sort_by: str | None = None,
        row_limit: int = 100,
        max_src_column_width: int = 75,
        max_name_column_width: int = 55,
        max_shapes_column_width: int = 80,
        header: str | None = None,
        top_level_events_only: bool = False,
    ) -> str:
        """The events in torch's table layout, sorted by the attribute ``sort_by``
        names (descending), the first ``row_limit`` of them. ``top_level_events_only``
        changes nothing: ops here never nest."""
        from layerscope.render.torch_table import format_events

        events, notes = self._ordered(sort_by)
        return format_events(
            events,
            row_limit=row_limit,
            max_src_column_width=max_src_column_width,
            max_name_column_width=max_name_column_width,
            max_shapes_column_width=max_shapes_column_width,
            header=header,
            notes=notes,
            times_known=self.times_known,
        )

    def _ordered(self, sort_by: str | None) -> tuple[list[OpEvent], list[str]]:
        """The events in the order ``sort_by`` asks for, and notes for the table."""
        events: list[OpEvent] = list(self)
        if sort_by is not None:
            attribute = sort_attribute(sort_by)
            if events and not hasattr(events[0], attribute):
                raise AttributeError(f"cannot sort events by {sort_by!r}: an event has no {attribute!r}")
            events.sort(key=lambda event: getattr(event, attribute) or 0, reverse=True)
        return events, []

    def __str__(self) -> str:
        return self.table()
