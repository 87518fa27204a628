"""One name per thing in every view: what a figure is called and what it covers are the
same in the text tree, its footer, the HTML report and the op tables."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import layerscope


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(64, 64) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_container_never_called_shows_no_peak_of_its_own() -> None:
    """The ModuleList is indexed, never called: no interval of its own, so no peak
    (blank, None), while its children, called, have theirs."""
    profile = layerscope.check_tree(layerscope.profile(_Blocks(), torch.randn(8, 64), backward=True, warmup=0, repeat=1))
    blocks = profile["blocks"]
    assert blocks.calls == 0
    assert [stats.peak_bytes for _, stats in blocks.phases()] == [None, None]
    assert all(stats.peak_bytes is not None for _, stats in profile["blocks.0"].phases())


def test_layerscopes_own_time_has_one_name_wherever_it_sits() -> None:
    """Top-level or inside the optimizer's step, layerscope's own time is ``<layerscope>``:
    in its node's name and in its path."""
    profile = _sgd_block(nn.Sequential(nn.Linear(8, 8)), steps=2)
    overhead = [node for node in profile.nodes() if node.kind == "overhead"]
    assert overhead and {node.name for node in overhead} == {"<layerscope>"}
    assert all(node.path.endswith("<layerscope>") or node.path.endswith("[<layerscope>]") for node in overhead)
    assert "[layerscope]" not in profile.render("text")


def _sgd_block(model: nn.Module, steps: int) -> layerscope.Profile:
    """``steps`` SGD steps of ``model`` on a 4 x 8 batch, in a Profiler block."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.randn(4, 8)
    with layerscope.Profiler(model) as prof:
        for _ in range(steps):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return prof.profile


def test_trainable_and_frozen_parameters_are_counted_apart(tmp_path: Path) -> None:
    """A frozen first Linear (16 x 16 + 16 = 272) and a trainable second (16 x 4 + 4 =
    68): the footer and the HTML report say both, and a saved profile keeps them."""
    from layerscope.render.html import report_data

    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 4))
    for parameter in model[0].parameters():
        parameter.requires_grad_(False)
    profile = layerscope.count_flops(model, torch.randn(2, 16))
    assert profile.meta.trainable_params == 68 and profile.root.params_total == 340
    assert "Params: 340 (1.33 KiB): 68 trainable, 272 frozen" in profile.render("text")
    assert report_data(profile)["meta"]["trainable_params"] == 68
    profile.save(tmp_path / "saved.json")
    assert layerscope.load(tmp_path / "saved.json").meta.trainable_params == 68


def test_a_multi_step_blocks_chrome_trace_has_the_traced_steps_memory(tmp_path: Path) -> None:
    """Three steps summed: the trace is the last step, and its memory track is that
    step's own timeline (kept in the trace, saved and read back), not the step with the
    highest peak's; the step's peak is marked only where it is the traced run's."""
    import json

    profile = layerscope.check_tree(_sgd_block(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)), steps=3))
    assert profile.figures.steps == 3 and profile.trace is not None and profile.trace.memory is not None
    profile.save(tmp_path / "steps.json")
    loaded = layerscope.load(tmp_path / "steps.json")
    assert loaded.trace is not None and loaded.trace.memory == profile.trace.memory
    events = json.loads(loaded.render("chrome"))["traceEvents"]
    live = [e["args"]["bytes"] for e in events if e.get("name") == "live memory"]
    assert live == profile.trace.memory.bytes
    assert not [e for e in events if e.get("name") == "memory peak"]


def test_a_count_shows_each_modules_output_shape_as_torchinfo_does() -> None:
    """LeNet-5 on 1x1x32x32: its first convolution (5x5, 6 channels, no padding) gives
    1x6x28x28 (32 - 5 + 1), the model 1x10; a timed profile shows the column when asked."""
    from layerscope import zoo

    entry = zoo.get("lenet5")
    text = layerscope.count_flops(entry.build(), entry.example_inputs(1)).render("text", depth=2)
    header, *_ = [line for line in text.splitlines() if line.startswith("Module ")]
    rows = [(line.split("|")[0].strip(" ├└─│"), line.split("|")[-1].strip()) for line in text.splitlines() if "|" in line]
    assert header.split("|")[-1].strip() == "Output shape"
    assert rows[2] == ("LeNet5", "[1, 10]")
    assert next(cell for name, cell in rows if name == "0") == "[1, 6, 28, 28]"  # features.0, the first conv
    timed = layerscope.profile(entry.build(), entry.example_inputs(1), warmup=0, repeat=1)
    assert "Output shape" not in timed.render("text")
    assert "Output shape" in timed.render("text", columns=["self_cpu", "output_shape"])
