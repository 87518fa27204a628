"""What a FLOP formula sees of an op call: each tensor as its shape, dtype and device.

Formulas count from metadata, never from data, so every capture backend can use them:
the dispatch mode converts its live tensors here (``to_meta``), and a backend that
records only shapes (torch's profiler) builds the same records itself. A call's
metadata, made hashable, is also its ``signature``: the key of ``count_op``'s cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

_CPU = torch.device("cpu")

#: Longer lists (a ``_foreach_*`` op's parameters) are not cached: their keys would be
#: large, and their formulas are a sum over the list that costs about as much as a key.
MAX_CACHED_LIST = 16


@dataclass(frozen=True)
class TensorMeta:
    """A tensor without its data, as a formula reads it: ``.shape``, ``.dtype``,
    ``.numel()``, ``.dim()`` / ``.ndim``, ``.size(i)``, ``.element_size()``,
    ``.is_floating_point()``.

    ``device``, ``stride`` (None: contiguous) and ``requires_grad`` are what torch reads
    to choose the kernels a composite op decomposes into (``layerscope.flops.fake``);
    formulas do not read them, and the last two are kept for composite ops only."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device = _CPU
    stride: tuple[int, ...] | None = None
    requires_grad: bool = False

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def size(self, dim: int | None = None) -> Any:
        return tuple(self.shape) if dim is None else self.shape[dim]

    def element_size(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self.dtype.itemsize

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def is_complex(self) -> bool:
        return self.dtype.is_complex

    # torch's attention formulas ask, to unpack nested (jagged) inputs.
    is_nested = False

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]


def to_meta(value: Any, detailed: bool = False) -> Any:
    """``value`` with every tensor replaced by its ``TensorMeta`` (``detailed``: with its
    strides and ``requires_grad``); lists, tuples and dicts (kwargs) keep their kind (a
    structseq output becomes a tuple), anything else is kept as it is."""
    if isinstance(value, torch.Tensor):
        if detailed:
            return TensorMeta(value.shape, value.dtype, value.device, value.stride(), value.requires_grad)
        return TensorMeta(value.shape, value.dtype, value.device)
    if isinstance(value, list):
        return [to_meta(v, detailed) for v in value]
    if isinstance(value, tuple) and not isinstance(value, torch.Size):
        return tuple([to_meta(v, detailed) for v in value])
    if isinstance(value, dict):
        return {k: to_meta(v, detailed) for k, v in value.items()}
    return value


class Uncacheable(Exception):
    """A call whose signature would be too large to keep (see ``MAX_CACHED_LIST``)."""


def signature(value: Any, detailed: bool = False) -> Any:
    """A hashable stand-in for a live or metadata value: a tensor is ``(shape, dtype)``
    (``detailed``: and device, strides and ``requires_grad``), a list a tuple. Called for
    every counted op.

    Raises ``Uncacheable`` for long lists, and hashing the result raises ``TypeError``
    for unhashable arguments (symbolic sizes); such calls are counted uncached."""
    if isinstance(value, torch.Tensor):
        if detailed:
            return value.shape, value.dtype, value.device, value.stride(), value.requires_grad
        return value.shape, value.dtype
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_CACHED_LIST:
            raise Uncacheable
        return tuple([signature(v, detailed) for v in value])
    if isinstance(value, TensorMeta):
        stride = None if value.stride is None else tuple(value.stride)
        return "TensorMeta", tuple(value.shape), value.dtype, value.device, stride, value.requires_grad
    # NB: other objects (a torch.Generator) hash by identity. No formula reads them.
    return value


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in ``value`` (metadata, nested in lists and tuples)."""
    if isinstance(value, TensorMeta):
        return value.numel() * value.dtype.itemsize
    if isinstance(value, (tuple, list)):
        return sum([tensor_bytes(item) for item in value])
    return 0
