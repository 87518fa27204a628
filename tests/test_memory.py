"""Memory per module and for the step: hand arithmetic on real models, agreement with
torch.profiler's own allocation events, categories at the peak, optimizer state, and
the walk over hand-written event streams.

Memory is logical storage bytes: a float32 tensor of shape (4, 16) is 4 * 16 * 4 = 256
bytes, whatever the allocator rounds it to. Activations are credited to the module whose
forward *allocated* the storage that autograd saved (see docs/memory.md).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile
from torch.utils.checkpoint import checkpoint

import layerscope
from layerscope import check_tree
from layerscope.attribute import build_profile
from layerscope.attribute.memory import TIMELINE_POINTS
from layerscope.model.raw import (
    Adopt,
    Enter,
    Event,
    Exit,
    Free,
    Grad,
    ModuleInfo,
    Op,
    Optim,
    RawCapture,
    Saved,
    Step,
)
from layerscope.model.sidedocs import MemorySummary, OptimizerState, PeakAt
from layerscope.model.tree import Profile

F32 = 4


def _chain() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4), nn.ReLU()
    )


B = 4
X = torch.randn(B, 8)


def _forward_with_grad(model: nn.Module, inputs: Any) -> Profile:
    # One forward in grad mode, as training does, without backward.
    return check_tree(layerscope.profile(model, inputs, no_grad=False, warmup=0, repeat=1))


# -- activations, by hand ------------------------------------------------------------------


def test_linear_relu_chain_activations_by_hand() -> None:
    prof = _forward_with_grad(_chain(), X)
    # What autograd saves, per op:
    #   Linear(i, o): its input (for the weight's gradient) and its weight (a parameter);
    #   ReLU: its result (threshold_backward(grad, result)).
    # Each Linear's output feeds a ReLU, which saves its *result*, so a Linear's output
    # is freed once the ReLU ran: Linears keep nothing they allocated (their weights
    # predate the pass, and their inputs are the previous ReLU's result, counted there).
    # Each ReLU's result is saved (by itself, and by the next Linear as its input): it
    # is counted once, for the ReLU that allocated it.
    expected = {
        "0": 0,
        "1": B * 16 * F32,  # 256
        "2": 0,
        "3": B * 32 * F32,  # 512
        "4": 0,
        "5": B * 4 * F32,  # 64
    }
    for path, nbytes in expected.items():
        assert prof[path].forward.activation_bytes == nbytes, path
        assert prof[path].forward.self_activation_bytes == nbytes, path
    assert prof.root.forward.activation_bytes == 256 + 512 + 64
    assert prof.root.forward.self_activation_bytes == 0


def test_linear_relu_chain_allocations_and_peaks_by_hand() -> None:
    prof = _forward_with_grad(_chain(), X)
    # Every layer allocates its output: (4,16), (4,16), (4,32), (4,32), (4,4), (4,4).
    allocs = [256, 256, 512, 512, 64, 64]
    for n, nbytes in enumerate(allocs):
        stats = prof[str(n)].forward
        assert (stats.alloc_bytes, stats.self_alloc_bytes, stats.peak_bytes) == (nbytes, nbytes, nbytes)
    root = prof.root.forward
    assert root.alloc_bytes == sum(allocs) == 1664
    assert root.self_alloc_bytes == 0
    # Sequential drops each Linear's output when the next layer returns: the frees happen
    # in the root's own frame. Live bytes over the forward, from 0:
    #   +256 = 256, +256 = 512, -256 = 256, +512 = 768, +512 = 1280, -512 = 768,
    #   +64 = 832, +64 = 896, -64 = 832 -> peak 1280 above the start.
    assert root.self_freed_bytes == root.freed_bytes == 256 + 512 + 64
    assert root.peak_bytes == 1280
    # Per op: addmm allocates the output; t is a view of the weight and allocates nothing.
    [t, addmm] = prof["0"].ops
    assert (t.name, t.alloc_bytes) == ("aten::t", 0)
    assert (addmm.name, addmm.alloc_bytes, addmm.self_alloc_bytes) == ("aten::addmm", 256, 256)


def test_no_grad_keeps_no_activations() -> None:
    prof = check_tree(layerscope.profile(_chain(), X, warmup=0, repeat=1))  # no_grad by default
    assert prof.meta.no_grad is True
    assert all(node.forward.activation_bytes == 0 for node in prof.modules())
    # The same allocations are made; only nothing is kept for backward.
    assert prof.root.forward.alloc_bytes == 1664
    with torch.inference_mode():
        inference = check_tree(layerscope.profile(_chain(), X, no_grad=False, warmup=0, repeat=1))
    assert inference.root.forward.activation_bytes == 0


def _torch_profiler_growth(call: Any) -> tuple[int, Any]:
    """Net bytes allocated during ``call()`` by torch.profiler's allocation events: every
    event's self memory (allocations minus frees inside each op, and those outside ops)."""
    with torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = call()
    return sum(event.self_cpu_memory_usage for event in prof.events()), out


