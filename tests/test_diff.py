"""``layerscope.diff`` and ``layerscope diff``: what got slower between two profiles, and where.

Every test builds its profiles with the fake clock (every read advances a fixed step) and
then moves chosen self times by hand, keeping every invariant: no test compares two real
timings, which a busy machine can reorder. The planted regression (a layer twice as wide)
runs the real model for its exact FLOP counts and takes its times from the fake clock plus
the time its extra multiply-adds cost; how faithfully real module times are measured is
benchmarks/fidelity.py's question.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
from conftest import FakeClock
from layerscope.model.diff import Change, ProfileDiff, parse_duration_ns, parse_threshold
from layerscope.model.documents import profile_from_dict
from test_cli import assert_usage_error, run_cli

BATCH = 2


def _net(hidden: int = 16, *, swap: bool = False, extra: bool = False) -> nn.Module:
    """embed (8 -> hidden), act, head (hidden -> 4). ``swap`` replaces ``act`` (ReLU) by
    ``gelu`` (GELU); ``extra`` appends ``norm``."""
    layers: OrderedDict[str, nn.Module] = OrderedDict(embed=nn.Linear(8, hidden))
    layers["gelu" if swap else "act"] = nn.GELU() if swap else nn.ReLU()
    layers["head"] = nn.Linear(hidden, 4)
    if extra:
        layers["norm"] = nn.LayerNorm(4)
    return nn.Sequential(layers)


def _profile(model: nn.Module, *, step_ns: int = 1000, batch: int = BATCH, **options: Any) -> layerscope.Profile:
    """A fake-clock profile. Without ops by default: each leaf module then takes one tick,
    the figures below are counted from; ``record_ops=True`` adds the ops' ticks."""
    torch.manual_seed(0)
    options.setdefault("memory", False)
    options.setdefault("record_ops", False)
    prof = layerscope.profile(
        model, torch.randn(batch, 8), warmup=1, repeat=3, clock=FakeClock(step_ns), **options
    )
    return layerscope.check_tree(prof)


def _slower(profile: layerscope.Profile, extra_self_ns: dict[str, int]) -> layerscope.Profile:
    """``profile`` with the forward self time of each path moved by ``extra_self_ns``; the
    totals of its ancestors and the step move with it, so every invariant still holds
    (``profile_from_dict`` checks them)."""
    doc = profile.to_dict()
    entries = {entry["path"]: entry for entry in doc["modules"] + doc["parts"]}
    for path, extra in extra_self_ns.items():
        entries[path]["forward"]["self_cpu_time_ns"] += extra
        node: str | None = path
        while node is not None:
            entries[node]["forward"]["cpu_time_ns"] += extra
            node = entries[node]["parent"]
        if doc["meta"].get("step_time_ns") is not None:
            _longer_step(doc["meta"], extra)
    return layerscope.check_tree(profile_from_dict(doc))


def _longer_step(meta: dict[str, Any], extra: int) -> None:
    """The step's time and the shown pass's wall clock moved together (check_tree
    compares the two)."""
    meta["step_time_ns"] += extra
    meta["step_times_ns"][meta["shown_pass"]] += extra


def _moved(
    profile: layerscope.Profile, extra_ns: dict[str, int], *, phase: str = "forward", time: str = "cpu"
) -> layerscope.Profile:
    """``profile`` with the self ``time`` (``cpu`` or ``device``) of each path in
    ``phase`` moved by ``extra_ns``, its ancestors' totals with it (the step too, for CPU
    time), every invariant kept."""
    doc = profile.to_dict()
    entries = {entry["path"]: entry for entry in doc["modules"] + doc["parts"]}
    for path, extra in extra_ns.items():
        entries[path][phase][f"self_{time}_time_ns"] += extra
        node: str | None = path
        while node is not None:
            entries[node][phase][f"{time}_time_ns"] += extra
            node = entries[node]["parent"]
        if time == "cpu" and doc["meta"].get("step_time_ns") is not None:
            _longer_step(doc["meta"], extra)
    return layerscope.check_tree(profile_from_dict(doc))


def _paths(diff: ProfileDiff) -> list[str]:
    return [row.path for row in diff.rows]


# -- matching -------------------------------------------------------------------------


def test_added_and_removed_modules_are_marked() -> None:
    base = _profile(_net(), record_ops=True)
    new = _profile(_net(swap=True, extra=True), record_ops=True)
    result = layerscope.diff(base, new)
    status = {row.path: row.status for row in result.rows}
    assert status == {"": "matched", "embed": "matched", "head": "matched",
                      "act": "removed", "gelu": "added", "norm": "added"}
    act, gelu = result.row("act"), result.row("gelu")
    assert (act.type_base, act.type_new) == ("ReLU", None)
    # Each takes three ticks: its call, and its one op's start and end.
    assert act["self_time_ns"] == Change(3000, None)
    assert (gelu["self_time_ns"].base, gelu["self_time_ns"].new) == (None, 3000)
    assert gelu["self_time_ns"].delta is None and gelu["flops"].delta is None
    # Their ops go with them.
    op_status = {(row.path, row.op): row.status for row in result.op_rows}
    assert op_status[("act", "aten::relu")] == "removed"
    assert op_status[("gelu", "aten::gelu")] == "added"
    assert op_status[("norm", "aten::native_layer_norm")] == "added"
    # The text marks them in the Note column; matched rows have no note.
    lines = {line.split(" | ")[0].strip(): line for line in result.render().splitlines() if " | " in line}
    assert lines["act"].endswith("| removed")
    assert lines["gelu"].endswith("| added") and lines["norm"].endswith("| added")
    assert lines["embed"].endswith("|")
    # Added and removed modules are never regressions, even with no noise floor.
    assert all(r.path not in ("gelu", "norm", "act") for r in result.regressions(0.0, min_time_ns=0))


def test_a_path_that_changed_type_is_noted() -> None:
    swapped = _net()
    swapped.act = nn.Tanh()  # same path, another module
    result = layerscope.diff(_profile(_net(), record_ops=True), _profile(swapped, record_ops=True))
    row = result.row("act")
    assert row.status == "matched" and (row.type_base, row.type_new) == ("ReLU", "Tanh")
    line = next(line for line in result.render().splitlines() if line.startswith("act "))
    assert "| Tanh " in line and line.endswith("| was ReLU")


