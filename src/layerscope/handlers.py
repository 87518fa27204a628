"""Ready-made ``on_ready`` callbacks for a scheduled ``Profiler``.

Each cycle's profile is handed to ``on_ready`` as soon as the cycle's last active step
ends, so a long job delivers as it goes: a crash or Ctrl-C later keeps every file
already written (files are written atomically).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from layerscope.model.tree import Profile


def cycle_file_name(profile: Profile, prefix: str = "layerscope", suffix: str = ".json") -> str:
    """``layerscope_steps12-14_rank0.json``: the step range and rank of the cycle, so the
    files of one run, or of many ranks writing to one folder, never overwrite each other.
    A cycle cut short (the run stopped or raised mid-cycle) ends in ``_incomplete``."""
    meta = profile.meta
    first, last = (meta.step_range or [0, 0])[:2]
    rank = meta.rank or 0
    tail = "" if meta.complete is not False else "_incomplete"
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


def gather(
    folder: str | os.PathLike[str], *, timeout: float = 300.0, prefix: str = "layerscope"
) -> Callable[[Profile], Path | None]:
    """``on_ready`` that collects each cycle's profile from every rank on rank 0, which
    merges them (:func:`layerscope.merge`) into one ``layerscope-ranks/1`` file in
    ``folder``, ``{prefix}_steps{a}-{b}_ranks.json``; rank 0's handler returns its path,
    the others' None. Outside a process group the one profile is merged alone.

    Each rank hands its profile to the process group's key-value store (the one its
    ranks met through) and goes on at once; rank 0 waits for the others' up to
    ``timeout`` seconds per cycle. A rank that never sends (it died, or is far behind)
    holds no one up past that: rank 0 writes what arrived, the document names the ranks
    missing, and a ``RuntimeWarning`` says so. Every rank must use ``gather`` (a rank that
    does not is reported missing after ``timeout``).
    """
    if not timeout > 0:
        raise ValueError(f"gather: timeout must be a positive number of seconds, got {timeout!r}")
    target = Path(folder)
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"gather needs a folder to write merged profiles into; {str(target)!r} is a file")

    def handler(profile: Profile) -> Path | None:
        from layerscope.capture.distributed import default_store

        meta = profile.meta
        first, last = (meta.step_range or [0, 0])[:2]
        rank, world = meta.rank or 0, meta.world_size or 1
        store = default_store() if world > 1 else None
        key = f"layerscope/{meta.run_id or ''}/steps{first}-{last}"
        if store is not None and rank != 0:
            store.set(f"{key}/rank{rank}", json.dumps(profile.to_dict(), separators=(",", ":")))
            return None
        profiles, missing = [profile], []
        if store is not None:
            profiles, missing = _collect(store, key, profile, world, timeout)
        target.mkdir(parents=True, exist_ok=True)
        path = target / f"{prefix}_steps{first}-{last}_ranks.json"
        _save_merged(profiles, path)
        if missing:
            warnings.warn(
                f"layerscope: gather: rank{'s' * (len(missing) > 1)} {', '.join(map(str, missing))} of {world} "
                f"sent no profile for steps {first}-{last} within {timeout:g}s; wrote the "
                f"{len(profiles)} that arrived to {path} (missing ranks named there)",
                RuntimeWarning,
                stacklevel=2,
            )
        return path

    return handler


def _collect(store: Any, key: str, mine: Profile, world: int, timeout: float) -> tuple[list[Profile], list[int]]:
    """Rank 0's side of :func:`gather`: the other ranks' profiles as they arrive, until
    ``timeout`` seconds have passed."""
    from datetime import timedelta

    from layerscope.model.documents import profile_from_dict

    profiles, missing = [mine], []
    deadline = time.monotonic() + timeout
    for rank in range(1, world):
        name = f"{key}/rank{rank}"
        left = deadline - time.monotonic()
        try:
            store.wait([name], timedelta(seconds=max(left, 0.001)))
        except Exception:  # the store says "timeout" with a RuntimeError subclass
            missing.append(rank)
            continue
        data = store.get(name)
        store.delete_key(name)
        profiles.append(profile_from_dict(json.loads(data), source=f"rank {rank}'s profile"))
    return profiles, missing


def _save_merged(profiles: list[Profile], path: Path) -> None:
    from layerscope.model.ranks import merge

    merge(profiles).save(str(path), fmt="json")
