"""Time per module from a compiled run's kernels: pure, no torch.

Inductor turns a graph into kernel calls: *extern* calls (one aten op each, e.g.
``extern_kernels.addmm``) and *generated* kernels (``cpp_fused_*`` on CPU), each holding
several FX nodes, each node from one module. Under torch's profiler every call is a
range inside its graph's ``## Call CompiledFxGraph <key> ##`` range, in call order.

The rule, stated once: **a kernel call's time goes to the modules of its FX nodes, in
proportion to their number of nodes; views and reshapes, which move no data, are not
counted.** A call whose nodes are all one module's belongs wholly to it (exact); a
call shared by several is apportioned, and marked shared. A call with no node that
names a module, the graph wrapper's own time and the guards stay with the model as a
whole: the root's self time. A module that ran eagerly, between graphs (a graph
break), has a profiler range of its own: its self time is that range less the eager
modules and compiled regions inside it.

In a training step, a backward graph's kernels are split by the same rule into the
backward phase: AOTAutograd gives each backward node the module of the forward node it
differentiates (``capture/compiled.py`` reads it), so a kernel's nodes name the modules
whose gradients it computes. A backward kernel none of whose nodes names a module
(gradient accumulation, a tied weight's summed gradient) stays with the root's backward
time, and ``CompileInfo.unattributed_time_ns("backward")`` names it. The loss (its own
range) is the ``<loss>`` part's; the rest of the forward (up to the loss) and of the
backward (after it) is the root's, in each phase.

Each node's self time is the median over the passes, the root's own included (in each
pass, what the modules leave of the pass), and the step is the sum of those medians, as
for any profile: a median of per-module figures does not add up to the median pass.

:func:`build_compiled` makes the profile in one go: the eager pass's capture (tree,
op rows, FLOPs, memory) and these self times, totals summed as for any profile.
"""

from __future__ import annotations

import dataclasses
import re
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from layerscope.attribute.memory import Site
from layerscope.attribute.profile import assemble
from layerscope.attribute.walk import LOSS, OTHER, Dynamic, PassResult, part_node
from layerscope.base.stats import median, median_floor
from layerscope.model.compile_info import CompileInfo, KernelTime, StepCompile, steps_in_medians
from layerscope.model.raw import (
    CompiledCapture,
    CompiledGraph,
    CompiledPass,
    CompiledRegion,
    EagerRange,
    GraphBreak,
    GraphNode,
    RawCapture,
    StepRange,
)
from layerscope.model.runfacts import RunFigures
from layerscope.model.tree import Profile

#: How a kernel call's time is split, as profiles and reports state it.
RULE = (
    "a kernel call's time goes to the modules of its FX nodes in proportion to their number of nodes "
    "(views not counted); modules run eagerly between graphs are timed by their own ranges; "
    "the graphs' wrapper and guards stay with the root"
)
#: The rule of a training step: the forward's, and how backward kernels find their module.
BACKWARD_RULE = RULE + (
    "; a backward kernel's nodes count for the module whose forward they differentiate (the forward "
    "node of the same autograd sequence number), and a backward kernel with no such node stays with "
    "the root's backward time, named as unattributed"
)

#: Post-grad node names of ops that only reinterpret memory (not counted in the split).
_VIEW = re.compile(
    r"(view|_unsafe_view|reshape|permute|transpose|t|expand|squeeze|unsqueeze|select|slice|as_strided|alias"
    r"|split|split_with_sizes|unbind|getitem|clone_view)(_\d+)?"
)


