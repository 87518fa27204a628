"""Compare two profiles: did my change make it slower, and where?

``diff(base, new)`` matches the nodes of two :class:`~layerscope.model.tree.Profile` trees by
path (modules, labels and step parts alike) and their ops by ``(module path, phase, op
name, input shapes)``, and keeps, for each entry, the base and new value of each metric
(a :class:`Change`). Rows are ordered by absolute impact: the size of the change in self
time, largest first, ties by path. It is a transform like ``model/transforms.py``: plain
Python, no torch, and no number is turned into a string here (``render/diff_text.py``
does that).

One metric (:data:`METRICS`: self or total CPU time, device time, FLOPs or allocated
bytes) orders the rows and is what :meth:`ProfileDiff.regressions` gates on; by default
the self device time where both sides measured one, else the self CPU time (FLOPs when
neither side was timed).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from layerscope.base import fmt, formats
from layerscope.model.tree import PHASES, ModuleNode, OpStats, PhaseStats, Profile

#: The schema a saved diff names.
DIFF_SCHEMA = "layerscope-diff/1"

__all__ = [
    "DEFAULT_MIN_DEVICE_TIME_NS",
    "DEFAULT_MIN_TIME_NS",
    "METRICS",
    "Change",
    "DiffRow",
    "Metric",
    "ProfileDiff",
    "Regression",
    "ShapeCalls",
    "diff",
    "parse_duration_ns",
    "parse_threshold",
    "profile_kind",
]

#: The default noise floor: a module whose self time is below this in both profiles is
#: never reported as a regression, however large its relative change. CPU timings of a
#: few microseconds move by tens of percent from run to run.
DEFAULT_MIN_TIME_NS = 50_000
#: The default floor for device times: a kernel's time repeats within a few percent, and
#: a small module's kernels take microseconds (a LayerNorm's, 5-20 µs on an H100), which
#: the CPU's floor would hide from the gate.
DEFAULT_MIN_DEVICE_TIME_NS = 5_000

_TIMES: tuple[str, ...] = ("time_ns", "self_time_ns", "device_time_ns", "self_device_time_ns")

#: Metrics of an op row, in the order ``to_dict`` lists them.
OP_METRICS: tuple[str, ...] = (*_TIMES, "flops", "macs", "alloc_bytes")

#: Metrics of a node row. Times, FLOPs and allocations are sums over the compared
#: phases; ``peak_bytes`` is the highest of them (peaks do not add).
NODE_METRICS: tuple[str, ...] = (*OP_METRICS, "peak_bytes", "activation_bytes", "self_flops", "self_alloc_bytes")

#: The model-level summary, in the order it is shown.
SUMMARY_METRICS: tuple[str, ...] = ("time_ns", "device_time_ns", "flops", "params", "peak_bytes")


@dataclass(frozen=True)
class Metric:
    """What a diff orders its rows by and gates on (``--metric``).

    ``node_field`` and ``op_field`` name the row metric compared (an op's FLOPs and
    allocations have no self/total split: ops do not nest); ``model_field`` is the
    model-level figure gated with it: a summary entry, or, for allocations, the root
    row's total. Only a time has a noise floor and a noise band: FLOPs and bytes are
    counted, not timed."""

    name: str
    label: str
    node_field: str
    op_field: str
    model_field: str
    timed: bool

    @property
    def unit(self) -> str:
        """``time``, ``count`` or ``bytes``: how its values are written."""
        return "time" if self.timed else "bytes" if self.node_field.endswith("_bytes") else "count"


#: The metrics a diff can order and gate by, as ``--metric`` names them: ``self_`` or
#: ``total_``, then ``cpu`` (CPU time), ``device`` (device time), ``flops`` or ``alloc``
#: (bytes allocated, as the tree's Alloc column).
METRICS: dict[str, Metric] = {
    metric.name: metric
    for metric in (
        Metric("self_cpu", "self time", "self_time_ns", "self_time_ns", "time_ns", True),
        Metric("total_cpu", "total time", "time_ns", "time_ns", "time_ns", True),
        Metric("self_device", "self device time", "self_device_time_ns", "self_device_time_ns", "device_time_ns", True),
        Metric("total_device", "total device time", "device_time_ns", "device_time_ns", "device_time_ns", True),
        Metric("self_flops", "self FLOPs", "self_flops", "flops", "flops", False),
        Metric("total_flops", "FLOPs", "flops", "flops", "flops", False),
        Metric("self_alloc", "self allocated bytes", "self_alloc_bytes", "alloc_bytes", "alloc_bytes", False),
        Metric("total_alloc", "allocated bytes", "alloc_bytes", "alloc_bytes", "alloc_bytes", False),
    )
}


def default_metric(base: Profile, new: Profile) -> str:
    """The self device time where both sides measured one, else the self CPU time; when a
    side was not timed (``layerscope flops``), the FLOPs, the one thing both counted."""
    if not (base.timed and new.timed):
        return "total_flops"
    if _has_device(base) and _has_device(new):
        return "self_device"
    return "self_cpu"


def resolve_metric(base: Profile, new: Profile, metric: str | None) -> Metric:
    """The metric a diff of ``base`` and ``new`` orders and gates by: ``metric``, or the
    default (:func:`default_metric`). ValueError for an unknown name, or a metric a side
    did not measure: a gate on it would pass whatever happened."""
    if metric is None:
        return METRICS[default_metric(base, new)]
    chosen = metric_named(metric)
    lacking = [side for side, profile in (("base", base), ("new", new)) if not _measures(profile, chosen)]
    if lacking:
        raise ValueError(
            f"{' and '.join(lacking)} did not measure {chosen.label} ({_MEASURED_BY[chosen.model_field]}): "
            f"cannot order or gate by {chosen.name}"
        )
    return chosen


def _has_device(profile: Profile) -> bool:
    return any(stats.device_time_ns is not None for _, stats in profile.root.phases())


def _measures(profile: Profile, metric: Metric) -> bool:
    """Whether ``profile`` has figures of ``metric`` (at its root)."""
    if metric.timed and not profile.timed:
        return False
    field_name = {"time_ns": "cpu_time_ns"}.get(metric.model_field, metric.model_field)
    return any(getattr(stats, field_name) is not None for _, stats in profile.root.phases())


#: What measures each kind of figure, for the error when a side lacks it.
_MEASURED_BY = {
    "time_ns": "a timed profile",
    "device_time_ns": "a run on an accelerator",
    "flops": "an op pass",
    "alloc_bytes": "memory tracking",
}


def metric_named(name: str) -> Metric:
    """The metric called ``name``; ValueError naming the choices otherwise."""
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"unknown metric {name!r}; expected one of: {', '.join(METRICS)}") from None


@dataclass(frozen=True)
class ShapeCalls:
    """One input shape of an op row paired across shapes, and how many calls had it."""

    input_shapes: Any
    calls: int

    def to_dict(self) -> dict[str, Any]:
        return {"input_shapes": self.input_shapes, "calls": self.calls}


@dataclass(frozen=True)
class Change:
    """One metric in both profiles; ``None`` where a side did not measure it."""

    base: int | None
    new: int | None

    @property
    def delta(self) -> int | None:
        """``new - base``; None unless both were measured."""
        if self.base is None or self.new is None:
            return None
        return self.new - self.base

    @property
    def relative(self) -> float | None:
        """``delta / base`` (0.25 is 25% more); None when undefined (a side missing, or
        a base of zero)."""
        if self.base is None or self.new is None or self.base == 0:
            return None
        return (self.new - self.base) / self.base

    def to_dict(self) -> dict[str, Any]:
        return {"base": self.base, "new": self.new, "delta": self.delta, "relative": self.relative}


@dataclass(frozen=True)
class DiffRow:
    """One node (``op is None``) or one op, as matched between the two profiles.

    ``status`` is ``"matched"``, ``"added"`` (only in new) or ``"removed"`` (only in
    base). ``type_base``/``type_new`` are the node's module types (None on the missing
    side); they differ when a path now holds another kind of module.
    """

    path: str
    kind: str
    status: str
    metrics: dict[str, Change]
    type_base: str | None = None
    type_new: str | None = None
    op: str | None = None
    phase: str | None = None
    input_shapes: Any = None
    #: An op matched by name within its module and phase whose shapes changed (the batch
    #: size did): the new side's shapes; ``input_shapes`` holds the base's.
    new_input_shapes: Any = None
    #: Its metric's value (a time) moved, but by no more than the runs' measured noise
    #: (:meth:`ProfileDiff.within_noise`): not a regression.
    noise: bool = False
    #: An op row paired across shapes: every shape of each side, with its calls. The
    #: row's figures are each side's sums over these; ``input_shapes`` and
    #: ``new_input_shapes`` are the first of each. Empty on other rows.
    shapes_base: tuple[ShapeCalls, ...] = ()
    shapes_new: tuple[ShapeCalls, ...] = ()

    def __getitem__(self, metric: str) -> Change:
        return self.metrics[metric]

    @property
    def impact_ns(self) -> int:
        """How much the self time moved, either way; an added or removed entry counts
        its whole self time."""
        change = self.metrics["self_time_ns"]
        return abs((change.new or 0) - (change.base or 0))

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"path": self.path, "kind": self.kind, "status": self.status}
        if self.op is None:
            doc.update(type_base=self.type_base, type_new=self.type_new)
        else:
            doc.update(op=self.op, phase=self.phase, input_shapes=self.input_shapes)
            if self.new_input_shapes is not None:
                doc["new_input_shapes"] = self.new_input_shapes
            if self.shapes_base:
                doc["shapes_base"] = [shape.to_dict() for shape in self.shapes_base]
                doc["shapes_new"] = [shape.to_dict() for shape in self.shapes_new]
        doc["noise"] = self.noise
        doc["metrics"] = {name: change.to_dict() for name, change in self.metrics.items()}
        return doc


@dataclass(frozen=True)
class Regression:
    """Something that grew by more than the threshold in the diff's metric: the model's
    figure (``path is None``; ``metric`` is a summary field, ``phase`` the total's
    kind, ``step`` or ``forward``) or one node's in one phase (``metric`` is a row
    field, ``self_time_ns`` for ``--metric self_cpu``)."""

    path: str | None
    metric: str
    change: Change
    phase: str = "forward"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "metric": self.metric, "phase": self.phase, **self.change.to_dict()}

    @property
    def what(self) -> str:
        """What grew, named: ``forward self_cpu`` for a node (its phase and the
        ``--metric`` name), ``step time`` or ``step device time`` for the model."""
        if self.path is None:
            return f"{self.phase} {_MODEL_LABELS[self.metric]}"
        name = next(m.name for m in METRICS.values() if m.node_field == self.metric)
        return f"{self.phase} {name}"

    def __str__(self) -> str:
        """``features.3 (forward self_cpu) +80.1%``; from a zero base, ``features.3
        (forward self_cpu) 0ns -> 61.00us``."""
        change = self.change
        where = f"{display_path(self.path)} ({self.what})"
        if change.base == 0:
            write = _WRITERS[_unit(self.metric)]
            return f"{where} {write(0)} -> {write(change.new or 0)}"
        return f"{where} {change_percent(change)}"


#: How the model-level figures are named in a regression line.
_MODEL_LABELS = {"time_ns": "time", "device_time_ns": "device time", "flops": "FLOPs", "alloc_bytes": "allocated bytes"}
_WRITERS = {"time": fmt.time_ns, "count": fmt.count, "bytes": fmt.nbytes}


def _unit(field_name: str) -> str:
    return "time" if field_name.endswith("_ns") else "bytes" if field_name.endswith("_bytes") else "count"


def change_percent(change: Change) -> str:
    """``+12.3%`` / ``-4.0%``; ``from 0`` when the base was zero; blank if not measured."""
    delta = change.delta
    if delta is None:
        return ""
    if change.base == 0:
        return "from 0" if delta else ""
    text = fmt.percent(delta, change.base)
    return "+" + text if delta > 0 else text


def display_path(path: str | None) -> str:
    """A node's path as shown: the root (path ``""``) is ``(root)``; None is the model's total."""
    if path is None:
        return "model total"
    return path or "(root)"


@dataclass
class ProfileDiff(formats.NotebookDisplay):
    """What changed between ``base`` and ``new``; see :func:`diff`.

    ``rows`` are the nodes and ``op_rows`` the ops, both largest change in ``metric``
    first (a name of :data:`METRICS`). ``summary`` compares the whole model;
    ``warnings`` says what does not match (other model, other mode, other device) and so
    what the comparison leaves out.
    """

    base: Profile = field(repr=False)
    new: Profile = field(repr=False)
    rows: list[DiffRow]
    op_rows: list[DiffRow]
    summary: dict[str, Change]
    warnings: list[str]
    #: The phases compared: those either profile has, or only ``forward`` when one is a
    #: training step and the other not.
    phases: tuple[str, ...]
    #: What the summary's ``time_ns`` is: ``"step"`` or ``"forward"``.
    total_kind: str
    min_time_ns: int = DEFAULT_MIN_TIME_NS
    #: Each side's measured noise: how its repeated passes or steps spread
    #: (:meth:`~layerscope.model.tree.Profile.pass_spread`); None where it ran once.
    noise_base: float | None = None
    noise_new: float | None = None
    #: What orders the rows and what :meth:`regressions` gates on (see :func:`diff`).
    metric: str = "self_cpu"

    @property
    def noise(self) -> float | None:
        """The noise band, relative: the larger side's spread (None: neither measured)."""
        return _band(self.noise_base, self.noise_new)

    def within_noise(self, change: Change) -> bool:
        """Whether a time moved by no more than was measured as noise: by at most the
        noise band of the larger side's value. False when a side was not measured, or
        no noise was (one pass each); the floor (``min_time_ns``) is another rule."""
        return _within(change, self.noise)

    @property
    def timed(self) -> bool:
        """False when a side was counted without timing: no time is compared."""
        return self.base.timed and self.new.timed

    def row(self, path: str) -> DiffRow:
        """The node row at ``path``; KeyError if neither profile has it."""
        for row in self.rows:
            if row.path == path:
                return row
        raise KeyError(f"no module at path {path!r} in either profile")

    def changed_ops(self) -> list[DiffRow]:
        """The op rows that changed: added, removed, paired across shapes, or with
        another self time, FLOPs or value of the diff's metric (``op_rows`` holds every
        op, most of which a change leaves alone)."""
        moved = ("self_time_ns", "flops", METRICS[self.metric].op_field)
        return [
            row
            for row in self.op_rows
            if row.status != "matched"
            or row.new_input_shapes is not None
            or any(row.metrics[name].delta not in (0, None) for name in moved)
        ]

    def regressions(
        self, threshold: float | str = 0.1, min_time_ns: int | str | None = None
    ) -> list[Regression]:
        """What grew by more than ``threshold`` (``0.1`` or ``"10%"``) in the diff's
        :attr:`metric`: the model's figure first (its step or forward time for a CPU
        time, its device time, FLOPs or allocated bytes), then each node in each compared
        phase, largest change first. Phases are judged apart, so a slower backward is
        not hidden by a faster forward, and each regression names its phase.

        For a time, a node counts only if its value is at least ``min_time_ns``
        (``50000`` or ``"50us"``; default: the diff's own floor) in base or new: below
        that, timing noise swamps any ratio. Nor does a time that moved within the runs'
        measured noise (:attr:`noise`), the model's included. FLOPs and bytes are
        counted, not timed: neither rule applies to them. Added and removed nodes are
        not regressions; the model's figure shows what they cost.
        """
        ratio = parse_threshold(threshold) if isinstance(threshold, str) else float(threshold)
        if not ratio >= 0 or math.isinf(ratio):
            raise ValueError(f"threshold must be a number >= 0, got {threshold!r}")
        if min_time_ns is None:
            floor = self.min_time_ns
        else:
            floor = parse_duration_ns(min_time_ns) if isinstance(min_time_ns, str) else int(min_time_ns)
        metric = METRICS[self.metric]
        if not metric.timed:
            floor = 0
        found: list[Regression] = []
        total = self.model_change()
        if _regressed(total, ratio) and not (metric.timed and self.within_noise(total)):
            found.append(Regression(None, metric.model_field, total, self.total_kind))
        base_nodes = {node.path: node for node in self.base.nodes()}
        new_nodes = {node.path: node for node in self.new.nodes()}
        nodes: list[Regression] = []
        for row in self.rows:
            if row.status != "matched":
                continue
            for phase in self.phases:
                change = _phase_change(base_nodes[row.path], new_nodes[row.path], phase, metric, self.timed)
                if change.delta is None or max(change.base or 0, change.new or 0) < floor:
                    continue
                if metric.timed and self.within_noise(change):
                    continue
                if _regressed(change, ratio):
                    nodes.append(Regression(row.path, metric.node_field, change, phase))
        nodes.sort(key=lambda r: (-(r.change.delta or 0), r.path or "", PHASES.index(r.phase)))
        return found + nodes

    def model_change(self) -> Change:
        """The model-level figure the metric gates: a summary entry, or for allocations
        the root's total over the compared phases."""
        field_name = METRICS[self.metric].model_field
        if field_name in self.summary:
            return self.summary[field_name]
        return self.row("")[field_name]

    DOCUMENT = "diff"  # its table in the output registry

    def render(self, fmt: str = "text", **options: Any) -> str:
        """The diff in a registered format (``layerscope.base.formats.formats("diff")``); as
        text: the summary, then the nodes and the changed ops, largest change first;
        ``limit`` caps the rows of each table (None: every row)."""
        return formats.render(self, fmt, **options)

    def save(self, path: str | os.PathLike[str], fmt: str | None = None, **options: Any) -> None:
        """Write the diff to ``path`` atomically; the format follows the extension
        (``.json``, ``.html``, ``.txt``; JSON otherwise)."""
        formats.save(self, path, fmt, **options)

    def __str__(self) -> str:
        return formats.display_text(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document (schema ``layerscope-diff/1``): the rows and summary,
        and under ``profiles`` the two profiles compared, which
        :func:`layerscope.model.documents.diff_from_dict` rebuilds it from."""
        return {
            "schema": DIFF_SCHEMA,
            "base": _describe(self.base),
            "new": _describe(self.new),
            "warnings": list(self.warnings),
            "phases": list(self.phases),
            "total_kind": self.total_kind,
            "min_time_ns": self.min_time_ns,
            "metric": self.metric,
            "noise": {"base": self.noise_base, "new": self.noise_new, "band": self.noise},
            "summary": {name: change.to_dict() for name, change in self.summary.items()},
            "rows": [row.to_dict() for row in self.rows],
            "op_rows": [row.to_dict() for row in self.op_rows],
            # The two profiles compared: what a saved diff is rebuilt from when read back.
            "profiles": {"base": self.base.to_dict(), "new": self.new.to_dict()},
        }


def _regressed(change: Change, ratio: float) -> bool:
    if change.base is None or change.new is None:
        return False
    if change.base == 0:
        return change.new > 0
    return change.new - change.base > ratio * change.base


def _phase_change(base: ModuleNode, new: ModuleNode, phase: str, metric: Metric, timed: bool) -> Change:
    """One node's value of ``metric`` in one phase, on each side; None on a side that
    has no such phase (a node that runs in one side's backward only is not compared)."""

    def value(node: ModuleNode) -> int | None:
        if getattr(node, phase) is None:
            return None
        return _node_values(node, (phase,), timed)[metric.node_field]

    return Change(value(base), value(new))


def _within(change: Change, band: float | None) -> bool:
    if band is None or change.base is None or change.new is None:
        return False
    return abs(change.new - change.base) <= band * max(change.base, change.new)


def _describe(profile: Profile) -> dict[str, Any]:
    meta = profile.meta
    return {
        "model": meta.model or profile.root.type,
        "device": meta.device,
        "mode": meta.mode,
        "kind": profile_kind(profile),
        "timed": profile.timed,
    }


def profile_kind(profile: Profile) -> str:
    """What a profile measured: ``forward-only``, a ``step`` (a ``Profiler`` block with
    no backward) or a ``step with backward``."""
    if profile.step_time_ns is None:
        return "forward-only"
    return "step with backward" if profile.has_backward else "step"


def _phrase(kind: str) -> str:
    return kind if kind == "forward-only" else f"a {kind}"


# -- the comparison ----------------------------------------------------------------------


def diff(
    base: Profile, new: Profile, *, min_time_ns: int | None = None, metric: str | None = None
) -> ProfileDiff:
    """Compare ``new`` against ``base``.

    Nodes match by path, ops by ``(module path, phase, name, input shapes)``; what only
    ``base`` has is ``removed``, what only ``new`` has is ``added``. When the two are of
    different models, the paths they share are compared and ``warnings`` says so; when
    one has a backward phase and the other not, only the forward phase is compared.
    ``min_time_ns`` is the noise floor :meth:`ProfileDiff.regressions` uses by default
    (None: :data:`DEFAULT_MIN_DEVICE_TIME_NS` for a device time, else
    :data:`DEFAULT_MIN_TIME_NS`).
    ``metric`` (a name of :data:`METRICS`: ``self_cpu``, ``total_device``, ...) orders
    the rows and is what :meth:`ProfileDiff.regressions` gates on; None: the self device
    time where both sides measured one, else the self CPU time (the FLOPs when a side
    was counted without timing).
    """
    if min_time_ns is not None and min_time_ns < 0:
        raise ValueError(f"min_time_ns must be >= 0, got {min_time_ns}")
    chosen = resolve_metric(base, new, metric)
    if min_time_ns is None:
        min_time_ns = DEFAULT_MIN_DEVICE_TIME_NS if "device" in chosen.name else DEFAULT_MIN_TIME_NS
    warnings: list[str] = []
    base_model = base.meta.model or base.root.type
    new_model = new.meta.model or new.root.type
    base_kind, new_kind = profile_kind(base), profile_kind(new)
    same_kind = base_kind == new_kind
    present = {phase for profile in (base, new) for phase, _ in profile.root.phases()}
    phases = tuple(p for p in PHASES if p in present and (same_kind or p == "forward"))
    timed = base.timed and new.timed

    shared = {node.path for node in base.nodes()} & {node.path for node in new.nodes()}
    if base_model != new_model:
        warnings.append(
            f"different models: base is {base_model}, new is {new_model}; "
            f"comparing the {len(shared)} paths they share"
        )
    if not same_kind:
        warnings.append(
            f"different modes: base is {_phrase(base_kind)}, new is {_phrase(new_kind)}; "
            "comparing the forward phase only, and the forward time as the model's total"
        )
    if base.meta.device != new.meta.device:
        warnings.append(
            f"different devices: base ran on {base.meta.device}, new on "
            f"{new.meta.device}; times are compared as they are"
        )
    if base.timed != new.timed:
        # Two untimed counts are a FLOP comparison, asked for; one of each is a surprise.
        side = "new" if base.timed else "base"
        warnings.append(f"{side} was counted without timing (layerscope flops): no time is compared")

    noise_base, noise_new = (base.pass_spread(), new.pass_spread()) if timed else (None, None)
    band = _band(noise_base, noise_new)
    rows = _marked(_node_rows(base, new, phases, timed, chosen.node_field), chosen, chosen.node_field, band)
    op_rows = _marked(_op_rows(base, new, phases, timed, chosen.op_field), chosen, chosen.op_field, band)
    summary, total_kind = _summary(base, new, phases, timed, same_kind)
    return ProfileDiff(
        base=base, new=new, rows=rows, op_rows=op_rows, summary=summary, warnings=warnings,
        phases=phases, total_kind=total_kind, min_time_ns=min_time_ns, noise_base=noise_base, noise_new=noise_new,
        metric=chosen.name,
    )


def _band(noise_base: float | None, noise_new: float | None) -> float | None:
    """The noise band: the larger side's measured spread; None when neither was measured."""
    known = [n for n in (noise_base, noise_new) if n is not None]
    return max(known) if known else None


def _marked(rows: list[DiffRow], metric: Metric, field_name: str, band: float | None) -> list[DiffRow]:
    """The rows, those whose metric (a time: counts have no noise) moved within the
    noise marked so."""
    if not metric.timed:
        return rows
    return [
        dataclasses.replace(row, noise=True)
        if row.status == "matched" and row.metrics[field_name].delta and _within(row.metrics[field_name], band)
        else row
        for row in rows
    ]


def _phase_stats(node: ModuleNode, phases: tuple[str, ...]) -> list[PhaseStats]:
    return [stats for phase, stats in node.phases() if phase in phases]


def _sum(values: Iterable[int | None]) -> int | None:
    """The sum of what was measured; None when nothing was."""
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _summed(items: Sequence[PhaseStats | OpStats], timed: bool) -> dict[str, int | None]:
    """The op-row metrics summed over phases of a node, or over the entries of an op.

    An untimed count (``count_flops``) stores zero times: not measured, so not compared."""
    values: dict[str, int | None] = {
        # An op row's time is None where it is unknown (a compiled model's, a block's
        # detailed step's): not measured, so not compared.
        "time_ns": _sum(item.cpu_time_ns for item in items),
        "self_time_ns": _sum(item.self_cpu_time_ns for item in items),
        "device_time_ns": _sum(item.device_time_ns for item in items),
        "self_device_time_ns": _sum(item.self_device_time_ns for item in items),
        "flops": _sum(item.flops for item in items),
        "macs": _sum(item.macs for item in items),
        "alloc_bytes": _sum(item.alloc_bytes for item in items),
    }
    if not timed:
        values.update(dict.fromkeys(_TIMES))
    return values


def _node_values(node: ModuleNode | None, phases: tuple[str, ...], timed: bool) -> dict[str, int | None]:
    if node is None or not node.profiled:
        # A node kept only to hold ``paths=`` subtrees has zero figures, not measured ones.
        return dict.fromkeys(NODE_METRICS)
    stats = _phase_stats(node, phases)
    peaks = [s.peak_bytes for s in stats if s.peak_bytes is not None]
    values = _summed(stats, timed)
    values["peak_bytes"] = max(peaks) if peaks else None
    values["activation_bytes"] = node.forward.activation_bytes
    values["self_flops"] = _sum(s.self_flops for s in stats)
    values["self_alloc_bytes"] = _sum(s.self_alloc_bytes for s in stats)
    return values


def _changes(names: tuple[str, ...], base: dict[str, int | None], new: dict[str, int | None]) -> dict[str, Change]:
    return {name: Change(base[name], new[name]) for name in names}


K = TypeVar("K")
V = TypeVar("V")


def _pairs(base: dict[K, V], new: dict[K, V]) -> Iterator[tuple[K, V | None, V | None, V, str]]:
    """``(key, base entry, new entry, either entry, status)`` for every key of either side;
    status is ``matched``, ``added`` (new only) or ``removed`` (base only)."""
    for key in base.keys() | new.keys():
        old, now = base.get(key), new.get(key)
        status = "added" if old is None else "removed" if now is None else "matched"
        either = now if now is not None else old
        assert either is not None
        yield key, old, now, either, status


def _node_rows(base: Profile, new: Profile, phases: tuple[str, ...], timed: bool, order: str) -> list[DiffRow]:
    base_nodes = {node.path: node for node in base.nodes()}
    new_nodes = {node.path: node for node in new.nodes()}
    rows = [
        DiffRow(
            path=path,
            kind=either.kind,
            status=status,
            metrics=_changes(NODE_METRICS, _node_values(old, phases, timed), _node_values(now, phases, timed)),
            type_base=None if old is None else old.type,
            type_new=None if now is None else now.type,
        )
        for path, old, now, either, status in _pairs(base_nodes, new_nodes)
    ]
    return _by_impact(rows, order)


OpKey = tuple[str, str, str, str]


def _shapes_key(shapes: Any) -> str:
    # Shapes are nested lists (and None for non-tensors): JSON text makes them hashable
    # and orders them the same way every run.
    return json.dumps(shapes, separators=(",", ":"), sort_keys=True)


def _ops(profile: Profile, phases: tuple[str, ...]) -> dict[OpKey, list[OpStats]]:
    """Ops by key. With ``with_stack`` one key can hold several entries (one per call
    site); they are compared as one."""
    found: dict[OpKey, list[OpStats]] = {}
    for node in profile.nodes():
        for op in node.ops:
            if op.phase in phases:
                key = (node.path, op.phase, op.name, _shapes_key(op.input_shapes))
                found.setdefault(key, []).append(op)
    return found


def _op_values(ops: list[OpStats] | None, timed: bool) -> dict[str, int | None]:
    return dict.fromkeys(OP_METRICS) if ops is None else _summed(ops, timed)


def _op_rows(base: Profile, new: Profile, phases: tuple[str, ...], timed: bool, order: str) -> list[DiffRow]:
    """Ops matched by (module, phase, name, shapes); then what is left of one module,
    phase and name on both sides is paired as one row: when the batch size changed,
    every op is one row with its shape change, not a removed row and an added one.

    NB: all the shapes left on each side go into that one row, summed, never paired
    shape by shape. Which base shape became which new one cannot be told from the
    shapes: a backward matmul's two calls can share a shape at one batch size and
    differ at the next, and pairing one of the two with one of the two compares one
    call with two. Summed, each side's figures are all of its calls that changed shape,
    and the FLOPs of a doubled batch double."""
    base_ops, new_ops = _ops(base, phases), _ops(new, phases)
    rows = []
    left: dict[tuple[str, str, str], tuple[list[OpKey], list[OpKey]]] = {}
    for key, old, now, either, status in _pairs(base_ops, new_ops):
        if status != "matched":
            sides = left.setdefault(key[:3], ([], []))
            sides[0 if status == "removed" else 1].append(key)
            continue
        rows.append(_op_row(key, old, now, either, status, timed))
    for removed, added in left.values():
        removed.sort(key=lambda k: k[3])
        added.sort(key=lambda k: k[3])
        if removed and added:
            old = [op for key in removed for op in base_ops[key]]
            now = [op for key in added for op in new_ops[key]]
            rows.append(_op_row(
                removed[0], old, now, old, "matched", timed, new_shapes=now[0].input_shapes,
                shapes_base=_shape_calls(removed, base_ops), shapes_new=_shape_calls(added, new_ops),
            ))
            continue
        for key in removed:
            rows.append(_op_row(key, base_ops[key], None, base_ops[key], "removed", timed))
        for key in added:
            rows.append(_op_row(key, None, new_ops[key], new_ops[key], "added", timed))
    return _by_impact(rows, order)


def _shape_calls(keys: list[OpKey], ops: dict[OpKey, list[OpStats]]) -> tuple[ShapeCalls, ...]:
    return tuple(ShapeCalls(ops[key][0].input_shapes, sum(op.calls for op in ops[key])) for key in keys)


def _op_row(
    key: OpKey, old: list[OpStats] | None, now: list[OpStats] | None, either: list[OpStats], status: str, timed: bool,
    new_shapes: Any = None, shapes_base: tuple[ShapeCalls, ...] = (), shapes_new: tuple[ShapeCalls, ...] = (),
) -> DiffRow:
    return DiffRow(
        path=key[0],
        kind="op",
        status=status,
        metrics=_changes(OP_METRICS, _op_values(old, timed), _op_values(now, timed)),
        op=key[2],
        phase=key[1],
        input_shapes=either[0].input_shapes,
        new_input_shapes=new_shapes,
        shapes_base=shapes_base,
        shapes_new=shapes_new,
    )


def _by_impact(rows: list[DiffRow], field_name: str) -> list[DiffRow]:
    """Largest change in ``field_name`` (the diff's metric) first, either way, an added
    or removed entry counting its whole value; ties by path (then op, phase, shapes)."""

    def impact(row: DiffRow) -> int:
        change = row.metrics[field_name]
        return abs((change.new or 0) - (change.base or 0))

    return sorted(
        rows,
        key=lambda r: (-impact(r), r.path, r.op or "", r.phase or "", _shapes_key(r.input_shapes)),
    )


def _summary(
    base: Profile, new: Profile, phases: tuple[str, ...], timed: bool, same_kind: bool
) -> tuple[dict[str, Change], str]:
    def values(profile: Profile, use_step: bool) -> dict[str, int | None]:
        stats = _phase_stats(profile.root, phases)
        if not timed:
            time = None
        elif use_step:
            time = profile.step_time_ns
        else:
            time = profile.root.forward.cpu_time_ns
        return {
            "time_ns": time,
            "device_time_ns": _sum(s.device_time_ns for s in stats) if timed else None,
            "flops": _sum(s.flops for s in stats),
            # None when the counts are not known (a profile from a trace without the
            # model): then no change is computed, never one from or to 0.
            "params": profile.root.params_total,
            "peak_bytes": None if profile.memory is None else profile.memory.peak_bytes,
        }

    use_step = same_kind and base.step_time_ns is not None and new.step_time_ns is not None
    summary = _changes(SUMMARY_METRICS, values(base, use_step), values(new, use_step))
    return summary, "step" if use_step else "forward"


# -- parsing the command line's numbers --------------------------------------------------

_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_THRESHOLD = re.compile(rf"^\s*{_NUMBER}\s*(%?)\s*$")
_DURATION = re.compile(rf"^\s*{_NUMBER}\s*(ns|us|µs|ms|s)?\s*$")
_DURATION_SCALE = {None: 1, "ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


def parse_threshold(text: str) -> float:
    """``"10%"`` or ``"0.1"`` -> ``0.1``. A bare number of 1 or more is refused as
    ambiguous (is ``10`` ten percent, or 1000%?)."""
    match = _THRESHOLD.match(text)
    if not match:
        raise ValueError(f"expected a percentage such as 10% or a fraction such as 0.1, got {text!r}")
    number, percent = float(match.group(1)), match.group(2)
    if percent:
        return number / 100
    if number >= 1:
        raise ValueError(
            f"{text!r} is ambiguous: write {match.group(1)}% for a percentage, or a fraction "
            f"below 1 such as {number / 100:g} for {match.group(1)}%"
        )
    return number


def parse_duration_ns(text: str) -> int:
    """``"50us"`` -> ``50000``; units ns, us (or µs), ms, s; a bare number is ns."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"expected a duration such as 50us, 1ms, 200ns or a number of ns, got {text!r}")
    return round(float(match.group(1)) * _DURATION_SCALE[match.group(2)])
