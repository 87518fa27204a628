"""Capture on real models: the tree is sound, and its figures are the ones expected.

Every profile made here goes through ``check_tree``. Fixture models carry their expected
numbers in comments; the fake clock (each read +1000 ns) makes times exact, because a
module's time is then only a count of clock reads:

- a pass reads the clock once when a profiled module is entered and once when it exits;
- with ``record_ops`` (the default) it also reads it twice per aten op, so a module's
  time holds its ops' ticks, as a real run's holds its ops' time.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import layerscope
from conftest import tiered
from layerscope import zoo
from layerscope.attribute import build_profile
from layerscope.base.errors import ModelError
from layerscope.capture.assembly import Assembly, CapturePlan
from layerscope.model.check import InvariantError, check_tree
from layerscope.model.documents import profile_from_dict
from layerscope.model.raw import Event, ModuleShapes
from layerscope.model.tree import Profile

STEP = 1000  # ns per fake-clock read (conftest.FakeClock)


def unique_params(model: nn.Module) -> list[nn.Parameter]:
    # Module.parameters() already yields a shared Parameter once.
    return list(model.parameters())


def op_calls(profile: Profile) -> int:
    return sum(op.calls for node in profile.nodes() for op in node.ops)


def op_names(profile: Profile, path: str) -> set[str]:
    return {op.name for op in profile[path].ops}


class CountOps(TorchDispatchMode):
    """Counts the aten ops a forward dispatches, to compare with the Op events recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += 1
        return func(*args, **(kwargs or {}))


# -- fixture models -------------------------------------------------------------------


class Doubler(nn.Module):
    """One aten op per call (``aten::mul``), no parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class Repeated(nn.Module):
    """``act`` is called 3 times from the root's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.act = Doubler()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = self.act(x)
        return x


class Nested(nn.Module):
    """root -> child (one aten::mul), then one aten::add in the root itself."""

    def __init__(self) -> None:
        super().__init__()
        self.child = Doubler()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.child(x) + 1


class Shared(nn.Module):
    """``b`` is another name for ``a``: one module, called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)  # 4*4 + 4 = 20 params
        self.b = self.a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class Uncalled(nn.Module):
    """``unused`` is registered but never called."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 4)  # 4*4 + 4 = 20 params
        self.unused = nn.Linear(4, 8)  # 4*8 + 8 = 40 params

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


class FunctionalParent(nn.Module):
    """The root runs ops itself: matmul (-> aten::mm on 2-D), +, relu."""

    def __init__(self) -> None:
        super().__init__()
        self.child = nn.Linear(4, 4)  # aten::t + aten::addmm
        self.weight = nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.child(x)
        z = torch.matmul(x, self.weight)
        return F.relu(y + z)


