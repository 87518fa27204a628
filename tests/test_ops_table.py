"""The operator table (``Profile.ops``, ``--format ops``): grouping, sorting, filters,
totals against the tree, errors, and golden text.

Real models throughout (the zoo, and small nets defined here whose ops can be counted by
hand); one hand-built tree checks FLOPs of ops with no formula.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
from layerscope import zoo
from layerscope.base.errors import OptionError
from layerscope.model.ops import SORT_KEYS, TORCH_SORT_KEYS, OpTableError, op_table
from layerscope.model.tree import ModuleNode, OpStats, PhaseStats, Profile
from layerscope.render import formats
from test_cli import FAST, assert_usage_error, run_cli


def _zoo_profile(name: str, clock: Any = None, **options: Any) -> Profile:
    entry = zoo.get(name)
    prof = layerscope.profile(entry.build(), entry.example_inputs(1), warmup=0, repeat=1, clock=clock, **options)
    layerscope.check_tree(prof)
    return prof


@pytest.fixture(scope="module")
def resnet18() -> Profile:
    from conftest import FakeClock

    return _zoo_profile("resnet18", FakeClock(), memory=False)


@pytest.fixture(scope="module")
def mlp_step() -> Profile:
    """An mlp forward + backward with memory tracked: every metric but device time."""
    from conftest import FakeClock

    return _zoo_profile("mlp", FakeClock(), backward=True)


def _every_op(prof: Profile, under: str | None = None) -> list[OpStats]:
    nodes = prof.nodes() if under is None else prof.node(under).walk()
    return [op for node in nodes for op in node.ops]


# -- grouping ---------------------------------------------------------------------------


def test_group_by_shape_splits_resnet18_convolutions(resnet18: Profile) -> None:
    by_name = {row.name: row for row in resnet18.ops(group_by="name")}
    convs = [row for row in resnet18.ops(group_by="shape") if row.name == "aten::convolution"]
    # (input, weight) of each conv, counted from torchvision's layout: the stem, layer1's
    # four 3x3 convs, then per later layer its first 3x3 (stride 2), the 1x1 downsample
    # and three 3x3 convs at the new width.
    expected = Counter({((1, 3, 224, 224), (64, 3, 7, 7)): 1, ((1, 64, 56, 56), (64, 64, 3, 3)): 4})
    for c_in, c_out, size in ((64, 128, 56), (128, 256, 28), (256, 512, 14)):
        expected[((1, c_in, size, size), (c_out, c_in, 3, 3))] = 1
        expected[((1, c_in, size, size), (c_out, c_in, 1, 1))] = 1
        expected[((1, c_out, size // 2, size // 2), (c_out, c_out, 3, 3))] = 3
    found = Counter({(tuple(r.input_shapes[0]), tuple(r.input_shapes[1])): r.calls for r in convs})
    assert found == expected
    assert len(convs) == 11
    assert sum(r.calls for r in convs) == by_name["aten::convolution"].calls == 20
    assert sum(r.flops or 0 for r in convs) == by_name["aten::convolution"].flops
    # Every op is in exactly one row, whatever the grouping.
    for group_by in ("name", "shape", "module", "module_type", "phase", ("module", "shape")):
        table = resnet18.ops(group_by=group_by)
        assert sum(r.calls for r in table) == table.total.calls == sum(o.calls for o in _every_op(resnet18))


def test_group_by_module_and_module_type(resnet18: Profile) -> None:
    by_module = resnet18.ops(group_by="module", sort_by="flops")
    assert by_module.columns[:3] == ["name", "module", "module_type"]
    convs = [r for r in by_module if r.name == "aten::convolution"]
    assert len(convs) == 20 and all(r.calls == 1 and r.modules == 1 for r in convs)
    assert {r.module_type for r in convs} == {"Conv2d"}
    assert {r.module for r in convs} == {n.path for n in resnet18.modules() if n.type == "Conv2d"}
    by_type = {(r.name, r.module_type): r for r in resnet18.ops(group_by="module_type")}
    bn = by_type[("aten::native_batch_norm", "BatchNorm2d")]
    assert bn.calls == 20 and bn.modules == 20 and bn.module is None


def test_combined_keys_as_tuple_or_commas(resnet18: Profile) -> None:
    a = resnet18.ops(group_by=("shape", "module"))
    b = resnet18.ops(group_by="module,shape")
    assert a.group_by == b.group_by == ("name", "module", "shape")
    assert [r.to_dict() for r in a] == [r.to_dict() for r in b]


def test_tiny_model_ops_counted_by_hand(fake_clock: Any) -> None:
    # nn.Linear(4, 3) on a 2x4 input runs aten::t and aten::addmm, then ReLU aten::relu.
    # addmm: 2*2*4*3 = 48 FLOPs for the product (24 MACs) + 2*3 = 6 for the bias = 54.
    # relu: one FLOP per element, 2*3 = 6.
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    prof = layerscope.profile(model, torch.ones(2, 4), warmup=0, repeat=1, clock=fake_clock, memory=False)
    layerscope.check_tree(prof)
    table = prof.ops(sort_by="flops")
    assert [(r.name, r.calls, r.flops, r.macs, r.modules) for r in table] == [
        ("aten::addmm", 1, 54, 24, 1),
        ("aten::relu", 1, 6, 0, 1),
        ("aten::t", 1, 0, 0, 1),
    ]
    # The fake clock moves 1000 ns per read and an op reads it twice.
    assert all(r.self_cpu_time_ns == r.cpu_time_ns == 1000 for r in table)
    total = table.total
    assert (total.calls, total.flops, total.macs, total.self_cpu_time_ns, total.modules) == (3, 60, 24, 3000, 2)
    assert total.alloc_bytes is None and total.self_device_time_ns is None


def test_totals_equal_the_tree(mlp_step: Profile, resnet18: Profile) -> None:
    for prof in (mlp_step, resnet18):
        table = prof.ops()
        ops = _every_op(prof)
        assert table.total.calls == sum(o.calls for o in ops)
        assert table.total.self_cpu_time_ns == sum(o.self_cpu_time_ns for o in ops)
        assert table.total.flops == sum(o.flops or 0 for o in ops)
        assert table.total.bytes == sum(o.bytes or 0 for o in ops)
        # The model's ops of one phase add up to the root's figures for that phase.
        for phase, stats in prof.root.phases():
            model = prof.ops(module="", phase=phase).total
            assert model.flops == stats.flops and model.macs == stats.macs, phase
            assert model.bytes == stats.bytes, phase
    step = mlp_step.ops(module="").total
    assert step.alloc_bytes == sum(s.alloc_bytes for _, s in mlp_step.root.phases())


# -- sorting ----------------------------------------------------------------------------


def test_sorting_by_every_metric_is_descending(mlp_step: Profile) -> None:
    for key, field in SORT_KEYS.items():
        if field in ("self_device_time_ns", "device_time_ns"):
            continue  # a CPU profile has none
        table = mlp_step.ops(sort_by=key, group_by="shape")
        assert table.sort_by == field
        values = [getattr(r, field) for r in table]
        assert values == sorted(values, reverse=True), key
        # Ties go by name, then key: the order depends on nothing else.
        for a, b in zip(table.rows, table.rows[1:]):
            if getattr(a, field) == getattr(b, field):
                assert a.name <= b.name, (key, a.name, b.name)
        same = mlp_step.ops(sort_by=field, group_by="shape")
        assert [r.to_dict() for r in same] == [r.to_dict() for r in table]
    for torch_name, field in TORCH_SORT_KEYS.items():
        if "cuda" not in torch_name and "device" not in torch_name:
            assert mlp_step.ops(sort_by=torch_name).sort_by == field


def test_default_sort_is_self_cpu_time_or_flops_when_untimed() -> None:
    entry = zoo.get("mlp")
    assert _zoo_profile("mlp").ops().sort_by == "self_cpu_time_ns"
    counted = layerscope.count_flops(entry.build(), entry.example_inputs(1))
    table = counted.ops()
    assert table.sort_by == "flops"
    assert "self_cpu_time_ns" not in table.columns and "Self CPU" not in table.render()
    with pytest.raises(OpTableError, match="not timed"):
        counted.ops(sort_by="self_cpu_time")


def test_alloc_sort_agrees_with_the_ops(mlp_step: Profile) -> None:
    table = mlp_step.ops(sort_by="alloc_bytes")
    expected: Counter[str] = Counter()
    for op in _every_op(mlp_step):
        expected[op.name] += op.alloc_bytes
    assert {r.name: r.alloc_bytes for r in table} == dict(expected)
    assert table.rows[0].alloc_bytes == max(expected.values()) > 0
    # torch.profiler's name for the same sort.
    torch_style = mlp_step.ops(sort_by="self_cpu_memory_usage")
    assert [r.name for r in torch_style] == [r.name for r in mlp_step.ops(sort_by="self_alloc_bytes")]
    # The ReLU's forward result (1 x 256 float32) is its one allocation (autograd's
    # aten::detach of it for backward is a view: no new storage).
    relu = mlp_step.ops(module="layers.1", phase="forward", sort_by="alloc_bytes")
    assert [(r.name, r.alloc_bytes) for r in relu] == [("aten::relu", 256 * 4), ("aten::detach", 0)]


# -- filters ----------------------------------------------------------------------------


def test_module_restricts_to_a_subtree(resnet18: Profile) -> None:
    layer1 = resnet18.ops(module="layer1")
    inside = [op for node in resnet18.nodes() if node.path.startswith("layer1.") for op in node.ops]
    assert layer1.total.calls == sum(o.calls for o in inside)
    assert {r.name for r in layer1} == {o.name for o in inside}
    conv = resnet18.ops(module="layer1.0.conv1", group_by="shape")
    assert [(r.name, r.calls, r.input_shapes[:2]) for r in conv] == [
        ("aten::convolution", 1, [[1, 64, 56, 56], [64, 64, 3, 3]])
    ]
    assert "module layer1.0.conv1" in conv.render()
    # The root's subtree is the model; module=None adds the step's parts.
    assert resnet18.ops(module="").total.calls == sum(o.calls for o in _every_op(resnet18, ""))


def test_phase_filter(mlp_step: Profile) -> None:
    forward = mlp_step.ops(phase="forward")
    backward = mlp_step.ops(phase="backward")
    # The step's parts outside the model (the loss's forward here) are a phase of their own.
    step = mlp_step.ops(phase="step")
    assert forward.total.calls + backward.total.calls + step.total.calls == mlp_step.ops().total.calls
    assert "aten::threshold_backward" in {r.name for r in backward}
    assert "aten::threshold_backward" not in {r.name for r in forward}
    loss_ops = {op.name for part in mlp_step.parts for node in part.walk() for op in node.ops if op.phase == "forward"}
    assert loss_ops and {r.name for r in step} == loss_ops
    by_phase = mlp_step.ops(group_by="phase")
    assert {r.phase for r in by_phase} == {"forward", "backward", "step"}


def test_limit_keeps_the_total(resnet18: Profile) -> None:
    whole = resnet18.ops(group_by="shape")
    top = resnet18.ops(group_by="shape", limit=3)
    assert len(top) == 3 and top.rows == whole.rows[:3]
    assert top.total == whole.total and top.matched == len(whole) > 3
    assert f"Showing 3 of {len(whole)} rows" in top.render()
    assert len(resnet18.ops(limit=0)) == 0


def test_a_profile_without_ops_gives_an_empty_table() -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    prof = layerscope.profile(model, torch.ones(2, 4), warmup=0, repeat=1, record_ops=False)
    table = prof.ops()
    assert len(table) == 0 and table.total.calls == 0
    assert "(no ops: profiled with record_ops=False)" in table.render()
    with pytest.raises(OpTableError, match="record_ops=False"):
        prof.ops(sort_by="flops")


# -- stacks -----------------------------------------------------------------------------


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _first(x: torch.Tensor) -> torch.Tensor:
    return _double(x)


def _second(x: torch.Tensor) -> torch.Tensor:
    return _double(x)


class StackNet(nn.Module):
    """aten::mul runs twice from ``_double``, called from two functions here. (torch's
    profiler records each Python frame by its function, at the line it starts.)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = _first(x)
        b = _second(a)
        return a + b


