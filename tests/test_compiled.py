"""Per-module profiles of ``torch.compile``d models: the split of kernel time over
modules by hand (pure), and real compiles of the zoo's MLP and GPT, a transformers BERT
and a model with a graph break (Inductor on the CPU)."""

from __future__ import annotations

import copy
import functools
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
from layerscope import zoo
from layerscope.attribute.compiled import (
    RULE,
    attribute,
    build_compiled,
    eager_self,
    event_name,
    match_calls,
    shares,
    with_ops,
)
from layerscope.attribute.profile import op_walk
from layerscope.base.errors import ModelError, RenderError, SchemaError
from layerscope.capture import compiled as compiled_module
from layerscope.model.check import check_tree
from layerscope.model.documents import profile_from_dict
from layerscope.model.ops import OpTableError
from layerscope.model.raw import (
    CompiledCapture,
    CompiledGraph,
    CompiledPass,
    CompiledRegion,
    EagerRange,
    Enter,
    Exit,
    GraphBreak,
    GraphCall,
    GraphNode,
    KernelRange,
    ModuleInfo,
    Op,
    RawCapture,
    Step,
)
from layerscope.model.tree import Profile
from test_cli import run_cli
from test_no_side_effects import unchanged

# -- the rule, by hand ------------------------------------------------------------------


def test_shares_count_nodes_per_module_leaving_views_out() -> None:
    nodes = [GraphNode(*n) for n in (("mul", "a"), ("view_1", "b"), ("add", "a"), ("erf", "c"), ("permute_2", "c"))]
    assert shares(nodes) == {"a": 2 / 3, "c": 1 / 3}
    # A call made of views only (a reshape kernel) is split over them; no module: empty.
    assert shares([GraphNode("view", "a"), GraphNode("permute", "b")]) == {"a": 0.5, "b": 0.5}
    assert shares([GraphNode("mul", None), GraphNode("add", None)]) == {}
    assert shares([GraphNode("addmm", "fc")]) == {"fc": 1.0}


def test_event_names_of_kernel_calls() -> None:
    assert event_name("extern_kernels.addmm:2") == "aten::addmm"
    assert event_name("torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:3") == (
        "aten::_scaled_dot_product_flash_attention_for_cpu"
    )
    assert event_name("cpp_fused_gelu_0:7") is None


def test_calls_are_matched_in_order_skipping_unseen_ones() -> None:
    calls = ["extern_kernels.addmm:1", "cpp_fused_relu_0:2", "extern_kernels.addmm:3", "cpp_fused_relu_0:4"]
    events = [("aten::addmm", 10), ("graph_0_cpp_fused_relu_0", 2), ("aten::copy_", 1), ("graph_0_cpp_fused_relu_0", 3)]
    # The second addmm was not seen: the next relu range is call 4; copy_ is no call.
    assert match_calls(calls, events) == [
        ("extern_kernels.addmm:1", 10), ("cpp_fused_relu_0:2", 2), (None, 1), ("cpp_fused_relu_0:4", 3),
    ]


def test_triton_kernel_ranges_match_their_calls() -> None:
    # On a GPU, Inductor's Triton launcher records a range named after the kernel itself
    # (seen on an H100 with torch 2.11: only the extern calls had matched).
    calls = ["extern_kernels.mm:1", "triton_poi_fused_addmm_relu_0:2", "extern_kernels.addmm:3"]
    events = [("aten::mm", 10), ("triton_poi_fused_addmm_relu_0", 4), ("aten::addmm", 7)]
    assert match_calls(calls, events) == [
        ("extern_kernels.mm:1", 10), ("triton_poi_fused_addmm_relu_0:2", 4), ("extern_kernels.addmm:3", 7),
    ]
    assert match_calls(calls[1:2], [("triton_poi_fused_addmm_relu_1", 4)]) == [(None, 4)]


def G(calls: list[str], nodes: dict[str, list[tuple[str, str | None]]]) -> CompiledGraph:
    """A graph by hand: its calls, and each call's nodes as (name, module)."""
    return CompiledGraph("k", "0/0", calls, {call: [GraphNode(*n) for n in found] for call, found in nodes.items()})


