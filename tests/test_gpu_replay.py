"""The GPU path, checked on every commit without a GPU: captures recorded on an H100
(``tests/data/captures``, by ``benchmarks/gpu.py``'s record part) replayed through the
same adapter, conversion and walker that ran there, and held against ground truth
recorded in the same run (torch's own trace of the same session, the kernels' union, the
allocator's peak) and against torch.profiler traces of the same workloads recorded in
another session (``../shared/traces``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import layerscope
from layerscope.base.intervals import union_ns
from layerscope.capture import replay

CAPTURES = Path(__file__).parent / "data" / "captures"
#: Eager blocks' captures (compiled blocks' are replayed by tests/test_compiled_block.py).
NAMES = sorted(p.name.removesuffix(".json.gz") for p in CAPTURES.glob("*.json.gz") if not p.name.startswith("compiled_"))


def test_the_recorded_captures_are_here() -> None:
    assert NAMES == ["bert_base_fwd", "ddp_nccl_train", "gpt2_adamw_train", "gpt2_ckpt_train", "llama_bf16_train"]


@pytest.fixture(scope="module", params=NAMES)
def recorded(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any], layerscope.Profile]:
    data = replay.load(CAPTURES / f"{request.param}.json.gz")
    return request.param, data, replay.replay(data)


def test_a_replay_is_the_profile_the_gpu_made(recorded: tuple[str, dict[str, Any], layerscope.Profile]) -> None:
    _, data, prof = recorded
    layerscope.check_tree(prof)
    assert "H100" in data["truth"]["device_name"] and prof.meta.device.startswith("cuda")
    # Node by node, forward and backward self device time, and every module's total:
    # what the H100 showed. (A label's total depends on what the tree nests under it,
    # which changed since the recording: a range enclosing module calls now holds them.)
    mine = replay.node_figures(prof)
    # layerscope's own work in the step (its notes) is a node of its own since the
    # recording (it was <other>'s CPU time): no device work is launched from it.
    own = {path for path in mine if prof.node(path).kind == "overhead"}
    assert own and all(not mine[path][0] and not mine[path][2] for path in own)
    assert mine.keys() - own == data["live"].keys()
    for path, (fwd_self, fwd, bwd_self, bwd) in data["live"].items():
        assert (mine[path][0], mine[path][2]) == (fwd_self, bwd_self), path
        if prof.node(path).kind == "module":
            assert (mine[path][1], mine[path][3]) == (fwd, bwd), path
    assert prof.root.forward.device_time_ns > 0


def _device_work(data: dict[str, Any]) -> list[tuple[int, int]]:
    """Every kernel, copy and memset launched from an op in the recorded window, read
    from the recorded events themselves (not through layerscope's conversion)."""
    spans = []
    for window in data["windows"]:
        for kind, annotation, name, linked, start, end, *_ in window["result"]["events"]:
            if kind != "CPU" and not annotation and name != "[memory]" and linked > 0:
                spans.append((start, end))
    return spans


def test_every_device_nanosecond_is_in_one_place(recorded: tuple[str, dict[str, Any], layerscope.Profile]) -> None:
    _, data, prof = recorded
    ledger = prof.device
    assert ledger is not None
    # The steps' busy time is the union of the window's device work (all of it ran in a
    # step here), and every nanosecond of it is a node's or a part's.
    assert ledger.busy_ns == union_ns(_device_work(data))
    assert ledger.attributed_ns == ledger.busy_ns and ledger.unattributed_ns == 0
    selves = sum(stats.self_device_time_ns or 0 for node in prof.nodes() for _, stats in node.phases())
    assert selves == ledger.attributed_ns


def test_every_module_agrees_with_torchs_own_trace_of_the_same_session(
    recorded: tuple[str, dict[str, Any], layerscope.Profile],
) -> None:
    """``layerscope.load`` of torch's trace of the very session (read on the GPU
    machine) against the live profile: module by module, forward and backward, within 1%
    (seen: identical, every module of all five)."""
    _, data, prof = recorded
    (traced,) = data["truth"]["trace_nodes"]
    live = replay.node_figures(prof)
    compared = 0
    for path, figures in live.items():
        if prof.node(path).kind != "module":
            continue  # parts and labels: the trace was read with the nesting of its day
        for i in (1, 3):
            mine, theirs = figures[i], traced[path][i]
            if mine is None:
                continue
            assert theirs is not None and abs(mine - theirs) <= 0.01 * max(mine, theirs), (path, i, mine, theirs)
            compared += 1
    assert compared >= len(live) // 2


def test_the_step_peak_is_the_allocators(recorded: tuple[str, dict[str, Any], layerscope.Profile]) -> None:
    name, data, prof = recorded
    assert prof.memory is not None and prof.memory.device is not None
    peak = prof.memory.device.allocated_peak_bytes
    if name == "ddp_nccl_train":
        # The process group allocates on its own thread, whose allocations torch's
        # profiler does not record for the block's thread: the allocator's peak is
        # higher by one bucket (docs/design.md).
        assert peak <= data["truth"]["max_memory_allocated"]
    else:
        assert peak == data["truth"]["max_memory_allocated"]


# -- against the same workloads recorded in another session (../shared/traces) ----------


def _meta_model(name: str) -> torch.nn.Module:
    tf = pytest.importorskip("transformers")
    with torch.device("meta"):
        if name == "bert_base_fwd":
            return tf.BertModel(tf.BertConfig()).eval()
        if name == "gpt2_adamw_train":
            return tf.GPT2LMHeadModel(tf.GPT2Config())
        if name == "gpt2_ckpt_train":
            return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=6))
        return tf.LlamaForCausalLM(tf.LlamaConfig(
            num_hidden_layers=4, hidden_size=1024, num_attention_heads=16, num_key_value_heads=4,
            intermediate_size=2816, vocab_size=32000, attn_implementation="sdpa",
        ))


