"""The walk: one pass's event stream in, what each node did in it out. Pure: no torch.

:class:`PassWalker` takes the records of ``layerscope.model.raw`` one at a time, in the order
they happened, and adds up self times per node and phase, calls, op tables, spans and
(through ``memory.py``) memory:

- **Forward.** A frame (module call or label) owns the time inside it minus the time of
  frames and backward work nested directly in it (its dynamic children).
- **Backward.** Each backward op belongs to the node whose forward created the autograd
  node being executed: autograd numbers the nodes it creates in order, and a module's
  forward creates the numbers between its ``Enter`` and ``Exit``. Gradient accumulation
  (nodes without a number) belongs to the module owning the parameter. An op's *slot*
  runs from its start to the next backward op's start (or a module called in backward:
  a checkpoint's recompute), so the engine's work between ops is charged to the op
  before it.
- **Recompute.** Module calls during backward (activation checkpointing) are frames of
  phase ``recompute``, never counted as forward.
- **Device time.** A frame's device time runs from the device mark at its entry to the
  one at its exit, minus its children's. A frame without marks (a backend that times
  kernels, not module calls) owns the device time of the ops run directly in it.
  Backward ops and ops outside frames carry their own.
- **The step.** A pass with ``Step`` marks is a whole step: work outside the model becomes
  top-level *parts* (``<loss>``, ``<optimizer:NAME>``, ``<zero_grad>``, labels, and
  ``<other>`` for the rest), so every nanosecond of the step's wall time is in exactly
  one node. The loss is the work after a forward of the model and before backward; a
  forward after backward starts the next iteration of a step that runs several.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from layerscope.attribute.chain import BackwardChain, Entry, Key, is_made, is_module, key_path
from layerscope.attribute.memory import MemoryLedger, MemoryResult, Site, StreamFacts, scan
from layerscope.base.comm import is_communication
from layerscope.base.intervals import merged
from layerscope.model.raw import (
    MEMORY_NOTES,
    NO_SEQ,
    NOTES,
    Adopt,
    Collective,
    DeviceBusy,
    DeviceMem,
    Enter,
    Event,
    Exit,
    Free,
    Grad,
    LabelEnter,
    LabelExit,
    ModuleShapes,
    Op,
    Optim,
    Saved,
    Step,
)
from layerscope.model.sidedocs import Timeline
from layerscope.model.tree import OpStats

#: The kinds of record that take no time (``raw.NOTES``), as a set of types.
_TIMELESS: frozenset[type] = frozenset(NOTES)

OTHER = "<other>"
LOSS = "<loss>"
#: Work between two forwards of the model with no backward after it (a generation
#: loop's decode logic, a serving loop's batching).
BETWEEN = "<between calls>"
COMMUNICATION = "<communication>"

@dataclass
class Dynamic:
    """A node that is not a module: a user label, or a part of the step."""

    path: str
    parent: Key | None
    kind: str
    name: str


#: One span of a pass: ``(t0_ns, t1_ns, key, phase, op_key, link)`` (see
#: ``PassResult.trace``), read only by ``attribute/profile.py``, which makes the
#: profile's typed trace of them.
PassSpan = tuple[int, int, Key, str, tuple[Any, ...] | None, int | None]


@dataclass
class PassResult:
    """What one pass (or training step) adds up to, before any tree exists."""

    self_cpu: dict[Site, int] = field(default_factory=dict)
    self_dev: dict[Site, int] = field(default_factory=dict)
    #: Host time in collectives (their ops, and waiting for them: ``<communication>``).
    self_comm: dict[Site, int] = field(default_factory=dict)
    calls: dict[Key, int] = field(default_factory=dict)
    dynamic: dict[str, Dynamic] = field(default_factory=dict)
    ops: dict[tuple[Any, ...], OpStats] = field(default_factory=dict)
    wall_ns: int | None = None
    top_level_ns: int = 0
    outside_ops: int = 0
    phases: set[str] = field(default_factory=set)
    memory: MemoryResult | None = None
    #: The pass as spans, when ops were collected: ``(t0, t1, key, phase, op_key, link)``,
    #: with ``op_key`` the op's table key for an op and None for a frame, backward span or
    #: part run, and ``link`` the autograd node linking a forward op to its backward work.
    #: Plain tuples, not a NamedTuple: one per op, and a NamedTuple made the walk of a
    #: 180,000-event stream about 40% slower (its instances stay tracked by the collector).
    trace: list[PassSpan] | None = None
    trace_start_ns: int = 0
    #: The traced step's own wall time (``wall_ns`` of the step the trace is; a sum of
    #: steps keeps its last step's trace, and this with it).
    trace_step_ns: int | None = None
    #: The traced step's live memory over time, where the steps were summed (each
    #: step's own timeline; ``memory.timeline`` is the step with the highest peak's).
    trace_memory: Timeline | None = None
    #: The step's device work as a whole (``DeviceBusy``'s figures summed over the
    #: steps), None when the stream had none: what the nodes' device times are a share of.
    device_busy: DeviceBusy | None = None
    #: Per module called: the label that every one of its forward calls ran directly in
    #: (the innermost frame open at its ``Enter``), None when a call ran in no label or
    #: the calls ran in different ones. The tree nests the module under that label.
    enclosing: dict[Key, str | None] = field(default_factory=dict)
    #: Per module: its ``(input_shapes, output_shapes)``, from the stream's
    #: :class:`~layerscope.model.raw.ModuleShapes` records (the first one of each module).
    module_shapes: dict[int, tuple[Any, Any]] = field(default_factory=dict)


def merge_enclosing(into: dict[Key, str | None], more: dict[Key, str | None]) -> None:
    """Fold another pass's :attr:`PassResult.enclosing` into ``into``: a module keeps its
    label only when every pass that called it called it in that same label."""
    for key, label in more.items():
        note_enclosing(into, key, label)


def note_enclosing(enclosing: dict[Key, str | None], key: Key, label: str | None) -> None:
    """One more call of ``key``, directly in ``label`` (None: in no label)."""
    if key not in enclosing:
        enclosing[key] = label
    elif enclosing[key] != label:
        enclosing[key] = None


def merge_shapes(into: dict[int, tuple[Any, Any]], more: dict[int, tuple[Any, Any]]) -> None:
    """Fold another pass's :attr:`PassResult.module_shapes` into ``into``: each module's
    first known shapes stay."""
    for module, shapes in more.items():
        into.setdefault(module, shapes)


def shapes_in(events: list[Event]) -> dict[int, tuple[Any, Any]]:
    """The module shapes a stream's records give, read without walking it (a step that
    is not walked: a warm-up step, or one that ran nothing)."""
    found: dict[int, tuple[Any, Any]] = {}
    for event in events:
        if type(event) is ModuleShapes:
            found.setdefault(event.module, (event.input_shapes, event.output_shapes))
    return found


def add_busy(total: DeviceBusy | None, more: DeviceBusy | None) -> DeviceBusy | None:
    """Two steps' device work, summed field by field (None: none known)."""
    if total is None or more is None:
        return more if total is None else total
    return DeviceBusy(*(a + b for a, b in zip(total, more)))


