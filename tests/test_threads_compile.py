"""What a profile counts when other threads call the model, and compiled models."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
from layerscope.base.errors import ModelError, ProfilerStateError
from layerscope.model.check import check_tree


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
    timed = profile.figures.steps
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


#: Two threads, each profiling its own model three times, started together, round after
#: round: torch's profiler runs one session per process, and two interleaving crashed it.
TAKING_TURNS = r"""
import sys, threading
import layerscope
from layerscope import zoo
from layerscope.model.check import check_tree

failures = []
for _ in range(int(sys.argv[1])):
    together = threading.Barrier(2)

    def work(name):
        try:
            entry = zoo.get(name)
            model, x = entry.build(), entry.example_inputs(2)
            together.wait()
            for _ in range(3):
                check_tree(layerscope.profile(model, x, backward=True, warmup=1, repeat=2))
        except BaseException as exc:
            failures.append(f"{name}: {exc!r}")

    threads = [threading.Thread(target=work, args=(name,)) for name in ("mlp", "lenet5")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
assert not failures, failures
"""


def test_profiles_in_two_threads_take_turns_with_torchs_profiler(tmp_path: Any) -> None:
    script = tmp_path / "turns.py"
    script.write_text(TAKING_TURNS, encoding="utf-8")
    # In a process of its own: a crash fails this test, not the whole run.
    run = subprocess.run([sys.executable, str(script), "5"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "External init callback" not in run.stderr


class Block:
    """A real Profiler block in a thread of its own, held open until told to end."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.profile: Any = None
        self._open = threading.Event()
        self._end = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with layerscope.Profiler(self.model) as prof:
            self.model(torch.randn(4, 16))
            self._open.set()
            self._end.wait(60)
            prof.step()
        self.profile = prof.profile

    def __enter__(self) -> Block:
        self._thread.start()
        assert self._open.wait(60)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._end.set()
        self._thread.join(60)


def test_while_another_threads_block_holds_torchs_profiler_others_record_without_it() -> None:
    """A block may last a whole training loop, so nothing waits for it: a profile() or
    another block records under the dispatch mode (as inside a user's torch.profiler),
    and a bare start of torch's profiler is refused in one line."""
    from layerscope.capture.kineto import KinetoWindow

    model, other = _model(), _model()
    x = torch.randn(4, 16)
    with Block(model) as block:
        prof = check_tree(layerscope.profile(other, x, warmup=1, repeat=2, backward=True))
        with layerscope.Profiler(other) as second:
            other(x)
        window = KinetoWindow({id(other): 0}, device=torch.device("cpu"))
        with pytest.raises(ProfilerStateError, match=r"held by a layerscope.Profiler block in another thread.*after"):
            window.start()
    assert prof.meta.times_from == "dispatch mode"
    assert [op.calls for op in prof["0"].ops if op.name == "aten::addmm"] == [1]
    assert check_tree(second.profile).meta.times_from == "dispatch mode"
    held = check_tree(block.profile)
    assert held.meta.times_from is None and held[""].calls == held["0"].calls == 1
    # The block is over: torch's profiler is free again.
    assert check_tree(layerscope.profile(other, x, warmup=1, repeat=2, backward=True)).meta.times_from is None


def test_a_block_waits_for_another_threads_profile_to_end() -> None:
    """profile() is a bounded call: a block started meanwhile waits for it, then gets
    torch's profiler (its times are torch's, not the dispatch mode's)."""
    calls: list[str] = []
    inside = threading.Event()

    class Slow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _model()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append("profile")
            if not inside.is_set():
                inside.set()
                time.sleep(0.3)  # the block below starts meanwhile
            return self.inner(x)

    profiles: list[Any] = []
    worker = threading.Thread(
        target=lambda: profiles.append(layerscope.profile(Slow(), torch.randn(4, 16), warmup=1, repeat=2, backward=True))
    )
    worker.start()
    assert inside.wait(60)
    model = _model()
    with layerscope.Profiler(model) as prof:
        calls.append("block")
        model(torch.randn(4, 16))
    worker.join(60)
    # Every pass of the profile ran before the block began.
    assert calls == ["profile"] * (len(calls) - 1) + ["block"]
    assert check_tree(profiles[0]).meta.times_from is None
    assert check_tree(prof.profile).meta.times_from is None


def test_compiled_models_are_refused_where_hooks_would_time_them() -> None:
    """A compiled submodule is refused, in a block as anywhere (its hooks would be
    traced); profile(), count_flops() and a block of a model compiled whole work
    (test_compiled, test_compiled_block)."""
    model = _model()
    compiled = torch.compile(model)
    in_place = _model()
    in_place[1].compile()
    with pytest.raises(ModelError, match=r"module '1' is compiled with torch.compile.*profile\(torch.compile\(model\)"):
        layerscope.Profiler(in_place).__enter__()
    eager = check_tree(layerscope.count_flops(model, torch.randn(2, 16)))
    assert check_tree(layerscope.count_flops(compiled, torch.randn(2, 16))).root.forward.flops == eager.root.forward.flops
    # A compiled submodule is named.
    inner = _model()
    inner[2].compile()
    with pytest.raises(ModelError, match=r"module '2' is compiled"):
        layerscope.count_flops(inner, torch.randn(2, 16))
    # The eager model still profiles.
    check_tree(layerscope.count_flops(compiled._orig_mod, torch.randn(2, 16)))
