"""The ranks of one run in one Chrome trace, for Perfetto: one process per rank
(``pid`` = the rank, named ``rank N``), each drawn by ``render/chrome.py`` from that
rank's own trace. Each rank's clock starts at its own step, so the ranks line up at 0.

Drawn from the rank files (a :class:`~layerscope.model.ranks.RankTraces`), not from a merged
document, which keeps no traces. Profiles are read one at a time as the document is
written, so the traces of many ranks never sit in memory together.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from layerscope.base.errors import RenderError
from layerscope.base.formats import register_renderer
from layerscope.base.version import __version__
from layerscope.model.ranks import RankTraces
from layerscope.render.chrome import document, process_events, timing_metadata


def _processes(traces: RankTraces, measured: dict[str, Any]) -> Iterator[str]:
    for profile in traces.profiles:
        rank = profile.meta.rank
        if not isinstance(rank, int):
            raise RenderError("a rank file has no rank in its meta: one process per rank needs it")
        if not measured:
            # The ranks ran the same steps: the first rank's says how all were measured.
            measured.update(model=str(profile.meta.model or profile.root.type), **timing_metadata(profile))
        try:
            yield from process_events(profile, rank, f"rank {rank}")
        except RenderError as exc:
            raise RenderError(f"rank {rank}: {exc}") from None


@register_renderer(
    "chrome", document="rank-traces", extensions=(".trace.json",), chunks=True,
    description="a Chrome trace / Perfetto JSON with one process per rank",
)
def render_rank_traces(traces: RankTraces) -> Iterator[str]:
    measured: dict[str, Any] = {}
    events = _processes(traces, measured)
    first = next(events, None)  # a rank without a trace is refused before anything is written
    if first is None:
        raise RenderError("no rank files to draw")
    other = {"layerscope_version": __version__, **measured, "processes": "one per rank (pid = rank)"}
    yield from document(itertools.chain([first], events), other)

