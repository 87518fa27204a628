"""Renderers: pure functions ``Profile -> str``, one file each, in one registry.

The registry has one table per document kind: ``profile`` (a :class:`Profile`, the
default), ``ranks`` (a merged run of several ranks, ``layerscope.ranks.MergedRun``),
``rank-traces`` (the rank files themselves, for their traces), ``diff`` (two profiles
compared, ``layerscope.diff.ProfileDiff``) and ``bench`` (a model-level benchmark,
``layerscope.bench.BenchResult``). A format name is unique within its table, so
``text``, ``json`` and ``html`` exist for several.

A renderer of a document that can be big (the Chrome trace) is registered with
``chunks=True`` and yields its text in pieces (``Profile -> Iterator[str]``): saving
writes the pieces as they come, so the whole document never sits in memory.

The registry drives ``Profile.render(fmt)``, the CLI's ``--format`` choices and the
format guessed from an output file's extension. Adding a format is one new file with a
``@register_renderer`` line, plus its import at the bottom of this file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from layerscope.tree import Profile

RenderFn = Callable[..., Any]


@dataclass(frozen=True)
class Renderer:
    name: str
    fn: RenderFn
    extensions: tuple[str, ...]
    description: str
    chunks: bool = False
    #: The renderer returns bytes (a picture), written to a file only.
    binary: bool = False


#: The profile formats (the ``profile`` table).
_RENDERERS: dict[str, Renderer] = {}
#: Every table, by document kind.
_TABLES: dict[str, dict[str, Renderer]] = {
    "profile": _RENDERERS, "ranks": {}, "rank-traces": {}, "diff": {}, "bench": {},
}


def _table(document: str) -> dict[str, Renderer]:
    try:
        return _TABLES[document]
    except KeyError:
        raise ValueError(f"unknown document kind {document!r}; expected one of: {', '.join(_TABLES)}") from None


def register_renderer(
    name: str, *, extensions: tuple[str, ...] = (), description: str = "", chunks: bool = False,
    document: str = "profile", binary: bool = False,
) -> Callable[[RenderFn], RenderFn]:
    """Register ``fn(doc, **options) -> str`` as format ``name`` of ``document``'s table
    (with ``chunks``, ``fn`` yields the text in pieces; with ``binary``, it returns bytes,
    a picture, which is written to files only); duplicates are an error."""
    table = _table(document)

    def decorate(fn: RenderFn) -> RenderFn:
        if name in table:
            raise ValueError(f"a {document} renderer named {name!r} is already registered")
        taken = {ext: r.name for r in table.values() for ext in r.extensions}
        for ext in extensions:
            if ext in taken:
                raise ValueError(f"extension {ext!r} already belongs to format {taken[ext]!r}")
        table[name] = Renderer(name, fn, tuple(extensions), description or (fn.__doc__ or "").strip(), chunks, binary)
        return fn

    return decorate


def document_kind(doc: Any) -> str:
    """``profile`` for a :class:`Profile`; a document class's own ``DOCUMENT`` otherwise."""
    return "profile" if isinstance(doc, Profile) else str(getattr(doc, "DOCUMENT", "profile"))


def formats(document: str = "profile") -> list[str]:
    """Registered format names of ``document``'s table, in registration order."""
    return list(_table(document))


def get_renderer(fmt: str, document: str = "profile") -> Renderer:
    table = _table(document)
    try:
        return table[fmt]
    except KeyError:
        what = "format" if document == "profile" else f"format for a {document} document"
        raise ValueError(f"unknown {what} {fmt!r}; expected one of: {', '.join(table)}") from None


def format_for_path(path: str | os.PathLike[str], default: str = "text", document: str = "profile") -> str:
    """The format an output file's extension implies (``.json`` -> ``json``)."""
    name = os.fspath(path).lower()
    best = ""
    found = default
    for renderer in _table(document).values():
        for ext in renderer.extensions:
            if name.endswith(ext) and len(ext) > len(best):
                best, found = ext, renderer.name
    return found


def render(profile: Any, fmt: str = "text", **options: Any) -> str:
    renderer = get_renderer(fmt, document_kind(profile))
    out = renderer.fn(profile, **options)
    return "".join(out) if renderer.chunks else out


def render_chunks(profile: Any, fmt: str = "text", **options: Any) -> Iterator[str]:
    """The rendering in pieces: a chunked renderer's own, else the whole text as one."""
    renderer = get_renderer(fmt, document_kind(profile))
    out = renderer.fn(profile, **options)
    if renderer.chunks:
        yield from out
    else:
        yield out


# Filling the registry: each module registers itself on import.
from layerscope.render import (  # noqa: E402,F401
    bench_html,
    bench_text,
    chrome,
    csv_table,
    deepspeed,
    diff_html,
    folded,
    html,
    json_doc,
    model,
    ops_table,
    png,
    ranks_chrome,
    ranks_html,
    ranks_text,
    speedscope,
    text,
    torchprof,
)
