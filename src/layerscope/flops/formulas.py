"""The built-in FLOP formulas. docs/flops.md lists each with its convention.

Matrix products, convolutions and attention use ``torch.utils.flop_counter``'s
formulas (their count is ``2 * macs``); layerscope adds the non-MAC work around them
(bias adds, softmax) to ``flops`` only. Everything else here is layerscope's own.

Every formula reads metadata (``TensorMeta``), never data. Most read only the op's
inputs. These also read ``out``, the output's shape, which ``count_meta`` derives on
fake tensors when a backend did not record it:

- per output element: the elementwise ops and their backward, softmax, dropout,
  upsampling, the random transforms (exponential_, ...), the ``max``/``min`` of two
  tensors, and the per-output part of ``mean``, ``var`` and ``std``;
- the bias of ``addmm``, ``baddbmm`` and the convolutions (one add per output);
- torch's convolution formulas: a convolution's count is per output position, and
  its backward's per gradient asked for;
- pooling (per output window) and pooling backward (per input gradient element).

Ops that torch implements as composites (``CompositeImplicitAutograd``: ``linear``,
``conv2d``, ``max_pool2d``, ``softmax``, ``prelu``, ...) have no formula here on purpose:
autograd decomposes them, and under ``torch.inference_mode()``, where the dispatch mode
sees them whole, ``layerscope.flops.fake`` counts their decomposition, so the counts
agree by construction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torch.utils import flop_counter as torch_flops

from layerscope.capture import _torch
from layerscope.flops import Formula, declare_free, has_formula, register_flops
from layerscope.flops.meta import TensorMeta

Args = tuple[Any, ...]
Kwargs = dict[str, Any]


def _first_tensor(value: Any) -> TensorMeta | None:
    if isinstance(value, TensorMeta):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _out_numel(out: Any) -> int:
    tensor = _first_tensor(out)
    if tensor is None:
        # Never 0 by default: without its output the call is unsupported, not free.
        raise ValueError("this formula needs the op's output")
    return tensor.numel()


def _arg(args: Args, kwargs: Kwargs, index: int, name: str, default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


# -- matrix products, convolution, attention: torch's formulas ------------------------


def _shapes(value: Any) -> Any:
    """Tensors replaced by their shapes, as torch's shape-wrapped formulas expect."""
    if isinstance(value, TensorMeta):
        return value.shape
    if isinstance(value, (tuple, list)):
        return type(value)(_shapes(v) for v in value)
    return value


