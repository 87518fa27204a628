"""The ``Profiler`` block: whatever runs in a ``with`` block, step by step, through one
capture backend (torch's profiler recording shapes and memory; a dispatch mode where it
cannot run; module hooks alone with ``record_ops=False``). Each cycle of a schedule is
folded as its steps are read (``attribute/cycle.py``) and delivered as a ``Profile``.

``layerscope.Profiler`` is this block with torch.profiler's names on top
(``compat/torch_profiler.py``): this module knows none of them."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from layerscope.attribute import parent_indices
from layerscope.attribute.compiled import StepFold, build_compiled_steps, with_ops
from layerscope.attribute.cycle import Cycle
from layerscope.attribute.profile import op_walk
from layerscope.attribute.walk import PassResult
from layerscope.base.errors import ProfilerStateError
from layerscope.base.peaks import check_peak_tflops
from layerscope.base.schedule import Action
from layerscope.capture import distributed
from layerscope.capture.assembly import Assembly, CapturePlan
from layerscope.capture.compiled import CompiledSteps
from layerscope.capture.counting import count_capture
from layerscope.capture.kineto import paused_gc
from layerscope.capture.modules import (
    compile_mark,
    eager_hint,
    eager_module,
    model_device,
    model_dtype,
    note_raising_module,
    peak_flops_per_s,
    require_module,
    warn_if_compiled_traced_hooks,
)
from layerscope.capture.recorder import Clock
from layerscope.model.compile_info import StepCompile
from layerscope.model.raw import CompiledPass, Event, RawCapture
from layerscope.model.tree import STEP_FAR, ModuleNode, Profile

if TYPE_CHECKING:

    from layerscope.model.ops import OpTable
    from layerscope.model.runfacts import RunFacts, RunFigures
    from layerscope.model.sidedocs import MemorySummary, Trace
    from layerscope.model.tree import StepSpread

#: Which steps a block records in detail (``Profiler(detail=...)``).
DETAIL = ("every", "first")


#: Which steps of a block run module hooks (``Profiler(hooks=...)``).
HOOKS = ("every", "first")


def check_hooks(hooks: str | None, detail: str) -> str:
    """``Profiler(hooks=...)`` checked against ``detail`` (ValueError); None is the
    default, ``"every"``: aligned light steps are cheaper and closer to the hooks-only
    reference (docs/benchmarks.md), but ops cannot tell apart two modules that run the
    same ops, so a routing that changes between steps (a mixture of experts) would be
    read as the hooked step's (docs/design.md)."""
    if hooks is None:
        return "every"
    if hooks not in HOOKS:
        raise ValueError(
            f"hooks must be one of {', '.join(map(repr, HOOKS))}, got {hooks!r}: 'every' opens a range per module "
            "call in every step, 'first' only in the detailed steps (the light steps' ops are aligned to their calls)"
        )
    if hooks == "first" and detail != "first":
        raise ValueError(
            "hooks='first' records the light steps of detail='first' without module hooks; with "
            f"detail={detail!r} every step is detailed and hooked: give detail='first' too"
        )
    return hooks


def check_detail(detail: str, record_ops: bool) -> None:
    """``Profiler(detail=...)`` checked against its other arguments (ValueError)."""
    if detail not in DETAIL:
        raise ValueError(
            f"detail must be one of {', '.join(map(repr, DETAIL))}, got {detail!r}: 'every' records every step in "
            "detail (times, shapes and memory from one run), 'first' details each cycle's first step and times "
            "the others lightly (faithful module times; counts and memory from the detailed step)"
        )
    if detail == "first" and not record_ops:
        raise ValueError(
            "detail='first' with record_ops=False: record_ops=False records no detail in any step; drop one of them"
        )


#: Steps read back from torch's profiler at a time: its events stay in C++ until it
#: stops, so a long run stops (at a step boundary, after the step's work) every so often.
WINDOW_STEPS = 32


