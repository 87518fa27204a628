"""A model-level benchmark (``layerscope.bench.BenchResult``) as one self-contained HTML
page (the ``html`` format of the registry's ``bench`` table): latency (p50, with p10 to
p90) and throughput per batch size, and peak memory where it was measured, as small SVG
charts, then the table. The page machinery is ``html.py``'s; the data holds raw numbers
only, the result's own figures (``BatchResult``'s percentiles and throughput), in
ascending batch size; a batch size that did not run (out of memory, skipped) has its
status and no figures.
"""

from __future__ import annotations

from typing import Any

from layerscope.base.formats import register_renderer
from layerscope.model.bench import BatchResult, BenchResult
from layerscope.render.html import html_page

SCHEMA = "layerscope-bench-html/1"

#: The figures of a batch size that ran, by name (``BatchResult``'s properties).
BATCH_FIGURES: tuple[str, ...] = (
    "runs", "p10_ns", "p50_ns", "p90_ns", "p99_ns", "mean_ns", "std_ns", "cv", "min_ns", "max_ns", "throughput_per_s",
)


def _batch(entry: BatchResult) -> dict[str, Any]:
    ran = entry.status == "ok" and bool(entry.times_ns)
    doc: dict[str, Any] = {"batch_size": entry.batch_size, "status": entry.status}
    doc.update({name: getattr(entry, name) if ran else None for name in BATCH_FIGURES})
    doc.update(peak_memory_bytes=entry.peak_memory_bytes, h2d_ns=entry.h2d_ns, d2h_ns=entry.d2h_ns)
    return doc


def bench_data(result: BenchResult) -> dict[str, Any]:
    """The document the page embeds."""
    return {
        "schema": SCHEMA,
        "model": result.model, "mode": result.mode, "device": result.device, "dtype": result.dtype,
        "autocast": result.autocast, "compiled": result.compiled, "compile_time_ns": result.compile_time_ns,
        "params": result.params, "trainable_params": result.trainable_params, "model_bytes": result.model_bytes,
        "flops_per_sample": result.flops_per_sample, "macs_per_sample": result.macs_per_sample,
        "machine": dict(result.machine), "settings": dict(result.settings),
        "max_batch_size": result.max_batch_size, "best_batch_size": result.best_batch_size,
        "count_batch_size": result.count_batch_size, "tokens_per_sample": result.tokens_per_sample,
        "inputs": [{"name": name, "shape": shape, "dtype": dtype} for name, shape, dtype in result.inputs],
        "warnings": result.warnings,
        "batches": [_batch(entry) for entry in sorted(result.batches, key=lambda b: b.batch_size)],
    }


@register_renderer(
    "html", document="bench", extensions=(".html", ".htm"),
    description="the benchmark as one self-contained HTML page: latency, throughput and memory charts, the table",
)
def render_bench_html(result: BenchResult) -> str:
    return html_page("bench.js", f"{result.model} benchmark", bench_data(result))
