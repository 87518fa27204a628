"""Ready-made ``on_ready`` callbacks for a scheduled ``Profiler``.

Each cycle's profile is handed to ``on_ready`` as soon as the cycle's last active step
ends, so a long job delivers as it goes: a crash or Ctrl-C later keeps every file
already written (files are written atomically).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from layerscope.tree import Profile


def cycle_file_name(profile: Profile, prefix: str = "layerscope", suffix: str = ".json") -> str:
    """``layerscope_steps12-14_rank0.json``: the step range and rank of the cycle, so the
    files of one run, or of many ranks writing to one folder, never overwrite each other.
    A cycle cut short (the run stopped or raised mid-cycle) ends in ``_incomplete``."""
    meta = profile.meta
    first, last = (meta.get("step_range") or [0, 0])[:2]
    rank = meta.get("rank", 0)
    tail = "" if meta.get("complete", True) else "_incomplete"
    return f"{prefix}_steps{first}-{last}_rank{rank}{tail}{suffix}"


def save_json(folder: str | os.PathLike[str], *, prefix: str = "layerscope") -> Callable[[Profile], Path]:
    """``on_ready`` that writes each cycle's profile as ``layerscope/1`` JSON into
    ``folder`` (created if missing) and returns the file's path."""
    target = Path(folder)
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"save_json needs a folder to write profiles into; {str(target)!r} is a file")

    def handler(profile: Profile) -> Path:
        target.mkdir(parents=True, exist_ok=True)
        path = target / cycle_file_name(profile, prefix)
        profile.save(str(path), fmt="json")
        return path

    return handler


def print_table(**options: Any) -> Callable[[Profile], None]:
    """``on_ready`` that prints each cycle's text table (``options`` as for ``render``,
    e.g. ``depth=2``)."""

    def handler(profile: Profile) -> None:
        print(profile.render("text", **options))

    return handler
