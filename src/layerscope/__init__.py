"""layerscope: where do the time, memory and FLOPs of a PyTorch model go?

Quick start::

    import layerscope
    prof = layerscope.profile(model, x)       # warm-up, median of measured passes
    print(prof)                               # the module tree
    prof["encoder.layer.0"].forward.cpu_time_ns
    prof.save("profile.json")                 # layerscope.load("profile.json")

The library prints nothing unless asked; ``import layerscope`` does not import torch
until a profiling entry point is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from layerscope.base.version import __version__ as __version__

__all__ = [
    "BenchResult",
    "InvariantError",
    "LayerscopeError",
    "ModuleNode",
    "OpStats",
    "PhaseStats",
    "Profile",
    "Profiler",
    "benchmark",
    "check_tree",
    "count_flops",
    "diff",
    "label",
    "load",
    "merge",
    "profile",
    "register_flops",
    "schedule",
]

# The built-in formats register themselves in the output registry (layerscope.base.formats).
import layerscope.render  # noqa: F401
from layerscope.base import moved
from layerscope.base.errors import LayerscopeError
from layerscope.base.schedule import schedule
from layerscope.loading import load
from layerscope.model.bench import BenchResult
from layerscope.model.check import InvariantError, check_tree
from layerscope.model.diff import diff
from layerscope.model.ranks import merge
from layerscope.model.tree import ModuleNode, OpStats, PhaseStats, Profile

moved.install()

if TYPE_CHECKING:
    from layerscope.bench.measure import benchmark
    from layerscope.capture.label import label
    from layerscope.compat.torch_profiler import Profiler
    from layerscope.flops import register_flops
    from layerscope.session import count_flops, profile


def __getattr__(name: str) -> Any:
    # The capture layer imports torch: load it on first use, so reading and rendering
    # saved profiles (`layerscope show`) stays fast and torch-free.
    if name in ("profile", "count_flops"):
        from layerscope import session

        return getattr(session, name)
    if name == "Profiler":
        # The block with torch.profiler's names too: the one users import.
        from layerscope.compat.torch_profiler import Profiler

        return Profiler
    if name == "benchmark":
        from layerscope.bench.measure import benchmark

        return benchmark
    if name == "handlers":
        import layerscope.handlers

        return layerscope.handlers
    if name == "label":
        from layerscope.capture.label import label

        return label
    if name == "register_flops":
        from layerscope.flops import register_flops

        return register_flops
    raise AttributeError(f"module 'layerscope' has no attribute {name!r}")