def test_rows_are_sorted_by_absolute_change_in_self_time() -> None:
    prof = _profile(_net())
    base = _slower(prof, {"head": 10_000})  # head: 11us in base, 1us in new: -10us
    new = _slower(prof, {"embed": 5_000})  # embed: 1us in base, 6us in new: +5us
    result = layerscope.diff(base, new)
    # head (|-10us|) before embed (+5us); the unchanged rows after them, by path.
    assert _paths(result) == ["head", "embed", "", "act"]
    head, embed = result.row("head")["self_time_ns"], result.row("embed")["self_time_ns"]
    assert (head.base, head.new, head.delta) == (11_000, 1_000, -10_000)
    assert head.relative == pytest.approx(-10 / 11)
    assert (embed.delta, embed.relative) == (5_000, 5.0)
    # Totals of the ancestors follow: the root's total moved by 5us - 10us.
    assert result.row("")["time_ns"].delta == -5_000
    assert result.summary["time_ns"].delta == -5_000
    text = result.render()
    assert "-10.00us" in text and "-90.9%" in text and "+5.000us" in text and "+500.0%" in text


def test_ops_match_by_module_phase_name_and_input_shapes() -> None:
    # A larger batch changes addmm's and relu's input shapes but not the weight's
    # transpose (aten::t of the [16, 8] weight): t matches as it is; addmm, alone of its
    # name in its module and phase on each side, matches by name with its shape change.
    result = layerscope.diff(_profile(_net(), record_ops=True), _profile(_net(), batch=3, record_ops=True))
    by_key = {(row.path, row.op, json.dumps(row.input_shapes)): row for row in result.op_rows}
    assert by_key[("embed", "aten::t", "[[16, 8]]")].status == "matched"
    assert by_key[("embed", "aten::t", "[[16, 8]]")].new_input_shapes is None
    addmm = by_key[("embed", "aten::addmm", "[[16], [2, 8], [8, 16]]")]
    assert addmm.status == "matched" and addmm.new_input_shapes == [[16], [3, 8], [8, 16]]
    assert addmm["flops"].delta == 2 * 8 * 16 + 16  # one more row of the batch
    assert by_key[("head", "aten::addmm", "[[4], [2, 16], [16, 4]]")].status == "matched"
    assert not any(row.status != "matched" for row in result.op_rows)
    text = result.render()
    assert "[[16], [2, 8], [8, 16]] -> [[16], [3, 8], [8, 16]]" in text
    assert result.to_dict()["op_rows"][0].get("new_input_shapes") is not None or any(
        row.get("new_input_shapes") for row in result.to_dict()["op_rows"]
    )
    # The same op in two modules is two rows.
    assert by_key[("head", "aten::t", "[[4, 16]]")].status == "matched"
    # With backward, each phase's ops are their own rows; a profile against itself
    # matches every one of them.
    step = _profile(_net(), backward=True, record_ops=True)
    own = layerscope.diff(step, step)
    phases = {row.phase for row in own.op_rows}
    assert phases == {"forward", "backward"}
    assert {row.status for row in own.op_rows} == {"matched"}
    assert len(own.op_rows) == len({(n.path, o.phase, o.name, json.dumps(o.input_shapes))
                                    for n in step.nodes() for o in n.ops})
    assert own.changed_ops() == []


def test_ops_with_several_call_sites_are_compared_as_one() -> None:
    # With with_stack, one (module, phase, name, shapes) can hold one entry per call
    # site; the diff adds them up rather than matching them one by one.
    prof = _profile(_net(), record_ops=True)
    doc = prof.to_dict()
    head = next(entry for entry in doc["modules"] if entry["path"] == "head")
    addmm = next(op for op in head["ops"] if op["name"] == "aten::addmm")
    head["ops"].append(dict(addmm, stack=["train.py:42"]))
    # The second call site's FLOPs, MACs and bytes are the module's too, and its parents'.
    by_path = {entry["path"]: entry for entry in doc["modules"]}
    for field in ("flops", "macs", "bytes"):
        head["forward"][f"self_{field}"] += addmm[field]
        path = "head"
        while path is not None:
            by_path[path]["forward"][field] += addmm[field]
            path = by_path[path]["parent"]
    twice = profile_from_dict(doc)
    rows = [row for row in layerscope.diff(prof, twice).op_rows if (row.path, row.op) == ("head", "aten::addmm")]
    assert len(rows) == 1
    assert rows[0]["self_time_ns"].new == 2 * rows[0]["self_time_ns"].base
    assert rows[0]["flops"].new == 2 * rows[0]["flops"].base


# -- thresholds and the noise floor ---------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10%", 0.1), ("0.1", 0.1), ("12.5%", 0.125), (" 5 % ", 0.05), ("0", 0.0), ("150%", 1.5), (".25", 0.25)],
)
def test_parse_threshold(text: str, expected: float) -> None:
    assert parse_threshold(text) == pytest.approx(expected)


@pytest.mark.parametrize(("text", "hint"), [("10", "ambiguous"), ("abc", "10%"), ("-5%", "10%"), ("", "10%"), ("nan", "10%")])
def test_parse_threshold_refuses(text: str, hint: str) -> None:
    with pytest.raises(ValueError, match=hint):
        parse_threshold(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("50us", 50_000), ("1ms", 1_000_000), ("200ns", 200), ("1500", 1500), ("0.5s", 500_000_000), ("2µs", 2000), ("1.5 ms", 1_500_000)],
)
def test_parse_duration(text: str, expected: int) -> None:
    assert parse_duration_ns(text) == expected


