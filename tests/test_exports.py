"""Folded stacks, speedscope and CSV: exact sums, well-formed files, golden output.

Every export is read back: folded lines are parsed into stacks and summed, the speedscope
file is checked field by field against its schema, the CSV is read with ``csv.DictReader``
and compared with the profile's own numbers.

flamegraph.pl and inferno are not run here: neither is installed on the machines these
tests run on, so each line is checked against the grammar they parse instead
(``^[^\\n]+ \\d+$``, value after the last space).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import layerscope
from layerscope import zoo
from layerscope.model.check import check_tree
from layerscope.model.sidedocs import Trace
from layerscope.model.tree import ModuleNode, OpStats, PhaseStats, Profile, link
from layerscope.render import format_for_path, formats, get_renderer
from layerscope.render.stacks import METRICS, MetricError, build_stacks, sanitize
from test_cli import FAST, assert_usage_error, run_cli

FOLDED_LINE = re.compile(r"^[^\n]+ \d+$")


def half_up_us(ns: int) -> int:
    """Nanoseconds to whole microseconds, halves rounded up (as the folded export does)."""
    return (ns + 500) // 1000


def folded_lines(text: str) -> list[tuple[tuple[str, ...], int]]:
    """Parse folded text as flamegraph.pl does: the value follows the last space."""
    assert text, "empty folded output"
    assert text.endswith("\n")
    parsed = []
    for line in text[:-1].split("\n"):
        assert FOLDED_LINE.match(line), repr(line)
        stack, value = line.rsplit(" ", 1)
        frames = tuple(stack.split(";"))
        assert all(frame and frame == frame.strip() for frame in frames), repr(line)
        assert int(value) > 0, repr(line)
        parsed.append((frames, int(value)))
    assert len({frames for frames, _ in parsed}) == len(parsed), "a stack appears twice"
    return parsed


def subtree_value(text: str, prefix: tuple[str, ...]) -> int:
    """The value of every stack under ``prefix``: what a flame graph shows for that frame."""
    return sum(value for frames, value in folded_lines(text) if frames[: len(prefix)] == prefix)


def every_self(profile: Profile, field: str) -> int:
    return sum(getattr(stats, field) or 0 for node in profile.nodes() for _, stats in node.phases())


def whole_time_ns(profile: Profile) -> int:
    return profile.step_time_ns or profile.root.forward.cpu_time_ns


# -- profiles -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def resnet_forward() -> Profile:
    # profile(): module and op times from one pass, the median.
    entry = zoo.get("resnet18")
    return check_tree(layerscope.profile(entry.build(), entry.example_inputs(1), warmup=1, repeat=1))


@pytest.fixture(scope="module")
def gpt_backward() -> Profile:
    entry = zoo.get("gpt")
    return check_tree(
        layerscope.profile(entry.build(), entry.example_inputs(1), warmup=1, repeat=1, backward=True)
    )


@pytest.fixture(scope="module")
def mlp_step() -> Profile:
    entry = zoo.get("mlp")
    model, inputs = entry.build(), entry.example_inputs(4)
    optimizer = torch.optim.Adam(model.parameters())
    with layerscope.Profiler(model) as prof:
        model(inputs).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return check_tree(prof.profile)


REAL = ["resnet_forward", "gpt_backward", "mlp_step"]


@pytest.fixture(params=REAL)
def real(request: pytest.FixtureRequest) -> Profile:
    return request.getfixturevalue(request.param)


def hand_built() -> Profile:
    """Net (self 1500 ns: view 500) > blocks (ModuleList) > 0 (self 2000 ns; its ops took
    1500 + 1500 ns, more than its self time, as in a file an older layerscope wrote with
    ops from a pass of their own) > a label with a ``;`` and a
    line break in its name (self 300 ns)."""

    def stats(total: int, own: int, flops: int, self_flops: int) -> PhaseStats:
        return PhaseStats(cpu_time_ns=total, self_cpu_time_ns=own, flops=flops, self_flops=self_flops)

    label = ModuleNode(
        "blocks.0[a;b\nc ]", "label", parent="blocks.0", depth=3, calls=1, kind="label",
        forward=stats(300, 300, 0, 0),
    )
    block = ModuleNode(
        "blocks.0", "Linear", parent="blocks", depth=2, calls=1, params=6, params_total=6,
        forward=stats(2300, 2000, 12, 12),
        ops=[
            OpStats("aten::addmm", calls=1, cpu_time_ns=1500, self_cpu_time_ns=1500, flops=12,
                    stack=["model.py:12 forward", "train.py:3 main"]),
            OpStats("aten::t", calls=1, cpu_time_ns=1500, self_cpu_time_ns=1500, flops=0),
        ],
    )
    blocks = ModuleNode(
        "blocks", "ModuleList", parent="", depth=1, params_total=6, forward=stats(2300, 0, 12, 0)
    )
    root = ModuleNode(
        "", "Net", calls=1, params_total=6, forward=stats(3800, 1500, 12, 0),
        ops=[OpStats("aten::view", calls=1, cpu_time_ns=500, self_cpu_time_ns=500, flops=0)],
    )
    link([root, blocks, block, label])
    return check_tree(Profile(root, meta={"model": "Net"}))


# -- folded ---------------------------------------------------------------------------


def test_hand_built_folded_scales_ops_to_fit_and_names_frames() -> None:
    # Stacks in ns: Net 1000, Net;aten::view 500, blocks.0's ops scaled from 1500 + 1500
    # to 1000 + 1000 (its own line gets 0 and is left out), the label 300. Total 3800 ns.
    # Cumulative µs: round(1.0)=1, round(1.5)=2, round(2.5)=3, round(3.5)=4, round(3.8)=4.
    assert hand_built().render("folded") == (
        "Net 1\n"
        "Net;aten::view 1\n"
        "Net;blocks;0;aten::addmm 1\n"
        "Net;blocks;0;aten::t 1\n"
    )
    # The label's 300 ns round to nothing above; in FLOPs every stack is exact.
    assert hand_built().render("folded", metric="flops") == "Net;blocks;0;aten::addmm 12\n"


def test_hand_built_label_frame_is_sanitized() -> None:
    profile = hand_built()
    for path in ("blocks.0[a;b\nc ]", "blocks.0", "blocks", ""):
        profile.node(path).forward.cpu_time_ns += 2700
    profile.node("blocks.0[a;b\nc ]").forward.self_cpu_time_ns += 2700
    check_tree(profile)
    lines = folded_lines(profile.render("folded"))
    # ";" would split the frame and a line break the line.
    assert (("Net", "blocks", "0", "[a:b c ]"), 3) in lines
    assert sum(value for _, value in lines) == half_up_us(6500)
    # A trailing space would sit before the value; an empty name would be an empty frame.
    assert [sanitize(name) for name in ("x;y\r\n ", " \t", "a\x00b")] == ["x:y", "?", "a b"]


def test_folded_time_sums_exactly_to_the_total(real: Profile) -> None:
    text = real.render("folded")
    assert sum(value for _, value in folded_lines(text)) == half_up_us(whole_time_ns(real))
    assert every_self(real, "self_cpu_time_ns") == whole_time_ns(real)


def test_forward_only_profile_has_no_phase_frames(resnet_forward: Profile) -> None:
    lines = folded_lines(resnet_forward.render("folded"))
    assert {frames[0] for frames, _ in lines} == {"ResNet"}
    assert any(frames[-1] == "aten::convolution" for frames, _ in lines)
    # The module's own line and its op lines (consecutive) add up to its self time.
    for node in resnet_forward.modules():
        prefix = ("ResNet", *node.path.split(".")) if node.path else ("ResNet",)
        own = sum(
            value for frames, value in lines
            if frames == prefix or (frames[:-1] == prefix and frames[-1].startswith("aten::"))
        )
        assert abs(own * 1000 - node.forward.self_cpu_time_ns) < 1000, node.path


def test_backward_profile_starts_stacks_with_the_phase(gpt_backward: Profile) -> None:
    roots = {frames[0] for frames, _ in folded_lines(gpt_backward.render("folded"))}
    assert {"forward", "backward"} <= roots
    assert roots - {"forward", "backward"} <= {part.path for part in gpt_backward.parts}
    assert "<loss>" in roots


def test_training_step_parts_are_roots(mlp_step: Profile) -> None:
    lines = folded_lines(mlp_step.render("folded"))
    assert any(frames[0] == "<optimizer:Adam>" and frames[-1].startswith("aten::") for frames, _ in lines)
    assert ("forward", "MLP", "layers", "2", "aten::addmm") in {frames for frames, _ in lines}


def test_parsed_back_a_node_holds_its_total(mlp_step: Profile) -> None:
    text = mlp_step.render("folded")
    for path, prefix in (("layers.2", ("layers", "2")), ("layers", ("layers",)), ("", ())):
        node = mlp_step.node(path)
        for phase, stats in node.phases():
            # A node's stacks are consecutive lines, so cumulative rounding moves their
            # sum by less than a microsecond from the node's total.
            value = subtree_value(text, (phase, "MLP", *prefix))
            assert abs(value * 1000 - stats.cpu_time_ns) < 1000, (path, phase)
    flops = mlp_step.render("folded", metric="flops")
    assert subtree_value(flops, ("backward", "MLP", "layers", "2")) == mlp_step.node("layers.2").backward.flops
    assert subtree_value(flops, ("forward", "MLP")) == mlp_step.root.forward.flops
    optimizer = next(part for part in mlp_step.parts if part.kind == "optimizer")
    assert subtree_value(flops, (optimizer.path,)) == optimizer.forward.flops


def test_folded_flops_sum_to_every_phase_and_part(real: Profile) -> None:
    lines = folded_lines(real.render("folded", metric="flops"))
    total = real.root.forward.flops + (real.root.backward.flops if real.root.backward else 0)
    total += sum(stats.flops for part in real.parts for _, stats in part.phases())
    assert sum(value for _, value in lines) == total == every_self(real, "self_flops")


def test_metric_errors() -> None:
    with pytest.raises(MetricError, match="unknown metric 'bytes'"):
        hand_built().render("folded", metric="bytes")
    entry = zoo.get("lenet5")
    untimed = layerscope.count_flops(entry.build(), entry.example_inputs(1))
    with pytest.raises(MetricError, match="no time"):
        untimed.render("folded", metric="time")
    # An untimed count exports its FLOPs by default.
    assert untimed.render("folded") == untimed.render("folded", metric="flops")
    no_ops = layerscope.profile(entry.build(), entry.example_inputs(1), warmup=0, repeat=1, record_ops=False)
    with pytest.raises(MetricError, match="no flops"):
        no_ops.render("folded", metric="flops")
    assert [p["unit"] for p in json.loads(untimed.render("speedscope"))["profiles"]] == ["none"]
    assert [p["unit"] for p in json.loads(no_ops.render("speedscope"))["profiles"]] == ["nanoseconds"]


# -- speedscope -----------------------------------------------------------------------


def check_speedscope(text: str) -> dict[str, Any]:
    """The fields https://www.speedscope.app/file-format-schema.json requires, typed."""
    doc = json.loads(text)
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    assert isinstance(doc["name"], str) and doc["exporter"].startswith("layerscope ")
    frames = doc["shared"]["frames"]
    for frame in frames:
        assert isinstance(frame["name"], str) and frame["name"]
        assert set(frame) <= {"name", "file", "line", "col"}
        assert all(isinstance(v, str) for k, v in frame.items() if k in ("name", "file"))
    assert doc["profiles"] and 0 <= doc["activeProfileIndex"] < len(doc["profiles"])
    for profile in doc["profiles"]:
        assert profile["type"] == "sampled"
        assert isinstance(profile["name"], str)
        assert profile["unit"] in ("none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes")
        assert len(profile["samples"]) == len(profile["weights"]) > 0
        assert all(isinstance(w, int) and w > 0 for w in profile["weights"])
        assert all(sample and all(0 <= i < len(frames) for i in sample) for sample in profile["samples"])
        assert profile["endValue"] - profile["startValue"] == sum(profile["weights"])
    return doc


