"""layerscope.schedule: same step-by-step actions as torch.profiler.schedule, stricter arguments."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch.profiler

from layerscope.base.schedule import Action, Schedule, schedule

N_STEPS = 60

# (wait, warmup, active, repeat, skip_first)
SETTINGS = [
    (0, 0, 1, 0, 0),  # every step is its own cycle
    (0, 0, 1, 3, 0),
    (1, 1, 1, 0, 0),
    (1, 1, 2, 1, 1),
    (1, 1, 3, 2, 0),
    (2, 1, 3, 2, 5),
    (0, 1, 2, 0, 0),  # wait=0
    (3, 0, 2, 0, 0),  # warmup=0
    (3, 0, 2, 4, 2),
    (0, 0, 5, 2, 0),  # wait=0, warmup=0
    (2, 2, 1, 0, 3),  # active=1
    (5, 1, 1, 3, 0),
    (0, 3, 4, 1, 10),
    (1, 2, 3, 0, 7),
    (4, 4, 4, 5, 1),  # 5 cycles of 12 steps run past step 59
    (10, 5, 20, 0, 0),  # large
    (20, 10, 30, 1, 0),  # one cycle is exactly 60 steps
    (7, 3, 11, 2, 13),
    (0, 0, 1, 0, 100),  # skip_first beyond the tested range
    (1000, 1000, 1000, 3, 0),
    (2, 3, 4, 1, 59),
]


def _torch_actions(wait: int, warmup: int, active: int, repeat: int, skip_first: int) -> list[Action]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns when warmup=0
        fn = torch.profiler.schedule(
            wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first
        )
    return [Action[fn(step).name] for step in range(N_STEPS)]


def test_action_members_match_torch() -> None:
    # torch 2.13 also has DEVICE_STOPPED, set internally by its profiler and never returned
    # by a schedule; the four schedule actions match by name and value.
    torch_actions = {a.name: a.value for a in torch.profiler.ProfilerAction}
    assert {a.name: torch_actions[a.name] for a in Action} == {a.name: a.value for a in Action}
    assert set(torch_actions) - {a.name for a in Action} <= {"DEVICE_STOPPED"}


@pytest.mark.parametrize(("wait", "warmup", "active", "repeat", "skip_first"), SETTINGS)
def test_matches_torch(wait: int, warmup: int, active: int, repeat: int, skip_first: int) -> None:
    sched = schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
    ours = [sched(step) for step in range(N_STEPS)]
    assert ours == _torch_actions(wait, warmup, active, repeat, skip_first)


N, W, R, S = Action.NONE, Action.WARMUP, Action.RECORD, Action.RECORD_AND_SAVE


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"wait": 1, "warmup": 1, "active": 2, "repeat": 1, "skip_first": 1},
            [N, N, W, R, S, N, N, N, N, N, N, N],
        ),
        (
            {"wait": 0, "warmup": 1, "active": 1, "repeat": 0},
            [W, S, W, S, W, S, W, S, W, S, W, S],
        ),
        (
            {"wait": 2, "warmup": 0, "active": 3, "repeat": 2, "skip_first": 2},
            [N, N, N, N, R, R, S, N, N, R, R, S, N, N, N, N],
        ),
        ({}, [S] * 12),  # defaults: every step recorded and saved
    ],
)
def test_literal_sequences(kwargs: dict[str, int], expected: list[Action]) -> None:
    sched = schedule(**kwargs)
    assert [sched(step) for step in range(len(expected))] == expected


def test_defaults_and_fields() -> None:
    sched = schedule()
    assert sched == Schedule(wait=0, warmup=0, active=1, repeat=0, skip_first=0)
    assert sched.cycle_length == 1
    sched = schedule(wait=2, warmup=3, active=4, repeat=5, skip_first=6)
    assert (sched.wait, sched.warmup, sched.active, sched.repeat, sched.skip_first) == (2, 3, 4, 5, 6)
    assert sched.cycle_length == 9
    assert sched.end == 6 + 5 * 9
    assert schedule(repeat=0).end is None


def test_frozen() -> None:
    sched = schedule(active=2)
    with pytest.raises(AttributeError):
        sched.active = 3  # type: ignore[misc]


def test_keyword_only() -> None:
    with pytest.raises(TypeError):
        schedule(1, 1, 1)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("wait", -1, ">= 0"),
        ("warmup", -2, ">= 0"),
        ("active", 0, ">= 1"),
        ("active", -1, ">= 1"),
        ("repeat", -1, ">= 0"),
        ("skip_first", -5, ">= 0"),
        ("wait", 1.0, "an int"),
        ("active", 2.5, "an int"),
        ("repeat", float("nan"), "an int"),
        ("active", True, "an int"),
        ("skip_first", False, "an int"),
        ("warmup", "1", "an int"),
        ("active", None, "an int"),
    ],
)
def test_invalid_arguments(name: str, value: object, expected: str) -> None:
    with pytest.raises(ValueError, match=r"^schedule: ") as info:
        schedule(**{name: value})  # type: ignore[arg-type]
    msg = str(info.value)
    assert f"{name} must be" in msg
    assert expected in msg
    assert msg.endswith(f"got {value!r}")


def test_active_zero_message() -> None:
    with pytest.raises(ValueError) as info:
        schedule(active=0)
    assert str(info.value) == (
        "schedule: active must be an int >= 1 (the number of measured steps per cycle), got 0"
    )


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ValueError, match="wait"):
        Schedule(wait=-1)


@pytest.mark.parametrize("step", [-1, -100, 1.0, True, "3", None])
def test_invalid_step(step: object) -> None:
    sched = schedule(active=2, repeat=1)
    with pytest.raises(ValueError, match=r"step must be an int >= 0"):
        sched(step)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"step must be an int >= 0"):
        sched.done(step)  # type: ignore[arg-type]


def test_done_with_repeat() -> None:
    sched = schedule(wait=1, warmup=1, active=2, repeat=2, skip_first=3)  # cycles end at step 3 + 8
    assert [sched.done(step) for step in range(14)] == [False] * 11 + [True] * 3
    assert sched(10) is Action.RECORD_AND_SAVE
    assert sched.done(10**9)


def test_done_never_with_repeat_zero() -> None:
    sched = schedule(wait=1, warmup=1, active=2, repeat=0, skip_first=3)
    assert not any(sched.done(step) for step in range(1000))
    assert not sched.done(10**12)


@pytest.mark.parametrize(("wait", "warmup", "active", "repeat", "skip_first"), SETTINGS)
def test_done_means_idle_from_then_on(
    wait: int, warmup: int, active: int, repeat: int, skip_first: int
) -> None:
    sched = schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)
    steps = range(3 * N_STEPS)
    flags = [sched.done(step) for step in steps]
    # Once done, always done, and every step from then on is NONE.
    first = flags.index(True) if True in flags else len(flags)
    assert flags == [False] * first + [True] * (len(flags) - first)
    assert all(sched(step) is Action.NONE for step in steps[first:])
    if repeat:
        assert first == min(skip_first + repeat * (wait + warmup + active), len(flags))
        # The step before the end is the last cycle's save.
        if 0 < first < len(flags):
            assert sched(first - 1) is Action.RECORD_AND_SAVE
    else:
        assert first == len(flags)


def test_str_describes_cycle() -> None:
    text = str(schedule(wait=1, warmup=2, active=3, repeat=2, skip_first=4))
    assert text == "skip 4 steps, then (wait 1, warm up 2, record 3) 2 times, then idle from step 16"
    assert str(schedule(wait=1, warmup=1, active=1)) == "cycles of (wait 1, warm up 1, record 1) forever"
    assert "once" in str(schedule(repeat=1))
    assert Schedule.__doc__ is not None and "repeat=0" in Schedule.__doc__


def test_module_does_not_import_torch() -> None:
    code = "import sys, layerscope.base.schedule; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
