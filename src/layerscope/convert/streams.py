"""The conversion: one window's ranges and device work (:mod:`layerscope.convert.ranges`,
written by either adapter) as typed streams of :mod:`layerscope.model.raw` records, one per
step (``Step`` ... ``Step``), which the walker in ``layerscope.attribute`` attributes.

Pure: what only torch knows of an op (whether a name is an op of its dispatcher, whether
an overload is a composite whose work its nested ops do, its FLOPs, MACs and bytes) is
asked of the :class:`OpCatalog` the caller hands in; ``flops/recorded.py`` is torch's.

How the records are derived:

- **Threads.** Only the thread that opened the window (and autograd's engine threads,
  for its backward) counts: global hooks fire for every thread, so hooks ignore other
  threads, and their ops are dropped here.
- **Backward.** Each ``autograd::engine::evaluate_function: NodeName`` range becomes one
  backward ``Op`` whose ``grad`` is the node's sequence number, the link to the module
  whose forward created it. Gradient accumulation has no number; autograd's engine
  runs it as soon as its gradient is complete (it has the highest priority), so right
  after the node that produced the gradient: it takes that node's number, and so its
  module.
- **Sequence numbers at module boundaries.** An op's ``sequence_nr`` is autograd's
  counter when it started, so the counter at any instant is the number of the next op
  (on that thread) that carries one: that is what ``Enter``/``Exit`` get, as the
  hook-based capture reads it directly.
- **Ops.** The ops directly inside a frame, or outside every frame (the loss written
  inline, glue), become forward ``Op`` records with their time and, on a device, their
  kernels' device time: the union of the intervals of the kernels launched from the op
  or the ops under it (a kernel's ``linked_correlation_id`` is its launching op's
  ``correlation_id``), so kernels overlapping on two streams are not counted twice. In
  a detailed window ops are read down to the dispatcher's level, with their shapes,
  counts and memory (``_Converter.emit``; docs/design.md, "Detail from torch's events").
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable
from typing import Any, Protocol

from layerscope.base.comm import is_communication
from layerscope.base.intervals import union_ns
from layerscope.convert.device import launch_times, share_device_time
from layerscope.convert.memory import Note, Reads, StepMemory
from layerscope.convert.ranges import (
    ACCUMULATE,
    EVALUATE,
    MEMORY,
    MODULE_PREFIX,
    NOTE_PREFIX,
    OVERHEAD_NAME,
    PART_PREFIX,
    RAISED_NAME,
    STEP_NAME,
    USER_SCOPE,
    Detail,
    KernelSpan,
    Range,
    WindowCapture,
    input_shapes,
    label_kind,
    op_like,
)
from layerscope.model.raw import (
    NO_SEQ,
    Collective,
    DeviceBusy,
    DeviceMem,
    Enter,
    Event,
    Exit,
    Free,
    LabelEnter,
    LabelExit,
    Op,
    Step,
)

#: ``(flops, macs, bytes)`` of one call; a figure not known is None.
Counts = tuple[int | None, int | None, int]


class OpCatalog(Protocol):
    """What the conversion asks of the torch that recorded the ops (``flops/recorded.py``)."""

    #: Whether the ops' inputs were recorded (their shapes are the rows' shapes).
    shapes: bool

    def is_dispatcher_op(self, name: str) -> bool:
        """Whether ``name`` is an op of torch's dispatcher (``aten::mm``), not a range of
        autograd's or a custom ``Function``."""
        ...

    def is_composite(self, name: str, overload: str) -> bool:
        """Whether the overload's work is done by the ops torch nests in it."""
        ...

    def counts(self, name: str, overload: str, inputs: list[Any], concrete: list[Any] | None) -> tuple[Hashable | None, Counts]:
        """A key for the call's signature (None when it has none) and its counts."""
        ...


def _sequence_nr(event: Range) -> int:
    return getattr(event.extra_fields, "sequence_number", -1)


def _kind(event: Range, name: str | None = None) -> str:
    """What a range is, from its name (read once: every read is a call into C++). A
    namespaced name (``aten::mm``) is an op without looking further."""
    if name is None:
        name = event.name
    if "::" in name and not name.startswith(EVALUATE) and op_like(name):
        return "op"
    if name.startswith(MODULE_PREFIX):
        return "module"
    if name == STEP_NAME:
        return "step"
    if name.startswith(NOTE_PREFIX):
        return "note"
    if name == RAISED_NAME:
        return "raised"
    if name == MEMORY:
        return "memory"
    if name.startswith(PART_PREFIX):
        return "part"
    if name.startswith(EVALUATE):
        return "backward"
    if is_communication(name):
        return "op"  # a process group's range around a collective (gloo:all_reduce)
    if getattr(event.extra_fields, "scope", None) == USER_SCOPE:
        return "label"
    return "op"


