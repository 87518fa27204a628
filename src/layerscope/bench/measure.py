"""Measuring a whole model: latency, throughput and peak memory per batch size.

The only part of :mod:`layerscope.bench` that imports torch. The user's model is never
changed: inference on the model itself runs in ``eval()`` and every module's mode is
put back in ``finally``; a training step, a dtype, another device or ``compile=True``
work on a deep copy.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from layerscope.base.errors import InputsError
from layerscope.base.stats import median_floor
from layerscope.capture._torch import tree_leaves, tree_map
from layerscope.capture.inputs import dtypes_of, shapes_of
from layerscope.capture.memory import model_memory
from layerscope.capture.modules import model_device, model_dtype, modes_restored, require_module
from layerscope.capture.training import loss_of
from layerscope.model.bench import BatchResult, BenchResult

#: ``progress(stage, done, total)``, as ``layerscope.profile``'s.
Progress = Callable[[str, int, int], None]

MODES = ("inference", "train")

BATCHING_RULE = (
    "a sample is one example: every tensor in it (a Tensor, or each tensor of a tuple, list or dict) "
    "has a batch dimension of size 1 at dim 0, and is repeated along dim 0 to each batch size"
)
BUILDER_HINT = (
    "or pass a builder instead: in Python sample=lambda batch_size: ..., "
    "on the command line --inputs module:callable taking the batch size"
)


#: How allocators word running out of memory (CUDA's, and the CPU allocator's
#: "DefaultCPUAllocator: can't allocate memory ... (Cannot allocate memory)").
_OOM_WORDS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_oom(exc: BaseException) -> bool:
    """Out of memory: CUDA's own error, or a RuntimeError saying so (CPU allocators)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(words in text for words in _OOM_WORDS)


