"""The run's facts (``Profile.meta``), typed: what ran, on what, how it was measured;
and the figures attribution computed of the run as a whole (``Profile.figures``).

One field per fact, its unit in its name; a fact not known is None (never 0), and a
document leaves it out. :meth:`RunFacts.to_dict` and :meth:`RunFacts.from_dict` are the
one conversion to and from the facts of the ``meta`` object of a ``layerscope/1``
document; a key this version does not know (written by a newer one, or by hand) is kept
in ``extra`` and written back. Capture writes the facts by field (a misspelt one raises
at once); renderers read fields. ``prof.meta["steps"]`` and ``prof.meta.get("steps")``
still read, deprecated: the warning names the attribute.

:class:`RunFigures` (steps summed, each step's wall time, the passes' times, the step's
time, ops outside the tree) are written by attribution, never by capture. A document
keeps them in its ``meta`` object, where earlier versions wrote them (:func:`meta_to_dict`),
so files are read and written as before. Pure: no torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any


@dataclass
class RunFacts:
    """What a profile's run was. Nested facts of a trace file (``source``,
    ``modules_from``, ``device_events``) and of a merged run (``from_merged_run``) are
    small frozen records of their own, each with its conversion to and from the object
    a document has always held."""

    # -- what ran, on what ---------------------------------------------------------
    #: The model's class name.
    model: str | None = None
    layerscope_version: str | None = None
    #: None for a trace file (it does not say).
    torch_version: str | None = None
    python_version: str | None = None
    #: ``cpu``, ``cuda:0``, ``meta``.
    device: str | None = None
    #: The parameters' dtype (None: no parameters).
    dtype: str | None = None
    #: The model's ``training`` flag when it ran.
    training: bool | None = None
    #: What this torch lacks that layerscope tolerates: name -> what is lost.
    torch_api_missing: dict[str, str] | None = None
    #: The parameters that train (``requires_grad``), each shared one once: the rest of
    #: the root's ``params_total`` is frozen (a LoRA's base weights). None: not known (a
    #: trace file's run).
    trainable_params: int | None = None
    #: ``profile`` (profile()), ``count`` (count_flops), ``context`` (a Profiler block),
    #: ``trace`` (a torch.profiler trace file).
    mode: str | None = None
    warmup: int | None = None
    repeat: int | None = None
    no_grad: bool | None = None
    backward: bool | None = None
    #: The module paths profiled (None: the whole model).
    paths: list[str] | None = None
    #: Modules no hook can see: called from TorchScript (``torch.jit.script`` /
    #: ``trace``), their figures unknown, their work their scripted caller's (None: none).
    unseen: list[str] | None = None
    #: Input shapes, positional then keyword: ``[[shape, ...], {name: shape}]``.
    inputs: list[Any] | None = None
    #: Input dtype names, as ``inputs``.
    input_dtypes: list[Any] | None = None
    #: The dtype autocast ran ops in, when it was on.
    autocast: str | None = None
    #: The device's peak FLOP/s (for MFU), when known.
    peak_flops_per_s: float | None = None
    #: Where ``peak_flops_per_s`` came from, or why it is not known, when that needs
    #: saying (a trace file's GPU and dtype; a peak given to ``layerscope show``).
    peak_from: str | None = None
    #: Where op rows and times came from when not from torch's profiler (``dispatch
    #: mode``, ``trace``).
    ops_from: str | None = None
    times_from: str | None = None
    #: False for an untimed count (count_flops): its times are all zero.
    timed: bool | None = None
    # -- a Profiler block ------------------------------------------------------------
    #: The first and last step of the cycle: ``[first, last]``.
    step_range: list[int] | None = None
    #: False when the block ended before its schedule's cycle did.
    complete: bool | None = None
    schedule: str | None = None
    #: The step a detailed trace was taken from (older files).
    detail_step: int | None = None
    # -- distributed runs ------------------------------------------------------------
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    host: str | None = None
    run_id: str | None = None
    #: The process group's backend (a trace file's ``distributedInfo``).
    backend: str | None = None
    # -- where it came from ------------------------------------------------------------
    #: The model spec the CLI resolved (``zoo:resnet18``).
    spec: str | None = None
    #: A trace file: which, on what, recorded with what.
    source: TraceSource | None = None
    #: A trace file: how its modules were found.
    modules_from: ModulesFrom | None = None
    #: Why FLOPs are unknown (a trace without shapes).
    flops_unknown: str | None = None
    #: A trace file's device events, and those in no node.
    device_events: DeviceEvents | None = None
    #: A rank's profile read back from a merged run: which, and what the merge dropped.
    from_merged_run: FromMergedRun | None = None
    #: Keys this version does not know, kept as read.
    extra: dict[str, Any] = field(default_factory=dict)
    #: The figures of the profile these facts are the meta of (set by ``Profile``), for
    #: the deprecated ``prof.meta["steps"]`` only; not a fact, not saved.
    _figures: RunFigures | None = field(default=None, init=False, repr=False, compare=False)

    def copy(self) -> RunFacts:
        """Another object with the same facts."""
        return replace(self, extra=dict(self.extra))

    # -- the document ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The facts of a ``meta`` object: the known facts, then ``extra``."""
        out: dict[str, Any] = {}
        for name in _ORDER:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.to_dict() if name in _RECORDS else value
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> RunFacts:
        """From a document's ``meta`` (checked by :mod:`layerscope.schema` first); the
        figures it holds are :class:`RunFigures`', not kept here."""
        known, extra = {}, {}
        for key, value in doc.items():
            if key in _RECORDS:
                known[key] = None if value is None else _RECORDS[key](value)
            elif key in _FIELDS:
                known[key] = value
            elif key not in FIGURE_NAMES:
                extra[key] = value
        return cls(**known, extra=extra)

    # -- the reads of a mapping it once was, deprecated ---------------------------------
    def __getitem__(self, key: str) -> Any:
        """``prof.meta["steps"]``, deprecated (it was a mapping): the fact or figure as
        a document holds it (a nested record as its object; None for one not known);
        KeyError for a name that is neither. The warning names the attribute to read."""
        value = self._deprecated_read(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        """``prof.meta.get("steps")``, deprecated, as :meth:`__getitem__` with a default."""
        return self._deprecated_read(key, default)

    def _deprecated_read(self, key: str, default: Any) -> Any:
        if key in _FIELDS:
            value, instead = getattr(self, key), f"prof.meta.{key}"
            if key in _RECORDS and value is not None:
                value = value.to_dict()
        elif key in FIGURE_NAMES:
            figures = self._figures if self._figures is not None else RunFigures()
            value, instead = getattr(figures, key), f"prof.figures.{key}"
        elif key in self.extra:
            value, instead = self.extra[key], f"prof.meta.extra[{key!r}]"
        else:
            warnings.warn(
                f"reading prof.meta as a mapping is deprecated, and {key!r} is neither a fact of the run "
                "(prof.meta) nor a figure of the profile (prof.figures)", DeprecationWarning, stacklevel=3,
            )
            return default
        warnings.warn(f"reading prof.meta as a mapping is deprecated: read {instead}", DeprecationWarning, stacklevel=3)
        return value

    #: Not a mapping: ``"steps" in prof.meta``, ``dict(prof.meta)`` and loops are errors
    #: (a TypeError), never a search through ``__getitem__``.
    __iter__ = None


#: What no fact holds (a name neither a fact nor a figure).
_MISSING = object()


@dataclass(frozen=True)
class TraceSource:
    """Where a profile read from a torch.profiler trace came from (``meta.source``)."""

    #: What kind of file (``torch.profiler trace``).
    kind: str
    #: The file's name.
    file: str
    #: The accelerators the trace's ``deviceProperties`` name, sorted.
    device_names: tuple[str, ...]
    #: What the trace was recorded with (as its file says, else as its events show).
    record_shapes: bool
    profile_memory: bool
    with_stack: bool
    #: The trace's ``schemaVersion`` (None: it has none; written after ``device_names``).
    schema_version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "file": self.file, "device_names": list(self.device_names),
            "schema_version": self.schema_version, "record_shapes": self.record_shapes,
            "profile_memory": self.profile_memory, "with_stack": self.with_stack,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TraceSource:
        return cls(
            kind=doc["kind"], file=doc["file"], device_names=tuple(doc["device_names"]),
            schema_version=doc.get("schema_version"), record_shapes=doc["record_shapes"],
            profile_memory=doc["profile_memory"], with_stack=doc["with_stack"],
        )


@dataclass(frozen=True)
class OpPlacement:
    """How a trace without module events had its ops placed in the module calls of the
    model's call template (``convert/align.py``): counts of the steps' outermost forward
    ops."""

    #: Ops in one call of the template (one pass), and the passes the steps held.
    template_ops: int
    passes: int
    #: The steps' outermost forward ops, and how each was placed: matched to a template
    #: op (aligned), given the call its aligned neighbours share (by neighbours), or left
    #: in no module (unplaced: outside the model's calls, or in a pass not aligned).
    ops: int
    aligned: int
    by_neighbours: int
    unplaced: int
    #: The passes not aligned with confidence, each named with the share of the
    #: template's ops it matched ("step 3, pass 2: 41% of the template matched").
    unaligned: tuple[str, ...] = ()
    #: The data-dependent reads the template's meta run answered with a guess.
    guesses: tuple[str, ...] = ()
    #: Ops of forwards recomputed in backward (activation checkpointing) placed in the
    #: calls they recompute.
    recomputed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "template_ops": self.template_ops, "passes": self.passes, "ops": self.ops, "aligned": self.aligned,
            "by_neighbours": self.by_neighbours, "unplaced": self.unplaced, "unaligned": list(self.unaligned),
            "guesses": list(self.guesses), "recomputed": self.recomputed,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> OpPlacement:
        return cls(
            template_ops=doc["template_ops"], passes=doc["passes"], ops=doc["ops"], aligned=doc["aligned"],
            by_neighbours=doc["by_neighbours"], unplaced=doc["unplaced"], unaligned=tuple(doc.get("unaligned") or ()),
            guesses=tuple(doc.get("guesses") or ()), recomputed=doc.get("recomputed", 0),
        )


@dataclass(frozen=True)
class ModulesFrom:
    """How a trace's module instances were found and matched to a model's modules
    (``meta.modules_from``)."""

    #: How they were matched, in words.
    method: str
    #: The trace's module instances, and how many of them were matched.
    instances: int
    matched: int
    #: Instances matched to no module (their work stays with their caller), sorted.
    unmatched: tuple[str, ...] = ()
    #: Matched instances whose name in the trace is not their path in the model:
    #: the trace's name -> the model's path (None: none renamed).
    renamed: dict[str, str] | None = None
    #: How the model's parameter shapes were checked against the ops' inputs (a model given).
    shapes: str | None = None
    #: Modules of the model with parameters that ran in no instance (None: none).
    uncalled: tuple[str, ...] | None = None
    #: For a trace without module events: how its ops were placed in the model's calls.
    placement: OpPlacement | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": self.method, "instances": self.instances, "matched": self.matched, "unmatched": list(self.unmatched),
        }
        if self.renamed is not None:
            out["renamed"] = dict(self.renamed)
        if self.shapes is not None:
            out["shapes"] = self.shapes
        if self.uncalled is not None:
            out["uncalled"] = list(self.uncalled)
        if self.placement is not None:
            out["placement"] = self.placement.to_dict()
        return out

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ModulesFrom:
        renamed, uncalled, placement = doc.get("renamed"), doc.get("uncalled"), doc.get("placement")
        return cls(
            method=doc["method"], instances=doc["instances"], matched=doc["matched"],
            unmatched=tuple(doc.get("unmatched") or ()), renamed=None if renamed is None else dict(renamed),
            shapes=doc.get("shapes"), uncalled=None if uncalled is None else tuple(uncalled),
            placement=None if placement is None else OpPlacement.from_dict(placement),
        )


