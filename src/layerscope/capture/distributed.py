"""Who this process is in a distributed job: rank, world size, local rank, host and the
run id every file of one run shares. Built on ``torch.distributed`` itself.

The run id is made by rank 0 and broadcast over the default process group the first
time a profiler starts in it (every rank enters its ``Profiler`` at the same point of
the same script, as for any collective), then kept for the life of that group, so later
blocks of the run need no collective. ``LAYERSCOPE_RUN_ID`` in the environment names
the run instead, with no collective at all (for a job that profiles some ranks only).
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import torch

RUN_ID_ENV = "LAYERSCOPE_RUN_ID"

#: The run id agreed in each default process group, by the group's id.
_agreed: dict[int, str] = {}


def _dist() -> Any:
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def rank() -> int:
    """This process's rank in a distributed job (0 when there is none)."""
    dist = _dist()
    if dist is not None:
        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0") or 0)


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def identity() -> dict[str, Any]:
    """``rank``, and inside an initialised process group also ``world_size``,
    ``local_rank``, ``host`` and ``run_id`` (a collective the first time; see the
    module's docstring)."""
    dist = _dist()
    if dist is None:
        return {"rank": rank()}
    found = {
        "rank": int(dist.get_rank()),
        "world_size": int(dist.get_world_size()),
        "local_rank": int(os.environ.get("LOCAL_RANK", dist.get_rank()) or 0),
        "host": socket.gethostname(),
    }
    found["run_id"] = run_id()
    return found


def run_id() -> str:
    """The run id of this job (see the module's docstring)."""
    named = os.environ.get(RUN_ID_ENV)
    if named:
        return named
    dist = _dist()
    if dist is None:
        return new_run_id()
    group = dist.group.WORLD
    key = id(group)
    agreed = _agreed.get(key)
    if agreed is None:
        box = [new_run_id() if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        agreed = _agreed[key] = str(box[0])
    return agreed


def default_store() -> Any:
    """The key-value store of the default process group (rendezvous), or None."""
    dist = _dist()
    if dist is None:
        return None
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:
        return None
