"""A ``Profiler`` block around a ``torch.compile``d model: the split of a step into its
parts by hand (pure), and real training and inference loops of the zoo's MLP and GPT
(Inductor on the CPU), each block run once per module of tests."""

from __future__ import annotations

import gzip
import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
from layerscope import block, zoo
from layerscope.attribute.compiled import BLOCK_RULE, StepFold, build_compiled_steps, step_sites
from layerscope.base.errors import LayerscopeWarning, ModelError, ProfilerStateError
from layerscope.base.kineto_json import open_trace
from layerscope.convert.compiled import FORWARD_RANGE, STEP_RANGE, compiled_passes
from layerscope.convert.ranges import KernelSpan, Range
from layerscope.model.check import check_tree
from layerscope.model.compile_info import CompileInfo, StepCompile, steps_in_medians
from layerscope.model.documents import profile_from_dict
from layerscope.model.raw import (
    CompiledGraph,
    CompiledPass,
    GraphBreak,
    GraphCall,
    GraphNode,
    KernelRange,
    StepRange,
)
from layerscope.traces.ranges import read_ranges

# -- the split of a step, by hand --------------------------------------------------------

_FORWARD = CompiledGraph("f", "0/0", ["extern_kernels.addmm:1"], {"extern_kernels.addmm:1": [GraphNode("addmm", "fc")]})
_BACKWARD = CompiledGraph(
    "b", "0/0", ["extern_kernels.mm:2"], {"extern_kernels.mm:2": [GraphNode("mm", "fc")]}, phase="backward",
)


def _step(step_ns: int, *, compile_ns: int = 0) -> CompiledPass:
    """A training step (ns from its start): zero_grad, the call [100, 300) with a compile
    of ``compile_ns`` inside it from 110 (which makes what follows that much later), the
    loss up to the engine's two nodes, AdamW's step."""
    c = compile_ns
    ranges = [
        StepRange("zero_grad", "AdamW", 0, 5),
        StepRange("forward", "", 100, 300 + c),
        StepRange("backward", "MeanBackward0", 350 + c, 360 + c),
        StepRange("backward", "CompiledFunctionBackward", 360 + c, 460 + c),
        StepRange("optimizer", "AdamW", 500 + c, 560 + c),
    ]
    if compile_ns:
        ranges.append(StepRange("compile", "dynamo", 110, 110 + c))
    calls = [
        GraphCall("f", [KernelRange("aten::addmm", 30)], 60),
        GraphCall("b", [KernelRange("aten::mm", 20)], 40),
    ]
    return CompiledPass(step_ns + c, calls, ranges=sorted(ranges, key=lambda r: r.start_ns))


def test_a_step_is_split_into_its_parts_and_every_ns_is_in_one() -> None:
    times, device, in_kernels, compiling = step_sites({"f": _FORWARD, "b": _BACKWARD}, _step(600), {"", "fc"})
    assert in_kernels == 50 and compiling == 0 and device is None  # no device work recorded
    assert times == {
        ("fc", "forward"): 30, ("", "forward"): 200 - 30,  # the call, less fc's kernel
        ("fc", "backward"): 20, ("", "backward"): 110 - 20,  # the engine's nodes, less fc's kernel
        ("<loss>", "forward"): 350 - 300,  # from the call's end to the backward's start
        ("<zero_grad>", "forward"): 5, ("<optimizer:AdamW>", "forward"): 60,
        ("<other>", "forward"): 600 - 200 - 110 - 50 - 5 - 60,
    }
    assert sum(times.values()) == 600


def test_time_compiling_is_in_no_part() -> None:
    graphs = {"f": _FORWARD, "b": _BACKWARD}
    plain, *_ = step_sites(graphs, _step(600), {"", "fc"})
    times, _, _, compiling = step_sites(graphs, _step(600, compile_ns=10_000), {"", "fc"})
    assert compiling == 10_000
    # The compile inside the call is taken out of it: every part is as without it.
    assert times == plain


def test_the_fold_takes_medians_and_leaves_out_steps_that_compiled() -> None:
    fold = StepFold({"", "fc"})
    graphs = {"f": _FORWARD, "b": _BACKWARD}
    fold.add(0, _step(600, compile_ns=50_000), graphs)
    for number, step_ns in ((1, 600), (2, 700), (3, 800)):
        fold.add(number, _step(step_ns), graphs)
    fold.add(4, CompiledPass(30, []), graphs)  # the step the block's end cut short: nothing ran
    assert fold.step_numbers == [0, 1, 2, 3] and fold.backward
    times = fold.times(graphs, leave_out={0})
    # Steps 1-3 differ only in <other> (100 more each): its median is step 2's.
    assert times.self_ns["<other>"] == 700 - 200 - 110 - 50 - 5 - 60
    assert times.step_ns == 700
    assert times.self_ns["fc"] == 30 and times.backward_self_ns["fc"] == 20
    # With no other step, the compiling one is used.
    alone = StepFold({"", "fc"})
    alone.add(0, _step(600, compile_ns=50_000), graphs)
    assert alone.times(graphs, leave_out={0}).step_ns == 600


# -- real loops ---------------------------------------------------------------------------


