"""Reading a torch.profiler (Kineto) Chrome-trace JSON file, plain or gzip, one event at a time.

A trace is one JSON object: ``traceEvents`` (a list of event objects) and a few other keys
(``schemaVersion``, ``deviceProperties``, ``distributedInfo``, ``baseTimeNanoseconds``...),
before or after the events, as the writer chose. Traces of a real model are tens of MB of
JSON, and a synthetic one of 10^6 events about 250 MB, so the file is never held whole:
it is decompressed and decoded in chunks of :data:`CHUNK_BYTES` into a text buffer, the top
level is walked key by key, and each element of ``traceEvents`` is decoded alone by the
standard library's C scanner (``json``'s ``scan_once``). An element cut by the end of the
buffer is decoded again once more text has been read; only when the file has no more text
is a decoding error final ("truncated" if it comes at the end of the text).

Numbers. Timestamps are microseconds near 10^12 with three decimals
(``"ts": 1419247333291.708``), more digits than a float keeps exact in nanoseconds. So
every JSON *float* of the file (a number written with a fraction or an exponent) is
given as a :class:`FloatText`, a ``str`` holding the number's source text; JSON integers
stay ``int``. :func:`us_to_ns` turns either into integer nanoseconds exactly; any other
use of a float (``"blocks per SM"``, ``"memory bandwidth (GB/s)"``) calls ``float()``
itself. NaN and Infinity, which Python's ``json`` reads but JSON does not allow, are
refused.

Usage::

    with open_trace("trace.json.gz") as trace:
        for event in trace.events():
            start_ns = us_to_ns(event["ts"])
        trace.meta["schemaVersion"]

Every problem with the file's content is a :class:`~layerscope.base.errors.SchemaError` of one
line that names the file, what was wrong and what was expected; a missing file is a
``FileNotFoundError``. Standard library only: this module does not import torch.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import os
import re
import zlib
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from layerscope.base.errors import SchemaError

#: Bytes read from the file (after gzip decompression) per refill of the text buffer.
#: Measured with benchmarks/trace_parse.py on 10^6 events (medians of 5): 256 KiB 2.96 s,
#: 1 MiB 2.51 s, 4 MiB 3.63 s; peak RSS 1, 5 and 20 MiB above the imports'.
CHUNK_BYTES = 1 << 20
#: What :func:`is_kineto_trace` reads at most (after decompression).
SNIFF_BYTES = 64 << 10
#: Top-level keys only Kineto's traces carry (``traceEvents`` is in every Chrome trace).
KINETO_KEYS = frozenset({"schemaVersion", "deviceProperties"})
#: Event categories only torch's profiler records, and how many events are looked at.
KINETO_CATEGORIES = frozenset({
    "cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy",
    "gpu_memset", "cpu_instant_event", "gpu_user_annotation", "ac2g", "fwdbwd",
    # The names before torch 1.10, matched without regard to case as the categories are.
    "operator", "runtime", "memcpy", "memset",
})
_SNIFF_EVENTS = 200
_GZIP_MAGIC = b"\x1f\x8b"
_SPACE = " \t\n\r"
_SKIP_SPACE = re.compile(r"[ \t\n\r]*").match
#: A decoding error this close to the end of the buffered text may come from an element
#: cut by the chunk boundary ("tr" of "true", "1e" of "1e-05", "\u00" of an escape), not
#: from bad JSON: more text is read before judging. A cut string is reported as
#: "Unterminated string" at its start, however far back (see :func:`_may_be_cut`).
_CUT_TAIL = 32
#: What the scanner leaves undecoded at its error when the text ends inside a value: a
#: number's sign, point or exponent ("1." fails at the "."), a literal's start, an escape's.
_CUT_REST = re.compile(r"(?:[-.]|[eE][-+]?|t|tr|tru|f|fa|fal|fals|n|nu|nul|\\u[0-9a-fA-F]{0,3}|\\)?[ \t\n\r]*")


class FloatText(str):
    """A JSON float of the trace, kept as the text the file wrote (``"1419247333291.708"``).

    A ``str``, so nothing is lost; :func:`us_to_ns` reads it exactly, ``float()`` as a
    float. Being its own type, it is told apart from a JSON string holding digits.
    """

    __slots__ = ()


class _NotANumber(ValueError):
    """NaN or Infinity: Python's json reads them, the JSON standard does not."""


