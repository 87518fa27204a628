"""FLOP formulas at the edges the main formula tests leave: arguments passed by keyword,
the other forms of an op, and formulas the fast tier does not otherwise reach.

Every expected count is worked out by hand from the shapes, the arithmetic in a comment
(conventions: docs/flops.md). Formulas read shapes only, so most calls hand ``count_op``
tensors of the right shapes without running the op; those that run it say so.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from layerscope.flops import count_op
from layerscope.flops.formulas import _list_numel
from layerscope.flops.meta import TensorMeta

aten = torch.ops.aten


def e(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def counts(name: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None, out: Any = None) -> tuple[Any, Any]:
    flops, macs, _ = count_op(name, args, kwargs or {}, out)
    return flops, macs


def ran(op: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Run the aten overload for real and count the call as made."""
    out = op(*args, **kwargs)
    return counts(op._schema.name, args, kwargs, out)


# -- scatter_add / index_add / index_put ------------------------------------------------------


def test_scatter_add_and_index_add_with_the_source_by_keyword() -> None:
    base, index, src = torch.zeros(2, 5), torch.tensor([[0, 1, 2], [2, 3, 4]]), torch.ones(2, 3)
    # one add per source element: 2*3 = 6, whether src comes by position or by name
    assert ran(aten.scatter_add.default, base, 1, index, src=src) == (6, 0)
    assert ran(aten.scatter_add_.default, base.clone(), 1, index, src=src) == (6, 0)
    rows, source = torch.tensor([0, 2, 4, 4]), torch.ones(4, 3)
    # index_add names it `source`: 4*3 = 12 adds, by position or by name
    assert ran(aten.index_add.default, torch.zeros(5, 3), 0, rows, source) == (12, 0)
    assert ran(aten.index_add.default, torch.zeros(5, 3), 0, rows, source=source) == (12, 0)
    assert ran(aten.index_add_.default, torch.zeros(5, 3), 0, rows, source=source, alpha=2) == (12, 0)


def test_index_put_accumulate_by_keyword_and_by_default() -> None:
    base, rows, values = torch.zeros(4), [torch.tensor([0, 1, 1, 3, 3])], torch.ones(5)
    # accumulate: one add per value (5); overwrite (the default, or named False): 0
    assert ran(aten.index_put.default, base, rows, values, accumulate=True) == (5, 0)
    assert ran(aten.index_put.default, base, rows, values, accumulate=False) == (0, 0)
    assert ran(aten.index_put.default, base, rows, values) == (0, 0)
    assert ran(aten.index_put_.default, base.clone(), rows, values, True) == (5, 0)
    assert ran(aten._index_put_impl_.default, base.clone(), rows, values, accumulate=True) == (5, 0)


# -- max / min --------------------------------------------------------------------------------


def test_max_min_of_two_tensors_count_per_output_element() -> None:
    a, b = torch.ones(2, 1), torch.ones(1, 3)
    # broadcast to (2, 3): one comparison per output element = 6 (not a's 2 elements)
    assert ran(aten.max.other, a, b) == (6, 0)
    assert ran(aten.min.other, a, b) == (6, 0)


def test_max_min_reductions_count_per_input_element() -> None:
    x = torch.ones(2, 3)
    # whole-tensor max: one comparison per input element = 6 (the output is one element)
    assert ran(aten.max.default, x) == (6, 0)
    assert ran(aten.min.default, x) == (6, 0)
    # along dim 1: still 6 per input element (the output, values and indices, is (2,))
    assert ran(aten.max.dim, x, 1) == (6, 0)
    assert ran(aten.min.dim, x, 1, True) == (6, 0)


# -- convolution backward: grad_bias ----------------------------------------------------------


