"""The two ways in: ``profile(model, inputs)`` runs the passes itself; ``Profiler(model)``
wraps the user's own code for one run. Both end in a :class:`~layerscope.tree.Profile`."""

from __future__ import annotations

import contextlib
import os
import platform
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from layerscope import __version__
from layerscope.attribute import (
    Accumulator,
    build_from_steps,
    build_profile,
    parent_indices,
    walk_pass,
)
from layerscope.attribute.compiled import RULE as COMPILED_RULE
from layerscope.attribute.compiled import attribute as attribute_compiled
from layerscope.capture import distributed, kineto
from layerscope.capture.backend import Backend, KinetoSteps, RecorderSteps
from layerscope.capture.compiled import eager_module, time_compiled
from layerscope.capture.inputs import check_signature, dtypes_of, shapes_of, split_inputs
from layerscope.capture.memory import model_memory, tensors_in
from layerscope.capture.modules import (
    autocast_dtype,
    model_device,
    model_dtype,
    module_table,
    refuse_compiled,
    refuse_meta_timing,
    require_module,
)
from layerscope.capture.recorder import Clock, Recorder, exclusive
from layerscope.capture.training import grads_restored, loss_of, state_restored
from layerscope.errors import ModelError, ProfilerStateError
from layerscope.raw import Enter, Event, Op, RawCapture
from layerscope.schedule import Action
from layerscope.tree import Profile

#: Timed steps read back from torch's profiler at a time: its events stay in C++ until
#: it stops, so a long run stops (at a step boundary, after the timed work) every so often.
WINDOW_STEPS = 32

#: ``progress(stage, done, total)``: stage is "warmup", "measure" or "ops".
Progress = Callable[[str, int, int], None]


def _meta(model: nn.Module, device: torch.device, **extra: Any) -> dict[str, Any]:
    return {
        "model": type(model).__name__,
        "layerscope_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "device": str(device),
        "dtype": model_dtype(model),
        "training": model.training,
        **extra,
    }


