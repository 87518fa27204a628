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
turned into the same typed records (``layerscope.model.raw``) the dispatch backend writes:
``Step``, ``Enter``/``Exit``, ``LabelEnter``/``LabelExit`` and ``Op``. The walker in
``layerscope.attribute`` attributes both the same way.

How the records are derived is the conversion's (``layerscope.convert.streams``), which
reads the window's ranges as the live adapter (``capture/torch_events.py``) wrote them,
asking torch's op catalog (``flops/recorded.py``) what only torch knows of an op.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any, Generic, TypeVar

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from layerscope.base.errors import ProfilerStateError
from layerscope.capture import _torch
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
from layerscope.capture.modules import autocast_dtype
from layerscope.capture.torch_events import read_window
from layerscope.convert.align import CallTemplate, place, template_of_step
from layerscope.convert.ranges import (
    MODULE_PREFIX,
    NOTE_PREFIX,
    PART_PREFIX,
    RAISED_NAME,
    STEP_NAME,
    WindowCapture,
)
from layerscope.convert.streams import convert_window
from layerscope.flops.recorded import CATALOG
from layerscope.model.raw import Event, ModuleShapes
from layerscope.model.runfacts import OpPlacement

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
        # A write another thread began into the sink just before descriptor 2 was given
        # back may land a moment later: read until a short wait brings nothing more.
        while (more := _pass_on(sink.fileno(), read, 2)) != read or _landing(sink.fileno(), read):
            read = more
        sink.close()


def _landing(sink: int, read: int) -> bool:
    """Whether more was written into ``sink`` past ``read`` after a short wait (1 ms)."""
    time.sleep(0.001)
    return os.fstat(sink).st_size > read


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
        #: Results stopped and not yet read (a block's last window, read on first use).
        self._pending: weakref.WeakSet[PendingRead[Any]] = weakref.WeakSet()

    def take(self, *, bounded: bool) -> bool:
        me = threading.get_ident()
        with self._changed:
            while self._thread is not None and self._thread != me:
                if not self._bounded:
                    return False
                self._changed.wait()
            fresh = self._thread is None
            if fresh:
                self._thread, self._bounded = me, bounded
            self._depth += 1
        if fresh:
            self._drain()
        return True

    def defer(self, pending: PendingRead[Any]) -> None:
        """A stopped result left unread: read before torch's profiler is next prepared."""
        with self._changed:
            self._pending.add(pending)

    def _drain(self) -> None:
        """Read every result left unread (their owners get them from the reads)."""
        with self._changed:
            pending, self._pending = list(self._pending), weakref.WeakSet()
        for read in pending:
            with contextlib.suppress(Exception):  # the owner's read raises it again
                read.streams()

    def give(self) -> None:
        with self._changed:
            self._depth -= 1
            if not self._depth:
                self._thread = None
                self._changed.notify_all()

    def after_fork(self) -> None:
        # A forked child has the forking thread alone: a claim another thread held is gone.
        self._changed = threading.Condition()
        self._pending = weakref.WeakSet()
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


def profiler_activities(has_device: bool) -> set[Any]:
    """What torch's profiler records: the CPU, and the device's work when there is one."""
    from torch.autograd.profiler import ProfilerActivity

    activities = {ProfilerActivity.CPU}
    if has_device:
        activities.add(ProfilerActivity.CUDA)
    return activities


