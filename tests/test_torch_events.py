"""The live adapter (``capture/torch_events.py``) on what torch's profiler emits on CUDA,
built by hand in the recorded form (``dump_result``'s) and replayed through the same
adapter, conversion and walker as a live window: allocations and annotations on the
device, a launch whose CUPTI id collides with an op's, backward kernels launched from
autograd's device thread, a module range torch nests in a runtime call. Each case is
one that gave wrong device times before the adapter existed. And on the CPU, a real
block recorded and replayed is the same profile, and torch's own trace of the same
session reads back as it."""

from __future__ import annotations

import tempfile
from dataclasses import asdict
from typing import Any

import pytest
import torch

import layerscope
from layerscope import zoo
from layerscope.capture import replay
from layerscope.capture.torch_events import RECORD_FORMAT, ReplayedResult, read_window
from layerscope.convert.ranges import MODULE_PREFIX, STEP_NAME
from layerscope.model.raw import ModuleInfo

MS = 1_000_000
EVAL = "autograd::engine::evaluate_function: "


def op(name: str, t0: int, t1: int, *children: list[Any], corr: int = 0, seq: int = -1, tid: int = 1) -> list[Any]:
    return ["TorchOp", name, t0, t1, tid, corr, "", [seq, None, []], list(children)]


def frame(index: int, t0: int, t1: int, *children: list[Any], tid: int = 1) -> list[Any]:
    return ["TorchOp", f"{MODULE_PREFIX}{index}", t0, t1, tid, 0, "", [-1, None, []], list(children)]


def step(t0: int, t1: int, *children: list[Any]) -> list[Any]:
    return ["TorchOp", STEP_NAME, t0, t1, 1, 0, "", [-1, None, []], list(children)]


def alloc(t: int, ident: int, size: int, total: int) -> list[Any]:
    return ["Allocation", "[memory]", t, t, 1, 0, "", [0x1000 + ident, size, ident, total, total, "cuda:0"], []]


def kernel(linked: int, t0: int, t1: int, name: str = "gemm") -> list[Any]:
    return ["CUDA", False, name, linked, t0, t1, 7, 900 + linked, None]


def recording(tree: list[Any], events: list[Any]) -> dict[str, Any]:
    """A recording of one window over a model with one Linear (``fc``)."""
    modules = [ModuleInfo("", "Net", None, 0, 0), ModuleInfo("fc", "Linear", "", 1, 10)]
    return {
        "format": replay.FORMAT, "modules": [asdict(m) for m in modules], "param_bytes": 40, "memory_static": {},
        "module_shapes": [], "meta": {"device": "cuda:0"}, "live": {}, "truth": {},
        "windows": [{"has_device": True, "detail": True, "with_stack": False, "notes": [],
                     "result": {"format": RECORD_FORMAT, "tree": tree, "events": events}}],
    }


def test_allocations_and_annotations_on_the_device_are_not_device_work() -> None:
    # An AdamW step's annotation spans the device for 5 ms (linked id 0) and the
    # caching allocator reports each allocation as a device event (linked id 0); the
    # mm allocates its output. Only the two kernels are work: 100 and 50 ns.
    tree = [step(0, 10 * MS, frame(1, 10, 900, op("aten::mm", 20, 400, alloc(30, 1, 512, 512), corr=5),
                                   op("aten::add", 500, 800, corr=6)))]
    events = [
        kernel(5, 1000, 1100), kernel(6, 1200, 1250, "add"),
        ["CUDA", False, "[memory]", 0, 1030, 1030, 0, 0, None],
        ["CUDA", True, "Optimizer.step#AdamW.step", 0, 0, 5 * MS, 7, 0, None],
    ]
    prof = layerscope.check_tree(replay.replay(recording(tree, events)))
    ops = {o.name: o.device_time_ns for o in prof["fc"].ops}
    assert ops == {"aten::mm": 100, "aten::add": 50}
    assert prof["fc"].forward.device_time_ns == 150
    assert prof.device is not None and prof.device.busy_ns == 150 and prof.device.unattributed_ns == 0


