"""Training loops: ``Profiler.step()``, schedules, ``on_ready`` and the cycle files.

A real loop (forward, loss, backward, optimizer step, zero_grad) runs under a
``Profiler``; steps are summed into one profile per cycle, idle steps install nothing,
warm-up steps are thrown away, and a run that raises keeps (and writes) what it had.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as nn_module

import layerscope
from layerscope.base.errors import ProfilerStateError
from layerscope.block import WINDOW_STEPS
from layerscope.handlers import save_json
from layerscope.model.check import check_tree
from layerscope.model.tree import Profile
from test_no_side_effects import Raiser, assert_unchanged, snapshot

X = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
Y = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def train_step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    # The loss is computed outside the model, between its forward and backward.
    loss = F.mse_loss(model(X), Y)
    loss.backward()
    opt.step()
    opt.zero_grad()


def module_calls(profile: Profile) -> dict[str, int]:
    return {node.path: node.calls for node in profile.modules()}


# -- a schedule over a training loop ----------------------------------------------------


def test_schedule_delivers_each_cycle_at_its_last_active_step() -> None:
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    delivered: list[tuple[int, Profile]] = []
    loop = {"step": -1}

    def on_ready(profile: Profile) -> None:
        delivered.append((loop["step"], profile))

    # wait=1, warmup=1, active=2: cycles of 4 steps. Cycle 1: step 0 idle, 1 warm-up,
    # 2 recorded, 3 recorded and saved (delivered in step 3's step() call). Cycle 2: the
    # same at steps 4..7. repeat=2 ends the schedule at step 0 + 2 * 4 = 8, so steps 8..11
    # are idle. Each cycle keeps 2 steps: every module ran once per kept step, 2 calls.
    sched = layerscope.schedule(wait=1, warmup=1, active=2, repeat=2)
    with layerscope.Profiler(model, schedule=sched, on_ready=on_ready) as prof:
        for step in range(12):
            loop["step"] = step
            train_step(model, opt)
            prof.step()

    assert [at for at, _ in delivered] == [3, 7]
    profiles = [profile for _, profile in delivered]
    assert [p.meta.step_range for p in profiles] == [[2, 3], [6, 7]]
    assert prof.profile is profiles[-1]
    for profile in profiles:
        check_tree(profile)
        meta = profile.meta
        assert profile.figures.steps == 2
        assert meta.complete is True
        assert meta.rank == 0
        assert meta.schedule == str(sched)
        assert len(profile.figures.step_times_ns) == 2
        assert profile.step_time_ns == sum(profile.figures.step_times_ns)
        assert module_calls(profile) == {"": 2, "0": 2, "1": 2, "2": 2}
        assert "<optimizer:Adam>" in {part.path for part in profile.parts}
        assert profile["<optimizer:Adam>"].calls == 2


# -- without a schedule ---------------------------------------------------------------


def test_every_step_is_summed_into_one_profile_without_a_schedule() -> None:
    steps = 5
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    delivered: list[Profile] = []
    loop_done = False

    def on_ready(profile: Profile) -> None:
        assert loop_done, "without a schedule the profile is delivered at block exit only"
        delivered.append(profile)

    with layerscope.Profiler(model, on_ready=on_ready) as prof:
        for _ in range(steps):
            train_step(model, opt)
            prof.step()
        loop_done = True

    assert len(delivered) == 1
    profile = check_tree(delivered[0])
    assert prof.profile is profile
    meta = profile.meta
    # Every step is timed and detailed (ops, shapes, FLOPs, memory) by one run of
    # torch's profiler: no step stands for another.
    timed = steps
    assert meta.detail_step is None and "counts_from" not in meta.to_dict() and meta.times_from is None
    assert profile.figures.step_numbers == list(range(steps))
    assert profile.figures.steps == timed
    assert len(profile.figures.step_times_ns) == timed
    assert all(t > 0 for t in profile.figures.step_times_ns)
    assert meta.step_range == [0, steps - 1]
    assert meta.complete is True
    assert meta.schedule is None
    # The step's parts and the model's phases add up to the steps' wall time exactly
    # (check_tree checks the first equality).
    total_self = sum(stats.self_cpu_time_ns for node in profile.nodes() for _, stats in node.phases())
    assert profile.step_time_ns == total_self == sum(profile.figures.step_times_ns)

    assert module_calls(profile) == {"": timed, "0": timed, "1": timed, "2": timed}
    parts = {part.path: part for part in profile.parts}
    assert {"<loss>", "<optimizer:SGD>", "<zero_grad>", "<other>"} <= set(parts)
    assert parts["<loss>"].kind == "loss"
    assert "aten::mse_loss" in {op.name for op in parts["<loss>"].ops}
    assert parts["<optimizer:SGD>"].kind == "optimizer"
    assert parts["<optimizer:SGD>"].calls == timed
    # The parameter updates: SGD adds each gradient into its parameter, one FLOP per
    # element, 8 x 16 + 16 + 16 x 4 + 4 = 212 elements, every step.
    assert parts["<optimizer:SGD>"].forward.flops == 212 * timed
    assert parts["<zero_grad>"].calls == timed
    # Each step recorded its own op rows.
    (mse,) = [op for op in parts["<loss>"].ops if op.name == "aten::mse_loss"]
    assert mse.calls == timed

    for node in profile.modules():
        assert node.backward is not None, node.path
    first, last = profile["0"], profile["2"]
    for linear in (first, last):
        assert linear.type == "Linear"
        assert linear.forward.macs > 0
        assert linear.backward.macs > 0
    # The first Linear's input needs no gradient, so its backward computes the weight
    # gradient only (as many MACs as its forward); the last one also computes its
    # input's gradient (twice its forward).
    assert first.backward.macs == first.forward.macs
    assert last.backward.macs == 2 * last.forward.macs


def test_every_iteration_has_its_loss_without_step_calls() -> None:
    # Several iterations in one block and no step() between them: each new forward after
    # backward starts an iteration, and the work between it and its backward is the loss.
    def run(iterations: int) -> Profile:
        model = mlp()
        with layerscope.Profiler(model) as prof:
            for _ in range(iterations):
                loss = model(X).pow(2).mean()
                loss.backward()
        assert prof.profile is not None
        return check_tree(prof.profile)

    def op_calls(part: Any) -> dict[tuple[str, str], int]:
        return {(op.name, op.phase): op.calls for op in part.ops}

    one, three = run(1), run(3)
    assert three.figures.steps == 1
    assert module_calls(three) == {"": 3, "0": 3, "1": 3, "2": 3}
    once = op_calls(one["<loss>"])
    assert {("aten::pow", "forward"), ("aten::mean", "forward")} <= set(once)
    assert any(phase == "backward" for _, phase in once)  # the loss's own backward
    assert op_calls(three["<loss>"]) == {key: 3 * calls for key, calls in once.items()}
    other = {op.name for part in three.parts if part.path == "<other>" for op in part.ops}
    assert not {"aten::pow", "aten::mean"} & other


# -- idle and warm-up steps ------------------------------------------------------------


class Probe(nn.Module):
    """Notes, on each call, how many global module hooks and dispatch modes are live."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int, int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(
            (
                len(nn_module._global_forward_pre_hooks),
                len(nn_module._global_forward_hooks),
                torch._C._len_torch_dispatch_stack(),
            )
        )
        return x


