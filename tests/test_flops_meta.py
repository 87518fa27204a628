"""Formulas count from metadata: the per-signature cache, ``count_meta`` against live
tensors, and composite ops seen whole under ``torch.inference_mode()``.

A backend that records shapes but no tensors (torch's profiler) calls ``count_meta``
with ``TensorMeta``s and no output; its numbers must be those of the live op.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import layerscope
import layerscope.flops as flops
from layerscope.flops import TensorMeta, count_meta, count_op, register_flops, unregister_flops
from layerscope.flops.meta import to_meta
from layerscope.model.tree import Profile
from test_flops_formulas import Fn, randn


def totals(prof: Profile) -> tuple[int | None, int | None, int | None]:
    forward = prof.root.forward
    return forward.flops, forward.macs, forward.bytes


# -- TensorMeta ------------------------------------------------------------------------------


def test_tensor_meta_reads_like_a_tensor() -> None:
    x = randn(2, 3, 4).to(torch.float16)
    meta = to_meta(x)
    assert isinstance(meta, TensorMeta)
    for read in (
        lambda t: tuple(t.shape), lambda t: t.dtype, lambda t: t.numel(), lambda t: t.dim(), lambda t: t.ndim,
        lambda t: t.size(1), lambda t: tuple(t.size()), lambda t: t.element_size(), lambda t: t.nbytes,
        lambda t: t.is_floating_point(), lambda t: len(t),
    ):
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
                            False, [0, 0], 1, mask)


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


# Composite ops, from metadata, against a profile of the same call, where autograd
# decomposes them. (name, the call, its tensors)
COMPOSITES = {
    "conv2d": (aten.conv2d, lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, dilation=1, groups=1),
               (randn(2, 3, 9, 9), randn(8, 3, 3, 3), randn(8))),
    "conv_transpose2d": (aten.conv_transpose2d, lambda x, w: F.conv_transpose2d(x, w, stride=2, groups=2),
                         (randn(1, 4, 5, 5), randn(4, 3, 3, 3))),
    "linear": (aten.linear, F.linear, (randn(2, 5, 8), randn(16, 8), randn(16))),
    "matmul": (aten.matmul, torch.matmul, (randn(2, 5, 8), randn(8, 3))),
    "matmul-batched": (aten.matmul, torch.matmul, (randn(2, 2, 5, 8), randn(2, 8, 3))),
    "sdpa": (aten.scaled_dot_product_attention, F.scaled_dot_product_attention, SDPA["plain"][0]),
    "sdpa-causal": (aten.scaled_dot_product_attention, lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True), SDPA["causal"][0]),
    "sdpa-mask": (aten.scaled_dot_product_attention, F.scaled_dot_product_attention,
                  (*SDPA["float-mask"][0], SDPA["float-mask"][1]["attn_mask"])),
    "sdpa-bool-mask": (aten.scaled_dot_product_attention, F.scaled_dot_product_attention,
                       (*SDPA["float-mask"][0], randn(5, 7) > 0)),
    "layer_norm": (aten.layer_norm, lambda x, w, b: F.layer_norm(x, [16], w, b), (randn(2, 3, 16), randn(16),
                                                                                    randn(16))),
}


@pytest.mark.parametrize(("op", "call", "tensors"), COMPOSITES.values(), ids=COMPOSITES.keys())
def test_composites_from_metadata(op: Any, call: Callable[..., Any], tensors: tuple[Any, ...]) -> None:
    # Record the composite's own call (its arguments as the dispatcher got them) under
    # inference mode, where it reaches a dispatch mode whole.
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    class Catch(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func.overloadpacket is op:
                seen.append((args, kwargs or {}))
            return func(*args, **(kwargs or {}))

    with torch.inference_mode(), Catch():
        call(*tensors)
    (args, kwargs), = seen
    decomposed = totals(layerscope.count_flops(Fn(call), tensors, no_grad=False, memory=False))
    assert count_meta(op._qualified_op_name, to_meta(args), to_meta(kwargs)) == decomposed
    assert decomposed[0] and decomposed[0] > 0


def test_unknown_and_data_dependent_ops_from_metadata() -> None:
    x = to_meta(randn(2, 3))
    assert count_meta("lstest::no_such_op", (x,), {}) == (None, None, 24)  # inputs' bytes only
    assert count_meta("aten::nonzero", (x,), {}) == (0, 0, 0)  # free: no output needed


# -- inference mode: composite ops reach the dispatcher whole -----------------------------------------


def test_inference_mode_counts_linear() -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).eval()
    x = torch.rand(8, 64)
    with torch.inference_mode():
        prof = layerscope.count_flops(model, x)
    assert {op.name for op in prof["0"].ops} == {"aten::linear"}
    assert prof.unsupported_ops() == {}
    # 8*64*64 + 8*64*10 = 32,768 + 5,120 = 37,888 MACs;
    # flops 2*37,888 + bias 8*64 + 8*10 + relu 8*64 = 75,776 + 592 + 512 = 76,880
    assert prof.root.forward.macs == 37_888
    assert totals(prof) == totals(layerscope.count_flops(model, x))


def _modules() -> dict[str, tuple[nn.Module, Any]]:
    mask = randn(5, 7)
    return {
        "conv1d": (nn.Conv1d(4, 8, 3, stride=2, padding=1), randn(2, 4, 10)),
        "conv3d": (nn.Conv3d(2, 4, 3, padding=1), randn(1, 2, 5, 5, 5)),
        "conv_transpose1d": (nn.ConvTranspose1d(4, 8, 3, stride=2), randn(2, 4, 10)),
        "conv_transpose2d": (nn.ConvTranspose2d(4, 8, 3, stride=2, padding=1, output_padding=1, groups=2),
                             randn(2, 4, 5, 5)),
        "conv_transpose3d": (nn.ConvTranspose3d(2, 4, 3), randn(1, 2, 4, 4, 4)),
        "conv2d-same": (nn.Conv2d(3, 4, 3, padding="same", dilation=2), randn(1, 3, 8, 8)),
        "group_norm": (nn.GroupNorm(2, 4), randn(2, 4, 5, 5)),
        "instance_norm": (nn.InstanceNorm2d(4, affine=True), randn(2, 4, 5, 5)),
        "batch_norm": (nn.BatchNorm1d(4), randn(3, 4)),
        "layer_norm": (nn.LayerNorm(16), randn(2, 3, 16)),
        "rms_norm": (nn.RMSNorm(16), randn(2, 3, 16)),
        "embedding_bag": (nn.EmbeddingBag(10, 4, mode="mean"), torch.tensor([[1, 2, 3], [4, 5, 6]])),
        "lstm": (nn.LSTM(8, 16, num_layers=2), randn(5, 2, 8)),
        "gru": (nn.GRU(8, 16, bidirectional=True), randn(5, 2, 8)),
        "rnn": (nn.RNN(8, 16, batch_first=True), randn(2, 5, 8)),
        "multihead_attention": (nn.MultiheadAttention(16, 2, batch_first=True).train(),
                                (randn(2, 5, 16), randn(2, 5, 16), randn(2, 5, 16))),
        "transformer_layer": (nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).train(), randn(2, 5, 16)),
        "einsum": (Fn(lambda a, b: torch.einsum("bij,bjk->bik", a, b)), (randn(2, 3, 4), randn(2, 4, 5))),
        "matmul-transposed": (Fn(lambda a, b: a.transpose(1, 2) @ b), (randn(2, 4, 3), randn(4, 5))),
        "linear-transposed": (Fn(lambda a, w, b: F.linear(a.transpose(0, 1), w, b)),
                              (randn(3, 2, 4), randn(5, 4), randn(5))),
        "linear-4d": (nn.Linear(4, 5), randn(2, 3, 2, 4)),
        "sdpa-mask": (Fn(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)),
                      (randn(2, 2, 5, 8), randn(2, 2, 7, 8), randn(2, 2, 7, 8), mask)),
        "sdpa-gqa": (Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
                     (randn(2, 4, 5, 8), randn(2, 2, 5, 8), randn(2, 2, 5, 8))),
        "softmax-dtype": (Fn(lambda x: F.softmax(x, -1, dtype=torch.float64)), randn(2, 3)),
        "prelu": (nn.PReLU(3), randn(2, 3, 4)),
        "max_pool1d": (nn.MaxPool1d(2), randn(1, 3, 8)),
        "max_pool2d": (nn.MaxPool2d(2), randn(1, 3, 8, 8)),
        "max_pool3d": (nn.MaxPool3d(2), randn(1, 2, 4, 4, 4)),
        "avg_pool1d": (nn.AvgPool1d(2), randn(1, 3, 8)),
        "adaptive_max_pool1d": (nn.AdaptiveMaxPool1d(3), randn(1, 3, 8)),
        "adaptive_avg_pool2d": (nn.AdaptiveAvgPool2d((2, 3)), randn(1, 3, 6, 6)),
        "max-of-two": (Fn(lambda a, b: torch.max(a, b)), (randn(1, 3), randn(2, 3))),
        "square": (Fn(torch.square), randn(2, 3)),
        "cross_entropy": (Fn(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1)),
                          (randn(4, 5), torch.tensor([0, 1, 2, 3]))),
        "cosine_similarity": (nn.CosineSimilarity(), (randn(4, 5), randn(4, 5))),
        "dropout-train": (nn.Dropout(0.5).train(), randn(2, 3)),
        "to": (Fn(lambda x: x.to(torch.float64) * 2), randn(2, 3)),
    }


MODULES = _modules()


@pytest.mark.parametrize("name", MODULES)
def test_inference_mode_counts_as_no_grad(name: str) -> None:
    model, x = MODULES[name]
    no_grad = layerscope.count_flops(model, x)
    with torch.inference_mode():
        inference = layerscope.count_flops(model, x)
    assert inference.unsupported_ops() == no_grad.unsupported_ops() == {}
    assert totals(inference) == totals(no_grad)


IN_PLACE = [
    ("aten::add_", (torch.randn(4, 5), torch.randn(5)), {"alpha": 2}),
    ("aten::mul_", (torch.randn(3, 8).t(), 0.5), {}),
    ("aten::addcdiv_", (torch.randn(6), torch.randn(6), torch.rand(6) + 1), {"value": 0.1}),
    ("aten::lerp_", (torch.randn(2, 3), torch.randn(2, 3), 0.9), {}),
    ("aten::_foreach_add_", ([torch.randn(3), torch.randn(2, 2)], 1.0), {}),
    ("aten::_foreach_addcdiv_", ([torch.randn(3)], [torch.randn(3)], [torch.rand(3) + 1], [0.1]), {}),
]


@pytest.mark.parametrize(("name", "args", "kwargs"), IN_PLACE, ids=[case[0] for case in IN_PLACE])
def test_in_place_outputs_are_read_from_the_schema_as_the_op_would_give_them(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    # An in-place op's output is its first input (or nothing, for the _foreach_ ones):
    # read from the schema without running it, and the same as running it on fake tensors.
    from layerscope.flops import fake

    assert fake._in_place(name) in ("self", "nothing")
    meta_args = to_meta(args, True)
    read = fake.output_meta(name, meta_args, kwargs)
    ran = to_meta(fake._run(name, meta_args, kwargs), True)
    assert read == ran
    assert count_meta(name, to_meta(args, False), kwargs) == count_op(name, args, kwargs, None if read is None else args[0])


@pytest.mark.parametrize("name", ["aten::add", "aten::resize_", "aten::_foreach_sqrt", "aten::unsqueeze_", "aten::copy"])
def test_ops_whose_output_is_not_their_input_still_run(name: str) -> None:
    from layerscope.flops import fake

    assert fake._in_place(name) is None
