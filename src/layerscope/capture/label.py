"""``layerscope.label``: name a region of code so it appears as a node in the profile."""

from __future__ import annotations

from contextlib import ContextDecorator
from typing import Any

import torch


class label(ContextDecorator):
    """Name a region of code; it appears in the profile as a node where it ran.

    Works as a context manager (``with layerscope.label("data"): ...``) or a decorator
    (``@layerscope.label("loss")``). It is a ``torch.profiler.record_function`` range, so
    torch.profiler traces show it too, and layerscope reads ``record_function`` ranges
    written directly the same way. Inside a module it becomes a child of that module
    (path ``"encoder[name]"``); outside the model, a top-level part of the step
    (``"<name>"``). Outside a profiler it costs one dispatcher call.
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"label needs a non-empty string name, got {name!r}")
        if any(c in name for c in "[]<>"):
            raise ValueError(f"label names cannot contain [ ] < > (they delimit labels in paths), got {name!r}")
        self.name = name
        self._open: list[Any] = []

    def __enter__(self) -> label:
        rf = torch.autograd.profiler.record_function(self.name)
        rf.__enter__()
        self._open.append(rf)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._open.pop().__exit__(*exc_info)