def test_speedscope_has_a_profile_per_metric_with_exact_weights(real: Profile) -> None:
    doc = check_speedscope(real.render("speedscope"))
    time, flops = doc["profiles"]
    assert (time["unit"], flops["unit"]) == ("nanoseconds", "none")
    assert time["endValue"] == whole_time_ns(real)
    assert flops["endValue"] == every_self(real, "self_flops")
    # The same stacks and weights as the folded export; speedscope's come in the order
    # they ran (the trace's), folded ones in tree order.
    names = [frame["name"] for frame in doc["shared"]["frames"]]
    stacks = [";".join(names[i] for i in sample) for sample in flops["samples"]]
    folded = real.render("folded", metric="flops")
    assert sorted(f"{s} {w}" for s, w in zip(stacks, flops["weights"])) == sorted(folded.splitlines())


def test_speedscope_keeps_same_named_modules_apart(mlp_step: Profile) -> None:
    doc = check_speedscope(mlp_step.render("speedscope", metric="time"))
    assert len(doc["profiles"]) == 1
    zeros = [frame for frame in doc["shared"]["frames"] if frame["name"] == "0"]
    assert zeros == [{"name": "0", "file": "layers.0"}]
    files = [frame["file"] for frame in doc["shared"]["frames"] if "file" in frame]
    assert len(files) == len(set(files))


