"""Files: atomic writes, and a strict reader of JSON (what a layerscope document may hold).

The bottom layer: it knows no document. Rendering and saving documents is
:mod:`layerscope.base.formats`; reading them back is :mod:`layerscope.model.documents`."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from layerscope.base.errors import SchemaError


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


def write_atomic(path: str | os.PathLike[str], text: str | bytes | Iterable[str | bytes]) -> None:
    """Write ``text`` (str, as UTF-8; bytes; or an iterable of str or bytes chunks, written as they
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


def _write_all(handle: BinaryIO, text: str | bytes | Iterable[str | bytes]) -> None:
    if isinstance(text, (str, bytes)):
        handle.write(text.encode("utf-8") if isinstance(text, str) else text)
        return
    for chunk in text:
        handle.write(chunk if isinstance(chunk, bytes) else chunk.encode("utf-8"))


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
