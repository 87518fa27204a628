"""The aligner of traces without module events (``convert/align.py``), on hand-built op
streams and range trees: every expected placement worked out by hand."""

from __future__ import annotations

import pytest

from layerscope.convert.align import (
    ALIGNED,
    BY_NEIGHBOURS,
    UNPLACED,
    CallTemplate,
    align,
    place,
)
from layerscope.convert.ranges import MEMORY, MODULE_PREFIX, USER_SCOPE, Range, RangeFields

# A model: root (module 0) calls block (module 1) which calls fc1 (2) and act (3), then
# the root calls head (4). Calls: 0 root, 1 block, 2 fc1, 3 act, 4 head.
#   op 0 aten::embedding  in root
#   op 1 aten::linear     in fc1
#   op 2 aten::relu       in act
#   op 3 aten::add        in block
#   op 4 aten::linear     in head
TEMPLATE = CallTemplate(
    ops=("aten::embedding", "aten::linear", "aten::relu", "aten::add", "aten::linear"),
    call_module=(0, 1, 2, 3, 4),
    call_parent=(-1, 0, 1, 1, 0),
    op_call=(0, 2, 3, 1, 4),
)
CALLS = len(TEMPLATE.call_module)


def test_a_stream_equal_to_the_template_repeated_takes_the_fast_path() -> None:
    out = align(list(TEMPLATE.ops) * 3, TEMPLATE)
    assert out.exact
    assert out.passes == 3
    assert out.how == [ALIGNED] * 15
    # Pass p's calls are numbered p * 5 + call.
    assert out.calls == [0, 2, 3, 1, 4, 5, 7, 8, 6, 9, 10, 12, 13, 11, 14]
    assert out.unaligned == []


def test_ops_the_template_has_and_the_trace_lacks_leave_the_rest_aligned() -> None:
    # The trace's library version runs no aten::relu: the other four find their calls.
    out = align(["aten::embedding", "aten::linear", "aten::add", "aten::linear"], TEMPLATE)
    assert not out.exact
    assert out.calls == [0, 2, 1, 4]
    assert out.how == [ALIGNED] * 4
    assert out.passes == 1 and out.unaligned == []  # 4 of 5 template ops matched: 80%


def test_an_op_between_two_of_one_call_joins_it_and_one_between_calls_joins_their_common_caller() -> None:
    stream = ["aten::embedding", "aten::linear", "aten::view", "aten::relu", "aten::add", "aten::to", "aten::linear"]
    out = align(stream, TEMPLATE)
    # aten::view sits between fc1's linear (chain root, block, fc1) and act's relu (root,
    # block, act): their innermost shared call is block (1). aten::to sits between
    # block's add (root, block) and head's linear (root, head): the root (0).
    assert out.calls == [0, 2, 1, 3, 1, 0, 4]
    assert out.how == [ALIGNED, ALIGNED, BY_NEIGHBOURS, ALIGNED, ALIGNED, BY_NEIGHBOURS, ALIGNED]


def test_ops_before_the_first_aligned_op_or_after_the_last_are_in_no_module() -> None:
    stream = ["aten::to", *TEMPLATE.ops, "aten::cross_entropy_loss", "aten::sum"]
    out = align(stream, TEMPLATE)
    assert out.calls == [-1, 0, 2, 3, 1, 4, -1, -1]
    assert out.how == [UNPLACED, *[ALIGNED] * 5, UNPLACED, UNPLACED]


def test_the_number_of_passes_is_the_count_that_aligns_best_even_with_many_other_ops() -> None:
    # Two calls of the model among 40 ops of other work (a harness's own): the guess
    # len(stream) / len(template) = 10 would be wrong.
    other = [f"aten::other_{k}" for k in range(20)]
    stream = other + list(TEMPLATE.ops) + other + list(TEMPLATE.ops)
    out = align(stream, TEMPLATE)
    assert out.passes == 2
    assert out.how.count(ALIGNED) == 10
    assert out.calls[20:25] == [0, 2, 3, 1, 4]
    assert out.calls[45:50] == [5, 7, 8, 6, 9]


