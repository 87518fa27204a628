"""The trace (``Profile.trace``) and its Chrome / Perfetto export, loaded back and checked
against the profile's own numbers."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
from layerscope import check_tree, zoo
from layerscope.model.documents import profile_from_dict
from layerscope.model.sidedocs import Trace
from layerscope.model.tree import ModuleNode, PhaseStats, Profile, link


def _training_step(name: str = "mlp", batch: int = 4) -> Profile:
    entry = zoo.get(name)
    torch.manual_seed(0)
    model = entry.build()
    x = entry.example_inputs(batch)
    opt = torch.optim.Adam(model.parameters())
    with layerscope.Profiler(model) as prof:
        out = model(x)
        loss = out.float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return check_tree(prof.profile)


def _chrome(profile: Profile) -> dict[str, Any]:
    return json.loads(profile.render("chrome"))


def _spans(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Module, label, step-part and op spans (not the step's own span, on its own track)."""
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "step"]


def _ns(us: float) -> int:
    return round(us * 1000)


def crossing_spans(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """The complete events of each thread that overlap without nesting, read as a viewer
    reads them: ``ts`` and ``dur`` as floats (``json.loads``, like ``JSON.parse``), a
    span's end ``ts + dur`` in float arithmetic. Sorted by start, longest first, a span
    must end by the end of the innermost open span it starts in."""
    tracks: dict[tuple[Any, Any], list[tuple[float, float, str]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
    crossing = []
    for events in tracks.values():
        events.sort(key=lambda span: (span[0], -span[1]))
        open_spans: list[tuple[float, float, str]] = []
        for start, end, name in events:
            while open_spans and open_spans[-1][1] <= start:
                open_spans.pop()
            if open_spans and end > open_spans[-1][1]:
                crossing.append((open_spans[-1][2], name))
                continue  # a viewer drops it; the rest are checked against what nests
            open_spans.append((start, end, name))
    return crossing


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_every_op_lies_within_its_module_span(name: str) -> None:
    prof = _training_step(name)
    spans = _spans(_chrome(prof))
    frames: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for e in spans:
        if not e["cat"].startswith("op,"):
            frames.setdefault((e["args"]["path"], e["args"]["phase"]), []).append((_ns(e["ts"]), _ns(e["ts"] + e["dur"])))
    checked = 0
    for e in spans:
        if not e["cat"].startswith("op,"):
            continue
        # Step parts too: the loss written inline in the block is a span of <loss>.
        path = "" if e["args"]["module"] == prof.meta.model else e["args"]["module"]
        start, end = _ns(e["ts"]), _ns(e["ts"] + e["dur"])
        phase = e["args"]["phase"]
        assert any(a <= start and end <= b for a, b in frames[(path, phase)]), (e["name"], path, phase)
        checked += 1
    assert checked > 10


def test_root_spans_add_up_to_the_root_times() -> None:
    prof = _training_step("gpt")
    spans = _spans(_chrome(prof))
    model = prof.meta.model
    forward = [e for e in spans if e["name"] == model]
    backward = [e for e in spans if e["name"] == f"{model} (backward)"]
    assert len(forward) == 1
    assert _ns(forward[0]["dur"]) == prof.root.forward.cpu_time_ns
    # In backward the root's span covers every backward op traced to the model; each
    # op's slot runs to the next op's start, so the spans add up to the root's time.
    assert sum(_ns(e["dur"]) for e in backward) == prof.root.backward.cpu_time_ns
    # Module spans nest: each child's forward span lies inside its parent's.
    by_path = {e["args"]["path"]: e for e in spans if e["cat"] == "module,forward"}
    block = by_path["blocks.0"]
    attn = by_path["blocks.0.attn"]
    assert block["ts"] <= attn["ts"] and attn["ts"] + attn["dur"] <= block["ts"] + block["dur"]


def test_trace_event_format_fields_and_args() -> None:
    prof = _training_step("mlp")
    doc = _chrome(prof)
    assert doc["displayTimeUnit"] == "ns"
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert names == {"process_name", "thread_name"}
    for e in _spans(doc):
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e)
        assert e["dur"] >= 0 and e["ts"] >= 0
    [addmm] = [e for e in _spans(doc) if e["name"] == "aten::addmm" and e["args"]["module"] == "layers.0"]
    # FLOPs per call: 2 * batch * in * out plus the bias add (4 x 256).
    assert addmm["args"]["flops"] == 2 * 4 * 64 * 256 + 4 * 256
    assert addmm["args"]["input_shapes"] == [[256], [4, 64], [64, 256]]
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "live memory"]
    assert counters and max(e["args"]["bytes"] for e in counters) == prof.memory.peak_bytes


def test_chrome_is_deterministic_and_streams_to_disk(tmp_path: Any) -> None:
    prof = _training_step("mlp")
    first = prof.render("chrome")
    assert prof.render("chrome") == first
    path = tmp_path / "step.trace.json"
    prof.save(str(path))  # the format follows the extension
    assert path.read_text(encoding="utf-8") == first
    # A saved JSON profile keeps its trace: the export is the same after loading it.
    saved = tmp_path / "step.json"
    prof.save(str(saved))
    assert layerscope.load(str(saved)).render("chrome") == first


def test_profile_keeps_its_op_pass_as_trace() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    prof = check_tree(layerscope.profile(model, torch.randn(2, 8), warmup=0, repeat=1))
    spans = prof.trace.spans
    assert [(s.path, s.phase) for s in spans if s.op_index < 0] == [("", "forward"), ("0", "forward"), ("1", "forward")]
    assert [prof[s.path].ops[s.op_index].name for s in spans if s.op_index >= 0] == ["aten::t", "aten::addmm", "aten::relu"]


def test_no_trace_no_chrome() -> None:
    model = nn.Sequential(nn.Linear(8, 8))
    untraced = layerscope.profile(model, torch.randn(2, 8), warmup=0, repeat=1, record_ops=False)
    assert untraced.trace is None
    with pytest.raises(ValueError, match="no trace"):
        untraced.render("chrome")
    with pytest.raises(ValueError, match="not timed"):
        layerscope.count_flops(model, torch.randn(2, 8)).render("chrome")


def test_flows_lead_from_forward_ops_to_their_backward() -> None:
    # MLP: every Linear's addmm creates an AddmmBackward0 node (and its weight's t a
    # TBackward0): each flow starts in a forward op of a module and ends at the first
    # backward op run for that node, which layerscope attributes to the same module.
    prof = _training_step("mlp")
    doc = _chrome(prof)
    spans = _spans(doc)
    starts = [e for e in doc["traceEvents"] if e["ph"] == "s"]
    finishes = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f"}
    assert starts and len(starts) == len(finishes) == len(prof.trace.flows)
    linear_paths = {node.path for node in prof.modules() if node.type == "Linear"}
    linked = set()
    for start in starts:
        end = finishes[start["id"]]
        assert end["bp"] == "e" and end["ts"] > start["ts"]
        forward = next(e for e in spans if e["cat"] == "op,forward" and e["ts"] == start["ts"])
        backward = next(e for e in spans if e["cat"] == "op,backward" and e["ts"] == end["ts"])
        assert forward["args"]["module"] == backward["args"]["module"]
        linked.add(forward["args"]["module"])
    assert linear_paths <= linked


def _two_spans(trace: list[list[Any]]) -> Profile:
    """Net > lin, with ``trace`` as the trace (hand-built; times in ns)."""
    end = max(start + duration for start, duration, *_ in trace)
    lin = ModuleNode(
        "lin", "Linear", parent="", depth=1, calls=1, forward=PhaseStats(cpu_time_ns=end, self_cpu_time_ns=end)
    )
    root = ModuleNode("", "Net", calls=1, forward=PhaseStats(cpu_time_ns=end, self_cpu_time_ns=0))
    link([root, lin])
    profile = check_tree(Profile(root, meta={"model": "Net"}))
    profile.trace = Trace.from_dict({"spans": trace})
    return profile


def test_spans_sharing_an_end_nest_when_read_as_floats() -> None:
    # Both spans end at 7367461 ns. Written as microseconds with three decimals, a
    # viewer's float sums differ: 7002.020 + 365.441 = 7367.461 for the child but
    # 7001.994 + 365.467 = 7367.460999999999 for its parent, so the child would cross
    # its parent's end.
    end = 7_367_461
    profile = _two_spans(
        [[7_001_994, end - 7_001_994, "", "forward", -1], [7_002_020, end - 7_002_020, "lin", "forward", -1]]
    )
    doc = _chrome(profile)
    assert crossing_spans(doc) == []
    [net, lin] = _spans(doc)
    assert net["ts"] + net["dur"] == lin["ts"] + lin["dur"]
    # Every boundary and duration still reads back to the exact nanosecond.
    read_back = [_ns(net["ts"]), _ns(net["dur"]), _ns(lin["ts"]), _ns(lin["dur"])]
    assert read_back == [7_001_994, 365_467, 7_002_020, 365_441]
    assert _ns(lin["ts"] + lin["dur"]) == end


def test_back_to_back_spans_touch_but_do_not_overlap_as_floats() -> None:
    # Siblings in a row: each one's float end is exactly the next one's float start.
    trace = [[0, 3_000_000, "", "forward", -1]]
    starts = [1, 333_334, 1_000_001, 1_999_999, 2_123_457]
    trace += [[a, b - a, "lin", "forward", -1] for a, b in zip(starts, [*starts[1:], 3_000_000])]
    doc = _chrome(_two_spans(trace))
    assert crossing_spans(doc) == []
    lins = [e for e in _spans(doc) if e["name"] == "lin"]
    assert [e["ts"] + e["dur"] for e in lins[:-1]] == [e["ts"] for e in lins[1:]]


def _gpt2_training_step() -> Profile:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=2, vocab_size=256, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters())
    with layerscope.Profiler(model) as prof:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    return check_tree(prof.profile)


