"""The torch.profiler recipe's calls on ``layerscope.Profiler``.

The seed script (seeds/001) runs first, section by section, with the zoo's AlexNet (a
batch of 1 instead of ResNet-18's 5: timing is not the point); then goldens of the table
with a fake clock (LeNet-5), the argument handling, and the no-side-effect snapshot.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, record_function

import layerscope
from conftest import FakeClock
from layerscope import zoo
from layerscope.compat.torch_profiler import as_schedule, key_averages
from layerscope.render.stacks import MetricError
from test_no_side_effects import X4, Failing, assert_unchanged, everything, snapshot

# Output bytes of AlexNet's five convolutions at batch 1 (float32): 64x55x55, 192x27x27,
# 384x13x13, 256x13x13, 256x13x13.
CONV_OUTPUT_BYTES = 4 * (64 * 55 * 55 + 192 * 27 * 27 + 384 * 13 * 13 + 2 * 256 * 13 * 13)  # 1,939,968


@pytest.fixture(scope="module")
def alexnet() -> nn.Module:
    return zoo.get("alexnet").build().eval()


@pytest.fixture(scope="module")
def inputs() -> torch.Tensor:
    return torch.randn(1, 3, 224, 224)


def _rows(table: str) -> list[list[str]]:
    """A torch-style table's body rows, as cells split on runs of 2+ spaces."""
    lines = table.splitlines()
    rules = [n for n, line in enumerate(lines) if line.startswith("---")]
    return [re.split(r"\s{2,}", line.strip()) for line in lines[rules[1] + 1 : rules[2]] if line.strip()]


def _header(table: str) -> list[str]:
    return re.split(r"\s{2,}", table.splitlines()[1].strip())


# -- the seed's script ----------------------------------------------------------------


def test_seed_execution_time(alexnet: nn.Module, inputs: torch.Tensor) -> None:
    model = alexnet
    with layerscope.Profiler(model, activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with record_function("model_inference"):
            model(inputs)
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=10)
    assert _header(table)[:6] == ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    rows = _rows(table)
    assert len(rows) == min(10, len(prof.key_averages()))
    calls = {row[0]: int(row[-1]) for row in rows}
    assert calls["aten::convolution"] == 5 and calls["aten::addmm"] == 3
    assert table.splitlines()[-1].startswith("Self CPU time total: ")
    self_sorted = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
    assert [row[0] for row in _rows(self_sorted)] == [row[0] for row in rows]  # ops never nest here

    by_shape = prof.key_averages(group_by_input_shape=True).table(sort_by="cpu_time_total", row_limit=10)
    assert _header(by_shape)[-1] == "Input Shapes"
    assert "aten::convolution" in {row[0] for row in _rows(by_shape)}
    shapes = [e.input_shapes for e in prof.key_averages(group_by_input_shape=True) if e.key == "aten::convolution"]
    assert len(shapes) == 5  # one row per convolution: their input shapes all differ
    assert [[1, 3, 224, 224], [64, 3, 11, 11], [64]] in shapes

    # On the CPU there is no CUDA time to sort by: the default order, and a note saying so.
    on_cuda = prof.key_averages().table(sort_by="cuda_time_total", row_limit=10)
    assert "cannot sort by 'cuda_time_total'" in on_cuda.splitlines()[-1]
    assert _rows(on_cuda) == _rows(self_sorted)
    # The record_function label is a node of the tree (a step part around the model), not an op row.
    assert "model_inference" in {node.name.strip("<>") for node in prof.profile.nodes()}
    assert "model_inference" not in table


def test_seed_memory(alexnet: nn.Module, inputs: torch.Tensor) -> None:
    model = alexnet
    with layerscope.Profiler(
        model, activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True
    ) as prof:
        model(inputs)
    table = prof.key_averages().table(sort_by="self_cpu_memory_usage", row_limit=10)
    header = _header(table)
    assert header[6:9] == ["CPU Mem", "Self CPU Mem", "# of Calls"]
    rows = _rows(table)
    conv = next(row for row in rows if row[0] == "aten::convolution")
    assert CONV_OUTPUT_BYTES == 1_939_968
    assert conv[7] == f"{CONV_OUTPUT_BYTES / 1024**2:.2f} MB" == "1.85 MB"
    total_sorted = prof.key_averages().table(sort_by="cpu_memory_usage", row_limit=10)
    assert _rows(total_sorted)[0][0] == rows[0][0]
    assert next(e for e in prof.key_averages() if e.key == "aten::convolution").cpu_memory_usage == CONV_OUTPUT_BYTES


def test_seed_tracing_stacks_and_flamegraph(alexnet: nn.Module, inputs: torch.Tensor, tmp_path: Path) -> None:
    model = alexnet
    with layerscope.Profiler(model, activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        model(inputs)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    trace = json.loads((tmp_path / "trace.json").read_text(encoding="utf-8"))
    assert any(event["name"] == "aten::convolution" for event in trace["traceEvents"])

    table = prof.key_averages(group_by_stack_n=5).table(sort_by="self_cuda_time_total", row_limit=2)
    assert _header(table)[-1] == "Source Location"
    assert "torch_profiler.py:" in table  # this file, its path cut from the left to fit

    stacks = tmp_path / "profiler_stacks.txt"
    prof.export_stacks(str(stacks), "self_cpu_time_total")
    lines = stacks.read_text(encoding="utf-8").splitlines()
    # What flamegraph.pl reads: frames joined by ';', a space, a whole number.
    assert lines and all(re.fullmatch(r"[^;\s]+(;[^;]+)* \d+", line) for line in lines)
    assert "AlexNet;features;0;aten::convolution" in {line.rsplit(" ", 1)[0] for line in lines}
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) == round(prof.step_time_ns / 1000)  # the block's step
    with pytest.raises(MetricError, match="no device_time"):
        prof.export_stacks(str(stacks), "self_cuda_time_total")


