"""The memory side of a pass walk: live bytes, who allocated and freed them, peaks, the
category of every live byte, and a timeline. Pure: no torch.

The pass walker (``walk.py``) drives one :class:`MemoryLedger` alongside its frames. Memory is *live*
bytes: what was live before the pass (``Adopt``) plus what ops allocated, minus what was
freed. The walk knows where it is at each moment (the innermost frame, or the module
whose backward is running) and charges allocations and frees there.

- **Peaks.** A frame's peak is the highest live reached while it was open, relative to
  live when it opened; the same for each entry of the backward chain (``chain.py``).
- **Categories.** A storage is an activation if autograd saved it (``Saved``), a gradient
  if it became a parameter's gradient (``Grad``), optimizer state if the optimizer
  allocated it and it outlived the pass; else ``other``. Known from a first scan, a
  category holds from the storage's allocation on.
- **Activations** are credited to the frame that allocated the storage: a module's
  ``activation_bytes`` is what its forward allocated and left alive for backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

from layerscope.attribute.chain import BackwardChain, Entry, Key, is_made
from layerscope.model.raw import MEMORY_CATEGORIES, Adopt, DeviceMem, Event, Free, Grad, Op, Optim, Saved
from layerscope.model.sidedocs import DeviceMemory, Timeline, TimelineSpan

if TYPE_CHECKING:
    from layerscope.attribute.walk import Frame

Site = tuple[Key, str]

#: At most this many points in a pass's memory timeline (each bucket keeps its min and max).
TIMELINE_POINTS = 2000
#: At most this many module spans in the timeline.
TIMELINE_SPANS = 2000


def is_part(key: Key) -> TypeGuard[str]:
    """Whether ``key`` is a top-level part of the step (``<loss>``, ``<optimizer:Adam>``);
    a part's key is its path, a string."""
    return is_made(key) and key.startswith("<")