def eager_self(ranges: Sequence[EagerRange], regions: Sequence[CompiledRegion]) -> dict[str, int]:
    """The self time of each module that ran eagerly: its range less the ranges of the
    eager modules and compiled regions directly inside it (their time is theirs)."""

    def inside(inner: tuple[int, int], outer: tuple[int, int]) -> bool:
        return outer[0] <= inner[0] and inner[1] <= outer[1] and inner != outer

    spans = [(r.start_ns, r.end_ns) for r in ranges]
    own: dict[str, int] = {}
    for r in ranges:
        span = (r.start_ns, r.end_ns)
        nested = [s for s in spans if inside(s, span)]
        direct = [s for s in nested if not any(inside(s, other) for other in nested)]
        compiled = [
            (c.start_ns, c.end_ns) for c in regions
            if inside((c.start_ns, c.end_ns), span) and not any(inside((c.start_ns, c.end_ns), s) for s in direct)
        ]
        taken = sum(e - s for s, e in direct) + sum(e - s for s, e in compiled)
        own[r.path] = own.get(r.path, 0) + max(r.end_ns - r.start_ns - taken, 0)
    return own


def shares(nodes: Sequence[GraphNode]) -> dict[str, float]:
    """Each module's share of a kernel call: its nodes over all counted nodes (views
    left out, unless the call is nothing else); empty when no node names a module."""
    counted = [n.module for n in nodes if not _VIEW.fullmatch(n.name)] or [n.module for n in nodes]
    named = [path for path in counted if path is not None]
    if not named:
        return {}
    counts: dict[str, int] = {}
    for path in named:
        counts[path] = counts.get(path, 0) + 1
    return {path: n / len(named) for path, n in counts.items()}


def event_name(call: str) -> str | None:
    """The profiler's name of a kernel call: ``extern_kernels.addmm:2`` ->
    ``aten::addmm``, ``torch.ops.aten.foo.default:3`` -> ``aten::foo``; None for a
    generated kernel (its range is ``graph_<n>_<kernel>`` on the CPU, the Triton kernel's
    name on a GPU)."""
    name = call.rsplit(":", 1)[0]
    if name.startswith("extern_kernels."):
        return "aten::" + name.split(".", 1)[1]
    found = re.fullmatch(r"(?:torch\.ops\.)?(\w+)\.(\w+)(?:\.\w+)?", name)
    if found is not None and not name.startswith("cpp_"):
        return f"{found.group(1)}::{found.group(2)}"
    return None


def _matches(event: str, call: str) -> bool:
    expected = event_name(call)
    if expected is not None:
        return event == expected
    # A C++ kernel's range is ``graph_<n>_<kernel>``; a Triton kernel's (on a GPU) is the
    # kernel's own name, which Inductor's launcher records.
    return re.fullmatch(r"(?:graph_\d+_)?" + re.escape(call.rsplit(":", 1)[0]), event) is not None


def match_calls(calls: Sequence[str], events: Sequence[tuple[str, int]]) -> list[tuple[str | None, int]]:
    """Each event under a graph call, paired with the kernel call it is (in order; a
    kernel the profiler did not see is skipped), or None for a range of no call."""
    out: list[tuple[str | None, int]] = []
    i = 0
    for name, ns in events:
        j = next((j for j in range(i, len(calls)) if _matches(name, calls[j])), None)
        if j is None:
            out.append((None, ns))
            continue
        out.append((calls[j], ns))
        i = j + 1
    return out


@dataclass
class CompiledTimes:
    """Per module (``named_modules()`` path) median self time in the forward and in the
    backward, the step (their sum) and the kernels. ``self_ns[""]`` is the root's: what
    no module's kernel holds (the forward's wrapper and guards, and with no loss range
    the whole pass's rest); ``backward_self_ns[""]`` the backward's rest: kernels whose
    module is not known (:meth:`~layerscope.model.compile_info.CompileInfo.unattributed_time_ns`),
    the backward graphs' wrapper and the autograd engine's own work. A training step's
    loss is the ``<loss>`` part's forward self time."""

    self_ns: dict[str, int]
    step_ns: int
    kernels: list[KernelTime] = field(default_factory=list)
    #: The median time in kernel calls (the rest of the step is wrapper, guards, eager).
    kernel_ns: int = 0
    backward_self_ns: dict[str, int] = field(default_factory=dict)
    #: The same split of the device time launched in each part (None: no device work
    #: was recorded): a kernel call's device time goes where its host time goes.
    device_self_ns: dict[str, int] | None = None
    backward_device_self_ns: dict[str, int] | None = None
    #: Per phase, the median device time the graphs launched outside their kernel calls
    #: (CUDA-graph replays): in the root's device time, named as unattributed.
    replay_device_ns: dict[str, int] = field(default_factory=dict)


