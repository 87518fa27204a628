"""Saving and loading: a lossless round trip, clear errors for anything that is not a
sound ``layerscope/1`` file, and writes that never leave a half-written file behind."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
import layerscope.base.formats
import layerscope.base.io
from conftest import FULL_DEVICE, NULL_DEVICE
from layerscope import zoo
from layerscope.base.errors import SchemaError
from layerscope.model.check import check_tree
from layerscope.model.schema import MEMORY, TRACE, check_value
from layerscope.model.sidedocs import (
    DeviceMemory,
    Flow,
    Flows,
    MemorySummary,
    OptimizerState,
    PeakAt,
    Span,
    Spans,
    Timeline,
    TimelineSpan,
    Trace,
)
from layerscope.model.tree import Profile


@pytest.fixture(scope="module")
def zoo_profile() -> Profile:
    entry = zoo.get("lenet5")
    torch.manual_seed(0)
    return check_tree(layerscope.profile(entry.build(), entry.example_inputs(2), warmup=0, repeat=2))


@pytest.fixture
def saved(tmp_path: Path, zoo_profile: Profile) -> Path:
    path = tmp_path / "lenet.json"
    zoo_profile.save(str(path))
    return path


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# -- round trip ------------------------------------------------------------------------


def test_round_trip_keeps_everything(saved: Path, zoo_profile: Profile) -> None:
    doc = json.loads(saved.read_text(encoding="utf-8"))
    assert doc["schema"] == "layerscope/1"
    assert len(doc["modules"]) == len(list(zoo_profile.nodes()))

    loaded = layerscope.load(saved)
    check_tree(loaded)
    assert loaded.to_dict() == zoo_profile.to_dict()
    assert loaded.param_bytes == zoo_profile.param_bytes
    assert loaded["features.0"].ops == zoo_profile["features.0"].ops
    assert leftovers(saved.parent) == []


def test_round_trip_of_a_profiler_block_with_dict_outputs(tmp_path: Path) -> None:
    class DictOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.unused = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor, *, mask: torch.Tensor) -> dict[str, Any]:
            return {"logits": self.fc(x) * mask, "extra": (x.shape[0], None)}

    model = DictOut()
    with layerscope.Profiler(model) as prof:
        model(torch.ones(3, 4), mask=torch.ones(3, 2))
    path = tmp_path / "ctx.json"
    prof.save(path)
    loaded = layerscope.load(str(path))
    assert loaded.to_dict() == prof.to_dict()
    assert loaded[""].output_shapes == {"logits": [3, 2], "extra": [None, None]}
    assert loaded["unused"].calls == 0


def test_saving_again_replaces_the_file(tmp_path: Path, zoo_profile: Profile) -> None:
    path = tmp_path / "p.json"
    path.write_text("old", encoding="utf-8")
    zoo_profile.save(path)
    assert layerscope.load(path).to_dict() == zoo_profile.to_dict()
    assert leftovers(tmp_path) == []


# -- load errors -----------------------------------------------------------------------


def write_json(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def assert_schema_error(path: Path, match: str) -> None:
    with pytest.raises(SchemaError, match=match) as excinfo:
        layerscope.load(path)
    assert path.name in str(excinfo.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothere\.json"):
        layerscope.load(tmp_path / "nothere.json")


def test_truncated_file(saved: Path) -> None:
    text = saved.read_text(encoding="utf-8")
    saved.write_text(text[: len(text) // 2], encoding="utf-8")
    assert_schema_error(saved, "not valid JSON")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "binary.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    assert_schema_error(path, "not UTF-8")


@pytest.mark.parametrize("doc", [{"traceEvents": []}, [], None, "layerscope/1"])
def test_a_file_from_another_tool(tmp_path: Path, doc: Any) -> None:
    said = "not a layerscope profile" if isinstance(doc, dict) else "neither a layerscope profile nor a torch.profiler trace"
    assert_schema_error(write_json(tmp_path / "trace.json", doc), said)


def test_unknown_schema(saved: Path) -> None:
    doc = json.loads(saved.read_text(encoding="utf-8"))
    doc["schema"] = "layerscope/99"
    assert_schema_error(write_json(saved, doc), "'layerscope/99'")


# lenet5's modules: "", features, features.0 (a Conv2d, with ops), ...
OPS_AT = 2


def _drop(key: str) -> Any:
    def damage(doc: dict[str, Any]) -> None:
        del doc["modules"][OPS_AT][key]

    return damage


def _set(index: int, key: str, value: Any) -> Any:
    def damage(doc: dict[str, Any]) -> None:
        doc["modules"][index][key] = value

    return damage


def _set_top(key: str, value: Any) -> Any:
    def damage(doc: dict[str, Any]) -> None:
        doc[key] = value

    return damage


def _set_forward(index: int, key: str, value: Any) -> Any:
    def damage(doc: dict[str, Any]) -> None:
        doc["modules"][index]["forward"][key] = value

    return damage


def _set_op(key: str, value: Any) -> Any:
    def damage(doc: dict[str, Any]) -> None:
        doc["modules"][OPS_AT]["ops"][0][key] = value

    return damage


def _swap_first_two(doc: dict[str, Any]) -> None:
    doc["modules"][0], doc["modules"][1] = doc["modules"][1], doc["modules"][0]


def _duplicate_second(doc: dict[str, Any]) -> None:
    doc["modules"].append(dict(doc["modules"][OPS_AT]))


DAMAGE = {
    "no modules": _set_top("modules", None),
    "modules not a list": _set_top("modules", "conv1"),
    "empty module list": _set_top("modules", []),
    "entry not an object": _set_top("modules", ["conv1"]),
    "no totals": _set_top("totals", {}),
    "missing type": _drop("type"),
    "missing path": _drop("path"),
    "missing forward": _drop("forward"),
    "forward not an object": _set(OPS_AT, "forward", [1, 2]),
    "ops not a list of objects": _set(OPS_AT, "ops", [3]),
    "parent comes later": _swap_first_two,
    "unknown parent": _set(OPS_AT, "parent", "nowhere"),
    "duplicate path": _duplicate_second,
    # Wrong types in the right places must also be a SchemaError, not a TypeError.
    "calls a string": _set(OPS_AT, "calls", "3"),
    "params null": _set(OPS_AT, "params", None),
    "cpu time a string": _set_forward(OPS_AT, "cpu_time_ns", "100"),
    "op calls a string": _set_op("calls", "1"),
    "op in no phase": _set_op("phase", "children"),
    "a count beyond 64 bits": _set_forward(OPS_AT, "self_flops", 10**30),
    "shapes nested 100 deep": _set(OPS_AT, "input_shapes", json.loads("[" * 100 + "]" * 100)),
    "trace span too short": lambda doc: doc["trace"]["spans"][0].pop(),
    "memory peaks by phase a list": lambda doc: doc["memory"].update(peak_by_phase=[1, 2]),
    "meta a list": _set_top("meta", [1]),
    "step times strings": lambda doc: doc["meta"].update(pass_cpu_time_ns=["1ms"]),
    # The header reads these three.
    "inputs an object": lambda doc: doc["meta"].update(inputs={"x": [1, 4]}),
    "input dtypes not names": lambda doc: doc["meta"].update(input_dtypes=[[7], {}]),
    "autocast a number": lambda doc: doc["meta"].update(autocast=16),
}


@pytest.mark.parametrize("damage", list(DAMAGE.values()), ids=list(DAMAGE))
def test_damaged_module_list(saved: Path, damage: Any) -> None:
    doc = json.loads(saved.read_text(encoding="utf-8"))
    assert doc["modules"][OPS_AT]["ops"], "the damage needs a module with ops here"
    damage(doc)
    assert_schema_error(write_json(saved, doc), "damaged|inconsistent")


def _break_total(doc: dict[str, Any]) -> None:
    doc["modules"][0]["forward"]["cpu_time_ns"] += 1


def _break_params(doc: dict[str, Any]) -> None:
    doc["modules"][0]["params_total"] += 1


def _negative(doc: dict[str, Any]) -> None:
    doc["modules"][-1]["forward"]["self_cpu_time_ns"] = -1


def _wrong_depth(doc: dict[str, Any]) -> None:
    doc["modules"][1]["depth"] = 5


@pytest.mark.parametrize("damage", [_break_total, _break_params, _negative, _wrong_depth])
def test_a_tree_that_breaks_invariants(saved: Path, damage: Any) -> None:
    doc = json.loads(saved.read_text(encoding="utf-8"))
    damage(doc)
    assert_schema_error(write_json(saved, doc), "inconsistent")


def _full_side_documents() -> tuple[Trace, MemorySummary]:
    """A trace and a memory summary with every field set (hand-built)."""
    trace = Trace(
        Spans.from_rows([(0, 90, "", "forward", -1), (10, 20, "lin", "forward", 0), (50, 30, "lin", "backward", 1)]),
        Flows.from_rows([(1, 2)]), step_ns=100,
        memory=Timeline(t_ns=[0, 20], bytes=[100, 250], categories={"parameters": [100, 100], "activations": [0, 150]},
                        points_recorded=2, spans=[TimelineSpan(0, 90, "", "forward")]),
    )
    memory = MemorySummary(
        peak_bytes=300, baseline_bytes=100, peak_at=PeakAt("lin", "forward", 20),
        peak_categories={"parameters": 100, "activations": 200}, peak_by_phase={"forward": 300, "backward": 250},
        param_bytes_by_dtype={"float32": 96}, buffer_bytes_by_dtype={"float32": 4},
        optimizer_state_bytes={"Adam": OptimizerState(8, {"exp_avg": 4, "exp_avg_sq": 4})},
        timeline=Timeline(
            t_ns=[0, 20], bytes=[100, 300], categories={"parameters": [100, 100], "activations": [0, 200]},
            points_recorded=2, spans=[TimelineSpan(0, 90, "", "forward"), TimelineSpan(90, 95, "<loss>", None)],
        ),
        device=DeviceMemory(allocated_peak_bytes=512, reserved_at_peak_bytes=2048),
    )
    return trace, memory


def test_the_schema_checks_every_field_of_the_trace_and_the_memory_summary() -> None:
    trace, memory = _full_side_documents()
    trace_doc, memory_doc = trace.to_dict(), memory.to_dict()
    assert set(trace_doc) == set(TRACE.fields)
    assert set(trace_doc["memory"]) == set(TRACE.fields["memory"].spec.fields)
    assert set(memory_doc) == set(MEMORY.fields)
    for key in ("peak_at", "timeline", "device"):
        assert set(memory_doc[key]) == set(MEMORY.fields[key].spec.fields), key
    assert set(memory_doc["optimizer_state_bytes"]["Adam"]) == set(MEMORY.fields["optimizer_state_bytes"].spec.spec.fields)
    assert check_value(trace_doc, TRACE) == [] and check_value(memory_doc, MEMORY) == []
    # Each read back is the same object; the document's rows are lists, as JSON has them.
    assert Trace.from_dict(json.loads(json.dumps(trace_doc))) == trace
    assert MemorySummary.from_dict(json.loads(json.dumps(memory_doc))) == memory
    assert trace_doc["spans"][1] == [10, 20, "lin", "forward", 0] and trace_doc["flows"] == [[1, 2]]
    assert list(trace.spans)[2] == Span(50, 30, "lin", "backward", 1) == trace.spans[2]
    assert list(trace.flows) == [Flow(forward=1, backward=2)] and len(trace.spans) == 3


def test_a_trace_without_flows_or_step_marks_reads_back() -> None:
    # A file from before flows and step marks: the trace reads, and writes back as it was.
    doc = {"spans": [[0, 5, "", "forward", -1]]}
    trace = Trace.from_dict(doc)
    assert (len(trace.flows), trace.step_ns, trace.spans[0].duration_ns) == (0, None, 5)
    assert trace.to_dict() == {"spans": [[0, 5, "", "forward", -1]], "flows": []}


# -- hostile files ---------------------------------------------------------------------

HOSTILE = {
    # Python refuses to read integers of more than 4300 digits (a ValueError, not JSON's).
    "5000 digits": '{"schema": "layerscope/1", "meta": {"steps": ' + "9" * 5000 + "}}",
    # The JSON reader recurses per level: a RecursionError.
    "nested 100000 deep": "[" * 100_000,
    "NaN": '{"schema": "layerscope/1", "meta": {"peak_flops_per_s": NaN}}',
    "1e999": '{"schema": "layerscope/1", "meta": {"peak_flops_per_s": 1e999}}',
}


@pytest.mark.parametrize("text", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_json_is_a_schema_error(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    from layerscope.cli import main

    path = tmp_path / "hostile.json"
    path.write_text(text, encoding="utf-8")
    assert_schema_error(path, "not a layerscope profile")
    assert main(["show", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("layerscope: error: ") and "hostile.json" in line


@pytest.mark.parametrize(
    ("field", "value"),
    [("flops", -2), ("macs", -1), ("bytes", -8), ("cpu_time_ns", -1), ("freed_bytes", -4)],
)
def test_an_op_with_a_negative_figure(saved: Path, field: str, value: int, capsys: pytest.CaptureFixture[str]) -> None:
    from layerscope.cli import main

    doc = json.loads(saved.read_text(encoding="utf-8"))
    doc["modules"][OPS_AT]["ops"][0][field] = value
    assert_schema_error(write_json(saved, doc), f"op aten::\\w+ has negative {field}")
    assert main(["show", str(saved)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


@pytest.mark.parametrize("field", ["flops", "macs", "bytes"])
def test_op_rows_add_up_to_the_nodes_self_figures(saved: Path, field: str) -> None:
    doc = json.loads(saved.read_text(encoding="utf-8"))
    op = doc["modules"][OPS_AT]["ops"][-1]
    op[field] += 1000  # the module's total and self figures no longer match its ops
    assert_schema_error(write_json(saved, doc), f"'features.0' forward: self_{field}=\\d+ != its ops' {field}")


def test_the_message_lists_the_first_breaches_and_counts_the_rest(saved: Path) -> None:
    doc = json.loads(saved.read_text(encoding="utf-8"))
    broken = [entry["path"] for entry in doc["modules"] if entry["ops"]]
    for entry in doc["modules"]:
        for op in entry["ops"]:
            op["calls"] = 0
    with pytest.raises(SchemaError) as excinfo:
        layerscope.load(write_json(saved, doc))
    message = str(excinfo.value)
    total = sum(len(entry["ops"]) for entry in doc["modules"])
    assert "\n" not in message
    assert f"{total} problems: {broken[0]!r}: op " in message
    assert message.count("has 0 calls") == 5 and message.endswith(f"; and {total - 5} more")


# -- atomic writes ---------------------------------------------------------------------


def test_failed_render_leaves_the_old_file(
    saved: Path, zoo_profile: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = saved.read_bytes()

    def broken(profile: Profile, **options: Any) -> str:
        raise RuntimeError("renderer broke")

    json_renderer = layerscope.base.formats.get_renderer("json")
    monkeypatch.setitem(layerscope.base.formats._TABLES["profile"], "json", dataclasses.replace(json_renderer, fn=broken))
    with pytest.raises(RuntimeError, match="renderer broke"):
        zoo_profile.save(saved)
    assert saved.read_bytes() == old
    assert leftovers(saved.parent) == []


def test_failure_after_the_write_leaves_the_old_file(
    saved: Path, zoo_profile: Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The new text is fully written to the temporary file, then the flush to disk fails:
    # the target must still hold the old profile, and the temporary file must be gone.
    old = saved.read_bytes()
    written: list[str] = []
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        written.extend(leftovers(saved.parent))
        raise OSError("disk full")

    monkeypatch.setattr(layerscope.base.io.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        zoo_profile.save(saved)
    monkeypatch.setattr(layerscope.base.io.os, "fsync", real_fsync)
    assert written, "the temporary file should have existed during the write"
    assert saved.read_bytes() == old
    assert leftovers(saved.parent) == []
    assert layerscope.load(saved).to_dict() == zoo_profile.to_dict()


@pytest.mark.parametrize("text", [12, None], ids=["int", "none"])
def test_write_atomic_with_text_that_is_not_text(saved: Path, text: Any) -> None:
    old = saved.read_bytes()
    with pytest.raises(TypeError):
        layerscope.base.io.write_atomic(saved, text)
    assert saved.read_bytes() == old
    assert leftovers(saved.parent) == []


def test_write_atomic_writes_bytes_as_they_are(saved: Path) -> None:
    layerscope.base.io.write_atomic(saved, b"\x89PNG\r\n")
    assert saved.read_bytes() == b"\x89PNG\r\n"
    assert leftovers(saved.parent) == []


def test_write_atomic_interrupted_mid_write(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Half the text reaches the temporary file, then Ctrl-C: the target keeps its old
    # bytes and the half-written temporary file is removed.
    old = saved.read_bytes()
    real_fdopen = os.fdopen

    class HalfWriter:
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def __enter__(self) -> HalfWriter:
            self.handle.__enter__()
            return self

        def __exit__(self, *exc: Any) -> None:
            self.handle.__exit__(*exc)

        def write(self, text: str) -> int:
            self.handle.write(text[: len(text) // 2])
            self.handle.flush()
            assert leftovers(saved.parent), "the temporary file should exist now"
            raise KeyboardInterrupt

    monkeypatch.setattr(layerscope.base.io.os, "fdopen", lambda *a, **k: HalfWriter(real_fdopen(*a, **k)))
    with pytest.raises(KeyboardInterrupt):
        layerscope.base.io.write_atomic(saved, "{}" * 1000)
    assert saved.read_bytes() == old
    assert leftovers(saved.parent) == []


def test_write_atomic_to_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="does not exist"):
        layerscope.base.io.write_atomic(tmp_path / "no" / "such" / "p.json", "{}")
    assert not (tmp_path / "no").exists()


def test_write_atomic_writes_the_whole_text(tmp_path: Path) -> None:
    path = tmp_path / "plain.txt"
    layerscope.base.io.write_atomic(path, "héllo\n" * 1000)
    assert path.read_text(encoding="utf-8") == "héllo\n" * 1000
    assert leftovers(tmp_path) == []


# -- devices, FIFOs and symlinks -------------------------------------------------------


def test_a_character_device_is_written_in_place(char_device: Any, zoo_profile: Profile) -> None:
    # Renaming a temporary file over /dev/null would turn it into a regular file.
    null = char_device("null", NULL_DEVICE)
    zoo_profile.save(null)
    layerscope.base.io.write_atomic(null, (chunk for chunk in ["a", "b"]))
    assert stat.S_ISCHR(os.stat(null).st_mode)
    assert os.stat(null).st_rdev == os.makedev(*NULL_DEVICE)
    assert sorted(p.name for p in null.parent.iterdir()) == ["null"]


def test_a_full_device_fails_with_its_os_error(char_device: Any, zoo_profile: Profile) -> None:
    full = char_device("full", FULL_DEVICE)
    with pytest.raises(OSError) as excinfo:
        zoo_profile.save(full)
    assert excinfo.value.errno == errno.ENOSPC
    assert stat.S_ISCHR(os.stat(full).st_mode)
    assert sorted(p.name for p in full.parent.iterdir()) == ["full"]


def test_a_fifo_is_written_in_place(tmp_path: Path, zoo_profile: Profile) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    zoo_profile.save(fifo)
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert json.loads(received[0]) == zoo_profile.to_dict()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert leftovers(tmp_path) == []


def test_a_symlink_stays_a_link_and_its_target_is_replaced(tmp_path: Path, zoo_profile: Profile) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "p.json"
    target.write_text("old", encoding="utf-8")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    zoo_profile.save(link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert layerscope.load(target).to_dict() == zoo_profile.to_dict()
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the target keeps its mode
    assert leftovers(tmp_path) == leftovers(tmp_path / "real") == []


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.txt"
    link.symlink_to(tmp_path / "new.txt")
    layerscope.base.io.write_atomic(link, "hello\n")
    assert link.is_symlink()
    assert (tmp_path / "new.txt").read_text(encoding="utf-8") == "hello\n"


def test_a_symlink_to_a_device_leaves_the_device(char_device: Any) -> None:
    null = char_device("null", NULL_DEVICE)
    link = null.parent / "out.txt"
    link.symlink_to(null)
    layerscope.base.io.write_atomic(link, "hello\n")
    assert link.is_symlink() and stat.S_ISCHR(os.stat(null).st_mode)


def test_a_benchmark_saved_to_a_device_leaves_the_device(char_device: Any) -> None:
    from layerscope.bench import benchmark

    null = char_device("null", NULL_DEVICE)
    result = benchmark(nn.Linear(4, 2), torch.ones(1, 4), [1], warmup=0, min_runs=1, min_time_s=0, memory=False)
    result.save(null)
    assert stat.S_ISCHR(os.stat(null).st_mode)


def test_write_atomic_to_a_folder(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match="it is a folder"):
        layerscope.base.io.write_atomic(tmp_path, "{}")


def test_a_profile_s_codec_is_its_own_inverse(saved: Path) -> None:
    # Profile.from_dict beside to_dict (model/tree.py); the strict reader checks and then builds the same.
    doc = json.loads(saved.read_text())
    again = Profile.from_dict(doc)
    assert again.to_dict() == doc == layerscope.load(saved).to_dict()
