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
- Formulas count from metadata: in ``args``, ``kwargs`` and ``out`` every tensor is a
  ``TensorMeta`` (shape, dtype, device; ``.numel()``, ``.dim()``, ``.size(i)``, ...),
  never a live tensor, and scalars are as the op got them. So one formula serves every
  capture backend, and runs once per distinct call signature (``count_op`` caches).
- An op with no formula that torch implements as a composite of other ops (under
  ``torch.inference_mode()`` the dispatcher shows ``aten::linear`` instead of ``aten::t``
  + ``aten::addmm``) is counted by its decomposition, run on fake tensors: the same
  flops, macs and bytes as its parts when autograd decomposes it.

Users register formulas for their own ops::

    @layerscope.register_flops("mylib::fused_gelu")
    def fused_gelu(args, kwargs, out):
        return 8 * out.numel(), 0      # (flops, macs); out is a TensorMeta
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from layerscope.base.comm import is_communication, payload_bytes
from layerscope.flops.meta import TensorMeta, Uncacheable, signature, tensor_bytes, to_meta

__all__ = [
    "Counts", "Formula", "TensorMeta", "count_meta", "count_op", "declare_free", "formula_for",
    "has_formula", "is_free", "register_flops", "registered", "unregister_flops",
]

#: ``formula(args, kwargs, out) -> (flops, macs)``; every tensor in them is a ``TensorMeta``.
Formula = Callable[[tuple[Any, ...], dict[str, Any], Any], tuple[int, int]]
#: ``(flops, macs, bytes)`` of one call; flops and macs are None for an unsupported op.
Counts = tuple[int | None, int | None, int]

_FORMULAS: dict[str, Formula] = {}

#: Counts per call signature. Cleared when the registry changes, and when it grows past
#: ``_CACHE_LIMIT`` entries, so memory stays bounded whatever a run's shapes.
_CACHE: dict[Any, Counts] = {}
_CACHE_LIMIT = 4096
#: How often the registry changed: caches of counts kept elsewhere check it.
_GENERATION = [0]


def generation() -> int:
    """A number that changes whenever a formula is registered or removed."""
    return _GENERATION[0]


def _remember(key: Any, counts: Counts) -> Counts:
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()
    try:
        _CACHE[key] = counts
    except TypeError:
        pass  # unhashable, see _cached
    return counts


def _op_name(target: Any) -> str:
    """``"aten::add"`` from a string, an OpOverloadPacket or an OpOverload."""
    if isinstance(target, str):
        if "::" not in target:
            raise ValueError(f"op names look like 'namespace::name' (e.g. 'aten::add'), got {target!r}")
        return target
    from layerscope.capture import _torch

    qualified = _torch.packet_name(target)  # OpOverloadPacket
    if qualified:
        return str(qualified)
    try:
        return str(_torch.op_name(target))  # OpOverload
    except AttributeError:
        pass
    raise TypeError(f"cannot name op {target!r}; pass 'namespace::name' or torch.ops.namespace.name")


def register_flops(*targets: Any) -> Callable[[Formula], Formula]:
    """Register ``formula(args, kwargs, out) -> (flops, macs)`` for one or more ops.

    The formula gets the call's metadata: each tensor argument and output is a
    ``TensorMeta`` (``.shape``, ``.dtype``, ``.numel()``, ...), not a tensor. It must
    count from those and the scalar arguments alone: its result is cached per signature.
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
        _CACHE.clear()
        _GENERATION[0] += 1
        return formula

    return decorate


def unregister_flops(target: Any) -> None:
    """Remove a formula (for tests and for replacing one deliberately)."""
    _FORMULAS.pop(_op_name(target), None)
    _CACHE.clear()
    _GENERATION[0] += 1


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


def _cache_key(name: str, args: Any, kwargs: dict[str, Any], out: Any, detailed: bool) -> Any:
    """The call's signature, or None when it is not to be cached."""
    try:
        return (
            name,
            signature(args, detailed),
            tuple([(k, signature(v, detailed)) for k, v in kwargs.items()]),
            signature(out, detailed),
        )
    except Uncacheable:
        return None


def _cached(key: Any) -> Counts | None:
    try:
        return _CACHE.get(key)
    except TypeError:  # unhashable (symbolic sizes): counted uncached
        return None


def count_op(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Counts:
    """``(flops, macs, bytes)`` of one op call on live tensors; flops and macs are None
    when the op has no formula. ``bytes`` estimates traffic as the bytes of tensor inputs
    plus outputs (0 for free ops, which move no data through arithmetic units).

    The tensors are converted to ``TensorMeta`` and the formula runs once per distinct
    signature (op, shapes, dtypes, devices, scalar arguments); repeats come from a cache."""
    formula = _FORMULAS.get(name)
    if formula is _free:
        return 0, 0, 0
    # A composite's decomposition may depend on strides and requires_grad: keep them.
    detailed = formula is None and fake.is_composite(name)
    key = _cache_key(name, args, kwargs, out, detailed)
    cached = None if key is None else _cached(key)
    if cached is not None:
        return cached
    counts = _count(name, formula, to_meta(args, detailed), to_meta(kwargs, detailed), to_meta(out, detailed))
    return counts if key is None else _remember(key, counts)


def count_meta(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any = None) -> Counts:
    """``(flops, macs, bytes)`` of one op call described by metadata alone: tensors in
    ``args``, ``kwargs`` and ``out`` are ``TensorMeta`` (a backend that records shapes
    but no tensors builds them). With ``out=None`` the output's metadata is derived by
    running the op on fake tensors, for the formulas that read it; an op with no formula
    that torch implements as a composite (``aten::linear``) is counted by its
    decomposition (``layerscope.flops.fake``)."""
    formula = _FORMULAS.get(name)
    if formula is _free:
        return 0, 0, 0
    key = _cache_key(name, args, kwargs, out, detailed=False)
    cached = None if key is None else _cached(key)
    if cached is not None:
        return cached
    if out is None and (formula is not None or not fake.is_composite(name)):
        out = fake.output_meta(name, args, kwargs)
    counts = _count(name, formula, args, kwargs, out)
    return counts if key is None else _remember(key, counts)


def _count(name: str, formula: Formula | None, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Counts:
    if is_communication(name):
        # A collective does no arithmetic worth counting; its bytes are its payload.
        return 0, 0, payload_bytes(name, args, out, tensor_bytes)
    if formula is None and fake.is_composite(name):
        decomposed = fake.count_decomposition(name, args, kwargs)
        if decomposed is not None:
            return decomposed
    nbytes = tensor_bytes(args) + tensor_bytes(list(kwargs.values())) + tensor_bytes(out)
    if formula is None:
        return None, None, nbytes
    try:
        flops, macs = formula(args, kwargs, out)
    except Exception:
        # A formula that cannot read this call's arguments must never break the user's
        # forward: the op is reported as unsupported instead.
        return None, None, nbytes
    return int(flops), int(macs), nbytes


# Filling the registry; composites and output shapes need count_op defined.
from layerscope.flops import fake  # noqa: E402
from layerscope.flops import formulas as _formulas  # noqa: E402,F401
