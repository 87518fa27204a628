"""The document's checks are derived from the types that hold it (``schema.spec_of``):
what a type says is declared once, by the type; what it cannot say, once, in
``schema.DECLARED``; and a declaration cannot name a field its class lacks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest

from layerscope.model.runfacts import RunFacts, RunFigures
from layerscope.model.schema import (
    BOOL,
    INT,
    META,
    NUMBER,
    STR,
    Declared,
    DictOf,
    ListOf,
    Obj,
    OneOf,
    Opt,
    Row,
    check_value,
    spec_of,
)


class Point(NamedTuple):
    x_ns: int
    label: str | None


@dataclass(frozen=True)
class Inner:
    ok: bool


@dataclass
class Record:
    name: str
    share: float
    count: int = 0
    tags: list[str] = field(default_factory=list)
    names: tuple[str, ...] = ()
    pair: tuple[int, str] | None = None
    table: dict[str, int] = field(default_factory=dict)
    inner: Inner | None = None
    points: list[Point] = field(default_factory=list)
    kind: str = "module"
    anything: Any = None
    _private: int = 0


def test_a_record_s_check_is_read_from_its_type_hints() -> None:
    declared = {Record: Declared(fields={"kind": OneOf(("module", "label")), "anything": STR})}
    assert spec_of(Record, declared) == Obj(
        {
            "name": STR, "share": NUMBER, "count": INT, "tags": ListOf(STR), "names": ListOf(STR),
            "pair": Opt(Row((INT, STR))), "table": DictOf(INT), "inner": Opt(Obj({"ok": BOOL}, frozenset({"ok"}))),
            "points": ListOf(Row((INT, Opt(STR)))), "kind": OneOf(("module", "label")), "anything": STR,
        },
        frozenset({"name", "share"}),  # the fields Python has no default for
    )


def test_what_a_type_cannot_say_is_declared_keys_required_nulls_and_fields_not_saved() -> None:
    declared = {
        Record: Declared(
            fields={"anything": STR}, required=frozenset({"count"}), nullable=frozenset({"tags"}),
            keys={"share": "fraction"}, not_saved=frozenset({"points", "inner"}),
        )
    }
    spec = spec_of(Record, declared)
    assert set(spec.fields) == {"name", "fraction", "count", "tags", "names", "pair", "table", "kind", "anything"}
    assert spec.required == {"name", "fraction", "count"} and spec.fields["tags"] == Opt(ListOf(STR))
    assert check_value({"name": "a", "fraction": 0.5, "count": 1, "tags": None}, spec) == []
    assert check_value({"name": "a", "share": 0.5}, spec) == [": no 'count'", ": no 'fraction'"]


def test_a_type_it_cannot_read_must_be_declared_and_a_declaration_must_name_a_field() -> None:
    with pytest.raises(TypeError, match=r"Record\.anything: no document check for the type typing\.Any"):
        spec_of(Record, {})
    with pytest.raises(TypeError, match="names fields Record does not have: anythin"):
        spec_of(Record, {Record: Declared(fields={"anythin": STR})})


def test_the_meta_object_checks_every_fact_and_figure_and_the_compiled_run() -> None:
    assert set(META.fields) == (
        set(spec_of(RunFacts).fields) | set(spec_of(RunFigures).fields) | {"compile"}
    )
    assert "extra" not in META.fields and "_figures" not in META.fields
    assert META.fields["step_range"] == Opt(Row((INT, INT))) and META.fields["steps"] == Opt(INT)