def test_a_pass_that_took_another_branch_is_named_and_its_ops_stay_unplaced() -> None:
    # The second call ran other ops where the block was (data-dependent control flow:
    # a routing): 3 of its 5 template ops matched (embedding and both linears), 60% <
    # 80%, so none of its ops is given a module.
    other_branch = ["aten::embedding", "aten::linear", "aten::topk", "aten::bmm", "aten::linear"]
    out = align(list(TEMPLATE.ops) + other_branch, TEMPLATE)
    assert out.passes == 2
    assert [(p, round(share, 2)) for p, share in out.unaligned] == [(1, 0.6)]
    assert out.calls[:5] == [0, 2, 3, 1, 4]
    assert out.calls[5:] == [-1] * 5
    assert out.how[5:] == [UNPLACED] * 5


def test_a_template_checks_its_own_shape() -> None:
    with pytest.raises(ValueError, match="parent 1 is not an earlier call"):
        CallTemplate(ops=("a",), call_module=(0, 1), call_parent=(1, -1), op_call=(0,))
    with pytest.raises(ValueError, match="one call per op"):
        CallTemplate(ops=("a", "b"), call_module=(0,), call_parent=(-1,), op_call=(0,))
    with pytest.raises(ValueError, match="ran in no call"):
        CallTemplate(ops=("a",), call_module=(0,), call_parent=(-1,), op_call=(3,))


def test_an_empty_stream_or_template_places_nothing() -> None:
    assert align([], TEMPLATE).calls == []
    empty = CallTemplate(ops=(), call_module=(0,), call_parent=(-1,), op_call=())
    assert align(["aten::mm"], empty).how == [UNPLACED]


# -- module ranges put into a step's tree ------------------------------------------------


def _op(name: str, start: int, end: int, *children: Range) -> Range:
    return Range(name, start, end, 1, start, list(children), RangeFields())


def _label(name: str, start: int, end: int, *children: Range) -> Range:
    return Range(name, start, end, 1, 0, list(children), RangeFields(scope=USER_SCOPE))


def _shape(rng: Range) -> object:
    """A range tree as (name, start, end, children), for comparing whole trees."""
    return (rng.name, rng.start_time_ns, rng.end_time_ns, [_shape(c) for c in rng.children])


def test_placing_wraps_each_call_around_its_ops_nested_as_the_template_says() -> None:
    alloc = Range(MEMORY, 33, 33, 1, 0, [], RangeFields(device="cuda", alloc_size=64))
    step = Range("layerscope.step", 0, 100, 1, 0, [
        _op("aten::embedding", 10, 20),
        _op("aten::linear", 22, 30, _op("aten::addmm", 23, 29)),
        alloc,
        _op("aten::relu", 35, 40),
        _op("aten::add", 42, 45),
        _op("aten::linear", 50, 60),
        _op("aten::sum", 70, 80),  # the loss: after the model's last op, in no module
    ])
    placed = place([(step, 0)], TEMPLATE)
    assert (placed.ops, placed.aligned, placed.by_neighbours, placed.unplaced, placed.passes) == (6, 5, 0, 1, 1)
    m = MODULE_PREFIX
    assert _shape(step) == ("layerscope.step", 0, 100, [
        (f"{m}0", 10, 60, [
            ("aten::embedding", 10, 20, []),
            (f"{m}1", 22, 45, [
                (f"{m}2", 22, 33, [("aten::linear", 22, 30, [("aten::addmm", 23, 29, [])]), (MEMORY, 33, 33, [])]),
                (f"{m}3", 35, 40, [("aten::relu", 35, 40, [])]),
                ("aten::add", 42, 45, []),
            ]),
            (f"{m}4", 50, 60, [("aten::linear", 50, 60, [])]),
        ]),
        ("aten::sum", 70, 80, []),
    ])


