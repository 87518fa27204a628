"""One number, one truth: every view of a profile shows the profile's own figures.

For every profile of a corpus (zoo models and small transformers configs, forward,
``backward=True`` and ``Profiler`` training blocks; the GPU captures of
``tests/data/captures`` replayed; every torch.profiler trace of ``../shared/traces``;
merged runs of ranks) every registered format is rendered, read back, and its totals
are held against the profile's figures: each phase's CPU time of the model and of the
step's parts, device time and ``Profile.device``'s ledger, FLOPs, MACs, params, peak
memory, communication. A figure a format prints is compared as the renderer prints it
(through ``layerscope.base.fmt`` or the renderer's own formatting), never within a
tolerance. Where a format legitimately shows another figure (a one-step trace of a
summed run), the stated relation is checked, not skipped.

No check compares two measured times: each compares one figure with itself, rendered
another way, or a sum with the same numbers summed, or relations that hold in one run
by construction (an op's range lies inside its module's).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
import layerscope.render  # fills the registry
from conftest import ALL_TRACES, BIG, SHARED_TRACES, tiered
from layerscope import zoo
from layerscope.base import fmt, formats
from layerscope.base.errors import RenderError
from layerscope.capture import replay
from layerscope.model.check import check_tree
from layerscope.model.tree import ModuleNode, Profile, part_total
from layerscope.render import deepspeed as deepspeed_render
from layerscope.render.stacks import rescale

# -- the corpus -------------------------------------------------------------------------

CAPTURES = Path(__file__).parent / "data" / "captures"
CAPTURE_NAMES = ("bert_base_fwd", "ddp_nccl_train", "gpt2_adamw_train", "gpt2_ckpt_train", "llama_bf16_train")

def _zoo(name: str) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    entry = zoo.get(name)
    return entry.build(), entry.example_inputs(2)


def _transformers(name: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    if name == "bert":
        config = transformers.BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=256,
        )
        return transformers.BertModel(config), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    config = transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=2, vocab_size=256, n_positions=64, bos_token_id=0, eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config), {"input_ids": ids}


def _model(source: str) -> tuple[nn.Module, Any]:
    kind, name = source.split(":")
    return _zoo(name) if kind == "zoo" else _transformers(name)


def _loss(output: Any) -> torch.Tensor:
    tensor = output if isinstance(output, torch.Tensor) else output[0]
    return tensor.float().pow(2).mean()


def _block(source: str, steps: int) -> Profile:
    """A training loop in a ``Profiler`` block: forward, loss, backward, AdamW, zero_grad."""
    model, inputs = _model(source)
    opt = torch.optim.AdamW(model.parameters())
    with layerscope.Profiler(model) as prof:
        for _ in range(steps):
            output = model(**inputs) if isinstance(inputs, dict) else model(inputs)
            _loss(output).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return prof.profile


def _build(case: str) -> Profile:
    how, _, what = case.partition(" ")
    if how == "trace":
        return layerscope.load(SHARED_TRACES / f"{what}.json.gz")  # type: ignore[return-value]
    if how == "replay":
        return replay.replay(replay.load(CAPTURES / f"{what}.json.gz"))
    if how == "forward":
        model, inputs = _model(what)
        return layerscope.profile(model, inputs, warmup=1, repeat=2)
    if how == "backward":
        model, inputs = _model(what)
        return layerscope.profile(model, inputs, backward=True, warmup=1, repeat=2)
    source, steps = what.split(" x")
    return _block(source, int(steps))


MODELS = ("zoo:mlp", "zoo:gpt", "zoo:lenet5", "hf:gpt2", "hf:bert")
CASES = (
    *(f"forward {m}" for m in MODELS),
    *(f"backward {m}" for m in MODELS),
    "block zoo:mlp x3", "block zoo:gpt x1", "block zoo:lenet5 x2", "block hf:gpt2 x1", "block hf:bert x2",
    *(f"replay {name}" for name in CAPTURE_NAMES),
    *(f"trace {name}" for name in ALL_TRACES),
)


@cache
def _corpus(case: str) -> Profile:
    return check_tree(_build(case))


@pytest.fixture(params=tiered(CASES, slow=[f"trace {name}" for name in BIG]))
def profile(request: pytest.FixtureRequest) -> Profile:
    case = request.param
    if case.startswith("trace "):
        request.getfixturevalue("shared_traces")  # skips cleanly where the folder is absent
    return _corpus(case)


def _one_run(profile: Profile) -> bool:
    """Whether the trace is the whole run the tree sums: ``profile()``'s median pass, one
    step of a ``Profiler`` or of a trace file."""
    return profile.meta.mode == "profile" or (profile.meta.mode in ("context", "trace") and int(profile.figures.steps or 1) == 1)


def test_the_trace_list_is_the_folder(shared_traces: Path) -> None:
    assert sorted(p.name.removesuffix(".json.gz") for p in shared_traces.glob("*.json.gz")) == list(ALL_TRACES)


def test_the_capture_list_is_the_folder() -> None:
    eager = (p for p in CAPTURES.glob("*.json.gz") if not p.name.startswith("compiled_"))  # test_compiled_block's
    assert sorted(p.name.removesuffix(".json.gz") for p in eager) == list(CAPTURE_NAMES)


# -- the profile's own figures ------------------------------------------------------------


def _trees(profile: Profile) -> list[ModuleNode]:
    return [profile.root, *profile.parts]


def _all_phases(node: ModuleNode, field: str) -> int | None:
    values = [getattr(stats, field) for _, stats in node.phases()]
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _all_phases_of(nodes: list[ModuleNode], field: str) -> int:
    """``field`` over every phase of ``nodes`` (unknown counts nothing)."""
    return sum(_all_phases(node, field) or 0 for node in nodes)


def _self_sum(profile: Profile, field: str) -> int:
    return sum(getattr(stats, field) or 0 for node in profile.nodes() for _, stats in node.phases())


def test_the_profile_adds_up(profile: Profile) -> None:
    """The figures every view shows, related once here: the step is its phases and parts,
    the ledger's attributed time every node's self device time."""
    if profile.step_time_ns is not None and profile.timed:
        assert profile.step_time_ns == sum(_all_phases(tree, "cpu_time_ns") or 0 for tree in _trees(profile))
    if profile.device is not None:
        ledger = profile.device
        assert ledger.busy_ns == ledger.attributed_ns + ledger.unattributed_ns
        assert ledger.attributed_ns == _self_sum(profile, "self_device_time_ns")
        assert ledger.attributed_ns == sum(_all_phases(tree, "device_time_ns") or 0 for tree in _trees(profile))


# -- JSON -----------------------------------------------------------------------------------


def test_json_holds_the_profiles_figures(profile: Profile) -> None:
    doc = json.loads(profile.render("json"))
    assert doc["totals"]["params"] == profile.root.params_total
    assert doc["totals"]["param_bytes"] == profile.param_bytes
    assert doc["totals"]["step_time_ns"] == profile.step_time_ns
    for phase, stats in profile.root.phases():
        assert doc["totals"][phase] == stats.to_dict()
    assert doc["totals"]["parts"] == {part.path: part_total(part) for part in profile.parts}
    by_path = {row["path"]: row for row in [*doc["modules"], *doc["parts"]]}
    for node in profile.nodes():
        for phase, stats in node.phases():
            assert by_path[node.path][phase] == stats.to_dict(), (node.path, phase)
    assert doc.get("device") == (None if profile.device is None else profile.device.to_dict())
    if profile.memory is not None:
        assert doc["memory"]["peak_bytes"] == profile.memory.peak_bytes


# -- CSV --------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def test_csv_rows_are_the_nodes_figures(profile: Profile) -> None:
    rows = list(csv.DictReader(io.StringIO(profile.render("csv"))))
    assert [row["path"] for row in rows] == [node.path for node in profile.nodes()]
    for row, node in zip(rows, profile.nodes()):
        assert row["params_total"] == _cell(node.params_total)
        for phase, stats in node.phases():
            for key, value in stats.to_dict().items():
                assert row[f"{phase}_{key}"] == _cell(value), (node.path, phase, key)


def test_csv_op_rows_are_the_op_rows(profile: Profile) -> None:
    rows = list(csv.DictReader(io.StringIO(profile.render("csv", ops=True))))
    ops = [(node, op) for node in profile.nodes() for op in node.ops]
    assert len(rows) == len(ops)
    for field in ("self_cpu_time_ns", "self_device_time_ns", "flops", "macs", "alloc_bytes"):
        column = next((c for c in rows[0] if c.endswith(field)), None) if rows else None
        if column is None:
            continue
        shown = sum(int(row[column]) for row in rows if row[column])
        assert shown == sum(getattr(op, field) or 0 for _, op in ops), field


# -- text ---------------------------------------------------------------------------------


def _footer(text: str) -> list[str]:
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("---"))
    rest = lines[start + 1 :]
    blank = rest.index("")
    return rest[blank + 1 :]


def _table(text: str, first: str = "Module ") -> tuple[list[str], list[list[str]]]:
    """The header and rows of a text table, cut at the rule's column boundaries (a name
    may hold a ``|`` itself)."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith(first))
    rule = lines[head + 1]
    cuts = [-1, *(i for i, char in enumerate(rule) if char == "|"), len(rule) + 1000]

    def cells(line: str) -> list[str]:
        return [line[a + 1 : b].strip() for a, b in itertools.pairwise(cuts)]

    rows = []
    for line in lines[head + 2 :]:
        if not line.strip() or line.startswith("---"):
            break
        rows.append(cells(line))
    return cells(lines[head]), rows