def read_before_next_session(pending: PendingRead[Any]) -> None:
    """A stopped result left unread, read at the latest before torch's profiler is next
    prepared in the process (``_Claim``)."""
    _CLAIM.defer(pending)


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
        inputs: Sequence[torch.Tensor] = (),
        hooks: str = "every",
    ) -> None:
        self._index = index
        #: ``hooks="first"``: a light session runs no module hooks once a hooked one
        #: gave the call template its steps' ops are aligned to.
        self._hooks_first = hooks == "first"
        self._unhooked_next = False
        self._hooked = True
        self.template: CallTemplate | None = None
        #: How each unhooked window's ops were placed.
        self.placements: list[OpPlacement] = []
        #: Steps begun in every session so far, and before the running one: a step's
        #: number among the steps recorded, as a placement names it.
        self._begun = 0
        self._first = 0
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
        #: What a detailed window of this one's records (``light`` turns it off for a while).
        self._detailed = (self.detail, self.memory, self.with_stack)
        self._root_id = id(root) if root is not None else None
        #: The dtype ``torch.autocast`` ran each forward of ``root`` in (None: off), as the
        #: root's own pre-hook saw it, in every window of this one's: autocast entered
        #: inside a step is visible nowhere else.
        self.autocast: set[str | None] = set()
        #: Each parameter and the module owning it (gradient notes).
        self._owners = owners or []
        self._state_tensors = state_tensors or []
        #: Tensors live before each step that are not the model's (profile's inputs).
        self._inputs = list(inputs)
        #: Modules whose shapes were read, in any window of this one's (once per capture),
        #: and the records of those read in the running window (its first step's).
        self._shapes_read: set[int] = set()
        self._shapes: list[ModuleShapes] = []
        self._notes: list[list[tuple[Any, ...]]] = []
        self._grads_noted: set[int] = set()
        self._shape_hook: ExitStack | None = None
        #: The note of the model's own storages (parameters, buffers), read at a window's first step.
        self._constant: tuple[Any, ...] | None = None

    def _activities(self) -> set[Any]:
        return profiler_activities(self.has_device)

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
            return [constant, *_adopt(grads, "gradients", since_start=True), *_adopt(self._inputs, "other", since_start=True)]

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
        model_id = self._root_id
        root_seqs: list[int | None] = []
        note = self._note
        amp, device = self.autocast, self._device

        def pre(module: nn.Module, args: Any, kwargs: Any = None) -> None:
            key = id(module)
            if key == model_id and get_ident() == owner and task() == -1:
                amp.add(autocast_dtype(device))
                if root_id is not None:
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
        read = self._shapes_read
        add = self._shapes.append
        index_get = self._index.get
        owner = self._owner
        get_ident = threading.get_ident
        task = _graph_task

        tensor = torch.Tensor

        def shape(module: nn.Module, args: Any, kwargs: Any, output: Any = None) -> None:
            i = index_get(id(module))
            if i is None or i in read or (get_ident() != owner and task() == -1):
                return
            read.add(i)
            if not kwargs and type(output) is tensor and all(type(a) is tensor for a in args):
                add(ModuleShapes(i, [list(a.shape) for a in args], list(output.shape)))  # the common case
                return
            inputs = shapes_of(list(args))
            if kwargs:
                inputs.append(shapes_of(kwargs))
            add(ModuleShapes(i, inputs, shapes_of(output)))

        return shape

    def start(self) -> None:
        self._first = self._begun
        self._owner = threading.get_ident()
        self._notes = []
        self._shapes = []
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
            # The window before is read by now (profiler_held): its template is known.
            self._hooked = not (self._unhooked_next and self.template is not None)
            if self._hooked:
                pre, post = self._hooks()
                stack.callback(nn_module.register_module_forward_pre_hook(pre).remove)
                stack.callback(nn_module.register_module_forward_hook(post, always_call=True).remove)
            if self.detail and len(self._shapes_read) < len(self._index):
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

    def light(self, light: bool) -> None:
        """Whether the next session this window starts is *light*: torch's profiler
        without shapes, overload names, memory or stacks, only op and module ranges (and
        kernels), the cheapest run that times every module and op. Only between sessions:
        a running one keeps what it was started with."""
        assert not self.running, "a window's detail is set between its sessions"
        self.detail, self.memory, self.with_stack = (False, False, False) if light else self._detailed
        self._unhooked_next = light and self._hooks_first

    def begin_step(self) -> None:
        self._begun += 1
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
        try:
            return self._disable()()
        finally:
            self._claim.close()

    def stop_later(self) -> PendingRead[list[list[Event]]]:
        """Stop the profiler as :meth:`stop` does, and read its result when the streams are
        first asked for: what torch's own stop does (it processes its events on first
        use), so a block's exit costs about what torch's does. Until then the result
        stays in torch's C++ (a window's steps at most); it is read at the latest before
        torch's profiler is next prepared in the process (``_Claim``)."""
        try:
            pending = PendingRead(self._disable())
            if WINDOW_OBSERVERS:
                pending.streams()  # an observer sees the window while it is installed
            else:
                _CLAIM.defer(pending)
            return pending
        finally:
            self._claim.close()

    def _disable(self) -> Callable[[], list[list[Event]]]:
        """Stop the profiler (hooks first); the read of the window's steps as typed streams."""
        stack, self._stack = self._stack, None
        if stack is None:
            return list
        self.end_step()
        try:
            stack.close()
        finally:
            with quiet_profiler():
                result = _torch.disable_profiler()
        notes, self._notes = self._notes, []
        shapes, self._shapes = self._shapes, []
        has_device, detail, with_stack = self.has_device, self.detail, self.with_stack
        align = self._aligner(self._hooked, self._first) if self._hooks_first else None

        def read() -> list[list[Event]]:
            streams = streams_of(
                result, has_device=has_device, detail=detail, notes=notes, with_stack=with_stack, align=align,
            )
            if streams:
                streams[0][:0] = shapes  # read in the window's first step (the hook's only one)
            else:
                self._shapes_read.difference_update(record.module for record in shapes)
            return streams

        return read


    def _aligner(self, hooked: bool, first: int) -> Callable[[WindowCapture], None]:
        """What a window's read does with its ranges (``hooks="first"``): a hooked
        window's first step with a module call gives the template; an unhooked window's
        steps (numbered from ``first`` among the steps recorded) get their module ranges
        from it. A step that does not align is named, and the next window runs the hooks
        again (a new template)."""

        def align(window: WindowCapture) -> None:
            steps = [r for r in window.roots if r.name == STEP_NAME]
            if hooked:
                self.template = next(filter(None, map(template_of_step, steps)), None) or self.template
            elif self.template is not None:
                placed = place(list(zip(steps, range(first, first + len(steps)))), self.template, window.roots)
                self.placements.append(placed)
                if placed.unaligned:
                    self.template = None

        return align


