"""The output registry: every format of every document layerscope writes, in one table.

A *document* is something layerscope renders: a ``profile`` (:class:`~layerscope.model.tree.Profile`),
a ``diff`` of two profiles, a merged run of ranks (``ranks``), the rank files themselves
for their traces (``rank-traces``), a ``bench`` result, a comparison of two benchmarks
(``bench-comparison``) and an operator table (``op-table``). Each document class names
its kind in a ``DOCUMENT`` class attribute. The registry is keyed by (document kind,
format name): ``text``, ``json`` and ``html`` exist for several kinds.

A format is a :class:`Renderer`: a pure function ``fn(document, **options)``, the file
extensions it is guessed from, whether it yields its text in pieces (``chunks``: big
documents are written as they are made, never whole in memory) or returns bytes
(``binary``: a picture, for files only), and its keyword :class:`Option` s. The options
are checked here, for the Python API and the CLI alike, and the CLI builds its
``--format`` choices and option flags from them.

This module sits below the data model and imports none of it: a document's
``render()``/``save()`` delegate here, and the renderers, which import the model,
register themselves into it (``layerscope.render`` loads the built-in ones).
"""

from __future__ import annotations

import inspect
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from layerscope.base.errors import OptionError
from layerscope.base.io import write_atomic

RenderFn = Callable[..., Any]
#: A renderer as registered: the decorator hands it back with its own signature.
_Fn = TypeVar("_Fn", bound=RenderFn)

#: The document kinds, each with what it is (for messages).
DOCUMENTS: dict[str, str] = {
    "profile": "a profile",
    "diff": "a diff of two profiles",
    "ranks": "a merged run of ranks",
    "rank-traces": "the rank files of a distributed run",
    "bench": "a benchmark",
    "bench-comparison": "a comparison of two benchmarks",
    "op-table": "an operator table",
}


@dataclass(frozen=True)
class Option:
    """A keyword option of one or more formats, and its command-line flag ``--NAME``
    (underscores as dashes).

    ``parse`` turns the flag's text into the value (raising ``ValueError`` with what was
    expected); ``None`` makes the flag a switch that passes ``True``. With ``listing``,
    ``--NAME list`` prints what it returns (the accepted values) and exits. ``flag=False``
    keeps an option to the Python API (structured values a command line cannot spell).
    One name means one option everywhere in the registry."""

    name: str
    help: str
    parse: Callable[[str], Any] | None = str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    listing: Callable[[], str] | None = None
    flag: bool = True

    @property
    def flag_name(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Renderer:
    name: str
    fn: RenderFn
    extensions: tuple[str, ...]
    description: str
    document: str = "profile"
    #: ``fn`` yields the text in pieces.
    chunks: bool = False
    #: ``fn`` returns bytes (a picture), written to a file only.
    binary: bool = False
    options: tuple[Option, ...] = ()

    def option_names(self) -> list[str]:
        return [option.name for option in self.options]


_TABLES: dict[str, dict[str, Renderer]] = {kind: {} for kind in DOCUMENTS}
#: Every option by name, to keep one meaning per name.
_OPTIONS: dict[str, Option] = {}


def _table(document: str) -> dict[str, Renderer]:
    try:
        return _TABLES[document]
    except KeyError:
        raise ValueError(f"unknown document kind {document!r}; expected one of: {', '.join(_TABLES)}") from None


def _keywords(fn: RenderFn) -> set[str] | None:
    """The keyword-only parameters of ``fn``; None when it takes ``**options``."""
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.kind is p.KEYWORD_ONLY}


def register_renderer(
    name: str, *, extensions: tuple[str, ...] = (), description: str = "", chunks: bool = False,
    document: str = "profile", binary: bool = False, options: tuple[Option, ...] = (),
) -> Callable[[_Fn], _Fn]:
    """Register ``fn(doc, **options)`` as format ``name`` of ``document``'s table.

    ``fn`` returns the text (str); with ``chunks`` it yields it in pieces; with
    ``binary`` it returns bytes. ``options`` are its keyword options: each must be a
    keyword-only parameter of ``fn``, and an option name already registered elsewhere
    must be the same :class:`Option`. A second format of one name or extension in one
    table is an error."""
    table = _table(document)

    def decorate(fn: _Fn) -> _Fn:
        if name in table:
            raise ValueError(f"a {document} renderer named {name!r} is already registered")
        taken = {ext: r.name for r in table.values() for ext in r.extensions}
        for ext in extensions:
            if ext in taken:
                raise ValueError(f"extension {ext!r} already belongs to format {taken[ext]!r}")
        keywords = _keywords(fn)
        for option in options:
            if keywords is not None and option.name not in keywords:
                raise ValueError(f"{fn.__qualname__} has no keyword parameter {option.name!r} for its option")
            known = _OPTIONS.get(option.name)
            if known is not None and known != option:
                raise ValueError(f"option {option.name!r} is already registered with another meaning")
        for option in options:
            _OPTIONS.setdefault(option.name, option)
        description_text = description or (fn.__doc__ or "").strip()
        table[name] = Renderer(name, fn, tuple(extensions), description_text, document, chunks, binary, tuple(options))
        return fn

    return decorate


def document_kind(doc: Any) -> str:
    """The registry table of ``doc``: its class's ``DOCUMENT``."""
    kind = getattr(type(doc), "DOCUMENT", None)
    if kind not in _TABLES:
        raise TypeError(f"cannot render a {type(doc).__name__}: expected a layerscope document ({', '.join(DOCUMENTS)})")
    return str(kind)


def formats(document: str = "profile") -> list[str]:
    """Registered format names of ``document``'s table, in registration order."""
    return list(_table(document))


def renderers(document: str = "profile") -> list[Renderer]:
    """The formats of ``document``'s table, in registration order."""
    return list(_table(document).values())