def _zoo_backward(name: str) -> Profile:
    # What `layerscope profile zoo:NAME --backward --repeat 1` runs.
    entry = zoo.get(name)
    torch.manual_seed(0)
    model, inputs = entry.build(), entry.example_inputs(1)
    return check_tree(layerscope.profile(model, inputs, backward=True, warmup=1, repeat=1))


@pytest.mark.parametrize("make", ["zoo:gpt", "zoo:mlp", "step:gpt", "step:gpt2"])
def test_real_traces_nest_when_read_as_floats(make: str) -> None:
    # Backward spans run back to back, so many ends meet: before times were written on
    # a binary grid, 8 spans crossed in these gpt and mlp traces and 13 to 25 in GPT-2's.
    kind, name = make.split(":")
    if kind == "zoo":
        profile = _zoo_backward(name)
    else:
        profile = _gpt2_training_step() if name == "gpt2" else _training_step(name)
    doc = _chrome(profile)
    assert len(_spans(doc)) > 50
    assert crossing_spans(doc) == []


# -- the step, memory and how times were measured ---------------------------------------


def test_hand_built_step_span_has_its_own_track() -> None:
    # Net [100, 900) > lin [200, 700), in a step whose marks are 1000 ns apart.
    profile = _two_spans([[100, 800, "", "forward", -1], [200, 500, "lin", "forward", -1]])
    profile.trace.step_ns = 1000
    profile.meta.mode, profile.meta.step_range, profile.meta.detail_step = "context", [3, 5], 4
    doc = _chrome(profile)
    [step] = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]
    assert (step["name"], step["ts"], step["dur"], step["tid"]) == ("step 4", 0, 1, 0)
    assert step["args"] == {"step": 4, "step_ns": 1000}
    tracks = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert tracks == {0: "step", 1: "forward and backward"}
    assert {e["tid"] for e in _spans(doc)} == {1}
    # Without step marks (an old file, a pass without them) there is no step track.
    profile.trace.step_ns = None
    assert not [e for e in _chrome(profile)["traceEvents"] if e["ph"] == "X" and e["tid"] == 0]


