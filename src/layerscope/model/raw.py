"""The raw capture: what a capture backend recorded, before any tree exists.

Plain data only (ints, strings, tuples), so a capture can be built by hand in tests, kept,
or serialised, and ``layerscope.attribute`` derives the tree from it without torch.

An event stream is a list of typed records, in the order they happened:

- :class:`Enter` / :class:`Exit`: a module call began / ended
- :class:`Op`: one aten op (forward, or backward work of an autograd node)
- :class:`LabelEnter` / :class:`LabelExit`: a ``record_function`` range (user label,
  optimizer step, ``zero_grad``) or a step part run by layerscope (the loss)
- :class:`Step`: the first and last events of a pass or training step

A :class:`Collective` notes a collective running on a process group's own thread, and a
:class:`DeviceBusy` the step's device work as a whole (its busy time, communication and
what no op launched). A :class:`ModuleShapes` gives a module's input and output shapes,
once per capture, in the stream of the step whose call they were read from.
With memory tracking, also :class:`Free`, :class:`Saved`, :class:`Grad`, :class:`Adopt`,
:class:`Optim` and :class:`DeviceMem` (memory notes: they take no time of their own).

``seq`` is autograd's sequence number when the event happened: the autograd nodes a
module's forward creates have numbers in ``[seq at Enter, seq at Exit)``, which is how
backward work is traced back to the module that caused it. ``in_backward`` is true when
the event happened while autograd's engine ran (a checkpointed module recomputing).

All ``t_ns`` of one stream come from one host clock; ``device_t_ns`` are offsets on the
device timeline (``None`` when nothing ran on an accelerator).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from layerscope.model.runfacts import RunFacts


class Enter(NamedTuple):
    """A call of module ``module`` (an index into the module table) began."""

    t_ns: int
    module: int
    device_t_ns: int | None = None
    seq: int | None = None
    in_backward: bool = False


class Exit(NamedTuple):
    """A call of module ``module`` ended (also when its forward raised)."""

    t_ns: int
    module: int
    device_t_ns: int | None = None
    seq: int | None = None
    in_backward: bool = False


class Op(NamedTuple):
    """One aten op, from ``t0_ns`` to ``t1_ns``.

    ``input_shapes`` holds one shape per tensor argument (a tuple of ints, ``torch.Size``
    as captured, or a list), nested for a list of tensors; None when not recorded.
    ``flops``/``macs`` are None for an op with no FLOP formula (unsupported) or when
    FLOPs were not counted. ``grad`` is None for an op run in forward; in backward it is
    ``(node_seq, owner)``: the sequence number of the autograd node being executed, and
    for a node that accumulates a parameter's gradient (which has no sequence number)
    the index of the module owning the parameter. ``allocs`` lists ``(serial, nbytes)``
    for each storage the op allocated (memory tracking only). ``stack`` (only with
    ``with_stack``) is the user's Python frames calling the op, innermost first, as
    ``"file:line function"`` strings. ``fwd_seq`` is the sequence number a forward op
    gave the autograd node it created (None when unknown), and ``tid`` the thread it ran
    on (None when unknown): together they link a forward op to its backward.
    """

    t0_ns: int
    t1_ns: int
    #: None for a nameless record: time or memory of a frame's that is no op row (a
    #: composite's own slot, an autograd node's, an allocation outside every op).
    name: str | None
    input_shapes: Any = None
    device_time_ns: int | None = None
    flops: int | None = None
    macs: int | None = None
    bytes: int = 0
    grad: tuple[int | None, int | None] | None = None
    allocs: Sequence[tuple[int, int]] | None = None
    stack: tuple[str, ...] | None = None
    fwd_seq: int | None = None
    tid: int | None = None


class LabelEnter(NamedTuple):
    """A labelled range began. ``kind`` is ``label`` (``record_function`` /
    ``layerscope.label``), ``optimizer``, ``zero_grad`` or ``loss``. ``grad`` is set when
    it began inside autograd's execution of a node (a hook of that node: FSDP's
    pre-backward and reduce-scatter), as :attr:`Op.grad`: the node's number, or the
    module owning the parameter of a gradient accumulation."""

    t_ns: int
    name: str
    kind: str
    device_t_ns: int | None = None
    seq: int | None = None
    in_backward: bool = False
    grad: tuple[int | None, int | None] | None = None


class LabelExit(NamedTuple):
    """The innermost open labelled range ended."""

    t_ns: int
    device_t_ns: int | None = None
    seq: int | None = None
    in_backward: bool = False


class Step(NamedTuple):
    """The first and last events of a pass or training step."""

    t_ns: int


class Free(NamedTuple):
    """A tracked storage (``serial``) was freed."""

    t_ns: int
    serial: int


class Saved(NamedTuple):
    """Autograd saved storage ``serial`` for backward (an activation)."""

    serial: int


class Grad(NamedTuple):
    """A gradient of ``nbytes`` was written for a parameter of module ``owner``;
    ``serial`` is the gradient's storage (None if untracked)."""

    t_ns: int
    owner: int
    nbytes: int
    serial: int | None


