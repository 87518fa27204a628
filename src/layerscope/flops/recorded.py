"""An op call as torch's profiler recorded it (``record_shapes``), turned into what the
FLOP formulas read: the call's arguments with every tensor a ``TensorMeta``.

The profiler records each op's inputs in schema order, keyword-only ones included:
tensors as their metadata (shape, strides, dtype, device, the allocation they live in),
lists of tensors as lists, plain scalars as values. Lists of ints (a convolution's
stride, a reduction's dims) are recorded only as the call's *concrete inputs*, read from
the flat event list; strings (``gelu``'s ``approximate``) are not recorded at all, and
their schema default stands in (no formula of layerscope's reads one).

The overload (``capture_overload_names``) gives the schema, which says which inputs are
keyword-only, and whether the op is a ``CompositeImplicitAutograd`` composite (its work
is done by the ops nested in it, each counted on its own).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from layerscope.capture import _torch
from layerscope.convert.ranges import NOT_RECORDED, SCALAR, TENSOR, TENSORS, UNKNOWN
from layerscope.flops import Counts, count_meta, generation, is_free
from layerscope.flops.meta import TensorMeta


def _packet(name: str) -> Any:
    namespace, _, op = name.partition("::")
    if not op:
        return None
    try:
        return getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return None


@functools.lru_cache(maxsize=4096)
def _overload(name: str, overload: str) -> Any:
    packet = _packet(name)
    if packet is None:
        return None
    try:
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        return None


@functools.lru_cache(maxsize=4096)
def is_dispatcher_op(name: str) -> bool:
    """Whether ``name`` is an op of torch's dispatcher (``aten::mm``), not a range of the
    autograd engine or a custom ``Function`` (``AddmmBackward0``, ``torch::autograd::AccumulateGrad``)."""
    return _packet(name) is not None


@functools.lru_cache(maxsize=4096)
def is_composite(name: str, overload: str) -> bool:
    """Whether this overload is implemented by other ops (``CompositeImplicitAutograd``),
    which torch's profiler shows nested in it (``aten::linear`` over ``aten::addmm``)."""
    qualified = name if overload in ("", "default") else f"{name}.{overload}"
    try:
        return _torch.has_composite_kernel(qualified)
    except RuntimeError:
        return False


def _meta(value: Any) -> Any:
    """A recorded input as a formula reads it: tensor metadata becomes a ``TensorMeta``."""
    if isinstance(value, list):
        return [_meta(v) for v in value]
    sizes = getattr(value, "sizes", None)
    if sizes is not None:
        return TensorMeta(tuple(sizes), value.dtype, value.device)
    return value


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, TensorMeta):
        return value.shape, value.dtype, value.device
    return value


def _key(values: list[Any]) -> tuple[Any, ...]:
    """The inputs as a cache key. A plain float input of a call on tensors (an
    optimizer's step size, which changes every step) is keyed by its type alone: no
    formula reads one, and no output shape depends on one (a float in a list, an
    interpolation's scale factors, is kept)."""
    on_tensors = any(isinstance(v, TensorMeta) for v in values)
    return tuple("float" if on_tensors and type(v) is float else _hashable(v) for v in values)


#: Counts per recorded call signature, for one generation of the formulas' registry
#: (bounded: cleared when full).
_COUNTS: dict[Any, Counts] = {}
_COUNTS_LIMIT = 8192
_COUNTS_GENERATION = [-1]


def recorded_call(name: str, overload: str, inputs: list[Any], concrete: list[Any] | None) -> tuple[Any, list[Any]]:
    """``(signature, values)`` of one recorded call: its inputs as a formula reads them
    (``concrete`` inputs, the int lists, filled in), and a hashable key for them (None
    when they cannot be hashed)."""
    values = [_meta(v) for v in inputs]
    if concrete:
        for i, (value, known) in enumerate(zip(values, concrete)):
            if value is None and known is not None:
                values[i] = known
    key: Any = (name, overload, _key(values))
    try:
        hash(key)
    except TypeError:
        key = None
    return key, values


def count_recorded(name: str, overload: str, inputs: list[Any], concrete: list[Any] | None) -> Counts:
    """``(flops, macs, bytes)`` of one recorded call, through the formulas' registry
    (``count_meta``), once per distinct signature."""
    key, values = recorded_call(name, overload, inputs, concrete)
    return count_call(key, name, overload, values)