class KwargsDict(nn.Module):
    """Keyword-only ``scale``; returns a dict. ``aten::mul`` runs only if scale != 1."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> dict[str, torch.Tensor]:
        y = self.proj(x)
        if scale != 1.0:
            y = y * scale
        return {"y": y, "pooled": x.sum(-1)}


class Tied(nn.Module):
    """``alpha.weight`` is ``zeta.weight``. ``zeta`` is registered first, so it comes
    first in named_modules() (though not alphabetically) and owns the shared weight."""

    def __init__(self) -> None:
        super().__init__()
        self.zeta = nn.Linear(4, 4)  # weight 16 + bias 4 = 20
        self.alpha = nn.Linear(4, 4)  # own bias 4 only
        self.alpha.weight = self.zeta.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha(self.zeta(x))


X = torch.ones(2, 4)


# -- real models: invariants and parameter counts --------------------------------------

@pytest.mark.parametrize("name", tiered(zoo.names()))
def test_zoo_models_give_sound_trees(name: str, zoo_profile: Any) -> None:
    model, _, prof = zoo_profile(name)
    check_tree(prof)

    params = unique_params(model)
    assert prof.root.params_total == sum(p.numel() for p in params)
    assert prof.param_bytes == sum(p.numel() * p.element_size() for p in params)
    assert [n.path for n in prof.nodes()] == [path for path, _ in model.named_modules()]
    assert prof.root.calls == 1
    assert len(prof.figures.pass_cpu_time_ns) == 2
    assert prof.root.forward.cpu_time_ns > 0
    assert op_calls(prof) > 0
    assert prof.figures.unattributed_ops == 0  # the root module wraps every op


@pytest.fixture(scope="module")
def transformers_models() -> dict[str, tuple[nn.Module, dict[str, torch.Tensor]]]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    bert = transformers.BertModel(
        transformers.BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=1000
        )
    )
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_embd=64, n_layer=2, n_head=2, vocab_size=1000, n_positions=128, bos_token_id=0, eos_token_id=0
        )
    )
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(0))
    return {
        "bert": (bert, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}),
        "gpt2": (gpt2, {"input_ids": ids}),
    }


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_transformers_models_give_sound_trees(name: str, transformers_models: Any) -> None:
    model, inputs = transformers_models[name]
    prof = check_tree(layerscope.profile(model, inputs, warmup=1, repeat=2))

    params = unique_params(model)
    assert prof.root.params_total == sum(p.numel() for p in params)
    assert prof.param_bytes == sum(p.numel() * p.element_size() for p in params)
    assert prof.root.calls == 1
    # Keyword inputs are seen by the root's hook as keywords.
    assert prof.root.input_shapes == [{key: [2, 16] for key in inputs}]
    assert isinstance(prof.root.output_shapes, dict)
    assert op_calls(prof) > 0


def test_gpt2_tied_lm_head_counted_once(transformers_models: Any) -> None:
    model, inputs = transformers_models["gpt2"]
    assert model.lm_head.weight is model.transformer.wte.weight
    prof = check_tree(layerscope.profile(model, inputs, warmup=0, repeat=1, record_ops=False))
    # wte (1000*64) comes first in named_modules(), so it owns the tied weight.
    assert prof["transformer.wte"].params == 1000 * 64
    assert prof["lm_head"].params == 0
    naive = sum(p.numel() for _, m in model.named_modules() for p in m.parameters(recurse=False))
    assert prof.root.params_total == naive - 1000 * 64


# -- fixture models: structure ---------------------------------------------------------


def test_repeated_module_counts_every_call() -> None:
    prof = check_tree(layerscope.profile(Repeated(), X, warmup=0, repeat=2))
    assert prof["act"].calls == 3
    assert prof.root.calls == 1
    # 3 calls x one aten::mul, aggregated into one row (same name, same shapes). torch's
    # profiler records the Python scalar as the 0-d tensor the op received.
    [mul] = prof["act"].ops
    assert (mul.name, mul.calls, mul.input_shapes) == ("aten::mul", 3, [[2, 4], []])


def test_shared_module_is_one_node_at_its_first_path() -> None:
    prof = check_tree(layerscope.profile(Shared(), X, warmup=0, repeat=2))
    assert [n.path for n in prof.nodes()] == ["", "a"]
    assert "b" not in prof
    with pytest.raises(KeyError):
        prof.node("b")
    assert prof["a"].calls == 2  # called as self.a and as self.b
    assert prof["a"].params == 20
    assert prof.root.params_total == 20


def test_uncalled_module_is_present_with_zero_figures() -> None:
    prof = check_tree(layerscope.profile(Uncalled(), X, warmup=0, repeat=2))
    unused = prof["unused"]
    assert unused.calls == 0
    assert unused.forward.cpu_time_ns == 0
    assert unused.forward.self_cpu_time_ns == 0
    assert unused.ops == []
    assert unused.input_shapes is None and unused.output_shapes is None
    assert unused.params == 40  # never called, still owns its parameters
    assert prof["used"].calls == 1
    assert prof.root.params_total == 20 + 40


def test_functional_ops_in_parent_belong_to_the_parent() -> None:
    model = FunctionalParent()
    prof = check_tree(layerscope.profile(model, X, warmup=0, repeat=1))
    root_ops = op_names(prof, "")
    child_ops = op_names(prof, "child")
    assert root_ops == {"aten::mm", "aten::add", "aten::relu"}
    assert "aten::addmm" in child_ops
    assert not root_ops & child_ops

    # Every Op event lands in exactly one module: recount them with a mode of our own.
    counter = CountOps()
    with torch.no_grad(), counter:
        model(X)
    assert op_calls(prof) == counter.count
    assert prof.figures.unattributed_ops == 0


def test_keyword_inputs_and_dict_outputs() -> None:
    t = torch.ones(2, 4)
    prof = check_tree(layerscope.profile(KwargsDict(), {"x": t, "scale": 2.0}, warmup=0, repeat=1))
    assert prof.root.output_shapes == {"y": [2, 3], "pooled": [2]}
    # No positional args; the keywords, non-tensors as None.
    assert prof.root.input_shapes == [{"x": [2, 4], "scale": None}]
    assert prof.meta.inputs == [[], {"x": [2, 4], "scale": None}]
    assert prof.meta.input_dtypes == [[], {"x": "float32", "scale": None}]
    assert prof.meta.autocast is None
    assert "  ·  input x [2, 4] float32  ·  " in prof.render("text").splitlines()[0]
    # scale=2.0 reached forward: the multiply only runs when scale != 1.
    assert "aten::mul" in op_names(prof, "")
    assert prof["proj"].output_shapes == [2, 3]


def test_tied_parameters_counted_once_at_first_owner() -> None:
    model = Tied()
    prof = check_tree(layerscope.profile(model, X, warmup=0, repeat=1))
    assert prof["zeta"].params == 20  # 4*4 weight + 4 bias
    assert prof["alpha"].params == 4  # own bias only; the weight is zeta's
    assert prof.root.params_total == 24 == sum(p.numel() for p in model.parameters())
    assert prof.param_bytes == 24 * 4  # float32


class RootAlias(nn.Module):
    """The root registers its child's weight as its own parameter too. The root comes
    first in named_modules(), so it owns the weight; the child keeps only its bias."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)  # weight 16, bias 4
        self.w = self.fc.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) @ self.w


