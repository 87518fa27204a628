"""Saving and loading profiles: atomic writes, and a strict reader of ``layerscope/1``."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from layerscope.errors import SchemaError

SCHEMA = "layerscope/1"


def destination(path: str | os.PathLike[str]) -> tuple[Path, bool]:
    """Where writing ``path`` puts the bytes: ``(file, in_place)``.

    A regular file or a new name is replaced atomically, and through a symlink it is the
    link's target that is replaced (the link stays a link). Anything else that exists
    (a character device such as /dev/null, a FIFO, a terminal) is written in place:
    renaming a new file over it would replace the device with a regular file.
    """
    target = Path(path)
    try:
        mode = os.stat(target).st_mode  # follows symlinks
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(f"cannot write {str(target)!r}: it is a folder; give a file name")
    if mode is not None and not stat.S_ISREG(mode):
        return target, True
    # A (possibly dangling) symlink: the file to replace is the one it points to.
    return (Path(os.path.realpath(target)) if target.is_symlink() else target), False


def write_atomic(path: str | os.PathLike[str], text: str | bytes | Iterable[str]) -> None:
    """Write ``text`` (str, as UTF-8; bytes; or an iterable of str chunks, written as they
    come so a big document never sits in memory whole) to ``path`` so that readers see
    the old file or the whole new one.

    The text goes to a temporary file in the same folder, is flushed to disk, then
    renamed over ``path``: a failed run never leaves a half-written file behind. A
    device or FIFO (``-o /dev/null``) is written in place instead (see
    :func:`destination`); every failure to write raises ``OSError``.
    """
    if not isinstance(text, (str, bytes)):
        text = iter(text)  # a TypeError now, before anything is opened or created
    target, in_place = destination(path)
    if in_place:
        with open(target, "wb") as handle:
            _write_all(handle, text)
        return
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(f"cannot write {str(path)!r}: folder {str(folder)!r} does not exist")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        # mkstemp makes the file private (0600); give it the mode a plain open() would,
        # or keep the mode of the file it replaces.
        try:
            mode = target.stat().st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp_name, mode)
        with os.fdopen(fd, "wb") as handle:
            _write_all(handle, text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        raise


def _write_all(handle: BinaryIO, text: str | bytes | Iterable[str]) -> None:
    if isinstance(text, (str, bytes)):
        handle.write(text.encode("utf-8") if isinstance(text, str) else text)
        return
    for chunk in text:
        handle.write(chunk if isinstance(chunk, bytes) else chunk.encode("utf-8"))


def save(profile: Any, path: str | os.PathLike[str], fmt: str | None = None, **options: Any) -> None:
    from layerscope.render import document_kind, format_for_path, render_chunks

    chosen = fmt or format_for_path(path, default="json", document=document_kind(profile))
    write_atomic(path, render_chunks(profile, chosen, **options))


def profile_from_dict(doc: Any, source: str = "document") -> Any:
    """Rebuild a :class:`Profile` from a ``layerscope/1`` dict, checking the type of every
    field it reads and the tree's invariants."""
    from layerscope.check import summarize, tree_problems
    from layerscope.schema import document_problems
    from layerscope.tree import ModuleNode, Profile, link

    if not isinstance(doc, dict) or "schema" not in doc:
        raise SchemaError(f"{source} is not a layerscope profile (no 'schema' field)")
    schema = doc["schema"]
    if schema != SCHEMA:
        raise SchemaError(
            f"{source} has schema {schema!r}; this layerscope reads {SCHEMA!r} only"
        )
    problems = document_problems(doc)
    if problems:
        raise SchemaError(f"{source} is a damaged layerscope profile: {summarize(problems)}")
    try:
        nodes = [_node_from_dict(entry) for entry in doc["modules"]]
        root = link(nodes)
        parts: list[ModuleNode] = []
        by_path: dict[str, ModuleNode] = {}
        for entry in doc.get("parts") or []:
            node = _node_from_dict(entry)
            if node.parent is None:
                parts.append(node)
            else:
                by_path[node.parent].children.append(node)
            by_path[node.path] = node
        profile = Profile(
            root=root,
            meta=dict(doc.get("meta") or {}),
            param_bytes=doc["totals"]["param_bytes"],
            parts=parts,
            memory=None if doc.get("memory") is None else dict(doc["memory"]),
            trace=None if doc.get("trace") is None else dict(doc["trace"]),
        )
        problems = tree_problems(profile)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SchemaError(f"{source} is a damaged layerscope profile: {type(exc).__name__}: {exc}") from None
    if problems:
        raise SchemaError(f"{source} is inconsistent: {summarize(problems)}")
    return profile


