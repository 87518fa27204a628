"""Running an op on fake tensors built from metadata: no data, no memory, no arithmetic.

Two uses:

- **Output metadata.** A backend that records input shapes but not outputs (torch's
  profiler) still needs ``out`` for the formulas that read it: the op is run on fake
  stand-ins of its inputs, and its output's shapes are read.
- **Composite ops.** Ops that torch implements as a composite of other ops
  (``CompositeImplicitAutograd``: ``aten::linear``, ``aten::conv2d``, ``aten::layer_norm``,
  ``aten::scaled_dot_product_attention``, ...) are decomposed by autograd, so a dispatch
  mode sees their parts. Under ``torch.inference_mode()`` autograd is skipped and the
  dispatch mode sees the composite op itself. Such an op is counted by running it on
  fake stand-ins, outside inference mode, and counting each part with ``count_op``: the
  same flops, macs and bytes as its parts would have had.

Stand-ins are fake tensors with the metadata's device (a CPU stand-in picks the CPU
kernels, as the real call would), strides and ``requires_grad``, which torch reads to
choose a path (``matmul`` folds a non-contiguous input only for a weight that requires
grad). They run without grad, as the real call under inference mode does. Metadata
without strides (a profiler's shapes) stands for contiguous tensors.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from typing import Any

import torch

from layerscope.capture import _torch
from layerscope.capture._torch import FakeTensorMode, MissingTorchAPI
from layerscope.flops import Counts, count_op
from layerscope.flops.meta import TensorMeta, to_meta


def _packet(name: str) -> Any:
    namespace, _, op = name.partition("::")
    return getattr(getattr(torch.ops, namespace), op)


@functools.cache
def is_composite(name: str) -> bool:
    """Whether some overload of ``name`` is a ``CompositeImplicitAutograd`` op."""
    try:
        overloads = _packet(name).overloads()
    except (AttributeError, RuntimeError):
        return False
    for overload in overloads:
        qualified = name if overload == "default" else f"{name}.{overload}"
        try:
            if _torch.has_composite_kernel(qualified):
                return True
        except RuntimeError:  # TorchScript-only overloads (aten::to.prim_Device)
            continue
    return False


def _stand_ins(value: Any) -> Any:
    """Tensors for ``value``'s metadata; fake ones, under the caller's FakeTensorMode."""
    if isinstance(value, TensorMeta):
        if value.stride is None:
            tensor = torch.empty(value.shape, dtype=value.dtype, device=value.device)
        else:
            tensor = torch.empty_strided(value.shape, value.stride, dtype=value.dtype, device=value.device)
        return tensor.requires_grad_() if value.requires_grad else tensor
    if isinstance(value, list):
        return [_stand_ins(v) for v in value]
    if isinstance(value, tuple):
        return tuple([_stand_ins(v) for v in value])
    return value


@functools.cache
def _default_keys() -> tuple[Any, Any]:
    """The dispatcher's thread-local key sets outside any mode, read on a new thread.

    Inside a dispatch mode's handler (the recorder's, which calls count_op) every key
    above it is excluded, autograd's too, and a composite would decompose below autograd:
    its views would not carry requires_grad, and matmul would take another path."""
    return _torch.default_dispatch_keys()


@contextlib.contextmanager
def _fake_quiet() -> Any:
    """The fake mode logs each op it cannot run, with a traceback, before raising; the
    caller reports the figure as unknown instead, so that log is held back."""
    log = logging.getLogger(_torch.FAKE_TENSOR_LOGGER)
    was = log.disabled
    log.disabled = True
    try:
        yield
    finally:
        log.disabled = was


def _run(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], counter: _PartCounter | None = None) -> Any:
    """The op's output on fake stand-ins, as at top level outside inference mode, without
    grad; with ``counter``, the ops it runs are counted (it sits above the fake mode)."""
    with torch.inference_mode(False), torch.no_grad(), _torch.force_dispatch_keys(*_default_keys()), _fake_quiet():
        with FakeTensorMode():
            fake_args = _stand_ins(args)
            fake_kwargs = {k: _stand_ins(v) for k, v in kwargs.items()}
            with counter if counter is not None else contextlib.nullcontext():
                return _packet(name)(*fake_args, **fake_kwargs)


#: In-place ops that change their tensor's shape or strides: their output is not their
#: input's metadata.
_RESHAPES_IN_PLACE = frozenset({
    "resize_", "resize_as_", "set_", "squeeze_", "unsqueeze_", "transpose_", "t_", "as_strided_",
    "swapdims_", "swapaxes_", "_resize_output_", "resize_as_sparse_", "sparse_resize_", "sparse_resize_and_clear_",
})


@functools.cache
def _in_place(name: str) -> str | None:
    """How every overload of ``name`` returns, when its schema alone says what its output
    is: "nothing" (``_foreach_add_``: ``-> ()``) or "self" (``add_``: the first input,
    written in place, is the output); else None (the op has to run)."""
    try:
        packet = _packet(name)
        schemas = [_torch.op_schema(getattr(packet, overload)) for overload in packet.overloads()]
    except (AttributeError, RuntimeError):
        return None
    # TorchScript's list overloads (``add_.t``: ``t[](a!) self``) never reach a profiler.
    schemas = [s for s in schemas if not s.arguments or str(s.arguments[0].type) in ("Tensor", "List[Tensor]")]
    if schemas and all(not schema.returns for schema in schemas):
        return "nothing"

    def returns_self(schema: Any) -> bool:
        if len(schema.returns) != 1 or not schema.arguments:
            return False
        out, first = schema.returns[0].alias_info, schema.arguments[0].alias_info
        return out is not None and out.is_write and first is not None and out.before_set == first.before_set

    bare = name.partition("::")[2]
    if schemas and bare not in _RESHAPES_IN_PLACE and all(returns_self(schema) for schema in schemas):
        return "self"
    return None


def output_meta(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The output's metadata, or None when the op cannot run on fake tensors (its shape
    depends on data, or it has no fake implementation). An in-place op's output is read
    from its schema, without running it: the optimizer's ``_foreach_*_`` calls over every
    parameter were most of the cost of a training step's counts."""
    returns = _in_place(name)
    if returns == "nothing":
        return None
    if returns == "self" and args and isinstance(args[0], TensorMeta):
        return args[0]
    try:
        return to_meta(_run(name, args, kwargs))
    except MissingTorchAPI:
        raise
    except Exception:
        return None


