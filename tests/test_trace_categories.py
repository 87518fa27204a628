"""Every Kineto JSON torch releases have written: the category names before torch 1.10
(``Operator``, ``Kernel``, ``Memcpy``, ``Memset``, ``Runtime``, ``Input dims``), any
case, read as today's; device work of a category layerscope does not read is counted,
by category, and said, never left out silently."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import layerscope
from layerscope.base.errors import LayerscopeWarning
from layerscope.model.check import tree_problems

#: Today's category -> the name torch's profiler wrote before torch 1.10.
OLD_NAMES = {
    "cpu_op": "Operator", "kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset",
    "cuda_runtime": "Runtime", "cuda_driver": "Runtime",
}


def _rewritten(source: Path, target: Path, names: dict[str, str], dims: bool = False) -> Path:
    with gzip.open(source, "rt") as handle:
        doc = json.load(handle)
    for event in doc["traceEvents"]:
        category = event.get("cat")
        if category in names:
            event["cat"] = names[category]
        args = event.get("args")
        if dims and isinstance(args, dict) and "Input Dims" in args:
            args["Input dims"] = args.pop("Input Dims")
    target.write_text(json.dumps(doc))
    return target


def _figures(profile: layerscope.Profile) -> list[tuple[str, int | None, int | None, int]]:
    return [
        (node.path, node.forward.device_time_ns, node.forward.flops, node.calls) for node in profile.nodes()
    ]


@pytest.mark.parametrize("case", ["older", pytest.param("upper", marks=pytest.mark.slow), pytest.param("lower", marks=pytest.mark.slow)])
def test_a_trace_with_the_category_names_of_older_torch_reads_as_todays(
    case: str, shared_traces: Path, tmp_path: Path
) -> None:
    names = {
        "older": OLD_NAMES,
        "upper": {k: v.upper() for k, v in OLD_NAMES.items()},
        "lower": {k: k.upper() for k in OLD_NAMES},  # today's names, another case
    }[case]
    source = shared_traces / "h100_bert_small_inference.json.gz"
    today = layerscope.load(source)
    older = layerscope.load(_rewritten(source, tmp_path / "older.json", names, dims=case == "older"))
    assert tree_problems(older) == []
    assert _figures(older) == _figures(today)
    assert older.meta.device_events == today.meta.device_events
    assert older.root.forward.device_time_ns == 309_437  # the H100's 60 kernels in the step, as read today
    assert older.meta.peak_flops_per_s == today.meta.peak_flops_per_s


def test_device_work_of_an_unknown_category_is_counted_as_unread_and_said(shared_traces: Path, tmp_path: Path) -> None:
    source = shared_traces / "h100_bert_small_inference.json.gz"
    with gzip.open(source, "rt") as handle:
        doc = json.load(handle)
    work = [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    moved = [e for e in work if e["cat"] == "kernel"][:5]
    for event in moved:
        event["cat"] = "accelerator_kernel"  # a category no torch release wrote
    (tmp_path / "unknown.json").write_text(json.dumps(doc))
    with pytest.warns(LayerscopeWarning, match=r"5 device events of categories layerscope does not read \(5 accelerator_kernel\)"):
        profile = layerscope.load(tmp_path / "unknown.json")
    device = profile.meta.device_events
    assert device is not None
    assert device.events == len(work) - 5
    assert device.unread == {"accelerator_kernel": 5}
    spans = sorted((round(float(e["ts"]) * 1000), round((float(e["ts"]) + float(e["dur"])) * 1000)) for e in moved)
    assert device.unread_time_ns == pytest.approx(sum(end - start for start, end in spans), abs=10)
    text = profile.render("text", depth=0)
    assert "not read (categories layerscope does not know): 5 accelerator_kernel" in text
    again = tmp_path / "saved.json"
    profile.save(again)
    assert layerscope.load(again).meta.device_events == device


def test_an_old_trace_is_told_from_its_categories_alone(tmp_path: Path) -> None:
    from layerscope.loading import is_trace_file

    doc = {"traceEvents": [{"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert is_trace_file(tmp_path / "old.json")


def test_a_synchronization_on_the_device_track_is_no_unread_work(shared_traces: Path) -> None:
    """The A100 AlexNet trace holds 41 ``cuda_sync`` events (the host waiting on a stream
    or event, drawn on the device's track): not device work, so neither unread nor said."""
    import warnings

    path = shared_traces / "a100_alexnet_no_modules.json.gz"
    with gzip.open(path, "rt") as handle:
        syncs = sum(1 for event in json.load(handle)["traceEvents"] if event.get("cat") == "cuda_sync")
    assert syncs == 41
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayerscopeWarning)
        profile = layerscope.load(path, shapes=False)
    assert profile.meta.device_events is None or not profile.meta.device_events.unread
