"""layerscope.benchmark / layerscope bench: model-level latency, throughput, memory."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
from layerscope import zoo
from layerscope.base.errors import InputsError, SchemaError
from layerscope.bench import BatchResult, BenchResult, compare, from_dict
from layerscope.bench.measure import batch_of, time_runs
from test_cli import assert_usage_error, run_cli
from test_no_side_effects import assert_unchanged, snapshot

FAST: dict[str, Any] = {"warmup": 1, "min_runs": 5, "min_time_s": 0.02}


def mlp() -> tuple[nn.Module, torch.Tensor]:
    entry = zoo.get("mlp")
    torch.manual_seed(0)
    return entry.build().eval(), entry.example_inputs(1)


class FailsAbove(nn.Module):
    """A real model whose forward calls ``fail(batch_size)`` above a batch size."""

    def __init__(self, limit: int, fail: Callable[[int], Any]) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.limit = limit
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            self.fail(x.shape[0])
        return self.linear(x)


def oom_above(limit: int, error: type[Exception] = torch.cuda.OutOfMemoryError) -> FailsAbove:
    """Raises as the allocator does when out of memory."""

    def fail(batch: int) -> None:
        raise error(f"CUDA out of memory. Tried to allocate {batch} GiB")

    return FailsAbove(limit, fail)


def raises_above(limit: int) -> FailsAbove:
    def fail(batch: int) -> None:
        raise ValueError("shape mismatch in my layer")

    return FailsAbove(limit, fail)


# -- measuring a real model ---------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp_result() -> BenchResult:
    model, x = mlp()
    return layerscope.benchmark(model, x, [1, 4, 16], **FAST)


def test_statistics_are_ordered_and_throughput_is_batch_over_mean(mlp_result: BenchResult) -> None:
    assert [b.batch_size for b in mlp_result.batches] == [1, 4, 16]
    for entry in mlp_result.batches:
        assert entry.status == "ok"
        assert entry.runs >= 5 and entry.total_time_ns >= 0.02e9
        assert entry.min_ns <= entry.p50_ns <= entry.p90_ns <= entry.p99_ns <= entry.max_ns
        assert entry.min_ns <= entry.mean_ns <= entry.max_ns
        # batch / mean latency, and within what the spread of the runs allows
        per_run = entry.batch_size * 1e9
        assert entry.throughput_per_s == pytest.approx(per_run / entry.mean_ns)
        assert entry.throughput_per_s == pytest.approx(entry.batch_size * entry.runs * 1e9 / entry.total_time_ns)
        assert per_run / entry.max_ns <= entry.throughput_per_s <= per_run / entry.min_ns
        assert entry.peak_memory_bytes and entry.peak_memory_bytes > 0
    assert mlp_result.best_batch_size in (1, 4, 16)
    assert mlp_result.batch(16).peak_memory_bytes > mlp_result.batch(1).peak_memory_bytes


def test_size_and_flops_equal_layerscope_profile(mlp_result: BenchResult) -> None:
    model, x = mlp()
    prof = layerscope.profile(model, x, warmup=0, repeat=1)
    assert mlp_result.params == prof.root.params_total == sum(p.numel() for p in model.parameters())
    assert mlp_result.trainable_params == mlp_result.params
    assert mlp_result.flops == prof.root.forward.flops and mlp_result.macs == prof.root.forward.macs
    assert mlp_result.model_bytes_by_dtype == {"float32": 4 * mlp_result.params}
    # counted at the smallest batch size, then per sample: batch x2 gives FLOPs x2
    result = layerscope.benchmark(model, x, [2, 3], warmup=0, min_runs=1, min_time_s=0, memory=False)
    at_two = layerscope.count_flops(model, batch_of(x, 2))
    assert result.count_batch_size == 2 and result.flops == at_two.root.forward.flops
    assert result.flops_per_sample == mlp_result.flops and result.macs_per_sample == mlp_result.macs


def test_machine_and_settings_are_recorded(mlp_result: BenchResult) -> None:
    machine = mlp_result.machine
    assert machine["threads"] == torch.get_num_threads()
    assert machine["torch_version"] == torch.__version__ and machine["cpu"]
    assert mlp_result.settings["min_runs"] == 5 and mlp_result.device == "cpu" and mlp_result.dtype == "float32"


def test_time_runs_needs_both_the_runs_and_the_time() -> None:
    ticks = iter(range(0, 10**9, 10))  # each clock read 10ns later: each run is 10ns
    clock = lambda: next(ticks)  # noqa: E731
    assert len(time_runs(lambda: None, min_runs=3, min_time_ns=0, clock=clock)) == 3
    assert len(time_runs(lambda: None, min_runs=3, min_time_ns=100, clock=clock)) == 10
    assert time_runs(lambda: None, min_runs=1, min_time_ns=0, clock=clock) == [10]


def test_the_users_model_is_untouched_in_every_mode() -> None:
    model, x = mlp()
    model.train()
    model.layers[0].eval()  # a mixed state must come back as it was
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    before = snapshot(model)
    for options in ({}, {"mode": "train"}, {"dtype": "bfloat16"}, {"autocast": "bfloat16"}):
        layerscope.benchmark(model, x, [1, 2], **FAST, **options)
        assert_unchanged(before, snapshot(model))
        assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
        assert all(torch.equal(p.grad, torch.ones_like(p)) for p in model.parameters())


def test_a_model_that_raises_names_the_batch_size_and_leaves_no_trace() -> None:
    model = raises_above(2).train()
    x = torch.randn(1, 8)  # drawn before the snapshot, which holds the RNG state
    before = snapshot(model)
    for mode in ("inference", "train"):
        with pytest.raises(ValueError, match=r"shape mismatch in my layer \(at batch size 4\)"):
            layerscope.benchmark(model, x, [1, 2, 4, 8], mode=mode, **FAST)
        assert_unchanged(before, snapshot(model))


def test_training_mode_steps_the_optimizer_on_a_copy() -> None:
    model, x = mlp()
    original = [p.detach().clone() for p in model.parameters()]
    seen: list[nn.Module] = []
    result = layerscope.benchmark(model, x, [1, 4], mode="train", lr=0.1, inspect_model=seen.append, **FAST)
    assert result.mode == "train" and result.settings["lr"] == 0.1
    (trained,) = seen
    assert trained is not model and trained.training
    assert any(not torch.equal(a, p) for a, p in zip(original, trained.parameters())), "the optimizer never stepped"
    assert all(torch.equal(a, p) for a, p in zip(original, model.parameters()))
    # a user optimizer and loss are used
    calls: list[str] = []

    def adam(params: Any) -> torch.optim.Optimizer:
        calls.append("optimizer")
        return torch.optim.Adam(params)

    def loss(out: torch.Tensor) -> torch.Tensor:
        calls.append("loss")
        return out.square().mean()

    layerscope.benchmark(model, x, [1], mode="train", optimizer=adam, loss_fn=loss, **FAST)
    assert calls[0] == "optimizer" and calls.count("loss") >= 6


def test_dtype_autocast_and_compile_run_on_a_copy() -> None:
    model, x = mlp()
    half = layerscope.benchmark(model, x, [2], dtype=torch.bfloat16, **FAST)
    assert half.dtype == "bfloat16" and half.model_bytes_by_dtype == {"bfloat16": 2 * half.params}
    amp = layerscope.benchmark(model, x, [2], autocast="bfloat16", **FAST)
    assert amp.autocast == "bfloat16" and amp.dtype == "float32"
    compiled = layerscope.benchmark(model, x, [1, 2], compile=True, compile_options={"backend": "eager"}, **FAST)
    assert compiled.compiled and compiled.compile_time_ns == compiled.batch(1).first_run_ns > 0
    assert compiled.flops == layerscope.count_flops(model, x).root.forward.flops  # counted on the eager copy
    assert next(model.parameters()).dtype == torch.float32 and not model.training


# -- batching, out of memory, bad input ------------------------------------------------------


def test_batching_rule_and_builders() -> None:
    sample = {"x": torch.randn(1, 3), "mask": torch.ones(1, 5, dtype=torch.bool), "scale": 2.0}
    batch = batch_of(sample, 4)
    assert batch["x"].shape == (4, 3) and batch["mask"].shape == (4, 5) and batch["scale"] == 2.0
    assert torch.equal(batch["x"][3], sample["x"][0])
    assert batch_of(lambda n: torch.zeros(n, 2), 6).shape == (6, 2)
    model = nn.Linear(3, 2)
    result = layerscope.benchmark(model, lambda n: torch.randn(n, 3), [1, 3], **FAST)
    assert [b.status for b in result.batches] == ["ok", "ok"]


@pytest.mark.parametrize(
    ("sample", "found"),
    [(torch.randn(64), "shape [64] (size 64 at dim 0)"), (torch.tensor(3.0), "scalar tensor (no batch dimension)"),
     ((torch.randn(1, 8), torch.randn(2, 8)), "shape [2, 8]")],
)
def test_a_sample_that_cannot_be_batched_says_how_batching_works(sample: Any, found: str) -> None:
    with pytest.raises(InputsError) as info:
        layerscope.benchmark(nn.Linear(8, 8), sample, [1, 4], **FAST)
    message = str(info.value)
    assert found in message and "batch dimension of size 1 at dim 0" in message
    assert "sample=lambda batch_size" in message and "--inputs" in message


@pytest.mark.parametrize("error", [torch.cuda.OutOfMemoryError, RuntimeError])
def test_out_of_memory_is_recorded_and_larger_sizes_skipped(error: type[Exception]) -> None:
    result = layerscope.benchmark(oom_above(4, error), torch.randn(1, 8), [1, 2, 8, 16], **FAST)
    assert [b.status for b in result.batches] == ["ok", "ok", "oom", "skipped"]
    assert result.best_batch_size in (1, 2)
    assert "out of memory at batch size 8" in " ".join(result.warnings)
    text = result.render()
    assert re.search(r"^ +8 +OOM$", text, re.M) and re.search(r"^ +16 +SKIPPED$", text, re.M)
    assert from_dict(json.loads(json.dumps(result.to_dict()))).to_dict() == result.to_dict()


def cpu_allocation_fails(limit: int) -> FailsAbove:
    """Above a batch size, asks the CPU allocator for 2**50 bytes per sample: the real
    DefaultCPUAllocator error ("can't allocate memory"), no simulation."""
    return FailsAbove(limit, lambda batch: torch.empty(batch * 2**50, dtype=torch.uint8))


def test_a_real_cpu_allocation_failure_is_out_of_memory() -> None:
    result = layerscope.benchmark(cpu_allocation_fails(2), torch.randn(1, 8), [1, 2, 4, 8], memory=False, **FAST)
    assert [b.status for b in result.batches] == ["ok", "ok", "oom", "skipped"]


def test_bad_settings_are_named() -> None:
    model = nn.Linear(8, 8)
    x = torch.randn(1, 8)
    with pytest.raises(ValueError, match="batch_sizes must be a non-empty list of whole numbers >= 1, got \\[0\\]"):
        layerscope.benchmark(model, x, [0])
    with pytest.raises(ValueError, match="mode must be one of inference, train, got 'eval'"):
        layerscope.benchmark(model, x, mode="eval")
    with pytest.raises(ValueError, match="min_runs must be an int >= 1"):
        layerscope.benchmark(model, x, min_runs=0)
    with pytest.raises(layerscope.LayerscopeError, match=r"expected a torch\.nn\.Module"):
        layerscope.benchmark(nn.Linear, x)


# -- data model, JSON, rendering, compare (hand-made, no timing) ------------------------------


def made(times: dict[int, list[int]], *, model: str = "MLP", machine: bool = True) -> BenchResult:
    return BenchResult(
        model=model, mode="inference", device="cpu", dtype="float32", params=85000, trainable_params=85000,
        model_bytes_by_dtype={"float32": 340000}, flops=170000, macs=84480, count_batch_size=1,
        batches=[BatchResult(n, times_ns=t, first_run_ns=5 * t[0], peak_memory_bytes=4096 * n) for n, t in times.items()],
        settings={"warmup": 3, "min_runs": 5, "min_time_s": 0.5},
        machine={"cpu": "Test CPU", "threads": 2, "torch_version": "2.13.0+cpu", "python_version": "3.11.7"} if machine else {},
    )


BASE = {1: [100_000, 101_000, 99_000, 100_000, 100_000], 8: [400_000, 404_000, 396_000, 400_000, 400_000]}


def test_statistics_by_hand() -> None:
    entry = made(BASE).batch(8)
    assert entry.mean_ns == 400_000 and entry.p50_ns == 400_000 and entry.min_ns == 396_000
    # sample std: sqrt((4000² + 4000²) / 4) = 2828.4...
    assert entry.std_ns == pytest.approx(math.sqrt(8_000_000))
    assert entry.p90_ns == pytest.approx(402_400)  # 400000 + 0.6 * (404000 - 400000)
    assert entry.throughput_per_s == 20_000  # 8 samples / 0.4 ms
    assert made(BASE).best_batch_size == 8


def test_json_round_trip_and_schema_errors(tmp_path: Path, mlp_result: BenchResult) -> None:
    path = tmp_path / "bench.json"
    mlp_result.save(path)
    again = layerscope.load(path)
    assert again.to_dict() == mlp_result.to_dict() and again.render() == mlp_result.render()
    doc = json.loads(path.read_text())
    assert doc["schema"] == "layerscope-bench/1" and doc["batches"][0]["summary"]["p50_ns"] == mlp_result.batches[0].p50_ns
    with pytest.raises(SchemaError, match="expected schema 'layerscope-bench/1', found 'layerscope/1' \\(a profile"):
        from_dict({"schema": "layerscope/1"})
    with pytest.raises(SchemaError, match="'flops' must be a whole number or null"):
        from_dict({**doc, "flops": "many"})
    with pytest.raises(SchemaError, match="batch size 1 has status 'ok' but no timed runs"):
        from_dict({**doc, "batches": [{"batch_size": 1, "status": "ok", "times_ns": []}]})
    (tmp_path / "cut.json").write_text(path.read_text()[:50])
    with pytest.raises(SchemaError, match="not valid JSON"):
        layerscope.load(tmp_path / "cut.json")


def test_bench_load_is_a_deprecated_alias_that_reads_benchmarks_only(tmp_path: Path, mlp_result: BenchResult) -> None:
    mlp_result.save(tmp_path / "bench.json")
    layerscope.count_flops(nn.Linear(2, 2), torch.randn(1, 2)).save(tmp_path / "prof.json")
    with pytest.warns(DeprecationWarning, match="use layerscope.load"):
        assert layerscope.bench.load(tmp_path / "bench.json").to_dict() == mlp_result.to_dict()
    with pytest.warns(DeprecationWarning), pytest.raises(SchemaError, match="not a layerscope benchmark: it is a profile"):
        layerscope.bench.load(tmp_path / "prof.json")
    (tmp_path / "trace.json").write_text('{"traceEvents": []}')
    with pytest.warns(DeprecationWarning), pytest.raises(SchemaError, match="not a layerscope benchmark \\(no 'schema'"):
        layerscope.bench.load(tmp_path / "trace.json")


def test_golden_table(golden: Any) -> None:
    result = made(BASE | {32: [1_500_000, 1_900_000, 1_200_000, 1_400_000, 1_500_000]})
    result.batches.append(BatchResult(64, status="oom"))
    golden("bench_table.out", result.render())


def test_compare_ratio_and_noise(golden: Any) -> None:
    slower = {1: [t * 12 // 10 for t in BASE[1]], 8: [400_000, 420_000, 380_000, 400_000, 400_000]}
    comparison = compare(made(BASE), made(slower | {4: [1000] * 5}))
    one, eight = comparison.rows
    assert one.ratio == pytest.approx(1.2) and one.significant and one.verdict == "slower"
    assert eight.ratio == 1.0 and not eight.significant and eight.verdict == "within noise"
    assert comparison.only_new == [4] and comparison.only_base == []
    assert [r.batch_size for r in comparison.regressions(0.1)] == [1]
    assert comparison.regressions(0.25) == []
    faster = compare(made(slower), made(BASE)).rows[0]
    assert faster.ratio == pytest.approx(1 / 1.2) and faster.verdict == "faster"
    golden("bench_compare.out", comparison.render())


# -- command line ---------------------------------------------------------------------------


@pytest.mark.slow  # command lines end to end
def test_cli_bench_json_plot_and_compare(tmp_path: Path) -> None:
    run = run_cli("bench", "zoo:mlp", "--batch-sizes", "1", "4", "--min-runs", "3", "--min-time", "0.02",
                  "-o", "r.json", "--plot", "r.png", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "zoo:mlp: inference, float32, cpu" in run.stdout and "samples/s" in run.stdout
    result = layerscope.load(tmp_path / "r.json")
    assert [b.batch_size for b in result.batches] == [1, 4] and result.model == "zoo:mlp"
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    same = run_cli("bench", "--compare", "r.json", "r.json", "--fail-above", "10%", cwd=tmp_path)
    assert same.returncode == 0 and "within noise" in same.stdout
    made(BASE).save(tmp_path / "base.json")
    made({1: [t * 2 for t in BASE[1]]}).save(tmp_path / "new.json")
    worse = run_cli("bench", "--compare", "base.json", "new.json", "--fail-above", "10%", cwd=tmp_path)
    assert worse.returncode == 1 and "x2.000" in worse.stdout
    assert "regression: batch size 1 is x2.000 slower" in worse.stderr


def test_cli_bench_bad_input(tmp_path: Path) -> None:
    assert "needs a SPEC" in assert_usage_error(run_cli("bench", cwd=tmp_path))
    layerscope.count_flops(nn.Linear(2, 2), torch.randn(1, 2)).save(tmp_path / "prof.json")
    line = assert_usage_error(run_cli("bench", "--compare", "prof.json", "prof.json", cwd=tmp_path))
    assert "not a layerscope benchmark" in line and "layerscope show" in line
    made(BASE).save(tmp_path / "bench.json")
    line = assert_usage_error(run_cli("show", "bench.json", cwd=tmp_path))
    assert "not a layerscope profile, merged run of ranks or diff of two profiles: it is a benchmark" in line
    assert "bench --compare" in line
    line = assert_usage_error(run_cli("bench", "zoo:mlp", "--input", "64", cwd=tmp_path))
    assert "size 64 at dim 0" in line and "--inputs" in line
    assert "no such benchmark file" in assert_usage_error(run_cli("bench", "--compare", "a.json", "b.json", cwd=tmp_path))
    assert ".png" in assert_usage_error(run_cli("bench", "zoo:mlp", "--plot", "x.jpg", cwd=tmp_path))


def test_plot_bench_from_a_dict(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from layerscope.render.plot import plot_bench

    plot_bench(made(BASE).to_dict(), tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_plot_draws_peak_memory_per_batch_size() -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from layerscope.render.plot import draw_bench

    axes = draw_bench(Figure(), made(BASE))
    assert [a.get_ylabel() for a in axes] == ["latency per batch (us)", "throughput (samples/s)", "peak memory (KiB)"]
    (line,) = axes[2].get_lines()
    # made() gives batch n a peak of 4096 * n bytes: 4 and 32 KiB.
    assert list(line.get_xdata()) == [1, 8] and list(line.get_ydata()) == [4.0, 32.0]
    bare = made(BASE)
    for entry in bare.batches:
        entry.peak_memory_bytes = None
    assert len(draw_bench(Figure(), bare)) == 2  # nothing measured, no memory panel


# -- CUDA (skipped without a GPU) -----------------------------------------------------------

cuda = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("mode", ["inference", "train"])
@cuda[0]
@cuda[1]
def test_cuda_benchmark_has_transfers_and_allocator_peaks(mode: str) -> None:
    model, x = mlp()
    result = layerscope.benchmark(model, x, [1, 8], device="cuda", mode=mode, **FAST)
    assert result.device.startswith("cuda") and result.machine["gpu"]
    for entry in result.batches:
        assert entry.h2d_ns and entry.d2h_ns and entry.peak_memory_bytes and entry.runs >= 5
    assert next(model.parameters()).device.type == "cpu"


@cuda[0]
@cuda[1]
def test_cuda_max_batch_search_finds_the_largest_that_fits() -> None:
    limit = 40

    class Big(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] > limit:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
            return self.linear(x)

    result = layerscope.benchmark(Big(), torch.randn(1, 8), [1, 2], device="cuda", find_max_batch=True, **FAST)
    assert result.max_batch_size == limit


def test_noise_warning_needs_the_bulk_of_the_runs_spread() -> None:
    # 99 runs of 100 us and one of 10 ms: CV is 99% (10 ms pulls the mean and std), but
    # p10..p90 is 0 wide: the percentiles are trustworthy, so no warning.
    outlier = BatchResult(1, times_ns=[100_000] * 99 + [10_000_000])
    assert outlier.cv > 0.10
    assert outlier.p90_ns - outlier.p10_ns == 0
    # Runs spread evenly from 50 us to 150 us: CV ~29%, p10..p90 ~80% of p50: warned.
    spread = BatchResult(2, times_ns=[50_000 + 1_000 * k for k in range(101)])
    assert spread.cv > 0.10
    result = made({})
    result.batches = [outlier, spread]
    [warning] = result.warnings
    assert "batch size 2 (" in warning and "batch size 1 (" not in warning


# -- FLOPs it could not count -------------------------------------------------------------


def test_flops_it_could_not_count_are_unknown_not_zero(tmp_path: Path) -> None:
    # The count runs at the smallest batch size; out of memory there, FLOPs are unknown.
    result = layerscope.benchmark(oom_above(0), torch.randn(1, 8), [1, 2], **FAST)
    assert result.flops is None and result.macs is None and result.flops_per_sample is None
    assert "per sample   ? MACs, ? FLOPs (unknown: the count ran out of memory)" in result.render()
    result.save(tmp_path / "bench.json")
    assert layerscope.load(tmp_path / "bench.json").flops is None


@torch.library.custom_op("layerscope_test::mystery", mutates_args=())
def _mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_ops_with_no_formula_are_listed_not_counted_as_zero(tmp_path: Path) -> None:
    class Mystery(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(_mystery(x))

    result = layerscope.benchmark(Mystery(), torch.randn(1, 8), [1], **FAST)
    assert result.unsupported_ops == {"layerscope_test::mystery": 1}
    assert result.macs == 8 * 4  # the linear's count stands
    assert "ops with no FLOP formula (not counted in FLOPs): layerscope_test::mystery x1" in result.render()
    result.save(tmp_path / "bench.json")
    assert layerscope.load(tmp_path / "bench.json").unsupported_ops == {"layerscope_test::mystery": 1}


def test_an_interrupted_benchmark_keeps_the_batch_sizes_that_finished(tmp_path: Path) -> None:
    from layerscope.bench.measure import BenchInterrupted

    class StopsAt8(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] == 8:
                raise KeyboardInterrupt  # the user's Ctrl-C, while batch size 8 runs
            return self.fc(x)

    with pytest.raises(KeyboardInterrupt) as stopped:
        layerscope.benchmark(StopsAt8(), torch.randn(1, 4), batch_sizes=[1, 2, 8, 32], min_runs=3, min_time_s=0)
    assert isinstance(stopped.value, BenchInterrupted)
    result = stopped.value.result
    assert [(b.batch_size, b.status) for b in result.batches] == [(1, "ok"), (2, "ok"), (8, "interrupted"), (32, "interrupted")]
    text = result.render("text")
    assert "    8  INTERRUPTED" in text and "   32  INTERRUPTED" in text
    # The best is chosen among the sizes that finished only; which of 1 and 2 wins is the clock's call.
    fastest = max(result.batches[:2], key=lambda b: (b.throughput_per_s, -b.batch_size)).batch_size
    assert result.best_batch_size == fastest
    assert f"best throughput: batch size {fastest}," in text
    result.save(tmp_path / "partial.json")
    again = layerscope.load(tmp_path / "partial.json")
    assert [b.status for b in again.batches] == ["ok", "ok", "interrupted", "interrupted"]


def test_the_input_is_shown_and_a_sequence_model_gets_tokens_per_second(golden: Any) -> None:
    # Token ids [1, 128] at batch size 1: 128 tokens per sample. Batch 8 in 0.4 ms is
    # 20,000 samples/s (hand: 8 / 0.0004 s), so 2,560,000 tokens/s.
    result = made(BASE, model="GPT2Model")
    result.input_shapes, result.input_dtypes = {"input_ids": [1, 128], "attention_mask": [1, 128]}, {
        "input_ids": "int64", "attention_mask": "int64"}
    assert result.inputs == [("input_ids", [1, 128], "int64"), ("attention_mask", [1, 128], "int64")]
    assert result.tokens_per_sample == 128
    text = result.render()
    assert "input        input_ids int64 [1, 128], attention_mask int64 [1, 128] (at batch size 1; 128 tokens per sample)" in text
    assert "best throughput: batch size 8, 20.00K samples/s, 2.56M tokens/s" in text
    golden("bench_table_tokens.out", text)
    again = from_dict(json.loads(result.render("json")))
    assert again.inputs == result.inputs and again.to_dict()["tokens_per_sample"] == 128
    from layerscope.render.bench_html import bench_data

    assert bench_data(result)["tokens_per_sample"] == 128 and bench_data(result)["inputs"][0]["shape"] == [1, 128]
    # An image model's float input: its input shown, no tokens.
    image = made(BASE)
    image.input_shapes, image.input_dtypes = [[1, 3, 32, 32]], ["float32"]
    assert image.inputs == [("0", [1, 3, 32, 32], "float32")] and image.tokens_per_sample is None
    assert "tokens" not in image.render()
    # A result saved before inputs were kept: nothing is made up.
    old = json.loads(made(BASE).render("json"))
    del old["input_shapes"], old["input_dtypes"], old["tokens_per_sample"]
    assert from_dict(old).inputs == [] and "input " not in from_dict(old).render()


def test_a_real_benchmark_records_what_it_fed_the_model() -> None:
    model, x = mlp()
    result = layerscope.benchmark(model, x, [1, 2], **FAST)
    assert result.inputs == [("input", list(x.shape), "float32")] and result.tokens_per_sample is None
    tokens = torch.randint(0, 50, (1, 12))
    embed = nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(96, 4)).eval()
    sequence = layerscope.benchmark(embed, tokens, [1, 3], **FAST)
    assert sequence.inputs == [("input", [1, 12], "int64")] and sequence.tokens_per_sample == 12
    assert "tokens/s" in sequence.render()