def test_root_activations_equal_live_growth_of_the_forward() -> None:
    # After a forward in grad mode, what is still live is what autograd keeps, plus the
    # output. The chain ends in a ReLU, whose result (the output) is saved: the growth
    # is exactly the activations.
    model = _chain()
    growth, out = _torch_profiler_growth(lambda: model(X))
    assert growth == _forward_with_grad(model, X).root.forward.activation_bytes == 832
    del out


def test_transformers_bert_activations_equal_live_growth() -> None:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=500)
    model = BertModel(config)
    ids = torch.randint(0, 500, (2, 16))
    growth, out = _torch_profiler_growth(lambda: model(input_ids=ids))
    prof = _forward_with_grad(model, {"input_ids": ids})
    # BERT's outputs are both saved (the pooler reads the first token of the last hidden
    # state; its tanh saves the pooled output), so the growth is the activations.
    assert prof.root.forward.activation_bytes == growth > 0
    # The attention blocks hold most of it; per layer the figures are identical.
    layer0 = prof["encoder.layer.0"].forward.activation_bytes
    assert layer0 == prof["encoder.layer.1"].forward.activation_bytes > 0
    del out


# -- the training step ---------------------------------------------------------------------


def _adam_steps(
    model: nn.Module, inputs: torch.Tensor, steps: int, optimizer: Any = torch.optim.Adam, **options: Any
) -> Profile:
    opt = optimizer(model.parameters(), lr=1e-3)
    with layerscope.Profiler(model, **options) as prof:
        for _ in range(steps):
            opt.zero_grad()
            model(inputs).sum().backward()
            opt.step()
            prof.step()
    return check_tree(prof.profile)


def test_adam_state_is_two_moments_of_the_parameters() -> None:
    model = _chain()
    params = list(model.parameters())
    param_bytes = sum(p.numel() * F32 for p in params)  # 8*16+16 + 16*32+32 + 32*4+4 = 820 floats
    assert param_bytes == 820 * F32
    prof = _adam_steps(model, X, 1)
    state = prof.memory.optimizer_state_bytes["Adam"]
    assert state.bytes_by_key["exp_avg"] == state.bytes_by_key["exp_avg_sq"] == param_bytes
    # Adam also keeps one float32 step counter per parameter tensor.
    assert state.bytes_by_key["step"] == len(params) * F32
    assert state.total_bytes == 2 * param_bytes + len(params) * F32
    assert prof.memory.param_bytes_by_dtype == {"float32": param_bytes}


def test_step_peak_and_its_categories() -> None:
    model = _chain()
    prof = _adam_steps(model, X, 1)
    memory = prof.memory
    param_bytes = 820 * F32
    state = memory.optimizer_state_bytes["Adam"].total_bytes
    # The first step's peak is in Adam's step: parameters, their gradients and the new
    # state are all live, plus the step's temporaries.
    assert memory.peak_at.path == "<optimizer:Adam>"
    assert memory.peak_at.phase is None  # a step part has no forward or backward
    categories = memory.peak_categories
    assert categories["parameters"] == param_bytes
    assert categories["gradients"] == param_bytes
    assert categories["optimizer_state"] == state
    assert categories["activations"] == 0  # backward released them
    assert sum(categories.values()) == memory.peak_bytes
    # The step's peak is at least the forward's.
    assert memory.peak_bytes >= memory.peak_by_phase["forward"]
    assert memory.peak_bytes >= memory.baseline_bytes + prof.root.forward.peak_bytes
    # Gradients written per module are its parameters' bytes.
    assert prof["0"].backward.grad_bytes == (8 * 16 + 16) * F32
    assert prof.root.backward.grad_bytes == param_bytes
    assert prof["1"].backward.grad_bytes == 0