_Read = TypeVar("_Read")


class PendingRead(Generic[_Read]):
    """A stopped window's result, read once, by whichever asks first: its owner
    (:meth:`streams`), or the next session about to prepare torch's profiler. The read
    gives the window's steps as typed streams (a compiled model's block: its passes)."""

    def __init__(self, read: Callable[[], _Read]) -> None:
        self._read: Callable[[], _Read] | None = read
        self._streams: _Read | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def streams(self) -> _Read:
        """The window's steps (read now if not read yet); a read that failed raises its
        error again on every call."""
        with self._lock:
            read, self._read = self._read, None
            if read is not None:
                try:
                    self._streams = read()
                except BaseException as exc:
                    self._error = exc
            if self._error is not None:
                raise self._error
            assert self._streams is not None
            return self._streams


def streams_of(
    result: Any, *, has_device: bool, detail: bool, notes: list[list[tuple[Any, ...]]], with_stack: bool,
    align: Callable[[WindowCapture], None] | None = None,
) -> list[list[Event]]:
    """A stopped window's result (torch's, or a replayed one) as typed streams, one per
    step: the adapter, then the conversion, with the window's observers told; ``align``
    (``hooks="first"``) reads or writes the window's module ranges before the
    conversion."""
    with paused_gc():
        window = read_window(result, has_device=has_device, detail=detail, notes=notes, with_stack=with_stack)
        for observer in WINDOW_OBSERVERS:
            observer(window, result)
        if align is not None:
            align(window)
        return convert_window(window, CATALOG)


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




def _stopped_recompute() -> bool:
    """Whether the exception being handled is a non-reentrant checkpoint ending its
    recompute early (once every tensor it needs is back)."""
    return _torch.is_stopped_recompute(sys.exc_info()[0])


def _grad_fns(output: Any) -> list[Any]:
    return [t.grad_fn for t in tensors_in(output) if t.grad_fn is not None]