def test_hand_built_speedscope_weights_are_exact_nanoseconds() -> None:
    doc = check_speedscope(hand_built().render("speedscope", metric="time"))
    (time,) = doc["profiles"]
    assert time["weights"] == [1000, 500, 1000, 1000, 300]
    assert time["endValue"] == 3800


def _sample_names(doc: dict[str, Any], profile: int = 0) -> list[str]:
    names = [frame["name"] for frame in doc["shared"]["frames"]]
    return [";".join(names[i] for i in sample) for sample in doc["profiles"][profile]["samples"]]


def test_hand_built_speedscope_samples_come_in_the_order_they_ran() -> None:
    # Net > a, b; forward runs a then b, backward b then a (as autograd does). Self ns:
    # forward Net 20, a 30, b 50; backward Net 10, a 40, b 50.
    def stats(total: int, own: int) -> PhaseStats:
        return PhaseStats(cpu_time_ns=total, self_cpu_time_ns=own)

    a = ModuleNode("a", "Linear", parent="", depth=1, calls=1, forward=stats(30, 30), backward=stats(40, 40))
    b = ModuleNode("b", "Linear", parent="", depth=1, calls=1, forward=stats(50, 50), backward=stats(50, 50))
    root = ModuleNode("", "Net", calls=1, forward=stats(100, 20), backward=stats(100, 10))
    link([root, a, b])
    profile = check_tree(Profile(root, meta={"model": "Net"}))
    profile.trace = Trace.from_dict({
        "spans": [
            [0, 100, "", "forward", -1], [10, 30, "a", "forward", -1], [40, 50, "b", "forward", -1],
            [200, 100, "", "backward", -1], [200, 50, "b", "backward", -1], [250, 50, "a", "backward", -1],
        ]
    })
    doc = check_speedscope(profile.render("speedscope", metric="time"))
    assert list(zip(_sample_names(doc), doc["profiles"][0]["weights"])) == [
        ("forward;Net", 20), ("forward;Net;a", 30), ("forward;Net;b", 50),
        ("backward;Net", 10), ("backward;Net;b", 50), ("backward;Net;a", 40),
    ]
    # Folded stacks keep tree order; without a trace, so does speedscope.
    folded_order = [";".join(f.name for f in stack) for stack, _ in build_stacks(profile, METRICS["time"])]
    assert folded_order[-2:] == ["backward;Net;a", "backward;Net;b"]
    profile.trace = None
    tree_order = _sample_names(check_speedscope(profile.render("speedscope", metric="time")))
    assert tree_order[-2:] == ["backward;Net;a", "backward;Net;b"]