@pytest.mark.parametrize("text", ["5parsecs", "-1us", "us", "1e3"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="50us"):
        parse_duration_ns(text)


@pytest.fixture(scope="module")
def floor_pair() -> tuple[layerscope.Profile, layerscope.Profile]:
    """embed takes 1ms in base and 1.3ms in new (+30%); act 1us and 6us (+500%): the
    model as a whole is 30.3us (2.9%) slower."""
    prof = _profile(_net())
    base = _slower(prof, {"embed": 999_000})
    return base, _slower(base, {"embed": 300_000, "act": 5_000})


def test_noise_floor_ignores_tiny_modules(floor_pair: tuple[layerscope.Profile, layerscope.Profile]) -> None:
    result = layerscope.diff(*floor_pair)
    assert result.row("act")["self_time_ns"].relative == pytest.approx(5.0)
    # act (6us at most) is under the default 50us floor: only embed regressed. The model
    # total moved by 305us of 1.006ms, 30.3%.
    found = result.regressions(0.1)
    assert [(r.path, r.metric) for r in found] == [(None, "time_ns"), ("embed", "self_time_ns")]
    assert [str(r) for r in found] == ["model total (forward time) +30.3%", "embed (forward self_cpu) +30.0%"]
    # With no floor, act counts too, after embed (rows come largest change first).
    assert [r.path for r in result.regressions(0.1, min_time_ns=0)] == [None, "embed", "act"]
    assert [r.path for r in result.regressions(0.1, min_time_ns="6us")] == [None, "embed", "act"]
    assert [r.path for r in result.regressions(0.1, min_time_ns="6.001us")] == [None, "embed"]
    # The diff's own floor is the default.
    assert [r.path for r in layerscope.diff(*floor_pair, min_time_ns=0).regressions(0.1)] == [None, "embed", "act"]
    # Only what grew by more than the threshold: 30% is not above 30%, or 50%.
    assert result.regressions(0.5) == []
    assert [r.path for r in result.regressions("30%")] == [None]


def test_thresholds_as_percent_and_fraction_agree(floor_pair: tuple[layerscope.Profile, layerscope.Profile]) -> None:
    result = layerscope.diff(*floor_pair)
    assert result.regressions("10%") == result.regressions(0.1) == result.regressions("0.1")
    assert result.regressions("31%") == result.regressions(0.31) == []
    with pytest.raises(ValueError, match="ambiguous"):
        result.regressions("10")


def test_tiny_module_regressing_500_percent_below_the_floor_does_not_fail(tmp_path: Path) -> None:
    # embed holds 1ms in both; act goes from 1us to 6us (+500%), the model +0.5%.
    base = _slower(_profile(_net()), {"embed": 999_000})
    base.save(tmp_path / "base.json")
    _slower(base, {"act": 5_000}).save(tmp_path / "new.json")
    run = run_cli("diff", "base.json", "new.json", "--fail-above", "10%", cwd=tmp_path)
    assert run.returncode == 0, run
    assert run.stdout.rstrip().endswith("No regression above 10%.")
    assert "+500.0%" in run.stdout
    # Without the floor, it fails and names it.
    run = run_cli("diff", "base.json", "new.json", "--fail-above", "10%", "--min-time", "0", cwd=tmp_path)
    assert run.returncode == 1, run
    assert run.stdout.rstrip().endswith("Regressed above 10%: act (forward self_cpu) +500.0%")


# -- different models and modes -------------------------------------------------------


class Wide(nn.Module):
    """The same paths as ``_net()`` plus ``extra``, under another class name."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.head = nn.Linear(16, 4)
        self.extra = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.extra(self.head(self.act(self.embed(x))))


def test_different_models_warn_and_compare_the_paths_they_share() -> None:
    result = layerscope.diff(_profile(_net(), record_ops=True), _profile(Wide(), record_ops=True))
    assert len(result.warnings) == 1
    assert "different models: base is Sequential, new is Wide" in result.warnings[0]
    assert "4 paths they share" in result.warnings[0]  # "", embed, act, head
    assert {row.path: row.status for row in result.rows} == {
        "": "matched", "embed": "matched", "act": "matched", "head": "matched", "extra": "added",
    }
    # Matched paths compare for real: embed is the same layer in both, FLOPs to the unit.
    # 2 * 2 * 8 * 16 multiply-adds + 2 * 16 bias adds = 544.
    embed = result.row("embed")["flops"]
    assert (embed.base, embed.new, embed.delta) == (544, 544, 0)
    text = result.render()
    assert "Warning: different models: base is Sequential, new is Wide" in text.splitlines()[1]


def test_forward_only_against_a_step_compares_the_forward_phase() -> None:
    forward, step = _profile(_net()), _profile(_net(), backward=True)
    result = layerscope.diff(forward, step)
    assert any(w.startswith("different modes: base is forward-only, new is a step with backward") for w in result.warnings)
    assert result.phases == ("forward",) and result.total_kind == "forward"
    # The forward is the same calls timed by the same fake clock: nothing moved in it.
    for path in ("", "embed", "act", "head"):
        assert result.row(path)["self_time_ns"].delta == 0, path
    assert result.summary["time_ns"].delta == 0
    assert {row.path for row in result.rows if row.status == "added"} == {"<loss>", "<other>"}
    # With ops: the same FLOPs, and only forward op rows compared.
    counted = layerscope.diff(_profile(_net(), record_ops=True), _profile(_net(), backward=True, record_ops=True))
    for path in ("", "embed", "act", "head"):
        assert counted.row(path)["flops"].delta == 0, path
    assert {row.phase for row in counted.op_rows} == {"forward"}
    step = _profile(_net(), backward=True, record_ops=True)
    # Two steps compare the whole step, backward included.
    both = layerscope.diff(step, step)
    assert both.warnings == [] and both.total_kind == "step"
    assert both.summary["time_ns"].base == step.step_time_ns
    assert both.row("head")["flops"].base == step["head"].forward.flops + step["head"].backward.flops


def _with_device_time(profile: layerscope.Profile) -> layerscope.Profile:
    """``profile`` as if run on an accelerator: each device time equal to its CPU time
    (so they add up through the tree just as the CPU times do)."""
    doc = profile.to_dict()
    for entry in doc["modules"] + doc["parts"]:
        for phase in ("forward", "backward", "recompute"):
            if entry[phase] is not None:
                entry[phase]["device_time_ns"] = entry[phase]["cpu_time_ns"]
                entry[phase]["self_device_time_ns"] = entry[phase]["self_cpu_time_ns"]
        for op in entry["ops"]:
            op["device_time_ns"], op["self_device_time_ns"] = op["cpu_time_ns"], op["self_cpu_time_ns"]
    return layerscope.check_tree(profile_from_dict(doc))


def test_device_time_is_compared_when_both_have_it() -> None:
    prof = _profile(_net())
    base, new = _with_device_time(prof), _with_device_time(_slower(prof, {"embed": 5_000}))
    result = layerscope.diff(base, new)
    device = result.row("embed")["device_time_ns"]
    assert (device.base, device.new, device.delta) == (1_000, 6_000, 5_000)
    assert result.summary["device_time_ns"].delta == 5_000
    header = next(line for line in result.render().splitlines() if line.startswith("Module "))
    assert "Device Δ" in header and "Device Δ%" in header
    # One side on the CPU: nothing to compare, and no device columns (the summary
    # still shows the one side's device time).
    mixed = layerscope.diff(base, _slower(prof, {"embed": 5_000}))
    assert mixed.row("embed")["device_time_ns"].delta is None
    assert "Device Δ" not in mixed.render()
    assert "Device time  | 7.000us |         |" in mixed.render()


# -- the metric: what orders the rows and what the gate judges --------------------------


@pytest.fixture(scope="module")
def device_pair() -> tuple[layerscope.Profile, layerscope.Profile]:
    """Both on an accelerator. Base: embed and head 1ms of self time each, on the CPU and
    on the device alike. New: embed's CPU time +300us (+30%) while its device time fell
    by 500us (-50%); head's device time +200us (+20%), its CPU time unchanged."""
    base = _with_device_time(_slower(_profile(_net()), {"embed": 999_000, "head": 999_000}))
    new = _moved(_moved(base, {"embed": 300_000}), {"embed": -500_000, "head": 200_000}, time="device")
    return base, new


def test_device_time_is_the_default_metric_when_both_sides_have_it(
    device_pair: tuple[layerscope.Profile, layerscope.Profile],
) -> None:
    result = layerscope.diff(*device_pair)
    assert result.metric == "self_device"
    # Ordered by the change in self device time: embed (|-500us|), head (+200us), the rest.
    assert _paths(result) == ["embed", "head", "", "act"]
    # Gated on it too: head grew 20%; embed's CPU +30% is not what is judged. The model's
    # device time: 4us (root) + 1ms + 1us + 1ms = 2.005ms, then 300us less: -15%, no
    # regression, whereas its CPU time grew by 300us.
    found = result.regressions(0.1)
    assert [(r.path, r.metric, r.phase) for r in found] == [("head", "self_device_time_ns", "forward")]
    assert (found[0].change.base, found[0].change.new) == (1_000_000, 1_200_000)
    assert str(found[0]) == "head (forward self_device) +20.0%"
    assert result.model_change() == Change(2_005_000, 1_705_000)
    text = result.render(limit=2)
    assert "Modules, largest change in self device time first:" in text
    header = next(line for line in text.splitlines() if line.startswith("Module "))
    # The metric's own figures first, after the names.
    assert header.split(" | ")[2:6] == ["Self dev base", "Self dev new", "Self dev Δ", "Self dev Δ%"]


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        # CPU: embed +30% (1ms -> 1.3ms); the model's forward time 2.005ms -> 2.305ms, +15.0%.
        ("self_cpu", ["model total (forward time) +15.0%", "embed (forward self_cpu) +30.0%"]),
        # Totals: the root's total grows with embed's (2.005ms -> 2.305ms).
        # Totals: the root's total grows with embed's (2.005ms -> 2.305ms); equal gains
        # come by path.
        ("total_cpu", ["model total (forward time) +15.0%", "(root) (forward total_cpu) +15.0%", "embed (forward total_cpu) +30.0%"]),
        # The root's device total falls by 300us: only head, +20%.
        ("total_device", ["head (forward total_device) +20.0%"]),
    ],
)
def test_metric_chooses_what_is_gated(
    device_pair: tuple[layerscope.Profile, layerscope.Profile], metric: str, expected: list[str],
) -> None:
    result = layerscope.diff(*device_pair, metric=metric)
    assert result.metric == metric
    assert [str(r) for r in result.regressions(0.1)] == expected


