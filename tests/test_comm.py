"""Communication: the collective registry, payload bytes, and waiting in the walk,
on hand-written event streams with hand-computed figures."""

from __future__ import annotations

import pytest

from layerscope.attribute.profile import build_profile
from layerscope.base import comm
from layerscope.flops import count_meta
from layerscope.flops.meta import TensorMeta
from layerscope.model.check import check_tree
from layerscope.model.raw import (
    NO_SEQ,
    Collective,
    Enter,
    Exit,
    LabelEnter,
    LabelExit,
    ModuleInfo,
    Op,
    RawCapture,
    Step,
)


@pytest.mark.parametrize(
    ("name", "is_comm", "kind"),
    [
        ("c10d::allreduce_", True, "all_reduce"),
        ("c10d::_allgather_base_", True, "all_gather"),
        ("c10d::_reduce_scatter_base_", True, "reduce_scatter"),
        ("c10d::broadcast_", True, "broadcast"),
        ("_c10d_functional::all_gather_into_tensor", True, "all_gather"),
        ("_c10d_functional::wait_tensor", True, "wait"),
        ("gloo:all_reduce", True, "all_reduce"),
        ("nccl:reduce_scatter", True, "reduce_scatter"),
        ("record_param_comms", True, None),
        # Tensor parallelism's all-reduce over symmetric memory (B200 trace): no NCCL in the name.
        ("symm_mem::multimem_all_reduce_", True, "all_reduce"),
        ("aten::mm", False, None),
        ("my_label", False, None),
    ],
)
def test_registry(name: str, is_comm: bool, kind: str | None) -> None:
    assert comm.is_communication(name) is is_comm
    if is_comm:
        assert comm.kind(name) == kind


def test_bus_factor_follows_the_bandwidth_convention() -> None:
    assert comm.bus_factor("c10d::allreduce_", 4) == pytest.approx(2 * 3 / 4)
    assert comm.bus_factor("c10d::_allgather_base_", 8) == pytest.approx(7 / 8)
    assert comm.bus_factor("c10d::broadcast_", 8) == 1.0


def _t(*shape: int) -> TensorMeta:
    import torch

    return TensorMeta(tuple(shape), torch.float32, "cpu")


def test_payload_bytes_per_collective() -> None:
    # An all-reduce moves its tensors: 10 + 6 floats.
    assert count_meta("c10d::allreduce_", ([_t(10), _t(2, 3)],), {}, out=None)[2] == 64
    # An all-gather is about what it gathers (output 4 x 8 floats), not its input (8).
    assert count_meta("c10d::_allgather_base_", (_t(4, 8), _t(8)), {}, out=None)[2] == 128
    # A reduce-scatter is about its input (4 x 8), not its output shard (8).
    assert count_meta("c10d::_reduce_scatter_base_", (_t(8), _t(4, 8)), {}, out=None)[2] == 128
    # No arithmetic is counted for a collective.
    assert count_meta("c10d::allreduce_", ([_t(10)],), {}, out=None)[:2] == (0, 0)
    assert count_meta("c10d::barrier", (_t(1),), {}, out=None)[2] == 0


MODULES = [ModuleInfo(path="", type="Root", parent=None, depth=0, params=0)]


def test_idle_time_during_a_collective_is_waiting_and_the_step_adds_up() -> None:
    """Forward 10-100; one backward node 110-150 whose hook starts an all-reduce at
    150-160 (enqueue on this thread); the collective runs on gloo's thread 155-390, while
    this thread is idle from 160 to 400 (the reducer waits); a copy 400-420; step 0-500.

    Waiting = idle time inside the collective = 160..390 = 230 ns. <other> is the rest of
    the idle time: 0..10, 100..110, 390..400, 420..500 = 10 + 10 + 10 + 80 = 110 ns."""
    stream = [
        Step(0),
        Enter(10, 0, None, 1),
        Exit(100, 0, None, 2),
        Op(110, 150, "AddmmBackward0", grad=(1, None)),
        Op(150, 160, "c10d::allreduce_", grad=(1, None)),
        Collective(155, 390, "gloo:all_reduce"),
        Op(400, 420, "aten::copy_"),
        Step(500),
    ]
    profile = build_profile(RawCapture(modules=MODULES, timing_passes=[stream], op_pass=None))
    check_tree(profile)
    parts = {node.path: node for node in profile.parts}
    wait = parts["<communication>"]
    assert wait.kind == "communication"
    assert wait.forward.self_cpu_time_ns == 230
    assert wait.forward.comm_time_ns == 230
    assert parts["<other>"].forward.self_cpu_time_ns == 110 + 20  # and the copy, 400..420
    backward = profile.root.backward
    assert backward is not None
    # The node's slot runs to the collective's start (40); the collective's, to its end (10).
    assert backward.self_cpu_time_ns == 50
    assert backward.comm_time_ns == 10
    assert profile.step_time_ns == 500


