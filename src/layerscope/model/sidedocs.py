"""The side documents of a :class:`~layerscope.model.tree.Profile`, typed: its trace
(``Profile.trace``, one run's spans on a timeline), its memory summary
(``Profile.memory``, the step's peak, its culprit and the timeline of live bytes) and its
device ledger (``Profile.device``, where every device nanosecond of the steps went).

Every number carries its unit in its name. Each type turns itself into its part of the
``layerscope/1`` document (``to_dict``) and back (``from_dict``), here and nowhere else;
the document's keys, their order and their lists are the ones earlier versions wrote,
so a saved file reads back and writes out byte for byte. ``from_dict`` trusts its input:
:mod:`layerscope.model.schema` checks a document first.

A trace holds one span per op call: its spans and flows are kept as columns
(:class:`Spans`, :class:`Flows`), built without an object per span, and read as
:class:`Span` and :class:`Flow` records. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Span(NamedTuple):
    """A module, label, step part or op running: from ``start_ns`` (after the run's
    start) for ``duration_ns``. ``op_index`` is an index into ``profile[path].ops``
    for an op, -1 for a module, label or step part running (forward frames; in
    backward, the owner of the running ops and its ancestors)."""

    start_ns: int
    duration_ns: int
    path: str
    phase: str
    op_index: int


class Flow(NamedTuple):
    """An autograd node: ``forward``, the index in ``Trace.spans`` of the forward op that
    created it; ``backward``, of the first op that ran for it in backward."""

    forward: int
    backward: int


@dataclass
class Spans:
    """A trace's spans, a column per :class:`Span` field: ``spans.start_ns[i]`` is span
    ``i``'s start. A trace holds one span per op call (millions in a long run), so they
    are kept as columns, built with no object per span; iterating or indexing gives
    :class:`Span` objects, and a loop over many reads the columns it needs with ``zip``."""

    start_ns: list[int] = field(default_factory=list)
    duration_ns: list[int] = field(default_factory=list)
    path: list[str] = field(default_factory=list)
    phase: list[str] = field(default_factory=list)
    op_index: list[int] = field(default_factory=list)

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[Any]]) -> Spans:
        """From ``(start_ns, duration_ns, path, phase, op_index)`` rows."""
        if not rows:
            return cls()
        start, duration, path, phase, index = zip(*rows)
        return cls(list(start), list(duration), list(path), list(phase), list(index))

    def rows(self) -> list[list[Any]]:
        """``[start_ns, duration_ns, path, phase, op_index]`` for each span, as a document has them."""
        return list(map(list, zip(self.start_ns, self.duration_ns, self.path, self.phase, self.op_index)))

    def __len__(self) -> int:
        return len(self.start_ns)

    def __iter__(self) -> Iterator[Span]:
        return map(Span, self.start_ns, self.duration_ns, self.path, self.phase, self.op_index)

    def __getitem__(self, i: int) -> Span:
        return Span(self.start_ns[i], self.duration_ns[i], self.path[i], self.phase[i], self.op_index[i])


@dataclass
class Flows:
    """A trace's flows, a column per :class:`Flow` field (as :class:`Spans`)."""

    forward: list[int] = field(default_factory=list)
    backward: list[int] = field(default_factory=list)

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[int]]) -> Flows:
        """From ``(forward, backward)`` rows."""
        if not rows:
            return cls()
        forward, backward = zip(*rows)
        return cls(list(forward), list(backward))

    def rows(self) -> list[list[int]]:
        return list(map(list, zip(self.forward, self.backward)))

    def __len__(self) -> int:
        return len(self.forward)

    def __iter__(self) -> Iterator[Flow]:
        return map(Flow, self.forward, self.backward)


