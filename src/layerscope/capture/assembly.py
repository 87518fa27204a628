"""One capture assembly: the set-up every entry point shares, and the capture it ends with.

An entry point (``profile``, ``count_flops``, the ``Profiler`` block) describes what it
wants captured in a :class:`CapturePlan`: the model, its inputs when the entry point runs
it, the paths, whole steps or passes, ops or module times alone, memory, stacks, the
clock, and whether torch's profiler may record. An :class:`Assembly` over the plan
checks the model and builds its module table and recorder (made); claims the model,
and torch's profiler where it may run, and chooses the backend once, with its fallback
(entered); passes the step calls the entry point drives to that backend (``begin_step``,
``end_step``, ``part``, ``backward``, ``collect``); and ends with a complete, serialisable
:class:`~layerscope.model.raw.RawCapture` (:meth:`Assembly.capture`), its facts built by
:func:`meta_of`: everything the tree is derived from, in one object.

The fallback is decided here and nowhere else: where torch's profiler was to record ops
and cannot run (a user's own ``torch.profiler`` runs, and only one can; another thread's
``Profiler`` block holds it), the dispatch mode records them, and the capture says so
under one name, ``meta.times_from``.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from layerscope.base.version import __version__
from layerscope.capture._torch import missing_meta
from layerscope.capture.backend import Backend, KinetoSteps, RecorderSteps, detailed_steps, timed_steps
from layerscope.capture.inputs import check_signature, dtypes_of, shapes_of
from layerscope.capture.kineto import PendingRead, profiler_session
from layerscope.capture.memory import model_memory, tensors_in
from layerscope.capture.modules import (
    autocast_dtype,
    model_device,
    model_dtype,
    module_table,
    refuse_compiled,
    refuse_meta_timing,
    require_module,
    unseen_modules,
)
from layerscope.capture.recorder import Clock, Recorder, exclusive
from layerscope.convert.align import combined
from layerscope.model.raw import Event, ModuleShapes, RawCapture
from layerscope.model.runfacts import ModulesFrom, RunFacts

#: ``meta.times_from`` where torch's profiler was to record and could not.
DISPATCH_MODE = "dispatch mode"


def meta_of(model: nn.Module, device: torch.device, **facts: Any) -> RunFacts:
    """What was run: the model, versions, device, dtype, and ``facts`` (by field: a
    name :class:`~layerscope.model.runfacts.RunFacts` lacks raises)."""
    return RunFacts(
        model=type(model).__name__,
        layerscope_version=__version__,
        torch_version=torch.__version__,
        python_version=platform.python_version(),
        device=str(device),
        dtype=model_dtype(model),
        training=model.training,
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        # What this torch lacks that layerscope tolerates (nothing on a supported torch).
        torch_api_missing=missing_meta().get("torch_api_missing"),
        **facts,
    )


@dataclass(frozen=True, slots=True)
class CapturePlan:
    """What an entry point wants captured."""

    model: nn.Module
    #: The passes' inputs as ``(args, kwargs)``, where the entry point runs the model
    #: itself: checked against its ``forward``, live before each pass (memory), and
    #: stated in the facts (``inputs``, ``input_dtypes``, ``autocast``). None where the
    #: user's own code runs it (a ``Profiler`` block).
    inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    #: The ``named_modules()`` subtrees profiled (None: the whole model).
    paths: Sequence[str] | None = None
    #: Each stream is a whole step, whose parts add up to its wall time (``backward=True``,
    #: a block), or the model's pass alone.
    steps: bool = False
    #: Ops (shapes, FLOPs, memory, stacks), or module times alone.
    detail: bool = True
    #: Memory and stacks come with ops: ignored without ``detail``.
    memory: bool = False
    with_stack: bool = False
    #: Replaces ``time.perf_counter_ns`` (tests): every step is then the recorder's.
    clock: Clock | None = None
    #: False for an untimed count: no device timer, and the facts say ``timed: false``.
    timed: bool = True
    #: Whether torch's profiler may record the steps (with ``detail``, or timing a whole
    #: step's backward without Python per op); else hooks and the dispatch mode do.
    torch_profiler: bool = True
    #: A bounded session (a ``profile()`` call) waits while another thread's holds torch's
    #: profiler; an unbounded one (a block, maybe a whole training loop) waits for none.
    bounded: bool = True
    #: Keep each module's ``extra_repr()`` (the annotated model view).
    with_repr: bool = True
    #: "first": light steps record torch's profiler without module hooks, their ops
    #: aligned to the calls of the window before (``Profiler(hooks="first")``).
    hooks: str = "every"


class Assembly:
    """A capture set up from a :class:`CapturePlan`: made (the model checked, its module
    table and the recorder over it), entered (the model and torch's profiler claimed,
    the backend chosen), driven step by step, and read as a :class:`RawCapture`."""

    def __init__(self, plan: CapturePlan) -> None:
        model = require_module(plan.model)
        refuse_compiled(model)
        if plan.timed:
            refuse_meta_timing(model, plan.inputs)
        if plan.inputs is not None:
            check_signature(model, *plan.inputs)
        self.plan = plan
        self.modules, self.infos, self.param_bytes = module_table(model, plan.paths, with_repr=plan.with_repr)
        self.device = model_device(model)
        self._memory = plan.memory and plan.detail
        self._with_stack = plan.with_stack and plan.detail
        #: Tensors live before each pass that are not the model's (the inputs).
        self._inputs = list(tensors_in(plan.inputs)) if plan.inputs is not None else []
        self.recorder = Recorder(
            self.modules,
            [info.selected for info in self.infos],
            # An untimed count reads no device clock.
            device=self.device if plan.timed else torch.device("cpu"),
            clock=plan.clock,
            memory=self._memory,
            with_stack=self._with_stack,
            inputs=self._inputs,
        )
        #: The recorder's steps, until entering chooses torch's profiler where it may run.
        self.backend: Backend = RecorderSteps(self.recorder, detailed=plan.detail, steps=plan.steps)
        #: Where the times came from when torch's profiler was to record and could not.
        self.times_from: str | None = None
        self._stack: ExitStack | None = None

    # -- entered: the claims and the backend ------------------------------------------
    def __enter__(self) -> Assembly:
        assert self._stack is None, "an Assembly is entered once"
        stack = ExitStack()
        try:
            stack.enter_context(exclusive(self.plan.model))
            self.backend = self._choose(stack)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, *exc_info: Any) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def _choose(self, stack: ExitStack) -> Backend:
        """The backend, chosen once. torch's profiler, where the plan lets it record: ops
        with shapes and memory (times and detail from one run), or a step's module times
        and backward without Python per op. It runs one session per process, held for
        the whole capture (``kineto.profiler_session``): another thread's bounded one is
        waited for; while another thread's block holds it, or a user's own
        ``torch.profiler`` runs in this thread, the recorder takes the steps, and with ops
        says so (``meta.times_from``). Without torch's profiler: module hooks on a clock
        (the leanest forward timing), and with ops the dispatch mode (``count_flops``; a
        fake clock keeps every pass on the recorder)."""
        plan = self.plan
        wanted = plan.torch_profiler and plan.clock is None
        if wanted and stack.enter_context(profiler_session(bounded=plan.bounded)):
            selected = [info.selected for info in self.infos]
            found = (
                detailed_steps(
                    plan.model, self.modules, selected, self.device, state_tensors=self.recorder.state_tensors,
                    memory=self._memory, with_stack=self._with_stack, steps=plan.steps, inputs=self._inputs,
                    hooks=plan.hooks,
                )
                if plan.detail
                else timed_steps(self.modules, selected, self.device, steps=plan.steps)
            )
            if found is not None:
                return found
        if wanted and plan.detail:
            self.times_from = DISPATCH_MODE
        return self.backend

    # -- the step calls the entry points drive ----------------------------------------
    @property
    def windowed(self) -> bool:
        """Whether steps are read back in windows (torch's profiler), not one by one."""
        return isinstance(self.backend, KinetoSteps)

    @property
    def has_device_time(self) -> bool:
        return self.backend.has_device_time

    def begin_step(self) -> None:
        self.backend.begin_step()

    def end_step(self) -> None:
        self.backend.end_step()

    def part(self, kind: str, name: str) -> AbstractContextManager[None]:
        return self.backend.part(kind, name)

    def backward(self) -> AbstractContextManager[None]:
        return self.backend.backward()

    def collect(self) -> list[list[Event]]:
        return self.backend.collect()

    def autocast_seen(self) -> str | None:
        """The dtype ``torch.autocast`` ran the model's forwards in, where every forward
        torch's profiler saw ran under it in that one dtype (autocast entered inside a
        step included); None otherwise (off, mixed, or not seen: the recorder's steps)."""
        seen = self.backend.autocast if isinstance(self.backend, KinetoSteps) else set()
        return next(iter(seen)) if len(seen) == 1 else None

    @property
    def recording(self) -> bool:
        """Whether torch's profiler is recording steps for it now (a window running)."""
        return isinstance(self.backend, KinetoSteps) and self.backend.running

    def light(self, light: bool) -> None:
        """Record the next window's steps lightly: times of every module and op from
        torch's profiler, without shapes, memory or stacks (what a detailed step pays for
        per op). Between windows only, and only where torch's profiler records
        (:attr:`windowed`)."""
        assert isinstance(self.backend, KinetoSteps)
        self.backend.light(light)

    def aligned_steps(self, before: ModulesFrom | None = None) -> ModulesFrom | None:
        """How the steps recorded without module hooks had their ops placed in module
        calls (``hooks="first"``), in the windows read since the last call (a cycle's),
        added to ``before`` (this cycle's, told earlier); None where none were."""
        placed = self.backend.placement() if isinstance(self.backend, KinetoSteps) else None
        earlier = before.placement if before is not None else None
        placed = combined([p for p in (earlier, placed) if p is not None])
        if placed is None:
            return before
        return ModulesFrom(method=LIVE_ALIGNED, instances=0, matched=0, placement=placed)

    def collect_later(self) -> PendingRead[list[list[Event]]] | None:
        """Stop capturing now and read the finished steps on first use, where the backend
        reads back windows (torch's profiler); None where it does not (nothing to put off)."""
        return self.backend.collect_later() if isinstance(self.backend, KinetoSteps) else None

    @property
    def dropped_passes(self) -> int:
        """Passes to run first and drop: torch's profiler, recording shapes and memory,
        makes a window's first pass pay its first-use costs."""
        return 1 if self.plan.detail and self.windowed else 0

    @contextmanager
    def warm_pass(self) -> Iterator[None]:
        """Around a warm-up pass, unrecorded: under the dispatch mode it runs in the mode
        too, whose first ops run several times slower than later ones."""
        if self.plan.detail and isinstance(self.backend, RecorderSteps):
            with self.recorder.warm_detail_pass():
                yield
        else:
            yield

    def measured(self) -> list[list[Event]]:
        """The streams collected, less the :attr:`dropped_passes`, whose module shapes
        go on in the first kept one (a capture reads each module's once)."""
        streams = self.collect()
        dropped, kept = streams[: self.dropped_passes], streams[self.dropped_passes :]
        if dropped and kept:
            kept[0][:0] = [event for stream in dropped for event in stream if type(event) is ModuleShapes]
        return kept

    # -- the capture -------------------------------------------------------------------
    def capture(
        self, *, timing_passes: list[list[Event]] | None = None, op_pass: list[Event] | None = None,
        detailed_passes: bool = False, **facts: Any,
    ) -> RawCapture:
        """The whole capture: the streams given (a block's steps are folded as they are
        read, and it gives none), the module table, what is known of the model without
        running it, and the run's facts (``facts``, by :class:`RunFacts` field, with
        those the plan and the backend state: paths, inputs, untimed, ``times_from``)."""
        plan, model = self.plan, self.plan.model
        if plan.inputs is not None:
            facts = {**_inputs_facts(*plan.inputs, self.device), **facts}
        return RawCapture(
            modules=self.infos,
            timing_passes=timing_passes or [],
            op_pass=op_pass,
            detailed_passes=detailed_passes,
            has_device_time=self.has_device_time,
            param_bytes=self.param_bytes,
            memory_static=model_memory(model) if self._memory else {},
            meta=meta_of(
                model,
                self.device,
                paths=None if plan.paths is None else list(plan.paths),
                unseen=unseen_modules(self.infos, self.modules) or None,
                timed=None if plan.timed else False,
                times_from=self.times_from,
                **facts,
            ),
        )


#: ``meta.modules_from.method`` of a block whose light steps ran no module hooks.
LIVE_ALIGNED = "light steps recorded without module hooks, their ops aligned to the calls of the hooked steps"


def _inputs_facts(args: tuple[Any, ...], kwargs: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """What the passes ran on: the inputs' shapes and dtypes (positional, then keyword),
    and the dtype autocast ran ops in, when it was on."""
    return {
        "inputs": [shapes_of(list(args)), shapes_of(kwargs)],
        "input_dtypes": [dtypes_of(list(args)), dtypes_of(kwargs)],
        "autocast": autocast_dtype(device),
    }
