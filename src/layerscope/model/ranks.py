"""One run of many ranks: merge the per-rank profiles of a distributed job.

A job under torchrun writes one ``layerscope/1`` profile per rank and cycle
(``layerscope.handlers.save_json``). :func:`merge` folds them into one
:class:`MergedRun` (schema ``layerscope-ranks/1``), from which every figure of the
report is derived:

- **spread**: per node and phase, the distribution over ranks of its time, self time,
  communication time and memory peak (min, median, max, the slowest rank, max / median);
- **stragglers**: a rank whose self time in a node exceeds the median of the other ranks;
- **waiting**: per rank, the share of its step spent waiting in collectives;
- **one tree**: the median rank's, rebuilt and checked like any loaded profile.

What a merged document keeps, so that merging stays associative and order-independent
(``merge([merge([a, b]), c]) == merge([a, merge([b, c])]) == merge([c, a, b])``): the
union of the ranks' node structure (path, type, parent, ...) once, and for each rank its
meta, its memory summary and its own figures per node and phase. Everything else in the
document is derived from those, so a merged document is merged again exactly as the rank
files it came from. Not kept (they stay in the rank files): op rows, and with them FLOPs,
MACs and bytes (communication bytes too), whose invariant is that a node's op rows add up to them; traces; memory
timelines; input and output shapes.

Plain Python, no torch; no number becomes a string here (``render/ranks_text.py``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from layerscope.base import formats
from layerscope.base.errors import MergeError, SchemaError
from layerscope.base.stats import median_floor, median_floor_without, observed_median_index
from layerscope.model.runfacts import FromMergedRun, RunFacts, RunFigures, meta_to_dict
from layerscope.model.sidedocs import MemorySummary
from layerscope.model.tree import PHASES, ModuleNode, PhaseStats, Profile

__all__ = [
    "DEFAULT_MIN_TIME_NS",
    "DEFAULT_THRESHOLD",
    "SCHEMA",
    "ImbalanceChange",
    "MergedRun",
    "RankTraces",
    "Spread",
    "Straggler",
    "Waiting",
    "imbalance_changes",
    "merge",
    "ranks_from_dict",
]

SCHEMA = "layerscope-ranks/1"

#: A rank is a straggler in a node when its self time there exceeds the other ranks'
#: median by more than this fraction ...
DEFAULT_THRESHOLD = 0.1
#: ... and by at least this much: below a millisecond, a step's noise swamps any ratio.
DEFAULT_MIN_TIME_NS = 1_000_000

#: Figures that come from op rows (a node's ops add up to them): not kept per rank.
_FROM_OPS = frozenset({
    "flops", "self_flops", "macs", "self_macs", "bytes", "self_bytes", "comm_bytes", "self_comm_bytes",
})

#: What a rank's tree rebuilt from a merged run lacks, in words.
_NOT_KEPT = "FLOPs, MACs, bytes, collective bytes and calls, op rows and the trace"

#: Node fields that must agree across ranks: the model's structure.
_STRUCTURE = ("type", "parent", "depth", "kind", "params", "params_total", "extra_repr")
#: Of those, the parameter counts: None (not known) on one rank is never a mismatch.
_COUNTS = frozenset({"params", "params_total"})

#: The metrics of a :class:`Spread`, in the order they are listed.
SPREAD_METRICS: tuple[str, ...] = ("time_ns", "self_time_ns", "comm_time_ns", "peak_bytes")


# -- the data ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeShape:
    """A node's place in the model, the same on every rank that has it. ``params`` and
    ``params_total`` are None when not known (a profile from a trace without the model)."""

    path: str
    type: str
    parent: str | None
    depth: int
    kind: str
    params: int | None
    params_total: int | None
    extra_repr: str

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class NodeFigures:
    """What one rank measured in one node: its calls and its stats per phase."""

    calls: int
    profiled: bool
    phases: dict[str, PhaseStats]

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"calls": self.calls, "profiled": self.profiled}
        for phase in PHASES:
            stats = self.phases.get(phase)
            doc[phase] = None if stats is None else _compact(stats)
        return doc


@dataclass
class RankRecord:
    """One rank of the run, as kept in a merged document. ``nodes`` is in the rank's
    own pre-order (the model's tree, then the step's parts). ``source`` names where it
    came from, for messages; it is not saved."""

    rank: int
    meta: dict[str, Any]
    param_bytes: int | None
    memory: dict[str, Any] | None
    nodes: dict[str, NodeFigures]
    shapes: dict[str, NodeShape] = field(repr=False)
    source: str = field(default="", compare=False)

    @property
    def step_time_ns(self) -> int | None:
        value = self.meta.get("step_time_ns")
        return None if value is None else int(value)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "meta": self.meta,
            "param_bytes": self.param_bytes,
            "memory": self.memory,
            "nodes": {path: figures.to_dict() for path, figures in self.nodes.items()},
        }


def _compact(stats: PhaseStats) -> dict[str, Any]:
    # Fields not measured (None) are left out: a PhaseStats reads them back as None.
    return {k: v for k, v in stats.to_dict().items() if v is not None}


def _plain(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples as lists): a rank merged from memory and
    the same rank read from a file must compare equal."""
    return json.loads(json.dumps(value, allow_nan=False))