@dataclass
class Trace:
    """One run as spans on a timeline (``Profile.trace``): sorted by start, enclosing
    spans first. ``profile()`` keeps its op pass (apart from its timed passes); a
    ``Profiler`` its last step (its detail step in older files). ``step_ns``, when the
    run had step marks: the step's length, from its first mark (time 0) to its last."""

    spans: Spans = field(default_factory=Spans)
    flows: Flows = field(default_factory=Flows)
    step_ns: int | None = None
    #: The traced step's live memory over time, on the spans' clock, where it is not
    #: ``Profile.memory.timeline``'s step (a block's steps summed: that one is the step
    #: with the highest peak); None where they are the same run, or memory was not tracked.
    memory: Timeline | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"spans": self.spans.rows(), "flows": self.flows.rows()}
        if self.step_ns is not None:
            out["step_ns"] = self.step_ns
        if self.memory is not None:
            out["memory"] = self.memory.to_dict()
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Trace:
        memory = doc.get("memory")
        return cls(
            Spans.from_rows(doc["spans"]), Flows.from_rows(doc.get("flows") or ()), doc.get("step_ns"),
            None if memory is None else Timeline.from_dict(memory),
        )


class TimelineSpan(NamedTuple):
    """A top-level module or step part running, on the memory timeline; ``phase`` is
    None for a step part's own work (it has no forward)."""

    start_ns: int
    end_ns: int
    path: str
    phase: str | None


@dataclass
class Timeline:
    """Live bytes over the run: ``bytes[i]`` at ``t_ns[i]`` (at most a few thousand
    points kept of ``points_recorded``, each bucket's min and max, so the peak
    survives), ``categories``: the same points split by category (they add up to
    ``bytes``; None in files that predate them), and the top-level spans."""

    t_ns: list[int] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    categories: dict[str, list[int]] | None = None
    points_recorded: int = 0
    spans: list[TimelineSpan] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t_ns": self.t_ns, "bytes": self.bytes}
        if self.categories is not None:
            out["categories"] = self.categories
        out["points_recorded"] = self.points_recorded
        out["spans"] = [list(span) for span in self.spans]
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Timeline:
        categories = doc.get("categories")
        return cls(
            t_ns=list(doc.get("t_ns") or []),
            bytes=list(doc.get("bytes") or []),
            categories=None if categories is None else {name: list(v) for name, v in categories.items()},
            points_recorded=doc.get("points_recorded", 0),
            spans=[TimelineSpan(*span) for span in doc.get("spans") or ()],
        )


@dataclass
class PeakAt:
    """Where the step's peak was reached: the node running (``path``), its phase (None
    for a step part's own work) and the time (None where not known)."""

    path: str
    phase: str | None
    t_ns: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "phase": self.phase, "t_ns": self.t_ns}


@dataclass
class OptimizerState:
    """An optimizer's state: ``total_bytes``, and by state key (``exp_avg``, ``step``)."""

    total_bytes: int
    bytes_by_key: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total_bytes, "by_key": self.bytes_by_key}


@dataclass
class DeviceMemory:
    """The caching allocator at the step's peak (a GPU run)."""

    allocated_peak_bytes: int
    reserved_at_peak_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"allocated_peak_bytes": self.allocated_peak_bytes, "reserved_at_peak_bytes": self.reserved_at_peak_bytes}


