"""The benchmark's data model: plain dataclasses, no torch, JSON in and out.

A :class:`BenchResult` holds what was measured, once: each batch size's raw per-run
latencies (``times_ns``) and the figures that are measured rather than derived. Every
statistic (percentiles, mean, std, CV, throughput, the best batch size) is a property
computed from those runs, so a saved result and a re-loaded one give the same numbers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from layerscope.base import formats
from layerscope.base.errors import SchemaError
from layerscope.base.stats import percentile

SCHEMA = "layerscope-bench/1"

#: Above this coefficient of variation (std / mean of the runs) the figures are flagged
#: as too noisy to trust, when the bulk of the runs is spread too: (p90 - p10) / p50 above
#: the same share. A few outliers alone (one slow run in thousands) inflate the CV but
#: leave the percentiles trustworthy.
NOISY_CV = 0.10

#: Status of one batch size: measured, ran out of memory, or not tried after an OOM.
STATUSES = ("ok", "oom", "skipped", "interrupted")


@dataclass
class BatchResult:
    """One batch size. ``times_ns`` are the timed runs after warm-up, in run order.

    ``peak_memory_bytes``: on CUDA the allocator's peak over the timed runs (weights
    included); on CPU the peak of live tensor bytes tracked by layerscope in one extra,
    untimed pass (logical storage bytes, as ``Profile.memory.peak_bytes``).
    ``first_run_ns`` is the first warm-up call (with ``compile=True``: compilation).
    ``h2d_ns`` / ``d2h_ns`` (CUDA only): copying the batch to the device and the
    output back, timed apart from compute.
    """

    batch_size: int
    status: str = "ok"
    times_ns: list[int] = field(default_factory=list)
    first_run_ns: int | None = None
    peak_memory_bytes: int | None = None
    h2d_ns: int | None = None
    d2h_ns: int | None = None

    def _sorted(self) -> list[int]:
        if not self.times_ns:
            raise ValueError(f"batch size {self.batch_size} has no timed runs (status {self.status})")
        return sorted(self.times_ns)

    @property
    def runs(self) -> int:
        return len(self.times_ns)

    @property
    def total_time_ns(self) -> int:
        """The sum of the timed runs (the time between runs is not counted)."""
        return sum(self.times_ns)

    @property
    def mean_ns(self) -> float:
        return self.total_time_ns / len(self._sorted())

    @property
    def std_ns(self) -> float:
        """Sample standard deviation (n - 1); 0 for a single run."""
        values = self._sorted()
        if len(values) < 2:
            return 0.0
        mean = self.mean_ns
        return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))

    @property
    def cv(self) -> float:
        """Coefficient of variation, std / mean."""
        mean = self.mean_ns
        return self.std_ns / mean if mean else 0.0

    def percentile_ns(self, q: float) -> float:
        return percentile(self._sorted(), q)

    @property
    def min_ns(self) -> int:
        return self._sorted()[0]

    @property
    def max_ns(self) -> int:
        return self._sorted()[-1]

    @property
    def p10_ns(self) -> float:
        return self.percentile_ns(10)

    @property
    def p50_ns(self) -> float:
        return self.percentile_ns(50)

    @property
    def p90_ns(self) -> float:
        return self.percentile_ns(90)

    @property
    def p99_ns(self) -> float:
        return self.percentile_ns(99)

    @property
    def throughput_per_s(self) -> float:
        """Samples per second: ``batch_size / mean latency``, which is the same as
        ``batch_size * runs / total_time_ns``."""
        return self.batch_size * 1e9 / self.mean_ns

    @property
    def mean_interval_ns(self) -> tuple[float, float]:
        """``mean ± 2·std/sqrt(runs)``: about a 95% interval for the mean."""
        half = 2.0 * self.std_ns / math.sqrt(self.runs)
        return self.mean_ns - half, self.mean_ns + half

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "batch_size": self.batch_size,
            "status": self.status,
            "times_ns": list(self.times_ns),
            "first_run_ns": self.first_run_ns,
            "peak_memory_bytes": self.peak_memory_bytes,
            "h2d_ns": self.h2d_ns,
            "d2h_ns": self.d2h_ns,
        }
        if self.status == "ok" and self.times_ns:
            # Derived, for readers of the JSON; from_dict recomputes them from times_ns.
            doc["summary"] = {
                "runs": self.runs, "mean_ns": self.mean_ns, "std_ns": self.std_ns, "cv": self.cv,
                "min_ns": self.min_ns, "p50_ns": self.p50_ns, "p90_ns": self.p90_ns,
                "p99_ns": self.p99_ns, "max_ns": self.max_ns, "throughput_per_s": self.throughput_per_s,
            }
        return doc

    @classmethod
    def from_dict(cls, entry: Any, source: str = "document") -> BatchResult:
        """A batch size's figures from its :meth:`to_dict` entry (the derived ``summary``
        is not read: it is computed again); a one-line :class:`SchemaError` naming what is
        wrong for anything else."""
        if not isinstance(entry, dict) or not isinstance(entry.get("batch_size"), int):
            raise SchemaError(f"{source}: each entry of 'batches' must be an object with an integer 'batch_size'")
        where = f"batch size {entry['batch_size']}"
        status = entry.get("status", "ok")
        if status not in STATUSES:
            raise SchemaError(f"{source}: {where} has status {status!r}; expected one of {', '.join(STATUSES)}")
        times = entry.get("times_ns", [])
        if not isinstance(times, list) or not all(isinstance(t, int) and t >= 0 for t in times):
            raise SchemaError(f"{source}: {where}: 'times_ns' must be a list of whole numbers of nanoseconds")
        if status == "ok" and not times:
            raise SchemaError(f"{source}: {where} has status 'ok' but no timed runs in 'times_ns'")
        optional = {name: _int_or_none(entry.get(name), f"{where}: {name!r}", source) for name in _BATCH_FIELDS}
        return cls(batch_size=entry["batch_size"], status=status, times_ns=times, **optional)


@dataclass
class BenchResult(formats.NotebookDisplay):
    """A model-level benchmark: the model's size and cost, then latency, throughput and
    peak memory per batch size, with the settings and the machine it ran on.

    ``flops`` / ``macs`` were counted once, at ``count_batch_size`` (the smallest batch
    size), for the forward pass; the per-sample figures divide by that batch size. They
    are None when the count could not run (out of memory), never 0; calls of ops with no
    FLOP formula are in ``unsupported_ops`` (op name -> calls), as in a profile.
    """

    model: str
    mode: str  # "inference" or "train"
    device: str
    dtype: str
    params: int
    trainable_params: int
    model_bytes_by_dtype: dict[str, int]
    flops: int | None
    macs: int | None
    count_batch_size: int
    batches: list[BatchResult]
    settings: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    autocast: str | None = None
    compiled: bool = False
    compile_time_ns: int | None = None
    #: CUDA only, with ``find_max_batch=True``: the largest batch size that fit.
    max_batch_size: int | None = None
    unsupported_ops: dict[str, int] = field(default_factory=dict)
    #: The batch at ``count_batch_size`` as the model got it: shapes and dtype names,
    #: nested as the inputs are (a dict of keyword inputs, a list of positional ones);
    #: None in a result saved before they were kept.
    input_shapes: Any = None
    input_dtypes: Any = None

    DOCUMENT = "bench"  # its table in the output registry

    @property
    def inputs(self) -> list[tuple[str, list[int], str]]:
        """Each input tensor as ``(name, shape, dtype)`` at ``count_batch_size``: a keyword
        input by its key, a positional one by its index (``"0"``), a lone tensor ``"input"``."""
        return list(_leaves("input", self.input_shapes, self.input_dtypes))

    @property
    def tokens_per_sample(self) -> int | None:
        """A sequence model's tokens per sample: the length (dim 1) of its first input of
        token ids (an integer tensor ``[batch, sequence]``); None for other models."""
        for _, shape, dtype in self.inputs:
            if len(shape) == 2 and dtype.startswith(("int", "uint")):
                return shape[1]
        return None

    @property
    def model_bytes(self) -> int:
        return sum(self.model_bytes_by_dtype.values())

    @property
    def flops_per_sample(self) -> float | None:
        return None if self.flops is None else self.flops / self.count_batch_size

    @property
    def macs_per_sample(self) -> float | None:
        return None if self.macs is None else self.macs / self.count_batch_size

    @property
    def measured(self) -> list[BatchResult]:
        return [b for b in self.batches if b.status == "ok" and b.times_ns]

    @property
    def best_batch_size(self) -> int | None:
        """The batch size with the highest throughput (the smallest one on a tie)."""
        best = max(self.measured, key=lambda b: (b.throughput_per_s, -b.batch_size), default=None)
        return None if best is None else best.batch_size

    def batch(self, batch_size: int) -> BatchResult:
        for entry in self.batches:
            if entry.batch_size == batch_size:
                return entry
        raise KeyError(f"no batch size {batch_size} in this result; it has {[b.batch_size for b in self.batches]}")

    @property
    def warnings(self) -> list[str]:
        """Why some figures should not be trusted, or are missing."""
        out = []
        noisy = [b for b in self.measured if b.cv > NOISY_CV and (b.p90_ns - b.p10_ns) > NOISY_CV * b.p50_ns]
        if noisy:
            sizes = ", ".join(f"{b.batch_size} ({100 * b.cv:.0f}%)" for b in noisy)
            out.append(
                f"noisy: the run-to-run variation (CV) is above {100 * NOISY_CV:.0f}% at batch size {sizes}; "
                "the machine was too busy or too variable to trust these figures: close other programs, "
                "or raise min_time_s / --min-time"
            )
        oom = [b.batch_size for b in self.batches if b.status == "oom"]
        if oom:
            out.append(f"out of memory at batch size {oom[0]}; larger batch sizes were skipped")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model": self.model,
            "mode": self.mode,
            "device": self.device,
            "dtype": self.dtype,
            "autocast": self.autocast,
            "compiled": self.compiled,
            "compile_time_ns": self.compile_time_ns,
            "max_batch_size": self.max_batch_size,
            "params": self.params,
            "trainable_params": self.trainable_params,
            "model_bytes_by_dtype": dict(self.model_bytes_by_dtype),
            "flops": self.flops,
            "macs": self.macs,
            "unsupported_ops": dict(self.unsupported_ops),
            "count_batch_size": self.count_batch_size,
            "input_shapes": self.input_shapes,
            "input_dtypes": self.input_dtypes,
            "tokens_per_sample": self.tokens_per_sample,
            "settings": dict(self.settings),
            "machine": dict(self.machine),
            "batches": [b.to_dict() for b in self.batches],
        }

    @classmethod
    def from_dict(cls, doc: Any, source: str = "document") -> BenchResult:
        """A :class:`BenchResult` from its ``to_dict()``; a one-line :class:`SchemaError`
        naming what is wrong for anything else."""
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
            hint = " (a profile: use 'layerscope show')" if found == "layerscope/1" else ""
            raise SchemaError(f"{source} is not a layerscope benchmark: expected schema {SCHEMA!r}, found {found!r}{hint}")
        for key, kind in _REQUIRED.items():
            if not isinstance(doc.get(key), kind):
                raise SchemaError(f"{source}: {key!r} is missing or not a {kind.__name__}")
        unsupported = doc.get("unsupported_ops") or {}
        if not isinstance(unsupported, dict) or not all(_is_count(calls) for calls in unsupported.values()):
            raise SchemaError(f"{source}: 'unsupported_ops' must map op names to numbers of calls")
        return cls(
            model=doc["model"], mode=doc["mode"], device=doc["device"], dtype=doc["dtype"],
            params=doc["params"], trainable_params=doc["trainable_params"],
            model_bytes_by_dtype=dict(doc["model_bytes_by_dtype"]),
            flops=_int_or_none(doc.get("flops"), "'flops'", source), macs=_int_or_none(doc.get("macs"), "'macs'", source),
            unsupported_ops=dict(unsupported),
            count_batch_size=doc["count_batch_size"],
            batches=[BatchResult.from_dict(b, source) for b in doc["batches"]],
            settings=dict(doc.get("settings") or {}), machine=dict(doc.get("machine") or {}),
            autocast=doc.get("autocast"), compiled=bool(doc.get("compiled", False)),
            compile_time_ns=_int_or_none(doc.get("compile_time_ns"), "'compile_time_ns'", source),
            max_batch_size=_int_or_none(doc.get("max_batch_size"), "'max_batch_size'", source),
            input_shapes=doc.get("input_shapes"), input_dtypes=doc.get("input_dtypes"),
        )

    def save(self, path: str | os.PathLike[str], fmt: str | None = None, **options: Any) -> None:
        """Write the result atomically: as JSON (``layerscope-bench/1``), or in the format
        ``path``'s extension names (``.html``, ``.txt``, ``.png``), or ``fmt``."""
        formats.save(self, path, fmt, **options)

    def render(self, fmt: str = "text", **options: Any) -> Any:
        """The result in a registered format (``layerscope.base.formats.formats("bench")``)."""
        return formats.render(self, fmt, **options)

    def __str__(self) -> str:
        return self.render()