@dataclasses.dataclass(frozen=True, slots=True)
class _Options:
    """What a block records, fixed when it is made (``Profiler``'s arguments, checked)."""

    paths: Sequence[str] | None
    record_ops: bool
    #: Memory and stacks come from op recording: off without it.
    memory: bool
    with_stack: bool
    clock: Clock | None
    schedule: Callable[[int], Any] | None
    peak_tflops: float | None
    #: Which steps are recorded in detail: "every", or "first" (each cycle's first
    #: recorded step; the others are timed lightly).
    detail: str = "every"
    #: Which steps run module hooks: "every", or "first" (the detailed steps; the light
    #: ones record torch's profiler alone, their ops aligned to the hooked step's calls).
    hooks: str = "every"


@dataclasses.dataclass(frozen=True, slots=True)
class _Capture:
    """What entering the block set up, which every cycle's profile is built with: the
    capture's assembly (the module table, the backend every step goes through) and the
    process's identity (rank, world size, host, run id)."""

    assembly: Assembly
    identity: dict[str, Any]


#: The names a finished block answers for its profile (``prof.render(...)``); any other
#: name of a Profile is read from ``prof.profile`` (the AttributeError says so).
PROFILE_NAMES = (
    "root", "meta", "figures", "parts", "memory", "trace", "param_bytes", "step_time_ns",
    "node", "nodes", "modules", "ops", "unsupported_ops", "step_spread", "render", "save", "show", "to_dict",
)

#: Every public name of a Profile: those the block does not answer name ``prof.profile``.
_ALL_PROFILE_NAMES = frozenset(
    name for name in {*dir(Profile), *(f.name for f in dataclasses.fields(Profile))} if not name.startswith("_")
)


def _ranged(raw: RawCapture, cycle: Cycle) -> RawCapture:
    """A cycle's capture facts with the steps it recorded."""
    assert cycle.first is not None and cycle.last is not None
    return dataclasses.replace(raw, meta=dataclasses.replace(raw.meta, step_range=[cycle.first, cycle.last]))