def _modules_of(graph: CompiledGraph, call: str, known: set[str]) -> dict[str, float]:
    """A call's shares (:func:`shares`), a path not in ``known`` counted for the root."""
    modules: dict[str, float] = {}
    for path, share in shares(graph.nodes.get(call, ())).items():
        target = path if path in known else ""
        modules[target] = modules.get(target, 0.0) + share
    return modules


def attribute(graphs: dict[str, CompiledGraph], passes: Sequence[CompiledPass], known: set[str]) -> CompiledTimes:
    """Split each pass's kernel time over the modules of ``known`` paths (by
    :func:`shares`; a path not in ``known`` counts for the root), a forward graph's into
    the forward, a backward graph's into the backward, and take medians. In a training
    step (a pass with a loss range) the forward is the pass up to the loss, the
    backward the pass after it, and the loss is ``<loss>``'s."""
    per_pass: list[dict[tuple[str, str], float]] = []
    per_pass_device: list[dict[tuple[str, str], float]] = []
    kernel_totals: list[int] = []
    samples = _Samples()
    for one in passes:
        times, device, in_kernels = _kernel_sites(graphs, one, known, samples)
        loss_site = (LOSS if LOSS in known else "", "forward")
        if one.has_device:
            # The autograd engine's nodes: what the backward graphs' kernel calls leave is the root's.
            _add(device, ("", "backward"), _device_of(one.ranges, "backward") - _phase_total(device, "backward"))
            spans = [(r.start_ns, r.end_ns, r.path) for r in one.eager]
            for at, ns in one.loose_device:  # device work launched outside the kernel calls and the engine
                inner = [span for span in spans if span[0] <= at < span[1]]
                if inner:  # a module run eagerly: the innermost one's
                    path = min(inner, key=lambda span: span[1] - span[0])[2]
                    site = (path if path in known else "", "forward")
                elif one.loss is None or at < one.loss.start_ns:
                    site = ("", "forward")
                else:
                    site = loss_site if at < one.loss.end_ns else ("", "backward")
                _add(device, site, ns)
            per_pass_device.append(device)
        for path, ns in eager_self(one.eager, one.regions).items():
            site = (path if path in known else "", "forward")
            times[site] = times.get(site, 0.0) + ns
        forward = sum(ns for (_, phase), ns in times.items() if phase == "forward")
        backward = sum(ns for (_, phase), ns in times.items() if phase == "backward")
        if one.loss is None:
            times[("", "forward")] = times.get(("", "forward"), 0.0) + max(one.step_ns - forward - backward, 0)
        else:
            loss_ns = one.loss.end_ns - one.loss.start_ns
            times[loss_site] = times.get(loss_site, 0.0) + loss_ns
            times[("", "forward")] = times.get(("", "forward"), 0.0) + max(one.loss.start_ns - forward, 0)
            times[("", "backward")] = times.get(("", "backward"), 0.0) + max(one.step_ns - one.loss.end_ns - backward, 0)
        per_pass.append(times)
        kernel_totals.append(in_kernels)
    return _medians(graphs, per_pass, kernel_totals, samples, known, per_pass_device or None)


@dataclass
class _Samples:
    """Each kernel call's host times, and device times where recorded, over the passes;
    and per pass, per phase, the device time the graphs launched outside their calls."""

    host: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    device: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    replays: list[dict[str, int]] = field(default_factory=list)


