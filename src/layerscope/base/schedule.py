"""Step schedules: decide, per training step, whether layerscope's Profiler records that step.

A long training run has far more steps than anyone wants to profile. A schedule maps the
0-based step number to an :class:`Action`: skip the step, measure it and throw the
measurement away (warm-up), or measure it and keep it. The last kept step of a cycle is
:attr:`Action.RECORD_AND_SAVE`, the cue to deliver that cycle's profile.

The cycle, and its arithmetic, are the same as ``torch.profiler.schedule`` (torch 2.13) with
``skip_first_wait=0``, so a schedule that works with the torch profiler works here::

    sched = schedule(wait=1, warmup=1, active=2, repeat=1, skip_first=1)
    [sched(step).name for step in range(7)]
    # ['NONE', 'NONE', 'WARMUP', 'RECORD', 'RECORD_AND_SAVE', 'NONE', 'NONE']

This module is pure Python; it does not import torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Action", "Schedule", "schedule"]


class Action(enum.Enum):
    """What to do with one step.

    Same names and values as the schedule actions of ``torch.profiler.ProfilerAction``
    (torch's ``DEVICE_STOPPED``, which its profiler sets internally and a schedule never
    returns, has no counterpart here).
    """

    NONE = 0
    """Idle: the step is not measured."""
    WARMUP = 1
    """Measured, then discarded (lets caches, allocators and autotuners settle)."""
    RECORD = 2
    """Measured and kept."""
    RECORD_AND_SAVE = 3
    """Last active step of a cycle: measured and kept, then the cycle's profile is delivered."""


# Each argument: (lowest allowed value, what it means), for the error messages.
_LIMITS = {
    "wait": (0, "the number of idle steps at the start of each cycle"),
    "warmup": (0, "the number of measured-then-discarded steps per cycle"),
    "active": (1, "the number of measured steps per cycle"),
    "repeat": (0, "the number of cycles, 0 for no limit"),
    "skip_first": (0, "the number of steps skipped before the first cycle"),
}


def _check_arg(name: str, value: object) -> None:
    low, meaning = _LIMITS[name]
    # bool is a subclass of int, but schedule(active=True) is a mistake, not a count.
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"schedule: {name} must be an int >= {low} ({meaning}), got {value!r}")


def _check_step(step: object) -> int:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"schedule: step must be an int >= 0 (a 0-based step number), got {step!r}")
    return step


@dataclass(frozen=True)
class Schedule:
    """Which steps to skip, warm up on, and record.

    Steps are numbered from 0. The first ``skip_first`` steps are skipped (``NONE``); then
    cycles of ``wait + warmup + active`` steps follow, each made of

    - ``wait`` idle steps (``NONE``),
    - ``warmup`` steps measured and discarded (``WARMUP``),
    - ``active`` steps measured and kept (``RECORD``), the last of which is
      ``RECORD_AND_SAVE``: the cycle's profile is delivered after it.

    ``repeat`` cycles are run, after which every step is ``NONE`` (see :meth:`done`);
    ``repeat=0`` means cycles never stop.

    Build one with :func:`schedule`; calling it with a step number gives that step's
    :class:`Action`.
    """

    wait: int = 0
    warmup: int = 0
    active: int = 1
    repeat: int = 0
    skip_first: int = 0

    def __post_init__(self) -> None:
        for name in _LIMITS:
            _check_arg(name, getattr(self, name))

    @property
    def cycle_length(self) -> int:
        """Steps in one cycle: ``wait + warmup + active``."""
        return self.wait + self.warmup + self.active

    @property
    def end(self) -> int | None:
        """The first step after the last cycle, or ``None`` when ``repeat=0`` (no end)."""
        if self.repeat == 0:
            return None
        return self.skip_first + self.repeat * self.cycle_length

    def done(self, step: int) -> bool:
        """True when every cycle is over by ``step``: it and all later steps are ``NONE``.

        Always False with ``repeat=0``. A training loop may stop profiling (or stop early)
        once this is True.
        """
        step = _check_step(step)
        end = self.end
        return end is not None and step >= end

    def __call__(self, step: int) -> Action:
        """The action for 0-based step number ``step``."""
        step = _check_step(step)
        if step < self.skip_first or self.done(step):
            return Action.NONE
        pos = (step - self.skip_first) % self.cycle_length
        if pos < self.wait:
            return Action.NONE
        if pos < self.wait + self.warmup:
            return Action.WARMUP
        if pos == self.cycle_length - 1:
            return Action.RECORD_AND_SAVE
        return Action.RECORD

    def __str__(self) -> str:
        parts = []
        if self.skip_first:
            parts.append(f"skip {self.skip_first} step{'s' * (self.skip_first != 1)}, then ")
        cycle = f"wait {self.wait}, warm up {self.warmup}, record {self.active}"
        if self.repeat == 0:
            parts.append(f"cycles of ({cycle}) forever")
        else:
            times = "once" if self.repeat == 1 else f"{self.repeat} times"
            parts.append(f"({cycle}) {times}, then idle from step {self.end}")
        return "".join(parts)


def schedule(
    *, wait: int = 0, warmup: int = 0, active: int = 1, repeat: int = 0, skip_first: int = 0
) -> Schedule:
    """A :class:`Schedule`: skip ``skip_first`` steps, then cycle wait / warmup / active.

    Each cycle is ``wait`` idle steps, ``warmup`` steps measured and discarded, then
    ``active`` steps measured and kept (the last one is ``RECORD_AND_SAVE``). ``repeat``
    cycles are run, then every step is idle; ``repeat=0`` (the default) never stops.
    Same step-by-step actions as ``torch.profiler.schedule`` with the same arguments.

    Every argument must be an int (not a bool): ``active >= 1``, the others ``>= 0``;
    anything else raises ``ValueError`` naming the argument.
    """
    return Schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