def test_later_steps_count_existing_state_from_the_start() -> None:
    # Profiled from the second step on, Adam's state predates the step: it is live for
    # the whole step, so it is in the baseline and in every category split.
    model = _chain()
    opt = torch.optim.Adam(model.parameters())
    model(X).sum().backward()
    opt.step()
    opt.zero_grad()
    with layerscope.Profiler(model) as prof:
        model(X).sum().backward()
        opt.step()
        opt.zero_grad()
    memory = check_tree(prof.profile).memory
    state = memory.optimizer_state_bytes["Adam"].total_bytes
    assert memory.baseline_bytes == 820 * F32 + state
    assert memory.peak_categories["optimizer_state"] == state


def test_every_step_is_its_own_sizes_come_from_the_peak_step_and_flows_add_up() -> None:
    one = _adam_steps(_chain(), X, 1)
    three = _adam_steps(_chain(), X, 3)
    # Every step records its own memory: flows (allocations) add up over the steps, and
    # sizes (peaks, activations) are the peak step's.
    assert one.figures.steps == 1 and three.figures.steps == 3
    assert three.meta.detail_step is None and three.meta.times_from is None
    assert three.memory.peak_bytes >= one.memory.peak_bytes
    for node in three.modules():
        single = one[node.path]
        assert node.forward.activation_bytes == single.forward.activation_bytes
        assert node.forward.alloc_bytes == 3 * single.forward.alloc_bytes
        assert node.forward.flops == 3 * single.forward.flops


def _adamw_loop(steps: int, schedule: Any = None) -> Profile:
    return _adam_steps(_chain(), X, steps, torch.optim.AdamW, schedule=schedule)


def test_step_zero_one_off_work_appears_once_in_step_zero() -> None:
    # AdamW creates its state (a zeros_like per moment and parameter) in step 0 only.
    cold = _adamw_loop(4)
    warm = _adamw_loop(4, layerscope.schedule(wait=0, warmup=1, active=3, repeat=1))
    assert cold.figures.step_numbers == [0, 1, 2, 3] and warm.figures.step_numbers == [1, 2, 3]
    params = len(list(_chain().parameters()))  # 6: three weights, three biases
    state_bytes = 2 * 820 * F32  # exp_avg and exp_avg_sq, once each
    cold_opt, warm_opt = cold["<optimizer:AdamW>"], warm["<optimizer:AdamW>"]
    zeros = {op.name: op for op in cold_opt.ops if op.name == "aten::zeros_like"}
    # Counted once (2 moments x 6 parameters), not once per step.
    assert sum(op.calls for op in cold_opt.ops if op.name == "aten::zeros_like") == 2 * params
    assert zeros and not [op for op in warm_opt.ops if op.name == "aten::zeros_like"]
    # Step 0's optimizer allocated the state, besides what every step allocates.
    per_step = warm_opt.forward.alloc_bytes // 3
    assert cold_opt.forward.alloc_bytes - 4 * per_step >= state_bytes
    # The other steps' figures are the warmed-up loop's: modules' flops and allocations
    # per step are equal, and the optimizer's FLOPs per step too.
    for node in warm.modules():
        assert cold[node.path].forward.flops * 3 == node.forward.flops * 4, node.path
        assert cold[node.path].forward.alloc_bytes * 3 == node.forward.alloc_bytes * 4, node.path
    assert cold_opt.forward.flops * 3 == warm_opt.forward.flops * 4
    # And step 0 stands out in the steps' spread: it is named when it is far off.
    spread = cold.step_spread()
    assert spread is not None and [n for n, _ in spread.steps] == [0, 1, 2, 3]


def test_training_step_activations_are_freed_in_backward() -> None:
    prof = check_tree(layerscope.profile(_chain(), X, backward=True, warmup=0, repeat=1))
    # The forward's saved tensors are freed as backward consumes them: every ReLU
    # result is freed in backward (charged to whichever module's backward is running).
    assert prof.root.forward.activation_bytes == 832
    assert prof.root.backward.freed_bytes >= 832
    timeline = prof.memory.timeline
    assert max(timeline.bytes) == prof.memory.peak_bytes
    assert {span.path for span in timeline.spans} >= {"", "<loss>"}
    # The model's spans have phases; a step part (<loss>, <layerscope>) has none in forward.
    assert {span.phase for span in timeline.spans if not span.path.startswith("<")} == {"forward", "backward"}
    # (Two forward spans: the loss itself, and backward's seed gradient made outside it.)
    assert [span.phase for span in timeline.spans if span.path == "<loss>"] == [None, None, "backward"]