def _train(model: nn.Module, compiled: nn.Module, x: torch.Tensor, steps: int) -> tuple[layerscope.Profiler, Any]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with layerscope.Profiler(compiled) as prof:
        for _ in range(steps):
            opt.zero_grad()
            loss = compiled(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            prof.step()
    return prof, opt


@pytest.fixture(scope="module")
def loops() -> dict[str, Any]:
    """The zoo MLP's and GPT's compiled training loops and GPT's inference loop, in
    blocks, with the eager counts of the same steps; each run once."""
    out: dict[str, Any] = {}
    for name in ("mlp", "gpt"):
        entry = zoo.get(name)
        torch.manual_seed(0)
        model = entry.build()
        x = entry.example_inputs(2)
        compiled = torch.compile(model)
        before = dict(compiled.__dict__)
        prof, _ = _train(model, compiled, x, steps=4)
        after = dict(compiled.__dict__)
        profile = check_tree(prof.profile)
        eager = layerscope.count_flops(model, x, backward=True)
        out[name] = (profile, eager, before, after, model)
    entry = zoo.get("gpt")
    model = entry.build()
    x = entry.example_inputs(2)
    compiled = torch.compile(model)
    with torch.no_grad(), layerscope.Profiler(compiled) as prof:
        for _ in range(3):
            compiled(x)
            prof.step()
    out["gpt-inference"] = (check_tree(prof.profile), layerscope.count_flops(model, x), None, None, model)
    return out


@pytest.mark.slow  # the loops fixture compiles three models: out of the fast tier
@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_flops_and_macs_equal_the_eager_step_per_module_and_phase(loops: dict[str, Any], name: str) -> None:
    profile, eager, *_ = loops[name]
    for node in eager.modules():
        mine = profile.node(node.path)
        assert (mine.forward.flops, mine.forward.macs) == (node.forward.flops, node.forward.macs), node.path
        assert mine.backward is not None and node.backward is not None
        assert (mine.backward.flops, mine.backward.macs) == (node.backward.flops, node.backward.macs), node.path


@pytest.mark.slow  # the loops fixture compiles three models: out of the fast tier
@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_a_training_step_has_its_parts_with_times_and_unknown_counts(loops: dict[str, Any], name: str) -> None:
    profile, *_ = loops[name]
    parts = {part.path: part for part in profile.parts}
    assert {"<loss>", "<optimizer:AdamW>", "<zero_grad>", "<other>"} <= set(parts)
    for part in parts.values():
        assert part.forward.flops is None and part.forward.macs is None  # unknown, never 0
    assert parts["<optimizer:AdamW>"].forward.self_cpu_time_ns > 0
    # Every node's median self time adds up to the step the profile states.
    total = sum(
        stats.self_cpu_time_ns for tree in [profile.root, *profile.parts] for node in tree.walk()
        for _, stats in node.phases()
    )
    assert total == profile.step_time_ns == profile.compiled.step_time_ns
    assert profile.figures.steps == 4 and profile.figures.step_numbers == [0, 1, 2, 3]
    assert len(profile.figures.step_times_ns) == 4
    assert profile.meta.mode == "context" and profile.meta.step_range == [0, 3]
    assert BLOCK_RULE in profile.compiled.rule


@pytest.mark.slow  # the loops fixture compiles three models: out of the fast tier
@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_every_kernel_is_in_modules_or_named_unattributed(loops: dict[str, Any], name: str) -> None:
    profile, *_ = loops[name]
    info = profile.compiled
    assert {k.phase for k in info.kernels} == {"forward", "backward"}
    paths = {node.path for node in profile.modules()}
    for kernel in info.kernels:
        assert not kernel.modules or abs(sum(kernel.modules.values()) - 1) < 1e-5
        assert set(kernel.modules) <= paths
    every_linear = [n.path for n in profile.modules() if n.type == "Linear"]
    assert every_linear and all(profile.node(p).backward.self_cpu_time_ns > 0 for p in every_linear)


@pytest.mark.slow  # the loops fixture compiles three models: out of the fast tier
def test_steps_that_compiled_are_named_with_their_time(loops: dict[str, Any]) -> None:
    profile, *_ = loops["gpt"]
    info = profile.compiled
    # A loop of one shape compiles in its first step at most (an earlier compile in the
    # process may have left nothing to compile).
    for compiled in info.step_compiles:
        assert compiled.step == 0 and compiled.time_ns > 0 and compiled.frames >= 1
    assert info.compile_time_ns == sum(c.time_ns for c in info.step_compiles)
    text = profile.render("text", width=200)
    assert "Median step of 4" in text
    if info.step_compiles:
        assert f"Compiled in the block: step {info.step_compiles[0].step}" in text


@pytest.mark.slow  # the loops fixture compiles three models: out of the fast tier
def test_an_inference_loop_has_a_forward_and_no_loss(loops: dict[str, Any]) -> None:
    profile, eager, *_ = loops["gpt-inference"]
    assert profile.root.backward is None
    assert {part.path for part in profile.parts} <= {"<other>"}
    assert profile.root.forward.flops == eager.root.forward.flops
    assert {k.phase for k in profile.compiled.kernels} == {"forward"}


@pytest.mark.slow  # the loops fixture compiles three models: out of the fast tier
@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_the_model_is_left_as_it_was(loops: dict[str, Any], name: str) -> None:
    _, _, before, after, model = loops[name]
    assert after.keys() == before.keys() and all(after[key] is value for key, value in before.items())
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks and not module._backward_hooks


@pytest.mark.slow  # the loops fixture compiles three models: out of the fast tier
def test_a_saved_block_profile_loads_with_its_step_compiles(loops: dict[str, Any]) -> None:
    profile, *_ = loops["mlp"]
    loaded = profile_from_dict(json.loads(json.dumps(profile.to_dict())))
    assert loaded.compiled is not None
    assert loaded.compiled.step_compiles == profile.compiled.step_compiles
    assert loaded.compiled.kernels == profile.compiled.kernels
    assert loaded.figures.steps == 4
    doc = StepCompile(3, 1000, 1).to_dict()
    assert StepCompile.from_dict(doc) == StepCompile(3, 1000, 1)


def test_a_model_compiled_in_place_is_recorded_as_one_compiled_whole() -> None:
    # model.compile() (torch's in-place compile: no wrapper, the module's own call is
    # compiled) was refused as a model whose hooks Dynamo traces. It is the same compile
    # as torch.compile(model): its block records the same steps from the kernels, and
    # the call model.compile() set is put back after.
    entry = zoo.get("mlp")
    torch.manual_seed(0)
    model = entry.build()
    x = entry.example_inputs(2)
    model.compile()
    user_call = model._compiled_call_impl
    before = dict(model.__dict__)
    prof, _ = _train(model, model, x, steps=3)
    assert model._compiled_call_impl is user_call
    assert model.__dict__.keys() == before.keys() and all(model.__dict__[k] is v for k, v in before.items())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    profile = check_tree(prof.profile)
    assert profile.compiled is not None and profile.figures.steps == 3
    # Step 0 compiled, unless an earlier compile of the MLP's structure in this process
    # is reused (Dynamo guards the module's structure, not its identity).
    assert [c.step for c in profile.compiled.step_compiles] in ([0], [])
    kernels = profile.compiled.kernels
    assert {k.phase for k in kernels} == {"forward", "backward"} and all(k.modules for k in kernels)
    eager = layerscope.count_flops(entry.build(), x, backward=True)  # a model never compiled
    for node in eager.modules():
        mine = profile.node(node.path)
        assert (mine.forward.flops, mine.forward.macs) == (node.forward.flops, node.forward.macs), node.path
        assert (mine.backward.flops, mine.backward.macs) == (node.backward.flops, node.backward.macs), node.path


def test_a_model_compiled_in_place_gets_its_compiled_call_back_when_forward_raises() -> None:
    model = zoo.get("mlp").build()
    model.compile()
    user_call = model._compiled_call_impl
    with pytest.raises(RuntimeError), layerscope.Profiler(model):
        model(torch.randn(2, 3))  # the MLP takes 64 features
    assert model._compiled_call_impl is user_call


def test_a_model_compiled_in_place_with_another_backend_is_refused_naming_how_to_run_it_eagerly() -> None:
    model = zoo.get("mlp").build()
    model.compile(backend="aot_eager")
    with pytest.raises(ModelError, match=r"backend 'aot_eager'.*the model before model.compile\(\)"):
        layerscope.Profiler(model).__enter__()
    assert model._compiled_call_impl is not None


def _compiled_gpt(**options: Any) -> tuple[Any, nn.Module, torch.Tensor, nn.Module]:
    """The zoo GPT (seeded), its example inputs and ``torch.compile`` of it."""
    entry = zoo.get("gpt")
    torch.manual_seed(0)
    model = entry.build()
    return entry, model, entry.example_inputs(2), torch.compile(model, **options)


def test_the_medians_leave_out_steps_that_compiled_or_ran_other_input_shapes_while_others_ran() -> None:
    numbers = [0, 1, 2, 3, 4]
    assert steps_in_medians(numbers, compiled=[0, 2], other_inputs=[2, 4]) == [1, 3]
    # Only the count's own step had its shapes, and it compiled: that step.
    assert steps_in_medians(numbers, compiled=[0, 1], other_inputs=[1, 2, 3, 4]) == [0]
    # No step had the count's shapes (it was a warm-up step): those that did not compile.
    assert steps_in_medians(numbers, compiled=[0], other_inputs=numbers) == [1, 2, 3, 4]
    assert steps_in_medians([0], compiled=[0], other_inputs=[0]) == [0]
    info = CompileInfo("inductor", "", 0, 1, 1, step_compiles=[StepCompile(0, 5, 1)], other_input_steps=[2, 4])
    assert info.left_out(numbers) == (1, 2)
    assert CompileInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info


@pytest.mark.slow  # compiles a model twice (two sequence lengths)
def test_steps_with_other_input_shapes_than_the_count_are_named_and_left_out() -> None:
    # The FLOPs are one eager step's, on the first call's inputs: a step of another
    # sequence length did other work. Before, its time went into the medians beside
    # FLOPs of the first length, and FLOP/s set one against the other.
    entry, model, x, compiled = _compiled_gpt(dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lengths = (16, 16, 24, 16, 24, 16)
    with layerscope.Profiler(compiled) as prof:
        for n in lengths:
            opt.zero_grad()
            compiled(x[:, :n]).float().pow(2).mean().backward()
            opt.step()
            prof.step()
    profile = check_tree(prof.profile)
    info = profile.compiled
    assert info.other_input_steps == [2, 4]
    kept = info.median_steps(profile.figures.step_numbers)
    assert kept and not set(kept) & {0, 2, 4}
    assert info.left_out(profile.figures.step_numbers)[1] >= 1
    text = profile.render("text")
    assert "Other model calls than the eager count's step (other input shapes, or another number of calls" in text
    assert "in steps 2, 4: left out of the medians" in text
    assert "with other calls than the FLOPs' count left out" in text
    eager = layerscope.count_flops(entry.build(), x[:, :16], backward=True)
    assert (profile.root.forward.flops, profile.root.backward.flops) == (eager.root.forward.flops, eager.root.backward.flops)


@pytest.mark.slow  # 70 compiles before the block's own
def test_a_steps_compile_time_is_read_past_the_64_compiles_torch_keeps() -> None:
    # torch keeps the metrics of its last 64 compiles: a count of them stops changing
    # there, and a step that compiled after 64 compiles in the process read no compile
    # time (0 ns, as if free). The mark is the last compile's own record.
    for n in range(70):  # 70 functions of their own code: 70 frames compiled
        namespace: dict[str, Any] = {}
        exec(f"def add(x):\n    return x + {n}", namespace)  # a fresh code object each
        torch.compile(namespace["add"], backend="eager")(torch.ones(2))
    entry = zoo.get("mlp")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 8))  # a structure nothing compiled before
    compiled = torch.compile(model)
    with torch.no_grad(), layerscope.Profiler(compiled) as prof:
        for _ in range(2):
            compiled(entry.example_inputs(2))
            prof.step()
    (first,) = check_tree(prof.profile).compiled.step_compiles
    assert first.step == 0 and first.frames >= 1 and first.time_ns > 0


