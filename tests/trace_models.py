"""The model each real GPU trace in ``../shared/traces/`` was recorded from, and its inputs.

``TRACE_MODELS[stem]()`` gives ``(model, inputs)`` for the trace ``<stem>.json.gz``: the
model built on the meta device (no weights, nothing downloaded), in the dtype and
``train()``/``eval()`` mode it ran in, and the inputs it was called with as real CPU tensors
of the traced shapes and dtypes (a tensor, or a dict of keyword arguments; ``labels`` where
the training step took its loss from them). Read a trace with its model::

    model, inputs = TRACE_MODELS["h100_bert_base_fwd"]()
    layerscope.load(shared / "h100_bert_base_fwd.json.gz", model=model)

Each builder says what in the trace gave its configuration: the module classes and their
nesting come from the ``nn.Module: ClassName_k`` python_function events (the root's class is
the class built); sizes come from the ``cpu_op`` events' ``Input Dims``/``Input type``.
transformers is imported inside the builders only, so this file imports without it.

Not covered:

- ``b200_gptoss_tp8_rank0``: vLLM's GPT-OSS (``GptOssForCausalLM`` over ``VocabParallelEmbedding``,
  ``QKVParallelLinear``, ``RowParallelLinear``, ``FusedMoE``, vLLM's ``Attention`` with an fp8 KV
  cache, ``QuantFP8``), tensor parallel over 8 ranks (rank 0's shards: QKV [.., 640] for 8 query
  heads + 1 KV head of 64, 128 experts through ``vllm::moe_forward``). Its classes exist only in
  vLLM (not installed, and it needs a GPU); transformers' ``GptOssForCausalLM`` has other classes
  and the whole, unsharded weights, so no buildable model fits.
- ``h100_compiled_gpt2_train`` / ``h100_compiled_gpt2_cudagraphs``: compiled, no module events
  (not asked for here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

_meta = torch.device("meta")


def _ids(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.long)


# -- BERT ---------------------------------------------------------------------------


def h100_bert_base_fwd() -> tuple[nn.Module, Any]:
    """Root ``BertModel_0``, 12 ``BertLayer`` (``BertSelfAttention``), ``BertPooler``.

    aten::embedding on [30522, 768] with indices [8, 128] (vocab, hidden 768; batch 8 x 128),
    [512, 768] (positions) and [2, 768] (token types); aten::linear [768, 768] x4, [3072, 768]
    and [768, 3072] per layer (intermediate 3072); aten::scaled_dot_product_attention on
    [8, 12, 128, 64] (12 heads, SDPA, no mask); float: the default BertConfig, fp32, no_grad,
    eval (no dropout ops).
    """
    import transformers

    config = transformers.BertConfig(attn_implementation="sdpa")
    with _meta:
        model = transformers.BertModel(config)
    return model.eval(), {"input_ids": _ids(8, 128)}


def _bert_small() -> tuple[nn.Module, Any]:
    """Root ``BertLMHeadModel_0`` > ``BertModel`` (4 ``BertLayer``, ``BertSdpaSelfAttention`` in
    the older transformers that recorded it) + ``BertOnlyMLMHead``.

    aten::embedding on [30522, 512] / [512, 512] / [2, 512] with indices [1, 141] (hidden 512,
    one sequence of 141 tokens; the README's "1 x 512" is the hidden size, not the length);
    aten::linear [2048, 512] once per layer, 4 layers (intermediate 2048); aten::linear
    [30522, 512] + bias (the LM head's decoder); aten::scaled_dot_product_attention on
    [1, 8, 141, 64] (8 heads, SDPA, no mask: input_ids only); every op c10::BFloat16.
    """
    import transformers

    config = transformers.BertConfig(
        is_decoder=True, hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048,
        attn_implementation="sdpa",
    )
    with _meta:
        model = transformers.BertLMHeadModel(config)
    return model.to(torch.bfloat16).eval(), {"input_ids": _ids(1, 141)}


def h100_bert_small_inference() -> tuple[nn.Module, Any]:
    return _bert_small()


def mi300x_bert_small_inference() -> tuple[nn.Module, Any]:
    """The same model and input as h100_bert_small_inference (the same shapes, on an MI300X)."""
    return _bert_small()


# -- GPT-2 ----------------------------------------------------------------------------


def h100_gpt2_adamw_train() -> tuple[nn.Module, Any]:
    """Root ``GPT2LMHeadModel_0`` > ``GPT2Model`` (12 ``GPT2Block``) + ``Linear`` (lm_head).

    aten::embedding on [50257, 768] with indices [4, 256] (vocab, n_embd; batch 4 x 256) and
    [1024, 768] (n_positions); aten::addmm [768, 2304] / [768, 768] / [768, 3072] / [3072, 768]
    (the Conv1Ds), 12 of each (n_layer 12); aten::scaled_dot_product_attention on
    [4, 12, 256, 64] with dropout 0.1 and is_causal (12 heads, SDPA, train mode);
    aten::cross_entropy_loss on [1024, 50257] and long [1024] (the loss from labels
    [4, 256]); float: the default GPT2Config, fp32.
    """
    import transformers

    with _meta:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(attn_implementation="sdpa"))
    return model.train(), {"input_ids": _ids(4, 256), "labels": _ids(4, 256)}


def h100_gpt2_ckpt_train() -> tuple[nn.Module, Any]:
    """As h100_gpt2_adamw_train, with 6 layers and non-reentrant activation checkpointing.

    The same embedding [50257, 768] / [1024, 768] with indices [4, 256], and
    cross_entropy_loss on [1024, 50257]; 12 ``GPT2Block`` events and 12 SDPA calls per step,
    6 forward + the 6 recomputed in backward (n_layer 6).
    """
    import transformers

    with _meta:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=6, attn_implementation="sdpa"))
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.2x's name for it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train(), {"input_ids": _ids(4, 256), "labels": _ids(4, 256)}


# -- Llama / Qwen2 --------------------------------------------------------------------


def h100_llama_bf16_train() -> tuple[nn.Module, Any]:
    """Root ``LlamaForCausalLM_0`` > ``LlamaModel`` (4 ``LlamaDecoderLayer``) + lm_head.

    aten::embedding on [32000, 1024] with indices [4, 512] (vocab 32000, hidden 1024, batch
    4 x 512); aten::linear without bias on [1024, 1024] (q, o), [256, 1024] (k, v: 4 KV heads of
    64), [2816, 1024] (gate, up: intermediate 2816) and [1024, 2816] (down), 4 layers; lm_head
    [32000, 1024], untied; aten::scaled_dot_product_attention on [4, 16, 512, 64] /
    [4, 4, 512, 64] with enable_gqa (16 heads, 4 KV heads, SDPA); weights c10::BFloat16;
    cross_entropy_loss on [2048, 32000] and long [2048] (labels [4, 512]).
    """
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=4, attn_implementation="sdpa",
    )
    with _meta:
        model = transformers.LlamaForCausalLM(config)
    return model.to(torch.bfloat16).train(), {"input_ids": _ids(4, 512), "labels": _ids(4, 512)}


def h100_qwen15_05b_inference() -> tuple[nn.Module, Any]:
    """Root ``Qwen2Model_0`` (no LM head): Qwen1.5-0.5B-Chat's body.

    aten::embedding on [151936, 1024] with indices [16, 559] (vocab 151936, hidden 1024, batch
    16 x 559); 24 ``Qwen2DecoderLayer``; aten::linear with bias on [1024, 1024] x3 per layer
    (q, k, v: 16 KV heads, as many as query heads), without bias on [1024, 1024] (o),
    [2816, 1024] x2 (gate, up: intermediate 2816) and [1024, 2816] (down);
    aten::scaled_dot_product_attention on [16, 16, 559, 64], is_causal, no mask (SDPA);
    c10::BFloat16 weights; aten::eq on long [16, 559] == 1 then aten::all before the first
    layer: an attention_mask of ones was passed (masking_utils checks it for padding).
    """
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=2816, num_hidden_layers=24,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, attn_implementation="sdpa",
    )
    with _meta:
        model = transformers.Qwen2Model(config)
    inputs = {"input_ids": _ids(16, 559), "attention_mask": torch.ones(16, 559, dtype=torch.long)}
    return model.to(torch.bfloat16).eval(), inputs


# -- OWLv2 ----------------------------------------------------------------------------


def h100_owlv2_inference() -> tuple[nn.Module, Any]:
    """Root ``Owlv2ForObjectDetection_0`` (called 5 times in the step), OWLv2 large patch 14.

    Vision: aten::conv2d on [1, 3, 1008, 1008] x [1024, 3, 14, 14] (image 1008, patch 14,
    hidden 1024), position embedding [5185, 1024] (72 x 72 patches + class), per call 24
    vision ``Owlv2EncoderLayer`` (120 of 180 over 5 calls) with aten::linear [1024, 1024] x4,
    [4096, 1024], [1024, 4096] (16 heads of 64 from aten::bmm [16, 5185, 64], intermediate
    4096). Text: aten::embedding on [49408, 768] / [16, 768] with indices [1, 5] (vocab,
    hidden 768, 16 positions; one query of 5 tokens), 12 layers with aten::linear
    [768, 768] x4, [3072, 768], [768, 3072] (12 heads from aten::bmm [12, 5, 64]). Projections
    [768, 1024] (visual) and [768, 768] (text): projection_dim 768. Attention is eager
    (aten::bmm + aten::softmax, no SDPA). All c10::BFloat16; pixel_values arrive float and
    are cast to bf16 (aten::to) before the model, so they are bf16 here.
    """
    import transformers

    text = {
        "vocab_size": 49408, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
        "num_attention_heads": 12, "max_position_embeddings": 16,
    }
    vision = {
        "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
        "image_size": 1008, "patch_size": 14,
    }
    config = transformers.Owlv2Config(text_config=text, vision_config=vision, projection_dim=768)
    config._attn_implementation = "eager"
    for sub in (config.text_config, config.vision_config):
        sub._attn_implementation = "eager"
    with _meta:
        model = transformers.Owlv2ForObjectDetection(config)
    inputs = {
        "input_ids": _ids(1, 5),
        "attention_mask": torch.ones(1, 5, dtype=torch.long),
        "pixel_values": torch.zeros(1, 3, 1008, 1008, dtype=torch.bfloat16),
    }
    return model.to(torch.bfloat16).eval(), inputs


# -- plain torch ----------------------------------------------------------------------


class Net(nn.Module):
    """The normalization-layer network of mi300x_norm_layers_fwd_bwd (AMD TraceLens's
    perf-model fixture): five norms with affine parameters, then the same five without, on
    an [8, 16, 32, 32] input. Each is called inside a ``record_function`` range named after it."""

    def __init__(self, shape: tuple[int, int, int, int] = (8, 16, 32, 32)) -> None:
        super().__init__()
        channels = shape[1]
        self.bn = nn.BatchNorm2d(channels, affine=True)
        self.ln = nn.LayerNorm(list(shape[1:]), elementwise_affine=True)
        self.gn = nn.GroupNorm(4, channels, affine=True)
        self.inn = nn.InstanceNorm2d(channels, affine=True)
        self.rmsn = nn.RMSNorm(list(shape[2:]), elementwise_affine=True)
        self.bn2 = nn.BatchNorm2d(channels, affine=False)
        self.ln2 = nn.LayerNorm(list(shape[1:]), elementwise_affine=False)
        self.gn2 = nn.GroupNorm(4, channels, affine=False)
        self.inn2 = nn.InstanceNorm2d(channels, affine=False)
        self.rmsn2 = nn.RMSNorm(list(shape[2:]), elementwise_affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name, norm in (
            ("BatchNorm affine=True", self.bn), ("LayerNorm affine=True", self.ln),
            ("GroupNorm affine=True", self.gn), ("InstanceNorm affine=True", self.inn),
            ("RMSNorm affine=True", self.rmsn), ("BatchNorm affine=False", self.bn2),
            ("LayerNorm affine=False", self.ln2), ("GroupNorm affine=False", self.gn2),
            ("InstanceNormNorm affine=False", self.inn2), ("RMSNorm affine=False", self.rmsn2),
        ):
            with torch.profiler.record_function(name):
                x = norm(x)
        return x


def mi300x_norm_layers_fwd_bwd() -> tuple[nn.Module, Any]:
    """Root ``Net_0`` (3 steps of forward + ``MSELoss`` + backward), children in call order
    BatchNorm2d, LayerNorm, GroupNorm, InstanceNorm2d, RMSNorm, twice (the record_function
    ranges say affine=True, then affine=False).

    aten::batch_norm on [8, 16, 32, 32] with weight/bias/running stats [16] and training=True
    (16 channels, train mode; the affine=False one keeps running stats [16]); aten::layer_norm
    normalized_shape [16, 32, 32]; aten::group_norm with 4 groups; aten::instance_norm with
    weight/bias [16] and no running stats (track_running_stats False); aten::rms_norm
    normalized_shape [32, 32], eps None. All float. The MSELoss is called outside the Net
    (a root of its own), so it is not part of this model.
    """
    with _meta:
        model = Net()
    return model.train(), torch.zeros(8, 16, 32, 32)


def h100_ddp_nccl_train() -> tuple[nn.Module, Any]:
    """The ``Sequential_0`` that ``DistributedDataParallel_0`` wrapped (the trace's root is the DDP
    wrapper, which holds no parameters of its own): Linear, ReLU, Linear, ReLU, Linear, ReLU, Linear.

    aten::linear on [64, 2048] x [2048, 2048] + [2048] three times (batch 64, width 2048) and
    [10, 2048] + [10] last (10 outputs); aten::relu [64, 2048] x3; float.
    The loss (cross_entropy_loss on [64, 10], long [64]) was taken outside the model.
    """
    with _meta:
        model = nn.Sequential(
            nn.Linear(2048, 2048), nn.ReLU(),
            nn.Linear(2048, 2048), nn.ReLU(),
            nn.Linear(2048, 2048), nn.ReLU(),
            nn.Linear(2048, 10),
        )
    return model.train(), torch.zeros(64, 2048)


def a100_alexnet_no_modules() -> tuple[nn.Module, Any]:
    """layerscope's zoo AlexNet (torchvision layout), batch 128, fp32, train mode.

    The trace records neither shapes nor modules, so the batch comes from the kernels of the
    first forward: the bias add after conv1 runs 96,800 blocks of 128 x 2 elements =
    24,780,800 = N x 64 x 55 x 55, the ReLU (clamp) 48,400 blocks of 128 x 4 (the same), and
    max_pool 23,328 blocks of 256 = N x 64 x 27 x 27: N = 128. The parameter copies
    (92,928 bytes = 64 x 3 x 11 x 11 floats; 150,994,944 = 4096 x 9216 floats) are AlexNet's.
    fused_dropout kernels run in the classifier: the model was in train mode.
    """
    from layerscope import zoo

    entry = zoo.get("alexnet")
    with _meta:
        model = entry.build()
    return model.train(), entry.example_inputs(128)


def mi300x_resnet_ddp_actckpt_train_rank0() -> tuple[nn.Module, Any]:
    """The ``ResNet_0`` that ``DistributedDataParallel_0`` wrapped: ResNet-18 (torchvision layout,
    layerscope's zoo ``resnet18``) with each of layer1..layer4 wrapped in torch's
    ``CheckpointWrapper`` (``CheckpointWrapper_k`` > ``Sequential`` > 2 ``BasicBlock``; the
    recomputed ``Sequential`` calls show again in backward), bf16, train mode.

    aten::conv2d on [10, 3, 224, 224] x [64, 3, 7, 7] (batch 10, 224 x 224 images), then
    [64, 64, 3, 3] / [128, 64, 3, 3] / ... / [512, 512, 3, 3] with 1x1 downsamples
    [128, 64, 1, 1], [256, 128, 1, 1], [512, 256, 1, 1]: two BasicBlocks per stage (ResNet-18);
    aten::linear [10, 512] x [1000, 512] (1000 classes); aten::batch_norm training=True;
    every op c10::BFloat16.
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from layerscope import zoo

    with _meta:
        model = zoo.get("resnet18").build()
    for name in ("layer1", "layer2", "layer3", "layer4"):
        setattr(model, name, checkpoint_wrapper(getattr(model, name)))
    inputs = torch.zeros(10, 3, 224, 224, dtype=torch.bfloat16)
    return model.to(torch.bfloat16).train(), inputs


#: trace file stem -> builder of ``(model, inputs)``.
TRACE_MODELS: dict[str, Callable[[], tuple[nn.Module, Any]]] = {
    "h100_bert_base_fwd": h100_bert_base_fwd,
    "h100_bert_small_inference": h100_bert_small_inference,
    "mi300x_bert_small_inference": mi300x_bert_small_inference,
    "h100_gpt2_adamw_train": h100_gpt2_adamw_train,
    "h100_gpt2_ckpt_train": h100_gpt2_ckpt_train,
    "h100_llama_bf16_train": h100_llama_bf16_train,
    "h100_qwen1.5_0.5b_inference": h100_qwen15_05b_inference,
    "h100_owlv2_inference": h100_owlv2_inference,
    "mi300x_norm_layers_fwd_bwd": mi300x_norm_layers_fwd_bwd,
    "h100_ddp_nccl_train": h100_ddp_nccl_train,
    "a100_alexnet_no_modules": a100_alexnet_no_modules,
    "mi300x_resnet_ddp_actckpt_train_rank0": mi300x_resnet_ddp_actckpt_train_rank0,
}
