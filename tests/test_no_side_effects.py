"""Profiling leaves the model, torch and the caller's exception exactly as they were.

Each test takes a snapshot of everything a profiler could touch (every submodule's
``__dict__`` and hook dicts, ``state_dict`` keys, train/eval flags, the values of every
parameter and buffer, torch's global RNG states, torch's global module hooks,
``torch.nn.functional``, the dispatch-mode stack, grad mode), profiles, and compares.
``test_snapshot_sees_each_kind_of_change`` proves the snapshot would notice.

A ``Profiler`` block is the exception for values: it wraps the user's own code, whose
buffer updates and random draws are the user's to keep.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as nn_module
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

import layerscope
from layerscope import zoo
from layerscope.base.errors import InputsError, ModelError, ProfilerStateError
from layerscope.model.check import check_tree

# Every hook dict torch keeps on a module; the snapshot covers all of vars(module), these
# are named so that a torch that renamed one fails here instead of going unchecked.
MODULE_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)

GLOBAL_HOOK_DICTS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_forward_hooks_always_called",
    "_global_forward_hooks_with_kwargs",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
    "_global_module_registration_hooks",
    "_global_parameter_registration_hooks",
    "_global_buffer_registration_hooks",
)


def _contents(value: Any) -> Any:
    """A value's identity, plus its items' identities for the containers torch mutates."""
    if isinstance(value, dict):
        return (id(value), tuple((key, id(item)) for key, item in value.items()))
    if isinstance(value, (set, frozenset)):
        return (id(value), frozenset(value))
    return id(value)


def _digest(tensor: torch.Tensor) -> tuple[str, tuple[int, ...], str]:
    """A tensor's dtype, shape and the hash of its bytes: equal only for the same bits."""
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return str(tensor.dtype), tuple(tensor.shape), hashlib.sha256(data.numpy().tobytes()).hexdigest()


def rng_states() -> dict[str, Any]:
    """torch's global random states: the CPU's, and each CUDA device's once CUDA is up."""
    states = {"torch CPU RNG": _digest(torch.get_rng_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["torch CUDA RNG"] = [_digest(state) for state in torch.cuda.get_rng_state_all()]
    return states


def snapshot(model: nn.Module, *, values: bool = True) -> dict[str, Any]:
    """Everything profiling could touch; ``values`` adds every parameter's and buffer's
    value and the RNG states (a Profiler block's own code may change those)."""
    state: dict[str, Any] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        attrs = vars(module)
        for name in MODULE_HOOK_DICTS:
            assert name in attrs, f"torch no longer has {name}: update the snapshot"
        state[f"module {path!r} __dict__"] = {name: _contents(value) for name, value in attrs.items()}
        state[f"module {path!r} training"] = module.training
    state["state_dict keys"] = list(model.state_dict().keys())
    state["parameter grads"] = [(name, id(p.grad)) for name, p in model.named_parameters()]
    for name in GLOBAL_HOOK_DICTS:
        state[f"torch {name}"] = _contents(getattr(nn_module, name))
    state["torch.nn.functional"] = {name: id(value) for name, value in vars(F).items()}
    state["dispatch mode"] = _get_current_dispatch_mode()
    state["dispatch stack depth"] = torch._C._len_torch_dispatch_stack()
    state["grad enabled"] = torch.is_grad_enabled()
    if values:
        for name, param in model.named_parameters():
            state[f"parameter {name!r} value"] = _digest(param)
            if param.grad is not None:
                state[f"parameter {name!r} grad value"] = _digest(param.grad)
        for name, buffer in model.named_buffers():
            state[f"buffer {name!r} value"] = _digest(buffer)
        state.update(rng_states())
    return state


def assert_unchanged(before: dict[str, Any], after: dict[str, Any]) -> None:
    changed = sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))
    assert not changed, f"profiling changed: {changed}"


# -- models ----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(F.relu(self.norm(self.fc(x))))