class Frame:
    """A module call or label the walk is inside."""

    __slots__ = (
        "child_device_ns", "child_ns", "covered", "device_t_enter_ns", "key", "live_at_enter", "live_top",
        "op_device_ns", "phase", "restore", "span_t0_ns", "t_enter_ns",
    )

    def __init__(self, key: Key, phase: str, t_enter_ns: int, device_t_enter_ns: int | None, live_bytes: int) -> None:
        self.key = key
        self.phase = phase
        self.t_enter_ns = t_enter_ns
        self.device_t_enter_ns = device_t_enter_ns
        #: Host and device time of the frames and backward work nested directly in it.
        self.child_ns = 0
        self.child_device_ns = 0
        #: Device time of the ops run directly in it: its own device time when it has no
        #: device marks (a backend that times kernels only).
        self.op_device_ns = 0
        #: Live bytes when it opened, and the highest since (memory tracking).
        self.live_at_enter = live_bytes
        self.live_top = live_bytes
        #: The intervals its direct ops, backward slots and child frames took, kept only
        #: when collectives ran: its idle time during one is waiting for it.
        self.covered: list[tuple[int, int]] | None = None
        #: Where its current span began: its entry, or where a call of a module from
        #: outside its parent (see ``PassWalker.draw``) that cut its span ended.
        self.span_t0_ns = t_enter_ns
        #: A call from outside the module's parent: how many drawn entries to keep when
        #: it closes, and the entries it cut, reopened then.
        self.restore: tuple[int, list[Frame]] | None = None


class PartRun(NamedTuple):
    """Ops outside every frame charged to one part in a row (a loss written inline in a
    ``Profiler`` block): one span of that part."""

    key: Key
    t0_ns: int
    t1_ns: int


def walk_pass(
    events: list[Event],
    paths: list[str],
    *,
    has_device: bool = False,
    collect_ops: bool = False,
    parents: list[int | None] | None = None,
) -> PassResult:
    """Self times, calls and (with ``collect_ops``) op tables of one event stream, and
    its memory when it holds memory events. ``parents`` (each module's parent index)
    lets backward memory peaks cover a module's ancestors too."""
    walker = PassWalker(
        paths, has_device=has_device, collect_ops=collect_ops, parents=parents, memory=scan(events),
        waits=any(type(event) is Collective for event in events),
    )
    walker.ahead(events)
    for event in events:
        walker.feed(event)
    return walker.finish()


