"""The Kineto capture's conversion, on recorded-style event trees built by hand.

These run without a GPU: device kernels are plain records linked to their launching op
by correlation id, as torch's profiler reports them.
"""

from __future__ import annotations

from layerscope.base.intervals import union_ns
from layerscope.convert.ranges import (
    MODULE_PREFIX,
    PART_PREFIX,
    STEP_NAME,
    USER_SCOPE,
    KernelSpan,
    Range,
    RangeFields,
)
from layerscope.convert.streams import convert
from layerscope.flops.recorded import CATALOG
from layerscope.model.raw import NO_SEQ, Collective, Enter, Event, Exit, LabelEnter, LabelExit, Op, Step

EVAL = "autograd::engine::evaluate_function: "


def module(index: int, start: int, end: int, *children: Range, tid: int = 1) -> Range:
    return Range(f"{MODULE_PREFIX}{index}", start, end, tid, children=list(children))


def op(name: str, start: int, end: int, *children: Range, seq: int = -1, corr: int = 0, tid: int = 1) -> Range:
    return Range(name, start, end, tid, corr, list(children), RangeFields(sequence_number=seq))


def label(name: str, start: int, end: int, *children: Range, tid: int = 1) -> Range:
    return Range(name, start, end, tid, 0, list(children), RangeFields(scope=USER_SCOPE))


def step(start: int, end: int, *children: Range, tid: int = 1) -> Range:
    return Range(STEP_NAME, start, end, tid, children=list(children))


