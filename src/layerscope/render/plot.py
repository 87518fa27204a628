"""Pictures of a profile: the memory timeline of one step as a PNG (needs matplotlib).

``plot_memory(profile, "memory.png")`` draws live bytes over the step (a step line), the
baseline, the peak with the module and phase it happened in, the model's top-level
modules and the step's parts (loss, optimizer, ...) as bars along the bottom, and the
peak's breakdown by category. matplotlib is imported only here, and only its
object-oriented API is used (no pyplot, no global state), so plotting works in
threads, notebooks and on machines without a display.
"""

from __future__ import annotations

import io
import os
from typing import Any

from layerscope.base import fmt
from layerscope.base.errors import MissingDependencyError
from layerscope.base.io import write_atomic
from layerscope.model.raw import MEMORY_CATEGORIES
from layerscope.model.sidedocs import MemorySummary, PeakAt, Timeline

#: The PNG's size: FIGSIZE inches at DPI dots per inch (1200 x 720 pixels).
FIGSIZE = (12.0, 7.2)
DPI = 100

PHASE_COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "recompute": "#55A868"}
#: Step parts that are neither forward nor backward (optimizer step, zero_grad, ...).
PART_COLOUR = "#8172B3"
LINE_COLOUR = "#222222"
PEAK_COLOUR = "#C44E52"

NO_TIMELINE = (
    "this profile has no memory timeline: it was made with memory tracking off "
    "(memory=False, or record_ops=False / --no-ops); profile again with memory on, the default "
    "(layerscope.profile(model, inputs), layerscope.Profiler(model) or layerscope profile SPEC -o x.json)"
)


def plot_memory(profile: Any, path: str | os.PathLike[str], *, title: str | None = None) -> None:
    """Draw ``profile``'s memory timeline and write it to ``path`` as a PNG.

    The file is always a PNG, whatever ``path``'s extension, and is written
    atomically (a temporary file in the same folder, renamed over ``path``).
    ``title`` defaults to "<model> memory over one step".

    Raises ``ValueError`` if the profile has no memory timeline (it was made with
    ``memory=False`` or ``record_ops=False``) and ``ImportError`` without matplotlib.
    """
    png = render_memory_png(profile, title=title)
    write_atomic(path, png)


def memory_timeline(profile: Any) -> Timeline:
    """``profile.memory.timeline``, or a ``ValueError`` saying how to get one."""
    memory = getattr(profile, "memory", None)
    timeline = memory.timeline if isinstance(memory, MemorySummary) else None
    if timeline is None or not timeline.t_ns or not timeline.bytes:
        raise ValueError(NO_TIMELINE)
    return timeline


def render_memory_png(profile: Any, *, title: str | None = None) -> bytes:
    """The PNG bytes :func:`plot_memory` writes."""
    timeline = memory_timeline(profile)
    memory = profile.memory
    fig = _figure("drawing a memory timeline")
    model = str(profile.meta.model or "model")
    _draw(fig, memory, timeline, model, title if title is not None else f"{model} memory over one step")
    return _png(fig)


def _figure(feature: str) -> Any:
    """A matplotlib Figure on the Agg canvas; without matplotlib, a
    :class:`~layerscope.base.errors.MissingDependencyError` (an ``ImportError``) naming ``feature``."""
    try:
        # The package itself first: a cached submodule would otherwise slip past a
        # matplotlib that is missing (or blocked in sys.modules).
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependencyError(feature, "matplotlib", "plot") from None
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": "layerscope"})
    return buf.getvalue()


# -- benchmarks ---------------------------------------------------------------------------


def plot_bench(result: Any, path: str | os.PathLike[str], *, title: str | None = None) -> None:
    """Draw a benchmark (a ``BenchResult`` or its ``to_dict()``) as a PNG at ``path``,
    written atomically: latency (p50, with the p10-p90 band and min) and throughput
    against batch size, on log2 batch axes, and the peak memory per batch size when it was
    measured. Batch sizes that ran out of memory are marked. Raises ``ImportError``
    without matplotlib."""
    write_atomic(path, render_bench_png(result, title=title))


def render_bench_png(result: Any, *, title: str | None = None) -> bytes:
    """The PNG bytes :func:`plot_bench` writes."""
    fig = _figure("drawing a benchmark")
    draw_bench(fig, result, title=title)
    return _png(fig)