@pytest.mark.slow  # compiles GPT for a block of two-call steps, and runs it eagerly beside
def test_a_step_that_calls_the_model_twice_is_counted_with_both_calls() -> None:
    # The eager count ran the first call alone: with two calls a step (two views of a
    # batch; gradient accumulation inside a step), Calls said 1 and the FLOPs were half
    # the step's, while the times were both calls'. The count now replays the step's
    # calls; a step with another number of calls is named and left out.
    entry, model, x, compiled = _compiled_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with layerscope.Profiler(compiled) as prof:
        for calls in (2, 2, 2, 1, 2):
            opt.zero_grad()
            sum(compiled(x).float().pow(2).mean() for _ in range(calls)).backward()
            opt.step()
            prof.step()
    profile = check_tree(prof.profile)
    once = layerscope.count_flops(entry.build(), x)
    assert profile.root.calls == 2
    assert profile.root.forward.flops == 2 * once.root.forward.flops
    # The same two-call step in an eager block: its backward holds each parameter's
    # gradient accumulated over both calls, which is not twice one call's.
    eager = entry.build()
    with layerscope.Profiler(eager) as eager_prof:
        sum(eager(x).float().pow(2).mean() for _ in range(2)).backward()
    for node in check_tree(eager_prof.profile).modules():
        mine = profile.node(node.path)
        assert mine.calls == node.calls, node.path  # 2 for every module called (a ModuleList is not)
        assert mine.forward.flops == node.forward.flops == 2 * once.node(node.path).forward.flops, node.path
        if node.path:  # the root's own backward holds each loss's, which differ
            assert mine.backward.flops == node.backward.flops, node.path
    assert profile.compiled.other_input_steps == [3]
    assert 3 not in profile.compiled.median_steps(profile.figures.step_numbers)


