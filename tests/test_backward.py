"""Backward per module: FLOPs against torch's counter and hand arithmetic, the step's
parts, labels, activation checkpointing, and ``profile(backward=True)``.

The per-module reference for backward is ``FlopCounterMode`` run on each module *alone*:
the module is called again on a copy of the inputs it got in the real run (each input
requiring grad exactly when it did), and backward is run from the outputs that received
a gradient in the real run. What the counter counts in that backward is the work of
that module's gradients, which is what layerscope attributes to the module.

FlopCounterMode's own per-module split of a backward is not the reference: it marks a
module as running from the moment its outputs' gradients are ready until its inputs'
gradients are, so when an input feeds several modules (query/key/value projections, a
residual branch) or a module returns its input (dropout in eval), the spans overlap and
a module is charged with its siblings' backward work. ``test_flop_counter_tracker_spills``
shows one such case with hand arithmetic. Model-wide, both count the same ops, so the
whole run's total is compared with the counter's directly.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

import layerscope
from conftest import tiered
from layerscope import check_tree
from layerscope.capture.training import loss_of
from layerscope.model.tree import Profile
from test_flops_agreement import BUILDERS, CUSTOM_MAPPING

# The heaviest zoo models take seconds per module alone; they are covered forward-only
# elsewhere and by the same code path here through the smaller ones.
BACKWARD_MODELS = [name for name in sorted(BUILDERS) if name not in ("resnet50", "vit_b_16")]
#: Those whose backward takes 5 s or more here: in the slow tier only.
BACKWARD_SLOW = ("alexnet", "resnet18", "t5")


def _call(model: nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _build(name: str) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model, inputs = BUILDERS[name]()
    if hasattr(model, "config"):
        model.config.use_cache = False  # no key/value cache objects threaded through calls
    model.eval()
    return model, inputs


class _Kept:
    """A tensor input of one call: a copy, and whether it required grad."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor.detach().clone()
        self.requires_grad = tensor.requires_grad

    def rebuild(self) -> torch.Tensor:
        if self.requires_grad:
            # A non-leaf, as in the real run (in-place ops on a leaf would be refused).
            return self.tensor.clone().requires_grad_(True).clone()
        return self.tensor


def _record_calls(model: nn.Module, inputs: Any) -> dict[int, list[tuple[Any, list[bool]]]]:
    """Each module call's inputs, and which outputs got a gradient, in one real step."""
    calls: dict[int, list[tuple[Any, list[bool]]]] = {}

    def pre(module: nn.Module, args: Any, kwargs: Any) -> None:
        kept = tree_map(lambda x: _Kept(x) if isinstance(x, torch.Tensor) else x, (args, kwargs))
        calls.setdefault(id(module), []).append((kept, []))

    def post(module: nn.Module, args: Any, output: Any) -> None:
        flags = calls[id(module)][-1][1]
        for n, leaf in enumerate(tree_leaves(output)):
            flags.append(False)
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                leaf.register_hook(lambda grad, n=n, flags=flags: flags.__setitem__(n, True))

    handles = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in model.modules()]
    handles += [m.register_forward_hook(post) for m in model.modules()]
    try:
        loss_of(_call(model, inputs), None).backward()
    finally:
        for handle in handles:
            handle.remove()
        for p in model.parameters():
            p.grad = None
    return calls


def _alone_backward_flops(module: nn.Module, calls: list[tuple[Any, list[bool]]]) -> int:
    total = 0
    for kept, got_grad in calls:

        def rebuild(x: Any) -> Any:
            if isinstance(x, _Kept):
                return x.rebuild()
            # A cache object carries tensors of the real run's graph; the module runs
            # without one (the models are built with use_cache=False).
            return None if type(x).__name__.endswith("Cache") else x

        args, kwargs = tree_map(rebuild, kept, is_leaf=lambda x: isinstance(x, _Kept))
        counter = FlopCounterMode(display=False, custom_mapping=CUSTOM_MAPPING)
        with counter:
            out = module(*args, **kwargs)
            forward = counter.get_total_flops()
            outs = [t for t, got in zip(tree_leaves(out), got_grad) if got]
            if outs:
                torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
        total += counter.get_total_flops() - forward
    for p in module.parameters():
        p.grad = None
    return total