def P(step_ns: int, graph_calls: list[tuple[str, list[tuple[str, int]], int]]) -> CompiledPass:
    """A pass by hand: its length and graph calls as (key, [(range, ns)], ns)."""
    return CompiledPass(
        step_ns, [GraphCall(key, [KernelRange(*k) for k in kernels], ns) for key, kernels, ns in graph_calls]
    )


def test_eager_modules_keep_their_range_less_what_is_nested() -> None:
    # seq.0 ran eagerly 100..300 holding a compiled region 150..200; seq.1 ran eagerly
    # 300..400 holding seq.1.inner 320..360, itself holding a region 330..340.
    ranges = [EagerRange("seq.0", 100, 300), EagerRange("seq.1", 300, 400), EagerRange("seq.1.inner", 320, 360)]
    regions = [CompiledRegion(150, 200), CompiledRegion(330, 340), CompiledRegion(500, 600)]
    assert eager_self(ranges, regions) == {"seq.0": 150, "seq.1": 60, "seq.1.inner": 30}


def test_attribute_splits_kernels_and_leaves_the_rest_to_the_root() -> None:
    graph = G(
        ["extern_kernels.addmm:1", "cpp_fused_add_gelu_0:2", "extern_kernels.mm:3"],
        {
            "extern_kernels.addmm:1": [("addmm", "fc")],
            "cpp_fused_add_gelu_0:2": [("add", "block"), ("mul", "act"), ("erf", "act"), ("mul_1", "act")],
            "extern_kernels.mm:3": [("mm", "elsewhere")],  # not a module of this tree: the root's
        },
    )
    passes = [
        P(1000, [("k", [("aten::addmm", 300), ("graph_0_cpp_fused_add_gelu_0", 80), ("aten::mm", 100)], 600)]),
        P(1200, [("k", [("aten::addmm", 500), ("graph_0_cpp_fused_add_gelu_0", 40), ("aten::mm", 100)], 700)]),
        P(900, [("k", [("aten::addmm", 200), ("graph_0_cpp_fused_add_gelu_0", 120), ("aten::mm", 100)], 500)]),
    ]
    passes[0].eager = [EagerRange("fc", 10, 30)]  # a range of its own besides (a second call, eager)
    times = attribute({"k": graph}, passes, known={"", "fc", "block", "act"})
    # fc: median(300 + 20, 500, 200) = 320. The fused call is 1/4 block, 3/4 act:
    # block median(20, 10, 30) = 20; act median(60, 30, 90) = 60.
    assert times.self_ns == {"act": 60, "block": 20, "fc": 320, "": 1000 - 400}
    assert times.step_ns == 1000
    assert times.kernel_ns == 480  # median of 480, 640, 420
    fused = next(k for k in times.kernels if k.call == "cpp_fused_add_gelu_0:2")
    assert fused.shared and fused.modules == {"block": 0.25, "act": 0.75} and fused.time_ns == 80
    assert next(k for k in times.kernels if k.call == "extern_kernels.mm:3").modules == {"": 1.0}


def test_the_step_is_the_sum_of_the_medians_so_the_tree_adds_up_on_a_busy_machine() -> None:
    # Each pass slow in a different module: fc and act's medians (500 each) add up to
    # more than the median pass (600). Per pass, the root keeps what its modules leave
    # (90, 90, 100: median 90), and the step is the sum of the medians: 500 + 500 + 90.
    graph = G(["extern_kernels.addmm:1", "cpp_fused_relu_0:2"],
              {"extern_kernels.addmm:1": [("addmm", "fc")], "cpp_fused_relu_0:2": [("relu", "act")]})
    passes = [
        P(600, [("k", [("aten::addmm", 500), ("graph_0_cpp_fused_relu_0", 10)], 550)]),
        P(600, [("k", [("aten::addmm", 10), ("graph_0_cpp_fused_relu_0", 500)], 550)]),
        P(1100, [("k", [("aten::addmm", 500), ("graph_0_cpp_fused_relu_0", 500)], 1050)]),
    ]
    times = attribute({"k": graph}, passes, known={"", "fc", "act"})
    assert times.self_ns == {"": 90, "act": 500, "fc": 500}
    assert times.step_ns == 1090 == sum(times.self_ns.values())