def test_union_of_overlapping_kernels():
    # [0,10) and [5,12) overlap: 12; [20,25) apart: 5; a kernel inside another adds nothing.
    assert union_ns([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17
    assert union_ns([]) == 0


def test_forward_frames_ops_and_sequence_numbers():
    # Root (0) holds a Linear (1) whose aten::linear has sequence number 7 (it creates
    # nodes 7 and 8), then a ReLU (2) whose relu has 9.
    tree = [
        step(
            0,
            100,
            module(
                0,
                10,
                90,
                module(1, 20, 50, op("aten::linear", 25, 45, op("aten::addmm", 30, 44, seq=8), seq=7)),
                module(2, 55, 80, op("aten::relu", 60, 70, seq=9)),
            ),
        )
    ]
    (stream,) = convert(tree)
    assert stream == [
        Step(0),
        Enter(10, 0, None, 7, False),
        Enter(20, 1, None, 7, False),
        Op(25, 45, "aten::linear", fwd_seq=7, tid=1),
        Exit(50, 1, None, 9, False),
        Enter(55, 2, None, 9, False),
        Op(60, 70, "aten::relu", fwd_seq=9, tid=1),
        Exit(80, 2, None, None, False),
        Exit(90, 0, None, None, False),
        Step(100),
    ]


def test_backward_nodes_and_gradient_accumulation():
    tree = [
        step(
            0,
            200,
            module(0, 10, 40, op("aten::mm", 15, 30, seq=3)),
            op(EVAL + "MmBackward0", 100, 130, op("MmBackward0", 101, 129), seq=3),
            op(EVAL + "torch::autograd::AccumulateGrad", 131, 140),
        )
    ]
    (stream,) = convert(tree)
    backward = [e for e in stream if isinstance(e, Op) and e.grad is not None]
    # Accumulation takes the number of the node that completed its gradient just before.
    assert backward == [
        Op(100, 130, "MmBackward0", grad=(3, None), tid=1),
        Op(131, 140, "torch::autograd::AccumulateGrad", grad=(3, None), tid=1),
    ]
    # Accumulation with no node before it is unowned.
    (alone,) = convert([step(0, 50, op(EVAL + "torch::autograd::AccumulateGrad", 10, 20))])
    assert [e.grad for e in alone if isinstance(e, Op)] == [(NO_SEQ, None)]


def test_parts_labels_and_optimizer_ranges():
    tree = [
        step(
            0,
            100,
            Range(PART_PREFIX + "loss", 10, 20, 1, children=[op("aten::mean", 12, 18, seq=4)]),
            label("Optimizer.step#AdamW.step", 30, 60),
            label("data", 70, 90),
        )
    ]
    (stream,) = convert(tree)
    enters = [(e.name, e.kind) for e in stream if isinstance(e, LabelEnter)]
    assert enters == [("loss", "loss"), ("AdamW", "optimizer"), ("data", "label")]
    assert sum(isinstance(e, LabelExit) for e in stream) == 3


def test_other_threads_are_left_out_but_autograd_threads_are_kept():
    tree = [
        step(0, 100, module(0, 10, 40, op("aten::mm", 15, 30, seq=1)), tid=1),
        # A serving thread calling the same model meanwhile: not this block's work.
        module(0, 20, 60, op("aten::mm", 25, 55, seq=1, tid=2), tid=2),
        # Autograd's device thread running this step's backward.
        op(EVAL + "MmBackward0", 50, 70, seq=1, tid=3),
        # The same thread, outside every step: not counted.
        op(EVAL + "MmBackward0", 150, 170, seq=1, tid=3),
    ]
    (stream,) = convert(tree)
    assert [e.module for e in stream if isinstance(e, Enter)] == [0]
    assert [(e.t0_ns, e.tid) for e in stream if isinstance(e, Op) and e.grad is not None] == [(50, 3)]


def test_recompute_inside_backward_cuts_the_node_slot():
    # A checkpoint's backward node recomputes module 1 inside its own range.
    tree = [
        step(
            0,
            300,
            module(0, 10, 50, module(1, 20, 40, op("aten::relu", 25, 35, seq=2))),
            op(
                EVAL + "CheckpointFunctionBackward",
                100,
                200,
                op("CheckpointFunctionBackward", 101, 199, module(1, 120, 160, op("aten::relu", 125, 150, seq=5))),
                seq=2,
            ),
        )
    ]
    (stream,) = convert(tree)
    node = next(e for e in stream if isinstance(e, Op) and e.grad is not None)
    assert (node.t0_ns, node.t1_ns) == (100, 120)
    recompute = [e for e in stream if isinstance(e, Enter) and e.in_backward]
    assert [(e.t_ns, e.module) for e in recompute] == [(120, 1)]


def test_device_time_is_the_union_of_the_op_subtree_kernels():
    # aten::linear launches nothing itself; its addmm (corr 2) launches two kernels on
    # two streams that overlap for 5 ns; a backward node's mm (corr 4) launches one.
    tree = [
        step(
            0,
            500,
            module(0, 10, 100, op("aten::linear", 20, 90, op("aten::addmm", 30, 80, corr=2), seq=1, corr=1)),
            op(EVAL + "AddmmBackward0", 200, 300, op("aten::mm", 210, 290, corr=4), seq=1, corr=3),
        )
    ]
    kernels = [KernelSpan(2, 1000, 1020), KernelSpan(2, 1015, 1030), KernelSpan(4, 2000, 2007), KernelSpan(99, 0, 5)]
    (stream,) = convert(tree, kernels, has_device=True)
    ops = {e.name: e.device_time_ns for e in stream if isinstance(e, Op)}
    assert ops == {"aten::linear": 30, "AddmmBackward0": 7}


def test_no_step_range_gives_no_stream():
    assert convert([module(0, 0, 10)]) == []


def test_a_custom_function_running_modules_is_walked_into():
    # A reentrant checkpoint runs the block's modules inside its autograd Function's
    # range in forward; the Function's own slot ends where the modules begin.
    tree = [step(0, 100, module(0, 5, 95, op("CheckpointFunction", 10, 90, module(1, 20, 80, op("aten::relu", 30, 40, seq=1)))))]
    (stream,) = convert(tree)
    function = next(e for e in stream if isinstance(e, Op) and e.name == "CheckpointFunction")
    assert (function.t0_ns, function.t1_ns) == (10, 20)
    assert [(e.t_ns, e.module, e.in_backward) for e in stream if isinstance(e, Enter)] == [(5, 0, False), (20, 1, False)]


def test_real_profiler_run_converts_to_a_stream_per_step():
    import torch
    from torch import nn

    from layerscope.capture.kineto import KinetoWindow

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    index = {id(m): i for i, (_, m) in enumerate(model.named_modules())}
    window = KinetoWindow(index, device=torch.device("cpu"))
    window.start()
    for _ in range(2):
        window.begin_step()
        with window.part("loss"):
            loss = model(torch.randn(3, 4)).sum()
        loss.backward()
        window.end_step()
    streams = window.stop()
    assert len(streams) == 2
    for stream in streams:
        assert isinstance(stream[0], Step) and isinstance(stream[-1], Step)
        assert [e.module for e in stream if isinstance(e, Enter)] == [0, 1, 2, 3]
        assert [e.name for e in stream if isinstance(e, LabelEnter)] == ["loss"]
        backward = [e for e in stream if isinstance(e, Op) and e.grad is not None]
        assert {"AddmmBackward0", "ReluBackward0", "TBackward0"} <= {e.name for e in backward}
        # The Linear layers' parameters accumulate right after their own nodes.
        accumulate = [e.grad for e in backward if e.name.endswith("AccumulateGrad")]
        assert len(accumulate) == 4 and all(seq is not None and seq < NO_SEQ for seq, _ in accumulate)
    # The hooks are gone, the model untouched.
    from torch.nn.modules import module as nn_module

    assert not nn_module._global_forward_pre_hooks and not nn_module._global_forward_hooks


def test_collectives_from_a_gradient_hook_and_gloo_thread() -> None:
    """DDP's reducer starts its all-reduce inside the gradient accumulation node's range
    (a hook); gloo runs it on its own thread. The all-reduce becomes a backward op of the
    same node, cutting the node's op where it starts (the node's end after it is the
    node's again); the gloo range becomes a
    ``Collective`` note; a collective range on another thread outside the step is dropped."""
    roots = [
        step(
            0, 500,
            module(0, 10, 100, op("aten::addmm", 20, 90, seq=7)),
            op(EVAL + "AddmmBackward0", 110, 150, seq=7),
            op(EVAL + "torch::autograd::AccumulateGrad", 150, 170, op("c10d::allreduce_", 160, 168)),
        ),
        op("gloo:all_reduce", 165, 390, tid=3),
        op("gloo:all_reduce", 600, 700, tid=3),
    ]
    (stream,) = convert(roots)
    ops = [e for e in stream if isinstance(e, Op) and e.grad is not None]
    assert [(o.name, o.t0_ns, o.t1_ns, o.grad) for o in ops] == [
        ("AddmmBackward0", 110, 150, (7, None)),
        ("torch::autograd::AccumulateGrad", 150, 160, (7, None)),
        ("c10d::allreduce_", 160, 168, (7, None)),
        (None, 168, 168, (7, None)),  # the node resumes where the collective ends
        (None, 168, 170, (7, None)),  # the node's own end, after the collective, is the node's
    ]
    assert [e for e in stream if isinstance(e, Collective)] == [Collective(165, 390, "gloo:all_reduce")]


def test_a_node_with_hooks_takes_its_number_from_its_own_range_and_its_hook_labels() -> None:
    """A node with a pre-hook (FSDP's pre-backward) leaves its evaluate range unnumbered;
    the node's own range inside carries the number. A label the hook opens is backward
    work of that node (``grad``), with its collective inside as an op."""
    roots = [
        step(
            0, 300,
            module(0, 10, 100, op("aten::addmm", 20, 90, seq=7)),
            op(
                EVAL + "AddmmBackward0", 110, 200,
                label("FSDP::pre_backward (0)", 115, 150, op("c10d::_allgather_base_", 120, 130)),
                op("AddmmBackward0", 150, 190, seq=7),
            ),
        ),
    ]
    (stream,) = convert(roots)
    body = [e for e in stream if not isinstance(e, (Step, Enter, Exit)) and getattr(e, "name", "") != "aten::addmm"]
    assert body == [
        Op(110, 115, "AddmmBackward0", grad=(7, None), tid=1),
        LabelEnter(115, "FSDP::pre_backward (0)", "label", None, None, True, (7, None)),
        Op(120, 130, "c10d::_allgather_base_", tid=1),
        LabelExit(150, None, None, True),
        # After the hook's label, the node's slot resumes: its own range (the formula,
        # 150 to 190) and the engine's end are the node's work, not the next part's.
        Op(150, 150, None, grad=(7, None), tid=1),
        Op(150, 200, None, grad=(7, None), tid=1),
    ]


# -- a detailed window: ops at the dispatcher's level, with shapes, counts and memory ---


class _Meta:
    """An input as torch's profiler records it (``_TensorMetadata``)."""

    def __init__(self, *sizes: int) -> None:
        import torch

        self.sizes = list(sizes)
        self.dtype = torch.float32
        self.device = torch.device("cpu")


def _op(name: str, start: int, end: int, *children: Range, inputs: tuple = (), seq: int = -1, corr: int = 0) -> Range:
    return Range(name, start, end, 1, corr, list(children), RangeFields(sequence_number=seq, inputs=list(inputs)))


def _alloc(t: int, ident: int, size: int, ptr: int) -> Range:
    return Range("[memory]", t, t, 1, 0, [], RangeFields(ptr=ptr, alloc_size=size, allocation_id=ident))


def test_detailed_conversion_opens_composites_and_counts_their_parts_once() -> None:
    from layerscope.attribute import walk_pass
    from layerscope.convert.ranges import Detail

    # A module's aten::linear (a composite) over t and addmm; addmm allocates its output
    # (id 7, 32 B) and a temporary it frees itself (id 8). Outside the model, a second
    # linear: no backward follows, so its parts are rows of <other>, charged once through
    # the composite's record.
    x, w, b = _Meta(2, 4), _Meta(4, 4), _Meta(4)
    linear = _op(
        "aten::linear", 20, 90,
        _op("aten::t", 25, 30, inputs=(w,)),
        _op("aten::addmm", 30, 80, _alloc(40, 7, 32, 0x100), _alloc(50, 8, 64, 0x200), _alloc(60, 8, -64, 0x200),
            inputs=(b, x, _Meta(4, 4), 1, 1), corr=2),
        inputs=(x, w, b), seq=0,
    )
    loss = _op(
        "aten::linear", 200, 260,
        _op("aten::t", 205, 210, inputs=(w,)),
        _op("aten::addmm", 210, 250, inputs=(b, x, _Meta(4, 4), 1, 1), corr=4),
        inputs=(x, w, b),
    )
    tree = [step(0, 500, module(0, 10, 100, linear), loss)]
    kernels = [KernelSpan(2, 1000, 1020), KernelSpan(4, 2000, 2010)]
    (stream,) = convert(tree, kernels, has_device=True, detail=Detail(), ops=CATALOG)
    ops = [e for e in stream if isinstance(e, Op)]
    # Rows: t and addmm twice; linear never (its parts count its work); one nameless
    # record holds the outer linear's time and its parts' kernels.
    assert [o.name for o in ops] == ["aten::t", "aten::addmm", None, "aten::t", "aten::addmm"]
    addmm = ops[1]
    # 2x4 @ 4x4 = 32 MACs; torch's count is 2 per MAC, plus the bias add: 64 + 8.
    assert (addmm.flops, addmm.macs) == (72, 32)
    assert addmm.input_shapes == ((4,), (2, 4), (4, 4))
    assert addmm.allocs == ((7, 32),)  # the temporary freed inside is not counted
    assert addmm.device_time_ns == 20
    carrier = ops[2]
    assert (carrier.t0_ns, carrier.t1_ns, carrier.device_time_ns) == (200, 260, 10)
    result = walk_pass(stream, [""], has_device=True, collect_ops=True)
    # The model's frame owns its op's kernels; <other> (after the model's forward, no
    # backward following) owns the outer linear's, once, and its 60 ns once, with the rest
    # of the step.
    assert result.self_dev[(0, "forward")] == 20
    assert result.self_dev[("<other>", "forward")] == 10
    assert result.self_cpu[(0, "forward")] == 90
    assert result.self_cpu[("<other>", "forward")] == 500 - 90
    rows = {(key[0], key[2]): op.calls for key, op in result.ops.items()}
    assert rows == {(0, "aten::t"): 1, (0, "aten::addmm"): 1, ("<other>", "aten::t"): 1, ("<other>", "aten::addmm"): 1}


def test_recompute_on_autograd_device_thread_keeps_its_ops_and_leaves_the_counter_alone() -> None:
    from layerscope.convert.ranges import Detail

    # On a GPU, backward runs on autograd's device thread (tid 3): a checkpoint's node
    # recomputes module 1 there. Its ops are recompute work of module 1 (not dropped as
    # another thread's), and their sequence numbers (thread 3's own counter) do not move
    # the forward thread's counter at module 0's exit.
    relu = _Meta(2, 4)
    tree = [
        step(
            0, 300,
            module(0, 10, 50, module(1, 20, 40, Range("aten::relu", 25, 35, 1, 0, [], RangeFields(2, inputs=[relu])))),
        ),
        Range(EVAL + "CheckpointFunctionBackward", 100, 200, 3, 0, [
            module(1, 120, 160, Range("aten::relu", 125, 150, 3, 0, [], RangeFields(0, inputs=[relu])), tid=3),
        ], RangeFields(2)),
    ]
    (stream,) = convert(tree, detail=Detail(), ops=CATALOG)
    recomputed = [e for e in stream if isinstance(e, Op) and e.name == "aten::relu" and e.tid == 3]
    assert len(recomputed) == 1 and recomputed[0].flops == 8
    exits = [e for e in stream if isinstance(e, Exit) and not e.in_backward]
    assert [(e.module, e.seq) for e in exits] == [(1, None), (0, None)]


def _ledger_window() -> tuple[list[Range], list[KernelSpan]]:
    """Two steps. Step A (host 0-500): the model runs an addmm (corr 2) and an mm (corr
    3), then an all-reduce (corr 4) outside it; a memset launched from no op range runs
    at 400. Step B (host 500-1000): the model's gemm (corr 6)."""
    tree = [
        step(0, 500, module(0, 10, 99, op("aten::addmm", 30, 80, corr=2), op("aten::mm", 85, 95, corr=3)),
             op("c10d::allreduce_", 100, 110, corr=4)),
        step(500, 1000, module(0, 510, 700, op("aten::mm", 600, 650, corr=6))),
    ]
    kernels = [
        KernelSpan(2, 1000, 1100, "gemm", 7),
        KernelSpan(3, 1050, 1120, "gemm2", 8),  # overlaps gemm for 50 on another stream
        KernelSpan(4, 1090, 1200, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 9),
        KernelSpan(0, 400, 410, "Memset (Device)", 7),  # launched from no op range
        KernelSpan(6, 1190, 1300, "gemm3", 7),  # step B's, launched in B, overlaps A's all-reduce
    ]
    return tree, kernels


def test_each_step_device_busy_counts_overlap_once_and_keeps_collectives_out_of_ops():
    from layerscope.model.raw import DeviceBusy

    tree, kernels = _ledger_window()
    first, second = convert(tree, kernels, has_device=True)
    ops = [(e.name, e.device_time_ns) for e in first + second if isinstance(e, Op)]
    # gemm holds 1000-1100 (100); gemm2 started later, so holds only 1100-1120 (20); the
    # all-reduce's kernel is communication, never an op's time; step B's gemm3 is
    # compute, so holds 1190-1300 (110) although A's all-reduce still ran then.
    assert ops == [("aten::addmm", 100), ("aten::mm", 20), ("c10d::allreduce_", 0), ("aten::mm", 110)]
    # Step A: compute 100 + 20 + memset 10 = 130; the all-reduce ran 1090-1200 (110), of
    # which 1090-1120 and 1190-1200 (40) with compute: alone 70; busy 130 + 70 = 200.
    assert [e for e in first if isinstance(e, DeviceBusy)] == [DeviceBusy(200, 130, 110, 40, 10)]
    assert [e for e in second if isinstance(e, DeviceBusy)] == [DeviceBusy(110, 110, 0, 0, 0)]
    # Both steps add up to the union of all the work: 400-410 and 1000-1300.
    assert 200 + 110 == union_ns([(k.start_ns, k.end_ns) for k in kernels])


def test_the_profile_ledger_puts_every_device_nanosecond_in_one_place():
    from layerscope.attribute.cycle import Cycle
    from layerscope.model.check import check_tree
    from layerscope.model.raw import ModuleInfo, RawCapture
    from layerscope.render.text import device_lines

    tree, kernels = _ledger_window()
    infos = [ModuleInfo("", "Net", None, 0, 0)]
    cycle = Cycle(infos, [None], collect_ops=True)
    for number, stream in enumerate(convert(tree, kernels, has_device=True)):
        cycle.add(stream, number, warmup=False, keep_empty=True, has_device=True)
    profile = check_tree(cycle.build(RawCapture(modules=infos, has_device_time=True)))
    ledger = profile.device
    assert ledger is not None
    # Nodes: the model 100 + 20 + 110 = 230; the all-reduce's 70 alone and the memset's
    # 10 are in no node, each with its reason: 230 + 70 + 10 = 310 = 200 + 110.
    assert (ledger.busy_ns, ledger.attributed_ns) == (310, 230)
    assert ledger.unattributed_ns_by_reason == {"communication": 70, "no_op_range": 10}
    assert (ledger.compute_ns, ledger.comm_ns, ledger.overlap_ns) == (240, 110, 40)
    assert device_lines(profile) == [
        "Device busy 310ns = attributed 230ns + unattributed 80ns (collectives' kernels, not overlapped with "
        "compute 70ns; launched outside any op range 10ns)",
        "Device communication 110ns, of which 40ns overlapped with compute",
    ]
    # Saved and read back, it is the same ledger.
    from layerscope.model.sidedocs import DeviceLedger

    assert profile.to_dict()["device"] == ledger.to_dict()
    assert DeviceLedger.from_dict(ledger.to_dict()) == ledger


def test_a_custom_ops_own_kernels_are_its_frames():
    # vllm::moe_forward (an op layerscope does not open as a dispatcher op) launches a
    # kernel itself (corr 5) beside its nested aten::mm (corr 6).
    tree = [step(0, 500, module(0, 10, 200, op("vllm::moe_forward", 20, 150, op("aten::mm", 30, 40, corr=6), corr=5)))]
    kernels = [KernelSpan(5, 1000, 1040, "fused_moe_kernel", 7), KernelSpan(6, 1100, 1110, "gemm", 7)]
    from layerscope.attribute import walk_pass
    from layerscope.convert.ranges import Detail

    (stream,) = convert(tree, kernels, has_device=True, detail=Detail(), ops=CATALOG)
    result = walk_pass(stream, [""], has_device=True, collect_ops=True)
    assert result.self_dev[(0, "forward")] == 40 + 10


def _memory(t: int, ident: int, size: int, ptr: int, device: str) -> Range:
    import torch

    fields = RangeFields(ptr=ptr, alloc_size=size, allocation_id=ident, device=torch.device(device))
    return Range("[memory]", t, t, 1, 0, [], fields)


def _gradient_allocated_again(device: str) -> tuple[list[Event], int]:
    """A step on ``device`` that frees a 256-byte gradient live before it (id 3 at 0x500,
    as ``zero_grad(set_to_none=True)`` does) and allocates it again (id 4 at 0x600), its
    allocation events sized as the device's allocator sizes them; its stream, and its
    growth (peak - baseline)."""
    from layerscope.attribute import walk_pass
    from layerscope.convert.ranges import NOTE_PREFIX, Detail

    block = 512 if device == "cuda" else 256
    # Live before the step: two parameters (1,024 B and a 256-byte bias) and the gradient.
    notes = [[
        ("constant", [(1024, device), (256, device)], "parameters"),
        ("adopt", 0x500, 256, "gradients", True, device),
    ]]
    tree = [step(0, 100, Range(f"{NOTE_PREFIX}0", 1, 1), _memory(10, 3, -block, 0x500, device), _memory(20, 4, block, 0x600, device))]
    (stream,) = convert(tree, detail=Detail(notes=notes), ops=CATALOG)
    memory = walk_pass(stream, [""]).memory
    assert memory is not None
    return stream, memory.peak_bytes - memory.baseline_bytes


def test_memory_live_before_a_step_is_sized_by_the_rule_of_the_steps_allocations() -> None:
    from layerscope.model.raw import Adopt

    # On CUDA torch's allocation events carry the caching allocator's blocks (a multiple
    # of 512 B, at least 512): what was live before the step is sized the same way, so
    # the gradient freed and allocated again (512 B each way) leaves the live bytes where
    # they were, as the allocator's own total does: growth 0. (Logical sizes before the
    # step with blocks in it: -256 + 512 = +256 B.)
    stream, growth = _gradient_allocated_again("cuda")
    adopted = [e for e in stream if isinstance(e, Adopt)]
    assert adopted == [Adopt(1, None, 1024 + 512, "parameters", True), Adopt(1, -0x500, 512, "gradients", True)]
    assert growth == 0
    # The CPU's events report exact sizes: logical bytes throughout, growth 0 as well.
    stream, growth = _gradient_allocated_again("cpu")
    adopted = [e for e in stream if isinstance(e, Adopt)]
    assert adopted == [Adopt(1, None, 1024 + 256, "parameters", True), Adopt(1, -0x500, 256, "gradients", True)]
    assert growth == 0


def test_the_cuda_allocators_block_rule() -> None:
    from layerscope.convert.memory import held_bytes

    # round_size: below 512 B one block; above, up to the next multiple of 512.
    assert [held_bytes(n, "cuda") for n in (1, 256, 512, 513, 1024, 5000)] == [512, 512, 512, 1024, 1024, 5120]
    assert [held_bytes(n, "cpu") for n in (1, 256, 513)] == [1, 256, 513]


def test_a_range_without_detail_keeps_only_the_kernels_outside_the_frames_nested_in_it() -> None:
    """Read without detail (a light step), a compiled region's range (no namespace)
    holds a label (its graph call) whose op launched kernel 7, and launched kernel 8
    itself: the label's op holds kernel 7's 10 ns, the region's record only its own
    5 ns. The module's device time is 15, not 25 (kernel 7 counted once)."""
    tree = [step(0, 500, module(0, 10, 200, op(
        "Torch-Compiled Region: 0/1", 20, 150,
        label("## Call CompiledFxGraph f ##", 40, 140, op("triton_poi_fused_add_0", 50, 60, corr=7)), corr=8,
    )))]
    kernels = [KernelSpan(7, 1000, 1010, "triton_poi_fused_add_0", 7), KernelSpan(8, 1100, 1105, "memset", 7)]
    (stream,) = convert(tree, kernels, has_device=True)
    device = {e.name: e.device_time_ns for e in stream if isinstance(e, Op)}
    assert device == {"Torch-Compiled Region: 0/1": 5, "triton_poi_fused_add_0": 10}
    from layerscope.attribute import walk_pass

    result = walk_pass(stream, [""], has_device=True)
    assert sum(result.self_dev.values()) == 15


def test_a_collective_inside_a_custom_op_read_without_detail_is_communication() -> None:
    """A tensor-parallel all-reduce: ``vllm::all_reduce`` (a custom op, 20-120) runs
    ``symm_mem::multimem_all_reduce_`` (60-80) inside it. Read without detail, the
    collective is a record of its own, so its 20 ns are the module's communication time
    (as with detail), and the custom op's own slot ends where it begins."""
    tree = [step(0, 200, module(0, 10, 150, op(
        "vllm::all_reduce", 20, 120, op("aten::empty_like", 25, 30), op("symm_mem::multimem_all_reduce_", 60, 80),
    )))]
    (stream,) = convert(tree)
    ops = [(e.name, e.t0_ns, e.t1_ns) for e in stream if isinstance(e, Op)]
    assert ops == [("vllm::all_reduce", 20, 60), ("symm_mem::multimem_all_reduce_", 60, 80)]
    from layerscope.attribute import walk_pass

    assert walk_pass(stream, [""]).self_comm == {(0, "forward"): 20}


def test_ops_without_recorded_inputs_are_rows_where_a_module_called_them() -> None:
    """With the catalog of a trace without shapes (``OutermostOps``: names alone, no
    torch), ``aten::linear`` is one row (its ``addmm`` is not opened), with no shapes
    and no counts, and keeps what it allocated and did not free (the output, 64 B; the
    16-byte workspace it freed is nobody's); a custom op outside aten is opened into its
    parts, so the collective inside it is a row."""
    from layerscope.convert.ranges import Detail
    from layerscope.convert.streams import OutermostOps

    tree = [step(0, 500, module(0, 10, 400,
        _op("aten::linear", 20, 90, _op("aten::addmm", 30, 80, _alloc(35, 1, 64, 0x100), _alloc(40, 2, 16, 0x200),
                                        _alloc(70, 2, -16, 0x200))),
        _op("vllm::all_reduce", 100, 300, _op("symm_mem::multimem_all_reduce_", 150, 200)),
    ))]
    (stream,) = convert(tree, detail=Detail(), ops=OutermostOps())
    rows = [(e.name, e.input_shapes, e.flops, e.macs, e.allocs) for e in stream if isinstance(e, Op) and e.name]
    assert rows == [
        ("aten::linear", None, None, None, ((1, 64),)),
        ("symm_mem::multimem_all_reduce_", None, None, None, None),
    ]


def test_a_range_outside_every_module_that_runs_one_keeps_its_own_and_its_parts_kernels() -> None:
    """After the model's forward (module 0, 10-100), a custom Function outside every
    module (200-600) runs an op (``aten::mul``, kernel 20 ns), launches 5 ns itself, and
    calls module 0 again (300-500, ``aten::add``, 40 ns): no backward follows, another
    forward does, so the Function's own work is the ``<between calls>`` part's. Read
    with detail, with the catalog of a trace without shapes, or without detail, its 25 ns
    are that part's and the 40 ns the module's: before, with detail, its record held none
    when a module ran inside it, and the 25 ns were nobody's."""
    from layerscope.attribute import walk_pass
    from layerscope.convert.ranges import Detail
    from layerscope.convert.streams import OutermostOps

    def tree() -> list[Range]:
        return [step(0, 1000,
            module(0, 10, 100, op("aten::relu", 20, 30, corr=4)),
            op("MyFunction", 200, 600, op("aten::mul", 210, 250, corr=5), module(0, 300, 500, op("aten::add", 310, 350, corr=6)),
               corr=9),
        )]

    kernels = [KernelSpan(4, 2000, 2010), KernelSpan(5, 3000, 3020), KernelSpan(6, 4000, 4040), KernelSpan(9, 5000, 5005)]
    for how in ({}, {"detail": Detail(), "ops": CATALOG}, {"detail": Detail(), "ops": OutermostOps()}):
        (stream,) = convert(tree(), kernels, has_device=True, **how)
        assert walk_pass(stream, [""], has_device=True).self_dev == {(0, "forward"): 10 + 40, ("<between calls>", "forward"): 25}, how