def test_tied_parameter_owned_by_the_root_when_it_comes_first() -> None:
    model = RootAlias()
    prof = check_tree(layerscope.profile(model, X, warmup=0, repeat=1, record_ops=False))
    assert prof.root.params == 16
    assert prof["fc"].params == 4
    assert prof.root.params_total == 20 == sum(p.numel() for p in model.parameters())


def test_param_bytes_follow_each_parameters_dtype() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).to(torch.float16), nn.Linear(4, 4))
    model[2].weight = model[0].weight  # shared: its 64 bytes count once
    with layerscope.Profiler(model) as prof:
        pass  # nothing runs: parameters are counted all the same
    # [0]: 20 x 4 bytes; [1]: 20 x 2 bytes; [2]: own bias 4 x 4 bytes.
    assert prof.param_bytes == 80 + 40 + 16
    assert prof[""].params_total == 44
    assert [n.calls for n in prof.modules()] == [0, 0, 0, 0]
    check_tree(prof.profile)


def test_profiler_reads_like_a_profile() -> None:
    model = Nested()
    with layerscope.Profiler(model) as prof:
        model(X)
    assert isinstance(check_tree(prof.profile), Profile)
    assert prof.to_dict() == prof.profile.to_dict()
    assert prof["child"] is prof.profile["child"]
    assert str(prof) == prof.profile.render("text", width=120)  # not a terminal: 120 columns
    assert "child" in str(prof)
    assert [n.path for n in prof.modules()] == ["", "child"]
    assert [n.path for n in prof.nodes()] == ["", "child", "<layerscope>", "<other>"]
    assert prof.meta.mode == "context"
    assert prof["child"].input_shapes == [[2, 4]]
    assert prof["child"].output_shapes == [2, 4]


# -- exact numbers with the fake clock -------------------------------------------------