def draw_bench(fig: Any, result: Any, *, title: str | None = None) -> list[Any]:
    """Draw a benchmark on ``fig``; returns its axes: latency, throughput, and peak memory
    per batch size when the benchmark measured it."""
    from layerscope.model.bench import BenchResult

    bench = result if isinstance(result, BenchResult) else BenchResult.from_dict(result)
    ok = sorted(bench.measured, key=lambda b: b.batch_size)
    sizes = [b.batch_size for b in ok]
    unit, scale = _time_unit(max((b.p90_ns for b in ok), default=0.0))
    peaks = [b for b in ok if b.peak_memory_bytes is not None]
    axes = list(fig.subplots(1, 3 if peaks else 2))
    latency, throughput = axes[:2]
    if peaks:
        memory = axes[2]
        mem_unit, mem_scale = _byte_unit(max(b.peak_memory_bytes or 0 for b in peaks))
        memory.plot([b.batch_size for b in peaks], [(b.peak_memory_bytes or 0) / mem_scale for b in peaks],
                    "o-", color=PEAK_COLOUR)
        memory.set_ylabel(f"peak memory ({mem_unit})")
        fig.subplots_adjust(wspace=0.4)  # room for the middle panels' axis labels
    latency.fill_between(sizes, [b.p10_ns / scale for b in ok], [b.p90_ns / scale for b in ok],
                         color=PHASE_COLOURS["forward"], alpha=0.2, label="p10-p90")
    latency.plot(sizes, [b.p50_ns / scale for b in ok], "o-", color=PHASE_COLOURS["forward"], label="p50")
    latency.plot(sizes, [b.min_ns / scale for b in ok], ".:", color=LINE_COLOUR, label="min")
    latency.set_ylabel(f"latency per batch ({unit})")
    throughput.plot(sizes, [b.throughput_per_s for b in ok], "o-", color=PHASE_COLOURS["backward"])
    throughput.set_ylabel("throughput (samples/s)")
    best = bench.best_batch_size
    if best is not None:
        throughput.axvline(best, color=PEAK_COLOUR, linestyle="--", label=f"best: batch {best}")
        throughput.legend(loc="lower right")
    for entry in bench.batches:
        if entry.status == "oom":
            for axis in axes:
                axis.axvline(entry.batch_size, color=PEAK_COLOUR, linestyle=":", label="out of memory")
    for axis in axes:
        if len(sizes) > 1:
            axis.set_xscale("log", base=2)
        axis.set_xticks(sizes, [str(n) for n in sizes])
        axis.set_xlabel("batch size")
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
    latency.legend(loc="upper left")
    machine = bench.machine
    heading = title if title is not None else f"{bench.model}: {bench.mode}, {bench.dtype}, {bench.device}"
    fig.suptitle(f"{heading}\n{machine.get('cpu', '')}, threads: {machine.get('threads', '?')}, "
                 f"torch {machine.get('torch_version', '?')}", fontsize=11)
    return axes


def _time_unit(largest_ns: float) -> tuple[str, float]:
    for name, size in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if largest_ns >= size:
            return name, size
    return "ns", 1.0


# -- drawing ----------------------------------------------------------------------------


def _byte_unit(peak: int) -> tuple[str, float]:
    for name, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if peak >= size:
            return name, float(size)
    return "B", 1.0


def _span_label(path: str, model: str) -> str:
    return model if path == "" else path


def _span_colour(path: str, phase: str) -> str:
    if path.startswith("<") and path != "<loss>" and phase == "forward":
        return PART_COLOUR  # an optimizer step or zero_grad is not a forward pass
    return PHASE_COLOURS.get(phase, PART_COLOUR)


def _lanes(spans: list[tuple[int, int, str, str]]) -> list[int]:
    """Greedy lanes: each span goes in the first lane free at its start."""
    ends: list[int] = []
    lanes = []
    for start, end, _, _ in spans:
        for i, last in enumerate(ends):
            if last <= start:
                ends[i] = end
                lanes.append(i)
                break
        else:
            ends.append(end)
            lanes.append(len(ends) - 1)
    return lanes