def test_checkpointed_block_keeps_nothing_and_recomputes() -> None:
    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 8), nn.ReLU())
            self.head = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(checkpoint(self.block, x, use_reentrant=False))

    torch.manual_seed(0)
    prof = check_tree(layerscope.profile(Checkpointed(), X, backward=True, warmup=0, repeat=1))
    # Under checkpointing the block's inner layers save nothing: their tensors are
    # recomputed in backward, where the block allocates them again. What the block
    # keeps is its output, which the head's Linear saves as its input (credited to the
    # ReLU that allocated it).
    for inner in ("block.0", "block.1", "block.2"):
        assert prof[inner].forward.activation_bytes == 0
    assert prof["block.3"].forward.activation_bytes == B * 8 * F32
    assert prof["block"].forward.activation_bytes == B * 8 * F32
    assert prof["block"].forward.alloc_bytes == (B * 64 + B * 64 + B * 8 + B * 8) * F32
    assert prof["block"].recompute is not None
    assert prof["block"].recompute.alloc_bytes >= (B * 64) * F32
    assert prof.root.forward.activation_bytes == B * 8 * F32 + prof["head"].forward.activation_bytes


def test_meta_device_gives_the_same_figures() -> None:
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=500)
    torch.manual_seed(0)
    cpu = layerscope.count_flops(BertModel(config), {"input_ids": torch.randint(0, 500, (2, 16))}, backward=True)
    with torch.device("meta"):
        meta_model = BertModel(config)
    meta = layerscope.count_flops(meta_model, {"input_ids": torch.zeros(2, 16, dtype=torch.long, device="meta")}, backward=True)
    check_tree(cpu)
    check_tree(meta)
    assert meta.memory.peak_bytes == cpu.memory.peak_bytes
    for node in cpu.modules():
        other = meta[node.path]
        assert other.forward.activation_bytes == node.forward.activation_bytes
        assert other.forward.peak_bytes == node.forward.peak_bytes


def test_memory_off() -> None:
    prof = check_tree(layerscope.profile(_chain(), X, warmup=0, repeat=1, memory=False))
    assert prof.memory is None
    assert prof.root.forward.peak_bytes is None and prof.root.forward.alloc_bytes is None
    assert all(op.alloc_bytes is None for op in prof.root.ops)
    assert "Peak memory" not in prof.render("text")


def test_nothing_outlives_the_pass() -> None:
    # No optimizer hook stays registered, and a storage freed after the profile is not
    # recorded anywhere (the weak references died with the pass).
    from torch.optim import optimizer as optim_module

    model = _chain()
    prof = _adam_steps(model, X, 1)
    assert not optim_module._global_optimizer_pre_hooks
    assert not optim_module._global_optimizer_post_hooks
    before = copy.deepcopy(prof.to_dict())
    kept = model(X)
    del kept
    assert prof.to_dict() == before


def test_memory_round_trips_through_json(tmp_path: Any) -> None:
    prof = _adam_steps(_chain(), X, 2)
    path = tmp_path / "mem.json"
    prof.save(str(path))
    loaded = layerscope.load(str(path))
    assert loaded.to_dict() == prof.to_dict()
    assert loaded.memory.peak_bytes == prof.memory.peak_bytes


def test_text_shows_memory() -> None:
    text = _adam_steps(_chain(), X, 1).render("text")
    assert "Activations" in text and "Peak mem" in text
    assert "Peak memory: " in text and "in <optimizer:Adam> = parameters" in text
    assert "Adam state 6.43 KiB" in text  # 2 * 3280 + 6 * 4 = 6584 bytes


# -- the walk, on hand-written event streams -----------------------------------------------

MODULES = [
    ModuleInfo(path="", type="Root", parent=None, depth=0, params=0),
    ModuleInfo(path="a", type="A", parent="", depth=1, params=0),
    ModuleInfo(path="b", type="B", parent="", depth=1, params=0),
]
ROOT, A, BB = range(3)


def _op(t0: int, t1: int, allocs: Any = None, grad: Any = None) -> Op:
    return Op(t0_ns=t0, t1_ns=t1, name="aten::x", input_shapes=[], flops=0, macs=0, grad=grad, allocs=allocs)


def _build(events: list[Event]) -> Profile:
    raw = RawCapture(modules=copy.deepcopy(MODULES), op_pass=events, meta={"timed": False})
    return check_tree(build_profile(raw))


