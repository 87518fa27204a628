"""What ``profile(..., backward=True)`` needs around the model: a loss to call backward
on, and the parameters' ``.grad`` left exactly as the user had them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from layerscope.errors import InputsError


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
    """Keep every parameter's ``.grad`` as it was; yields a function that clears them
    (each measured pass starts from no gradients, so passes do the same work)."""
    if not clear:
        yield lambda: None
        return
    params = list(model.parameters())
    saved = [p.grad for p in params]

    def clear_all() -> None:
        for p in params:
            p.grad = None

    try:
        yield clear_all
    finally:
        for p, grad in zip(params, saved):
            p.grad = grad