@pytest.mark.slow  # compiles GPT under autocast
def test_the_count_runs_under_the_autocast_the_steps_ran_in() -> None:
    # Under torch.autocast the steps ran in bfloat16 (with bf16 copies of the weights);
    # the eager count ran in float32, so the activations and memory were another run's.
    entry, _, x, compiled = _compiled_gpt()
    with layerscope.Profiler(compiled) as prof:
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = compiled(x).float().pow(2).mean()
            loss.backward()
            prof.step()
    profile = check_tree(prof.profile)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        amp = layerscope.count_flops(entry.build(), x, backward=True)
    plain = layerscope.count_flops(entry.build(), x, backward=True)
    assert amp.root.forward.activation_bytes != plain.root.forward.activation_bytes  # the test tells them apart
    assert profile.root.forward.activation_bytes == amp.root.forward.activation_bytes
    assert profile.root.forward.flops == amp.root.forward.flops


# -- what a compiled block refuses, and what it keeps -------------------------------------


# torch's own warnings about the run this test makes on purpose (hooks under torch.compile).
@pytest.mark.filterwarnings("ignore:Using `torch.compile\\(module\\)` when there are global hooks:UserWarning")
@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace the builtin:UserWarning")
def test_a_block_on_the_eager_model_whose_compiled_wrapper_ran_in_it_says_so() -> None:
    # Profiler(model) while the code calls compiled = torch.compile(model): the block's
    # hooks are on the eager model, and Dynamo traces them into the wrapper's graphs
    # (graph breaks at every module). Before, the profile of that run came with no word.
    entry = zoo.get("mlp")
    model = entry.build()
    x = entry.example_inputs(2)
    compiled = torch.compile(model)
    compiled(x)
    with pytest.warns(LayerscopeWarning, match=r"Dynamo traced layerscope's module hooks.*layerscope.Profiler\(compiled\)"):
        with layerscope.Profiler(model):
            compiled(x)
    plain = zoo.get("mlp").build()  # no wrapper of it: nothing to say, though Dynamo compiled before
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayerscopeWarning)
        with layerscope.Profiler(plain):
            plain(x)


def test_a_forward_that_raises_leaves_the_model_as_it_was() -> None:
    model = zoo.get("mlp").build()
    compiled = torch.compile(model)
    before = dict(compiled.__dict__)
    with pytest.raises(RuntimeError) as raised, layerscope.Profiler(compiled) as prof:
        compiled(torch.randn(2, 3))  # the MLP takes 64 features
    assert dict(compiled.__dict__).keys() == before.keys()
    assert all(compiled.__dict__[key] is value for key, value in before.items())
    assert "layerscope: raised in module '(the model)' (MLP)" in raised.value.__notes__
    with pytest.raises(ProfilerStateError, match="never returned from a call in the block"):
        _ = prof.profile


def test_steps_before_a_raise_are_kept_and_the_profile_says_it_is_incomplete() -> None:
    entry = zoo.get("mlp")
    compiled = torch.compile(entry.build())
    x = entry.example_inputs(2)
    with pytest.raises(RuntimeError), torch.no_grad(), layerscope.Profiler(compiled) as prof:
        for bad in (False, False, True):
            compiled(torch.randn(2, 3) if bad else x)
            prof.step()
    profile = check_tree(prof.profile)
    assert profile.meta.complete is False and profile.figures.step_numbers == [0, 1, 2]


def test_a_block_whose_model_never_ran_says_so() -> None:
    compiled = torch.compile(zoo.get("mlp").build())
    with layerscope.Profiler(compiled) as prof:
        pass
    with pytest.raises(ProfilerStateError, match="never returned from a call in the block"):
        str(prof)
    with pytest.raises(ProfilerStateError, match="never returned from a call in the block"):
        _ = prof.profile  # the same error on every read


def test_another_backend_is_refused() -> None:
    compiled = torch.compile(zoo.get("mlp").build(), backend="aot_eager")
    with pytest.raises(ModelError, match="backend 'aot_eager'"), layerscope.Profiler(compiled):
        pass


@pytest.mark.parametrize(
    ("options", "named"),
    [({"record_ops": False}, "record_ops=False"), ({"with_stack": True}, "with_stack=True"),
     ({"paths": ["layers"]}, "paths=")],
)
def test_options_a_compiled_block_cannot_honour_are_refused(options: dict[str, Any], named: str) -> None:
    compiled = torch.compile(zoo.get("mlp").build())
    with pytest.raises(ValueError, match=named), layerscope.Profiler(compiled, **options):
        pass


