"""Timed capture through torch's own profiler (Kineto): the run a user is shown as time.

What runs while the user's code is timed is no heavier than ``torch.profiler``:

- torch's C++ observers record every op (no shapes, no stacks);
- two global module hooks open and close a ``_RecordFunctionFast`` range per module
  call (about a microsecond each), so modules are ranges on the same clock as the ops;
- a range around each step or pass, and around the parts layerscope runs itself (the
  loss of ``profile``).

Nothing Python runs per op. The profiler is stopped once per *window* (a cycle's timed
steps, or a bounded number of them), after the timed work, and its events are read
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
  ``correlation_id``), so kernels overlapping on two streams are not counted twice.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from layerscope.capture.recorder import label_kind
from layerscope.comm import is_communication
from layerscope.raw import NO_SEQ, Collective, Enter, Event, Exit, LabelEnter, LabelExit, Op, Step

MODULE_PREFIX = "layerscope.module#"
PART_PREFIX = "layerscope.part#"
STEP_NAME = "layerscope.step"
_EVALUATE = "autograd::engine::evaluate_function: "
_ACCUMULATE = "torch::autograd::AccumulateGrad"

try:  # torch >= 2.1
    from torch._C._profiler import _RecordFunctionFast as _Range
except ImportError:  # pragma: no cover - older torch
    _Range = None  # type: ignore[assignment,misc]

_graph_task: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: -1)

@contextmanager
def quiet_fd2() -> Iterator[None]:
    """Point file descriptor 2 at the null device for the duration (C++ writes go there
    directly, so ``sys.stderr`` cannot catch them)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _quiet() -> AbstractContextManager[None]:
    import layerscope.capture

    return quiet_fd2() if layerscope.capture.QUIET_PROFILER else nullcontext()


def available() -> bool:
    """Whether the Kineto capture can run here: torch has it, and no other profiler
    (a user's ``torch.profiler``, or another layerscope block's) is running, since only
    one can."""
    if _Range is None:
        return False
    enabled = getattr(torch.autograd, "_profiler_enabled", None)
    return enabled is not None and not enabled()


class KernelSpan(NamedTuple):
    """A device kernel (or memcpy/memset) and the op that launched it."""

    linked_correlation_id: int
    start_ns: int
    end_ns: int


@dataclass
class RangeFields:
    """The op fields of a :class:`Range` (torch's ``_ExtraFields_TorchOp``)."""

    sequence_number: int = -1
    scope: Any = None


@dataclass
class Range:
    """A host range (an op, a module range, a label) with the ranges nested in it, by
    the attribute names of the profiler's own tree events, so :func:`convert` reads
    either and tests build these by hand."""

    name: str
    start_time_ns: int
    end_time_ns: int
    start_tid: int = 0
    correlation_id: int = 0
    children: list[Range] = field(default_factory=list)
    extra_fields: RangeFields = field(default_factory=RangeFields)


try:
    from torch._C._profiler import RecordScope as _RecordScope
    from torch._C._profiler import _EventType

    _USER_SCOPE: Any = _RecordScope.USER_SCOPE
    _TORCH_OP: Any = _EventType.TorchOp
except ImportError:  # pragma: no cover
    _USER_SCOPE = _TORCH_OP = None


def _sequence_nr(event: Any) -> int:
    return getattr(event.extra_fields, "sequence_number", -1)


def read_kernels(result: Any) -> list[KernelSpan]:
    """The device kernels of a profiler result, with the op each was launched from."""
    cpu = torch._C._autograd.DeviceType.CPU
    return [
        KernelSpan(e.linked_correlation_id(), e.start_ns(), e.end_ns())
        for e in result.events()
        if e.device_type() != cpu
    ]


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of ``[start, end)`` intervals (kernels on several streams
    overlap; their device time is the time any of them ran)."""
    total = 0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start  # type: ignore[operator]
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None:
        total += cur_end - cur_start  # type: ignore[operator]
    return total


def _kind(event: Any, name: str | None = None) -> str:
    """What a range is, from its name (read once: every read is a call into C++). A
    namespaced name (``aten::mm``) is an op without looking further."""
    if name is None:
        name = event.name
    if "::" in name and not name.startswith(_EVALUATE) and _op_like(name):
        return "op"
    if name.startswith(MODULE_PREFIX):
        return "module"
    if name == STEP_NAME:
        return "step"
    if name.startswith(PART_PREFIX):
        return "part"
    if name.startswith(_EVALUATE):
        return "backward"
    if is_communication(name):
        return "op"  # a process group's range around a collective (gloo:all_reduce)
    if getattr(event.extra_fields, "scope", None) == _USER_SCOPE:
        return "label"
    return "op"


def _op_like(name: str) -> bool:
    """Whether a namespaced name reads as an op's (``aten::mm``, ``c10d::allreduce_``):
    a lower-case namespace and no spaces. ``record_function`` ranges named like
    ``FSDP::pre_forward (0)`` are told apart by their scope instead."""
    namespace = name.split("::", 1)[0]
    return " " not in name and namespace == namespace.lower()


def convert(roots: list[Any], kernels: list[KernelSpan] = (), *, has_device: bool = False) -> list[list[Event]]:  # type: ignore[assignment]
    """The window's ranges (the roots of each thread's tree, :class:`Range` or the
    profiler's events) as one typed stream per step (``Step`` ... ``Step``)."""
    return _Converter(roots, kernels, has_device).streams()