def _torch_backed(fn: Callable[..., int], extra: Callable[[Args, Kwargs, Any], int] | None = None) -> Formula:
    # torch wraps shape formulas in a pytree map that costs more than the formula; call
    # the function underneath with shapes from a cheap map. Raw formulas take tensors.
    shape_formula = getattr(fn, "__wrapped__", None)

    def formula(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
        if shape_formula is not None:
            counted = int(shape_formula(*_shapes(args), out_shape=_shapes(out), **{k: _shapes(v) for k, v in kwargs.items()}))
        else:
            counted = int(fn(*args, out_val=out, **kwargs))
        # torch counts 2 FLOPs per multiply-accumulate.
        macs = counted // 2
        return counted + (extra(args, kwargs, out) if extra else 0), macs

    return formula


def _conv_bias(args: Args, kwargs: Kwargs, out: Any) -> int:
    return _out_numel(out) if _arg(args, kwargs, 2, "bias") is not None else 0


def _slow_conv_bias(args: Args, kwargs: Kwargs, out: Any) -> int:
    # _slow_conv2d_forward(self, weight, kernel_size, bias, stride, padding)
    return _out_numel(out) if _arg(args, kwargs, 3, "bias") is not None else 0


def _conv_backward_bias(args: Args, kwargs: Kwargs, out: Any) -> int:
    # grad_bias sums grad_output over every axis but channels: one add per element.
    mask = _arg(args, kwargs, 10, "output_mask", [False, False, False])
    return args[0].numel() if mask and mask[2] else 0


def _scores(query: TensorMeta, key: TensorMeta) -> int:
    """Attention score elements: batch * heads * query length * key length."""
    return math.prod(query.shape[:-1]) * key.shape[-2]


def _softmax_on_scores(args: Args, kwargs: Kwargs, out: Any) -> int:
    # NB: 3 FLOPs per score for the softmax (exp, sum, divide); the scale is folded into
    # the matmul and a causal mask is not exploited (as torch counts the matmuls).
    return 3 * _scores(args[0], args[1])


def _softmax_backward_on_scores(args: Args, kwargs: Kwargs, out: Any) -> int:
    return 3 * _scores(args[1], args[2])


# addmm and baddbmm, counted by _addmm below with their bias, are never torch-backed.
_EXTRAS: dict[str, Callable[[Args, Kwargs, Any], int]] = {
    "aten::convolution": _conv_bias,
    "aten::_convolution": _conv_bias,
    # aten::cudnn_convolution takes no bias (it is added by a separate op).
    "aten::convolution_overrideable": _conv_bias,
    "aten::convolution_backward": _conv_backward_bias,
    "aten::_scaled_dot_product_efficient_attention": _softmax_on_scores,
    "aten::_scaled_dot_product_flash_attention": _softmax_on_scores,
    "aten::_scaled_dot_product_cudnn_attention": _softmax_on_scores,
    "aten::_scaled_dot_product_efficient_attention_backward": _softmax_backward_on_scores,
    "aten::_scaled_dot_product_flash_attention_backward": _softmax_backward_on_scores,
    "aten::_scaled_dot_product_cudnn_attention_backward": _softmax_backward_on_scores,
}

def _matmul_macs(a: TensorMeta, b: TensorMeta) -> int:
    """(..., m, k) @ (..., k, n): batch * m * k * n multiply-accumulates."""
    return math.prod(a.shape[:-1]) * a.shape[-1] * b.shape[-1]


def _mm(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    macs = _matmul_macs(args[0], args[1])
    return 2 * macs, macs


def _addmm(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    macs = _matmul_macs(args[1], args[2])
    return 2 * macs + _out_numel(out), macs


# The matrix products are counted here directly, with the same arithmetic as torch's
# formulas: torch's addmm formula calls its own pytree-wrapped mm formula, which costs
# ~20x the arithmetic on every call. The agreement tests hold them equal.
def _slow_conv2d(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    # _slow_conv2d_forward(self, weight, kernel_size, bias, stride, padding): torch maps
    # it to its generic conv formula, whose argument order it does not have.
    weight = args[1]
    macs = _out_numel(out) * math.prod(weight.shape[1:])
    return 2 * macs + _slow_conv_bias(args, kwargs, out), macs


_FAST: dict[str, Formula] = {
    "aten::mm": _mm, "aten::bmm": _mm, "aten::addmm": _addmm, "aten::baddbmm": _addmm,
    "aten::_slow_conv2d_forward": _slow_conv2d,
}

for _packet, _fn in torch_flops.flop_registry.items():
    _name = _torch.packet_name(_packet)
    if _name:
        register_flops(_name)(_FAST.get(_name) or _torch_backed(_fn, _EXTRAS.get(_name)))


# NB: torch 2.13's counter has no formula for the CPU attention kernels and counts
# them as 0. layerscope counts them with torch's own formula for the other kernels.
if not has_formula("aten::_scaled_dot_product_flash_attention_for_cpu"):

    @register_flops("aten::_scaled_dot_product_flash_attention_for_cpu")
    def _sdpa_cpu(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
        query, key, value = args[0], args[1], args[2]
        counted = int(torch_flops.sdpa_flop_count(query.shape, key.shape, value.shape))
        return counted + 3 * _scores(query, key), counted // 2


if not has_formula("aten::_scaled_dot_product_flash_attention_for_cpu_backward"):

    @register_flops("aten::_scaled_dot_product_flash_attention_for_cpu_backward")
    def _sdpa_cpu_backward(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
        grad_out, query, key, value = args[0], args[1], args[2], args[3]
        counted = int(torch_flops.sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape))
        return counted + 3 * _scores(query, key), counted // 2


# -- elementwise ----------------------------------------------------------------------


def _per_output_element(flops_per_element: int) -> Formula:
    def formula(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
        return flops_per_element * _out_numel(out), 0

    return formula


def _with_inplace(*names: str) -> list[str]:
    return [n for name in names for n in (name, name + "_")]


# One FLOP per output element, whatever the function's internal cost: arithmetic,
# comparisons and elementwise functions alike.
register_flops(
    *_with_inplace(
        "aten::add", "aten::sub", "aten::mul", "aten::div", "aten::rsub", "aten::neg", "aten::abs",
        "aten::pow", "aten::sqrt", "aten::rsqrt", "aten::reciprocal", "aten::exp", "aten::log",
        "aten::log1p", "aten::expm1", "aten::sin", "aten::cos", "aten::tanh", "aten::sigmoid",
        "aten::relu", "aten::gelu", "aten::silu", "aten::mish", "aten::hardtanh", "aten::hardswish",
        "aten::hardsigmoid", "aten::leaky_relu", "aten::elu", "aten::softplus", "aten::threshold",
        "aten::clamp", "aten::clamp_min", "aten::clamp_max", "aten::minimum", "aten::maximum",
        "aten::erf", "aten::floor", "aten::ceil", "aten::round", "aten::sign",
        "aten::eq", "aten::ne", "aten::gt", "aten::ge", "aten::lt", "aten::le",
        "aten::logical_not", "aten::logical_and", "aten::logical_or", "aten::bitwise_not",
        "aten::bitwise_and", "aten::bitwise_or", "aten::fmod", "aten::remainder",
    ),
    "aten::_prelu_kernel", "aten::glu",
)(_per_output_element(1))

# a + value * t1 * t2 and friends: two operations per element.
register_flops(*_with_inplace("aten::addcmul", "aten::addcdiv", "aten::lerp"))(_per_output_element(2))

# Backward of an elementwise function: the derivative and its product with the
# incoming gradient.
register_flops(
    "aten::threshold_backward", "aten::gelu_backward", "aten::silu_backward", "aten::tanh_backward",
    "aten::sigmoid_backward", "aten::hardtanh_backward", "aten::hardswish_backward",
    "aten::hardsigmoid_backward", "aten::leaky_relu_backward", "aten::elu_backward",
    "aten::softplus_backward", "aten::mish_backward", "aten::_prelu_kernel_backward",
    "aten::glu_backward",
)(_per_output_element(2))

# Softmax: exp, sum, divide. Its backward: y * (g - sum(g * y)).
register_flops(
    "aten::_softmax", "aten::_safe_softmax", "aten::_log_softmax",
    "aten::_softmax_backward_data", "aten::_log_softmax_backward_data",
)(_per_output_element(3))

# Dropout: one multiply by the scaled mask.
register_flops("aten::native_dropout", "aten::native_dropout_backward")(_per_output_element(1))


# -- normalisation ----------------------------------------------------------------------


def _norm(weight_index: int, bias_index: int, per_element: int = 5) -> Formula:
    """mean, subtract, square-and-accumulate (2), scale by 1/std: 5 per element; the
    affine weight and bias add 1 each."""

    def formula(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
        numel = args[0].numel()
        affine = sum(1 for i in (weight_index, bias_index) if len(args) > i and args[i] is not None)
        return (per_element + affine) * numel, 0

    return formula


register_flops("aten::native_layer_norm")(_norm(2, 3))
register_flops("aten::native_group_norm")(_norm(1, 2))
register_flops("aten::_fused_rms_norm")(_norm(2, 99, per_element=4))  # no mean to subtract


@register_flops(
    "aten::native_batch_norm", "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit_functional",
    "aten::cudnn_batch_norm", "aten::miopen_batch_norm",  # a GPU's own kernels, called as native's
)
def _batch_norm(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    training = bool(_arg(args, kwargs, 5, "training", True))
    affine = sum(1 for i in (1, 2) if args[i] is not None)
    # NB: in eval the running statistics are used: subtract and scale only.
    per_element = 5 if training else 2
    return (per_element + affine) * args[0].numel(), 0


@register_flops("aten::_native_batch_norm_legit_no_training")
def _batch_norm_eval(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    affine = sum(1 for i in (1, 2) if args[i] is not None)
    return (2 + affine) * args[0].numel(), 0


def _norm_backward(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    # NB: approximated as twice the forward's 5 per element, plus the weight and bias
    # gradients (a multiply-add and an add per element).
    return 12 * args[0].numel(), 0


register_flops(
    "aten::native_layer_norm_backward", "aten::native_batch_norm_backward",
    "aten::native_group_norm_backward", "aten::_fused_rms_norm_backward",
    "aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm_backward",
)(_norm_backward)


# -- pooling -------------------------------------------------------------------------


def _kernel_numel(kernel: Any, dims: int) -> int:
    if isinstance(kernel, int):
        return kernel**dims
    values = list(kernel)
    if len(values) == 1:
        values = values * dims
    return math.prod(values)


def _pool(dims: int) -> Formula:
    """One comparison (max) or add (avg) per window element, per output element."""

    def formula(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
        return _out_numel(out) * _kernel_numel(_arg(args, kwargs, 1, "kernel_size"), dims), 0

    return formula


# max_pool{1,2,3}d, avg_pool1d and adaptive_max_pool1d are composites of these.
register_flops("aten::max_pool2d_with_indices", "aten::avg_pool2d")(_pool(2))
register_flops("aten::max_pool3d_with_indices", "aten::avg_pool3d")(_pool(3))


@register_flops(
    "aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool3d", "aten::adaptive_max_pool2d",
    "aten::adaptive_max_pool3d",
)
def _adaptive_pool(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    # Each input element is read into (about) one window: one add/compare each.
    return args[0].numel(), 0


@register_flops(
    "aten::max_pool2d_with_indices_backward", "aten::max_pool3d_with_indices_backward",
    "aten::avg_pool2d_backward", "aten::avg_pool3d_backward", "aten::_adaptive_avg_pool2d_backward",
    "aten::_adaptive_avg_pool3d_backward", "aten::adaptive_max_pool2d_backward",
    "aten::adaptive_max_pool3d_backward",
)
def _pool_backward(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    # Gradients are accumulated into the input's shape: one add per input element.
    return _out_numel(out), 0


# -- reductions ------------------------------------------------------------------------


def _reduction(per_input_element: int, per_output_element: int = 0) -> Formula:
    def formula(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
        return per_input_element * args[0].numel() + per_output_element * _out_numel(out), 0

    return formula


register_flops(
    "aten::sum", "aten::prod", "aten::amax", "aten::amin", "aten::argmax",
    "aten::argmin", "aten::cumsum", "aten::cumprod", "aten::logsumexp", "aten::any", "aten::all",
    "aten::norm", "aten::linalg_vector_norm", "aten::topk", "aten::sort",
)(_reduction(1))
register_flops("aten::mean")(_reduction(1, 1))  # the sum, then one divide per output
# var/std: mean, then subtract and square-accumulate (2) per element, one divide per output.
register_flops("aten::var", "aten::std", "aten::var_mean", "aten::std_mean")(_reduction(3, 1))


@register_flops("aten::max", "aten::min")
def _max_min(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    # max(a, b) of two tensors is an elementwise maximum (it decomposes into
    # aten::maximum): one per output element. Otherwise a reduction: one per input.
    if len(args) > 1 and isinstance(args[1], TensorMeta):
        return _out_numel(out), 0
    return args[0].numel(), 0


# -- embedding, scatter, interpolation ---------------------------------------------------


@register_flops("aten::embedding_dense_backward")
def _embedding_backward(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    # Each gradient row is added into its token's row: one add per grad element.
    return args[0].numel(), 0


@register_flops("aten::_embedding_bag_backward")
def _embedding_bag_backward(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    """Gradient of an ``nn.EmbeddingBag``'s weight, dense or sparse.

    ``(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
    scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx)``, ``grad`` is
    (bags, D). Sum (mode 0): each index's row gets its bag's gradient row, one add per
    index and column: N(indices) * D. Mean (1): the same adds, and each bag's gradient
    divided by its size first: + N(grad). Max (2): each bag's gradient row goes to its
    maximum's row: N(grad). ``per_sample_weights`` and ``scale_grad_by_freq`` each
    multiply every added row: + N(indices) * D. NB: padding indices are counted.
    """
    grad, indices = args[0], args[1]
    mode = int(_arg(args, kwargs, 8, "mode", 0))
    if mode == 2:
        return grad.numel(), 0
    added = indices.numel() * grad.shape[-1]
    flops = added + (grad.numel() if mode == 1 else 0)
    if _arg(args, kwargs, 10, "per_sample_weights") is not None:
        flops += added
    if _arg(args, kwargs, 7, "scale_grad_by_freq", False):
        flops += added
    return flops, 0


@register_flops("aten::scatter_add", "aten::scatter_add_", "aten::index_add", "aten::index_add_")
def _scatter_add(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    source = args[3] if len(args) > 3 else kwargs.get("src", kwargs.get("source"))
    return (source.numel() if isinstance(source, TensorMeta) else 0), 0


@register_flops("aten::index_put", "aten::index_put_", "aten::_index_put_impl_")
def _index_put(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    accumulate = bool(_arg(args, kwargs, 3, "accumulate", False))
    return (args[2].numel() if accumulate else 0), 0


# A linear interpolation is 3 FLOPs (sub, mul, add); n-linear needs 2**n - 1 of them.
register_flops("aten::upsample_linear1d")(_per_output_element(3))
register_flops("aten::upsample_bilinear2d", "aten::_upsample_bilinear2d_aa")(_per_output_element(9))
register_flops("aten::upsample_trilinear3d")(_per_output_element(21))
register_flops("aten::upsample_bicubic2d", "aten::_upsample_bicubic2d_aa")(_per_output_element(2 * 16))  # 16 taps, multiply-add each


# -- free: views, copies, creation, selection, random numbers -------------------------

declare_free(
    [
        # views and reshapes
        "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::t",
        "aten::transpose", "aten::permute", "aten::expand", "aten::expand_as", "aten::squeeze",
        "aten::unsqueeze", "aten::slice", "aten::select", "aten::split", "aten::split_with_sizes",
        "aten::unbind", "aten::chunk", "aten::narrow", "aten::alias", "aten::detach",
        "aten::as_strided", "aten::unfold", "aten::view_as_real", "aten::view_as_complex",
        "aten::movedim", "aten::flatten", "aten::unflatten", "aten::diagonal", "aten::numpy_T",
        "aten::unsafe_split", "aten::unsafe_chunk",
        "aten::unsafe_split_with_sizes", "aten::squeeze_", "aten::unsqueeze_", "aten::t_", "aten::transpose_",
        "aten::detach_",
        # copies and layout
        "aten::clone", "aten::contiguous", "aten::_to_copy", "aten::copy_", "aten::cat",
        "aten::stack", "aten::repeat", "aten::flip", "aten::roll", "aten::pad",
        "aten::constant_pad_nd", "aten::reflection_pad2d", "aten::replication_pad2d",
        "aten::lift_fresh", "aten::lift_fresh_copy", "aten::_local_scalar_dense",
        "aten::select_backward", "aten::slice_backward", "aten::index_select", "aten::gather",
        "aten::index", "aten::take", "aten::masked_select", "aten::nonzero", "aten::resize_",
        "aten::set_", "aten::upsample_nearest1d", "aten::upsample_nearest2d",
        "aten::upsample_nearest3d", "aten::_upsample_nearest_exact1d", "aten::_upsample_nearest_exact2d",
        "aten::_upsample_nearest_exact3d", "aten::pixel_shuffle",
        "aten::pixel_unshuffle", "aten::im2col", "aten::col2im", "aten::embedding",
        "aten::_embedding_bag", "aten::_embedding_bag_forward_only", "aten::scatter", "aten::scatter_",
        # creation
        "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::zeros", "aten::zeros_like",
        "aten::ones", "aten::ones_like", "aten::full", "aten::full_like", "aten::arange",
        "aten::linspace", "aten::scalar_tensor", "aten::new_zeros", "aten::new_ones",
        "aten::new_empty", "aten::new_empty_strided", "aten::new_full", "aten::fill_",
        "aten::zero_", "aten::eye", "aten::tril", "aten::triu", "aten::tril_", "aten::triu_",
        "aten::masked_fill", "aten::masked_fill_", "aten::where", "aten::_assert_async",
        "aten::_assert_tensor_metadata", "aten::sym_constrain_range_for_size",
        # drawing random numbers: see _RANDOM_TRANSFORMS
        "aten::random_", "aten::random", "aten::bernoulli", "aten::bernoulli_", "aten::rand",
        "aten::randn", "aten::randint", "aten::rand_like", "aten::randn_like", "aten::randint_like",
        "aten::normal", "aten::normal_", "aten::normal_functional", "aten::uniform", "aten::uniform_",
        "aten::randperm", "aten::multinomial",
    ]
)

# Random numbers. Drawing is free: bits and integers (random_, randint, randperm), uniform
# (rand, uniform_) and normal (randn, normal_) values in the op's own range, mean and std,
# bernoulli and multinomial draws are made by the generator, not by arithmetic on data.
# A distribution that torch makes from a draw by a closed-form transform counts the
# transform, per output element, one FLOP per operation as elementwise ops count:
_RANDOM_TRANSFORMS = {
    "exponential": 3,  # -log(1 - u) / lambda: subtract, log, divide (the sign folded in)
    "geometric": 3,  # ceil(log(u) / log(1 - p)): log, divide, ceil (log(1 - p) is computed once)
    "cauchy": 5,  # median + sigma * tan(pi * (u - 1/2)): subtract, multiply, tan, multiply, add
    "log_normal": 1,  # exp(z) of a normal draw z with the op's mean and std: exp
}
for _name, _cost in _RANDOM_TRANSFORMS.items():
    register_flops(*_with_inplace(f"aten::{_name}"))(_per_output_element(_cost))


# -- nn.MultiheadAttention's fused inference path ------------------------------------------


@register_flops("aten::_native_multi_head_attention")
def _native_mha(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    """In-projections of q, k, v, the two attention matmuls, the out-projection.

    ``(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
    proj_bias, ...)``; inputs are ``(B, L, E)`` or unbatched ``(L, E)``.
    """
    query, key = args[0], args[1]
    embed_dim, num_heads = int(args[3]), int(args[4])
    batch = query.shape[0] if query.dim() == 3 else 1
    q_len, kv_len = query.shape[-2], key.shape[-2]
    macs = (
        batch * q_len * embed_dim * embed_dim  # q projection
        + 2 * batch * kv_len * embed_dim * embed_dim  # k and v projections
        + 2 * batch * q_len * kv_len * embed_dim  # q @ k^T and attn @ v, all heads
        + batch * q_len * embed_dim * embed_dim  # out projection
    )
    bias = 0
    if args[6] is not None:
        bias += batch * (q_len + 2 * kv_len) * embed_dim
    if args[8] is not None:
        bias += batch * q_len * embed_dim
    softmax = 3 * batch * num_heads * q_len * kv_len
    return 2 * macs + bias + softmax, macs


@register_flops("aten::_transformer_encoder_layer_fwd")
def _encoder_layer(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    """``nn.TransformerEncoderLayer``'s fused inference path: self-attention (as
    :func:`_native_mha` counts it, query = key = value = ``src``), the two feed-forward
    Linears with their biases, the activation (1 per hidden element), the two layer
    norms and the two residual adds, each as its unfused op counts, so the fused and
    unfused paths count the same.

    ``(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
    use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
    ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask, mask_type)``; ``src`` is
    ``(B, L, E)`` or ``(L, E)``. A nested ``src`` (padding dropped by a key padding
    mask) has no dense shape: refused, so the op is listed as not counted.
    """
    src = args[0]
    if getattr(src, "shape", None) is None or src.dim() not in (2, 3):
        raise ValueError("a nested or unshaped src: no dense shape to count")
    attention_flops, attention_macs = _native_mha((src, src, src, *args[1:7]), {}, out)
    tokens, embed_dim = src.numel() // src.shape[-1], src.shape[-1]
    hidden = args[14].shape[0]
    ffn_macs = 2 * tokens * embed_dim * hidden
    biases = tokens * hidden * (args[15] is not None) + tokens * embed_dim * (args[17] is not None)
    norms = sum(
        (5 + (weight is not None) + (bias is not None)) * src.numel() for weight, bias in ((args[10], args[11]), (args[12], args[13]))
    )
    residuals = 2 * src.numel()
    flops = attention_flops + 2 * ffn_macs + biases + tokens * hidden + norms + residuals
    return flops, attention_macs + ffn_macs


# -- weight normalisation ---------------------------------------------------------------------


@register_flops("aten::_weight_norm_interface")
def _weight_norm(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    """``w = v * (g / ||v||)`` (``nn.utils.weight_norm`` and its parametrization),
    ``(v, g, dim)``: the norms square and accumulate every element of ``v`` (2 each),
    each norm's square root and ``g / norm`` (2 per element of ``g``), then one multiply
    per element of ``v``."""
    v, g = args[0], args[1]
    return 3 * v.numel() + 2 * g.numel(), 0


# -- FFT ----------------------------------------------------------------------------------------


def _fft(points_of: Callable[[Args, Any], tuple[int, int]], per_point: float) -> Formula:
    """``per_point * n * log2(n)`` per transform of ``n`` points (FFTW's convention: 5 for
    a complex transform, half that for a real one), times the transforms in the batch;
    normalisation (``normalization`` != 0) adds 1 per output element."""

    def formula(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
        points, transforms = points_of(args, out)
        flops = round(per_point * points * math.log2(points)) * transforms if points > 1 else 0
        normalization = _arg(args, kwargs, 2, "normalization", 0)
        if normalization:
            flops += out.numel()
        return flops, 0

    return formula


def _real_points(args: Args, out: Any) -> tuple[int, int]:
    """(points per transform, transforms) over the real input's ``dim`` sizes."""
    real, dims = args[0], args[1]
    points = math.prod(real.shape[d] for d in dims)
    return points, real.numel() // max(points, 1)


def _inverse_real_points(args: Args, out: Any) -> tuple[int, int]:
    """As :func:`_real_points`, over the real output's ``dim`` sizes."""
    dims = args[1]
    points = math.prod(out.shape[d] for d in dims)
    return points, out.numel() // max(points, 1)


register_flops("aten::_fft_r2c")(_fft(_real_points, 2.5))
register_flops("aten::_fft_c2r")(_fft(_inverse_real_points, 2.5))
register_flops("aten::_fft_c2c")(_fft(_real_points, 5))


# -- recurrent layers on CPU (oneDNN) -------------------------------------------------------


def _rnn_rows_and_gates(inputs: TensorMeta, w_ih: TensorMeta) -> tuple[int, int]:
    """(steps * batch, gate pre-activations over all steps): one row of the input per
    step and batch element, and ``w_ih.shape[0]`` (gates * hidden) pre-activations each."""
    rows = math.prod(inputs.shape[:-1])
    return rows, rows * w_ih.shape[0]


@register_flops("aten::mkldnn_rnn_layer")
def _mkldnn_rnn_layer(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    """One layer and direction of nn.LSTM/GRU/RNN run by oneDNN.

    ``(input, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, batch_sizes, mode, hidden_size,
    num_layers, has_biases, ...)``: every step multiplies the input by ``w_ih`` and the
    hidden state by ``w_hh``. NB: besides the MACs, 2 FLOPs per gate pre-activation for
    the two bias adds (none without biases) and 3 for the activation and state update.
    """
    inputs, w_ih, w_hh = args[0], args[1], args[2]
    rows, gate_values = _rnn_rows_and_gates(inputs, w_ih)
    macs = rows * (w_ih.numel() + w_hh.numel())
    per_gate_value = 5 if _arg(args, kwargs, 12, "has_biases", True) else 3
    return 2 * macs + per_gate_value * gate_values, macs


@register_flops("aten::mkldnn_rnn_layer_backward")
def _mkldnn_rnn_layer_backward(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    """Backward of ``mkldnn_rnn_layer``: every gradient, whatever needs it (the kernel
    has no mask).

    ``(input, w_ih, w_hh, b_ih, b_hh, hx, cx, output, hy, cy, grad_output, grad_hy,
    grad_cy, reverse, mode, hidden_size, num_layers, has_biases, ...)``. Each of the
    forward's two matrix products per step (input @ w_ih^T, hidden @ w_hh^T) has two in
    backward, the gradient of its input and that of its weight, each as many MACs as
    the forward one: per row of the input, d_input = d_gates @ w_ih and
    d_w_ih += d_gates^T @ input (N(w_ih) each), d_hidden = d_gates @ w_hh and
    d_w_hh += d_gates^T @ hidden (N(w_hh) each). NB: besides the MACs, per gate
    pre-activation, 2 for each of the forward's 3 activation and state-update operations
    (the derivative and its product with the gradient) and 2 for the bias gradients
    (one add into each of b_ih's and b_hh's; none without biases).
    """
    inputs, w_ih, w_hh = args[0], args[1], args[2]
    rows, gate_values = _rnn_rows_and_gates(inputs, w_ih)
    macs = rows * (2 * w_ih.numel() + 2 * w_hh.numel())
    per_gate_value = 2 * 3 + (2 if _arg(args, kwargs, 17, "has_biases", True) else 0)
    return 2 * macs + per_gate_value * gate_values, macs


# -- vector products and losses ------------------------------------------------------------


@register_flops("aten::mv")
def _mv(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    macs = args[0].numel()  # (m, n) @ (n,): m * n multiply-accumulates
    return 2 * macs, macs


@register_flops("aten::dot", "aten::vdot")
def _dot(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    macs = args[0].numel()
    return 2 * macs, macs


register_flops("aten::celu", "aten::celu_", "aten::log_sigmoid_forward")(_per_output_element(1))
register_flops("aten::log_sigmoid_backward")(_per_output_element(2))


# -- optimizers: multi-tensor (foreach) and fused kernels ------------------------------


def _list_numel(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return sum(t.numel() for t in value if isinstance(t, TensorMeta))
    return value.numel() if isinstance(value, TensorMeta) else 0


def _foreach(flops_per_element: int) -> Formula:
    def formula(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
        # One elementwise op over a list of tensors: per element of the first list.
        return flops_per_element * _list_numel(args[0]), 0

    return formula


for _names, _cost in (
    (("add", "sub", "mul", "div", "sqrt", "neg", "abs", "exp", "log", "reciprocal", "sign", "pow",
      "maximum", "minimum", "clamp_min", "clamp_max", "sigmoid", "tanh", "rsqrt"), 1),
    (("lerp", "addcmul", "addcdiv", "norm"), 2),
):
    register_flops(*[f"aten::_foreach_{n}{tail}" for n in _names for tail in ("", "_")])(_foreach(_cost))


@register_flops("aten::_fused_adam_", "aten::_fused_adam")
def _fused_adam(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    """Adam per parameter element, as its unfused form counts it: the first moment's
    lerp (2), the second's scale and addcmul (1 + 2), sqrt (1), bias correction (1), eps
    (1) and the addcdiv update (2) = 10."""
    return 10 * _list_numel(args[0]), 0


@register_flops("aten::_fused_adamw_", "aten::_fused_adamw")
def _fused_adamw(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    """AdamW: Adam's 10 per element plus 1 for the decoupled weight decay."""
    return 11 * _list_numel(args[0]), 0


@register_flops("aten::_fused_sgd_", "aten::_fused_sgd")
def _fused_sgd(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    """SGD per parameter element: the update ``p -= lr * g`` counted as one FLOP, as
    ``aten::add_`` counts it unfused (momentum and weight decay are ignored)."""
    return _list_numel(args[0]), 0


@register_flops("aten::mse_loss")
def _mse_loss(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    # subtract, square, accumulate: 3 per element (the final mean's divide ignored)
    return 3 * args[0].numel(), 0


@register_flops("aten::mse_loss_backward")
def _mse_loss_backward(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    # grad_input = 2 * (input - target) * grad / n: subtract, and two multiplies (the
    # constant 2/n folded into one), per input element
    return 3 * args[1].numel(), 0


@register_flops("aten::nll_loss_backward", "aten::nll_loss2d_backward")
def _nll_loss_backward(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    # a zero-filled gradient with minus the (scaled) output gradient scattered to one
    # entry per target: 1 per target
    return args[2].numel(), 0


@register_flops("aten::nll_loss_forward", "aten::nll_loss2d_forward")
def _nll_loss(args: Args, kwargs: Kwargs, out: Any) -> tuple[int, int]:
    # one gathered log-probability per target, negated and accumulated
    return 2 * args[1].numel(), 0