def _node_from_dict(entry: dict[str, Any]) -> Any:
    from layerscope.tree import ModuleNode, OpStats, PhaseStats

    def phase(name: str) -> Any:
        data = entry.get(name)
        return None if data is None else PhaseStats.from_dict(data)

    return ModuleNode(
        path=entry["path"],
        type=entry["type"],
        parent=entry["parent"],
        depth=entry["depth"],
        calls=entry["calls"],
        params=entry["params"],
        params_total=entry["params_total"],
        profiled=entry.get("profiled", True),
        forward=PhaseStats.from_dict(entry["forward"]),
        backward=phase("backward"),
        recompute=phase("recompute"),
        kind=str(entry.get("kind") or "module"),
        ops=[OpStats.from_dict(op) for op in entry.get("ops", [])],
        unsupported_ops=dict(entry.get("unsupported_ops") or {}),
        extra_repr=str(entry.get("extra_repr") or ""),
        input_shapes=entry.get("input_shapes"),
        output_shapes=entry.get("output_shapes"),
    )


class _NotANumber(ValueError):
    """NaN or Infinity in a JSON file: Python reads them, the JSON standard does not."""


def _no_constant(name: str) -> Any:
    raise _NotANumber(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _NotANumber(f"{text} is too large a number")
    return value


def read_json(path: str | os.PathLike[str], what: str) -> tuple[Any, str]:
    """The JSON document at ``path`` and its name for messages; ``what`` ("profile",
    "benchmark") names the kind of file in the errors: FileNotFoundError, or a
    :class:`SchemaError` for a file that is not UTF-8 JSON a layerscope file can hold."""
    name = os.fspath(path)
    try:
        text = Path(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"no such {what} file: {name!r}") from None
    except UnicodeDecodeError:
        raise SchemaError(f"{name!r} is not a layerscope {what} (not UTF-8 text)") from None
    not_it = f"{name!r} is not a layerscope {what}"
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float), name
    except json.JSONDecodeError as exc:
        raise SchemaError(
            f"{name!r} is not valid JSON (truncated or corrupted?): {exc.msg} at line {exc.lineno}"
        ) from None
    except _NotANumber as exc:
        raise SchemaError(f"{not_it}: {exc}") from None
    except ValueError:
        # Python refuses to read integers of more than sys.get_int_max_str_digits() digits.
        raise SchemaError(f"{not_it}: it holds a number with thousands of digits") from None
    except RecursionError:
        raise SchemaError(f"{not_it}: its JSON nests too deeply") from None


def load(path: str | os.PathLike[str]) -> Any:
    """Read a profile saved as JSON (a :class:`~layerscope.tree.Profile`), or a merged run
    of ranks (``layerscope-ranks/1``, a :class:`~layerscope.ranks.MergedRun`); a clear
    :class:`SchemaError` for anything else."""
    doc, name = read_json(path, "profile")
    from layerscope.ranks import SCHEMA as RANKS_SCHEMA

    if isinstance(doc, dict) and doc.get("schema") == RANKS_SCHEMA:
        from layerscope.ranks import ranks_from_dict

        return ranks_from_dict(doc, source=repr(name))
    return profile_from_dict(doc, source=repr(name))
