"""FLOP and MAC formulas against counts worked out by hand.

Each expected number carries its arithmetic in a comment. Most cases run a real profile
of a tiny model (so capture, attribution and the tree build are exercised too); the
backward formulas and a few edge cases call ``count_op`` on a real op's real output.
Conventions: docs/flops.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import layerscope
from layerscope import zoo
from layerscope.flops import (
    count_op,
    formula_for,
    has_formula,
    is_free,
    register_flops,
    registered,
    unregister_flops,
)
from layerscope.model.tree import OpStats, Profile

# -- helpers -------------------------------------------------------------------------


def run(model: nn.Module, inputs: Any) -> Profile:
    """Profile once and check the tree's invariants, including self_flops == sum(op.flops)."""
    prof = layerscope.profile(model, inputs, warmup=0, repeat=1)
    layerscope.check_tree(prof)
    for node in prof.nodes():
        assert node.forward.self_flops == sum(op.flops or 0 for op in node.ops), node.path
        assert node.forward.self_macs == sum(op.macs or 0 for op in node.ops), node.path
        unsupported: dict[str, int] = {}
        for op in node.ops:
            if op.flops is None:
                unsupported[op.name] = unsupported.get(op.name, 0) + op.calls
        assert node.unsupported_ops == unsupported, node.path
    return prof


def ops_named(prof: Profile, name: str, path: str = "") -> list[OpStats]:
    return [op for op in prof[path].ops if op.name == name]


def only_op(prof: Profile, name: str, path: str = "") -> OpStats:
    found = ops_named(prof, name, path)
    assert len(found) == 1, f"{name} at {path!r}: {[(o.name, o.input_shapes) for o in prof[path].ops]}"
    return found[0]


def flops_macs(prof: Profile, path: str = "") -> tuple[int | None, int | None]:
    return prof[path].forward.flops, prof[path].forward.macs


def counted(op: Any, *args: Any, **kwargs: Any) -> tuple[int | None, int | None]:
    """Run the aten overload ``op`` for real and count it: ``(flops, macs)``."""
    out = op(*args, **kwargs)
    flops, macs, _ = count_op(op._schema.name, args, kwargs, out)
    return flops, macs