class _PartCounter(_torch.DispatchMode):  # type: ignore[misc]
    """Sums ``count_op`` over the ops a composite decomposes into."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: int | None = 0
        self.macs: int | None = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = _torch.op_name(func)
        if name.startswith("prim::"):  # the fake tensors' own queries (prim::device)
            return out
        flops, macs, nbytes = count_op(name, args, kwargs, out)
        self.bytes += nbytes
        if flops is None or macs is None or self.flops is None or self.macs is None:
            self.flops = self.macs = None
        else:
            self.flops += flops
            self.macs += macs
        return out


#: Per thread, the composites being decomposed: one met again among its own parts (an
#: overload that is not composite, with no formula) is unsupported, not decomposed forever.
_decomposing = threading.local()


def count_decomposition(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Counts | None:
    """``(flops, macs, bytes)`` of a composite op, summed over its parts; None when it
    cannot run on fake tensors. Unsupported if any part is."""
    names: set[str] = _decomposing.__dict__.setdefault("names", set())
    if name in names:
        return None
    counter = _PartCounter()
    names.add(name)
    try:
        _run(name, args, kwargs, counter)
    except MissingTorchAPI:
        raise
    except Exception:
        return None
    finally:
        names.discard(name)
    return counter.flops, counter.macs, counter.bytes
