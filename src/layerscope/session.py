"""The two ways in: ``profile(model, inputs)`` runs the passes itself; ``Profiler(model)``
wraps the user's own code for one run. Both end in a :class:`~layerscope.tree.Profile`."""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from layerscope import __version__
from layerscope.build import build_profile
from layerscope.capture.inputs import check_signature, shapes_of, split_inputs
from layerscope.capture.modules import model_device, model_dtype, module_table, require_module
from layerscope.capture.recorder import Clock, Recorder, exclusive
from layerscope.errors import ProfilerStateError
from layerscope.raw import RawCapture
from layerscope.tree import Profile

#: ``progress(stage, done, total)``: stage is "warmup", "measure" or "ops".
Progress = Callable[[str, int, int], None]


def _meta(model: nn.Module, device: torch.device, **extra: Any) -> dict[str, Any]:
    return {
        "model": type(model).__name__,
        "layerscope_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "device": str(device),
        "dtype": model_dtype(model),
        "training": model.training,
        **extra,
    }


def profile(
    model: nn.Module,
    inputs: Any = None,
    *,
    warmup: int = 2,
    repeat: int = 5,
    paths: Sequence[str] | None = None,
    record_ops: bool = True,
    no_grad: bool = True,
    progress: Progress | None = None,
    clock: Clock | None = None,
    peak_tflops: float | None = None,
) -> Profile:
    """Profile ``model``'s forward pass on ``inputs``, layer by layer.

    ``inputs`` is a Tensor, a tuple/list of positional arguments, or a dict of keyword
    arguments. ``warmup`` unmeasured passes run first, then ``repeat`` timing passes
    (per-module medians are reported), then, with ``record_ops``, one more pass that
    records each module's aten ops and shapes (kept apart so op recording does not
    inflate the module times). ``paths`` limits profiling to those ``named_modules()``
    subtrees. ``no_grad`` runs the passes under ``torch.no_grad()`` as inference does.
    ``clock`` replaces ``time.perf_counter_ns`` (tests use a fake one). ``peak_tflops``
    is the hardware's peak for MFU (% of peak per module); on common GPUs it is known.

    The model is left as it was: hooks are removed and modes exited even if it raises,
    and its exception reaches the caller unchanged.
    """
    require_module(model)
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be an int >= 1, got {repeat!r}")
    args, kwargs = split_inputs(inputs)
    check_signature(model, args, kwargs)
    modules, infos, param_bytes = module_table(model, paths)
    device = model_device(model)
    peak_flops_per_s = _peak(peak_tflops, device, model_dtype(model))
    recorder = Recorder(modules, [i.selected for i in infos], device=device, clock=clock)
    report = progress or (lambda stage, done, total: None)

    grad = torch.no_grad() if no_grad else contextlib.nullcontext()
    with exclusive(model), grad:
        for n in range(warmup):
            if record_ops and n == warmup - 1:
                with recorder.warm_detail_pass():
                    model(*args, **kwargs)
            else:
                model(*args, **kwargs)
            report("warmup", n + 1, warmup)
        for n in range(repeat):
            with recorder.timing_pass():
                model(*args, **kwargs)
            report("measure", n + 1, repeat)
        if record_ops:
            with recorder.detail_pass():
                model(*args, **kwargs)
            report("ops", 1, 1)

    raw = RawCapture(
        modules=infos,
        timing_passes=recorder.timing_passes,
        op_pass=recorder.op_pass,
        module_shapes=recorder.module_shapes,
        has_device_time=recorder.has_device_time,
        param_bytes=param_bytes,
        meta=_meta(
            model,
            device,
            mode="profile",
            warmup=warmup,
            repeat=repeat,
            no_grad=no_grad,
            paths=None if paths is None else list(paths),
            inputs=[shapes_of(list(args)), shapes_of(kwargs)],
            peak_flops_per_s=peak_flops_per_s,
        ),
    )
    return build_profile(raw)


def _peak(peak_tflops: float | None, device: torch.device, dtype: str | None) -> int | None:
    if peak_tflops is not None:
        if not peak_tflops > 0:
            raise ValueError(f"peak_tflops must be a positive number of TFLOP/s, got {peak_tflops!r}")
        return int(peak_tflops * 1e12)
    from layerscope.capture.peaks import known_peak_flops_per_s

    return known_peak_flops_per_s(device, dtype)


