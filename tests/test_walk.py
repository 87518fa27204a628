"""The walker (``attribute/walk.py``) and the tree it builds, from hand-written event
streams: no torch, no model, every number computed by hand. A stream is what a capture
backend emits (``model/raw.py``'s typed events); ``build_profile`` walks it into the tree.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from layerscope.attribute import build_profile, parent_indices, walk_pass
from layerscope.attribute.combine import Accumulator
from layerscope.attribute.profile import assemble, build_from_steps
from layerscope.attribute.walk import Dynamic
from layerscope.model.check import check_tree, tree_problems
from layerscope.model.raw import (
    Enter,
    Event,
    Exit,
    LabelEnter,
    LabelExit,
    ModuleInfo,
    ModuleShapes,
    Op,
    RawCapture,
    Step,
)
from layerscope.model.runfacts import RunFigures
from layerscope.model.tree import Profile


def op_calls(profile: Profile) -> int:
    return sum(op.calls for node in profile.nodes() for op in node.ops)


# -- raw capture -> tree, with hand-written event streams ------------------------------

# root (0 params) -> a (10) -> a.b (5); root -> c (0)
MODULES = [
    ModuleInfo(path="", type="Root", parent=None, depth=0, params=0),
    ModuleInfo(path="a", type="A", parent="", depth=1, params=10),
    ModuleInfo(path="a.b", type="B", parent="a", depth=2, params=5),
    ModuleInfo(path="c", type="C", parent="", depth=1, params=0),
]
ROOT, A, B, C = range(4)


def enter(t: int, index: int) -> Enter:
    return Enter(t_ns=t, module=index)


def leave(t: int, index: int) -> Exit:
    return Exit(t_ns=t, module=index)


def op(t0: int, t1: int, name: str, shapes: list[Any]) -> Op:
    return Op(t0_ns=t0, t1_ns=t1, name=name, input_shapes=shapes)


def build(*passes: list[Event], op_pass: list[Event] | None = None) -> Profile:
    raw = RawCapture(modules=copy.deepcopy(MODULES), timing_passes=list(passes), op_pass=op_pass)
    return check_tree(build_profile(raw))


def cpu(prof: Profile, path: str) -> tuple[int, int]:
    stats = prof[path].forward
    return stats.self_cpu_time_ns, stats.cpu_time_ns


def test_build_nested_modules() -> None:
    stream = [
        enter(0, ROOT), enter(10, A), enter(20, B), leave(50, B), leave(70, A),
        enter(80, C), leave(90, C), leave(100, ROOT),
    ]
    prof = build(stream)
    assert cpu(prof, "a.b") == (30, 30)  # 50 - 20
    assert cpu(prof, "a") == (30, 60)  # 70 - 10 = 60, minus b's 30
    assert cpu(prof, "c") == (10, 10)
    assert cpu(prof, "") == (30, 100)  # 100 - 60 - 10
    assert [n.calls for n in prof.nodes()] == [1, 1, 1, 1]
    assert prof.root.params_total == 15
    assert prof["a"].params_total == 15
    assert prof.figures.pass_cpu_time_ns == [100]


def test_build_module_called_twice() -> None:
    stream = [enter(0, ROOT), enter(10, C), leave(15, C), enter(20, C), leave(40, C), leave(50, ROOT)]
    prof = build(stream)
    assert prof["c"].calls == 2
    assert cpu(prof, "c") == (25, 25)  # 5 + 20
    assert cpu(prof, "") == (25, 50)
    assert prof["a"].calls == 0 and cpu(prof, "a") == (0, 0)


def _one_child_pass(child_ns: int, root_ns: int = 200) -> list[Event]:
    # root lasts root_ns; a lasts child_ns inside it.
    return [enter(0, ROOT), enter(10, A), leave(10 + child_ns, A), leave(root_ns, ROOT)]


def test_build_shows_the_median_pass_whole() -> None:
    prof = build(*[_one_child_pass(d, r) for d, r in ((10, 300), (50, 200), (30, 250))])
    # Passes last 300, 200, 250: the median is the third, shown whole (a 30, root
    # 250 - 30 = 220 self), so the tree adds up to a measured pass.
    assert prof.figures.shown_pass == 2
    assert cpu(prof, "a") == (30, 30)
    assert cpu(prof, "") == (220, 250)
    assert prof.figures.pass_cpu_time_ns == [300, 200, 250]


def test_build_median_pass_is_the_lower_median_and_first_of_equals() -> None:
    prof = build(*[_one_child_pass(d, r) for d, r in ((10, 400), (30, 100), (50, 300), (70, 200))])
    # 100, 200, 300, 400: the lower median 200 is the fourth pass (a 70), an observed one.
    assert prof.figures.shown_pass == 3
    assert cpu(prof, "a") == (70, 70)
    assert cpu(prof, "") == (130, 200)
    equal = build(*[_one_child_pass(d) for d in (10, 30, 50)])
    assert equal.figures.shown_pass == 1 and cpu(equal, "a") == (30, 30)


def test_build_calls_are_the_median_pass_s() -> None:
    once = [enter(0, ROOT), enter(1, C), leave(2, C), leave(10, ROOT)]
    twice = [enter(0, ROOT), enter(1, C), leave(2, C), enter(3, C), leave(4, C), leave(10, ROOT)]
    prof = build(once, twice, twice)
    assert prof["c"].calls == 2


def test_build_ops_go_to_innermost_module_and_outside_is_counted() -> None:
    stream = [
        op(-20, -10, "aten::empty", []),  # before the root: outside
        enter(0, ROOT),
        op(1, 3, "aten::add", [[2]]),  # root's own
        enter(10, A),
        enter(20, B),
        op(21, 25, "aten::mul", [[2], [2]]),  # b's
        op(26, 27, "aten::mul", [[2], [2]]),  # b's again, same shapes: same row
        op(28, 29, "aten::mul", [[3], [3]]),  # b's, other shapes: own row
        leave(30, B),
        op(31, 34, "aten::mul", [[2], [2]]),  # a's (b has exited)
        leave(40, A),
        leave(50, ROOT),
        op(60, 61, "aten::empty", []),  # after the root: outside
    ]
    prof = build(stream, op_pass=stream)
    assert prof.figures.unattributed_ops == 2

    def rows(path: str) -> list[tuple[str, int, int, list[Any]]]:
        return [(o.name, o.calls, o.cpu_time_ns, o.input_shapes) for o in prof[path].ops]

    assert rows("") == [("aten::add", 1, 2, [[2]])]
    assert rows("a") == [("aten::mul", 1, 3, [[2], [2]])]
    assert rows("a.b") == [("aten::mul", 2, 5, [[2], [2]]), ("aten::mul", 1, 1, [[3], [3]])]
    assert rows("c") == []
    for node in prof.nodes():
        for o in node.ops:
            assert o.self_cpu_time_ns == o.cpu_time_ns  # ops are one level deep
    # Op events are ignored by the timing walk: root self is 50 - 30 = 20.
    assert cpu(prof, "") == (20, 50)


def test_build_unbalanced_stream_exit_skips_an_open_frame() -> None:
    # b is entered but never exits; a's exit closes it.
    stream = [
        enter(0, ROOT), enter(10, A), enter(20, B), leave(50, A),
        op(60, 61, "aten::relu", [[1]]),  # after a's exit: the root's, not b's
        leave(100, ROOT),
    ]
    prof = build(stream, op_pass=stream)
    assert prof["a"].calls == 1
    assert prof["a"].forward.cpu_time_ns == 40  # 50 - 10, however b is accounted
    assert prof.root.calls == 1
    assert prof.root.forward.cpu_time_ns == 100
    assert [o.name for o in prof.root.ops] == ["aten::relu"]
    assert prof["a.b"].ops == []


def test_build_unbalanced_stream_left_open_and_stray_exit() -> None:
    stream = [
        leave(5, C),  # exit with nothing open: ignored
        enter(10, ROOT), enter(20, A), leave(40, A), enter(50, C),  # root and c never exit
    ]
    prof = build(stream, op_pass=stream)
    assert prof["a"].calls == 1
    assert cpu(prof, "a") == (20, 20)
    # Calls are counted when entered: root and c started a call each.
    assert prof["c"].calls == 1
    assert prof.root.calls == 1


def test_module_shapes_are_records_that_take_no_time() -> None:
    # Each module's shapes come once per capture, in whichever pass read them (here the
    # first and the third, not the median one shown); they change no figure.
    def shaped(records: list[ModuleShapes], root_ns: int) -> list[Event]:
        return [enter(0, ROOT), enter(10, A), leave(20, A), *records, leave(root_ns, ROOT)]

    a_shapes = ModuleShapes(A, [[2, 4]], [2, 8])
    root_shapes = ModuleShapes(ROOT, [[2, 4], {"mask": None}], {"y": [2, 8]})
    plain = build(*[shaped([], r) for r in (300, 200, 250)])
    prof = build(shaped([a_shapes], 300), shaped([], 200), shaped([root_shapes], 250))
    assert prof.figures.shown_pass == plain.figures.shown_pass == 2
    assert [cpu(prof, path) for path in ("", "a")] == [cpu(plain, path) for path in ("", "a")] == [(240, 250), (10, 10)]
    assert (prof["a"].input_shapes, prof["a"].output_shapes) == ([[2, 4]], [2, 8])
    assert (prof[""].input_shapes, prof[""].output_shapes) == ([[2, 4], {"mask": None}], {"y": [2, 8]})
    assert prof["c"].input_shapes is None and plain["a"].input_shapes is None
    # An untimed count reads them from its op pass.
    counted = build(op_pass=shaped([a_shapes], 100))
    assert counted["a"].input_shapes == [[2, 4]]


def test_build_without_passes_or_op_pass() -> None:
    prof = build()
    assert [n.calls for n in prof.nodes()] == [0, 0, 0, 0]
    assert op_calls(prof) == 0
    assert prof.figures.unattributed_ops == 0
    assert prof.figures.pass_cpu_time_ns is None


def test_walk_refuses_what_is_not_an_event_record() -> None:
    # An old-style positional tuple, say: refused, not silently skipped.
    with pytest.raises(TypeError, match="not an event record"):
        walk_pass([enter(0, ROOT), (1, 10, ROOT, None)], [m.path for m in MODULES])


def test_build_device_times_add_up() -> None:
    stream = [
        Enter(t_ns=0, module=ROOT, device_t_ns=0),
        Enter(t_ns=10, module=A, device_t_ns=100),
        Exit(t_ns=20, module=A, device_t_ns=400),
        Exit(t_ns=30, module=ROOT, device_t_ns=1000),
    ]
    raw = RawCapture(modules=copy.deepcopy(MODULES), timing_passes=[stream], has_device_time=True)
    prof = check_tree(build_profile(raw))
    assert prof["a"].forward.self_device_time_ns == 300
    assert prof.root.forward.self_device_time_ns == 700  # 1000 - 300
    assert prof.root.forward.device_time_ns == 1000
    assert prof["c"].forward.device_time_ns == 0


def test_build_device_times_from_ops_when_frames_have_no_device_marks() -> None:
    # A backend that times kernels, not module calls (torch's Kineto profiler): Enter and
    # Exit carry no device time, each op its kernel time. A frame's own device time is
    # that of the ops run directly in it.
    def kernel(t0: int, t1: int, name: str, device_ns: int, grad: Any = None) -> Op:
        return Op(t0_ns=t0, t1_ns=t1, name=name, input_shapes=[], device_time_ns=device_ns, grad=grad)

    stream = [
        Step(t_ns=0),
        Enter(t_ns=0, module=ROOT, seq=0),
        kernel(1, 3, "aten::add", 5),  # root's own
        Enter(t_ns=10, module=A, seq=0),
        kernel(11, 12, "aten::mul", 7),  # a's own
        Enter(t_ns=20, module=B, seq=0),
        kernel(21, 25, "aten::mm", 40),  # b's
        kernel(26, 27, "aten::relu", 2),  # b's
        Exit(t_ns=30, module=B, seq=3),  # b created autograd nodes 0..2
        Exit(t_ns=40, module=A, seq=5),  # a nodes 3..4
        Enter(t_ns=50, module=C, seq=5),
        Exit(t_ns=60, module=C, seq=5),  # c ran no op
        Exit(t_ns=100, module=ROOT, seq=5),
        kernel(110, 120, "aten::sum", 9),  # the loss, outside every frame
        kernel(130, 140, "aten::mm", 11, grad=(1, None)),  # backward of b's node 1
        Step(t_ns=200),
    ]
    raw = RawCapture(modules=copy.deepcopy(MODULES), timing_passes=[stream], op_pass=stream, has_device_time=True)
    prof = check_tree(build_profile(raw))

    def device(path: str) -> tuple[int | None, int | None]:
        stats = prof[path].forward
        return stats.self_device_time_ns, stats.device_time_ns

    assert device("a.b") == (42, 42)  # 40 + 2
    assert device("a") == (7, 49)  # 7 + b's 42
    assert device("c") == (0, 0)
    assert device("") == (5, 54)  # 5 + a's 49 + c's 0
    assert prof["a.b"].backward.self_device_time_ns == 11
    assert prof.root.backward.device_time_ns == 11
    assert prof["<loss>"].forward.self_device_time_ns == 9
    # Every op's kernel time is in exactly one node: 5 + 7 + 40 + 2 + 11 + 9.
    all_nodes = list(prof.nodes())  # the model's, then the step's parts
    assert sum(stats.self_device_time_ns or 0 for node in all_nodes for _, stats in node.phases()) == 74
    assert sum(op.device_time_ns or 0 for node in all_nodes for op in node.ops) == 74


# -- labels that enclose module calls ----------------------------------------------------


def label(t: int, name: str) -> LabelEnter:
    return LabelEnter(t_ns=t, name=name, kind="label")


def test_a_label_that_encloses_module_calls_is_their_parent() -> None:
    # root runs label L (10..90), which calls a (20..60, holding a.b 30..50) and c (70..80).
    stream = [
        enter(0, ROOT), label(10, "L"), enter(20, A), enter(30, B), leave(50, B), leave(60, A),
        enter(70, C), leave(80, C), LabelExit(t_ns=90), leave(100, ROOT),
    ]
    prof = build(stream)
    assert [child.path for child in prof.root.children] == ["[L]"]
    assert [child.path for child in prof["[L]"].children] == ["a", "c"]
    assert (prof["a"].parent, prof["a"].depth) == ("[L]", 2)
    assert (prof["a.b"].parent, prof["a.b"].depth) == ("a", 3)
    assert (prof["c"].parent, prof["c"].depth) == ("[L]", 2)
    assert cpu(prof, "[L]") == (30, 80)  # 90 - 10 = 80, minus a's 40 and c's 10
    assert cpu(prof, "a") == (20, 40)  # 60 - 20, minus b's 20
    assert cpu(prof, "a.b") == (20, 20)
    assert cpu(prof, "c") == (10, 10)
    assert cpu(prof, "") == (20, 100)  # 100 - L's 80
    assert prof["[L]"].calls == 1 and prof["a"].calls == 1


def test_labels_in_labels_hold_modules_and_keep_the_model_order() -> None:
    # c ran in no label before a ran in [L1][L2]: c keeps its place, a is found in L1's.
    stream = [
        enter(0, ROOT), enter(5, C), leave(8, C), label(10, "L1"), label(12, "L2"), enter(20, A),
        leave(30, A), LabelExit(t_ns=35), LabelExit(t_ns=40), leave(50, ROOT),
    ]
    prof = build(stream)
    assert [child.path for child in prof.root.children] == ["[L1]", "c"]  # a's place: first
    assert [child.path for child in prof["[L1]"].children] == ["[L1][L2]"]
    assert (prof["a"].parent, prof["a"].depth, prof["a.b"].depth) == ("[L1][L2]", 3, 4)
    assert cpu(prof, "[L1][L2]") == (13, 23)  # 35 - 12 = 23, minus a's 10
    assert cpu(prof, "[L1]") == (7, 30)  # 40 - 10 = 30, minus L2's 23
    assert cpu(prof, "") == (17, 50)  # 50 - c's 3 - L1's 30


def test_a_module_a_label_holds_in_part_or_from_elsewhere_stays_under_its_module() -> None:
    # c runs once in L (70..80) and once outside it (92..97): it has one place in the
    # tree, its module's; L holds a only, and its own time still leaves out c's call.
    stream = [
        enter(0, ROOT), label(10, "L"), enter(20, A), leave(60, A), enter(70, C), leave(80, C),
        LabelExit(t_ns=90), enter(92, C), leave(97, C), leave(100, ROOT),
    ]
    prof = build(stream)
    assert [child.path for child in prof.root.children] == ["[L]", "c"]
    assert [child.path for child in prof["[L]"].children] == ["a"]
    assert prof["c"].parent == "" and prof["c"].calls == 2
    assert cpu(prof, "[L]") == (30, 70)  # 80 - a's 40 - c's 10 = 30; + a's 40
    assert cpu(prof, "c") == (15, 15)  # 10 + 5
    assert cpu(prof, "") == (15, 100)  # 100 - 80 - 5

    # a runs label L, which calls c, a child of the root, not of a: c stays the root's.
    stream = [
        enter(0, ROOT), enter(10, A), label(20, "L"), enter(30, C), leave(40, C), LabelExit(t_ns=50),
        leave(60, A), leave(100, ROOT),
    ]
    prof = build(stream)
    assert prof["c"].parent == "" and prof["a[L]"].children == []
    assert cpu(prof, "a[L]") == (20, 20)  # 50 - 20 - c's 10
    assert cpu(prof, "a") == (20, 40)  # 60 - 10 - L's 30; + L's 20 (c's 10 is c's own)
    assert cpu(prof, "") == (50, 100)  # 100 - a's 50; + a's 40 + c's 10


def test_a_module_recomputed_outside_its_label_stays_under_it() -> None:
    # c's forward runs in L; backward recomputes it (activation checkpointing) in no frame.
    stream = [
        enter(0, ROOT), label(10, "L"), enter(20, C), leave(30, C), LabelExit(t_ns=40), leave(50, ROOT),
        Enter(t_ns=60, module=C, in_backward=True), Exit(t_ns=70, module=C, in_backward=True),
    ]
    prof = build(stream)
    assert prof["c"].parent == "[L]" and prof["c"].calls == 1
    assert prof["c"].recompute is not None and prof["c"].recompute.self_cpu_time_ns == 10
    assert prof["[L]"].recompute is not None and prof["[L]"].recompute.cpu_time_ns == 10  # c's


def test_passes_that_disagree_on_a_module_s_label_leave_it_under_its_module() -> None:
    in_label = [enter(0, ROOT), label(10, "L"), enter(20, C), leave(30, C), LabelExit(t_ns=40), leave(50, ROOT)]
    outside = [enter(0, ROOT), label(10, "L"), LabelExit(t_ns=15), enter(20, C), leave(30, C), leave(50, ROOT)]
    assert build(in_label, in_label, in_label)["c"].parent == "[L]"
    assert build(in_label, outside, in_label)["c"].parent == ""


def test_assemble_leaves_what_it_is_given_as_it_was() -> None:
    # A timed pass and an op pass of their own, which disagree on c's label (their made
    # nodes and enclosing labels are merged), and a made node whose parent is no node
    # (an orphan, drawn at the top level): the profile is new, and its inputs unchanged.
    in_label = [enter(0, ROOT), label(10, "L"), enter(20, C), leave(30, C), LabelExit(t_ns=40), leave(50, ROOT)]
    outside = [
        enter(0, ROOT), label(10, "M"), LabelExit(t_ns=15), enter(20, C), op(22, 28, "aten::relu", [[2]]),
        leave(30, C), leave(50, ROOT),
    ]
    paths = [info.path for info in MODULES]
    times = walk_pass(in_label, paths, has_device=False)
    ops = walk_pass(outside, paths, has_device=False, collect_ops=True, parents=parent_indices(MODULES))
    times.dynamic["[lost]"] = Dynamic(path="[lost]", parent="[nowhere]", kind="label", name="lost")
    raw = RawCapture(modules=copy.deepcopy(MODULES), meta={"model": "Root"})
    figures = RunFigures()
    given = copy.deepcopy((raw, times, ops, figures))
    prof = check_tree(assemble(raw, times, ops, figures))
    assert (raw, times, ops, figures) == given
    assert [part.path for part in prof.parts] == ["[lost]"]
    assert [child.path for child in prof.root.children] == ["a", "c", "[L]", "[M]"]  # c's label: in one pass only
    assert prof.meta is not raw.meta and prof.figures is not figures and prof.figures.unattributed_ops == 0


# -- the trace's spans: where the tree counts a call ----------------------------------


def traced(stream: list[Event], modules: list[ModuleInfo] = MODULES) -> Profile:
    """One detailed pass: its times and its spans are one run."""
    raw = RawCapture(modules=copy.deepcopy(modules), timing_passes=[stream], detailed_passes=True)
    return check_tree(build_profile(raw))


def frame_spans(prof: Profile) -> dict[str, list[tuple[int, int]]]:
    """Each node's forward spans (not its ops'), as ``(start, end)``."""
    assert prof.trace is not None
    spans: dict[str, list[tuple[int, int]]] = {}
    for span in prof.trace.spans:
        if span.op_index == -1 and span.phase == "forward":
            spans.setdefault(span.path, []).append((span.start_ns, span.start_ns + span.duration_ns))
    return spans


def assert_spans_are_the_times(prof: Profile) -> None:
    for path, spans in frame_spans(prof).items():
        assert sum(t1 - t0 for t0, t1 in spans) == prof[path].forward.cpu_time_ns, path


def test_a_module_called_from_outside_its_parent_is_drawn_under_its_parent() -> None:
    # b (a's child) runs once in a and once from c (a module shared by two callers, as
    # vLLM's rotary embedding is by every layer's attention). The tree counts both calls
    # under a, so the second is drawn in a span of a, cut out of c's.
    stream = [
        enter(0, ROOT), enter(10, A), enter(20, B), leave(30, B), leave(40, A),
        enter(50, C), op(52, 58, "aten::mul", [[2]]), enter(60, B), op(62, 68, "aten::add", [[2]]),
        leave(70, B), leave(90, C), leave(100, ROOT),
    ]
    prof = traced(stream)
    assert cpu(prof, "a.b") == (20, 20)  # 10 + 10
    assert cpu(prof, "a") == (20, 40)  # 40 - 10 - b's 10; + b's 20 (both calls)
    assert cpu(prof, "c") == (30, 30)  # 90 - 50 - b's 10
    assert cpu(prof, "") == (30, 100)  # 100 - a's 30 - c's 40
    assert frame_spans(prof) == {
        "": [(0, 100)],
        "a": [(10, 40), (60, 70)],
        "a.b": [(20, 30), (60, 70)],
        "c": [(50, 60), (70, 90)],
    }
    assert_spans_are_the_times(prof)


def test_a_module_called_from_a_label_of_another_module_cuts_the_label_too() -> None:
    # a runs label L, which calls c, a child of the root: L and a are cut around c.
    stream = [
        enter(0, ROOT), enter(10, A), label(20, "L"), enter(30, C), leave(40, C), LabelExit(t_ns=50),
        leave(60, A), leave(100, ROOT),
    ]
    prof = traced(stream)
    assert frame_spans(prof) == {
        "": [(0, 100)], "a": [(10, 30), (40, 60)], "a[L]": [(20, 30), (40, 50)], "c": [(30, 40)],
    }
    assert_spans_are_the_times(prof)


# root -> blocks (a ModuleList, never called) -> blocks.0 (-> blocks.0.rope), blocks.1
LISTED = [
    ModuleInfo(path="", type="Root", parent=None, depth=0, params=0),
    ModuleInfo(path="blocks", type="ModuleList", parent="", depth=1, params=0),
    ModuleInfo(path="blocks.0", type="Block", parent="blocks", depth=2, params=0),
    ModuleInfo(path="blocks.0.rope", type="Rope", parent="blocks.0", depth=3, params=0),
    ModuleInfo(path="blocks.1", type="Block", parent="blocks", depth=2, params=0),
]


def test_a_shared_module_in_a_later_block_is_drawn_in_the_first_block() -> None:
    # Both blocks call the one rope (the first block's child): the second call is drawn
    # under blocks.0, cut out of blocks.1; the ModuleList, never called, has no span.
    root, _, first, rope, second = range(5)
    stream = [
        enter(0, root), enter(10, first), enter(12, rope), leave(20, rope), leave(30, first),
        enter(40, second), enter(45, rope), leave(55, rope), leave(70, second), leave(80, root),
    ]
    prof = traced(stream, LISTED)
    assert cpu(prof, "blocks.0") == (12, 30)  # 20 - rope's 8; + rope's 18 (both calls)
    assert cpu(prof, "blocks.1") == (20, 20)  # 30 - rope's 10
    assert frame_spans(prof) == {
        "": [(0, 80)],
        "blocks.0": [(10, 30), (45, 55)],
        "blocks.0.rope": [(12, 20), (45, 55)],
        "blocks.1": [(40, 45), (55, 70)],
    }
    assert_spans_are_the_times(prof)


def test_a_backward_nodes_time_before_a_label_inside_it_is_the_nodes() -> None:
    """A backward node (autograd number 1, created by the root's forward 10-100) runs its
    own code 110-130, an op 130-150, its own code again 150-180, then a label inside it
    180-240 (a compiled backward's graph call, or a hook), then resumes 240-250. Every
    nanosecond from 110 to 250 is the root's backward, the label's 60 in its own node: the
    slot of the op at 130 runs to the label's start, as it runs to the next backward op's
    or a recomputed module's. <other> keeps only 0-10, 100-110 and 250-300."""
    stream = [
        Step(0),
        Enter(10, ROOT, None, 1),
        Exit(100, ROOT, None, 2),
        Op(110, 130, None, grad=(1, None)),
        Op(130, 150, "aten::zeros", grad=(1, None)),
        LabelEnter(180, "graph", "label", in_backward=True, grad=(1, None)),
        LabelExit(240, in_backward=True),
        Op(240, 240, None, grad=(1, None)),
        Op(240, 250, None, grad=(1, None)),
        Step(300),
    ]
    prof = check_tree(build_profile(RawCapture(modules=copy.deepcopy(MODULES), timing_passes=[stream])))
    backward = prof.root.backward
    assert backward is not None
    assert (backward.self_cpu_time_ns, backward.cpu_time_ns) == (80, 140)  # 110-180 and 240-250; + the label's 60
    label = next(node for node in prof.nodes() if node.kind == "label")
    assert label.backward is not None and label.backward.cpu_time_ns == 60
    other = next(node for node in prof.parts if node.path == "<other>")
    assert other.forward.self_cpu_time_ns == 10 + 10 + 50
    assert prof.step_time_ns == 300


def test_backward_run_inside_a_users_label_is_taken_out_of_the_labels_own_time() -> None:
    """``with record_function("backward"): loss.backward()``: the label (50-103) holds the
    root's backward work (53-100, autograd number 1, created by the root's forward
    10-40). The label's own time is 53 - 47 = 6; the backward's 47 is the root's; and
    every node's own time adds up to the step's wall time, 150, measured apart (its two
    marks): 10 + 10 + 47 before, between and after (<other>), 30 forward, 6 the label's,
    47 backward."""
    stream = [
        Step(0),
        Enter(10, ROOT, None, 1),
        Exit(40, ROOT, None, 2),
        LabelEnter(50, "backward", "label"),
        Op(53, 100, None, grad=(1, None)),
        LabelExit(103),
        Step(150),
    ]
    prof = check_tree(build_profile(RawCapture(modules=copy.deepcopy(MODULES), timing_passes=[stream])))
    label = next(node for node in prof.nodes() if node.kind == "label")
    own = [stats.self_cpu_time_ns for _, stats in label.phases()]
    assert sum(own) == 6
    assert prof.root.backward is not None and prof.root.backward.cpu_time_ns == 47
    assert prof.root.forward.cpu_time_ns == 30
    assert prof.step_time_ns == 150
    assert sum(stats.self_cpu_time_ns or 0 for node in prof.nodes() for _, stats in node.phases()) == 150


def test_check_tree_compares_the_step_time_with_the_clocks_wall_times() -> None:
    """The sum of every node's own time is the step time by construction; the steps'
    wall times (each step's two marks) are measured apart from it, so a node's time
    counted twice shows as a step longer than its wall clock. Two steps of 150 ns summed:
    300; a wall time read as 140 is a problem named with both figures."""
    stream = [Step(0), Enter(10, ROOT, None, 1), Exit(40, ROOT, None, 2), Step(150)]
    later = [Step(150), Enter(160, ROOT, None, 1), Exit(190, ROOT, None, 2), Step(300)]
    steps = Accumulator()
    for number, events in enumerate([stream, later]):
        steps.add(walk_pass(events, [info.path for info in MODULES]), number)
    prof = check_tree(build_from_steps(RawCapture(modules=copy.deepcopy(MODULES), timing_passes=[]), steps))
    assert (prof.step_time_ns, prof.figures.step_times_ns) == (300, [150, 150])
    assert prof.figures.step_times_ns is not None
    prof.figures.step_times_ns[1] = 140
    assert tree_problems(prof) == [
        "step_time_ns=300 != the sum of the 2 steps' wall times (290): time counted twice or lost"
    ]
