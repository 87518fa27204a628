"""Capture through torch's own profiler (Kineto): the run a user is shown as time, and
in a *detailed* window also its ops, shapes, FLOPs and memory, from the same run.

What runs while the user's code is timed is no heavier than ``torch.profiler``:

- torch's C++ observers record every op (a detailed window: with input shapes, overload
  names and, with memory, every allocation and free; with ``with_stack`` torch's
  Python tracer);
- two global module hooks open and close a ``_RecordFunctionFast`` range per module
  call (about a microsecond each), so modules are ranges on the same clock as the ops;
- a range around each step or pass, and around the parts layerscope runs itself (the
  loss of ``profile``).

Nothing Python runs per op (a detailed window adds Python per step, per optimizer step
and once per forward of the model: ``KinetoWindow``). The profiler is stopped once per
*window* (a cycle's steps, or a bounded number of them), after the steps' work, and its events are read
back once (``_ProfilerResult.events()``, never torch's ``FunctionEvent`` path) and
turned into the same typed records (``layerscope.raw``) the dispatch backend writes:
``Step``, ``Enter``/``Exit``, ``LabelEnter``/``LabelExit`` and ``Op``. The walker in
``layerscope.attribute`` attributes both the same way.

How the records are derived (``convert``):

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
  inline, glue), become forward ``Op`` records with their time and, on CUDA, their
  kernels' device time: the union of the intervals of the kernels launched from the op
  or the ops under it (a kernel's ``linked_correlation_id`` is its launching op's
  ``correlation_id``), so kernels overlapping on two streams are not counted twice. In
  a detailed window ops are read down to the dispatcher's level, with their shapes,
  counts and memory (``_Converter.emit``; docs/design.md, "Detail from torch's events").
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import tempfile
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from layerscope.capture import _torch, op_args
from layerscope.capture._torch import graph_task_id as _graph_task
from layerscope.capture._torch import next_sequence_nr as _next_seq
from layerscope.capture.inputs import shapes_of
from layerscope.capture.memory import (
    optimizer_hooks,
    optimizer_state_bytes,
    optimizer_state_tensors,
    saved_storages,
    tensors_in,
)
from layerscope.capture.recorder import label_kind
from layerscope.capture.torch_events import read_window
from layerscope.capture.window import (
    MEMORY,
    USER_SCOPE,
    Detail,
    KernelSpan,
    Range,
    WindowCapture,
    op_like,
)
from layerscope.comm import is_communication, is_communication_kernel
from layerscope.errors import ProfilerStateError
from layerscope.intervals import merged, union_ns
from layerscope.raw import (
    NO_SEQ,
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
    Op,
    Optim,
    Saved,
    Step,
)

MODULE_PREFIX = "layerscope.module#"
PART_PREFIX = "layerscope.part#"
STEP_NAME = "layerscope.step"
#: A zero-length range marking when a note of layerscope's (memory live before the step,
#: activations saved by a forward, optimizer state) was taken: ``layerscope.note#K``.
NOTE_PREFIX = "layerscope.note#"
#: The step part holding layerscope's own work inside a step (its notes): ``<layerscope>``.
OVERHEAD_NAME = "layerscope"
#: A zero-length range marking that a checkpoint stopped recomputing in a module's
#: forward (in a detailed window).
RAISED_NAME = "layerscope.raised"
_EVALUATE = "autograd::engine::evaluate_function: "
_ACCUMULATE = "torch::autograd::AccumulateGrad"

_Range = _torch.FastRange

#: A line of torch's profiler backend's own log (Kineto's), as it starts and stops:
#: ``USDT:2026-11-26 15:00:00 2127:2127 SyncActivityProfilerHandler.cpp:52] profiler_start``;
#: and the one it writes as it is first started in a thread other than the one that
#: imported torch (``ERROR: External init callback must run in same thread as
#: registerClient (5 != 3)``): it skips torch's client's ``init()`` then, which is empty.
#: And the CPU allocator's warning as a block it did not see allocated is freed while
#: memory is profiled (:func:`spend_unknown_block_warning`): ``[W1127 05:56:06.114684318
#: CPUAllocator.cpp:245] Memory block of unknown size was allocated before the profiling
#: started, profiler results will not include the deallocation event``.
_BACKEND_LINE = re.compile(
    rb"(?:USDT|STAGE):\d{4}-\d\d-\d\d [^\n]*?\w+\.cpp:\d+\] "
    rb"|ERROR: External init callback must run in same thread as registerClient \(-?\d+ != -?\d+\)$"
    rb"|\[W\d+ [\d:.]+ \w+\.cpp:\d+\] Memory block of unknown size was allocated before the profiling started"
)


@contextmanager
def quiet_fd2() -> Iterator[None]:
    """For the duration, torch's profiler backend's own lines kept off file descriptor
    2 (C++ writes there directly, past ``sys.stderr``); every other line written there
    meanwhile (by another thread) is passed on as the duration ends."""
    sys.stderr.flush()
    saved = os.dup(2)
    sink = tempfile.TemporaryFile()
    try:
        os.dup2(sink.fileno(), 2)
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        # What was written so far goes out before descriptor 2 is given back, so that
        # a thread's later lines follow its earlier ones; the few written in between
        # follow at once.
        read = _pass_on(sink.fileno(), 0, saved)
        os.dup2(saved, 2)
        os.close(saved)
        _pass_on(sink.fileno(), read, 2)
        sink.close()


def _pass_on(sink: int, start: int, fd: int) -> int:
    """The lines written into ``sink`` from offset ``start`` on, less the backend's, to
    ``fd``; the offset read up to. (``pread``: descriptor 2 shares the sink's offset.)"""
    data = b""
    while chunk := os.pread(sink, 1 << 16, start + len(data)):
        data += chunk
    kept = b"".join(line for line in data.splitlines(keepends=True) if not _BACKEND_LINE.match(line))
    while kept:
        kept = kept[os.write(fd, kept) :]
    return start + len(data)


class _UnknownBlockWarning:
    """The CPU allocator's warning that a block allocated before memory profiling began
    was freed while it runs, spent once per process where it is kept off stderr.

    torch writes it from C++ the first time such a block is freed and every 1000th time
    after (one counter for the process), and a step frees one as soon as it drops a
    gradient or a batch made before the block: every ``Profiler`` block printed it, in
    the middle of the user's own code. Freeing a block of our own just after memory
    profiling is enabled, inside :func:`quiet_profiler`, makes that first time ours; what
    the profile records is unchanged (torch reports no event for such a free)."""

    def __init__(self) -> None:
        self.spent = False
        self._block: torch.Tensor | None = None

    def before(self) -> None:
        """Allocate the block, before profiling starts (unless the warning is spent)."""
        if not self.spent:
            self._block = torch.empty(1)

    def after(self) -> None:
        """Free it, now that profiling runs (inside :func:`quiet_profiler`)."""
        if self._block is not None:
            self._block = None  # the only reference: freed here
            self.spent = True


_UNKNOWN_BLOCK = _UnknownBlockWarning()


def quiet_profiler() -> AbstractContextManager[None]:
    """Around starting or stopping torch's profiler: its backend's log lines kept off
    stderr (:func:`quiet_fd2`), unless ``layerscope.capture.QUIET_PROFILER`` is off."""
    import layerscope.capture

    return quiet_fd2() if layerscope.capture.QUIET_PROFILER else nullcontext()


def available() -> bool:
    """Whether the Kineto capture can run in this thread: no other profiler (a user's
    ``torch.profiler``, or a layerscope block's) is running in it, since only one can.
    Another thread's layerscope session is kept off by :func:`profiler_session`, which
    a caller holds first. A torch without what it needs raises ``MissingTorchAPI``
    naming it."""
    return _torch.profiler_free()


class _Claim:
    """torch's profiler, held by one layerscope session at a time in the process.

    Kineto runs one session per process: two threads' sessions interleaving (one
    preparing while the other runs or stops) crash the process. A session holds this
    from before torch's profiler is prepared until after it is disabled and its result
    read. The holding thread may take it again (a session's windows inside it, a
    ``profile()`` inside a ``Profiler`` block); another thread waits while a *bounded*
    session holds it (a ``profile()`` call), and is told no at once while a ``Profiler``
    block does (it may run for a whole training loop)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._thread: int | None = None
        self._depth = 0
        self._bounded = True

    def take(self, *, bounded: bool) -> bool:
        me = threading.get_ident()
        with self._changed:
            while self._thread is not None and self._thread != me:
                if not self._bounded:
                    return False
                self._changed.wait()
            if self._thread is None:
                self._thread, self._bounded = me, bounded
            self._depth += 1
            return True

    def give(self) -> None:
        with self._changed:
            self._depth -= 1
            if not self._depth:
                self._thread = None
                self._changed.notify_all()

    def after_fork(self) -> None:
        # A forked child has the forking thread alone: a claim another thread held is gone.
        self._changed = threading.Condition()
        if self._thread != threading.get_ident():
            self._thread, self._depth, self._bounded = None, 0, True


_CLAIM = _Claim()
os.register_at_fork(after_in_child=_CLAIM.after_fork)


@contextmanager
def profiler_session(*, bounded: bool) -> Iterator[bool]:
    """Around a layerscope session that may start torch's profiler: whether it holds it
    (:class:`_Claim`). ``bounded`` (``profile()``) waits for another thread's bounded
    session to end; a session of a ``Profiler`` block in another thread yields False,
    and the caller records without torch's profiler, as inside a user's own."""
    if not _CLAIM.take(bounded=bounded):
        yield False
        return
    try:
        yield True
    finally:
        _CLAIM.give()


@contextmanager
def profiler_held() -> Iterator[None]:
    """Around one start-to-read of torch's profiler: inside the thread's own session,
    or waiting for another thread's bounded one; refused while another thread's
    ``Profiler`` block holds it."""
    with profiler_session(bounded=True) as held:
        if not held:
            raise ProfilerStateError(
                "torch's profiler is held by a layerscope.Profiler block in another thread, and a process runs "
                "one session of it at a time: profile after that block ends"
            )
        yield


def _sequence_nr(event: Any) -> int:
    return getattr(event.extra_fields, "sequence_number", -1)


def _kind(event: Any, name: str | None = None) -> str:
    """What a range is, from its name (read once: every read is a call into C++). A
    namespaced name (``aten::mm``) is an op without looking further."""
    if name is None:
        name = event.name
    if "::" in name and not name.startswith(_EVALUATE) and op_like(name):
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
    if name.startswith(_EVALUATE):
        return "backward"
    if is_communication(name):
        return "op"  # a process group's range around a collective (gloo:all_reduce)
    if getattr(event.extra_fields, "scope", None) == USER_SCOPE:
        return "label"
    return "op"


def convert(
    roots: list[Any], kernels: list[KernelSpan] = (), *, has_device: bool = False, detail: Detail | None = None  # type: ignore[assignment]
) -> list[list[Event]]:
    """The window's ranges (the roots of each thread's tree, :class:`Range` or the
    profiler's events) as one typed stream per step (``Step`` ... ``Step``). With
    ``detail`` (a window recording shapes and memory), ops are read down to the level a
    dispatch mode sees (composites opened into their parts), each with its input shapes,
    FLOPs, MACs and bytes (``op_args``), the storages it allocated and those freed."""
    return _Converter(roots, kernels, has_device, detail).streams()


def convert_window(window: WindowCapture) -> list[list[Event]]:
    """:func:`convert` of one recorded window (live, or read back from a file)."""
    return convert(window.roots, window.kernels, has_device=window.has_device, detail=window.detail)


class _Converter:
    """Turns one window's range trees and kernels into typed records, one method per
    kind of range.

    The owner thread is the one whose ranges mark the steps; another thread's work
    counts only inside a backward (``evaluate_function``) range that ran during one of
    the owner's steps (autograd's device threads), and nowhere else. In a timing window
    ops are read one level deep (the ones directly in a frame or step), below that only
    on a device, for their kernels; in a detailed window down to the level a dispatch
    mode sees (``emit``)."""

    def __init__(self, roots: list[Any], kernels: list[KernelSpan], has_device: bool, detail: Detail | None = None) -> None:
        self.has_device = has_device
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
        self.records[at] = (t_ns, order, record._replace(**fields))  # type: ignore[union-attr]

    def kernel_time(self, event: Range) -> int:
        """Device time of the kernels launched from ``event`` or any op under it: looked
        up by the id torch links them with, which op ranges alone carry (0 elsewhere:
        an allocation, a module or step range)."""
        spans: list[tuple[int, int]] = []
        by_op = self.kernels_by_op
        pending = [event]
        while pending:
            item = pending.pop()
            found = by_op.get(item.correlation_id)  # never 0: work launched from no op is no op's
            if found:
                spans.extend(found)
            pending.extend(item.children)
        return union_ns(spans)

    # -- one method per kind of range ---------------------------------------------------
    def walk(self, event: Any, kind: str, in_backward: bool, grad: tuple[int, None] | None = None) -> None:
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
                self.put(event.start_time_ns, _Note(event.start_time_ns, int(event.name[len(NOTE_PREFIX) :])))  # type: ignore[arg-type]
            self.put(event.end_time_ns, LabelExit(event.end_time_ns, None, None, in_backward))
        elif kind == "memory":
            if self.detail is not None:
                self.on_memory_outside_ops(event, grad)
        elif self.on_owner:
            self.on_op(event, in_backward)

    def on_op(self, event: Any, in_backward: bool, name: str | None = None) -> None:
        """An op right inside a frame or the step. A range that is not an aten-level op
        (a custom autograd ``Function``, such as a reentrant checkpoint) can run modules:
        those are walked, and the op's own slot ends where they begin."""
        name = event.name if name is None else name
        if self.detail is not None:
            self.emit(event, in_backward, None, name)
            return
        start = event.start_time_ns
        seq = _sequence_nr(event)
        if seq >= 0 and event.start_tid == self.owner_tid:
            self.seq_marks.append((start, seq))
        at = self.put(start, Op(start, event.end_time_ns, name, fwd_seq=seq if seq >= 0 else None, tid=event.start_tid))
        if "::" not in name:
            nested = _nested_frames(event)
            if nested:
                self.replace(at, t1_ns=nested[0][0].start_time_ns)
                for child, kind in nested:
                    self.walk(child, kind, in_backward)
        if self.has_device:
            self.replace(at, device_time_ns=self.kernel_time(event))

    def walk_children(self, event: Any, in_backward: bool) -> None:
        for child in event.children:
            name = child.name
            kind = _kind(child, name)
            if kind == "op":  # the common case, without a second read of the name
                if self.on_owner:
                    self.on_op(child, in_backward, name)
            else:
                self.walk(child, kind, in_backward)

    def on_backward(self, event: Any) -> None:
        """One autograd node's work: a backward op whose ``grad`` is the node's number.
        A checkpoint recomputing (module ranges inside) or a reentrant backward (nested
        node ranges) ends the node's own slot where the nested work begins, so no time
        is counted twice."""
        node = event.name[len(_EVALUATE) :]
        seq = _sequence_nr(event)
        if seq < 0 and not node.endswith(_ACCUMULATE):
            # A node with hooks (FSDP's pre-backward) leaves its evaluate range unnumbered;
            # the node's own range inside it carries the number.
            seq = next((_sequence_nr(c) for c in event.children if c.name == node), -1)
        if seq < 0 or node.endswith(_ACCUMULATE):
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
        nested = _nested_frames(event)
        if nested:
            self.replace(at, t1_ns=nested[0][0].start_time_ns)
            for child, kind in nested:
                if kind == "backward":
                    self.on_backward(child)
                elif kind == "comm":
                    # A collective the node's hooks started (DDP's reducer, from gradient
                    # accumulation): communication of the same node's module.
                    start = child.start_time_ns
                    op = Op(start, child.end_time_ns, child.name, grad=(seq, None), tid=child.start_tid)
                    if self.has_device:
                        op = op._replace(device_time_ns=self.kernel_time(child))
                    self.put(start, op)
                else:
                    self.walk(child, kind, True, (seq, None))
        if self.has_device:
            self.replace(at, device_time_ns=self.kernel_time(event))

    # -- detail: ops at the dispatcher's level, with shapes, FLOPs and memory ------------
    def emit(self, event: Any, in_backward: bool, grad: tuple[int, None] | None, name: str | None = None) -> None:
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
        elif op_args.is_dispatcher_op(name):
            leaf = op_args.is_composite(name, overload) and not self.opens(event, name, overload)
            leaf = leaf or not op_args.is_composite(name, overload)
        else:
            leaf = False
        if not leaf:
            at = None
            if grad is None and self.depth == 0:
                at = self.put(start, Op(start, event.end_time_ns, None, tid=event.start_tid))  # type: ignore[arg-type]
            first = len(self.records)
            self.emit_children(event, in_backward, grad)
            if at is not None:
                # Frames nested in it (a custom Function running modules) take their own
                # time: the record's ends where the first begins. Otherwise it holds the
                # kernels of its parts too (its parts are rows only, charged through it).
                frames = [r[0] for r in self.records[first:] if type(r[2]) in (Enter, LabelEnter)]
                if frames:
                    self.replace(at, t1_ns=min(frames))
                elif self.has_device:
                    self.replace(at, device_time_ns=self.kernel_time(event))
            elif grad is None and self.has_device:
                self._own_kernels(event)
            return
        flops, macs, nbytes = self.counts(event, name, overload)[2]
        inputs = list(getattr(event.extra_fields, "inputs", ()))
        allocs = self.op_allocations(event)
        stack = self.stack_of(event)
        op = Op(
            start, event.end_time_ns, name, op_args.input_shapes(inputs), None, flops, macs, nbytes, grad,
            allocs, stack, seq if seq >= 0 and grad is None else None, event.start_tid,
        )
        if self.has_device:
            op = op._replace(device_time_ns=self.kernel_time(event))
        self.put(start, op)

    def _own_kernels(self, event: Any) -> None:
        """The kernels an opened range launched itself, not from an op nested in it (a
        custom op's, ``vllm::moe_forward`` launching Triton kernels from Python): a
        nameless instant record carries them, so the frame it ran in holds their time
        (in backward the node's own record does)."""
        own = self.kernels_by_op.get(event.correlation_id)
        if own:
            start = event.start_time_ns
            self.put(start, Op(start, start, None, device_time_ns=union_ns(own), tid=event.start_tid))  # type: ignore[arg-type]

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

    def counts(self, event: Any, name: str, overload: str) -> tuple[Any, ...]:
        detail = self.detail
        assert detail is not None
        inputs = list(getattr(event.extra_fields, "inputs", ()))
        key, values = op_args.recorded_call(name, overload, inputs, detail.concrete.get(event.correlation_id))
        return key, values, op_args.count_call(key, name, overload, values)

    def opens(self, event: Any, name: str, overload: str) -> bool:
        """Whether a composite is read as the ops nested in it: unless they do no
        arithmetic while it counts some. A composite whose kernel does its work itself
        (``max_pool1d`` on the CPU, whose only part is an ``empty``) is one op, counted
        by its decomposition. (The parts, not the decomposition, are compared with zero:
        a fake run may take another path than the real one, ``rms_norm``'s fused op.)"""
        key, _, (flops, _, _) = self.counts(event, name, overload)
        cached = self.opened.get(key) if key is not None else None
        if cached is not None:
            return cached
        found = not flops or bool(self.parts_flops(event) or 0)
        if key is not None:
            self.opened[key] = found
        return found

    def parts_flops(self, event: Any) -> int | None:
        """FLOPs of the ops nested in ``event``, read as :meth:`emit` reads them."""
        total = 0
        for child in event.children:
            name = child.name
            if _kind(child, name) != "op":
                continue
            overload = getattr(child, "overload_name", "") or ""
            if op_args.is_dispatcher_op(name) and not (
                op_args.is_composite(name, overload) and self.opens(child, name, overload)
            ):
                flops = self.counts(child, name, overload)[2][0]
            else:
                flops = self.parts_flops(child)
            if flops is None:
                return None
            total += flops
        return total

    def emit_children(self, event: Any, in_backward: bool, grad: tuple[int, None] | None) -> None:
        for child in event.children:
            name = child.name
            kind = _kind(child, name)
            if kind == "op":
                self.emit(child, in_backward, grad, name)
            elif kind == "memory":
                self.on_memory_outside_ops(child, grad)
            elif kind == "backward":
                self.on_backward(child)
            else:
                self.walk(child, kind, in_backward if grad is None else True, grad)

    def emit_node(self, event: Any, seq: int) -> None:
        """An autograd node's work (``evaluate_function``): a nameless record carrying
        the node's number holds its slot up to its first nested record; the ops inside
        (its formula's, and the engine's around it) follow, tagged with the node."""
        grad = (seq, None)
        at = self.put(event.start_time_ns, Op(event.start_time_ns, event.end_time_ns, None, grad=grad, tid=event.start_tid))  # type: ignore[arg-type]
        if self.detail is not None and self.detail.notes:  # memory recorded: notes mark each step's start
            reads = _node_reads(event, event.name[len(_EVALUATE) :])
            if reads:
                self.put(event.start_time_ns, _Reads(event.start_time_ns, seq, reads))  # type: ignore[arg-type]
        first = len(self.records)
        self.emit_children(event, True, grad)
        if len(self.records) > first:
            self.replace(at, t1_ns=max(event.start_time_ns, min(r[0] for r in self.records[first:])))
        if self.has_device:
            nested = sum((r[2].device_time_ns or 0) for r in self.records[first:] if type(r[2]) is Op)
            self.replace(at, device_time_ns=max(0, self.kernel_time(event) - nested))

    def op_allocations(self, event: Any) -> tuple[tuple[int, int], ...] | None:
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

    def on_memory_outside_ops(self, event: Any, grad: tuple[int, None] | None) -> None:
        """An allocation or free seen in a frame or node but in no op (the autograd
        engine's buffers): a free is a ``Free``, an allocation a nameless instant op."""
        fields = event.extra_fields
        t = event.start_time_ns
        self.note_device_total(event)
        if fields.alloc_size > 0:
            self.ptr_of[fields.allocation_id] = fields.ptr
            self.put(t, Op(t, t, None, grad=grad, allocs=((fields.allocation_id, fields.alloc_size),), tid=event.start_tid))  # type: ignore[arg-type]
        else:
            self.ptr_of.setdefault(fields.allocation_id, fields.ptr)
            self.put(t, Free(t, fields.allocation_id))

    def note_device_total(self, event: Any) -> None:
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
        self.device_busy, self.kernels_by_op = share_device_time(self.kernels, steps, _launch_times(self.roots))

    def _split(self) -> list[list[Event]]:
        """Per step, with autograd's counter filled in at frame boundaries."""
        times = [t for t, _ in self.seq_marks]
        values = [s for _, s in self.seq_marks]

        def seq_at(t_ns: int) -> int | None:
            at = bisect_left(times, t_ns)
            return values[at] if at < len(values) else None

        streams: list[list[Event]] = []
        current: list[Event] | None = None
        memory = _StepMemory(self.ptr_of, self.detail.notes if self.detail is not None else [])
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