@pytest.fixture(scope="module")
def stepped() -> Any:
    cache: dict[str, tuple[nn.Module, Any, Profile]] = {}

    def get(name: str) -> tuple[nn.Module, Any, Profile]:
        if name not in cache:
            model, inputs = _build(name)
            prof = layerscope.profile(model, inputs, backward=True, warmup=0, repeat=1)
            cache[name] = (model, inputs, prof)
        return cache[name]

    yield get
    cache.clear()


@pytest.mark.parametrize("name", tiered(BACKWARD_MODELS, slow=BACKWARD_SLOW))
def test_backward_macs_agree_with_flop_counter_per_module(stepped: Any, name: str) -> None:
    model, inputs, prof = stepped(name)
    check_tree(prof)
    assert prof.unsupported_ops() == {}
    calls = _record_calls(model, inputs)
    modules = dict(model.named_modules())
    mismatches = []
    compared = 0
    for node in prof.modules():
        if node.kind != "module" or node.calls == 0:
            continue
        module = modules[node.path]
        theirs = _alone_backward_flops(module, calls[id(module)])
        compared += 1
        if 2 * node.backward.macs != theirs:
            mismatches.append((node.path, 2 * node.backward.macs, theirs))
    assert compared > 3
    assert mismatches == [], f"(path, 2 * layerscope backward macs, FlopCounterMode): {mismatches[:5]}"
    assert prof.root.backward.macs > prof.root.forward.macs


@pytest.mark.parametrize("name", tiered(["bert", "gpt2", "llama", "t5", "resnet18", "gpt"], slow=BACKWARD_SLOW))
def test_whole_step_total_agrees_with_flop_counter(stepped: Any, name: str) -> None:
    model, inputs, prof = stepped(name)
    counter = FlopCounterMode(display=False, custom_mapping=CUSTOM_MAPPING)
    with counter:
        loss_of(_call(model, inputs), None).backward()
    for p in model.parameters():
        p.grad = None
    macs = sum(
        stats.macs or 0 for node in (prof.root, *prof.parts) for _, stats in node.phases()
    )
    assert 2 * macs == counter.get_total_flops()


def test_flop_counter_tracker_spills(stepped: Any) -> None:
    """BERT's key projection, batch 2 x 16 tokens, hidden 64 (32 rows of 64):
    forward   32 x 64 x 64                              = 131,072 MACs
    backward  grad input 32 x 64 x 64 + grad weight 64 x 32 x 64 = 262,144 MACs
    FlopCounterMode's tracker charges it with the value projection's backward too,
    since both read the same input and its gradient is ready only after both."""
    model, inputs, prof = stepped("bert")
    key = prof["encoder.layer.0.attention.self.key"]
    assert key.forward.macs == 32 * 64 * 64 == 131_072
    assert key.backward.macs == 2 * 32 * 64 * 64 == 262_144
    counter = FlopCounterMode(display=False, custom_mapping=CUSTOM_MAPPING)
    with counter:
        loss_of(_call(model, inputs), None).backward()
    for p in model.parameters():
        p.grad = None
    in_context = sum(counter.get_flop_counts()["BertModel.encoder.layer.0.attention.self.key"].values())
    assert in_context > 2 * (key.forward.macs + key.backward.macs)


# -- hand arithmetic -----------------------------------------------------------------------


def _chain(*dims: int, bias: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(a, b, bias=bias) for a, b in itertools.pairwise(dims)])


def test_matmul_only_net_backward_is_twice_forward() -> None:
    # Linear 8->16->32->4 without bias, batch 5, input requiring grad: each layer's
    # forward is one matmul (5*in*out MACs); backward computes grad input and grad
    # weight, two matmuls of the same size. So fwd + bwd = 3 x fwd, layer by layer.
    model = _chain(8, 16, 32, 4)
    x = torch.randn(5, 8, requires_grad=True)
    prof = check_tree(layerscope.profile(model, x, backward=True, warmup=0, repeat=1))
    for path, (a, b) in {"0": (8, 16), "1": (16, 32), "2": (32, 4)}.items():
        node = prof[path]
        assert node.forward.macs == 5 * a * b
        assert node.backward.macs == 2 * 5 * a * b
        assert node.forward.macs + node.backward.macs == 3 * node.forward.macs
    root = prof.root
    assert root.forward.macs == 5 * (8 * 16 + 16 * 32 + 32 * 4) == 3_840
    assert root.backward.macs + root.forward.macs == 3 * root.forward.macs