def test_fake_clock_profile_exact(fake_clock: Any) -> None:
    # Memory tracking reads the clock too (frees, live memory at the start): off here.
    prof = check_tree(layerscope.profile(Nested(), X, warmup=0, repeat=2, clock=fake_clock, memory=False))
    # Each pass records its ops, and the tree is one pass's. Reads: enter root (1),
    # add (2, 3), enter child (4), mul (5, 6), exit child (7), exit root (8).
    #   child: 7-4 = 3 reads -> 3000 self = total, its mul 1000 of it
    #   root:  8-1 = 7 reads = 7000 total, minus the child's 3000 -> 4000 self, add 1000 of it
    assert prof["child"].forward.self_cpu_time_ns == 3000
    assert prof["child"].forward.cpu_time_ns == 3000
    assert prof.root.forward.self_cpu_time_ns == 4000
    assert prof.root.forward.cpu_time_ns == 7000
    assert prof.figures.pass_cpu_time_ns == [7000, 7000]
    # Two equal passes: the lower median is the first.
    assert prof.figures.shown_pass == 0
    [mul] = prof["child"].ops
    [add] = prof.root.ops
    assert (mul.name, mul.calls, mul.cpu_time_ns, mul.self_cpu_time_ns) == ("aten::mul", 1, 1000, 1000)
    assert (add.name, add.calls, add.cpu_time_ns, add.self_cpu_time_ns) == ("aten::add", 1, 1000, 1000)
    # Reads in all: 2 passes x 8, and nothing else.
    assert fake_clock.now == 16 * STEP


def test_fake_clock_repeated_module_exact(fake_clock: Any) -> None:
    prof = check_tree(
        layerscope.profile(Repeated(), X, warmup=0, repeat=1, record_ops=False, clock=fake_clock)
    )
    # Reads: enter root (1), 3 x (enter act, exit act) (2..7), exit root (8).
    #   act:  3 calls x 1000 = 3000 self = total
    #   root: 8-1 = 7000 total, minus 3000 -> 4000 self
    assert prof["act"].calls == 3
    assert prof["act"].forward.self_cpu_time_ns == 3000
    assert prof.root.forward.self_cpu_time_ns == 4000
    assert prof.root.forward.cpu_time_ns == 7000
    assert fake_clock.now == 8 * STEP


def test_fake_clock_warmup_is_not_measured(fake_clock: Any) -> None:
    prof = check_tree(layerscope.profile(Nested(), X, warmup=2, repeat=3, clock=fake_clock, memory=False))
    # Whatever warm-up reads, the tree is one of the 3 measured passes (8 reads each,
    # as in test_fake_clock_profile_exact).
    assert prof.root.forward.cpu_time_ns == 7000
    assert prof["child"].forward.cpu_time_ns == 3000
    assert prof.figures.pass_cpu_time_ns == [7000, 7000, 7000]
    assert prof.figures.shown_pass == 1


def test_fake_clock_profiler_block_counts_ops_in_module_times(fake_clock: Any) -> None:
    model = Nested()
    # Memory tracking reads the clock too (frees, live memory at the start): off here.
    with layerscope.Profiler(model, clock=fake_clock, memory=False) as prof:
        model(X)
    check_tree(prof.profile)
    # One pass holds modules and ops: step starts (1), enter root (2), enter child (3),
    # mul (4, 5), exit child (6), add (7, 8), exit root (9), step ends (10).
    #   child: 6-3 = 3000 self = total
    #   root:  9-2 = 7000 total, minus 3000 -> 4000 self
    #   <other>: the step's 10-1 = 9000 minus the model's 7000 -> 2000
    assert prof["child"].forward.cpu_time_ns == 3000
    assert prof[""].forward.self_cpu_time_ns == 4000
    assert prof[""].forward.cpu_time_ns == 7000
    assert [(op.name, op.cpu_time_ns) for op in prof["child"].ops] == [("aten::mul", 1000)]
    assert [(op.name, op.cpu_time_ns) for op in prof[""].ops] == [("aten::add", 1000)]
    assert prof.figures.pass_cpu_time_ns == [7000]
    assert [(p.path, p.forward.cpu_time_ns) for p in prof.parts] == [("<other>", 2000)]
    assert prof.step_time_ns == 9000
    assert fake_clock.now == 10 * STEP


