"""``layerscope.load``: every file layerscope reads, told by its content.

A document layerscope saved names its schema, and :data:`READERS` holds the one reader
of each: a profile (``layerscope/1``), a merged run of ranks (``layerscope-ranks/1``), a
benchmark (``layerscope-bench/1``), a diff (``layerscope-diff/1``, rebuilt from the two
profiles it holds). A torch.profiler trace (Kineto's Chrome-trace JSON,
plain or gzip) is turned into a profile by :mod:`layerscope.traces` (which imports
torch, so only when the file is one).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from layerscope.base.errors import SchemaError
from layerscope.base.formats import DOCUMENTS
from layerscope.base.io import read_json
from layerscope.base.kineto_json import is_kineto_trace
from layerscope.model.bench import SCHEMA as BENCH_SCHEMA
from layerscope.model.bench import BenchResult
from layerscope.model.diff import DIFF_SCHEMA, ProfileDiff
from layerscope.model.documents import diff_from_dict, profile_from_dict
from layerscope.model.ranks import SCHEMA as RANKS_SCHEMA
from layerscope.model.ranks import MergedRun
from layerscope.model.tree import SCHEMA as PROFILE_SCHEMA
from layerscope.model.tree import Profile

#: A document layerscope saves and reads back.
Document = Profile | MergedRun | BenchResult | ProfileDiff
_Kind = TypeVar("_Kind", Profile, MergedRun, BenchResult, ProfileDiff)

#: The reader of each saved document kind, by the schema its file names: each type's own
#: ``from_dict`` (a profile's with its checks, which sit above the tree: model/documents.py).
READERS: dict[str, Callable[[Any, str], Document]] = {
    PROFILE_SCHEMA: profile_from_dict,
    RANKS_SCHEMA: MergedRun.from_dict,
    BENCH_SCHEMA: BenchResult.from_dict,
    DIFF_SCHEMA: diff_from_dict,
}


def load(
    path: str | os.PathLike[str], *, model: Any = None, shapes: bool = True,
    progress: Callable[[str, int, int], None] | None = None, inputs: Any = None,
) -> Document:
    """Read any file layerscope reads: a profile saved as JSON (a
    :class:`~layerscope.model.tree.Profile`), a merged run of ranks (a
    :class:`~layerscope.model.ranks.MergedRun`), a benchmark (a
    :class:`~layerscope.bench.BenchResult`), or a torch.profiler trace file (``.json``
    or ``.json.gz``, as Kineto writes it) as a profile; a clear
    :class:`~layerscope.base.errors.SchemaError` for anything else (a gzip file is read as a
    trace, so a damaged one is said to be a damaged trace).

    ``model`` (an ``nn.Module``, only read, never run) gives a trace's modules their paths
    in it and their parameters; a saved profile has both already (docs/traces.md). A trace
    recorded without ``with_stack`` has no module events: given ``model`` and ``inputs``
    (the forms ``profile()`` takes; only their shapes and dtypes are read; a transformers
    model's default inputs when not given), its ops are aligned to the model's call
    template, learned from one run of a meta copy of the model
    (``meta.modules_from.placement`` says how each op was placed; docs/traces.md).
    ``shapes=False`` reads a trace as if it had recorded no shapes: the same times, no
    FLOPs, each op row the op where a module called it (``aten::linear``, not the
    ``addmm`` in it); faster, in less memory, and without importing torch.
    ``progress(stage, done, total)`` (``layerscope.progress.progress_bar``'s callback)
    hears how far a trace's read and build are; a saved document is read at once.
    """
    if not isinstance(shapes, bool):
        raise TypeError(f"shapes must be True or False, got {shapes!r}")
    if is_trace_file(path):
        from layerscope.traces.load import load_trace

        if model is None:
            return load_trace(path, shapes=shapes, progress=progress)
        from layerscope.capture.modules import traced_model

        template = _template_source(model, inputs)
        return load_trace(path, model=traced_model(model), shapes=shapes, progress=progress, template=template)
    if inputs is not None and os.path.exists(path):
        raise ValueError(
            f"inputs= give a torch.profiler trace's model its call template (with model=); {os.fspath(path)!r} "
            "is not a trace file"
        )
    for given, what in ((model is not None, "model= maps the modules"), (not shapes, "shapes=False leaves out the shapes")):
        if given and os.path.exists(path):  # a missing file is said to be missing (read_saved)
            raise ValueError(
                f"{what} of a torch.profiler trace file; {os.fspath(path)!r} is not one "
                "(a saved layerscope profile has its module paths and counts already)"
            )
    return read_saved(path)


def _template_source(model: Any, inputs: Any) -> Callable[[bool], Any]:
    """What learns ``model``'s call template called with ``inputs`` (None: a transformers
    model's default inputs, built from its config; else none is learned), when the trace
    asks."""

    def learn(grad: bool) -> Any:
        from layerscope.capture.template import call_template
        from layerscope.zoo.specs import default_transformers_inputs, is_transformers_model

        given = inputs
        if given is None:
            if not is_transformers_model(model):
                return None
            given = default_transformers_inputs(model, 1)
        return call_template(model, given, grad=grad)

    return learn


def read_saved(path: str | os.PathLike[str], what: str = "profile") -> Document:
    """The document layerscope saved at ``path`` (no trace files: :func:`load` reads
    those), by its schema; ``what`` names the file in the errors of reading it ("no such
    profile file")."""
    doc, name = read_json(path, what)
    return from_document(doc, source=repr(name), what=what)


def from_document(doc: Any, source: str = "document", what: str = "profile") -> Document:
    """The document a saved file's JSON ``doc`` holds, read by its schema's reader;
    ``what`` names what was expected where ``doc`` names no schema."""
    if not isinstance(doc, dict):
        found = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(doc), "a number")
        raise SchemaError(
            f"{source} is neither a layerscope {what} nor a torch.profiler trace: its JSON is {found}, where "
            "both are an object (a document's 'schema', a trace's 'traceEvents')"
        )
    schema = doc.get("schema")
    reader = READERS.get(schema) if isinstance(schema, str) else None
    if reader is None:
        if schema is None:
            raise SchemaError(f"{source} is not a layerscope {what} (no 'schema' field)")
        raise SchemaError(f"{source} has schema {schema!r}; this layerscope reads {', '.join(map(repr, READERS))}")
    return reader(doc, source)


#: What to do with a document of another kind, said after it is refused.
_USE = {"profile": "'layerscope show' shows it", "ranks": "'layerscope show' shows it",
        "bench": "'layerscope bench --compare' compares two", "diff": "'layerscope show' shows it"}


def expect(doc: Document, source: str, *kinds: type[_Kind]) -> _Kind:
    """``doc`` when it is one of ``kinds``; else a :class:`SchemaError` saying what it is
    and what reads it."""
    if isinstance(doc, kinds):
        return doc
    names = [DOCUMENTS[kind.DOCUMENT].removeprefix("a ") for kind in kinds]
    wanted = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    found = doc.DOCUMENT
    raise SchemaError(f"{source} is not a layerscope {wanted}: it is {DOCUMENTS[found]} ({_USE[found]})")


def is_trace_file(path: str | os.PathLike[str]) -> bool:
    """Whether :func:`load` reads ``path`` as a torch.profiler trace: Kineto's JSON, or any
    gzip file."""
    return is_kineto_trace(path) or _is_gzip(path)


def _is_gzip(path: str | os.PathLike[str]) -> bool:
    """A gzip file: layerscope writes none, torch.profiler's handlers do (``.json.gz``), so
    one that is not readable as a trace is a damaged trace, and said so."""
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"\x1f\x8b"
    except OSError:
        return False