def _kernel_sites(
    graphs: Mapping[str, CompiledGraph], one: CompiledPass, known: set[str], samples: _Samples,
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float], int]:
    """One pass's kernel time per (module, phase) by :func:`shares`, host and device
    (empty without device work), and its host time in kernel calls; each kernel call's
    times are added to ``samples``."""
    times: dict[tuple[str, str], float] = {}
    device: dict[tuple[str, str], float] = {}
    replays: dict[str, int] = {}
    in_kernels = 0
    for graph_call in one.graph_calls:
        key = graph_call.graph
        graph = graphs.get(key)
        if graph is None:
            continue
        ranges = graph_call.kernels
        if graph_call.device_ns is not None:
            # What the graph launched itself, outside its kernel calls: a CUDA graph's replay.
            own = graph_call.device_ns - sum(k.device_ns or 0 for k in ranges)
            if own > 0:
                _add(device, ("", graph.phase), own)
                replays[graph.phase] = replays.get(graph.phase, 0) + own
        for call, at in match_calls(graph.calls, [(k.name, n) for n, k in enumerate(ranges)]):
            kernel = ranges[at]
            if call is None:  # a range of no kernel call: its device work is the root's, as its host time is
                if kernel.device_ns:
                    _add(device, ("", graph.phase), kernel.device_ns)
                continue
            ns, device_ns = kernel.duration_ns, kernel.device_ns
            in_kernels += ns
            samples.host.setdefault((key, call), []).append(ns)
            if device_ns is not None:
                samples.device.setdefault((key, call), []).append(device_ns)
            for path, share in _modules_of(graph, call, known).items():
                site = (path, graph.phase)
                times[site] = times.get(site, 0.0) + ns * share
                if device_ns is not None:
                    device[site] = device.get(site, 0.0) + device_ns * share
    if one.has_device:
        samples.replays.append(replays)
    return times, device, in_kernels


def _split(per_pass: Sequence[dict[tuple[str, str], float]]) -> tuple[dict[str, int], dict[str, int]]:
    """Each site's median over the passes (a site a pass lacks counts 0 in it), forward
    and backward apart."""
    sites = {site for times in per_pass for site in times}
    medians = {site: round(median(times.get(site, 0.0) for times in per_pass)) for site in sorted(sites)}
    return (
        {path: ns for (path, phase), ns in medians.items() if phase == "forward"},
        {path: ns for (path, phase), ns in medians.items() if phase == "backward"},
    )


def _medians(
    graphs: Mapping[str, CompiledGraph], per_pass: Sequence[dict[tuple[str, str], float]], kernel_totals: list[int],
    samples: _Samples, known: set[str], per_pass_device: Sequence[dict[tuple[str, str], float]] | None = None,
) -> CompiledTimes:
    """Each site's median over the passes, host and device, the step (the host medians'
    sum), and each kernel call's median times with its shares."""
    self_ns, backward_self_ns = _split(per_pass)
    step_ns = sum(self_ns.values()) + sum(backward_self_ns.values())
    kernels = []
    for key, graph in graphs.items():
        for call in graph.calls:
            host = samples.host.get((key, call))
            if host:
                # Shares as saved (6 places): a loaded profile's kernels equal these.
                shares_saved = {path: round(share, 6) for path, share in _modules_of(graph, call, known).items()}
                device = samples.device.get((key, call))
                kernels.append(KernelTime(
                    key, call, median_floor(host), shares_saved, graph.phase, median_floor(device) if device else None,
                ))
    device_self, backward_device_self = _split(per_pass_device) if per_pass_device else (None, None)
    phases = sorted({phase for replays in samples.replays for phase in replays})
    replay = {phase: median_floor([replays.get(phase, 0) for replays in samples.replays]) for phase in phases}
    return CompiledTimes(
        self_ns, step_ns, kernels, median_floor(kernel_totals) if kernel_totals else 0, backward_self_ns,
        device_self, backward_device_self, {phase: ns for phase, ns in replay.items() if ns},
    )


