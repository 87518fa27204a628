"""A compiled model's passes from the ranges torch's profiler recorded: pure, no torch.

The input is what the eager conversion reads (``convert/ranges.py``): each thread's
root :class:`Range` trees and the device work, each kernel with the range that launched
it (``KernelSpan.linked_correlation_id``): a live window read by the capture's adapter,
a replayed one, or a torch.profiler trace file's (``traces/ranges.py``). The output is
``model/raw.py``'s :class:`CompiledPass` per timed call or step, which
``attribute/compiled.py`` splits over modules.

- A pass is a ``STEP_RANGE`` range (``profile()``'s timed calls, a block's steps); a
  window with none (a trace file) is one pass from its first range to its last.
- Every range belongs to the pass it starts in; Dynamo's and Inductor's own work while
  compiling (inside a ``... (dynamo_timed)`` range) is left out.
- A graph call is a ``## Call CompiledFxGraph <key> ##`` range: its direct children are
  its kernel calls' ranges, in order, each with its host time and, where device work was
  recorded, the device time of the kernels launched inside it (its own and its nested
  ops'): an extern kernel's aten op launches its kernels, and Inductor names a range
  after each Triton kernel it launches. The call's own device time holds its kernel
  calls' and what the graph launched outside them (a CUDA graph's replay: its kernels
  have no launch of their own).
- A block's step has its parts' ranges (:class:`StepRange`, the outermost of each kind),
  each with the device time launched inside it (in its subtree), and the device work
  launched outside every part's and graph call's subtree (``CompiledPass.loose_device``:
  when and how long), so each ns of a step's device time is in one place.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Sequence

from layerscope.convert.ranges import EVALUATE, KernelSpan, Range, label_kind
from layerscope.model.raw import (
    CompiledPass,
    CompiledRegion,
    EagerRange,
    GraphCall,
    KernelRange,
    LossRange,
    StepRange,
)

#: The range layerscope wraps each timed call (``profile()``) or step (a block) in.
STEP_RANGE = "layerscope#compiled_step"
#: The range around a module that ran eagerly (its path follows).
MODULE_RANGE = "layerscope#eager:"
#: The range around a training step's loss, between the forward and the backward.
LOSS_RANGE = "layerscope#loss"
#: The range around each call of a compiled model in a ``Profiler`` block.
FORWARD_RANGE = "layerscope#compiled_forward"
#: The range Dynamo opens around each compiled region's run.
REGION = "Torch-Compiled Region"
#: How Dynamo's compile-time ranges end (``_compile.compile_inner (dynamo_timed)``).
COMPILING = " (dynamo_timed)"
_CALL = re.compile(r"## Call CompiledFxGraph (\S+) ##")


def step_range(name: str) -> tuple[str, str] | None:
    """The kind and name of a block step's part a range is, or None: a call of the
    compiled model, the autograd engine running a node (the model's backward graphs,
    the loss's gradient, gradient accumulation), an optimizer's ``step`` or
    ``zero_grad``, Dynamo compiling."""
    if name == FORWARD_RANGE:
        return "forward", ""
    if name.startswith(EVALUATE):
        return "backward", name[len(EVALUATE) :]
    if name.endswith(COMPILING):
        return "compile", name
    kind, label = label_kind(name)
    return (kind, label) if kind != "label" else None


class _Tree:
    """Every range of a window, flat and in start order, with each one's device time
    (the kernels launched in it and in the ranges nested in it)."""

    def __init__(self, roots: Sequence[Range], kernels: Sequence[KernelSpan], has_device: bool) -> None:
        self.has_device = has_device
        #: Device ns launched by each range itself (by correlation id); 0: no range known.
        self.launched: dict[int, int] = {}
        if has_device:
            for kernel in kernels:
                ns = kernel.end_ns - kernel.start_ns
                self.launched[kernel.linked_correlation_id] = self.launched.get(kernel.linked_correlation_id, 0) + ns
        self.ranges: list[Range] = []
        self.device: dict[int, int] = {}
        stack = [(r, False) for r in reversed(roots)]
        while stack:  # iteratively: real windows nest deeper than recursion likes
            rng, done = stack.pop()
            if done:
                own = self.launched.get(rng.correlation_id, 0) if rng.correlation_id else 0
                self.device[id(rng)] = own + sum(self.device[id(c)] for c in rng.children)
                continue
            self.ranges.append(rng)
            stack.append((rng, True))
            stack.extend((c, False) for c in reversed(rng.children))
        self.ranges.sort(key=lambda r: r.start_time_ns)

    def device_ns(self, rng: Range) -> int | None:
        return self.device[id(rng)] if self.has_device else None


def compiled_passes(roots: Sequence[Range], kernels: Sequence[KernelSpan], *, has_device: bool) -> list[CompiledPass]:
    """Each pass's figures (see the module's docstring) from a window's root ranges and
    device work."""
    tree = _Tree(roots, kernels, has_device)
    steps = [r for r in tree.ranges if r.name == STEP_RANGE]
    if not steps:
        if not tree.ranges:
            return []
        whole = Range(STEP_RANGE, tree.ranges[0].start_time_ns, max(r.end_time_ns for r in tree.ranges))
        return [_pass(whole, tree.ranges, tree)]
    starts = [step.start_time_ns for step in steps]
    inside: list[list[Range]] = [[] for _ in steps]
    for rng in tree.ranges:
        if rng.name == STEP_RANGE:
            continue
        at = bisect_right(starts, rng.start_time_ns) - 1
        if at >= 0 and rng.start_time_ns <= steps[at].end_time_ns:
            inside[at].append(rng)
    return [_pass(step, mine, tree) for step, mine in zip(steps, inside, strict=True)]


def _within(span: tuple[int, int], outer: Sequence[tuple[int, int]]) -> bool:
    return any(start <= span[0] and span[1] <= end for start, end in outer)


def _pass(step: Range, ranges: list[Range], tree: _Tree) -> CompiledPass:
    """One pass from its step range and the ranges that start in it (in start order)."""
    origin = step.start_time_ns

    def span(rng: Range) -> tuple[int, int]:
        return rng.start_time_ns - origin, rng.end_time_ns - origin

    kept = _step_ranges(ranges, span, tree)
    parts = [part for part, _ in kept]
    compiling = [(r.start_ns, r.end_ns) for r in parts if r.kind == "compile"]
    graph_calls: list[GraphCall] = []
    eager: list[EagerRange] = []
    regions: list[CompiledRegion] = []
    loss: LossRange | None = None
    # The ranges whose device work a part or a graph call holds: their subtrees, the
    # ranges each one's device time was summed over.
    covered: set[int] = set()
    for _, rng in kept:
        _cover(rng, covered)
    for rng in ranges:
        if compiling and _within(span(rng), compiling):
            continue  # Dynamo's and Inductor's own work while compiling (tracing, benchmarking)
        name = rng.name
        if name == LOSS_RANGE:
            loss = LossRange(*span(rng))
        elif name.startswith(MODULE_RANGE):
            eager.append(EagerRange(name[len(MODULE_RANGE) :], *span(rng)))
        elif name.startswith(REGION):
            regions.append(CompiledRegion(*span(rng)))
        found = _CALL.fullmatch(name)
        if found is None:
            continue
        kernels = []
        for child in sorted(rng.children, key=lambda c: c.start_time_ns):
            kernels.append(KernelRange(child.name, child.end_time_ns - child.start_time_ns, tree.device_ns(child)))
        graph_calls.append(GraphCall(found.group(1), kernels, rng.end_time_ns - rng.start_time_ns, tree.device_ns(rng)))
        _cover(rng, covered)
    loose: list[tuple[int, int]] = []
    if tree.has_device:
        for rng in ranges:
            ns = tree.launched.get(rng.correlation_id, 0) if rng.correlation_id else 0
            if ns and id(rng) not in covered:
                loose.append((rng.start_time_ns - origin, ns))
    return CompiledPass(
        step.end_time_ns - step.start_time_ns, graph_calls, eager, regions, loss, parts, loose,
        has_device=tree.has_device,
    )


def _cover(rng: Range, covered: set[int]) -> None:
    stack = [rng]
    while stack:
        one = stack.pop()
        covered.add(id(one))
        stack.extend(one.children)


def _step_ranges(
    ranges: list[Range], span: Callable[[Range], tuple[int, int]], tree: _Tree,
) -> list[tuple[StepRange, Range]]:
    """A step's parts (:func:`step_range`), each with its range: the outermost range of
    each kind; the engine's and optimizers' ranges inside a compile (tracing the
    backward) left out."""
    found: list[tuple[StepRange, Range]] = []
    open_until: dict[str, int] = {}
    for rng in ranges:  # in start order
        known = step_range(rng.name)
        if known is None:
            continue
        kind, name = known
        start, end = span(rng)
        if start < open_until.get(kind, -1):
            continue  # inside one of its kind (a node's own nested call)
        open_until[kind] = end
        found.append((StepRange(kind, name, start, end, tree.device_ns(rng)), rng))
    compiling = [(r.start_ns, r.end_ns) for r, _ in found if r.kind == "compile"]
    return [
        (r, rng) for r, rng in found
        if r.kind in ("compile", "forward") or not _within((r.start_ns, r.end_ns), compiling)
    ]