def _hand_run() -> tuple[RawCapture, CompiledCapture]:
    """An eager pass of Net(fc, act) and a compiled run of it by hand: one graph of an
    addmm (fc's) and a fused relu (act's), three passes."""
    modules = [
        ModuleInfo(path="", type="Net", parent=None, depth=0, params=0),
        ModuleInfo(path="fc", type="Linear", parent="", depth=1, params=12),
        ModuleInfo(path="act", type="ReLU", parent="", depth=1, params=0),
    ]
    op_pass = [
        Step(0), Enter(0, 0),
        Enter(10, 1), Op(12, 20, "aten::addmm", [[2, 3], [3, 4]], flops=48, macs=24, bytes=64), Exit(30, 1),
        Enter(40, 2), Op(41, 45, "aten::relu", [[2, 4]], flops=None), Exit(50, 2),
        Exit(60, 0), Step(60),
    ]
    raw = RawCapture(modules=modules, op_pass=op_pass, param_bytes=48, meta={"model": "Net", "device": "cpu", "mode": "profile"})
    graph = G(
        ["extern_kernels.addmm:1", "cpp_fused_relu_0:2"],
        {"extern_kernels.addmm:1": [("addmm", "fc")], "cpp_fused_relu_0:2": [("relu", "act")]},
    )
    passes = [
        P(1000, [("k", [("aten::addmm", 300), ("graph_0_cpp_fused_relu_0", 100)], 500)]),
        P(1200, [("k", [("aten::addmm", 400), ("graph_0_cpp_fused_relu_0", 50)], 600)]),
        P(900, [("k", [("aten::addmm", 200), ("graph_0_cpp_fused_relu_0", 150)], 400)]),
    ]
    breaks = [GraphBreak("net.py:7", "print")]
    return raw, CompiledCapture({"k": graph}, passes, breaks, compile_time_ns=5_000_000, frames=1)


def test_a_compiled_profile_is_built_once_from_both_captures() -> None:
    raw, run = _hand_run()
    ops = op_walk(raw)
    assert ops is not None and with_ops(raw, ops) == {"fc", "act"}
    given = copy.deepcopy((raw, ops, run))
    prof = check_tree(build_compiled(raw, ops, run))
    # Built anew: the eager pass's walk keeps its op times and its trace.
    assert (raw, ops, run) == given
    assert ops.trace is not None and all(op.cpu_time_ns is not None for op in ops.ops.values())
    # fc: median(300, 400, 200); act: median(100, 50, 150); the root keeps the rest of
    # the median call (1000), and its total is the call: summed as any tree's.
    assert [(n.path, n.forward.self_cpu_time_ns, n.forward.cpu_time_ns) for n in prof.root.walk()] == [
        ("", 600, 1000), ("fc", 300, 300), ("act", 100, 100),
    ]
    assert prof.root.forward.flops == 48 and prof["fc"].forward.macs == 24 and prof.unsupported_ops() == {"aten::relu": 1}
    assert [(op.name, op.calls, op.cpu_time_ns, op.self_cpu_time_ns) for n in prof.nodes() for op in n.ops] == [
        ("aten::addmm", 1, None, None), ("aten::relu", 1, None, None),
    ]
    assert prof.trace is None and prof.timed
    info = prof.compiled
    assert info is not None
    assert (info.backend, info.graphs, info.frames, info.step_time_ns, info.kernel_time_ns) == ("inductor", 1, 1, 1000, 400)
    assert [(k.call, k.time_ns, k.modules) for k in info.kernels] == [
        ("extern_kernels.addmm:1", 300, {"fc": 1.0}), ("cpp_fused_relu_0:2", 100, {"act": 1.0}),
    ]
    # Op cells with no time are blank, by the rule for any unknown figure.
    addmm = next(line for line in prof.render("text", show_ops=True).splitlines() if "aten::addmm" in line)
    assert [cell.strip() for cell in addmm.split("|")][2:5] == ["", "", ""]


