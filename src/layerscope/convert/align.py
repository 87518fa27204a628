"""Module calls for a trace that recorded none: its ops aligned to the model's call template.

A trace recorded without ``with_stack`` holds ops, labels and steps but no
``nn.Module`` events. Given the model, its *call template* (the outermost ops one call of
it runs, in order, each with the module calls open around it: ``capture/template.py``
learns it from one run of a meta copy) is aligned to each step's own outermost forward
ops, and every op takes the module call of its counterpart. The trace's ranges then get
the module ranges the Python tracer would have written, and the rest of the read is the
with-stack read's: backward ops follow their forward op's module through autograd's
sequence numbers, as they always do.

The alignment (:func:`align`), on op names:

- **Exact fast path**: the stream is the template, once or ``k`` times.
- **Otherwise** an anchored longest-common-subsequence alignment of the stream against
  the template repeated ``k`` times (``k`` the number of model calls in the step: the
  count that aligns with the fewest edits, found by a ternary search): the ops that do
  work (not the views, casts and allocations of :data:`LIGHT_OPS`) are aligned first, so
  a library version's extra ``contiguous`` cannot shift a ``q_proj`` onto a ``k_proj``;
  then every op between two matched anchors. Both by rapidfuzz's bit-parallel ``Indel``.
  A long stream is aligned a few calls at a time (:func:`_chunked`), so time and memory
  grow linearly with it (docs/benchmarks.md has the times).
- **Ops without a counterpart** (library version drift: an ``aten::reshape`` more or
  less) take the innermost call that the aligned ops on either side of them share:
  *placed by neighbours*. Ops before a pass's first aligned op or after its last stay
  outside the model (a wrapper's own ops, a loss): *unplaced*.
- **Confidence**: a pass (one repetition of the template) is *aligned* when
  :data:`CONFIDENT` of the template's calls that run ops of their own had one matched,
  half the template's ops were, and every call of a module with parameters had one (a
  model of another depth, a branch the template did not take). Otherwise the pass is
  named in the profile's facts, and no op of its step keeps a module (they stay with the
  enclosing labels and steps: a model of half the depth reads as two passes, the first
  aligned, so the step's other passes are in doubt too). Data-dependent control flow the
  template did not take (a routing, an early exit: whole calls without a match) is named.
  A branch between two modules that run the same ops (of the same shapes) cannot be told
  from the ops: the template's guesses are named, with a warning.

Each op's placement is counted (:class:`~layerscope.model.runfacts.OpPlacement`).
Pure: no torch; rapidfuzz is imported when a stream is not the template.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from layerscope.convert.ranges import (
    ACCUMULATE,
    EVALUATE,
    MEMORY,
    MODULE_PREFIX,
    USER_SCOPE,
    Range,
    RangeFields,
    label_kind,
)
from layerscope.model.runfacts import OpPlacement

#: The share of the template's calls that run ops of their own which must each have one
#: matched for a pass to count as aligned (:func:`_confident`): below it, the run took
#: another branch than the template (its step's ops stay unattributed, named).
CONFIDENT = 0.8

#: How an op was placed.
ALIGNED, BY_NEIGHBOURS, UNPLACED = "aligned", "by neighbours", "unplaced"


@dataclass(frozen=True)
class CallTemplate:
    """One call of a model as its outermost ops (``ops``: op names, in call order) and
    the module calls around them: call ``c`` is a call of module ``call_module[c]`` (its
    index in ``named_modules()`` order, as a profile's tree), inside call
    ``call_parent[c]`` (-1: the model's own call, the root); op ``i`` ran directly in call
    ``op_call[i]``. ``guesses`` names each data-dependent read the template's run
    answered without data (a meta tensor has none)."""

    ops: tuple[str, ...]
    call_module: tuple[int, ...]
    call_parent: tuple[int, ...]
    op_call: tuple[int, ...]
    guesses: tuple[str, ...] = ()
    #: The labels (``record_function`` ranges) the model opens inside its calls, each
    #: with the call it was opened in (a label holding all of a call's ops is inside it
    #: when named here, else read as opened around it).
    labels: tuple[tuple[str, int], ...] = ()
    #: The modules (indices) with parameters of their own: a pass in which a call of one
    #: of them ran no op is not aligned (a model of another depth, another branch).
    weighty: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if len(self.call_module) != len(self.call_parent):
            raise ValueError("a call template needs one parent per call")
        if len(self.ops) != len(self.op_call):
            raise ValueError("a call template needs one call per op")
        for at, parent in enumerate(self.call_parent):
            if not -1 <= parent < at:
                raise ValueError(f"call {at}'s parent {parent} is not an earlier call")
        if any(not 0 <= c < len(self.call_module) for c in self.op_call):
            raise ValueError("an op of a call template ran in no call of it")


@dataclass
class Aligned:
    """One stream's alignment: each op's call (``calls[i]``: ``pass * len(call_module) +
    call``, -1 for none) and how it was placed (``how[i]``), the passes it holds, and
    those not aligned with confidence (``(pass, share of the template matched)``)."""

    calls: list[int]
    how: list[str]
    passes: int
    unaligned: list[tuple[int, float]]
    #: Whether the stream was the template repeated, op for op.
    exact: bool = False


def align(names: list[str], template: CallTemplate) -> Aligned:
    """Each op of ``names`` (one step's outermost forward ops, in order) placed in a call
    of ``template`` repeated (module docstring)."""
    n = len(template.ops)
    calls_per_pass = len(template.call_module)
    if not names or not n:
        return Aligned([-1] * len(names), [UNPLACED] * len(names), 0, [])
    if len(names) % n == 0 and all(names[i] == template.ops[i % n] for i in range(len(names))):
        calls = [(i // n) * calls_per_pass + template.op_call[i % n] for i in range(len(names))]
        return Aligned(calls, [ALIGNED] * len(names), len(names) // n, [], exact=True)

    codes: dict[str, int] = {}
    stream = [codes.setdefault(name, len(codes)) for name in names]
    once = [codes.setdefault(name, len(codes)) for name in template.ops]
    light = {code for name, code in codes.items() if name in LIGHT_OPS}
    matched_to, passes = _chunked(stream, once, light)
    _slide_to_runs(matched_to, stream, n, passes)

    per_pass = [0] * passes
    covered: list[set[int]] = [set() for _ in range(passes)]
    for j in matched_to:
        if j >= 0:
            per_pass[j // n] += 1
            covered[j // n].add(template.op_call[j % n])
    working = set(template.op_call)
    # The calls of modules with parameters that run ops: each must have one matched.
    needed = {c for c in working if template.call_module[c] in template.weighty}
    unaligned = [
        (p, per_pass[p] / n) for p in range(passes)
        if not _confident(per_pass[p], n, len(covered[p]), len(working)) or not needed <= covered[p]
    ]
    dropped = {p for p, _ in unaligned}

    calls = [-1] * len(names)
    how = [UNPLACED] * len(names)
    for i, j in enumerate(matched_to):
        if j >= 0 and j // n not in dropped:
            calls[i] = (j // n) * calls_per_pass + template.op_call[j % n]
            how[i] = ALIGNED
    _place_by_neighbours(calls, how, template)
    return Aligned(calls, how, passes, unaligned)


#: Ops that reshape, view, cast or allocate: the library versions a template and a trace
#: come from differ most in these (``reshape`` for ``view``, an extra ``contiguous``), and
#: they are too alike to tell calls apart. The alignment first matches the other ops, the
#: anchors, then these between them.
LIGHT_OPS = frozenset({
    "aten::view", "aten::reshape", "aten::_unsafe_view", "aten::transpose", "aten::permute", "aten::t",
    "aten::contiguous", "aten::expand", "aten::expand_as", "aten::unsqueeze", "aten::squeeze", "aten::slice",
    "aten::select", "aten::narrow", "aten::flatten", "aten::unflatten", "aten::split", "aten::split_with_sizes",
    "aten::chunk", "aten::unbind", "aten::as_strided", "aten::alias", "aten::detach", "aten::detach_",
    "aten::lift_fresh", "aten::to", "aten::_to_copy", "aten::type_as", "aten::empty", "aten::empty_like",
    "aten::empty_strided", "aten::size", "aten::stride", "aten::item", "aten::is_nonzero", "aten::_local_scalar_dense",
    "aten::clone", "aten::copy_", "aten::zeros", "aten::ones", "aten::full", "aten::arange", "aten::mul", "aten::add",
    "aten::div", "aten::sub", "aten::repeat", "aten::cat", "aten::stack",
})


def _indel() -> Any:
    """rapidfuzz's ``Indel`` (imported on first use: a trace read without alignment, or
    a stream equal to its template, never needs it)."""
    from rapidfuzz.distance import Indel

    return Indel


def _matches(stream: list[int], target: list[int], out: list[int], at_stream: int, at_target: int) -> list[tuple[int, int]]:
    """A longest common subsequence of ``stream`` and ``target`` (rapidfuzz's Indel), each
    match written into ``out`` (offset by ``at_stream`` / ``at_target``); the pairs."""
    pairs: list[tuple[int, int]] = []
    if not stream or not target:
        return pairs
    if stream == target:
        for k in range(len(stream)):
            out[at_stream + k] = at_target + k
            pairs.append((at_stream + k, at_target + k))
        return pairs
    for code in _indel().opcodes(stream, target):
        if code.tag == "equal":
            for offset in range(code.src_end - code.src_start):
                at = (at_stream + code.src_start + offset, at_target + code.dest_start + offset)
                out[at[0]] = at[1]
                pairs.append(at)
    return pairs


def _anchored(stream: list[int], target: list[int], light: set[int]) -> list[int]:
    """Each stream op's position in ``target``, or -1: the anchors (ops not in ``light``)
    aligned first, then, between each two matched anchors, every op (module
    docstring)."""
    matched_to = [-1] * len(stream)
    heavy_s = [i for i, code in enumerate(stream) if code not in light]
    heavy_t = [j for j, code in enumerate(target) if code not in light]
    anchors: list[tuple[int, int]] = []
    scratch = [-1] * len(heavy_s)
    for a, b in _matches([stream[i] for i in heavy_s], [target[j] for j in heavy_t], scratch, 0, 0):
        anchors.append((heavy_s[a], heavy_t[b]))
    previous_i = previous_j = -1
    for i, j in [*anchors, (len(stream), len(target))]:
        if i < len(stream):
            matched_to[i] = j
        if i - previous_i > 1 and j - previous_j > 1:  # ops on both sides of the gap
            _matches(stream[previous_i + 1 : i], target[previous_j + 1 : j], matched_to, previous_i + 1, previous_j + 1)
        previous_i, previous_j = i, j
    return matched_to


#: A stream is aligned a few model calls at a time, about this many ops of them (each
#: piece's cost grows with its length times the template's: pieces keep the whole
#: linear in the stream's length, and its memory bounded).
CHUNK_OPS = 2048


def _match(stream: list[int], once: list[int], light: set[int]) -> tuple[list[int], int]:
    """Each op's position in ``once`` repeated (-1: none), and the repeats: the count
    that aligns with the fewest edits (:func:`_passes`), then :func:`_anchored`."""
    indel = _indel()
    passes = _passes(stream, once, lambda k: indel.distance(stream, once * k))
    return _anchored(stream, once * passes, light), passes


def _chunked(stream: list[int], once: list[int], light: set[int]) -> tuple[list[int], int]:
    """:func:`_match` over the whole stream, a piece at a time: a piece of ``c + 1``
    calls' worth of ops (``c`` calls in :data:`CHUNK_OPS`, at least 2) is aligned, the calls that
    end well before its edge are kept (``c`` at most), and the next piece begins after
    the last kept call's last op. Calls no op matched are no calls. A short stream is
    one piece."""
    n = len(once)
    per_piece = max(2, CHUNK_OPS // n)
    size = (per_piece + 1) * n
    if len(stream) <= 2 * size:
        local, passes = _match(stream, once, light)
        found = sorted({j // n for j in local if j >= 0})
        renumber = {p: r for r, p in enumerate(found)}
        return [renumber[j // n] * n + j % n if j >= 0 else -1 for j in local], len(found)
    out = [-1] * len(stream)
    passes = 0
    pos = 0
    while pos < len(stream):
        end = min(len(stream), pos + size)
        local, _ = _match(stream[pos:end], once, light)
        last_of: dict[int, int] = {}
        for i, j in enumerate(local):
            if j >= 0:
                last_of[j // n] = i
        keep = sorted(last_of)
        if end < len(stream):
            # A call near the piece's edge may go on past it: the next piece takes it.
            keep = [p for p in keep if last_of[p] < end - pos - n // 2][:per_piece]
        if not keep:
            pos = len(stream) if end == len(stream) else end - n
            continue
        renumber = {p: passes + r for r, p in enumerate(keep)}
        for i, j in enumerate(local):
            if j >= 0 and j // n in renumber:
                out[pos + i] = renumber[j // n] * n + j % n
        passes += len(keep)
        pos = len(stream) if end == len(stream) else pos + last_of[keep[-1]] + 1
    return out, passes


def _confident(matched: int, template_ops: int, calls_matched: int, calls: int) -> bool:
    """Whether a pass aligned: :data:`CONFIDENT` of the template's calls that run ops of
    their own had one of them matched, and at least half the template's ops were. A
    library version's drift (``bmm`` for ``matmul``, a ``contiguous`` more) leaves every
    call some of its ops; another branch of the model (experts a router did not pick, a
    layer an early exit skipped) leaves whole calls without any."""
    return calls_matched >= CONFIDENT * calls and 2 * matched >= template_ops


def _passes(stream: list[int], once: list[int], distance: Callable[[int], int]) -> int:
    """How many calls of the model a stream holds: the count whose repeated template
    aligns with the fewest edits. The edits are about unimodal in the count (too few
    leave the stream's ops unmatched, too many the template's), so an integer ternary
    search over 1 .. len(stream) / len(once) + 1 finds it in O(log) alignments."""
    low, high = 1, max(1, len(stream) // max(1, len(once)) + 1)
    seen: dict[int, int] = {}

    def cost(k: int) -> int:
        if k not in seen:
            seen[k] = distance(k)
        return seen[k]

    while high - low > 2:
        third = (high - low) // 3
        a, b = low + third, high - third
        if cost(a) <= cost(b):
            high = b
        else:
            low = a
    return min(range(low, high + 1), key=lambda k: (cost(k), k))


def _slide_to_runs(matched_to: list[int], stream: list[int], n: int, passes: int) -> None:
    """A pass's first match moved forward, and its last back, next to the run it
    continues: where the alignment matched the first of the template's ops to an op
    followed by unmatched ops and then the template's next op, and an op of the same
    name sits right before that (a harness's ``aten::to`` before the data loader, the
    model's own after it), the match moves to it; the ops skipped then lie outside the
    pass."""
    by_pass: list[list[int]] = [[] for _ in range(passes)]
    for i, j in enumerate(matched_to):
        if j >= 0:
            by_pass[j // n].append(i)
    for mine in by_pass:
        if len(mine) < 2:
            continue
        first, second = mine[0], mine[1]
        if second - first > 1 and matched_to[second] == matched_to[first] + 1:
            to = next((k for k in range(second - 1, first, -1) if matched_to[k] < 0 and stream[k] == stream[first]), None)
            if to is not None:
                matched_to[to], matched_to[first] = matched_to[first], -1
        last, before = mine[-1], mine[-2]
        if last - before > 1 and matched_to[last] == matched_to[before] + 1:
            to = next((k for k in range(before + 1, last) if matched_to[k] < 0 and stream[k] == stream[last]), None)
            if to is not None:
                matched_to[to], matched_to[last] = matched_to[last], -1


def _chain(call: int, template: CallTemplate) -> list[int]:
    """The calls open around global call ``call``, outermost first."""
    per = len(template.call_module)
    base, at = call - call % per, call % per
    out: list[int] = []
    while at >= 0:
        out.append(base + at)
        at = template.call_parent[at]
    out.reverse()
    return out


def _place_by_neighbours(calls: list[int], how: list[str], template: CallTemplate) -> None:
    """Unmatched ops between two aligned ones take the innermost call both neighbours
    are in (none: unplaced); ops before the first or after the last stay unplaced."""
    previous = -1
    for i, call in enumerate(calls):
        if call < 0:
            continue
        if previous >= 0 and i - previous > 1:
            left, right = _chain(calls[previous], template), _chain(call, template)
            shared = -1
            for a, b in zip(left, right):
                if a != b:
                    break
                shared = a
            if shared >= 0:
                for k in range(previous + 1, i):
                    calls[k] = shared
                    how[k] = BY_NEIGHBOURS
        previous = i


# -- the template of a step recorded with module ranges ----------------------------------


def template_of_step(step: Range) -> CallTemplate | None:
    """The call template in a step recorded with module ranges (a hooked step of a
    block): its first outermost module call when every outermost call is of that one
    module (the model, called once or several times a step), else all of them in order
    (a step that calls the encoder, then the decoder); their module calls and the
    outermost ops in them, through labels. None: the step called no module."""
    tops = list(_module_calls(step))
    if not tops:
        return None
    if all(top.name == tops[0].name for top in tops):
        tops = tops[:1]
    ops: list[str] = []
    op_call: list[int] = []
    call_module: list[int] = []
    call_parent: list[int] = []
    labels: dict[str, int] = {}

    def walk(rng: Range, call: int) -> None:
        for child in rng.children:
            if child.name.startswith(MODULE_PREFIX):
                call_module.append(int(child.name[len(MODULE_PREFIX) :]))
                call_parent.append(call)
                walk(child, len(call_module) - 1)
            elif child.name == MEMORY or _outside_model(child):
                continue
            elif is_op(child):
                ops.append(child.name)
                op_call.append(call)
            elif child.children:
                labels.setdefault(child.name, call)
                walk(child, call)

    for top in tops:
        call_module.append(int(top.name[len(MODULE_PREFIX) :]))
        call_parent.append(-1)
        walk(top, len(call_module) - 1)
    return CallTemplate(
        ops=tuple(ops), call_module=tuple(call_module), call_parent=tuple(call_parent), op_call=tuple(op_call),
        labels=tuple(labels.items()),
    )


def without_module_ranges(ranges: list[Range]) -> list[Range]:
    """``ranges`` with every module range replaced by the ranges nested in it, at every
    depth: a window as torch's profiler alone records it (a step of ``hooks="first"``
    without its hooks; the recorded captures' oracle)."""
    out: list[Range] = []
    for rng in ranges:
        kids = without_module_ranges(rng.children) if rng.children else None
        if rng.name.startswith(MODULE_PREFIX):
            out.extend(kids or [])
        else:
            if kids is not None:
                rng.children = kids
            out.append(rng)
    return out


def _module_calls(rng: Range) -> Iterator[Range]:
    """The outermost module ranges in ``rng``, in order, through labels (not in ops)."""
    for child in rng.children:
        if child.name.startswith(MODULE_PREFIX):
            yield child
        elif child.children and not is_op(child) and not _outside_model(child):
            yield from _module_calls(child)


# -- the trace's ranges: the stream read from them, the module ranges put in them --------


def is_op(rng: Range) -> bool:
    """Whether a trace range is an op (not a label, a module call, an allocation)."""
    fields = rng.extra_fields
    return rng.name != MEMORY and fields.scope is None and not rng.name.startswith(MODULE_PREFIX)


def _outside_model(rng: Range) -> bool:
    """Ranges whose ops are never the model's forward: backward nodes run on the
    caller's thread (CPU), optimizer steps and zero_grad."""
    if rng.name.startswith(EVALUATE) or rng.name.startswith(ACCUMULATE):
        return True
    return rng.extra_fields.scope == USER_SCOPE and label_kind(rng.name)[0] != "label"


def stream_of(step: Range) -> Iterator[Range]:
    """A step's outermost forward ops, in order: its ops and those in its labels, not
    the ops nested in ops, nor those in backward nodes, optimizer steps or zero_grad."""
    for child in step.children:
        if child.name == MEMORY or _outside_model(child):
            continue
        if is_op(child):
            yield child
        elif child.children:
            yield from stream_of(child)


def place(steps: list[tuple[Range, int]], template: CallTemplate, roots: list[Range] | None = None) -> OpPlacement:
    """Module ranges put into each step of ``steps`` (``(step range, number)``) by
    aligning its outermost forward ops to ``template``; then, in the backward nodes of
    ``roots`` (every thread's), the recomputed forwards of activation checkpointing
    (:func:`place_recompute`). How each op was placed."""
    per = len(template.call_module)
    ops = aligned = neighbours = unplaced = passes = 0
    unaligned: list[str] = []
    by_sequence: dict[int, list[int]] = {}
    for step, number in steps:
        stream = list(stream_of(step))
        found = align([op.name for op in stream], template)
        passes += found.passes
        for p, share in found.unaligned:
            unaligned.append(f"step {number}, pass {p + 1}: {share:.0%} of the template matched")
        if found.unaligned:
            # A call that did not align puts its neighbours in doubt (a model of another
            # depth reads as two calls, one of them aligned): the step keeps no module.
            found.calls = [-1] * len(stream)
            found.how = [UNPLACED] * len(stream)
        placed: dict[int, list[int]] = {}
        chains: dict[int, list[int]] = {}
        for op, call in zip(stream, found.calls):
            if call >= 0:
                chain = chains.get(call)
                if chain is None:
                    chain = chains[call] = _chain(call, template)
                placed[id(op)] = chain
        module_of = [template.call_module[g % per] for g in range(found.passes * per)]
        step.children = _wrapped(step.children, [], _Placing.of(placed, template, module_of))
        for op in stream:
            chain = placed.get(id(op))
            if chain is not None:
                _sequence_numbers(op, chain, by_sequence)
        ops += len(stream)
        aligned += found.how.count(ALIGNED)
        neighbours += found.how.count(BY_NEIGHBOURS)
        unplaced += found.how.count(UNPLACED)
    recomputed = place_recompute(roots or [], by_sequence, template)
    return OpPlacement(
        template_ops=len(template.ops), passes=passes, ops=ops, aligned=aligned, by_neighbours=neighbours,
        unplaced=unplaced, unaligned=tuple(unaligned), guesses=template.guesses, recomputed=recomputed,
    )


def combined(placements: list[OpPlacement]) -> OpPlacement | None:
    """Several windows' placements as one (summed; the template's size the last's);
    None for none."""
    if not placements:
        return None
    last = placements[-1]
    return OpPlacement(
        template_ops=last.template_ops,
        passes=sum(p.passes for p in placements),
        ops=sum(p.ops for p in placements),
        aligned=sum(p.aligned for p in placements),
        by_neighbours=sum(p.by_neighbours for p in placements),
        unplaced=sum(p.unplaced for p in placements),
        unaligned=tuple(u for p in placements for u in p.unaligned),
        guesses=tuple(dict.fromkeys(g for p in placements for g in p.guesses)),
        recomputed=sum(p.recomputed for p in placements),
    )


def _sequence_numbers(op: Range, chain: list[int], out: dict[int, list[int]]) -> None:
    """Each autograd sequence number in ``op`` (its own and its nested ops': the node of
    ``aten::linear`` is its ``addmm``'s), mapped to the calls ``op`` ran in."""
    todo = [op]
    while todo:
        item = todo.pop()
        seq = getattr(item.extra_fields, "sequence_number", -1)
        if seq >= 0:
            out.setdefault(seq, chain)
        if item.children:
            todo.extend(item.children)


def _node_sequence(node: Range) -> int:
    """A backward node's sequence number: its own, else its function's (the op in it)."""
    seq = getattr(node.extra_fields, "sequence_number", -1)
    if seq < 0:
        seq = next((getattr(c.extra_fields, "sequence_number", -1) for c in node.children if is_op(c)), -1)
    return seq


def _call_spans(template: CallTemplate) -> list[tuple[int, int]]:
    """Each call's ops in the template as ``(first, last)`` positions (its own and its
    callees': contiguous); ``(0, -1)`` for a call that ran no op."""
    spans = [(len(template.ops), -1)] * len(template.call_module)
    for at, call in enumerate(template.op_call):
        while call >= 0:
            first, last = spans[call]
            spans[call] = (min(first, at), max(last, at))
            call = template.call_parent[call]
    return [(first, last) if last >= 0 else (0, -1) for first, last in spans]


def place_recompute(roots: list[Range], by_sequence: dict[int, list[int]], template: CallTemplate) -> int:
    """Module ranges around the forwards that activation checkpointing recomputes
    during backward; the ops placed.

    A recompute runs inside the backward node that first needs a checkpointed
    activation: its ops are the ones there with autograd sequence numbers (grad is on
    for a recompute, off for a node's own work). The node's sequence number names the
    forward op it is the backward of (``by_sequence``: that op's calls); the recomputed
    call is the innermost of those calls whose template ops are at least as many as
    :data:`CONFIDENT` of the recompute's, and the recompute is aligned to that call's
    ops alone, nested from it, as the Python tracer nests a recomputed module call."""
    spans = _call_spans(template)
    per = len(template.call_module)
    placed_ops = 0
    todo = list(roots)
    while todo:
        rng = todo.pop()
        if not rng.children:
            continue
        if not rng.name.startswith(EVALUATE):
            todo.extend(rng.children)
            continue
        own = _node_sequence(rng)
        chain = by_sequence.get(own)
        for container, run in _recompute_runs(rng, own):
            if chain is not None:
                placed_ops += _place_run(container, run, chain, template, spans, per)
        todo.extend(c for c in _nested_nodes(rng))
    return placed_ops


def _nested_nodes(node: Range) -> Iterator[Range]:
    """Backward nodes run inside ``node`` (a reentrant checkpoint's backward)."""
    todo = list(node.children)
    while todo:
        item = todo.pop()
        if item.name.startswith(EVALUATE):
            yield item
        elif item.children:
            todo.extend(item.children)


def _recompute_runs(node: Range, own: int) -> Iterator[tuple[Range, list[Range]]]:
    """Runs of sibling ops with sequence numbers in a backward node, and the range they
    are the children of (not inside nested backward nodes, nor inside the runs); the
    node's function (the op with the node's own sequence number ``own``) holds them."""
    todo = [node]
    while todo:
        parent = todo.pop()
        run: list[Range] = []
        for child in parent.children:
            if child.name == MEMORY:
                continue
            if child.name.startswith(EVALUATE):
                if run:
                    yield parent, run
                    run = []
                continue
            seq = getattr(child.extra_fields, "sequence_number", -1)
            if is_op(child) and seq >= 0 and seq != own:
                run.append(child)
                continue
            if run:
                yield parent, run
                run = []
            if child.children:
                todo.append(child)
        if run:
            yield parent, run


def _place_run(
    container: Range, run: list[Range], chain: list[int], template: CallTemplate, spans: list[tuple[int, int]],
    per: int,
) -> int:
    """One recompute run placed under the call of ``chain`` it recomputes (module
    docstring of :func:`place_recompute`); the ops placed (0: none fits)."""
    at = next(
        (k for k in range(len(chain) - 1, -1, -1) if spans[chain[k] % per][1] - spans[chain[k] % per][0] + 1 >= CONFIDENT * len(run)),
        None,
    )
    if at is None:
        return 0
    call = chain[at]
    base = call - call % per
    first, last = spans[call % per]
    part = CallTemplate(
        ops=template.ops[first : last + 1], call_module=template.call_module, call_parent=template.call_parent,
        op_call=template.op_call[first : last + 1], labels=template.labels, weighty=template.weighty,
    )
    found = align([op.name for op in run], part)
    if found.passes != 1 or found.unaligned:
        return 0
    placed: dict[int, list[int]] = {}
    for op, local in zip(run, found.calls):
        full = _chain(base + local, template) if local >= 0 else chain[: at + 1]
        placed[id(op)] = full[at:]  # from the recomputed call down
    module_of = {c: template.call_module[c % per] for calls in placed.values() for c in calls}
    container.children = _wrapped(container.children, [], _Placing.of(placed, template, module_of))
    return len(placed)


@dataclass
class _Placing:
    """What putting module ranges into a tree reads: each placed op's chain of calls
    (by ``id``), each call's module, each call's placed ops (``sizes``), and the
    template's labels opened inside a call (``inside``: name -> the template's call,
    global calls taken modulo ``per``)."""

    placed: dict[int, list[int]]
    module_of: Mapping[int, int] | list[int]
    sizes: dict[int, int]
    inside: dict[str, int]
    per: int

    @classmethod
    def of(cls, placed: dict[int, list[int]], template: CallTemplate, module_of: Mapping[int, int] | list[int]) -> _Placing:
        sizes: dict[int, int] = {}
        for chain in placed.values():
            for call in chain:
                sizes[call] = sizes.get(call, 0) + 1
        return cls(placed, module_of, sizes, dict(template.labels), len(template.call_module))


def _label_chain(rng: Range, how: _Placing) -> list[int] | None:
    """The calls a label goes inside: those every placed op in ``rng`` shares, down to
    the call the template saw it opened in, else to the first the label holds whole (a
    label around a whole call is read as opened around it, as a user's label around
    ``model(x)`` is). None: it holds no placed op; [] when any of its ops is unplaced or
    they share none."""
    placed = how.placed
    shared: list[int] | None = None
    count = 0
    for op in stream_of(rng):
        count += 1
        chain = placed.get(id(op))
        if chain is None:
            return []
        if shared is None:
            shared = list(chain)
        else:
            keep = 0
            while keep < len(shared) and keep < len(chain) and shared[keep] == chain[keep]:
                keep += 1
            del shared[keep:]
    if shared is not None:
        opened_in = how.inside.get(rng.name)
        at = next((k for k, call in enumerate(shared) if call % how.per == opened_in), None)
        if at is None:
            at = next((k for k, call in enumerate(shared) if how.sizes[call] == count), len(shared)) - 1
        del shared[at + 1 :]
    return shared


def _wrapped(children: list[Range], base: list[int], how: _Placing) -> list[Range]:
    """``children`` (siblings, in time order) with calls deeper than ``base`` opened and
    closed around them."""
    out: list[Range] = []
    # The open calls below base: (call, its range).
    open_: list[tuple[int, Range]] = []

    def into() -> list[Range]:
        return open_[-1][1].children if open_ else out

    def close_to(depth: int) -> None:
        while len(open_) > depth:
            _, rng = open_.pop()
            rng.start_time_ns = rng.children[0].start_time_ns
            rng.end_time_ns = max(c.end_time_ns for c in rng.children)

    for child in children:
        if child.name == MEMORY:
            into().append(child)
            continue
        if is_op(child) and not _outside_model(child):
            chain = how.placed.get(id(child))
        elif child.children and not _outside_model(child):
            chain = _label_chain(child, how)
            if chain is None:
                into().append(child)  # holds no placed op: where it ran
                continue
        else:
            chain = None
        if chain is None or chain[: len(base)] != base:
            close_to(0)
            out.append(child)
            continue
        below = chain[len(base) :]
        keep = 0
        while keep < len(open_) and keep < len(below) and open_[keep][0] == below[keep]:
            keep += 1
        close_to(keep)
        for call in below[keep:]:
            rng = Range(
                f"{MODULE_PREFIX}{how.module_of[call]}", child.start_time_ns, child.end_time_ns, child.start_tid,
                extra_fields=RangeFields(),
            )
            into().append(rng)
            open_.append((call, rng))
        if is_op(child):
            into().append(child)
        else:
            child.children = _wrapped(child.children, chain, how)
            into().append(child)
    close_to(0)
    return out

