"""Write a big synthetic torch.profiler (Kineto) trace by tiling a real one.

    python benchmarks/trace_tile.py SOURCE.json.gz OUT.json.gz --events 1000000
    python -m benchmarks.trace_tile SOURCE.json.gz OUT.json.gz --events 1000000

The output is the source trace with its ``traceEvents`` repeated ("copies") until it holds
exactly ``--events`` events, for measuring how readers and importers scale on real event
shapes (the real traces are in ../shared/traces/, see its README.md). Copy k is the source's
events with:

- every ``ts`` moved k x (the source's time span + ``--gap-us``) later, in whole
  microseconds; the arithmetic is on integer nanoseconds, and decimal timestamps are
  written back with three decimals, so none is rounded by a float;
- every id that links events moved by k x a power of ten above the source's largest id,
  so that copies never share one while the links inside a copy hold: ``args``
  ``correlation`` (launch <-> kernel), ``External id``, ``Python id`` and ``Python parent
  id`` (the Python call tree), ``Sequence number`` (forward op <-> its backward), and the
  ``id`` of flow events (``ph`` "s", "f", "t": ``ac2g`` and ``fwdbwd`` arrows);
  negative and null ids are kept as they are.

Metadata events (``ph: M``: process and thread names) are written once, in copy 0. The
last copy is cut short to reach ``--events`` exactly, so a few of its links may lack
their other end. Every other top-level key is kept, in the source's order, and every
number is written as the source wrote it. OUT is gzip-compressed when its name ends in
``.gz`` (the source's compression is told by its content), and written atomically (a
temporary file in OUT's folder, renamed over OUT at the end). Events are streamed out; the
source's events are held in memory as text templates (about twice its JSON size).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from layerscope.base.io import write_atomic
from layerscope.base.kineto_json import FloatText, open_trace, us_to_ns

#: ``args`` keys whose integer values link events; moved per copy.
LINK_ARGS = ("correlation", "External id", "Python id", "Python parent id", "Sequence number")
#: Flow events, whose ``id`` pairs a start with its end.
FLOW_PHASES = frozenset({"s", "f", "t"})
#: Text chunks handed to the writer, in characters.
WRITE_CHARS = 1 << 20

# A placeholder for a number written from a slot: json.dumps writes the string
# "\x00<n>\x00" as "\u0000<n>\u0000", which then marks where slot n goes.
_MARK = "\x00{}\x00"
_MARKED = re.compile(r'"\\u0000(\d+)\\u0000"')

# Slot kinds: a number's text as the source wrote it, a timestamp (ns; a JSON integer or a
# decimal), an id.
_TEXT, _TS_INT, _TS_DECIMAL, _ID = range(4)


@dataclass
class Template:
    """One value's JSON text with holes: ``pieces[0] slot[0] pieces[1] ... pieces[-1]``."""

    pieces: list[str]
    slots: list[tuple[int, Any]]

    def render(self, shift_ns: int, id_shift: int) -> str:
        if not self.slots:
            return self.pieces[0]
        pieces = self.pieces
        out = [pieces[0]]
        for i, (kind, value) in enumerate(self.slots, 1):
            if kind == _TEXT:
                out.append(value)
            elif kind == _ID:
                out.append(str(value + id_shift))
            elif kind == _TS_INT:
                out.append(str((value + shift_ns) // 1000))
            else:
                out.append(_decimal_us(value + shift_ns))
            out.append(pieces[i])
        return "".join(out)


@dataclass
class Source:
    """A trace read for tiling: its events as templates, and its other top-level keys."""

    events: list[Template] = field(default_factory=list)
    #: Whether each event is a metadata event (``ph: M``), written once.
    metadata: list[bool] = field(default_factory=list)
    #: The top-level keys before and after ``traceEvents``, as templates.
    before: list[tuple[str, Template]] = field(default_factory=list)
    after: list[tuple[str, Template]] = field(default_factory=list)
    first_ns: int | None = None
    last_ns: int | None = None
    max_id: int = 0


def _decimal_us(ns: int) -> str:
    """Integer nanoseconds as microseconds with three decimals."""
    sign = "-" if ns < 0 else ""
    whole, part = divmod(abs(ns), 1000)
    return f"{sign}{whole}.{part:03d}"


class _Marker:
    """Builds a template: replaces the values that become slots by placeholders."""

    def __init__(self) -> None:
        self.slots: list[tuple[int, Any]] = []

    def slot(self, kind: int, value: Any) -> str:
        self.slots.append((kind, value))
        return _MARK.format(len(self.slots) - 1)

    def floats(self, value: Any) -> Any:
        """``value`` with every float (:class:`FloatText`) a slot of its own text."""
        if isinstance(value, FloatText):
            return self.slot(_TEXT, str(value))
        if isinstance(value, dict):
            return {key: self.floats(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.floats(item) for item in value]
        return value

    def template(self, value: Any) -> Template:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        parts = _MARKED.split(text)
        pieces, found = parts[0::2], [int(n) for n in parts[1::2]]
        if sorted(found) != list(range(len(self.slots))):
            raise ValueError("the source holds text that looks like this tool's placeholders")
        return Template(pieces, [self.slots[n] for n in found])


def _event_template(event: dict[str, Any], source: Source) -> Template:
    marker = _Marker()
    marked = dict(event)
    if event.get("ph") != "M" and "ts" in event:
        ts = event["ts"]
        ns = us_to_ns(ts)
        marked["ts"] = marker.slot(_TS_INT if type(ts) is int else _TS_DECIMAL, ns)
        end = ns + max(0, us_to_ns(event.get("dur", 0)))
        source.first_ns = ns if source.first_ns is None else min(source.first_ns, ns)
        source.last_ns = end if source.last_ns is None else max(source.last_ns, end)
    if event.get("ph") in FLOW_PHASES:
        flow_id = event.get("id")
        if type(flow_id) is int and flow_id >= 0:
            marked["id"] = marker.slot(_ID, flow_id)
            source.max_id = max(source.max_id, flow_id)
    args = event.get("args")
    if isinstance(args, dict):
        marked["args"] = args = dict(args)
        for key in LINK_ARGS:
            value = args.get(key)
            if type(value) is int and value >= 0:
                args[key] = marker.slot(_ID, value)
                source.max_id = max(source.max_id, value)
    return marker.template(marker.floats(marked))


def read_source(path: str) -> Source:
    source = Source()
    keys_before: list[str] | None = None
    with open_trace(path) as trace:
        for event in trace.events():
            if keys_before is None:
                keys_before = list(trace.meta)
            source.events.append(_event_template(event, source))
            source.metadata.append(event.get("ph") == "M")
        meta = trace.meta
    if keys_before is None:
        keys_before = []  # no events: the list goes first
    for key, value in meta.items():
        marker = _Marker()
        entry = (key, marker.template(marker.floats(value)))
        (source.before if key in keys_before else source.after).append(entry)
    return source


def tile(source: Source, events: int, gap_us: int) -> Iterator[str]:
    """The tiled trace's JSON text, in chunks of about :data:`WRITE_CHARS` characters."""
    span_ns = (source.last_ns or 0) - (source.first_ns or 0)
    shift_us = -(-span_ns // 1000) + gap_us  # whole microseconds: JSON-integer times stay integers
    id_step = 10 ** len(str(source.max_id))
    buffer: list[str] = ["{"]
    size = 0

    def keys(entries: list[tuple[str, Template]]) -> Iterable[str]:
        for key, template in entries:
            yield f"{json.dumps(key, ensure_ascii=False)}:{template.render(0, 0)},"

    buffer.extend(keys(source.before))
    buffer.append('"traceEvents":[')
    written = 0
    copy = 0
    tileable = not all(source.metadata)
    while written < events and (copy == 0 or tileable):
        shift_ns = copy * shift_us * 1000
        id_shift = copy * id_step
        for template, metadata in zip(source.events, source.metadata):
            if written == events:
                break
            if metadata and copy > 0:
                continue
            text = template.render(shift_ns, id_shift)
            buffer.append(f",{text}" if written else text)
            written += 1
            size += len(text)
            if size >= WRITE_CHARS:
                yield "".join(buffer)
                buffer, size = [], 0
        copy += 1
    buffer.append("]")
    after = list(keys(source.after))
    if after:
        buffer.append(",")
        buffer.append("".join(after)[:-1])
    buffer.append("}")
    yield "".join(buffer)


def gzipped(chunks: Iterable[str], level: int) -> Iterator[bytes]:
    """The chunks as one gzip stream (no file name, time 0: the same input gives the same bytes)."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    for chunk in chunks:
        data = compressor.compress(chunk.encode("utf-8"))
        if data:
            yield data
    yield compressor.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="SOURCE", help="a Kineto trace, .json or .json.gz")
    parser.add_argument("out", metavar="OUT", help="the trace to write (.json.gz is compressed)")
    parser.add_argument("--events", type=int, default=1_000_000, help="events in OUT (default: 1,000,000)")
    parser.add_argument(
        "--gap-us", type=int, default=1000, help="idle microseconds between one copy's end and the next (default: 1000)"
    )
    parser.add_argument("--level", type=int, default=6, choices=range(1, 10), metavar="1-9",
                        help="gzip compression level (default: 6, zlib's)")
    args = parser.parse_args(argv)
    if args.events < 1:
        parser.error("--events must be at least 1")
    start = time.perf_counter()
    source = read_source(args.source)
    tiled = sum(not m for m in source.metadata)
    if args.events > len(source.events) and not tiled:
        parser.error(f"{args.source} has only metadata events ({len(source.events):,}); nothing to tile")
    chunks: Iterable[Any] = tile(source, args.events, args.gap_us)
    if args.out.endswith(".gz"):
        chunks = gzipped(chunks, args.level)
    write_atomic(args.out, chunks)
    seconds = time.perf_counter() - start
    copies = 1 + max(0, -(-(args.events - len(source.events)) // max(1, tiled)))
    print(
        f"{args.out}: {args.events:,} events ({copies} copies of {len(source.events):,}) in "
        f"{os.path.getsize(args.out) / 2**20:.1f} MiB, {seconds:.1f} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