def test_metric_on_the_command_line(device_pair: tuple[layerscope.Profile, layerscope.Profile], tmp_path: Path) -> None:
    device_pair[0].save(tmp_path / "base.json")
    device_pair[1].save(tmp_path / "new.json")
    run = run_cli("diff", "base.json", "new.json", "--fail-above", "25%", cwd=tmp_path)
    assert run.returncode == 0, run  # head's device time grew 20%, not above 25%
    run = run_cli("diff", "base.json", "new.json", "--fail-above", "25%", "--metric", "self_cpu", cwd=tmp_path)
    assert run.returncode == 1, run
    assert run.stdout.splitlines()[-1] == "Regressed above 25%: embed (forward self_cpu) +30.0%"
    doc = json.loads(run_cli("diff", "base.json", "new.json", "--metric", "total_cpu", "--format", "json", cwd=tmp_path).stdout)
    assert doc["metric"] == "total_cpu" and doc["rows"][0]["path"] == ""  # the root's total moved most
    line = assert_usage_error(run_cli("diff", "base.json", "new.json", "--metric", "self_gpu", cwd=tmp_path))
    assert line.endswith("--metric: unknown metric 'self_gpu'; expected one of: self_cpu, total_cpu, self_device, "
                         "total_device, self_flops, total_flops, self_alloc, total_alloc")
    _profile(_net()).save(tmp_path / "cpu.json")
    line = assert_usage_error(run_cli("diff", "base.json", "cpu.json", "--metric", "self_device", cwd=tmp_path))
    assert line.endswith("--metric: new did not measure self device time (a run on an accelerator): cannot order or gate by self_device")


def test_each_phase_is_gated_on_its_own_and_named(tmp_path: Path) -> None:
    # A training step: head's forward self time falls by 600us while its backward grows
    # by 300us. Summed, head is 300us faster; the backward alone is +300us on 1ms, +30%.
    step = _profile(_net(), backward=True, record_ops=True)
    base = _moved(_slower(step, {"head": 999_000}), {"head": 1_000_000 - step["head"].backward.self_cpu_time_ns}, phase="backward")
    new = _moved(_moved(base, {"head": -600_000}), {"head": 300_000}, phase="backward")
    result = layerscope.diff(base, new)
    assert result.row("head")["self_time_ns"].delta == -300_000
    found = [r for r in result.regressions(0.1) if r.path is not None]
    assert [(r.path, r.phase, r.change.base, r.change.new) for r in found] == [("head", "backward", 1_000_000, 1_300_000)]
    assert str(found[0]) == "head (backward self_cpu) +30.0%"
    assert found[0].to_dict()["phase"] == "backward"


def _two_linears() -> nn.Module:
    """first (8 -> 8), proj (8 -> 4, no bias). In proj's backward the input's gradient is
    mm(grad [B, 4], weight [4, 8]) and the weight's mm(grad.t() [4, B], input [B, 8]): at
    batch 4 both are [[4, 4], [4, 8]], one op entry of 2 calls; at batch 8 they differ."""
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(first=nn.Linear(8, 8), proj=nn.Linear(8, 4, bias=False)))


