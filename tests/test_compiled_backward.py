"""The backward of a ``torch.compile``d model per module: the split of backward kernels
by hand (pure), and real training steps of the zoo's MLP and GPT (Inductor on the CPU),
compiled once per module of tests."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import layerscope
from layerscope import zoo
from layerscope.attribute.compiled import BACKWARD_RULE, attribute
from layerscope.base import fmt
from layerscope.model.check import check_tree
from layerscope.model.documents import profile_from_dict
from layerscope.model.raw import CompiledGraph, CompiledPass, GraphCall, GraphNode, KernelRange, LossRange
from layerscope.model.tree import Profile
from processes import run_layerscope

# -- the rule, by hand ------------------------------------------------------------------


def test_backward_kernels_go_to_their_forward_modules_in_the_backward_phase() -> None:
    forward = CompiledGraph("f", "0/0", ["extern_kernels.addmm:1"], {"extern_kernels.addmm:1": [GraphNode("addmm", "fc")]})
    backward = CompiledGraph(
        "b", "0/0", ["extern_kernels.mm:2", "cpp_fused_sum_threshold_backward_0:3", "extern_kernels.addmm:4"],
        {
            "extern_kernels.mm:2": [GraphNode("mm", "fc")],
            # A fused kernel over two modules: split by node count, as in the forward.
            "cpp_fused_sum_threshold_backward_0:3": [
                GraphNode("le", "act"), GraphNode("where", "act"), GraphNode("sum_1", "fc"), GraphNode("view", "fc"),
            ],
            # Gradient accumulation: no node names a module.
            "extern_kernels.addmm:4": [GraphNode("addmm_default", None)],
        },
        phase="backward",
    )
    one = CompiledPass(
        1000,
        [
            GraphCall("f", [KernelRange("aten::addmm", 100)], 150),
            GraphCall("b", [
                KernelRange("aten::mm", 200), KernelRange("graph_0_cpp_fused_sum_threshold_backward_0", 60),
                KernelRange("aten::addmm", 40),
            ], 400),
        ],
        loss=LossRange(300, 350),
    )
    times = attribute({"f": forward, "b": backward}, [one], known={"", "fc", "act", "<loss>"})
    # Forward: fc's addmm, the loss's range, the root the rest up to the loss (300 - 100).
    assert times.self_ns == {"": 200, "<loss>": 50, "fc": 100}
    # Backward: fc 200 + 60 / 3 (sum_1; the view not counted), act 60 * 2 / 3; the root
    # the rest after the loss (1000 - 350 - 300), the unattributed addmm's 40 in it.
    assert times.backward_self_ns == {"": 650 - 260, "act": 40, "fc": 220}
    assert times.step_ns == 1000 == sum(times.self_ns.values()) + sum(times.backward_self_ns.values())
    by_call = {k.call: k for k in times.kernels}
    assert by_call["extern_kernels.mm:2"].phase == "backward" and by_call["extern_kernels.addmm:1"].phase == "forward"
    assert by_call["extern_kernels.addmm:4"].modules == {}


# -- real training steps ----------------------------------------------------------------


@pytest.fixture(scope="module")
def steps() -> dict[str, tuple[Profile, Profile]]:
    """Each zoo model's compiled training step and its eager count, made once."""
    out = {}
    for name in ("mlp", "gpt"):
        entry = zoo.get(name)
        torch.manual_seed(0)
        model = entry.build()
        x = entry.example_inputs(2)
        compiled = check_tree(layerscope.profile(torch.compile(model), x, backward=True, warmup=0, repeat=2))
        eager = layerscope.count_flops(model, x, backward=True)
        out[name] = (compiled, eager)
    return out


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_compiled_backward_flops_equal_eager_per_module_and_phase(
    steps: dict[str, tuple[Profile, Profile]], name: str
) -> None:
    compiled, eager = steps[name]
    pairs = list(zip(compiled.nodes(), eager.nodes(), strict=True))
    for a, b in pairs:
        assert a.path == b.path
        assert (a.forward.flops, a.forward.macs) == (b.forward.flops, b.forward.macs)
        assert (a.backward is None) == (b.backward is None)
        if a.backward is not None and b.backward is not None:
            assert (a.backward.flops, a.backward.macs) == (b.backward.flops, b.backward.macs)


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_every_backward_kernel_is_one_modules_or_named_unattributed(
    steps: dict[str, tuple[Profile, Profile]], name: str
) -> None:
    compiled, _ = steps[name]
    info = compiled.compiled
    assert info is not None and info.rule == BACKWARD_RULE
    backward = [k for k in info.kernels if k.phase == "backward"]
    assert backward, "no backward kernel was timed"
    paths = {node.path for node in compiled.nodes()}
    for kernel in backward:
        assert set(kernel.modules) <= paths
        assert kernel.modules == {} or sum(kernel.modules.values()) == pytest.approx(1.0, abs=1e-5)
    attributed = sum(k.time_ns for k in backward if k.modules)
    assert attributed + info.unattributed_time_ns("backward") == sum(k.time_ns for k in backward)
    # Every Linear's weight gradient is a kernel of its own module's.
    for node in compiled.nodes():
        if node.type == "Linear" and node.params:
            assert any(k.modules.get(node.path) == 1.0 for k in backward), node.path
            assert node.backward is not None and node.backward.self_cpu_time_ns > 0