def test_inside_a_running_torch_profiler_the_block_says_why_not() -> None:
    compiled = torch.compile(zoo.get("mlp").build())
    with torch.profiler.profile(), pytest.raises(ProfilerStateError, match="already running"):
        with layerscope.Profiler(compiled):
            pass


def test_a_recompile_inside_the_block_is_named_with_its_step() -> None:
    class Fresh(nn.Module):  # a class of its own: no compile in the process has seen its code
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x))

    compiled = torch.compile(Fresh())
    with torch.no_grad():
        compiled(torch.randn(2, 8))  # compiled by the user before the block
        with layerscope.Profiler(compiled) as prof:
            for batch in (2, 2, 5, 5):
                compiled(torch.randn(batch, 8))
                prof.step()
    info = check_tree(prof.profile).compiled
    # layerscope's own compile in the block's first step, and a recompile for the new batch size.
    assert [c.step for c in info.step_compiles] == [0, 2]
    assert prof.profile.figures.step_numbers == [0, 1, 2, 3]
    assert "Compiled in the block: step 0" in prof.render("text", width=300)


def test_steps_read_in_windows_are_all_kept_and_on_ready_gets_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(block, "WINDOW_STEPS", 2)  # torch's profiler read back every 2 steps
    received: list[Any] = []
    compiled = torch.compile(zoo.get("mlp").build())
    x = zoo.get("mlp").example_inputs(2)
    with torch.no_grad(), layerscope.Profiler(compiled, on_ready=received.append) as prof:
        for _ in range(5):
            compiled(x)
            prof.step()
    assert len(received) == 1 and received[0] is prof.profile
    profile = check_tree(received[0])
    assert profile.figures.step_numbers == [0, 1, 2, 3, 4] and len(profile.figures.step_times_ns) == 5
    assert profile.compiled.kernels and all(k.time_ns > 0 for k in profile.compiled.kernels)


# -- device time: each kernel call's device work, and every ns of a step's in one place ----