def test_training_step_span_covers_every_span() -> None:
    prof = _training_step("mlp")
    doc = _chrome(prof)
    [step] = [e for e in doc["traceEvents"] if e.get("cat") == "step"]
    # A one-step block takes its times from the step it traced: its length is the step's.
    assert step["name"] == "step 0" and step["ts"] == 0
    assert _ns(step["dur"]) == prof.trace.step_ns == prof.figures.step_time_ns
    assert all(0 <= e["ts"] and e["ts"] + e["dur"] <= step["dur"] for e in _spans(doc))
    assert crossing_spans(doc) == []


def test_memory_peak_marks_its_categories() -> None:
    prof = _training_step("mlp")
    doc = _chrome(prof)
    [peak] = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    memory = prof.memory
    assert peak["name"] == "memory peak" and _ns(peak["ts"]) == memory.peak_at.t_ns
    categories = {k: v for k, v in peak["args"].items() if k not in ("bytes", "path", "phase")}
    assert categories == memory.peak_categories
    assert sum(categories.values()) == peak["args"]["bytes"] == memory.peak_bytes
    # The live-bytes counter reaches the same peak at the same time.
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "live memory"]
    top = max(counters, key=lambda e: e["args"]["bytes"])
    assert top["args"]["bytes"] == memory.peak_bytes and top["ts"] == peak["ts"]


def test_other_data_says_how_times_were_measured() -> None:
    entry = zoo.get("mlp")
    model, x = entry.build(), entry.example_inputs(4)
    with layerscope.Profiler(model) as prof:
        for _ in range(3):
            model(x).pow(2).mean().backward()
            prof.step()
    other = _chrome(check_tree(prof.profile))["otherData"]
    assert other["mode"] == "context" and other["steps"] == 3 and "counts_from" not in other
    assert other["trace_run"] == "step 2"
    assert other["times"].startswith("module times: the sum of 3 steps, each timed with its ops")
    assert "torch's profiler" in other["trace_times"] and "2^-12" in other["time_unit"]
    one = _chrome(_zoo_backward("mlp"))["otherData"]
    assert (one["mode"], one["trace_run"], one["repeat"]) == ("profile", "pass 1", 1)
    assert one["times"] == "every figure: the one pass after 1 warm-up, the traced run itself"
    # Older files said the dispatch mode under a second name (ops_from): still read.
    older = prof.profile.to_dict()
    older["meta"]["ops_from"] = "dispatch mode"
    said = _chrome(check_tree(profile_from_dict(older)))["otherData"]
    assert said["ops_from"] == "dispatch mode" and "under a dispatch mode" in said["trace_times"]