def _add(sites: dict[tuple[str, str], float], site: tuple[str, str], ns: float) -> None:
    if ns > 0:
        sites[site] = sites.get(site, 0.0) + ns


def _phase_total(sites: dict[tuple[str, str], float], phase: str) -> float:
    return sum(ns for (_, at), ns in sites.items() if at == phase)


def _device_of(ranges: Sequence[StepRange], kind: str) -> int:
    """The device time launched in ``kind``'s ranges."""
    return sum(r.device_ns or 0 for r in ranges if r.kind == kind)


def _length(ranges: Sequence[StepRange], kind: str) -> int:
    return sum(r.end_ns - r.start_ns for r in ranges if r.kind == kind)


def _overlap(ranges: Sequence[StepRange], kinds: Sequence[str], within: Sequence[StepRange]) -> int:
    """The time of ``kinds``' ranges inside the ``within`` ranges."""
    return sum(
        max(0, min(r.end_ns, w.end_ns) - max(r.start_ns, w.start_ns))
        for r in ranges if r.kind in kinds for w in within
    )


def step_sites(
    graphs: Mapping[str, CompiledGraph], one: CompiledPass, known: set[str], samples: _Samples | None = None,
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float] | None, int, int]:
    """A block's step around a compiled model, split into sites (``(path, phase)``):
    the :data:`BLOCK_RULE`. Returns the host sites, the device sites (None without
    device work), the host time in kernel calls and the time compiling (in no site);
    each kernel call's times are added to ``samples``."""
    times, device, in_kernels = _kernel_sites(graphs, one, known, samples or _Samples())
    ranges = one.ranges
    forward_ranges = [r for r in ranges if r.kind == "forward"]
    backward_ranges = [r for r in ranges if r.kind == "backward"]
    compiling = _length(ranges, "compile")
    forward = _length(ranges, "forward") - _overlap(ranges, ("compile",), forward_ranges)
    backward = _length(ranges, "backward")
    for path, ns in eager_self(one.eager, one.regions).items():  # modules run eagerly, between graphs
        _add(times, (path if path in known else "", "forward"), ns)
    if forward_ranges:
        _add(times, ("", "forward"), forward - _phase_total(times, "forward"))
        _add(device, ("", "forward"), _device_of(ranges, "forward") - _phase_total(device, "forward"))
    if backward_ranges:
        _add(times, ("", "backward"), backward - _phase_total(times, "backward"))
        _add(device, ("", "backward"), _device_of(ranges, "backward") - _phase_total(device, "backward"))
    parts = 0
    for r in ranges:
        if r.kind in ("optimizer", "zero_grad"):
            path = part_node(r.kind, r.name).path
            _add(times, (path, "forward"), r.end_ns - r.start_ns)
            _add(device, (path, "forward"), r.device_ns or 0)
            parts += r.end_ns - r.start_ns
    gap: tuple[int, int] | None = None
    if forward_ranges and backward_ranges:
        # The loss: from the end of the last call before the backward to the backward's start.
        first_backward = min(r.start_ns for r in backward_ranges)
        ends = [r.end_ns for r in forward_ranges if r.end_ns <= first_backward]
        if ends:
            gap = (max(ends), first_backward)
            within = StepRange("loss", "", *gap)
            loss = gap[1] - gap[0] - _overlap(ranges, ("optimizer", "zero_grad", "compile"), [within])
            _add(times, (LOSS, "forward"), loss)
            parts += max(loss, 0)
    _add(times, (OTHER, "forward"), one.step_ns - forward - backward - parts - compiling)
    for at, ns in one.loose_device:  # launched outside every part and kernel call
        _add(device, (LOSS if gap is not None and gap[0] <= at < gap[1] else OTHER, "forward"), ns)
    return times, device if one.has_device else None, in_kernels, compiling