def convert(
    roots: list[Range], kernels: list[KernelSpan] | None = None, *, has_device: bool = False,
    detail: Detail | None = None, ops: OpCatalog | None = None,
) -> list[list[Event]]:
    """The window's ranges (the roots of each thread's tree) as one typed stream per step
    (``Step`` ... ``Step``). With ``detail`` (a window recording shapes and memory), ops
    are read down to the level a dispatch mode sees (composites opened into their parts),
    each with its input shapes, FLOPs, MACs and bytes (asked of ``ops``, which a detailed
    window needs), the storages it allocated and those freed."""
    if detail is not None and ops is None:
        raise ValueError("a detailed window is converted with an op catalog (ops=): its ops are counted")
    return _Converter(roots, list(kernels or ()), has_device, detail, ops or _NO_OPS).streams()


def convert_window(window: WindowCapture, ops: OpCatalog | None = None) -> list[list[Event]]:
    """:func:`convert` of one recorded window (live, or read back from a file)."""
    return convert(window.roots, window.kernels, has_device=window.has_device, detail=window.detail, ops=ops)


class _NoOps:
    """The catalog of a window without detail, which never asks one."""

    shapes = False

    def is_dispatcher_op(self, name: str) -> bool:
        raise AssertionError("a window without detail asks no catalog")

    def is_composite(self, name: str, overload: str) -> bool:
        raise AssertionError("a window without detail asks no catalog")

    def counts(self, name: str, overload: str, inputs: list[Any], concrete: list[Any] | None) -> tuple[Hashable | None, Counts]:
        raise AssertionError("a window without detail asks no catalog")


_NO_OPS = _NoOps()


class OutermostOps:
    """The catalog of a detailed window whose ops recorded no inputs (a trace recorded,
    or read, without shapes): nothing says which overload ran or what it counts, so each
    op is one row where a module called it (``aten::linear``, not the ``addmm`` in it),
    uncounted. A namespaced op outside aten that is no collective is opened into its
    parts, as an op torch's registry lacks is (``vllm::all_reduce`` around
    ``symm_mem::multimem_all_reduce_``). No torch: the catalog reads names alone."""

    shapes = False

    def is_dispatcher_op(self, name: str) -> bool:
        return "::" in name and op_like(name) and not _may_nest(name)

    def is_composite(self, name: str, overload: str) -> bool:
        return False

    def counts(self, name: str, overload: str, inputs: list[Any], concrete: list[Any] | None) -> tuple[Hashable | None, Counts]:
        return None, (None, None, 0)