def test_walk_forward_by_hand() -> None:
    events = [
        Step(t_ns=0),
        Adopt(t_ns=0, serial=None, nbytes=1000, category="parameters", since_start=True),
        Enter(t_ns=10, module=ROOT, seq=0),
        Enter(t_ns=20, module=A, seq=0),
        _op(30, 40, ((0, 100),)),  # a allocates 100: live 1100
        Exit(t_ns=50, module=A, seq=1),
        Enter(t_ns=60, module=BB, seq=1),
        _op(70, 80, ((1, 50),)),  # b allocates 50: live 1150
        Free(t_ns=85, serial=0),  # b frees a's 100: live 1050
        Exit(t_ns=90, module=BB, seq=2),
        Exit(t_ns=100, module=ROOT, seq=2),
        Saved(serial=1),
        Step(t_ns=200),
    ]
    prof = _build(events)
    a, b, root = prof["a"].forward, prof["b"].forward, prof.root.forward
    assert (a.alloc_bytes, a.freed_bytes, a.peak_bytes, a.activation_bytes) == (100, 0, 100, 0)
    assert (b.alloc_bytes, b.freed_bytes, b.peak_bytes, b.activation_bytes) == (50, 100, 50, 50)
    assert (root.alloc_bytes, root.self_alloc_bytes, root.freed_bytes, root.peak_bytes) == (150, 0, 100, 150)
    memory = prof.memory
    assert memory.baseline_bytes == 1000
    assert memory.peak_bytes == 1150
    assert memory.peak_at == PeakAt(path="b", phase="forward", t_ns=80)
    assert memory.peak_categories == {
        "parameters": 1000, "gradients": 0, "optimizer_state": 0, "activations": 50, "other": 100,
    }
    assert memory.timeline.t_ns == [0, 40, 80, 85]
    assert memory.timeline.bytes == [1000, 1100, 1150, 1050]
    assert memory.timeline.spans == [(10, 100, "", "forward"), (20, 50, "a", "forward"), (60, 90, "b", "forward")]


def test_walk_backward_chain_by_hand() -> None:
    # Forward: a creates autograd nodes 0..4, b nodes 5..9. Backward runs b's node 7
    # then a's node 2, then the accumulation of a's parameter.
    events = [
        Step(t_ns=0),
        Enter(t_ns=0, module=ROOT, seq=0),
        Enter(t_ns=1, module=A, seq=0),
        Exit(t_ns=2, module=A, seq=5),
        Enter(t_ns=3, module=BB, seq=5),
        Exit(t_ns=4, module=BB, seq=10),
        Exit(t_ns=5, module=ROOT, seq=10),
        _op(10, 20, ((0, 300),), grad=(7, None)),  # b's backward allocates 300
        Free(t_ns=25, serial=0),
        _op(30, 40, ((1, 200),), grad=(2, None)),  # a's backward allocates 200
        _op(50, 60, None, grad=(2**64 - 1, A)),  # a's parameter's gradient...
        Grad(t_ns=60, owner=A, nbytes=200, serial=1),  # ...is that storage
        Step(t_ns=100),
    ]
    prof = _build(events)
    a, b, root = prof["a"].backward, prof["b"].backward, prof.root.backward
    assert (b.alloc_bytes, b.peak_bytes) == (300, 300)
    # The free at 25 happens during b's slot (before a's first op at 30).
    assert b.freed_bytes == 300
    assert (a.alloc_bytes, a.peak_bytes, a.grad_bytes) == (200, 200, 200)
    # The root's backward spans both: live 0 -> 300 -> 0 -> 200.
    assert (root.alloc_bytes, root.peak_bytes, root.grad_bytes) == (500, 300, 200)
    memory = prof.memory
    assert memory.peak_at.path == "b" and memory.peak_at.phase == "backward"
    assert memory.peak_categories["other"] == 300
    # a's backward op and its gradient's accumulation share a row (same name, shapes).
    [op] = [o for o in prof["a"].ops if o.phase == "backward"]
    assert (op.calls, op.alloc_bytes) == (2, 200)
    spans = memory.timeline.spans
    # Backward spans end where the last backward op does (60), not at the step's end.
    assert (10, 30, "b", "backward") in spans and (30, 60, "a", "backward") in spans
    assert (10, 60, "", "backward") in spans


# A step whose forward ran module a, which created autograd nodes 0..4.
A_CREATES_NODES_0_TO_4 = [
    Step(t_ns=0),
    Enter(t_ns=0, module=ROOT, seq=0),
    Enter(t_ns=1, module=A, seq=0),
    Exit(t_ns=2, module=A, seq=5),
    Exit(t_ns=3, module=ROOT, seq=5),
]