def rank_record(profile: Profile, source: str) -> RankRecord:
    """What a merged document keeps of one rank's profile: a small record, which a process
    that loaded a rank's trace hands back instead of the whole profile."""
    meta = _plain(meta_to_dict(profile.meta, profile.figures))
    rank = meta.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise MergeError(
            f"{source} has no rank in its meta (found {rank!r}): merge takes the per-rank profiles "
            "of a distributed run (a Profiler under torchrun saved with layerscope.handlers.save_json)"
        )
    nodes: dict[str, NodeFigures] = {}
    shapes: dict[str, NodeShape] = {}
    for node in profile.nodes():
        phases = {}
        for phase, stats in node.phases():
            kept = PhaseStats.from_dict({k: v for k, v in stats.to_dict().items() if k not in _FROM_OPS})
            phases[phase] = kept
        nodes[node.path] = NodeFigures(node.calls, node.profiled, phases)
        shapes[node.path] = NodeShape(
            node.path, node.type, node.parent, node.depth, node.kind, node.params, node.params_total, node.extra_repr
        )
    memory = None
    if profile.memory is not None:
        memory = _plain({k: v for k, v in profile.memory.to_dict().items() if k != "timeline"})
    param_bytes = None if profile.param_bytes is None else int(profile.param_bytes)
    return RankRecord(rank, meta, param_bytes, memory, nodes, shapes, source)