def test_fake_clock_profiler_without_ops(fake_clock: Any) -> None:
    model = Nested()
    with layerscope.Profiler(model, record_ops=False, clock=fake_clock) as prof:
        model(X)
    check_tree(prof.profile)
    # Same as a timing pass: 1000 child, 3000 root, no ops at all; the step's marks
    # add two clock reads around it, and its 5000 less the model's 3000 is <other>.
    assert prof["child"].forward.cpu_time_ns == 1000
    assert prof[""].forward.cpu_time_ns == 3000
    assert op_calls(prof.profile) == 0
    assert prof.step_time_ns == 5000
    assert fake_clock.now == 6 * STEP


# -- paths= ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def alexnet() -> nn.Module:
    torch.manual_seed(0)
    return zoo.get("alexnet").build()


ALEXNET_X = zoo.get("alexnet").example_inputs(1)


def _selected(path: str) -> bool:
    return path == "features.3" or path == "classifier" or path.startswith("classifier.")


def test_paths_limit_profiling_to_subtrees(alexnet: nn.Module) -> None:
    prof = check_tree(
        layerscope.profile(alexnet, ALEXNET_X, warmup=0, repeat=1, paths=["features.3", "classifier"])
    )
    assert [n.path for n in prof.nodes()] == [p for p, _ in alexnet.named_modules()]
    for node in prof.nodes():
        if _selected(node.path):
            assert node.profiled, node.path
            assert node.calls == 1, node.path
            assert node.forward.cpu_time_ns > 0, node.path
        else:
            assert not node.profiled, node.path
            assert node.calls == 0, node.path
            assert node.forward.self_cpu_time_ns == 0, node.path
            assert node.ops == [], node.path
    assert "aten::convolution" in op_names(prof, "features.3")
    assert "aten::addmm" in op_names(prof, "classifier.1")
    # features.0's convolution, the root's flatten, ... ran outside the chosen subtrees.
    assert prof.figures.unattributed_ops > 0
    assert prof.meta.paths == ["features.3", "classifier"]
    # Parameters are counted in full, profiled or not.
    assert prof.root.params_total == 61_100_840


def test_paths_exact_with_fake_clock(alexnet: nn.Module, fake_clock: Any) -> None:
    prof = check_tree(
        layerscope.profile(
            alexnet, ALEXNET_X, warmup=0, repeat=1, record_ops=False,
            paths=["features.3", "classifier"], clock=fake_clock,
        )
    )
    # features.3: enter, exit -> 1000. classifier: enter, 7 children x 2 reads, exit
    # -> 15000 total, 7 x 1000 in children, 8000 self. Unprofiled modules read nothing.
    assert prof["features.3"].forward.cpu_time_ns == 1000
    assert prof["classifier"].forward.cpu_time_ns == 15_000
    assert prof["classifier"].forward.self_cpu_time_ns == 8000
    assert prof["features"].forward.cpu_time_ns == 1000
    assert prof.root.forward.cpu_time_ns == 16_000
    assert fake_clock.now == (2 + 16) * STEP


def test_paths_unknown_raises_model_error(alexnet: nn.Module) -> None:
    with pytest.raises(ModelError, match=r"'features\.99'"):
        layerscope.profile(alexnet, ALEXNET_X, warmup=0, repeat=1, paths=["features.3", "features.99"])
    with pytest.raises(ModelError, match="'nope'"):
        with layerscope.Profiler(alexnet, paths=["nope"]):
            pass


# -- passes and progress ---------------------------------------------------------------


def test_repeat_sets_number_of_passes() -> None:
    prof = check_tree(layerscope.profile(Nested(), X, warmup=0, repeat=3, record_ops=False))
    assert len(prof.figures.pass_cpu_time_ns) == 3
    assert prof.meta.repeat == 3