def test_walk_categorises_gradients_from_their_allocation() -> None:
    events = [
        *A_CREATES_NODES_0_TO_4,
        _op(10, 20, ((0, 64),), grad=(2, None)),
        _op(20, 30, None, grad=(2**64 - 1, A)),
        Grad(t_ns=30, owner=A, nbytes=64, serial=0),
        Step(t_ns=40),
    ]
    memory = _build(events).memory
    assert memory.peak_categories["gradients"] == 64
    assert memory.peak_categories["other"] == 0


def test_walk_counts_frees_during_an_op_on_the_op() -> None:
    events = [
        Step(t_ns=0),
        Enter(t_ns=0, module=ROOT, seq=0),
        _op(1, 2, ((0, 40),)),
        Free(t_ns=4, serial=0),  # freed while the next op ran (4 is inside 3..5)
        _op(3, 5, ((1, 10),)),
        Exit(t_ns=9, module=ROOT, seq=0),
        Step(t_ns=10),
    ]
    prof = _build(events)
    [row] = prof.root.ops  # both are aten::x with the same shapes: one row
    assert (row.calls, row.alloc_bytes, row.freed_bytes) == (2, 50, 40)
    assert prof.root.forward.peak_bytes == 40


def test_walk_timeline_is_bounded_and_keeps_the_peak() -> None:
    events: list[Event] = [Step(t_ns=0), Enter(t_ns=0, module=ROOT, seq=0)]
    t = 1
    for serial in range(5000):
        size = 1000 if serial == 3333 else 10
        events.append(_op(t, t + 1, ((serial, size),)))
        events.append(Free(t_ns=t + 2, serial=serial))
        t += 3
    events += [Exit(t_ns=t, module=ROOT, seq=0), Step(t_ns=t + 1)]
    memory = _build(events).memory
    timeline = memory.timeline
    assert timeline.points_recorded == 1 + 2 * 5000
    assert len(timeline.bytes) <= TIMELINE_POINTS
    assert memory.peak_bytes == max(timeline.bytes) == 1000
    assert timeline.t_ns == sorted(timeline.t_ns)


def test_walk_adds_up_two_optimizers_of_one_class() -> None:
    # Two Adam instances (one per half of a model, say) are told apart by ident: their
    # states add up. One instance stepping twice counts its latest state only.
    events = [
        Step(t_ns=0),
        Enter(t_ns=0, module=ROOT),
        Exit(t_ns=1, module=ROOT),
        Optim(t_ns=2, name="Adam", state_bytes_by_key={"exp_avg": 8}, ident=1),
        Optim(t_ns=3, name="Adam", state_bytes_by_key={"exp_avg": 16}, ident=2),
        Optim(t_ns=4, name="Adam", state_bytes_by_key={"exp_avg": 24}, ident=2),
        Step(t_ns=5),
    ]
    state = _build(events).memory.optimizer_state_bytes["Adam"]
    assert state == OptimizerState(total_bytes=8 + 24, bytes_by_key={"exp_avg": 8 + 24})


def test_walk_without_memory_events_has_no_memory() -> None:
    prof = _build([Step(t_ns=0), Enter(t_ns=0, module=ROOT, seq=0), _op(0, 1), Exit(t_ns=1, module=ROOT, seq=0), Step(t_ns=2)])
    assert prof.memory is None
    assert prof.root.forward.alloc_bytes is None