def profile(
    model: nn.Module,
    inputs: Any = None,
    *,
    warmup: int = 2,
    repeat: int = 5,
    paths: Sequence[str] | None = None,
    record_ops: bool = True,
    memory: bool = True,
    with_stack: bool = False,
    no_grad: bool | None = None,
    backward: bool = False,
    loss_fn: Callable[[Any], Any] | None = None,
    progress: Progress | None = None,
    clock: Clock | None = None,
    peak_tflops: float | None = None,
) -> Profile:
    """Profile ``model``'s forward pass (and with ``backward=True`` its backward) on
    ``inputs``, layer by layer.

    ``inputs`` is a Tensor, a tuple/list of positional arguments, or a dict of keyword
    arguments. ``warmup`` unmeasured passes run first, then ``repeat`` timing passes
    (per-module medians are reported), then, with ``record_ops``, one more pass that
    records each module's aten ops and shapes (kept apart so op recording does not
    inflate the module times). ``paths`` limits profiling to those ``named_modules()``
    subtrees. ``no_grad`` runs the passes under ``torch.no_grad()`` as inference does
    (the default without ``backward``). ``memory`` tracks memory in that same pass
    (allocations, peaks and activations per module, the step's peak and its culprit;
    see ``Profile.memory``); it does not touch the timed passes. ``with_stack`` keeps
    the user's Python frames that called each op (``OpStats.stack``), so op tables can
    be grouped by call site; it costs time in that pass only.

    ``backward=True`` makes each pass a training step without the optimizer: forward,
    the loss (``loss_fn(output)``, or the sum of the first floating-point tensor in the
    output), then backward. Each module gets a ``backward`` phase, and the work outside
    the model appears as the step's parts (``<loss>``, ``<other>``). Parameters'
    ``.grad`` are restored afterwards.
    ``clock`` replaces ``time.perf_counter_ns`` (tests use a fake one). ``peak_tflops``
    is the hardware's peak for MFU (% of peak per module); on common GPUs it is known.

    A model compiled whole (``torch.compile(model)``) is profiled from its kernels:
    layerscope compiles its module once more with Inductor's provenance tracking, and
    each module's time comes from the kernel calls holding its FX nodes; FLOPs, memory
    and op rows from one eager pass (``record_ops`` has no effect). Forward only;
    ``meta["compile"]`` holds the kernels, graph breaks and compile time.

    The model is left as it was: hooks are removed and modes exited even if it raises,
    parameter and buffer values (a train-mode BatchNorm's statistics) and torch's random
    state are put back, and its exception reaches the caller unchanged.
    """
    require_module(model)
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be an int >= 1, got {repeat!r}")
    eager = eager_module(model)
    if eager is not None:
        if backward or paths is not None or clock is not None:
            given = [n for n, v in (("backward=True", backward), ("paths", paths), ("clock", clock)) if v]
            raise ModelError(
                f"{', '.join(given)}: not for a torch.compile'd model, whose forward alone is profiled per "
                "module (torch 2.13 keeps no kernel provenance for the lazily compiled backward); profile "
                "model._orig_mod for the eager training step"
            )
        return _profile_compiled(
            eager, inputs, warmup=warmup, repeat=repeat, memory=memory, no_grad=no_grad,
            progress=progress, peak_tflops=peak_tflops,
        )  # fmt: skip
    refuse_compiled(model)
    refuse_meta_timing(model, inputs)
    no_grad, grad = _grad_mode(no_grad, backward)
    args, kwargs = split_inputs(inputs)
    check_signature(model, args, kwargs)
    modules, infos, param_bytes = module_table(model, paths)
    device = model_device(model)
    peak_flops_per_s = _peak(peak_tflops, device, model_dtype(model))
    selected = [i.selected for i in infos]
    recorder = Recorder(modules, selected, device=device, clock=clock, memory=memory, with_stack=with_stack)
    recorder.memory_inputs = list(tensors_in((args, kwargs)))
    report = progress or (lambda stage, done, total: None)
    # Forward alone is timed by module hooks on a Python clock (the leanest); a step with
    # backward through torch's profiler, which sees autograd's engine without Python per
    # op. A fake clock (tests) keeps every pass on the recorder.
    timed: Backend | None = None
    if backward and clock is None:
        timed = _timed_backend(recorder, modules, selected, device)
    if timed is None:
        timed = RecorderSteps(recorder, detailed=False, steps=backward)
    # Op rows, shapes, FLOPs and memory from a pass under torch's profiler (recording
    # shapes and memory); the dispatch mode only where that profiler cannot run.
    detail: Backend | None = None
    if clock is None:
        detail = _detailed_backend(
            model, recorder, modules, selected, device, memory=memory, with_stack=with_stack, steps=backward,
            inputs=recorder.memory_inputs,
        )  # fmt: skip
    ops_from = None
    if detail is None:
        detail = RecorderSteps(recorder, detailed=True, steps=backward)
        ops_from = "dispatch mode" if record_ops and clock is None else None

    def step(on: Backend) -> None:
        _run_step(model, args, kwargs, on, backward=backward, loss_fn=loss_fn)

    with exclusive(model), grad, grads_restored(model, clear=backward) as clear_grads, state_restored(model):
        for n in range(warmup):
            clear_grads()
            if record_ops and n == warmup - 1 and isinstance(detail, RecorderSteps):
                with recorder.warm_detail_pass():
                    step(detail)
            else:
                step(timed)
            report("warmup", n + 1, warmup)
        try:
            for n in range(repeat):
                clear_grads()
                timed.begin_step()
                try:
                    step(timed)
                finally:
                    timed.end_step()
                report("measure", n + 1, repeat)
        finally:
            timing_passes = timed.collect()
        op_pass = None
        if record_ops:
            # Under torch's profiler a first pass takes its first-use costs (dropped).
            passes = 1 if isinstance(detail, RecorderSteps) else 2
            try:
                for _ in range(passes):
                    clear_grads()
                    detail.begin_step()
                    try:
                        step(detail)
                    finally:
                        detail.end_step()
            finally:
                streams = detail.collect()
            op_pass = streams[-1]
            report("ops", 1, 1)

    raw = RawCapture(
        modules=infos,
        timing_passes=timing_passes,
        op_pass=op_pass,
        module_shapes=recorder.module_shapes,
        has_device_time=recorder.has_device_time,
        param_bytes=param_bytes,
        memory_static=model_memory(model) if memory and record_ops else {},
        meta=_meta(
            model,
            device,
            mode="profile",
            warmup=warmup,
            repeat=repeat,
            no_grad=no_grad,
            backward=backward,
            paths=None if paths is None else list(paths),
            **_inputs_meta(args, kwargs, device),
            peak_flops_per_s=peak_flops_per_s,
            **({"ops_from": ops_from} if ops_from else {}),
        ),
    )
    return build_profile(raw)