class Everything(nn.Module):
    """Nested, shared, tied, uncalled, buffers, non-persistent buffers, kwargs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.alias = self.blocks[0]
        self.head = nn.Linear(8, 8)
        self.tail = nn.Linear(8, 8)
        self.tail.weight = self.head.weight
        self.unused = nn.Conv2d(1, 1, 1)
        self.register_buffer("offset", torch.zeros(8))
        self.register_buffer("scratch", torch.zeros(8), persistent=False)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        h = self.alias(h)
        return self.tail(self.head(h)) * scale + self.offset


class Raiser(nn.Module):
    """Raises ``exc`` on its ``raise_on``-th call (1-based); counts calls in a list so
    its own ``__dict__`` keeps the same objects."""

    def __init__(self, exc: BaseException, raise_on: int = 1) -> None:
        super().__init__()
        self.exc = exc
        self.raise_on = raise_on
        self.calls = [0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls[0] += 1
        if self.calls[0] == self.raise_on:
            raise self.exc
        return x


class Failing(nn.Module):
    def __init__(self, exc: BaseException, raise_on: int = 1) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.raiser = Raiser(exc, raise_on)
        self.last = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.raiser(self.first(x)))


X4 = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))


def everything(mode: str) -> nn.Module:
    torch.manual_seed(0)
    model = Everything()
    if mode == "train":
        model.train()
    elif mode == "eval":
        model.eval()
    else:  # mixed: the root trains, one block and the head do not
        model.train()
        model.blocks[1].eval()
        model.head.eval()
    model(X4)  # a first plain call, so anything torch caches lazily exists already
    return model


@contextlib.contextmanager
def unchanged(model: nn.Module, *, values: bool = True) -> Iterator[None]:
    before = snapshot(model, values=values)
    yield
    assert_unchanged(before, snapshot(model, values=values))


# -- the snapshot itself ---------------------------------------------------------------


class _NoopMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def test_snapshot_sees_each_kind_of_change(monkeypatch: pytest.MonkeyPatch) -> None:
    model = everything("train")
    base = snapshot(model)

    def changed_by(action: Any) -> list[str]:
        with contextlib.ExitStack() as stack:
            action(stack)
            after = snapshot(model)
        return sorted(k for k in base.keys() | after.keys() if base.get(k) != after.get(k))

    def add_attribute(stack: contextlib.ExitStack) -> None:
        model.head.__flops__ = 0
        stack.callback(delattr, model.head, "__flops__")

    def local_hook(stack: contextlib.ExitStack) -> None:
        stack.callback(model.blocks[1].fc.register_forward_hook(lambda *a: None).remove)

    def global_hook(stack: contextlib.ExitStack) -> None:
        stack.callback(nn_module.register_module_forward_pre_hook(lambda *a: None).remove)

    def patch_functional(stack: contextlib.ExitStack) -> None:
        original = F.relu
        F.relu = lambda *a, **k: original(*a, **k)
        stack.callback(setattr, F, "relu", original)

    def flip_training(stack: contextlib.ExitStack) -> None:
        model.blocks[1].norm.eval()
        stack.callback(model.blocks[1].norm.train)

    def add_buffer(stack: contextlib.ExitStack) -> None:
        model.head.register_buffer("__params__", torch.zeros(1))
        stack.callback(model.head._buffers.pop, "__params__")

    def enter_mode(stack: contextlib.ExitStack) -> None:
        stack.enter_context(_NoopMode())

    def no_grad(stack: contextlib.ExitStack) -> None:
        stack.enter_context(torch.no_grad())

    def update_statistics(stack: contextlib.ExitStack) -> None:
        saved = model.blocks[1].norm.running_mean.clone()
        model.blocks[1].norm.running_mean.add_(1)
        stack.callback(model.blocks[1].norm.running_mean.copy_, saved)

    def step_a_weight(stack: contextlib.ExitStack) -> None:
        saved = model.embed.weight.detach().clone()
        with torch.no_grad():
            model.embed.weight.mul_(0.5)
        stack.callback(lambda: model.embed.weight.data.copy_(saved))

    def draw_a_random_number(stack: contextlib.ExitStack) -> None:
        saved = torch.get_rng_state()
        torch.rand(1)
        stack.callback(torch.set_rng_state, saved)

    assert changed_by(add_attribute) == ["module 'head' __dict__"]
    assert changed_by(local_hook) == ["module 'blocks.1.fc' __dict__"]
    assert changed_by(global_hook) == ["torch _global_forward_pre_hooks"]
    assert changed_by(patch_functional) == ["torch.nn.functional"]
    assert changed_by(flip_training) == ["module 'blocks.1.norm' __dict__", "module 'blocks.1.norm' training"]
    assert changed_by(add_buffer) == ["buffer 'head.__params__' value", "module 'head' __dict__", "state_dict keys"]
    assert changed_by(enter_mode) == ["dispatch mode", "dispatch stack depth"]
    assert changed_by(no_grad) == ["grad enabled"]
    assert changed_by(update_statistics) == ["buffer 'blocks.1.norm.running_mean' value"]
    assert changed_by(step_a_weight) == ["parameter 'embed.weight' value"]
    assert changed_by(draw_a_random_number) == ["torch CPU RNG"]
    assert_unchanged(base, snapshot(model))


# -- torch's global with_kwargs flags ------------------------------------------------


def _profile_run(model: nn.Module) -> None:
    layerscope.profile(model, X4, warmup=1, repeat=2)


def _profiler_run(model: nn.Module) -> None:
    with layerscope.Profiler(model):
        model(X4)


def _profile_raising(model: nn.Module) -> None:
    model.blocks[0].fc.register_forward_hook(_raise_value_error)
    with pytest.raises(ValueError):
        layerscope.profile(model, X4, warmup=0, repeat=1)


def _profiler_raising(model: nn.Module) -> None:
    model.blocks[0].fc.register_forward_hook(_raise_value_error)
    with pytest.raises(ValueError), layerscope.Profiler(model, record_ops=False):
        model(X4)


def _raise_value_error(*args: Any) -> None:
    raise ValueError("boom")


@pytest.mark.parametrize("run", [_profile_run, _profiler_run, _profile_raising, _profiler_raising])
def test_no_stale_global_hook_flags(run: Any) -> None:
    # register_module_forward_hook(with_kwargs=True) sets a flag in
    # _global_forward_hooks_with_kwargs that handle.remove() leaves behind (torch 2.13);
    # a profiler that promises to leave no trace must clear it too, or every pass leaks
    # one entry into torch's global state.
    model = everything("eval")
    before = dict(nn_module._global_forward_hooks_with_kwargs)
    run(model)
    assert dict(nn_module._global_forward_hooks_with_kwargs) == before


# -- profile() -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["train", "eval", "mixed"])
@pytest.mark.parametrize("no_grad", [True, False])
def test_profile_leaves_no_trace(mode: str, no_grad: bool) -> None:
    model = everything(mode)
    with unchanged(model):
        prof = layerscope.profile(model, {"x": X4, "scale": 2.0}, warmup=1, repeat=2, no_grad=no_grad)
    check_tree(prof)
    assert prof.meta.training == (mode != "eval")


def test_profile_leaves_no_trace_with_grad_disabled_by_caller() -> None:
    model = everything("eval")
    with torch.no_grad():
        with unchanged(model):
            prof = layerscope.profile(model, X4, warmup=0, repeat=1, no_grad=False)
        assert not torch.is_grad_enabled()
    check_tree(prof)


@pytest.mark.parametrize("name", ["lenet5", "gpt"])
def test_profile_zoo_model_leaves_no_trace(name: str) -> None:
    entry = zoo.get(name)
    torch.manual_seed(0)
    model = entry.build()
    inputs = entry.example_inputs(1)
    model(inputs)
    with unchanged(model):
        check_tree(layerscope.profile(model, inputs, warmup=1, repeat=2, paths=None))
    with unchanged(model):
        first_child = next(path for path, _ in model.named_modules() if path)
        check_tree(layerscope.profile(model, inputs, warmup=0, repeat=1, paths=[first_child]))


@pytest.mark.parametrize("mode", ["train", "eval", "mixed"])
def test_profile_backward_leaves_no_trace(mode: str) -> None:
    model = everything(mode)
    model.head.weight.grad = torch.ones_like(model.head.weight)  # a gradient the user had
    with unchanged(model):
        prof = layerscope.profile(model, X4, backward=True, warmup=1, repeat=2)
    check_tree(prof)
    assert prof["blocks.0.fc"].backward.macs > 0
    assert bool((model.head.weight.grad == 1).all())


def test_profile_backward_raising_in_backward_cleans_up() -> None:
    class BackwardBoom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.fc(x)
            out.register_hook(_raise_value_error)  # raises while autograd runs backward
            return out

    model = BackwardBoom()
    with unchanged(model):
        with pytest.raises(ValueError, match="boom"):
            layerscope.profile(model, X4, backward=True, warmup=0, repeat=1)
    assert model.fc.weight.grad is None


# -- values: buffers, parameters, random states ----------------------------------------


def norm_drop() -> nn.Module:
    """A train-mode model whose every forward moves BatchNorm statistics (running_mean,
    running_var, num_batches_tracked) and draws a dropout mask from the global RNG."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 2)).train()