def test_ops_paired_across_shapes_compare_all_their_calls() -> None:
    base = _profile(_two_linears(), batch=4, backward=True, record_ops=True)
    new = _profile(_two_linears(), batch=8, backward=True, record_ops=True)
    result = layerscope.diff(base, new)
    rows = [r for r in result.op_rows if (r.path, r.op, r.phase) == ("proj", "aten::mm", "backward")]
    assert len(rows) == 1 and rows[0].status == "matched"
    mm = rows[0]
    # 2 calls of 2*4*4*8 = 256 FLOPs at batch 4; at batch 8, 2*8*4*8 = 512 (the input's
    # gradient) and 2*4*8*8 = 512 (the weight's): the batch doubled, so did the FLOPs.
    assert (mm["flops"].base, mm["flops"].new, mm["flops"].delta) == (512, 1024, 512)
    assert [(s.input_shapes, s.calls) for s in mm.shapes_base] == [([[4, 4], [4, 8]], 2)]
    assert [(s.input_shapes, s.calls) for s in mm.shapes_new] == [([[4, 8], [8, 8]], 1), ([[8, 4], [4, 8]], 1)]
    # Both sides' shapes are shown, with the calls each figure sums.
    line = next(line for line in result.render().splitlines() if line.startswith("aten::mm ") and "| backward |" in line and "| proj " in line)
    assert "[[4, 4], [4, 8]] x2 -> [[4, 8], [8, 8]] x1, [[8, 4], [4, 8]] x1" in line
    cells = [cell.strip() for cell in line.split("|")]
    assert cells[-4:-1] == ["512", "1.02K", "+512"]  # FLOPs base, new, change: each side's own
    doc = next(r for r in result.to_dict()["op_rows"] if (r["path"], r["op"], r["phase"]) == ("proj", "aten::mm", "backward"))
    assert doc["shapes_base"] == [{"input_shapes": [[4, 4], [4, 8]], "calls": 2}]
    assert [s["calls"] for s in doc["shapes_new"]] == [1, 1]
    # The forward's one addmm-free mm changes shape alone: base -> new, as before.
    forward = next(r for r in result.op_rows if (r.path, r.op, r.phase) == ("proj", "aten::mm", "forward"))
    assert (forward.input_shapes, forward.new_input_shapes) == ([[4, 8], [8, 4]], [[8, 8], [8, 4]])
    assert (forward["flops"].base, forward["flops"].new) == (2 * 4 * 8 * 4, 2 * 8 * 8 * 4)


def test_untimed_counts_compare_flops_only() -> None:
    base = layerscope.count_flops(_net(), torch.randn(BATCH, 8))
    new = layerscope.count_flops(_net(hidden=32), torch.randn(BATCH, 8))
    result = layerscope.diff(base, new)
    assert not result.timed and result.warnings == []
    assert all(change.base is None for change in (result.summary["time_ns"], result.row("embed")["time_ns"]))
    # Ranked by the change in FLOPs (totals): the root +832, embed +544 (2*2*8*16 more
    # multiply-adds, 2*16 more bias adds), head +256, act +32.
    assert _paths(result) == ["", "embed", "head", "act"]
    assert [result.row(p)["flops"].delta for p in _paths(result)] == [832, 544, 256, 32]
    # With no time on either side, FLOPs are the metric: what orders the rows is what a
    # gate judges. From 840 FLOPs to 1672 (+99%); embed 544 -> 1088, head 264 -> 520
    # (2*2*32*4 + 2*4), act 32 -> 64; no noise floor, FLOPs are counted.
    assert result.metric == "total_flops"
    found = result.regressions(0.5)
    assert [(r.path, r.metric, r.change.delta) for r in found] == [
        (None, "flops", 832), ("", "flops", 832), ("embed", "flops", 544), ("head", "flops", 256), ("act", "flops", 32),
    ]
    assert str(found[0]) == "model total (forward FLOPs) +99.0%" and str(found[3]) == "head (forward total_flops) +97.0%"
    assert "Self base" not in result.render() and "FLOPs Δ" in result.render()
    # A time is refused: neither side measured one, and a gate on it would always pass.
    with pytest.raises(ValueError, match="base and new did not measure self time"):
        layerscope.diff(base, new, metric="self_cpu")


# -- text, JSON, golden ---------------------------------------------------------------


@pytest.fixture(scope="module")
def golden_pair() -> tuple[layerscope.Profile, layerscope.Profile]:
    """base: the 16-wide net; new: 32 wide with ``norm`` added and ``act`` swapped for
    ``gelu``, its embed 40us slower. Memory is tracked: byte counts are exact too."""
    base = _profile(_net(), memory=True, record_ops=True)
    new = _slower(_profile(_net(hidden=32, swap=True, extra=True), step_ns=1100, memory=True, record_ops=True), {"embed": 40_000})
    return base, new


def test_golden_diff_text(golden_pair: tuple[layerscope.Profile, layerscope.Profile], golden: Any) -> None:
    golden("diff_widened.out", layerscope.diff(*golden_pair).render())


def test_golden_diff_cli_with_a_limit(golden_pair: tuple[layerscope.Profile, layerscope.Profile], tmp_path: Path, golden: Any) -> None:
    golden_pair[0].save(tmp_path / "base.json")
    golden_pair[1].save(tmp_path / "new.json")
    run = run_cli("diff", "base.json", "new.json", "--fail-above", "10%", "--limit", "3", cwd=tmp_path)
    assert run.returncode == 1, run
    assert run.stderr == ""
    golden("diff_widened_cli_limit3.out", run.stdout)
    assert run.stdout.splitlines()[-1].startswith("Regressed above 10%: model total (forward time) +")
    assert "more module rows not shown (limit 3)" in run.stdout


def test_rendering_twice_gives_identical_text(golden_pair: tuple[layerscope.Profile, layerscope.Profile]) -> None:
    first = layerscope.diff(*golden_pair)
    again = layerscope.diff(*golden_pair)
    assert first.render().encode("utf-8") == first.render().encode("utf-8") == again.render().encode("utf-8")
    assert str(first) == str(again)
    assert first.render(limit=2) == again.render(limit=2)
    assert json.dumps(first.to_dict()) == json.dumps(again.to_dict())


def test_limit_caps_each_table(golden_pair: tuple[layerscope.Profile, layerscope.Profile]) -> None:
    result = layerscope.diff(*golden_pair)
    text = result.render(limit=2)
    modules = text.split("Modules, largest change")[1].split("\n\n")[0].splitlines()
    assert len(modules) == 1 + 2 + 2  # title, header, rule, 2 rows
    assert modules[3].startswith("embed ")  # +40us: the largest change
    assert f"{len(result.rows) - 2} more module rows not shown (limit 2)" in text