class Adopt(NamedTuple):
    """Memory that was live before it was seen (parameters, existing gradients,
    optimizer state, inputs). ``serial`` is None for memory not tracked further;
    ``since_start`` says it was live from the first event of the pass on."""

    t_ns: int
    serial: int | None
    nbytes: int
    category: str
    since_start: bool


class Optim(NamedTuple):
    """An optimizer's state after its step (``ident`` tells two optimizers of one class apart)."""

    t_ns: int
    name: str
    state_bytes_by_key: dict[str, int]
    ident: int


class DeviceMem(NamedTuple):
    """The accelerator's caching allocator at its highest point of the pass."""

    allocated_peak_bytes: int
    reserved_at_peak_bytes: int


class Collective(NamedTuple):
    """A collective in flight from ``t0_ns`` to ``t1_ns`` on a thread of the process
    group's own (``gloo:all_reduce``): it takes none of the profiled thread's time, but
    time that thread spends idle meanwhile is waiting for it."""

    t0_ns: int
    t1_ns: int
    name: str


class DeviceBusy(NamedTuple):
    """The step's device work (kernels, copies, memsets) on every stream, each instant
    counted once (``convert/device.py`` gives each instant to one kernel: compute before
    a collective's, then the earliest started; a kernel is its launch's step, whole):
    ``busy_ns`` what the step's work holds; ``compute_ns`` what its work that is not a
    collective's holds, ``comm_ns`` the time its collectives' kernels ran, ``overlap_ns``
    the part of that with compute running (``busy = compute + comm - overlap``);
    ``unlinked_ns`` the share of compute work launched from no op range."""

    busy_ns: int
    compute_ns: int
    comm_ns: int
    overlap_ns: int
    unlinked_ns: int


class ModuleShapes(NamedTuple):
    """Module ``module``'s input and output shapes, read at its first call the capture
    saw (one record per module and capture, at most): ``input_shapes`` one entry per
    positional argument, then a mapping of the keyword ones when there were any, and
    ``output_shapes`` the output's; a tensor's shape is a list of ints, a container's
    are nested as it is, anything else is None. Takes no time."""

    module: int
    input_shapes: Any
    output_shapes: Any


Event = (
    Enter | Exit | Op | LabelEnter | LabelExit | Step | Free | Saved | Grad | Adopt | Optim | DeviceMem | Collective
    | DeviceBusy | ModuleShapes
)

#: Events that note memory and take no time of their own.
MEMORY_NOTES = (Free, Saved, Grad, Adopt, Optim, DeviceMem)
#: Every event that takes no time of its own thread: it neither ends a backward slot nor
#: starts a pass.
NOTES = (*MEMORY_NOTES, Collective, DeviceBusy, ModuleShapes)

#: Memory categories of the live bytes at the step's peak.
MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")

#: Autograd's sequence number for nodes that have none (gradient accumulation).
NO_SEQ = 2**64 - 1


@dataclass
class ModuleInfo:
    """A unique module of the profiled model, in ``named_modules()`` order.

    ``params`` is the number of parameters it owns directly, or None when it is not
    known (modules read from a trace recorded without the model at hand): unknown, never
    0. A capture knows either every module's count or none."""

    path: str
    type: str
    parent: str | None
    depth: int
    params: int | None
    selected: bool = True
    extra_repr: str = ""


@dataclass
class RawCapture:
    """Everything one profiling session recorded.

    ``timing_passes`` are the measured passes: module enter/exit only (per-node medians
    are shown), or with ``detailed_passes`` each with its ops too (the median pass is
    shown whole); ``op_pass`` is a stream that holds op events apart from them (an
    untimed count's one pass). Each module's shapes are records in those streams
    (:class:`ModuleShapes`), which the walk gathers.
    """

    modules: list[ModuleInfo]
    timing_passes: list[list[Event]] = field(default_factory=list)
    op_pass: list[Event] | None = None
    detailed_passes: bool = False
    has_device_time: bool = False
    #: Bytes of the parameters; None when not known (no model at hand).
    param_bytes: int | None = 0
    #: Model-level memory known without running it: bytes by dtype of parameters and buffers.
    memory_static: dict[str, Any] = field(default_factory=dict)
    meta: RunFacts = field(default_factory=RunFacts)

    def __post_init__(self) -> None:
        given: object = self.meta
        if type(given) is dict:  # facts given as a document's meta object
            self.meta = RunFacts.from_dict(given)
    #: Whether what Python knew was noted (activations saved for backward, gradients by
    #: owner): a trace file's allocations come without it, so those figures are unknown.
    memory_notes: bool = True
    #: Whether op records carry FLOP counts where a formula exists: a trace recorded
    #: without shapes has none, so FLOPs, MACs and bytes are unknown, never 0.
    counts_known: bool = True