def count_flops(
    model: nn.Module,
    inputs: Any = None,
    *,
    paths: Sequence[str] | None = None,
    no_grad: bool = True,
) -> Profile:
    """FLOPs, MACs, bytes, params and shapes from one forward pass, without timing.

    Works on the meta device: build the model under ``with torch.device("meta"):`` and
    pass meta inputs to count a model too large to run (nothing is allocated).
    """
    require_module(model)
    args, kwargs = split_inputs(inputs)
    check_signature(model, args, kwargs)
    modules, infos, param_bytes = module_table(model, paths)
    device = model_device(model)
    recorder = Recorder(modules, [i.selected for i in infos], device=torch.device("cpu"))
    grad = torch.no_grad() if no_grad else contextlib.nullcontext()
    with exclusive(model), grad, recorder.detail_pass():
        model(*args, **kwargs)
    raw = RawCapture(
        modules=infos,
        op_pass=recorder.op_pass,
        module_shapes=recorder.module_shapes,
        param_bytes=param_bytes,
        meta=_meta(
            model, device, mode="count", timed=False, no_grad=no_grad,
            paths=None if paths is None else list(paths),
            inputs=[shapes_of(list(args)), shapes_of(kwargs)],
        ),
    )
    return build_profile(raw)


class Profiler:
    """Profile whatever runs in a ``with`` block, once::

        with layerscope.Profiler(model) as prof:
            model(x)
        print(prof)

    Ops and shapes are recorded in the same run as the times (``record_ops=False``
    gives the leanest timing). After the block ``prof`` reads like a ``Profile``. If the
    block raises, what was captured up to then is still kept and readable.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        paths: Sequence[str] | None = None,
        record_ops: bool = True,
        clock: Clock | None = None,
    ) -> None:
        self.model = require_module(model)
        self._paths = paths
        self._record_ops = record_ops
        self._clock = clock
        self._stack: contextlib.ExitStack | None = None
        self._recorder: Recorder | None = None
        self._infos: list[Any] = []
        self._param_bytes = 0
        self._profile: Profile | None = None

    def __enter__(self) -> Profiler:
        if self._stack is not None:
            raise ProfilerStateError("this Profiler is already running; use a new one for each block")
        modules, self._infos, self._param_bytes = module_table(
            self.model, self._paths, with_repr=self._record_ops
        )
        self._device = model_device(self.model)
        self._recorder = Recorder(
            modules, [i.selected for i in self._infos], device=self._device, clock=self._clock
        )
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(exclusive(self.model))
            if self._record_ops:
                stack.enter_context(self._recorder.detail_pass(also_timing=True))
            else:
                stack.enter_context(self._recorder.timing_pass())
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, *exc_info: Any) -> bool:
        assert self._stack is not None and self._recorder is not None
        try:
            self._stack.__exit__(*exc_info)
        finally:
            self._stack = None
            self._profile = build_profile(
                RawCapture(
                    modules=self._infos,
                    timing_passes=self._recorder.timing_passes,
                    op_pass=self._recorder.op_pass,
                    module_shapes=self._recorder.module_shapes,
                    has_device_time=self._recorder.has_device_time,
                    param_bytes=self._param_bytes,
                    meta=_meta(
                        self.model,
                        self._device,
                        mode="context",
                        warmup=0,
                        repeat=1,
                        paths=None if self._paths is None else list(self._paths),
                    ),
                )
            )
        return False

    # -- the Profile reading API ------------------------------------------------------
    @property
    def profile(self) -> Profile:
        if self._profile is None:
            state = "still running" if self._stack is not None else "not started"
            raise ProfilerStateError(f"the Profiler is {state}; read it after its with-block ends")
        return self._profile

    def __getattr__(self, name: str) -> Any:
        # Reading methods (to_dict, save, render, node, ...) are the Profile's own.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.profile, name)

    def __getitem__(self, path: str) -> Any:
        return self.profile[path]

    def __str__(self) -> str:
        return str(self.profile)
