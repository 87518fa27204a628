"""layerscope's FLOP pass agrees with ``torch.utils.flop_counter`` on real models.

Where torch has a formula, layerscope uses it, and its MACs are half of torch's count
(torch counts 2 FLOPs per multiply-accumulate and nothing else). So, module by module,
``2 * node.forward.macs`` equals ``FlopCounterMode``'s count for that module, exactly.

torch 2.13's counter lacks two ops that layerscope counts, so the counter is given them
through ``custom_mapping``:

- ``aten::_scaled_dot_product_flash_attention_for_cpu``, the CPU kernel behind
  ``F.scaled_dot_product_attention`` (the zoo's gpt and every transformers model here);
- ``aten::_native_multi_head_attention``, ``nn.MultiheadAttention``'s fused inference
  path (the zoo's vit_b_16 takes it in eval under ``no_grad``).

Without them the counter reads lower than layerscope by exactly those ops' FLOPs.

Module keys: FlopCounterMode names the root by its type and every other module
``f"{root type}.{named_modules() path}"``. A module that is never called (a ModuleList,
say, or MultiheadAttention's ``out_proj`` on the fused path) has no counter entry, while
layerscope holds its children's totals structurally; those are checked separately.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

import layerscope
from conftest import tiered
from layerscope import zoo
from layerscope.model.tree import ModuleNode, Profile

CPU_SDPA = "aten::_scaled_dot_product_flash_attention_for_cpu"
CPU_SDPA_BACKWARD = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
NATIVE_MHA = "aten::_native_multi_head_attention"


def _cpu_sdpa_flop(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    # Custom mappings are shape-wrapped: every tensor argument arrives as its shape.
    return sdpa_flop_count(query, key, value)


def _native_mha_flop(
    query: Any,
    key: Any,
    value: Any,
    embed_dim: int,
    num_heads: int,
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    """2 FLOPs per MAC of the matrix products, as torch counts them (formulas.py's
    ``_native_mha``): q and out projections (q_len * E * E each), k and v projections
    (kv_len * E * E each), q @ k^T and attn @ v (q_len * kv_len * E each, over all heads)."""
    batch = query[0] if len(query) == 3 else 1
    q_len, kv_len = query[-2], key[-2]
    macs = batch * (
        2 * q_len * embed_dim * embed_dim
        + 2 * kv_len * embed_dim * embed_dim
        + 2 * q_len * kv_len * embed_dim
    )
    return 2 * macs


def _cpu_sdpa_backward_flop(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


TORCH_LACKS = {
    CPU_SDPA: (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, _cpu_sdpa_flop),
    CPU_SDPA_BACKWARD: (
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward,
        _cpu_sdpa_backward_flop,
    ),
    NATIVE_MHA: (torch.ops.aten._native_multi_head_attention, _native_mha_flop),
}
CUSTOM_MAPPING = dict(TORCH_LACKS.values())

# Which of those ops each model runs (every other model runs neither).
USES_OPS_TORCH_LACKS = {
    "gpt": {CPU_SDPA},
    "vit_b_16": {NATIVE_MHA},
    "bert": {CPU_SDPA},
    "gpt2": {CPU_SDPA},
    "llama": {CPU_SDPA},
    "t5": {CPU_SDPA},
    "vit": {CPU_SDPA},
}


# -- models -----------------------------------------------------------------------------


def _token_ids() -> torch.Tensor:
    return torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(0))


def _bert() -> tuple[nn.Module, Any]:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=1000,
        attn_implementation="sdpa",
    )
    return BertModel(config), {"input_ids": _token_ids()}


def _gpt2() -> tuple[nn.Module, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_embd=64, n_layer=2, n_head=2, vocab_size=1000, n_positions=128, bos_token_id=0, eos_token_id=0,
        attn_implementation="sdpa",
    )
    return GPT2LMHeadModel(config), {"input_ids": _token_ids()}


def _llama() -> tuple[nn.Module, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    # 4 query heads share 2 key/value heads: grouped-query attention.
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1000, attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config), {"input_ids": _token_ids()}


def _t5() -> tuple[nn.Module, Any]:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        d_model=64, d_ff=128, num_layers=2, num_heads=2, vocab_size=1000, d_kv=32, attn_implementation="sdpa"
    )
    ids = _token_ids()
    return T5ForConditionalGeneration(config), {"input_ids": ids, "decoder_input_ids": ids}


def _vit() -> tuple[nn.Module, Any]:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, image_size=32,
        patch_size=8, attn_implementation="sdpa",
    )
    pixels = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return ViTModel(config), {"pixel_values": pixels}


def _zoo(name: str) -> Callable[[], tuple[nn.Module, Any]]:
    def build() -> tuple[nn.Module, Any]:
        entry = zoo.get(name)
        return entry.build(), entry.example_inputs(1)

    return build


BUILDERS: dict[str, Callable[[], tuple[nn.Module, Any]]] = {name: _zoo(name) for name in zoo.names()}
BUILDERS.update(bert=_bert, gpt2=_gpt2, llama=_llama, t5=_t5, vit=_vit)
MODELS = sorted(BUILDERS)


# -- running both counters -----------------------------------------------------------------


@dataclass
class Measured:
    model: nn.Module
    inputs: Any
    profile: Profile
    _counts: dict[bool, dict[str, dict[Any, int]]] = field(default_factory=dict)

    def flop_counts(self, with_mapping: bool = True) -> dict[str, dict[Any, int]]:
        """FlopCounterMode's counts for one forward, run as ``profile`` runs it (under
        ``no_grad``), with or without ``CUSTOM_MAPPING``; each is measured once."""
        if with_mapping not in self._counts:
            counter = FlopCounterMode(display=False, custom_mapping=CUSTOM_MAPPING if with_mapping else None)
            with torch.no_grad(), counter:
                if isinstance(self.inputs, dict):
                    self.model(**self.inputs)
                elif isinstance(self.inputs, (tuple, list)):
                    self.model(*self.inputs)
                else:
                    self.model(self.inputs)
            self._counts[with_mapping] = counter.get_flop_counts()
        return self._counts[with_mapping]

    def key(self, node: ModuleNode) -> str:
        root = type(self.model).__name__
        return root if node.path == "" else f"{root}.{node.path}"


@pytest.fixture(scope="module")
def measure(zoo_profile: Any) -> Any:
    """``measure(name)``: the model, its inputs and its profile, built once per module
    (a zoo model's once per session)."""
    cache: dict[str, Measured] = {}

    def get(name: str) -> Measured:
        if name not in cache:
            if name in zoo.names():  # the session's profile of it (conftest.py), built as BUILDERS builds it
                cache[name] = Measured(*zoo_profile(name))
            else:
                model, inputs = BUILDERS[name]()
                model.eval()
                profile = layerscope.profile(model, inputs, warmup=0, repeat=1)
                cache[name] = Measured(model, inputs, profile)
        return cache[name]

    yield get
    cache.clear()


# -- tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", tiered(MODELS))
def test_profile_is_sound_and_every_op_has_a_formula(measure: Any, name: str) -> None:
    profile = measure(name).profile
    layerscope.check_tree(profile)
    assert profile.unsupported_ops() == {}


@pytest.mark.parametrize("name", tiered(MODELS))
def test_called_modules_agree_with_flop_counter(measure: Any, name: str) -> None:
    measured = measure(name)
    counts = measured.flop_counts()
    called = [node for node in measured.profile.nodes() if node.calls > 0]
    assert called and called[0].path == ""

    mismatches = []
    for node in called:
        theirs = sum(counts.get(measured.key(node), {}).values())
        if 2 * node.forward.macs != theirs:
            mismatches.append((node.path, 2 * node.forward.macs, theirs))
    assert mismatches == [], f"(path, 2 * layerscope macs, FlopCounterMode flops): {mismatches[:5]}"
    assert measured.profile.root.forward.macs > 0

    # Every module the counter saw is a called module of the profile (so no count was
    # compared against a misspelt key, which would read as an empty one).
    keys = {measured.key(node) for node in called}
    assert set(counts) - {"Global"} <= keys


@pytest.mark.parametrize("name", tiered(MODELS))
def test_uncalled_modules_hold_their_childrens_sum(measure: Any, name: str) -> None:
    measured = measure(name)
    counts = measured.flop_counts()
    for node in measured.profile.nodes():
        if node.calls > 0:
            continue
        assert measured.key(node) not in counts, f"{node.path!r} has no calls but the counter saw it run"
        assert node.forward.self_macs == 0, node.path
        assert node.forward.macs == sum(child.forward.macs for child in node.children), node.path


def test_uncalled_modules_are_the_expected_ones(measure: Any) -> None:
    # The check above is vacuous for a model with no uncalled modules; these have some.
    uncalled = {name: {n.path for n in measure(name).profile.nodes() if n.calls == 0} for name in MODELS}
    assert uncalled["gpt"] == {"blocks"}
    assert uncalled["llama"] == {"model.layers"}
    t5_module_lists = {"encoder.block", "encoder.block.0.layer", "decoder.block", "decoder.block.1.layer"}
    assert t5_module_lists <= uncalled["t5"]
    # The fused path computes the out-projection itself: 12 encoder layers, 12 unused out_proj.
    assert uncalled["vit_b_16"] == {
        f"encoder.layers.encoder_layer_{i}.self_attention.out_proj" for i in range(12)
    }
    assert measure("t5").profile["encoder.block"].forward.macs > 0


@pytest.mark.parametrize("name", tiered(MODELS))
def test_counter_without_custom_mapping_misses_exactly_the_ops_torch_lacks(measure: Any, name: str) -> None:
    """torch 2.13's counter counts the CPU attention kernels as 0: on the attention
    models it reads lower than layerscope, by exactly those ops' 2 * macs."""
    measured = measure(name)
    ops = [op for node in measured.profile.nodes() for op in node.ops if op.name in TORCH_LACKS]
    assert {op.name for op in ops} == USES_OPS_TORCH_LACKS.get(name, set())

    plain = measured.flop_counts(with_mapping=False)
    theirs = sum(plain.get(type(measured.model).__name__, {}).values())
    ours = 2 * measured.profile.root.forward.macs
    assert ours - theirs == 2 * sum(op.macs or 0 for op in ops)
    if ops:
        assert theirs < ours


def test_native_mha_mapping_matches_hand_arithmetic(measure: Any) -> None:
    # vit_b_16 at batch 1: 197 tokens (14 * 14 patches + class token), E = 768.
    # q, k, v, out projections 4 * 197 * 768 * 768 = 464,781,312
    # q @ k^T and attn @ v     2 * 197 * 197 * 768 =  59,610,624
    # total                                         = 524,391,936
    attention = measure("vit_b_16").profile["encoder.layers.encoder_layer_0.self_attention"]
    assert attention.forward.macs == 4 * 197 * 768 * 768 + 2 * 197 * 197 * 768 == 524_391_936
    assert _native_mha_flop((1, 197, 768), (1, 197, 768), (1, 197, 768), 768, 12) == 2 * 524_391_936


def test_alexnet_and_lenet5_anchor_macs(measure: Any) -> None:
    # AlexNet (torchvision layout), 3x224x224, batch 1:
    #   conv1 64*3*11*11 * 55*55   =  70,276,800
    #   conv2 192*64*5*5 * 27*27   = 223,948,800
    #   conv3 384*192*3*3 * 13*13  = 112,140,288
    #   conv4 256*384*3*3 * 13*13  = 149,520,384
    #   conv5 256*256*3*3 * 13*13  =  99,680,256
    #   fc6   9216*4096            =  37,748,736
    #   fc7   4096*4096            =  16,777,216
    #   fc8   4096*1000            =   4,096,000
    #   total                      = 714,188,480  (torchvision publishes 0.71 "GFLOPS")
    assert measure("alexnet").profile.root.forward.macs == 714_188_480
    # LeNet-5, 1x32x32, batch 1:
    #   conv1 6*1*5*5 * 28*28   = 117,600
    #   conv2 16*6*5*5 * 10*10  = 240,000
    #   fc1   400*120           =  48,000
    #   fc2   120*84            =  10,080
    #   fc3   84*10             =     840
    #   total                   = 416,520
    assert measure("lenet5").profile.root.forward.macs == 416_520


# -- grad mode, no_grad and inference_mode count alike ---------------------------------------

#: Models for which torch itself runs other kernels when gradients are on (docs/flops.md),
#: and what that changes. vit_b_16: nn.MultiheadAttention's fused path runs only without
#: grad (the same flops, fewer bytes). t5: its attention mask comes from a parameter and
#: requires grad, so attention runs the math path, whose scale and mask add count as
#: elementwise ops (the same MACs, more flops).
GRAD_CHANGES_KERNELS = {"vit_b_16": "bytes", "t5": "flops"}


def _per_module(profile: Profile) -> dict[str, tuple[int | None, int | None, int | None]]:
    return {n.path: (n.forward.self_flops, n.forward.self_macs, n.forward.self_bytes) for n in profile.nodes()}


def _root(profile: Profile) -> tuple[int | None, int | None, int | None]:
    return profile.root.forward.flops, profile.root.forward.macs, profile.root.forward.bytes


@pytest.mark.parametrize("name", tiered(MODELS))
def test_grad_no_grad_and_inference_mode_count_alike(measure: Any, name: str) -> None:
    # Under inference mode the dispatcher shows composite ops (aten::linear, aten::conv2d,
    # aten::layer_norm, aten::scaled_dot_product_attention) instead of their parts; they
    # are counted by their decomposition, so every figure must be the same.
    model, inputs = measure(name).model, measure(name).inputs  # in eval
    grad = layerscope.count_flops(model, inputs, no_grad=False, memory=False)
    no_grad = layerscope.count_flops(model, inputs, no_grad=True, memory=False)
    with torch.inference_mode():
        inference = layerscope.count_flops(model, inputs, memory=False)
    assert inference.unsupported_ops() == no_grad.unsupported_ops() == grad.unsupported_ops() == {}
    assert _root(inference) == _root(no_grad)
    assert _per_module(inference) == _per_module(no_grad)
    assert no_grad.root.forward.macs

    changes = GRAD_CHANGES_KERNELS.get(name)
    if changes is None:
        assert _root(grad) == _root(no_grad)
        assert _per_module(grad) == _per_module(no_grad)
    elif changes == "bytes":
        assert _root(grad)[:2] == _root(no_grad)[:2]
        assert {p: c[:2] for p, c in _per_module(grad).items()} == {p: c[:2] for p, c in _per_module(no_grad).items()}
        assert _root(grad)[2] != _root(no_grad)[2]
    else:
        assert grad.root.forward.macs == no_grad.root.forward.macs
        assert grad.root.forward.flops != no_grad.root.forward.flops


@pytest.mark.parametrize("name", tiered(MODELS))
def test_events_count_what_the_dispatch_mode_counts(measure: Any, name: str) -> None:
    # profile() reads ops from torch's profiler events (recorded input shapes, composites
    # opened into their parts); count_flops runs a dispatch mode. Module by module and op
    # by op, both count the same FLOPs and MACs. (A Python scalar is a 0-d tensor in the
    # events, so rows are compared by name, and bytes are not compared.)
    measured = measure(name)
    events = measured.profile
    dispatch = layerscope.count_flops(measured.model, measured.inputs, memory=False)
    assert {p: c[:2] for p, c in _per_module(events).items()} == {p: c[:2] for p, c in _per_module(dispatch).items()}

    def rows(profile: Profile) -> dict[tuple[str, str], list[tuple[int | None, int | None]]]:
        found: dict[tuple[str, str], list[tuple[int | None, int | None]]] = {}
        for node in profile.nodes():
            for op in node.ops:
                if op.flops != 0:  # views and copies may show at another level: both count 0
                    found.setdefault((node.path, op.name), []).append((op.flops, op.macs))
        return {key: sorted(v, key=repr) for key, v in found.items()}

    by_events, by_dispatch = rows(events), rows(dispatch)
    assert set(by_events) == set(by_dispatch)
    for key, counted in by_dispatch.items():
        # The same total per module and op; rows may split differently by shapes.
        assert sum(f or 0 for f, _ in by_events[key]) == sum(f or 0 for f, _ in counted), key
        assert sum(m or 0 for _, m in by_events[key]) == sum(m or 0 for _, m in counted), key


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "t5"])
def test_events_count_the_training_step_as_the_dispatch_mode(measure: Any, name: str) -> None:
    # Forward and backward, per module and per op, in a training step.
    measured = measure(name)
    model, inputs = measured.model, measured.inputs
    events = layerscope.profile(model, inputs, backward=True, warmup=0, repeat=1, memory=False)
    dispatch = layerscope.count_flops(model, inputs, backward=True, memory=False)
    for node in events.nodes():
        other = dispatch[node.path]
        for phase in ("forward", "backward"):
            mine, theirs = getattr(node, phase), getattr(other, phase)
            if mine is None or theirs is None:
                assert mine is theirs is None or not (mine or theirs).flops, (node.path, phase)
                continue
            assert (mine.flops, mine.macs) == (theirs.flops, theirs.macs), (node.path, phase)
