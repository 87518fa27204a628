"""The Chrome trace (Trace Event Format), for Perfetto and ``chrome://tracing``.

Drawn from ``Profile.trace``: module, label and step-part spans on the timeline with
their ops nested inside, forward and backward (in backward a module's span covers the
ops traced to it and to its descendants). Every span is a complete event (``"ph": "X"``)
with times in microseconds on a binary grid finer than a nanosecond (see
:func:`_grid`), so spans nest exactly as a viewer reads them, in float arithmetic. Args
carry the path, phase, shapes and FLOPs per call. Flow arrows (``"ph": "s"``/``"f"``)
lead from each forward op that created an autograd node to the first op run for that node
in backward. A track of its own holds one span for the traced step (``step N``, or
``pass N`` for ``profile()``'s median pass), when the run had step marks.

Memory, the traced run's (one step's timeline, or for steps summed the traced step's
own, ``Trace.memory``): a counter of live bytes over time, a counter of the same bytes
split by category (parameters, gradients, optimizer state, activations, other: viewers
stack them), and, where the step's peak is the traced run's, an instant event at the
peak whose args are the peak's bytes by category.

``otherData`` says how the times were measured: the spans are the traced run's own
times, recorded by torch's profiler (or, where it could not run, under a dispatch mode,
``meta.times_from``); a ``Profiler``'s module times are the sum of its steps, the trace
its last step; ``profile()``'s are its median pass's, the traced run itself. The document is yielded event by event, so saving a big trace
streams it to disk.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

from layerscope.base.errors import RenderError
from layerscope.base.formats import register_renderer
from layerscope.base.version import __version__
from layerscope.model.runfacts import RunFacts, RunFigures
from layerscope.model.sidedocs import Timeline
from layerscope.model.tree import Profile

_TID = 1
#: The step's own track, above the spans.
_STEP_TID = 0


#: Times are written on a grid of 2**-GRID_BITS µs (about 0.24 ns), whose values a
#: double holds exactly; see :func:`_grid`.
GRID_BITS = 12
_GRID = 1 << GRID_BITS
#: The decimal digits of one grid step: 2**-12 == 5**12 / 10**12.
_STEP_DIGITS = 5**GRID_BITS


def _grid(ns: int) -> int:
    """Integer nanoseconds as a whole number of grid steps, rounded up.

    A viewer reads ``ts`` and ``dur`` as doubles and ends a span at ``ts + dur``. With
    three decimals of microseconds, the doubles are not the decimals, and two spans that
    end on the same nanosecond can end one ulp apart: a child past its parent, a span
    past its successor's start. On a binary grid each value is a double exactly, and so
    is the sum of two (below 2**41 µs, 25 days), so ``ts + dur`` is exactly the end on
    the grid, and spans that nest or touch in nanoseconds nest or touch as read. The
    step is finer than a nanosecond, so reading a time back rounds to its exact
    nanosecond (and, rounded up, truncating a start does too, as Perfetto's importer does).
    """
    return -((-ns * _GRID) // 1000)


def _us(steps: int) -> str:
    """Grid steps as exact decimal microseconds (at most 12 decimals, trailing zeros cut)."""
    whole, fraction = divmod(steps, _GRID)
    if not fraction:
        return str(whole)
    return f"{whole}.{fraction * _STEP_DIGITS:012d}".rstrip("0")


def _ts(ns: int) -> str:
    return _us(_grid(ns))


def _event(name: str, cat: str, start_ns: int, dur_ns: int, pid: int, args: dict[str, Any], tid: int = _TID) -> str:
    # The end is put on the grid, not the duration: dur is the difference of two grid
    # points, so the start plus dur is the end exactly.
    start = _grid(start_ns)
    return (
        f'{{"name":{json.dumps(name, ensure_ascii=False)},"cat":"{cat}","ph":"X",'
        f'"ts":{_us(start)},"dur":{_us(_grid(start_ns + dur_ns) - start)},"pid":{pid},"tid":{tid},'
        f'"args":{json.dumps(args, ensure_ascii=False, separators=(",", ":"))}}}'
    )


def _span_events(profile: Profile, pid: int) -> Iterator[str]:
    assert profile.trace is not None
    model = str(profile.meta.model or profile.root.type)
    nodes: dict[str, Any] = {}
    spans = profile.trace.spans
    for start, duration, path, phase, index in zip(spans.start_ns, spans.duration_ns, spans.path, spans.phase, spans.op_index):
        node = nodes.get(path)
        if node is None:
            node = nodes[path] = profile.node(path)
        if index < 0:
            name = path or model
            args = {"path": path, "type": node.type, "phase": phase}
            yield _event(name if phase != "backward" else f"{name} (backward)", f"{node.kind},{phase}", start, duration, pid, args)
            continue
        op = node.ops[index]
        args = {"module": path or model, "phase": phase, "input_shapes": op.input_shapes}
        if op.flops is not None and op.calls:
            args["flops"] = op.flops // op.calls
        if op.alloc_bytes is not None and op.calls:
            args["alloc_bytes"] = op.alloc_bytes // op.calls
        yield _event(op.name, f"op,{phase}", start, duration, pid, args)


def _flow_events(profile: Profile, pid: int) -> Iterator[str]:
    """A flow per autograd node: from the forward op that created it (the arrow starts
    inside that op's span) to the first op run for it in backward (bound to its start)."""
    assert profile.trace is not None
    starts, flows = profile.trace.spans.start_ns, profile.trace.flows
    for n, (forward, backward) in enumerate(zip(flows.forward, flows.backward)):
        start, end = starts[forward], starts[backward]
        common = f'"name":"autograd","cat":"flow","id":{n},"pid":{pid},"tid":{_TID}'
        yield f'{{{common},"ph":"s","ts":{_ts(start)}}}'
        yield f'{{{common},"ph":"f","bp":"e","ts":{_ts(end)}}}'


def _memory_events(profile: Profile, pid: int) -> Iterator[str]:
    # The traced run's memory: the profile's timeline where it is that run (one step, a
    # pass), else the traced step's own (Trace.memory); the step's peak marked only where
    # it is the traced run's.
    memory = profile.memory
    if not memory:
        return
    one_run = int(profile.figures.steps or 1) == 1
    own = profile.trace.memory if profile.trace is not None else None
    if not one_run and own is None:
        return  # a file from before the traced step kept its own timeline
    timeline = (memory.timeline if one_run else own) or Timeline()
    for t, live in zip(timeline.t_ns, timeline.bytes):
        yield f'{{"name":"live memory","ph":"C","ts":{_ts(t)},"pid":{pid},"tid":{_TID},"args":{{"bytes":{live}}}}}'
    split = timeline.categories or {}
    names = list(split)
    for i, t in enumerate(timeline.t_ns if names else []):
        args = ",".join(f"{json.dumps(name)}:{split[name][i]}" for name in names)
        yield f'{{"name":"memory by category","ph":"C","ts":{_ts(t)},"pid":{pid},"tid":{_TID},"args":{{{args}}}}}'
    at = memory.peak_at
    if one_run and at is not None and at.t_ns is not None:
        peak: dict[str, Any] = {"bytes": memory.peak_bytes, **memory.peak_categories}
        peak.update({"path": at.path or profile.meta.model, "phase": at.phase})
        yield (
            f'{{"name":"memory peak","ph":"i","s":"t","ts":{_ts(at.t_ns)},"pid":{pid},"tid":{_TID},'
            f'"args":{json.dumps(peak, separators=(",", ":"))}}}'
        )


def traced_step(meta: RunFacts) -> int | None:
    """The number of the step the trace holds: a ``Profiler``'s last step (its detail
    step in a file written when one step was recorded apart); None for ``profile()``'s
    op pass."""
    if meta.mode != "context":
        return None
    if meta.detail_step is not None:
        return int(meta.detail_step)
    return meta.step_range[1] if meta.step_range else None


def _step_events(profile: Profile, pid: int) -> Iterator[str]:
    assert profile.trace is not None
    step_ns = profile.trace.step_ns
    if step_ns is None:
        return
    number = traced_step(profile.meta)
    name = _run_name(profile.figures, number)
    yield f'{{"name":"thread_name","ph":"M","pid":{pid},"tid":{_STEP_TID},"args":{{"name":"step"}}}}'
    yield _event(name, "step", 0, step_ns, pid, {"step": number, "step_ns": step_ns}, tid=_STEP_TID)


def _run_name(figures: RunFigures, number: int | None) -> str:
    """The traced run: ``step N`` of a block, ``pass N`` of ``profile()`` (its median,
    counted from 1), ``op pass`` in files whose ``profile()`` traced a pass of its own."""
    if number is not None:
        return f"step {number}"
    return "op pass" if figures.shown_pass is None else f"pass {figures.shown_pass + 1}"


def _count(n: Any, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"


def timing_metadata(profile: Profile) -> dict[str, Any]:
    """How the trace's times and the profile's times were measured, for ``otherData``."""
    meta, figures = profile.meta, profile.figures
    number = traced_step(meta)
    if meta.mode == "profile" and figures.shown_pass is not None:
        which = "the one pass" if meta.repeat == 1 else f"pass {figures.shown_pass + 1}, the median of {meta.repeat}"
        times = f"every figure: {which} after {meta.warmup} warm-up, the traced run itself"
    elif meta.mode == "profile":
        times = (
            f"module times: median of {_count(meta.repeat, 'timed pass')} after "
            f"{meta.warmup} warm-up, apart from the traced op pass"
        )
    else:
        times = (
            f"module times: the sum of {_count(figures.steps, 'step')}, each timed with its ops, shapes, "
            "FLOPs and memory in one run; the trace is the last step"
        )
    facts = {
        "mode": meta.mode, "times_from": meta.times_from, "ops_from": meta.ops_from, "steps": figures.steps,
        "step_range": meta.step_range, "repeat": meta.repeat, "warmup": meta.warmup,
    }
    dispatch = "dispatch mode" in (meta.times_from, meta.ops_from)  # ops_from: older files
    return {
        "trace_run": _run_name(figures, number),
        "trace_times": "the traced run's own, recorded under a dispatch mode (slower than an unrecorded run)"
        if dispatch
        else "the traced run's own, recorded by torch's profiler with shapes and memory",
        "times": times,
        **{key: value for key, value in facts.items() if value is not None},
        "time_unit": "ts and dur in µs on a 2^-12 µs grid: round(x * 1000) is the exact ns",
    }


def process_events(profile: Profile, pid: int, process_name: str) -> Iterator[str]:
    """One profile's events as process ``pid``: its name, then spans, flows and memory.
    A Chrome trace of several profiles (the ranks of a run) holds one such process each."""
    if profile.trace is None and profile.compiled:
        raise RenderError(
            "a compiled model's profile keeps no trace (the eager pass's spans would not be the compiled run's); "
            "its kernels and their times: --format kernels"
        )
    if profile.trace is None and profile.figures.detailed_steps:
        raise RenderError(
            "this block's profile keeps no trace: its times are the light steps' means and its op rows the "
            "detailed step's, and no one run holds both; for a timeline profile with detail='every', the default"
        )
    if profile.trace is None:
        raise RenderError(
            "this profile has no trace to draw: it was made without recording ops "
            "(record_ops=False / --no-ops); profile again with ops recorded, the default"
        )
    if not profile.timed:
        raise RenderError("this profile was counted, not timed (count_flops / layerscope flops): it has no timeline")
    yield f'{{"name":"process_name","ph":"M","pid":{pid},"tid":0,"args":{{"name":{json.dumps(process_name)}}}}}'
    yield f'{{"name":"thread_name","ph":"M","pid":{pid},"tid":{_TID},"args":{{"name":"forward and backward"}}}}'
    yield from _step_events(profile, pid)
    yield from _span_events(profile, pid)
    yield from _flow_events(profile, pid)
    yield from _memory_events(profile, pid)


def document(processes: Iterator[str], other: dict[str, Any]) -> Iterator[str]:
    """The Trace Event Format document around ``processes``' events, in pieces."""
    yield '{"traceEvents":[\n'
    for n, event in enumerate(processes):
        yield event if n == 0 else ",\n" + event
    yield '\n],"displayTimeUnit":"ns","otherData":' + json.dumps(other) + "}\n"


@register_renderer(
    "chrome",
    extensions=(".trace.json",),
    description="a Chrome trace / Perfetto JSON of one run: module spans over their ops",
    chunks=True,
)
def render_chrome(profile: Profile) -> Iterator[str]:
    """The trace, in pieces (see the module docstring)."""
    pid = int(profile.meta.rank or 0)
    model = str(profile.meta.model or profile.root.type)
    events = process_events(profile, pid, f"{model} (layerscope)")
    first = next(events)  # a profile without a trace is refused before anything is written
    other = {"layerscope_version": __version__, "model": model, "device": profile.meta.device}
    other.update(timing_metadata(profile))
    yield from document(itertools.chain([first], events), other)
