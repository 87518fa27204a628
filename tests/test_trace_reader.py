"""The streaming reader of torch.profiler (Kineto) trace files (layerscope.traces.reader),
and the tiler that makes big traces from real ones (benchmarks/trace_tile.py).

The real traces of ../shared/traces/ are read both by the reader and by ``json.load``, and
must agree event for event. Damaged files are small hand-made ones in ``tmp_path``; chunk
sizes of a few bytes cut events, strings, numbers and UTF-8 characters across reads.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import BIG, REAL_TRACES, tiered
from layerscope.base.errors import SchemaError
from layerscope.base.kineto_json import FloatText, is_kineto_trace, open_trace, us_to_ns

ROOT = Path(__file__).resolve().parents[1]
TILER = ROOT / "benchmarks" / "trace_tile.py"
LINK_ARGS = ("correlation", "External id", "Python id", "Python parent id", "Sequence number")


def as_json_load(value: Any) -> Any:
    """``value`` as ``json.load`` gives it: each :class:`FloatText` as its float."""
    if isinstance(value, FloatText):
        return float(value)
    if isinstance(value, dict):
        return {key: as_json_load(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_json_load(item) for item in value]
    return value


def read(path: Path, chunk_bytes: int = 1 << 20) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    with open_trace(path, chunk_bytes=chunk_bytes) as trace:
        events = list(trace.events())
        return events, trace.meta


def exact_ns(text: str) -> int:
    """The reference for :func:`us_to_ns`: decimal arithmetic, ties to even."""
    return int((Decimal(text) * 1000).to_integral_value(rounding=ROUND_HALF_EVEN))


def write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def schema_error(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """The one-line message of the SchemaError that reading ``path`` raises; it names the file."""
    with pytest.raises(SchemaError) as caught:
        read(path, chunk_bytes)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message, message
    return message


# -- the real traces ---------------------------------------------------------------------------


# The two ranked traces (56k and 25k events) are the slow tier's, with OWLv2: each is
# parsed twice here, once by json.load.
@pytest.mark.parametrize(
    "name", tiered(REAL_TRACES, slow=(*BIG, "mi300x_resnet_ddp_actckpt_train_rank0", "b200_gptoss_tp8_rank0")),
)
def test_a_real_trace_reads_as_json_load_reads_it(shared_traces: Path, name: str) -> None:
    path = shared_traces / f"{name}.json.gz"
    events, meta = read(path)
    with gzip.open(path, "rb") as handle:
        doc = json.load(handle)
    assert len(events) == len(doc["traceEvents"])
    assert [as_json_load(e) for e in events] == doc["traceEvents"]
    assert as_json_load(meta) == {key: value for key, value in doc.items() if key != "traceEvents"}
    assert list(meta) == [key for key in doc if key != "traceEvents"]
    # Every timestamp, exact in ns (float64 is not, at 10^12 us with three decimals).
    for event in events:
        ts = event.get("ts")
        if ts is not None:
            assert us_to_ns(ts) == (exact_ns(ts) if isinstance(ts, str) else ts * 1000)


def test_a_real_trace_cut_into_small_reads_gives_the_same_events(shared_traces: Path) -> None:
    path = shared_traces / "mi300x_bert_small_inference.json.gz"
    assert read(path, chunk_bytes=4099) == read(path)


def test_floats_are_their_source_text_and_integers_stay_integers(shared_traces: Path) -> None:
    events, meta = read(shared_traces / "h100_bert_small_inference.json.gz")
    step = events[0]
    assert step["ts"] == "1419247332972.313" and isinstance(step["ts"], FloatText)
    assert us_to_ns(step["ts"]) == 1419247332972313
    assert step["dur"] == "4426.114" and step["pid"] == 19392 and type(step["pid"]) is int
    assert meta["baseTimeNanoseconds"] == 1751410836000000000


def test_is_kineto_trace_by_content(shared_traces: Path, tmp_path: Path) -> None:
    source = shared_traces / "h100_bert_small_inference.json.gz"
    assert is_kineto_trace(source)
    plain = write(tmp_path, "trace.json", gzip.decompress(source.read_bytes()))
    assert is_kineto_trace(plain)
    # Told by content, not by name.
    assert is_kineto_trace(write(tmp_path, "gzipped.json", source.read_bytes()))
    assert is_kineto_trace(write(tmp_path, "plain.json.gz", plain.read_bytes()))
    # deviceProperties first (the B200 trace's order), schemaVersion first (the A100's).
    assert is_kineto_trace(shared_traces / "b200_gptoss_tp8_rank0.json.gz")
    assert is_kineto_trace(shared_traces / "a100_alexnet_no_modules.json.gz")


def test_is_kineto_trace_reads_only_the_start(shared_traces: Path, tmp_path: Path) -> None:
    whole = (shared_traces / "h100_owlv2_inference.json.gz").read_bytes()
    cut = write(tmp_path, "cut.json.gz", whole[: 200 << 10])  # 200 KiB of 2.3 MB
    assert is_kineto_trace(cut)
    assert "truncated" in schema_error(cut)


# -- not traces ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"schema": "layerscope/1", "meta": {}}',
        "[1, 2]",
        '"traceEvents"',
        "",
        "not json",
        '{"meta": ' + json.dumps("x" * (70 << 10)) + ', "traceEvents": []}',  # past the 64 KiB sniffed
        # A Chrome trace of another writer (layerscope's own export): traceEvents, no Kineto event.
        '{"traceEvents": []}',
        '{"traceEvents": [{"ph": "X", "name": "encoder", "cat": "module", "ts": 0, "dur": 5, "pid": 0, "tid": 0}],'
        ' "otherData": {"layerscope_version": "0.1"}}',
    ],
)
def test_is_kineto_trace_refuses_other_content(tmp_path: Path, text: str) -> None:
    assert not is_kineto_trace(write(tmp_path, "other.json", text))
    assert not is_kineto_trace(write(tmp_path, "other.json.gz", gzip.compress(text.encode())))


def test_is_kineto_trace_of_a_file_it_cannot_open_is_false(tmp_path: Path) -> None:
    assert not is_kineto_trace(tmp_path / "missing.json")
    assert not is_kineto_trace(tmp_path)


def test_is_kineto_trace_of_a_small_hand_made_trace(tmp_path: Path) -> None:
    assert is_kineto_trace(write(tmp_path, "t.json", ' {"traceEvents": [{"ph": "X", "cat": "cpu_op"}, {"ph": "X"'))  # cut: only the start is read
    assert not is_kineto_trace(write(tmp_path, "u.json", '{"traceEvents": [{"ph": "X"'))  # no event of torch's read yet
    assert is_kineto_trace(write(tmp_path, "s.json", '{"other": [1, 2], "schemaVersion": 1}'))
    assert not is_kineto_trace(write(tmp_path, "n.json", '{"other": [1, 2], "nested": {"traceEvents": []}}'))


# -- us_to_ns ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ns"),
    [
        ("1419247333291.708", 1419247333291708),
        (FloatText("1419116104994.671"), 1419116104994671),
        ("5.74", 5740),
        ("0.5", 500),
        ("10", 10000),
        ("0.001", 1),
        ("1e3", 1_000_000),
        ("1E+3", 1_000_000),
        ("2.5e-2", 25),
        ("-3.25", -3250),
        ("-0.0", 0),
        ("1.0000000000000001e-05", 0),  # 0.01 ns
        ("0.0015", 2),  # 1.5 ns: ties to even
        ("0.0025", 2),
        ("0.0025000001", 3),
        ("-0.0015", -2),
        ("1419247333291.7085", 1419247333291708),
        ("1419247333291.708999", 1419247333291709),
        ("123456789012345678901234567890", 123456789012345678901234567890000),
        (1419247333291, 1419247333291000),
        (-7, -7000),
        (5.74, 5740),
        (1419247333291.708, 1419247333291708),
    ],
)
def test_us_to_ns_is_exact(value: Any, ns: int) -> None:
    assert us_to_ns(value) == ns


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "1_000", " 1.5", "1.5 ", "\u0663.000", "1e", ".5", "+1", "1e100"])
def test_us_to_ns_refuses_text_that_is_not_a_time(text: str) -> None:
    with pytest.raises(ValueError):
        us_to_ns(text)


@pytest.mark.parametrize("value", [True, None, [1], float("nan"), float("inf")])
def test_us_to_ns_refuses_other_values(value: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        us_to_ns(value)


@given(
    digits=st.integers(min_value=0, max_value=10**20),
    decimals=st.integers(min_value=0, max_value=9),
    exponent=st.one_of(st.none(), st.integers(min_value=-12, max_value=12)),
    negative=st.booleans(),
)
def test_us_to_ns_agrees_with_decimal_arithmetic(digits: int, decimals: int, exponent: int | None, negative: bool) -> None:
    text = str(digits).rjust(decimals + 1, "0")
    if decimals:
        text = f"{text[:-decimals]}.{text[-decimals:]}"
    if exponent is not None:
        text += f"e{exponent}"
    if negative:
        text = "-" + text
    assert us_to_ns(text) == exact_ns(text)


@given(ns=st.integers(min_value=0, max_value=10**16))
def test_three_decimals_round_trip(ns: int) -> None:
    assert us_to_ns(f"{ns // 1000}.{ns % 1000:03d}") == ns


# -- events cut across reads -----------------------------------------------------------------

HAND_MADE = {
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "GPU \u00e9\u65e5\u672c", "clock": 1.5e9}],
    "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1419247333291.708, "dur": 22.51,
         "args": {"External id": 2, "Input Dims": [[1, 512], []], "Concrete Inputs": ["", "0"], "flag": True}},
        {"ph": "X", "name": "quote \" backslash \\ tab \t \u00e9 \u65e5 \U0001f600", "ts": 1e3, "dur": 0.001,
         "args": {"none": None, "no": False, "neg": -12.5e-3, "big": 123456789012345678901234567890}},
        {"ph": "i", "s": "t", "name": "[memory]", "ts": 1419247333291, "args": {"Bytes": -512, "Addr": 94}},
        {"ph": "M", "name": "process_name", "pid": "Spans", "tid": 0, "args": {"name": "x" * 300}},
        {},
    ],
    "traceName": "/tmp/file.json",
    "roctracer_version": 4.1,
    "baseTimeNanoseconds": 1751410836000000000,
}


@pytest.mark.parametrize("layout", ["compact", "indented", "crlf"])
@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 7, 64, 1 << 20])
def test_events_cut_by_the_chunk_boundary(tmp_path: Path, layout: str, chunk_bytes: int) -> None:
    if layout == "compact":
        text = json.dumps(HAND_MADE, separators=(",", ":"), ensure_ascii=False)
    elif layout == "indented":  # torch's own writer puts newlines and spaces between events
        text = json.dumps(HAND_MADE, indent=2, ensure_ascii=False)
    else:
        text = "\r\n\t " + json.dumps(HAND_MADE, indent="\t", ensure_ascii=False).replace("\n", "\r\n") + "\r\n"
    for path in (write(tmp_path, "t.json", text), write(tmp_path, "t.json.gz", gzip.compress(text.encode()))):
        events, meta = read(path, chunk_bytes)
        expected = json.loads(text)
        assert [as_json_load(e) for e in events] == expected["traceEvents"]
        assert as_json_load(meta) == {k: v for k, v in expected.items() if k != "traceEvents"}
        assert events[0]["ts"] == "1419247333291.708" and events[1]["ts"] == "1000.0"
        assert isinstance(meta["roctracer_version"], FloatText) and meta["baseTimeNanoseconds"] == 1751410836000000000


def test_meta_after_the_events_is_there_once_they_are_read(tmp_path: Path) -> None:
    path = write(tmp_path, "t.json", '{"a": 1, "traceEvents": [{"ts": 1}, {"ts": 2}], "b": 2.50}')
    with open_trace(path, chunk_bytes=3) as trace:
        events = trace.events()
        next(events)
        assert trace.meta == {"a": 1}
        assert list(events) == [{"ts": 2}]
        assert trace.meta == {"a": 1, "b": "2.50"} and trace.events_read == 2


def test_an_empty_event_list_and_a_byte_order_mark(tmp_path: Path) -> None:
    assert read(write(tmp_path, "t.json", '\ufeff{"traceEvents": [ ], "schemaVersion": 1}')) == ([], {"schemaVersion": 1})


def test_events_reads_once_and_closes_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "t.json", '{"traceEvents": [{"ts": 1}, {"ts": 2}]}')
    trace = open_trace(path)
    events = trace.events()
    next(events)
    events.close()  # the caller stopped early
    assert trace._source.handle.closed
    with pytest.raises(RuntimeError, match="already called"):
        next(trace.events())


# -- damaged files -------------------------------------------------------------------------------

TRACE_TEXT = json.dumps(
    {"traceEvents": [{"ph": "X", "name": f"op{i}", "ts": 1419247333291.708 + i, "dur": 1.5} for i in range(200)],
     "schemaVersion": 1},
    separators=(",", ":"),
)


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no such trace file: .*missing\.json"):
        open_trace(tmp_path / "missing.json")


@pytest.mark.parametrize("name", ["empty.json", "empty.json.gz"])
def test_an_empty_file(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, name, gzip.compress(b"  \n") if name.endswith(".gz") else b"")
    assert "is empty" in schema_error(path)


@pytest.mark.parametrize("chunk_bytes", [7, 1 << 20])
@pytest.mark.parametrize("cut", [len(TRACE_TEXT) // 2, TRACE_TEXT.index("},{", 5000) + 1, TRACE_TEXT.index("},{", 5000) + 2])
def test_json_cut_in_the_middle_of_the_events_is_truncated(tmp_path: Path, chunk_bytes: int, cut: int) -> None:
    for path in (write(tmp_path, "t.json", TRACE_TEXT[:cut]), write(tmp_path, "t.json.gz", gzip.compress(TRACE_TEXT[:cut].encode()))):
        message = schema_error(path, chunk_bytes)
        assert "is truncated" in message and "events of 'traceEvents'" in message


def test_json_cut_after_the_events_is_truncated(tmp_path: Path) -> None:
    message = schema_error(write(tmp_path, "t.json", TRACE_TEXT[:-3]))
    assert "is truncated" in message


@pytest.mark.parametrize("chunk_bytes", [7, 1 << 20])
def test_a_truncated_gzip_stream(tmp_path: Path, chunk_bytes: int) -> None:
    data = gzip.compress(TRACE_TEXT.encode())
    cut = len(data) // 2
    message = schema_error(write(tmp_path, "t.json.gz", data[:cut]), chunk_bytes)
    assert f"is truncated: its gzip stream ended early, after {cut:,} compressed bytes" in message


def test_a_damaged_gzip_stream(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(TRACE_TEXT.encode()))
    data[len(data) // 2] ^= 0xFF
    data[len(data) // 2 + 1] ^= 0xFF
    message = schema_error(write(tmp_path, "t.json.gz", bytes(data)))
    assert "gzip" in message


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_text_that_is_not_utf8(tmp_path: Path, name: str) -> None:
    data = TRACE_TEXT.replace("op7", "op\udcff", 1).encode("utf-8", "surrogateescape")  # a lone 0xff byte
    path = write(tmp_path, name, gzip.compress(data) if name.endswith(".gz") else data)
    message = schema_error(path, chunk_bytes=64)
    assert "not UTF-8" in message and "0xff" in message and f"offset {data.index(0xFF):,}" in message


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("hello", "is not JSON"),
        ("<html></html>", "is not JSON"),
        ("[1, 2]", "holds a JSON list, not an object"),
        ("123", "holds a JSON number"),
        ('{"schema": "x"}', "no 'traceEvents' list (top-level keys: 'schema'); expected Kineto's"),
        ("{}", "no 'traceEvents' list"),
        ('{"traceEvents": {}}', "'traceEvents' is an object, expected a list of events"),
        ('{"traceEvents": null}', "'traceEvents' is null, expected a list"),
        ('{"traceEvents": [{"ts": 1}, 2]}', "event 2 of 'traceEvents' is a number, expected an object"),
        ('{"traceEvents": [{"ts": 1}, "x"]}', "event 2 of 'traceEvents' is a string"),
        ('{"traceEvents": [], "traceEvents": []}', "two 'traceEvents' keys"),
        ('{"traceEvents": [{"ts": NaN}]}', "NaN, which is not a number JSON allows"),
        ('{"traceEvents": [{"ts": -Infinity}]}', "-Infinity"),
        ('{"schemaVersion": Infinity, "traceEvents": []}', "Infinity"),
        ('{"traceEvents": []} {}', "more text after its JSON object"),
        ('{"traceEvents": [{"ts": 1},, {"ts": 2}]}', "is not valid JSON"),
        ('{"traceEvents": [{"ts": 1} {"ts": 2}]}', "where ',' or ']' after event 1 of 'traceEvents' was expected"),
        ('{"traceEvents": [{"ts": 1}], "a" 1}', "where ':' after key 'a' was expected"),
        ('{"traceEvents": [{"ts": 1}], }', "where a key in double quotes after the end of 'traceEvents' was expected"),
        ('{"traceEvents": [{"ts": tru}]}', "is not valid JSON"),
    ],
)
def test_json_that_is_not_a_trace(tmp_path: Path, text: str, said: str) -> None:
    for chunk_bytes in (3, 1 << 20):
        assert said in schema_error(write(tmp_path, "t.json", text), chunk_bytes)


def test_bad_json_in_the_middle_is_not_called_truncated(tmp_path: Path) -> None:
    broken = TRACE_TEXT.replace('"name":"op50"', '"name":op50', 1)
    path = write(tmp_path, "t.json", broken)
    with open_trace(path, chunk_bytes=16) as trace:
        seen = []
        with pytest.raises(SchemaError) as caught:
            for event in trace.events():
                seen.append(event)
    message = str(caught.value)
    assert len(seen) == 50 and "truncated" not in message
    assert f"is not valid JSON at character {broken.index(':op50') + 1:,} (in event 51 of 'traceEvents')" in message


# -- the tiler -------------------------------------------------------------------------------


def test_the_tiler_repeats_a_real_trace_with_its_ids_apart(shared_traces: Path, tmp_path: Path) -> None:
    source = shared_traces / "mi300x_norm_layers_fwd_bwd.json.gz"  # fwdbwd flows and sequence numbers
    out = tmp_path / "tiled.json.gz"
    asked = 20_000
    done = subprocess.run(
        [sys.executable, str(TILER), str(source), str(out), "--events", str(asked)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["tiled.json.gz"]  # written atomically: no temporary left
    src_events, src_meta = read(source)
    events, meta = read(out)
    assert len(events) == asked
    assert meta == src_meta and list(meta) == list(src_meta)
    with gzip.open(out, "rb") as handle:
        assert len(json.load(handle)["traceEvents"]) == asked

    # Copy 0 is the source; each later copy its events but the metadata ones, shifted.
    tiled = [e for e in src_events if e.get("ph") != "M"]
    copies = [events[: len(src_events)]]
    rest = events[len(src_events) :]
    while rest:
        copies.append(rest[: len(tiled)])
        rest = rest[len(tiled) :]
    assert len(copies) == 3 and sum(e.get("ph") == "M" for e in events) == len(src_events) - len(tiled)
    time_step = us_to_ns(copies[1][0]["ts"]) - us_to_ns(tiled[0]["ts"])
    id_step = copies[1][0]["args"]["External id"] - tiled[0]["args"]["External id"]
    assert time_step > 0 and id_step >= 1000

    def ids(copy: list[dict[str, Any]]) -> set[tuple[str, int]]:
        found = set()
        for event in copy:
            if event.get("ph") in ("s", "f", "t"):
                found.add((f"flow {event['cat']}", event["id"]))
            for key in LINK_ARGS:
                value = (event.get("args") or {}).get(key)
                if type(value) is int:
                    found.add((key, value))
        return found

    for k, copy in enumerate(copies):
        for made, original in zip(copy, src_events if k == 0 else tiled):
            if original.get("ph") == "M":
                assert made == original
                continue
            # Times move by k steps, exactly, and are written with three decimals.
            assert us_to_ns(made["ts"]) - us_to_ns(original["ts"]) == k * time_step
            assert isinstance(made["ts"], FloatText) and len(made["ts"].partition(".")[2]) == 3
            shifted = dict(original, ts=made["ts"])
            if original.get("ph") in ("s", "f", "t"):
                shifted["id"] = original["id"] + k * id_step
            if "args" in original:
                shifted["args"] = dict(original["args"])
                for key in LINK_ARGS:
                    value = original["args"].get(key)
                    if type(value) is int:
                        shifted["args"][key] = value + k * id_step
            assert made == shifted
    found = [ids(copy) for copy in copies]
    assert all(found)
    for i in range(len(found)):
        for j in range(i):
            assert not found[i] & found[j]


def test_the_tiler_teaches_its_use() -> None:
    done = subprocess.run([sys.executable, str(TILER), "--help"], capture_output=True, text=True, check=True)
    assert "--events" in done.stdout and "correlation" in done.stdout