def _window() -> tuple[list[Range], list[KernelSpan]]:
    """A training step on a device, by hand (ns): zero_grad launches nothing; the call
    [100, 300) runs graph f (an addmm launching two kernels, correlation 11); the loss
    launches a kernel (20) at 320; the engine's nodes run graph b (an mm, 31, one kernel)
    and accumulate a gradient (40, one kernel); AdamW's step launches two (51, 52)."""
    def r(name: str, start: int, end: int, corr: int = 0, *children: Range) -> Range:
        return Range(name, start, end, 1, corr, list(children))

    step = r(STEP_RANGE, 0, 600, 1,
        r("Optimizer.zero_grad#AdamW.zero_grad", 0, 5, 2),
        r(FORWARD_RANGE, 100, 300, 3, r("## Call CompiledFxGraph f ##", 150, 250, 10, r("aten::addmm", 160, 190, 11))),
        r("aten::mean", 320, 330, 20),
        r("autograd::engine::evaluate_function: CompiledFunctionBackward", 360, 460, 30,
          r("## Call CompiledFxGraph b ##", 370, 450, 32, r("aten::mm", 380, 400, 31))),
        r("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 460, 470, 40),
        r("Optimizer.step#AdamW.step", 500, 560, 50, r("aten::_foreach_add_", 510, 520, 51), r("aten::sqrt", 530, 540, 52)),
    )
    kernels = [
        KernelSpan(11, 1000, 1400), KernelSpan(11, 1400, 1500),  # the addmm's two: 500
        KernelSpan(20, 1600, 1610),  # the loss's: 10
        KernelSpan(31, 1700, 1900),  # the mm's: 200
        KernelSpan(40, 1900, 1930),  # gradient accumulation: 30
        KernelSpan(51, 2000, 2040), KernelSpan(52, 2040, 2045),  # AdamW's: 45
    ]
    return [step], kernels


def test_each_kernel_call_has_the_device_time_it_launched() -> None:
    roots, kernels = _window()
    (one,) = compiled_passes(roots, kernels, has_device=True)
    assert [(g.graph, [(k.name, k.duration_ns, k.device_ns) for k in g.kernels]) for g in one.graph_calls] == [
        ("f", [("aten::addmm", 30, 500)]), ("b", [("aten::mm", 20, 200)]),
    ]
    device = {(r.kind, r.name): r.device_ns for r in one.ranges}
    assert device == {
        ("zero_grad", "zero_grad"): 0, ("forward", ""): 500, ("backward", "CompiledFunctionBackward"): 200,
        ("backward", "torch::autograd::AccumulateGrad"): 30, ("optimizer", "AdamW"): 45,
    }
    assert one.loose_device == [(320, 10)]  # the loss's kernel, launched outside every part
    # Without device work recorded, nothing says 0: every device figure is unknown.
    (host,) = compiled_passes(roots, kernels, has_device=False)
    assert host.graph_calls[0].kernels[0].device_ns is None and host.ranges[1].device_ns is None
    assert not host.loose_device and not host.has_device


def test_a_steps_device_time_is_split_like_its_host_time_and_every_ns_is_in_one_place() -> None:
    roots, kernels = _window()
    (one,) = compiled_passes(roots, kernels, has_device=True)
    graphs = {"f": _FORWARD, "b": _BACKWARD}
    _, device, _, _ = step_sites(graphs, one, {"", "fc"})
    assert device == {
        ("fc", "forward"): 500, ("fc", "backward"): 200,
        ("", "backward"): 30,  # gradient accumulation: the engine's, in no kernel call
        ("<loss>", "forward"): 10, ("<optimizer:AdamW>", "forward"): 45,
    }
    assert sum(device.values()) == sum(k.end_ns - k.start_ns for k in kernels)


def test_the_shared_h100_compiled_step_puts_every_device_ns_in_one_place(shared_traces: Path) -> None:
    """A real torch.profiler trace of one compiled AdamW step of GPT-2 on an H100 (no
    layerscope range in it: one pass), read by the trace reader and converted by the
    same code as a live window: each kernel call's device time is that of the kernels
    the trace links to its range, and every kernel is in one place."""
    path = shared_traces / "h100_compiled_gpt2_train.json.gz"
    with open_trace(path) as trace:
        ranges = read_ranges(trace.events())
    roots = [root for thread in ranges.roots.values() for root in thread]
    (one,) = compiled_passes(roots, ranges.kernels, has_device=True)
    # The same figures straight from the file: each kernel's duration by the External id
    # of the cpu_op that launched it.
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    device_by_op: dict[int, float] = {}
    for event in events:
        if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            op = event["args"]["External id"]
            device_by_op[op] = device_by_op.get(op, 0.0) + event["dur"]
    launched = {e["args"]["External id"]: e["name"] for e in events if e.get("cat") == "cpu_op"}
    calls = [kernel for call in one.graph_calls for kernel in call.kernels]
    assert len(one.graph_calls) == 4 and len(calls) == 88
    by_name: dict[str, float] = {}
    for op, us in device_by_op.items():
        by_name[launched.get(op, "?")] = by_name.get(launched.get(op, "?"), 0.0) + us
    triton = [k for k in calls if k.name.startswith("triton_")]
    assert triton and all(k.device_ns and k.device_ns > 0 for k in triton)
    # Each Triton kernel name is launched once per step here: its range's device time is its kernels'.
    for kernel in triton:
        if sum(1 for k in calls if k.name == kernel.name) == 1:
            assert kernel.device_ns == pytest.approx(by_name[kernel.name] * 1000, abs=2)
    # Every ns: the parts' ranges (the engine's nodes hold the backward graphs), the
    # forward graphs' calls, and what was launched outside all of them.
    in_parts = sum(r.device_ns or 0 for r in one.ranges)
    part_spans = [(r.start_ns, r.end_ns) for r in one.ranges]
    forward_calls = sum(
        call.device_ns or 0 for call, rng in zip(one.graph_calls, _graph_ranges(roots), strict=True)
        if not any(s <= rng[0] - _origin(roots) and rng[1] - _origin(roots) <= e for s, e in part_spans)
    )
    total = sum(k.end_ns - k.start_ns for k in ranges.kernels)
    assert in_parts + forward_calls + sum(ns for _, ns in one.loose_device) == total
    assert total == pytest.approx(sum(device_by_op.values()) * 1000, abs=len(device_by_op))


def _origin(roots: list[Range]) -> int:
    return min(r.start_time_ns for r in roots)


def _graph_ranges(roots: list[Range]) -> list[tuple[int, int]]:
    """The graph calls' spans, in start order."""
    found = []
    stack = list(roots)
    while stack:
        rng = stack.pop()
        if rng.name.startswith("## Call CompiledFxGraph"):
            found.append((rng.start_time_ns, rng.end_time_ns))
        stack.extend(rng.children)
    return sorted(found)


def _net_counted() -> tuple[Any, Any]:
    """The eager count (raw capture and its op walk) of a real model whose one module is ``fc``."""
    from layerscope.attribute.profile import op_walk
    from layerscope.capture.counting import count_capture

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    raw = count_capture(Net(), torch.randn(2, 4), None, False, True, None, False)
    ops = op_walk(raw)
    assert ops is not None
    return raw, ops


def test_a_profile_built_from_device_steps_holds_device_time_per_module_and_part() -> None:
    """The hand-made device step above, built into a profile with the eager count of a
    real model whose one module is ``fc``: each node's device time is its share."""
    raw, ops = _net_counted()
    roots, kernels = _window()
    graphs = {"f": _FORWARD, "b": _BACKWARD}
    fold = StepFold({"", "fc"})
    for number in range(3):
        (one,) = compiled_passes(roots, kernels, has_device=True)
        fold.add(number, one, graphs)
    profile = check_tree(build_compiled_steps(raw, ops, fold, graphs, graph_breaks=[], step_compiles=[]))
    assert profile.compiled.unattributed_device_ns("backward") == 0  # every backward kernel has its module
    fc = profile.node("fc")
    assert (fc.forward.self_device_time_ns, fc.backward.self_device_time_ns) == (500, 200)
    assert profile.root.backward.self_device_time_ns == 30
    parts = {part.path: part.forward.self_device_time_ns for part in profile.parts}
    assert parts["<loss>"] == 10 and parts["<optimizer:AdamW>"] == 45
    by_call = {k.call: k.device_ns for k in profile.compiled.kernels}
    assert by_call == {"extern_kernels.addmm:1": 500, "extern_kernels.mm:2": 200}
    table = profile.render("kernels")
    assert "Device time" in table and "500ns" in table
    loaded = profile_from_dict(json.loads(json.dumps(profile.to_dict())))
    assert [k.device_ns for k in loaded.compiled.kernels] == [500, 200]


def test_a_schedule_records_its_active_steps_and_delivers_each_cycle() -> None:
    received: list[Any] = []
    compiled = torch.compile(zoo.get("mlp").build())
    x = zoo.get("mlp").example_inputs(2)
    schedule = layerscope.schedule(wait=1, warmup=1, active=2, repeat=2)
    with torch.no_grad(), layerscope.Profiler(compiled, schedule=schedule, on_ready=received.append) as prof:
        for _ in range(9):
            compiled(x)
            prof.step()
    # Cycles of 4 steps: wait (step 0), warm-up (1), active (2, 3); then 4-7; step 8 is past the schedule.
    assert [check_tree(p).figures.step_numbers for p in received] == [[2, 3], [6, 7]]
    assert all(p.meta.schedule is not None and p.meta.complete for p in received)
    assert prof.profile is received[-1]
    # The block compiled in its warm-up step (unless an earlier one in the process left
    # nothing to compile): that step is in no cycle, so no cycle names it.
    assert all(c.step in p.figures.step_numbers for p in received for c in p.compiled.step_compiles)


def test_a_recorded_compiled_block_replays_as_the_same_profile() -> None:
    """A compiled block's windows recorded as torch's profiler handed them over, saved
    as JSON and replayed through the same adapter, conversion and fold: the same node
    times and kernels (what a GPU run records, ``benchmarks/gpu.py --record``)."""
    from layerscope.capture import replay

    entry = zoo.get("mlp")
    model = entry.build()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters())
    x = entry.example_inputs(2)
    with replay.CompiledRecorder() as recorder, layerscope.Profiler(compiled) as prof:
        for _ in range(3):
            opt.zero_grad()
            compiled(x).pow(2).mean().backward()
            opt.step()
            prof.step()
    live = check_tree(prof.profile)
    data = json.loads(json.dumps(replay.compiled_recording(recorder, live, about="zoo mlp, 3 steps on the CPU")))
    # The first step is read at once (the graphs it called tell which modules run
    # eagerly); the rest at the end, with the step the block's end cut short.
    assert [w["steps"] for w in data["windows"]] == [[0], [1, 2, 3]]
    replayed = check_tree(replay.replay_compiled(data, entry.build(), x))
    assert {n.path: [n.forward.self_cpu_time_ns, n.backward and n.backward.self_cpu_time_ns]
            for n in [*replayed.root.walk(), *replayed.parts]} == {k: v for k, v in data["live_host"].items()}
    assert replayed.compiled.kernels == live.compiled.kernels
    assert replay.node_figures(replayed) == data["live"]
    with pytest.raises(ValueError, match="not a compiled block's recording"):
        replay.replay_compiled({"format": "layerscope-capture/1"}, model, x)