def test_to_dict_is_plain_json(golden_pair: tuple[layerscope.Profile, layerscope.Profile]) -> None:
    doc = json.loads(json.dumps(layerscope.diff(*golden_pair).to_dict(), allow_nan=False))
    assert doc["schema"] == "layerscope-diff/1"
    assert doc["base"]["model"] == doc["new"]["model"] == "Sequential"
    assert doc["rows"][0]["path"] == "embed"
    embed = doc["rows"][0]["metrics"]["self_time_ns"]
    assert embed["delta"] == embed["new"] - embed["base"] and embed["delta"] > 40_000
    # Removed: base only; added: new only.
    act = next(row for row in doc["rows"] if row["path"] == "act")
    assert act["status"] == "removed" and act["metrics"]["flops"]["new"] is None


# -- the command line -----------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """base.json and a 30%-slower new.json (every clock read takes 1.3us), plus damaged files."""
    folder = tmp_path_factory.mktemp("diff")
    _profile(_net()).save(folder / "base.json")
    _profile(_net(), step_ns=1300).save(folder / "new.json")
    text = (folder / "base.json").read_text(encoding="utf-8")
    (folder / "truncated.json").write_text(text[: len(text) // 2], encoding="utf-8")
    (folder / "trace.json").write_text('{"version": 3, "samples": []}', encoding="utf-8")
    (folder / "empty.trace.json").write_text('{"schemaVersion": 1, "traceEvents": []}', encoding="utf-8")
    return folder


@pytest.mark.parametrize("threshold", ["10%", "0.1"])
def test_cli_fails_above_the_threshold(saved: Path, threshold: str) -> None:
    run = run_cli("diff", "base.json", "new.json", "--fail-above", threshold, "--min-time", "0", cwd=saved)
    assert run.returncode == 1, run
    assert "Traceback" not in run.stderr and run.stderr == ""
    # One regression per line, the model's total first, then the nodes by time gained.
    verdict = run.stdout.splitlines()[-6:]
    assert verdict[0] == "Regressed above 10%: 5 (the model's total and 4 nodes), the largest gain in time first:"
    assert verdict[1] == "  model total (forward time) +30.0%"
    assert sorted(verdict[2:]) == [
        "  (root) (forward self_cpu) +30.0%", "  act (forward self_cpu) +30.0%",
        "  embed (forward self_cpu) +30.0%", "  head (forward self_cpu) +30.0%",
    ]


@pytest.mark.parametrize("threshold", ["30%", "0.3", "50%"])
def test_cli_passes_at_or_below_the_threshold(saved: Path, threshold: str) -> None:
    run = run_cli("diff", "base.json", "new.json", "--fail-above", threshold, "--min-time", "0", cwd=saved)
    assert run.returncode == 0, run
    assert run.stdout.splitlines()[-1].startswith("No regression above")


def test_cli_without_fail_above_always_exits_0(saved: Path) -> None:
    run = run_cli("diff", "base.json", "new.json", cwd=saved)
    assert run.returncode == 0, run
    assert "Regressed" not in run.stdout and "No regression" not in run.stdout
    assert run.stdout.startswith("Diff  ·  base: Sequential, cpu, forward-only  ·  new: Sequential, cpu, forward-only")


def test_cli_json_to_a_file(saved: Path, tmp_path: Path) -> None:
    out = tmp_path / "diff.json"
    run = run_cli("diff", "base.json", "new.json", "--fail-above", "10%", "-o", str(out), cwd=saved)
    assert run.returncode == 1, run
    assert run.stdout == ""
    # The report went to the file (JSON, from its extension); the verdict still reaches the log.
    assert run.stderr.splitlines() == [
        f"layerscope: wrote the json diff to {out}", "Regressed above 10%: model total (forward time) +30.0%"
    ]
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["fail_above"] == 0.1 and doc["metric"] == "self_cpu"
    assert doc["regressions"] == [{
        "path": None, "metric": "time_ns", "phase": "forward", "base": 7000, "new": 9100, "delta": 2100,
        "relative": pytest.approx(0.3),
    }]


def test_cli_help_teaches_with_examples(saved: Path) -> None:
    run = run_cli("diff", "--help", cwd=saved)
    assert run.returncode == 0
    for fragment in ("examples:", "layerscope diff base.json new.json --fail-above 10%", "--min-time", "exit status:", "0.1"):
        assert fragment in run.stdout, fragment


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(("base.json", "missing.json"), ["no such profile file", "'missing.json'"], id="missing-file"),
        pytest.param(("truncated.json", "new.json"), ["'truncated.json'", "not valid JSON", "truncated"], id="truncated"),
        pytest.param(("base.json", "trace.json"), ["'trace.json'", "not a layerscope profile"], id="other-tool"),
        pytest.param(
            ("base.json", "empty.trace.json"), ["'empty.trace.json'", "torch.profiler trace with nothing"], id="empty-trace"
        ),
        pytest.param(("base.json", "new.json", "--fail-above", "10"), ["--fail-above", "ambiguous", "10%"], id="bare-10"),
        pytest.param(("base.json", "new.json", "--fail-above", "lots"), ["--fail-above", "'lots'"], id="bad-threshold"),
        pytest.param(("base.json", "new.json", "--min-time", "5 parsecs"), ["--min-time", "'5 parsecs'", "50us"], id="bad-min-time"),
        pytest.param(("base.json", "new.json", "-o", "/nonexistent-dir/d.txt"), ["cannot write", "does not exist"], id="bad-output"),
    ],
)
def test_cli_bad_input_is_a_one_line_error(saved: Path, args: tuple[str, ...], expected: list[str]) -> None:
    line = assert_usage_error(run_cli("diff", *args, cwd=saved))
    for fragment in expected:
        assert fragment in line, (fragment, line)


def test_cli_debug_shows_the_traceback(saved: Path) -> None:
    run = run_cli("diff", "truncated.json", "new.json", "--debug", cwd=saved)
    assert run.returncode == 2
    assert "Traceback (most recent call last)" in run.stderr
    assert run.stderr.rstrip().splitlines()[-1].startswith("layerscope: error: 'truncated.json' is not valid JSON")


# -- real GPU traces --------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_h100_mi300x(shared_traces: Path) -> tuple[layerscope.Profile, layerscope.Profile]:
    """The same BERT-small inference traced on an H100 (base) and an MI300X (new)."""
    return (
        layerscope.load(shared_traces / "h100_bert_small_inference.json.gz"),
        layerscope.load(shared_traces / "mi300x_bert_small_inference.json.gz"),
    )


LINEAR_25 = "BertOnlyMLMHead_0.BertLMPredictionHead_0.Linear_25"