@dataclass
class Spread:
    """One metric of one node and phase over the ranks that have it: the smallest, the
    median (to the nanosecond or byte, rounded down for an even number of ranks), the
    largest and the rank it was on (the lowest such rank on a tie), and ``imbalance`` =
    max / median (None for a median of zero)."""

    path: str
    phase: str
    metric: str
    min: int
    median: int
    max: int
    argmax_rank: int
    ranks: int

    @property
    def imbalance(self) -> float | None:
        return None if self.median == 0 else self.max / self.median

    def to_dict(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["imbalance"] = self.imbalance
        return doc


@dataclass(frozen=True)
class Straggler:
    """``rank`` spent ``excess_ns`` more in ``path``'s own work (``phase``) than the median
    of the other ranks did: the time that rank cost the step there."""

    path: str
    phase: str
    rank: int
    self_time_ns: int
    others_median_ns: int

    @property
    def excess_ns(self) -> int:
        return self.self_time_ns - self.others_median_ns

    @property
    def relative(self) -> float | None:
        """``excess / others' median`` (0.5 is 50% slower); None from a zero median."""
        return None if self.others_median_ns == 0 else self.excess_ns / self.others_median_ns

    def to_dict(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc.update(excess_ns=self.excess_ns, relative=self.relative)
        return doc


@dataclass(frozen=True)
class Waiting:
    """How much of a rank's step went to waiting in collectives (the ``<communication>``
    part's time; 0 when it has none). ``step_time_ns`` is None for a forward-only
    profile, and ``fraction`` with it."""

    rank: int
    wait_ns: int
    step_time_ns: int | None

    @property
    def fraction(self) -> float | None:
        return None if not self.step_time_ns else self.wait_ns / self.step_time_ns

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "wait_ns": self.wait_ns, "step_time_ns": self.step_time_ns, "fraction": self.fraction}


@dataclass
class MergedRun(formats.NotebookDisplay):
    """The ranks of one run (one cycle of a ``Profiler`` schedule), merged.

    ``ranks`` are sorted by rank; ``nodes`` is the union of their node structure, in an
    order that keeps every rank's own pre-order. ``world_size``, ``run_id``, ``model``
    and ``step_range`` are those the ranks agree on (None where no rank said).
    ``threshold`` and ``min_time_ns`` are the straggler test's (see :meth:`stragglers`).
    """

    DOCUMENT = "ranks"

    nodes: list[NodeShape]
    ranks: list[RankRecord]
    world_size: int | None = None
    run_id: str | None = None
    model: str | None = None
    step_range: list[int] | None = None
    threshold: float = DEFAULT_THRESHOLD
    min_time_ns: int = DEFAULT_MIN_TIME_NS

    # -- the ranks ---------------------------------------------------------------------
    @property
    def rank_numbers(self) -> list[int]:
        return [record.rank for record in self.ranks]

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks of ``range(world_size)`` with no profile here (empty when unknown)."""
        if self.world_size is None:
            return []
        present = set(self.rank_numbers)
        return [rank for rank in range(self.world_size) if rank not in present]

    def record(self, rank: int) -> RankRecord:
        for record in self.ranks:
            if record.rank == rank:
                return record
        raise KeyError(f"rank {rank} is not in this merged run; it has ranks {_listed(self.rank_numbers)}")

    @property
    def time_metric(self) -> str:
        """``device`` when every rank measured device time, else ``cpu``: the time all
        spreads and stragglers are in."""
        for record in self.ranks:
            root = record.nodes.get("")
            if root is None or root.phases["forward"].device_time_ns is None:
                return "cpu"
        return "device"

    def step_time_ns(self, record: RankRecord) -> int:
        """The rank's step time; for a forward-only profile, its root's time."""
        # A forward-only profile has no step: its root's time stands for it.
        if record.step_time_ns is not None:
            return record.step_time_ns
        return sum(_time(stats, self.time_metric) for stats in record.nodes[""].phases.values())

    @property
    def median_rank(self) -> int:
        """The rank of the median step time (the lower median for an even number of
        ranks; ties by rank): an observed rank, whose tree stands for the run."""
        by_rank = sorted(self.ranks, key=lambda r: r.rank)
        return by_rank[observed_median_index([self.step_time_ns(r) for r in by_rank])].rank

    def rank_profile(self, rank: int) -> Profile:
        """Rank ``rank``'s profile rebuilt from the merged document (no op rows, FLOPs or
        trace), its invariants checked as :func:`layerscope.load` checks a file's."""
        from layerscope.model.check import summarize, tree_problems

        record = self.record(rank)
        by_path: dict[str, ModuleNode] = {}
        tops: list[ModuleNode] = []
        for shape in self.nodes:
            figures = record.nodes.get(shape.path)
            if figures is None:
                continue
            node = ModuleNode(
                path=shape.path, type=shape.type, parent=shape.parent, depth=shape.depth, calls=figures.calls,
                params=shape.params, params_total=shape.params_total, profiled=figures.profiled,
                forward=figures.phases.get("forward") or PhaseStats(), backward=figures.phases.get("backward"),
                recompute=figures.phases.get("recompute"), kind=shape.kind, extra_repr=shape.extra_repr,
            )
            by_path[shape.path] = node
            if shape.parent is None:
                tops.append(node)
            else:
                by_path[shape.parent].children.append(node)
        if not tops or tops[0].path != "":
            raise SchemaError(f"rank {rank} of this merged run has no root module")
        root, parts = tops[0], tops[1:]
        memory = None if record.memory is None else MemorySummary.from_dict(record.memory)
        # The run's counts are known on every node or on none (merge): so is the rank's tree.
        param_bytes = None if root.params is None else record.param_bytes
        meta = RunFacts.from_dict(record.meta)
        # What a merged run drops, said where the rank's tree is shown: never read as 0.
        meta.from_merged_run = FromMergedRun(rank=rank, not_kept=_NOT_KEPT)
        profile = Profile(
            root=root, meta=meta, figures=RunFigures.from_dict(record.meta), param_bytes=param_bytes, parts=parts,
            memory=memory,
        )
        problems = tree_problems(profile)
        if problems:
            raise SchemaError(f"rank {rank} of this merged run is inconsistent: {summarize(problems)}")
        return profile

    def median_profile(self) -> Profile:
        """The tree of :attr:`median_rank`."""
        return self.rank_profile(self.median_rank)

    # -- the figures -------------------------------------------------------------------
    def values_by_rank(
        self, path: str, phase: str, metric: str, time_metric: str | None = None
    ) -> list[tuple[int, int]]:
        """``(value, rank)`` of ``metric`` (one of ``SPREAD_METRICS``) for each rank that
        measured it, in rank order."""
        time_metric = time_metric or self.time_metric
        found = []
        for record in self.ranks:
            figures = record.nodes.get(path)
            stats = None if figures is None else figures.phases.get(phase)
            if stats is None:
                continue
            if metric == "time_ns":
                value: int | None = _time(stats, time_metric)
            elif metric == "self_time_ns":
                value = _self_time(stats, time_metric)
            elif metric == "comm_time_ns":
                # None is "no collective ran": none on this rank, so zero.
                value = stats.comm_time_ns or 0
            else:
                value = stats.peak_bytes
            if value is not None:
                found.append((value, record.rank))
        return found

    def spreads(self) -> list[Spread]:
        """Every node (in tree order) and phase, each metric some rank measured; a
        communication time that is zero on every rank is left out."""
        rows = []
        time_metric = self.time_metric
        for shape in self.nodes:
            for phase in PHASES:
                for metric in SPREAD_METRICS:
                    values = self.values_by_rank(shape.path, phase, metric, time_metric)
                    if not values or (metric == "comm_time_ns" and not any(v for v, _ in values)):
                        continue
                    rows.append(_spread(shape.path, phase, metric, values))
        return rows

    def spread(self, path: str, phase: str = "forward", metric: str = "time_ns") -> Spread:
        values = self.values_by_rank(path, phase, metric)
        if not values:
            raise KeyError(f"no rank measured {metric} of {path!r} in {phase}")
        return _spread(path, phase, metric, values)

    def stragglers(self, threshold: float | None = None, min_time_ns: int | None = None) -> list[Straggler]:
        """Nodes where one rank's self time exceeds the median of the *other* ranks by
        more than ``threshold`` (a fraction; default: the run's, 10%) and by at least
        ``min_time_ns`` (default: the run's, 1 ms), largest excess first (ties by path,
        phase and rank).

        Self time, not total time: a delay planted in one leaf module names that module,
        not every ancestor whose total contains it. On the CPU the self time excludes the
        node's own time in collectives (``self_comm_time_ns``): that is the *others'*
        waiting for the straggler, not work of its own. The ``<communication>`` part is
        never a straggler, for the same reason; :meth:`waiting` shows it.
        """
        ratio = self.threshold if threshold is None else threshold
        floor = self.min_time_ns if min_time_ns is None else min_time_ns
        time_metric = self.time_metric
        found = []
        for shape in self.nodes:
            if shape.kind == "communication":
                continue
            for phase in PHASES:
                values = sorted(self.values_by_rank(shape.path, phase, "self_time_ns", time_metric))
                if len(values) < 2:
                    continue
                ordered = [value for value, _ in values]
                for index, (value, rank) in enumerate(values):
                    median = median_floor_without(ordered, index)
                    excess = value - median
                    if excess >= floor and excess > ratio * median and excess > 0:
                        found.append(Straggler(shape.path, phase, rank, value, median))
        found.sort(key=lambda s: (-s.excess_ns, s.path, PHASES.index(s.phase), s.rank))
        return found

    def waiting(self) -> list[Waiting]:
        """Per rank, its time in the ``<communication>`` part and its step time. The fast
        ranks wait for the slow one, so a straggler shows as its peers' waiting."""
        rows = []
        for record in self.ranks:
            wait = sum(
                figures.phases["forward"].cpu_time_ns
                for path, figures in record.nodes.items()
                if record.shapes[path].kind == "communication" and record.shapes[path].parent is None
            )
            rows.append(Waiting(record.rank, wait, record.step_time_ns))
        return rows

    # -- the document ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The ``layerscope-ranks/1`` document: what was merged (``nodes``, ``ranks``),
        then the figures derived from it (``summary``), for readers of the JSON; a
        reader of the document rebuilds those from the ranks."""
        return {
            "schema": SCHEMA,
            "run": {
                "run_id": self.run_id,
                "model": self.model,
                "world_size": self.world_size,
                "step_range": self.step_range,
                "ranks": self.rank_numbers,
                "missing_ranks": self.missing_ranks,
                "median_rank": self.median_rank,
                "time_metric": self.time_metric,
                "straggler_threshold": self.threshold,
                "straggler_min_time_ns": self.min_time_ns,
            },
            "nodes": [shape.to_dict() for shape in self.nodes],
            "ranks": [record.to_dict() for record in self.ranks],
            "summary": {
                "spreads": [row.to_dict() for row in self.spreads()],
                "stragglers": [row.to_dict() for row in self.stragglers()],
                "waiting": [row.to_dict() for row in self.waiting()],
            },
        }

    @classmethod
    def from_dict(cls, doc: Any, source: str = "document") -> MergedRun:
        """Rebuild a :class:`MergedRun` from a ``layerscope-ranks/1`` dict: the type of every
        field it reads is checked, and every rank's tree is rebuilt and checked; the
        ``summary`` is derived again from the ranks, never read."""
        from layerscope.model.check import summarize
        from layerscope.model.schema import check_value

        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            found = doc.get("schema") if isinstance(doc, dict) else None
            raise SchemaError(f"{source} has schema {found!r}; a merged run has {SCHEMA!r}")
        problems = check_value(doc, _rank_spec())
        if problems:
            raise SchemaError(f"{source} is a damaged merged run: {summarize(problems)}")
        try:
            shapes = {entry["path"]: NodeShape(**{f.name: entry[f.name] for f in fields(NodeShape)}) for entry in doc["nodes"]}
            if len(shapes) != len(doc["nodes"]):
                raise ValueError("a node path is listed twice")
            union = list(shapes.values())
            records = []
            for entry in doc["ranks"]:
                nodes: dict[str, NodeFigures] = {}
                for shape in union:  # the rank's own order: the union's, restricted to it
                    data = entry["nodes"].get(shape.path)
                    if data is not None:
                        phases = {p: PhaseStats.from_dict(data[p]) for p in PHASES if data.get(p) is not None}
                        nodes[shape.path] = NodeFigures(data["calls"], data["profiled"], phases)
                unknown = set(entry["nodes"]) - set(nodes)
                if unknown:
                    raise ValueError(f"rank {entry['rank']} has node {sorted(unknown)[0]!r}, which 'nodes' lacks")
                records.append(RankRecord(
                    entry["rank"], dict(entry["meta"]), entry["param_bytes"],
                    None if entry.get("memory") is None else dict(entry["memory"]), nodes,
                    {path: shapes[path] for path in nodes}, f"rank {entry['rank']} of {source}",
                ))
            if not records:
                raise ValueError("it holds no ranks")
            run = doc["run"]
            merged = merge(
                [cls(nodes=[], ranks=records)], sources=[source],
                threshold=float(run.get("straggler_threshold", DEFAULT_THRESHOLD)),
                min_time_ns=int(run.get("straggler_min_time_ns", DEFAULT_MIN_TIME_NS)),
            )
            for record in merged.ranks:
                try:
                    merged.rank_profile(record.rank)  # every rank's invariants, at the door
                except SchemaError as exc:
                    raise SchemaError(f"{source}: {exc}") from None
        except SchemaError:
            raise
        except MergeError as exc:
            raise SchemaError(f"{source} is an inconsistent merged run: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise SchemaError(f"{source} is a damaged merged run: {type(exc).__name__}: {exc}") from None
        return merged

    def render(self, fmt: str = "text", **options: Any) -> str:
        """The merged run in a registered format (``layerscope.base.formats.formats("ranks")``)."""
        return formats.render(self, fmt, **options)

    def save(self, path: str | os.PathLike[str], fmt: str | None = None, **options: Any) -> None:
        """Write the merged run to ``path`` atomically; the format follows the extension."""
        formats.save(self, path, fmt, **options)

    def __str__(self) -> str:
        return formats.display_text(self)


@dataclass
class RankTraces:
    """The rank files of one run, for the exports that need their traces (a Chrome
    trace with one process per rank). ``profiles`` may be a lazy iterable, loading one
    file at a time, so the traces of many ranks never sit in memory together."""

    DOCUMENT = "rank-traces"

    profiles: Iterable[Profile]


def _time(stats: PhaseStats, time_metric: str) -> int:
    if time_metric == "device":
        return stats.device_time_ns or 0
    return stats.cpu_time_ns


def _self_time(stats: PhaseStats, time_metric: str) -> int:
    if time_metric == "device":
        return stats.self_device_time_ns or 0
    return max(0, stats.self_cpu_time_ns - (stats.self_comm_time_ns or 0))


def _spread(path: str, phase: str, metric: str, values: list[tuple[int, int]]) -> Spread:
    top, top_rank = max(values, key=lambda item: (item[0], -item[1]))
    return Spread(
        path, phase, metric, min(v for v, _ in values), median_floor([v for v, _ in values]), top, top_rank, len(values)
    )


def _listed(ranks: Iterable[int]) -> str:
    return ", ".join(str(r) for r in ranks) or "none"


# -- merging -----------------------------------------------------------------------------


def _records(item: Profile | MergedRun | RankRecord, source: str) -> Iterator[RankRecord]:
    if isinstance(item, RankRecord):
        yield item
    elif isinstance(item, MergedRun):
        for record in item.ranks:
            yield RankRecord(
                record.rank, record.meta, record.param_bytes, record.memory, record.nodes, record.shapes,
                f"rank {record.rank} of {source}",
            )
    elif isinstance(item, Profile):
        yield rank_record(item, source)
    else:
        raise TypeError(f"merge takes Profiles, MergedRuns and RankRecords, got {type(item).__name__} ({source})")


def merge(
    items: Iterable[Profile | MergedRun | RankRecord],
    *,
    sources: Sequence[str] | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    min_time_ns: int = DEFAULT_MIN_TIME_NS,
) -> MergedRun:
    """Merge the per-rank profiles of one run, and merged runs of it, into one.

    ``items`` may be lazy (a generator loading one file at a time): each profile is
    reduced to what a merged document keeps as soon as it comes, so memory does not hold
    every rank's op rows and trace (a :class:`RankRecord`, :func:`rank_record`'s, is
    taken as it is: the command line loads rank traces in processes of their own). ``sources`` names the items in messages (file names).

    Refused with a :class:`~layerscope.base.errors.MergeError` naming what differs: ranks of
    other runs (``meta.run_id``), models, world sizes or cycles (``step_range``), a
    rank given twice, a rank outside the world size. Ranks absent from a known world size
    are merged without and named (:attr:`MergedRun.missing_ranks`). A meta field no rank
    states is unknown, never a mismatch.
    """
    if not threshold >= 0 or threshold == float("inf"):
        raise ValueError(f"threshold must be a number >= 0, got {threshold!r}")
    if min_time_ns < 0:
        raise ValueError(f"min_time_ns must be >= 0, got {min_time_ns}")
    records: list[RankRecord] = []
    for index, item in enumerate(items):
        source = sources[index] if sources is not None and index < len(sources) else f"input {index + 1}"
        records.extend(_records(item, source))
    if not records:
        raise MergeError("nothing to merge: give the per-rank profiles of one run")
    # Files of several cycles first: `merge out/*.json` over two cycles gives each rank
    # twice, and the cycles are what to say.
    step_range = _agreed(
        sorted(records, key=lambda r: r.rank), "step_range", "files from different cycles", _one_cycle(records),
        describe=_steps,
    )
    seen: dict[int, RankRecord] = {}
    for record in records:
        if record.rank in seen:
            raise MergeError(
                f"rank {record.rank} is given twice ({seen[record.rank].source} and {record.source}); "
                "each rank's profile may be merged once"
            )
        seen[record.rank] = record
    records.sort(key=lambda r: r.rank)
    run_id = _agreed(records, "run_id", "files from different runs", "merge the files of one run")
    model = _agreed(records, "model", "profiles of different models", "merge the ranks of one model")
    world_size = _agreed(records, "world_size", "different world sizes", "merge the ranks of one run")
    if world_size is not None:
        outside = [r.rank for r in records if r.rank >= world_size]
        if outside:
            raise MergeError(
                f"rank {outside[0]} ({seen[outside[0]].source}) is outside the world size {world_size} "
                f"the ranks state (ranks 0-{world_size - 1})"
            )
    nodes = _union(records)
    if any(shape.params is None for record in records for shape in record.shapes.values()):
        nodes, records = _counts_unknown(nodes, records)
    return MergedRun(
        nodes=nodes, ranks=records, world_size=world_size, run_id=run_id, model=model,
        step_range=None if step_range is None else list(step_range), threshold=float(threshold),
        min_time_ns=int(min_time_ns),
    )


def _one_cycle(records: list[RankRecord]) -> str:
    """How to merge one cycle of these ranks' files: the first cycle's files, as a
    pattern (``run/layerscope_steps0-4_rank*.json``) where their names differ only by
    rank, else by name."""
    cycles: dict[tuple[int, ...], list[str]] = {}
    for record in records:
        value = record.meta.get("step_range")
        if value is not None:
            cycles.setdefault(tuple(value), []).append(record.source)
    if len(cycles) < 2:
        return "merge one cycle at a time"
    first = cycles[min(cycles)]
    patterns = {re.sub(r"rank\d+", "rank*", source) for source in first}
    if len(patterns) == 1 and all(re.search(r"rank\d+", source) for source in first):
        return f"merge one cycle at a time, e.g. layerscope merge {patterns.pop()}"
    named = ", ".join(first[:3]) + (", ..." if len(first) > 3 else "")
    return f"merge one cycle at a time, e.g. {_steps(min(cycles))}'s: {named}"


def _steps(value: Any) -> str:
    return f"steps {value[0]}-{value[1]}"


def _agreed(records: list[RankRecord], key: str, what: str, advice: str, describe: Any = repr) -> Any:
    """The value of ``meta[key]`` that every rank stating it agrees on (None when none
    does); a :class:`MergeError` naming each value and its ranks otherwise."""
    by_value: dict[str, tuple[Any, list[int]]] = {}
    for record in records:
        value = record.meta.get(key)
        if value is None:
            continue
        by_value.setdefault(json.dumps(value, sort_keys=True), (value, []))[1].append(record.rank)
    if len(by_value) > 1:
        groups = sorted(by_value.values(), key=lambda item: item[1][0])
        listed = " and ".join(
            f"{describe(value)} (rank{'s' if len(ranks) > 1 else ''} {_listed(ranks)})" for value, ranks in groups
        )
        raise MergeError(f"{what}: {key} {listed}; {advice}")
    return next(iter(by_value.values()))[0] if by_value else None


def _union(records: list[RankRecord]) -> list[NodeShape]:
    """Every rank's nodes once, in a pre-order that keeps each rank's own order of
    siblings (a node new to the union goes right after its previous sibling in the rank
    that has it). Ranks are taken in rank order, so the union depends only on the set of
    ranks merged, never on how they were grouped."""
    shapes: dict[str, NodeShape] = {}
    owner: dict[str, int] = {}
    children: dict[str | None, list[str]] = {}
    for record in records:
        last: dict[str | None, int] = {}
        for path in record.nodes:
            shape = record.shapes[path]
            known = shapes.get(path)
            if known is None:
                shapes[path] = shape
                owner[path] = record.rank
                siblings = children.setdefault(shape.parent, [])
                at = last.get(shape.parent, -1) + 1
                siblings.insert(at, path)
                last[shape.parent] = at
                continue
            differs = [] if known == shape else [n for n in _STRUCTURE if _disagree(n, getattr(known, n), getattr(shape, n))]
            if differs:
                name = differs[0]
                raise MergeError(
                    f"rank {record.rank} and rank {owner[path]} disagree on node {path!r}: its {name} is "
                    f"{getattr(shape, name)!r} on rank {record.rank}, {getattr(known, name)!r} on rank "
                    f"{owner[path]}; merge the ranks of one model"
                )
            last[shape.parent] = children[shape.parent].index(path)
    ordered: list[NodeShape] = []
    stack = list(reversed(children.get(None, [])))
    while stack:
        path = stack.pop()
        ordered.append(shapes[path])
        stack.extend(reversed(children.get(path, [])))
    return ordered


def _disagree(name: str, known: Any, value: Any) -> bool:
    """Whether two ranks' values of structure field ``name`` differ; a parameter count
    one rank does not know (None) is unknown, never a mismatch."""
    if name in _COUNTS and (known is None or value is None):
        return False
    return bool(known != value)


def _counts_unknown(nodes: list[NodeShape], records: list[RankRecord]) -> tuple[list[NodeShape], list[RankRecord]]:
    """The union and the ranks with every parameter count unknown: a rank that does not
    know them (profiled from a trace without the model) makes the run's unknown, so no
    rank's tree mixes counts with gaps, and merging again gives the same document."""
    blank = {shape.path: replace(shape, params=None, params_total=None) for shape in nodes}
    ranks = [
        replace(record, param_bytes=None, shapes={path: blank[path] for path in record.shapes}) for record in records
    ]
    return list(blank.values()), ranks


