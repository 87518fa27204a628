"""Pure renderers of benchmarks: ``BenchResult -> str`` and ``BenchComparison -> str``.

``render_table`` and ``render_json`` are the ``text`` and ``json`` formats of the
registry's ``bench`` table (``render/bench_html.py`` is its ``html``).

Deterministic: the same result gives the same text (no dates), rows in ascending batch
size. Numbers become strings only through :mod:`layerscope.base.fmt`.
"""

from __future__ import annotations

import json
from typing import Any

from layerscope.base import fmt
from layerscope.base.formats import register_renderer
from layerscope.model.bench import BatchResult, BenchComparison, BenchResult
from layerscope.render.options import WIDTH
from layerscope.render.table import SPACES, Column, draw, draw_fitted, from_headers, wrap_lines


def _ns(value: float | None) -> str:
    return "" if value is None else fmt.time_ns(round(value))


def _per_s(value: float) -> str:
    return fmt.count(round(value)) + "/s"


def _per_sample(value: float | None) -> str:
    """A per-sample count; ``?`` when it is unknown, as the tree shows an op with no formula."""
    return "?" if value is None else fmt.count(round(value))


def _unsupported(calls: dict[str, int]) -> list[str]:
    if not calls:
        return []
    listed = ", ".join(f"{name} x{n}" for name, n in sorted(calls.items()))
    return [f"             ops with no FLOP formula (not counted in FLOPs): {listed}"]


def _mode(result: BenchResult) -> str:
    parts = [result.mode, result.dtype, result.device]
    if result.autocast:
        parts.append(f"autocast {result.autocast}")
    if result.compiled:
        parts.append("compiled")
    return ", ".join(parts)


def _machine(machine: dict[str, Any]) -> str:
    parts = [str(machine.get("cpu") or "unknown CPU")]
    if machine.get("threads") is not None:
        parts.append(f"{machine['threads']} thread" + ("" if machine["threads"] == 1 else "s"))
    if machine.get("gpu"):
        parts.append(f"{machine['gpu']} ({fmt.nbytes(machine.get('gpu_memory_bytes'))})")
    parts.append(f"torch {machine.get('torch_version', '?')}")
    parts.append(f"python {machine.get('python_version', '?')}")
    return ", ".join(parts)


def _inputs_line(result: BenchResult) -> list[str]:
    """``input        input_ids int64 [1, 128] (batch size 1)``; nothing when unknown."""
    inputs = result.inputs
    if not inputs:
        return []
    listed = ", ".join(f"{name} {dtype} {fmt.shape(shape)}" for name, shape, dtype in inputs)
    tokens = result.tokens_per_sample
    per_sample = f"; {tokens} tokens per sample" if tokens is not None else ""
    return [f"input        {listed} (at batch size {result.count_batch_size}{per_sample})"]


def _batch_row(entry: BatchResult, show_transfer: bool, tokens: int | None) -> list[str]:
    if entry.status != "ok":
        cells = [str(entry.batch_size), entry.status.upper()] + [""] * (10 if tokens is None else 11)
    else:
        cells = [
            str(entry.batch_size), _ns(entry.p50_ns), _ns(entry.p90_ns), _ns(entry.p99_ns),
            f"{_ns(entry.mean_ns)} ± {_ns(entry.std_ns)}", _ns(entry.min_ns), _ns(entry.max_ns),
            f"{100 * entry.cv:.1f}%", str(entry.runs), _per_s(entry.throughput_per_s),
            *([] if tokens is None else [_per_s(entry.throughput_per_s * tokens)]),
            fmt.nbytes(entry.peak_memory_bytes),
        ]
    if show_transfer:
        cells += [_ns(entry.h2d_ns), _ns(entry.d2h_ns)]
    return cells


#: How a width hides the table's columns: latency and throughput stay.
_PRIORITIES = {
    "p50": 0, "samples/s": 0, "mean ± std": 1, "tokens/s": 1, "peak mem": 1, "p90": 2, "CV": 2, "p99": 3,
    "min": 4, "max": 4, "H2D": 4, "D2H": 4, "runs": 5,
}


