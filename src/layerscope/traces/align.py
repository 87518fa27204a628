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
- **Otherwise** a longest-common-subsequence alignment of the stream against the template
  repeated ``k`` times (``k`` the number of model calls in the step: the count that
  aligns with the fewest edits, found by a ternary search), by
  rapidfuzz's bit-parallel ``Indel`` (about 36 ms for 21k against 21k ops here, never
  a quadratic table of Python objects).
- **Ops without a counterpart** (library version drift: an ``aten::reshape`` more or
  less) take the innermost call that the aligned ops on either side of them share:
  *placed by neighbours*. Ops before a pass's first aligned op or after its last stay
  outside the model (a wrapper's own ops, a loss): *unplaced*.
- **Confidence**: a pass (one repetition of the template) whose ops matched fewer than
  :data:`CONFIDENT` of the template's is *not aligned*: its ops keep no module (they stay
  with the enclosing labels and steps) and the pass is named in the profile's facts. So
  data-dependent control flow the template did not take (a routing, an early exit) is
  named, never silently put on a wrong module.

Each op's placement is counted (:class:`~layerscope.model.runfacts.OpPlacement`).
Pure: no torch; rapidfuzz is imported when a stream is not the template.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from layerscope.convert.ranges import (
    ACCUMULATE,
    EVALUATE,
    MEMORY,
    MODULE_PREFIX,
    USER_SCOPE,
    Range,
    label_kind,
)
from layerscope.model.runfacts import OpPlacement
from layerscope.traces.ranges import MODULE_FIELDS

#: The share of a pass's template ops that must find a counterpart for the pass to count
#: as aligned: below it, the run took another branch than the template (its ops stay
#: unattributed, named).
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

    from rapidfuzz.distance import Indel

    codes: dict[str, int] = {}
    stream = [codes.setdefault(name, len(codes)) for name in names]
    once = [codes.setdefault(name, len(codes)) for name in template.ops]
    passes = _passes(stream, once, lambda k: Indel.distance(stream, once * k))
    target = once * passes

    matched_to = [-1] * len(names)  # each stream op's template position, or -1
    for tag, i1, i2, j1, _ in Indel.opcodes(stream, target):
        if tag == "equal":
            for offset in range(i2 - i1):
                matched_to[i1 + offset] = j1 + offset
    _slide_back(matched_to, stream, target, n)

    per_pass = [0] * passes
    for j in matched_to:
        if j >= 0:
            per_pass[j // n] += 1
    unaligned = [(p, per_pass[p] / n) for p in range(passes) if per_pass[p] / n < CONFIDENT]
    dropped = {p for p, _ in unaligned}

    calls = [-1] * len(names)
    how = [UNPLACED] * len(names)
    for i, j in enumerate(matched_to):
        if j >= 0 and j // n not in dropped:
            calls[i] = (j // n) * calls_per_pass + template.op_call[j % n]
            how[i] = ALIGNED
    _place_by_neighbours(calls, how, template)
    return Aligned(calls, how, passes, unaligned)


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


def _slide_back(matched_to: list[int], stream: list[int], target: list[int], n: int) -> None:
    """Matches moved next to the run they continue: where the alignment matched a
    stream op to a later template position across a pass boundary while an earlier,
    unmatched position of the same op sits right after the previous match (a common
    op, ``aten::to``, matched into the next pass), the match moves back to it."""
    last = -1
    for i, j in enumerate(matched_to):
        if j < 0:
            continue
        if last >= 0 and j // n != last // n:
            # The first match of a new pass: an unmatched position of this op just after
            # the previous match, in the previous pass, continues that run instead.
            for back in range(last + 1, min(j, (last // n + 1) * n)):
                if target[back] == stream[i]:
                    matched_to[i] = j = back
                    break
        last = j


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


def place(steps: list[tuple[Range, int]], template: CallTemplate) -> OpPlacement:
    """Module ranges put into each step of ``steps`` (``(step range, number)``) by
    aligning its outermost forward ops to ``template``; how each op was placed."""
    per = len(template.call_module)
    ops = aligned = neighbours = unplaced = passes = 0
    unaligned: list[str] = []
    for step, number in steps:
        stream = list(stream_of(step))
        found = align([op.name for op in stream], template)
        passes += found.passes
        for p, share in found.unaligned:
            unaligned.append(f"step {number}, pass {p + 1}: {share:.0%} of the template matched")
        placed: dict[int, list[int]] = {}
        chains: dict[int, list[int]] = {}
        for op, call in zip(stream, found.calls):
            if call >= 0:
                chain = chains.get(call)
                if chain is None:
                    chain = chains[call] = _chain(call, template)
                placed[id(op)] = chain
        module_of = [template.call_module[g % per] for g in range(found.passes * per)]
        sizes: dict[int, int] = {}
        for chain in placed.values():
            for call in chain:
                sizes[call] = sizes.get(call, 0) + 1
        step.children = _wrapped(step.children, [], placed, module_of, sizes)
        ops += len(stream)
        aligned += found.how.count(ALIGNED)
        neighbours += found.how.count(BY_NEIGHBOURS)
        unplaced += found.how.count(UNPLACED)
    return OpPlacement(
        template_ops=len(template.ops), passes=passes, ops=ops, aligned=aligned, by_neighbours=neighbours,
        unplaced=unplaced, unaligned=tuple(unaligned), guesses=template.guesses,
    )


def _label_chain(rng: Range, placed: dict[int, list[int]], sizes: dict[int, int]) -> list[int] | None:
    """The calls a label goes inside: those every placed op in ``rng`` shares, down to
    the first the label holds whole (``sizes``: each call's placed ops; a label around a
    whole call is read as opened around it, as a user's label around ``model(x)`` is).
    None: it holds no placed op; [] when any of its ops is unplaced or they share none."""
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
        whole = next((at for at, call in enumerate(shared) if sizes[call] == count), len(shared))
        del shared[whole:]
    return shared


def _wrapped(
    children: list[Range], base: list[int], placed: dict[int, list[int]], module_of: list[int],
    sizes: dict[int, int],
) -> list[Range]:
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
            chain = placed.get(id(child))
        elif child.children and not _outside_model(child):
            chain = _label_chain(child, placed, sizes)
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
                f"{MODULE_PREFIX}{module_of[call]}", child.start_time_ns, child.end_time_ns, child.start_tid,
                extra_fields=MODULE_FIELDS,
            )
            into().append(rng)
            open_.append((call, rng))
        if is_op(child):
            into().append(child)
        else:
            child.children = _wrapped(child.children, chain, placed, module_of, sizes)
            into().append(child)
    close_to(0)
    return out