def _launch_times(roots: list[Any]) -> dict[int, int]:
    """When each range of the window began, by its correlation id: the launch of the
    kernels linked to it."""
    out: dict[int, int] = {}
    pending = list(roots)
    while pending:
        item = pending.pop()
        if item.correlation_id:
            out[item.correlation_id] = item.start_time_ns
        pending.extend(item.children)
    return out


def kernel_steps(kernels: list[KernelSpan], steps: list[tuple[int, int]], launched: dict[int, int]) -> list[int | None]:
    """The step (an index into ``steps``, sorted host windows) each kernel belongs to, or
    None. A kernel is its launch's: the step whose window holds the start of the op range
    that launched it, whole, however long after the step it ran (a kernel never straddles
    two steps). Work launched from no op range known (link 0) belongs to the step whose
    window holds its own start on the device, or, in a gap, to the step before the gap."""
    starts = [s for s, _ in steps]
    out: list[int | None] = []
    for k in kernels:
        link = k.linked_correlation_id
        at: int | None
        if link > 0:
            t = launched.get(link)
            at = None if t is None else bisect_right(starts, t) - 1
            if at is not None and (at < 0 or t is None or t > steps[at][1]):
                at = None
        else:
            at = bisect_right(starts, k.start_ns) - 1
            if at < 0 or (at == len(steps) - 1 and k.start_ns > steps[at][1]):
                at = None
        out.append(at)
    return out


