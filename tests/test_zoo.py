"""Tests for the built-in model zoo: registry contract and exact layouts.

Parameter counts and module paths are pinned to torchvision's published
models, so any drift from their layout fails loudly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from layerscope import zoo

ALL_NAMES = ["alexnet", "gpt", "lenet5", "mlp", "resnet18", "resnet50", "vit_b_16"]

# Hand-computed (weights + biases) for the two non-torchvision-reference models.
# lenet5:
#   conv1: 6*1*5*5 + 6      =    156
#   conv2: 16*6*5*5 + 16    =  2,416
#   fc1:   400*120 + 120    = 48,120
#   fc2:   120*84 + 84      = 10,164
#   fc3:   84*10 + 10       =    850
#   total                   = 61,706
LENET5_PARAMS = 156 + 2_416 + 48_120 + 10_164 + 850
# mlp:
#   fc1: 64*256 + 256       = 16,640
#   fc2: 256*256 + 256      = 65,792
#   fc3: 256*10 + 10        =  2,570
#   total                   = 85,002
MLP_PARAMS = 16_640 + 65_792 + 2_570
# gpt (d=128, vocab=1000, ctx=64, 4 blocks; lm_head is tied so adds nothing):
#   wte:  1000*128               = 128,000
#   wpe:  64*128                 =   8,192
#   per block:
#     ln_1:      2*128            =     256
#     attn.qkv:  128*384 + 384    =  49,536
#     attn.proj: 128*128 + 128    =  16,512
#     ln_2:      2*128            =     256
#     mlp.fc:    128*512 + 512    =  66,048
#     mlp.proj:  512*128 + 128    =  65,664
#     block total                 = 198,272  (x4 = 793,088)
#   ln_f: 2*128                  =     256
#   total                        = 929,536
GPT_PARAMS = 128_000 + 8_192 + 4 * (256 + 49_536 + 16_512 + 256 + 66_048 + 65_664) + 256

EXPECTED_PARAMS = {
    "lenet5": 61_706,
    "alexnet": 61_100_840,
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "vit_b_16": 86_567_656,
    "gpt": 929_536,
    "mlp": 85_002,
}

# Number of distinct parameter tensors in the torchvision models.
EXPECTED_PARAM_TENSORS = {
    "alexnet": 16,
    "resnet18": 62,
    "resnet50": 161,
    "vit_b_16": 152,
}

EXPECTED_OUTPUT = {
    "lenet5": lambda b: (b, 10),
    "alexnet": lambda b: (b, 1000),
    "resnet18": lambda b: (b, 1000),
    "resnet50": lambda b: (b, 1000),
    "vit_b_16": lambda b: (b, 1000),
    "gpt": lambda b: (b, 32, 1000),
    "mlp": lambda b: (b, 10),
}

# The big models run at batch 1 to keep the suite fast on small CI machines.
BATCH = {
    "lenet5": 2,
    "mlp": 2,
    "gpt": 2,
    "alexnet": 1,
    "resnet18": 1,
    "resnet50": 1,
    "vit_b_16": 1,
}

EXPECTED_PATHS = {
    "lenet5": ["features.0", "features.3", "classifier.0", "classifier.4"],
    "alexnet": ["features.0", "features.12", "avgpool", "classifier.1", "classifier.6"],
    "resnet18": [
        "conv1",
        "bn1",
        "relu",
        "maxpool",
        "layer1.0.conv1",
        "layer1.1.bn2",
        "layer2.0.downsample.0",
        "layer2.0.downsample.1",
        "layer4.1.conv2",
        "avgpool",
        "fc",
    ],
    "resnet50": [
        "layer1.0.downsample.0",
        "layer3.5.bn3",
        "layer4.2.conv3",
        "layer4.2.relu",
        "fc",
    ],
    "vit_b_16": [
        "conv_proj",
        "encoder",
        "encoder.dropout",
        "encoder.ln",
        "encoder.layers.encoder_layer_0.ln_1",
        "encoder.layers.encoder_layer_0.self_attention",
        "encoder.layers.encoder_layer_0.self_attention.out_proj",
        "encoder.layers.encoder_layer_11.dropout",
        "encoder.layers.encoder_layer_11.ln_2",
        "encoder.layers.encoder_layer_11.mlp.0",
        "encoder.layers.encoder_layer_11.mlp.3",
        "encoder.layers.encoder_layer_11.mlp.4",
        "heads",
        "heads.head",
    ],
    "gpt": [
        "wte",
        "wpe",
        "blocks.0.ln_1",
        "blocks.0.attn.qkv",
        "blocks.0.attn.proj",
        "blocks.3.ln_2",
        "blocks.3.mlp.fc",
        "blocks.3.mlp.act",
        "blocks.3.mlp.proj",
        "ln_f",
        "lm_head",
    ],
    "mlp": ["layers", "layers.0", "layers.1", "layers.4"],
}

ABSENT_PATHS = {
    "resnet18": ["layer1.0.downsample", "layer4.2", "layer4.1.conv3"],
    "resnet50": ["layer4.3", "layer2.1.downsample"],
    "vit_b_16": [
        "encoder.layers.encoder_layer_12",
        "encoder.layers.encoder_layer_0.mlp.5",
    ],
    "alexnet": ["features.13", "classifier.7"],
    "gpt": ["blocks.4"],
}


@pytest.fixture(scope="module")
def models() -> Iterator[dict[str, nn.Module]]:
    # Building the large models dominates run time, so build each once per
    # module and drop them all at teardown to free the memory.
    class _Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, name: str) -> nn.Module:
            torch.manual_seed(0)
            model = zoo.get(name).build().eval()
            self[name] = model
            return model

    lazy = _Lazy()
    yield lazy
    lazy.clear()


def _call(model: nn.Module, inputs: Any) -> torch.Tensor:
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


# --------------------------------------------------------------------- registry


def test_names_sorted_and_complete() -> None:
    assert zoo.names() == ALL_NAMES
    assert zoo.names() == sorted(zoo.ZOO)


def test_entries_are_consistent() -> None:
    for name in ALL_NAMES:
        entry = zoo.get(name)
        assert isinstance(entry, zoo.ZooEntry)
        assert entry.name == name
        assert entry.description and "\n" not in entry.description
        assert callable(entry.build) and callable(entry.example_inputs)


def test_entry_is_frozen() -> None:
    entry = zoo.get("mlp")
    with pytest.raises(AttributeError):
        entry.name = "other"  # type: ignore[misc]


def test_duplicate_registration_raises() -> None:
    before = zoo.get("mlp")
    with pytest.raises(ValueError, match="mlp"):
        zoo.register("mlp", "duplicate", lambda b: torch.zeros(b, 64))(nn.Identity)
    assert zoo.get("mlp") is before


def test_register_returns_builder_and_adds_entry() -> None:
    def tiny() -> nn.Module:
        return nn.Linear(2, 3)

    try:
        returned = zoo.register(
            "_test_tiny", "tiny test model", lambda b: torch.zeros(b, 2)
        )(tiny)
        assert returned is tiny
        entry = zoo.get("_test_tiny")
        assert entry.build is tiny and entry.description == "tiny test model"
        assert "_test_tiny" in zoo.names()
    finally:
        zoo.ZOO.pop("_test_tiny", None)
    assert zoo.names() == ALL_NAMES


def test_unknown_name_lists_available() -> None:
    with pytest.raises(KeyError) as excinfo:
        zoo.get("nope")
    message = str(excinfo.value)
    assert "nope" in message
    assert ", ".join(ALL_NAMES) in message


# --------------------------------------------------------------------- inputs


@pytest.mark.parametrize("name", ALL_NAMES)
def test_example_inputs_deterministic(name: str) -> None:
    entry = zoo.get(name)
    a = entry.example_inputs(2)
    b = entry.example_inputs(2)
    assert isinstance(a, torch.Tensor)
    assert a.device.type == "cpu"
    assert a.shape[0] == 2
    assert torch.equal(a, b)
    if name == "gpt":
        assert a.dtype == torch.long
        assert a.shape == (2, 32)
        assert int(a.min()) >= 0 and int(a.max()) < 1000
    else:
        assert a.dtype == torch.float32


# --------------------------------------------------------------------- models


@pytest.mark.parametrize("name", ALL_NAMES)
def test_forward_shape(name: str, models: dict[str, nn.Module]) -> None:
    batch = BATCH[name]
    inputs = zoo.get(name).example_inputs(batch)
    with torch.no_grad():
        out = _call(models[name], inputs)
    assert tuple(out.shape) == EXPECTED_OUTPUT[name](batch)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", ALL_NAMES)
def test_param_count(name: str, models: dict[str, nn.Module]) -> None:
    model = models[name]
    assert sum(p.numel() for p in model.parameters()) == EXPECTED_PARAMS[name]


def test_hand_computed_counts_match_table() -> None:
    assert LENET5_PARAMS == EXPECTED_PARAMS["lenet5"]
    assert MLP_PARAMS == EXPECTED_PARAMS["mlp"]
    assert GPT_PARAMS == EXPECTED_PARAMS["gpt"]


@pytest.mark.parametrize("name", sorted(EXPECTED_PARAM_TENSORS))
def test_param_tensor_count(name: str, models: dict[str, nn.Module]) -> None:
    assert len(list(models[name].parameters())) == EXPECTED_PARAM_TENSORS[name]


@pytest.mark.parametrize("name", ALL_NAMES)
def test_module_paths(name: str, models: dict[str, nn.Module]) -> None:
    paths = dict(models[name].named_modules())
    missing = [p for p in EXPECTED_PATHS[name] if p not in paths]
    assert not missing
    unexpected = [p for p in ABSENT_PATHS.get(name, []) if p in paths]
    assert not unexpected


def test_module_types(models: dict[str, nn.Module]) -> None:
    alex = dict(models["alexnet"].named_modules())
    assert isinstance(alex["features.0"], nn.Conv2d)
    assert isinstance(alex["classifier.0"], nn.Dropout)
    assert isinstance(alex["classifier.6"], nn.Linear)
    assert alex["classifier.6"].in_features == 4096

    r50 = dict(models["resnet50"].named_modules())
    assert isinstance(r50["layer4.2.conv3"], nn.Conv2d)
    assert r50["layer4.2.conv3"].out_channels == 2048
    # v1.5: stride on the 3x3 conv, not the first 1x1.
    assert r50["layer2.0.conv2"].stride == (2, 2)
    assert r50["layer2.0.conv1"].stride == (1, 1)

    vit = dict(models["vit_b_16"].named_modules())
    block = vit["encoder.layers.encoder_layer_0"]
    assert isinstance(block.self_attention, nn.MultiheadAttention)
    assert block.self_attention.batch_first
    assert isinstance(vit["encoder.layers.encoder_layer_0.mlp"], nn.Sequential)
    assert isinstance(vit["encoder.layers.encoder_layer_0.mlp.1"], nn.GELU)
    assert vit["encoder.ln"].eps == 1e-6
    assert vit["encoder.layers.encoder_layer_0.ln_1"].eps == 1e-6


def test_vit_parameters_and_state_dict_keys(models: dict[str, nn.Module]) -> None:
    vit = models["vit_b_16"]
    state = vit.state_dict()
    assert state["class_token"].shape == (1, 1, 768)
    assert state["encoder.pos_embedding"].shape == (1, 197, 768)
    assert state["conv_proj.weight"].shape == (768, 3, 16, 16)
    assert state[
        "encoder.layers.encoder_layer_0.self_attention.in_proj_weight"
    ].shape == (
        2304,
        768,
    )
    assert state["encoder.layers.encoder_layer_11.mlp.3.weight"].shape == (768, 3072)
    assert state["heads.head.weight"].shape == (1000, 768)


def test_resnet_state_dict_key_count(models: dict[str, nn.Module]) -> None:
    # torchvision's resnet18/50 state dicts have 122 and 320 entries
    # (parameters + BN running_mean/running_var/num_batches_tracked).
    assert len(models["resnet18"].state_dict()) == 122
    assert len(models["resnet50"].state_dict()) == 320


def test_gpt_weight_tying(models: dict[str, nn.Module]) -> None:
    model = models["gpt"]
    assert model.lm_head.weight is model.wte.weight
    # The tied tensor is reported once by parameters(), twice by named_parameters
    # with remove_duplicate=False.
    all_named = list(model.named_parameters(remove_duplicate=False))
    assert len(all_named) == len(list(model.parameters())) + 1


def test_gpt_is_causal(models: dict[str, nn.Module]) -> None:
    model = models["gpt"]
    idx = zoo.get("gpt").example_inputs(1)
    changed = idx.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 1000
    with torch.no_grad():
        a = model(idx)
        b = model(changed)
    # Earlier positions must not see the last token.
    torch.testing.assert_close(a[:, :-1], b[:, :-1])
    assert not torch.allclose(a[:, -1], b[:, -1])