class _Converter:
    """Turns one window's range trees and kernels into typed records, one method per
    kind of range.

    The owner thread is the one whose ranges mark the steps; another thread's work
    counts only inside a backward (``evaluate_function``) range that ran during one of
    the owner's steps (autograd's device threads), and nowhere else. Ops are read one
    level deep (the ones directly in a frame or step); below that only on a device,
    for their kernels."""

    def __init__(self, roots: list[Any], kernels: list[KernelSpan], has_device: bool) -> None:
        self.has_device = has_device
        self.kernels_by_op: dict[int, list[tuple[int, int]]] = {}
        for k in kernels:
            self.kernels_by_op.setdefault(k.linked_correlation_id, []).append((k.start_ns, k.end_ns))
        self.roots = roots
        self.records: list[tuple[int, int, Event]] = []  # (time, order, record)
        # Autograd's counter over time: (start, sequence_nr) of the owner's ops that
        # carry one, in order. The first such op after an instant is a top-level op.
        self.seq_marks: list[tuple[int, int]] = []
        self.on_owner = True
        self.last_backward_seq: int | None = None

    # -- helpers ----------------------------------------------------------------------
    def put(self, t_ns: int, record: Event) -> int:
        self.records.append((t_ns, len(self.records), record))
        return len(self.records) - 1

    def replace(self, at: int, **fields: Any) -> None:
        t_ns, order, record = self.records[at]
        self.records[at] = (t_ns, order, record._replace(**fields))  # type: ignore[union-attr]

    def kernel_time(self, event: Any) -> int:
        """Device time of the kernels launched from ``event`` or any op under it."""
        spans: list[tuple[int, int]] = []
        pending = [event]
        while pending:
            item = pending.pop()
            spans.extend(self.kernels_by_op.get(item.correlation_id, ()))
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
            self.walk_children(event, in_backward)
            self.put(event.end_time_ns, Exit(event.end_time_ns, index, None, None, in_backward))
        elif kind in ("part", "label"):
            if kind == "part":
                label = lkind = event.name[len(PART_PREFIX) :]
            else:
                lkind, label = label_kind(event.name)
            self.put(event.start_time_ns, LabelEnter(event.start_time_ns, label, lkind, None, None, in_backward, grad))
            self.walk_children(event, in_backward)
            self.put(event.end_time_ns, LabelExit(event.end_time_ns, None, None, in_backward))
        elif kind == "backward":
            self.on_backward(event)
        elif self.on_owner:
            self.on_op(event, in_backward)

    def on_op(self, event: Any, in_backward: bool, name: str | None = None) -> None:
        """An op right inside a frame or the step. A range that is not an aten-level op
        (a custom autograd ``Function``, such as a reentrant checkpoint) can run modules:
        those are walked, and the op's own slot ends where they begin."""
        name = event.name if name is None else name
        start = event.start_time_ns
        seq = _sequence_nr(event)
        if seq >= 0:
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

    # -- the walk ---------------------------------------------------------------------
    def streams(self) -> list[list[Event]]:
        owner = next((r.start_tid for r in self.roots if r.name == STEP_NAME), None)
        if owner is None:
            return []
        steps = [(r.start_time_ns, r.end_time_ns) for r in self.roots if r.name == STEP_NAME and r.start_tid == owner]
        for root in self.roots:
            tid = root.start_tid
            self.on_owner = tid == owner
            kind = _kind(root)
            if self.on_owner:
                self.walk(root, kind, False)
            elif kind == "backward" and any(s <= root.start_time_ns <= e for s, e in steps):
                self.on_backward(root)  # autograd's device thread, backward of a step
            elif is_communication(root.name) and any(root.start_time_ns < e and s < root.end_time_ns for s, e in steps):
                # A collective running on the process group's own thread (gloo's worker).
                self.put(root.start_time_ns, Collective(root.start_time_ns, root.end_time_ns, root.name))
            # anything else on another thread is not the profiled block's work
        self.records.sort(key=lambda r: (r[0], r[1]))
        self.seq_marks.sort()
        return self._split()

    def _split(self) -> list[list[Event]]:
        """Per step, with autograd's counter filled in at frame boundaries."""
        times = [t for t, _ in self.seq_marks]
        values = [s for _, s in self.seq_marks]

        def seq_at(t_ns: int) -> int | None:
            at = bisect_left(times, t_ns)
            return values[at] if at < len(values) else None

        streams: list[list[Event]] = []
        current: list[Event] | None = None
        for t_ns, _, record in self.records:
            if isinstance(record, Step):
                if current is None:
                    current = [record]
                else:
                    current.append(record)
                    streams.append(current)
                    current = None
                continue
            if current is None:
                continue
            if isinstance(record, (Enter, Exit, LabelEnter, LabelExit)):
                record = record._replace(seq=seq_at(t_ns))
            current.append(record)
        return streams


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
        elif "::" not in name or not _op_like(name):
            pending.extend(reversed(item.children))
    return found