def _refuse_constant(name: str) -> Any:
    raise _NotANumber(f"it holds {name}, which is not a number JSON allows")


_DECIMAL_SCALE = (0, 100, 10, 1)  # ns per unit of the last of 1, 2 or 3 decimals
_NUMBER = re.compile(r"(-?)([0-9]+)(?:\.([0-9]+))?(?:[eE]([-+]?[0-9]+))?")


def us_to_ns(value: int | str | float) -> int:
    """Microseconds as a trace writes them, as integer nanoseconds.

    - ``int`` (a JSON integer): ``value * 1000``.
    - ``str`` (a :class:`FloatText`, or any JSON number's text): exact decimal arithmetic on
      the digits, any number of decimals, an exponent and a minus sign allowed:
      ``"1419247333291.708"`` -> ``1419247333291708``; ``"1e3"`` -> ``1000000``. Digits
      finer than a nanosecond are rounded to the nearest nanosecond, ties to even
      (``"0.0005"`` -> ``0``, ``"0.0015"`` -> ``2``).
    - ``float``: ``round(value * 1000)``, which is exact only as far as the float is.

    Anything else (``bool`` included), text that is not a JSON number, NaN or infinity
    raises ``TypeError`` / ``ValueError``.
    """
    if type(value) is int:
        return value * 1000
    if isinstance(value, str):
        # Fast path for Kineto's own form: whole microseconds and 1 to 3 decimals (a float
        # written shortest drops trailing zeros: "5.74").
        whole, _, decimals = value.partition(".")
        if 0 < len(decimals) <= 3 and value.isascii() and whole.isdigit() and decimals.isdigit():
            return int(whole) * 1000 + int(decimals) * _DECIMAL_SCALE[len(decimals)]
        return _text_us_to_ns(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value!r} microseconds is not a time")
        return round(value * 1000)
    raise TypeError(f"a time in microseconds must be an int, a number's text or a float, not {type(value).__name__}")


def _text_us_to_ns(text: str) -> int:
    match = _NUMBER.fullmatch(text) if text.isascii() else None
    if match is None:
        raise ValueError(f"{text!r} is not a number of microseconds")
    sign, whole, decimals, exponent = match.groups()
    decimals = decimals or ""
    digits = int(whole + decimals)
    # value = digits * 10**(exponent - len(decimals)) us = digits * 10**shift ns
    shift = 3 + int(exponent or 0) - len(decimals)
    if shift >= 0:
        if shift > 40:  # 10**40 ns is 3e23 years: not a time, and 10**shift could be huge
            raise ValueError(f"{text!r} microseconds is too large a time")
        ns = digits * 10**shift
    elif -shift > len(whole) + len(decimals):
        ns = 0  # under a tenth of a nanosecond
    else:
        divisor = 10**-shift
        ns, rest = divmod(digits, divisor)
        if 2 * rest > divisor or (2 * rest == divisor and ns % 2):
            ns += 1
    return -ns if sign else ns