#: How a block's step around a compiled model is split, as profiles state it.
BLOCK_RULE = (
    "each call of the compiled model is the forward: its kernels split by the rule above, the rest (wrapper, "
    "guards, modules run eagerly) the root's; the autograd engine's nodes are the backward: the backward graphs' "
    "kernels split likewise, the rest (the loss's gradient, gradient accumulation) the root's; the loss is "
    "from the last call before the backward to the backward's start; each optimizer's step and zero_grad are "
    "their parts; the rest of the step is <other>; time compiling is in none of them"
)


class _Columns:
    """A figure per site per step, in compact arrays (a site a step lacks is 0 in it)."""

    def __init__(self) -> None:
        self.columns: dict[tuple[str, str], array[float]] = {}

    def add(self, at: int, sites: dict[tuple[str, str], float]) -> None:
        """Step ``at``'s figures (the steps before it are in)."""
        for site, ns in sites.items():
            column = self.columns.get(site)
            if column is None:
                column = self.columns[site] = array("d", bytes(8 * at))
            column.append(ns)
        for column in self.columns.values():
            if len(column) == at:
                column.append(0.0)

    def steps(self, keep: Sequence[int]) -> list[dict[tuple[str, str], float]]:
        return [{site: column[at] for site, column in self.columns.items()} for at in keep]


@dataclass
class StepFold:
    """A block's steps around a compiled model, folded as they are read: each step's
    wall time and sites (:func:`step_sites`), host and device, kept per step in compact
    arrays (medians need every step's figure), and each kernel call's times."""

    known: set[str]
    step_numbers: list[int] = field(default_factory=list)
    step_ns: list[int] = field(default_factory=list)
    compile_ns: list[int] = field(default_factory=list)
    #: Whether a step ran a backward (the autograd engine's nodes).
    backward: bool = False
    #: Whether device work was recorded.
    has_device: bool = False
    #: The step parts' nodes, by path: the loss, the rest, and each optimizer's step and
    #: zero_grad the steps ran.
    parts: dict[str, Dynamic] = field(default_factory=lambda: {
        node.path: node for node in (part_node("loss", "loss"), part_node("other", "other"))
    })
    _host: _Columns = field(default_factory=_Columns)
    _device: _Columns = field(default_factory=_Columns)
    _kernel_totals: list[int] = field(default_factory=list)
    #: Per kernel call: (step index, host ns, device ns or -1) of each call, flat.
    _kernels: dict[tuple[str, str], array[int]] = field(default_factory=dict)
    #: Per step, per phase: the device time the graphs launched outside their calls.
    _replays: list[dict[str, int]] = field(default_factory=list)

    def add(self, number: int, one: CompiledPass, graphs: Mapping[str, CompiledGraph]) -> None:
        """Fold step ``number``; a step in which nothing ran (no call, no part: the one
        a block's end cuts short after its last ``step()``) is not one."""
        if not one.graph_calls and not one.ranges:
            return
        samples = _Samples()
        times, device, in_kernels, compiling = step_sites(graphs, one, self.known, samples)
        at = len(self.step_numbers)
        self._host.add(at, times)
        if device is not None:
            self.has_device = True
            self._device.add(at, device)
        for key, values in samples.host.items():
            devices = samples.device.get(key, [])
            flat = self._kernels.setdefault(key, array("q"))
            for n, ns in enumerate(values):
                flat.extend((at, ns, devices[n] if n < len(devices) else -1))
        self._replays.append(samples.replays[0] if samples.replays else {})
        for r in one.ranges:
            if r.kind in ("optimizer", "zero_grad"):
                node = part_node(r.kind, r.name)
                self.parts.setdefault(node.path, node)
        self.backward = self.backward or any(r.kind == "backward" for r in one.ranges)
        self.step_numbers.append(number)
        self.step_ns.append(one.step_ns)
        self.compile_ns.append(compiling)
        self._kernel_totals.append(in_kernels)

    def times(self, graphs: Mapping[str, CompiledGraph], leave_out: set[int]) -> CompiledTimes:
        """Medians over the steps, those numbered in ``leave_out`` (steps that compiled)
        left out unless no other step ran."""
        keep = [at for at, number in enumerate(self.step_numbers) if number not in leave_out]
        if not keep:
            keep = list(range(len(self.step_numbers)))
        kept = set(keep)
        samples = _Samples()
        for key, flat in self._kernels.items():
            for n in range(0, len(flat), 3):
                if flat[n] in kept:
                    samples.host.setdefault(key, []).append(flat[n + 1])
                    if flat[n + 2] >= 0:
                        samples.device.setdefault(key, []).append(flat[n + 2])
        if self.has_device:
            samples.replays = [self._replays[at] for at in keep]
        return _medians(
            graphs, self._host.steps(keep), [self._kernel_totals[at] for at in keep], samples, self.known,
            self._device.steps(keep) if self.has_device else None,
        )