def test_text_root_row_and_footer_show_the_profiles_totals(profile: Profile) -> None:
    text = profile.render("text")
    header, rows = _table(text)
    root_row = dict(zip(header, rows[0]))
    footer = "\n".join(_footer(text))
    root = profile.root
    assert f"Params: {fmt.params(root.params_total, profile.param_bytes)}" in footer
    if not any(node.calls for node in profile.modules()):
        # No module ran (a trace without module events): the model's FLOPs are unknown.
        assert "FLOPs: ? (no module call in the tree)" in footer
    elif root.forward.flops is not None:
        partial = root.flops_partial  # ops without a formula below: "N + ?"
        assert f"FLOPs: {fmt.counted(root.forward.flops, partial)}   MACs: {fmt.counted(root.forward.macs, partial)}" in footer
    if profile.timed and not root.profiled:
        # No module was seen running: the model's own figures are unknown, blank in its row.
        assert "Forward CPU total: ?" in footer
        assert not any(root_row[column] for column in header[2:])
    elif profile.timed:
        assert f"Forward CPU total: {fmt.time_ns(root.forward.cpu_time_ns)}" in footer
        total = "CPU total" if "CPU total" in root_row else "Fwd total"
        assert root_row[total] == fmt.time_ns(root.forward.cpu_time_ns)
    if "Device total" in root_row and root.profiled:
        device = _all_phases(root, "device_time_ns")
        assert root_row["Device total"] == fmt.time_ns(device)
        assert f"Device total: {fmt.time_ns(device)}" in footer
    if "Params" in root_row:
        assert root_row["Params"] == fmt.count(root.params_total)
    step = profile.step_time_ns
    if step is not None and profile.timed:
        line = next(line for line in footer.splitlines() if re.match(r"(\d+ steps? \(summed\)|Step( \(the tree is the median pass, pass \d+ of \d+\))?): ", line))
        assert f": {fmt.time_ns(step)} = forward {fmt.time_ns(root.forward.cpu_time_ns)}" in line
        for part in profile.parts:
            assert f"{fmt.node_name(part.name)} {fmt.time_ns(part_total(part))}" in line
        by_path = {row[0].lstrip("│├└─ "): dict(zip(header, row)) for row in rows}
        for part in profile.parts:
            shown = by_path[fmt.node_name(part.name)]
            if "Step %" in shown:
                assert shown["Step %"] == fmt.percent(part_total(part), step)
    ledger = profile.device
    if ledger is not None:
        # Attributed = the model's device time (the footer's "Device total") + the parts'.
        in_parts = _all_phases_of(profile.parts, "device_time_ns")
        held = f" (model {fmt.time_ns(_all_phases(root, 'device_time_ns') or 0)} + step parts {fmt.time_ns(in_parts)})" if in_parts else ""
        assert ledger.attributed_ns == (_all_phases(root, "device_time_ns") or 0) + in_parts
        assert (
            f"Device busy {fmt.time_ns(ledger.busy_ns)} = attributed {fmt.time_ns(ledger.attributed_ns)}{held} "
            f"+ unattributed {fmt.time_ns(ledger.unattributed_ns)}"
        ) in footer
    if profile.memory is not None:
        assert f"Peak memory: {fmt.nbytes(profile.memory.peak_bytes)}" in footer