def test_idle_steps_install_nothing_and_warmup_steps_are_not_counted() -> None:
    torch.manual_seed(0)
    probe = Probe()
    model = nn.Sequential(nn.Linear(8, 16), probe, nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = layerscope.schedule(wait=1, warmup=1, active=2, repeat=2)
    actions = [sched(step).name for step in range(12)]
    assert actions == ["NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE"] * 2 + ["NONE"] * 4
    baseline = (
        len(nn_module._global_forward_pre_hooks),
        len(nn_module._global_forward_hooks),
        torch._C._len_torch_dispatch_stack(),
    )
    delivered: list[Profile] = []
    with layerscope.Profiler(model, schedule=sched, on_ready=delivered.append) as prof:
        for step in range(12):
            train_step(model, opt)
            if actions[step] == "WARMUP":
                train_step(model, opt)  # extra work that must not show up anywhere
            prof.step()

    calls_per_step = [1 if a != "WARMUP" else 2 for a in actions]
    assert len(probe.seen) == sum(calls_per_step) == 14
    seen = iter(probe.seen)
    for step, action in enumerate(actions):
        for _ in range(calls_per_step[step]):
            pre, post, modes = next(seen)
            if action == "NONE":
                assert (pre, post, modes) == baseline, f"step {step} is idle but profiling was on"
            else:
                # Warm-up and recorded steps run under torch's profiler: module ranges
                # from the two global hooks, and no dispatch mode (warm-up steps are
                # dropped when read back). The first such step also takes each module's
                # shapes, with one more forward hook.
                shapes = 1 if step == 1 else 0
                assert (pre, post, modes) == (baseline[0] + 1, baseline[1] + 1 + shapes, baseline[2]), step

    # Warm-up steps (1 and 5, each with two forwards) are dropped: nothing of theirs,
    # times or counts, is in a cycle's figures.
    assert [p.meta.step_range for p in delivered] == [[2, 3], [6, 7]]
    for profile in delivered:
        check_tree(profile)
        assert profile.meta.detail_step is None
        assert profile.figures.steps == 2
        assert len(profile.figures.step_times_ns) == 2
        assert module_calls(profile) == {"": 2, "0": 2, "1": 2, "2": 2, "3": 2}
        assert profile["<optimizer:SGD>"].calls == 2
        assert profile["<zero_grad>"].calls == 2
        # Shapes are read once (in warm-up step 1) and are every cycle's.
        assert (profile["0"].input_shapes, profile["0"].output_shapes) == ([[5, 8]], [5, 16])
        assert (profile["3"].input_shapes, profile["3"].output_shapes) == ([[5, 16]], [5, 4])
    assert prof.profile is delivered[-1]


def test_every_step_runs_under_torchs_profiler_and_none_under_a_mode() -> None:
    seen: list[tuple[str, bool, int]] = []

    class Spy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(("", torch.autograd._profiler_enabled(), torch._C._len_torch_dispatch_stack()))
            return x

    model = nn.Sequential(nn.Linear(8, 8), Spy())
    # Two warm-up steps, run under the profiler and dropped; two recorded steps.
    sched = layerscope.schedule(wait=0, warmup=2, active=2, repeat=1)
    with layerscope.Profiler(model, schedule=sched) as prof:
        for _ in range(4):
            model(torch.randn(2, 8)).sum().backward()
            prof.step()
    assert [(profiler, modes) for _, profiler, modes in seen] == [(True, 0)] * 4
    profile = check_tree(prof.profile)
    assert profile.figures.steps == 2 and profile.figures.step_numbers == [2, 3]
    assert profile["0"].forward.flops == 2 * (2 * 2 * 8 * 8 + 2 * 8)


def test_inside_a_users_torch_profiler_every_step_is_a_detail_step() -> None:
    # Only one torch profiler can run: inside the user's, layerscope records every step
    # with its dispatch mode, and the user's profiler keeps working.
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    with torch.profiler.profile() as theirs, layerscope.Profiler(model) as prof:
        for _ in range(3):
            model(torch.randn(2, 8)).sum().backward()
            prof.step()
    profile = check_tree(prof.profile)
    assert profile.figures.steps == 3 and profile.meta.times_from == "dispatch mode"
    assert profile[""].calls == 3
    assert any(e.name == "aten::addmm" for e in theirs.events())


# -- the last window, read on first use ------------------------------------------------


def _trained_block(model: nn.Module, steps: int = 3) -> Any:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.Profiler(model) as prof:
        for _ in range(steps):
            train_step(model, opt)
            prof.step()
    return prof


def _figures(profile: Profile) -> tuple[Any, ...]:
    """What two runs of the same steps share: module calls and FLOPs, ops and their counts."""
    return (
        module_calls(profile),
        {node.path: (node.forward.flops, node.backward and node.backward.flops) for node in profile.modules()},
        sorted((op.name, op.calls) for op in profile.ops()),
        profile.figures.steps, profile.figures.step_numbers,
    )


def test_the_block_s_last_steps_are_read_on_first_use_as_they_would_be_at_once() -> None:
    # Leaving the block stops torch's profiler and reads its last window when the profile
    # is first asked for, as torch's own profiler processes its events on first use.
    from layerscope.capture import kineto

    at_once = check_tree(_trained_block(mlp()).profile)
    prof = _trained_block(mlp())
    assert prof._later is not None and len(kineto._CLAIM._pending) == 1
    later = check_tree(prof.profile)
    assert prof._later is None and not kineto._CLAIM._pending
    assert _figures(later) == _figures(at_once)
    assert later.figures.steps == 3 and later.meta.step_range == [0, 2]


def test_a_result_left_unread_is_read_before_torch_s_profiler_runs_again() -> None:
    # Kineto runs one session per process: the next session reads the pending result
    # first, and the block's owner gets the same profile from it, in any thread.
    import threading

    from layerscope.capture import kineto

    first = _trained_block(mlp())
    layerscope.profile(mlp(), X)  # another session: the block's window is read before it starts
    assert not kineto._CLAIM._pending
    second = _trained_block(mlp())
    read: list[Profile] = []
    reader = threading.Thread(target=lambda: read.append(second.profile))
    reader.start()
    reader.join()
    assert _figures(check_tree(first.profile)) == _figures(check_tree(read[0]))


def test_the_model_s_facts_are_those_at_the_block_s_end_not_at_the_read() -> None:
    model = mlp()
    prof = _trained_block(model)
    model.eval().double()  # the user goes on with the model before reading the profile
    try:
        meta = prof.profile.meta
        assert meta.training is True and meta.dtype == "float32"
    finally:
        model.float().train()


def test_a_read_that_fails_raises_on_every_use_never_an_empty_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    from layerscope.capture import kineto

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("conversion failed")

    prof = _trained_block(mlp())
    monkeypatch.setattr(kineto, "convert_window", broken)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="conversion failed"):
            _ = prof.profile
    with pytest.raises(RuntimeError, match="conversion failed"):
        str(prof)