def test_speedscope_backward_runs_from_the_last_layer(mlp_step: Profile) -> None:
    doc = check_speedscope(mlp_step.render("speedscope", metric="time"))
    samples = _sample_names(doc)
    linears = sorted(node.path for node in mlp_step.modules() if node.type == "Linear")
    first_seen = {}
    for n, sample in enumerate(samples):
        phase = sample.split(";")[0]
        for path in linears:
            if f";{path.replace('.', ';')};" in f";{sample};":
                first_seen.setdefault((phase, path), n)
    forward = sorted(linears, key=lambda path: first_seen[("forward", path)])
    backward = sorted(linears, key=lambda path: first_seen[("backward", path)])
    assert forward == linears and backward == linears[::-1]
    # The step runs forward, the loss, backward, then the optimizer.
    roots = [sample.split(";")[0] for sample in samples]
    firsts = [root for n, root in enumerate(roots) if root not in roots[:n]]
    # layerscope's own work at the step's start (its memory note) runs first; <other>,
    # drawn nowhere, follows the stack before it in tree order.
    assert firsts[0] == "<layerscope>"
    assert [root for root in firsts if root != "<other>"][1:5] == ["forward", "<loss>", "backward", "<optimizer:Adam>"]


# -- CSV ------------------------------------------------------------------------------


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_csv_has_a_row_per_node_with_its_numbers(real: Profile) -> None:
    rows = csv_rows(real.render("csv"))
    nodes = list(real.nodes())
    assert [row["path"] for row in rows] == [node.path for node in nodes]
    for row, node in zip(rows, nodes):
        assert row["type"] == node.type and row["kind"] == node.kind
        assert int(row["params_total"]) == node.params_total
        assert row["parent"] == (node.parent or "")
        for phase, stats in node.phases():
            for field in ("cpu_time_ns", "self_cpu_time_ns", "flops", "self_flops", "macs", "alloc_bytes"):
                value = getattr(stats, field)
                assert row[f"{phase}_{field}"] == ("" if value is None else str(value)), (node.path, phase, field)
            assert row[f"{phase}_self_device_time_ns"] == ""  # None on CPU: an empty cell
    has_backward = any(node.backward is not None for node in nodes)
    assert ("backward_cpu_time_ns" in rows[0]) == has_backward