@dataclass(frozen=True)
class DeviceEvents:
    """A trace's device work (``meta.device_events``): every kernel, memcpy and memset,
    those launched outside every step and those launched before the trace began (in no
    node, either of them), each as a count and the time the device was busy with them."""

    events: int
    time_ns: int
    outside_steps: int
    outside_steps_time_ns: int
    orphans: int
    orphans_time_ns: int
    #: Device work of categories layerscope does not read, counted by category, and the
    #: time the device was busy with it (in no node; None: there was none).
    unread: dict[str, int] | None = None
    unread_time_ns: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "events": self.events, "time_ns": self.time_ns, "outside_steps": self.outside_steps,
            "outside_steps_time_ns": self.outside_steps_time_ns, "orphans": self.orphans,
            "orphans_time_ns": self.orphans_time_ns,
        }
        if self.unread is not None:
            out["unread"] = dict(self.unread)
            out["unread_time_ns"] = self.unread_time_ns
        return out

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> DeviceEvents:
        unread = doc.get("unread")
        return cls(
            events=doc["events"], time_ns=doc["time_ns"], outside_steps=doc["outside_steps"],
            outside_steps_time_ns=doc["outside_steps_time_ns"], orphans=doc["orphans"],
            orphans_time_ns=doc["orphans_time_ns"], unread=None if unread is None else dict(unread),
            unread_time_ns=doc.get("unread_time_ns"),
        )