def batch_of(sample: Any, batch_size: int) -> Any:
    """``sample`` (a batch of 1 along dim 0) repeated to ``batch_size`` along dim 0, or
    ``sample(batch_size)`` when it is a callable. Non-tensor values pass through."""
    if callable(sample) and not isinstance(sample, torch.Tensor):
        return sample(batch_size)

    def grow(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if value.dim() == 0 or value.shape[0] != 1:
            got = "a scalar tensor (no batch dimension)" if value.dim() == 0 else (
                f"a tensor of shape {list(value.shape)} (size {value.shape[0]} at dim 0)"
            )
            raise InputsError(f"cannot batch the sample to batch size {batch_size}: it holds {got}; {BATCHING_RULE}; {BUILDER_HINT}")
        # A real copy, not an expand() view: the model sees the memory a batch takes.
        return value.repeat(batch_size, *([1] * (value.dim() - 1)))

    return tree_map(grow, sample)


def _cast(batch: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    def move(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        return value.to(device)

    return tree_map(move, batch)


def _call(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _parse_dtype(value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    from layerscope.zoo.specs import parse_dtype

    return parse_dtype(str(value))


def machine_info(device: torch.device) -> dict[str, Any]:
    """The machine a result was measured on."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    info: dict[str, Any] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_bytes=int(props.total_memory), cuda_version=torch.version.cuda)
    return info


def _at_batch(exc: BaseException, batch_size: int) -> BaseException:
    """The model's own exception, same type and traceback, saying at which batch size."""
    where = f"(at batch size {batch_size})"
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]} {where}", *exc.args[1:])
    else:
        exc.add_note(f"layerscope.benchmark: raised {where}")
    return exc


class _Runner:
    """One benchmarked model (the user's, or a copy) and the step that is timed."""

    def __init__(
        self, model: nn.Module, *, mode: str, device: torch.device, autocast: torch.dtype | None,
        loss_fn: Callable[[Any], Any] | None, optimizer: Callable[[Any], torch.optim.Optimizer] | None, lr: float,
    ) -> None:
        self.model = model
        self.train = mode == "train"
        self.device = device
        self.autocast = autocast
        self.loss_fn = loss_fn
        self.optimizer: torch.optim.Optimizer | None = None
        if self.train:
            params = [p for p in model.parameters() if p.requires_grad]
            self.optimizer = optimizer(params) if optimizer is not None else torch.optim.SGD(params, lr=lr)

    def amp(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast)

    def grad_mode(self) -> contextlib.AbstractContextManager[Any]:
        # inference_mode rather than no_grad: it also skips version counters and view
        # tracking, which is what a deployed model runs under.
        return torch.enable_grad() if self.train else torch.inference_mode()

    def step(self, batch: Any) -> Any:
        with self.amp():
            output = _call(self.model, batch)
            if not self.train:
                return output
            loss = loss_of(output, self.loss_fn)
        loss.backward()
        assert self.optimizer is not None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return output

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def reset(self) -> None:
        """After an out-of-memory error: drop gradients and cached blocks."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def time_runs(
    step: Callable[[], Any], *, min_runs: int, min_time_ns: int, clock: Callable[[], int] = time.perf_counter_ns
) -> list[int]:
    """Run ``step`` until at least ``min_runs`` runs AND ``min_time_ns`` of timed runs;
    each run's wall time in ns. ``step`` must return only when its work is done."""
    times: list[int] = []
    append = times.append
    spent = 0
    while len(times) < min_runs or spent < min_time_ns:
        start = clock()
        step()
        elapsed = clock() - start
        append(elapsed)
        spent += elapsed
    return times


def time_runs_cuda(step: Callable[[], Any], *, min_runs: int, min_time_ns: int, device: torch.device) -> list[int]:
    """As :func:`time_runs`, timed by CUDA events around each run; nothing synchronizes
    between runs, one ``synchronize`` at the end resolves the events. The loop's
    ``min_time_ns`` is counted on the host clock, which may run ahead of the device."""
    events = []
    start = time.perf_counter_ns()
    while len(events) < min_runs or time.perf_counter_ns() - start < min_time_ns:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        step()
        end.record()
        events.append((begin, end))
    torch.cuda.synchronize(device)
    return [round(begin.elapsed_time(end) * 1e6) for begin, end in events]  # ms -> ns


def _transfer_ns(value: Any, device: torch.device, repeat: int = 5) -> int:
    """Median time to copy ``value``'s tensors to ``device``, synchronized."""
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        tree_map(lambda t: t.to(device, non_blocking=False) if isinstance(t, torch.Tensor) else t, value)
        torch.cuda.synchronize()
        times.append(time.perf_counter_ns() - start)
    return median_floor(times)


def _peak_bytes_tracked(runner: _Runner, batch: Any) -> tuple[int | None, Any]:
    """One untimed pass under layerscope's memory tracking: (peak bytes, its profile)."""
    from layerscope.capture.modules import eager_module
    from layerscope.session import count_flops

    # A model compiled by the user is counted through its eager original: the counts are
    # the same, and per-module capture refuses compiled graphs.
    eager = eager_module(runner.model)
    if eager is None:
        eager = runner.model
    with runner.amp():
        prof = count_flops(eager, batch, memory=True, backward=runner.train, loss_fn=runner.loss_fn)
    peak = None if prof.memory is None else prof.memory.peak_bytes
    return peak, prof


def _check_sizes(batch_sizes: Sequence[int]) -> list[int]:
    sizes = list(batch_sizes)
    if not sizes or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
        raise ValueError(f"batch_sizes must be a non-empty list of whole numbers >= 1, got {batch_sizes!r}")
    return sorted(set(sizes))


def _check_settings(mode: str, warmup: int, min_runs: int, min_time_s: float) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if not isinstance(min_runs, int) or min_runs < 1:
        raise ValueError(f"min_runs must be an int >= 1, got {min_runs!r}")
    if not isinstance(min_time_s, (int, float)) or min_time_s < 0:
        raise ValueError(f"min_time_s must be a number of seconds >= 0, got {min_time_s!r}")


def benchmark(
    model: nn.Module,
    sample: Any,
    batch_sizes: Sequence[int] = (1, 8, 32),
    *,
    mode: str = "inference",
    warmup: int = 3,
    min_runs: int = 10,
    min_time_s: float = 0.5,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    autocast: str | torch.dtype | None = None,
    compile: bool = False,
    compile_options: dict[str, Any] | None = None,
    loss_fn: Callable[[Any], Any] | None = None,
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    lr: float = 1e-3,
    memory: bool = True,
    find_max_batch: bool = False,
    progress: Progress | None = None,
    inspect_model: Callable[[nn.Module], None] | None = None,
) -> BenchResult:
    """Benchmark ``model`` as a whole: size, FLOPs, then latency, throughput and peak
    memory at each batch size (ascending; an out-of-memory batch size is recorded as
    ``"oom"`` and the larger ones as ``"skipped"``).

    ``sample`` is one example, a batch of 1 along dim 0 (a Tensor, tuple/list of
    positional arguments or dict of keyword arguments; every tensor in it is repeated
    along dim 0 to the batch size), or a callable ``sample(batch_size)`` returning the
    batch. After ``warmup`` untimed runs, runs are timed until there are at least
    ``min_runs`` AND they add up to ``min_time_s``.

    ``mode="inference"`` runs the forward under ``torch.inference_mode()`` in
    ``eval()``; ``mode="train"`` times a whole training step on a deep copy in
    ``train()``: forward, loss (``loss_fn(output)`` or the sum of the first float
    output), backward, ``optimizer.step()`` (``optimizer(params)``, default
    ``torch.optim.SGD(params, lr=lr)``), ``zero_grad``. ``dtype`` casts a copy of the
    model and the float inputs; ``autocast`` runs forward and loss under
    ``torch.autocast(device_type, dtype)``; ``compile=True`` benchmarks
    ``torch.compile(copy, **compile_options)``, its first call reported apart
    (``compile_time_ns``). ``memory`` adds an untimed tracked pass per batch size on
    CPU (on CUDA the allocator's peak is read instead, after
    ``torch.cuda.reset_peak_memory_stats``). ``find_max_batch`` (CUDA) searches the
    largest batch size that fits (see :func:`max_batch_size`). ``inspect_model`` is
    called with the benchmarked model (the copy, where there is one) at the end.

    The user's model comes out as it went in: modes, parameters, gradients, no hooks.
    An exception from the model keeps its type and says at which batch size it came.
    """
    require_module(model)
    sizes = _check_sizes(batch_sizes)
    _check_settings(mode, warmup, min_runs, min_time_s)
    user_device = model_device(model)
    run_device = torch.device(device) if device is not None else user_device
    if run_device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(run_device)!r} was asked for, but this torch sees no CUDA device")
    cast = _parse_dtype(dtype)
    amp_dtype = _parse_dtype(autocast)
    report = progress or (lambda stage, done, total: None)

    needs_copy = mode == "train" or cast is not None or compile or run_device != user_device
    with modes_restored(model):
        working = copy.deepcopy(model) if needs_copy else model
        if needs_copy:
            working.to(device=run_device, dtype=cast)
        working.train(mode == "train")
        runner = _Runner(working, mode=mode, device=run_device, autocast=amp_dtype, loss_fn=loss_fn, optimizer=optimizer, lr=lr)
        result = _measure(
            runner, sample, sizes, cast=cast, warmup=warmup, min_runs=min_runs, min_time_s=min_time_s,
            memory=memory, compile_options=(compile_options or {}) if compile else None, report=report,
        )
        result.settings.update(warmup=warmup, min_runs=min_runs, min_time_s=min_time_s, lr=lr if mode == "train" else None)
        result.model = type(model).__name__
        if find_max_batch:
            result.max_batch_size = max_batch_size(runner, sample, cast=cast, start=sizes[-1])
        if inspect_model is not None:
            inspect_model(working)
    return result


def _measure(
    runner: _Runner, sample: Any, sizes: list[int], *, cast: torch.dtype | None, warmup: int, min_runs: int,
    min_time_s: float, memory: bool, compile_options: dict[str, Any] | None, report: Progress,
) -> BenchResult:
    device = runner.device
    eager = runner.model
    counted: Any = None
    memory_by_size: dict[int, int | None] = {}
    # FLOPs once, at the smallest batch size, on the eager model (the dispatch mode
    # does not see inside compiled graphs); on CPU the same pass gives its memory.
    first = _cast(batch_of(sample, sizes[0]), device, cast)
    try:
        memory_by_size[sizes[0]], counted = _peak_bytes_tracked(runner, first)
    except InputsError:
        raise
    except Exception as exc:
        if not is_oom(exc):
            raise _at_batch(exc, sizes[0]) from None
    compile_time_ns = None
    timed_model: Any = eager
    if compile_options is not None:
        timed_model = torch.compile(eager, **compile_options)
    runner.model = timed_model
    batches: list[BatchResult] = []
    failed = False
    interrupted: KeyboardInterrupt | None = None
    for index, size in enumerate(sizes):
        if interrupted is not None:
            batches.append(BatchResult(size, status="interrupted"))
            continue
        if failed:
            batches.append(BatchResult(size, status="skipped"))
            continue
        try:
            entry = _measure_size(runner, sample, size, cast=cast, warmup=warmup, min_runs=min_runs, min_time_s=min_time_s)
            if compile_options is not None and compile_time_ns is None:
                compile_time_ns = entry.first_run_ns
            if memory and device.type != "cuda":
                runner.model = eager
                if size not in memory_by_size:
                    memory_by_size[size] = _peak_bytes_tracked(runner, _cast(batch_of(sample, size), device, cast))[0]
                entry.peak_memory_bytes = memory_by_size[size]
                runner.model = timed_model
        except InputsError:
            raise
        except KeyboardInterrupt as stop:  # Ctrl-C: the batch sizes done are kept
            runner.model = timed_model
            interrupted, entry = stop, BatchResult(size, status="interrupted")
        except Exception as exc:
            runner.model = timed_model
            if not is_oom(exc):
                raise _at_batch(exc, size) from None
            runner.reset()
            entry, failed = BatchResult(size, status="oom"), True
        batches.append(entry)
        report("batch sizes", index + 1, len(sizes))
    runner.model = eager
    params = list(eager.parameters())
    static = model_memory(eager)
    by_dtype: dict[str, int] = {}
    for part in static.values():
        for name, nbytes in part.items():
            by_dtype[name] = by_dtype.get(name, 0) + nbytes
    # No count (it ran out of memory) is unknown, never 0 FLOPs.
    root = counted.root.forward if counted is not None else None
    result = BenchResult(
        model=type(eager).__name__, mode="train" if runner.train else "inference", device=str(device),
        dtype=model_dtype(eager) or "none", params=sum(p.numel() for p in params),
        trainable_params=sum(p.numel() for p in params if p.requires_grad), model_bytes_by_dtype=by_dtype,
        flops=None if root is None else root.flops, macs=None if root is None else root.macs,
        unsupported_ops={} if counted is None else counted.unsupported_ops(),
        count_batch_size=sizes[0], batches=batches, machine=machine_info(device),
        autocast=None if runner.autocast is None else str(runner.autocast).replace("torch.", ""),
        compiled=compile_options is not None, compile_time_ns=compile_time_ns,
        input_shapes=shapes_of(first), input_dtypes=dtypes_of(first),
    )
    if interrupted is not None:
        raise BenchInterrupted(result) from interrupted
    return result


class BenchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a benchmark: ``result`` holds the batch sizes that finished (the
    rest have status ``interrupted``). A ``KeyboardInterrupt``, so code that stops on one
    still stops."""

    def __init__(self, result: BenchResult) -> None:
        done = [b.batch_size for b in result.batches if b.status == "ok"]
        super().__init__(f"benchmark interrupted; batch sizes done: {done or 'none'}")
        self.result = result


def _measure_size(
    runner: _Runner, sample: Any, size: int, *, cast: torch.dtype | None, warmup: int, min_runs: int, min_time_s: float
) -> BatchResult:
    device = runner.device
    host_batch = batch_of(sample, size)
    entry = BatchResult(size)
    if device.type == "cuda":
        on_host = any(isinstance(t, torch.Tensor) and t.device.type != "cuda" for t in tree_leaves(host_batch))
        entry.h2d_ns = _transfer_ns(host_batch, device) if on_host else None
        torch.cuda.reset_peak_memory_stats(device)  # the benchmark owns the device while it runs
    batch = _cast(host_batch, device, cast)
    step = runner.step
    with runner.grad_mode():
        start = time.perf_counter_ns()
        output = step(batch)
        runner.sync()
        entry.first_run_ns = time.perf_counter_ns() - start
        for _ in range(max(0, warmup - 1)):
            output = step(batch)
        runner.sync()
        if device.type == "cuda":
            entry.d2h_ns = _transfer_ns(output, torch.device("cpu"))
        del output
        min_time_ns = int(min_time_s * 1e9)
        if device.type == "cuda":
            entry.times_ns = time_runs_cuda(lambda: step(batch), min_runs=min_runs, min_time_ns=min_time_ns, device=device)
            entry.peak_memory_bytes = int(torch.cuda.max_memory_allocated(device))
        else:
            entry.times_ns = time_runs(lambda: step(batch), min_runs=min_runs, min_time_ns=min_time_ns)
    return entry


def max_batch_size(
    runner: _Runner, sample: Any, *, cast: torch.dtype | None = None, start: int = 1, limit: int = 1 << 20
) -> int | None:
    """The largest batch size that runs one step without running out of CUDA memory:
    double from ``start`` until OOM (or ``limit``), then bisect between the last size that
    fit and the first that did not. ``empty_cache`` runs between tries. None off CUDA."""
    if runner.device.type != "cuda":
        return None

    def fits(size: int) -> bool:
        try:
            with runner.grad_mode():
                runner.step(_cast(batch_of(sample, size), runner.device, cast))
            runner.sync()
            return True
        except Exception as exc:
            if not is_oom(exc):
                raise _at_batch(exc, size) from None
            return False
        finally:
            runner.reset()

    good, bad = 0, None
    size = max(1, start)
    while size <= limit:
        if not fits(size):
            bad = size
            break
        good, size = size, size * 2
    if bad is None:
        return good
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if fits(middle) else (good, middle)
    return good or None
