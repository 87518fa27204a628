"""The part the framework callbacks share: one scheduled ``Profiler`` held open across
a trainer's hooks, its cycle files, and closing it whichever way the run ends."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from layerscope.base.schedule import schedule as make_schedule
from layerscope.handlers import save_json

Schedule = Callable[[int], Any]


def default_schedule() -> Schedule:
    """Step 0 idle (it pays for lazy set-up: allocator, autotuning, first dataloader
    batch), step 1 warm-up (the first steps under a dispatch mode run slower), then
    steps 2-4 recorded, once."""
    return make_schedule(wait=1, warmup=1, active=3, repeat=1)


class TrainingRun:
    """A ``Profiler`` over ``model``, entered now and closed by :meth:`close`.

    A trainer calls :meth:`step` at the end of each of its steps. Each delivered cycle is
    written to ``folder`` and its path appended to ``delivered``. Once the schedule says
    every cycle is over (``schedule.done(step)``) the profiler is closed at once, so the
    rest of the run carries nothing of layerscope's.
    """

    def __init__(
        self,
        model: Any,
        *,
        schedule: Schedule,
        record_ops: bool,
        detail: str = "every",
        folder: str | os.PathLike[str],
        rank: int | None,
        delivered: list[str],
    ) -> None:
        # layerscope.Profiler, as the callbacks document: a torch.profiler.schedule(...)
        # given to one is read as the same layerscope schedule.
        from layerscope.compat.torch_profiler import Profiler

        save = save_json(folder)

        def on_ready(profile: Any) -> None:
            if rank is not None:
                # The trainer knows its global rank even where torch.distributed is not
                # initialised (the library's own guess): the file name must carry it, or
                # ranks writing to one folder overwrite each other.
                profile.meta.rank = int(rank)
            delivered.append(str(save(profile)))

        self._schedule = schedule
        self._steps_ended = 0
        self._profiler: Any = Profiler(
            model, schedule=schedule, record_ops=record_ops, detail=detail, on_ready=on_ready,
        )
        self._profiler.__enter__()

    @property
    def running(self) -> bool:
        return self._profiler is not None

    def step(self) -> None:
        """End the current step (and deliver its cycle if it was the cycle's last)."""
        if self._profiler is None:
            return
        self._profiler.step()
        self._steps_ended += 1
        done = getattr(self._schedule, "done", None)
        if callable(done) and done(self._steps_ended):
            self.close()

    def close(self, exception: BaseException | None = None) -> None:
        """Exit the profiler: hooks and modes removed, a cycle cut short delivered (marked
        incomplete). ``exception`` is the error that stopped the run, if any."""
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return
        if exception is None:
            profiler.__exit__(None, None, None)
        else:
            profiler.__exit__(type(exception), exception, exception.__traceback__)