class PassWalker:
    """Walks one event stream: :meth:`feed` each record in order, then :meth:`finish`.

    ``memory`` is what ``memory.scan`` learnt from the whole stream (None: no memory
    tracking); the other arguments are those of :func:`walk_pass`.
    """

    def __init__(
        self,
        paths: list[str],
        *,
        has_device: bool = False,
        collect_ops: bool = False,
        parents: list[int | None] | None = None,
        memory: StreamFacts | None = None,
        waits: bool = False,
    ) -> None:
        self.paths = paths
        #: Collectives run in this stream: frames keep what covered them (see Frame.covered).
        self.waits = waits
        self.has_device = has_device
        self.collect_ops = collect_ops
        self.result = PassResult()
        #: The frames open now, innermost last.
        self.frames: list[Frame] = []
        #: Autograd numbers from ``seq_starts[i]`` on were created by ``seq_owners[i]``.
        self.seq_starts: list[int] = []
        self.seq_owners: list[Key] = []
        #: The model's forward ran, and backward work ran since it: between them is the loss.
        self.model_ran = False
        self.backward_ran = False
        #: Backward ops and forward calls still ahead in the stream (None: not known,
        #: :meth:`ahead` not told).
        self.backward_left: int | None = None
        self.calls_left: int | None = None
        #: The first and last ``Step`` marks, and the first time of any timed record.
        self.t_first: int | None = None
        self.t_last: int | None = None
        self.t_start: int | None = None
        #: Host time of the step already charged to a top-level node (the rest is <other>).
        self.accounted_ns = 0
        #: The ``[t0, t1)`` intervals charged at the top level (kept only in a stream with
        #: collectives), and the collectives in flight
        #: on other threads: idle time during a collective is waiting for it.
        self.covered: list[tuple[int, int]] = []
        self.collectives: list[tuple[int, int]] = []
        self.parents = parents
        self.ancestry = _ancestry(parents)
        self.chain = BackwardChain(self.ancestry)
        #: Backward spans end where their last op's slot ends, not at the event that closes them.
        self.last_backward_end = 0
        #: A backward op whose slot ends at the next timed record (a backward op's start).
        self.open_slot: tuple[Key, Op] | None = None
        self.part_run: PartRun | None = None
        #: An overhead label left out of the tree (see ``on_label_enter``) is open.
        self.skipped_label = False
        self.trace: list[PassSpan] | None = [] if collect_ops else None
        #: The forward spans open now, outermost first (kept with the trace): the open
        #: frames, except where a module runs called from outside its parent (see
        #: :meth:`draw`).
        self.drawn: list[Frame] = []
        #: Modules drawn around a call from outside its parent, not as frames of their own.
        self.lent: set[Key] = set()
        if self.trace is not None:
            self.chain.closers.append(self._backward_span_closed)
        self.mem = None if memory is None else MemoryLedger(memory, self.chain, _span_rule(parents, self.result.calls))
        #: Frees seen since the last op: ``(t_ns, nbytes)``.
        self.pending_frees: list[tuple[int, int]] = []
        #: The last op charged outside every frame: ``(t0, t1)``.
        self.top_op: tuple[int, int] | None = None
        #: The last op row and when it ran: a free recorded after it, during it (a
        #: profiler's stream lists an op before what happens inside it), is its own.
        self.last_row: tuple[int, int, OpStats] | None = None
        handlers: dict[type, Callable[[Any], None]] = {
            Enter: self.on_enter,
            Exit: self.on_exit,
            Op: self.on_op,
            LabelEnter: self.on_label_enter,
            LabelExit: self.on_label_exit,
            Step: self.on_step,
            Collective: self.on_collective,
            DeviceBusy: self.on_device_busy,
            ModuleShapes: self.on_module_shapes,
        }
        for kind in MEMORY_NOTES:
            handlers[kind] = _skip
        if self.mem is not None:
            handlers.update({
                Free: self.on_free,
                Adopt: self.on_adopt,
                Grad: self.mem.grad,
                Optim: self.mem.optimizer,
                DeviceMem: self.mem.device,
                Saved: _skip,  # read by the scan, before the walk
            })
        self._handlers = handlers

    def ahead(self, events: list[Event]) -> None:
        """Count what the stream holds ahead (backward work, forward calls), so that work
        after a forward is named for what follows it: ``<loss>`` only before the backward
        it feeds, ``<between calls>`` before another forward (a generation loop's decode
        logic), else ``<other>``. Without it (records fed one by one) a forward's aftermath
        is ``<loss>``, as before."""
        self.backward_left = sum(1 for e in events if type(e) is Op and e.grad is not None)
        self.calls_left = sum(1 for e in events if type(e) is Enter and not e.in_backward)

    def feed(self, event: Event) -> None:
        """Walk one more record of the stream."""
        kind = type(event)
        if kind is Op and self.backward_left is not None and event.grad is not None:  # type: ignore[union-attr]
            self.backward_left -= 1
        elif kind is Enter and self.calls_left is not None and not event.in_backward:  # type: ignore[union-attr]
            self.calls_left -= 1
        # The type in a set, not isinstance against the tuple: this runs once per record,
        # and the tuple's test costs ~9x as much (a failing test per kind of note).
        if type(event) not in _TIMELESS:
            if self.open_slot is not None:
                self._close_slot(event)
            if self.t_start is None and not isinstance(event, NOTES):
                self.t_start = event.t0_ns if isinstance(event, Op) else event.t_ns
        try:
            handler = self._handlers[type(event)]
        except KeyError:
            raise TypeError(f"not an event record of layerscope.model.raw: {event!r}") from None
        handler(event)

    # -- frames -----------------------------------------------------------------------------
    def on_enter(self, event: Enter) -> None:
        self.note_seq(event.seq, event.module)
        frames = self.frames
        if not event.in_backward:
            # Where the forward call ran places the module; a recompute (run from
            # backward, in whatever frame autograd is in) repeats it and does not.
            label = frames[-1].key if frames and is_made(frames[-1].key) else None
            note_enclosing(self.result.enclosing, event.module, label)
        self._open(event.module, event)

    def on_label_enter(self, event: LabelEnter) -> None:
        frames = self.frames
        if event.kind == "overhead" and not frames and self.t_first is None:
            # layerscope's own work outside the model in a pass with no step marks (a
            # forward pass has no parts): in no node, as the rest outside the model.
            self.skipped_label = True
            return
        # A hook of an autograd node (FSDP's pre-backward, its reduce-scatter) is backward
        # work of the module whose forward created the node, under that module.
        hooked: Key | None = None
        if frames:
            if frames[-1].phase == "backward":
                hooked = frames[-1].key
        elif event.grad is not None:
            hooked = self.backward_owner(event.grad)
            if is_made(hooked):
                self.ensure_part(hooked)
        if hooked is not None:
            path = self.ensure_dynamic(hooked, event.name, event.kind)
            self.result.calls[path] = self.result.calls.get(path, 0) + 1
            self._push(Frame(path, "backward", event.t_ns, event.device_t_ns, self.live()))
            return
        path = self.ensure_dynamic(frames[-1].key if frames else None, event.name, event.kind)
        self.note_seq(event.seq, path)
        # A label takes the phase of the frame it runs in (recompute inside a module
        # recomputing); one the engine runs outside any node and frame (a callback queued
        # for the end of backward) is a part of the step like any top-level label.
        self._open(path, event, recompute=bool(frames) and frames[-1].phase == "recompute")

    def _open(self, key: Key, event: Enter | LabelEnter, recompute: bool | None = None) -> None:
        """Open a frame; ``recompute`` defaults to whether autograd's engine runs."""
        if recompute is None:
            recompute = event.in_backward
        if not recompute:
            self.result.calls[key] = self.result.calls.get(key, 0) + 1
            if not self.frames:
                self.end_backward()
                self.close_part_run()
        self._push(Frame(key, "recompute" if recompute else "forward", event.t_ns, event.device_t_ns, self.live()))

    def _push(self, frame: Frame) -> None:
        if self.waits:
            frame.covered = []
        if self.trace is not None:
            self.draw(frame)
        self.frames.append(frame)

    def draw(self, frame: Frame) -> None:
        """Open ``frame``'s span. The tree counts a module's every call under its one
        parent (a shared module: vLLM's rotary embedding, called from every layer's
        attention; OWLv2's ``post_layernorm``, called by the detection head too), so a
        call from elsewhere is drawn where the tree counts it: the spans open inside its
        nearest drawn ancestor are cut at its entry, its ancestors below that one are
        drawn around it, and at its exit the cut spans reopen. So a module's forward
        spans add up to its forward time."""
        drawn = self.drawn
        key = frame.key
        if frame.phase == "forward" and is_module(key) and self.parents is not None:
            caller: Key | None = None
            for entry in reversed(drawn):
                if entry.phase != "forward":
                    # Run from backward work: drawn where it runs.
                    drawn.append(frame)
                    return
                if is_module(entry.key):
                    caller = entry.key
                    break
            if self.parents[key] != caller:
                self.draw_elsewhere(frame, caller)
        drawn.append(frame)

    def draw_elsewhere(self, frame: Frame, caller: Key | None) -> None:
        """Draw ``frame``'s ancestors below its nearest drawn one from its entry (a
        ``ModuleList`` between a model and its blocks too: spans of modules never called
        are dropped at the end), first cutting the spans open below that ancestor when
        the caller is not one (labels inside an ancestor stay open)."""
        assert self.trace is not None
        drawn, t = self.drawn, frame.t_enter_ns
        ancestry = self.ancestry(frame.key)[:-1]
        keep, start = len(drawn), 0
        for at in range(len(drawn) - 1, -1, -1):
            if drawn[at].key in ancestry:
                start = ancestry.index(drawn[at].key) + 1
                if drawn[at].key != caller:
                    keep = at + 1
                break
        else:
            if caller is not None:  # no ancestor drawn: cut from the outermost module drawn
                keep = next(at for at, entry in enumerate(drawn) if is_module(entry.key))
        cut = drawn[keep:]
        del drawn[keep:]
        for entry in reversed(cut):
            self._span(entry, t)
        for k in ancestry[start:]:
            self.lent.add(k)
            drawn.append(Frame(k, "forward", t, None, 0))
        frame.restore = (keep, cut)

    def _span(self, entry: Frame, t: int) -> None:
        """One span of a drawn entry, from where its current span began to ``t``."""
        assert self.trace is not None
        if t > entry.span_t0_ns or entry.span_t0_ns == entry.t_enter_ns:  # no empty piece of a cut span
            self.trace.append((entry.span_t0_ns, t, entry.key, entry.phase, None, None))

    def undraw(self, frame: Frame, t: int) -> None:
        """Close ``frame``'s span at ``t``, and what it drew around itself."""
        drawn = self.drawn
        if drawn and drawn[-1] is frame:
            drawn.pop()
        self._span(frame, t)
        if frame.restore is not None:
            keep, cut = frame.restore
            while len(drawn) > keep:
                self._span(drawn.pop(), t)
            for entry in cut:
                entry.span_t0_ns = t
            drawn.extend(cut)

    def on_exit(self, event: Exit) -> None:
        # Exits match their enters (forward hooks run even when forward raises). If one
        # did not, a frame left open is closed at the same time as its caller, and an exit
        # with no open frame is ignored.
        module = event.module
        self._close_through(lambda frame: frame.key == module, event)

    def on_label_exit(self, event: LabelExit) -> None:
        if self.skipped_label:  # an overhead label holds no frame: this is its exit
            self.skipped_label = False
            return
        self._close_through(lambda frame: is_made(frame.key), event)

    def _close_through(self, is_target: Callable[[Frame], bool], event: Exit | LabelExit) -> None:
        """Close the innermost frame ``is_target`` accepts, and any left open inside it."""
        frames = self.frames
        if not any(is_target(frame) for frame in frames):
            return
        while not is_target(frames[-1]):
            self.close_frame(event.t_ns, event.device_t_ns)
        self.close_frame(event.t_ns, event.device_t_ns)
        self.note_seq(event.seq, frames[-1].key if frames else self.top_owner())

    def close_frame(self, t: int, device_t: int | None) -> None:
        """Close the innermost frame at ``t`` (``device_t`` on the device)."""
        frames = self.frames
        frame = frames.pop()
        key, phase = frame.key, frame.phase
        if self.mem is not None:
            self.mem.frame_closed(frame, t, frames)
        if self.trace is not None:
            self.undraw(frame, t)
        duration = max(0, t - frame.t_enter_ns)
        device_duration = self_device = None
        if frame.device_t_enter_ns is not None:
            if device_t is not None:
                device_duration = max(0, device_t - frame.device_t_enter_ns)
                self_device = max(0, device_duration - frame.child_device_ns)
        elif self.has_device:
            # No device marks at its ends (torch's Kineto profiler times kernels, not
            # module calls): its own device time is its direct ops' kernel time.
            self_device = frame.op_device_ns
            device_duration = self_device + frame.child_device_ns
        self.charge(key, phase, max(0, duration - frame.child_ns), self_device)
        if frame.covered is not None and self.collectives:
            # Idle in this frame while a collective was in flight (a synchronous
            # collective: FSDP's all-gather): its own time, spent waiting.
            wait = waiting_ns(frame.t_enter_ns, t, frame.covered, self.collectives)
            if wait:
                comm = self.result.self_comm
                comm[(key, phase)] = comm.get((key, phase), 0) + wait
        if frames:
            if frames[-1].covered is not None:
                frames[-1].covered.append((frame.t_enter_ns, t))
            frames[-1].child_ns += duration
            frames[-1].child_device_ns += device_duration or 0
        else:
            self.account(frame.t_enter_ns, t)
            if is_module(key) and phase == "forward":
                # A forward of the model after backward work starts a new iteration (a
                # block of several without step() between them): what follows until its
                # backward is the loss again.
                self.model_ran = True
                self.backward_ran = False
                self.result.top_level_ns += duration

    # -- ops ----------------------------------------------------------------------------------
    def on_op(self, event: Op) -> None:
        frames = self.frames
        grad = event.grad
        if grad is not None and not (frames and frames[-1].phase in ("recompute", "backward")):
            self._backward_op(event, grad)
        elif frames:
            top = frames[-1]
            if self.has_device:
                top.op_device_ns += event.device_time_ns or 0
            memory = self.op_memory((top.key, top.phase), event)
            if top.covered is not None:
                top.covered.append((event.t0_ns, event.t1_ns))
            self.comm_op((top.key, top.phase), event)
            self.record_op(top.key, top.phase, event, memory)
        else:
            self._op_outside_frames(event)

    def _backward_op(self, event: Op, grad: tuple[int | None, int | None]) -> None:
        """Backward work: owned by whoever created the autograd node."""
        self.backward_ran = True
        self.close_part_run()
        key = self.backward_owner(grad)
        if key == OTHER and is_communication(event.name):
            key = COMMUNICATION  # a collective no module's backward started
        if is_made(key):
            self.ensure_part(key)
        if not self.frames:
            self.chain.move(key, event.t0_ns)
        memory = self.op_memory((key, "backward"), event)
        self.comm_op((key, "backward"), event)
        # Its time is charged when the slot ends, at the next timed record.
        self.open_slot = (key, event)
        self.record_op(key, "backward", event, memory)

    def _close_slot(self, following: Event | None) -> None:
        """Charge the open backward slot: it runs to ``following``'s start if that is a
        backward op, a module called in backward (a checkpoint's recompute) or a label
        begun inside a node (its hook, a compiled backward's graph call), the engine's
        or the node's own work between them, else to its op's end."""
        assert self.open_slot is not None
        key, event = self.open_slot
        self.open_slot = None
        end = event.t1_ns
        if type(following) is Op and following.grad is not None:
            end = max(following.t0_ns, end)
        elif type(following) is Enter and following.in_backward:
            end = max(following.t_ns, end)
        elif type(following) is LabelEnter and following.grad is not None:
            end = max(following.t_ns, end)
        slot = max(0, end - event.t0_ns)
        self.last_backward_end = max(self.last_backward_end, end)
        self.charge(key, "backward", slot, event.device_time_ns if self.has_device else None)
        if self.frames:
            if self.frames[-1].covered is not None:
                self.frames[-1].covered.append((event.t0_ns, end))
            self.frames[-1].child_ns += slot
            if self.has_device:
                self.frames[-1].child_device_ns += event.device_time_ns or 0
        else:
            self.account(event.t0_ns, end)

    def _op_outside_frames(self, event: Op) -> None:
        """Forward work outside every frame: the loss (after the model's forward, before
        backward) or other glue. Without step marks it is outside the tree."""
        self.end_backward()
        if self.t_first is not None and is_communication(event.name):
            # A collective outside the model (the loss all-reduced for logging).
            self.ensure_part(COMMUNICATION)
            site: Site | None = (COMMUNICATION, "forward")
        else:
            site = self.top_site()
        memory = self.op_memory(site, event)
        if site is None:
            if event.name is not None:
                self.result.outside_ops += 1
            return
        key = site[0]
        outer = self.top_op
        if outer is not None and outer[0] <= event.t0_ns and event.t1_ns <= outer[1]:
            # Inside the op charged last (a composite's parts, read as rows): its time
            # is counted once, in that op.
            self.record_op(key, "forward", event, memory)
            return
        self.top_op = (event.t0_ns, event.t1_ns)
        run = self.part_run
        t0 = event.t0_ns
        if run is not None and run.key == key:
            # The part runs on between its ops (the Python of an inline loss): its time
            # is its span's, from its first op's start to its last op's end.
            t0 = min(t0, run.t1_ns)
            self.part_run = run._replace(t1_ns=max(run.t1_ns, event.t1_ns))
        else:
            self.close_part_run()
            self.part_run = PartRun(key, event.t0_ns, event.t1_ns)
        elapsed = max(0, event.t1_ns - t0)
        self.charge(key, "forward", elapsed, event.device_time_ns if self.has_device else None)
        self.account(t0, event.t1_ns)
        self.comm_op((key, "forward"), event)
        self.record_op(key, "forward", event, memory)

    def comm_op(self, site: Site, event: Op) -> None:
        """A collective's own time is communication time of the node that ran it."""
        if is_communication(event.name):
            comm = self.result.self_comm
            comm[site] = comm.get(site, 0) + max(0, event.t1_ns - event.t0_ns)

    def on_device_busy(self, event: DeviceBusy) -> None:
        self.result.device_busy = add_busy(self.result.device_busy, event)

    def on_collective(self, event: Collective) -> None:
        self.collectives.append((event.t0_ns, event.t1_ns))

    def on_module_shapes(self, event: ModuleShapes) -> None:
        self.result.module_shapes.setdefault(event.module, (event.input_shapes, event.output_shapes))

    def account(self, t0: int, t1: int) -> None:
        """``[t0, t1)`` of the step is charged to a top-level node."""
        self.accounted_ns += max(0, t1 - t0)
        if self.waits:  # only a stream with collectives has waiting to find
            self.covered.append((t0, t1))

    def record_op(self, key: Key, phase: str, event: Op, memory: tuple[int, int]) -> None:
        """Add ``event`` to ``key``'s op table (when ops are collected)."""
        if not self.collect_ops or event.name is None:
            return
        has_device, mem = self.has_device, self.mem
        name, shapes, stack, flops = event.name, event.input_shapes, event.stack, event.flops
        table_key = (key, phase, name, _shape_key(shapes), stack)
        assert self.trace is not None  # kept whenever ops are collected
        # The autograd node linking a forward op to its backward work, for flow arrows.
        link = event.fwd_seq if event.grad is None else event.grad[0]
        self.trace.append((event.t0_ns, event.t1_ns, key, phase, table_key, link))
        ops = self.result.ops
        op = ops.get(table_key)
        if op is None:
            op = ops[table_key] = OpStats(
                name=name,
                phase=phase,
                input_shapes=_as_lists(shapes),
                device_time_ns=0 if has_device else None,
                self_device_time_ns=0 if has_device else None,
                flops=None if flops is None else 0,
                macs=None if event.macs is None else 0,
                bytes=0,
                alloc_bytes=0 if mem is not None else None,
                self_alloc_bytes=0 if mem is not None else None,
                freed_bytes=0 if mem is not None else None,
                stack=None if stack is None else list(stack),
            )
        op.calls += 1
        self.last_row = (event.t0_ns, event.t1_ns, op)
        if mem is not None:
            op.alloc_bytes = (op.alloc_bytes or 0) + memory[0]
            op.self_alloc_bytes = (op.self_alloc_bytes or 0) + memory[0]
            op.freed_bytes = (op.freed_bytes or 0) + memory[1]
        if flops is not None and op.flops is not None:
            op.flops += flops
            op.macs = (op.macs or 0) + (event.macs or 0)
        op.bytes = (op.bytes or 0) + (event.bytes or 0)
        elapsed = max(0, event.t1_ns - event.t0_ns)
        # Ops are seen at the dispatcher, one level deep: self time is total time.
        op.cpu_time_ns = (op.cpu_time_ns or 0) + elapsed
        op.self_cpu_time_ns = (op.self_cpu_time_ns or 0) + elapsed
        if has_device and event.device_time_ns is not None:
            op.device_time_ns = (op.device_time_ns or 0) + event.device_time_ns
            op.self_device_time_ns = (op.self_device_time_ns or 0) + event.device_time_ns

    def op_memory(self, site: Site | None, event: Op) -> tuple[int, int]:
        """Bytes the op allocated, and bytes freed while it ran."""
        mem = self.mem
        if mem is None:
            return 0, 0
        freed = 0
        if self.pending_frees:
            freed = sum(n for t, n in self.pending_frees if t >= event.t0_ns)
            self.pending_frees.clear()
        if not event.allocs:
            return 0, freed
        return mem.allocate(event.allocs, site, event.t1_ns, self.frames), freed

    # -- the step and memory notes ---------------------------------------------------------------
    def on_step(self, event: Step) -> None:
        self.close_part_run()
        if self.t_first is None:
            self.t_first = event.t_ns
        self.t_last = event.t_ns

    def on_free(self, event: Free) -> None:
        assert self.mem is not None
        nbytes = self.mem.free(event.serial, self.site_now(), event.t_ns)
        if nbytes:
            row = self.last_row
            if row is not None and row[0] <= event.t_ns <= row[1]:
                row[2].freed_bytes = (row[2].freed_bytes or 0) + nbytes
            else:
                self.pending_frees.append((event.t_ns, nbytes))

    def on_adopt(self, event: Adopt) -> None:
        assert self.mem is not None
        self.mem.adopt(event, self.site_now(), self.frames)

    # -- where work goes ------------------------------------------------------------------------
    def charge(self, key: Key, phase: str, ns: int, device_ns: int | None) -> None:
        result = self.result
        result.phases.add(phase)
        site = (key, phase)
        result.self_cpu[site] = result.self_cpu.get(site, 0) + ns
        if device_ns is not None:
            result.self_dev[site] = result.self_dev.get(site, 0) + device_ns

    def top_owner(self) -> str:
        """The part that work outside the model belongs to now: after a forward, the
        ``<loss>`` when backward work follows, ``<between calls>`` when another forward
        does (and no backward), else ``<other>``."""
        if not self.model_ran or self.backward_ran:
            return OTHER
        if self.backward_left is None or self.backward_left > 0:
            return LOSS
        return BETWEEN if self.calls_left else OTHER

    def top_site(self, create: bool = True) -> Site | None:
        """Where work outside any frame or backward chain is charged: the step's parts.
        A free alone does not make a <loss> part (``create=False``); it goes to <other>."""
        if self.t_first is None:
            return None
        key = self.top_owner()
        if key not in self.result.dynamic and not create:
            key = OTHER
        self.ensure_part(key)
        return (key, "forward")

    def site_now(self) -> Site | None:
        if self.frames:
            return (self.frames[-1].key, self.frames[-1].phase)
        owner = self.chain.owner
        if owner is not None:
            return (owner, "backward")
        return self.top_site(create=False)

    def ensure_part(self, key: str) -> None:
        """The <loss>, <communication> or <other> part exists (labels exist from their
        entry on)."""
        if key not in self.result.dynamic:
            kind = {LOSS: "loss", COMMUNICATION: "communication"}.get(key, "other")
            self.result.dynamic[key] = part_node(kind, key[1:-1])

    def ensure_dynamic(self, parent: Key | None, name: str, kind: str) -> str:
        """The node of a label or step part entered inside ``parent``; returns its path."""
        path = _label_path(None if parent is None else self.path_of(parent), name, kind)
        dynamic = self.result.dynamic
        if path not in dynamic:
            # Step parts sit at the top level, wherever they were entered from.
            top = kind in ("optimizer", "zero_grad", "loss") or parent is None
            dynamic[path] = Dynamic(path, None if top else parent, kind, name)
        return path

    def path_of(self, key: Key) -> str:
        return key_path(key, self.paths)

    def note_seq(self, seq: int | None, owner: Key) -> None:
        """Autograd nodes numbered from ``seq`` on are created by ``owner`` (until the
        next note). Numbers from another thread's counter (lower) are ignored."""
        if seq is None:
            return
        starts = self.seq_starts
        if starts and starts[-1] == seq:
            self.seq_owners[-1] = owner
        elif not starts or seq > starts[-1]:
            starts.append(seq)
            self.seq_owners.append(owner)

    def backward_owner(self, grad: tuple[int | None, int | None]) -> Key:
        """The node whose forward created the autograd node a backward op runs for."""
        seq, owner = grad
        if owner is not None:
            return owner
        if seq is None or seq < 0 or seq == NO_SEQ:
            return OTHER
        at = bisect_right(self.seq_starts, seq) - 1
        return self.seq_owners[at] if at >= 0 else OTHER

    def live(self) -> int:
        return self.mem.live if self.mem is not None else 0

    # -- spans ------------------------------------------------------------------------------------
    def end_backward(self) -> None:
        """Forward work begins: close the backward chain where its last slot ended."""
        if self.chain.entries:
            self.chain.close(self.last_backward_end)

    def close_part_run(self) -> None:
        run = self.part_run
        if run is None:
            return
        self.part_run = None
        if self.trace is not None:
            self.trace.append((run.t0_ns, run.t1_ns, run.key, "forward", None, None))
        if self.mem is not None:
            self.mem.part_span(run.key, run.t0_ns, run.t1_ns)

    def _backward_span_closed(self, entry: Entry, t: int, still_open: list[Entry]) -> None:
        assert self.trace is not None
        self.trace.append((entry.t_open, t, entry.key, "backward", None, None))

    # -- the end ------------------------------------------------------------------------------------
    def finish(self) -> PassResult:
        """Close what is still open and return the pass's result."""
        if self.open_slot is not None:
            self._close_slot(None)
        self.end_backward()
        self.close_part_run()
        if self.t_last is not None:
            while self.frames:
                self.close_frame(self.t_last, None)
        result = self.result
        t_base = self.t_first if self.t_first is not None else (self.t_start or 0)
        if self.mem is not None:
            result.memory = self.mem.finish(t_base, self.path_of)
        if self.trace is not None:
            uncalled = {key for key in self.lent if not result.calls.get(key)}
            if uncalled:
                # Drawn only around calls of their descendants (a ModuleList, a trace's
                # root): a module never called has no spans, as everywhere else.
                self.trace = [span for span in self.trace if span[4] is not None or span[2] not in uncalled]
            self.trace.sort(key=_span_order)
            result.trace = self.trace
            result.trace_start_ns = t_base
        if self.t_first is not None and self.t_last is not None:
            result.wall_ns = self.t_last - self.t_first
            if result.trace is not None:
                result.trace_step_ns = result.wall_ns
            wait = 0
            if self.collectives:
                wait = waiting_ns(self.t_first, self.t_last, self.covered, self.collectives)
                if wait:
                    self.ensure_part(COMMUNICATION)
                    self.charge(COMMUNICATION, "forward", wait, None)
                    comm = result.self_comm
                    comm[(COMMUNICATION, "forward")] = comm.get((COMMUNICATION, "forward"), 0) + wait
            self.ensure_part(OTHER)
            self.charge(OTHER, "forward", max(0, result.wall_ns - self.accounted_ns - wait), None)
        return result