class _Converter:
    """Turns one window's range trees and kernels into typed records, one method per
    kind of range.

    The owner thread is the one whose ranges mark the steps; another thread's work
    counts only inside a backward (``evaluate_function``) range that ran during one of
    the owner's steps (autograd's device threads), and nowhere else. In a timing window
    ops are read one level deep (the ones directly in a frame or step), below that only
    on a device, for their kernels; in a detailed window down to the level a dispatch
    mode sees (``emit``)."""

    def __init__(
        self, roots: list[Range], kernels: list[KernelSpan], has_device: bool, detail: Detail | None, ops: OpCatalog
    ) -> None:
        self.has_device = has_device
        self.ops = ops
        self.detail = detail
        #: Frames (module, label, part ranges) open on the owner thread's walk now.
        self.depth = 0
        #: Each allocation's address, by its id; the accelerator's allocator totals.
        self.ptr_of: dict[int, int] = {}
        self.device_totals: list[tuple[int, int, int]] = []
        self._totals_sorted = False
        #: Whether a composite of a signature is read as its parts (see ``opens``).
        self.opened: dict[Any, bool] = {}
        #: Where the records of each module frame open now begin.
        self.frame_first: list[int] = []
        #: Each op's kernels (by correlation id) as the pieces of time they hold alone:
        #: filled by :func:`share_device_time` as the walk begins, on a device.
        self.kernels_by_op: dict[int, list[tuple[int, int]]] = {}
        #: All of the window's device work (linked or not), for each step's busy time.
        self.kernels = kernels
        self.roots = roots
        self.records: list[tuple[int, int, Event]] = []  # (time, order, record)
        # Autograd's counter over time: (start, sequence_nr) of the owner's ops that
        # carry one, in order. The first such op after an instant is a top-level op.
        self.seq_marks: list[tuple[int, int]] = []
        self.on_owner = True
        #: The thread whose ranges mark the steps: only its ops number autograd's counter
        #: at its frames (another thread's, a checkpoint recomputing, count its own).
        self.owner_tid: int | None = None
        self.last_backward_seq: int | None = None

    # -- helpers ----------------------------------------------------------------------
    def stack_of(self, event: Range) -> tuple[str, ...] | None:
        """The user's Python frames around an op, innermost first (``with_stack``)."""
        if self.detail is None or self.detail.stacks is None:
            return None
        return event.stack

    def put(self, t_ns: int, record: Event) -> int:
        self.records.append((t_ns, len(self.records), record))
        return len(self.records) - 1

    def replace(self, at: int, **fields: Any) -> None:
        t_ns, order, record = self.records[at]
        self.records[at] = (t_ns, order, record._replace(**fields))

    def kernel_time(self, event: Range, skip: frozenset[int] = frozenset()) -> int:
        """Device time of the kernels launched from ``event`` or any op under it: looked
        up by the id torch links them with, which op ranges alone carry (0 elsewhere:
        an allocation, a module or step range). The subtrees of the ranges in ``skip``
        (their ``id()``: frames nested in the event, which hold their own) are left out."""
        spans: list[tuple[int, int]] = []
        by_op = self.kernels_by_op
        pending = [event]
        while pending:
            item = pending.pop()
            if skip and id(item) in skip:
                continue
            found = by_op.get(item.correlation_id)  # never 0: work launched from no op is no op's
            if found:
                spans.extend(found)
            pending.extend(item.children)
        return union_ns(spans)

    # -- one method per kind of range ---------------------------------------------------
    def walk(self, event: Range, kind: str, in_backward: bool, grad: tuple[int, None] | None = None) -> None:
        """Write ``event``'s records and its children's, in time order. ``grad``: the
        autograd node whose execution a label runs in (a hook of it)."""
        if kind == "step":
            if self.on_owner:
                self.put(event.start_time_ns, Step(event.start_time_ns))
            self.walk_children(event, in_backward)
            if self.on_owner:
                self.put(event.end_time_ns, Step(event.end_time_ns))
        elif kind == "module":
            index = int(event.name[len(MODULE_PREFIX) :])
            self.put(event.start_time_ns, Enter(event.start_time_ns, index, None, None, in_backward))
            self.depth += 1
            self.frame_first.append(len(self.records))
            self.walk_children(event, in_backward)
            self.frame_first.pop()
            self.depth -= 1
            self.put(event.end_time_ns, Exit(event.end_time_ns, index, None, None, in_backward))
        elif kind in ("part", "label"):
            if kind == "part":
                label = lkind = event.name[len(PART_PREFIX) :]
            else:
                lkind, label = label_kind(event.name)
            self.put(event.start_time_ns, LabelEnter(event.start_time_ns, label, lkind, None, None, in_backward, grad))
            self.depth += 1
            self.walk_children(event, in_backward)
            self.depth -= 1
            self.put(event.end_time_ns, LabelExit(event.end_time_ns, None, None, in_backward))
        elif kind == "backward":
            self.on_backward(event)
        elif kind == "raised":
            self.on_raised()
        elif kind == "note":
            # layerscope's own work inside the step (reading what Python knows for the
            # memory figures): a part of its own, <layerscope>, wherever it ran. A note's
            # items are kept by the window that took it; a trace file of the same
            # session has the mark without them.
            self.put(event.start_time_ns, LabelEnter(event.start_time_ns, OVERHEAD_NAME, "overhead", None, None, in_backward, grad))
            if self.detail is not None and int(event.name[len(NOTE_PREFIX) :]) < len(self.detail.notes):
                self.put(event.start_time_ns, Note(event.start_time_ns, int(event.name[len(NOTE_PREFIX) :])))  # type: ignore[arg-type]
            self.put(event.end_time_ns, LabelExit(event.end_time_ns, None, None, in_backward))
        elif kind == "memory":
            if self.detail is not None:
                self.on_memory_outside_ops(event, grad)
        elif self.on_owner:
            self.on_op(event, in_backward)

    def on_op(self, event: Range, in_backward: bool, name: str | None = None) -> None:
        """An op right inside a frame or the step. A range that is not an aten-level op
        (a custom autograd ``Function``, such as a reentrant checkpoint, or a custom op)
        can run modules, labels and collectives: those are walked, the op's own slot ends
        where they begin, and outside every frame its slots after them are its own."""
        name = event.name if name is None else name
        if self.detail is not None:
            self.emit(event, in_backward, None, name)
            return
        start = event.start_time_ns
        seq = _sequence_nr(event)
        if seq >= 0 and event.start_tid == self.owner_tid:
            self.seq_marks.append((start, seq))
        at = self.put(start, Op(start, event.end_time_ns, name, fwd_seq=seq if seq >= 0 else None, tid=event.start_tid))
        nested: list[tuple[Range, str]] = []
        frames: frozenset[int] = frozenset()
        if _may_nest(name):
            nested = _nested_frames(event)
            frames = frozenset(id(child) for child, _ in nested)
            self.inner_seq_marks(event, frames)
        if nested:
            self.replace(at, t1_ns=nested[0][0].start_time_ns)
            if self.depth == 0 and not in_backward:
                self.own_slots(event, nested)
            for child, kind in nested:
                self.walk(child, kind, in_backward)
        if self.has_device:
            # The frames nested in it hold their own kernels (a compiled region's graph
            # label, a custom Function's modules): the op's record keeps the rest.
            self.replace(at, device_time_ns=self.kernel_time(event, frames))

    def walk_children(self, event: Range, in_backward: bool) -> None:
        for child in event.children:
            name = child.name
            kind = _kind(child, name)
            if kind == "op":  # the common case, without a second read of the name
                if self.on_owner:
                    self.on_op(child, in_backward, name)
            else:
                self.walk(child, kind, in_backward)

    def on_backward(self, event: Range) -> None:
        """One autograd node's work: a backward op whose ``grad`` is the node's number.
        A checkpoint recomputing (module ranges inside) or a reentrant backward (nested
        node ranges) ends the node's own slot where the nested work begins, so no time
        is counted twice."""
        node = event.name[len(EVALUATE) :]
        seq = _sequence_nr(event)
        if seq < 0 and not node.endswith(ACCUMULATE):
            # A node with hooks (FSDP's pre-backward) leaves its evaluate range unnumbered;
            # the node's own range inside it carries the number.
            seq = next((_sequence_nr(c) for c in event.children if c.name == node), -1)
        if seq < 0 or node.endswith(ACCUMULATE):
            # No number: gradient accumulation runs right after the node that completed
            # its gradient (it has the engine's highest priority), so it belongs to the
            # module of that node.
            seq = NO_SEQ if self.last_backward_seq is None else self.last_backward_seq
        else:
            self.last_backward_seq = seq
        if self.detail is not None:
            self.emit_node(event, seq)
            return
        at = self.put(event.start_time_ns, Op(event.start_time_ns, event.end_time_ns, node, grad=(seq, None), tid=event.start_tid))
        first = len(self.records)
        nested = _nested_frames(event)
        if nested:
            self.replace(at, t1_ns=nested[0][0].start_time_ns)
            for child, kind in nested:
                if kind == "backward":
                    self.on_backward(child)
                    self.resume(child, (seq, None))
                elif kind == "comm":
                    # A collective the node's hooks started (DDP's reducer, from gradient
                    # accumulation): communication of the same node's module.
                    start = child.start_time_ns
                    op = Op(start, child.end_time_ns, child.name, grad=(seq, None), tid=child.start_tid)
                    if self.has_device:
                        op = op._replace(device_time_ns=self.kernel_time(child))
                    self.put(start, op)
                    self.resume(child, (seq, None))
                else:
                    self.walk(child, kind, True, (seq, None))
                    self.resume(child, (seq, None))
            self.node_tail(event, first, (seq, None))
        if self.has_device:
            self.own_kernels(at, event, first)

    # -- detail: ops at the dispatcher's level, with shapes, FLOPs and memory ------------
    def emit(self, event: Range, in_backward: bool, grad: tuple[int, None] | None, name: str | None = None) -> None:
        """An op range: a composite (or a range of autograd's, or a custom ``Function``)
        is opened into the ops nested in it, each counted once (a composite that
        dispatched nothing, ``aten::to`` to its own dtype, is no row, as a dispatch mode
        sees none); any other op is one record with its shapes, counts and memory. Outside every frame a composite's
        own record (nameless: no op row) keeps its time, and its parts are rows only."""
        name = event.name if name is None else name
        start = event.start_time_ns
        seq = _sequence_nr(event)
        if seq >= 0 and grad is None and event.start_tid == self.owner_tid:
            self.seq_marks.append((start, seq))
        overload = getattr(event, "overload_name", "") or ""
        if is_communication(name):
            leaf = True
        elif self.ops.is_dispatcher_op(name):
            composite = self.ops.is_composite(name, overload)
            leaf = not composite or not self.opens(event, name, overload)
        else:
            leaf = False
        if not leaf:
            at = None
            nested: list[tuple[Range, str]] = []
            if grad is None and self.depth == 0:
                # Outside every frame its own record (nameless) holds its time, and its
                # parts are rows only, charged through it. Frames and collectives nested
                # in it take their own time: its record ends where the first begins, and
                # its slots between and after them are records of their own.
                nested = _nested_frames(event)
                at = self.put(start, Op(start, nested[0][0].start_time_ns if nested else event.end_time_ns, None, tid=event.start_tid))
                self.own_slots(event, nested)
            self.emit_children(event, in_backward, grad)
            if at is not None:
                if self.has_device:
                    # Its parts' kernels and its own, not the nested frames' (which hold
                    # theirs), as the read without detail does.
                    self.replace(at, device_time_ns=self.kernel_time(event, frozenset(id(child) for child, _ in nested)))
            elif grad is None and self.has_device:
                self._own_kernels(event)
            return
        flops, macs, nbytes = self.counts(event, name, overload)[1]
        inputs = list(getattr(event.extra_fields, "inputs", ()))
        allocs = self.op_allocations(event)
        stack = self.stack_of(event)
        op = Op(
            start, event.end_time_ns, name, input_shapes(inputs) if self.ops.shapes else None, None, flops, macs, nbytes, grad,
            allocs, stack, seq if seq >= 0 and grad is None else None, event.start_tid,
        )
        if self.has_device:
            op = op._replace(device_time_ns=self.kernel_time(event))
        self.put(start, op)
        if grad is not None and is_communication(name):
            # A collective a node's hook started holds its own time; the node's resumes
            # at its end (read with detail or without, the same).
            self.resume(event, grad)

    def _own_kernels(self, event: Range) -> None:
        """The kernels an opened range launched itself, not from an op nested in it (a
        custom op's, ``vllm::moe_forward`` launching Triton kernels from Python): a
        nameless instant record carries them, so the frame it ran in holds their time
        (in backward the node's own record does)."""
        own = self.kernels_by_op.get(event.correlation_id)
        if own:
            start = event.start_time_ns
            self.put(start, Op(start, start, None, device_time_ns=union_ns(own), tid=event.start_tid))

    def on_raised(self) -> None:
        """A non-reentrant checkpoint stopped recomputing in this module's forward: it
        raises from autograd's saving of the op it is in, before that op's kernel ran
        (torch's profiler had opened its range; a dispatch mode never saw it). That op,
        its last, is no row."""
        first = self.frame_first[-1] if self.frame_first else 0
        for at in range(len(self.records) - 1, first - 1, -1):
            record = self.records[at][2]
            if type(record) in (Exit, LabelExit):
                return  # it was raised in a module inside: that one's marker handled it
            if type(record) is Op and record.name is not None and record.grad is None:
                self.replace(at, name=None, flops=None, macs=None, bytes=0)
                return

    def counts(self, event: Range, name: str, overload: str) -> tuple[Hashable | None, Counts]:
        detail = self.detail
        assert detail is not None
        return self.ops.counts(name, overload, event.extra_fields.inputs, detail.concrete.get(event.correlation_id))

    def opens(self, event: Range, name: str, overload: str) -> bool:
        """Whether a composite is read as the ops nested in it: unless they do no
        arithmetic while it counts some. A composite whose kernel does its work itself
        (``max_pool1d`` on the CPU, whose only part is an ``empty``) is one op, counted
        by its decomposition. (The parts, not the decomposition, are compared with zero:
        a fake run may take another path than the real one, ``rms_norm``'s fused op.)"""
        key, (flops, _, _) = self.counts(event, name, overload)
        cached = self.opened.get(key) if key is not None else None
        if cached is not None:
            return cached
        found = not flops or bool(self.parts_flops(event) or 0)
        if key is not None:
            self.opened[key] = found
        return found

    def parts_flops(self, event: Range) -> int | None:
        """FLOPs of the ops nested in ``event``, read as :meth:`emit` reads them."""
        total = 0
        for child in event.children:
            name = child.name
            if _kind(child, name) != "op":
                continue
            overload = getattr(child, "overload_name", "") or ""
            if self.ops.is_dispatcher_op(name) and not (
                self.ops.is_composite(name, overload) and self.opens(child, name, overload)
            ):
                flops = self.counts(child, name, overload)[1][0]
            else:
                flops = self.parts_flops(child)
            if flops is None:
                return None
            total += flops
        return total

    def emit_children(self, event: Range, in_backward: bool, grad: tuple[int, None] | None) -> None:
        for child in event.children:
            name = child.name
            kind = _kind(child, name)
            if kind == "op":
                self.emit(child, in_backward, grad, name)
            elif kind == "memory":
                self.on_memory_outside_ops(child, grad)
            elif kind == "backward":
                self.on_backward(child)
                self.resume(child, grad)
            else:
                self.walk(child, kind, in_backward if grad is None else True, grad)
                self.resume(child, grad)

    def inner_seq_marks(self, event: Range, frames: frozenset[int]) -> None:
        """Autograd's counter as the ops inside a custom ``Function`` or custom op moved
        it (outside the ``frames`` nested in it, whose ops mark their own when walked):
        read without detail the range is one record, but a node one of its ops created
        belongs to the module it ran in, as the read with detail finds."""
        pending = list(event.children)
        while pending:
            item = pending.pop()
            if id(item) in frames:
                continue
            seq = _sequence_nr(item)
            if seq >= 0 and item.start_tid == self.owner_tid:
                self.seq_marks.append((item.start_time_ns, seq))
            pending.extend(item.children)

    def own_slots(self, event: Range, nested: list[tuple[Range, str]]) -> None:
        """A range's own time between and after the frames and collectives nested in it
        (outermost, in time order), outside every frame: nameless records, so that time
        stays with the step's part the range ran in, not ``<other>``. Put before the
        nested work is read, so at equal times they come first; read with detail or
        without, the same (its first slot is its own record)."""
        if not nested:
            return
        ends = [child.end_time_ns for child, _ in nested]
        starts = [child.start_time_ns for child, _ in nested[1:]] + [event.end_time_ns]
        for t0, t1 in zip(ends, starts, strict=True):
            if t1 > t0:
                self.put(t0, Op(t0, t1, None, tid=event.start_tid))

    def own_kernels(self, at: int, event: Range, first: int) -> None:
        """The device time of node ``event``'s own record (at ``at``): its kernels less
        those the records nested in it (from ``first``: its ops, a recompute's frames, a
        collective) hold, read with detail or without, the same."""
        inner = sum((r[2].device_time_ns or 0) for r in self.records[first:] if type(r[2]) is Op)
        self.replace(at, device_time_ns=max(0, self.kernel_time(event) - inner))

    def node_tail(self, event: Range, first: int, grad: tuple[int, None]) -> None:
        """The node's own work after the last record nested in it (from ``first``): the
        engine's, or a gradient accumulation's end, is the node's slot too, a nameless
        record (read with detail or without, the same)."""
        if len(self.records) > first:
            last = max(r[2].t1_ns if type(r[2]) is Op else r[0] for r in self.records[first:])
            if last < event.end_time_ns:
                self.put(last, Op(last, event.end_time_ns, None, grad=grad, tid=event.start_tid))

    def resume(self, nested: Range, grad: tuple[int, None] | None) -> None:
        """After work nested in an autograd node (a checkpoint's recompute, a reentrant
        backward), the node's own slot resumes: a nameless instant of the node, whose slot
        runs to the next record, as an op's does. Without it the node's work after the
        nested work (restoring what the recompute changed, its own formula) fell to
        whatever came next, often ``<other>``; read with detail or without, the same."""
        if grad is not None:
            end = nested.end_time_ns
            self.put(end, Op(end, end, None, grad=grad, tid=nested.start_tid))

    def emit_node(self, event: Range, seq: int) -> None:
        """An autograd node's work (``evaluate_function``): a nameless record carrying
        the node's number holds its slot up to its first nested record; the ops inside
        (its formula's, and the engine's around it) follow, tagged with the node."""
        grad = (seq, None)
        at = self.put(event.start_time_ns, Op(event.start_time_ns, event.end_time_ns, None, grad=grad, tid=event.start_tid))
        if self.detail is not None and self.detail.notes:  # memory recorded: notes mark each step's start
            reads = _node_reads(event, event.name[len(EVALUATE) :])
            if reads:
                self.put(event.start_time_ns, Reads(event.start_time_ns, seq, reads))  # type: ignore[arg-type]
        first = len(self.records)
        self.emit_children(event, True, grad)
        if len(self.records) > first:
            self.replace(at, t1_ns=max(event.start_time_ns, min(r[0] for r in self.records[first:])))
        self.node_tail(event, first, grad)
        if self.has_device:
            self.own_kernels(at, event, first)

    def op_allocations(self, event: Range) -> tuple[tuple[int, int], ...] | None:
        """``(allocation id, bytes)`` of what the op allocated and did not free itself;
        frees of other storages during the op become ``Free`` records."""
        made: dict[int, int] = {}
        pending = list(reversed(event.children))  # in the order they happened
        while pending:
            item = pending.pop()
            if item.name == MEMORY:
                fields = item.extra_fields
                size, ident = fields.alloc_size, fields.allocation_id
                self.note_device_total(item)
                if size > 0:
                    made[ident] = size
                    self.ptr_of[ident] = fields.ptr
                elif ident in made:
                    del made[ident]  # a temporary of the op's own
                else:
                    self.put(item.start_time_ns, Free(item.start_time_ns, ident))
                    self.ptr_of.setdefault(ident, fields.ptr)
            else:
                pending.extend(reversed(item.children))
        return tuple(made.items()) or None

    def on_memory_outside_ops(self, event: Range, grad: tuple[int, None] | None) -> None:
        """An allocation or free seen in a frame or node but in no op (the autograd
        engine's buffers): a free is a ``Free``, an allocation a nameless instant op."""
        fields = event.extra_fields
        t = event.start_time_ns
        self.note_device_total(event)
        if fields.alloc_size > 0:
            self.ptr_of[fields.allocation_id] = fields.ptr
            self.put(t, Op(t, t, None, grad=grad, allocs=((fields.allocation_id, fields.alloc_size),), tid=event.start_tid))
        else:
            self.ptr_of.setdefault(fields.allocation_id, fields.ptr)
            self.put(t, Free(t, fields.allocation_id))

    def note_device_total(self, event: Range) -> None:
        fields = event.extra_fields
        device = fields.device
        if device is not None and device != "cpu":
            self.device_totals.append((event.start_time_ns, fields.total_allocated, fields.total_reserved))

    # -- the walk ---------------------------------------------------------------------
    def streams(self) -> list[list[Event]]:
        owner = next((r.start_tid for r in self.roots if r.name == STEP_NAME), None)
        if owner is None:
            return []
        self.owner_tid = owner
        steps = [(r.start_time_ns, r.end_time_ns) for r in self.roots if r.name == STEP_NAME and r.start_tid == owner]
        self.device_busy: dict[int, DeviceBusy] = {}
        if self.has_device:
            self._share_device_time(sorted(steps))
        for root in self.roots:
            tid = root.start_tid
            self.on_owner = tid == owner
            kind = _kind(root)
            if self.on_owner:
                self.walk(root, kind, False)
            elif kind == "backward" and any(s <= root.start_time_ns <= e for s, e in steps):
                # Autograd's device thread, backward of a step: all its work in the node
                # counts (a checkpoint's recompute runs its ops there).
                self.on_owner = True
                self.on_backward(root)
            elif is_communication(root.name) and any(root.start_time_ns < e and s < root.end_time_ns for s, e in steps):
                # A collective running on the process group's own thread (gloo's worker).
                self.put(root.start_time_ns, Collective(root.start_time_ns, root.end_time_ns, root.name))
            # anything else on another thread is not the profiled block's work
        self.records.sort(key=lambda r: (r[0], r[1]))
        self.seq_marks.sort()
        return self._split()

    def _share_device_time(self, steps: list[tuple[int, int]]) -> None:
        """Each step's device work as a :class:`DeviceBusy`, by the step's start, and each
        op's kernels as the pieces of time they hold alone (``kernels_by_op``), so the ops'
        device times add up to no more than the step's busy time: see :func:`share_device_time`."""
        self.device_busy, self.kernels_by_op = share_device_time(self.kernels, steps, launch_times(self.roots))

    def _split(self) -> list[list[Event]]:
        """Per step, with autograd's counter filled in at frame boundaries."""
        times = [t for t, _ in self.seq_marks]
        values = [s for _, s in self.seq_marks]

        def seq_at(t_ns: int) -> int | None:
            at = bisect_left(times, t_ns)
            return values[at] if at < len(values) else None

        streams: list[list[Event]] = []
        current: list[Event] | None = None
        memory = StepMemory(self.ptr_of, self.detail.notes if self.detail is not None else [])
        step_start = 0
        for t_ns, _, record in self.records:
            if isinstance(record, Step):
                if current is None:
                    current = [record]
                    memory.new_step()
                    step_start = t_ns
                else:
                    current.extend(self._device_peak(step_start, t_ns))
                    busy = self.device_busy.get(step_start)
                    if busy is not None:
                        current.append(busy)
                    current.append(record)
                    streams.append(current)
                    current = None
                continue
            resolved = memory.see(record)
            if current is None:
                continue
            if isinstance(record, (Enter, Exit, LabelEnter, LabelExit)):
                record = record._replace(seq=seq_at(t_ns))
                current.append(record)
            elif resolved is None:
                current.append(record)
            else:
                current.extend(resolved)
        return streams

    def _device_peak(self, t0: int, t1: int) -> list[Event]:
        """The accelerator allocator's highest total during the step (and reserved then):
        the totals in time order, found by bisection, so each step reads its own only."""
        totals = self.device_totals
        if not self._totals_sorted:
            totals.sort()
            self._totals_sorted = True
        lo = bisect_left(totals, (t0, -1, -1))
        hi = bisect_left(totals, (t1 + 1, -1, -1))
        if lo >= hi:
            return []
        allocated, reserved = max((alloc, reserved) for _, alloc, reserved in totals[lo:hi])
        return [DeviceMem(allocated_peak_bytes=allocated, reserved_at_peak_bytes=reserved)]