def test_group_by_stack_depth_splits_call_sites() -> None:
    prof = layerscope.profile(StackNet(), torch.ones(2, 2), warmup=0, repeat=1, with_stack=True)
    layerscope.check_tree(prof)
    one = [r for r in prof.ops(group_by="stack:1") if r.name == "aten::mul"]
    assert [(r.calls, len(r.stack)) for r in one] == [(2, 1)]
    line = _double.__code__.co_firstlineno
    assert one[0].stack[0].endswith(f"test_ops_table.py:{line} _double")
    two = [r for r in prof.ops(group_by="stack", stack_depth=2) if r.name == "aten::mul"]
    assert sorted(r.calls for r in two) == [1, 1]
    assert {r.stack[0] for r in two} == {one[0].stack[0]}  # the same inner frame ...
    callers = {r.stack[1] for r in two}  # ... called from two functions
    assert {c.rsplit(" ", 1)[1] for c in callers} == {"_first", "_second"}
    assert prof.ops(group_by="stack:2").group_by == ("name", "stack")
    # No cap on the depth; plain "stack" keeps the whole stack.
    deep = prof.ops(group_by="stack:1000")
    assert [r.stack for r in deep] == [r.stack for r in prof.ops(group_by="stack")]
    text = prof.ops(group_by="stack:2").render()
    assert "Stack" in text and " _double" in text and " _first" in text and " _second" in text


