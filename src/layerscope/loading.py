"""``layerscope.load``: any file layerscope reads, told by its content.

A saved profile (``layerscope/1``) or a merged run (``layerscope-ranks/1``) is read by
:mod:`layerscope.documents`; a torch.profiler trace (Kineto's Chrome-trace JSON, plain or
gzip) is turned into a profile by :mod:`layerscope.traces` (which imports torch, so only
when the file is one).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from layerscope import documents
from layerscope.traces.reader import is_kineto_trace

if TYPE_CHECKING:
    from layerscope.ranks import MergedRun
    from layerscope.tree import Profile


def load(path: str | os.PathLike[str], *, model: Any = None) -> Profile | MergedRun:
    """Read a profile saved as JSON (a :class:`~layerscope.tree.Profile`), a merged run of
    ranks (``layerscope-ranks/1``, a :class:`~layerscope.ranks.MergedRun`), or a
    torch.profiler trace file (``.json`` or ``.json.gz``, as Kineto writes it) as a
    profile; a clear :class:`~layerscope.errors.SchemaError` for anything else (a gzip
    file is read as a trace, so a damaged one is said to be a damaged trace).

    ``model`` (an ``nn.Module``, only read, never run) gives a trace's modules their paths
    in it and their parameters; a saved profile has both already (docs/traces.md).
    """
    if is_kineto_trace(path) or _is_gzip(path):
        from layerscope.traces.load import load_trace

        if model is None:
            return load_trace(path)
        from layerscope.capture.modules import traced_model

        return load_trace(path, model=traced_model(model))
    if model is not None:
        raise ValueError(
            f"model= maps the modules of a torch.profiler trace file; {os.fspath(path)!r} is not one "
            "(a saved layerscope profile has its module paths already)"
        )
    return documents.load(path)


def _is_gzip(path: str | os.PathLike[str]) -> bool:
    """A gzip file: layerscope writes none, torch.profiler's handlers do (``.json.gz``), so
    one that is not readable as a trace is a damaged trace, and said so."""
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"\x1f\x8b"
    except OSError:
        return False
