"""Model inputs: how a Tensor, tuple/list or dict becomes ``forward``'s arguments, and
how shapes are recorded as plain data (never references to tensors)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from layerscope.base.errors import InputsError

#: Longest sequence whose items are described one by one; longer ones are cut short.
_MAX_ITEMS = 64


def split_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``inputs`` as ``(args, kwargs)``: a Tensor is one positional argument, a tuple or
    list is the positional arguments, a dict is the keyword arguments, None is none."""
    if inputs is None:
        return (), {}
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    if isinstance(inputs, dict):
        bad = [k for k in inputs if not isinstance(k, str)]
        if bad:
            raise InputsError(f"keyword inputs need string keys, got {bad[:3]!r}")
        return (), dict(inputs)
    raise InputsError(
        f"inputs must be a Tensor, a tuple/list of positional arguments or a dict of keyword "
        f"arguments; got {type(inputs).__name__}"
    )


def check_signature(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise :class:`InputsError` naming what ``forward`` takes when the inputs don't fit."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return  # builtins and C++ modules hide their signature: let the call decide
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        given = ", ".join([describe_value(a) for a in args] + [f"{k}={describe_value(v)}" for k, v in kwargs.items()])
        raise InputsError(
            f"inputs do not fit {type(model).__name__}.forward{signature}: {exc}; "
            f"given ({given or 'nothing'})"
        ) from None


def describe_value(value: Any) -> str:
    """A short human description of one argument, for error messages."""
    if isinstance(value, torch.Tensor):
        return f"Tensor{list(value.shape)}:{dtype_name(value.dtype)}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(describe_value(v) for v in list(value)[:4])
        more = ", ..." if len(value) > 4 else ""
        return f"{type(value).__name__}({inner}{more})"
    if isinstance(value, dict):
        return "dict(" + ", ".join(f"{k}={describe_value(v)}" for k, v in list(value.items())[:4]) + ")"
    return type(value).__name__


def shapes_of(value: Any) -> Any:
    """Shapes in ``value`` as JSON-ready data: a tensor becomes its shape as a list, a
    tuple/list a list, a dict (or ModelOutput) a dict; anything else None."""
    return _tensor_data(value, lambda tensor: list(tensor.shape))


def dtypes_of(value: Any) -> Any:
    """Dtype names in ``value`` (``"int64"``), nested as :func:`shapes_of` nests shapes."""
    return _tensor_data(value, lambda tensor: dtype_name(tensor.dtype))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _tensor_data(value: Any, of_tensor: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return of_tensor(value)
    if isinstance(value, (tuple, list)):
        return [_tensor_data(v, of_tensor) for v in value[:_MAX_ITEMS]]
    if isinstance(value, dict):
        return {str(k): _tensor_data(v, of_tensor) for k, v in list(value.items())[:_MAX_ITEMS]}
    return None


def op_input_shapes(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Shapes of an op's tensor arguments (lists of tensors nest), non-tensors dropped,
    as torch.profiler's ``record_shapes`` shows them but without keeping the tensors.

    Called for every op, so it returns ``torch.Size`` tuples as they are (hashable, no
    copy); ``attribute`` turns them into lists once per op row."""
    shapes: list[Any] = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            shapes.append(arg.shape)
        elif isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], torch.Tensor):
            shapes.append(tuple(t.shape for t in arg if isinstance(t, torch.Tensor)))
    return tuple(shapes)