@dataclass
class MemoryResult:
    """What one pass (or the peak step of a cycle) says about memory."""

    alloc: dict[Site, int] = field(default_factory=dict)
    freed: dict[Site, int] = field(default_factory=dict)
    peak: dict[Site, int] = field(default_factory=dict)
    activation: dict[Site, int] = field(default_factory=dict)
    grad: dict[Site, int] = field(default_factory=dict)
    op_alloc: dict[int, int] = field(default_factory=dict)
    baseline_bytes: int = 0
    peak_bytes: int = 0
    peak_at: Site | None = None
    peak_t_ns: int = 0
    peak_categories: dict[str, int] = field(default_factory=dict)
    #: Highest live bytes in each phase of the model, and in each part of the step.
    peak_by_phase: dict[str, int] = field(default_factory=dict)
    optimizers: dict[str, dict[str, int]] = field(default_factory=dict)
    timeline: Timeline | None = None
    device: DeviceMemory | None = None

    def merge(self, other: MemoryResult) -> None:
        """Fold in another step: flows add up, sizes come from the step with the highest peak."""
        for mine, theirs in ((self.alloc, other.alloc), (self.freed, other.freed)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        if other.peak_bytes > self.peak_bytes or not self.peak_categories:
            for name in (
                "peak", "activation", "grad", "baseline_bytes", "peak_bytes", "peak_at", "peak_t_ns",
                "peak_categories", "peak_by_phase", "optimizers", "timeline", "device",
            ):
                setattr(self, name, getattr(other, name))


@dataclass(frozen=True)
class StreamFacts:
    """What a first look at a stream tells the memory ledger before it starts: the
    storages (by serial) that autograd saved, that became gradients and that were freed,
    and the bytes live from the start, by category."""

    saved: set[int]
    grads: set[int]
    freed: set[int]
    initial: dict[str, int]


def scan(events: list[Event]) -> StreamFacts | None:
    """First look at a stream: None when it holds no memory events, else its
    :class:`StreamFacts`."""
    saved: set[int] = set()
    grads: set[int] = set()
    freed: set[int] = set()
    initial: dict[str, int] = {}
    found = False
    for event in events:
        # ``type(event) is X`` at each test, not once into a local: mypy narrows ``event``
        # on the test itself, and on a recorded training run this was no slower (``match``
        # on the classes took twice as long). The frequent kinds come first.
        if type(event) is Op:
            found = found or bool(event.allocs)
        elif type(event) is Free:
            freed.add(event.serial)
        elif type(event) is Saved:
            saved.add(event.serial)
        elif type(event) is Grad:
            found = True
            if event.serial is not None:
                grads.add(event.serial)
        elif type(event) is Adopt:
            found = True
            if event.since_start:
                initial[event.category] = initial.get(event.category, 0) + event.nbytes
        elif type(event) is Optim or type(event) is DeviceMem:
            found = True
    if not found:
        return None
    return StreamFacts(saved=saved, grads=grads, freed=freed, initial=initial)


class MemoryLedger:
    """Live-memory bookkeeping for one event stream; the pass walker calls it as it goes."""

    def __init__(
        self,
        facts: StreamFacts,
        chain: BackwardChain,
        span_worthy: Callable[[Key, bool], bool],
    ) -> None:
        self.facts = facts
        self.result = MemoryResult()
        self.chain = chain
        chain.openers.append(self._chain_opened)
        chain.closers.append(self._chain_closed)
        self._span_worthy = span_worthy
        initial = facts.initial
        self.cat_live = {name: initial.get(name, 0) for name in MEMORY_CATEGORIES}
        self.live = sum(self.cat_live.values())
        self.result.baseline_bytes = self.live
        self._size: dict[int, int] = {}
        self._cat: dict[int, str] = {}
        self._site: dict[int, Site] = {}
        self._all_sizes: dict[int, int] = {}
        #: ``(t, live, live per category in MEMORY_CATEGORIES order)`` after each change.
        self._points: list[tuple[int, int, tuple[int, ...]]] = []
        self._spans: list[tuple[int, int, Key, str]] = []
        self._optim: dict[str, dict[Any, dict[str, int]]] = {}
        self._snapshot(None, 0)
        self.result.peak_bytes = self.live
        self.result.peak_categories = dict(self.cat_live)

    # -- live bytes ------------------------------------------------------------------------
    def _snapshot(self, site: Site | None, t: int) -> None:
        cat_live = self.cat_live
        self._points.append((t, self.live, tuple(cat_live[name] for name in MEMORY_CATEGORIES)))

    def _raised(self, site: Site | None, t: int, frames: list[Frame]) -> None:
        live = self.live
        if frames:
            top = frames[-1]
            if live > top.live_top:
                top.live_top = live
        elif self.chain.entries:
            running = self.chain.entries[-1]
            if live > running.live_top:
                running.live_top = live
        if site is not None:
            # The model's phases by name; the step's parts (``<loss>``, ...) by path.
            key, phase = site
            where = key if is_part(key) else phase
            if live > self.result.peak_by_phase.get(where, 0):
                self.result.peak_by_phase[where] = live
        if live > self.result.peak_bytes:
            self.result.peak_bytes = live
            self.result.peak_at = site
            self.result.peak_t_ns = t
            self.result.peak_categories = dict(self.cat_live)

    def allocate(self, allocs: Sequence[tuple[int, int]], site: Site | None, t: int, frames: list[Frame]) -> int:
        """An op at ``site`` allocated ``allocs``; returns their bytes."""
        facts = self.facts
        total = 0
        for serial, nbytes in allocs:
            if serial in facts.saved:
                category = "activations"
            elif serial in facts.grads:
                category = "gradients"
            elif site is not None and is_part(site[0]) and site[0].startswith("<optimizer:") and serial not in facts.freed:
                category = "optimizer_state"
            else:
                category = "other"
            self._size[serial] = nbytes
            self._all_sizes[serial] = nbytes
            self._cat[serial] = category
            self.cat_live[category] += nbytes
            if site is not None:
                self._site[serial] = site
            total += nbytes
        self.live += total
        if site is not None:
            self.result.alloc[site] = self.result.alloc.get(site, 0) + total
        self._snapshot(site, t)
        self._raised(site, t, frames)
        return total

    def free(self, serial: int, site: Site | None, t: int) -> int:
        nbytes = self._size.pop(serial, None)
        if nbytes is None:
            return 0
        self.live -= nbytes
        self.cat_live[self._cat.pop(serial)] -= nbytes
        if site is not None:
            self.result.freed[site] = self.result.freed.get(site, 0) + nbytes
        self._snapshot(site, t)
        return nbytes

    def adopt(self, event: Adopt, site: Site | None, frames: list[Frame]) -> None:
        if event.serial is not None:
            self._size[event.serial] = event.nbytes
            self._cat[event.serial] = event.category
        if not event.since_start:
            self.live += event.nbytes
            self.cat_live[event.category] += event.nbytes
            self._snapshot(site, event.t_ns)
            self._raised(site, event.t_ns, frames)

    def grad(self, event: Grad) -> None:
        site = (event.owner, "backward")
        self.result.grad[site] = self.result.grad.get(site, 0) + event.nbytes

    def optimizer(self, event: Optim) -> None:
        self._optim.setdefault(event.name, {})[event.ident] = dict(event.state_bytes_by_key)

    def device(self, event: DeviceMem) -> None:
        self.result.device = DeviceMemory(event.allocated_peak_bytes, event.reserved_at_peak_bytes)

    # -- frames and the backward chain ------------------------------------------------------
    def frame_closed(self, frame: Frame, t: int, frames: list[Frame]) -> None:
        """``frame`` (already popped) closed at ``t``; ``frames`` are the ones still open."""
        key, phase, top = frame.key, frame.phase, frame.live_top
        site = (key, phase)
        self.result.peak[site] = max(self.result.peak.get(site, 0), top - frame.live_at_enter)
        if frames:
            if top > frames[-1].live_top:
                frames[-1].live_top = top
        elif self.chain.entries:
            running = self.chain.entries[-1]
            if top > running.live_top:
                running.live_top = top
        if self._span_worthy(key, not frames):
            self._spans.append((frame.t_enter_ns, t, key, phase))

    def part_span(self, key: Key, t0: int, t1: int) -> None:
        """A run of a step part's ops outside any frame (an inline loss) ran from t0 to t1."""
        if self._span_worthy(key, True):
            self._spans.append((t0, t1, key, "forward"))

    def _chain_opened(self, entry: Entry) -> None:
        entry.live_at_open = entry.live_top = self.live

    def _chain_closed(self, entry: Entry, t: int, still_open: list[Entry]) -> None:
        site = (entry.key, "backward")
        self.result.peak[site] = max(self.result.peak.get(site, 0), entry.live_top - entry.live_at_open)
        if still_open and entry.live_top > still_open[-1].live_top:
            still_open[-1].live_top = entry.live_top
        if self._span_worthy(entry.key, not still_open):
            self._spans.append((entry.t_open, t, entry.key, "backward"))

    # -- the end ------------------------------------------------------------------------------
    def finish(self, t_base: int, path_of: Callable[[Key], str]) -> MemoryResult:
        result = self.result
        result.peak_t_ns = max(0, result.peak_t_ns - t_base)
        for serial in self.facts.saved:
            site = self._site.get(serial)
            if site is not None:
                result.activation[site] = result.activation.get(site, 0) + self._all_sizes[serial]
        for name, instances in self._optim.items():
            merged: dict[str, int] = {}
            for by_key in instances.values():
                for k, v in by_key.items():
                    merged[k] = merged.get(k, 0) + v
            result.optimizers[name] = merged
        result.timeline = _timeline(self._points, self._spans, t_base, path_of)
        return result


def _timeline(
    points: list[tuple[int, int, tuple[int, ...]]],
    spans: list[tuple[int, int, Key, str]],
    t_base: int,
    path_of: Callable[[Key], str],
) -> Timeline:
    """Live bytes over the pass, at most ``TIMELINE_POINTS`` points (min and max of
    each bucket, so the peak survives), split by category at each point (the
    categories add up to the bytes), and the spans of the top-level modules."""
    kept = points
    if len(points) > TIMELINE_POINTS:
        buckets = TIMELINE_POINTS // 2
        size = len(points) / buckets
        kept = []
        for b in range(buckets):
            chunk = points[int(b * size) : int((b + 1) * size)]
            if not chunk:
                continue
            low = min(chunk, key=lambda p: p[1])
            high = max(chunk, key=lambda p: p[1])
            kept.extend(sorted({low, high}))
    spans = sorted(spans)
    if len(spans) > TIMELINE_SPANS:
        spans = spans[:TIMELINE_SPANS]
    return Timeline(
        t_ns=[max(0, point[0] - t_base) for point in kept],
        bytes=[point[1] for point in kept],
        categories={name: [point[2][i] for point in kept] for i, name in enumerate(MEMORY_CATEGORIES)},
        points_recorded=len(points),
        # A step part has no forward: only its backward work (the loss's) names a phase.
        spans=[
            TimelineSpan(
                max(0, s - t_base), max(0, e - t_base), path_of(k), None if is_part(k) and phase == "forward" else phase
            )
            for s, e, k, phase in spans
        ],
    )
