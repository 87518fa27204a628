"""Model-level benchmarks: latency, throughput and peak memory per batch size.

- ``measure.py``: runs the model (the only part that imports torch): ``benchmark()``.
- ``result.py``: the data model, ``BenchResult``, its JSON (``layerscope-bench/1``),
  ``load`` and ``compare``.
- Its renderers are ``render/bench_text.py`` (text and JSON, comparisons too) and
  ``render/bench_html.py``, through the output registry (``BenchResult.render``).

Loading, comparing and rendering saved results does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from layerscope.bench.result import (
    SCHEMA,
    BatchResult,
    BenchComparison,
    BenchResult,
    compare,
    from_dict,
    load,
)

__all__ = ["SCHEMA", "BatchResult", "BenchComparison", "BenchResult", "benchmark", "compare", "from_dict", "load"]

if TYPE_CHECKING:
    from layerscope.bench.measure import benchmark


def __getattr__(name: str) -> Any:
    if name == "benchmark":
        from layerscope.bench.measure import benchmark

        return benchmark
    raise AttributeError(f"module 'layerscope.bench' has no attribute {name!r}")
