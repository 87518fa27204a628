"""The ``Profiler`` block's faces: the block itself (``layerscope.block``), which knows no
name of torch.profiler's, ``layerscope.Profiler`` (the block with torch.profiler's names,
``compat/torch_profiler.py``), and the block's reading of its profile: explicit
delegates, every other name of a Profile an AttributeError that says where it is.

A fake clock, so each block runs under the dispatch mode in milliseconds.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity

import layerscope
from conftest import FakeClock
from layerscope import block
from layerscope.base.errors import ProfilerStateError
from layerscope.compat import torch_profiler
from layerscope.model.tree import Profile

#: What torch.profiler's recipe adds to the block: arguments and reading calls.
TORCH_ARGUMENTS = ("activities", "record_shapes", "profile_memory", "on_trace_ready")
TORCH_CALLS = ("step_num", "key_averages", "export_chrome_trace", "export_stacks")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _run(profiler: type[block.Profiler] = layerscope.Profiler, **options: Any) -> block.Profiler:
    model = _model()
    with profiler(model, clock=FakeClock(), **options) as prof:
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
            prof.step()
    return prof


def test_layerscope_profiler_is_the_block_with_torch_profiler_s_names() -> None:
    assert layerscope.Profiler is torch_profiler.Profiler
    assert issubclass(layerscope.Profiler, block.Profiler)
    ours = inspect.signature(block.Profiler).parameters
    theirs = inspect.signature(layerscope.Profiler).parameters
    assert [name for name in theirs if name not in ours] == list(TORCH_ARGUMENTS)
    assert all(theirs[name] == ours[name] for name in ours)  # the same defaults and kinds
    for name in TORCH_CALLS:
        assert not hasattr(block.Profiler, name) and hasattr(layerscope.Profiler, name)


def test_the_block_refuses_torch_profiler_s_arguments() -> None:
    with pytest.raises(TypeError, match="activities"):
        block.Profiler(_model(), activities=[ProfilerActivity.CPU])  # type: ignore[call-arg]


def test_the_block_and_the_drop_in_build_the_same_profile() -> None:
    plain, drop_in = _run(block.Profiler), _run(activities=[ProfilerActivity.CPU], record_shapes=True)
    assert plain.to_dict() == drop_in.to_dict()
    assert drop_in.step_num == 2 and drop_in.key_averages()[0].key


def test_each_reading_name_is_the_profile_s_own() -> None:
    """Every delegate is written out on the block, with the Profile's signature."""
    for name in block.PROFILE_NAMES:
        ours, theirs = inspect.getattr_static(block.Profiler, name), inspect.getattr_static(Profile, name, None)
        assert name in vars(block.Profiler), name
        if callable(ours):
            assert inspect.signature(ours) == inspect.signature(theirs), name
        else:
            assert isinstance(ours, property), name


def test_the_delegates_read_the_profile() -> None:
    prof = _run()
    profile = prof.profile
    for name in ("root", "meta", "parts", "memory", "trace", "param_bytes"):
        assert getattr(prof, name) is getattr(profile, name), name
    assert prof.step_time_ns == profile.step_time_ns and prof.step_time_ns is not None
    assert prof.node("0") is profile.node("0") is prof["0"]
    assert list(prof.nodes()) == list(profile.nodes()) and list(prof.modules()) == list(profile.modules())
    assert prof.ops(sort_by="flops", group_by="shape").rows == profile.ops(sort_by="flops", group_by="shape").rows
    assert prof.unsupported_ops() == profile.unsupported_ops()
    assert prof.step_spread(far=1.1) == profile.step_spread(far=1.1)
    assert prof.render("text", depth=1) == profile.render("text", depth=1) and str(prof) == str(profile)
    assert prof.to_dict() == profile.to_dict()


def test_the_profile_s_other_names_say_where_they_are() -> None:
    prof = _run()
    others = sorted({name for name in dir(Profile) if not name.startswith("_")} - set(block.PROFILE_NAMES))
    assert others == ["DOCUMENT", "compiled", "device", "from_dict", "has_backward", "pass_spread", "timed", "totals"]
    for name in others:
        with pytest.raises(AttributeError, match=rf"no attribute '{name}'; read it from the profile: prof.profile.{name}$"):
            getattr(prof, name)
        getattr(prof.profile, name)
    with pytest.raises(AttributeError) as found:
        prof.no_such_name  # noqa: B018
    assert str(found.value) == "'Profiler' object has no attribute 'no_such_name'"


def test_before_the_block_ends_the_delegates_say_why_and_other_names_are_absent() -> None:
    model = _model()
    prof = layerscope.Profiler(model, clock=FakeClock())
    with pytest.raises(ProfilerStateError, match="not started"):
        prof.render()
    with prof:
        model(torch.randn(3, 4))
        with pytest.raises(ProfilerStateError, match="still running"):
            prof.meta  # noqa: B018
        assert not hasattr(prof, "compiled")  # an AttributeError, not the state's error
    assert prof.figures.steps == 1


def _autocast_steps(under: list[bool], **options: Any) -> layerscope.Profile:
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(4, 16)
    with layerscope.Profiler(model, **options) as prof:
        for amp in under:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                y = model(x)
            y.float().sum().backward()
            prof.step()
    return prof.profile


def test_autocast_entered_inside_the_steps_is_the_blocks_autocast() -> None:
    # The usual training loop enters autocast around the forward, inside each step: the
    # block sees it from the model's own pre-hook, and the header says so.
    profile = _autocast_steps([True, True])
    assert profile.meta.autocast == "bfloat16"
    assert "autocast bfloat16" in profile.render("text").splitlines()[0]
    # Steps that mixed autocast and not name none (the model's dtype stands).
    assert _autocast_steps([True, False]).meta.autocast is None
    assert _autocast_steps([False, False]).meta.autocast is None
    # A user's peak is theirs, whatever the dtype.
    assert _autocast_steps([True], peak_tflops=1.5).meta.peak_flops_per_s == 1.5e12