class _CompiledBlock:
    """A block around a model compiled whole: its steps recorded from the kernels of
    layerscope's compile (``capture/compiled.py``), folded as they are read
    (``attribute/compiled.py``), each cycle built with one eager step's count of the
    model (on the first call's inputs; made once, after the first recorded step that
    called it). A schedule's idle steps record nothing and its warm-up steps are
    recorded and dropped, as in an eager block."""

    def __init__(self, model: nn.Module, options: _Options) -> None:
        given = [
            name for name, unsupported in (
                ("paths=", options.paths is not None), ("record_ops=False", not options.record_ops),
                ("with_stack=True", options.with_stack), ("clock=", options.clock is not None),
            ) if unsupported
        ]
        if given:
            raise ValueError(
                f"{', '.join(given)}: not for a torch.compile'd model, whose block records its steps from its "
                f"kernels; drop them, or profile {eager_hint(model)} for the eager steps"
            )
        self.options = options
        self.steps = CompiledSteps(model)
        self._paths = {path for path, _ in self.steps.eager.named_modules()}
        self.fold = StepFold(self._paths)
        #: What each step recorded is for (a warm-up step's pass is dropped), until folded.
        self._actions: dict[int, Action] = {}
        self._counted: tuple[RawCapture, PassResult] | None = None
        #: Whether the modules that run eagerly were looked for (after the first call).
        self._eager_looked = False

    def __enter__(self) -> _CompiledBlock:
        self.steps.__enter__()
        return self

    def begin(self, number: int, action: Action) -> None:
        if action is not Action.NONE:
            self._actions[number] = action
            self.steps.begin_step(number)

    def action(self, number: int) -> Action:
        """What step ``number`` was begun for (``NONE``: it records nothing)."""
        return self._actions.get(number, Action.NONE)

    def end(self, number: int) -> None:
        """End step ``number``; every ``WINDOW_STEPS`` recorded steps, they are read."""
        if number in self._actions:
            self.steps.end_step()
            if not self._eager_looked and self.steps.returned:
                self._time_eager_modules()
            elif self.steps.window_steps >= WINDOW_STEPS:
                self._fold(self.steps.read_window(), self.fold)

    def _time_eager_modules(self) -> None:
        """After the first recorded step that called the model: its window read (the
        graphs it called now known), the eager count made, and the modules with ops of
        their own that no forward graph holds (they ran eagerly, between graphs) timed by
        ranges of their own from the next step on, as ``profile()`` times them."""
        self._eager_looked = True
        window = self.steps.read_window()
        backward = any(r.kind == "backward" for _, one in window for r in one.ranges)
        self._fold(window, self.fold)
        raw, ops = self._count(backward)
        graphs = self.steps.graphs()
        called = {call.graph for _, one in window for call in one.graph_calls}
        traced = {
            path for key in called if (graph := graphs.get(key)) is not None and graph.phase == "forward"
            for path in graph.modules
        }
        self.steps.time_eager_modules(sorted(with_ops(raw, ops) - traced))

    def _count(self, backward: bool) -> tuple[RawCapture, PassResult]:
        """The eager count of one step of the model on its first call's inputs (made once)."""
        if self._counted is None:
            steps = self.steps
            assert steps.inputs is not None
            # Under the autocast the counted step's calls ran in (its dtypes, its copies).
            amp = contextlib.nullcontext() if steps.autocast is None else torch.autocast(
                model_device(steps.eager).type, dtype=getattr(torch, steps.autocast),
            )
            with amp:
                raw = count_capture(
                    steps.eager, None, None, not steps.grad_enabled, backward, None, self.options.memory,
                    calls=steps.inputs,
                )
            ops = op_walk(raw)
            assert ops is not None  # a count always has its op pass
            self._counted = raw, ops
            steps.inputs = None  # counted: the user's tensors are not held any longer
        return self._counted

    def _fold(self, steps: list[tuple[int, CompiledPass]], fold: StepFold) -> None:
        if steps:
            graphs = self.steps.graphs()
            for number, one in steps:
                if self._actions.pop(number, None) is not Action.WARMUP:
                    fold.add(number, one, graphs)

    def cycle(self, *, complete: bool, identity: dict[str, Any]) -> Profile | None:
        """The cycle's profile (its steps read now), and a new cycle; None when it
        recorded no step."""
        self._fold(self.steps.read_window(), self.fold)
        fold, self.fold = self.fold, StepFold(self._paths)
        return self._build(fold, complete, identity)

    def stop(self, *, complete: bool, identity: dict[str, Any]) -> Callable[[], Profile | None]:
        """Stop recording; the last cycle's build, for the first read."""
        pending = self.steps.stop()
        fold = self.fold

        def build() -> Profile | None:
            self._fold(pending.streams(), fold)
            if not self.steps.returned:
                raise ProfilerStateError(
                    "the compiled model never returned from a call in the block (it was not called, or every call "
                    "raised): nothing to profile; call it inside the `with layerscope.Profiler(model) as prof:` block"
                )
            return self._build(fold, complete, identity)

        return build

    def _build(self, fold: StepFold, complete: bool, identity: dict[str, Any]) -> Profile | None:
        steps = self.steps
        if not fold.step_numbers or not steps.returned:
            return None
        raw, ops = self._count(fold.backward)
        graphs = steps.graphs()
        numbers = set(fold.step_numbers)
        meta = dataclasses.replace(
            raw.meta, timed=None, mode="context", complete=complete,
            step_range=[fold.step_numbers[0], fold.step_numbers[-1]],
            schedule=None if self.options.schedule is None else str(self.options.schedule),
            peak_flops_per_s=peak_flops_per_s(
                self.options.peak_tflops, model_device(steps.eager), steps.autocast or model_dtype(steps.eager),
            ),
            **identity,
        )
        return build_compiled_steps(
            dataclasses.replace(raw, meta=meta), ops, fold, graphs, graph_breaks=steps.graph_breaks(),
            step_compiles=[StepCompile(*compiled) for compiled in steps.compiles if compiled[0] in numbers],
            other_input_steps=steps.other_input_steps(),
        )