@dataclass(frozen=True)
class FromMergedRun:
    """A rank's profile rebuilt from a merged run (``meta.from_merged_run``): the rank,
    and what the merge did not keep (said where its tree is shown, never read as 0)."""

    rank: int
    not_kept: str

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "not_kept": self.not_kept}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> FromMergedRun:
        return cls(rank=doc["rank"], not_kept=doc["not_kept"])


@dataclass
class RunFigures:
    """What attribution measured of the run as a whole (``Profile.figures``): figures of
    the passes or steps, not facts of what ran. None where the run has no such figure."""

    #: The steps a ``Profiler`` block summed (None for ``profile()`` and ``count_flops``).
    steps: int | None = None
    #: Each recorded step's number and wall time (``profile()``: its timed passes, from 1).
    step_numbers: list[int] | None = None
    step_times_ns: list[int] | None = None
    #: Each timing pass's time in the model (profile()'s repeats; a block's steps summed).
    pass_cpu_time_ns: list[int] | None = None
    #: profile()'s pass whose figures the profile shows, all of them (the median one;
    #: counted from 0 over the measured passes); None where nodes hold per-node medians.
    shown_pass: int | None = None
    #: Ops run while no profiled module was active (not in the tree).
    unattributed_ops: int | None = None
    #: The step's wall time, which the model's phases and the parts add up to; None for
    #: a forward-only or untimed profile.
    step_time_ns: int | None = None
    #: A block that detailed some steps and timed the others lightly (``detail="first"``):
    #: the steps its FLOPs, MACs, shapes, memory, calls and op rows are from. Its times
    #: are then each node's mean over the light steps (``step_numbers``), and ``steps``
    #: counts those. None where every figure is from the same steps.
    detailed_steps: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The figures known, for the ``meta`` object (:func:`meta_to_dict`)."""
        return {name: value for name in FIGURE_NAMES if (value := getattr(self, name)) is not None}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> RunFigures:
        """From a document's ``meta`` object (checked by :mod:`layerscope.schema` first):
        the figures among its facts."""
        return cls(**{name: doc[name] for name in FIGURE_NAMES if name in doc})


def meta_to_dict(facts: RunFacts, figures: RunFigures) -> dict[str, Any]:
    """A profile's ``meta`` object: its facts, with its figures where earlier versions
    wrote them among the facts (after ``backend``), so a document is unchanged."""
    doc = facts.to_dict()
    head = {key: value for key, value in doc.items() if key in _BEFORE_FIGURES}
    return {**head, **figures.to_dict(), **{key: value for key, value in doc.items() if key not in _BEFORE_FIGURES}}


#: The facts' names, in document order (``extra`` is not one).
_ORDER: tuple[str, ...] = tuple(f.name for f in fields(RunFacts) if f.name != "extra" and not f.name.startswith("_"))
_FIELDS = frozenset(_ORDER)
#: The facts that are records of their own, and how each is read from its object.
_RECORDS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "source": TraceSource.from_dict, "modules_from": ModulesFrom.from_dict, "device_events": DeviceEvents.from_dict,
    "from_merged_run": FromMergedRun.from_dict,
}
#: The figures' names, in document order.
FIGURE_NAMES: tuple[str, ...] = tuple(f.name for f in fields(RunFigures))
#: The facts a ``meta`` object holds before the figures.
_BEFORE_FIGURES = frozenset(_ORDER[: _ORDER.index("backend") + 1])
