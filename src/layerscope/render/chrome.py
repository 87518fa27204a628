"""The Chrome trace (Trace Event Format), for Perfetto and ``chrome://tracing``.

Drawn from ``Profile.trace``: module, label and step-part spans on the timeline with
their ops nested inside, forward and backward (in backward a module's span covers the
ops traced to it and to its descendants). Every span is a complete event (``"ph": "X"``)
with times in microseconds written to the nanosecond, so nesting survives exactly. Args
carry the path, phase, shapes and FLOPs per call. Flow arrows (``"ph": "s"``/``"f"``)
lead from each forward op that created an autograd node to the first op run for that node
in backward. With one step's memory, a counter track draws live bytes. The document is yielded event by event, so saving a big trace streams
it to disk.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

from layerscope import __version__
from layerscope.errors import RenderError
from layerscope.render import register_renderer
from layerscope.tree import Profile

_TID = 1


def _us(ns: int) -> str:
    # Integer nanoseconds as exact microseconds (three decimals): no rounding to break nesting.
    return f"{ns // 1000}.{ns % 1000:03d}"


def _event(name: str, cat: str, start_ns: int, dur_ns: int, pid: int, args: dict[str, Any]) -> str:
    return (
        f'{{"name":{json.dumps(name, ensure_ascii=False)},"cat":"{cat}","ph":"X",'
        f'"ts":{_us(start_ns)},"dur":{_us(dur_ns)},"pid":{pid},"tid":{_TID},'
        f'"args":{json.dumps(args, ensure_ascii=False, separators=(",", ":"))}}}'
    )


def _span_events(profile: Profile, pid: int) -> Iterator[str]:
    assert profile.trace is not None
    model = str(profile.meta.get("model") or profile.root.type)
    nodes: dict[str, Any] = {}
    for start, duration, path, phase, index in profile.trace["spans"]:
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
    spans = profile.trace["spans"]
    for n, (forward, backward) in enumerate(profile.trace.get("flows") or ()):
        start, end = spans[forward][0], spans[backward][0]
        common = f'"name":"autograd","cat":"flow","id":{n},"pid":{pid},"tid":{_TID}'
        yield f'{{{common},"ph":"s","ts":{_us(start)}}}'
        yield f'{{{common},"ph":"f","bp":"e","ts":{_us(end)}}}'


def _memory_events(profile: Profile, pid: int) -> Iterator[str]:
    # The memory timeline and the trace come from the same run only for a single step.
    memory = profile.memory
    if not memory or int(profile.meta.get("steps") or 1) != 1:
        return
    timeline = memory.get("timeline") or {}
    for t, live in zip(timeline.get("t_ns") or [], timeline.get("bytes") or []):
        yield f'{{"name":"live memory","ph":"C","ts":{_us(t)},"pid":{pid},"tid":{_TID},"args":{{"bytes":{live}}}}}'


def process_events(profile: Profile, pid: int, process_name: str) -> Iterator[str]:
    """One profile's events as process ``pid``: its name, then spans, flows and memory.
    A Chrome trace of several profiles (the ranks of a run) holds one such process each."""
    if profile.trace is None:
        raise RenderError(
            "this profile has no trace to draw: it was made without recording ops "
            "(record_ops=False / --no-ops); profile again with ops recorded, the default"
        )
    if not profile.timed:
        raise RenderError("this profile was counted, not timed (count_flops / layerscope flops): it has no timeline")
    yield f'{{"name":"process_name","ph":"M","pid":{pid},"tid":0,"args":{{"name":{json.dumps(process_name)}}}}}'
    yield f'{{"name":"thread_name","ph":"M","pid":{pid},"tid":{_TID},"args":{{"name":"forward and backward"}}}}'
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
def render_chrome(profile: Profile, **_: Any) -> Iterator[str]:
    """The trace, in pieces (see the module docstring)."""
    pid = int(profile.meta.get("rank") or 0)
    model = str(profile.meta.get("model") or profile.root.type)
    events = process_events(profile, pid, f"{model} (layerscope)")
    first = next(events)  # a profile without a trace is refused before anything is written
    other = {"layerscope_version": __version__, "model": model, "device": profile.meta.get("device")}
    yield from document(itertools.chain([first], events), other)