def test_a_compiled_profile_saves_its_run_under_meta_compile_and_loads_it_back() -> None:
    raw, run = _hand_run()
    ops = op_walk(raw)
    assert ops is not None
    prof = build_compiled(raw, ops, run)
    doc = json.loads(json.dumps(prof.to_dict()))
    assert "compile" not in prof.meta.to_dict()
    assert doc["meta"]["compile"] == {
        "backend": "inductor", "rule": RULE, "compile_time_ns": 5_000_000, "frames": 1, "graphs": 1,
        "graph_breaks": [{"where": "net.py:7", "reason": "print"}], "step_time_ns": 1000, "kernel_time_ns": 400,
        "kernels": [
            {"graph": "k", "call": "extern_kernels.addmm:1", "time_ns": 300, "modules": {"fc": 1.0}},
            {"graph": "k", "call": "cpp_fused_relu_0:2", "time_ns": 100, "modules": {"act": 1.0}},
        ],
    }
    assert list(doc["meta"])[-1] == "compile"
    assert doc["modules"][1]["ops"][0]["cpu_time_ns"] is None
    loaded = profile_from_dict(doc)
    assert loaded.compiled == prof.compiled
    assert loaded.to_dict() == doc
    assert loaded.render("kernels") == prof.render("kernels")
    # Every field of the run is checked at the door.
    doc["meta"]["compile"]["kernels"][1]["time_ns"] = "100"
    del doc["meta"]["compile"]["graph_breaks"][0]["reason"]
    with pytest.raises(SchemaError) as found:
        profile_from_dict(doc)
    assert "meta.compile.kernels[1].time_ns: expected" in str(found.value)
    assert "meta.compile.graph_breaks[0]: no 'reason'" in str(found.value)


def test_an_op_table_sorted_by_a_time_some_ops_lack_puts_them_last() -> None:
    raw, run = _hand_run()
    ops = op_walk(raw)
    assert ops is not None
    prof = build_compiled(raw, ops, run)
    # Compiled: no op has a time, so the table has no time column and refuses to sort by one.
    assert "self_cpu_time_ns" not in prof.ops().columns
    with pytest.raises(OpTableError, match="its ops have no times"):
        prof.ops(sort_by="self_cpu_time")
    # One op timed, one not: the untimed one sorts last.
    prof["fc"].ops[0].cpu_time_ns = prof["fc"].ops[0].self_cpu_time_ns = 8
    table = prof.ops(sort_by="self_cpu_time")
    assert [(row.name, row.self_cpu_time_ns) for row in table.rows] == [("aten::addmm", 8), ("aten::relu", None)]
    assert table.total.self_cpu_time_ns == 8
    table.render()


# -- real compiles ------------------------------------------------------------------------


def _zoo(name: str) -> tuple[nn.Module, object]:
    torch.manual_seed(0)
    entry = zoo.get(name)
    return entry.build().eval(), entry.example_inputs(1)


def _compiled(model: nn.Module, inputs: object) -> tuple[Profile, Profile]:
    """The compiled model's profile, checked, and the eager count of the same module;
    the module is left as ``torch.compile`` left it."""
    compiled = torch.compile(model)
    with unchanged(model):
        prof = check_tree(layerscope.profile(compiled, inputs, warmup=1, repeat=3))
    return prof, check_tree(layerscope.count_flops(model, inputs))


def _same_flops(compiled: Profile, eager: Profile) -> None:
    pairs = list(zip(compiled.root.walk(), eager.root.walk(), strict=True))
    assert [(a.path, a.forward.flops, a.forward.macs) for a, _ in pairs] == [
        (b.path, b.forward.flops, b.forward.macs) for _, b in pairs
    ]


def _root_is_the_step(prof: Profile) -> None:
    info = prof.compiled
    assert info is not None
    assert prof.root.forward.cpu_time_ns == info.step_time_ns > 0
    # The median pass's kernel time and the sum of the modules' medians are two medians
    # of real timings: no order between them holds on a busy machine (the rule is
    # checked on hand-made passes: kernels 480 of a step of 1,000).
    assert info.kernel_time_ns > 0
    for kernel in info.kernels:
        assert kernel.time_ns >= 0
        assert sum(kernel.modules.values()) == pytest.approx(1.0, abs=1e-5)


