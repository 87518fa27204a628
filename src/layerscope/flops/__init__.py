"""FLOP and MAC counting per aten op: one registry, filled by decorators.

Conventions (docs/flops.md has every formula):

- ``macs`` counts multiply-accumulates; ``flops`` counts floating-point operations,
  2 per MAC plus the operations that are not MACs (bias adds, elementwise work,
  reductions, softmax, norms).
- Where ``torch.utils.flop_counter`` has a formula, its count is ``2 * macs`` exactly:
  those formulas are used, not copied.
- An op with no formula is *unsupported*: counted per module and name and shown to the
  user, never silently zero. Ops that do no arithmetic (views, copies, creation) are
  declared free, which is different from unknown.

Users register formulas for their own ops::

    @layerscope.register_flops("mylib::fused_gelu")
    def fused_gelu(args, kwargs, out):
        return 8 * out.numel(), 0      # (flops, macs)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

#: ``formula(args, kwargs, out) -> (flops, macs)``; args/kwargs are the op's real arguments.
Formula = Callable[[tuple[Any, ...], dict[str, Any], Any], tuple[int, int]]

_FORMULAS: dict[str, Formula] = {}


def _op_name(target: Any) -> str:
    """``"aten::add"`` from a string, an OpOverloadPacket or an OpOverload."""
    if isinstance(target, str):
        if "::" not in target:
            raise ValueError(f"op names look like 'namespace::name' (e.g. 'aten::add'), got {target!r}")
        return target
    qualified = getattr(target, "_qualified_op_name", None)  # OpOverloadPacket
    if qualified:
        return str(qualified)
    schema = getattr(target, "_schema", None)  # OpOverload
    if schema is not None:
        return str(schema.name)
    raise TypeError(f"cannot name op {target!r}; pass 'namespace::name' or torch.ops.namespace.name")


def register_flops(*targets: Any) -> Callable[[Formula], Formula]:
    """Register ``formula(args, kwargs, out) -> (flops, macs)`` for one or more ops.

    Registering an op that already has a formula is an error.
    """
    if not targets:
        raise TypeError("register_flops needs at least one op name")
    names = [_op_name(t) for t in targets]

    def decorate(formula: Formula) -> Formula:
        taken = [n for n in names if n in _FORMULAS]
        if taken:
            raise ValueError(f"a FLOP formula for {', '.join(taken)} is already registered")
        for name in names:
            _FORMULAS[name] = formula
        return formula

    return decorate


def unregister_flops(target: Any) -> None:
    """Remove a formula (for tests and for replacing one deliberately)."""
    _FORMULAS.pop(_op_name(target), None)


def _free(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> tuple[int, int]:
    return 0, 0


def declare_free(names: Iterable[str]) -> None:
    """Declare ops that do no floating-point arithmetic (views, copies, creation)."""
    register_flops(*names)(_free)


def is_free(name: str) -> bool:
    return _FORMULAS.get(name) is _free


def has_formula(name: str) -> bool:
    return name in _FORMULAS


def formula_for(name: str) -> Formula | None:
    return _FORMULAS.get(name)


def registered() -> list[str]:
    return sorted(_FORMULAS)


def _tensor_bytes(value: Any) -> int:
    # Called for every op's inputs and outputs: plain loops, no generators.
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    total = 0
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, torch.Tensor):
                total += item.numel() * item.element_size()
            elif isinstance(item, (tuple, list)):
                total += _tensor_bytes(item)
    return total


def count_op(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> tuple[int | None, int | None, int]:
    """``(flops, macs, bytes)`` of one op call; flops and macs are None when the op has
    no formula. ``bytes`` estimates traffic as the bytes of tensor inputs plus outputs
    (0 for free ops, which move no data through arithmetic units)."""
    formula = _FORMULAS.get(name)
    if formula is _free:
        return 0, 0, 0
    nbytes = _tensor_bytes(args) + _tensor_bytes(list(kwargs.values())) + _tensor_bytes(out)
    if formula is None:
        return None, None, nbytes
    try:
        flops, macs = formula(args, kwargs, out)
    except Exception:
        # A formula that cannot read this call's arguments must never break the user's
        # forward: the op is reported as unsupported instead.
        return None, None, nbytes
    return int(flops), int(macs), nbytes


# Filling the registry.
from layerscope.flops import formulas as _formulas  # noqa: E402,F401