def _draw(fig: Any, memory: MemorySummary, timeline: Timeline, model: str, title: str) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    t_ns = [int(t) for t in timeline.t_ns]
    live = [int(b) for b in timeline.bytes]
    raw_spans = [(int(s.start_ns), int(s.end_ns), str(s.path), str(s.phase)) for s in timeline.spans]
    baseline = memory.baseline_bytes
    peak = memory.peak_bytes
    peak_at = memory.peak_at or PeakAt("", None)
    peak_t = peak_at.t_ns
    if not isinstance(peak_t, int):
        peak_t = t_ns[live.index(max(live))]

    unit, scale = _byte_unit(max([peak, *live]))
    end_ns = max([t_ns[-1], *(s[1] for s in raw_spans), 1])
    xs = [t / 1e6 for t in t_ns] + [end_ns / 1e6]
    ys = [b / scale for b in live] + [live[-1] / scale]

    # Top-level step tier (the model root and the step's parts) over the root's children.
    step_tier = sorted((s for s in raw_spans if s[2] == "" or s[2].startswith("<")), key=lambda s: s[:2])
    module_tier = sorted((s for s in raw_spans if not (s[2] == "" or s[2].startswith("<"))), key=lambda s: s[:2])
    step_lanes = _lanes(step_tier)
    module_lanes = _lanes(module_tier)
    n_step = max(step_lanes, default=-1) + 1
    n_module = max(module_lanes, default=-1) + 1
    n_rows = max(1, n_step + n_module)

    grid = fig.add_gridspec(
        2, 1, height_ratios=[5.0, 0.55 * n_rows + 0.4], hspace=0.06,
        left=0.075, right=0.985, top=0.875, bottom=0.085 + 0.06,
    )
    ax = fig.add_subplot(grid[0])
    bars = fig.add_subplot(grid[1], sharex=ax)

    # Faint background shading for the model's forward / backward and the step parts.
    for start, end, path, phase in step_tier:
        ax.axvspan(start / 1e6, end / 1e6, color=_span_colour(path, phase), alpha=0.07, lw=0)

    ax.fill_between(xs, ys, step="post", color=LINE_COLOUR, alpha=0.08, lw=0)
    ax.step(xs, ys, where="post", color=LINE_COLOUR, lw=1.4)
    if isinstance(baseline, int):
        ax.axhline(baseline / scale, color="#555555", ls="--", lw=1.1)

    px, py = peak_t / 1e6, peak / scale
    ax.plot([px], [py], "o", color=PEAK_COLOUR, ms=8, zorder=5)
    where = None if memory.peak_at is None else peak_at.path
    if where is None:
        culprit = "(culprit unknown)"
    else:
        culprit = _span_label(str(where), model) if where == "" else str(where)
        peak_phase = peak_at.phase
        # Step parts run outside any forward or backward: their "phase" says nothing.
        if peak_phase and not (str(where).startswith("<") and peak_phase == "forward"):
            culprit += f" ({peak_phase})"
    x_left, x_right = 0.0, end_ns / 1e6 * 1.012  # room for a peak at the very end
    on_right = px > (x_left + x_right) / 2
    ax.annotate(
        f"peak {fmt.nbytes(peak)}\nin {culprit}\nat {fmt.time_ns(peak_t)}",
        xy=(px, py), xytext=(-14 if on_right else 14, 8), textcoords="offset points",
        ha="right" if on_right else "left", va="bottom", fontsize=9.5, color=PEAK_COLOUR, zorder=6,
        bbox={"boxstyle": "round,pad=0.35", "fc": "white", "ec": PEAK_COLOUR, "alpha": 0.92},
        arrowprops={"arrowstyle": "-", "color": PEAK_COLOUR, "lw": 0.8},
        parse_math=False,
    )

    ax.set_xlim(x_left, x_right)
    # Headroom above the highest point for the peak's note (~60 px), so it hides no data.
    axes_px = ax.get_window_extent(fig.canvas.get_renderer()).height
    ax.set_ylim(0, (max(py, *ys) or 1.0) / max(1.0 - 64.0 / axes_px, 0.5))
    ax.set_ylabel(f"live memory ({unit})")
    ax.grid(True, axis="y", color="#dddddd", lw=0.6)
    ax.tick_params(labelbottom=False)
    ax.set_title(title, fontsize=13, pad=30, parse_math=False)

    # Bars: step tier on top, modules below.
    rows = [(s, lane) for s, lane in zip(step_tier, step_lanes)]
    rows += [(s, n_step + lane) for s, lane in zip(module_tier, module_lanes)]
    _draw_bars(fig, bars, rows, n_rows, model)
    bars.set_ylim(-0.6, n_rows - 0.4)
    ticks, names = [], []
    if n_step:
        ticks.append(n_rows - 1 - (n_step - 1) / 2)
        names.append("step")
    if n_module:
        ticks.append((n_module - 1) / 2)
        names.append("modules")
    bars.set_yticks(ticks, names)
    bars.tick_params(axis="y", length=0)
    bars.set_xlabel("time since the step started (ms)")
    for side in ("top", "right"):
        bars.spines[side].set_visible(False)
        ax.spines[side].set_visible(False)

    handles: list[Any] = [
        Line2D([], [], color=LINE_COLOUR, lw=1.4, label="live bytes"),
        Line2D([], [], color="#555555", ls="--", lw=1.1, label="baseline (step start)"),
        Line2D([], [], color=PEAK_COLOUR, marker="o", ls="", ms=7, label="peak"),
    ]
    phases = {s[3] for s in raw_spans if _span_colour(s[2], s[3]) != PART_COLOUR}
    for phase in ("forward", "backward", "recompute"):
        if phase in phases:
            handles.append(Patch(color=PHASE_COLOURS[phase], alpha=0.55, label=phase))
    if any(_span_colour(s[2], s[3]) == PART_COLOUR for s in raw_spans):
        handles.append(Patch(color=PART_COLOUR, alpha=0.55, label="optimizer / other step parts"))
    ax.legend(
        handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(handles),
        frameon=False, fontsize=9, borderaxespad=0.2, handlelength=1.8, columnspacing=1.4,
    )

    fig.text(0.075, 0.025, _breakdown(memory, peak, baseline), fontsize=9.5, ha="left", va="bottom",
             linespacing=1.5, parse_math=False)


