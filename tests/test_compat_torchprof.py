"""``layerscope.compat.torchprof``: torchprof's ``Profile``, table and ``raw()``.

The seed script (seeds/000) runs first, with the zoo's AlexNet; then goldens of each
table with a fake clock (LeNet-5), calls, paths, and the no-side-effect snapshot.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

from conftest import FakeClock
from layerscope import zoo
from layerscope.compat import torchprof
from layerscope.compat.op_records import EventList
from layerscope.model.check import check_tree
from test_no_side_effects import X4, Failing, assert_unchanged, everything, snapshot

ALEXNET_ROWS = ["AlexNet", "features", *map(str, range(13)), "avgpool", "classifier", *map(str, range(7))]
ALEXNET_LEAVES = [f"features.{i}" for i in range(13)] + ["avgpool"] + [f"classifier.{i}" for i in range(7)]


def _table(text: str) -> list[list[str]]:
    """The table's rows as cells, the tree drawing stripped from the module names."""
    lines = text.splitlines()
    assert set(lines[1]) <= {"-", "|"}
    width = len(lines[1])  # rows lose their trailing blanks: pad them back before splitting
    return [[cell.strip().lstrip("│├└─ ") for cell in line.ljust(width).split(" | ")] for line in lines[2:]]


@pytest.fixture(scope="module")
def alexnet() -> nn.Module:
    return zoo.get("alexnet").build()


# -- the seed's script ----------------------------------------------------------------


def test_seed_quickstart_show_events_and_raw(alexnet: nn.Module) -> None:
    model = alexnet
    x = torch.rand([1, 3, 224, 224])
    with torchprof.Profile(model, use_cuda=torch.cuda.is_available(), profile_memory=True) as prof:
        model(x)
    text = prof.display(show_events=False)
    assert text == str(prof)
    header = text.splitlines()[0]
    assert [h.strip() for h in header.split(" | ")] == [
        "Module", "Self CPU total", "CPU total", "Self CPU Mem", "CPU Mem", "Number of Calls"
    ]
    rows = _table(text)
    assert [row[0] for row in rows] == ALEXNET_ROWS
    by_name = {row[0]: row for row in rows[-7:]}
    assert by_name["1"][-1] == "1"
    for row in rows:
        container = row[0] in ("AlexNet", "features", "classifier")
        assert (row[1:] == [""] * 5) == container  # blank rows for modules that hold others
    # features.0's output: 64 x 55 x 55 float32 = 774,400 B
    assert rows[2][3:5] == ["756.25 Kb", "756.25 Kb"]
    assert 64 * 55 * 55 * 4 == 774_400 == int(756.25 * 1024)

    events = _table(prof.display(show_events=True))
    names = [row[0] for row in events]
    assert names[:4] == ["AlexNet", "features", "0", "aten::convolution"]
    assert events[3][-1] == "1" and events[2][1:] == [""] * 5

    trace, event_lists_dict = prof.raw()
    assert trace[2] == torchprof.Trace(("AlexNet", "features", "0"), True, model.features[0])
    calls = event_lists_dict[trace[2].path]
    assert len(calls) == 1 and isinstance(calls[0], EventList)
    assert [e.name for e in calls[0]] == ["aten::convolution"]
    assert calls[0][0].cpu_memory_usage == 774_400
    printed = str(calls[0])
    assert "aten::convolution" in printed and printed.rstrip().splitlines()[-1].startswith("Self CPU time total: ")
    check_tree(prof.profile)
    assert prof.profile.root.forward.macs == 714_188_480  # and on to layerscope's own figures


def test_seed_paths(alexnet: nn.Module) -> None:
    model = alexnet
    x = torch.rand([1, 3, 224, 224])
    paths = [("AlexNet", "features", "3"), ("AlexNet", "classifier")]
    with torchprof.Profile(model, paths=paths) as prof:
        model(x)
    rows = _table(str(prof))
    assert [row[0] for row in rows] == ALEXNET_ROWS
    measured = [(n, row[0]) for n, row in enumerate(rows) if row[1]]
    assert measured == [(5, "3"), (16, "classifier")]
    assert rows[16][-1] == "1"
    _, events = prof.raw()
    assert sorted(events) == [("AlexNet", "classifier"), ("AlexNet", "features", "3")]
    # The classifier's one call holds its submodules' ops too, as torchprof's did.
    assert "aten::addmm" in {e.name for e in events[("AlexNet", "classifier")][0]}


# -- goldens --------------------------------------------------------------------------


def lenet() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    entry = zoo.get("lenet5")
    return entry.build().eval(), entry.example_inputs(1)


def test_golden_tables(golden: Any) -> None:
    model, x = lenet()
    with torchprof.Profile(model, profile_memory=True, clock=FakeClock()) as prof:
        model(x)
        model(x)
    golden("torchprof_lenet5.out", prof.display())
    golden("torchprof_lenet5_events.out", prof.display(show_events=True))
    rows = _table(prof.display())
    leaves = [row for row in rows if row[1]]
    assert len(leaves) == 11 and all(row[-1] == "2" for row in leaves)
    assert all(row[1] == row[2] for row in leaves)  # a leaf's self time is its total
    _, events = prof.raw()
    calls = events[("LeNet5", "features", "0")]
    assert len(calls) == 2
    golden("torchprof_lenet5_raw_call.out", calls[1].table(sort_by="self_cpu_time_total"))