def count_call(key: Any, name: str, overload: str, values: list[Any]) -> Counts:
    if _COUNTS_GENERATION[0] != generation():
        _COUNTS.clear()
        _COUNTS_GENERATION[0] = generation()
    found = _COUNTS.get(key) if key is not None else None
    if found is not None:
        return found
    args, kwargs = _split(name, overload, values)
    counts = count_meta(name, args, kwargs)
    if key is not None:
        if len(_COUNTS) >= _COUNTS_LIMIT:
            _COUNTS.clear()
        _COUNTS[key] = counts
    return counts


def _split(name: str, overload: str, values: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional and keyword arguments by the schema: keyword-only inputs are passed by
    name, and inputs that were not recorded (None where the schema has a default) are
    left to their defaults."""
    op = _overload(name, overload)
    if op is None:
        return tuple(values), {}
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    by_name = False  # after a positional input left to its default, the rest go by name
    for argument, value in zip(_torch.op_schema(op).arguments, values):
        if value is None and argument.has_default_value():
            by_name = True
            continue
        if argument.kwarg_only or by_name:
            kwargs[argument.name] = value
        else:
            args.append(value)
    return tuple(args), kwargs


_NUMBERS = frozenset({"NumberType", "IntType", "FloatType", "BoolType", "SymIntType", "SymFloatType", "SymBoolType", "ComplexType"})
#: Places a trace records no value for (strings, generators): an input recorded as nothing.
_UNRECORDED = frozenset({"StringType", "DeviceObjType", "GeneratorType", "AnyType", "LayoutType", "ScalarTypeType", "MemoryFormatType"})


def _fits(argument: Any, kind: str) -> bool:
    """Whether a schema argument can take an input of ``kind``."""
    t = argument.type
    optional = t.kind() == "OptionalType"
    if optional:
        t = t.getElementType()
    found = t.kind()
    if kind == UNKNOWN:
        return optional or argument.has_default_value() or found in _UNRECORDED
    if kind == TENSOR:
        return found == "TensorType"
    if kind == SCALAR:
        return found in _NUMBERS or found in _UNRECORDED
    if found != "ListType":
        return False
    element = t.getElementType()
    if element.kind() == "OptionalType":
        element = element.getElementType()
    is_tensor = element.kind() == "TensorType"
    return is_tensor if kind == TENSORS else not is_tensor


@functools.lru_cache(maxsize=8192)
def overload_for(name: str, kinds: tuple[str, ...]) -> str:
    """The overload of ``name`` whose schema takes inputs of these ``kinds`` (a trace
    file records no overload names): one with a place of the right kind for each input
    and a default for each place after them, the one with the fewest such places (the
    first listed among equals); ``out=`` variants only if nothing else fits. ``""`` (the
    default overload) when none does."""
    packet = _packet(name)
    if packet is None:
        return ""
    try:
        overloads = packet.overloads()
    except (AttributeError, RuntimeError):
        return ""
    best: tuple[int, int, str] | None = None
    for order, overload in enumerate(overloads):
        op = _overload(name, overload)
        if op is None:
            continue
        arguments = _torch.op_schema(op).arguments
        if len(arguments) < len(kinds) or not all(_fits(a, k) for a, k in zip(arguments, kinds)):
            continue
        rest = arguments[len(kinds) :]
        if not all(a.has_default_value() or a.type.kind() == "OptionalType" for a in rest):
            continue
        rank = (len(rest) + (1000 if any(a.is_out for a in arguments) else 0), order, overload)
        if best is None or rank < best:
            best = rank
    return "" if best is None else best[2]


class TorchOps:
    """The op catalog of the torch running here, as the conversion asks it
    (``layerscope.convert.streams.OpCatalog``)."""

    shapes = True

    def is_dispatcher_op(self, name: str) -> bool:
        return is_dispatcher_op(name)

    def is_composite(self, name: str, overload: str) -> bool:
        return is_composite(name, overload)

    def counts(self, name: str, overload: str, inputs: list[Any], concrete: list[Any] | None) -> tuple[Any, Counts]:
        if any(value is NOT_RECORDED for value in inputs):
            if is_free(name):
                return None, (0, 0, 0)  # no arithmetic (cat, stack): nothing its shapes could add
            return None, (None, None, 0)  # an input's shapes were left out: unknown, listed as such
        key, values = recorded_call(name, overload, inputs, concrete)
        return key, count_call(key, name, overload, values)


CATALOG = TorchOps()