def test_progress_reports_every_stage() -> None:
    seen: list[tuple[str, int, int]] = []
    layerscope.profile(Nested(), X, warmup=2, repeat=3, progress=lambda *a: seen.append(a))
    assert seen == [
        ("warmup", 1, 2), ("warmup", 2, 2),
        ("measure", 1, 3), ("measure", 2, 3), ("measure", 3, 3),
    ]
    seen.clear()
    layerscope.profile(Nested(), X, warmup=0, repeat=1, record_ops=False, progress=lambda *a: seen.append(a))
    assert seen == [("measure", 1, 1)]


# -- check_tree catches corruption -----------------------------------------------------


@pytest.fixture
def sound_profile() -> Profile:
    prof = check_tree(layerscope.profile(FunctionalParent(), X, warmup=0, repeat=1))
    assert prof.root.forward.cpu_time_ns > 0
    return prof


def test_check_tree_catches_a_broken_total(sound_profile: Profile) -> None:
    broken = copy.deepcopy(sound_profile)
    broken.root.forward.cpu_time_ns += 1
    with pytest.raises(InvariantError, match=r"cpu_time_ns=\d+ != self_cpu_time_ns"):
        check_tree(broken)


def test_check_tree_catches_a_negative(sound_profile: Profile) -> None:
    broken = copy.deepcopy(sound_profile)
    broken["child"].forward.self_cpu_time_ns = -5
    broken["child"].forward.cpu_time_ns = -5
    with pytest.raises(InvariantError, match="negative"):
        check_tree(broken)


def test_check_tree_catches_a_duplicate_path(sound_profile: Profile) -> None:
    broken = copy.deepcopy(sound_profile)
    twin = copy.deepcopy(broken["child"])
    # A twin with no figures of its own, so the only breach is the repeated path.
    twin.params = twin.params_total = twin.calls = 0
    twin.forward.cpu_time_ns = twin.forward.self_cpu_time_ns = 0
    twin.ops = []
    broken.root.children.append(twin)
    with pytest.raises(InvariantError, match="duplicate path 'child'"):
        check_tree(broken)


def test_check_tree_catches_params_and_op_breaches(sound_profile: Profile) -> None:
    broken = copy.deepcopy(sound_profile)
    broken.root.params_total += 1
    with pytest.raises(InvariantError, match="params_total"):
        check_tree(broken)
    broken = copy.deepcopy(sound_profile)
    broken.root.ops[0].self_cpu_time_ns = broken.root.ops[0].cpu_time_ns + 1
    with pytest.raises(InvariantError, match="self time exceeds"):
        check_tree(broken)


# -- the meta device ----------------------------------------------------------------------


def test_refuse_meta_timing_refuses_a_meta_model_or_meta_inputs() -> None:
    from layerscope.capture.modules import refuse_meta_timing

    with torch.device("meta"):
        on_meta = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
    with pytest.raises(ModelError, match=r"meta device.*layerscope\.count_flops"):
        refuse_meta_timing(on_meta, torch.ones(2, 8))
    with pytest.raises(ModelError, match="meta device"):
        refuse_meta_timing(nn.ReLU(), {"x": torch.empty(2, 8, device="meta")})  # no parameters to tell
    refuse_meta_timing(nn.Linear(8, 4), (torch.ones(2, 8), 3))  # on the CPU: nothing to refuse
    # Counting is what works on meta:
    assert layerscope.count_flops(on_meta, torch.empty(2, 8, device="meta")).root.forward.macs == 2 * 8 * 4


def test_profile_and_profiler_refuse_to_time_a_meta_model() -> None:
    with torch.device("meta"):
        on_meta = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
    x = torch.empty(2, 8, device="meta")
    with pytest.raises(ModelError, match=r"meta device.*layerscope\.count_flops"):
        layerscope.profile(on_meta, x)
    with pytest.raises(ModelError, match=r"meta device.*layerscope\.count_flops"):
        layerscope.profile(nn.Linear(8, 4), x)  # meta inputs to a real model
    with pytest.raises(ModelError, match="meta device"), layerscope.Profiler(on_meta):
        on_meta(x)