def test_seed_long_running_job(alexnet: nn.Module, inputs: torch.Tensor, tmp_path: Path) -> None:
    model = alexnet
    seen: list[tuple[int, int]] = []

    def trace_handler(p: Any) -> None:
        output = p.key_averages().table(sort_by="self_cuda_time_total", row_limit=10)
        seen.append((p.step_num, int(_rows(output)[0][-1])))
        p.export_chrome_trace(str(tmp_path / f"trace_{p.step_num}.json"))

    with torch.no_grad(), layerscope.Profiler(
        model,
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=2),
        on_trace_ready=trace_handler,
    ) as p:
        for _ in range(8):
            model(inputs)
            p.step()
    # As in torch: a cycle ends after steps 3 and 7, when step_num is already 4 and 8.
    assert [step for step, _ in seen] == [4, 8]
    assert {path.name for path in tmp_path.iterdir()} == {"trace_4.json", "trace_8.json"}
    assert p.meta.schedule == "cycles of (wait 1, warm up 1, record 2) forever"
    assert p.step_num == 8


# -- goldens --------------------------------------------------------------------------


def lenet_block(**options: Any) -> layerscope.Profiler:
    torch.manual_seed(0)
    entry = zoo.get("lenet5")
    model, x = entry.build().eval(), entry.example_inputs(2)
    with layerscope.Profiler(model, clock=FakeClock(), **options) as prof:
        model(x)
    return prof


def test_golden_tables(golden: Any) -> None:
    prof = lenet_block(profile_memory=True)
    golden("torch_table_lenet5.out", prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=5))
    golden(
        "torch_table_lenet5_shapes_memory.out",
        prof.key_averages(group_by_input_shape=True).table(sort_by="cpu_memory_usage"),
    )
    golden("torch_table_lenet5_cuda_on_cpu.out", prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=3))
    # Shares add up: the Self CPU % of all rows is 100 (to rounding).
    full = prof.key_averages().table()
    assert abs(sum(float(row[1].rstrip("%")) for row in _rows(full)) - 100) < 0.05
    # Torch's other attributes sort on the events themselves (here: the average).
    by_avg = prof.key_averages().table(sort_by="cpu_time")
    averages = [float(row[5].rstrip("us")) for row in _rows(by_avg)]
    assert averages == sorted(averages, reverse=True)


def test_key_averages_without_memory_hides_its_columns() -> None:
    table = lenet_block(profile_memory=False).key_averages().table()
    assert "CPU Mem" not in table


# -- arguments --------------------------------------------------------------------------


def test_torch_schedules_become_layerscope_schedules() -> None:
    ours = layerscope.schedule(wait=1, warmup=1, active=2, repeat=3, skip_first=2)
    theirs = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=3, skip_first=2)
    assert as_schedule(theirs) == ours
    # A torch schedule layerscope cannot express stays a callable, read step by step.
    odd = torch.profiler.schedule(wait=1, warmup=1, active=2, skip_first=2, skip_first_wait=1)
    assert as_schedule(odd) is odd


def test_bad_arguments() -> None:
    model = nn.Linear(4, 4)
    with pytest.raises(TypeError, match="not both"):
        layerscope.Profiler(model, on_ready=print, on_trace_ready=print)
    with pytest.raises(ValueError, match="activity"):
        layerscope.Profiler(model, activities=["GPU"])
    prof = lenet_block()
    with pytest.raises(ValueError, match="unknown metric"):
        prof.export_stacks("x.txt", "flops")
    with pytest.raises(ValueError, match="stack"):
        prof.key_averages(group_by_stack_n=2)  # needs with_stack=True
    assert key_averages(prof.profile)[0].key == prof.key_averages()[0].key


# -- no side effects -------------------------------------------------------------------


def test_recipe_block_leaves_no_trace(tmp_path: Path) -> None:
    model = everything("mixed")
    before = snapshot(model, values=False)  # the block runs the user's own forward
    delivered: list[int] = []
    with layerscope.Profiler(
        model, activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1),
        on_trace_ready=lambda p: delivered.append(p.step_num),
    ) as prof:
        for _ in range(3):
            model(X4)
            prof.step()
    prof.key_averages(group_by_input_shape=True, group_by_stack_n=3).table()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    prof.export_stacks(str(tmp_path / "s.txt"))
    assert delivered == [2]
    assert_unchanged(before, snapshot(model, values=False))


def test_raising_forward_leaves_no_trace() -> None:
    boom = ValueError("boom")
    model = Failing(boom)
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"^boom(\n|$)"), layerscope.Profiler(
        model, activities=[ProfilerActivity.CPU], profile_memory=True, on_trace_ready=lambda p: None
    ) as prof:
        model(X4)
    assert_unchanged(before, snapshot(model))
    assert "aten::addmm" in prof.key_averages().table()
