"""The profile as weighted call stacks: what the folded and speedscope renderers share.

A stack is a tuple of :class:`Frame`, root first, with an integer weight in the
metric's base unit (nanoseconds of CPU time, or FLOPs). Stacks are built from the one
tree, never re-measured:

- **Frames.** The model's root is its class name (``ResNet``). Every other node is its
  path relative to its parent's path: ``layer1`` under the root, ``0`` under
  ``layer1`` (a ModuleList or Sequential is a node of its own, so ``encoder.layer.0``
  is ``encoder;layer;0``), ``[name]`` for a label inside a module. Step parts are roots
  of their own, named by their path (``<loss>``, ``<optimizer:Adam>``). Ops are leaf
  frames (``aten::addmm``). When the model has more than its forward phase, each model
  stack starts with its phase (``forward``, ``backward``, ``recompute``); within a
  step part a phase other than forward is a frame after the part's name
  (``<loss>;backward;aten::expand``).
- **Weights.** A node's own stack holds its self value minus its ops' values; each op
  stack holds the op's value. Within one run a node's ops fit in its self time; where
  they add up to more (a file an older layerscope wrote, whose ``profile()`` timed ops
  in a pass of their own), the ops are scaled down together to fit the node's self time exactly (rounded to
  whole nanoseconds by cumulative rounding) and the node's own stack gets nothing. So no
  weight is ever negative, and the weights add up exactly to the sum of every node's
  self value over all phases: ``step_time_ns`` for a step, the root's forward time
  otherwise (or the FLOPs over all phases).
- **Order.** Stacks come in tree order (phase by phase for the model, then the parts),
  equal stacks merged at their first place, zero weights dropped: the same profile
  always gives the same stacks. With ``run_order=True`` and a trace, they come in the
  order they ran instead: each stack where its node's or op's first span starts in
  ``Profile.trace`` (so backward runs from the last layer back), ties and stacks the
  trace lacks kept in tree order after the stack before them. Weights do not change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from layerscope.base.errors import RenderError
from layerscope.model.tree import ModuleNode, OpStats, PhaseStats, Profile


class MetricError(RenderError):
    """The metric asked for is unknown, or the profile has no data for it."""


@dataclass(frozen=True)
class Metric:
    """A weight for stacks: a node's self value in a phase, and an op's value."""

    name: str
    unit: str  # the speedscope unit of the weights
    node_value: Callable[[PhaseStats], int | None]
    op_value: Callable[[OpStats], int | None]
    available: Callable[[Profile], bool]


#: The metrics stacks can be weighted by, in the order exporters list them.
METRICS: dict[str, Metric] = {
    metric.name: metric
    for metric in (
        Metric(
            "time", "nanoseconds",
            lambda stats: stats.self_cpu_time_ns,
            lambda op: op.self_cpu_time_ns,
            lambda profile: profile.timed,
        ),
        Metric(
            "device_time", "nanoseconds",
            lambda stats: stats.self_device_time_ns,
            lambda op: op.self_device_time_ns,
            lambda profile: profile.timed and profile.root.forward.device_time_ns is not None,
        ),
        Metric(
            "flops", "none",
            lambda stats: stats.self_flops,
            # An op with no FLOP formula (flops None) adds nothing; it is counted as
            # unsupported in the profile itself.
            lambda op: op.flops,
            lambda profile: profile.root.forward.flops is not None,
        ),
    )
}


def metric_for(profile: Profile, metric: str | None) -> Metric:
    """The metric named ``metric``; None picks time, or FLOPs for an untimed count."""
    if metric is None:
        metric = "time" if profile.timed else "flops"
    try:
        chosen = METRICS[metric]
    except KeyError:
        raise MetricError(f"unknown metric {metric!r}; expected one of: {', '.join(METRICS)}") from None
    if not chosen.available(profile):
        why = {
            "time": "it was counted without timing",
            "device_time": "it has no device time (it did not run on a GPU)",
        }.get(metric, profile.meta.flops_unknown or "no ops were recorded")
        raise MetricError(f"this profile has no {metric} to export: {why}")
    return chosen


def available_metrics(profile: Profile) -> list[Metric]:
    return [metric for metric in METRICS.values() if metric.available(profile)]


@dataclass(frozen=True)
class Frame:
    """One frame of a stack. ``path`` is the node's path (None for a phase or an op):
    two modules both shown as ``0`` stay two frames."""

    name: str
    path: str | None = None


Stack = tuple[Frame, ...]


def sanitize(name: str) -> str:
    """A frame name safe in a folded line: no ``;`` (the frame separator), no line
    breaks or other control characters, no surrounding whitespace (the value follows
    the last space), never empty."""
    cleaned = "".join(
        ":" if char == ";" else " " if not char.isprintable() else char for char in name
    ).strip()
    return cleaned or "?"


def rescale(values: list[int], numerator: int, denominator: int) -> list[int]:
    """``values`` times ``numerator / denominator`` as whole numbers by cumulative
    rounding (half up): each result is the difference of consecutive rounded running
    sums, so results are never negative and add up to the rounded scaled total."""
    out: list[int] = []
    running = 0
    rounded_before = 0
    for value in values:
        running += value
        rounded = (2 * running * numerator + denominator) // (2 * denominator)
        out.append(rounded - rounded_before)
        rounded_before = rounded
    return out


def _frame(node: ModuleNode) -> Frame:
    if node.parent is None:
        # The model's root shows its class; a step part, its path (<optimizer:Adam>).
        return Frame(sanitize(node.type if node.kind == "module" else node.path), node.path)
    # An optimizer or zero_grad part keeps its own path even inside a label, so its
    # path need not start with its parent's.
    relative = node.path
    if node.kind == "module":
        relative = node.name  # under its module or under a label that ran in it
    elif node.path.startswith(node.parent):
        relative = node.path[len(node.parent) :].lstrip(".")
    return Frame(sanitize(relative), node.path)


#: Where a stack's weight comes from, as a trace span names it: (path, phase, op index
#: into the node's ops, or -1 for the node's own line).
Origin = tuple[str, str, int]


def _node_stacks(
    node: ModuleNode, phase: str, prefix: Stack, metric: Metric
) -> Iterator[tuple[Stack, int, Origin]]:
    """The stacks of ``node`` and its descendants in one phase, depth first."""
    stack = (*prefix, _frame(node))
    stats = getattr(node, phase)
    if stats is not None:
        own = metric.node_value(stats) or 0
        ops = [(index, op) for index, op in enumerate(node.ops) if op.phase == phase]
        op_values = [metric.op_value(op) or 0 for _, op in ops]
        ops_total = sum(op_values)
        if ops_total > own:
            op_values = rescale(op_values, own, ops_total)
            ops_total = own
        yield stack, own - ops_total, (node.path, phase, -1)
        for (index, op), value in zip(ops, op_values):
            yield (*stack, Frame(sanitize(op.name))), value, (node.path, phase, index)
    for child in node.children:
        yield from _node_stacks(child, phase, stack, metric)


def _part_stacks(part: ModuleNode, metric: Metric) -> Iterator[tuple[Stack, int, Origin]]:
    for phase, _ in part.phases():
        if phase == "forward":
            yield from _node_stacks(part, phase, (), metric)
            continue
        # The phase frame goes after the part's name: <loss>;backward;aten::expand.
        for stack, value, origin in _node_stacks(part, phase, (), metric):
            yield (stack[0], Frame(phase), *stack[1:]), value, origin


def build_stacks(profile: Profile, metric: Metric, *, run_order: bool = False) -> list[tuple[Stack, int]]:
    """Every distinct stack with its weight (> 0), in tree order, or with ``run_order``
    in the order the trace ran them; see the module doc."""
    model_phases = [phase for phase, _ in profile.root.phases()]
    merged: dict[Stack, int] = {}
    origins: dict[Stack, list[Origin]] = {}

    def add(items: Iterator[tuple[Stack, int, Origin]]) -> None:
        for stack, value, origin in items:
            merged[stack] = merged.get(stack, 0) + value
            origins.setdefault(stack, []).append(origin)

    for phase in model_phases:
        prefix = (Frame(phase),) if len(model_phases) > 1 else ()
        add(_node_stacks(profile.root, phase, prefix, metric))
    for part in profile.parts:
        add(_part_stacks(part, metric))
    stacks = [(stack, value) for stack, value in merged.items() if value > 0]
    if not run_order or profile.trace is None:
        return stacks
    first: dict[Origin, int] = {}
    spans = profile.trace.spans
    for start, path, phase, index in zip(spans.start_ns, spans.path, spans.phase, spans.op_index):
        first.setdefault((path, phase, index), start)
    keys: list[int] = []
    for stack, _ in stacks:
        starts = [first[origin] for origin in origins[stack] if origin in first]
        keys.append(min(starts) if starts else keys[-1] if keys else -1)
    order = sorted(range(len(stacks)), key=keys.__getitem__)  # stable: ties stay in tree order
    return [stacks[i] for i in order]

