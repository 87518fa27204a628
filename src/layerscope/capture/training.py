"""What ``profile()`` and ``count_flops()`` need around the model: a loss to call
backward on, and the model left exactly as the user had it: parameters' ``.grad``,
parameter and buffer values (a train-mode BatchNorm moves its statistics in every
pass), and torch's random state (dropout draws from it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from layerscope.base.errors import InputsError
from layerscope.capture import _torch


def first_float_tensor(output: Any) -> torch.Tensor | None:
    """The first floating-point tensor in ``output``, searched depth first through
    tuples, lists and dicts (a ``transformers`` ``ModelOutput`` is a dict)."""
    stack = [output]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.is_floating_point() or item.is_complex():
                return item
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, (tuple, list)):
            stack.extend(reversed(item))
    return None


def loss_of(output: Any, loss_fn: Callable[[Any], Any] | None) -> torch.Tensor:
    """The scalar to call ``backward`` on: ``loss_fn(output)``, or the sum of the first
    floating-point tensor in the output."""
    if loss_fn is not None:
        loss = loss_fn(output)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise InputsError(
                f"loss_fn must return a one-element tensor to call backward on; it returned "
                f"{type(loss).__name__}{'' if not isinstance(loss, torch.Tensor) else ' of shape ' + str(list(loss.shape))}"
            )
        return loss.reshape(())
    tensor = first_float_tensor(output)
    if tensor is None or not tensor.requires_grad:
        found = "no floating-point tensor" if tensor is None else "a tensor that does not require grad"
        raise InputsError(
            f"backward=True needs a loss: the model's output holds {found}; pass "
            "loss_fn=, a function of the output returning a scalar tensor"
        )
    return tensor.sum()


@contextmanager
def grads_restored(model: nn.Module, *, clear: bool = True) -> Iterator[Callable[[], None]]:
    """Keep every parameter's ``.grad`` object as it was (a forward may run backward
    itself); yields a function that clears them when ``clear`` (each measured pass of a
    step starts from no gradients, so passes do the same work)."""
    params = list(model.parameters())
    saved = [p.grad for p in params]

    def clear_all() -> None:
        if clear:
            for p in params:
                p.grad = None

    try:
        yield clear_all
    finally:
        for p, grad in zip(params, saved):
            p.grad = grad


@contextmanager
def state_restored(model: nn.Module) -> Iterator[None]:
    """Put every parameter's, existing gradient's and buffer's value and torch's global
    random state back as they were, when the block ends or raises.

    Restored in place (``copy_`` into the same tensor objects), so references a user
    holds stay valid, and only where a tensor changed: its version counter moved or its
    value differs (BatchNorm updates its running statistics without moving theirs).
    Untouched tensors are never written, so an autograd graph the user built before
    stays valid. The copies live in host memory: the device's memory, and what the
    profile reports of it, are not doubled. Meta tensors hold no values to keep.
    """
    saved = [(tensor, _version(tensor), tensor.detach().to("cpu", copy=True)) for tensor in _state_tensors(model)]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        for tensor, version, value in saved:
            if _version(tensor) != version or not torch.equal(tensor.detach().cpu(), value):
                # A model built under inference_mode holds inference tensors: those
                # can be written only inside it.
                with torch.inference_mode() if tensor.is_inference() else torch.no_grad():
                    tensor.copy_(value)


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter (None for an inference tensor, which has none)."""
    return None if tensor.is_inference() else _torch.tensor_version(tensor)


def _state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The model's parameters, their existing gradients and its buffers that hold
    values, each once."""
    seen: set[int] = set()
    tensors = []
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    for tensor in (*params, *grads, *model.buffers()):
        if id(tensor) not in seen and tensor.device.type != "meta":
            seen.add(id(tensor))
            tensors.append(tensor)
    return tensors