class Profiler:
    """Profile whatever runs in a ``with`` block: inference, or whole training steps::

        with layerscope.Profiler(model) as prof:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step(); opt.zero_grad()
        print(prof)

    Every module gets its forward and backward figures; the loss, each optimizer's
    ``step``, ``zero_grad``, user labels and everything else (``<other>``) become the
    step's top-level parts, which add up to the step's wall time.

    In a training loop, call ``prof.step()`` after each step. Every step is recorded by
    torch's own profiler, with shapes and memory, one range per module call and nothing
    Python per op: the same run gives its times and its detail (ops, shapes, FLOPs,
    memory, activations), so module times are not inflated by the measuring, and each
    step's figures are its own. Figures are the steps' sums (``figures.steps``); the
    profile keeps each step's number and wall time (``figures.step_numbers``,
    ``figures.step_times_ns``), and ``step_spread()`` names the steps far from the
    median. Inside a user's own torch.profiler (only one can run), or while another
    thread's block holds torch's profiler, steps are recorded under a dispatch mode
    instead (``meta.times_from``); a block started during another thread's
    ``profile()`` waits for it to end. With
    ``schedule=layerscope.schedule(...)`` only the
    active steps of each cycle are recorded and ``on_ready(profile)`` receives each
    cycle's profile; idle steps install nothing. Events are folded into running totals
    as they are read (torch's profiler at most every ``WINDOW_STEPS`` steps), so memory
    stays flat on long runs. Only the thread that opened the block is recorded (and
    autograd's, for its backward).

    ``detail="first"`` records only each cycle's first step in detail and times the
    others lightly (torch's profiler without shapes, memory or stacks: the cheapest run
    that times every module, forward and backward, and the device): each node's times
    are then its mean over the light steps (``figures.step_numbers``), its calls, FLOPs,
    MACs, shapes, memory and op rows the detailed step's (``figures.detailed_steps``),
    never scaled from one to the other; op rows have no times and there is no trace
    (no one run holds both). A compiled model's block already works this way. With
    ``hooks="first"`` its light steps run no module hooks: torch's profiler alone records
    them, and each op is placed in the module call of its counterpart in the detailed
    step (``meta.modules_from.placement`` counts how; a module's CPU time then runs from
    its first op to its last). A step that does not align is named there, and the next
    window runs the hooks again; a step that routes to other modules running the same
    ops (another expert of a mixture of experts) cannot be told from the hooked one, so
    keep the default (``hooks="every"``) for such models.

    ``record_ops=False`` records module forward times only, by two hooks on a clock (no
    torch profiler: no ops, FLOPs, memory or backward), the leanest
    timing; ``memory=False`` keeps ops but not memory;
    ``with_stack=True`` keeps each op's Python call site (``OpStats.stack``).
    ``peak_tflops`` is the hardware's peak for MFU (% of peak per module); on common GPUs
    it is known from the datasheet. If the
    block raises, what was captured up to then is kept, marked
    ``meta.complete = False``.

    A model compiled as a whole (``torch.compile(model)``) is recorded from its kernels:
    while the block runs its calls go through layerscope's compile of the same module
    (your mode and options, with Inductor's provenance tracking), put back at the end.
    Each step is split into forward, backward, ``<loss>``, optimizer parts and ``<other>``
    from torch's events, every node holds its median over the steps (a step that
    compiled is named in ``profile.compiled.step_compiles`` and left out), and FLOPs,
    shapes and memory are one eager step's count.

    Leaving the block stops torch's profiler; its last steps are read and the profile
    built the first time it is asked for (as torch's profiler processes its events on
    first use), with the model's facts as they were at the block's end.

    After the block, ``prof.profile`` is the :class:`~layerscope.model.tree.Profile`; the
    block answers the reading calls users make on it (``PROFILE_NAMES``: ``prof.render(...)``,
    ``prof.save(...)``, ``prof["encoder"]``, ``print(prof)``, ...) as one-line delegates.
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
        peak_tflops: float | None = None,
        detail: str = "every",
        hooks: str | None = None,
    ) -> None:
        self.model = require_module(model)
        peak_tflops = check_peak_tflops(peak_tflops)
        check_detail(detail, record_ops)
        hooks = check_hooks(hooks, detail)
        if schedule is not None and not callable(schedule):
            raise TypeError(f"schedule must be a layerscope.schedule(...) (a callable step -> action), got {schedule!r}")
        if on_ready is not None and not callable(on_ready):
            raise TypeError(f"on_ready must be a callable taking a Profile, got {on_ready!r}")
        self._options = _Options(
            paths=paths, record_ops=record_ops, memory=memory and record_ops, with_stack=with_stack and record_ops,
            clock=clock, schedule=schedule, peak_tflops=peak_tflops, detail=detail, hooks=hooks,
        )
        #: Where each cycle's profile goes.
        self._on_ready = on_ready
        # The block's state: entered (a capture and an exit stack), the running step, and
        # the steps read so far; each cycle is folded into `_cycle`, built into `_profile`.
        self._capture: _Capture | None = None
        #: Set while the block runs: what leaving it closes.
        self._stack: contextlib.ExitStack | None = None
        #: Whether steps are read back in windows (torch's profiler), not one by one.
        self._windowed = False
        #: The capture while a step records (None between steps and in idle steps).
        self._running: Assembly | None = None
        #: The step running now (steps ended so far) and what the schedule asked of it.
        self._step = 0
        self._step_action = Action.NONE
        #: Steps recorded in the profiler's current window: (step number, action).
        self._window_steps: list[tuple[int, Action]] = []
        #: Whether the profiler's next or running window records its steps in detail
        #: (with detail="first", only until the cycle has a detailed step).
        self._window_detailed = True
        self._cycle: Cycle | None = None
        self._profile: Profile | None = None
        #: The block's last cycle, stopped and not yet read (built on first use).
        self._later: Callable[[], Profile | None] | None = None
        #: Why building it failed, raised again on every read.
        self._later_error: BaseException | None = None
        #: Cycles delivered so far.
        self._delivered = 0
        #: A model compiled whole is recorded from its kernels instead (set while it runs).
        self._compiled: _CompiledBlock | None = None
        self._identity: dict[str, Any] = {}
        #: Dynamo's compiles when an eager block began (a compile during it may have
        #: traced the block's hooks).
        self._compile_mark: Any = None

    # -- running ------------------------------------------------------------------------
    def __enter__(self) -> Profiler:
        if self._stack is not None or self._profile is not None or self._later is not None:
            raise ProfilerStateError("this Profiler has already run; use a new one for each block")
        options = self._options
        if eager_module(self.model) is not None:
            compiled = _CompiledBlock(self.model, options)
            compiled.__enter__()
            try:
                self._identity = distributed.identity()
                compiled.begin(self._step, self._action(self._step))
            except BaseException:
                compiled.steps.stop()  # the model's forward put back, torch's profiler stopped
                raise
            self._compiled, self._stack = compiled, contextlib.ExitStack()
            return self
        # Every step goes through one backend. With ops: torch's profiler, recording
        # shapes and memory, times and detail from the same run, held for the whole block
        # (one session per process: waiting for another thread's profile() to end, never
        # for a block's, which may last a training loop). Where it cannot run (a user's
        # torch.profiler already does, another thread's block holds it, or a fake clock
        # in tests) a dispatch mode, whose times are not faithful (meta.times_from says
        # so). record_ops=False is the leanest timing: module hooks on a clock, forward only.
        assembly = Assembly(CapturePlan(
            self.model, paths=options.paths, steps=True, detail=options.record_ops, memory=options.memory,
            with_stack=options.with_stack, clock=options.clock, torch_profiler=options.record_ops, bounded=False,
            with_repr=options.record_ops, hooks=options.hooks,
        ))
        self._compile_mark = compile_mark()
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(assembly)
            self._windowed = assembly.windowed
            # Rank, world size, host and the run id (agreed with the other ranks once).
            self._capture = _Capture(assembly, identity=distributed.identity())
            infos = assembly.infos
            self._cycle = Cycle(infos, parent_indices(infos), collect_ops=options.record_ops)
            self._stack = stack
            self._begin_step()
        except BaseException:
            self._stack = None
            stack.close()
            raise
        return self

    def _action(self, step: int) -> Action:
        schedule = self._options.schedule
        if schedule is None:
            return Action.RECORD
        # Another enum of the same names (torch.profiler's ProfilerAction) is read by name.
        action = schedule(step)
        return Action[action.name] if not isinstance(action, Action) else action

    def _begin_step(self) -> None:
        action = self._action(self._step)
        if action is Action.NONE:
            return
        assert self._capture is not None
        assembly = self._capture.assembly
        if self._windowed and self._options.detail == "first":
            assert self._cycle is not None
            self._detail_window(action is not Action.WARMUP and not self._cycle.detailed)
        assembly.begin_step()
        self._running = assembly
        self._step_action = action
        if self._windowed:
            self._window_steps.append((self._step, action))

    def _detail_window(self, detailed: bool) -> None:
        """Record the next steps in detail or lightly: a window running the other way is
        read first (torch's profiler records one way from start to stop)."""
        if detailed == self._window_detailed:
            return
        assert self._capture is not None
        self._read_window()
        self._capture.assembly.light(not detailed)
        self._window_detailed = detailed

    def _end_step(self) -> None:
        """Close the running step; a dispatch-mode step is walked now, the profiler's
        when their window is read back (every ``WINDOW_STEPS`` steps, at the cycle's end,
        and, with detail="first", after the detailed step, so the next is light)."""
        assembly, self._running = self._running, None
        if assembly is None:
            return
        assembly.end_step()
        if not self._windowed:
            (events,) = assembly.collect()
            self._add_step(events, self._step, self._step_action)
        elif len(self._window_steps) >= WINDOW_STEPS or (
            self._options.detail == "first" and self._window_detailed and self._step_action is not Action.WARMUP
        ):
            self._read_window()

    def _read_window(self) -> None:
        """Stop the profiler, and fold its steps into the running totals."""
        if not self._windowed or not self._window_steps:
            return
        assert self._capture is not None
        steps, self._window_steps = self._window_steps, []
        self._fold(self._capture.assembly.collect, steps, light=not self._window_detailed)

    def _fold(self, read: Callable[[], list[list[Event]]], steps: list[tuple[int, Action]], *, light: bool) -> None:
        """Read a stopped window's streams and fold them, one per step, into the cycle
        (``light``: the window timed its steps lightly)."""
        with paused_gc():
            for events, (number, action) in zip(read(), steps):
                self._add_step(events, number, action, light=light)

    def _add_step(self, events: list[Event], number: int, action: Action, *, light: bool = False) -> None:
        assert self._cycle is not None and self._capture is not None
        # A lone step is kept even if it ran nothing, so such a block still has a profile.
        self._cycle.add(
            events, number, warmup=action is Action.WARMUP, keep_empty=number == 0 and self._options.schedule is None,
            has_device=self._capture.assembly.has_device_time, light=light,
        )

    def step(self) -> None:
        """Mark the end of a training step (call it once per step, after ``opt.step()``)."""
        if self._stack is None:
            raise ProfilerStateError(
                "step() called outside a running Profiler: call it inside the "
                "`with layerscope.Profiler(model) as prof:` block, once per training step"
            )
        if self._compiled is not None:
            self._compiled_step()
            return
        action = self._step_action if self._running is not None else Action.NONE
        try:
            try:
                self._end_step()
            finally:
                # Even if on_ready raises (and the loop goes on), the next step is the next;
                # on_ready sees it already, as torch's on_trace_ready sees step_num.
                self._step += 1
            if action is Action.RECORD_AND_SAVE:
                self._deliver(complete=True)
        finally:
            self._begin_step()

    def _compiled_step(self) -> None:
        """A compiled model's step ended: a cycle's last one delivers its profile."""
        compiled = self._compiled
        assert compiled is not None
        action = compiled.action(self._step)
        try:
            try:
                compiled.end(self._step)
            finally:
                self._step += 1
            if action is Action.RECORD_AND_SAVE:
                profile = compiled.cycle(complete=True, identity=self._identity)
                if profile is not None:
                    self._profile = profile
                    self._delivered += 1
                    if self._on_ready is not None:
                        self._on_ready(profile)
        finally:
            compiled.begin(self._step, self._action(self._step))

    def _deliver(self, *, complete: bool) -> Profile | None:
        self._read_window()
        if self._cycle is None or self._cycle.empty:
            return None
        profile = self._build(complete=complete)
        self._cycle = self._cycle.next()
        self._profile = profile
        self._delivered += 1
        if self._on_ready is not None:
            self._on_ready(profile)
        return profile

    def _deliver_later(self, *, complete: bool) -> None:
        """The block's end without a receiver: torch's profiler is stopped now, and its
        last window read, walked and built into the profile on first use (``profile``),
        as torch's own profiler processes its events on first use. The model's facts are
        read now, as the model is at the block's end."""
        assert self._capture is not None and self._cycle is not None
        steps, self._window_steps = self._window_steps, []
        pending = self._capture.assembly.collect_later()
        assert pending is not None, "only a windowed block reads later"
        cycle, raw, light = self._cycle, self._raw(complete=complete), not self._window_detailed
        assembly = self._capture.assembly

        def build() -> Profile | None:
            self._fold(pending.streams, steps, light=light)
            aligned = assembly.aligned_steps(raw.meta.modules_from)  # and the last window's, read just now
            if aligned is not None:
                raw.meta.modules_from = aligned
            return None if cycle.empty else cycle.build(_ranged(raw, cycle))

        self._later = build

    def _build(self, *, complete: bool) -> Profile:
        assert self._cycle is not None
        return self._cycle.build(_ranged(self._raw(complete=complete), self._cycle))

    def _raw(self, *, complete: bool) -> RawCapture:
        """The capture's facts for a cycle's profile (its step range set by the caller)."""
        capture, options = self._capture, self._options
        assert capture is not None
        assembly = capture.assembly
        # The matrix units ran at autocast's dtype where the forwards ran under it (often
        # entered inside the step): the datasheet's peak for that dtype.
        amp = assembly.autocast_seen()
        return assembly.capture(
            mode="context",
            complete=complete,
            modules_from=assembly.aligned_steps(),
            schedule=None if options.schedule is None else str(options.schedule),
            autocast=amp,
            peak_flops_per_s=peak_flops_per_s(options.peak_tflops, assembly.device, amp or model_dtype(self.model)),
            **capture.identity,
        )

    def __exit__(self, *exc_info: Any) -> bool:
        assert self._stack is not None
        failed = exc_info[0] is not None
        if isinstance(exc_info[1], Exception):
            note_raising_module(exc_info[1], eager_module(self.model) or self.model)
        if self._compiled is not None:
            self._stack = None
            complete = not failed and self._options.schedule is None
            build = self._compiled.stop(complete=complete, identity=self._identity)
            if self._on_ready is None:
                self._later = build
            else:
                profile = build()
                if profile is not None:
                    self._profile = profile
                    self._delivered += 1
                    self._on_ready(profile)
            return False
        try:
            self._end_step()
        finally:
            try:
                self._stack.close()
                warn_if_compiled_traced_hooks(self.model, self._compile_mark)
            finally:
                self._stack = None
                # Without a schedule the block is one cycle; with one, steps recorded
                # since the last delivered cycle are a cycle cut short.
                complete = not failed and self._options.schedule is None
                try:
                    if self._windowed and self._window_steps and self._on_ready is None:
                        self._deliver_later(complete=complete)
                    else:
                        self._deliver(complete=complete)
                except Exception as exc:
                    if not failed:
                        raise
                    warnings.warn(f"layerscope: on_ready failed while the block was raising: {exc!r}", stacklevel=2)
        return False

    # -- reading the profile ------------------------------------------------------------
    @property
    def profile(self) -> Profile:
        """The last profile built: the whole block, or the last cycle with a schedule.
        The block's last steps are read from torch's profiler the first time it is asked for."""
        self._built()
        if self._profile is None:
            if self._stack is not None:
                state = "still running"
            elif self._capture is not None or self._compiled is not None:
                state = "finished without recording a step (the schedule never reached an active step)"
            else:
                state = "not started"
            raise ProfilerStateError(f"the Profiler is {state}; read it after its with-block ends")
        return self._profile

    # The Profile's reading calls users make on the block (PROFILE_NAMES), as delegates.
    @property
    def root(self) -> ModuleNode:
        return self.profile.root

    @property
    def meta(self) -> RunFacts:
        return self.profile.meta

    @property
    def figures(self) -> RunFigures:
        return self.profile.figures

    @property
    def parts(self) -> list[ModuleNode]:
        return self.profile.parts

    @property
    def memory(self) -> MemorySummary | None:
        return self.profile.memory

    @property
    def trace(self) -> Trace | None:
        return self.profile.trace

    @property
    def param_bytes(self) -> int | None:
        return self.profile.param_bytes

    @property
    def step_time_ns(self) -> int | None:
        return self.profile.step_time_ns

    def node(self, path: str) -> ModuleNode:
        return self.profile.node(path)

    def nodes(self) -> Iterator[ModuleNode]:
        return self.profile.nodes()

    def modules(self) -> Iterator[ModuleNode]:
        return self.profile.modules()

    def ops(
        self,
        *,
        sort_by: str | None = None,
        group_by: str | Sequence[str] | None = "name",
        limit: int | None = None,
        module: str | None = None,
        phase: str | None = None,
        stack_depth: int | None = None,
    ) -> OpTable:
        return self.profile.ops(
            sort_by=sort_by, group_by=group_by, limit=limit, module=module, phase=phase, stack_depth=stack_depth,
        )

    def unsupported_ops(self) -> dict[str, int]:
        return self.profile.unsupported_ops()

    def step_spread(self, far: float = STEP_FAR) -> StepSpread | None:
        return self.profile.step_spread(far)

    def render(self, fmt: str = "text", **options: Any) -> Any:
        return self.profile.render(fmt, **options)

    def save(self, path: str | os.PathLike[str], fmt: str | None = None, **options: Any) -> None:
        self.profile.save(path, fmt, **options)

    def show(self, **options: Any) -> None:
        self.profile.show(**options)

    def to_dict(self) -> dict[str, Any]:
        return self.profile.to_dict()

    def __getitem__(self, path: str) -> ModuleNode:
        return self.profile[path]

    def __str__(self) -> str:
        return str(self.profile)

    def __getattr__(self, name: str) -> Any:
        # Reached only for a name the block lacks: a Profile's other names are read from
        # the profile, and the error says so.
        where = f"; read it from the profile: prof.profile.{name}" if name in _ALL_PROFILE_NAMES else ""
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}{where}", name=name, obj=self)

    # A cell ending in ``prof`` after the block shows the profile's report, as ``prof.profile``
    # does; before there is one, the text says why (still running, not started).
    def _repr_html_(self) -> str | None:
        profile = self._built()
        return None if profile is None else profile._repr_html_()

    def _built(self) -> Profile | None:
        """The profile, the block's last cycle built first if it waits to be."""
        if self._later_error is not None:
            raise self._later_error
        build, self._later = self._later, None
        if build is not None:
            try:
                profile = build()
            except BaseException as exc:
                self._later_error = exc
                raise
            if profile is not None:
                self._profile = profile
                self._delivered += 1
        return self._profile

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **kwargs: Any) -> dict[str, str]:
        try:
            return self.profile._repr_mimebundle_(include, exclude, **kwargs)
        except ProfilerStateError as exc:
            return {"text/plain": str(exc)}
