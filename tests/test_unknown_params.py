"""A parameter count that is not known is unknown (None), never 0.

A profile built from a torch.profiler trace recorded without the model knows each
module's class and calls but not its parameters. Its ``params`` and ``params_total`` are
None on every node and its ``param_bytes`` None; every format shows them as unknown
("?" in text, null in JSON, an empty cell in CSV), a saved file reads back the same, and
a diff against it computes no change in params. A tree that knows some counts and not
others is refused by ``check_tree``.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

import layerscope
from layerscope.attribute import build_profile
from layerscope.base import formats
from layerscope.base.errors import SchemaError
from layerscope.model.check import InvariantError, check_tree, tree_problems
from layerscope.model.compile_info import CompileInfo, KernelTime
from layerscope.model.diff import diff
from layerscope.model.documents import profile_from_dict
from layerscope.model.ranks import merge
from layerscope.model.raw import Enter, Exit, LabelEnter, LabelExit, ModuleInfo, Op, RawCapture, Step
from layerscope.model.schema import document_problems
from layerscope.model.sidedocs import MemorySummary, Trace
from layerscope.model.tree import ModuleNode, OpStats, PhaseStats, Profile, link
from layerscope.render.html import report_data
from layerscope.render.text import STEP_COLUMNS

# -- a profile by hand: Net > encoder (Linear, one op) > a label; Net > head (Linear) ------
#
# Known counts: encoder 12 (a 3x4 weight), head 5 (4 + a bias), Net none of its own:
# Net's total 12 + 5 = 17, 68 bytes as float32. Times in ns: encoder 2000, head 1000,
# Net's own 500: 3500 in all.

KNOWN = {"": 0, "encoder": 12, "encoder[attn]": 0, "head": 5}


def _stats(total_ns: int, own_ns: int, flops: int, own_flops: int) -> PhaseStats:
    return PhaseStats(
        cpu_time_ns=total_ns, self_cpu_time_ns=own_ns, flops=flops, self_flops=own_flops, macs=flops // 2,
        self_macs=own_flops // 2, bytes=0, self_bytes=0,
    )


def hand_built(*, known: bool) -> Profile:
    """The tree above, with its counts (``known``) or without (None everywhere)."""

    def count(path: str, total: int) -> dict[str, int | None]:
        return {"params": KNOWN[path] if known else None, "params_total": total if known else None}

    addmm = OpStats(
        "aten::addmm", calls=1, cpu_time_ns=1500, self_cpu_time_ns=1500, input_shapes=[[2, 3], [3, 4]],
        flops=24, macs=12, bytes=0,
    )
    encoder = ModuleNode(
        "encoder", "Linear", parent="", depth=1, calls=1, forward=_stats(2000, 2000, 24, 24), ops=[addmm],
        extra_repr="in_features=3, out_features=4, bias=False", **count("encoder", 12),
    )
    label = ModuleNode(
        "encoder[attn]", "label", parent="encoder", depth=2, calls=1, kind="label", forward=_stats(0, 0, 0, 0),
        **count("encoder[attn]", 0),
    )
    head = ModuleNode("head", "Linear", parent="", depth=1, calls=1, forward=_stats(1000, 1000, 0, 0), **count("head", 5))
    root = ModuleNode("", "Net", calls=1, forward=_stats(3500, 500, 24, 0), **count("", 17))
    link([root, encoder, label, head])
    memory: dict[str, Any] = {
        "peak_bytes": 96, "baseline_bytes": 0, "peak_categories": {"activations": 96},
        "peak_at": {"path": "encoder", "phase": "forward", "t_ns": 1000},
        "timeline": {"t_ns": [0, 1000, 3500], "bytes": [0, 96, 0], "points_recorded": 3, "spans": []},
    }
    if known:
        memory["param_bytes_by_dtype"] = {"float32": 68}
    trace = {
        "spans": [[0, 3500, "", "forward", -1], [200, 2000, "encoder", "forward", -1],
                  [300, 1500, "encoder", "forward", 0], [2300, 1000, "head", "forward", -1]],
        "flows": [],
    }
    profile = Profile(
        root, meta={"model": "Net", "device": "cpu"}, param_bytes=68 if known else None,
        memory=MemorySummary.from_dict(memory), trace=Trace.from_dict(trace),
    )
    return check_tree(profile)


def compiled(profile: Profile) -> Profile:
    """``profile`` as a compiled model's: the ``kernels`` format draws only those. Its
    figures are the same (a compiled run's tree, op rows and counts are the eager ones)."""
    twin = copy.deepcopy(profile)
    twin.compiled = CompileInfo(
        backend="inductor", rule="split by node count", compile_time_ns=1000, frames=1, graphs=1,
        step_time_ns=3500, kernel_time_ns=3000,
        kernels=[KernelTime("k", "extern_kernels.addmm", 2000, {"encoder": 1.0}),
                 KernelTime("k", "cpp_fused_relu_0", 1000, {"head": 0.5, "": 0.5})],
    )
    return check_tree(twin)


def test_a_tree_without_counts_holds_its_invariants() -> None:
    profile = hand_built(known=False)
    assert all(node.params is None and node.params_total is None for node in profile.nodes())
    assert profile.param_bytes is None
    assert profile.totals["params"] is None and profile.totals["param_bytes"] is None
    # The same tree with counts: every total is its own count plus its children's.
    known = hand_built(known=True)
    assert [(n.path, n.params_total) for n in known.nodes()] == [("", 17), ("encoder", 12), ("encoder[attn]", 0), ("head", 5)]
    assert known.totals["params"] == 17 and known.totals["param_bytes"] == 68


# -- a mix is refused ---------------------------------------------------------------------


def test_a_tree_that_knows_some_counts_and_not_others_is_refused() -> None:
    # An unknown tree with one count filled in (a total too, so it adds up locally).
    profile = hand_built(known=False)
    profile.node("head").params = profile.node("head").params_total = 5
    problems = tree_problems(profile)
    assert any("params known for 1 node ('head') and unknown for 3 nodes" in p for p in problems), problems
    with pytest.raises(InvariantError, match="a profile knows every count or none"):
        check_tree(profile)

    # A known tree with one leaf's count missing: its parent's total no longer adds up
    # either (17 != 0 + 12 + unknown).
    profile = hand_built(known=True)
    profile.node("head").params = profile.node("head").params_total = None
    problems = tree_problems(profile)
    assert any("unknown for 1 node ('head')" in p for p in problems), problems
    assert "'': params_total != params + children" in problems
    with pytest.raises(InvariantError):
        check_tree(profile)


def test_an_unknown_count_with_a_known_total_is_refused() -> None:
    profile = hand_built(known=False)
    profile.node("head").params_total = 5  # a total of a count nobody knows
    problems = tree_problems(profile)
    assert "'head': params_total != params + children" in problems
    with pytest.raises(InvariantError):
        check_tree(profile)


# -- assembled from a capture -------------------------------------------------------------

# Net > a (Linear, 16 params) > c (ReLU, none); a label inside Net; a loss op and a
# backward op after the forward, so the step has parts (<loss>, <other>).
STREAM = [
    Step(0),
    Enter(10, 0, None, 1),
    Enter(20, 1, None, 1),
    Op(25, 35, "aten::addmm", input_shapes=[[2, 3], [3, 4]], flops=48, macs=24),
    Exit(40, 1, None, 2),
    LabelEnter(42, "attn", "label"),
    Op(44, 48, "aten::relu", input_shapes=[[2, 4]], flops=8, macs=0),
    LabelExit(50),
    Enter(52, 2, None, 2),
    Exit(56, 2, None, 2),
    Exit(60, 0, None, 2),
    Op(70, 80, "aten::mean", input_shapes=[[2, 4]], flops=8, macs=0),
    Op(90, 110, "AddmmBackward0", input_shapes=[[2, 4]], flops=96, macs=48, grad=(1, None)),
    Step(150),
]


def assembled(counts: tuple[int | None, int | None, int | None]) -> Profile:
    modules = [
        ModuleInfo(path="", type="Net", parent=None, depth=0, params=counts[0]),
        ModuleInfo(path="a", type="Linear", parent="", depth=1, params=counts[1]),
        ModuleInfo(path="c", type="ReLU", parent="", depth=1, params=counts[2]),
    ]
    raw = RawCapture(modules=modules, timing_passes=[STREAM], op_pass=STREAM, param_bytes=64, meta={"model": "Net"})
    return check_tree(build_profile(raw))


def test_assembly_keeps_known_counts_as_they_were() -> None:
    profile = assembled((0, 16, 0))
    by_path = {node.path: (node.kind, node.params, node.params_total) for node in profile.nodes()}
    assert by_path == {
        "": ("module", 0, 16), "a": ("module", 16, 16), "c": ("module", 0, 0),
        # Labels and step parts own no parameters: 0, where counts are known.
        "[attn]": ("label", 0, 0), "<loss>": ("loss", 0, 0), "<other>": ("other", 0, 0),
    }
    assert profile.param_bytes == 64


@pytest.mark.parametrize("counts", [(None, None, None), (0, None, 0)], ids=["none-known", "one-unknown"])
def test_assembly_without_counts_makes_every_count_unknown(counts: tuple[int | None, int | None, int | None]) -> None:
    # One module without a count makes the whole profile's unknown: never a mix.
    profile = assembled(counts)
    assert {node.path for node in profile.nodes()} == {"", "a", "c", "[attn]", "<loss>", "<other>"}
    assert all(node.params is None and node.params_total is None for node in profile.nodes())
    assert profile.param_bytes is None  # the capture's 64 bytes cannot be the counts' bytes
    text = profile.render("text")
    assert "Params:" in text and "Params: ?" in text
    assert "| Params |" not in text  # the step table has no params column either
    # The rest is the known profile's, figure for figure.
    known = assembled((0, 16, 0))
    keys = [column.key for column in STEP_COLUMNS if column.shown(known) and column.key != "params"]
    assert text.replace("Params: ?", "") == known.render("text", columns=keys).replace("Params: 16 (64 B)", "")


# -- every format ------------------------------------------------------------------------

PROFILE_FORMATS = formats.formats("profile")


def _render(profile: Profile, name: str) -> str | bytes:
    if name == "kernels":
        profile = compiled(profile)  # the only format that draws a compiled model's kernels alone
    if name == "png":
        pytest.importorskip("matplotlib")
    return formats.render(profile, name)


@pytest.mark.parametrize("name", PROFILE_FORMATS)
def test_every_format_renders_a_profile_without_counts(name: str) -> None:
    out = _render(hand_built(known=False), name)
    assert out
    known = _render(hand_built(known=True), name)
    if isinstance(out, str):
        # No format draws a count it does not have: neither 17 (the known total) nor
        # its parts appear as params, and a format without params reads the same.
        assert "68 B" not in out
        if "Params" not in known and "params" not in known:
            assert out == known


def test_the_text_tree_shows_no_count_it_does_not_have() -> None:
    text = hand_built(known=False).render("text")
    lines = text.split("\n")
    header = next(line for line in lines if line.startswith("Module "))
    assert "Params" not in header  # no column of blanks (or zeros) for an unknown figure
    assert "Params: ?" in text and "Params: 0" not in text
    assert "Memory: parameters ?" in text and "parameters 0 B" not in text
    # The known tree has the column and the footer its counts.
    known = hand_built(known=True).render("text")
    assert "Params" in next(line for line in known.split("\n") if line.startswith("Module "))
    assert "Params: 17 (68 B)" in known and "Memory: parameters 68 B float32" in known
    # Asking for the column is refused, naming the columns the profile has.
    with pytest.raises(layerscope.base.errors.RenderError, match="no column 'params'"):
        hand_built(known=False).render("text", columns=["self_cpu", "params"])
    # A narrow width hides columns and names them: params among them only where it exists.
    for known_counts, named in ((False, False), (True, True)):
        narrow = hand_built(known=known_counts).render("text", width=60)
        assert ("params" in narrow[narrow.index("Hidden to fit") :]) is named


def test_the_model_and_deepspeed_views_show_unknown_counts_as_unknown() -> None:
    profile = hand_built(known=False)
    model = profile.render("model")
    assert "Params: ?" in model
    assert re.findall(r"[\d.]+[KMG]? = [\d.]+% Params", model) == []  # no count, no share of one
    assert model.count("? Params") == 4  # Net, encoder, its label, head
    assert "module types by params" not in model
    deepspeed = profile.render("deepspeed")
    assert re.search(r"params per GPU: +\?\n", deepspeed)
    assert re.search(r"params of model = params per GPU \* mp_size: +\?\n", deepspeed)
    assert "0 = 0% Params" not in deepspeed and deepspeed.count("? Params") == 3  # modules only
    assert "= 0% Params" not in deepspeed


def test_json_and_csv_write_unknown_counts_as_null_and_empty() -> None:
    profile = hand_built(known=False)
    doc = json.loads(profile.render("json"))
    assert doc["totals"]["params"] is None and doc["totals"]["param_bytes"] is None
    assert [(m["params"], m["params_total"]) for m in doc["modules"]] == [(None, None)] * 4
    rows = list(csv.DictReader(io.StringIO(profile.render("csv"))))
    assert [(row["params"], row["params_total"]) for row in rows] == [("", "")] * 4
    known_rows = list(csv.DictReader(io.StringIO(hand_built(known=True).render("csv"))))
    assert [row["params_total"] for row in known_rows] == ["17", "12", "0", "5"]
    data = report_data(profile)
    assert data["param_bytes"] is None
    assert [(n["params"], n["params_total"]) for n in data["nodes"]] == [(None, None)] * 4


# -- saved and read back ------------------------------------------------------------------


@pytest.mark.parametrize("known", [False, True], ids=["unknown", "known"])
def test_a_saved_profile_reads_back_with_its_counts_or_without(known: bool, tmp_path: Path) -> None:
    profile = hand_built(known=known)
    path = tmp_path / "profile.json"
    profile.save(path)
    loaded = layerscope.load(path)
    assert isinstance(loaded, Profile)
    assert loaded.to_dict() == profile.to_dict()
    assert [n.params_total for n in loaded.nodes()] == [n.params_total for n in profile.nodes()]
    assert loaded.param_bytes == profile.param_bytes
    assert loaded.render("text") == profile.render("text")


def test_the_schema_takes_null_counts_but_not_other_values() -> None:
    doc = hand_built(known=False).to_dict()
    assert document_problems(doc) == []
    for bad in ("12", 1.5, True):
        damaged = copy.deepcopy(doc)
        damaged["modules"][1]["params"] = bad
        assert any("modules[1].params" in p for p in document_problems(damaged))
    # The field stays required: a file that leaves it out is damaged, not unknown.
    damaged = copy.deepcopy(doc)
    del damaged["modules"][1]["params_total"]
    with pytest.raises(SchemaError, match="params_total"):
        profile_from_dict(damaged)
    # A file that mixes known and unknown counts is refused at the door.
    mixed = copy.deepcopy(doc)
    mixed["modules"][3]["params"] = mixed["modules"][3]["params_total"] = 5
    with pytest.raises(SchemaError, match="a profile knows every count or none"):
        profile_from_dict(mixed)


# -- diff ---------------------------------------------------------------------------------


def test_a_diff_computes_no_change_in_counts_it_does_not_have() -> None:
    unknown, known = hand_built(known=False), hand_built(known=True)
    same = diff(unknown, unknown)
    assert same.summary["params"].base is None and same.summary["params"].new is None
    for base, new in ((known, unknown), (unknown, known)):
        change = diff(base, new).summary["params"]
        assert change.delta is None and change.relative is None  # unknown, not -17 or +17
        assert {change.base, change.new} == {17, None}
    against = diff(known, unknown)
    assert against.regressions(0.0) == []
    for name in formats.formats("diff"):
        for result in (same, against, diff(unknown, known)):
            assert formats.render(result, name)
    text = against.render("text")
    params_row = next(line for line in text.split("\n") if line.startswith("Params"))
    assert "17" in params_row and "-17" not in params_row and "%" not in params_row
    assert "Params" not in same.render("text")  # neither side has it: no row
    doc = json.loads(against.render("json"))
    assert doc["summary"]["params"] == {"base": 17, "new": None, "delta": None, "relative": None}


# -- ranks --------------------------------------------------------------------------------


def _rank(profile: Profile, rank: int) -> Profile:
    twin = copy.deepcopy(profile)
    twin.meta.rank, twin.meta.world_size, twin.meta.run_id = rank, 2, "run"
    twin.trace = None
    return twin


def test_ranks_without_counts_merge_and_a_rank_without_makes_the_runs_unknown(tmp_path: Path) -> None:
    known, unknown = hand_built(known=True), hand_built(known=False)
    both_known = merge([_rank(known, 0), _rank(known, 1)])
    assert [shape.params_total for shape in both_known.nodes] == [17, 12, 0, 5]

    for ranks in ([_rank(unknown, 0), _rank(unknown, 1)], [_rank(known, 0), _rank(unknown, 1)],
                  [_rank(unknown, 0), _rank(known, 1)]):
        run = merge(ranks)
        # Not a mismatch (the same model), and never a mix: the run's counts are unknown.
        assert all(shape.params is None and shape.params_total is None for shape in run.nodes)
        assert [record.param_bytes for record in run.ranks] == [None, None]
        for record in run.ranks:
            rebuilt = run.rank_profile(record.rank)
            assert rebuilt.param_bytes is None and rebuilt.root.params_total is None
        for name in formats.formats("ranks"):
            assert formats.render(run, name)
        path = tmp_path / "run.json"
        run.save(path)
        loaded = layerscope.load(path)
        assert loaded.to_dict() == run.to_dict()

    # Merging again gives the same document, whichever way it is grouped.
    a, b = _rank(known, 0), _rank(unknown, 1)
    assert merge([merge([a]), b]).to_dict() == merge([a, merge([b])]).to_dict() == merge([b, a]).to_dict()


# -- in a browser ---------------------------------------------------------------------------


@pytest.mark.browser
def test_the_page_shows_unknown_counts_as_unknown(browser: Any, tmp_path: Path) -> None:
    path = tmp_path / "unknown.html"
    hand_built(known=False).save(path)
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready]", timeout=10_000)
    facts = dict(page.eval_on_selector_all(
        "header dl .fact", "facts => facts.map(f => [f.querySelector('dt').textContent, f.querySelector('dd').textContent])"
    ))
    assert facts["params"] == "?"
    headers = page.eval_on_selector_all("#tree-table thead th", "ths => ths.map(th => th.textContent)")
    assert "Params" not in headers and "Calls" in headers
    assert errors == []
    page.close()