def _sites_of(times: CompiledTimes, index: dict[str, int]) -> tuple[dict[Site, int], dict[Site, int] | None]:
    """The times' medians as a walk's self figures, host and device (None: none recorded),
    a module by its table index, a part by its path."""

    def sites(forward: dict[str, int], backward: dict[str, int]) -> dict[Site, int]:
        found: dict[Site, int] = {(index.get(path, path), "forward"): ns for path, ns in forward.items()}
        found.update({(index.get(path, path), "backward"): ns for path, ns in backward.items()})
        return found

    host = sites(times.self_ns, times.backward_self_ns)
    if times.device_self_ns is None:
        return host, None
    return host, sites(times.device_self_ns, times.backward_device_self_ns or {})


def with_ops(raw: RawCapture, ops: PassResult) -> set[str]:
    """The paths of the modules with ops of their own in the eager pass (``ops``, its
    walk: :func:`~layerscope.attribute.profile.op_walk`)."""
    return {raw.modules[key].path for key, *_ in ops.ops if isinstance(key, int)}


def build_compiled(raw: RawCapture, ops: PassResult, run: CompiledCapture) -> Profile:
    """A compiled model's profile, built once: the tree, op rows, FLOPs and memory of
    the eager pass ``raw`` (walked into ``ops``), each node's forward self time (and,
    in a training step, backward self time) from ``run``'s kernels (:func:`attribute`),
    totals summed as for any profile. The op
    rows' times are None (the eager ops never ran compiled) and there is no trace: the
    profile's op rows are copies, ``ops`` is left as it was."""
    paths = [info.path for info in raw.modules]
    index = {path: n for n, path in enumerate(paths)}
    times = attribute(run.graphs, run.passes, set(paths) | set(ops.dynamic))
    self_cpu, self_dev = _sites_of(times, index)
    if self_dev is not None:
        raw = dataclasses.replace(raw, has_device_time=True)
    result = PassResult(
        self_cpu=self_cpu, self_dev=self_dev or {},
        calls=dict(ops.calls), dynamic=dict(ops.dynamic), phases=set(ops.phases),
        enclosing=dict(ops.enclosing),
    )
    untimed = dataclasses.replace(
        ops, trace=None,
        ops={key: dataclasses.replace(op, cpu_time_ns=None, self_cpu_time_ns=None) for key, op in ops.ops.items()},
    )
    backward = any(graph.phase == "backward" for graph in run.graphs.values())
    info = CompileInfo(
        backend="inductor", rule=BACKWARD_RULE if backward else RULE, compile_time_ns=run.compile_time_ns, frames=run.frames,
        graphs=len(run.graphs), graph_breaks=list(run.graph_breaks), step_time_ns=times.step_ns,
        kernel_time_ns=times.kernel_ns, kernels=times.kernels, replay_device_ns=dict(times.replay_device_ns),
    )
    return assemble(raw, result, untimed, RunFigures(), compiled=info)