def test_first_layer_without_input_grad_skips_the_grad_input_matmul() -> None:
    # Same net, input not requiring grad: layer 0 computes only its weight's gradient,
    # 5*8*16 = 640 MACs; layers 1 and 2 still compute both (2 x their forward).
    model = _chain(8, 16, 32, 4)
    prof = check_tree(layerscope.profile(model, torch.randn(5, 8), backward=True, warmup=0, repeat=1))
    assert prof["0"].backward.macs == 640
    assert prof["1"].backward.macs == 2 * 5 * 16 * 32
    assert prof["2"].backward.macs == 2 * 5 * 32 * 4


def test_bias_gradient_is_an_elementwise_sum() -> None:
    # Linear 8->16 with bias, batch 5: grad bias sums 5 rows of 16 -> 80 FLOPs, no MACs;
    # grad weight 5*8*16 = 640 MACs -> 1,280 FLOPs (input needs no grad).
    model = _chain(8, 16, bias=True)
    prof = check_tree(layerscope.profile(model, torch.randn(5, 8), backward=True, warmup=0, repeat=1))
    assert prof["0"].backward.macs == 640
    assert prof["0"].backward.flops == 2 * 640 + 80


def test_shared_module_run_twice_counts_backward_twice() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(6, 6, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(self.inner(x))

    torch.manual_seed(0)
    prof = check_tree(layerscope.profile(Twice(), torch.randn(3, 6), backward=True, warmup=0, repeat=1))
    inner = prof["inner"]
    # Forward 2 x 3*6*6 = 216. Backward: the outer call needs grad input and weight
    # (2 x 108), the inner call only its weight (108): 324.
    assert inner.calls == 2
    assert inner.forward.macs == 216
    assert inner.backward.macs == 324
    assert prof.root.params_total == 36


# -- the step's parts and invariants ------------------------------------------------------------


def test_profile_backward_parts_add_up_to_the_step() -> None:
    model = _chain(8, 16, 4, bias=True)
    prof = check_tree(layerscope.profile(model, torch.randn(5, 8), backward=True, warmup=1, repeat=3))
    assert prof.has_backward
    # <layerscope>: layerscope's own work in the step (the memory notes), in no node of the user's.
    assert [p.path for p in prof.parts] == ["<loss>", "<layerscope>", "<other>"]
    total = sum(stats.self_cpu_time_ns for node in prof.nodes() for _, stats in node.phases())
    assert prof.step_time_ns == total > 0
    assert len(prof.figures.step_times_ns) == 3
    # The loss is the sum of the output (5 x 4 = 20 elements): 19 additions... counted
    # as one FLOP per input element by the reduction formula; its backward expands.
    loss = prof["<loss>"]
    assert loss.forward.flops == 20
    assert [op.name for op in loss.ops if op.phase == "backward"] == ["aten::expand"]


def test_loss_fn_and_grads_are_left_as_they_were() -> None:
    model = _chain(4, 3, bias=True)
    model[0].weight.grad = torch.full_like(model[0].weight, 7.0)
    before = model[0].weight.grad
    target = torch.randn(2, 3)
    prof = layerscope.profile(
        model,
        torch.randn(2, 4),
        backward=True,
        loss_fn=lambda out: nn.functional.mse_loss(out, target),
        warmup=1,
        repeat=2,
    )
    check_tree(prof)
    assert model[0].weight.grad is before and bool((before == 7.0).all())
    assert model[0].bias.grad is None
    assert "aten::mse_loss" in {op.name for op in prof["<loss>"].ops}


def test_backward_needs_a_loss() -> None:
    model = nn.Embedding(10, 4)
    with pytest.raises(layerscope.LayerscopeError, match="loss_fn="):
        layerscope.profile(model.requires_grad_(False), torch.tensor([1, 2]), backward=True, warmup=0, repeat=1)
    with pytest.raises(layerscope.LayerscopeError, match="one-element tensor"):
        layerscope.profile(nn.Linear(2, 2), torch.randn(3, 2), backward=True, loss_fn=lambda o: o, repeat=1)
    with pytest.raises(ValueError, match="needs gradients"):
        layerscope.profile(nn.Linear(2, 2), torch.randn(3, 2), backward=True, no_grad=True)


def test_training_step_parts_in_a_profiler_block() -> None:
    model = _chain(8, 16, 4, bias=True)
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    with layerscope.Profiler(model) as prof:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    check_tree(prof.profile)
    kinds = {p.path: p.kind for p in prof.parts}
    assert kinds == {
        "<loss>": "loss", "<optimizer:Adam>": "optimizer", "<zero_grad>": "zero_grad", "<layerscope>": "overhead",
        "<other>": "other",
    }
    # The notes taken in the optimizer's step hooks are layerscope's work inside it.
    assert [n.kind for n in prof.profile["<optimizer:Adam>"].children] == ["overhead"]
    # Adam, per parameter element: exp_avg lerp (2), exp_avg_sq mul (1) and addcmul (2),
    # sqrt (1), divide by the bias correction (1), add eps (1), addcdiv (2) = 10 FLOPs,
    # plus 1 per parameter tensor for its step counter. Parameters: 8*16 + 16 + 16*4 + 4
    # = 212 elements in 4 tensors.
    assert prof["<optimizer:Adam>"].forward.flops == 10 * 212 + 4
    # mse_loss on 5 x 4 = 20 elements: 3 FLOPs each, forward and backward alike.
    assert prof["<loss>"].forward.flops == 60 and prof["<loss>"].backward.flops == 60
    assert prof.unsupported_ops() == {}
    assert prof.step_time_ns == sum(prof.figures.step_times_ns)


# -- labels ----------------------------------------------------------------------------------


class _Labelled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with layerscope.label("scale"):
            x = x * 3
            with torch.profiler.record_function("inner"):
                x = x + 1
        return self.fc(x)


def test_labels_are_nodes_where_they_ran() -> None:
    torch.manual_seed(0)
    model = _Labelled()

    @layerscope.label("data")
    def load() -> torch.Tensor:
        return torch.randn(2, 4).requires_grad_(True)

    with layerscope.Profiler(model) as prof:
        x = load()
        model(x).sum().backward()
    check_tree(prof.profile)
    scale = prof["[scale]"]
    assert (scale.kind, scale.parent, scale.name, scale.calls) == ("label", "", "scale", 1)
    inner = prof["[scale][inner]"]
    assert inner.parent == "[scale]" and inner.depth == 2
    # x * 3 on 8 elements in the label; x + 1 in the nested one; their backward (the
    # multiply's gradient: 8 FLOPs; the add's is a pass-through) follows them.
    assert scale.forward.self_flops == 8 and inner.forward.self_flops == 8
    assert scale.backward.self_flops == 8
    assert prof["<data>"].kind == "label" and prof["<data>"].calls == 1
    assert prof[""].forward.self_flops == 0  # the label's work is not the root's
    assert prof["fc"].forward.macs == 2 * 4 * 4


class _Paired(nn.Module):
    """A ``record_function`` range in forward around two submodule calls (as DDP's
    ``DistributedDataParallel.forward`` is around its module's)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4, bias=False)
        self.c = nn.Linear(4, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.profiler.record_function("pair"):
            x = self.b(self.a(x)) * 2
        return self.c(x)


def test_a_live_label_around_module_calls_is_their_parent() -> None:
    torch.manual_seed(0)
    model = _Paired()
    x = torch.randn(2, 4)
    with layerscope.Profiler(model) as prof:
        model(x).sum().backward()
    profile = check_tree(prof.profile)
    pair = profile["[pair]"]
    assert [child.path for child in profile.root.children] == ["[pair]", "c"]
    assert [child.path for child in pair.children] == ["a", "b"]
    assert (profile["a"].parent, profile["a"].depth, profile["c"].parent) == ("[pair]", 2, "")
    # Its total is the range's whole time, as its span in the trace says; its own time
    # leaves out the modules'.
    assert profile.trace is not None
    spans = [s for s in profile.trace.spans if (s.path, s.phase, s.op_index) == ("[pair]", "forward", -1)]
    assert pair.forward.cpu_time_ns == sum(span.duration_ns for span in spans) > 0
    assert pair.forward.self_cpu_time_ns == pair.forward.cpu_time_ns - profile["a"].forward.cpu_time_ns - profile["b"].forward.cpu_time_ns
    # FLOPs: a and b's 2 * 2 * 4 * 4 each, and the label's own multiply, 8.
    assert (pair.forward.self_flops, pair.forward.flops) == (8, 8 + 2 * 64)
    # Backward work belongs to the modules, and the label's backward total holds theirs.
    assert pair.backward.cpu_time_ns == profile["a"].backward.cpu_time_ns + profile["b"].backward.cpu_time_ns + pair.backward.self_cpu_time_ns


def test_label_rejects_bad_names() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        layerscope.label("")
    with pytest.raises(ValueError, match="cannot contain"):
        layerscope.label("a[b]")


# -- activation checkpointing ------------------------------------------------------------------


class _Checkpointed(nn.Module):
    def __init__(self, mode: str | None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(8, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
        self.b = nn.Linear(16, 2)
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        if self.mode is None:
            x = self.block(x)
        else:
            x = checkpoint(self.block, x, use_reentrant=self.mode == "reentrant")
        return self.b(x)


@pytest.mark.parametrize("mode", ["non-reentrant", "reentrant"])
def test_checkpoint_recompute_is_marked_not_double_counted(mode: str) -> None:
    x = torch.randn(4, 8)
    plain = check_tree(layerscope.profile(_Checkpointed(None), x, backward=True, warmup=0, repeat=1))
    ckpt = check_tree(layerscope.profile(_Checkpointed(mode), x, backward=True, warmup=0, repeat=1))
    assert plain.root.recompute is None
    for path in ("", "a", "block", "block.0", "block.1", "block.2", "b"):
        assert ckpt[path].calls == plain[path].calls == 1, path
        assert ckpt[path].forward.flops == plain[path].forward.flops, path
        assert ckpt[path].backward.flops == plain[path].backward.flops, path
    # The checkpointed block runs its forward again during backward, as recompute:
    #   block.0  Linear 16->16, batch 4: 4*16*16 = 1,024 MACs -> 2,048 + 64 bias = 2,112
    #   block.1  GELU on 64 elements                                            =    64
    #   block.2  Linear 16->16 again                                            = 2,112
    # The non-reentrant form stops recomputing once every saved tensor is back: block.2
    # saved only its input (block.1's output), so it is not run again.
    recomputed = {"block.0": 2_112, "block.1": 64, "block.2": 2_112 if mode == "reentrant" else 0}
    for path, flops in recomputed.items():
        assert ckpt[path].recompute.flops == flops, path
    assert ckpt["block"].recompute.flops == sum(recomputed.values())
    assert ckpt["a"].recompute.flops == 0 and ckpt["b"].recompute.flops == 0
    assert ckpt.root.recompute.flops == ckpt["block"].recompute.flops
    assert ckpt["block"].recompute.cpu_time_ns > 0


def test_step_profile_round_trips_through_json(tmp_path: Any) -> None:
    torch.manual_seed(0)
    model = _Labelled()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.Profiler(model) as prof:
        with layerscope.label("data"):
            x = torch.randn(2, 4)
        model(x).sum().backward()
        opt.step()
    path = tmp_path / "step.json"
    prof.save(str(path))
    loaded = layerscope.load(str(path))
    assert loaded.to_dict() == prof.to_dict()
    assert [p.path for p in loaded.parts] == [p.path for p in prof.parts]
    assert loaded["[scale][inner]"].kind == "label"
    assert loaded.render("text") == prof.render("text")


@pytest.mark.parametrize("impl", [{"foreach": False}, {"foreach": True}, {"fused": True}])
@pytest.mark.parametrize(("optimizer", "per_element"), [("Adam", 10), ("AdamW", 11), ("SGD", 1)])
def test_optimizer_flops_by_hand_for_every_implementation(impl: dict[str, bool], optimizer: str, per_element: int) -> None:
    # Linear 4->3 without bias: one parameter tensor of 12 elements.
    #   SGD   p -= lr * g: 1 per element (the add_ with alpha, as unfused code counts it)
    #   Adam  lerp 2, scale 1 + addcmul 2, sqrt 1, bias correction 1, eps 1, addcdiv 2 = 10
    #   AdamW Adam's 10 + decoupled weight decay 1 = 11
    # Adam(W) also add 1 to each parameter's step counter.
    model = _chain(4, 3)
    opt = getattr(torch.optim, optimizer)(model.parameters(), lr=0.1, **impl)
    with layerscope.Profiler(model) as prof:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    part = prof[f"<optimizer:{optimizer}>"]
    step_counter = 0 if optimizer == "SGD" else 1
    assert part.forward.flops == per_element * 12 + step_counter
    assert prof.unsupported_ops() == {}