def waiting_ns(t_first: int, t_last: int, covered: list[tuple[int, int]], collectives: list[tuple[int, int]]) -> int:
    """Time of ``[t_first, t_last)`` the profiled thread spent idle (in no ``covered``
    interval) while a collective was in flight: waiting for it."""
    idle: list[tuple[int, int]] = []
    cursor = t_first
    for t0, t1 in sorted(covered):
        if t0 > cursor:
            idle.append((cursor, min(t0, t_last)))
        cursor = max(cursor, t1)
    if cursor < t_last:
        idle.append((cursor, t_last))
    busy = merged([(max(a, t_first), min(b, t_last)) for a, b in collectives if b > a])
    total = 0
    j = 0
    for a, b in idle:
        while j < len(busy) and busy[j][1] <= a:
            j += 1
        k = j
        while k < len(busy) and busy[k][0] < b:
            total += max(0, min(b, busy[k][1]) - max(a, busy[k][0]))
            k += 1
    return total


def parent_indices(modules: list[Any]) -> list[int | None]:
    """Each module's parent as an index into ``modules`` (None for the root)."""
    index = {info.path: n for n, info in enumerate(modules)}
    return [None if info.parent is None else index.get(info.parent) for info in modules]


def _skip(event: Event) -> None:
    pass


