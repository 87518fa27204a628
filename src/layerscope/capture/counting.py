"""One untimed pass of a model, counted: forward, and in a training step its loss and
backward, under a dispatch mode (``count_flops``, and the eager figures of a compiled
model's profile and block). The model is left as it was: gradients, parameter and
buffer values and torch's random state."""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from layerscope.base.errors import DispatchModeError, LayerscopeWarning
from layerscope.capture import _torch
from layerscope.capture.assembly import Assembly, CapturePlan
from layerscope.capture.inputs import split_inputs
from layerscope.capture.modules import eager_calls, eager_module, note_raising_module, require_module
from layerscope.capture.training import grads_restored, loss_of, state_restored
from layerscope.model.raw import RawCapture

_T = TypeVar("_T")


def grad_mode(no_grad: bool | None, backward: bool) -> tuple[bool, contextlib.AbstractContextManager[Any]]:
    """``no_grad`` resolved (its default follows ``backward``) and the grad mode to run in."""
    if no_grad is None:
        no_grad = not backward
    if backward and no_grad:
        raise ValueError("backward=True needs gradients: drop no_grad=True (it is the default only without backward)")
    if no_grad:
        return True, torch.no_grad()
    return False, torch.enable_grad() if backward else contextlib.nullcontext()


#: torch's words when a backward or ``autograd.grad`` meets a graph built without
#: gradients: in a forward run under ``no_grad``, the model needs gradients itself.
_NEEDS_GRAD = ("does not require grad",)


def grad_retried(run: Callable[[bool | None], _T], no_grad: bool | None, backward: bool) -> _T:
    """``run(no_grad)``; where ``no_grad`` was left to its default and the forward, run
    without gradients, called autograd itself (a gradient penalty, forces as the
    gradient of an energy, ``torch.func`` inside ``forward``) and failed for it, the
    same run again with gradients on, and a warning that says so. The failed try left
    the model as it was (each entry point restores it)."""
    try:
        return run(no_grad)
    except RuntimeError as exc:
        if no_grad is not None or backward or not any(words in str(exc) for words in _NEEDS_GRAD):
            raise
    warnings.warn(
        "layerscope: the model's forward needs gradients (it calls autograd itself), so it ran with gradients "
        "on, not under torch.no_grad() (in Python, no_grad=False skips the first try)",
        LayerscopeWarning, stacklevel=3,
    )
    return run(False)


def run_step(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    capture: Assembly,
    *,
    backward: bool,
    loss_fn: Callable[[Any], Any] | None,
) -> None:
    """One pass: forward, and with ``backward`` the loss (a step part) and backward. An
    exception the model raises is noted with the module it came from."""
    run_calls(model, [(args, kwargs)], capture, backward=backward, loss_fn=loss_fn)


def run_calls(
    model: nn.Module,
    calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]],
    capture: Assembly,
    *,
    backward: bool,
    loss_fn: Callable[[Any], Any] | None,
) -> None:
    """:func:`run_step` of several calls of the model in one step (each call's positional
    and keyword arguments): their forwards in order, and with ``backward`` the sum of
    their losses (a step part) and one backward."""
    try:
        losses: list[torch.Tensor] = []
        for n, (args, kwargs) in enumerate(calls):
            output = model(*args, **kwargs)
            if inspect.isgenerator(output):
                warnings.warn(
                    "layerscope: the model's forward returned a generator: its work runs when the generator is "
                    "read, after the pass, so the profile holds only what ran before its first yield",
                    LayerscopeWarning, stacklevel=2,
                )
            if backward:
                with capture.part("loss", "loss"):
                    losses.append(loss_of(output, loss_fn))
                    if n == len(calls) - 1 and len(losses) > 1:
                        losses = [torch.stack([value.float() for value in losses]).sum()]
            del output
        if backward:
            (loss,) = losses
            del losses
            with capture.backward():
                loss.backward()
    except Exception as exc:
        refused = _torch.refused_higher_order(exc)
        if refused is not None:
            _torch.reset_compile_caches()  # the failed compile would refuse the user's own calls
            raise DispatchModeError(
                f"the model calls {refused}, a higher-order op that a dispatch mode cannot run "
                "(torch.compile runs it even eagerly, and refuses user dispatch modes)"
            ) from exc
        note_raising_module(exc, model)
        raise


def count_capture(
    model: nn.Module, inputs: Any, paths: Sequence[str] | None, no_grad: bool | None, backward: bool,
    loss_fn: Callable[[Any], Any] | None, memory: bool, *,
    calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]] | None = None,
) -> RawCapture:
    """The raw capture of ``count_flops``'s one untimed pass (its arguments; ``calls``:
    instead of ``inputs``, the calls of one step, each call's positional and keyword
    arguments as they were, run as :func:`run_calls` runs them): the tree, FLOPs, MACs,
    shapes and memory that a compiled model's profile and block take from its eager
    module too."""
    require_module(model)
    model = eager_module(model) or model  # a compiled model's FLOPs are its eager module's
    steps = list(calls) if calls is not None else [split_inputs(inputs)]
    try:
        return _counted(model, steps, paths, no_grad, backward, loss_fn, memory, torch_profiler=False)
    except DispatchModeError:
        # A higher-order op (flex_attention, cond) cannot run under the dispatch mode:
        # the same untimed pass is counted from torch's profiler's ops, as profile() is
        # (where torch's profiler is busy, the mode runs again and the one-line error
        # stands). A first forward outside it compiles the op's eager graph, so the
        # profiler sees the ops that run and not those torch.compile traces.
        _, grad = grad_mode(no_grad, backward)
        with eager_calls(model), grad, grads_restored(model, clear=False), state_restored(model):
            for args, kwargs in steps:
                model(*args, **kwargs)
        try:
            return _counted(model, steps, paths, no_grad, backward, loss_fn, memory, torch_profiler=True)
        except DispatchModeError as refused:
            raise DispatchModeError(
                f"{refused}; count_flops counts such a model from torch's profiler, "
                "which another profiler in this process holds now"
            ) from refused.__cause__


def _counted(
    model: nn.Module, steps: list[tuple[tuple[Any, ...], dict[str, Any]]], paths: Sequence[str] | None,
    no_grad: bool | None, backward: bool, loss_fn: Callable[[Any], Any] | None, memory: bool, *,
    torch_profiler: bool,
) -> RawCapture:
    """:func:`count_capture`'s pass, its ops read by the dispatch mode or by torch's profiler."""
    no_grad, grad = grad_mode(no_grad, backward)
    args, kwargs = steps[0]
    with eager_calls(model):  # a model compiled in place runs its eager forward for the count
        assembly = Assembly(CapturePlan(
            model, inputs=(args, kwargs), paths=paths, steps=backward, detail=True, memory=memory, timed=False,
            torch_profiler=torch_profiler,
        ))
        with assembly, grad, grads_restored(model, clear=backward) as clear_grads, state_restored(model):
            clear_grads()
            assembly.begin_step()
            try:
                run_calls(model, steps, assembly, backward=backward, loss_fn=loss_fn)
            finally:
                assembly.end_step()
        (op_pass,) = assembly.collect()
        return assembly.capture(op_pass=op_pass, mode="count", no_grad=no_grad, backward=backward)
