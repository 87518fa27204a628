"""Attention FLOPs where the query length is not the key length: decoding with a KV
cache (query length 1), cross-attention, chunked prefill. Every attention the other
tests run is square, where a formula that read the query's length for the key's would
pass; here each count is checked against torch's own counter
(``torch.utils.flop_counter``) or by hand."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

import layerscope
from layerscope.flops import count_meta
from layerscope.flops.meta import TensorMeta

B, H, LQ, LK, E, EV = 2, 3, 5, 11, 8, 4


def _meta(*shape: int) -> TensorMeta:
    return TensorMeta(shape, torch.float16, torch.device("cuda"))


@pytest.mark.parametrize(
    "name",
    [
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_cudnn_attention",
    ],
)
def test_a_fused_attention_kernel_counts_query_by_key_scores(name: str) -> None:
    # By hand: Q K^T is B*H*LQ*LK*E multiply-accumulates, P V is B*H*LQ*LK*EV; the
    # softmax 3 FLOPs per score (exp, sum, divide) over B*H*LQ*LK scores.
    macs = B * H * LQ * LK * (E + EV)
    flops, counted_macs, _ = count_meta(name, (_meta(B, H, LQ, E), _meta(B, H, LK, E), _meta(B, H, LK, EV)), {})
    assert counted_macs == macs == 3_960
    assert flops == 2 * macs + 3 * B * H * LQ * LK == 8_910


@pytest.mark.parametrize(
    "name",
    [
        "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::_scaled_dot_product_cudnn_attention_backward",
    ],
)
def test_a_fused_attention_backward_counts_query_by_key_scores(name: str) -> None:
    # torch's own count of the four matrix products (dQ, dK, dV, dP), plus the softmax's
    # backward: 3 FLOPs per score.
    matmuls = flop_counter.sdpa_backward_flop_count((B, H, LQ, EV), (B, H, LQ, E), (B, H, LK, E), (B, H, LK, EV))
    grad_out, q, k, v = _meta(B, H, LQ, EV), _meta(B, H, LQ, E), _meta(B, H, LK, E), _meta(B, H, LK, EV)
    out, logsumexp = _meta(B, H, LQ, EV), TensorMeta((B, H, LQ), torch.float32, torch.device("cuda"))
    schema_args: dict[str, tuple[Any, ...]] = {
        "aten::_scaled_dot_product_efficient_attention_backward": (grad_out, q, k, v, None, out, logsumexp, None, None, 0.0, [True, True, True, False]),
        "aten::_scaled_dot_product_flash_attention_backward": (grad_out, q, k, v, out, logsumexp, None, None, LQ, LK, 0.0, False, None, None),
        "aten::_scaled_dot_product_cudnn_attention_backward": (grad_out, q, k, v, out, logsumexp, None, None, None, None, None, LQ, LK, 0.0, False),
    }
    flops, _, _ = count_meta(name, schema_args[name], {})
    assert flops == matmuls + 3 * B * H * LQ * LK


def _torch_matmul_flops(run: Any) -> int:
    with FlopCounterMode(display=False) as counter:
        run()
    return int(counter.get_total_flops())


def _matmul_flops(profile: layerscope.Profile) -> int:
    """FLOPs of the profile's matrix products alone (torch's counter counts only those)."""
    matrix = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
    return sum(row.flops or 0 for row in profile.ops() if row.name in matrix)


def test_sdpa_on_the_cpu_with_a_longer_key_counts_torchs_matrix_products_and_a_query_by_key_softmax() -> None:
    q, k, v = torch.randn(B, H, LQ, E), torch.randn(B, H, LK, E), torch.randn(B, H, LK, EV)

    class Attention(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v)

    profile = layerscope.count_flops(Attention(), (q, k, v))
    assert profile.root.forward.macs == B * H * LQ * LK * (E + EV)
    assert _matmul_flops(profile) == _torch_matmul_flops(lambda: F.scaled_dot_product_attention(q, k, v)) == 7_920
    softmax = [row for row in profile.ops() if "softmax" in row.name]
    assert softmax and sum(row.flops or 0 for row in softmax) == 3 * B * H * LQ * LK


def test_cross_attention_of_multihead_attention_counts_its_key_length() -> None:
    """``nn.MultiheadAttention`` with keys and values from a longer source (a decoder
    attending to an encoder's output)."""
    embed, heads, target, source = 16, 4, 3, 9
    mha = nn.MultiheadAttention(embed, heads, batch_first=True).eval()
    query, memory = torch.randn(2, target, embed), torch.randn(2, source, embed)

    class Cross(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = mha

        def forward(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            return self.attn(x, m, m, need_weights=False)[0]

    model = Cross().eval()
    with torch.no_grad():
        profile = layerscope.count_flops(model, (query, memory))
        reference = _torch_matmul_flops(lambda: model(query, memory))
    # By hand: projections q (2*3*16*16), k and v (2*9*16*16 each), out (2*3*16*16);
    # scores and weighted sum 2 * (2 * 4 * 3 * 9 * 4).
    macs = 2 * target * embed * embed * 2 + 2 * source * embed * embed * 2 + 2 * (2 * heads * target * source * (embed // heads))
    assert profile.root.forward.macs == macs
    # torch's counter has no formula for the fused attention eval runs
    # (aten::_native_multi_head_attention): it counts the projections alone.
    assert 2 * (macs - 2 * (2 * heads * target * source * (embed // heads))) == reference


@pytest.mark.slow
def test_a_gpt2_decode_step_with_a_cache_counts_one_query_against_the_cached_keys() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64, attn_implementation="sdpa",
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    prompt, token = torch.randint(0, 64, (1, 12)), torch.randint(0, 64, (1, 1))

    def step() -> dict[str, Any]:
        # A fresh cache of the 12-token prompt each time: a forward extends the cache it is given.
        with torch.no_grad():
            cache = model(prompt, use_cache=True).past_key_values
        return {"input_ids": token, "past_key_values": cache, "use_cache": True}

    with torch.no_grad():
        reference_inputs = step()
        reference = _torch_matmul_flops(lambda: model(**reference_inputs))
        profile = layerscope.count_flops(model, step())
    attention = sum(
        (row.macs or 0) for row in profile.ops(group_by=("module", "name"))
        if row.name in ("aten::bmm", "aten::matmul") or "scaled_dot_product" in row.name
    )
    # Each layer: one query against 13 keys (12 cached + itself), 4 heads of 8: scores
    # 4 * 1 * 13 * 8 and weighted sum 4 * 1 * 13 * 8 MACs.
    assert attention == 2 * (2 * 4 * 1 * 13 * 8)
    # The rest as torch counts it, and one FLOP per output of each addmm's bias, which
    # torch leaves out: per layer c_attn 96, attn.c_proj 32, mlp.c_fc 128, mlp.c_proj 32.
    assert _matmul_flops(profile) == reference + 2 * (96 + 32 + 128 + 32)