# -- the op table -----------------------------------------------------------------------


def _ops(profile: Profile) -> list[Any]:
    return [op for node in profile.nodes() for op in node.ops]


def test_op_table_total_is_the_op_rows_total(profile: Profile) -> None:
    if not _ops(profile):
        with pytest.raises(RenderError):
            profile.render("ops")
        return
    table = profile.ops(group_by="name")
    ops = _ops(profile)
    assert table.total.calls == sum(op.calls for op in ops)
    if all(op.self_cpu_time_ns is not None for op in ops):
        assert table.total.self_cpu_time_ns == sum(op.self_cpu_time_ns for op in ops)
    if profile.root.forward.flops is not None:
        # Op rows add up to their node's self FLOPs in each phase (check_tree), so the
        # table's total is every node's, the model's over its phases plus the parts'.
        assert table.total.flops == sum(_all_phases(tree, "flops") or 0 for tree in _trees(profile))
    text = profile.render("ops")
    total_row = next(line for line in text.splitlines() if line.startswith("Total "))
    cells = [cell.strip() for cell in total_row.split("|")]
    header = [cell.strip() for cell in next(line for line in text.splitlines() if line.startswith("Name ")).split("|")]
    shown = dict(zip(header, cells))
    assert shown["Calls"] == str(table.total.calls)
    if "Self CPU" in shown and table.total.self_cpu_time_ns is not None:
        assert shown["Self CPU"] == fmt.time_ns(table.total.self_cpu_time_ns)
    if "FLOPs" in shown:
        assert shown["FLOPs"] == fmt.count(table.total.flops)


