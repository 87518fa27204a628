"""A model's call template, learned from one run of a meta copy of it: the outermost ops
one call runs, in order, and the module calls around each (``convert/align.py`` aligns a
trace's ops to it).

The copy is made without copying a weight (each parameter and buffer becomes a meta
tensor of its shape and dtype), and run under torch's profiler (CPU events only) with a
``record_function`` range around each module call, opened and closed by global module
hooks removed afterwards: the user's model is never run, moved or changed. The op names
are the profiler's own (``aten::linear``, not the ``addmm`` inside it), so they are the
names a trace of the real run holds.

A data-dependent read (``tensor.item()``, ``bool(mask.all())``) has no data on the meta
device. When the run raises for one, it runs again with each such read answered by a
guess (True, 1, 1.0), and each guess is named in the template: the real run may have
taken another branch there, which the alignment's confidence rule then names.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from layerscope.base.errors import TraceModelError
from layerscope.capture import _torch
from layerscope.capture.inputs import split_inputs
from layerscope.capture.kineto import paused_gc, quiet_profiler
from layerscope.convert.align import CallTemplate, template_of_step
from layerscope.convert.ranges import MODULE_PREFIX, STEP_NAME, USER_SCOPE, Range, RangeFields

#: The op that reads a tensor's value into Python (``item()``, ``bool()``).
_READ = "aten::_local_scalar_dense"
#: torch's profiler's name for a Python dispatch mode's frame (the guesses' mode).
_MODE_FRAME = "PythonDispatchMode"


def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every parameter and buffer a meta tensor of its shape and
    dtype (tied ones stay tied); no weight is copied, ``model`` is unchanged."""
    memo: dict[int, Any] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in memo:
            continue
        empty = torch.empty_like(tensor, device="meta")
        memo[id(tensor)] = nn.Parameter(empty, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) else empty
    return copy.deepcopy(model, memo)


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_like(value, device="meta").requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_meta(v) for k, v in value.items()}
    return value


class _Guesses(_torch.DispatchMode):  # type: ignore[misc]
    """Answers each read of a meta tensor's value with a guess, and keeps what it said."""

    def __init__(self) -> None:
        super().__init__()
        self.said: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if args and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta" and _torch.op_name(func) == _READ:
            tensor = args[0]
            value: Any = True if tensor.dtype == torch.bool else 1.0 if tensor.is_floating_point() else 1
            self.said.append(f"a {str(tensor.dtype).removeprefix('torch.')} read of shape {list(tensor.shape)} taken as {value}")
            return value
        return func(*args, **(kwargs or {}))


def call_template(model: nn.Module, inputs: Any, *, grad: bool = False) -> CallTemplate:
    """The call template of ``model`` called with ``inputs`` (a Tensor, a tuple of
    positional arguments or a dict of keyword arguments, as ``profile()`` takes them; only
    their shapes and dtypes are read), with autograd on when ``grad`` (a training step's
    forward). Raises :class:`TraceModelError` naming what the meta run raised."""
    args, kwargs = split_inputs(_to_meta(inputs))
    try:
        return _record(meta_copy(model), args, kwargs, grad, guesses=None)
    except Exception as exc:
        first = exc
    # A read of a meta tensor's value raises: again, each such read answered by a guess.
    try:
        return _record(meta_copy(model), args, kwargs, grad, guesses=_Guesses())
    except Exception:
        text = str(first).splitlines()[0] if str(first) else ""
        raise TraceModelError(
            f"the {type(model).__name__}'s call template could not be learned: a meta copy of it, called with "
            f"the given inputs, raised {type(first).__name__}: {text}"
        ) from first


def _record(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool, guesses: _Guesses | None,
) -> CallTemplate:
    index = {id(module): at for at, (_, module) in enumerate(model.named_modules())}
    handles: list[Any] = []

    def enter(module: nn.Module, _args: Any) -> None:
        at = index.get(id(module))
        if at is not None:
            handles.append(_torch.open_profiler_range(f"{MODULE_PREFIX}{at}"))

    def leave(module: nn.Module, _args: Any, _out: Any) -> None:
        if id(module) in index and handles:
            _torch.close_profiler_range(handles.pop())

    hooks = [
        nn.modules.module.register_module_forward_pre_hook(enter),
        nn.modules.module.register_module_forward_hook(leave, always_call=True),
    ]
    activities = [torch.profiler.ProfilerActivity.CPU]
    try:
        with quiet_profiler(), torch.profiler.profile(activities=activities) as prof, torch.set_grad_enabled(grad):
            if guesses is not None:
                with guesses:
                    model(*args, **kwargs)
            else:
                model(*args, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
        while handles:
            _torch.close_profiler_range(handles.pop())
    weighty = frozenset(at for at, (_, module) in enumerate(model.named_modules()) if any(True for _ in module.parameters(recurse=False)))
    with paused_gc():  # torch's event list and the tree built from it: many objects, none cyclic
        return _template_of(prof.events(), guesses, weighty)


def _template_of(events: Any, guesses: _Guesses | None, weighty: frozenset[int] = frozenset()) -> CallTemplate:
    """The template in the profiler's events: their trees as the ranges a block's hooked
    step records (a module range per call, labels, ops), read by
    ``convert.align.template_of_step`` as a live template is; the guesses' mode's frames
    are see-through."""

    def ranges(found: Any) -> list[Range]:
        out: list[Range] = []
        for event in sorted(found, key=lambda e: e.time_range.start):
            kids = ranges(event.cpu_children)
            if event.name == _MODE_FRAME:
                out.extend(kids)
                continue
            label = event.name.startswith(MODULE_PREFIX) or bool(getattr(event, "is_user_annotation", False))
            out.append(Range(
                event.name, int(event.time_range.start), int(event.time_range.end), 0, 0, kids,
                RangeFields(scope=USER_SCOPE if label else None),
            ))
        return out

    roots = ranges(e for e in events if e.cpu_parent is None)
    step = Range(STEP_NAME, 0, 0, 0, 0, roots)
    template = template_of_step(step)
    if template is None:
        raise TraceModelError("the model's call template is empty: its meta copy ran no module call")
    return replace(template, guesses=tuple(guesses.said) if guesses is not None else (), weighty=weighty)