def test_convolution_backward_output_mask_by_keyword() -> None:
    grad, x, w = torch.ones(1, 8, 3, 3), torch.ones(1, 3, 5, 5), torch.ones(8, 3, 3, 3)
    fixed = (grad, x, w, [8], [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    conv_backward = aten.convolution_backward.default
    # grad_bias only: no product, one add per grad_output element: 1*8*3*3 = 72 (run for real)
    assert ran(conv_backward, *fixed, output_mask=[False, False, True]) == (72, 0)
    # grad_input only: as many MACs as the forward, 72 outputs x 3*3*3 = 1,944; no bias adds
    assert ran(conv_backward, *fixed, output_mask=[True, False, False]) == (3_888, 1_944)


# -- attention kernels: softmax on the scores -------------------------------------------------


def test_efficient_attention_softmax_counts_query_by_key_scores() -> None:
    # query length 3, key length 5 (cross-attention), batch 1, 2 heads, head dim 8
    q, k, v = e(1, 2, 3, 8), e(1, 2, 5, 8), e(1, 2, 5, 8)
    out = (e(1, 2, 3, 8), e(1, 2, 3), e(), e())
    # q @ k^T: 1*2*3*5*8 = 240 MACs, attn @ v: 1*2*3*5*8 = 240 -> 480 MACs, 960 FLOPs;
    # softmax 3 per score, 1*2*3*5 = 30 scores: 90 -> 1,050
    assert counts("aten::_scaled_dot_product_efficient_attention", (q, k, v, None, False), out=out) == (1_050, 480)
    grad = e(1, 2, 3, 8)
    backward = (grad, q, k, v, e(1, 2, 3, 5), out[0], out[1], e(), e(), 0.0, [True, True, True, False])
    # five bmms of 240 MACs (scores recomputed, then the gradients of v, of the
    # probabilities, of q and of k) = 1,200 MACs, 2,400 FLOPs; softmax 3 * 30 = 90 -> 2,490
    assert counts("aten::_scaled_dot_product_efficient_attention_backward", backward, out=(q, k, v, None)) == (2_490, 1_200)


# -- embedding bag and recurrent backward: flags by keyword -----------------------------------


def bag_args(**flags: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    # 2 bags, 6 indices, D = 4: grad (2, 4)
    head = (e(2, 4), torch.zeros(6, dtype=torch.long), torch.zeros(2, dtype=torch.long),
            torch.zeros(6, dtype=torch.long), torch.zeros(2, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long), 10)
    return head, flags


@pytest.mark.parametrize(
    ("flags", "flops"),
    [
        # sum: each index's row gets its bag's row, 6*4 = 24 adds
        ({"scale_grad_by_freq": False, "mode": 0, "sparse": False, "per_sample_weights": None}, 24),
        # every added row scaled by its frequency: 24 + 24 = 48
        ({"scale_grad_by_freq": True, "mode": 0, "sparse": False, "per_sample_weights": None}, 48),
        # by its sample's weight: 24 + 24 = 48
        ({"scale_grad_by_freq": False, "mode": 0, "sparse": False, "per_sample_weights": e(6)}, 48),
        # mean: 24 adds + each bag's gradient divided by its size, (2,4) = 8 -> 32; scaled by
        # frequency as well: + 24 = 56
        ({"scale_grad_by_freq": True, "mode": 1, "sparse": False, "per_sample_weights": None}, 56),
        # max: each bag's gradient row to its maximum's row: (2,4) = 8, nothing else
        ({"scale_grad_by_freq": True, "mode": 2, "sparse": False, "per_sample_weights": None}, 8),
    ],
    ids=["sum", "sum-freq", "sum-weights", "mean-freq", "max"],
)
def test_embedding_bag_backward_flags_by_keyword(flags: dict[str, Any], flops: int) -> None:
    head, named = bag_args(**flags)
    assert counts("aten::_embedding_bag_backward", head, named) == (flops, 0)
    # the same flags by position
    positional = (*head, flags["scale_grad_by_freq"], flags["mode"], flags["sparse"], flags["per_sample_weights"])
    assert counts("aten::_embedding_bag_backward", positional) == (flops, 0)


@pytest.mark.parametrize(("has_biases", "per_gate_value"), [(True, 8), (False, 6)])
def test_rnn_layer_backward_has_biases_by_keyword(has_biases: bool, per_gate_value: int) -> None:
    # LSTM layer: input (seq 5, batch 2, 8), hidden 16, 4 gates: w_ih (64, 8), w_hh (64, 16)
    x, w_ih, w_hh = e(5, 2, 8), e(64, 8), e(64, 16)
    args = (x, w_ih, w_hh, e(64), e(64), e(2, 16), e(2, 16), e(5, 2, 16), e(2, 16), e(2, 16),
            e(5, 2, 16), None, None, False, 2, 16, 1)
    # 10 rows x (2*64*8 + 2*64*16 = 3,072) = 30,720 MACs; 640 gate pre-activations, each
    # 2*3 for the activation and state update and 2 for the bias gradients (0 without)
    expected = (2 * 30_720 + per_gate_value * 640, 30_720)
    assert counts("aten::mkldnn_rnn_layer_backward", args, {"has_biases": has_biases}) == expected
    # forward, has_biases by keyword: 10 rows x (64*8 + 64*16) = 15,360 MACs; per gate
    # pre-activation 2 bias adds (none without) + 3
    fwd = (x, w_ih, w_hh, e(64), e(64), e(2, 16), e(2, 16), False, [5, 5], 2, 16, 1)
    assert counts("aten::mkldnn_rnn_layer", fwd, {"has_biases": has_biases}) == (
        2 * 15_360 + (per_gate_value - 3) * 640, 15_360)


# -- the fused encoder layer ------------------------------------------------------------------


def encoder_args(src: torch.Tensor, biases: bool) -> tuple[Any, ...]:
    # E = 4, 2 heads, feed-forward hidden F = 6
    maybe = (lambda t: t) if biases else (lambda t: None)
    return (src, 4, 2, e(12, 4), maybe(e(12)), e(4, 4), e(4), True, False, 1e-5,
            maybe(e(4)), maybe(e(4)), e(4), None if not biases else e(4),
            e(6, 4), maybe(e(6)), e(4, 6), e(4), None, None)


def test_encoder_layer_batched_with_every_bias() -> None:
    # B = 2, L = 3, E = 4, 2 heads, F = 6; tokens = B*L = 6, N(src) = 24
    # attention MACs: q proj 2*3*4*4 = 96, k and v proj 2*2*3*4*4 = 192, scores and values
    #   2*2*3*3*4 = 144, out proj 96 -> 528
    # attention FLOPs: 2*528 = 1,056 + in-proj bias 2*(3+6)*4 = 72 + out-proj bias 2*3*4 = 24
    #   + softmax 3*2*2*3*3 = 108 -> 1,260
    # feed-forward MACs: 2 * 6*4*6 = 288 -> 576 FLOPs; biases 6*6 + 6*4 = 60; activation 6*6 = 36
    # layer norms (5 + weight + bias) * 24 = 168 each -> 336; residual adds 2*24 = 48
    # FLOPs: 1,260 + 576 + 60 + 36 + 336 + 48 = 2,316; MACs 528 + 288 = 816
    assert counts("aten::_transformer_encoder_layer_fwd", encoder_args(e(2, 3, 4), True)) == (2_316, 816)


def test_encoder_layer_unbatched_without_some_biases() -> None:
    # src (L = 3, E = 4): batch 1, tokens 3, N(src) = 12; no in-proj bias, no first
    # feed-forward bias, the first norm without weight and bias, the second without bias
    # attention MACs: 1*3*16 = 48 + 2*1*3*16 = 96 + 2*1*3*3*4 = 72 + 48 = 264
    # attention FLOPs: 528 + out-proj bias 1*3*4 = 12 + softmax 3*1*2*3*3 = 54 -> 594
    # feed-forward MACs 2 * 3*4*6 = 144 -> 288 FLOPs; second bias 3*4 = 12; activation 3*6 = 18
    # norms: 5*12 = 60 and (5 + 1)*12 = 72 -> 132; residual adds 2*12 = 24
    # FLOPs: 594 + 288 + 12 + 18 + 132 + 24 = 1,068; MACs 264 + 144 = 408
    assert counts("aten::_transformer_encoder_layer_fwd", encoder_args(e(3, 4), False)) == (1_068, 408)


def test_encoder_layer_without_a_dense_2d_or_3d_src_is_not_counted() -> None:
    assert counts("aten::_transformer_encoder_layer_fwd", encoder_args(e(1, 2, 3, 4), True)) == (None, None)
    assert counts("aten::_transformer_encoder_layer_fwd", encoder_args(e(4), True)) == (None, None)


# -- weight norm, FFT -------------------------------------------------------------------------


def test_weight_norm() -> None:
    v, g = torch.ones(4, 3), torch.ones(4, 1)
    # norms: square and accumulate 12 elements (24), sqrt and g / norm per row (2*4 = 8),
    # a multiply per element of v (12): 3*12 + 2*4 = 44 (run for real)
    assert ran(aten._weight_norm_interface.default, v, g, 0) == (44, 0)
    v, g = torch.ones(2, 5), torch.ones(1, 5)
    # dim 1: g (1, 5): 3*10 + 2*5 = 40
    assert ran(aten._weight_norm_interface.default, v, g, 1) == (40, 0)


def test_fft_real_to_complex() -> None:
    x = torch.ones(3, 2, 8)
    # dim [2]: 8 points, log2 8 = 3: 2.5*8*3 = 60 per transform, 3*2 = 6 transforms -> 360
    assert ran(aten._fft_r2c.default, x, [2], 0, True) == (360, 0)
    # dims [1, 2]: 16 points, log2 16 = 4: 2.5*16*4 = 160, 3 transforms -> 480;
    # normalization (2, by 1/n) by keyword adds one per output element, 3*2*5 = 30 -> 510
    assert ran(aten._fft_r2c.default, x, [1, 2], normalization=2, onesided=True) == (510, 0)
    # one point per transform: nothing to transform
    assert ran(aten._fft_r2c.default, torch.ones(4, 1), [1], 0, False) == (0, 0)


def test_fft_complex_to_real_counts_the_real_side() -> None:
    spectrum = torch.ones(3, 5, dtype=torch.complex64)
    # output (3, 8): 8 real points per transform: 2.5*8*3 = 60, 3 transforms -> 180;
    # normalization 1 adds one per output element, 3*8 = 24 -> 204
    assert ran(aten._fft_c2r.default, spectrum, [1], 0, 8) == (180, 0)
    assert ran(aten._fft_c2r.default, spectrum, [1], 1, 8) == (204, 0)
    # two dims of the output (2, 4, 6) over [0, 2]... the real side: output (2, 3, 8) over
    # dims [0, 2], 2*8 = 16 points, log2 16 = 4: 2.5*16*4 = 160, 3 transforms -> 480
    assert ran(aten._fft_c2r.default, torch.ones(2, 3, 5, dtype=torch.complex64), [0, 2], 0, 8) == (480, 0)


def test_fft_complex_to_complex() -> None:
    z = torch.ones(2, 4, dtype=torch.complex64)
    # dim [1]: 4 points, log2 4 = 2: 5*4*2 = 40 per transform, 2 transforms -> 80;
    # over both dims: 8 points, 5*8*3 = 120, one transform; normalized by keyword: + 8 -> 128
    assert ran(aten._fft_c2c.default, z, [1], 0, True) == (80, 0)
    assert ran(aten._fft_c2c.default, z, [0, 1], normalization=2, forward=False) == (128, 0)


# -- vector products, losses, eval batch norm -------------------------------------------------


def test_mv_and_dot() -> None:
    # (3, 4) @ (4,): 12 MACs, 24 FLOPs
    assert ran(aten.mv.default, torch.ones(3, 4), torch.ones(4)) == (24, 12)
    # 5 MACs, 10 FLOPs
    assert ran(aten.dot.default, torch.ones(5), torch.ones(5)) == (10, 5)
    assert ran(aten.vdot.default, torch.ones(5), torch.ones(5)) == (10, 5)


def test_losses() -> None:
    x, y = torch.ones(2, 3), torch.zeros(2, 3)
    # subtract, square, accumulate: 3 * 6 = 18
    assert ran(aten.mse_loss.default, x, y, 1) == (18, 0)
    # backward of the mean (its grad a scalar): 3 per input element, 3 * 6 = 18
    assert ran(aten.mse_loss_backward.default, torch.ones(()), x, y, 1) == (18, 0)
    logp, target = torch.zeros(4, 5), torch.tensor([0, 1, 2, 3])
    # 2 per target: 8; backward one per target: 4
    assert ran(aten.nll_loss_forward.default, logp, target, None, 1, -100) == (8, 0)
    assert ran(aten.nll_loss_backward.default, torch.ones(()), logp, target, None, 1, -100, torch.tensor(4.0)) == (4, 0)


def test_batch_norm_no_training() -> None:
    x, stat = torch.ones(2, 3, 4), torch.ones(3)
    # subtract and scale (2) + weight (1) + bias (1) per element: 4 * 24 = 96
    assert ran(aten._native_batch_norm_legit_no_training.default, x, stat, stat, stat, stat, 0.1, 1e-5) == (96, 0)
    # with the bias only: 3 * 24 = 72; neither: 2 * 24 = 48
    assert ran(aten._native_batch_norm_legit_no_training.default, x, None, stat, stat, stat, 0.1, 1e-5) == (72, 0)
    assert ran(aten._native_batch_norm_legit_no_training.default, x, None, None, stat, stat, 0.1, 1e-5) == (48, 0)


# -- optimizers -------------------------------------------------------------------------------


def test_fused_optimizers_count_per_parameter_element() -> None:
    params = [e(2, 3), e(4)]  # 10 elements
    rest = ([e(2, 3), e(4)],) * 4 + ([e(), e()],)
    # Adam 10 per element: 100; AdamW 11: 110; SGD 1: 10
    assert counts("aten::_fused_adam_", (params, *rest)) == (100, 0)
    assert counts("aten::_fused_adamw_", (params, *rest)) == (110, 0)
    assert counts("aten::_fused_sgd_", (params, [e(2, 3), e(4)], [])) == (10, 0)
    # a foreach op: 1 per element of its first list; lerp 2 per element
    assert counts("aten::_foreach_add_", (params, [e(2, 3), e(4)])) == (10, 0)
    assert counts("aten::_foreach_lerp_", (params, [e(2, 3), e(4)], 0.5)) == (20, 0)


def test_list_numel() -> None:
    def meta(*shape: int) -> TensorMeta:
        return TensorMeta(shape=shape, dtype=torch.float32)

    # elements of the tensors in a list or tuple, of one tensor, nothing else
    assert _list_numel([meta(2, 3), meta(4), None, 1.5]) == 10
    assert _list_numel((meta(5),)) == 5
    assert _list_numel(meta(2, 2)) == 4
    assert _list_numel(None) == 0
    assert _list_numel(3) == 0


def test_batch_norm_training_by_keyword_and_partial_affine() -> None:
    x, stat = torch.ones(2, 3, 4), torch.ones(3)
    bn = aten.native_batch_norm.default
    # eval, named: subtract and scale (2) + weight + bias: 4 * 24 = 96
    assert ran(bn, x, stat, stat, stat.clone(), stat.clone(), training=False, momentum=0.1, eps=1e-5) == (96, 0)
    # training: mean, subtract, square-accumulate (2), scale = 5, + bias only: 6 * 24 = 144
    assert ran(bn, x, None, stat, stat.clone(), stat.clone(), True, 0.1, 1e-5) == (144, 0)
    # training without running statistics, weight only: 6 * 24 = 144; neither: 5 * 24 = 120
    assert ran(bn, x, stat, None, None, None, True, 0.1, 1e-5) == (144, 0)
    assert ran(bn, x, None, None, stat.clone(), stat.clone(), True, 0.1, 1e-5) == (120, 0)


def test_slow_conv2d_forward_bias() -> None:
    x, w, bias = torch.ones(1, 3, 5, 5), torch.ones(8, 3, 3, 3), torch.ones(8)
    slow = aten._slow_conv2d_forward.default
    # output (1, 8, 3, 3) = 72 positions x 3*3*3 = 1,944 MACs, 3,888 FLOPs; a bias adds 72
    assert ran(slow, x, w, [3, 3], bias, [1, 1], [0, 0]) == (3_960, 1_944)
    assert ran(slow, x, w, [3, 3], bias=bias, stride=[1, 1], padding=[0, 0]) == (3_960, 1_944)
    assert ran(slow, x, w, [3, 3], None, [1, 1], [0, 0]) == (3_888, 1_944)
