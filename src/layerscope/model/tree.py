"""The one data model every output is derived from.

A :class:`Profile` holds a tree of :class:`ModuleNode` (one per unique module, keyed by
its ``named_modules()`` path) and each node holds its :class:`OpStats`. Nothing here
imports torch: trees can be built by hand in tests and fed to any renderer.

Numbers carry their unit in their name and stay numbers; only ``layerscope.base.fmt`` turns
them into strings.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from layerscope.base import formats
from layerscope.base.stats import observed_median, percentile_floor, spread
from layerscope.model import phases
from layerscope.model.compile_info import CompileInfo
from layerscope.model.runfacts import RunFacts, RunFigures, meta_to_dict
from layerscope.model.sidedocs import DeviceLedger, MemorySummary, Trace

if TYPE_CHECKING:
    from layerscope.model.ops import OpTable

#: The schema of a saved profile (``Profile.to_dict``).
SCHEMA = "layerscope/1"

#: Metrics of a phase that add up through the tree: ``X == self_X + sum(child X)``.
#: Each entry is ``(total_field, self_field)``.
ADDITIVE_PHASE_METRICS: tuple[tuple[str, str], ...] = (
    ("cpu_time_ns", "self_cpu_time_ns"),
    ("device_time_ns", "self_device_time_ns"),
    ("flops", "self_flops"),
    ("macs", "self_macs"),
    ("bytes", "self_bytes"),
    ("alloc_bytes", "self_alloc_bytes"),
    ("freed_bytes", "self_freed_bytes"),
    ("activation_bytes", "self_activation_bytes"),
    ("grad_bytes", "self_grad_bytes"),
    ("comm_time_ns", "self_comm_time_ns"),
    ("comm_bytes", "self_comm_bytes"),
)

#: The phases a node's work is split into (``model/phases.py``).
PHASES = phases.PHASES

#: Node kinds: modules of the model, user labels (``record_function``/``layerscope.label``)
#: and the parts of a training step outside the model.
NODE_KINDS: tuple[str, ...] = (
    "module", "label", "loss", "optimizer", "zero_grad", "communication", "overhead", "other",
)


@dataclass
class PhaseStats:
    """What one module did in one phase (``forward`` or ``backward``).

    ``device_*`` fields are ``None`` when the model did not run on an accelerator;
    ``flops``/``macs``/``bytes`` are ``None`` when no op pass was recorded. Ops with no
    FLOP formula add nothing to ``flops`` and are listed in ``unsupported_ops``.

    Memory fields (``None`` when memory was not tracked) count logical storage bytes:
    ``alloc_bytes``/``freed_bytes`` were allocated/freed while the node ran;
    ``peak_bytes`` is the highest live memory reached while it ran, above the live
    memory when it started (not additive); ``activation_bytes`` is what its forward
    allocated and left alive for backward (saved tensors); ``grad_bytes`` is the
    gradients written for its parameters in backward.

    Communication (``None`` when no collective ran): ``comm_time_ns`` is host time in
    collective ops (``c10d::allreduce_``, ...) plus, for the ``<communication>`` part,
    time spent waiting for collectives in flight; ``comm_bytes`` is the payload the
    collectives moved (the buffer size, as bus-bandwidth figures count it).
    """

    cpu_time_ns: int = 0
    self_cpu_time_ns: int = 0
    device_time_ns: int | None = None
    self_device_time_ns: int | None = None
    flops: int | None = None
    self_flops: int | None = None
    macs: int | None = None
    self_macs: int | None = None
    bytes: int | None = None
    self_bytes: int | None = None
    alloc_bytes: int | None = None
    self_alloc_bytes: int | None = None
    freed_bytes: int | None = None
    self_freed_bytes: int | None = None
    peak_bytes: int | None = None
    activation_bytes: int | None = None
    self_activation_bytes: int | None = None
    grad_bytes: int | None = None
    self_grad_bytes: int | None = None
    comm_time_ns: int | None = None
    self_comm_time_ns: int | None = None
    comm_bytes: int | None = None
    self_comm_bytes: int | None = None

    @property
    def busy_time_ns(self) -> int | None:
        """The time rates divide by: device time on an accelerator, else CPU time."""
        return self.device_time_ns if self.device_time_ns is not None else self.cpu_time_ns

    def to_dict(self) -> dict[str, Any]:
        # Communication fields are written only where a collective ran, so a profile of
        # one process reads as before.
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if not (f.name in _COMM_FIELDS and getattr(self, f.name) is None)
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PhaseStats:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


_COMM_FIELDS = frozenset({"comm_time_ns", "self_comm_time_ns", "comm_bytes", "self_comm_bytes"})


@dataclass
class OpStats:
    """One aten operator, aggregated per (module, phase, name, input shapes[, stack]).

    ``cpu_time_ns``/``self_cpu_time_ns`` are None when the op's time is not known: a
    compiled model's op rows come from an eager pass whose ops never ran compiled."""

    name: str
    phase: str = "forward"
    calls: int = 0
    cpu_time_ns: int | None = 0
    self_cpu_time_ns: int | None = 0
    device_time_ns: int | None = None
    self_device_time_ns: int | None = None
    #: One shape per tensor input; None where shapes were not recorded (a trace read
    #: without them).
    input_shapes: list[Any] | None = field(default_factory=list)
    flops: int | None = None
    macs: int | None = None
    bytes: int | None = None
    #: Storage bytes the op allocated (its new outputs); ops do not nest, so self == total.
    alloc_bytes: int | None = None
    self_alloc_bytes: int | None = None
    #: Storage bytes freed while the op ran.
    freed_bytes: int | None = None
    #: The user's Python frames that called it, innermost first (with ``with_stack``).
    stack: list[str] | None = None

    @property
    def busy_time_ns(self) -> int | None:
        """The time rates divide by: device time on an accelerator, else CPU time."""
        return self.device_time_ns if self.device_time_ns is not None else self.cpu_time_ns

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpStats:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class ModuleNode:
    """One ``nn.Module``, at its first ``named_modules()`` path (``""`` is the root), or
    a node of another ``kind``: a user label (path ``"encoder[name]"``, under the module
    it ran in, holding the modules it enclosed, or ``"<name>"`` at the top level) or a
    part of the training step outside
    the model (``"<loss>"``, ``"<optimizer:Adam>"``, ``"<zero_grad>"``, ``"<other>"``).

    ``params`` counts the parameters this module owns directly, each unique parameter
    counted once in the whole tree (a tied weight belongs to the first module, in
    ``named_modules()`` order, that owns it). ``params_total`` adds the descendants.
    Both are None when the counts are not known (a profile built from a trace recorded
    without the model): unknown, never 0, and then on every node of the profile, since
    a tree knows every count or none (``check_tree``). Labels and step parts own no
    parameters: 0 where the counts are known.
    ``profiled`` is False for ancestors kept only to hold the subtrees chosen with
    ``paths=``; their own figures are zero.
    """

    path: str
    type: str
    parent: str | None = None
    depth: int = 0
    calls: int = 0
    params: int | None = 0
    params_total: int | None = 0
    profiled: bool = True
    forward: PhaseStats = field(default_factory=PhaseStats)
    backward: PhaseStats | None = None
    recompute: PhaseStats | None = None
    kind: str = "module"
    ops: list[OpStats] = field(default_factory=list)
    unsupported_ops: dict[str, int] = field(default_factory=dict)
    extra_repr: str = ""
    input_shapes: Any = None
    output_shapes: Any = None
    children: list[ModuleNode] = field(default_factory=list, repr=False)

    @property
    def name(self) -> str:
        """The last component of the path (the root's is its type; a label's inside a
        module, its label). A step part is named by its whole path (``<loss>``,
        ``<optimizer:AdamW>``), the one spelling the tree, the footer, the memory peak
        and the exports share."""
        if self.kind != "module":
            if self.path.endswith("]"):
                return self.path[_label_start(self.path) : -1]
            return self.path
        return self.path.rsplit(".", 1)[-1] if self.path else self.type

    def phases(self) -> Iterator[tuple[str, PhaseStats]]:
        """``(phase name, stats)`` for each phase this node has figures for."""
        for phase in PHASES:
            stats = getattr(self, phase)
            if stats is not None:
                yield phase, stats

    @property
    def flops_partial(self) -> bool:
        """Whether this node's FLOPs and MACs leave out ops it or a descendant ran that
        have no formula, or whose shapes were not recorded (``unsupported_ops``): its
        counts are then a lower bound, shown ``N + ?`` (``?`` where nothing was counted),
        never as if complete."""
        return any(node.unsupported_ops for node in self.walk())

    def walk(self) -> Iterator[ModuleNode]:
        """This node and its descendants, depth first, children in registration order."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "type": self.type,
            "parent": self.parent,
            "depth": self.depth,
            "calls": self.calls,
            "params": self.params,
            "params_total": self.params_total,
            "profiled": self.profiled,
            "forward": self.forward.to_dict(),
            "backward": None if self.backward is None else self.backward.to_dict(),
            "recompute": None if self.recompute is None else self.recompute.to_dict(),
            "kind": self.kind,
            "input_shapes": self.input_shapes,
            "output_shapes": self.output_shapes,
            "ops": [op.to_dict() for op in self.ops],
            "unsupported_ops": dict(self.unsupported_ops),
            "extra_repr": self.extra_repr,
        }

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> ModuleNode:
        """The node of its :meth:`to_dict` entry, without children (:func:`link` and
        :meth:`Profile.from_dict` fill them)."""

        def phase(name: str) -> PhaseStats | None:
            data = entry.get(name)
            return None if data is None else PhaseStats.from_dict(data)

        return cls(
            path=entry["path"],
            type=entry["type"],
            parent=entry["parent"],
            depth=entry["depth"],
            calls=entry["calls"],
            params=entry["params"],
            params_total=entry["params_total"],
            profiled=entry.get("profiled", True),
            forward=PhaseStats.from_dict(entry["forward"]),
            backward=phase("backward"),
            recompute=phase("recompute"),
            kind=str(entry.get("kind") or "module"),
            ops=[OpStats.from_dict(op) for op in entry.get("ops", [])],
            unsupported_ops=dict(entry.get("unsupported_ops") or {}),
            extra_repr=str(entry.get("extra_repr") or ""),
            input_shapes=entry.get("input_shapes"),
            output_shapes=entry.get("output_shapes"),
        )


#: A step is far from the median when it takes this many times as long, or as short.
STEP_FAR = 1.5


@dataclass
class StepSpread:
    """The recorded steps' wall times: ``steps`` as ``(step number, ns)`` in order, and
    ``outliers``, the steps ``far`` times the median or more away from it (longer or
    shorter), farthest first: a step that did one-off work (an optimizer creating its
    state) stands out here instead of vanishing in a sum. ``median_ns`` is an observed
    step's (:func:`~layerscope.base.stats.observed_median`: ``profile()``'s median pass, the
    one shown); ``p10_ns`` and ``p90_ns`` are :func:`~layerscope.base.stats.percentile`'s."""

    steps: list[tuple[int, int]]
    min_ns: int
    median_ns: int
    max_ns: int
    p10_ns: int
    p90_ns: int
    outliers: list[tuple[int, int]]
    far: float