def _op_self_by_node(profile: Profile) -> Iterator[tuple[ModuleNode, str, int, int]]:
    for node in profile.nodes():
        by_phase: dict[str, int] = defaultdict(int)
        for op in node.ops:
            by_phase[op.phase] += op.self_cpu_time_ns or 0
        for phase, ops_ns in by_phase.items():
            stats = getattr(node, phase)
            yield node, phase, ops_ns, stats.self_cpu_time_ns


def test_a_modules_ops_lie_within_its_self_time(profile: Profile) -> None:
    """Op rows and module times of one run: an op's range lies inside its module's and
    outside its child modules', so a node's ops add up to no more than its self time."""
    over = [(node.path, phase, ops_ns, self_ns) for node, phase, ops_ns, self_ns in _op_self_by_node(profile) if ops_ns > self_ns]
    assert not over
    if profile.trace is not None and _one_run(profile):
        # The run the op rows come from (its trace) is the run the modules were timed in.
        assert not _module_span_mismatches(profile)


# -- the Chrome trace -------------------------------------------------------------------


def _chrome(profile: Profile) -> dict[str, Any]:
    return json.loads("".join(profile.render("chrome")))


def _ns(value: Any) -> int:
    return round(float(value) * 1000)




def _spans(profile: Profile) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Chrome trace's step span(s) and its other complete spans."""
    events = _chrome(profile)["traceEvents"]
    complete = [e for e in events if e.get("ph") == "X"]
    return [e for e in complete if e["cat"] == "step"], [e for e in complete if e["cat"] != "step"]


def _needs_trace(profile: Profile) -> None:
    if profile.trace is None:
        with pytest.raises(RenderError):
            _chrome(profile)
        pytest.skip("no trace: the Chrome format refuses it (checked)")


def test_chrome_step_is_the_traced_step(profile: Profile, request: pytest.FixtureRequest) -> None:
    _needs_trace(profile)
    assert profile.trace is not None
    step, spans = _spans(profile)
    if profile.trace.step_ns is None:
        assert step == []
        return
    assert [_ns(e["dur"]) for e in step] == [profile.trace.step_ns]
    times = profile.figures.step_times_ns
    if profile.meta.mode == "context" and times:
        # The trace is the last step the tree sums, and every span lies in it.
        assert profile.trace.step_ns == times[-1]
        assert all(_ns(e["ts"]) + _ns(e["dur"]) <= profile.trace.step_ns for e in spans)