def test_zoo_mlp_compiled_per_module() -> None:
    model, x = _zoo("mlp")
    prof, eager = _compiled(model, x)
    _same_flops(prof, eager)
    _root_is_the_step(prof)
    info = prof.compiled
    assert info is not None
    assert info.graphs == 1 and info.graph_breaks == []
    # Three Linear layers, each one extern addmm of its own: exact, not shared.
    by_module = {path: k for k in info.kernels for path in k.modules}
    for path in ("layers.0", "layers.2", "layers.4"):
        assert by_module[path].call.startswith("extern_kernels.addmm") and by_module[path].modules == {path: 1.0}
        assert prof[path].forward.self_cpu_time_ns > 0
    text = prof.render("text")
    assert "Compiled (inductor): 1 graph(s), 0 graph break(s)" in text
    # With ops nested, the eager ops show FLOPs and shapes but no time: they never ran.
    addmm = next(line for line in prof.render("text", show_ops=True).splitlines() if "aten::addmm" in line)
    cells = [cell.strip() for cell in addmm.split("|")]
    assert cells[1:5] == ["", "", "", ""] and cells[5].endswith("K")  # type, times, CPU % blank; FLOPs shown
    assert all(op.cpu_time_ns is None is op.self_cpu_time_ns for node in prof.nodes() for op in node.ops)
    with pytest.raises(RenderError, match="compiled model's profile keeps no trace"):
        prof.render("chrome")  # the eager pass's spans are not the compiled run's
    assert "layers.0 100.0%" in prof.render("kernels")
    # Profiled again: layerscope's compile of it is reused, not redone (Dynamo would stop
    # compiling the code after 8 backends), and says the same.
    compiles = compiled_module._COMPILER.compiles
    compiled = torch.compile(model)
    for _ in range(9):
        again = check_tree(layerscope.profile(compiled, x, warmup=0, repeat=1))
    assert compiled_module._COMPILER.compiles == compiles
    assert again.compiled is not None
    assert [k.call for k in again.compiled.kernels] == [k.call for k in info.kernels]
    assert again.compiled.compile_time_ns == info.compile_time_ns


def test_zoo_gpt_compiled_keeps_fused_modules_with_their_share() -> None:
    model, x = _zoo("gpt")
    prof, eager = _compiled(model, x)
    _same_flops(prof, eager)
    _root_is_the_step(prof)
    assert prof.compiled is not None
    kernels = prof.compiled.kernels
    # Each block's first LayerNorm runs inside a kernel it shares (with the residual add
    # before it): it keeps its share of that kernel's time, and the kernel is marked.
    shared = [k for k in kernels if "blocks.1.ln_1" in k.modules]
    assert shared and all(len(k.modules) > 1 for k in shared)
    assert prof["blocks.1.ln_1"].forward.self_cpu_time_ns > 0
    assert "*" in prof.render("kernels")
    # Saved and loaded, the run is the same typed object (shares to 6 places in both).
    assert profile_from_dict(json.loads(json.dumps(prof.to_dict()))).compiled == prof.compiled
    # Attention is one extern call, the attention module's.
    sdpa = [k for k in kernels if "scaled_dot_product" in k.call]
    assert len(sdpa) == 4 and all(k.modules == {f"blocks.{i}.attn": 1.0} for i, k in enumerate(sdpa))


def test_transformers_bert_compiled_flops_equal_eager() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 128, (1, 16))
    prof, eager = _compiled(model, {"input_ids": ids})
    _same_flops(prof, eager)
    _root_is_the_step(prof)
    timed = [n.path for n in prof.root.walk() if n.forward.self_cpu_time_ns > 0]
    assert "encoder.layer.1.attention.self.query" in timed
    assert "encoder.layer.0.output.dense" in timed


