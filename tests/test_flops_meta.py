"""Formulas count from metadata: the per-signature cache, and ``count_meta`` against
live tensors.

A backend that records shapes but no tensors (torch's profiler) calls ``count_meta``
with ``TensorMeta``s and no output; its numbers must be those of the live op.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import layerscope
import layerscope.flops as flops
from layerscope.flops import TensorMeta, count_meta, count_op, register_flops, unregister_flops
from layerscope.flops.meta import to_meta
from test_flops_formulas import Fn, randn

# -- TensorMeta ------------------------------------------------------------------------------


def test_tensor_meta_reads_like_a_tensor() -> None:
    x = randn(2, 3, 4).to(torch.float16)
    meta = to_meta(x)
    assert isinstance(meta, TensorMeta)
    for read in (
        lambda t: tuple(t.shape), lambda t: t.dtype, lambda t: t.numel(), lambda t: t.dim(), lambda t: t.ndim,
        lambda t: t.size(1), lambda t: tuple(t.size()), lambda t: t.element_size(), lambda t: t.nbytes,
        lambda t: t.is_floating_point(), lambda t: len(t),
    ):  # fmt: skip
        assert read(meta) == read(x)
    # Nesting is kept: lists stay lists, tuples tuples, scalars as they are.
    assert to_meta([x, (x, 3), None, 1.5]) == [meta, (meta, 3), None, 1.5]


# -- the cache ---------------------------------------------------------------------------------


@torch.library.custom_op("lstest::meta_twice", mutates_args=())
def lstest_twice(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@pytest.fixture
def calls() -> Iterator[list[Any]]:
    """A formula for lstest::meta_twice that records what it is called with."""
    seen: list[Any] = []

    @register_flops("lstest::meta_twice")
    def formula(args: Any, kwargs: Any, out: Any) -> tuple[int, int]:
        seen.append((args, out))
        return out.numel(), 0

    try:
        yield seen
    finally:
        unregister_flops("lstest::meta_twice")


def test_a_formula_runs_once_per_signature(calls: list[Any]) -> None:
    x = randn(2, 3)
    for _ in range(5):
        assert count_op("lstest::meta_twice", (x, 2.0), {}, lstest_twice(x, 2.0)) == (6, 0, 48)
    assert len(calls) == 1
    # It got metadata, not tensors.
    (args, out), = calls
    assert args == (TensorMeta(torch.Size([2, 3]), torch.float32), 2.0)
    assert out == TensorMeta(torch.Size([2, 3]), torch.float32)
    # A new shape, dtype or scalar is a new signature.
    y = randn(4, 3)
    count_op("lstest::meta_twice", (y, 2.0), {}, lstest_twice(y, 2.0))
    count_op("lstest::meta_twice", (x.double(), 2.0), {}, lstest_twice(x.double(), 2.0))
    count_op("lstest::meta_twice", (x, 3.0), {}, lstest_twice(x, 3.0))
    assert len(calls) == 4


def test_a_module_called_many_times_counts_once(calls: list[Any]) -> None:
    twice = Fn(lambda x: lstest_twice(lstest_twice(lstest_twice(x, 2.0), 2.0), 2.0))
    prof = layerscope.count_flops(twice, randn(2, 3))
    assert prof.root.forward.flops == 3 * 6  # three calls counted ...
    assert len(calls) == 1  # ... by one run of the formula


def test_registering_clears_the_cache(calls: list[Any]) -> None:
    x = randn(2, 3)
    count_op("lstest::meta_twice", (x, 2.0), {}, lstest_twice(x, 2.0))
    unregister_flops("lstest::meta_twice")
    assert count_op("lstest::meta_twice", (x, 2.0), {}, lstest_twice(x, 2.0)) == (None, None, 48)
    register_flops("lstest::meta_twice")(lambda args, kwargs, out: (7, 0))
    assert count_op("lstest::meta_twice", (x, 2.0), {}, lstest_twice(x, 2.0)) == (7, 0, 48)


def test_the_cache_stays_bounded(calls: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flops, "_CACHE_LIMIT", 8)
    for n in range(1, 30):
        x = randn(n)
        count_op("lstest::meta_twice", (x, 2.0), {}, lstest_twice(x, 2.0))
        assert len(flops._CACHE) <= 8
    assert len(calls) == 29


def test_long_tensor_lists_are_counted_uncached() -> None:
    params = [randn(3) for _ in range(40)]
    before = len(flops._CACHE)
    # 40 tensors, one FLOP per element of the first list: 40 * 3
    assert count_op("aten::_foreach_add_", (params, params), {}, None)[:2] == (120, 0)
    assert len(flops._CACHE) == before


# -- metadata alone gives the live numbers ---------------------------------------------------------


aten = torch.ops.aten

CONVOLUTIONS = {
    # (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    "plain": (randn(2, 3, 9, 9), randn(8, 3, 3, 3), randn(8), [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
    "stride-padding": (randn(2, 3, 9, 9), randn(8, 3, 3, 3), None, [2, 2], [1, 1], [1, 1], False, [0, 0], 1),
    "dilation": (randn(1, 3, 9, 9), randn(8, 3, 3, 3), randn(8), [1, 1], [2, 2], [2, 2], False, [0, 0], 1),
    "groups": (randn(1, 4, 7, 7), randn(8, 2, 3, 3), randn(8), [1, 2], [1, 0], [1, 1], False, [0, 0], 2),
    "conv1d": (randn(2, 4, 10), randn(6, 4, 3), randn(6), [2], [1], [1], False, [0], 1),
    "conv3d": (randn(1, 2, 5, 5, 5), randn(4, 2, 3, 3, 3), None, [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1),
    "transposed": (randn(2, 4, 5, 5), randn(4, 3, 3, 3), randn(6), [2, 2], [1, 1], [1, 1], True, [1, 1], 2),
}


def _same_from_metadata(op: Any, *args: Any, **kwargs: Any) -> tuple[int | None, int | None, int]:
    """Count a real call, then the same call from its inputs' metadata alone (no output):
    both must agree, and be supported."""
    out = op(*args, **kwargs)
    live = count_op(op._schema.name, args, kwargs, out)
    from_meta = count_meta(op._schema.name, to_meta(args), to_meta(kwargs))
    assert from_meta == live
    assert live[0] is not None and live[1] is not None
    return live


@pytest.mark.parametrize("args", CONVOLUTIONS.values(), ids=CONVOLUTIONS.keys())
def test_convolution_from_metadata(args: tuple[Any, ...]) -> None:
    _, macs, _ = _same_from_metadata(aten.convolution.default, *args)
    assert macs > 0


def test_convolution_backward_from_metadata() -> None:
    x, w = randn(2, 3, 9, 9), randn(8, 3, 3, 3)
    grad = randn(2, 8, 4, 4)
    for mask in ([True, True, True], [False, True, False], [True, False, False]):
        _same_from_metadata(aten.convolution_backward.default, grad, x, w, [8], [2, 2], [0, 0], [1, 1],
                            False, [0, 0], 1, mask)  # fmt: skip


@pytest.mark.parametrize(
    ("op", "args"),
    [
        (aten.mm.default, (randn(4, 8), randn(8, 16))),
        (aten.addmm.default, (randn(16), randn(4, 8), randn(8, 16))),
        (aten.bmm.default, (randn(3, 4, 8), randn(3, 8, 5))),
        (aten.baddbmm.default, (randn(3, 4, 5), randn(3, 4, 8), randn(3, 8, 5))),
    ],
    ids=["mm", "addmm", "bmm", "baddbmm"],
)
def test_matrix_products_from_metadata(op: Any, args: tuple[Any, ...]) -> None:
    _same_from_metadata(op, *args)


SDPA = {
    "plain": ((randn(2, 3, 5, 8), randn(2, 3, 7, 8), randn(2, 3, 7, 8)), {}),
    "causal": ((randn(2, 3, 5, 8), randn(2, 3, 5, 8), randn(2, 3, 5, 8)), {"is_causal": True}),
    "float-mask": ((randn(2, 3, 5, 8), randn(2, 3, 7, 8), randn(2, 3, 7, 8)), {"attn_mask": randn(5, 7)}),
}


@pytest.mark.parametrize(("args", "kwargs"), SDPA.values(), ids=SDPA.keys())
def test_cpu_attention_kernel_from_metadata(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    _same_from_metadata(aten._scaled_dot_product_flash_attention_for_cpu.default, *args, **kwargs)


def test_layer_norm_from_metadata() -> None:
    _same_from_metadata(aten.native_layer_norm.default, randn(2, 3, 16), [16], randn(16), randn(16), 1e-5)
    _same_from_metadata(aten.native_layer_norm.default, randn(2, 3, 16), [3, 16], None, None, 1e-5)


def test_unknown_and_data_dependent_ops_from_metadata() -> None:
    x = to_meta(randn(2, 3))
    assert count_meta("lstest::no_such_op", (x,), {}) == (None, None, 24)  # inputs' bytes only
    assert count_meta("aten::nonzero", (x,), {}) == (0, 0, 0)  # free: no output needed