class Fn(nn.Module):
    """A module whose forward is ``fn``: ops it runs are attributed to it."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


# -- matrix products -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "bias", "op_name", "flops", "macs"),
    [
        # addmm: 4*8*16 = 512 MACs; 2*512 + 4*16 bias adds = 1088
        ((4, 8), True, "aten::addmm", 1088, 512),
        # mm: 4*8*16 = 512 MACs; 2*512, no bias = 1024
        ((4, 8), False, "aten::mm", 1024, 512),
        # (2,4,8) is flattened to 8 rows: 8*8*16 = 1024 MACs; 2*1024 + 8*16 = 2176
        ((2, 4, 8), True, "aten::addmm", 2176, 1024),
        # 8*8*16 = 1024 MACs; 2*1024 = 2048
        ((2, 4, 8), False, "aten::mm", 2048, 1024),
    ],
)
def test_linear(shape: tuple[int, ...], bias: bool, op_name: str, flops: int, macs: int) -> None:
    prof = run(nn.Linear(8, 16, bias=bias), randn(*shape))
    op = only_op(prof, op_name)
    assert (op.flops, op.macs) == (flops, macs)
    assert flops_macs(prof) == (flops, macs)  # aten::t and the views are free
    assert prof.unsupported_ops() == {}


@pytest.mark.parametrize(
    ("conv", "shape", "flops", "macs"),
    [
        # out (2,8,5,5) = 400 elements x 3*3*3 = 27 MACs = 10,800; 2*10,800 + 400 bias = 22,000
        (nn.Conv2d(3, 8, 3, padding=1), (2, 3, 5, 5), 22_000, 10_800),
        # no bias: 2 * 10,800 = 21,600
        (nn.Conv2d(3, 8, 3, padding=1, bias=False), (2, 3, 5, 5), 21_600, 10_800),
        # groups=2: out (1,8,3,3) = 72 x (4/2)*3*3 = 18 MACs = 1,296; 2*1,296 = 2,592
        (nn.Conv2d(4, 8, 3, groups=2, bias=False), (1, 4, 5, 5), 2_592, 1_296),
        # groups=2 with bias: 2,592 + 72 = 2,664
        (nn.Conv2d(4, 8, 3, groups=2), (1, 4, 5, 5), 2_664, 1_296),
        # depthwise: out (1,4,3,3) = 36 x 1*3*3 = 324 MACs; 2*324 + 36 = 684
        (nn.Conv2d(4, 4, 3, groups=4), (1, 4, 5, 5), 684, 324),
        # Conv1d: out (1,8,8) = 64 x 4*3 = 768 MACs; 2*768 + 64 = 1,600
        (nn.Conv1d(4, 8, 3), (1, 4, 10), 1_600, 768),
        # transposed (torch counts per *input* position): 1*5*5 x 4*8*3*3 = 7,200 MACs;
        # out (1,8,7,7) = 392 bias adds; 2*7,200 + 392 = 14,792
        (nn.ConvTranspose2d(4, 8, 3), (1, 4, 5, 5), 14_792, 7_200),
    ],
    ids=["bias", "no-bias", "grouped", "grouped-bias", "depthwise", "conv1d", "transposed"],
)
def test_convolution(conv: nn.Module, shape: tuple[int, ...], flops: int, macs: int) -> None:
    prof = run(conv, randn(*shape))
    op = only_op(prof, "aten::convolution")
    assert (op.flops, op.macs) == (flops, macs)
    assert flops_macs(prof) == (flops, macs)


def test_cudnn_convolution_has_no_bias_to_count() -> None:
    # aten::cudnn_convolution(self, weight, padding, stride, dilation, groups, ...) takes no
    # bias; args[2] is the padding list. The formula reads shapes only, so run it on CPU.
    x, w = randn(1, 3, 5, 5), randn(8, 3, 3, 3)
    args = (x, w, [0, 0], [1, 1], [1, 1], 1, False, False, True)
    flops, macs, _ = count_op("aten::cudnn_convolution", args, {}, torch.empty(1, 8, 3, 3))
    # out (1,8,3,3) = 72 x 3*3*3 = 27 -> 1,944 MACs; no bias: 2 * 1,944 = 3,888
    assert (flops, macs) == (3_888, 1_944)


def test_slow_conv2d_forward_counts_without_breaking_the_forward() -> None:
    # aten::_slow_conv2d_forward(self, weight, kernel_size, bias, stride, padding): the
    # bias is args[3], and there is no `transposed` argument.
    conv = Fn(lambda x, w: torch.ops.aten._slow_conv2d_forward(x, w, [3, 3], None, [1, 1], [0, 0]))
    prof = run(conv, (randn(1, 3, 5, 5), randn(8, 3, 3, 3)))
    # 72 outputs x 27 = 1,944 MACs; no bias: 3,888
    assert flops_macs(prof) == (3_888, 1_944)


@pytest.mark.parametrize(
    ("fn", "shapes", "op_name", "macs"),
    [
        # rank 3: 2 batches x 3*4*5 = 120 MACs
        (torch.bmm, [(2, 3, 4), (2, 4, 5)], "aten::bmm", 120),
        (torch.matmul, [(2, 3, 4), (2, 4, 5)], "aten::bmm", 120),
        # rank 4: 2*6 = 12 batches x 3*4*5 = 720 MACs
        (torch.matmul, [(2, 6, 3, 4), (2, 6, 4, 5)], "aten::bmm", 720),
        # rank 3 @ rank 2 folds into one mm: (6,4) @ (4,5) = 6*4*5 = 120 MACs
        (torch.matmul, [(2, 3, 4), (4, 5)], "aten::mm", 120),
        # einsum lowers to bmm: 2 x 3*4*5 = 120 MACs
        (lambda a, b: torch.einsum("bij,bjk->bik", a, b), [(2, 3, 4), (2, 4, 5)], "aten::bmm", 120),
        # attention-style einsum: 2*3 = 6 batches x 5 queries x 8 dims x 7 keys = 1,680 MACs
        (lambda a, b: torch.einsum("bhqd,bhkd->bhqk", a, b), [(2, 3, 5, 8), (2, 3, 7, 8)], "aten::bmm", 1_680),
    ],
    ids=["bmm", "matmul-3d", "matmul-4d", "matmul-3d-2d", "einsum-3d", "einsum-4d"],
)
def test_matrix_products(fn: Callable[..., Any], shapes: list[tuple[int, ...]], op_name: str, macs: int) -> None:
    prof = run(Fn(fn), tuple(randn(*s) for s in shapes))
    op = only_op(prof, op_name)
    assert (op.flops, op.macs) == (2 * macs, macs)  # no bias: exactly 2 per MAC
    assert flops_macs(prof) == (2 * macs, macs)  # expand/view/permute are free


def test_baddbmm_adds_its_bias() -> None:
    # 2 x 3*4*5 = 120 MACs; 2*120 + (2,3,5) = 30 bias adds = 270
    prof = run(Fn(torch.baddbmm), (randn(2, 3, 5), randn(2, 4, 3).transpose(1, 2), randn(2, 4, 5)))
    assert flops_macs(prof) == (270, 120)


# -- attention ---------------------------------------------------------------------------


@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_cpu_flash_kernel(is_causal: bool) -> None:
    q, k, v = randn(2, 3, 5, 8), randn(2, 3, 5, 8), randn(2, 3, 5, 8)
    prof = run(Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)), (q, k, v))
    op = only_op(prof, "aten::_scaled_dot_product_flash_attention_for_cpu")
    # B*H = 6: q @ k^T = 6*5*8*5 = 1,200 MACs, attn @ v = 6*5*5*8 = 1,200 -> 2,400 MACs;
    # flops 2*2,400 + 3 per score * (6*5*5 = 150 scores) = 4,800 + 450 = 5,250.
    # NB: a causal mask is not exploited, as torch counts it: the same 5,250.
    assert (op.flops, op.macs) == (5_250, 2_400)
    assert flops_macs(prof) == (5_250, 2_400)
    assert prof.unsupported_ops() == {}


def test_torch_counter_misses_cpu_flash_attention() -> None:
    # Why layerscope has its own formula for the CPU kernel: torch's counter gives it 0.
    q = randn(2, 3, 5, 8)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        F.scaled_dot_product_attention(q, q, q)
    assert counter.get_total_flops() == 0
    assert has_formula("aten::_scaled_dot_product_flash_attention_for_cpu")


def test_native_multi_head_attention_fast_path() -> None:
    mha = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    x = randn(2, 5, 16)
    prof = run(mha, (x, x, x))  # query is key is value: the fused inference path
    op = only_op(prof, "aten::_native_multi_head_attention")
    # B=2, L=S=5, E=16, 2 heads. MACs:
    #   q projection   2*5*16*16   = 2,560
    #   k, v proj.     2*2*5*16*16 = 5,120
    #   q@k^T, a@v     2*2*5*5*16  = 1,600
    #   out projection 2*5*16*16   = 2,560   -> 11,840
    # flops: 2*11,840 + in-proj bias 2*(5+2*5)*16 = 480 + out bias 2*5*16 = 160
    #        + softmax 3 * 2*2*5*5 = 300  -> 23,680 + 480 + 160 + 300 = 24,620
    assert (op.flops, op.macs) == (24_620, 11_840)
    assert flops_macs(prof) == (24_620, 11_840)


def test_native_multi_head_attention_cross_lengths() -> None:
    # The formula reads shapes only; torch's kernel refuses S != L, so feed real tensors.
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    q, kv = randn(2, 5, 16), randn(2, 7, 16)
    args = (q, kv, kv, 16, 2, mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias)
    flops, macs, _ = count_op("aten::_native_multi_head_attention", args, {}, (randn(2, 5, 16), None))
    # MACs: q 2*5*256 = 2,560; k,v 2*2*7*256 = 7,168; scores+values 2*2*5*7*16 = 2,240;
    #       out 2*5*256 = 2,560 -> 14,528
    # flops: 2*14,528 + bias 2*(5+14)*16 = 608 + 2*5*16 = 160 + softmax 3*2*2*5*7 = 420 -> 30,244
    assert (flops, macs) == (30_244, 14_528)


# -- elementwise ---------------------------------------------------------------------------


class Arithmetic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return ((y + x) * x / y) - x


def test_python_operators_counted_in_the_parent() -> None:
    prof = run(Arithmetic(), randn(3, 4))
    for name in ("aten::add", "aten::mul", "aten::div", "aten::sub"):
        op = only_op(prof, name)
        assert (op.flops, op.macs) == (12, 0)  # 1 per element of (3,4)
        assert not ops_named(prof, name, "lin")
    # parent self: 4 ops x 12 = 48; child lin: 3*4*4 = 48 MACs, 2*48 + 3*4 = 108
    assert (prof[""].forward.self_flops, prof[""].forward.self_macs) == (48, 0)
    assert flops_macs(prof, "lin") == (108, 48)
    assert flops_macs(prof) == (156, 48)


def test_scalar_operands() -> None:
    # x*2 (mul), 1-x (rsub), x+1 (add), x**2 (pow): 1 per element of (2,3) = 6 each
    prof = run(Fn(lambda x: (x * 2, 1 - x, x + 1, x**2)), randn(2, 3))
    assert [(op.name, op.flops) for op in prof[""].ops] == [
        ("aten::mul", 6), ("aten::rsub", 6), ("aten::add", 6), ("aten::pow", 6),
    ]


@pytest.mark.parametrize(
    ("module", "op_name", "flops"),
    [
        # (2,3,4) = 24 elements: 1 FLOP each, whatever the function
        (nn.ReLU(), "aten::relu", 24),
        (nn.GELU(), "aten::gelu", 24),
        (nn.SiLU(), "aten::silu", 24),
        (nn.Tanh(), "aten::tanh", 24),
        (nn.Sigmoid(), "aten::sigmoid", 24),
        # softmax: exp, sum, divide = 3 per element: 3*24 = 72
        (nn.Softmax(dim=-1), "aten::_softmax", 72),
        (nn.LogSoftmax(dim=-1), "aten::_log_softmax", 72),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_activations(module: nn.Module, op_name: str, flops: int) -> None:
    prof = run(module, randn(2, 3, 4))
    op = only_op(prof, op_name)
    assert (op.flops, op.macs) == (flops, 0)
    assert flops_macs(prof) == (flops, 0)


# -- normalisation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "flops"),
    [
        # (2,3,16) = 96 elements x (5 + 1 weight + 1 bias) = 672
        (nn.LayerNorm(16), 672),
        # no affine: 5*96 = 480
        (nn.LayerNorm(16, elementwise_affine=False), 480),
        # weight only: 6*96 = 576
        (nn.LayerNorm(16, bias=False), 576),
    ],
    ids=["affine", "plain", "weight-only"],
)
def test_layer_norm(module: nn.Module, flops: int) -> None:
    prof = run(module, randn(2, 3, 16))
    assert only_op(prof, "aten::native_layer_norm").flops == flops
    assert flops_macs(prof) == (flops, 0)


def test_batch_norm_train_and_eval() -> None:
    bn = nn.BatchNorm2d(4)
    x = randn(2, 4, 5, 5)  # 200 elements
    prof = run(bn.train(), x)
    # training: batch statistics, (5 + 1 weight + 1 bias) * 200 = 1,400
    assert only_op(prof, "aten::native_batch_norm").flops == 1_400
    # + num_batches_tracked += 1: an aten::add_ of one element, 1 FLOP
    assert only_op(prof, "aten::add_").flops == 1
    assert flops_macs(prof) == (1_401, 0)
    prof = run(bn.eval(), x)
    # eval: running statistics, subtract and scale (2) + weight + bias = 4 * 200 = 800
    assert only_op(prof, "aten::native_batch_norm").flops == 800
    assert flops_macs(prof) == (800, 0)


def test_group_norm() -> None:
    # native_group_norm: (5 + 1 + 1) * (2*4*5*5 = 200) = 1,400
    prof = run(nn.GroupNorm(2, 4), randn(2, 4, 5, 5))
    assert only_op(prof, "aten::native_group_norm").flops == 1_400
    assert flops_macs(prof) == (1_400, 0)


@pytest.mark.parametrize(("affine", "flops"), [(False, 1_000), (True, 1_400)])
def test_instance_norm(affine: bool, flops: int) -> None:
    # InstanceNorm2d runs native_batch_norm in training mode on a (1, 2*4, 5, 5) view:
    # 5 * 200 = 1,000; affine (weight and bias repeated per sample): 7 * 200 = 1,400
    prof = run(nn.InstanceNorm2d(4, affine=affine), randn(2, 4, 5, 5))
    assert only_op(prof, "aten::native_batch_norm").flops == flops
    assert flops_macs(prof) == (flops, 0)


def test_rms_norm_decomposes_on_cpu_and_is_supported() -> None:
    prof = run(nn.RMSNorm(16), randn(2, 3, 16))
    # torch 2.13 on CPU runs nn.RMSNorm as plain ops, not aten::_fused_rms_norm.
    # (2,3,16) = 96 elements in 6 rows:
    #   pow 96 + mean (96 adds + 6 divides) + add_ eps 6 + rsqrt 6 + mul 96 + mul weight 96 = 402
    assert {op.name for op in prof[""].ops} == {
        "aten::pow", "aten::mean", "aten::add_", "aten::rsqrt", "aten::mul",
    }
    assert prof.unsupported_ops() == {}
    assert flops_macs(prof) == (402, 0)


def test_fused_rms_norm_formula() -> None:
    x, weight = randn(2, 3, 16), randn(16)
    fused = torch.ops.aten._fused_rms_norm.default
    # 4 per element (no mean to subtract) + 1 for the weight: 5 * 96 = 480
    assert counted(fused, x, [16], weight, 1e-5) == (480, 0)
    # no weight: 4 * 96 = 384
    assert counted(fused, x, [16], None, 1e-5) == (384, 0)


# -- pooling ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "op_name", "flops"),
    [
        # out (1,3,3,3) = 27 x 2*2 window = 108
        (nn.MaxPool2d(2), "aten::max_pool2d_with_indices", 108),
        # out (1,3,4,4) = 48 x 3*3 window = 432
        (nn.AvgPool2d(3, stride=1), "aten::avg_pool2d", 432),
        # adaptive: one add/compare per input element: 1*3*6*6 = 108
        (nn.AdaptiveAvgPool2d(2), "aten::_adaptive_avg_pool2d", 108),
        (nn.AdaptiveMaxPool2d(2), "aten::adaptive_max_pool2d", 108),
        # output size 1 becomes a mean: 108 adds + 3 divides = 111
        (nn.AdaptiveAvgPool2d(1), "aten::mean", 111),
    ],
    ids=["max", "avg", "adaptive-avg", "adaptive-max", "global-avg"],
)
def test_pooling(module: nn.Module, op_name: str, flops: int) -> None:
    prof = run(module, randn(1, 3, 6, 6))
    assert only_op(prof, op_name).flops == flops
    assert flops_macs(prof) == (flops, 0)


def test_max_pool1d_runs_as_2d() -> None:
    # On the CPU, without grad, max_pool1d's own kernel does the work (its only part is
    # an aten::empty), so it is one row, counted by its decomposition:
    # (1,3,8) -> unsqueeze -> max_pool2d over [1, 2]: out 1*3*1*4 = 12 x 2 = 24
    prof = run(nn.MaxPool1d(2), randn(1, 3, 8))
    assert only_op(prof, "aten::max_pool1d").flops == 24
    assert flops_macs(prof) == (24, 0)
    # count_flops (a dispatch mode) sees the decomposition torch runs under a mode.
    counted_prof = layerscope.count_flops(nn.MaxPool1d(2), randn(1, 3, 8))
    assert only_op(counted_prof, "aten::max_pool2d_with_indices").flops == 24


# -- reductions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "op_name", "flops"),
    [
        # x is (2,3): 6 elements
        (lambda x: x.sum(), "aten::sum", 6),  # 1 per input element
        (lambda x: x.sum(1), "aten::sum", 6),
        (lambda x: x.mean(), "aten::mean", 7),  # 6 adds + 1 divide per output
        (lambda x: x.mean(1), "aten::mean", 8),  # 6 + 2 outputs
        (lambda x: x.var(), "aten::var", 19),  # 3*6 + 1
        (lambda x: x.var(1), "aten::var", 20),  # 3*6 + 2
        (lambda x: x.std(1), "aten::std", 20),  # 3*6 + 2
        (lambda x: x.amax(1), "aten::amax", 6),
    ],
    ids=["sum", "sum-dim", "mean", "mean-dim", "var", "var-dim", "std-dim", "amax"],
)
def test_reductions(fn: Callable[[torch.Tensor], torch.Tensor], op_name: str, flops: int) -> None:
    prof = run(Fn(fn), randn(2, 3))
    assert only_op(prof, op_name).flops == flops
    assert flops_macs(prof) == (flops, 0)


# -- embedding, interpolation, free ops ----------------------------------------------------------


def test_embedding_is_free_not_unsupported() -> None:
    prof = run(nn.Embedding(10, 4), torch.tensor([[1, 2, 3]]))
    op = only_op(prof, "aten::embedding")
    assert (op.flops, op.macs) == (0, 0)
    assert flops_macs(prof) == (0, 0)
    assert prof.unsupported_ops() == {}
    assert is_free("aten::embedding")


@pytest.mark.parametrize(
    ("kwargs", "op_name", "flops"),
    [
        # nearest copies: free
        ({"scale_factor": 2, "mode": "nearest"}, "aten::upsample_nearest2d", 0),
        # bilinear: 3 linear interpolations x 3 FLOPs = 9 per output; out (1,2,5,7) = 70 -> 630
        ({"size": (5, 7), "mode": "bilinear"}, "aten::upsample_bilinear2d", 630),
        # bicubic: 16 taps x multiply-add = 32 per output; out (1,2,6,6) = 72 -> 2,304
        ({"scale_factor": 2, "mode": "bicubic"}, "aten::upsample_bicubic2d", 2_304),
    ],
    ids=["nearest", "bilinear", "bicubic"],
)
def test_interpolate(kwargs: dict[str, Any], op_name: str, flops: int) -> None:
    prof = run(Fn(lambda x: F.interpolate(x, **kwargs)), randn(1, 2, 3, 3))
    assert only_op(prof, op_name).flops == flops
    assert flops_macs(prof) == (flops, 0)
    assert prof.unsupported_ops() == {}


def test_interpolate_linear_1d() -> None:
    # 3 FLOPs per output; out (1,3,8) = 24 -> 72
    prof = run(Fn(lambda x: F.interpolate(x, scale_factor=2, mode="linear")), randn(1, 3, 4))
    assert only_op(prof, "aten::upsample_linear1d").flops == 72


def test_views_reshapes_and_copies_are_free() -> None:
    def shuffle(x: torch.Tensor) -> Any:
        return (
            x.view(6), x.reshape(3, 2), torch.cat([x, x]), torch.stack([x, x]), x.t(),
            x.permute(1, 0), x.unsqueeze(0), x[0], x[:, 1:], x.transpose(0, 1).contiguous(),
        )

    prof = run(Fn(shuffle), randn(2, 3))
    names = {op.name for op in prof[""].ops}
    assert {"aten::view", "aten::cat", "aten::stack", "aten::clone", "aten::select"} <= names
    for op in prof[""].ops:
        assert (op.flops, op.macs, op.bytes) == (0, 0, 0), op.name
        assert is_free(op.name), op.name
    assert prof.unsupported_ops() == {}
    assert flops_macs(prof) == (0, 0)


def test_free_declarations_name_real_ops() -> None:
    # A free declaration under a misspelled name leaves the real op unsupported.
    bogus = [n for n in registered() if is_free(n) and n.startswith("aten::")
             and not hasattr(torch.ops.aten, n.split("::", 1)[1])]
    assert bogus == []


# -- recurrent networks ------------------------------------------------------------------------


# Input (seq 5, batch 2, 8 features), hidden 16; G gate blocks (RNN 1, GRU 3, LSTM 4).
# One step: the input projection 2*8*16G MACs + the recurrent one 2*16*16G MACs.
# torch projects all 5 steps' inputs in one addmm: 10*8*16G, then 5 recurrent addmms.
RNN_CASES = [
    # G=1: 10*8*16 = 1,280 + 5 * 2*16*16 = 2,560 -> 3,840
    (nn.RNN, 3_840),
    # G=3: 10*8*48 = 3,840 + 5 * 2*16*48 = 7,680 -> 11,520
    (nn.GRU, 11_520),
    # G=4: 10*8*64 = 5,120 + 5 * 2*16*64 = 10,240 -> 15,360  (one step: 1,024 + 2,048 = 3,072)
    (nn.LSTM, 15_360),
]


@pytest.mark.parametrize(("cls", "macs"), RNN_CASES, ids=["RNN", "GRU", "LSTM"])
def test_recurrent_macs(cls: type[nn.Module], macs: int) -> None:
    prof = run(cls(8, 16), randn(5, 2, 8))
    assert prof.root.forward.macs == macs, prof.unsupported_ops()


@pytest.mark.parametrize(("cls", "macs"), RNN_CASES, ids=["RNN", "GRU", "LSTM"])
def test_recurrent_no_unsupported_ops(cls: type[nn.Module], macs: int) -> None:
    prof = run(cls(8, 16), randn(5, 2, 8))
    assert prof.unsupported_ops() == {}


def test_rnn_flops() -> None:
    prof = run(nn.RNN(8, 16), randn(5, 2, 8))
    # input addmm 2*1,280 + 10*16 bias = 2,720; recurrent addmms 5 * (2*512 + 2*16) = 5,280;
    # add_ of the two projections 5 * 32 = 160; tanh 5 * 32 = 160 -> 8,320
    assert flops_macs(prof) == (8_320, 3_840)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_lstm_without_mkldnn() -> None:
    # Without oneDNN, nn.LSTM runs as addmm + elementwise ops; the gates are split with
    # aten::unsafe_split, which does no arithmetic.
    with torch.backends.mkldnn.flags(enabled=False):
        prof = run(nn.LSTM(8, 16), randn(5, 2, 8))
    assert prof.root.forward.macs == 15_360
    assert prof.unsupported_ops() == {}


# -- anchors: zoo models ------------------------------------------------------------------------


def zoo_profile(name: str, batch: int) -> Profile:
    entry = zoo.get(name)
    torch.manual_seed(0)
    return run(entry.build().eval(), entry.example_inputs(batch))


# lenet5 on 1x32x32, per module (MACs, flops):
#   features.0 conv 1->6 k5: out 6*28*28 = 4,704 x 25 = 117,600 MACs; 2*117,600 + 4,704 = 239,904
#   features.1 tanh 4,704
#   features.2 avgpool 2: out 6*14*14 = 1,176 x 4 = 4,704
#   features.3 conv 6->16 k5: out 16*10*10 = 1,600 x 6*25 = 240,000 MACs; 480,000 + 1,600 = 481,600
#   features.4 tanh 1,600
#   features.5 avgpool 2: out 16*5*5 = 400 x 4 = 1,600
#   classifier.0 400->120: 48,000 MACs; 96,000 + 120 = 96,120
#   classifier.1 tanh 120
#   classifier.2 120->84: 10,080 MACs; 20,160 + 84 = 20,244
#   classifier.3 tanh 84
#   classifier.4 84->10: 840 MACs; 1,680 + 10 = 1,690
#   MACs 117,600 + 240,000 + 48,000 + 10,080 + 840 = 416,520; flops sum = 852,370
LENET5 = {
    "features.0": (239_904, 117_600), "features.1": (4_704, 0), "features.2": (4_704, 0),
    "features.3": (481_600, 240_000), "features.4": (1_600, 0), "features.5": (1_600, 0),
    "classifier.0": (96_120, 48_000), "classifier.1": (120, 0), "classifier.2": (20_244, 10_080),
    "classifier.3": (84, 0), "classifier.4": (1_690, 840), "": (852_370, 416_520),
}


def test_lenet5_by_hand() -> None:
    prof = zoo_profile("lenet5", 1)
    for path, expected in LENET5.items():
        assert flops_macs(prof, path) == expected, path
    assert prof[""].forward.self_flops == 0  # torch.flatten is a view
    assert prof.unsupported_ops() == {}


def test_mlp_by_hand() -> None:
    prof = zoo_profile("mlp", 1)
    # MACs 64*256 + 256*256 + 256*10 = 16,384 + 65,536 + 2,560 = 84,480
    # flops 2*84,480 + bias 256 + 256 + 10 + relu 256 + 256 = 168,960 + 522 + 512 = 169,994
    assert flops_macs(prof) == (169_994, 84_480)


def test_gpt_by_hand() -> None:
    prof = zoo_profile("gpt", 1)
    # T=32 tokens, d=128, 4 heads of 32, 4 blocks, vocab 1000. Per block, MACs:
    #   qkv 32*128*384 = 1,572,864; q@k^T and a@v 2 * 4*32*32*32 = 262,144; proj 32*128*128 = 524,288;
    #   fc 32*128*512 = 2,097,152; mlp proj 2,097,152   -> 6,553,600
    # non-MAC flops per block: ln_1 and ln_2 2 * 7*4,096 = 57,344; qkv bias 12,288;
    #   softmax 3*4*32*32 = 12,288; proj bias 4,096; fc bias 16,384; gelu 16,384;
    #   mlp proj bias 4,096; two residual adds 8,192   -> 131,072
    block = (2 * 6_553_600 + 131_072, 6_553_600)
    assert flops_macs(prof, "blocks.0") == block
    # total MACs 4 * 6,553,600 + lm_head 32*128*1000 = 4,096,000 -> 30,310,400
    # flops 2*30,310,400 + 4 * 131,072 + wte+wpe add 4,096 + ln_f 28,672 = 61,177,856
    assert flops_macs(prof) == (61_177_856, 30_310_400)
    assert prof.unsupported_ops() == {}


def test_alexnet_macs() -> None:
    prof = zoo_profile("alexnet", 1)
    # conv1 64*55*55 x 3*11*11  =  70,276,800
    # conv2 192*27*27 x 64*5*5  = 223,948,800
    # conv3 384*13*13 x 192*3*3 = 112,140,288
    # conv4 256*13*13 x 384*3*3 = 149,520,384
    # conv5 256*13*13 x 256*3*3 =  99,680,256
    # fc 9216*4096 + 4096*4096 + 4096*1000 = 37,748,736 + 16,777,216 + 4,096,000
    # total 714,188,480
    assert prof.root.forward.macs == 714_188_480
    assert prof.unsupported_ops() == {}


@pytest.mark.parametrize("name", ["lenet5", "gpt"])
def test_twice_macs_equals_torch_counter(name: str) -> None:
    entry = zoo.get(name)
    torch.manual_seed(0)
    model, x = entry.build().eval(), entry.example_inputs(1)
    prof = run(model, x)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    # torch counts matmuls and convolutions only, 2 per MAC; it has no formula for the CPU
    # attention kernel (see test_torch_counter_misses_cpu_flash_attention).
    sdpa_macs = sum(
        op.macs or 0 for node in prof.nodes() for op in node.ops
        if op.name == "aten::_scaled_dot_product_flash_attention_for_cpu"
    )
    assert counter.get_total_flops() == 2 * (prof.root.forward.macs - sdpa_macs)
    assert counter.get_total_flops() > 0


# -- metamorphic --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "lenet5", "gpt"])
def test_batch_doubles_flops_and_macs(name: str) -> None:
    one, two = zoo_profile(name, 1), zoo_profile(name, 2)
    assert one.root.forward.flops > 0
    for node in one.nodes():
        assert two[node.path].forward.flops == 2 * node.forward.flops, node.path
        assert two[node.path].forward.macs == 2 * node.forward.macs, node.path


class RunsTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.lin(x))


class SharedByTwoParents(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(4, 4)
        self.first = nn.Sequential(shared, nn.ReLU())
        self.second = nn.Sequential(shared, nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


def test_module_called_twice_counts_flops_twice_params_once() -> None:
    prof = run(RunsTwice(), randn(3, 4))
    # one call: 3*4*4 = 48 MACs, 2*48 + 3*4 = 108 flops; two calls: 216, 96
    assert prof["lin"].calls == 2
    assert flops_macs(prof, "lin") == (216, 96)
    assert only_op(prof, "aten::addmm", "lin").calls == 2
    assert prof.root.params_total == 4 * 4 + 4


def test_shared_module_counted_at_its_first_path() -> None:
    prof = run(SharedByTwoParents(), randn(3, 4))
    assert "second.0" not in prof
    assert flops_macs(prof, "first.0") == (216, 96)  # both calls, at its first path
    assert flops_macs(prof, "first.1") == (12, 0)  # relu on (3,4)
    assert flops_macs(prof, "second.1") == (12, 0)  # tanh
    assert flops_macs(prof, "second") == (12, 0)
    assert flops_macs(prof) == (240, 96)
    assert prof.root.params_total == 20


# -- the registry ---------------------------------------------------------------------------


@torch.library.custom_op("lstest::flops_scale", mutates_args=())
def lstest_scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


# torch's profiler records an op's inputs, not its output: a formula that reads ``out``
# gets it from the op's fake implementation, as torch.compile needs one too.
@lstest_scale.register_fake
def _(x: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.empty_like(x)


class Scaler(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return lstest_scale(x, 3.0)


class WithScaler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scaler = Scaler()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.scaler(x))


@pytest.fixture
def no_scale_formula() -> Iterator[None]:
    unregister_flops("lstest::flops_scale")
    try:
        yield
    finally:
        unregister_flops("lstest::flops_scale")


def test_custom_op_unsupported_until_registered(no_scale_formula: None) -> None:
    model, x = WithScaler(), randn(2, 4)
    prof = run(model, x)
    op = only_op(prof, "lstest::flops_scale", "scaler")
    assert (op.flops, op.macs) == (None, None)  # unknown, not zero
    assert prof["scaler"].unsupported_ops == {"lstest::flops_scale": 1}
    assert prof[""].unsupported_ops == {}
    assert prof.unsupported_ops() == {"lstest::flops_scale": 1}
    # lin alone: 2*4*4 = 32 MACs, 2*32 + 2*4 = 72
    assert flops_macs(prof) == (72, 32)

    @register_flops("lstest::flops_scale")
    def scale_flops(args: Any, kwargs: Any, out: Any) -> tuple[int, int]:
        return out.numel(), 0  # one multiply per element

    prof = run(model, x)
    assert only_op(prof, "lstest::flops_scale", "scaler").flops == 8  # (2,4)
    assert prof.unsupported_ops() == {}
    assert prof["scaler"].unsupported_ops == {}
    assert flops_macs(prof) == (80, 32)

    unregister_flops("lstest::flops_scale")
    assert run(model, x).unsupported_ops() == {"lstest::flops_scale": 1}


def test_registering_twice_is_an_error(no_scale_formula: None) -> None:
    def first(args: Any, kwargs: Any, out: Any) -> tuple[int, int]:
        return 1, 0

    register_flops("lstest::flops_scale")(first)
    with pytest.raises(ValueError, match="already registered"):
        register_flops("lstest::flops_scale")(lambda args, kwargs, out: (2, 0))
    # the packet and the overload name the same op
    with pytest.raises(ValueError, match="already registered"):
        register_flops(torch.ops.lstest.flops_scale)(lambda args, kwargs, out: (2, 0))
    with pytest.raises(ValueError, match="already registered"):
        register_flops(torch.ops.lstest.flops_scale.default)(lambda args, kwargs, out: (2, 0))
    assert formula_for("lstest::flops_scale") is first
    with pytest.raises(ValueError, match="already registered"):
        register_flops("aten::addmm")(first)


def test_register_flops_rejects_bad_names() -> None:
    with pytest.raises(ValueError, match="namespace::name"):
        register_flops("addmm")
    with pytest.raises(TypeError):
        register_flops()


def test_count_op_unknown_free_and_bytes() -> None:
    x = randn(2, 3)
    # unknown: no flops, no macs, but its traffic: (6 in + 6 out) * 4 bytes = 48
    assert count_op("lstest::no_such_op", (x,), {}, x) == (None, None, 48)
    # free: nothing at all
    assert count_op("aten::view", (x, [6]), {}, x.view(6)) == (0, 0, 0)
    bias, a, b = randn(16), randn(4, 8), randn(8, 16)
    out = torch.addmm(bias, a, b)
    # (16 + 32 + 128 + 64) floats * 4 bytes = 960
    assert count_op("aten::addmm", (bias, a, b), {}, out) == (1_088, 512, 960)
    assert not is_free("aten::add") and has_formula("aten::add")


# -- backward and other formulas, on real op outputs --------------------------------------------


def test_elementwise_backward_and_friends() -> None:
    g, x = randn(2, 3), randn(2, 3)
    aten = torch.ops.aten
    # derivative and its product with the gradient: 2 per element of (2,3) = 12
    assert counted(aten.gelu_backward.default, g, x) == (12, 0)
    assert counted(aten.threshold_backward.default, g, x, 0.0) == (12, 0)
    # softmax backward: 3 per element = 18
    y = torch.softmax(x, -1)
    assert counted(aten._softmax_backward_data.default, g, y, -1, torch.float32) == (18, 0)
    # addcmul: 2 per element = 12
    assert counted(aten.addcmul.default, x, x, x) == (12, 0)
    # native_dropout: one multiply by the scaled mask = 6
    assert counted(aten.native_dropout.default, x, 0.5, True) == (6, 0)


def test_norm_and_pool_backward() -> None:
    aten = torch.ops.aten
    x, w, b = randn(2, 3, 16), randn(16), randn(16)
    _, mean, rstd = aten.native_layer_norm.default(x, [16], w, b, 1e-5)
    # 12 per input element: 12 * 96 = 1,152
    assert counted(aten.native_layer_norm_backward.default, x, x, [16], mean, rstd, w, b,
                   [True, True, True]) == (1_152, 0)
    img = randn(1, 3, 6, 6)
    pooled, indices = aten.max_pool2d_with_indices.default(img, [2, 2])
    # one add per element of the gradient w.r.t. the input: 1*3*6*6 = 108
    assert counted(aten.max_pool2d_with_indices_backward.default, pooled, img, [2, 2], [2, 2],
                   [0, 0], [1, 1], False, indices) == (108, 0)


def test_convolution_backward() -> None:
    aten = torch.ops.aten
    x, w = randn(1, 3, 5, 5), randn(8, 3, 3, 3)
    grad = randn(1, 8, 3, 3)
    # forward MACs: 1*8*3*3 = 72 outputs x 27 = 1,944. grad_input and grad_weight cost
    # one forward each: 2 * 1,944 = 3,888 MACs; flops 2*3,888 + grad_bias sums 72 = 7,848
    assert counted(aten.convolution_backward.default, grad, x, w, [8], [1, 1], [0, 0], [1, 1],
                   False, [0, 0], 1, [True, True, True]) == (7_848, 3_888)
    # without grad_bias: 7,776
    assert counted(aten.convolution_backward.default, grad, x, w, [8], [1, 1], [0, 0], [1, 1],
                   False, [0, 0], 1, [True, True, False]) == (7_776, 3_888)


def test_sdpa_cpu_backward() -> None:
    aten = torch.ops.aten
    q, k, v = randn(2, 3, 5, 8), randn(2, 3, 5, 8), randn(2, 3, 5, 8)
    out, logsumexp = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v)
    # five (6,5,8)x(8,5)-sized bmms: 5 * 6*5*8*5 = 6,000 MACs; 2*6,000 + 3*150 scores = 12,450
    assert counted(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                   randn(2, 3, 5, 8), q, k, v, out, logsumexp, 0.0, False) == (12_450, 6_000)


def test_embedding_scatter_and_index_put() -> None:
    aten = torch.ops.aten
    grad, idx = randn(1, 3, 4), torch.tensor([[1, 2, 3]])
    # each gradient row added into its token's row: 1*3*4 = 12
    assert counted(aten.embedding_dense_backward.default, grad, idx, 10, -1, False) == (12, 0)
    base, src = torch.zeros(2, 5), randn(2, 3)
    index = torch.tensor([[0, 1, 2], [2, 3, 4]])
    # one add per source element: 6
    assert counted(aten.scatter_add.default, base, 1, index, src) == (6, 0)
    values = randn(3)
    rows = [torch.tensor([0, 1, 1])]
    # accumulate: one add per value (3); overwrite: 0
    assert counted(aten.index_put.default, torch.zeros(2), rows, values, True) == (3, 0)
    assert counted(aten.index_put.default, torch.zeros(2), rows, values, False) == (0, 0)


# -- random numbers ----------------------------------------------------------------------------


def test_drawing_random_numbers_is_free() -> None:
    aten = torch.ops.aten
    for op in (aten.random_, aten.random, aten.uniform_, aten.uniform, aten.normal_, aten.normal,
               aten.bernoulli_, aten.bernoulli, aten.randint_like):
        assert is_free(op._qualified_op_name), op


@pytest.mark.parametrize(
    ("op", "args", "flops"),
    [
        # -log(1 - u) / lambda: subtract, log, divide = 3 per element of (2,3): 18
        (torch.ops.aten.exponential_.default, (), 18),
        (torch.ops.aten.exponential.default, (), 18),
        # ceil(log(u) / log(1 - p)): log, divide, ceil = 3 * 6 = 18
        (torch.ops.aten.geometric_.default, (0.3,), 18),
        # median + sigma * tan(pi * (u - 1/2)): 5 * 6 = 30
        (torch.ops.aten.cauchy_.default, (), 30),
        # exp of a normal draw (the draw, with its mean and std, is free): 1 * 6 = 6
        (torch.ops.aten.log_normal_.default, (), 6),
    ],
    ids=["exponential_", "exponential", "geometric_", "cauchy_", "log_normal_"],
)
def test_random_transforms_count_the_transform(op: Any, args: tuple[Any, ...], flops: int) -> None:
    assert counted(op, torch.empty(2, 3), *args) == (flops, 0)


def test_a_dataloader_seed_is_not_unsupported() -> None:
    # Every DataLoader iterator draws its base seed with aten::random_ (and shuffling
    # uses aten::randperm): drawing is free, never unsupported.
    model = nn.Linear(4, 2)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(randn(8, 4)), batch_size=4, shuffle=True)
    with layerscope.Profiler(model) as prof:
        for (x,) in loader:
            model(x)
    assert prof.profile.unsupported_ops() == {}


# -- backward of the recurrent kernel and of EmbeddingBag ---------------------------------------


def backward_op(prof: Profile, name: str, path: str = "") -> OpStats:
    found = [op for op in prof[path].ops if op.name == name and op.phase == "backward"]
    assert len(found) == 1, [(op.name, op.phase) for op in prof[path].ops]
    return found[0]


@pytest.mark.parametrize(("bias", "per_gate_value"), [(True, 8), (False, 6)])
def test_lstm_backward(bias: bool, per_gate_value: int) -> None:
    # Input (seq 5, batch 2, 8 features), hidden 16, 4 gates: w_ih (64, 8), w_hh (64, 16).
    lstm = nn.LSTM(8, 16, bias=bias)
    prof = layerscope.count_flops(lstm, randn(5, 2, 8), backward=True, loss_fn=lambda out: out[0].sum())
    forward = only_op(prof, "aten::mkldnn_rnn_layer")
    # forward: 10 rows x (64*8 + 64*16 = 1,536) = 15,360 MACs
    assert forward.macs == 15_360
    # 10 rows x 64 gate pre-activations = 640; forward flops 2*15,360 + 5 (3 without bias) * 640
    assert forward.flops == 2 * 15_360 + (5 if bias else 3) * 640
    op = backward_op(prof, "aten::mkldnn_rnn_layer_backward")
    # Per row, each forward product has two: d_input = d_gates @ w_ih and d_w_ih = d_gates^T @ x
    # (512 MACs each), d_hidden = d_gates @ w_hh and d_w_hh = d_gates^T @ h (1,024 each):
    # 10 * (2*512 + 2*1,024) = 30,720 MACs = 2 x forward
    assert op.macs == 30_720 == 2 * forward.macs
    # flops 2*30,720 + (2 * 3 activation and state-update gradients + 2 bias gradients) * 640
    #     = 61,440 + 8*640 = 66,560 with biases; 61,440 + 6*640 = 65,280 without
    assert op.flops == 2 * 30_720 + per_gate_value * 640
    assert prof.unsupported_ops() == {}


@pytest.mark.parametrize(
    ("mode", "per_sample_weights", "flops"),
    [
        # 2 bags of 3 indices, D = 4: each index's row gets its bag's gradient row: 6*4 = 24
        ("sum", False, 24),
        # and each bag's gradient divided by its size first: + (2,4) = 8 -> 32
        ("mean", False, 32),
        # each bag's gradient row goes to its maximum's row: (2,4) = 8
        ("max", False, 8),
        # every added row scaled by its sample's weight: 24 + 24 = 48
        ("sum", True, 48),
    ],
    ids=["sum", "mean", "max", "per-sample-weights"],
)
def test_embedding_bag_backward(mode: str, per_sample_weights: bool, flops: int) -> None:
    bag = nn.EmbeddingBag(10, 4, mode=mode)
    indices = torch.tensor([[1, 2, 3], [4, 5, 6]])
    inputs: Any = (indices, None, torch.rand(2, 3)) if per_sample_weights else indices
    prof = layerscope.count_flops(bag, inputs, backward=True, loss_fn=lambda out: out.sum())
    assert (backward_op(prof, "aten::_embedding_bag_backward").flops, prof.root.backward.macs) == (flops, 0)
    assert prof.unsupported_ops() == {}