CAPTURES = Path(__file__).parent / "data" / "captures"
#: Compiled blocks recorded by ``benchmarks/gpu.py --record`` (zoo MLP, 3 AdamW steps,
#: batch 8): ``compiled_mlp_train_cpu`` with ``--device cpu`` (always here), and
#: ``compiled_mlp_train`` on a GPU once one has recorded it.
COMPILED_CAPTURES = sorted(CAPTURES.glob("compiled_mlp_train*.json.gz"))


def test_the_cpu_compiled_capture_is_in_the_repository() -> None:
    assert CAPTURES / "compiled_mlp_train_cpu.json.gz" in COMPILED_CAPTURES


@pytest.mark.parametrize("path", COMPILED_CAPTURES, ids=[p.name.split(".")[0] for p in COMPILED_CAPTURES])
def test_a_recorded_compiled_block_replays_as_it_ran(path: Path) -> None:
    """A compiled block's windows and graphs, recorded as torch handed them over, give
    the live block's figures again through today's code; on a GPU every kernel has its
    device time and each Linear its own, forward and backward."""
    from layerscope.capture import replay

    data = replay.load_json(path)
    entry = zoo.get("mlp")
    replayed = check_tree(replay.replay_compiled(data, entry.build(), entry.example_inputs(8)))
    assert replay.node_figures(replayed) == data["live"]
    assert {n.path: [n.forward.self_cpu_time_ns, n.backward and n.backward.self_cpu_time_ns]
            for n in [*replayed.root.walk(), *replayed.parts]} == data["live_host"]
    if data["about"].endswith("on cpu"):
        assert all(k.device_ns is None for k in replayed.compiled.kernels)
        return
    assert all(k.device_ns is not None and k.device_ns > 0 for k in replayed.compiled.kernels)
    for node in replayed.modules():
        if node.type == "Linear":
            assert node.forward.self_device_time_ns > 0 and node.backward.self_device_time_ns > 0, node.path


def test_the_shared_h100_cuda_graph_step_names_each_replay_and_loses_no_device_ns(shared_traces: Path) -> None:
    """The same GPT-2 step compiled with mode="reduce-overhead": its kernels are replayed
    from CUDA graphs, with no launch of their own. Each graph call's own device time
    (outside its kernel calls) is the replay, equal to the kernels the file links to the
    compiled regions; and every kernel is still in one place."""
    path = shared_traces / "h100_compiled_gpt2_cudagraphs.json.gz"
    with open_trace(path) as trace:
        ranges = read_ranges(trace.events())
    roots = [root for thread in ranges.roots.values() for root in thread]
    (one,) = compiled_passes(roots, ranges.kernels, has_device=True)
    replays = [call.device_ns - sum(k.device_ns or 0 for k in call.kernels) for call in one.graph_calls]
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    regions = {e["args"]["External id"] for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("CompiledFunction")}
    replayed = sum(
        e["dur"] for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["args"].get("External id") in regions
    )
    assert sum(1 for ns in replays if ns > 0) == 4  # two forward graphs, two backward ones, each replayed
    assert sum(replays) == pytest.approx(replayed * 1000, abs=200)
    part_spans = [(r.start_ns, r.end_ns) for r in one.ranges]
    outside = sum(
        call.device_ns or 0 for call, rng in zip(one.graph_calls, _graph_ranges(roots), strict=True)
        if not any(s <= rng[0] - _origin(roots) and rng[1] - _origin(roots) <= e for s, e in part_spans)
    )
    total = sum(k.end_ns - k.start_ns for k in ranges.kernels)
    assert sum(r.device_ns or 0 for r in one.ranges) + outside + sum(ns for _, ns in one.loose_device) == total