class _Source:
    """A file's bytes, gunzipped when they start with gzip's magic bytes, as UTF-8 text
    handed out a chunk at a time."""

    def __init__(self, path: str | os.PathLike[str], chunk_bytes: int, limit_bytes: int | None) -> None:
        self.name = os.fspath(path)
        try:
            self.handle: io.BufferedReader = open(self.name, "rb")  # closed by close()
        except FileNotFoundError:
            raise FileNotFoundError(f"no such trace file: {self.name!r}") from None
        try:
            #: The file's size on disk (compressed, for a ``.json.gz``).
            self.file_bytes = os.fstat(self.handle.fileno()).st_size
            self.gzipped = self.handle.peek(2)[:2] == _GZIP_MAGIC
            self.stream: io.BufferedIOBase = (
                gzip.GzipFile(fileobj=self.handle, mode="rb") if self.gzipped else self.handle
            )
        except BaseException:
            self.handle.close()
            raise
        self.chunk_bytes = chunk_bytes
        self.limit_bytes = limit_bytes
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.bytes_read = 0
        self.at_start = True
        self.done = False

    def read(self, at_least: int = 0) -> str:
        """The next text (at least ``at_least`` characters where the file has them; "" at
        the end)."""
        parts: list[str] = []
        got = 0
        while not self.done and (got == 0 or got < at_least):
            text = self._read_chunk()
            parts.append(text)
            got += len(text)
        return "".join(parts)

    def _read_chunk(self) -> str:
        size = self.chunk_bytes
        if self.limit_bytes is not None:
            size = min(size, self.limit_bytes - self.bytes_read)
        data = self._read_bytes(size) if size > 0 else b""
        final = not data
        if final:
            self.done = True
            if self.limit_bytes is not None and self.bytes_read >= self.limit_bytes:
                return ""  # a sniff stops here; the text may go on
        try:
            text = self.decoder.decode(data, final)
        except UnicodeDecodeError as exc:
            pending = len(self.decoder.getstate()[0])
            at = self.bytes_read - pending + exc.start
            raise SchemaError(
                f"{self.name!r} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {at:,} of "
                f"its {'decompressed ' if self.gzipped else ''}bytes); expected a torch.profiler trace, UTF-8 JSON"
            ) from None
        self.bytes_read += len(data)
        if self.at_start and text:
            self.at_start = False
            if text[0] == "\ufeff":  # a byte-order mark, which some editors write
                text = text[1:]
        return text

    def _read_bytes(self, size: int) -> bytes:
        if not self.gzipped:
            return self.stream.read(size)
        try:
            return self.stream.read(size)
        except EOFError:
            # The read that hit the end returns none of what it decompressed, so the text
            # read so far says nothing; the compressed bytes consumed say where it ended.
            raise SchemaError(
                f"{self.name!r} is truncated: its gzip stream ended early, after {self.handle.tell():,} "
                "compressed bytes, with no end-of-stream marker (a partial copy or download?); "
                "expected a whole .json.gz file"
            ) from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise SchemaError(
                f"{self.name!r} is a damaged gzip file ({exc}); expected gzip-compressed JSON"
            ) from None

    @property
    def file_bytes_read(self) -> int:
        """How much of the file (as stored) has been read so far."""
        return self.handle.tell() if not self.handle.closed else self.file_bytes

    def close(self) -> None:
        try:
            if self.stream is not self.handle:
                self.stream.close()
        finally:
            self.handle.close()


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a number" if isinstance(value, FloatText) else "a string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return "a number"


def _ends_inside(exc: json.JSONDecodeError) -> bool:
    """Whether ``exc``, raised decoding all of a text, says that the text ends inside a
    value (it was cut) rather than that it holds something wrong."""
    return exc.msg.startswith("Unterminated string") or _CUT_REST.fullmatch(exc.doc, exc.pos) is not None


def _may_be_cut(exc: json.JSONDecodeError, length: int) -> bool:
    """Whether ``exc``, raised decoding a buffer of ``length`` characters, may come from a
    value that goes on past the buffer's end rather than from bad JSON."""
    return exc.pos >= length - _CUT_TAIL or exc.msg.startswith("Unterminated string")


