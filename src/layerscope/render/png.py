"""Pictures: a profile's memory timeline and a benchmark's curves, as PNG (matplotlib).

``-o memory.png`` on a profile draws its memory over the step (as ``layerscope
plot-memory`` does); on a benchmark, latency, throughput and peak memory against batch
size. Binary formats: written to files only. The drawing lives in ``layerscope.render.plot``;
this registers it, so ``.png`` is one more extension the registry knows.
"""

from __future__ import annotations

from typing import Any

from layerscope.base.errors import MissingDependencyError, RenderError
from layerscope.base.formats import register_renderer
from layerscope.render.options import TITLE


@register_renderer(
    "png", extensions=(".png",), binary=True, options=(TITLE,),
    description="the memory timeline of the step as a PNG picture (needs matplotlib)",
)
def render_profile_png(profile: Any, *, title: str | None = None) -> bytes:
    from layerscope.render.plot import render_memory_png

    try:
        return render_memory_png(profile, title=title)
    except MissingDependencyError:
        raise  # as it is: the CLI names the command that asked for the picture
    except ValueError as exc:  # no timeline recorded
        raise RenderError(str(exc)) from None


@register_renderer(
    "png", document="bench", extensions=(".png",), binary=True, options=(TITLE,),
    description="latency, throughput and peak memory against batch size as a PNG picture (needs matplotlib)",
)
def render_bench_png(result: Any, *, title: str | None = None) -> bytes:
    from layerscope.render.plot import render_bench_png as draw

    return draw(result, title=title)
