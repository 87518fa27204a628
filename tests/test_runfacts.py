"""The run's facts (``Profile.meta``): one typed field per fact, one conversion to and
from the document, every field checked by the schema, the figures apart, and the deprecated
mapping reads users were shown."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping

import pytest

from layerscope import zoo
from layerscope.model.documents import profile_from_dict
from layerscope.model.runfacts import (
    DeviceEvents,
    FromMergedRun,
    RunFacts,
    RunFigures,
    TraceSource,
    meta_to_dict,
)
from layerscope.model.schema import META, check_value
from layerscope.session import count_flops

#: A trace's nested facts as a document holds them.
TRACE_META = {
    "model": "BertModel", "device": "cuda", "mode": "trace",
    "source": {"kind": "torch.profiler trace", "file": "t.json", "device_names": ["NVIDIA H100 80GB HBM3"],
               "schema_version": 1, "record_shapes": True, "profile_memory": False, "with_stack": True},
    "modules_from": {"method": "by class", "instances": 3, "matched": 2, "unmatched": ["Drop_0"],
                     "renamed": {"Sdpa_0": "Attention"}, "uncalled": ["pooler"]},
    "device_events": {"events": 5, "time_ns": 900, "outside_steps": 1, "outside_steps_time_ns": 100, "orphans": 0,
                      "orphans_time_ns": 0},
    "from_merged_run": {"rank": 1, "not_kept": "op rows"},
}


def test_a_document_reads_back_as_written_and_keeps_what_it_does_not_know() -> None:
    doc = {"model": "Net", "device": "cpu", "mode": "context", "schedule": "every step", "step_range": [0, 2],
           "complete": False, "written_by_a_newer_version": {"x": 1}}
    facts = RunFacts.from_dict(doc)
    assert facts.schedule == "every step" and facts.complete is False and facts.step_range == [0, 2]
    assert facts.extra == {"written_by_a_newer_version": {"x": 1}}
    assert facts.to_dict() == doc
    assert RunFacts.from_dict(json.loads(json.dumps(facts.to_dict()))) == facts
    assert check_value(facts.to_dict(), META) == []


def test_an_unknown_fact_is_left_out_never_zero() -> None:
    facts = RunFacts(model="Net", device="cpu", mode="count", timed=False)
    assert facts.to_dict() == {"model": "Net", "device": "cpu", "mode": "count", "timed": False}
    assert facts.repeat is None and "repeat" not in facts.to_dict()


def test_the_facts_are_no_mapping_and_its_reads_say_which_attribute_to_read() -> None:
    facts = RunFacts.from_dict({**TRACE_META, "repeat": 5, "newer": 1})
    assert not isinstance(facts, Mapping)
    with pytest.raises(TypeError):
        "repeat" in facts  # noqa: B015
    with pytest.raises(TypeError):
        dict(facts)  # type: ignore[call-overload]
    # What users were shown (prof.meta["steps"]) still reads, as a document holds it.
    with pytest.warns(DeprecationWarning, match=r"read prof\.meta\.repeat$"):
        assert facts["repeat"] == 5
    with pytest.warns(DeprecationWarning, match=r"read prof\.meta\.device$"):
        assert facts.get("device") == "cuda"
    with pytest.warns(DeprecationWarning, match=r"read prof\.meta\.modules_from$"):
        assert facts["modules_from"]["renamed"] == {"Sdpa_0": "Attention"}
    with pytest.warns(DeprecationWarning, match=r"read prof\.meta\.extra\['newer'\]$"):
        assert facts["newer"] == 1
    with pytest.warns(DeprecationWarning, match="read prof.meta.warmup"):
        assert facts["warmup"] is None and facts.get("warmup", 3) is None
    with pytest.warns(DeprecationWarning, match="neither a fact"):
        assert facts.get("no_such_fact", 7) == 7
    with pytest.warns(DeprecationWarning), pytest.raises(KeyError):
        facts["no_such_fact"]


def test_a_misspelt_fact_raises_where_it_is_written() -> None:
    with pytest.raises(TypeError, match="step_time"):
        RunFacts(model="Net", step_time=5)  # type: ignore[call-arg]


def test_nested_facts_are_typed_records_and_their_objects_are_unchanged() -> None:
    facts = RunFacts.from_dict(TRACE_META)
    assert facts.source == TraceSource(
        kind="torch.profiler trace", file="t.json", device_names=("NVIDIA H100 80GB HBM3",), record_shapes=True,
        profile_memory=False, with_stack=True, schema_version=1,
    )
    assert facts.modules_from is not None and facts.modules_from.unmatched == ("Drop_0",)
    assert facts.modules_from.shapes is None and facts.modules_from.renamed == {"Sdpa_0": "Attention"}
    assert facts.device_events == DeviceEvents(5, 900, 1, 100, 0, 0)
    assert facts.from_merged_run == FromMergedRun(rank=1, not_kept="op rows")
    assert facts.extra == {}
    out = facts.to_dict()
    assert json.dumps(out) == json.dumps(TRACE_META)  # the same keys in the same order
    assert check_value(out, META) == []


def test_a_wrong_type_in_a_file_is_named() -> None:
    doc = copy.deepcopy(TRACE_META)
    doc["source"]["file"] = 3
    assert check_value(doc, META) == ["source.file: expected a string, got 3"]
    del doc["device_events"]["orphans"]
    assert check_value(doc, META) == ["source.file: expected a string, got 3", "device_events: no 'orphans'"]


def test_a_profile_carries_its_facts_typed_through_a_file() -> None:
    entry = zoo.get("mlp")
    prof = count_flops(entry.build(), entry.example_inputs(1))
    meta = prof.meta
    assert isinstance(meta, RunFacts)
    assert (meta.model, meta.mode, meta.timed, meta.device) == ("MLP", "count", False, "cpu")
    assert meta.inputs == [[[1, 64]], {}] and meta.input_dtypes == [["float32"], {}]
    again = profile_from_dict(json.loads(prof.render("json")))
    assert again.meta == meta and again.figures == prof.figures and again.figures.unattributed_ops == 0


def test_figures_are_apart_from_the_facts_and_where_a_document_always_had_them() -> None:
    # A Profiler block's meta as files have held it: the figures among the facts.
    doc = {"model": "Net", "device": "cpu", "mode": "context", "step_range": [0, 2], "backend": "gloo", "steps": 3,
           "step_numbers": [0, 1, 2], "step_times_ns": [5, 6, 7], "pass_cpu_time_ns": [15], "unattributed_ops": 0,
           "step_time_ns": 18, "spec": "zoo:mlp", "written_by_a_newer_version": 1}
    facts, figures = RunFacts.from_dict(doc), RunFigures.from_dict(doc)
    assert figures == RunFigures(steps=3, step_numbers=[0, 1, 2], step_times_ns=[5, 6, 7], pass_cpu_time_ns=[15],
                                 unattributed_ops=0, step_time_ns=18)
    assert facts.extra == {"written_by_a_newer_version": 1} and "steps" not in facts.to_dict()
    out = meta_to_dict(facts, figures)
    assert out == doc and list(out) == list(doc)  # the same keys in the same order: files unchanged


def test_a_figure_read_from_the_meta_still_reads_and_says_where_it_is_now() -> None:
    entry = zoo.get("mlp")
    prof = count_flops(entry.build(), entry.example_inputs(1))
    with pytest.warns(DeprecationWarning, match=r"prof\.figures\.unattributed_ops"):
        assert prof.meta["unattributed_ops"] == 0
