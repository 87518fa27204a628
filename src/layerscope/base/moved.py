"""Modules that moved into the layer packages (``base/``, ``model/``, ...) still import
under their old names, with a ``DeprecationWarning`` naming the new one: code written
against ``layerscope.tree`` or ``layerscope.fmt`` keeps working while it moves over.

The old name is a module of its own whose attributes are the new module's (the same
objects: ``layerscope.tree.Profile is layerscope.model.tree.Profile``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

#: Old module name -> the module it is now.
MOVED: dict[str, str] = {
    "layerscope.errors": "layerscope.base.errors",
    "layerscope.fmt": "layerscope.base.fmt",
    "layerscope.io": "layerscope.base.io",
    "layerscope.formats": "layerscope.base.formats",
    "layerscope.comm": "layerscope.base.comm",
    "layerscope.stats": "layerscope.base.stats",
    "layerscope.intervals": "layerscope.base.intervals",
    "layerscope.peaks": "layerscope.base.peaks",
    "layerscope.traces.reader": "layerscope.base.kineto_json",
    "layerscope.tree": "layerscope.model.tree",
    "layerscope.ops": "layerscope.model.ops",
    "layerscope.sidedocs": "layerscope.model.sidedocs",
    "layerscope.compile_info": "layerscope.model.compile_info",
    "layerscope.check": "layerscope.model.check",
    "layerscope.schema": "layerscope.model.schema",
    "layerscope.transforms": "layerscope.model.transforms",
    "layerscope.ranks": "layerscope.model.ranks",
    "layerscope.documents": "layerscope.model.documents",
    "layerscope.raw": "layerscope.model.raw",
    "layerscope.runfacts": "layerscope.model.runfacts",
    "layerscope.bench.result": "layerscope.model.bench",
    "layerscope.plot": "layerscope.render.plot",
    "layerscope.specs": "layerscope.zoo.specs",
}
# ``layerscope.diff`` and ``layerscope.schedule`` are the functions of those names: their
# modules are ``layerscope.model.diff`` and ``layerscope.base.schedule``.


class _Moved(types.ModuleType):
    """An old module name: every attribute read from the module it is now."""

    def __init__(self, name: str, now: str) -> None:
        super().__init__(name, f"Moved to {now}.")
        self.__now = now

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self.__now), attr)

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(self.__now))


class _Loader(importlib.abc.Loader):
    def __init__(self, now: str) -> None:
        self.now = now

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warnings.warn(
            f"{spec.name} is {self.now} now: import it from there ({spec.name} will stop working in a later release)",
            DeprecationWarning, stacklevel=2,
        )
        return _Moved(spec.name, self.now)

    def exec_module(self, module: types.ModuleType) -> None:
        importlib.import_module(self.now)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        now = MOVED.get(fullname)
        return None if now is None else importlib.machinery.ModuleSpec(fullname, _Loader(now))


def install() -> None:
    """Let the old names import (once per process)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