class Talker(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("layerscope-test graph break")  # Dynamo cannot trace print: a graph break
        return self.linear(x).relu()


BREAK_LINE = inspect.getsourcelines(Talker.forward)[1] + 1


def test_a_graph_break_is_listed_and_both_sides_are_profiled(capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Talker(), nn.Linear(8, 4)).eval()
    prof, eager = _compiled(model, torch.randn(2, 8))
    _same_flops(prof, eager)
    info = prof.compiled
    assert info is not None and info.graph_breaks
    for found in info.graph_breaks:
        assert found.where.endswith(f"{Path(__file__).name}:{BREAK_LINE}")
        assert f"Graph break at {found.where}" in prof.render("text")
    # Dynamo gives up on Sequential's loop at the break: its layers 0 and 2 run eagerly
    # and are timed by ranges of their own; Talker's code after the print is a graph.
    assert info.graphs == 1
    assert {k.call.split(":")[0] for k in info.kernels} == {"extern_kernels.addmm", "cpp_fused_relu_0"}
    for path in ("0", "1.linear", "2"):
        assert prof[path].forward.self_cpu_time_ns > 0, path


class Halves(nn.Module):
    """A break in the model's own forward: a graph before it and one after."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.second = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        if x.sum().item() > 1e9:  # .item() leaves the graph
            x = x * 2
        return self.second(x)


def test_a_break_in_the_forward_profiles_the_graphs_on_both_sides() -> None:
    torch.manual_seed(0)
    prof, eager = _compiled(Halves().eval(), torch.randn(2, 8))
    _same_flops(prof, eager)
    info = prof.compiled
    assert info is not None and info.graphs == 2 and info.graph_breaks
    modules = {path for k in info.kernels for path in k.modules}
    assert {"first", "second"} <= modules
    assert prof["first"].forward.self_cpu_time_ns > 0 and prof["second"].forward.self_cpu_time_ns > 0


def test_paths_of_a_compiled_model_are_refused_with_why() -> None:
    model, x = _zoo("mlp")
    compiled = torch.compile(model)
    with unchanged(model), pytest.raises(ModelError, match="profiled whole from its kernels"):
        layerscope.profile(compiled, x, paths=["layers.0"])


@pytest.mark.slow  # two cold commands that compile: out of the fast tier
def test_cli_compile_lists_kernels_and_a_saved_profile_shows_them_again(tmp_path: Path) -> None:
    run = run_cli("profile", "zoo:mlp", "--compile", "--repeat", "2", "--warmup", "1", "-o", "mlp.json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "USDT" not in run.stderr
    saved = layerscope.load(tmp_path / "mlp.json")
    shown = run_cli("show", "mlp.json", "--format", "kernels", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == saved.render("kernels")
    assert "extern_kernels.addmm:1" in shown.stdout and "Per module" in shown.stdout
    assert "Compiled (inductor)" in run_cli("show", "mlp.json", cwd=tmp_path).stdout


def _wrapped(forward: Any) -> Any:
    """A decorator as model libraries put on ``forward`` (transformers' output-tuple and
    input-check wrappers): the frame Dynamo compiles is ``wrapper(*args, **kwargs)``."""

    @functools.wraps(forward)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    return wrapper


class _Decorated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.head = nn.Linear(32, 16)

    @_wrapped
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def test_kernels_reach_modules_when_forward_is_a_decorators_wrapper() -> None:
    # Dynamo names the modules from the wrapper's arguments (L['args'][0].head); before,
    # no path matched the model's and every kernel stayed with the root, forward and
    # backward alike (a transformers Llama lost all of them).
    torch.manual_seed(0)
    model, x = _Decorated(), torch.randn(4, 16)
    prof, eager = _compiled(model, x)
    kernels = prof.compiled.kernels
    assert kernels and all(k.modules for k in kernels), [(k.call, k.modules) for k in kernels]
    assert {"head", "body.0"} <= {path for k in kernels for path in k.modules}
    _same_flops(prof, eager)
    step = check_tree(layerscope.profile(torch.compile(model), x, backward=True, warmup=1, repeat=2))
    backward = [k for k in step.compiled.kernels if k.phase == "backward"]
    assert backward and all(k.modules for k in backward), [(k.call, k.modules) for k in backward]
    assert step.compiled.unattributed_time_ns("backward") == 0


class _Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class _Renamed(_Plain):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.a(x)  # Dynamo names the graph's nodes after these locals
        hidden = torch.relu(hidden)
        out = self.b(hidden)
        return out


def test_two_forwards_of_one_structure_each_get_their_own_kernels_modules() -> None:
    # Inductor's graph cache keys a graph by its structure. A second forward of the same
    # layers, whose graph nodes are named after other locals (hidden, out, not linear,
    # relu), hit the first one's entry (in this process, or another's, from the cache on
    # disk) and replayed its provenance, which names the first graph's nodes: no kernel
    # had a module. layerscope's compile keeps that cache off.
    x = torch.randn(4, 16)
    for model in (_Plain(), _Renamed()):
        prof, _ = _compiled(model, x)
        kernels = prof.compiled.kernels
        assert kernels and all(k.modules for k in kernels), [(type(model).__name__, k.call, k.modules) for k in kernels]
        assert {"a", "b"} <= {path for k in kernels for path in k.modules}


@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled:UserWarning")
def test_a_compile_with_every_cache_off_is_profiled_per_module() -> None:
    # TORCHINDUCTOR_FORCE_DISABLE_CACHES=1, as users set it to debug a compile: before,
    # the graphs were named by their cache events, which a disabled cache never writes,
    # and the profile was refused ("made no Inductor graph ... layerscope can read").
    torch.manual_seed(0)
    with torch.compiler.config.patch(force_disable_caches=True):
        prof, eager = _compiled(_Plain(), torch.randn(4, 16))
    kernels = prof.compiled.kernels
    assert kernels and all(k.modules for k in kernels), [(k.call, k.modules) for k in kernels]
    _same_flops(prof, eager)


def test_a_model_compiled_in_place_is_profiled_from_its_kernels() -> None:
    # model.compile() was refused ("compiled with torch.compile, whose graphs replay
    # module hooks"); it is profiled as torch.compile(model) is, and left compiled.
    model, x = _zoo("mlp")
    model.compile()
    user_call = model._compiled_call_impl
    prof = check_tree(layerscope.profile(model, x, warmup=1, repeat=2))
    assert model._compiled_call_impl is user_call
    assert prof.compiled is not None and prof.compiled.kernels
    assert all(k.modules for k in prof.compiled.kernels), [(k.call, k.modules) for k in prof.compiled.kernels]
    _same_flops(prof, check_tree(layerscope.count_flops(_zoo("mlp")[0], x)))
    # FLOPs of a model compiled in place are its eager forward's too.
    _same_flops(check_tree(layerscope.count_flops(model, x)), check_tree(layerscope.count_flops(_zoo("mlp")[0], x)))
    assert model._compiled_call_impl is user_call


class _Checkpointed(nn.Module):
    """A block run under torch.utils.checkpoint (as transformers' gradient checkpointing
    runs each layer), which Dynamo traces whole into the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.b, torch.relu(self.a(x)), use_reentrant=False)