def test_golden_paths_and_cuda_columns(golden: Any) -> None:
    model, x = lenet()
    paths = [("LeNet5", "classifier", "0"), ("LeNet5", "features")]
    with torchprof.Profile(model, paths=paths, clock=FakeClock()) as prof:
        model(x)
    # The CUDA columns of a model run on the CPU, as display() shows them where a CUDA
    # device is present (where none is, it leaves them out: see below): blank, not known.
    text = prof.profile.render("torchprof", show_events=True, use_cuda=True, paths=["classifier.0", "features"])
    golden("torchprof_lenet5_paths_cuda.out", text)
    assert "Self CUDA total | CUDA total" in text.splitlines()[0]
    assert prof.display(show_events=True) == prof.profile.render(
        "torchprof", show_events=True, use_cuda=False, paths=["classifier.0", "features"]
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine with no CUDA device")
def test_use_cuda_without_a_cuda_device_warns_once_and_leaves_the_columns_out() -> None:
    model, x = lenet()
    with pytest.warns(UserWarning) as caught:
        prof = torchprof.Profile(model, use_cuda=True, profile_memory=True, clock=FakeClock())
    assert [str(w.message) for w in caught] == [
        "torchprof.Profile(use_cuda=True): no CUDA device is present, so the table has no CUDA columns"
    ]
    assert caught[0].filename == __file__  # points at the caller's line
    assert prof.use_cuda is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: running and reading warn no more
        with prof:
            model(x)
        text = prof.display(show_events=True)
    assert [h.strip() for h in text.splitlines()[0].split(" | ")] == [
        "Module", "Self CPU total", "CPU total", "Self CPU Mem", "CPU Mem", "Number of Calls"
    ]
    assert "CUDA" not in text


# -- behaviour ------------------------------------------------------------------------


def test_disabled_and_unfinished() -> None:
    model, x = lenet()
    prof = torchprof.Profile(model, enabled=False)
    with prof:
        model(x)
    assert str(prof) == "<unfinished torchprof.profile>" and prof.raw() is None
    with pytest.raises(RuntimeError, match="not run"):
        _ = prof.profile
    with torchprof.Profile(model) as running:
        assert running.display() == "<unfinished torchprof.profile>"
        running(x)  # torchprof's Profile called the model too
    assert _table(str(running))[2][-1] == "1"
    with pytest.raises(RuntimeError, match="already run"), running:
        pass


def test_paths_start_with_the_class_name() -> None:
    model, _ = lenet()
    with pytest.raises(ValueError, match="'LeNet5'"):
        torchprof.Profile(model, paths=[("features", "0")])


# -- no side effects -------------------------------------------------------------------


@pytest.mark.parametrize("profile_memory", [False, True])
def test_profile_leaves_no_trace_and_never_replaces_forward(profile_memory: bool) -> None:
    model = everything("mixed")
    # The block wraps the user's own forward (train-mode BatchNorm, dropout): values
    # are the user's doing, so they are not compared (as for a Profiler block).
    before = snapshot(model, values=False)
    with torchprof.Profile(model, profile_memory=profile_memory, paths=[("Everything", "blocks", "0")]) as prof:
        assert all("forward" not in vars(module) for module in model.modules())
        model(X4)
    assert_unchanged(before, snapshot(model, values=False))
    prof.display(show_events=True)
    prof.raw()
    assert_unchanged(before, snapshot(model, values=False))


def test_raising_forward_leaves_no_trace() -> None:
    boom = ValueError("boom")
    model = Failing(boom)
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"^boom(\n|$)"), torchprof.Profile(model) as prof:
        model(X4)
    assert_unchanged(before, snapshot(model))
    rows = _table(str(prof))
    assert [row[0] for row in rows] == ["Failing", "first", "raiser", "last"]
    assert rows[3][1:] == ["0ns", "0ns", "0"] or rows[3][-1] == "0"


def test_cuda_memory_of_a_cpu_run_is_blank_not_zero() -> None:
    model = zoo.get("lenet5").build()
    with torchprof.Profile(model, profile_memory=True) as prof:
        model(torch.rand(1, 1, 32, 32))
    # The columns display(use_cuda=True) adds on a CUDA machine, for a model run on the CPU.
    lines = prof.profile.render("torchprof", use_cuda=True, profile_memory=True).splitlines()
    header = [cell.strip() for cell in lines[0].split("|")]
    cuda_mem = header.index("CUDA Mem")
    rows = [[cell.strip() for cell in line.split("|")] for line in lines[2:] if "|" in line]
    assert rows and all(row[cuda_mem] == "" and row[header.index("Self CUDA Mem")] == "" for row in rows)
    assert any(row[header.index("CPU Mem")] not in ("", "0 b") for row in rows)  # CPU memory still shown