def get_renderer(fmt: str, document: str = "profile") -> Renderer:
    table = _table(document)
    try:
        return table[fmt]
    except KeyError:
        what = "format" if document == "profile" else f"format for {DOCUMENTS[document]}"
        raise ValueError(f"unknown {what} {fmt!r}; expected one of: {', '.join(table)}") from None


def format_for_path(path: str | os.PathLike[str], default: str = "text", document: str = "profile") -> str:
    """The format an output file's extension implies (``.json`` -> ``json``); the longest
    matching extension wins (``.trace.json`` -> ``chrome``)."""
    name = os.fspath(path).lower()
    best = ""
    found = default
    for renderer in _table(document).values():
        for ext in renderer.extensions:
            if name.endswith(ext) and len(ext) > len(best):
                best, found = ext, renderer.name
    return found


def check_options(renderer: Renderer, options: dict[str, Any]) -> None:
    """Refuse options ``renderer`` does not take, naming the ones it does."""
    unknown = [name for name in options if name not in renderer.option_names()]
    if unknown:
        takes = ", ".join(renderer.option_names()) or "no options"
        what = f"the {renderer.name} format" + ("" if renderer.document == "profile" else f" of {DOCUMENTS[renderer.document]}")
        raise OptionError(f"{what} has no option {', '.join(map(repr, unknown))}; it takes: {takes}")


def _call(doc: Any, fmt: str, options: dict[str, Any]) -> tuple[Renderer, Any]:
    renderer = get_renderer(fmt, document_kind(doc))
    check_options(renderer, options)
    return renderer, renderer.fn(doc, **options)


def render(doc: Any, fmt: str = "text", **options: Any) -> Any:
    """``doc`` in format ``fmt``: str, or bytes for a binary format."""
    renderer, out = _call(doc, fmt, options)
    return "".join(out) if renderer.chunks else out


#: The width ``print(doc)`` fits where stdout is no terminal: a notebook, a log, a file.
DISPLAY_WIDTH = 120


def terminal_width() -> int | None:
    """The width to fit: ``COLUMNS`` where it is set to a whole number (honoured when
    stdout is piped, as ``shutil`` and rich honour it), else the terminal's when stdout
    is one, else None (the full width)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def display_text(doc: Any, **options: Any) -> str:
    """``doc`` as ``print(doc)`` shows it: its text format, fitted (when the format takes
    a width and ``options`` give none) to the terminal's width, or :data:`DISPLAY_WIDTH`
    where stdout is no terminal."""
    if "width" in get_renderer("text", document_kind(doc)).option_names():
        options.setdefault("width", terminal_width() or DISPLAY_WIDTH)
    return str(render(doc, "text", **options))


#: How an ``html`` page shows in a notebook, ``fn(page) -> markup``: the one
#: ``render/notebook.py`` registers (:func:`register_notebook_frame`).
_NOTEBOOK_FRAMES: list[Callable[[str], str]] = []


def register_notebook_frame(fn: Callable[[str], str]) -> Callable[[str], str]:
    """Register ``fn(page) -> markup`` as the frame :func:`display_html` puts a document's
    page in; a second one is an error."""
    if _NOTEBOOK_FRAMES:
        raise ValueError(f"a notebook frame is already registered ({_NOTEBOOK_FRAMES[0].__qualname__})")
    _NOTEBOOK_FRAMES.append(fn)
    return fn


def display_html(doc: Any) -> str:
    """``doc`` as a notebook shows it: its ``html`` format in the registered frame."""
    if not _NOTEBOOK_FRAMES:
        raise RuntimeError("no notebook frame is registered: import layerscope.render")
    return _NOTEBOOK_FRAMES[0](str(render(doc, "html")))


class NotebookDisplay:
    """How a document with an ``html`` format shows itself in Jupyter (IPython's display
    protocol): ``Profile``, ``ProfileDiff``, ``MergedRun`` and ``BenchResult``. Like their
    ``render()``/``save()``, it delegates here, and the renderers do the work.

    ``_repr_html_`` is its interactive report in a sandboxed frame (:func:`display_html`,
    ``render/notebook.py``); the ``text/plain`` of ``_repr_mimebundle_`` its text
    rendering, what ``print`` shows, for front ends that show text only (IPython's
    terminal, a notebook exported as text). Each is made when a front end asks for it,
    never before, and neither changes the document. They are two methods, not one bundle,
    because IPython's terminal calls ``_repr_mimebundle_`` too, and would build a page it
    then throws away, while it never asks for ``_repr_html_``; and not ``_repr_pretty_``,
    which IPython skips for a class with a ``__repr__`` of its own, as a dataclass has."""

    __slots__ = ()

    def _repr_html_(self) -> str:
        return display_html(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **kwargs: Any) -> dict[str, str]:
        return {"text/plain": str(self)}


def render_chunks(doc: Any, fmt: str = "text", **options: Any) -> Iterator[str | bytes]:
    """The rendering in pieces: a chunked renderer's own, else the whole as one. The
    options are checked at the call, before the first piece is asked for."""
    renderer, out = _call(doc, fmt, options)
    return iter(out) if renderer.chunks else iter((out,))


def save(doc: Any, path: str | os.PathLike[str], fmt: str | None = None, **options: Any) -> None:
    """Write ``doc`` to ``path`` atomically, in ``fmt`` or the format its extension
    names (JSON when it names none)."""
    chosen = fmt or format_for_path(path, default="json", document=document_kind(doc))
    # io.write_atomic writes bytes chunks too, but its annotation names str chunks only
    # (base/io.py is outside the type-checked files); remove once it says Iterable[str | bytes].
    write_atomic(path, render_chunks(doc, chosen, **options))
