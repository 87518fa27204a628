"""Renderers: pure functions from a document to its text (or bytes), one file each.

Each file registers its formats in the output registry (:mod:`layerscope.base.formats`,
re-exported here) with ``@register_renderer``; importing this package loads them all,
and ``import layerscope`` does. Adding a format is one new file with a
``@register_renderer`` line, plus its name in the list below.
"""

from __future__ import annotations

from layerscope.base.formats import (
    Option,
    Renderer,
    document_kind,
    format_for_path,
    formats,
    get_renderer,
    register_renderer,
    render,
    render_chunks,
    renderers,
    save,
)

__all__ = [
    "Option",
    "Renderer",
    "document_kind",
    "format_for_path",
    "formats",
    "get_renderer",
    "register_renderer",
    "render",
    "render_chunks",
    "renderers",
    "save",
]

# The built-in formats, in the order they are listed; each module registers itself.
from layerscope.render import (  # noqa: F401, I001
    text,
    json_doc,
    csv_table,
    ops_table,
    model,
    torchprof,
    deepspeed,
    chrome,
    folded,
    speedscope,
    html,
    kernels,
    ranks_text,
    ranks_html,
    ranks_chrome,
    diff_text,
    diff_html,
    bench_text,
    bench_html,
    png,
    notebook,
)