@register_renderer(
    "text", document="bench", extensions=(".txt",), description="the benchmark as a text table", options=(WIDTH,)
)
def render_table(result: BenchResult, *, width: int | None = None) -> str:
    """The benchmark as text: the model's size and cost, then one row per batch size;
    given ``width``, the table hides its least important columns to fit it and the text
    is wrapped."""
    sizes = ", ".join(f"{name} {fmt.nbytes(n)}" for name, n in sorted(result.model_bytes_by_dtype.items()))
    settings = result.settings
    lines = [
        f"{result.model}: {_mode(result)}",
        f"params       {fmt.param_count(result.params)} ({fmt.param_count(result.trainable_params)} trainable)",
        f"size         {fmt.nbytes(result.model_bytes)}" + (f" ({sizes})" if sizes else ""),
        f"per sample   {_per_sample(result.macs_per_sample)} MACs, {_per_sample(result.flops_per_sample)} FLOPs "
        + (f"(forward, counted at batch size {result.count_batch_size})" if result.flops is not None
           else "(unknown: the count ran out of memory)"),
        *_unsupported(result.unsupported_ops),
        *_inputs_line(result),
        f"machine      {_machine(result.machine)}",
        f"runs         {settings.get('warmup', '?')} warm-up, then at least {settings.get('min_runs', '?')} runs "
        f"and {settings.get('min_time_s', '?')}s per batch size",
    ]
    if result.max_batch_size is not None:
        lines.append(f"max batch    {result.max_batch_size} (the largest that fit in device memory)")
    if result.compile_time_ns is not None:
        lines.append(f"compile      {_ns(result.compile_time_ns)} (first call; not in the figures below)")
    show_transfer = any(b.h2d_ns is not None or b.d2h_ns is not None for b in result.batches)
    tokens = result.tokens_per_sample
    header = ["batch", "p50", "p90", "p99", "mean ± std", "min", "max", "CV", "runs", "samples/s"]
    header += ([] if tokens is None else ["tokens/s"]) + ["peak mem"]
    if show_transfer:
        header += ["H2D", "D2H"]
    rows = [_batch_row(b, show_transfer, tokens) for b in sorted(result.batches, key=lambda b: b.batch_size)]
    layout = [Column(name, priority=_PRIORITIES.get(name)) for name in header]
    table = draw_fitted(layout, rows, width, SPACES)
    lines = [*wrap_lines(lines, width), "", *table, ""]
    best = result.best_batch_size
    if best is not None:
        per_s = result.batch(best).throughput_per_s
        in_tokens = "" if tokens is None else f", {fmt.count(round(per_s * tokens))} tokens/s"
        lines.append(f"best throughput: batch size {best}, {fmt.count(round(per_s))} samples/s{in_tokens}")
    lines += wrap_lines([f"warning: {w}" for w in result.warnings], width)
    return "\n".join(lines) + "\n"


@register_renderer("json", document="bench", extensions=(".json",), description="the layerscope-bench/1 JSON document")
def render_json(result: BenchResult) -> str:
    return json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n"


@register_renderer("text", document="bench-comparison", description="two benchmarks compared, batch size by batch size")
def render_comparison(comparison: BenchComparison) -> str:
    """BASE against NEW batch size by batch size: mean latency and p50 of each, the ratio
    NEW / BASE of the means, and whether the difference exceeds the noise."""
    base, new = comparison.base, comparison.new
    lines = [f"base: {base.model}: {_mode(base)}", f"new:  {new.model}: {_mode(new)}", ""]
    header = ["batch", "base mean", "new mean", "base p50", "new p50", "ratio", "verdict"]
    rows = [
        [str(r.batch_size), *map(_ns, (r.base.mean_ns, r.new.mean_ns, r.base.p50_ns, r.new.p50_ns)), f"x{r.ratio:.3f}", r.verdict]
        for r in comparison.rows
    ]
    lines += draw(from_headers(header), rows, empty="(no batch size was measured in both)", style=SPACES)
    for name, sizes in (("base", comparison.only_base), ("new", comparison.only_new)):
        if sizes:
            lines.append(f"only in {name}: batch size {', '.join(map(str, sizes))}")
    lines.append("ratio: new mean / base mean; differences count only when the intervals "
                 "mean ± 2·std/sqrt(runs) do not overlap")
    return "\n".join(lines) + "\n"