def _profile_compiled(
    eager: nn.Module, inputs: Any, *, warmup: int, repeat: int, memory: bool,
    no_grad: bool | None, progress: Progress | None, peak_tflops: float | None,
) -> Profile:
    """A compiled model's profile: the tree, FLOPs, MACs, shapes and memory of one eager
    pass of its module (the same parameters), and each module's time from the kernels
    of layerscope's own compile of it (``capture/compiled.py``, ``attribute/compiled.py``)."""
    refuse_meta_timing(eager, inputs)
    report = progress or (lambda stage, done, total: None)
    # The eager pass records ops whatever record_ops says: FLOPs come from them. Its
    # trace and op times are dropped: they are the eager run's, not the compiled one's.
    prof = count_flops(eager, inputs, no_grad=no_grad, memory=memory)
    prof.trace = None
    for node in prof.nodes():  # the eager ops' times were the counting pass's, not the compiled run's
        for op in node.ops:
            op.cpu_time_ns = op.self_cpu_time_ns = 0
    no_grad, grad = _grad_mode(no_grad, False)
    args, kwargs = split_inputs(inputs)
    with exclusive(eager), grad, state_restored(eager):
        working = {node.path for node in prof.root.walk() if node.ops}
        run = time_compiled(eager, args, kwargs, warmup=warmup, repeat=repeat, working=working, progress=report)
    times = attribute_compiled(run.graphs, run.passes, {node.path for node in prof.root.walk()})
    for node in reversed(list(prof.root.walk())):
        node.forward.self_cpu_time_ns = times.self_ns.get(node.path, 0)
        node.forward.cpu_time_ns = node.forward.self_cpu_time_ns + sum(c.forward.cpu_time_ns for c in node.children)
    device = model_device(eager)
    prof.meta.update(
        mode="profile", warmup=warmup, repeat=repeat,
        peak_flops_per_s=_peak(peak_tflops, device, model_dtype(eager)),
        compile={
            "backend": "inductor", "rule": COMPILED_RULE, "compile_time_ns": run.compile_ns, "frames": run.frames,
            "graphs": len(run.graphs), "graph_breaks": run.graph_breaks, "step_time_ns": times.step_ns,
            "kernel_time_ns": times.kernel_ns, "kernels": [k.to_dict() for k in times.kernels],
        },
    )  # fmt: skip
    prof.meta.pop("timed", None)
    return prof