def test_one_assembly_chooses_the_backend_and_its_fallback_once() -> None:
    # The plan says what to capture; the assembly chooses how, once, and says so in the
    # capture under one name: torch's profiler where it can run (its first pass dropped,
    # the shapes read in it kept), the dispatch mode inside a user's torch.profiler.
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
    x = torch.randn(2, 4)
    plan = CapturePlan(model, inputs=((x,), {}), memory=True)

    def passes(assembly: Assembly, count: int) -> list[list[Event]]:
        for _ in range(count):
            assembly.begin_step()
            model(x)
            assembly.end_step()
        return assembly.measured()

    with Assembly(plan) as free:
        assert free.windowed and free.dropped_passes == 1 and free.times_from is None
        streams = passes(free, 1 + 2)
    with torch.profiler.profile(), Assembly(plan) as inside:
        assert not inside.windowed and inside.dropped_passes == 0 and inside.times_from == "dispatch mode"
        fallback = passes(inside, 2)
    # A clock of the caller's times by design: the recorder, and no fallback to state.
    with Assembly(dataclasses.replace(plan, clock=time.perf_counter_ns)) as clocked:
        assert not clocked.windowed and clocked.times_from is None
    for assembly, measured in ((free, streams), (inside, fallback)):
        assert len(measured) == 2
        assert [type(event) for event in measured[0]].count(ModuleShapes) == 3  # once per module
        assert not any(type(event) is ModuleShapes for event in measured[1])
        raw = assembly.capture(timing_passes=measured, detailed_passes=True, mode="profile")
        prof = check_tree(build_profile(raw))
        assert prof.meta.times_from == assembly.times_from and prof.meta.ops_from is None
        assert prof.meta.inputs == [[[2, 4]], {}] and prof.meta.paths is None and prof.meta.timed is None
        assert (prof["0"].input_shapes, prof["0"].output_shapes) == ([[2, 4]], [2, 8])
        assert prof["0"].forward.flops == 2 * 2 * 4 * 8 + 2 * 8 and prof.memory is not None  # addmm: matmul + bias


