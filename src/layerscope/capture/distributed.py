"""Who this process is in a distributed job: rank, world size, local rank, host and the
run id every file of one run shares. Built on ``torch.distributed`` itself.

The run id is made by rank 0 and broadcast through the default process group's
key-value store (the one its ranks met through) the first time a profiler starts, then
kept for the life of that group. Rank 0 never waits for anyone: profiling rank 0 alone
(``if rank == 0: with Profiler(...)``) cannot hang. Another rank waits for rank 0's id
up to ``RUN_ID_WAIT_S`` seconds, then makes its own and says so on stderr. Without a
store (an unusual init method) the id goes out by ``broadcast_object_list``, a
collective every rank must join. ``LAYERSCOPE_RUN_ID`` in the environment names the run
instead, with no communication at all.
"""

from __future__ import annotations

import os
import socket
import uuid
import warnings
from datetime import timedelta
from typing import Any

import torch

from layerscope.capture import _torch

RUN_ID_ENV = "LAYERSCOPE_RUN_ID"
#: How long a rank other than 0 waits for rank 0's run id.
RUN_ID_WAIT_S = 60.0
_STORE_KEY = "layerscope/run_id"

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
    ``local_rank``, ``host`` and ``run_id`` (see the module's docstring)."""
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
        agreed = _agreed[key] = _agree(dist)
    return agreed


def _agree(dist: Any) -> str:
    """Rank 0's new run id, as every rank learns it (see the module's docstring)."""
    store = default_store()
    if store is None:
        box = [new_run_id() if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])
    if dist.get_rank() == 0:
        made = new_run_id()
        store.set(_STORE_KEY, made)
        return made
    try:
        store.wait([_STORE_KEY], timedelta(seconds=RUN_ID_WAIT_S))
        return bytes(store.get(_STORE_KEY)).decode()
    except Exception:  # the store's timeout error
        made = new_run_id()
        warnings.warn(
            f"layerscope: rank {dist.get_rank()} heard no run id from rank 0 within {RUN_ID_WAIT_S:g}s "
            f"(is rank 0 profiling?); its files carry run id {made} (set {RUN_ID_ENV} to name the run)",
            RuntimeWarning,
            stacklevel=2,
        )
        return made


def default_store() -> Any:
    """The key-value store of the default process group (rendezvous), or None."""
    dist = _dist()
    if dist is None:
        return None
    try:
        return _torch.default_store()
    except Exception:
        return None