@dataclass(frozen=True)
class ImbalanceChange:
    """How a node's imbalance over the ranks (max / median time in a phase) moved between
    two merged runs; None on a side that lacks the node or has a median of zero."""

    path: str
    phase: str
    base: float | None
    new: float | None

    @property
    def delta(self) -> float | None:
        return None if self.base is None or self.new is None else self.new - self.base

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "phase": self.phase, "base": self.base, "new": self.new, "delta": self.delta}


def imbalance_changes(base: MergedRun, new: MergedRun) -> list[ImbalanceChange]:
    """Each node and phase of either run, its imbalance in both; the largest move first
    (one-sided rows last), ties by path and phase."""
    def imbalances(run: MergedRun) -> dict[tuple[str, str], float | None]:
        return {(row.path, row.phase): row.imbalance for row in run.spreads() if row.metric == "time_ns"}

    old, now = imbalances(base), imbalances(new)
    rows = [ImbalanceChange(path, phase, old.get((path, phase)), now.get((path, phase))) for path, phase in old.keys() | now.keys()]
    rows.sort(key=lambda r: (r.delta is None, -abs(r.delta or 0.0), r.path, PHASES.index(r.phase)))
    return rows


# -- the merged document's field types (MergedRun.from_dict checks them) -----------------


def _rank_spec() -> Any:
    from layerscope.model.schema import (
        BOOL,
        INT,
        MEMORY,
        META,
        NUMBER,
        PHASE_STATS,
        STR,
        DictOf,
        ListOf,
        Obj,
        Opt,
        spec_of,
    )

    shape = spec_of(NodeShape)  # every field, as its type says
    # A rank's figures and record: their keys are not their fields (phases by name, meta as kept).
    figures = Obj(
        {"calls": INT, "profiled": BOOL, "forward": PHASE_STATS, "backward": Opt(PHASE_STATS),
         "recompute": Opt(PHASE_STATS)},
        frozenset({"calls", "profiled", "forward"}),
    )
    rank = Obj(
        {"rank": INT, "meta": META, "param_bytes": Opt(INT), "memory": Opt(MEMORY), "nodes": DictOf(figures)},
        frozenset({"rank", "meta", "param_bytes", "nodes"}),
    )
    run = Obj({"straggler_threshold": NUMBER, "straggler_min_time_ns": INT})
    return Obj(
        {"schema": STR, "run": run, "nodes": ListOf(shape), "ranks": ListOf(rank)},
        frozenset({"schema", "run", "nodes", "ranks"}),
    )


#: The same as :meth:`MergedRun.from_dict`, under its older name.
ranks_from_dict = MergedRun.from_dict