def test_chrome_op_spans_are_the_op_rows(profile: Profile) -> None:
    """The ops' spans and the op rows are one run (``profile()``'s op pass, a one-step
    block, a trace file): per module, phase and op, the spans add up to the row's time."""
    _needs_trace(profile)
    if not _one_run(profile):
        pytest.skip("the op rows sum steps the trace (the last step) does not hold")
    _, spans = _spans(profile)
    shown: dict[tuple[str, str, str], int] = defaultdict(int)
    for e in spans:
        if e["cat"].startswith("op,"):
            shown[(e["args"]["module"], e["args"]["phase"], e["name"])] += _ns(e["dur"])
    model = str(profile.meta.model or profile.root.type)
    rows: dict[tuple[str, str, str], int] = defaultdict(int)
    for node in profile.nodes():
        for op in node.ops:
            rows[(node.path or model, op.phase, op.name)] += op.cpu_time_ns or 0
    assert shown == {key: ns for key, ns in rows.items() if ns or key in shown}


def _module_span_mismatches(profile: Profile, nodes: list[ModuleNode] | None = None) -> list[tuple[str, int, int]]:
    _, spans = _spans(profile)
    shown: dict[str, int] = defaultdict(int)
    for e in spans:
        if not e["cat"].startswith("op,") and e["args"]["phase"] == "forward":
            shown[e["args"]["path"]] += _ns(e["dur"])
    return [
        (node.path, shown[node.path], node.forward.cpu_time_ns)
        for node in (profile.modules() if nodes is None else nodes)
        if node.path in shown and shown[node.path] != node.forward.cpu_time_ns
    ]


def test_chrome_module_spans_are_the_tree_times(profile: Profile) -> None:
    """In one run, a module's forward spans add up to its forward time, and so do those
    of the parts layerscope makes (``<loss>`` from its first op to its last, the
    optimizer, ``zero_grad``). Not ``<other>``, the step's remainder, which has no span,
    nor a label part: one that encloses the model (a trace's top-level annotation) is
    drawn around it, while the model's time is the model's."""
    _needs_trace(profile)
    if not _one_run(profile):
        pytest.skip("the tree sums steps the trace (the last step) does not hold; the step's relation is checked")
    assert not _module_span_mismatches(profile)
    parts = [node for part in profile.parts if part.kind in ("loss", "optimizer", "zero_grad") for node in part.walk()]
    assert not _module_span_mismatches(profile, parts)


def test_chrome_memory_lies_within_the_step(profile: Profile) -> None:
    if profile.trace is None or profile.memory is None:
        return
    if int(profile.figures.steps or 1) != 1:
        # Steps summed: the traced step's own timeline, when the profile kept one.
        events = _chrome(profile)["traceEvents"]
        live = [e["args"]["bytes"] for e in events if e.get("name") == "live memory"]
        assert live == ([] if profile.trace.memory is None else profile.trace.memory.bytes)
        assert not [e for e in events if e.get("name") == "memory peak"]
        return
    events = _chrome(profile)["traceEvents"]
    live = [e for e in events if e.get("name") == "live memory"]
    peak = [e for e in events if e.get("name") == "memory peak"]
    if live:
        assert max(e["args"]["bytes"] for e in live) == profile.memory.peak_bytes
    if peak:
        assert peak[0]["args"]["bytes"] == profile.memory.peak_bytes
    step_ns = profile.trace.step_ns
    if step_ns is not None:
        assert all(0 <= _ns(e["ts"]) <= step_ns for e in [*live, *peak])


# -- folded stacks and speedscope ---------------------------------------------------------


def _stack_total(profile: Profile, metric: str) -> int:
    if metric == "flops":
        return _self_sum(profile, "self_flops")
    if metric == "device_time":
        return _self_sum(profile, "self_device_time_ns")
    return _self_sum(profile, "self_cpu_time_ns")


def _metrics(profile: Profile) -> list[str]:
    from layerscope.render.stacks import available_metrics

    return [m.name for m in available_metrics(profile)]