def test_csv_ops_has_a_row_per_op(real: Profile) -> None:
    rows = csv_rows(real.render("csv", ops=True))
    ops = [(node, op) for node in real.nodes() for op in node.ops]
    assert len(rows) == len(ops) > 0
    for row, (node, op) in zip(rows, ops):
        assert (row["path"], row["type"], row["phase"], row["op"]) == (node.path, node.type, op.phase, op.name)
        assert int(row["self_cpu_time_ns"]) == op.self_cpu_time_ns
        assert row["flops"] == ("" if op.flops is None else str(op.flops))
        assert json.loads(row["input_shapes"]) == op.input_shapes


def test_hand_built_csv_cells() -> None:
    rows = csv_rows(hand_built().render("csv", ops=True))
    assert rows[1]["stack"] == "model.py:12 forward <- train.py:3 main"
    assert rows[2]["stack"] == ""
    node_rows = csv_rows(hand_built().render("csv"))
    assert [row["name"] for row in node_rows] == ["Net", "blocks", "0", "a;b\nc "]
    assert node_rows[0]["profiled"] == "true" and node_rows[0]["parent"] == ""


# -- determinism and golden files -----------------------------------------------------


@pytest.mark.parametrize("fmt", ["folded", "speedscope", "csv"])
def test_exports_are_deterministic(real: Profile, fmt: str) -> None:
    assert real.render(fmt) == real.render(fmt)
    takes = get_renderer(fmt).option_names()
    options = {name: value for name, value in {"ops": True, "metric": "flops"}.items() if name in takes}
    assert real.render(fmt, **options) == real.render(fmt, **options)


def lenet5(clock: Any, **options: Any) -> Profile:
    entry = zoo.get("lenet5")
    return check_tree(
        layerscope.profile(
            entry.build(), entry.example_inputs(1), warmup=1, repeat=3, clock=clock, memory=False, **options
        )
    )