def build_compiled_steps(
    raw: RawCapture, ops: PassResult, fold: StepFold, graphs: Mapping[str, CompiledGraph], *,
    graph_breaks: Sequence[GraphBreak], step_compiles: Sequence[StepCompile], other_input_steps: Sequence[int] = (),
) -> Profile:
    """A ``Profiler`` block's profile of a compiled model: the tree, FLOPs, MACs, shapes
    and memory of one eager step of its module (``raw``, walked into ``ops``), and each
    node's median self time over the block's steps (``fold``; steps that compiled, and
    steps whose inputs had other shapes than the count's, ``other_input_steps``, left
    out while others ran: ``CompileInfo.median_steps``) by :data:`BLOCK_RULE`. The
    step's parts (loss, optimizers, the rest) have times only: their FLOPs and memory
    are unknown (the eager step's loss stood in for the user's). ``ops`` is left as it
    was."""
    paths = [info.path for info in raw.modules]
    index = {path: n for n, path in enumerate(paths)}
    other = sorted(set(other_input_steps) & set(fold.step_numbers))
    kept = steps_in_medians(fold.step_numbers, [c.step for c in step_compiles], other)
    times = fold.times(graphs, set(fold.step_numbers) - set(kept))
    self_cpu, self_dev = _sites_of(times, index)
    if self_dev is not None:
        raw = dataclasses.replace(raw, has_device_time=True)
    dynamic = {path: dyn for path, dyn in ops.dynamic.items() if not path.startswith("<")}
    for path in {path for path in (*times.self_ns, *times.backward_self_ns) if path.startswith("<")}:
        dynamic[path] = fold.parts[path]
    result = PassResult(
        self_cpu=self_cpu, self_dev=self_dev or {}, calls=dict(ops.calls), dynamic=dynamic, phases=set(ops.phases),
        enclosing=dict(ops.enclosing),
    )
    untimed = dataclasses.replace(
        ops, trace=None, dynamic=dict(dynamic),
        ops={
            key: dataclasses.replace(op, cpu_time_ns=None, self_cpu_time_ns=None)
            for key, op in ops.ops.items() if not (isinstance(key[0], str) and key[0].startswith("<"))
        },
    )
    used = [graphs[key] for key in dict.fromkeys(k.graph for k in times.kernels)]
    backward = any(graph.phase == "backward" for graph in used)
    info = CompileInfo(
        backend="inductor", rule=(BACKWARD_RULE if backward else RULE) + "; " + BLOCK_RULE,
        compile_time_ns=sum(c.time_ns for c in step_compiles), frames=len({graph.frame for graph in used}),
        graphs=len(used), graph_breaks=list(graph_breaks), step_time_ns=times.step_ns,
        kernel_time_ns=times.kernel_ns, kernels=times.kernels, step_compiles=list(step_compiles),
        replay_device_ns=dict(times.replay_device_ns), other_input_steps=other,
    )
    figures = RunFigures(steps=len(fold.step_numbers), step_numbers=list(fold.step_numbers), step_times_ns=list(fold.step_ns))
    profile = assemble(raw, result, untimed, figures, compiled=info)
    for part in profile.parts:
        for node in part.walk():
            for _, stats in node.phases():
                for name in _UNKNOWN_IN_PARTS:
                    setattr(stats, name, None)
    return profile


#: A compiled block's step parts' figures that the eager count cannot give (it ran its
#: own loss, and no optimizer).
_UNKNOWN_IN_PARTS = (
    "flops", "self_flops", "macs", "self_macs", "bytes", "self_bytes", "alloc_bytes", "self_alloc_bytes",
    "freed_bytes", "self_freed_bytes", "peak_bytes", "activation_bytes", "self_activation_bytes",
    "grad_bytes", "self_grad_bytes",
)