# -- misuse ----------------------------------------------------------------------------


def test_step_outside_a_running_block_is_refused() -> None:
    model = mlp()
    prof = layerscope.Profiler(model)
    with pytest.raises(ProfilerStateError, match=r"step\(\) called outside a running Profiler"):
        prof.step()
    with prof:
        model(X)
        prof.step()
    with pytest.raises(ProfilerStateError, match=r"step\(\)"):
        prof.step()
    # The refused calls changed nothing: one step was recorded.
    assert prof.figures.steps == 1


@pytest.mark.parametrize(
    ("bad", "named"), [({"active": 0}, "active"), ({"wait": -1}, "wait"), ({"repeat": -2}, "repeat")]
)
def test_invalid_schedules_are_value_errors(bad: dict[str, int], named: str) -> None:
    with pytest.raises(ValueError, match=rf"schedule: {named} must be an int >= "):
        layerscope.schedule(**bad)


# -- a run that raises -----------------------------------------------------------------


def test_exception_mid_step_keeps_delivered_cycles_and_the_partial_one(tmp_path: Path) -> None:
    boom = ValueError("boom")
    # One forward per step: Raiser's 8th call is step 7's forward (0-based).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Raiser(boom, raise_on=8), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handler = save_json(tmp_path)
    delivered: list[Profile] = []

    def on_ready(profile: Profile) -> None:
        delivered.append(profile)
        handler(profile)

    # Cycles as in the first test: [2, 3] is delivered at step 3; the second cycle has
    # recorded step 6 when step 7 raises halfway through its forward.
    sched = layerscope.schedule(wait=1, warmup=1, active=2, repeat=2)
    before = snapshot(model, values=False)  # the block's optimizer steps are the user's
    ran: list[int] = []
    with pytest.raises(ValueError) as excinfo:
        with layerscope.Profiler(model, schedule=sched, on_ready=on_ready) as prof:
            for step in range(12):
                ran.append(step)
                train_step(model, opt)
                prof.step()
    assert excinfo.value is boom
    assert excinfo.type is ValueError
    assert ran[-1] == 7
    # No hooks left (on the modules or global), same state_dict keys, same training
    # flags, no dispatch mode, grad mode as it was.
    assert_unchanged(before, snapshot(model, values=False))
    assert model.training

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "layerscope_steps2-3_rank0.json",
        "layerscope_steps6-7_rank0_incomplete.json",
    ]
    complete = check_tree(layerscope.load(str(tmp_path / "layerscope_steps2-3_rank0.json")))
    assert complete.meta.complete is True
    assert complete.figures.steps == 2
    assert module_calls(complete) == {"": 2, "0": 2, "1": 2, "2": 2, "3": 2}

    partial = check_tree(layerscope.load(str(tmp_path / "layerscope_steps6-7_rank0_incomplete.json")))
    assert partial.meta.complete is False
    assert partial.meta.step_range == [6, 7]
    assert partial.figures.steps == 2  # step 6 whole, step 7 up to the exception
    assert partial.step_time_ns == sum(partial.figures.step_times_ns)
    # Step 7 entered the raiser (its frame closed by the always-called hook), never the
    # last Linear.
    assert module_calls(partial) == {"": 2, "0": 2, "1": 2, "2": 2, "3": 1}
    assert [p.meta.complete for p in delivered] == [True, False]
    assert prof.profile is delivered[-1]