def test_group_by_stack_without_stacks_says_how(resnet18: Profile) -> None:
    with pytest.raises(OpTableError, match="with_stack=True"):
        resnet18.ops(group_by="stack:2")


# -- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"sort_by": "speed"}, ["unknown sort_by key 'speed'", "self_cpu_time", "alloc_bytes"]),
        ({"group_by": "layer"}, ["unknown group_by key 'layer'", "shape", "stack:N"]),
        ({"group_by": "stack:0"}, ["at least 1 frame"]),
        ({"group_by": "stack:two"}, ["whole number"]),
        ({"group_by": "shape:2"}, ["no ':' argument"]),
        ({"stack_depth": 2}, ["only with group_by='stack'"]),
        ({"sort_by": "self_device_time"}, ["no device time", "sort by one of: self_cpu_time"]),
        ({"sort_by": "alloc_bytes"}, ["no memory figures", "memory=False"]),
        ({"module": "layer1.0.conv9"}, ["no module at path 'layer1.0.conv9'", "'layer1.0.conv1'"]),
        ({"phase": "fwd"}, ["unknown phase 'fwd'", "forward"]),
        ({"limit": -1}, ["limit must be"]),
    ],
)
def test_bad_options_name_the_problem(resnet18: Profile, options: dict[str, Any], expected: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        resnet18.ops(**options)
    assert isinstance(info.value, layerscope.LayerscopeError)
    for part in expected:
        assert part in str(info.value)


# -- ops with no FLOP formula -----------------------------------------------------------


def _hand_built() -> Profile:
    # aten::foo has a formula for one shape (10 FLOPs) but raised for the other (2 calls).
    ops = [
        OpStats("aten::foo", calls=2, cpu_time_ns=40, self_cpu_time_ns=40, input_shapes=[[2]], flops=None, macs=None, bytes=8),
        OpStats("aten::foo", calls=1, cpu_time_ns=10, self_cpu_time_ns=10, input_shapes=[[1]], flops=10, macs=5, bytes=4),
        OpStats("aten::bar", calls=1, cpu_time_ns=30, self_cpu_time_ns=30, input_shapes=[[1]], flops=None, macs=None, bytes=4),
    ]
    stats = PhaseStats(
        cpu_time_ns=80, self_cpu_time_ns=80, flops=10, self_flops=10, macs=5, self_macs=5, bytes=16, self_bytes=16
    )
    root = ModuleNode("", "Hand", forward=stats, ops=ops, unsupported_ops={"aten::foo": 2, "aten::bar": 1}, calls=1)
    prof = Profile(root, meta={"model": "Hand", "device": "cpu"})
    layerscope.check_tree(prof)
    return prof


def test_unsupported_calls_are_counted_never_zero() -> None:
    prof = _hand_built()
    by_name = {r.name: r for r in prof.ops()}
    assert (by_name["aten::foo"].flops, by_name["aten::foo"].unsupported_calls) == (10, 2)
    assert (by_name["aten::bar"].flops, by_name["aten::bar"].unsupported_calls) == (None, 1)
    assert prof.ops().total.flops == prof.root.forward.flops == 10
    assert prof.ops().total.unsupported_calls == 3
    text = prof.ops().render()
    assert re.search(r"aten::foo .*\| +10\+\? \|", text)  # a lower bound, marked
    assert re.search(r"aten::bar .*\| +\? \|", text)  # unknown, never 0
    assert "Ops not counted in FLOPs (no formula, or their shapes not recorded): aten::bar x1, aten::foo x2" in text
    by_shape = [(r.name, r.flops, r.unsupported_calls) for r in prof.ops(group_by="shape", sort_by="calls")]
    assert by_shape == [("aten::foo", None, 2), ("aten::bar", None, 1), ("aten::foo", 10, 0)]


def test_device_columns_on_a_hand_built_accelerator_profile() -> None:
    # This machine may have no GPU: the device columns are checked on a tree built by hand.
    ops = [
        OpStats("aten::mm", calls=2, cpu_time_ns=20, self_cpu_time_ns=20, device_time_ns=300, self_device_time_ns=300),
        OpStats("aten::add", calls=1, cpu_time_ns=30, self_cpu_time_ns=30, device_time_ns=100, self_device_time_ns=100),
    ]
    stats = PhaseStats(cpu_time_ns=50, self_cpu_time_ns=50, device_time_ns=400, self_device_time_ns=400)
    prof = Profile(ModuleNode("", "Hand", forward=stats, ops=ops, calls=1), meta={"model": "Hand", "device": "cuda"})
    layerscope.check_tree(prof)
    table = prof.ops(sort_by="self_device_time")
    assert [r.name for r in table] == ["aten::mm", "aten::add"]
    assert [r.name for r in prof.ops()] == ["aten::add", "aten::mm"]  # by self CPU time
    assert table.rows[0].device_time_avg_ns == 150 and table.total.self_device_time_ns == 400
    body, total = _read_table(table.render())
    assert [r["Self Device %"] for r in body] == ["75.0%", "25.0%"]
    assert (body[0]["Self Device"], body[0]["Device avg"], total["Self Device"]) == ("300ns", "150ns", "400ns")
    assert "Device total" not in body[0]  # equal to Self Device for ops, which do not nest


# -- outputs ----------------------------------------------------------------------------


def test_to_dict_is_json_ready(mlp_step: Profile) -> None:
    table = mlp_step.ops(group_by="shape", limit=4)
    doc = json.loads(json.dumps(table.to_dict()))
    assert doc["group_by"] == ["name", "shape"] and doc["sort_by"] == "self_cpu_time_ns"
    assert len(doc["rows"]) == 4 and doc["matched"] == table.matched
    assert list(doc["rows"][0]) == table.columns == doc["columns"]
    assert doc["total"]["calls"] == table.total.calls
    assert "self_device_time_ns" not in table.columns  # a CPU run has no device columns


def test_to_dataframe(mlp_step: Profile) -> None:
    pytest.importorskip("pandas")
    table = mlp_step.ops(group_by="module", limit=5)
    frame = table.to_dataframe()
    assert list(frame.columns) == table.columns
    assert len(frame) == len(table) == 5
    assert frame["calls"].tolist() == [r.calls for r in table]
    assert {"name", "module", "module_type", "alloc_bytes", "flops", "modules"} <= set(frame.columns)


def test_to_dataframe_without_pandas_says_what_to_install(mlp_step: Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    table = mlp_step.ops()
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if pandas were not installed
    with pytest.raises(ImportError, match=r"pip install 'layerscope\[pandas\]'"):
        table.to_dataframe()


def test_renderer_is_registered_and_refuses_other_formats_options(resnet18: Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "ops" in formats()
    text = resnet18.render("ops", group_by="shape", limit=3)
    assert text == resnet18.ops(group_by="shape", limit=3).render()
    # print() fits a width: the terminal's, or 120 where stdout is none.
    monkeypatch.setattr("layerscope.base.formats.terminal_width", lambda: None)
    assert str(resnet18.ops(group_by="shape", limit=3)) == resnet18.render("ops", group_by="shape", limit=3, width=120)
    with pytest.raises(OptionError, match="the ops format has no option 'depth', 'show_ops'; it takes: sort_by"):
        resnet18.render("ops", group_by="shape", depth=2, show_ops=True)
    assert layerscope.render.render(resnet18, "ops") == op_table(resnet18).render()


def test_rendering_is_deterministic() -> None:
    from conftest import FakeClock

    texts = [_zoo_profile("lenet5", FakeClock()).render("ops", group_by="shape") for _ in range(2)]
    assert texts[0] == texts[1]
    prof = _zoo_profile("gpt", FakeClock())
    for options in ({}, {"group_by": "module,shape"}, {"sort_by": "flops", "limit": 5}):
        assert prof.render("ops", **options).encode() == prof.render("ops", **options).encode()


# -- golden files ----------------------------------------------------------------------


def _lenet5(clock: Any, **options: Any) -> Profile:
    entry = zoo.get("lenet5")
    prof = layerscope.profile(entry.build(), entry.example_inputs(1), warmup=1, repeat=3, clock=clock, **options)
    layerscope.check_tree(prof)
    return prof


def _read_table(text: str) -> tuple[list[dict[str, str]], dict[str, str]]:
    """The body rows and the Total row of a rendered op table, as header -> cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Name "))
    headers = [h.strip() for h in lines[start].split(" | ")]
    rules = [i for i, line in enumerate(lines) if i > start and set(line) <= {"-", "|"} and line]
    assert rules[0] == start + 1 and len(rules) == 2

    def cells(line: str) -> dict[str, str]:
        values = [c.strip() for c in line.split(" | ")]
        return dict(zip(headers, values + [""] * (len(headers) - len(values))))

    body = [cells(line) for line in lines[rules[0] + 1 : rules[1]] if not line.startswith(" ")]
    return body, cells(lines[rules[1] + 1])


def _check_printed_sums(text: str) -> None:
    body, total = _read_table(text)
    assert sum(int(r["Calls"]) for r in body) == int(total["Calls"])
    if "Self CPU %" in total:
        percents = sum(float(r["Self CPU %"].rstrip("%")) for r in body)
        assert abs(percents - 100.0) <= 0.05 * len(body) + 1e-9, percents


def test_golden_lenet5_by_name(fake_clock: Any, golden: Any) -> None:
    text = _lenet5(fake_clock, memory=False).render("ops")
    golden("ops_lenet5_by_name.out", text)
    _check_printed_sums(text)


def test_golden_lenet5_by_shape(fake_clock: Any, golden: Any) -> None:
    text = _lenet5(fake_clock, memory=False).render("ops", group_by="shape")
    golden("ops_lenet5_by_shape.out", text)
    _check_printed_sums(text)
    body, _ = _read_table(text)
    assert [r["Input shapes"] for r in body if r["Name"] == "aten::convolution"] == [
        "[[1, 1, 32, 32], [6, 1, 5, 5], [6]]",
        "[[1, 6, 14, 14], [16, 6, 5, 5], [16]]",
    ]


def test_golden_lenet5_memory_by_alloc(fake_clock: Any, golden: Any) -> None:
    prof = _lenet5(fake_clock)
    text = prof.render("ops", sort_by="alloc_bytes", group_by="module")
    golden("ops_lenet5_memory_alloc.out", text)
    body, total = _read_table(text)
    assert len(body) == len(prof.ops(group_by="module"))
    assert total["Alloc"] == layerscope.base.fmt.nbytes(sum(o.alloc_bytes for o in _every_op(prof)))


# -- command line ----------------------------------------------------------------------


def test_cli_format_ops_grouped_by_shape(tmp_path: Path) -> None:
    run = run_cli(
        "profile", "zoo:lenet5", *FAST, "--format", "ops", "--sort-by", "flops", "--group-by", "shape",
        "--limit", "4", cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    body, _ = _read_table(run.stdout)
    assert "Input shapes" in body[0] and len(body) == 4
    assert [r["Name"] for r in body[:2]] == ["aten::convolution", "aten::convolution"]
    assert "sorted by flops" in run.stdout and "Showing 4 of" in run.stdout
    run = run_cli("profile", "zoo:lenet5", *FAST, "--format", "ops", "--module", "classifier", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "aten::convolution" not in run.stdout and "aten::addmm" in run.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--sort-by", "flops"), "--sort-by: only for --format ops"),
        (("--format", "ops", "--sort-by", "device_time"), "no device time"),
        (("--format", "ops", "--module", "clasifier"), "did you mean 'classifier'"),
    ],
)
def test_cli_bad_op_table_options(tmp_path: Path, args: tuple[str, ...], expected: str) -> None:
    line = assert_usage_error(run_cli("profile", "zoo:lenet5", *FAST, *args, cwd=tmp_path))
    assert expected in line


def test_the_title_names_the_sort_key_a_person_types(resnet18: Profile) -> None:
    """Text says ``self_cpu_time`` (``--sort-by``'s key) where the data says
    ``self_cpu_time_ns`` (the JSON's and CSV's field), whichever was given."""
    for given in (None, "self_cpu_time", "self_cpu_time_ns", "self_cpu_time_total"):
        table = resnet18.ops(sort_by=given, limit=2)
        assert table.sort_by == "self_cpu_time_ns" and table.to_dict()["sort_by"] == "self_cpu_time_ns"
        assert "sorted by self_cpu_time, descending" in table.render(), given
    assert "sorted by flops, descending" in resnet18.render("ops", sort_by="flops", limit=2)


def test_rows_that_sum_several_phases_say_which(mlp_step: Profile) -> None:
    """Grouped by module and shape in a training step, each row names the phases of
    its ops (the Linear's forward addmm, its backward mm); grouped by phase, the column
    is the key itself."""
    table = mlp_step.ops(group_by="module,shape")
    assert table.columns[1] == "phase"
    phases = {(row.name, row.phase) for row in table}
    assert ("aten::addmm", "forward") in phases and ("aten::mm", "backward") in phases
    assert {row.phase for row in table} <= {"forward", "backward", "step", "forward+backward", "backward+step",
                                              "forward+step", "forward+backward+step"}
    assert all(row.phase is None for row in mlp_step.ops(group_by="module", phase="forward"))