# -- running a window -----------------------------------------------------------------


class KinetoWindow:
    """One profiler session: started before the first timed step, stopped after the
    last, then converted once. Module ranges are opened by global hooks for the modules
    in ``index`` (id -> module table index), on the owner thread and autograd's."""

    def __init__(self, index: dict[int, int], *, device: torch.device) -> None:
        self._index = index
        self._names = {key: f"{MODULE_PREFIX}{i}" for key, i in index.items()}
        self._device = device
        self._stack: ExitStack | None = None
        self._owner = 0
        self._step: Any = None
        self.has_device = device.type == "cuda"

    def _activities(self) -> set[Any]:
        from torch.autograd.profiler import ProfilerActivity

        activities = {ProfilerActivity.CPU}
        if self.has_device:
            activities.add(ProfilerActivity.CUDA)
        return activities

    def _hooks(self) -> tuple[Callable[..., None], Callable[..., None]]:
        names_get = self._names.get
        owner = self._owner
        get_ident = threading.get_ident
        task = _graph_task
        own: list[Any] = []  # the owner thread's open ranges
        others: dict[int, list[Any]] = {}  # autograd's threads' (a checkpoint recomputing)
        make = _Range

        def pre(module: nn.Module, args: Any) -> None:
            name = names_get(id(module))
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
            if names_get(id(module)) is None:
                return
            tid = get_ident()
            opened = own if tid == owner else others.get(tid)
            if opened:
                opened.pop().__exit__(None, None, None)

        return pre, post

    def start(self) -> None:
        from torch._C._profiler import ProfilerConfig, ProfilerState, _ExperimentalConfig
        from torch.autograd.profiler import _enable_profiler, _prepare_profiler

        self._owner = threading.get_ident()
        config = ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig())
        activities = self._activities()
        stack = ExitStack()
        try:
            with _quiet():
                _prepare_profiler(config, activities)
            pre, post = self._hooks()
            stack.callback(nn_module.register_module_forward_pre_hook(pre).remove)
            stack.callback(nn_module.register_module_forward_hook(post, always_call=True).remove)
            with _quiet():
                _enable_profiler(config, activities)
        except BaseException:
            stack.close()
            raise
        self._stack = stack

    @property
    def running(self) -> bool:
        return self._stack is not None

    def begin_step(self) -> None:
        self._step = _Range(STEP_NAME)
        self._step.__enter__()

    def end_step(self) -> None:
        step, self._step = self._step, None
        if step is not None:
            step.__exit__(None, None, None)

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
        from torch.autograd.profiler import _disable_profiler

        stack, self._stack = self._stack, None
        if stack is None:
            return []
        self.end_step()
        try:
            stack.close()
        finally:
            with _quiet():
                result = _disable_profiler()
        kernels = read_kernels(result) if self.has_device else []
        roots = [e for e in result.experimental_event_tree() if e.tag == _TORCH_OP]
        gc_was_on = gc.isenabled()
        gc.disable()  # many small objects, none cyclic: collections would only cost time
        try:
            return convert(roots, kernels, has_device=self.has_device)
        finally:
            if gc_was_on:
                gc.enable()