def test_a_launch_whose_cupti_id_collides_with_an_op_id_adds_nothing() -> None:
    # The mm's launch carries CUPTI's correlation id 6, which is also the add's id.
    launch = ["Kineto", "cudaLaunchKernel", 100, 150, 1, 6, "", None, []]
    tree = [step(0, MS, frame(1, 10, 900, op("aten::mm", 20, 400, launch, corr=5), op("aten::add", 500, 800, corr=6)))]
    window = read_window(ReplayedResult(recording(tree, [])["windows"][0]["result"]), has_device=True, detail=False)
    mm = window.roots[0].children[0].children[0]
    assert mm.name == "aten::mm" and mm.children == []  # the launch is not a range of the tree
    prof = replay.replay(recording(tree, [kernel(5, 1000, 1100), kernel(6, 2000, 2050, "add")]))
    assert {o.name: o.device_time_ns for o in prof["fc"].ops} == {"aten::mm": 100, "aten::add": 50}


def test_backward_kernels_from_autograds_device_thread_are_the_modules_backward() -> None:
    # The forward mm (autograd number 10) on the main thread; its backward node runs on
    # autograd's device thread (tid 2) during the step, allocating the gradient and
    # launching a 200 ns kernel, while an optimizer's annotation spans the device.
    grad = ["Allocation", "[memory]", 430, 430, 2, 0, "", [0x2000, 512, 2, 1024, 2048, "cuda:0"], []]
    tree = [
        step(0, MS, frame(1, 10, 300, op("aten::mm", 20, 200, corr=5, seq=10))),
        op(f"{EVAL}MmBackward0", 400, 600, op("aten::mm", 420, 580, grad, corr=7, tid=2), seq=10, tid=2),
    ]
    events = [kernel(5, 1000, 1100), kernel(7, 2000, 2200), ["CUDA", True, "Optimizer.step#AdamW.step", 0, 0, MS, 7, 0, None]]
    prof = layerscope.check_tree(replay.replay(recording(tree, events)))
    fc = prof["fc"]
    assert fc.forward.device_time_ns == 100
    assert fc.backward is not None and fc.backward.device_time_ns == 200


def test_a_module_range_torch_nests_in_a_runtime_call_is_still_the_module() -> None:
    # torch's tree nests by time on the host: a module's range that began inside a
    # runtime call's span is that call's child. Its work is still the module's.
    runtime = ["Kineto", "cudaThreadExchangeStreamCaptureMode", 5, 30, 1, 9, "", None,
               [frame(1, 20, 400, op("aten::mm", 40, 300, corr=5))]]
    tree = [step(0, MS, runtime)]
    prof = layerscope.check_tree(replay.replay(recording(tree, [kernel(5, 1000, 1100)])))
    assert prof["fc"].forward.device_time_ns == 100 and prof["fc"].calls == 1


def _gpt_block(trace_dir: str | None = None) -> tuple[Any, Any, Any]:
    entry = zoo.get("gpt")
    torch.manual_seed(0)
    model = entry.build().train()
    x = entry.example_inputs(2)
    opt = torch.optim.AdamW(model.parameters())

    def one() -> None:
        opt.zero_grad()
        model(x).float().pow(2).mean().backward()
        opt.step()

    one()
    with replay.WindowRecorder(trace_dir) as recorder:
        with layerscope.Profiler(model) as prof:
            for _ in range(2):
                one()
                prof.step()
    return model, prof.profile, recorder


def test_a_recorded_block_replays_as_the_same_profile(tmp_path: Any) -> None:
    model, live, recorder = _gpt_block()
    path = tmp_path / "gpt.json.gz"
    replay.save(replay.recording(recorder, model, live), path)
    assert replay.replay(replay.load(path)).to_dict() == live.to_dict()


@pytest.mark.slow  # records a block and torch's trace of it, then reads the trace back: 7 s
def test_torchs_own_trace_of_the_same_session_reads_back_as_the_block() -> None:
    with tempfile.TemporaryDirectory() as folder:
        model, live, recorder = _gpt_block(folder)
        (trace,) = recorder.traces
        traced = layerscope.load(trace, model=model)
    assert traced.figures.steps == live.figures.steps == 2
    for node in live.root.walk():
        other = traced[node.path]
        for phase in ("forward", "backward"):
            mine, theirs = getattr(node, phase), getattr(other, phase)
            assert mine.self_cpu_time_ns == theirs.self_cpu_time_ns, (node.path, phase)
        assert node.calls == other.calls