def _inputs_meta(args: tuple[Any, ...], kwargs: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """What the passes ran on: the inputs' shapes and dtypes (positional, then keyword),
    and the dtype autocast ran ops in, when it was on."""
    return {
        "inputs": [shapes_of(list(args)), shapes_of(kwargs)],
        "input_dtypes": [dtypes_of(list(args)), dtypes_of(kwargs)],
        "autocast": autocast_dtype(device),
    }


def _grad_mode(no_grad: bool | None, backward: bool) -> tuple[bool, contextlib.AbstractContextManager[Any]]:
    """``no_grad`` resolved (its default follows ``backward``) and the grad mode to run in."""
    if no_grad is None:
        no_grad = not backward
    if backward and no_grad:
        raise ValueError("backward=True needs gradients: drop no_grad=True (it is the default only without backward)")
    if no_grad:
        return True, torch.no_grad()
    return False, torch.enable_grad() if backward else contextlib.nullcontext()


def _run_step(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    capture: Backend,
    *,
    backward: bool,
    loss_fn: Callable[[Any], Any] | None,
) -> None:
    """One pass: forward, and with ``backward`` the loss (a step part) and backward."""
    output = model(*args, **kwargs)
    if backward:
        with capture.part("loss", "loss"):
            loss = loss_of(output, loss_fn)
        del output
        with capture.backward():
            loss.backward()


def _has_work(events: list[Event]) -> bool:
    """Whether a step did anything (the step left open after the last ``step()`` did not)."""
    return any(isinstance(event, (Enter, Op)) for event in events)


def _timed_backend(recorder: Recorder, modules: list[nn.Module], selected: list[bool], device: torch.device) -> Backend | None:
    """Timed steps through torch's profiler, or None where it cannot run (a user's own
    ``torch.profiler`` is already running: only one can)."""
    if not kineto.available():
        return None
    index = {id(m): i for i, (m, keep) in enumerate(zip(modules, selected)) if keep}
    return KinetoSteps(kineto.KinetoWindow(index, device=device))


def _detailed_backend(
    model: nn.Module, recorder: Recorder, modules: list[nn.Module], selected: list[bool], device: torch.device,
    *, memory: bool, with_stack: bool, steps: bool = True, inputs: list[torch.Tensor] | None = None,
) -> Backend | None:
    """Steps timed *and* detailed by one run of torch's profiler (shapes, overloads and,
    with ``memory``, allocations), or None where it cannot run."""
    if not kineto.available():
        return None
    index = {id(m): i for i, (m, keep) in enumerate(zip(modules, selected)) if keep}
    owners: dict[int, tuple[torch.Tensor, int]] = {}
    for i, (m, keep) in enumerate(zip(modules, selected)):
        if keep:
            for p in m.parameters(recurse=False):
                owners.setdefault(id(p), (p, i))
    window = kineto.KinetoWindow(
        index, device=device, detail=True, memory=memory, with_stack=with_stack, root=model,
        owners=list(owners.values()), state_tensors=recorder.state_tensors, module_shapes=recorder.module_shapes,
    )  # fmt: skip
    window.inputs = list(inputs or [])
    return KinetoSteps(window, steps=steps)


def _peak(peak_tflops: float | None, device: torch.device, dtype: str | None) -> int | None:
    if peak_tflops is not None:
        if not peak_tflops > 0:
            raise ValueError(f"peak_tflops must be a positive number of TFLOP/s, got {peak_tflops!r}")
        return int(peak_tflops * 1e12)
    from layerscope.capture.peaks import known_peak_flops_per_s

    return known_peak_flops_per_s(device, dtype)


def count_flops(
    model: nn.Module,
    inputs: Any = None,
    *,
    paths: Sequence[str] | None = None,
    no_grad: bool | None = None,
    backward: bool = False,
    loss_fn: Callable[[Any], Any] | None = None,
    memory: bool = True,
) -> Profile:
    """FLOPs, MACs, bytes, params and shapes from one pass, without timing; with
    ``backward=True`` the pass is forward, loss and backward, as in ``profile``.
    ``memory`` also tracks memory in that pass, as ``profile`` does.

    Works on the meta device: build the model under ``with torch.device("meta"):`` and
    pass meta inputs to count a model too large to run (nothing is allocated).
    Parameter and buffer values and torch's random state are left as they were.
    """
    require_module(model)
    model = eager_module(model) or model  # a compiled model's FLOPs are its eager module's
    refuse_compiled(model)
    no_grad, grad = _grad_mode(no_grad, backward)
    args, kwargs = split_inputs(inputs)
    check_signature(model, args, kwargs)
    modules, infos, param_bytes = module_table(model, paths)
    device = model_device(model)
    recorder = Recorder(modules, [i.selected for i in infos], device=torch.device("cpu"), memory=memory)
    recorder.memory_inputs = list(tensors_in((args, kwargs)))
    detail = RecorderSteps(recorder, detailed=True, steps=backward)
    with exclusive(model), grad, grads_restored(model, clear=backward) as clear_grads, state_restored(model):
        clear_grads()
        detail.begin_step()
        try:
            _run_step(model, args, kwargs, detail, backward=backward, loss_fn=loss_fn)
        finally:
            detail.end_step()
    (op_pass,) = detail.collect()
    raw = RawCapture(
        modules=infos,
        op_pass=op_pass,
        module_shapes=recorder.module_shapes,
        param_bytes=param_bytes,
        memory_static=model_memory(model) if memory else {},
        meta=_meta(
            model, device, mode="count", timed=False, no_grad=no_grad, backward=backward,
            paths=None if paths is None else list(paths),
            **_inputs_meta(args, kwargs, device),
        ),
    )
    return build_profile(raw)


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

    In a training loop, call ``prof.step()`` after each step. The first step of a block
    (with a schedule: each cycle's last warm-up step, else its first recorded step) is
    its *detail step*: ops, shapes, FLOPs, memory and activations are recorded under a
    dispatch mode, and its times are not used. The steps after it are timed through
    torch's own profiler, with one range per module call and nothing Python per op, so
    module times are not inflated by the measuring. Times and calls are the timed
    steps' sums, the detail step's counts stand for each of them (``meta["steps"]``,
    ``meta["detail_step"]``), and the profile keeps each step's wall time
    (``meta["step_times_ns"]``). A block of one step takes its times from its detail
    step (``meta["times_from"]``). With ``schedule=layerscope.schedule(...)`` only the
    active steps of each cycle are recorded and ``on_ready(profile)`` receives each
    cycle's profile; idle steps install nothing. Events are folded into running totals
    as they are read (torch's profiler at most every ``WINDOW_STEPS`` steps), so memory
    stays flat on long runs. Only the thread that opened the block is recorded (and
    autograd's, for its backward).

    ``record_ops=False`` records module forward times only, by two hooks on a clock (no
    detail step, no torch profiler: no ops, FLOPs, memory or backward), the leanest
    timing; ``memory=False`` keeps ops but not memory;
    ``with_stack=True`` keeps each op's Python call site (``OpStats.stack``). If the
    block raises, what was captured up to then is kept, marked
    ``meta["complete"] = False``.

    torch.profiler's arguments (``activities``, ``record_shapes``, ``profile_memory``,
    ``on_trace_ready``, ``schedule=torch.profiler.schedule(...)``) and reading calls
    (``key_averages``, ``export_chrome_trace``, ``export_stacks``, ``step_num``) work
    too, with their meanings: see ``layerscope.compat.torch_profiler``.
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
        activities: Sequence[Any] | None = None,
        record_shapes: bool | None = None,
        profile_memory: bool | None = None,
        on_trace_ready: Callable[[Profiler], Any] | None = None,
    ) -> None:
        self.model = require_module(model)
        # torch.profiler's arguments, with their meanings: see layerscope.compat.torch_profiler.
        from layerscope.compat import torch_profiler

        memory, schedule, on_ready = torch_profiler.options(
            self, memory=memory, schedule=schedule, on_ready=on_ready, activities=activities,
            record_shapes=record_shapes, profile_memory=profile_memory, on_trace_ready=on_trace_ready,
        )
        if schedule is not None and not callable(schedule):
            raise TypeError(f"schedule must be a layerscope.schedule(...) (a callable step -> action), got {schedule!r}")
        if on_ready is not None and not callable(on_ready):
            raise TypeError(f"on_ready must be a callable taking a Profile, got {on_ready!r}")
        self._paths = paths
        self._record_ops = record_ops
        self._memory = memory and record_ops
        self._with_stack = with_stack and record_ops
        self._clock = clock
        self._schedule = schedule
        self._on_ready = on_ready
        self._stack: contextlib.ExitStack | None = None
        self._recorder: Recorder | None = None
        self._backend: Backend | None = None
        #: Whether steps are read back in windows (torch's profiler), not one by one.
        self._windowed = False
        #: Why the times are not from torch's profiler, when they are not.
        self._times_from: str | None = None
        self._running: Backend | None = None
        #: Steps recorded in the profiler's current window: (step number, action).
        self._window_steps: list[tuple[int, Action]] = []
        self._infos: list[Any] = []
        self._param_bytes = 0
        self._profile: Profile | None = None
        self._steps = Accumulator()
        self._step = 0
        self._cycle_first: int | None = None
        self._cycle_last: int | None = None
        self._step_action = Action.NONE
        self._delivered = 0
        self._identity: dict[str, Any] = {}

    # -- running ------------------------------------------------------------------------
    def __enter__(self) -> Profiler:
        if self._stack is not None or self._profile is not None:
            raise ProfilerStateError("this Profiler has already run; use a new one for each block")
        refuse_compiled(self.model)
        refuse_meta_timing(self.model)
        modules, self._infos, self._param_bytes = module_table(
            self.model, self._paths, with_repr=self._record_ops
        )
        self._device = model_device(self.model)
        selected = [i.selected for i in self._infos]
        self._recorder = Recorder(
            modules,
            selected,
            device=self._device,
            clock=self._clock,
            memory=self._memory,
            with_stack=self._with_stack,
        )
        # Every step goes through one backend. With ops: torch's profiler, recording
        # shapes and memory, times and detail from the same run; where it cannot run (a
        # user's torch.profiler already does, or a fake clock in tests) a dispatch mode,
        # whose times are not faithful (meta["times_from"] says so). record_ops=False
        # is the leanest timing: module hooks on a clock, forward only.
        backend: Backend | None = None
        if self._record_ops and self._clock is None:
            backend = _detailed_backend(
                self.model, self._recorder, modules, selected, self._device, memory=self._memory,
                with_stack=self._with_stack,
            )  # fmt: skip
        if backend is None:
            backend = RecorderSteps(self._recorder, detailed=self._record_ops)
            if self._record_ops and self._clock is None:  # a given clock times by design
                self._times_from = "dispatch mode"
        self._backend = backend
        self._windowed = isinstance(backend, KinetoSteps)
        self._parents = parent_indices(self._infos)
        # Rank, world size, host and the run id (agreed with the other ranks once).
        self._identity = distributed.identity()
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(exclusive(self.model))
            self._stack = stack
            self._begin_step()
        except BaseException:
            self._stack = None
            stack.close()
            raise
        return self

    def _action(self, step: int) -> Action:
        if self._schedule is None:
            return Action.RECORD
        action = self._schedule(step)
        return Action[action.name] if not isinstance(action, Action) else action

    def _begin_step(self) -> None:
        action = self._action(self._step)
        if action is Action.NONE:
            return
        backend = self._backend
        assert backend is not None
        backend.begin_step()
        self._running = backend
        self._step_action = action
        if self._windowed:
            self._window_steps.append((self._step, action))

    def _end_step(self) -> None:
        """Close the running step; a dispatch-mode step is walked now, the profiler's
        when their window is read back (every ``WINDOW_STEPS`` steps, and at the cycle's
        end)."""
        backend, self._running = self._running, None
        if backend is None:
            return
        backend.end_step()
        if not self._windowed:
            (events,) = backend.collect()
            self._add_step(events, self._step, self._step_action)
        elif len(self._window_steps) >= WINDOW_STEPS:
            self._read_window()

    def _read_window(self) -> None:
        """Stop the profiler, and fold its steps into the running totals."""
        if not self._windowed or not self._window_steps:
            return
        assert self._backend is not None
        steps, self._window_steps = self._window_steps, []
        streams = self._backend.collect()
        for events, (number, action) in zip(streams, steps):
            self._add_step(events, number, action)

    def _add_step(self, events: list[Event], number: int, action: Action) -> None:
        # The step left open after the last step() call usually ran nothing: drop it
        # (but keep a lone step, so a block where nothing ran still has a profile).
        keep = _has_work(events) or (number == 0 and self._schedule is None)
        if action is Action.WARMUP or not keep:
            return
        assert self._recorder is not None
        paths = [info.path for info in self._infos]
        result = walk_pass(
            events,
            paths,
            has_device=self._recorder.has_device_time or self._backend.has_device_time,  # type: ignore[union-attr]
            collect_ops=self._record_ops,
            parents=self._parents,
        )
        self._steps.add(result, number)
        if self._cycle_first is None or number < self._cycle_first:
            self._cycle_first = number
        self._cycle_last = max(number, self._cycle_last if self._cycle_last is not None else number)

    def step(self) -> None:
        """Mark the end of a training step (call it once per step, after ``opt.step()``)."""
        if self._stack is None:
            raise ProfilerStateError(
                "step() called outside a running Profiler: call it inside the "
                "`with layerscope.Profiler(model) as prof:` block, once per training step"
            )
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

    def _deliver(self, *, complete: bool) -> Profile | None:
        self._read_window()
        if not self._steps.steps:
            return None
        profile = self._build(complete=complete)
        self._steps = Accumulator()
        self._cycle_first = self._cycle_last = None
        self._profile = profile
        self._delivered += 1
        if self._on_ready is not None:
            self._on_ready(profile)
        return profile

    def _build(self, *, complete: bool) -> Profile:
        assert self._recorder is not None
        raw = RawCapture(
            modules=self._infos,
            module_shapes=self._recorder.module_shapes,
            has_device_time=self._recorder.has_device_time,
            param_bytes=self._param_bytes,
            memory_static=model_memory(self.model) if self._memory else {},
            meta=_meta(
                self.model,
                self._device,
                mode="context",
                paths=None if self._paths is None else list(self._paths),
                step_range=[self._cycle_first, self._cycle_last],
                complete=complete,
                schedule=None if self._schedule is None else str(self._schedule),
                **self._identity,
                **({"times_from": self._times_from} if self._times_from else {}),
            ),
        )
        return build_from_steps(raw, self._steps, counted=self._record_ops)

    def __exit__(self, *exc_info: Any) -> bool:
        assert self._stack is not None
        failed = exc_info[0] is not None
        try:
            self._end_step()
        finally:
            try:
                self._stack.close()
            finally:
                self._stack = None
                # Without a schedule the block is one cycle; with one, steps recorded
                # since the last delivered cycle are a cycle cut short.
                complete = not failed and self._schedule is None
                try:
                    self._deliver(complete=complete)
                except Exception as exc:
                    if not failed:
                        raise
                    warnings.warn(f"layerscope: on_ready failed while the block was raising: {exc!r}", stacklevel=2)
        return False

    # -- the Profile reading API ------------------------------------------------------
    @property
    def profile(self) -> Profile:
        """The last profile built: the whole block, or the last cycle with a schedule."""
        if self._profile is None:
            if self._stack is not None:
                state = "still running"
            elif self._recorder is not None:
                state = "finished without recording a step (the schedule never reached an active step)"
            else:
                state = "not started"
            raise ProfilerStateError(f"the Profiler is {state}; read it after its with-block ends")
        return self._profile

    def __getattr__(self, name: str) -> Any:
        # Reading methods (to_dict, save, render, node, ...) are the Profile's own.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.profile, name)

    def __getitem__(self, path: str) -> Any:
        return self.profile[path]

    def __str__(self) -> str:
        return str(self.profile)

    # -- torch.profiler's names (layerscope.compat.torch_profiler) ----------------------
    @property
    def step_num(self) -> int:
        """How many steps ``step()`` has ended (torch.profiler's name)."""
        return self._step

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0) -> Any:
        """The ops averaged by name (and shapes, and stack), printed by ``.table(sort_by=...)``."""
        from layerscope.compat import torch_profiler

        return torch_profiler.key_averages(self.profile, group_by_input_shape, group_by_stack_n)

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """The Chrome trace of the profile (its detail step)."""
        from layerscope.compat import torch_profiler

        torch_profiler.export_chrome_trace(self.profile, path)

    def export_stacks(self, path: str | os.PathLike[str], metric: str = "self_cpu_time_total") -> None:
        """Folded stacks for flamegraph.pl, in whole microseconds of ``metric``."""
        from layerscope.compat import torch_profiler

        torch_profiler.export_stacks(self.profile, path, metric)
