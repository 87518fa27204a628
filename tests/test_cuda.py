"""CUDA paths: device time per module and op. Skipped where torch sees no CUDA device."""

from __future__ import annotations

import pytest
import torch

import layerscope
from layerscope import zoo

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_profile_on_cuda_has_device_times() -> None:
    entry = zoo.get("resnet18")
    model = entry.build().eval().cuda()
    prof = layerscope.profile(model, entry.example_inputs(2).cuda(), warmup=2, repeat=3)
    layerscope.check_tree(prof)
    root = prof.root
    assert prof.meta["device"].startswith("cuda")
    assert root.forward.device_time_ns is not None and root.forward.device_time_ns > 0
    # Convolutions run on the device: their modules show device time, and their ops do.
    conv = prof["conv1"]
    assert conv.forward.device_time_ns > 0
    assert any(op.device_time_ns and op.device_time_ns > 0 for op in conv.ops)
    text = prof.render("text")
    assert "Self Device" in text and "Device total" in text


def test_profiler_block_on_cuda() -> None:
    entry = zoo.get("gpt")
    model = entry.build().eval().cuda()
    x = entry.example_inputs(2).cuda()
    with torch.no_grad(), layerscope.Profiler(model) as prof:
        model(x)
    layerscope.check_tree(prof.profile)
    assert prof.root.forward.device_time_ns > 0
    assert prof["blocks.0.attn"].forward.device_time_ns > 0