@dataclass
class MemorySummary:
    """A profile's model-level memory (``Profile.memory``), in logical storage bytes:
    the step's peak above nothing (``peak_bytes``), the live bytes at its start
    (``baseline_bytes``), where the peak was reached and what it held by category,
    each phase's peak, parameter and buffer bytes by dtype (None where the model was
    not at hand: a profile read from a trace), each optimizer's state, the timeline and
    the caching allocator's figures."""

    peak_bytes: int
    baseline_bytes: int = 0
    peak_at: PeakAt | None = None
    peak_categories: dict[str, int] = field(default_factory=dict)
    peak_by_phase: dict[str, int] = field(default_factory=dict)
    param_bytes_by_dtype: dict[str, int] | None = None
    buffer_bytes_by_dtype: dict[str, int] | None = None
    optimizer_state_bytes: dict[str, OptimizerState] = field(default_factory=dict)
    timeline: Timeline | None = None
    device: DeviceMemory | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.param_bytes_by_dtype is not None:
            out["param_bytes_by_dtype"] = self.param_bytes_by_dtype
        if self.buffer_bytes_by_dtype is not None:
            out["buffer_bytes_by_dtype"] = self.buffer_bytes_by_dtype
        out.update(
            optimizer_state_bytes={name: state.to_dict() for name, state in self.optimizer_state_bytes.items()},
            baseline_bytes=self.baseline_bytes,
            peak_bytes=self.peak_bytes,
            peak_at=None if self.peak_at is None else self.peak_at.to_dict(),
            peak_categories=self.peak_categories,
            peak_by_phase=self.peak_by_phase,
            timeline=None if self.timeline is None else self.timeline.to_dict(),
            device=None if self.device is None else self.device.to_dict(),
        )
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> MemorySummary:
        at, timeline, device = doc.get("peak_at"), doc.get("timeline"), doc.get("device")
        return cls(
            peak_bytes=doc["peak_bytes"],
            baseline_bytes=doc.get("baseline_bytes", 0),
            peak_at=None if at is None else PeakAt(at["path"], at["phase"], at.get("t_ns")),
            peak_categories=dict(doc.get("peak_categories") or {}),
            peak_by_phase=dict(doc.get("peak_by_phase") or {}),
            param_bytes_by_dtype=_table(doc.get("param_bytes_by_dtype")),
            buffer_bytes_by_dtype=_table(doc.get("buffer_bytes_by_dtype")),
            optimizer_state_bytes={
                name: OptimizerState(state["total"], dict(state.get("by_key") or {}))
                for name, state in (doc.get("optimizer_state_bytes") or {}).items()
            },
            timeline=None if timeline is None else Timeline.from_dict(timeline),
            device=None if device is None else DeviceMemory(device["allocated_peak_bytes"], device["reserved_at_peak_bytes"]),
        )


def _table(value: dict[str, int] | None) -> dict[str, int] | None:
    return None if value is None else dict(value)


#: Why device time is in no node, by key of :attr:`DeviceLedger.unattributed_ns_by_reason`.
UNATTRIBUTED_REASONS: dict[str, str] = {
    "communication": "collectives' kernels, not overlapped with compute",
    "no_op_range": "launched outside any op range",
    "no_node": "launched from op ranges no node holds",
}


@dataclass
class DeviceLedger:
    """Every device nanosecond of the profile's steps in exactly one place
    (``Profile.device``): ``busy_ns``, the steps' device work on every stream with
    overlap counted once, is ``attributed_ns`` (the self device time of every node and
    part, all phases) plus what no node holds, by reason
    (:data:`UNATTRIBUTED_REASONS`). ``compute_ns`` and ``comm_ns`` are the busy time of
    the work that is not a collective's and of collectives' kernels, ``overlap_ns`` the
    time both ran (``compute_ns + comm_ns - busy_ns``): a collective's device time is
    communication, never a module's compute. Steps are summed."""

    busy_ns: int
    attributed_ns: int
    unattributed_ns_by_reason: dict[str, int] = field(default_factory=dict)
    compute_ns: int = 0
    comm_ns: int = 0
    overlap_ns: int = 0

    @property
    def unattributed_ns(self) -> int:
        return sum(self.unattributed_ns_by_reason.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "busy_ns": self.busy_ns,
            "attributed_ns": self.attributed_ns,
            "unattributed_ns_by_reason": dict(self.unattributed_ns_by_reason),
            "compute_ns": self.compute_ns,
            "comm_ns": self.comm_ns,
            "overlap_ns": self.overlap_ns,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> DeviceLedger:
        return cls(
            busy_ns=doc["busy_ns"], attributed_ns=doc["attributed_ns"],
            unattributed_ns_by_reason=dict(doc.get("unattributed_ns_by_reason") or {}),
            compute_ns=doc.get("compute_ns", 0), comm_ns=doc.get("comm_ns", 0), overlap_ns=doc.get("overlap_ns", 0),
        )