def test_gpu_traces_are_gated_on_device_time(bert_h100_mi300x: tuple[layerscope.Profile, layerscope.Profile]) -> None:
    result = layerscope.diff(*bert_h100_mi300x)
    assert result.metric == "self_device"
    # Linear_25 (the LM head's 512 -> 30522 projection) took 47.651us of CPU and 41.280us
    # of device time on the H100; 75.201us (+57.8%) and 25.537us (-38.1%) on the MI300X.
    linear = result.row(LINEAR_25)
    assert linear["self_time_ns"] == Change(47_651, 75_201)
    assert linear["self_device_time_ns"] == Change(41_280, 25_537)
    # Its device time fell: no regression, with or without the floor. The model's device
    # time grew from 309.437us to 390.748us, +26.3%: gated.
    for floor in (None, 0):
        found = result.regressions("20%", min_time_ns=floor)
        assert LINEAR_25 not in [r.path for r in found]
        assert (found[0].path, found[0].metric, found[0].change) == (None, "device_time_ns", Change(309_437, 390_748))
        assert str(found[0]) == "model total (step device time) +26.3%"
    # On CPU time, it is one: named with its phase and metric.
    cpu = layerscope.diff(*bert_h100_mi300x, metric="self_cpu")
    line = next(str(r) for r in cpu.regressions("20%") if r.path == LINEAR_25)
    assert line == f"{LINEAR_25} (forward self_cpu) +57.8%"
    # The step's CPU time fell (4.426ms -> 4.007ms): no model-level regression on it.
    assert None not in [r.path for r in cpu.regressions("20%")]


def test_the_device_floor_lets_small_gpu_modules_be_gated(
    bert_h100_mi300x: tuple[layerscope.Profile, layerscope.Profile],
) -> None:
    result = layerscope.diff(*bert_h100_mi300x)
    # Device times repeat within a few percent, and a small model's kernels take
    # microseconds: the floor for a device time is 5us, not the CPU's 50us.
    assert result.min_time_ns == 5_000
    found = result.regressions("20%")
    # Layer 0's attention: 10.080us of self device time on the H100, 32.032us on the
    # MI300X (+217.8%), below 50us on both sides, yet named.
    attention = "BertModel_0.BertEncoder_0.BertLayer_0.BertAttention_0.BertSdpaSelfAttention_0"
    assert [r.change for r in found if r.path == attention] == [Change(10_080, 32_032)]
    assert f"{attention} (forward self_device) +217.8%" in [str(r) for r in found]
    # Under the CPU's floor only the model's total remains.
    assert [r.path for r in result.regressions("20%", min_time_ns="50us")] == [None]
    # On CPU time the floor stays 50us.
    assert layerscope.diff(*bert_h100_mi300x, metric="self_cpu").min_time_ns == 50_000


def test_flops_gate_nothing_when_no_flop_moved() -> None:
    # Same model, same shapes: no FLOP moved, whatever the times did.
    result = layerscope.diff(_profile(_net(), record_ops=True), _profile(_net(), step_ns=1300, record_ops=True), metric="total_flops")
    assert result.metric == "total_flops" and result.regressions(0.1) == []


def test_gpu_traces_on_the_command_line(shared_traces: Path, tmp_path: Path) -> None:
    base = str(shared_traces / "h100_bert_small_inference.json.gz")
    new = str(shared_traces / "mi300x_bert_small_inference.json.gz")
    run = run_cli("diff", base, new, "--fail-above", "20%", cwd=tmp_path)
    assert run.returncode == 1, run
    lines = run.stdout.splitlines()
    at = lines.index("Regressed above 20%: 10 (the model's total and 9 nodes), the largest gain in time first:")
    assert lines[at + 1] == "  model total (step device time) +26.3%"
    # Small modules' device time is gated too (a 5us floor): layer 0's attention +217.8%.
    assert "  BertModel_0.BertEncoder_0.BertLayer_0.BertAttention_0.BertSdpaSelfAttention_0 (forward self_device) +217.8%" in lines
    assert "Modules, largest change in self device time first:" in run.stdout
    run = run_cli("diff", base, new, "--fail-above", "20%", "--metric", "self_cpu", cwd=tmp_path)
    assert run.returncode == 1, run
    assert f"  {LINEAR_25} (forward self_cpu) +57.8%" in run.stdout.splitlines()


# -- a real, planted regression -------------------------------------------------------


