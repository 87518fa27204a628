"""Running an op on fake tensors built from metadata: no data, no memory, no arithmetic.

A backend that records input shapes but not outputs (torch's profiler) still needs
``out`` for the formulas that read it: the op is run on fake stand-ins of its inputs,
and its output's shapes are read.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from layerscope.flops.meta import TensorMeta, to_meta


def _packet(name: str) -> Any:
    namespace, _, op = name.partition("::")
    return getattr(getattr(torch.ops, namespace), op)


def _stand_ins(value: Any) -> Any:
    """Tensors for ``value``'s metadata; fake ones, under the caller's FakeTensorMode."""
    if isinstance(value, TensorMeta):
        return torch.empty(value.shape, dtype=value.dtype, device=value.device)
    if isinstance(value, list):
        return [_stand_ins(v) for v in value]
    if isinstance(value, tuple):
        return tuple([_stand_ins(v) for v in value])
    return value


def output_meta(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The output's metadata, or None when the op cannot run on fake tensors (its shape
    depends on data, or it has no fake implementation)."""
    try:
        with torch.no_grad(), FakeTensorMode():
            fake_args = _stand_ins(args)
            fake_kwargs = {k: _stand_ins(v) for k, v in kwargs.items()}
            return to_meta(_packet(name)(*fake_args, **fake_kwargs))
    except Exception:
        return None