def share_device_time(
    kernels: list[KernelSpan], steps: list[tuple[int, int]], launched: dict[int, int]
) -> tuple[dict[int, DeviceBusy], dict[int, list[tuple[int, int]]]]:
    """Each step's :class:`DeviceBusy` by the step's start, and the pieces of time the
    kernels of each op (by correlation id) hold alone.

    Every instant the steps' device work ran is given to one kernel, so nothing is
    counted twice when streams overlap, within a step or across two: compute work before
    a collective's kernel (communication that overlaps compute is shown as overlap,
    never as a module's time), then the kernel that started first. A step's busy time is
    what its own kernels (:func:`kernel_steps`) hold, so the steps add up to the union of
    their work. A collective's kernels are never an op's (their time is the step's
    communication); compute work launched from no op range is ``unlinked_ns``. Work in
    no step is in neither."""
    at_step = kernel_steps(kernels, steps, launched)
    compute = sorted(
        (k.start_ns, k.end_ns, k.linked_correlation_id, at)
        for k, at in zip(kernels, at_step)
        if at is not None and not is_communication_kernel(k.name)
    )
    comm = sorted(
        (k.start_ns, k.end_ns, at) for k, at in zip(kernels, at_step) if at is not None and is_communication_kernel(k.name)
    )
    figures = {at: [0, 0, 0, 0] for at in range(len(steps))}  # compute, comm, comm alone, unlinked
    pieces: dict[int, list[tuple[int, int]]] = {}
    reach: int | None = None
    for start, end, link, at in compute:
        begin = start if reach is None else max(start, reach)
        if end > begin:
            figures[at][0] += end - begin
            if link > 0:
                pieces.setdefault(link, []).append((begin, end))
            else:
                figures[at][3] += end - begin
        reach = end if reach is None else max(reach, end)
    busy_compute = merged((s, e) for s, e, _, _ in compute)
    ends = [e for _, e in busy_compute]
    reach = None
    for start, end, at in comm:
        begin = start if reach is None else max(start, reach)
        if end > begin:
            figures[at][1] += end - begin
            figures[at][2] += (end - begin) - _covered(busy_compute, ends, begin, end)
        reach = end if reach is None else max(reach, end)
    busy: dict[int, DeviceBusy] = {}
    for at, (start, _) in enumerate(steps):
        compute_ns, comm_ns, alone, unlinked = figures[at]
        busy[start] = DeviceBusy(compute_ns + alone, compute_ns, comm_ns, comm_ns - alone, unlinked)
    return busy, pieces


