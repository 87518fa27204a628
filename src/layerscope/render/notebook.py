"""How a document's report shows in a notebook (``_repr_html_``, through
:func:`layerscope.base.formats.display_html`): its ``html`` page, whole, in a sandboxed frame.
"""

from __future__ import annotations

from html import escape as escape_html

from layerscope.base.formats import register_notebook_frame

#: The height of a report's frame in a notebook: the report scrolls inside it, and the
#: frame's lower edge can be dragged.
NOTEBOOK_FRAME_HEIGHT_PX = 600


@register_notebook_frame
def notebook_frame(page: str, height_px: int = NOTEBOOK_FRAME_HEIGHT_PX) -> str:
    """``page``, a whole HTML document, as a notebook output: an ``<iframe>`` with the
    page escaped into ``srcdoc`` and sandboxed to run its own script only.

    The report is a page with its own Content-Security-Policy and one inline script. Put
    into the notebook's DOM, its policy would not apply, its ids and styles would mix with
    the notebook's (and with another report's in the same notebook), and front ends that
    sanitize HTML would drop its script. In ``srcdoc`` it is a document of its own, so its
    policy holds and nothing is fetched; ``sandbox="allow-scripts"`` without
    ``allow-same-origin`` gives it an opaque origin: it cannot reach the notebook, its
    storage or its kernel, open windows or navigate the notebook away."""
    return (
        '<iframe class="layerscope-report" title="layerscope report" sandbox="allow-scripts" '
        f'style="width: 100%; height: {height_px}px; border: 1px solid #d0d7de; resize: vertical; overflow: auto" '
        f'srcdoc="{escape_html(page, quote=True)}"></iframe>'
    )