def test_a_checkpointed_regions_forward_kernels_reach_its_modules() -> None:
    # The provenance map names no Dynamo node for the nodes of a checkpointed region,
    # traced whole: its forward kernels had no module, and the block's forward time was
    # the model's (a transformers model with gradient checkpointing lost every layer's).
    # Each post-grad node's own module stands in.
    torch.manual_seed(0)
    model, x = _Checkpointed().train(), torch.randn(4, 16)
    step = check_tree(layerscope.profile(torch.compile(model), x, backward=True, warmup=1, repeat=2))
    forward = [k for k in step.compiled.kernels if k.phase == "forward"]
    assert any(path.startswith("b.") for k in forward for path in k.modules), [(k.call, k.modules) for k in forward]
    assert {"b.0", "b.2"} <= {path for k in forward for path in k.modules}
    eager = check_tree(layerscope.count_flops(model, x, backward=True))
    for node in eager.modules():
        assert step.node(node.path).forward.flops == node.forward.flops, node.path


def test_kernels_reach_modules_whatever_the_compiled_frame_calls_itself() -> None:
    # Dynamo names the frame's first local as the code does: L['fn'] for a module
    # compiled whole (a Sequential), L['s'] for a forward(s, x). Both map to the model's
    # paths; before, only L['self'] did, and every kernel stayed with the root.
    class Named(_Plain):
        def forward(s, x: torch.Tensor) -> torch.Tensor:
            return s.b(torch.relu(s.a(x)))

    for model in (nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)), Named()):
        prof, _ = _compiled(model, torch.randn(4, 16))
        assert prof.compiled is not None
        kernels = prof.compiled.kernels
        assert kernels and all(k.modules for k in kernels), [(k.call, k.modules) for k in kernels]
        first = "0" if isinstance(model, nn.Sequential) else "a"
        assert prof[first].forward.self_cpu_time_ns > 0