def _covered(spans: list[tuple[int, int]], ends: list[int], start: int, end: int) -> int:
    """How much of ``[start, end)`` the merged ``spans`` (``ends``: their ends) cover."""
    total = 0
    at = bisect_right(ends, start)
    while at < len(spans) and spans[at][0] < end:
        total += max(0, min(end, spans[at][1]) - max(start, spans[at][0]))
        at += 1
    return total


class _Note(NamedTuple):
    """Where note ``index`` of the window was taken (a ``layerscope.note#K`` range)."""

    t_ns: int
    index: int


class _Reads(NamedTuple):
    """The allocations (ids) that the ops of autograd node ``seq``'s work read, less the
    gradients the node was given."""

    t_ns: int
    seq: int
    ids: tuple[int, ...]


class _StepMemory:
    """Storages by address while the records are read in time order: allocations'
    ids become the serials of this step's storages, memory that was live before the
    step (adopted by address in a note) gets serial ``-address``, and notes become
    ``Adopt``, ``Saved``, ``Grad`` and ``Optim`` records.

    What the model's forward saved is read from the autograd graph at its exit (a
    note). Nodes made outside it (a loss written inline) are read by no Python moment
    before their backward releases what they saved, so for them the events stand in:
    a storage allocated by a forward op of the step and read by such a node's ops
    (``_Reads``) was saved by it, as autograd's formulas read only what they saved and
    the gradients they are given."""

    def __init__(self, ptr_of: dict[int, int], notes: list[list[tuple[Any, ...]]]) -> None:
        self.ptr_of = ptr_of
        self.notes = notes
        self.live: dict[int, int] = {}  # address -> allocation id
        self.step: set[int] = set()
        #: This step's storages allocated by forward ops (not by backward's).
        self.forward_made: set[int] = set()
        #: The autograd numbers each forward of the model took this step: ``[since, until)``.
        self.forwards: list[tuple[int, int]] = []

    def new_step(self) -> None:
        self.step = set()
        self.forward_made = set()
        self.forwards = []

    def serial(self, ptr: int) -> int | None:
        """This step's storage at ``ptr``; None if it was live before the step."""
        found = self.live.get(ptr)
        return found if found in self.step else None

    def see(self, record: Any) -> list[Event] | None:
        """Note what ``record`` does to the storages; what stands in its place, if not itself."""
        kind = type(record)
        if kind is Op and record.allocs:
            for serial, _ in record.allocs:
                self.live[self.ptr_of[serial]] = serial
                self.step.add(serial)
                if record.grad is None:
                    self.forward_made.add(serial)
        elif kind is Free:
            ptr = self.ptr_of.get(record.serial, 0)
            if self.live.get(ptr) == record.serial:
                del self.live[ptr]
            if record.serial not in self.step:
                return [record._replace(serial=-ptr)]  # memory adopted by address, if it was
        elif kind is _Note:
            return self.resolve(record)
        elif kind is _Reads:
            return self.saved_outside(record)
        return None

    def saved_outside(self, reads: _Reads) -> list[Event]:
        """``Saved`` for what a node made outside the model's forwards read: storages of
        the step's forward still live (the model's own nodes were read at its exit)."""
        if reads.seq == NO_SEQ or any(since <= reads.seq < until for since, until in self.forwards):
            return []
        out: list[Event] = []
        for serial in reads.ids:
            if serial in self.forward_made and self.live.get(self.ptr_of.get(serial, 0)) == serial:
                out.append(Saved(serial))
        return out

    def resolve(self, note: _Note) -> list[Event]:
        out: list[Event] = []
        t = note.t_ns
        for item in self.notes[note.index]:
            what = item[0]
            if what == "adopt":  # ("adopt", ptr, nbytes, category, since_start, device type)
                _, ptr, nbytes, category, since_start, device = item
                if self.serial(ptr) is None:
                    out.append(Adopt(t, -ptr, held_bytes(nbytes, device), category, since_start))
            elif what == "constant":  # ("constant", [(nbytes, device type), ...], category)
                out.append(Adopt(t, None, sum(held_bytes(n, device) for n, device in item[1]), item[2], True))
            elif what == "saved":  # ("saved", ptrs)
                for ptr in item[1]:
                    serial = self.serial(ptr)
                    if serial is not None:
                        out.append(Saved(serial))
            elif what == "forward":  # ("forward", since, until): the numbers its nodes took
                self.forwards.append((item[1], item[2]))
            elif what == "grad":  # ("grad", ptr, owner, nbytes)
                _, ptr, owner, nbytes = item
                serial = self.serial(ptr)
                out.append(Grad(t, owner, nbytes, serial if serial is not None else -ptr))
            elif what == "optim":  # ("optim", name, bytes by key, ident)
                out.append(Optim(t, item[1], item[2], item[3]))
        return out