@pytest.mark.parametrize("name", ["bert_base_fwd", "gpt2_adamw_train", "gpt2_ckpt_train", "llama_bf16_train"])
def test_per_module_device_time_matches_the_shared_h100_trace(name: str, shared_traces: Path) -> None:
    """Each module's device time per step, forward and backward, within 5% of a
    torch.profiler trace of the same model and input on the same kind of GPU, for every
    module holding at least 1% of the step (seen: within 1.1% for BERT, 1.7% for
    GPT-2, 1.3% with checkpointing, 3.3% for bf16 Llama's small norms)."""
    data = replay.load(CAPTURES / f"{name}.json.gz")
    prof = replay.replay(data)
    other = layerscope.load(shared_traces / f"h100_{name}.json.gz", model=_meta_model(name))
    mine, theirs = replay.node_figures(prof), replay.node_figures(other)
    steps, their_steps = prof.figures.steps, other.figures.steps
    root = ((mine[""][1] or 0) + (mine[""][3] or 0)) / steps
    compared = 0
    for path, figures in mine.items():
        if path.startswith("<"):
            continue
        for i in (1, 3):
            if figures[i] is None:
                continue
            a, b = figures[i] / steps, theirs[path][i] / their_steps
            if max(a, b) < 0.01 * root:
                continue
            assert abs(a - b) <= 0.05 * max(a, b), (path, "forward" if i == 1 else "backward", a, b)
            compared += 1
    assert compared >= 20


# -- light steps (``Profiler(detail="first")``) on the H100's events ------------------------

#: The recordings of more than one step with work: the first detailed, the rest light.
MULTI_STEP = ["bert_base_fwd", "ddp_nccl_train", "gpt2_adamw_train"]


@pytest.mark.parametrize("name", NAMES)
def test_a_light_read_of_a_step_gives_every_nodes_times_as_its_detailed_read(name: str) -> None:
    from layerscope.attribute import parent_indices, walk_pass
    from layerscope.convert.streams import convert_window
    from layerscope.flops.recorded import CATALOG
    from layerscope.model.raw import ModuleInfo

    data = replay.load(CAPTURES / f"{name}.json.gz")
    infos = [ModuleInfo(**m) for m in data["modules"]]
    paths, parents = [info.path for info in infos], parent_indices(infos)
    detailed = convert_window(replay.windows(data)[0], CATALOG)
    light = convert_window(replay._light_windows(data)[0], CATALOG)
    assert len(light) == len(detailed)
    for one, lean_one in zip(detailed, light):
        full = walk_pass(one, paths, has_device=True, collect_ops=True, parents=parents)
        lean = walk_pass(lean_one, paths, has_device=True, parents=parents)
        # Every node's device time, and the step's device work, read without the detail:
        # the same kernels land in the same nodes (a checkpoint's recompute included,
        # whose kernels the node's own record once counted a second time).
        assert lean.self_dev == full.self_dev and lean.device_busy == full.device_busy
        # And every node's CPU time: a node's work around what is nested in it (a
        # recompute, a collective, a hook's label) and after its last op is its own in both.
        assert lean.self_cpu == full.self_cpu
        assert not any(op.input_shapes for op in lean.ops.values())