class TraceReader:
    """One pass over a Kineto trace file: :meth:`events` yields each element of
    ``traceEvents``; :attr:`meta` holds the other top-level keys.

    Made by :func:`open_trace`; use it as a context manager (or let :meth:`events` run to
    its end, which closes the file). :meth:`events` can be called once per reader.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, chunk_bytes: int = CHUNK_BYTES, _limit_bytes: int | None = None
    ) -> None:
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be at least 1, got {chunk_bytes}")
        self._source = _Source(path, chunk_bytes, _limit_bytes)
        self.name = self._source.name
        #: Every top-level key but ``traceEvents``, in the file's order. Keys written after
        #: the events are here once :meth:`events` has run to its end.
        self.meta: dict[str, Any] = {}
        #: How many events :meth:`events` has yielded so far.
        self.events_read = 0
        decoder = json.JSONDecoder(parse_float=FloatText, parse_constant=_refuse_constant)
        self._scan = decoder.scan_once
        self._buf = ""
        self._pos = 0
        self._dropped = 0  # characters of text before self._buf
        self._started = False
        self._seen_events = False
        try:
            self._open_object()
        except BaseException:
            self.close()
            raise

    # -- the public side -------------------------------------------------------------------
    def events(self) -> Iterator[dict[str, Any]]:
        """Each element of ``traceEvents``, decoded one at a time, as the file holds it (a
        dict; floats as :class:`FloatText`). Reads the whole file: :attr:`meta` is complete
        when the iteration ends, and the file is closed then."""
        if self._started:
            raise RuntimeError(f"events() of {self.name!r} was already called; open the trace again to reread it")
        self._started = True
        try:
            yield from self._walk()
        finally:
            self.close()

    def close(self) -> None:
        self._source.close()

    @property
    def file_bytes(self) -> int:
        """The file's size on disk (compressed, for a ``.json.gz``): what
        :attr:`file_bytes_read` counts up to, for a progress bar."""
        return self._source.file_bytes

    @property
    def file_bytes_read(self) -> int:
        """How much of the file, as stored, has been read so far (read ahead of the
        events yielded by at most a chunk)."""
        return self._source.file_bytes_read

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- the top level -----------------------------------------------------------------------
    def _open_object(self) -> None:
        """Check, before anything else is read, that the text starts a JSON object."""
        first = self._next_char()
        expected = "expected a torch.profiler trace, a JSON object with a 'traceEvents' list"
        if first == "":
            raise SchemaError(f"{self.name!r} is empty (no JSON text); {expected}")
        if first == "[":
            raise SchemaError(f"{self.name!r} holds a JSON list, not an object; {expected}")
        if first != "{":
            if first in '"-0123456789tfn':
                raise SchemaError(f"{self.name!r} holds a JSON {self._describe_start()}, not an object; {expected}")
            raise SchemaError(f"{self.name!r} is not JSON (it starts with {first!r}); {expected}")
        self._pos += 1

    def _describe_start(self) -> str:
        first = self._buf[self._pos]
        return {"t": "true", "f": "false", "n": "null", '"': "string"}.get(first, "number")

    def _walk(self) -> Iterator[dict[str, Any]]:
        after = "the '{' that opens it"
        if self._next_char() == "}":
            self._pos += 1
        else:
            while True:
                key = self._key(after)
                after = f"key {key!r}"
                if key == "traceEvents":
                    if self._seen_events:
                        raise SchemaError(f"{self.name!r} has two 'traceEvents' keys; expected one list of events")
                    self._seen_events = True
                    if self._next_char() != "[":
                        found = _kind(self._value("the value of 'traceEvents'"))
                        raise SchemaError(f"{self.name!r}: 'traceEvents' is {found}, expected a list of events")
                    self._pos += 1
                    yield from self._array()
                    after = "the end of 'traceEvents'"
                else:
                    self.meta[key] = self._value(f"the value of key {key!r}")
                char = self._next_char()
                self._pos += 1
                if char == "}":
                    break
                if char != ",":
                    self._pos -= 1
                    self._unexpected(char, f"',' or '}}' after {after}")
        char = self._next_char()
        if char != "":
            self._fail(f"has more text after its JSON object ({char!r} at character {self._at(self._pos):,})")
        if not self._seen_events:
            keys = ", ".join(repr(k) for k in list(self.meta)[:6]) or "none"
            raise SchemaError(
                f"{self.name!r} is JSON but not a torch.profiler trace: its object has no 'traceEvents' list "
                f"(top-level keys: {keys}); expected Kineto's Chrome trace format"
            )

    def _key(self, after: str) -> str:
        char = self._next_char()
        if char != '"':
            self._unexpected(char, f"a key in double quotes after {after}")
        key = self._value(f"a key after {after}")
        if self._next_char() != ":":
            self._unexpected(self._next_char(), f"':' after key {key!r}")
        self._pos += 1
        self._next_char()
        return key

    def _value(self, what: str) -> Any:
        """Decode the whole value at the current position (reading more text as needed)."""
        while True:
            buf, pos = self._buf, self._pos
            try:
                value, end = self._scan(buf, pos)
            except (StopIteration, ValueError, RecursionError) as exc:
                self._recover(exc, what)
                continue
            if end >= len(buf) and self._more():
                continue  # a number, true, false or null may go on in the next chunk
            self._pos = end
            return value

    def _has_kineto_key(self) -> bool:
        """Whether the text, up to the first value that is cut off or bad, shows a Kineto
        trace: a top-level key only Kineto writes (:data:`KINETO_KEYS`), or among the first
        events of ``traceEvents`` one of a category only torch's profiler records
        (:data:`KINETO_CATEGORIES`). A Chrome trace of another writer (layerscope's own
        export) has ``traceEvents`` too, and is not one."""
        try:
            if self._next_char() == "}":
                return False
            while True:
                key = self._key("the top level")
                if key in KINETO_KEYS:
                    return True
                if key == "traceEvents" and self._next_char() == "[":
                    self._pos += 1
                    for seen, event in enumerate(self._array()):
                        if str(event.get("cat")).lower() in KINETO_CATEGORIES:
                            return True
                        if seen >= _SNIFF_EVENTS:
                            return False
                else:
                    self._value(f"the value of key {key!r}")
                if self._next_char() != ",":
                    return False
                self._pos += 1
        except SchemaError:
            return False

    # -- the events ----------------------------------------------------------------------------
    def _array(self) -> Iterator[dict[str, Any]]:
        """Each element of the list whose '[' was just read, leaving the position after its ']'."""
        scan = self._scan
        skip = _SKIP_SPACE
        if self._next_char() == "]":
            self._pos += 1
            return
        buf, pos = self._buf, self._pos
        size = len(buf)
        while True:
            try:
                event, end = scan(buf, pos)
            except (StopIteration, ValueError, RecursionError) as exc:
                self._pos = pos
                self._recover(exc, f"event {self.events_read + 1:,} of 'traceEvents'")
                buf, pos = self._buf, self._pos
                size = len(buf)
                continue
            if type(event) is not dict:
                self._pos = pos
                raise SchemaError(
                    f"{self.name!r}: event {self.events_read + 1:,} of 'traceEvents' is {_kind(event)}, expected an object"
                )
            self.events_read += 1
            yield event
            if end < size and buf[end] == ",":
                pos = end + 1
                if pos < size and buf[pos] in _SPACE:  # torch's own writer puts a newline here
                    pos = skip(buf, pos).end()
                continue
            # White space before the separator, the list's end, or the buffer's end.
            self._pos = end
            char = self._next_char()
            if char == "]":
                self._pos += 1
                return
            if char != ",":
                self._unexpected(char, f"',' or ']' after event {self.events_read:,} of 'traceEvents'")
            self._pos += 1
            buf, pos = self._buf, self._pos
            size = len(buf)

    def _recover(self, exc: BaseException, what: str) -> None:
        """After decoding ``what`` at the current position failed with ``exc``: skip white
        space, or read more text where the value may go on past the buffer, for the caller to
        decode again; or raise the SchemaError that says what is wrong."""
        buf, pos = self._buf, self._pos
        if isinstance(exc, StopIteration):
            # The scanner's "no value starts here", at pos or (for a nested value) further on.
            at = exc.value
            if at == pos and pos < len(buf) and buf[pos] in _SPACE:
                if self._next_char() != "":
                    return
                self._truncated(what)
            exc = json.JSONDecodeError("Expecting value", buf, at)
        if isinstance(exc, json.JSONDecodeError):
            if _may_be_cut(exc, len(buf)) and self._more():
                return
            self._decode_failed(exc, what)
        self._number_failed(exc, what)

    # -- the buffer -------------------------------------------------------------------------
    def _next_char(self) -> str:
        """The next character that is not white space ("" at the end of the text), with the
        position moved onto it."""
        while True:
            buf = self._buf
            pos = _SKIP_SPACE(buf, self._pos).end()
            self._pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self._more():
                return ""

    def _more(self) -> bool:
        """Read more text after the buffer (at least as much as is left unread in it, so that
        a long element is decoded again only a few times); False at the end of the text,
        with the buffer as it was (positions in a decoding error still point into it)."""
        if self._source.done:
            return False
        text = self._source.read(at_least=len(self._buf) - self._pos)
        if not text:
            return False
        self._dropped += self._pos
        self._buf = self._buf[self._pos :] + text
        self._pos = 0
        return True

    def _at(self, pos: int) -> int:
        return self._dropped + pos

    # -- errors ------------------------------------------------------------------------------
    def _fail(self, message: str) -> None:
        raise SchemaError(f"{self.name!r} {message}")

    def _unexpected(self, char: str, expected: str) -> None:
        if char == "":
            self._truncated(expected)
        self._fail(
            f"is not valid JSON: {char!r} at character {self._at(self._pos):,} where {expected} was expected"
        )

    def _truncated(self, expected: str) -> None:
        where = (
            f"after {self.events_read:,} events of 'traceEvents'"
            if self._seen_events
            else f"after {self._at(len(self._buf)):,} characters"
        )
        limited = self._source.limit_bytes is not None
        raise SchemaError(
            f"{self.name!r} is truncated: its JSON text ends {where}, where {expected} was expected"
            + (" (within the bytes read)" if limited else " (a partial copy, or a profiler that did not finish?)")
        )

    def _decode_failed(self, exc: json.JSONDecodeError, what: str) -> None:
        if self._source.done and _ends_inside(exc):
            self._truncated(f"the rest of {what}")
        self._fail(f"is not valid JSON at character {self._at(exc.pos):,} (in {what}): {exc.msg}")

    def _number_failed(self, exc: BaseException, what: str) -> None:
        if isinstance(exc, _NotANumber):
            self._fail(f"is not valid JSON ({what}): {exc}")
        if isinstance(exc, RecursionError):
            self._fail(f"nests too deeply to read ({what}); expected a torch.profiler trace")
        # int() refuses more than sys.get_int_max_str_digits() digits.
        self._fail(f"holds a number with thousands of digits ({what}); expected a torch.profiler trace")


def open_trace(path: str | os.PathLike[str], *, chunk_bytes: int = CHUNK_BYTES) -> TraceReader:
    """Open a Kineto trace (``.json`` or ``.json.gz``; gzip is told by its magic bytes, not
    the name) for one pass: ``with open_trace(path) as trace: for event in trace.events()``.

    The file is opened, and checked to start a JSON object, now (``FileNotFoundError``, or
    :class:`~layerscope.base.errors.SchemaError` for an empty file, a damaged gzip header, text
    that is not UTF-8 JSON); the rest is read as the events are. ``chunk_bytes`` is how
    much is read at a time (tests make it tiny to cut events across reads).
    """
    return TraceReader(path, chunk_bytes=chunk_bytes)


def is_kineto_trace(path: str | os.PathLike[str]) -> bool:
    """Whether the file's content (plain or gzip) looks like a Kineto trace: a JSON object
    with a ``schemaVersion`` or ``deviceProperties`` key, or events of torch's profiler's
    categories (``cpu_op``, ``kernel``, ...) in ``traceEvents``, within its first
    :data:`SNIFF_BYTES` (64 KiB) of text.

    Reads at most that much text (and the gzip input it takes); never judges by the file's
    name. ``False`` for any other content, damaged or not, and for a file that cannot be
    opened (missing, a folder, no permission): the caller's own attempt to read it says why.
    """
    try:
        reader = TraceReader(path, chunk_bytes=SNIFF_BYTES, _limit_bytes=SNIFF_BYTES)
    except (SchemaError, OSError):
        return False
    with reader:
        return reader._has_kineto_key()