def _node_reads(event: Any, node: str) -> tuple[int, ...]:
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


def _allocation_ids(event: Any) -> list[int]:
    """The allocation ids of an op's recorded tensor inputs (lists of tensors too)."""
    found: list[int] = []
    for value in getattr(event.extra_fields, "inputs", ()):
        for item in value if isinstance(value, list) else (value,):
            ident = getattr(item, "allocation_id", None)
            if type(ident) is int:
                found.append(ident)
    return found


def _nested_frames(event: Any) -> list[tuple[Any, str]]:
    """Module, label and node ranges and collectives under a backward node or a custom
    ``Function``, outermost only. Namespaced ops (``aten::mm``) never run modules, so their subtrees
    (most of the events) are not read."""
    found: list[tuple[Any, str]] = []
    pending = list(reversed(event.children))
    while pending:
        item = pending.pop()
        name = item.name
        kind = _kind(item, name)
        if kind in ("module", "label", "part", "backward"):
            found.append((item, kind))
        elif is_communication(name):
            found.append((item, "comm"))
        elif "::" not in name or not op_like(name):
            pending.extend(reversed(item.children))
    return found


# -- running a window -----------------------------------------------------------------


class KinetoWindow:
    """One profiler session: started before the first timed step, stopped after the
    last, then converted once. Module ranges are opened by global hooks for the modules
    in ``index`` (id -> module table index), on the owner thread and autograd's.

    A *detailed* window (``detail``) also records what the op rows need, all in torch's
    own C++ observers: input shapes (``record_shapes``), overload names, and with
    ``memory`` every allocation and free (``profile_memory``); with ``with_stack`` each
    op's Python call site. Python runs only per module call (a range, and each module's
    input and output shapes on its first call), per step and per optimizer step (memory
    notes), and once per forward of ``root`` (the activations it left for backward, read
    from the autograd graph): never per op.
    """

    def __init__(
        self,
        index: dict[int, int],
        *,
        device: torch.device,
        detail: bool = False,
        memory: bool = False,
        with_stack: bool = False,
        root: nn.Module | None = None,
        owners: list[tuple[torch.Tensor, int]] | None = None,
        state_tensors: list[torch.Tensor] | None = None,
        module_shapes: dict[int, tuple[Any, Any]] | None = None,
    ) -> None:
        self._index = index
        self._names = {key: f"{MODULE_PREFIX}{i}" for key, i in index.items()}
        self._device = device
        self._stack: ExitStack | None = None
        #: torch's profiler held for this window (``profiler_held``), from start to its read.
        self._claim = ExitStack()
        self._owner = 0
        self._step: Any = None
        self.has_device = device.type == "cuda"
        self.detail = detail
        self.memory = memory and detail
        self.with_stack = with_stack and detail
        self._root_id = id(root) if root is not None else None
        #: Each parameter and the module owning it (gradient notes).
        self._owners = owners or []
        self._state_tensors = state_tensors or []
        #: Tensors live before each step that are not the model's (profile's inputs).
        self.inputs: list[torch.Tensor] = []
        self.module_shapes = module_shapes if module_shapes is not None else {}
        self._notes: list[list[tuple[Any, ...]]] = []
        self._grads_noted: set[int] = set()
        self._shape_hook: ExitStack | None = None
        #: The note of the model's own storages (parameters, buffers), read at a window's first step.
        self._constant: tuple[Any, ...] | None = None

    def _activities(self) -> set[Any]:
        from torch.autograd.profiler import ProfilerActivity

        activities = {ProfilerActivity.CPU}
        if self.has_device:
            activities.add(ProfilerActivity.CUDA)
        return activities

    # -- notes: what Python knows, placed on the profiler's clock ------------------------
    def _note(self, items: list[tuple[Any, ...]] | Callable[[], list[tuple[Any, ...]]]) -> None:
        """A note of what Python knows (``items``, or a function making them: its work,
        layerscope's own inside the user's step, is inside the note's range, so its time
        is the ``<layerscope>`` part's and no node of the user's)."""
        rf = _Range(f"{NOTE_PREFIX}{len(self._notes)}")
        rf.__enter__()
        try:
            self._notes.append(items() if callable(items) else items)
        finally:
            rf.__exit__(None, None, None)

    def _note_step_start(self) -> None:
        """Memory live when the step begins: the model's state, gradients, inputs."""
        if self._constant is None:
            # The model's own storages keep their sizes while a window runs: read once.
            self._constant = ("constant", _storage_sizes(self._state_tensors), "parameters")
        constant = self._constant

        def items() -> list[tuple[Any, ...]]:
            grads = [p.grad for p, _ in self._owners if p.grad is not None]
            return [constant, *_adopt(grads, "gradients", since_start=True), *_adopt(self.inputs, "other", since_start=True)]

        self._note(items)

    def _note_grads(self) -> None:
        """Each parameter's gradient and its owner, once per step (before an optimizer
        step, and at the step's end: one of them sees them before a ``zero_grad``)."""

        def items() -> list[tuple[Any, ...]]:
            found: list[tuple[Any, ...]] = []
            for param, owner in self._owners:
                grad = param.grad
                if grad is None:
                    continue
                at = _storage_at(grad)
                if at is None or at[0] in self._grads_noted:
                    continue
                self._grads_noted.add(at[0])
                found.append(("grad", at[0], owner, param.numel() * param.element_size()))
            return found

        self._note(items)

    def _optimizer_pre(self, optimizer: Any) -> None:
        self._note_grads()
        self._note(lambda: _adopt(list(optimizer_state_tensors(optimizer)), "optimizer_state", since_start=True))

    def _optimizer_post(self, optimizer: Any) -> None:
        self._note(lambda: [("optim", type(optimizer).__name__, optimizer_state_bytes(optimizer), id(optimizer))])

    def _hooks(self) -> tuple[Callable[..., None], Callable[..., None]]:
        names_get = self._names.get
        owner = self._owner
        get_ident = threading.get_ident
        task = _graph_task
        own: list[Any] = []  # the owner thread's open ranges
        others: dict[int, list[Any]] = {}  # autograd's threads' (a checkpoint recomputing)
        make = _Range
        detail = self.detail
        root_id = self._root_id if self.memory else None
        root_seqs: list[int | None] = []
        note = self._note

        def pre(module: nn.Module, args: Any, kwargs: Any = None) -> None:
            key = id(module)
            if key == root_id and get_ident() == owner and task() == -1:
                root_seqs.append(_next_seq())
            name = names_get(key)
            if name is None:
                return
            rf = make(name)
            tid = get_ident()
            if tid == owner:
                rf.__enter__()
                own.append(rf)
            elif task() != -1:  # not another thread calling the model: autograd's
                rf.__enter__()
                others.setdefault(tid, []).append(rf)

        def post(module: nn.Module, args: Any, output: Any) -> None:
            key = id(module)
            tid = get_ident()
            if names_get(key) is not None:
                if detail and output is None and _stopped_recompute():
                    raised = make(RAISED_NAME)  # a checkpoint stopped recomputing: the op it was in never ran
                    raised.__enter__()
                    raised.__exit__(None, None, None)
                opened = own if tid == owner else others.get(tid)
                if opened:
                    opened.pop().__exit__(None, None, None)
            # The model's own exit, whether or not it is profiled (paths=).
            if key == root_id and root_seqs and tid == owner and task() == -1:
                since = root_seqs.pop()
                if torch.is_grad_enabled():
                    note(lambda: [("saved", saved_storages(_grad_fns(output), since)), ("forward", since, _next_seq())])

        return pre, post

    def _shapes_hook(self) -> Callable[..., None]:
        """Each module's input and output shapes on its first call (a hook with keyword
        arguments, which costs more: installed for a window's first step only)."""
        shapes = self.module_shapes
        index_get = self._index.get
        owner = self._owner
        get_ident = threading.get_ident
        task = _graph_task

        tensor = torch.Tensor

        def shape(module: nn.Module, args: Any, kwargs: Any, output: Any = None) -> None:
            i = index_get(id(module))
            if i is None or i in shapes or (get_ident() != owner and task() == -1):
                return
            if not kwargs and type(output) is tensor and all(type(a) is tensor for a in args):
                shapes[i] = ([list(a.shape) for a in args], list(output.shape))  # the common case
                return
            inputs = shapes_of(list(args))
            if kwargs:
                inputs.append(shapes_of(kwargs))
            shapes[i] = (inputs, shapes_of(output))

        return shape

    def start(self) -> None:
        self._owner = threading.get_ident()
        self._notes = []
        self._constant = None
        # A detailed window records overload names too (they pick the schema a call's
        # inputs follow); a torch without them assumes default overloads.
        config = _torch.profiler_config(self.detail, self.memory, self.with_stack)
        activities = self._activities()
        claim = ExitStack()
        stack = ExitStack()
        try:
            # Held until the result is read (stop): one session of torch's profiler at a time.
            claim.enter_context(profiler_held())
            with quiet_profiler():
                _torch.prepare_profiler(config, activities)
            pre, post = self._hooks()
            stack.callback(nn_module.register_module_forward_pre_hook(pre).remove)
            stack.callback(nn_module.register_module_forward_hook(post, always_call=True).remove)
            if self.detail and len(self.module_shapes) < len(self._index):
                shapes = ExitStack()
                stack.callback(shapes.close)
                handle = nn_module.register_module_forward_hook(self._shapes_hook(), with_kwargs=True, always_call=True)
                shapes.callback(handle.remove)
                # torch keeps the with_kwargs flag outside the handle: take it out too.
                _torch.forget_hook_kwargs_flag(shapes, handle)
                self._shape_hook = shapes
            if self.memory:
                optimizer_hooks(stack, self._optimizer_pre, self._optimizer_post)
            if self.memory:
                _UNKNOWN_BLOCK.before()
            with quiet_profiler():
                _torch.enable_profiler(config, activities)
                _UNKNOWN_BLOCK.after()
        except BaseException:
            try:
                stack.close()
            finally:
                claim.close()
            raise
        self._stack = stack
        self._claim = claim

    @property
    def running(self) -> bool:
        return self._stack is not None

    def begin_step(self) -> None:
        self._step = _Range(STEP_NAME)
        self._step.__enter__()
        if self.memory:
            self._grads_noted = set()
            self._note_step_start()

    def end_step(self) -> None:
        step, self._step = self._step, None
        if step is not None:
            if self.memory:
                self._note_grads()
            step.__exit__(None, None, None)
        shapes, self._shape_hook = self._shape_hook, None
        if shapes is not None:
            shapes.close()  # the shapes of the window's first step are enough

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        rf = _Range(PART_PREFIX + name)
        rf.__enter__()
        try:
            yield
        finally:
            rf.__exit__(None, None, None)

    def stop(self) -> list[list[Event]]:
        """Stop the profiler (hooks first), and the window's steps as typed streams."""
        stack, self._stack = self._stack, None
        if stack is None:
            return []
        try:
            self.end_step()
            try:
                stack.close()
            finally:
                with quiet_profiler():
                    result = _torch.disable_profiler()
            try:
                return streams_of(
                    result, has_device=self.has_device, detail=self.detail, notes=self._notes,
                    with_stack=self.with_stack,
                )
            finally:
                self._notes = []
        finally:
            self._claim.close()


