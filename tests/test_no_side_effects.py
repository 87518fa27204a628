"""Profiling leaves the model, torch and the caller's exception exactly as they were.

Each test takes a snapshot of everything a profiler could touch (every submodule's
``__dict__`` and hook dicts, ``state_dict`` keys, train/eval flags, torch's global module
hooks, ``torch.nn.functional``, the dispatch-mode stack, grad mode), profiles, and
compares. ``test_snapshot_sees_each_kind_of_change`` proves the snapshot would notice.
"""

from __future__ import annotations

import contextlib
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
from layerscope.check import check_tree
from layerscope.errors import InputsError, ModelError, ProfilerStateError

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


def snapshot(model: nn.Module) -> dict[str, Any]:
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
def unchanged(model: nn.Module) -> Iterator[None]:
    before = snapshot(model)
    yield
    assert_unchanged(before, snapshot(model))


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

    assert changed_by(add_attribute) == ["module 'head' __dict__"]
    assert changed_by(local_hook) == ["module 'blocks.1.fc' __dict__"]
    assert changed_by(global_hook) == ["torch _global_forward_pre_hooks"]
    assert changed_by(patch_functional) == ["torch.nn.functional"]
    assert changed_by(flip_training) == ["module 'blocks.1.norm' __dict__", "module 'blocks.1.norm' training"]
    assert changed_by(add_buffer) == ["module 'head' __dict__", "state_dict keys"]
    assert changed_by(enter_mode) == ["dispatch mode", "dispatch stack depth"]
    assert changed_by(no_grad) == ["grad enabled"]
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
    assert prof.meta["training"] == (mode != "eval")


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


# -- Profiler --------------------------------------------------------------------------


@pytest.mark.parametrize("record_ops", [True, False])
@pytest.mark.parametrize("mode", ["train", "eval", "mixed"])
def test_profiler_block_leaves_no_trace(mode: str, record_ops: bool) -> None:
    model = everything(mode)
    with unchanged(model):
        with layerscope.Profiler(model, record_ops=record_ops) as prof:
            model(X4, scale=3.0)
    check_tree(prof.profile)
    assert prof["blocks.1.fc"].calls == 1
    assert prof["blocks.0"].calls == 2  # also called as self.alias


# -- a forward that raises -------------------------------------------------------------


# (warmup, raise_on): which pass raises. With warmup=1 and ops on, call 1 is the warm-up
# pass under the op-recording mode; with warmup=0, call 1 is a timing pass and call 2
# (repeat=1) the op pass.
RAISING_PASSES = [(1, 1), (0, 1), (0, 2)]


@pytest.mark.parametrize(("warmup", "raise_on"), RAISING_PASSES)
def test_profile_reraises_the_models_exception_and_cleans_up(warmup: int, raise_on: int) -> None:
    boom = ValueError("boom")
    model = Failing(boom, raise_on)
    with unchanged(model):
        with pytest.raises(ValueError, match=r"^boom$") as excinfo:
            layerscope.profile(model, X4, warmup=warmup, repeat=1)
    assert excinfo.type is ValueError
    assert excinfo.value is boom
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
        with pytest.raises(ValueError, match=r"^boom$") as excinfo:
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