class Planted(nn.Module):
    """embed (64 -> 1024), act, wide (1024 -> width), head (width -> 16). At batch 64,
    wide's 64 * 1024 * width multiply-adds are nearly all the work: doubling ``width``
    adds 64 * 1024 * 1024 of them to wide and 64 * 1024 * 16 to head."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Linear(64, 1024)
        self.act = nn.ReLU()
        self.wide = nn.Linear(1024, width)
        self.head = nn.Linear(width, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.wide(self.act(self.embed(x))))


#: What a multiply-add costs in the planted regression's times: 1/16 ns, one core's
#: 32 GFLOP/s, about what a quiet 2-core VM runs a float32 matmul at.
PLANTED_MACS_PER_NS = 16


def test_planted_regression_is_found_first(tmp_path: Path) -> None:
    """A layer made twice as wide is the diff's first row and fails the CLI's gate. The
    models run for real (their FLOPs are counted, exact); their times are the fake
    clock's, plus, in the wide model, the time its extra multiply-adds take at
    PLANTED_MACS_PER_NS: wide +4,194,304 ns, head +65,536 ns. A busy machine cannot
    reorder them."""
    torch.manual_seed(0)
    x = torch.randn(64, 64)
    with torch.no_grad():
        for name, width in (("base", 1024), ("new", 2048)):
            prof = layerscope.profile(Planted(width).eval(), x, warmup=1, repeat=3, memory=False, clock=FakeClock())
            if name == "new":
                prof = _slower(prof, {
                    "wide": 64 * 1024 * 1024 // PLANTED_MACS_PER_NS, "head": 64 * 1024 * 16 // PLANTED_MACS_PER_NS,
                })
            layerscope.check_tree(prof).save(tmp_path / f"{name}.json")

    result = layerscope.diff(layerscope.load(tmp_path / "base.json"), layerscope.load(tmp_path / "new.json"))
    assert result.rows[0].path == "wide"
    # FLOPs do not depend on timing: exact. wide gains 64 * 1024 * 1024 multiply-adds
    # (2 FLOPs each) and 64 * 1024 bias adds; head reads twice as many inputs.
    assert result.row("wide")["macs"].delta == 64 * 1024 * 1024
    assert result.row("wide")["flops"].delta == 2 * 64 * 1024 * 1024 + 64 * 1024
    assert result.row("head")["macs"].delta == 64 * 1024 * 16
    assert result.row("embed")["flops"].delta == 0 and result.row("act")["flops"].delta == 0
    assert result.summary["params"].delta == 1024 * 1024 + 1024 + 1024 * 16

    run = run_cli("diff", "base.json", "new.json", "--fail-above", "10%", cwd=tmp_path)
    assert run.returncode == 1, run
    table = run.stdout.split("Modules, largest change in self time first:\n")[1].splitlines()
    assert table[2].startswith("wide ")  # the first row under the header and its rule
    lines = run.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Regressed above 10%: "))
    assert lines[at].endswith("the largest gain in time first:")
    assert lines[at + 1].startswith("  model total (forward time) +")
    assert lines[at + 2].startswith("  wide (forward self_cpu) +")  # the first node named: it gained the most

    same = run_cli("diff", "base.json", "base.json", "--fail-above", "10%", cwd=tmp_path)
    assert same.returncode == 0, same
    assert same.stdout.splitlines()[-1] == "No regression above 10%."


def test_a_long_verdict_is_bounded_and_counted() -> None:
    from layerscope.model.diff import Change, Regression
    from layerscope.render.diff_text import REGRESSIONS_SHOWN, regressions_line

    nodes = [Regression(f"layers.{i}", "self_time_ns", Change(1000, 1000 + 100 * i)) for i in range(1, 48)]
    text = regressions_line([Regression(None, "time_ns", Change(10_000, 20_000)), *nodes], 0.1)
    lines = text.splitlines()
    assert lines[0] == "Regressed above 10%: 48 (the model's total and 47 nodes), the largest gain in time first:"
    assert lines[1] == "  model total (forward time) +100.0%"
    assert lines[2] == "  layers.47 (forward self_cpu) +470.0%"  # the node that gained the most time first
    assert len(lines) == 1 + REGRESSIONS_SHOWN + 1
    assert lines[-1] == "  ... and 38 more (--format json lists them all)"


# -- noise -------------------------------------------------------------------------------


def _with_passes(profile: layerscope.Profile, passes: list[int]) -> layerscope.Profile:
    """``profile`` as if its repeated passes had taken ``passes`` ns (its measured noise)."""
    doc = profile.to_dict()
    doc["meta"]["pass_cpu_time_ns"] = passes
    return layerscope.check_tree(profile_from_dict(doc))


def test_pass_spread_is_the_range_of_the_passes_over_their_median() -> None:
    def run_spread(profile: layerscope.Profile) -> float | None:
        return profile.pass_spread()

    base = _profile(_net(), step_ns=1000)
    # (p90 - p10) / median, interpolated: of 90, 100, 110 us, p10 = 92 and p90 = 108 us.
    assert run_spread(_with_passes(base, [90_000, 110_000, 100_000])) == pytest.approx(0.16)
    assert run_spread(_with_passes(base, [100_000])) is None  # one pass: no noise measured
    doc = base.to_dict()
    doc["meta"]["pass_cpu_time_ns"] = [300_000]
    doc["meta"]["step_times_ns"] = [100_000, 104_000, 96_000, 100_000]  # a block's steps
    assert run_spread(profile_from_dict(doc)) == pytest.approx(0.056)  # (102.8 - 97.2) / 100
    # One outlier among eleven passes hardly moves it (the range would say 200%).
    assert run_spread(_with_passes(base, [100_000] * 10 + [300_000])) == pytest.approx(0.0)


def test_changes_within_the_measured_noise_are_marked_and_not_regressions(tmp_path: Path) -> None:
    # Base's passes spread by 16% (p10 92 to p90 108 us around 100), new's by 4%: the
    # band is 16%. embed's self time grows by 150 us to 1.15 ms (within 16% of it, 184
    # us): noise. head's grows by 600 us (over 16% of its new 1.6 ms, 256 us): a regression.
    base = _with_passes(_profile(_net(), step_ns=1000), [90_000, 110_000, 100_000])
    embed_ns, head_ns = base["embed"].forward.self_cpu_time_ns, base["head"].forward.self_cpu_time_ns
    base = _slower(base, {"embed": 1_000_000 - embed_ns, "head": 1_000_000 - head_ns})
    base = _with_passes(base, [90_000, 110_000, 100_000])
    new = _with_passes(_slower(base, {"embed": 150_000, "head": 600_000}), [100_000, 105_000, 100_000])
    result = layerscope.diff(base, new)
    assert (result.noise_base, result.noise_new, result.noise) == (pytest.approx(0.16), pytest.approx(0.04), pytest.approx(0.16))
    assert result.row("embed").noise and not result.row("head").noise
    assert result.within_noise(result.row("embed")["self_time_ns"])  # 150,000 <= 0.16 x 1,150,000
    assert not result.within_noise(result.row("head")["self_time_ns"])  # 600,000 > 0.16 x 1,600,000
    total = result.summary["time_ns"]  # +750 us on ~2 ms: over the band too
    assert total.delta == 750_000 and not result.within_noise(total)
    assert [r.path for r in result.regressions(0.1)] == [None, "head"]
    # Text: the note, and what was measured; JSON and HTML carry the same.
    text = result.render("text")
    embed_line = next(line for line in text.splitlines() if line.startswith("embed "))
    assert embed_line.rstrip().endswith("| noise")
    assert "Noise: repeated passes spread by 16.0% (base) and 4.0% (new); a self time that moved by at most 16.0% is marked noise" in text
    doc = json.loads(result.render("json"))
    assert doc["noise"] == {"base": pytest.approx(0.16), "new": pytest.approx(0.04), "band": pytest.approx(0.16)}
    assert {row["path"]: row["noise"] for row in doc["rows"]}["embed"] is True
    from layerscope.render.diff_html import diff_data

    data = diff_data(result)
    assert {row["path"]: row["noise"] for row in data["rows"]} == {row["path"]: row["noise"] for row in doc["rows"]}
    assert data["noise"]["band"] == pytest.approx(0.16)


def test_one_pass_measures_no_noise_and_says_so() -> None:
    base = _with_passes(_profile(_net()), [100_000])
    new = _with_passes(_slower(base, {"embed": 5_000}), [100_000])
    result = layerscope.diff(base, new)
    assert result.noise is None and not any(row.noise for row in result.rows)
    assert "Noise: not measured (each side ran one pass or step); only the floor applies." in result.render("text")
