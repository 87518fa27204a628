"""The ``Profiler`` block's faces: the block itself (``layerscope.block``), which knows no
name of torch.profiler's, and ``layerscope.Profiler`` (the block with torch.profiler's
names, ``compat/torch_profiler.py``).

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
from layerscope.compat import torch_profiler

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