def test_a_graphs_own_device_work_is_a_named_replay_in_the_roots_time() -> None:
    """A graph call whose kernels were replayed from a CUDA graph launches them itself
    (its own correlation): that device time is the root's, and named."""
    def r(name: str, start: int, end: int, corr: int = 0, *children: Range) -> Range:
        return Range(name, start, end, 1, corr, list(children))

    roots = [r(STEP_RANGE, 0, 400, 1,
               r(FORWARD_RANGE, 0, 300, 2, r("## Call CompiledFxGraph f ##", 10, 290, 10, r("aten::addmm", 20, 40, 11))))]
    kernels = [KernelSpan(10, 1000, 1700), KernelSpan(11, 1700, 1750)]  # the replay's 700, the addmm's 50
    (one,) = compiled_passes(roots, kernels, has_device=True)
    assert one.graph_calls[0].device_ns == 750
    graphs = {"f": _FORWARD}
    _, device, _, _ = step_sites(graphs, one, {"", "fc"})
    assert device == {("fc", "forward"): 50, ("", "forward"): 700}
    fold = StepFold({"", "fc"})
    fold.add(0, one, graphs)
    assert fold.times(graphs, set()).replay_device_ns == {"forward": 700}
    raw, ops = _net_counted()
    profile = check_tree(build_compiled_steps(raw, ops, fold, graphs, graph_breaks=[], step_compiles=[]))
    info = profile.compiled
    assert info.replay_device_ns == {"forward": 700} and info.unattributed_device_ns("forward") == 700
    assert profile.root.forward.self_device_time_ns == 700 and profile.node("fc").forward.self_device_time_ns == 50
    assert "CUDA-graph replays (device work the graphs launched outside their kernel calls): forward 700ns" in (
        profile.render("text", width=400)
    )
    loaded = profile_from_dict(json.loads(json.dumps(profile.to_dict())))
    assert loaded.compiled.replay_device_ns == {"forward": 700}


def test_a_graph_break_is_named_with_the_step_that_compiled_it(capsys: pytest.CaptureFixture[str]) -> None:
    class Chatty(nn.Module):  # a class of its own: compiled for the first time in this block
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            print("layerscope-test block graph break")  # Dynamo cannot trace print: a graph break
            return self.fc(x).relu()

    compiled = torch.compile(Chatty())
    with torch.no_grad(), layerscope.Profiler(compiled) as prof:
        for _ in range(3):
            compiled(torch.randn(2, 8))
            prof.step()
    info = check_tree(prof.profile).compiled
    first = info.step_compiles[0]
    assert first.step == 0 and first.graph_breaks >= 1 and info.graph_breaks
    assert all(c.graph_breaks == 0 for c in info.step_compiles[1:])
    text = prof.render("text", width=400)
    plural = "s" if first.graph_breaks != 1 else ""
    assert re.search(rf"Compiled in the block: step 0 \S+ \(\d+ frames?, {first.graph_breaks} graph break{plural}\)", text)
    assert "layerscope-test block graph break" in capsys.readouterr().out  # the user's print still ran


def test_modules_run_eagerly_between_graphs_are_timed_by_their_own_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    class Loud(nn.Module):  # a class of its own: compiled for the first time in this block
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            print("layerscope-test eager neighbours")  # a graph break
            return self.linear(x).relu()

    model = nn.Sequential(nn.Linear(8, 8), Loud(), nn.Linear(8, 4))
    compiled = torch.compile(model)
    with torch.no_grad(), layerscope.Profiler(compiled) as prof:
        for _ in range(4):
            compiled(torch.randn(2, 8))
            prof.step()
    profile = check_tree(prof.profile)
    # Dynamo gives up on Sequential's loop at the break: layers 0 and 2 run eagerly, and
    # each has a time of its own (from the second step on); Loud's code after the print is a graph.
    for path in ("0", "1.linear", "2"):
        assert profile[path].forward.self_cpu_time_ns > 0, path
    assert {k.call.split(":")[0] for k in profile.compiled.kernels} == {"extern_kernels.addmm", "cpp_fused_relu_0"}
    assert not any(hooks for m in model.modules() for hooks in (m._forward_hooks, m._forward_pre_hooks))
    capsys.readouterr()


def device_block_profile() -> Any:
    """A compiled block's profile from hand-made steps on a device (deterministic
    figures) and the eager count of a real model: step 0 compiled (its figures left out
    of the medians) with a graph break, and graph f's call replayed some work itself."""
    import dataclasses

    raw, ops = _net_counted()
    _, kernels = _window()
    graphs = {"f": _FORWARD, "b": _BACKWARD}
    fold = StepFold({"", "fc"})
    replay = KernelSpan(10, 3000, 3070)  # launched by graph f's call itself: a replay
    for number, extra in ((0, 5_000), (1, 0), (2, 0), (3, 0)):
        step_roots, _ = _window()
        step_roots[0].end_time_ns += extra
        (one,) = compiled_passes(step_roots, [*kernels, replay], has_device=True)
        fold.add(number, one, graphs)
    meta = dataclasses.replace(raw.meta, mode="context", timed=None, step_range=[0, 3])
    return check_tree(build_compiled_steps(
        dataclasses.replace(raw, meta=meta), ops, fold, graphs,
        graph_breaks=[GraphBreak("model.py:12", "print is not traced")],
        step_compiles=[StepCompile(0, 2_500_000_000, 1, 1)],
    ))


def test_a_compiled_blocks_report_reads_as_written(golden: Any) -> None:
    """The text and kernel table of :func:`device_block_profile`."""
    profile = device_block_profile()
    golden("compiled_block_device.out", profile.render("text", width=120))
    golden("compiled_block_device_kernels.out", profile.render("kernels"))


@pytest.mark.slow  # the loops fixture compiles three models: out of the fast tier
def test_torchs_key_averages_of_a_compiled_block_say_its_op_times_were_never_measured(loops: dict[str, Any]) -> None:
    from layerscope.compat.torch_profiler import key_averages

    profile, *_ = loops["mlp"]
    table = key_averages(profile).table(row_limit=3)
    assert "aten::addmm" in table
    assert "have no times of their own: their times are not measured (?)" in table
    assert "Self CPU time total: ?" in table and "NaN" not in table  # unknown, never 0
