"""The run's facts (``Profile.meta``), typed: what ran, on what, how it was measured.

One field per fact, its unit in its name; a fact not known is None (never 0), and a
document leaves it out. :meth:`RunFacts.to_dict` and :meth:`RunFacts.from_dict` are the
one conversion to and from the ``meta`` object of a ``layerscope/1`` document; a key
this version does not know (written by a newer one, or by hand) is kept in ``extra``
and written back. Capture writes the facts by field (a misspelt one raises at once);
renderers read fields. ``facts["steps"]`` and ``facts.get("steps")`` still read, as a
read-only mapping (None for a fact not known; iterating gives the known ones). Pure: no
torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any


@dataclass
class RunFacts(Mapping[str, Any]):
    """What a profile's run was. Nested facts of a trace file (``source``,
    ``modules_from``, ``device_events``) and of a merged run (``from_merged_run``) are
    plain objects, as their documents have them."""

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
    #: ``profile`` (profile()), ``count`` (count_flops), ``context`` (a Profiler block),
    #: ``trace`` (a torch.profiler trace file).
    mode: str | None = None
    warmup: int | None = None
    repeat: int | None = None
    no_grad: bool | None = None
    backward: bool | None = None
    #: The module paths profiled (None: the whole model).
    paths: list[str] | None = None
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
    #: Where op rows came from, as older files said it (``dispatch mode``, ``trace``):
    #: read, no longer written (``times_from`` says it).
    ops_from: str | None = None
    #: Where times and op rows (one run's) came from when not from torch's profiler:
    #: ``dispatch mode``, ``trace``.
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
    # -- the run's figures -----------------------------------------------------------
    steps: int | None = None
    step_numbers: list[int] | None = None
    step_times_ns: list[int] | None = None
    #: Each timing pass's time in the model (profile()'s repeats; a block's steps summed).
    pass_cpu_time_ns: list[int] | None = None
    #: profile()'s pass whose figures the profile shows, all of them (the median one;
    #: counted from 0 over the measured passes); None where nodes hold per-node medians.
    shown_pass: int | None = None
    #: Ops run while no profiled module was active (not in the tree).
    unattributed_ops: int | None = None
    #: The step's wall time, which the model's phases and the parts add up to.
    step_time_ns: int | None = None
    # -- where it came from ------------------------------------------------------------
    #: The model spec the CLI resolved (``zoo:resnet18``).
    spec: str | None = None
    #: A trace file: ``{"kind", "file", "device_names", "schema_version",
    #: "record_shapes", "profile_memory", "with_stack"}``.
    source: dict[str, Any] | None = None
    #: A trace file: how its modules were found.
    modules_from: dict[str, Any] | None = None
    #: Why FLOPs are unknown (a trace without shapes).
    flops_unknown: str | None = None
    #: A trace file's device events: ``{"events", "time_ns", "outside_steps",
    #: "outside_steps_time_ns", "orphans", "orphans_time_ns"}``.
    device_events: dict[str, int] | None = None
    #: A rank's profile read back from a merged run: ``{"rank", "not_kept"}``.
    from_merged_run: dict[str, Any] | None = None
    #: Keys this version does not know, kept as read.
    extra: dict[str, Any] = field(default_factory=dict)

    def copy(self) -> RunFacts:
        """Another object with the same facts (a profile's own, to add its figures to)."""
        return replace(self, extra=dict(self.extra))

    # -- the document ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The ``meta`` object of a document: the known facts, then ``extra``."""
        return dict(self.items())

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> RunFacts:
        """From a document's ``meta`` (checked by :mod:`layerscope.schema` first)."""
        known, extra = {}, {}
        for key, value in doc.items():
            if key in _FIELDS:
                known[key] = value
            else:
                extra[key] = value
        return cls(**known, extra=extra)

    # -- read as a mapping -------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        """A fact by name: None for one this version knows but the run did not (as a
        document once held it, null); KeyError for a name it does not know."""
        if key in _FIELDS:
            return getattr(self, key)
        if key in self.extra:
            return self.extra[key]
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        """Whether the fact is known (iterating gives these)."""
        if isinstance(key, str) and key in _FIELDS:
            return getattr(self, key) is not None
        return key in self.extra

    def __iter__(self) -> Iterator[str]:
        for name in _ORDER:
            if getattr(self, name) is not None:
                yield name
        yield from self.extra

    def __len__(self) -> int:
        return sum(1 for _ in self)



#: The facts' names, in document order (``extra`` is not one).
_ORDER: tuple[str, ...] = tuple(f.name for f in fields(RunFacts) if f.name != "extra")
_FIELDS = frozenset(_ORDER)
