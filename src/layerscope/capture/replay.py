"""Recorded captures: a ``Profiler`` block's windows as torch's profiler gave them to the
adapter, saved with the model's module table, and replayed through the same adapter,
conversion and walker on any machine. A GPU run records them (``benchmarks/gpu.py
--record``); the suite replays them without a GPU, so the CUDA path is checked on every
commit.

A recording (``layerscope-capture/1``, gzipped JSON) holds:

- ``modules``: the model's module table (:class:`~layerscope.model.raw.ModuleInfo`), and
  ``meta``, the live profile's facts (device, dtype, model);
- ``windows``: each window's recorded torch events (``torch_events.dump_result``), its
  notes and how it was recorded (device, detail, stacks);
- ``live``: what the live profile said of the same windows, node by node (forward and
  backward self and total device time), to check that a replay is the same profile;
- ``truth``: figures taken in the same session from elsewhere (torch's own trace of it,
  read by ``layerscope.load``; the allocator's peak), to check both against.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from torch import nn

from layerscope.attribute import parent_indices
from layerscope.attribute.compiled import StepFold, build_compiled_steps
from layerscope.attribute.cycle import Cycle
from layerscope.attribute.profile import op_walk
from layerscope.base.io import write_atomic
from layerscope.capture.assembly import LIVE_ALIGNED
from layerscope.capture.compiled import RESULT_OBSERVERS, known_graphs
from layerscope.capture.counting import count_capture
from layerscope.capture.kineto import WINDOW_OBSERVERS
from layerscope.capture.memory import model_memory
from layerscope.capture.modules import module_table
from layerscope.capture.torch_events import ReplayedResult, dump_result, read_window
from layerscope.convert.align import combined, place, template_of_step, without_module_ranges
from layerscope.convert.compiled import compiled_passes
from layerscope.convert.ranges import STEP_NAME, WindowCapture
from layerscope.convert.streams import convert_window
from layerscope.flops.recorded import CATALOG
from layerscope.model.compile_info import StepCompile
from layerscope.model.raw import CompiledGraph, Event, GraphBreak, ModuleInfo, ModuleShapes, RawCapture
from layerscope.model.runfacts import ModulesFrom, RunFacts
from layerscope.model.tree import Profile

FORMAT = "layerscope-capture/1"


def save_json(data: dict[str, Any], path: str | Path) -> None:
    """Write ``data`` as JSON, gzipped when ``path`` ends in ``.gz`` (atomically)."""
    text = json.dumps(data, separators=(",", ":")).encode()
    write_atomic(Path(path), gzip.compress(text, mtime=0) if str(path).endswith(".gz") else text)


def load_json(path: str | Path) -> Any:
    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


class WindowRecorder:
    """While it is open (a ``with`` block), every window torch's profiler hands
    layerscope is recorded as the adapter read it (``windows``), and with ``trace_dir``
    torch's own trace of the same session is saved there too (``trace-K.json``)."""

    def __init__(self, trace_dir: str | Path | None = None) -> None:
        self.windows: list[dict[str, Any]] = []
        self.traces: list[Path] = []
        self._trace_dir = None if trace_dir is None else Path(trace_dir)

    def _observe(self, window: WindowCapture, result: Any) -> None:
        detail = window.detail
        self.windows.append({
            "has_device": window.has_device,
            "detail": detail is not None,
            "with_stack": bool(detail is not None and detail.stacks),
            "notes": [] if detail is None else [[list(item) for item in note] for note in detail.notes],
            "result": dump_result(result),
        })
        if self._trace_dir is not None:
            path = self._trace_dir / f"trace-{len(self.traces)}.json"
            result.save(str(path))
            self.traces.append(path)

    def __enter__(self) -> WindowRecorder:
        WINDOW_OBSERVERS.append(self._observe)
        return self

    def __exit__(self, *exc: Any) -> None:
        WINDOW_OBSERVERS.remove(self._observe)