def _draw_bars(fig: Any, bars: Any, rows: list[Any], n_rows: int, model: str) -> None:
    """One bar per span, named inside when it fits, else beside it in a free gap of its
    row, else left unnamed (its colour and place still say what it is)."""
    renderer = fig.canvas.get_renderer()
    box = bars.get_window_extent(renderer)
    left_px, right_px = box.x0, box.x1
    placed: list[tuple[int, str, float, float]] = []
    taken: dict[int, list[tuple[float, float]]] = {}
    for (start, end, path, phase), row in rows:
        y = n_rows - 1 - row
        colour = _span_colour(path, phase)
        x0, width = start / 1e6, max(end - start, 0) / 1e6
        bars.barh(y, width, left=x0, height=0.72, color=colour, alpha=0.55, ec=colour, lw=0.8)
        a = bars.transData.transform((x0, y))[0]
        b = bars.transData.transform((x0 + width, y))[0]
        taken.setdefault(y, []).append((a, b))
        placed.append((y, _span_label(path, model), a, b))

    def free(y: int, lo: float, hi: float) -> bool:
        return lo >= left_px and hi <= right_px and all(hi <= a or lo >= b for a, b in taken[y])

    outside = []
    for y, label, a, b in placed:
        middle = bars.transData.inverted().transform(((a + b) / 2, 0))[0]
        for name, size in _label_candidates(label):
            text = bars.text(middle, y, name, ha="center", va="center", fontsize=size, parse_math=False)
            if text.get_window_extent(renderer).width <= (b - a) - 4:
                break
            text.remove()
        else:
            text = bars.text(0, y, label, fontsize=8, parse_math=False)
            outside.append((y, label, a, b, text.get_window_extent(renderer).width))
            text.remove()
    for y, label, a, b, width_px in outside:
        gap = 3.0
        for lo, hi, align in ((b + gap, b + gap + width_px, "left"), (a - gap - width_px, a - gap, "right")):
            if free(y, lo - 1, hi + 1):
                x = bars.transData.inverted().transform((lo if align == "left" else hi, 0))[0]
                bars.text(x, y, label, ha=align, va="center", fontsize=8, color="#333333", parse_math=False)
                taken[y].append((lo, hi))
                break


def _label_candidates(label: str) -> list[tuple[str, float]]:
    """Names to try inside a bar, longest first: the label, smaller, then its last part
    ("AdamW" for "<optimizer:AdamW>", "dense" for "encoder.layer.0.dense")."""
    short = label.strip("<>").rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    candidates = [(label, 8.5), (label, 7.5)]
    if short and short != label:
        candidates.append((short, 7.5))
    return candidates


def _breakdown(memory: MemorySummary, peak: int, baseline: Any) -> str:
    categories = memory.peak_categories
    parts = []
    for key in MEMORY_CATEGORIES:
        value = categories.get(key)
        if isinstance(value, int):
            share = f" ({100 * value / peak:.0f}%)" if peak else ""
            parts.append(f"{fmt.memory_category(key, bool(memory.buffer_bytes_by_dtype))} {fmt.nbytes(value)}{share}")
    head = f"At the peak, {fmt.nbytes(peak)}"
    if isinstance(baseline, int):
        head += f" ({fmt.nbytes(peak - baseline)} above the baseline {fmt.nbytes(baseline)})"
    return head + (":\n" + "   ·   ".join(parts) if parts else ": no breakdown recorded")
