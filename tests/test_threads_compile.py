"""What a profile counts when other threads call the model, and compiled models."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
from layerscope.check import check_tree
from layerscope.errors import ModelError


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


class Hammer:
    """A real second thread calling the same model in a loop (a serving thread)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.calls = 0
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        x = torch.randn(2, 16)
        with torch.no_grad():
            while not self._stop.is_set():
                self.model(x)
                self.calls += 1
                self._started.set()

    def __enter__(self) -> Hammer:
        self._thread.start()
        assert self._started.wait(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)


def _busy_forward(model: nn.Module, hammer: Hammer, x: torch.Tensor) -> None:
    # Give the other thread room to call the model while this one is inside it.
    before = hammer.calls
    model(x)
    while hammer.calls < before + 3:
        model[1](torch.zeros(1))  # a call outside the model's root: not the root's
        threading.Event().wait(0.001)


@pytest.mark.parametrize("record_ops", [True, False])
def test_a_profiler_block_counts_only_its_own_thread(record_ops: bool) -> None:
    model = _model()
    x = torch.randn(4, 16)
    steps = 4
    with Hammer(model) as hammer, layerscope.Profiler(model, record_ops=record_ops) as prof:
        for _ in range(steps):
            _busy_forward(model, hammer, x)
            prof.step()
    assert hammer.calls > steps * 3  # the other thread really ran meanwhile
    profile = check_tree(prof.profile)
    timed = profile.meta["steps"]
    assert timed == steps  # every step is recorded, with or without its ops
    assert profile[""].calls == timed
    assert profile["0"].calls == profile["2"].calls == timed


def test_profile_counts_only_its_own_thread() -> None:
    model = _model()
    with Hammer(model) as hammer:
        prof = check_tree(layerscope.profile(model, torch.randn(4, 16), warmup=1, repeat=5))
        prof_bwd = check_tree(layerscope.profile(model, torch.randn(4, 16), warmup=1, repeat=5, backward=True))
    assert hammer.calls > 0
    for p in (prof, prof_bwd):
        assert p[""].calls == 1
        assert [op.calls for op in p["0"].ops if op.name == "aten::addmm"] == [1]


def test_compiled_models_are_refused_where_hooks_would_time_them() -> None:
    """A Profiler block and a compiled submodule are refused (their hooks would be
    traced); profile() and count_flops() of a model compiled whole work (test_compiled)."""
    model = _model()
    compiled = torch.compile(model)
    with pytest.raises(ModelError, match=r"compiled with torch.compile.*profile\(torch.compile\(model\)"):
        layerscope.Profiler(compiled).__enter__()
    eager = check_tree(layerscope.count_flops(model, torch.randn(2, 16)))
    assert check_tree(layerscope.count_flops(compiled, torch.randn(2, 16))).root.forward.flops == eager.root.forward.flops
    # A compiled submodule is named.
    inner = _model()
    inner[2].compile()
    with pytest.raises(ModelError, match=r"module '2' is compiled"):
        layerscope.count_flops(inner, torch.randn(2, 16))
    # The eager model still profiles.
    check_tree(layerscope.count_flops(compiled._orig_mod, torch.randn(2, 16)))