def node_figures(profile: Profile) -> dict[str, list[int | None]]:
    """Each node's (and part's: ``<loss>``) device figures by path: forward self and
    total, backward self and total, in ns (None where unknown)."""
    out: dict[str, list[int | None]] = {}
    for node in [*profile.root.walk(), *profile.parts]:
        back = node.backward
        out[node.path] = [
            node.forward.self_device_time_ns, node.forward.device_time_ns,
            None if back is None else back.self_device_time_ns, None if back is None else back.device_time_ns,
        ]
    return out


def recording(
    recorder: WindowRecorder, model: Any, profile: Profile, *, truth: dict[str, Any] | None = None, about: str = "",
) -> dict[str, Any]:
    """A recording of a block's windows over ``model`` (see the module's docstring);
    ``profile`` is the block's, each module's shapes taken from it."""
    _, infos, param_bytes = module_table(model, profile.meta.paths)
    index = {info.path: i for i, info in enumerate(infos)}
    shapes = {
        index[node.path]: [node.input_shapes, node.output_shapes]
        for node in profile.root.walk() if node.path in index and node.input_shapes is not None
    }
    return {
        "format": FORMAT,
        "about": about,
        "modules": [asdict(m) for m in infos],
        "param_bytes": param_bytes,
        "memory_static": model_memory(model),
        "module_shapes": [[i, s] for i, s in shapes.items()],
        "meta": profile.meta.to_dict(),
        "windows": recorder.windows,
        "live": node_figures(profile),
        "truth": truth or {},
    }


def save(data: dict[str, Any], path: str | Path) -> None:
    save_json(data, path)


