"""``layerscope.base.fmt``: the one module that turns numbers into strings.

Every expected string is written out by hand; none is computed with the code under test.
"""

from __future__ import annotations

import re

import pytest

from layerscope.base import fmt

# -- time_ns --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value_ns", "expected"),
    [
        (None, ""),  # not measured: a blank cell, never "0ns"
        (0, "0ns"),
        (1, "1ns"),
        (999, "999ns"),
        (1000, "1.000us"),
        (1001, "1.001us"),
        (9_999, "9.999us"),
        (10_000, "10.00us"),
        (41_200, "41.20us"),
        (99_990, "99.99us"),
        (100_000, "100.0us"),
        (141_400, "141.4us"),
        (999_900, "999.9us"),
        (1_000_000, "1.000ms"),
        (1_808_000, "1.808ms"),
        (14_030_000, "14.03ms"),
        (950_800_000, "950.8ms"),
        (1_000_000_000, "1.000s"),
        (12_345_678_901, "12.35s"),
        # Seconds is the last unit: large values keep growing in it.
        (3_600_000_000_000, "3600.0s"),
    ],
)
def test_time_ns(value_ns: int | None, expected: str) -> None:
    assert fmt.time_ns(value_ns) == expected


@pytest.mark.parametrize(
    ("value_ns", "expected"),
    [
        # Rounding 999.95us and up to four digits gives "1000.0": carry into ms instead.
        (999_949, "999.9us"),
        (999_950, "1.000ms"),
        (999_999, "1.000ms"),
        (999_999_999, "1.000s"),
    ],
)
def test_time_ns_rounding_carries_into_the_next_unit(value_ns: int, expected: str) -> None:
    assert fmt.time_ns(value_ns) == expected


@pytest.mark.parametrize(
    ("value_ns", "expected"),
    [
        # Rounding across a decade inside one unit must keep four significant digits,
        # as 100_000 -> "100.0us" does: "100.00us" would be five, and one column wider.
        (99_999, "100.0us"),
        (9_999_999, "10.00ms"),
        (99_999_999, "100.0ms"),
    ],
)
def test_time_ns_rounding_across_a_decade_keeps_four_digits(value_ns: int, expected: str) -> None:
    assert fmt.time_ns(value_ns) == expected


_TIME_TEXT = re.compile(r"^(\d+(?:\.\d+)?)(ns|us|ms|s)$")


def test_time_ns_never_prints_1000_of_a_unit_and_never_loses_precision() -> None:
    # Sweep every unit boundary closely: below it, on it, and the values whose rounding
    # carries. Each string must parse, stay below 1000 of its unit (except seconds),
    # and read back within half a unit in the last printed place.
    values = set()
    for boundary in (1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000, 1_000_000_000):
        values.update(range(boundary - 60, boundary + 60))
    scale_of = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
    for value in sorted(values):
        text = fmt.time_ns(value)
        match = _TIME_TEXT.match(text)
        assert match, f"{value} -> {text!r} does not parse"
        number, unit = match.groups()
        assert unit == "s" or float(number) < 1000, f"{value} -> {text!r}"
        decimals = len(number.partition(".")[2])
        half_place = 0.5 * 10.0**-decimals * scale_of[unit]
        assert abs(float(number) * scale_of[unit] - value) <= half_place + 1e-6, f"{value} -> {text!r}"


# -- count ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ""),
        (0, "0"),
        (36, "36"),
        (999, "999"),
        (1000, "1.00K"),
        (23_296, "23.30K"),
        (61_706, "61.71K"),
        (929_536, "929.54K"),
        (999_994, "999.99K"),
        # Rounding to 1000.00K carries to the next suffix.
        (999_995, "1.00M"),
        (61_100_840, "61.10M"),
        (11_689_512, "11.69M"),
        (1_000_000_000, "1.00G"),
        (2_500_000_000_000, "2.50T"),
        (-1500, "-1.50K"),
    ],
)
def test_count(value: int | None, expected: str) -> None:
    assert fmt.count(value) == expected


# -- nbytes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ""),
        (0, "0 B"),
        (144, "144 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (246_824, "241.04 KiB"),  # lenet5's float32 parameters: 61706 * 4
        (1024 * 1024 - 1, "1.00 MiB"),  # 1023.999 KiB rounds up, so it carries to MiB
        (1024 * 1024, "1.00 MiB"),
        (3 * 1024**3, "3.00 GiB"),
        (1024**4, "1.00 TiB"),
        (2048 * 1024**4, "2048.00 TiB"),  # the last unit keeps growing
    ],
)
def test_nbytes(value: int | None, expected: str) -> None:
    assert fmt.nbytes(value) == expected


# -- percent --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("part", "whole", "expected"),
    [
        (1, 3, "33.3%"),
        (2, 3, "66.7%"),
        (5, 5, "100.0%"),
        (0, 5, "0.0%"),
        (13, 27, "48.1%"),
        (None, 5, ""),
        (1, None, ""),
        (1, 0, ""),  # no total to divide by: blank, not a ZeroDivisionError
    ],
)
def test_percent(part: int | None, whole: int | None, expected: str) -> None:
    assert fmt.percent(part, whole) == expected


# -- shape ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ""),
        ([], "[]"),
        ([1, 3, 224, 224], "[1, 3, 224, 224]"),
        ([[1, 32, 128], [32, 128]], "[[1, 32, 128], [32, 128]]"),
        ([[1000, 128], []], "[[1000, 128], []]"),
        ({"input_ids": [2, 128]}, "{input_ids: [2, 128]}"),
        ([{"x": [2, 8]}, [3]], "[{x: [2, 8]}, [3]]"),
    ],
)
def test_shape(value: object, expected: str) -> None:
    assert fmt.shape(value) == expected


def test_shape_of_a_non_tensor_argument_is_not_an_empty_slot() -> None:
    # capture.inputs.shapes_of records a non-tensor argument (None, a float) as None.
    # Rendered inside a list it must still be visible, not a bare ", ]".
    text = fmt.shape([[2, 8], None])
    assert text.startswith("[[2, 8], ")
    assert not re.search(r",\s*[,\]]", text), text


def test_parameter_counts_say_billions_as_their_readers_do() -> None:
    """Llama-7B's 6,738,415,616 parameters read 6.74B (DeepSpeed's and torchinfo's
    billions), while its FLOPs keep the G of GFLOPs."""
    assert fmt.param_count(6_738_415_616) == "6.74B"
    assert fmt.params(6_738_415_616, None) == "6.74B"
    assert fmt.param_count(61_100_840) == "61.10M"
    assert fmt.count(6_738_415_616) == "6.74G"


def test_a_compiled_graphs_call_is_named_by_its_keys_first_characters() -> None:
    """The H100 compiled GPT-2 trace's forward graph runs in a range named by its
    52-character cache key; trees, footers and pages show its first 8 characters."""
    name = "<## Call CompiledFxGraph fwfthdzugwtaavdjqz4mdtox57aeyxjz4u25sczbgqumlhi47z2s ##>"
    assert fmt.node_name(name) == "<CompiledFxGraph fwfthdzu…>"
    assert fmt.node_name("<## Call CompiledFxGraph f ##>") == "<## Call CompiledFxGraph f ##>"  # no key to cut
