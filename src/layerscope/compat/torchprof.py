"""torchprof's ``Profile``, on a layerscope ``Profiler``.

Change the import, keep the code::

    # import torchprof
    from layerscope.compat import torchprof

    with torchprof.Profile(model, profile_memory=True) as prof:
        model(x)
    print(prof.display(show_events=False))      # or print(prof)
    traces, events_by_path = prof.raw()
    prof.profile                                 # the layerscope Profile: FLOPs, JSON, diff

Unlike torchprof, which stopped working on torch 2.x and replaced each measured
module's ``forward`` while it ran, this adds nothing to the model: it is a
``layerscope.Profiler`` block (removable global hooks and a dispatch mode, gone when
the block ends). The block is one step, so times come from the step that also records
the ops, as torchprof's did (its autograd profiler ran around every op too).
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from layerscope.block import Profiler
from layerscope.capture.modules import require_module
from layerscope.capture.recorder import Clock
from layerscope.compat.op_records import EventList, OpEvent
from layerscope.model.sidedocs import Spans
from layerscope.model.tree import OpStats
from layerscope.model.tree import Profile as LayerscopeProfile

__all__ = ["Profile", "Trace"]

TorchprofPath = tuple[str, ...]

_UNFINISHED = "<unfinished torchprof.profile>"


class Trace(NamedTuple):
    """A module as torchprof listed it: its path from the root's class name down
    (``("AlexNet", "features", "0")``), whether it has no children, and the module."""

    path: TorchprofPath
    leaf: bool
    module: nn.Module


def walk_modules(model: nn.Module) -> Iterator[Trace]:
    """Every module, depth first through ``named_children()``, as torchprof walked them."""
    pending: list[tuple[TorchprofPath, nn.Module]] = [((type(model).__name__,), model)]
    while pending:
        path, module = pending.pop()
        children = list(module.named_children())
        yield Trace(path, not children, module)
        pending.extend(((*path, name), child) for name, child in reversed(children))


class Profile:
    """torchprof's context manager: ``with Profile(model) as prof: model(x)``.

    ``paths`` are tuples of module names from the root's class name down
    (``("AlexNet", "features", "3")``); only those modules (subtrees) are measured, and
    only their rows carry figures. Without ``paths`` every module is measured and the
    leaves' rows carry figures, as torchprof showed them. ``use_cuda`` adds the CUDA
    columns (measured when the model runs on a GPU); ``profile_memory`` tracks memory
    and adds its columns. ``clock`` replaces the timer (tests use a fake one).

    With ``use_cuda=True`` where no CUDA device is present, a warning says so once,
    when the ``Profile`` is made, and ``use_cuda`` turns False: the table has no CUDA
    columns. That is what torchprof's users saw from torch's profiler, which warned
    and turned CUDA profiling off; columns with nothing to measure would only read as
    figures.
    """

    def __init__(
        self,
        model: nn.Module,
        enabled: bool = True,
        use_cuda: bool = False,
        profile_memory: bool = False,
        paths: Sequence[TorchprofPath] | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._model = require_module(model)
        self.enabled = enabled
        if use_cuda and not torch.cuda.is_available():
            warnings.warn(
                "torchprof.Profile(use_cuda=True): no CUDA device is present, so the table has no CUDA columns",
                stacklevel=2,
            )
            use_cuda = False
        self.use_cuda = use_cuda
        self.profile_memory = profile_memory
        self.paths = None if paths is None else [tuple(path) for path in paths]
        self._dotted = None if self.paths is None else [self._to_dotted(path) for path in self.paths]
        self._clock = clock
        self._profiler: Profiler | None = None
        self.entered = False
        self.exited = False

    def _to_dotted(self, path: TorchprofPath) -> str:
        root = type(self._model).__name__
        if not path or path[0] != root:
            raise ValueError(f"a torchprof path starts with the model's class name {root!r}, got {path!r}")
        return ".".join(path[1:])

    def _to_tuple(self, dotted: str) -> TorchprofPath:
        return (type(self._model).__name__, *(dotted.split(".") if dotted else ()))

    # -- running ------------------------------------------------------------------------
    def __enter__(self) -> Profile:
        if not self.enabled:
            return self
        if self.entered:
            raise RuntimeError("this torchprof.Profile has already run; use a new one for each block")
        self.entered = True
        self._profiler = Profiler(self._model, paths=self._dotted, memory=self.profile_memory, clock=self._clock)
        self._profiler.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> bool:
        if self._profiler is None:
            return False
        self.exited = True
        return self._profiler.__exit__(*exc_info)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._model(*args, **kwargs)

    # -- reading --------------------------------------------------------------------------
    @property
    def profile(self) -> LayerscopeProfile:
        """The layerscope Profile behind the table (FLOPs, backward, JSON, diff)."""
        if self._profiler is None:
            raise RuntimeError("this torchprof.Profile has not run (or was created with enabled=False)")
        return self._profiler.profile

    def display(self, show_events: bool = False) -> str:
        """torchprof's table; ``show_events`` nests each measured module's aten ops."""
        if not self.exited:
            return _UNFINISHED
        return self.profile.render(
            "torchprof",
            show_events=show_events,
            use_cuda=self.use_cuda,
            profile_memory=self.profile_memory,
            paths=self._dotted,
        )

    def __str__(self) -> str:
        return self.display()

    def _measured(self) -> list[str]:
        """The dotted paths torchprof would have measured: the chosen ones, or the leaves."""
        if self._dotted is not None:
            return list(self._dotted)
        return [node.path for node in self.profile.modules() if node.kind == "module" and not any(
            child.kind == "module" for child in node.children
        )]

    def raw(self) -> tuple[tuple[Trace, ...], dict[TorchprofPath, list[EventList]]] | None:
        """``(traces, events_by_path)`` as torchprof returned them (None before the block
        ends): every module as a :class:`Trace`, and for each measured module's path one
        :class:`~layerscope.compat.op_records.EventList` per call, its aten ops in the order
        they ran (the ops of its submodules included, as torchprof's were)."""
        if not self.exited:
            return None
        traces = tuple(walk_modules(self._model))
        events: dict[TorchprofPath, list[EventList]] = defaultdict(list)
        measured = set(self._measured())
        for dotted, call in _calls(self.profile, measured):
            events[self._to_tuple(dotted)].append(call)
        return traces, events


def _calls(profile: LayerscopeProfile, measured: set[str]) -> Iterator[tuple[str, EventList]]:
    """Each forward call of a measured module, with the ops run inside it, from the
    profile's trace (the spans nest: a call's ops start before the call ends)."""
    spans = Spans() if profile.trace is None else profile.trace.spans
    on_device = str(profile.meta.device or "cpu").startswith("cuda")
    open_calls: list[tuple[int, EventList | None]] = []  # (end_ns, the call's ops or None)
    done: list[tuple[str, EventList]] = []
    for start, duration, path, phase, index in zip(spans.start_ns, spans.duration_ns, spans.path, spans.phase, spans.op_index):
        if phase != "forward":
            continue
        while open_calls and open_calls[-1][0] <= start:
            open_calls.pop()
        if index < 0:
            call = EventList() if path in measured else None
            if call is not None:
                done.append((path, call))
            open_calls.append((start + duration, call))
            continue
        op = profile.node(path).ops[index]
        event = _op_call(op, duration, on_device)
        for _, call in open_calls:
            if call is not None:
                call.append(event)
    return iter(done)


def _op_call(op: OpStats, duration_ns: int, on_device: bool) -> OpEvent:
    """One call of ``op``: its own span's time; NB: its device time, memory and FLOPs are
    the row's per call (calls in one row share name and input shapes)."""
    calls = max(op.calls, 1)

    def share(value: int | None) -> int | None:
        return None if value is None else value // calls

    device_ns = share(op.device_time_ns)
    return OpEvent.from_figures(
        op.name,
        1,
        self_cpu_ns=duration_ns,
        cpu_ns=duration_ns,
        self_device_ns=device_ns,
        device_ns=device_ns,
        alloc_bytes=share(op.alloc_bytes),
        self_alloc_bytes=share(op.alloc_bytes),
        on_device=on_device,
        input_shapes=op.input_shapes,
        stack=op.stack,
        flops=share(op.flops),
    )