def test_no_collective_no_communication_figures() -> None:
    stream = [Step(0), Enter(10, 0, None, 1), Exit(100, 0, None, 2), Step(120)]
    profile = build_profile(RawCapture(modules=MODULES, timing_passes=[stream]))
    assert profile.root.forward.comm_time_ns is None
    assert "comm_time_ns" not in profile.root.forward.to_dict()
    assert [n.path for n in profile.parts] == ["<other>"]


def test_collectives_no_module_started_go_to_the_communication_part() -> None:
    """A collective outside the model (the loss all-reduced for logging, 130-150) and one
    in backward run for no known autograd node (160-170) are the
    <communication> part's, with their own time; the loss op before stays <loss>."""
    stream = [
        Step(0),
        Enter(10, 0, None, 1),
        Exit(100, 0, None, 2),
        Op(110, 120, "aten::mean"),
        Op(130, 150, "c10d::allreduce_"),
        Op(160, 170, "c10d::allreduce_", grad=(NO_SEQ, None)),
        Step(200),
    ]
    profile = build_profile(RawCapture(modules=MODULES, timing_passes=[stream]))
    check_tree(profile)
    parts = {node.path: node for node in profile.parts}
    assert set(parts) == {"<loss>", "<communication>", "<other>"}
    assert parts["<loss>"].forward.self_cpu_time_ns == 10
    wait = parts["<communication>"]
    assert (wait.forward.self_cpu_time_ns, wait.forward.comm_time_ns) == (20, 20)
    assert wait.backward is not None and (wait.backward.self_cpu_time_ns, wait.backward.comm_time_ns) == (10, 10)
    # 0..10, 100..110, 120..130, 150..160, 170..200
    assert parts["<other>"].forward.self_cpu_time_ns == 10 + 10 + 10 + 10 + 30


def test_a_backward_hook_label_and_a_synchronous_collective_in_it() -> None:
    """Module 0's forward creates autograd node 1. In backward, node 1's hook opens a
    label (115-150) whose all-gather op (120-130) starts a collective on gloo's thread
    (121-145): the label is backward work under module 0; its time idle during the
    collective (130-145) is its waiting, communication time with the op's own 10 ns."""
    stream = [
        Step(0),
        Enter(10, 0, None, 1),
        Exit(100, 0, None, 2),
        Op(110, 115, "AddmmBackward0", grad=(1, None)),
        LabelEnter(115, "FSDP::pre_backward (0)", "label", None, None, True, (1, None)),
        Op(120, 130, "c10d::_allgather_base_"),
        Collective(121, 145, "gloo:all_gather"),
        LabelExit(150, None, None, True),
        Step(200),
    ]
    profile = build_profile(RawCapture(modules=MODULES, timing_passes=[stream]))
    check_tree(profile)
    (label,) = profile.root.children
    assert (label.path, label.kind) == ("[FSDP::pre_backward (0)]", "label")
    assert label.recompute is None and label.backward is not None
    assert label.backward.self_cpu_time_ns == 35
    assert label.backward.comm_time_ns == 10 + 15
    assert profile.root.backward is not None and profile.root.backward.self_cpu_time_ns == 5
    assert "<communication>" not in {n.path for n in profile.parts}


def test_golden_rank_profile_text(golden: object) -> None:
    """A rank's tree with collectives: the Comm columns and the communication line. One
    step, 0-1000: fc's forward 20-300 (autograd nodes 1-2), its backward node 400-450,
    whose gradient hook all-reduces 64 floats (450-470, 256 bytes) on gloo's thread
    455-900, this thread idle from 470 to 920 (waiting 470-900 = 430 ns)."""
    modules = [
        ModuleInfo(path="", type="Net", parent=None, depth=0, params=16),
        ModuleInfo(path="fc", type="Linear", parent="", depth=1, params=64),
    ]
    stream = [
        Step(0),
        Enter(10, 0, None, 1),
        Enter(20, 1, None, 1),
        Op(30, 290, "aten::addmm", ((4, 8), (8, 8)), flops=512, macs=256, bytes=384),
        Exit(300, 1, None, 3),
        Exit(310, 0, None, 3),
        Op(400, 450, "AddmmBackward0", grad=(1, None)),
        Op(450, 470, "c10d::allreduce_", [[(64,)]], flops=0, macs=0, bytes=256, grad=(1, None)),
        Collective(455, 900, "gloo:all_reduce"),
        Op(920, 940, "aten::copy_"),
        Step(1000),
    ]
    raw = RawCapture(
        modules=modules, timing_passes=[stream], op_pass=stream, param_bytes=320,
        meta={"model": "Net", "device": "cpu", "mode": "context", "rank": 1, "world_size": 4, "host": "node7"},
    )
    profile = build_profile(raw)
    check_tree(profile)
    fc = profile.root.children[0]
    assert fc.backward is not None and (fc.backward.comm_time_ns, fc.backward.comm_bytes) == (20, 256)
    golden("rank_comm.out", profile.render("text"))  # type: ignore[operator]