def test_a_label_inside_one_call_goes_inside_it_and_one_around_the_model_holds_its_calls() -> None:
    step = Range("layerscope.step", 0, 100, 1, 0, [
        _label("forward", 5, 65, *[
            _op("aten::embedding", 10, 20),
            _label("my_mlp", 21, 41, _op("aten::linear", 22, 30), _op("aten::relu", 35, 40)),
            _op("aten::add", 42, 45),
            _op("aten::linear", 50, 60),
        ]),
        _label("Optimizer.step#SGD.step", 70, 90, _op("aten::add_", 72, 80)),
    ])
    placed = place([(step, 0)], TEMPLATE)
    assert (placed.aligned, placed.unplaced) == (5, 0)  # the optimizer's op is not the model's
    m = MODULE_PREFIX
    assert _shape(step) == ("layerscope.step", 0, 100, [
        ("forward", 5, 65, [
            (f"{m}0", 10, 60, [
                ("aten::embedding", 10, 20, []),
                (f"{m}1", 21, 45, [
                    # The label's ops ran in fc1 and act: it goes inside block, their
                    # shared call, and the two calls inside it.
                    ("my_mlp", 21, 41, [
                        (f"{m}2", 22, 30, [("aten::linear", 22, 30, [])]),
                        (f"{m}3", 35, 40, [("aten::relu", 35, 40, [])]),
                    ]),
                    ("aten::add", 42, 45, []),
                ]),
                (f"{m}4", 50, 60, [("aten::linear", 50, 60, [])]),
            ]),
        ]),
        ("Optimizer.step#SGD.step", 70, 90, [("aten::add_", 72, 80, [])]),
    ])


# An attention: q, k and v projections (modules 1, 2, 3) in attn (call 0's module 0).
ATTENTION = CallTemplate(
    ops=(
        "aten::linear", "aten::view", "aten::transpose", "aten::linear", "aten::view", "aten::transpose",
        "aten::linear", "aten::view", "aten::transpose", "aten::matmul", "aten::softmax", "aten::matmul",
    ),
    call_module=(0, 1, 2, 3),
    call_parent=(-1, 0, 0, 0),
    op_call=(1, 0, 0, 2, 0, 0, 3, 0, 0, 0, 0, 0),
)


def test_a_library_versions_extra_views_do_not_shift_one_projection_onto_another() -> None:
    # The trace's version scales q with a mul, makes k and v contiguous and uses bmm: the
    # op names around the three linears differ, and an alignment of all ops at once may
    # pair a trace linear with the template's next one. Anchored on the ops that work,
    # each linear keeps its own module.
    # (An alignment of all ops at once pairs the second linear with v_proj's and leaves
    # the third unmatched: q, v, none.)
    stream = [
        "aten::linear", "aten::mul", "aten::view", "aten::view", "aten::reshape", "aten::transpose",
        "aten::transpose", "aten::linear", "aten::reshape", "aten::reshape", "aten::view", "aten::linear",
        "aten::mul", "aten::reshape", "aten::transpose", "aten::view", "aten::bmm", "aten::softmax", "aten::mul",
        "aten::contiguous", "aten::view", "aten::bmm", "aten::reshape", "aten::transpose",
    ]
    out = align(stream, ATTENTION)
    linears = [out.calls[i] for i, name in enumerate(stream) if name == "aten::linear"]
    assert linears == [1, 2, 3]
    assert out.unaligned == []  # every call that runs an op matched one


# A harness around a model: call 0 (module 0) runs aten::to, then module 1's linear.
HARNESSED = CallTemplate(
    ops=("aten::to", "aten::linear", "aten::relu"), call_module=(0, 1), call_parent=(-1, 0), op_call=(0, 1, 0),
)


def test_a_pass_starts_at_the_model_own_op_not_at_a_like_named_op_of_the_harness_before_it() -> None:
    # After the first call, the harness copies the output (aten::to) and its data loader
    # runs ops of its own; then the second call begins with the model's own aten::to.
    loader = ["aten::empty", "aten::random_", "aten::item", "aten::lift_fresh"]
    stream = ["aten::to", "aten::linear", "aten::relu", "aten::to", *loader, "aten::to", "aten::linear", "aten::relu"]
    out = align(stream, HARNESSED)
    assert out.passes == 2
    assert out.calls == [0, 1, 0, -1, -1, -1, -1, -1, 2, 3, 2]
    assert out.how[3:8] == [UNPLACED] * 5