# -- a torch.compile'd model's run (``capture/compiled.py``; ``attribute/compiled.py``) --


class KernelRange(NamedTuple):
    """One range under a graph call in torch's profiler (a kernel call's, mostly): its
    host time, and the device time of the kernels launched in it (None: no device work
    was recorded)."""

    name: str
    duration_ns: int
    device_ns: int | None = None


class GraphCall(NamedTuple):
    """One call of an Inductor graph (``graph``: the key its range names): the ranges under it in
    call order, its own length, and the device time launched in it (None: no device work
    recorded), which holds its kernel calls' and what the graph launched itself (a CUDA
    graph's replay)."""

    graph: str
    kernels: list[KernelRange]
    duration_ns: int
    device_ns: int | None = None


class EagerRange(NamedTuple):
    """A call of a module that ran eagerly, between graphs; ns from the pass's start."""

    path: str
    start_ns: int
    end_ns: int


class CompiledRegion(NamedTuple):
    """A ``Torch-Compiled Region`` range; ns from the pass's start."""

    start_ns: int
    end_ns: int


class LossRange(NamedTuple):
    """A training step's loss (between the forward and the backward); ns from the pass's start."""

    start_ns: int
    end_ns: int


class StepRange(NamedTuple):
    """A part of a ``Profiler`` block's step around a compiled model, from torch's
    events; ns from the step's start. ``kind``: ``forward`` (a call of the compiled
    model), ``backward`` (the autograd engine running a node), ``optimizer`` and
    ``zero_grad`` (an optimizer's, ``name`` its class), ``compile`` (Dynamo and
    Inductor compiling)."""

    kind: str
    name: str
    start_ns: int
    end_ns: int
    #: The device time of the kernels launched in it (None: no device work recorded).
    device_ns: int | None = None


@dataclass
class CompiledPass:
    """One timed call of the compiled model (with its loss and backward, in a training
    step): its length, its graph calls in order, the ranges of the modules that ran
    eagerly and of the compiled regions, and the loss's range (None: forward only).
    A block's step has its parts' ranges (``ranges``) instead of a loss range. Where
    device work was recorded (``has_device``), ``loose_device`` is the device work
    launched outside every part and graph call: (launch time from the pass's start, ns)."""

    step_ns: int
    graph_calls: list[GraphCall]
    eager: list[EagerRange] = field(default_factory=list)
    regions: list[CompiledRegion] = field(default_factory=list)
    loss: LossRange | None = None
    ranges: list[StepRange] = field(default_factory=list)
    loose_device: list[tuple[int, int]] = field(default_factory=list)
    has_device: bool = False


class GraphNode(NamedTuple):
    """A post-grad FX node of a kernel call and the module it came from (a
    ``named_modules()`` path; None when the node names none)."""

    name: str
    module: str | None


@dataclass
class CompiledGraph:
    """One Inductor graph: its key (``layerscope-N`` for layerscope's compile, Inductor's
    cache key in a trace file), the Dynamo frame it belongs to, its kernel
    calls in order (``name:handle``), each call's nodes, every module with a node in
    the graph (whether or not a kernel kept it), and its phase: ``forward``, or
    ``backward`` for the graph AOTAutograd made of the forward's gradients (its nodes'
    modules are the forward's whose gradient they compute)."""

    key: str
    frame: str
    calls: list[str] = field(default_factory=list)
    nodes: dict[str, list[GraphNode]] = field(default_factory=dict)
    modules: set[str] = field(default_factory=set)
    phase: str = "forward"

    def to_dict(self) -> dict[str, Any]:
        """As JSON (a recorded capture keeps the graphs its kernels are read with)."""
        return {
            "key": self.key, "frame": self.frame, "calls": list(self.calls),
            "nodes": {call: [[n.name, n.module] for n in nodes] for call, nodes in self.nodes.items()},
            "modules": sorted(self.modules), "phase": self.phase,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompiledGraph:
        return cls(
            data["key"], data["frame"], list(data["calls"]),
            {call: [GraphNode(name, module) for name, module in nodes] for call, nodes in data["nodes"].items()},
            set(data["modules"]), data["phase"],
        )


@dataclass
class GraphBreak:
    """Where Dynamo broke the graph (``file:line``, "" when not said) and why."""

    where: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"where": self.where, "reason": self.reason}


@dataclass
class CompiledCapture:
    """What a compiled model's timed run recorded: the graphs by key, the timed passes,
    the graph breaks, the compile time and the number of Dynamo frames compiled."""

    graphs: dict[str, CompiledGraph]
    passes: list[CompiledPass]
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    compile_time_ns: int = 0
    frames: int = 0