def test_autograd_still_catches_in_place_changes_to_saved_tensors() -> None:
    # Activations are read from the graph, not through saved-tensor hooks (which would
    # turn off autograd's version check): modifying a saved tensor still raises.
    class Clobbers(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.sigmoid(x)  # sigmoid saves its result
            y.mul_(2)
            return y

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        layerscope.profile(Clobbers(), x, backward=True, warmup=0, repeat=1)


def test_torch_func_inside_a_model_works_with_memory() -> None:
    class UsesFunc(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            slope = torch.func.grad(lambda a: torch.sigmoid(a).sum())(x.detach())
            return self.lin(x) * slope

    # Saved-tensor hooks would make torch.func refuse to run ("saved tensor hooks are
    # disabled"); reading the graph leaves it alone.
    prof = check_tree(layerscope.profile(UsesFunc(), torch.randn(2, 3), backward=True, warmup=0, repeat=1))
    assert prof["lin"].forward.alloc_bytes == 2 * 3 * F32
    assert prof["lin"].backward.grad_bytes == (3 * 3 + 3) * F32


def test_walk_backward_slots_run_past_memory_notes() -> None:
    # A backward op's slot runs to the next backward op's start; the free recorded
    # between them (autograd releasing saved tensors) must not cut it short.
    events = [
        *A_CREATES_NODES_0_TO_4,
        _op(10, 20, ((0, 8),), grad=(2, None)),
        Free(t_ns=25, serial=0),
        _op(30, 40, None, grad=(3, None)),
        Step(t_ns=50),
    ]
    raw = RawCapture(modules=copy.deepcopy(MODULES), timing_passes=[events], op_pass=events)
    prof = check_tree(build_profile(raw))
    assert prof["a"].backward.self_cpu_time_ns == (30 - 10) + (40 - 30)


def test_the_timeline_splits_live_bytes_by_category_at_every_point() -> None:
    """Each timeline point carries its live bytes by category, adding up to its bytes
    (check_tree checks it on every tree); at the peak they are the peak's categories,
    parameters stay the model's parameter bytes throughout (nothing frees or adds
    one), and the Chrome trace draws them as one stacked counter."""
    import json

    from layerscope import zoo

    entry = zoo.get("mlp")
    profile = layerscope.profile(entry.build(), entry.example_inputs(4), backward=True, repeat=1, warmup=1)
    layerscope.check_tree(profile)
    memory = profile.memory
    assert memory is not None
    timeline = memory.timeline
    split = timeline.categories
    assert list(split) == ["parameters", "gradients", "optimizer_state", "activations", "other"]
    for i, total in enumerate(timeline.bytes):
        assert sum(series[i] for series in split.values()) == total
    at_peak = timeline.bytes.index(memory.peak_bytes)
    assert {name: series[at_peak] for name, series in split.items()} == memory.peak_categories
    assert set(split["parameters"]) == {profile.param_bytes}
    assert max(split["activations"]) > 0 and max(split["gradients"]) > 0
    events = json.loads(profile.render("chrome"))["traceEvents"]
    counters = [e for e in events if e.get("name") == "memory by category"]
    assert len(counters) == len(timeline.t_ns)
    assert counters[at_peak]["args"] == memory.peak_categories


# -- the events against the dispatch mode ------------------------------------------------


def _adam_training(inside_torch_profiler: bool) -> Profile:
    model = _chain()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with contextlib.ExitStack() as stack:
        if inside_torch_profiler:
            # Only one torch profiler runs: layerscope falls back to its dispatch mode.
            stack.enter_context(torch.profiler.profile())
        prof = stack.enter_context(layerscope.Profiler(model))
        for _ in range(2):
            opt.zero_grad()
            model(X).sum().backward()
            opt.step()
            prof.step()
    return check_tree(prof.profile)


def test_memory_from_torchs_events_equals_the_dispatch_modes() -> None:
    events, dispatch = _adam_training(False), _adam_training(True)
    assert events.meta.times_from is None and dispatch.meta.times_from == "dispatch mode"
    fields = ("alloc_bytes", "freed_bytes", "peak_bytes", "activation_bytes", "grad_bytes", "flops", "macs")
    for node in events.modules():
        for phase in ("forward", "backward"):
            mine, theirs = getattr(node, phase), getattr(dispatch[node.path], phase)
            assert [getattr(mine, f) for f in fields] == [getattr(theirs, f) for f in fields], (node.path, phase)
    assert events["<loss>"].forward.alloc_bytes == dispatch["<loss>"].forward.alloc_bytes
    for key in ("baseline_bytes", "optimizer_state_bytes"):
        assert getattr(events.memory, key) == getattr(dispatch.memory, key), key
    # Adam's arithmetic with Python scalars: torch's profiler sees each scalar's 0-d
    # tensor (8 bytes) allocated, a dispatch mode does not. Nothing else differs.
    extra = events["<optimizer:Adam>"].forward.alloc_bytes - dispatch["<optimizer:Adam>"].forward.alloc_bytes
    assert extra >= 0 and extra % 8 == 0 and extra < 1024
    assert 0 <= events.memory.peak_bytes - dispatch.memory.peak_bytes <= 64


def test_a_tensor_the_loss_saves_is_an_activation_from_torchs_events_too() -> None:
    # The shapes of test_cuda's comparison: Linear(128, 256), ReLU, Linear(256, 128) on a
    # batch of 64, and a loss outside the model, pow(2).mean(). pow saves its input, the
    # model's output (64 * 128 * 4 = 32,768 B, allocated by "2"): an activation of "2"
    # although only the loss saved it. ReLU's output (64 * 256 * 4 = 65,536 B) is saved
    # by the ReLU and by "2"'s addmm. Per step: 65,536 + 32,768 = 98,304 B.
    def run(inside_torch_profiler: bool) -> Profile:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128))
        x = torch.randn(64, 128)
        with contextlib.ExitStack() as stack:
            if inside_torch_profiler:
                stack.enter_context(torch.profiler.profile())
            prof = stack.enter_context(layerscope.Profiler(model))
            for _ in range(2):
                model(x).pow(2).mean().backward()
                model.zero_grad(set_to_none=True)
                prof.step()
        return check_tree(prof.profile)

    events, dispatch = run(False), run(True)
    assert events.meta.times_from is None and dispatch.meta.times_from == "dispatch mode"
    for prof in (events, dispatch):
        assert prof["1"].forward.activation_bytes == 65_536
        assert prof["2"].forward.activation_bytes == 32_768
        assert prof.root.forward.activation_bytes == 98_304
        assert prof["<loss>"].forward.activation_bytes == 0
    for node in events.modules():
        for phase in ("forward", "backward"):
            mine, theirs = getattr(node, phase), getattr(dispatch[node.path], phase)
            assert (mine.alloc_bytes, mine.activation_bytes, mine.flops) == (
                theirs.alloc_bytes, theirs.activation_bytes, theirs.flops
            ), (node.path, phase)


