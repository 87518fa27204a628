"""Renderers: pure functions ``Profile -> str``, one file each, in one registry.

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


_RENDERERS: dict[str, Renderer] = {}


def register_renderer(
    name: str, *, extensions: tuple[str, ...] = (), description: str = "", chunks: bool = False
) -> Callable[[RenderFn], RenderFn]:
    """Register ``fn(profile, **options) -> str`` as format ``name`` (with ``chunks``,
    ``fn`` yields the text in pieces); duplicates are an error."""

    def decorate(fn: RenderFn) -> RenderFn:
        if name in _RENDERERS:
            raise ValueError(f"a renderer named {name!r} is already registered")
        taken = {ext: r.name for r in _RENDERERS.values() for ext in r.extensions}
        for ext in extensions:
            if ext in taken:
                raise ValueError(f"extension {ext!r} already belongs to format {taken[ext]!r}")
        _RENDERERS[name] = Renderer(name, fn, tuple(extensions), description or (fn.__doc__ or "").strip(), chunks)
        return fn

    return decorate


def formats() -> list[str]:
    """Registered format names, in registration order."""
    return list(_RENDERERS)


def get_renderer(fmt: str) -> Renderer:
    try:
        return _RENDERERS[fmt]
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}; expected one of: {', '.join(_RENDERERS)}") from None


def format_for_path(path: str | os.PathLike[str], default: str = "text") -> str:
    """The format an output file's extension implies (``.json`` -> ``json``)."""
    name = os.fspath(path).lower()
    best = ""
    found = default
    for renderer in _RENDERERS.values():
        for ext in renderer.extensions:
            if name.endswith(ext) and len(ext) > len(best):
                best, found = ext, renderer.name
    return found


def render(profile: Profile, fmt: str = "text", **options: Any) -> str:
    renderer = get_renderer(fmt)
    out = renderer.fn(profile, **options)
    return "".join(out) if renderer.chunks else out


def render_chunks(profile: Profile, fmt: str = "text", **options: Any) -> Iterator[str]:
    """The rendering in pieces: a chunked renderer's own, else the whole text as one."""
    renderer = get_renderer(fmt)
    out = renderer.fn(profile, **options)
    if renderer.chunks:
        yield from out
    else:
        yield out


# Filling the registry: each module registers itself on import.
from layerscope.render import (  # noqa: E402,F401
    chrome,
    csv_table,
    deepspeed,
    folded,
    json_doc,
    model,
    ops_table,
    speedscope,
    text,
    torchprof,
)