def test_a_checkpointed_blocks_backward_node_keeps_its_work_around_the_recompute() -> None:
    """The node that unpacks a checkpointed block's saved tensors runs the block's
    recompute nested in it, then its own work (restoring state, its formula). Its module's
    backward time is the node's range less the recompute, up to the next node: read from
    the recorded events themselves, not through layerscope's conversion."""
    from layerscope.convert.streams import EVALUATE, _nested_frames, _sequence_nr

    data = replay.load(CAPTURES / "gpt2_ckpt_train.json.gz")
    prof = replay.replay(data)
    path = "transformer.h.0.mlp.dropout"
    (window,) = replay.windows(data)

    def ranges(items: list[Any]) -> Any:
        for item in items:
            yield item
            yield from ranges(item.children)

    nodes = sorted(
        (r for r in ranges(window.roots) if r.name.startswith(EVALUATE)), key=lambda r: r.start_time_ns,
    )
    (node,) = [r for r in nodes if r.name.endswith("NativeDropoutBackward0") and _sequence_nr(r) == 3097]
    recompute = sum(child.end_time_ns - child.start_time_ns for child, _ in _nested_frames(node))
    following = min(r.start_time_ns for r in nodes if r.start_time_ns >= node.end_time_ns)
    assert recompute > 0 and prof.figures.steps == 1  # one step with work: this node's
    assert prof[path].backward.self_cpu_time_ns == following - node.start_time_ns - recompute


@pytest.mark.parametrize("name", MULTI_STEP)
def test_a_light_step_block_on_the_h100s_events(name: str) -> None:
    data = replay.load(CAPTURES / f"{name}.json.gz")
    every = replay.replay(data)
    mixed = layerscope.check_tree(replay.replay(data, light_after_first=True))
    assert mixed.figures.detailed_steps == [0] and mixed.figures.step_numbers == [1]
    # Counts are the detailed step's, once; both steps ran the same model work.
    for node in mixed.modules():
        for phase, stats in node.phases():
            assert stats.flops is not None and 2 * stats.flops == getattr(every.node(node.path), phase).flops, (
                node.path, phase,
            )
    # Every device nanosecond of the light step is in one place, and all of it in a node.
    ledger = mixed.device
    assert ledger is not None and ledger.unattributed_ns == 0
    assert ledger.attributed_ns == sum(
        stats.self_device_time_ns or 0 for node in mixed.nodes() for _, stats in node.phases()
    )
    assert mixed.root.forward.device_time_ns > 0
    assert all(op.device_time_ns is None and op.cpu_time_ns is None for node in mixed.nodes() for op in node.ops)


def test_steps_recorded_without_module_hooks_give_every_node_the_device_time_of_the_hooked_read(
    recorded: tuple[str, dict[str, Any], layerscope.Profile],
) -> None:
    """``Profiler(hooks="first")`` on the H100: each capture's steps replayed with their
    module ranges taken out (as torch's profiler records them without layerscope's
    hooks) and put back by aligning the ops to the first step's call template give every
    node, in every phase (forward, backward, a checkpoint's recompute), the device time
    of the hooked read, to the nanosecond."""
    name, data, prof = recorded
    aligned = replay.replay(data, aligned=True)
    layerscope.check_tree(aligned)
    placed = aligned.meta.modules_from.placement
    assert placed is not None and placed.unaligned == ()
    assert placed.aligned > 0 and placed.ops == placed.aligned + placed.by_neighbours + placed.unplaced
    if name == "gpt2_ckpt_train":
        assert placed.recomputed > 0
    assert [n.path for n in aligned.nodes()] == [n.path for n in prof.nodes()]
    for node in prof.nodes():
        mine = aligned.node(node.path)
        for phase in ("forward", "backward", "recompute"):
            want, got = getattr(node, phase), getattr(mine, phase)
            assert (want is None) == (got is None), (node.path, phase)
            if want is not None:
                assert got.device_time_ns == want.device_time_ns, (node.path, phase)