def _node_reads(event: Range, node: str) -> tuple[int, ...]:
    """Allocation ids of the tensors the ops under an autograd node's range read, less
    the gradients the node was given (the inputs of its own range, ``node``). Module
    frames (a checkpoint recomputing) and nested nodes are not read."""
    given: set[int] = set()
    read: dict[int, None] = {}
    pending = list(event.children)
    for child in pending:
        if child.name == node:
            given.update(_allocation_ids(child))
    while pending:
        item = pending.pop()
        name = item.name
        if name == MEMORY or _kind(item, name) != "op":
            continue
        read.update(dict.fromkeys(_allocation_ids(item)))
        pending.extend(item.children)
    return tuple(ident for ident in read if ident not in given)


def _allocation_ids(event: Range) -> list[int]:
    """The allocation ids of an op's recorded tensor inputs (lists of tensors too)."""
    found: list[int] = []
    for value in getattr(event.extra_fields, "inputs", ()):
        for item in value if isinstance(value, list) else (value,):
            ident = getattr(item, "allocation_id", None)
            if type(ident) is int:
                found.append(ident)
    return found


def _may_nest(name: str) -> bool:
    """Whether an op may hold frames or collectives of its own, to be read into: a range
    that is no namespaced op (a custom ``Function``) or a custom op outside aten
    (``vllm::all_reduce`` around ``symm_mem::multimem_all_reduce_``), unless it is a
    collective itself. aten's ops are most of the events, and never do. (Read with
    torch's catalog, an op is opened when torch's registry lacks it instead.)"""
    if "::" not in name:
        return True
    return not name.startswith("aten::") and not is_communication(name)


def _nested_frames(event: Range) -> list[tuple[Range, str]]:
    """Module, label and node ranges and collectives under a backward node, a custom
    ``Function`` or a custom op, outermost only. aten's ops (``aten::mm``) never run
    modules, so their subtrees (most of the events) are not read (:func:`_may_nest`)."""
    found: list[tuple[Range, str]] = []
    pending = list(reversed(event.children))
    while pending:
        item = pending.pop()
        name = item.name
        kind = _kind(item, name)
        if kind in ("module", "label", "part", "backward"):
            found.append((item, kind))
        elif is_communication(name):
            found.append((item, "comm"))
        elif not op_like(name) or _may_nest(name):
            pending.extend(reversed(item.children))
    return found