def streams_of(
    result: Any, *, has_device: bool, detail: bool, notes: list[list[tuple[Any, ...]]], with_stack: bool
) -> list[list[Event]]:
    """A stopped window's result (torch's, or a replayed one) as typed streams, one per
    step: the adapter, then the conversion, with the window's observers told."""
    with paused_gc():
        window = read_window(result, has_device=has_device, detail=detail, notes=notes, with_stack=with_stack)
        for observer in WINDOW_OBSERVERS:
            observer(window, result)
        return convert_window(window)


@contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cycle collector paused while a window's events are read and walked:
    many small objects, none cyclic, so a collection (which scans the whole heap of the
    user's process, models and data included) would only cost time."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


#: Callables given each window as it stops, ``(window, torch's profiler result)``:
#: ``benchmarks/gpu.py`` records windows on a GPU (and torch's own trace of the same
#: session, ``result.save(path)``) for the tests to replay. Empty unless a caller adds one.
WINDOW_OBSERVERS: list[Callable[[WindowCapture, Any], None]] = []


def _storage_at(tensor: torch.Tensor) -> tuple[int, int, str] | None:
    """``(address, bytes, device type)`` of a tensor's storage; None for one without a
    plain storage (sparse, a subclass, FSDP's freed shards)."""
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes(), storage.device.type
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _adopt(tensors: list[torch.Tensor], category: str, *, since_start: bool) -> list[tuple[Any, ...]]:
    """Notes adopting the distinct storages of ``tensors`` by address (with their
    logical bytes and device: :func:`held_bytes` sizes them as the step's allocations)."""
    return [("adopt", ptr, nbytes, category, since_start, device) for ptr, nbytes, device in _storages(tensors)]


def _storage_sizes(tensors: list[torch.Tensor]) -> list[tuple[int, str]]:
    """``(bytes, device type)`` of the distinct storages behind ``tensors``."""
    return [(nbytes, device) for _, nbytes, device in _storages(tensors)]


def _storages(tensors: list[torch.Tensor]) -> list[tuple[int, int, str]]:
    """``(address, bytes, device type)`` of the distinct non-empty storages behind ``tensors``."""
    found: list[tuple[int, int, str]] = []
    seen: set[int] = set()
    for tensor in tensors:
        at = _storage_at(tensor)
        if at is None or not at[1] or at[0] in seen:
            continue
        seen.add(at[0])
        found.append(at)
    return found


#: The CUDA caching allocator's smallest block, and the unit it rounds every request up
#: to (``kMinBlockSize`` and ``round_size`` in torch's c10/cuda/CUDACachingAllocator.cpp).
CUDA_BLOCK_BYTES = 512


def held_bytes(nbytes: int, device_type: str) -> int:
    """A storage of ``nbytes`` logical bytes as the allocation events of its device size
    it, so that memory live before a step and the step's own allocations follow one rule:
    on CUDA the caching allocator's block (its events report ``round_size``: up to a
    multiple of 512 bytes), elsewhere the logical size (the CPU's events report exact
    sizes). NB: ``roundup_power2_divisions`` in ``PYTORCH_CUDA_ALLOC_CONF`` rounds larger
    requests further; that setting is not read, its default rule is assumed."""
    if device_type != "cuda" or nbytes <= 0:
        return nbytes
    return (nbytes + CUDA_BLOCK_BYTES - 1) // CUDA_BLOCK_BYTES * CUDA_BLOCK_BYTES


def _stopped_recompute() -> bool:
    """Whether the exception being handled is a non-reentrant checkpoint ending its
    recompute early (once every tensor it needs is back)."""
    return _torch.is_stopped_recompute(sys.exc_info()[0])


def _grad_fns(output: Any) -> list[Any]:
    return [t.grad_fn for t in tensors_in(output) if t.grad_fn is not None]