def test_gpt_tied_weight_gradient_is_named_unattributed(steps: dict[str, tuple[Profile, Profile]]) -> None:
    compiled, _ = steps["gpt"]
    info = compiled.compiled
    assert info is not None
    unattributed = [k for k in info.kernels if k.phase == "backward" and not k.modules]
    # The tied embedding's two gradients, summed by gradient accumulation: no module's.
    assert [k.call.split(":")[0] for k in unattributed] == ["extern_kernels.addmm"]
    assert info.unattributed_time_ns("backward") == unattributed[0].time_ns
    # Attention's backward is its own module's, and each block's MLP has backward time.
    assert compiled["blocks.0.attn"].backward is not None
    assert compiled["blocks.0.attn"].backward.cpu_time_ns > 0


def test_a_compiled_step_saves_its_kernel_phases_and_loads_them_back(steps: dict[str, tuple[Profile, Profile]]) -> None:
    compiled, _ = steps["mlp"]
    again = profile_from_dict(json.loads(json.dumps(compiled.to_dict())))
    assert again.compiled == compiled.compiled
    assert {k.phase for k in again.compiled.kernels} == {"forward", "backward"}
    assert "Bwd self" in compiled.render("text")


def test_the_text_and_kernel_views_name_the_backward_and_its_unattributed_time(
    steps: dict[str, tuple[Profile, Profile]],
) -> None:
    compiled, _ = steps["gpt"]
    info = compiled.compiled
    assert info is not None
    backward = [k for k in info.kernels if k.phase == "backward"]
    text = compiled.render("text")
    assert (
        f"Backward: {len(backward)} of the kernel calls, 1 of them with no module's node: unattributed "
        f"{fmt.time_ns(info.unattributed_time_ns('backward'))}, counted in GPT's Bwd self."
    ) in text
    table = compiled.render("kernels")
    assert "| Phase" in table
    rows = [line for line in table.splitlines() if line.startswith("extern_kernels.addmm")]
    assert any("backward" in row and "(root: no module, unattributed)" in row for row in rows)
    kernel_rows = table.split("* shared by several modules")[0].splitlines()
    assert sum(" backward " in line for line in kernel_rows) == len(backward)


@pytest.mark.slow  # a cold command that compiles: out of the fast tier
def test_the_command_profiles_a_compiled_training_step(tmp_path: Any) -> None:
    done = run_layerscope(
        ["profile", "zoo:mlp", "--compile", "--backward", "--warmup", "0", "--repeat", "1", "--format", "kernels"], tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "| Phase" in done.stdout and " backward " in done.stdout
