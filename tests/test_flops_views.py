"""FLOPs in the views: the annotated model print, top module types per depth,
``count_flops`` and ``layerscope flops`` (including a 7B model on the meta device)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import layerscope
from layerscope import zoo
from layerscope.model.transforms import top_by_depth
from processes import Done, run_layerscope


def _lenet_profile(fake_clock):
    entry = zoo.get("lenet5")
    return layerscope.profile(entry.build().eval(), entry.example_inputs(1), warmup=1, repeat=3, clock=fake_clock)


def test_model_view_golden(fake_clock, golden) -> None:
    prof = layerscope.check_tree(_lenet_profile(fake_clock))
    golden("lenet5_model_view.out", prof.render("model"))


def test_top_by_depth_lenet5_hand_computed(fake_clock) -> None:
    prof = _lenet_profile(fake_clock)
    # depth 2 holds features.{0..5} and classifier.{0..4}.
    # conv1: 6 out channels * 28*28 positions * (1*5*5) = 117,600 MACs
    # conv2: 16 * 10*10 * (6*5*5) = 240,000 MACs
    # Linear 400->120: 48,000; 120->84: 10,080; 84->10: 840  -> Linear total 58,920
    assert top_by_depth(prof, "macs", 2, k=2) == [("Conv2d", 357_600), ("Linear", 58_920)]
    # params: conv 156 + 2,416 = 2,572; linear 48,120 + 10,164 + 850 = 59,134
    assert top_by_depth(prof, "params", 2, k=3) == [("Linear", 59_134), ("Conv2d", 2_572), ("AvgPool2d", 0)]
    assert prof.root.forward.macs == 357_600 + 58_920  # 416,520


def test_count_flops_matches_profile_and_is_untimed() -> None:
    entry = zoo.get("gpt")
    model = entry.build().eval()
    counted = layerscope.check_tree(layerscope.count_flops(model, entry.example_inputs(2)))
    timed = layerscope.profile(model, entry.example_inputs(2), warmup=0, repeat=1)
    assert counted.meta.timed is False
    for node in counted.nodes():
        other = timed[node.path]
        assert (node.forward.flops, node.forward.macs, node.calls) == (other.forward.flops, other.forward.macs, other.calls)
        assert node.forward.cpu_time_ns == 0
    text = counted.render("text")
    assert "Self CPU" not in text and "FLOPs" in text
    assert "time" not in counted.render("model").split("\n\n")[-1].splitlines()[0]


def test_count_flops_on_meta_device_allocates_nothing() -> None:
    entry = zoo.get("resnet18")
    with torch.device("meta"):
        model = entry.build().eval()
    prof = layerscope.count_flops(model, entry.example_inputs(1).to("meta"))
    real = layerscope.count_flops(entry.build().eval(), entry.example_inputs(1))
    assert prof.root.forward.macs == real.root.forward.macs > 0
    assert prof.meta.device == "meta"
    assert all(p.is_meta for p in model.parameters())


def _cli(*argv: str, cwd: Path) -> Done:
    return run_layerscope(list(argv), cwd)


def test_cli_flops_meta_7b_llama(tmp_path: Path) -> None:
    run = _cli("flops", "transformers:LlamaForCausalLM", "--device", "meta", "--format", "json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    # LlamaConfig() defaults: hidden 4096, 32 layers, intermediate 11008, vocab 32000, untied:
    # per layer 4*4096^2 (attention) + 3*4096*11008 (MLP) + 2*4096 (norms) = 202,383,360
    # embeddings + lm_head 2*32000*4096 = 262,144,000; final norm 4096
    assert doc["totals"]["params"] == 32 * 202_383_360 + 262_144_000 + 4096
    assert doc["meta"]["device"] == "meta" and doc["meta"]["timed"] is False
    assert doc["totals"]["unsupported_ops"] == {}


def test_cli_flops_text_and_model_format(tmp_path: Path) -> None:
    run = _cli("flops", "zoo:alexnet", "--depth", "1", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "714.19M" in run.stdout and "Self CPU" not in run.stdout
    run = _cli("profile", "zoo:lenet5", "--repeat", "1", "--warmup", "0", "--format", "model", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "(0): Conv2d(" in run.stdout and "Top 3 module types by MACs at depth 2: Conv2d: 357.60K, Linear: 58.92K" in run.stdout


def test_cli_profile_refuses_meta(tmp_path: Path) -> None:
    run = _cli("profile", "zoo:lenet5", "--device", "meta", cwd=tmp_path)
    assert run.returncode == 2
    assert "layerscope flops" in run.stderr


def test_mfu_column_hand_computed(fake_clock) -> None:
    entry = zoo.get("lenet5")
    prof = layerscope.profile(
        entry.build().eval(), entry.example_inputs(1), warmup=1, repeat=3, clock=fake_clock, peak_tflops=0.1
    )
    assert prof.meta.peak_flops_per_s == 100_000_000_000
    root_line = prof.render("text").splitlines()[4]
    # 852,370 FLOPs in 67 fake µs (27 ticks of module calls, 40 of their 20 ops' starts
    # and ends) = 12.72 GFLOP/s; of a 0.1 TFLOP/s peak: 12.7%
    assert prof.root.forward.flops == 852_370 and prof.root.forward.cpu_time_ns == 67_000
    assert "12.72 GFLOP/s" in root_line and "12.7%" in root_line
    assert "12.7% of peak" in prof.render("model")


def test_bad_peak_is_refused_before_running() -> None:
    import pytest

    calls = []
    model = torch.nn.Linear(2, 2)
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match="peak_tflops must be a positive"):
            layerscope.profile(model, torch.ones(1, 2), peak_tflops=0)
    finally:
        handle.remove()
    assert calls == []


def test_a_profiler_block_takes_the_peak_for_mfu() -> None:
    # Profiler(peak_tflops=...) as profile(): the peak in meta, MFU per module from it;
    # without one, on the CPU, the peak is unknown and no MFU is made up.
    import pytest

    entry = zoo.get("lenet5")
    model, x = entry.build().eval(), entry.example_inputs(1)
    with layerscope.Profiler(model, peak_tflops=0.1) as prof:
        model(x)
    assert prof.profile.meta.peak_flops_per_s == 100_000_000_000
    assert "MFU" in prof.profile.render("text")
    with layerscope.Profiler(model) as plain:
        model(x)
    assert plain.profile.meta.peak_flops_per_s is None
    assert "MFU" not in plain.profile.render("text")
    with pytest.raises(ValueError, match=r"peak_tflops must be a positive number of TFLOP/s .*got -1"):
        layerscope.Profiler(model, peak_tflops=-1)