def test_the_header_names_nested_inputs_and_autocast() -> None:
    # What ran: a tuple argument of two tensors, a token-id tensor, and ops in bfloat16.
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)

        def forward(self, pair: tuple[torch.Tensor, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
            return pair[0] @ pair[1] + self.embed(ids).sum()

    inputs = ((torch.ones(2, 3), torch.ones(3, 2)), torch.zeros(2, dtype=torch.int64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        prof = check_tree(layerscope.count_flops(Pair(), inputs))
    assert prof.meta.input_dtypes == [[["float32", "float32"], "int64"], {}]
    assert prof.meta.autocast == "bfloat16"
    assert prof.render("text").splitlines()[0] == (
        "Pair  ·  cpu  ·  float32  ·  autocast bfloat16  ·  inputs [[2, 3], [3, 2]] float32, [2] int64"
        "  ·  train mode  ·  counted in one pass, not timed"
    )
    again = profile_from_dict(prof.to_dict())  # as saved and loaded: the schema admits it
    assert again.render("text") == prof.render("text")


def test_an_exception_from_the_model_names_the_module_it_came_from_and_keeps_its_type() -> None:
    model = nn.Sequential(nn.Linear(64, 65), nn.ReLU(), nn.Sequential(nn.Linear(64, 256)))
    x = torch.randn(8, 64)
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied") as raised:
        layerscope.profile(model, x)
    assert raised.value.__notes__ == ["layerscope: raised in module '2.0' (Linear)"]
    with pytest.raises(RuntimeError) as again:
        with layerscope.Profiler(model):
            model(x)
    assert again.value.__notes__ == ["layerscope: raised in module '2.0' (Linear)"]
    with pytest.raises(RuntimeError) as counted:
        layerscope.count_flops(model, x)
    assert counted.value.__notes__ == ["layerscope: raised in module '2.0' (Linear)"]
    # The model is left as it was: no hooks, nothing added.
    assert not model._forward_hooks and not model._forward_pre_hooks


QUIET_SCRIPT = r"""
import os, sys, threading, time
import torch, layerscope
import layerscope.capture

layerscope.capture.QUIET_PROFILER = sys.argv[1] == "quiet"
model = torch.nn.Linear(4, 4)
done = threading.Event()

def chatter():  # another thread of the user's, writing to fd 2 past sys.stderr
    i = 0
    while not done.is_set():
        os.write(2, b"user line %d\n" % i)
        i += 1
        time.sleep(0.0005)
    os.write(2, b"user wrote %d\n" % i)

thread = threading.Thread(target=chatter)
thread.start()
for _ in range(5):
    sys.stderr.write("user print\n")  # one write (print's end would be another)
    with layerscope.Profiler(model) as prof:
        model(torch.randn(2, 4))
        prof.step()
done.set()
thread.join()
"""


def _run_script(tmp_path: Any, text: str, setting: str) -> Any:
    """``text`` run as a script of its own with ``setting`` as its argument; it succeeded."""
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(text, encoding="utf-8")
    run = subprocess.run([sys.executable, str(script), setting], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run


UNKNOWN_BLOCK_SCRIPT = r"""
import os, sys, warnings
import torch, layerscope
import layerscope.capture

layerscope.capture.QUIET_PROFILER = sys.argv[1] == "quiet"
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(8, 64)).sum().backward()  # gradients made before the block
with layerscope.Profiler(model):
    for _ in range(2):
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
        opt.zero_grad()  # frees them while torch's profiler records memory
        warnings.warn("a warning of the user's")
        os.write(2, b"a line on descriptor 2\n")
"""


@pytest.mark.slow  # a fresh Python process per setting, to watch its descriptor 2
@pytest.mark.parametrize("setting", ["quiet", "loud"])
def test_a_blocks_unknown_block_warning_is_hidden_and_other_warnings_are_not(setting: str, tmp_path: Any) -> None:
    # torch's CPU allocator warns (from C++, on descriptor 2) the first time a block
    # allocated before memory profiling began is freed while it runs: a step's
    # zero_grad() does it. layerscope spends that warning where stderr is kept quiet.
    run = _run_script(tmp_path, UNKNOWN_BLOCK_SCRIPT, setting)
    warned = [line for line in run.stderr.splitlines() if "Memory block of unknown size" in line]
    if setting == "quiet":
        assert warned == [], warned
    else:  # with the switch off, the warning comes through: the test can fail
        assert len(warned) == 1, run.stderr[-2000:]
    assert "UserWarning: a warning of the user's" in run.stderr
    assert run.stderr.count("a line on descriptor 2") == 2


@pytest.mark.slow  # a fresh Python process per setting, to watch its descriptor 2
@pytest.mark.parametrize("setting", ["quiet", "loud"])
def test_torch_profiler_lines_kept_off_stderr_and_nothing_of_the_users_lost(setting: str, tmp_path: Any) -> None:
    # A Profiler block prints nothing of torch's profiler backend (its start and stop
    # lines, "USDT: ... profiler_start"), and loses nothing the user writes meanwhile,
    # from any thread, even straight to file descriptor 2.
    import re

    run = _run_script(tmp_path, QUIET_SCRIPT, setting)
    lines = run.stderr.splitlines()
    written = int(next(line for line in lines if line.startswith("user wrote")).split()[-1])
    # Every line arrives, whole; one written just as the profiler starts or stops may
    # arrive a line or two out of place.
    assert sorted(int(line.split()[-1]) for line in lines if line.startswith("user line")) == list(range(written))
    assert lines.count("user print") == 5
    ours = [line for line in lines if not line.startswith(("user line", "user wrote", "user print"))]
    backend = [line for line in ours if re.match(r"(USDT|STAGE):\d{4}-", line)]
    if setting == "quiet":
        assert ours == [], ours[:5]
    else:  # the switch is real: with it off, torch's own lines come through
        assert backend, ours[:5]