def test_lenet5_golden_folded(fake_clock: Any, golden: Any) -> None:
    profile = lenet5(fake_clock)
    text = profile.render("folded")
    golden("export_lenet5.folded", text)
    assert sum(value for _, value in folded_lines(text)) == half_up_us(whole_time_ns(profile))


def test_lenet5_golden_folded_training_step(fake_clock: Any, golden: Any) -> None:
    # A Profiler block times modules and ops in one run, so ops fit inside their module.
    entry = zoo.get("lenet5")
    model, inputs = entry.build(), entry.example_inputs(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.Profiler(model, clock=fake_clock, memory=False) as prof:
        model(inputs).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    profile = check_tree(prof.profile)
    text = profile.render("folded")
    golden("export_lenet5_step.folded", text)
    assert sum(value for _, value in folded_lines(text)) == half_up_us(whole_time_ns(profile))
    assert "<optimizer:SGD>;aten::add_ " in text and "backward;LeNet5;features;0;aten::convolution_backward " in text


def test_lenet5_golden_csv(fake_clock: Any, golden: Any) -> None:
    profile = lenet5(fake_clock)
    golden("export_lenet5.csv", profile.render("csv"))
    golden("export_lenet5_ops.csv", profile.render("csv", ops=True))


# -- registry and command line --------------------------------------------------------


def test_formats_and_extensions() -> None:
    assert {"folded", "speedscope", "csv"} <= set(formats())
    assert format_for_path("run.folded") == "folded"
    assert format_for_path("run.speedscope.json") == "speedscope"  # the longest extension wins
    assert format_for_path("run.json") == "json"
    assert format_for_path("RUN.CSV") == "csv"


@pytest.fixture(scope="module")
def cli_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("exports_cli")


def test_cli_folded_to_stdout(cli_dir: Path) -> None:
    run = run_cli("profile", "zoo:lenet5", "--format", "folded", *FAST, cwd=cli_dir)
    assert run.returncode == 0, run.stderr
    assert folded_lines(run.stdout)[0][0][0] == "LeNet5"


def test_cli_guesses_the_format_from_the_file_name(cli_dir: Path) -> None:
    run = run_cli(
        "profile", "zoo:lenet5", "--metric", "flops", "-o", "lenet.folded", *FAST, cwd=cli_dir
    )
    assert run.returncode == 0, run.stderr
    assert "wrote folded to lenet.folded" in run.stderr
    lines = folded_lines((cli_dir / "lenet.folded").read_text(encoding="utf-8"))
    assert ("LeNet5", "features", "0", "aten::convolution") in {frames for frames, _ in lines}
    # The first conv: 6 output channels of 28 x 28, each 1 x 5 x 5 multiply-adds (2 FLOPs
    # each), plus one add per output element for the bias.
    assert dict(lines)[("LeNet5", "features", "0", "aten::convolution")] == 2 * 6 * 28 * 28 * 25 + 6 * 28 * 28


def test_cli_csv_ops_and_speedscope(cli_dir: Path) -> None:
    run = run_cli("flops", "zoo:lenet5", "--format", "csv", "--ops", cwd=cli_dir)
    assert run.returncode == 0, run.stderr
    rows = csv_rows(run.stdout)
    assert rows[1]["path"] == "features.0" and rows[1]["op"] == "aten::convolution" and rows[1]["flops"] == "239904"
    run = run_cli("flops", "zoo:lenet5", "-o", "lenet.speedscope.json", cwd=cli_dir)
    assert run.returncode == 0, run.stderr
    doc = check_speedscope((cli_dir / "lenet.speedscope.json").read_text(encoding="utf-8"))
    assert [profile["unit"] for profile in doc["profiles"]] == ["none"]


def test_cli_metric_time_of_an_untimed_count_is_a_usage_error(cli_dir: Path) -> None:
    line = assert_usage_error(run_cli("flops", "zoo:lenet5", "--format", "folded", "--metric", "time", cwd=cli_dir))
    assert "no time" in line