def load(path: str | Path) -> dict[str, Any]:
    data = load_json(path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: not a recorded capture (format {found!r}, expected {FORMAT!r})")
    return data


COMPILED_FORMAT = "layerscope-compiled-capture/1"


class CompiledRecorder:
    """While it is open, every window of a compiled model's block is recorded as torch's
    profiler handed it over (``windows``: its step numbers, whether device work was
    recorded, the events the adapter reads)."""

    def __init__(self) -> None:
        self.windows: list[dict[str, Any]] = []

    def _observe(self, steps: list[int], result: Any, has_device: bool) -> None:
        self.windows.append({"steps": list(steps), "has_device": has_device, "result": dump_result(result)})

    def __enter__(self) -> CompiledRecorder:
        RESULT_OBSERVERS.append(self._observe)
        return self

    def __exit__(self, *exc: Any) -> None:
        RESULT_OBSERVERS.remove(self._observe)


def compiled_recording(
    recorder: CompiledRecorder, profile: Profile, *, about: str = "", truth: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A recording (``layerscope-compiled-capture/1``) of a compiled model's block: its
    windows, the graphs its kernels are read with (those the profile's kernels name),
    the compiles and breaks, the live profile's facts and figures (each node's device
    figures and host self times, each kernel call's times) and ``truth`` from elsewhere."""
    info = profile.compiled
    assert info is not None, "a compiled model's profile"
    used = {k.graph for k in info.kernels}
    graphs = known_graphs()
    return {
        "format": COMPILED_FORMAT,
        "about": about,
        "backward": profile.root.backward is not None,
        "graphs": [graph.to_dict() for key, graph in sorted(graphs.items()) if key in used],
        "step_compiles": [c.to_dict() for c in info.step_compiles],
        "graph_breaks": [b.to_dict() for b in info.graph_breaks],
        "meta": profile.meta.to_dict(),
        "windows": recorder.windows,
        "live": node_figures(profile),
        "live_host": {node.path: [node.forward.self_cpu_time_ns, None if node.backward is None else node.backward.self_cpu_time_ns]
                      for node in [*profile.root.walk(), *profile.parts]},
        "kernels": [k.to_dict() for k in info.kernels],
        "truth": truth or {},
    }


def replay_compiled(data: dict[str, Any], model: nn.Module, inputs: Any) -> Profile:
    """The profile of a compiled block's recording: its windows through the adapter and
    ``convert/compiled.py``, folded and built as the live block did, with the eager
    count of ``model`` on ``inputs`` (the recorded model, on any device: counts do not
    depend on it)."""
    if data.get("format") != COMPILED_FORMAT:
        raise ValueError(f"not a compiled block's recording: format {data.get('format')!r}, expected {COMPILED_FORMAT!r}")
    backward = bool(data["backward"])
    raw = count_capture(model, inputs, None, not backward, backward, None, False)
    ops = op_walk(raw)
    assert ops is not None  # a count always has its op pass
    graphs = {g["key"]: CompiledGraph.from_dict(g) for g in data["graphs"]}
    fold = StepFold({info.path for info in raw.modules})
    for item in data["windows"]:
        window = read_window(ReplayedResult(item["result"]), has_device=item["has_device"], detail=False)
        passes = compiled_passes(window.roots, window.kernels, has_device=item["has_device"])
        for number, one in zip(item["steps"], passes, strict=False):
            fold.add(number, one, graphs)
    meta = RunFacts.from_dict(data["meta"])
    return build_compiled_steps(
        replace(raw, meta=meta), ops, fold, graphs,
        graph_breaks=[GraphBreak(b["where"], b["reason"]) for b in data["graph_breaks"]],
        step_compiles=[StepCompile.from_dict(c) for c in data["step_compiles"]],
    )


def windows(data: dict[str, Any]) -> list[WindowCapture]:
    """The recording's windows as the adapter reads them from the replayed events."""
    found = []
    for item in data["windows"]:
        found.append(read_window(
            ReplayedResult(item["result"]), has_device=item["has_device"], detail=item["detail"],
            notes=[[tuple(entry) for entry in note] for note in item["notes"]], with_stack=item["with_stack"],
        ))
    return found


def _light_windows(data: dict[str, Any]) -> list[WindowCapture]:
    """The recording's windows read as a light window's: no detail asked of the adapter."""
    return [
        read_window(ReplayedResult(item["result"]), has_device=item["has_device"], detail=False)
        for item in data["windows"]
    ]


def replay(data: dict[str, Any], *, light_after_first: bool = False, aligned: bool = False) -> Profile:
    """The profile of a recording: its windows through the adapter, the conversion and
    the walker, as the live block built it. ``light_after_first``: as a block with
    ``detail="first"`` builds it, its first step read in detail and every later one read
    as a light window's (the same events, read without shapes, overloads or memory).
    ``aligned``: as ``hooks="first"`` would have recorded them, every step's module
    ranges taken out and put back by aligning its ops to the call template of the
    recording's first step (``meta.modules_from.placement`` says how)."""
    infos = [ModuleInfo(**m) for m in data["modules"]]
    cycle = Cycle(infos, parent_indices(infos), collect_ops=True)
    number = 0
    has_device = False
    # The module shapes the live capture read (the recording keeps the profile's), as
    # records in the first step's stream, where the live window put them.
    shapes: list[Event] = [ModuleShapes(i, inputs, outputs) for i, (inputs, outputs) in data["module_shapes"]]
    light = _light_windows(data) if light_after_first else None
    found = windows(data)
    placements = []
    if aligned:
        first = next(r for r in found[0].roots if r.name == STEP_NAME)
        template = template_of_step(first)
        assert template is not None, "the recording's first step calls no module"
        for window in [*found, *(light or [])]:
            window.roots = without_module_ranges(window.roots)
            steps = [r for r in window.roots if r.name == STEP_NAME]
            placements.append(place(list(zip(steps, range(len(steps)))), template, window.roots))
    for w, window in enumerate(found):
        has_device = has_device or window.has_device
        lightly = None if light is None else convert_window(light[w], CATALOG)
        for s, events in enumerate(convert_window(window, CATALOG)):
            events[:0] = shapes
            shapes = []
            is_light = lightly is not None and number > 0
            if is_light:
                assert lightly is not None
                events = lightly[s]
            cycle.add(events, number, warmup=False, keep_empty=False, has_device=window.has_device, light=is_light)
            number += 1
    meta = RunFacts.from_dict(data["meta"])
    if aligned:
        meta.modules_from = ModulesFrom(
            method=LIVE_ALIGNED, instances=0, matched=0, placement=combined(placements[: len(found)]),
        )
    raw = RawCapture(
        modules=infos, has_device_time=has_device, param_bytes=data["param_bytes"],
        memory_static=data["memory_static"], meta=meta,
    )
    return cycle.build(raw)