def test_folded_stacks_add_up_to_the_total(profile: Profile) -> None:
    from layerscope.render.folded import NS_PER_VALUE

    for metric in _metrics(profile):
        text = profile.render("folded", metric=metric)
        counts = [int(line.rsplit(" ", 1)[1]) for line in text.splitlines()]
        total = _stack_total(profile, metric)
        assert sum(counts) == rescale([total], 1, NS_PER_VALUE[metric])[0], metric
        if metric == "time" and profile.step_time_ns is not None and profile.timed:
            assert total == profile.step_time_ns
        if metric == "time" and profile.step_time_ns is None and profile.timed:
            assert total == profile.root.forward.cpu_time_ns + sum(part_total(p) for p in profile.parts)


def test_speedscope_profiles_add_up_to_the_total(profile: Profile) -> None:
    doc = json.loads(profile.render("speedscope"))
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    metrics = _metrics(profile)
    assert len(doc["profiles"]) == len(metrics)
    for metric, entry in zip(metrics, doc["profiles"]):
        assert entry["type"] == "sampled"
        assert sum(entry["weights"]) == _stack_total(profile, metric), metric
        assert entry["endValue"] == sum(entry["weights"])


# -- the drop-ins' printouts ------------------------------------------------------------


def test_deepspeed_summary_shows_the_profiles_totals(profile: Profile) -> None:
    text = profile.render("deepspeed")
    root = profile.root
    shown: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line and "  " in line:
            label, _, value = line.partition(":")
            shown[label.strip()] = value.strip()
    assert shown["params per GPU"] == deepspeed_render._params(root.params_total).strip()
    assert shown["fwd MACs per GPU"] == deepspeed_render._macs(root.forward.macs).strip()
    assert shown["fwd flops per GPU"] == deepspeed_render._flops(root.forward.flops).strip()
    if profile.timed:
        # Latency is the busy time: the device's where there is one, as DeepSpeed's.
        assert shown["fwd latency"] == fmt.ds_seconds(root.forward.busy_time_ns / 1e9).strip()
        if root.backward is not None:
            assert shown["bwd latency"] == fmt.ds_seconds(root.backward.busy_time_ns / 1e9).strip()
        if profile.step_time_ns:
            assert shown["iter latency"] == fmt.ds_seconds(profile.step_time_ns / 1e9).strip()


def test_model_printout_shows_the_profiles_totals(profile: Profile) -> None:
    text = profile.render("model")
    root = profile.root
    assert f"Params: {fmt.params(root.params_total, profile.param_bytes)}" in text
    if profile.timed:
        assert f"Forward time: {fmt.time_ns(root.forward.busy_time_ns)}" in text
    if root.forward.macs is not None:
        assert f"Forward MACs: {fmt.count(root.forward.macs)}   FLOPs: {fmt.count(root.forward.flops)}" in text


def test_torchprof_rows_are_the_nodes_times(profile: Profile) -> None:
    """Each measured row (torchprof measures the leaf modules, a label seen through: the
    DDP trace's model inside DDP's forward range) shows its module's forward self and
    total CPU time and calls, in torchprof's own format."""
    header, rows = _table(profile.render("torchprof"))
    measured = [dict(zip(header, row)) for row in rows if row[header.index("Number of Calls")]]
    leaves = [
        node for node in profile.modules()
        if node.kind == "module" and node.profiled and not any(inner.kind == "module" for inner in list(node.walk())[1:])
    ]
    assert len(measured) == len(leaves)
    for row, node in zip(measured, leaves):
        if profile.timed:
            assert row["Self CPU total"] == fmt.profiler_time(node.forward.self_cpu_time_ns / 1000), node.path
            assert row["CPU total"] == fmt.profiler_time(node.forward.cpu_time_ns / 1000), node.path
        assert row["Number of Calls"] == str(node.calls), node.path


# -- HTML ---------------------------------------------------------------------------------


def _html_data(profile: Profile) -> dict[str, Any]:
    page = profile.render("html")
    found = re.search(r'<script type="application/json"[^>]*>(.*?)</script>', page, re.S)
    assert found
    return json.loads(found.group(1))