def _shape_key(shapes: Any) -> Any:
    # Captured shapes are tuples (hashable as they are); hand-written streams may use
    # lists, whose text is a faithful key.
    try:
        hash(shapes)
    except TypeError:
        return repr(shapes)
    return shapes


def _as_lists(shapes: Any) -> Any:
    """Shapes as JSON-ready nested lists of ints. A shape (a tuple of ints) is copied in
    one call: an optimizer's foreach op has hundreds of them per call."""
    if isinstance(shapes, (tuple, list)):
        return [
            list(s) if type(s) is tuple and (not s or type(s[0]) is int) else _as_lists(s)
            for s in shapes
        ]
    return shapes


def part_node(kind: str, name: str) -> Dynamic:
    """A step part's node, at the top level: ``<loss>``, ``<optimizer:NAME>``,
    ``<zero_grad>``, ``<other>`` (a compiled model's block makes its parts with it)."""
    return Dynamic(_label_path(None, name, kind), None, kind, name)


def _label_path(parent_path: str | None, name: str, kind: str) -> str:
    if kind == "optimizer":
        return f"<optimizer:{name}>"
    if kind in ("zero_grad", "loss"):
        return f"<{kind}>"
    if parent_path is None:
        return f"<{name}>"
    if kind == "overhead":  # layerscope's own time is <layerscope> wherever it sits
        return f"{parent_path}[<{name}>]"
    return f"{parent_path}[{name}]"


