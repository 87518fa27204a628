"""The run's facts (``Profile.meta``): one typed field per fact, one conversion to and
from the document, every field checked by the schema, and the mapping reads users know."""

from __future__ import annotations

import dataclasses
import json

import pytest

from layerscope import zoo
from layerscope.model.documents import profile_from_dict
from layerscope.model.runfacts import RunFacts
from layerscope.model.schema import META, check_value
from layerscope.session import count_flops


def test_the_schema_checks_every_fact() -> None:
    names = {f.name for f in dataclasses.fields(RunFacts)} - {"extra"}
    assert names - set(META.fields) == set()
    # and names nothing a RunFacts does not have, but the compiled run kept beside it
    assert set(META.fields) - names == {"compile"}


def test_a_document_reads_back_as_written_and_keeps_what_it_does_not_know() -> None:
    doc = {"model": "Net", "device": "cpu", "mode": "context", "steps": 3, "step_times_ns": [5, 6, 7],
           "step_range": [0, 2], "complete": False, "written_by_a_newer_version": {"x": 1}}
    facts = RunFacts.from_dict(doc)
    assert facts.steps == 3 and facts.complete is False and facts.step_range == [0, 2]
    assert facts.extra == {"written_by_a_newer_version": {"x": 1}}
    assert facts.to_dict() == doc
    assert RunFacts.from_dict(json.loads(json.dumps(facts.to_dict()))) == facts
    assert check_value(facts.to_dict(), META) == []


def test_an_unknown_fact_is_left_out_never_zero() -> None:
    facts = RunFacts(model="Net", device="cpu", mode="count", timed=False)
    assert facts.to_dict() == {"model": "Net", "device": "cpu", "mode": "count", "timed": False}
    assert facts.steps is None and "steps" not in facts and facts.get("steps") is None and facts["steps"] is None
    with pytest.raises(KeyError):
        facts["no_such_fact"]


def test_the_mapping_reads_what_the_fields_hold() -> None:
    facts = RunFacts(model="Net", device="cuda:0", mode="profile", repeat=5, pass_cpu_time_ns=[3, 4])
    assert facts["repeat"] == 5 and facts.get("device") == "cuda:0" and "repeat" in facts
    assert dict(facts) == facts.to_dict() and len(facts) == 5
    assert list(facts) == ["model", "device", "mode", "repeat", "pass_cpu_time_ns"]


def test_a_misspelt_fact_raises_where_it_is_written() -> None:
    with pytest.raises(TypeError, match="step_time"):
        RunFacts(model="Net", step_time=5)  # type: ignore[call-arg]


def test_a_wrong_type_in_a_file_is_named() -> None:
    problems = check_value({"model": "Net", "source": {"kind": "torch.profiler trace", "file": 3}}, META)
    assert problems == ["source.file: expected a string, got 3"]


def test_a_profile_carries_its_facts_typed_through_a_file() -> None:
    entry = zoo.get("mlp")
    prof = count_flops(entry.build(), entry.example_inputs(1))
    meta = prof.meta
    assert isinstance(meta, RunFacts)
    assert (meta.model, meta.mode, meta.timed, meta.device) == ("MLP", "count", False, "cpu")
    assert meta.inputs == [[[1, 64]], {}] and meta.input_dtypes == [["float32"], {}]
    again = profile_from_dict(json.loads(prof.render("json")))
    assert again.meta == meta and again.meta.unattributed_ops == meta.unattributed_ops == 0
