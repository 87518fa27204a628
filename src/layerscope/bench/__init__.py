"""Model-level benchmarks: latency, throughput and peak memory per batch size.

- ``measure.py``: runs the model (the only part that imports torch): ``benchmark()``.
- ``result.py``: the data model, ``BenchResult``, its JSON (``layerscope-bench/1``)
  and ``compare``; ``layerscope.load`` reads a saved one back.
- Its renderers are ``render/bench_text.py`` (text and JSON, comparisons too) and
  ``render/bench_html.py``, through the output registry (``BenchResult.render``).

Loading, comparing and rendering saved results does not import torch.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

from layerscope.model.bench import (
    SCHEMA,
    BatchResult,
    BenchComparison,
    BenchResult,
    compare,
    from_dict,
)

__all__ = ["SCHEMA", "BatchResult", "BenchComparison", "BenchResult", "benchmark", "compare", "from_dict", "load"]

if TYPE_CHECKING:
    from layerscope.bench.measure import benchmark


def load(path: str | os.PathLike[str]) -> BenchResult:
    """Deprecated: ``layerscope.load(path)`` reads a benchmark as it reads every document.
    This reads a benchmark only, and says what any other document is."""
    warnings.warn("layerscope.bench.load is deprecated: use layerscope.load", DeprecationWarning, stacklevel=2)
    from layerscope.loading import expect, read_saved

    return expect(read_saved(path, "benchmark"), repr(os.fspath(path)), BenchResult)


def __getattr__(name: str) -> Any:
    if name == "benchmark":
        from layerscope.bench.measure import benchmark

        return benchmark
    raise AttributeError(f"module 'layerscope.bench' has no attribute {name!r}")