def test_keyboard_interrupt_leaves_delivered_files_intact(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handler = save_json(tmp_path)
    written: dict[str, str] = {}

    def on_ready(profile: Profile) -> None:
        path = handler(profile)
        written[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()

    # repeat=0: cycles of 4 forever; [2, 3] and [6, 7] are delivered, and Ctrl-C comes in
    # step 10 (the first active step of the third cycle) between its loss and backward.
    sched = layerscope.schedule(wait=1, warmup=1, active=2)
    stop = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as excinfo:
        with layerscope.Profiler(model, schedule=sched, on_ready=on_ready) as prof:
            for step in range(20):
                loss = F.mse_loss(model(X), Y)
                if step == 10:
                    raise stop
                loss.backward()
                opt.step()
                opt.zero_grad()
                prof.step()
    assert excinfo.value is stop

    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "layerscope_steps10-10_rank0_incomplete.json",
        "layerscope_steps2-3_rank0.json",
        "layerscope_steps6-7_rank0.json",
    ]
    for name in names:
        # Each file is exactly as it was written, and loads (load checks the tree too).
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == written[name]
        profile = check_tree(layerscope.load(str(tmp_path / name)))
        assert profile.meta.complete is not name.endswith("_incomplete.json")
    partial = layerscope.load(str(tmp_path / "layerscope_steps10-10_rank0_incomplete.json"))
    assert partial.figures.steps == 1
    assert module_calls(partial) == {"": 1, "0": 1, "1": 1, "2": 1}


# -- long runs -------------------------------------------------------------------------


def _container_sizes(prof: Any) -> dict[str, int]:
    """Length of every list/dict/set/tuple held by the Profiler, its recorder, its step
    accumulator and the accumulator's running totals."""
    owners = {
        "prof": prof,
        "recorder": prof._capture.assembly.recorder,
        "steps": prof._cycle.steps,
        "total": prof._cycle.steps.total,
    }
    return {
        f"{owner}.{name}": len(value)
        for owner, obj in owners.items()
        for name, value in vars(obj).items()
        if isinstance(value, (list, dict, set, frozenset, tuple))
    }


def _long_run(steps: int) -> tuple[dict[str, int], int, Profile]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(3, 4), torch.randn(3, 2)
    with layerscope.Profiler(model) as prof:
        for _ in range(steps):
            F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
        # Still inside the block: what the Profiler holds after `steps` steps (leaving
        # the block hands the totals over to the profile and starts a new accumulator).
        # Every step is folded in whenever torch's profiler is read back, at most
        # WINDOW_STEPS steps apart (the window also holds the step opened by the last
        # step() call).
        assert prof._cycle.steps.steps + len(prof._window_steps) == steps + 1
        assert len(prof._window_steps) <= WINDOW_STEPS
        sizes = _container_sizes(prof)
        sizes.pop("prof._window_steps")
        op_calls = sum(op.calls for op in prof._cycle.steps.total.ops.values()) // prof._cycle.steps.steps
    return sizes, op_calls, prof.profile


def test_long_runs_keep_running_totals_not_raw_events() -> None:
    short_sizes, short_calls, short = _long_run(50)
    long_sizes, long_calls, long = _long_run(300)
    # Only the per-step wall times grow with the run (O(steps) ints, by design); every
    # other container the Profiler holds has the same size after 50 and 300 steps: the
    # op table has one entry per (node, phase, op, shapes), not one per call.
    for sizes, steps in ((short_sizes, 50), (long_sizes, 300)):
        # Read back every WINDOW_STEPS steps (the open step counts in the window).
        read = (steps + 1) // WINDOW_STEPS * WINDOW_STEPS
        assert sizes.pop("steps.step_times_ns") == read
        assert sizes.pop("steps.step_numbers") == read
    assert long_sizes == short_sizes
    assert short_sizes["total.ops"] > 0
    assert max(long_sizes.values()) < 50
    # Every step recorded its own ops: the same rows each step.
    assert long_calls == short_calls
    for profile, steps in ((short, 50), (long, 300)):
        check_tree(profile)
        assert profile.figures.steps == steps
        assert len(profile.figures.step_times_ns) == steps
        assert profile.figures.step_numbers == list(range(steps))
        assert profile["2"].calls == steps
        assert sum(op.calls for node in profile.nodes() for op in node.ops) == steps * short_calls


# -- exact times with a fake clock -----------------------------------------------------


def test_step_times_from_a_fake_clock(fake_clock: Any) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.ones(2, 4)
    with layerscope.Profiler(model, record_ops=False, clock=fake_clock) as prof:
        model(x)
        prof.step()
        model(x)
        prof.step()
    # Every clock read advances 1000 ns; with record_ops=False the clock is read only by
    # the step marks and the module enter/exit hooks (no op mode):
    #   enter: step 0 opens                   Step    1000
    #   model(x): Enter ''  2000, Enter '0'  3000, Exit '0'  4000,
    #             Enter '1' 5000, Exit '1'   6000, Exit ''   7000
    #   step(): step 0 closes                 Step    8000  -> 8000 - 1000 = 7000
    #           step 1 opens                  Step    9000
    #   model(x): 10000 .. 15000 as above
    #   step(): step 1 closes                 Step   16000  -> 16000 - 9000 = 7000
    #           step 2 opens                  Step   17000
    #   exit:   step 2 closes                 Step   18000  (nothing ran: dropped)
    assert fake_clock.now == 18000
    profile = check_tree(prof.profile)
    assert profile.figures.steps == 2
    assert profile.figures.step_times_ns == [7000, 7000]
    assert profile.meta.step_range == [0, 1]
    assert profile.step_time_ns == 14000
    # Per step: '' spans 2000..7000 (5000 ns) of which '0' and '1' take 1000 ns each,
    # so 3000 ns self; the 2000 ns of the step outside the model are <other>.
    assert profile[""].forward.cpu_time_ns == 2 * 5000
    assert profile[""].forward.self_cpu_time_ns == 2 * 3000
    assert profile["0"].forward.cpu_time_ns == 2 * 1000
    assert profile["1"].forward.cpu_time_ns == 2 * 1000
    assert [part.path for part in profile.parts] == ["<other>"]
    assert profile["<other>"].forward.self_cpu_time_ns == 2 * 2000
    assert module_calls(profile) == {"": 2, "0": 2, "1": 2}


def test_on_ready_raising_inside_step_does_not_shift_later_steps() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(5, 8)
    got: list[list[int]] = []

    def on_ready(profile: Any) -> None:
        got.append(profile.meta.step_range)
        if len(got) == 1:
            raise OSError("disk full")

    with layerscope.Profiler(model, schedule=layerscope.schedule(active=2), on_ready=on_ready) as prof:
        for _ in range(8):
            model(x)
            try:
                prof.step()
            except OSError:
                pass
    # Cycles of 2 active steps: [0, 1], [2, 3], [4, 5], [6, 7]; the first handler call
    # failed, and the steps after it are still numbered as the loop ran them.
    assert got == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_a_step_part_has_one_spelling_everywhere() -> None:
    # The table, the step's footer line and the memory peak all say <optimizer:AdamW>.
    model = mlp()
    opt = torch.optim.AdamW(model.parameters())
    with layerscope.Profiler(model) as prof:
        with layerscope.label("data"):
            X.clone()
        train_step(model, opt)
    assert prof["<optimizer:AdamW>"].name == "<optimizer:AdamW>"
    text = prof.render("text")
    names = [line.split(" | ")[0].strip() for line in text.splitlines() if " | " in line]
    assert {"<data>", "<loss>", "<optimizer:AdamW>", "<zero_grad>", "<other>"} <= set(names)
    step_line = next(line for line in text.splitlines() if line.startswith("1 step"))
    assert "+ <optimizer:AdamW> " in step_line and "+ <loss> " in step_line
    bare = [line for line in text.splitlines() if "optimizer:AdamW" in line.replace("<optimizer:AdamW>", "")]
    assert bare == []


def test_warmup_steps_are_dropped_when_every_step_is_detailed(fake_clock: Any) -> None:
    # With a fake clock (as inside a user's torch.profiler) every step is a detail step:
    # warm-up steps are still not the cycle's.
    model = nn.Sequential(nn.Linear(4, 4))
    sched = layerscope.schedule(wait=1, warmup=1, active=2, repeat=2)
    delivered: list[Profile] = []
    with layerscope.Profiler(model, schedule=sched, clock=fake_clock, on_ready=delivered.append) as prof:
        for _ in range(8):
            model(torch.randn(2, 4))
            prof.step()
    assert [p.meta.step_range for p in delivered] == [[2, 3], [6, 7]]
    for profile in delivered:
        check_tree(profile)
        assert profile.figures.steps == 2
        assert profile[""].calls == 2
        # The shapes read in warm-up step 1 (once per block) are every cycle's.
        assert (profile["0"].input_shapes, profile["0"].output_shapes) == ([[2, 4]], [2, 4])


def test_step_spread_names_the_steps_far_from_the_median() -> None:
    # Five steps, numbered 3 to 7; step 6 did one-off work. By hand: sorted 90, 100, 105,
    # 110, 400 -> median (an observed step, the middle one) 105; interpolated (base/stats.py's
    # rule): p10 at position 0.4 = 90 + 0.4 * 10 = 94, p90 at 3.6 = 110 + 0.6 * 290 = 284.
    # Far is 1.5 x away: 400 > 157.5 is; 90 (x0.86) is not.
    model = nn.Linear(2, 2)
    with layerscope.Profiler(model) as prof:
        for _ in range(2):
            model(torch.ones(1, 2)).sum().backward()
            prof.step()
    profile = check_tree(prof.profile)
    profile.figures.step_times_ns, profile.figures.step_numbers = [100, 110, 90, 400, 105], [3, 4, 5, 6, 7]
    spread = profile.step_spread()
    assert spread is not None
    assert (spread.min_ns, spread.median_ns, spread.p10_ns, spread.p90_ns, spread.max_ns) == (90, 105, 94, 284, 400)
    assert spread.outliers == [(6, 400)]
    assert spread.steps == [(3, 100), (4, 110), (5, 90), (6, 400), (7, 105)]
    text = profile.render("text")
    assert "Step wall time over 5 steps: min 90ns, median 105ns, p90 284ns, max 400ns" in text
    assert "Steps far from the median (x1.5 or more away, in the sums above): step 6 400ns (x3.8)" in text
    profile.figures.step_times_ns = [100]
    assert profile.step_spread() is None