def test_a_released_input_is_freed_while_the_profiler_runs() -> None:
    # Recording shapes must not keep an op's inputs alive until the profiler stops: x
    # and y, 1 MiB each and inputs of recorded ops, are freed when deleted, before two
    # more MiB are allocated in the same step.
    mib = 32768 * 8 * F32
    model = _chain()
    with layerscope.Profiler(model) as prof:
        model(X)
        x = torch.randn(32768, 8)
        y = x * 2
        z = y.sum()
        del x, y
        big, again = torch.empty(32768, 8), torch.empty(32768, 8)
        del big, again, z
        prof.step()
    profile = check_tree(prof.profile)
    freed = sum(stats.freed_bytes or 0 for node in profile.nodes() for _, stats in node.phases())
    assert freed >= 4 * mib
    # Had x and y been kept alive, the live bytes would have reached 4 MiB above the start.
    memory = profile.memory
    assert 2 * mib <= memory.peak_bytes - memory.baseline_bytes < 3 * mib


def test_activations_are_read_when_only_some_modules_are_profiled() -> None:
    # With paths= the model's root is not profiled, but its forward's end is still where
    # the activations are read: the chosen modules keep theirs.
    def run(paths: Any) -> Profile:
        model = _chain()
        with layerscope.Profiler(model, paths=paths) as prof:
            for _ in range(2):
                model(X).sum().backward()
                prof.step()
        return check_tree(prof.profile)

    whole, some = run(None), run(["1", "3"])
    for path in ("1", "3"):
        assert some[path].forward.activation_bytes == whole[path].forward.activation_bytes > 0, path


def test_the_peak_names_buffers_where_it_counts_them_with_the_parameters() -> None:
    from layerscope.model.tree import ModuleNode, PhaseStats, Profile

    memory = {
        "param_bytes_by_dtype": {"float32": 4096}, "buffer_bytes_by_dtype": {"float32": 64},
        "optimizer_state_bytes": {}, "baseline_bytes": 4160, "peak_bytes": 5184,
        "peak_at": {"path": "", "phase": "forward", "t_ns": 10}, "peak_categories": {"parameters": 4160, "other": 1024},
    }
    root = ModuleNode("", "Net", calls=1, params=1024, params_total=1024, forward=PhaseStats(cpu_time_ns=10, self_cpu_time_ns=10))
    text = Profile(root=root, param_bytes=4096, memory=MemorySummary.from_dict(memory)).render("text")
    # The footer counts parameters (4.00 KiB) and buffers (64 B) apart; the peak's live
    # bytes hold both, and say so instead of a second, different "parameters" figure.
    assert "Memory: parameters 4.00 KiB float32; buffers 64 B float32" in text
    assert "= parameters and buffers 4.06 KiB + other 1.00 KiB" in text
    without = MemorySummary.from_dict(dict(memory, buffer_bytes_by_dtype={}))
    assert "= parameters 4.06 KiB + other" in Profile(root=root, param_bytes=4096, memory=without).render("text")