def test_html_data_is_the_profiles_figures(profile: Profile) -> None:
    data = _html_data(profile)
    fields_ = data["phase_fields"]
    nodes = list(profile.nodes())
    assert [n["path"] for n in data["nodes"]] == [n.path for n in nodes]
    for shown, node in zip(data["nodes"], nodes):
        assert shown["params_total"] == node.params_total
        for phase, stats in node.phases():
            assert dict(zip(fields_, shown["phases"][phase])) == stats.to_dict() | {
                k: getattr(stats, k) for k in fields_
            }, (node.path, phase)
    if profile.memory is not None:
        assert data["memory"]["peak_bytes"] == profile.memory.peak_bytes
    assert data.get("device") == (None if profile.device is None else profile.device.to_dict())
    if "name" in data["ops"]:
        table = profile.ops(group_by="name")
        columns = data["ops"]["name"]["columns"]
        assert dict(zip(columns, data["ops"]["name"]["total"])) == {c: getattr(table.total, c) for c in columns}


def test_names_and_phases_are_one_in_every_view(profile: Profile) -> None:
    """A node is named the same in the tree, the HTML report and the text (layerscope's
    own time is ``<layerscope>`` wherever it sits); op tables give a step part's forward
    ops the ``step`` phase and never the model's ``forward``."""
    data = _html_data(profile)
    assert [n["name"] for n in data["nodes"]] == [fmt.node_name(n.name) for n in profile.nodes()]
    assert all(n.name == "<layerscope>" for n in profile.nodes() if n.kind == "overhead")
    assert "[layerscope]" not in profile.render("text")
    if not any(node.ops for node in profile.nodes()):
        return
    phases = {row.phase for row in profile.ops(group_by="phase")}
    assert phases <= {"forward", "backward", "recompute", "step"}
    parts_forward = any(op.phase == "forward" for part in profile.parts for n in part.walk() for op in n.ops)
    assert ("step" in phases) == parts_forward
    model_forward = any(op.phase == "forward" for n in profile.root.walk() for op in n.ops)
    assert ("forward" in phases) == model_forward


def test_kernels_is_for_compiled_profiles_only(profile: Profile) -> None:
    if profile.compiled is None:
        with pytest.raises(RenderError):
            profile.render("kernels")
    else:
        assert profile.render("kernels")


def test_every_profile_format_is_checked() -> None:
    """A format added to the registry gets a check here."""
    checked = {"text", "json", "csv", "ops", "model", "torchprof", "deepspeed", "chrome", "folded", "speedscope", "html", "kernels", "png"}
    assert set(formats.formats("profile")) == checked


# -- merged ranks ---------------------------------------------------------------------------

#: Recorded profiles that name their rank: a merged run of each (the others' ranks missing).
RANKED = ("replay ddp_nccl_train", "trace h100_ddp_nccl_train", "trace b200_gptoss_tp8_rank0", "trace mi300x_resnet_ddp_actckpt_train_rank0")


@pytest.mark.parametrize("case", RANKED)
def test_a_merged_run_shows_its_ranks_figures(case: str, request: pytest.FixtureRequest) -> None:
    from layerscope.model import ranks

    if case.startswith("trace "):
        request.getfixturevalue("shared_traces")
    profile = _corpus(case)
    merged = ranks.merge([profile])
    doc = json.loads(merged.render("json"))
    (record,) = doc["ranks"]
    assert record["rank"] == (profile.meta.rank or 0)
    assert record["param_bytes"] == profile.param_bytes
    for node in profile.nodes():
        kept = record["nodes"][node.path]
        for phase, stats in node.phases():
            figures = stats.to_dict()
            assert {key: figures[key] for key in kept[phase]} == kept[phase], (node.path, phase)
    text = merged.render("text")
    metric = merged.time_metric
    header, rows = _table(text)
    field = "device_time_ns" if metric == "device" else "cpu_time_ns"
    root_rows = [dict(zip(header, row)) for row in rows if row[0] == "(root)"]
    for row in root_rows:
        stats = getattr(profile.root, row["Phase"])
        assert row[f"rank {record['rank']}"] == fmt.time_ns(getattr(stats, field))
    step = profile.step_time_ns
    if step is not None:
        assert f"({fmt.time_ns(step)})" in text.splitlines()[1]
    from layerscope.render.ranks_html import ranks_data

    page = merged.render("html")
    data = ranks_data(merged)
    assert json.dumps(data["run"]["step_time_ns"]) in page
    assert data["run"]["step_time_ns"] == [step]
    paths = [shape["path"] for shape in data["nodes"]]
    for row in data["heat"]:
        stats = getattr(profile.node(paths[row["node"]]), row["phase"])
        assert row["time"] == [getattr(stats, field)], (paths[row["node"]], row["phase"])