def _leaves(name: str, shapes: Any, dtypes: Any) -> Iterator[tuple[str, list[int], str]]:
    if isinstance(shapes, dict):
        for key, shape in shapes.items():
            yield from _leaves(str(key), shape, dtypes.get(key) if isinstance(dtypes, dict) else None)
    elif isinstance(shapes, list) and all(isinstance(v, int) for v in shapes) and isinstance(dtypes, str):
        yield name, shapes, dtypes
    elif isinstance(shapes, list):
        for index, shape in enumerate(shapes):
            inner = dtypes[index] if isinstance(dtypes, list) and index < len(dtypes) else None
            yield from _leaves(str(index) if name == "input" else f"{name}.{index}", shape, inner)


_BATCH_FIELDS = ("first_run_ns", "peak_memory_bytes", "h2d_ns", "d2h_ns")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _int_or_none(value: Any, what: str, source: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise SchemaError(f"{source}: {what} must be a whole number or null, got {value!r}")


_REQUIRED = {
    "model": str, "mode": str, "device": str, "dtype": str, "params": int, "trainable_params": int,
    "model_bytes_by_dtype": dict, "count_batch_size": int, "batches": list,
}

#: ``layerscope.bench.from_dict``: the same as :meth:`BenchResult.from_dict`.
from_dict = BenchResult.from_dict


@dataclass
class BatchComparison:
    """One batch size in both runs. ``ratio`` is NEW mean latency / BASE mean latency
    (above 1: slower). ``significant``: the intervals ``mean ± 2·std/sqrt(runs)`` of the
    two runs do not overlap, so the difference is larger than the noise."""

    batch_size: int
    base: BatchResult
    new: BatchResult

    @property
    def ratio(self) -> float:
        return self.new.mean_ns / self.base.mean_ns

    @property
    def significant(self) -> bool:
        base_lo, base_hi = self.base.mean_interval_ns
        new_lo, new_hi = self.new.mean_interval_ns
        return new_lo > base_hi or new_hi < base_lo

    @property
    def verdict(self) -> str:
        if not self.significant:
            return "within noise"
        return "slower" if self.ratio > 1 else "faster"


@dataclass
class BenchComparison:
    base: BenchResult
    new: BenchResult
    rows: list[BatchComparison]
    only_base: list[int]
    only_new: list[int]

    def regressions(self, threshold: float) -> list[BatchComparison]:
        """Batch sizes that got slower by more than ``threshold`` (0.1: 10%) and by more
        than the noise."""
        return [row for row in self.rows if row.significant and row.ratio > 1 + threshold]

    DOCUMENT = "bench-comparison"  # its table in the output registry

    def render(self, fmt: str = "text", **options: Any) -> str:
        """The comparison in a registered format (``formats("bench-comparison")``)."""
        return formats.render(self, fmt, **options)


def compare(base: BenchResult, new: BenchResult) -> BenchComparison:
    """Compare two benchmarks batch size by batch size (measured sizes only)."""
    base_ok = {b.batch_size: b for b in base.measured}
    new_ok = {b.batch_size: b for b in new.measured}
    rows = [BatchComparison(n, base_ok[n], new_ok[n]) for n in sorted(base_ok.keys() & new_ok.keys())]
    return BenchComparison(
        base, new, rows, sorted(base_ok.keys() - new_ok.keys()), sorted(new_ok.keys() - base_ok.keys())
    )