class SelfTuning(nn.Module):
    """Steps its own optimizer inside forward (test-time adaptation does this)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.opt = [torch.optim.SGD(self.fc.parameters(), lr=0.1)]  # a list: not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            self.fc(x).pow(2).sum().backward()
        self.opt[0].step()
        self.opt[0].zero_grad(set_to_none=False)
        return self.fc(x)


COUNT_AND_PROFILE = {
    "profile": lambda model, x, **kw: layerscope.profile(model, x, warmup=1, repeat=2, **kw),
    "count_flops": layerscope.count_flops,
}


@pytest.mark.parametrize("run", COUNT_AND_PROFILE.values(), ids=COUNT_AND_PROFILE.keys())
@pytest.mark.parametrize("backward", [False, True])
def test_train_mode_statistics_dropout_and_rng_are_restored(run: Any, backward: bool) -> None:
    model = norm_drop()
    held = {name: buffer for name, buffer in model.named_buffers()}  # references a user keeps
    assert held["1.num_batches_tracked"].item() == 0
    with unchanged(model):
        check_tree(run(model, X4, backward=backward))
    assert held["1.num_batches_tracked"].item() == 0
    assert all(held[name] is buffer for name, buffer in model.named_buffers())


@pytest.mark.parametrize("run", COUNT_AND_PROFILE.values(), ids=COUNT_AND_PROFILE.keys())
def test_a_model_built_under_inference_mode_is_restored(run: Any) -> None:
    # Its parameters and buffers are inference tensors: no version counter, and they
    # can be written only inside inference_mode.
    with torch.inference_mode():
        model = norm_drop()
        with unchanged(model):
            run(model, X4, no_grad=False)
    assert model[1].num_batches_tracked.item() == 0


@pytest.mark.parametrize("run", COUNT_AND_PROFILE.values(), ids=COUNT_AND_PROFILE.keys())
def test_untouched_tensors_are_never_written(run: Any) -> None:
    # Writing a value back bumps a tensor's version counter, which would break an
    # autograd graph the user built before profiling; only changed tensors are restored.
    model = norm_drop().eval()
    loss = model(X4).sum()
    versions = [t._version for t in (*model.parameters(), *model.buffers())]
    run(model, X4)
    assert [t._version for t in (*model.parameters(), *model.buffers())] == versions
    loss.backward()  # the graph built before is still valid


@pytest.mark.parametrize("run", COUNT_AND_PROFILE.values(), ids=COUNT_AND_PROFILE.keys())
def test_a_seeded_run_is_not_shifted_by_profiling(run: Any) -> None:
    model = norm_drop()
    torch.manual_seed(7)
    expected = torch.rand(4)
    torch.manual_seed(7)
    run(model, X4)  # dropout draws in every pass
    assert torch.equal(torch.rand(4), expected)


@pytest.mark.parametrize("run", COUNT_AND_PROFILE.values(), ids=COUNT_AND_PROFILE.keys())
def test_parameters_stepped_inside_forward_are_restored(run: Any) -> None:
    model = SelfTuning()
    weight = model.fc.weight
    with unchanged(model):
        run(model, X4)
    assert model.fc.weight is weight
    assert model.fc.weight.grad is None


def test_a_gradient_the_user_had_keeps_its_value() -> None:
    model = SelfTuning()  # its forward accumulates into the existing .grad in place
    model.fc.bias.grad = torch.ones(4)
    with unchanged(model):
        layerscope.profile(model, X4, warmup=0, repeat=1)
    assert bool((model.fc.bias.grad == 1).all())


# (warmup, raise_on) with repeat=1: the last warm-up pass, the first recorded pass (its
# window's first-use costs, dropped), the measured pass raises; every pass before it moved the statistics and drew a dropout mask.
@pytest.mark.parametrize(("warmup", "raise_on"), [(2, 2), (1, 2), (1, 3)])
def test_values_are_restored_when_forward_raises(warmup: int, raise_on: int) -> None:
    model = nn.Sequential(norm_drop(), Raiser(ValueError("boom"), raise_on=raise_on))
    model.train()
    with unchanged(model):
        with pytest.raises(ValueError, match=r"^boom(\n|$)"):
            layerscope.profile(model, X4, warmup=warmup, repeat=1)
    assert model[1].calls == [raise_on]


def test_count_flops_values_are_restored_when_forward_raises() -> None:
    model = nn.Sequential(norm_drop(), Raiser(ValueError("boom")))
    model.train()
    with unchanged(model):
        with pytest.raises(ValueError, match=r"^boom(\n|$)"):
            layerscope.count_flops(model, X4)


def test_count_flops_leaves_a_train_mode_resnet18_as_it_was() -> None:
    entry = zoo.get("resnet18")
    torch.manual_seed(0)
    model = entry.build().train()
    with unchanged(model):
        prof = layerscope.count_flops(model, entry.example_inputs(2))
    check_tree(prof)
    assert model.bn1.num_batches_tracked.item() == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("run", COUNT_AND_PROFILE.values(), ids=COUNT_AND_PROFILE.keys())
def test_cuda_rng_and_statistics_are_restored(run: Any) -> None:
    model = norm_drop().cuda()
    x = X4.cuda()
    model(x)  # CUDA is initialized, and its RNG state is in the snapshot
    with unchanged(model):
        check_tree(run(model, x))


# -- Profiler --------------------------------------------------------------------------


@pytest.mark.parametrize("record_ops", [True, False])
@pytest.mark.parametrize("mode", ["train", "eval", "mixed"])
def test_profiler_block_leaves_no_trace(mode: str, record_ops: bool) -> None:
    model = everything(mode)
    # The block's own forward updates BatchNorm statistics and draws dropout masks in
    # train mode: that is the user's code, so values are compared with a plain run below.
    with unchanged(model, values=mode == "eval"):
        with layerscope.Profiler(model, record_ops=record_ops) as prof:
            model(X4, scale=3.0)
    check_tree(prof.profile)
    assert prof["blocks.1.fc"].calls == 1
    assert prof["blocks.0"].calls == 2  # also called as self.alias


@pytest.mark.parametrize("record_ops", [True, False])
def test_profiler_block_keeps_what_the_users_code_did(record_ops: bool) -> None:
    # A Profiler wraps the user's training code: its BatchNorm updates, optimizer steps
    # and random draws are its intent, and must be exactly those of the same code run
    # without a profiler (nothing restored, nothing extra drawn).
    def train_step(model: nn.Module) -> torch.Tensor:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(X4).sum().backward()
        opt.step()
        return torch.rand(3)  # where the user's random stream stands afterwards

    plain, profiled = everything("train"), everything("train")
    torch.manual_seed(1)
    expected = train_step(plain)
    torch.manual_seed(1)
    with layerscope.Profiler(profiled, record_ops=record_ops):
        got = train_step(profiled)
    assert torch.equal(got, expected)
    for (name, a), b in zip(plain.state_dict().items(), profiled.state_dict().values()):
        assert torch.equal(a, b), name


# -- a forward that raises -------------------------------------------------------------


# (warmup, raise_on): which pass raises. With warmup=1, call 1 is the warm-up pass; with
# warmup=0, call 1 is the first recorded pass (dropped) and call 2 (repeat=1) the
# measured one.
RAISING_PASSES = [(1, 1), (0, 1), (0, 2)]


@pytest.mark.parametrize(("warmup", "raise_on"), RAISING_PASSES)
def test_profile_reraises_the_models_exception_and_cleans_up(warmup: int, raise_on: int) -> None:
    boom = ValueError("boom")
    model = Failing(boom, raise_on)
    with unchanged(model):
        with pytest.raises(ValueError, match=r"^boom(\n|$)") as excinfo:
            layerscope.profile(model, X4, warmup=warmup, repeat=1)
    assert excinfo.type is ValueError
    assert excinfo.value is boom
    # The exception's type and message are the model's own; a note says where it came from.
    assert str(boom) == "boom" and boom.__notes__ == ["layerscope: raised in module 'raiser' (Raiser)"]
    assert model.raiser.calls == [raise_on]
    # The model is free again: profiling it once more works.
    model.raiser.raise_on = 0
    check_tree(layerscope.profile(model, X4, warmup=0, repeat=1))


def test_profile_reraises_base_exceptions_and_cleans_up() -> None:
    stop = KeyboardInterrupt()
    model = Failing(stop)
    with unchanged(model):
        with pytest.raises(KeyboardInterrupt) as excinfo:
            layerscope.profile(model, X4, warmup=0, repeat=1)
    assert excinfo.value is stop


@pytest.mark.parametrize("record_ops", [True, False])
def test_profiler_keeps_partial_results_when_the_block_raises(record_ops: bool) -> None:
    boom = ValueError("boom")
    model = Failing(boom)
    with unchanged(model):
        with pytest.raises(ValueError, match=r"^boom(\n|$)") as excinfo:
            with layerscope.Profiler(model, record_ops=record_ops) as prof:
                model(X4)
    assert excinfo.type is ValueError
    assert excinfo.value is boom
    partial = check_tree(prof.profile)
    # first ran; raiser was entered and its frame closed by the always-called hook;
    # last never ran.
    assert partial["first"].calls == 1
    assert partial["raiser"].calls == 1
    assert partial[""].calls == 1
    assert partial["last"].calls == 0
    assert partial["first"].forward.cpu_time_ns > 0
    if record_ops:
        assert "aten::addmm" in {op.name for op in partial["first"].ops}
        assert partial["first"].input_shapes == [[4, 4]]
    assert prof.to_dict()["modules"][0]["calls"] == 1


def test_profiler_exception_raised_by_a_user_hook_still_cleans_up() -> None:
    boom = RuntimeError("from a user's pre-hook")
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def hook(module: nn.Module, args: Any) -> None:
        raise boom

    handle = model[1].register_forward_pre_hook(hook)
    try:
        with unchanged(model):
            with pytest.raises(RuntimeError) as excinfo:
                with layerscope.Profiler(model) as prof:
                    model(X4)
        assert excinfo.value is boom
        check_tree(prof.profile)
        assert prof["0"].calls == 1
    finally:
        handle.remove()


# -- nesting ---------------------------------------------------------------------------


def test_nested_profilers_on_one_model_are_refused() -> None:
    model = everything("eval")
    with unchanged(model):
        with layerscope.Profiler(model) as outer:
            inside = snapshot(model)
            with pytest.raises(ProfilerStateError, match="already running"):
                with layerscope.Profiler(model):
                    pass  # pragma: no cover - never entered
            with pytest.raises(ProfilerStateError, match="already running"):
                layerscope.profile(model, X4, warmup=0, repeat=1)
            # The refused profilers added nothing to what the outer one installed.
            assert_unchanged(inside, snapshot(model))
            model(X4)
    check_tree(outer.profile)
    assert outer["embed"].calls == 1  # counted once, not once per profiler


def test_reentering_a_running_profiler_is_refused() -> None:
    model = everything("eval")
    prof = layerscope.Profiler(model)
    with unchanged(model):
        with prof:
            with pytest.raises(ProfilerStateError):
                prof.__enter__()
            with pytest.raises(ProfilerStateError, match="still running"):
                _ = prof.profile
            model(X4)
    check_tree(prof.profile)
    assert prof["embed"].calls == 1


def test_reading_a_profiler_before_it_ran_is_refused() -> None:
    prof = layerscope.Profiler(everything("eval"))
    with pytest.raises(ProfilerStateError, match="not started"):
        prof.to_dict()


def test_nested_profilers_on_two_models_work() -> None:
    first, second = everything("eval"), everything("eval")
    with unchanged(first), unchanged(second):
        with layerscope.Profiler(first) as outer:
            with layerscope.Profiler(second) as inner:
                first(X4)
                second(X4)
                second(X4)
    check_tree(outer.profile)
    check_tree(inner.profile)
    assert outer["embed"].calls == 1
    assert inner["embed"].calls == 2
    assert outer[""].calls == 1
    assert inner[""].calls == 2


# -- bad input -------------------------------------------------------------------------


class NotAModel:
    pass


def test_not_a_module_is_a_model_error() -> None:
    with pytest.raises(ModelError, match=r"NotAModel"):
        layerscope.profile(NotAModel(), X4)
    with pytest.raises(ModelError, match=r"builtins\.str"):
        layerscope.Profiler("resnet18")  # type: ignore[arg-type]
    # Passing the class instead of an instance names the class's type.
    with pytest.raises(ModelError, match=r"builtins\.type"):
        layerscope.profile(nn.Linear, X4)  # type: ignore[arg-type]


class TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


def test_inputs_that_do_not_fit_forward() -> None:
    model = TwoInputs()
    with unchanged(model):
        with pytest.raises(InputsError) as excinfo:
            layerscope.profile(model, torch.ones(2, 3))
    message = str(excinfo.value)
    # The signature as inspect renders it (annotations are strings in this file).
    assert f"TwoInputs.forward{inspect.signature(model.forward)}" in message
    assert "forward(x: 'torch.Tensor', y: 'torch.Tensor')" in message
    assert "Tensor[2, 3]:float32" in message
    assert "'y'" in message  # what is missing

    with pytest.raises(InputsError) as excinfo:
        layerscope.profile(model, {"x": torch.ones(2), "z": 3})
    assert "z=int" in str(excinfo.value)
    assert "forward(x: 'torch.Tensor', y: 'torch.Tensor')" in str(excinfo.value)

    with pytest.raises(InputsError, match="given \\(nothing\\)"):
        layerscope.profile(model, None)


@pytest.mark.parametrize(
    ("inputs", "named"),
    [({1, 2}, "set"), ("text", "str"), (3.0, "float"), ((t for t in [X4]), "generator")],
)
def test_wrong_input_container_type(inputs: Any, named: str) -> None:
    with pytest.raises(InputsError, match=rf"got {named}$"):
        layerscope.profile(nn.Linear(4, 4), inputs)


def test_dict_inputs_need_string_keys() -> None:
    with pytest.raises(InputsError, match="string keys"):
        layerscope.profile(nn.Linear(4, 4), {0: X4})


@pytest.mark.parametrize(
    "bad", [{"warmup": -1}, {"repeat": 0}, {"repeat": -3}, {"warmup": 1.5}, {"repeat": "5"}]
)
def test_bad_pass_counts_are_value_errors(bad: dict[str, Any]) -> None:
    model = nn.Linear(4, 4)
    with unchanged(model):
        with pytest.raises(ValueError, match=next(iter(bad))):
            layerscope.profile(model, X4, **bad)