def _span_order(span: tuple[Any, ...]) -> tuple[int, int, int]:
    # By start; an enclosing span (longer) before the spans it holds; ops after frames.
    return (span[0], -span[1], 0 if span[4] is None else 1)


def _ancestry(parents: list[int | None] | None) -> Callable[[Key], list[Key]]:
    """``key`` and its ancestors, outermost first (a part or label stands alone)."""
    memo: dict[Key, list[Key]] = {}

    def chain(key: Key) -> list[Key]:
        found = memo.get(key)
        if found is None:
            found = [key]
            if is_module(key) and parents is not None:
                up = parents[key]
                while up is not None:
                    found.append(up)
                    up = parents[up]
            found.reverse()
            memo[key] = found
        return found

    return chain


def _span_rule(parents: list[int | None] | None, calls: dict[Key, int]) -> Callable[[Key, bool], bool]:
    """Which frames the memory timeline draws: the step's parts, the model, and the
    modules right under it, counting only modules that were called (the blocks of a
    ``ModuleList`` the model loops over are right under it)."""
    def worthy(key: Key, top_level: bool) -> bool:
        if not is_module(key):
            return top_level
        if parents is None:
            return top_level
        if not calls.get(key):
            return False
        called_above = 0
        up = parents[key]
        while up is not None:
            called_above += 1 if calls.get(up) else 0
            up = parents[up]
        return called_above <= 1

    return worthy