@dataclass
class Profile(formats.NotebookDisplay):
    """A profiled model: ``meta`` (what was run, how), the module tree, and what
    attribution measured of the run as a whole (``figures``)."""

    root: ModuleNode
    meta: RunFacts = field(default_factory=RunFacts)
    #: The steps summed, each step's or pass's time, the step's time, ops outside the
    #: tree: computed with the tree, saved in the document's ``meta`` beside the facts.
    figures: RunFigures = field(default_factory=RunFigures)
    #: Bytes of the model's parameters; None when not known (its params are unknown).
    param_bytes: int | None = 0
    #: Top-level parts of a training step outside the model (loss, optimizer, labels,
    #: other), each the root of its own small tree; empty for a forward-only profile.
    parts: list[ModuleNode] = field(default_factory=list)
    #: Model-level memory (None when not tracked): parameter, buffer and optimizer-state
    #: bytes, the step's peak with its culprit and categories, and a timeline.
    memory: MemorySummary | None = None
    #: One run as spans on a timeline (None when no op pass ran): a
    #: :class:`~layerscope.model.sidedocs.Trace`, its spans sorted by start, enclosing spans
    #: first; ``profile()`` keeps its op pass, a ``Profiler`` its last step.
    trace: Trace | None = None
    #: A ``torch.compile``d model's run (kernels, graph breaks, compile time), None for
    #: an eager one: its times come from kernels, its op rows from an eager pass (their
    #: times None). Saved as the document's ``meta["compile"]``.
    compiled: CompileInfo | None = None
    #: Where every device nanosecond of the steps went (None without device work, or for
    #: ``profile()``'s per-node medians, which are no one step's): the busy time is the
    #: nodes' self device time plus what no node holds, by reason. Saved as ``device``.
    device: DeviceLedger | None = None
    _index: dict[str, ModuleNode] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        given: object = self.meta
        if type(given) is dict:  # facts given as a document's meta object (figures too)
            self.meta = RunFacts.from_dict(given)
            if self.figures == RunFigures():
                self.figures = RunFigures.from_dict(given)
        self.meta._figures = self.figures  # for the deprecated prof.meta["steps"]
        self._index = {node.path: node for node in self.nodes()}

    # -- reading -------------------------------------------------------------------
    @property
    def timed(self) -> bool:
        """False for an untimed count (``count_flops``): its time fields are all zero."""
        return self.meta.timed is not False

    def nodes(self) -> Iterator[ModuleNode]:
        """Every node, depth first: the model's tree in ``named_modules()`` order, then
        the step's parts."""
        yield from self.root.walk()
        for part in self.parts:
            yield from part.walk()

    def modules(self) -> Iterator[ModuleNode]:
        """The model's own nodes only (modules and the labels inside them)."""
        return self.root.walk()

    @property
    def has_backward(self) -> bool:
        return self.root.backward is not None

    @property
    def step_time_ns(self) -> int | None:
        """The step's wall time, which the model's phases and the parts add up to
        exactly; None for a forward-only profile."""
        return self.figures.step_time_ns

    def pass_spread(self) -> float | None:
        """How much the run's repeated measurements of the same work spread, relative:
        ``(p90 - p10) / median`` (:func:`layerscope.base.stats.spread`) of its passes' times
        (``profile()``'s repeats) or else of its steps' wall times (a ``Profiler``
        block); None with fewer than two (one pass measures no noise). A diff calls a
        change within it noise."""
        for values in (self.figures.pass_cpu_time_ns or [], self.figures.step_times_ns or []):
            if len(values) >= 2:
                return spread(values)
        return None

    def step_spread(self, far: float = STEP_FAR) -> StepSpread | None:
        """How the recorded steps' wall times vary: None with fewer than two steps."""
        times = list(self.figures.step_times_ns or [])
        if len(times) < 2:
            return None
        numbers = list(self.figures.step_numbers or [])
        if len(numbers) != len(times):
            numbers = list(range(len(times)))
        ordered = sorted(times)
        # The median step is an observed one: profile()'s median pass, the one shown.
        median = observed_median(ordered)
        outliers = [
            (n, t) for n, t in zip(numbers, times) if median and (t > median * far or t * far < median)
        ]
        outliers.sort(key=lambda item: -abs(item[1] - median))
        return StepSpread(
            steps=list(zip(numbers, times)), min_ns=ordered[0], median_ns=median, max_ns=ordered[-1],
            p10_ns=percentile_floor(ordered, 10), p90_ns=percentile_floor(ordered, 90),
            outliers=outliers, far=far,
        )

    def node(self, path: str) -> ModuleNode:
        """The node at ``path`` (``""`` is the root); KeyError names close matches."""
        try:
            return self._index[path]
        except KeyError:
            import difflib

            close = difflib.get_close_matches(path, list(self._index), n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise KeyError(f"no module at path {path!r} in this profile{hint}") from None

    def __getitem__(self, path: str) -> ModuleNode:
        return self.node(path)

    def __contains__(self, path: object) -> bool:
        return path in self._index

    def unsupported_ops(self) -> dict[str, int]:
        """Calls of ops with no FLOP formula, over the whole model, by op name."""
        merged: dict[str, int] = {}
        for node in self.nodes():
            for name, calls in node.unsupported_ops.items():
                merged[name] = merged.get(name, 0) + calls
        return dict(sorted(merged.items()))

    def ops(
        self,
        *,
        sort_by: str | None = None,
        group_by: str | Sequence[str] | None = "name",
        limit: int | None = None,
        module: str | None = None,
        phase: str | None = None,
        stack_depth: int | None = None,
    ) -> OpTable:
        """Every node's aten ops in one table, grouped by ``group_by`` (name, shape,
        module, module_type, phase, stack:N) and sorted by ``sort_by``, descending; see
        ``layerscope.model.ops.op_table``."""
        from layerscope.model.ops import op_table

        return op_table(
            self, sort_by=sort_by, group_by=group_by, limit=limit, module=module, phase=phase,
            stack_depth=stack_depth,
        )

    @property
    def totals(self) -> dict[str, Any]:
        """The whole model's figures; ``params`` and ``param_bytes`` are None when the
        parameter counts are not known."""
        return {
            "params": self.root.params_total,
            "param_bytes": self.param_bytes,
            "unsupported_ops": self.unsupported_ops(),
            "forward": self.root.forward.to_dict(),
            "backward": None if self.root.backward is None else self.root.backward.to_dict(),
            "recompute": None if self.root.recompute is None else self.root.recompute.to_dict(),
            "parts": {part.path: part_total(part) for part in self.parts},
            "step_time_ns": self.step_time_ns,
        }

    # -- output --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            # The facts, the figures among them, and a compiled model's run.
            "meta": meta_to_dict(self.meta, self.figures) | ({} if self.compiled is None else {"compile": self.compiled.to_dict()}),
            "totals": self.totals,
            "modules": [node.to_dict() for node in self.modules()],
            "parts": [node.to_dict() for part in self.parts for node in part.walk()],
            "memory": None if self.memory is None else self.memory.to_dict(),
            "trace": None if self.trace is None else self.trace.to_dict(),
            **({} if self.device is None else {"device": self.device.to_dict()}),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Profile:
        """The profile of its :meth:`to_dict` document, as given: it raises KeyError,
        TypeError or ValueError on a damaged one. A file is read through
        ``layerscope.load`` (``documents.profile_from_dict``), which checks every field's
        type (``model/schema.py``) before this and the tree's invariants (``model/check.py``) after
        it, the two modules that read the tree and so sit above it."""
        root = link([ModuleNode.from_dict(entry) for entry in doc["modules"]])
        parts: list[ModuleNode] = []
        by_path: dict[str, ModuleNode] = {}
        for entry in doc.get("parts") or []:
            node = ModuleNode.from_dict(entry)
            if node.parent is None:
                parts.append(node)
            else:
                by_path[node.parent].children.append(node)
            by_path[node.path] = node
        meta = dict(doc.get("meta") or {})
        compiled = meta.pop("compile", None)
        return cls(
            root=root,
            meta=RunFacts.from_dict(meta),
            figures=RunFigures.from_dict(meta),
            param_bytes=doc["totals"]["param_bytes"],
            parts=parts,
            memory=None if doc.get("memory") is None else MemorySummary.from_dict(doc["memory"]),
            trace=None if doc.get("trace") is None else Trace.from_dict(doc["trace"]),
            compiled=None if compiled is None else CompileInfo.from_dict(compiled),
            device=None if doc.get("device") is None else DeviceLedger.from_dict(doc["device"]),
        )

    DOCUMENT = "profile"  # its table in the output registry

    def render(self, fmt: str = "text", **options: Any) -> Any:
        """The profile in format ``fmt`` (``layerscope.base.formats.formats()``) with that
        format's options: str, or bytes for a picture."""
        return formats.render(self, fmt, **options)

    def save(self, path: str | os.PathLike[str], fmt: str | None = None, **options: Any) -> None:
        """Write the profile to ``path`` atomically; the format follows the extension."""
        formats.save(self, path, fmt, **options)

    def show(self, **options: Any) -> None:
        """Print the text tree (the only place the library prints, and only on request),
        fitted to the terminal, as ``print(profile)`` is, unless ``width`` is given."""
        print(formats.display_text(self, **options))

    def __str__(self) -> str:
        return formats.display_text(self)


def _label_start(path: str) -> int:
    """Where the label of ``parent[label]`` begins: after the ``[`` matching the last
    ``]`` (a label may hold brackets itself: ``[param|cuda]``)."""
    depth = 0
    for at in range(len(path) - 1, -1, -1):
        if path[at] == "]":
            depth += 1
        elif path[at] == "[":
            depth -= 1
            if depth == 0:
                return at + 1
    return path.rindex("[") + 1


def part_total(node: ModuleNode) -> int:
    """CPU time of a node over all its phases (a step part's share of the step)."""
    return sum(stats.cpu_time_ns for _, stats in node.phases())


def params_sum(own: int | None, children: Sequence[int | None]) -> int | None:
    """A node's ``params_total``: its own count plus its children's totals; None when
    any of them is unknown (unknown, never counted as 0)."""
    if own is None or None in children:
        return None
    return own + sum(count for count in children if count is not None)


def link(nodes: list[ModuleNode]) -> ModuleNode:
    """Fill ``children`` from ``parent`` paths; ``nodes`` is in pre-order, root first."""
    by_path: dict[str, ModuleNode] = {}
    for node in nodes:
        node.children = []
        if node.path in by_path:
            raise ValueError(f"duplicate module path {node.path!r}")
        by_path[node.path] = node
        if node.parent is not None:
            try:
                by_path[node.parent].children.append(node)
            except KeyError:
                raise ValueError(
                    f"module {node.path!r} names parent {node.parent!r}, which does not "
                    "come before it"
                ) from None
    if not nodes or nodes[0].parent is not None:
        raise ValueError("the first module must be the root, with parent null")
    return nodes[0]
