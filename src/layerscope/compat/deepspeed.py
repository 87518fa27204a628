"""DeepSpeed's flops profiler, on layerscope's measurements.

Change the import, keep the code::

    # from deepspeed.profiling.flops_profiler import get_model_profile, FlopsProfiler
    from layerscope.compat.deepspeed import get_model_profile, FlopsProfiler

    flops, macs, params = get_model_profile(model, input_shape=(1, 3, 224, 224))

``get_model_profile`` takes today's DeepSpeed arguments and the older ones of the first
``pytorch-profiler`` (``input_res``, ``input_constructor``, ``depth``, ``top_num``,
``as_strings``, ``print_aggregated_profile``, ``num_steps``); a call that uses an older
name gets the older behaviour: ``input_res`` (or the shape given second) has no batch
dimension (a batch of 1 is added) and ``(macs, params)`` is returned.

Where DeepSpeed differs, layerscope's numbers stand (docs/migrating.md):

- FLOPs and MACs are counted per aten op (``layerscope.count_flops``'s counting), so
  elementwise ops, attention and anything a module calls are in; tied weights count once.
- ``mode="backward"`` measures the backward, module by module, where DeepSpeed assumes
  twice the forward; a ``FlopsProfiler`` window that runs ``loss.backward()`` has it too.
- Nothing is added to the model (no ``module.__flops__``), no ``torch.nn.functional``
  is patched, and the model's train/eval flags are left as they were.

As in DeepSpeed, ``get_model_profile(print_profile=True)`` and ``print_model_profile``
print (or write ``output_file``): they are the calls that ask for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from layerscope.base import fmt
from layerscope.base.errors import ProfilerStateError
from layerscope.base.io import write_atomic
from layerscope.block import Profiler
from layerscope.capture.modules import modes_restored, require_module
from layerscope.capture.recorder import Clock
from layerscope.model.tree import Profile
from layerscope.session import count_flops, profile

__all__ = [
    "FlopsProfiler",
    "bytes_to_string",
    "duration_to_string",
    "flops_to_string",
    "get_model_profile",
    "macs_to_string",
    "number_to_string",
    "params_to_string",
]

#: Keyword names of the first DeepSpeed profiler (the seed README's), accepted as well.
LEGACY_NAMES = frozenset(
    {"input_res", "input_constructor", "depth", "top_num", "as_strings", "print_aggregated_profile", "num_steps"}
)

MODES = ("forward", "backward", "generate")


# -- DeepSpeed's string helpers, for code that imports them ------------------------------


def number_to_string(num: float, units: str | None = None, precision: int = 2) -> str:
    return fmt.si_number(num, units, precision)


def macs_to_string(macs: float, units: str | None = None, precision: int = 2) -> str:
    return fmt.si_number(macs, units, precision) + "MACs"


def flops_to_string(flops: float, units: str | None = None, precision: int = 2) -> str:
    return fmt.si_number(flops, units, precision) + "FLOPS"


def bytes_to_string(nbytes: float, units: str | None = None, precision: int = 2) -> str:
    return fmt.si_number(nbytes, units, precision) + "B"


def params_to_string(params: float, units: str | None = None, precision: int = 2) -> str:
    units = units.replace("B", "G") if units else units
    return fmt.si_number(params, units, precision).replace("G", "B").strip()


def duration_to_string(seconds: float, units: str | None = None, precision: int = 2) -> str:
    return fmt.si_number(seconds, units, precision) + "s"


# -- get_model_profile ----------------------------------------------------------------


def _type_names(modules: Sequence[Any] | None) -> tuple[str, ...]:
    return tuple(m.__name__ if isinstance(m, type) else str(m) for m in (modules or ()))


def _engine_sizes(ds_engine: Any) -> dict[str, Any]:
    """The sizes a DeepSpeed engine reports, read without importing DeepSpeed."""
    if ds_engine is None:
        return {}
    sizes = {key: getattr(ds_engine, key, None) for key in ("world_size", "dp_world_size", "mp_world_size")}
    batch = getattr(ds_engine, "train_micro_batch_size_per_gpu", None)
    sizes["batch_size"] = batch() if callable(batch) else batch
    return sizes


def _example(model: nn.Module, shape: Sequence[int]) -> torch.Tensor:
    """A tensor of ``shape`` with the dtype and device of the model's first parameter
    (ones: DeepSpeed's uninitialised memory could hold NaNs or denormals, which skew time)."""
    if not isinstance(shape, (tuple, list)) or not shape:
        raise ValueError(f"input_shape must be a non-empty tuple of ints, got {shape!r}")
    first = next(model.parameters(), None)
    if first is None:
        return torch.ones(tuple(shape))
    return torch.ones(tuple(shape), dtype=first.dtype, device=first.device)


def _as_inputs(value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What an old-style ``input_constructor`` returned, as forward's arguments: a dict
    is keyword arguments (the old API called ``model(**input)``), a tuple or list the
    positional ones, anything else the one argument."""
    if isinstance(value, Mapping):
        return (), dict(value)
    if isinstance(value, (tuple, list)):
        return tuple(value), {}
    return (value,), {}


def _measure(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    mode: str,
    warm_up: int,
    timed: bool,
    clock: Clock | None,
) -> Profile:
    """One profile of the call: timed (``warm_up`` passes, then one measured, as
    DeepSpeed does) when it is printed, else counted in one pass."""
    backward = mode == "backward"
    if mode == "forward" and args and kwargs:
        mode = "call"  # profile() takes positional or keyword arguments, not both
    if mode in ("forward", "backward"):
        inputs: Any = dict(kwargs) if kwargs else tuple(args)
        if not timed:
            return count_flops(model, inputs, backward=backward, memory=False)
        return profile(model, inputs, warmup=warm_up, repeat=1, backward=backward, memory=False, clock=clock)

    def run() -> Any:
        return model.generate(*args, **kwargs) if mode == "generate" else model(*args, **kwargs)

    with torch.no_grad():
        for _ in range(warm_up):
            run()
        with Profiler(model, memory=False, clock=clock) as prof:
            run()
    return prof.profile


def _emit(text: str, output_file: str | os.PathLike[str] | None) -> None:
    if output_file:
        folder = os.path.dirname(os.path.abspath(output_file))
        os.makedirs(folder, exist_ok=True)  # as DeepSpeed does
        write_atomic(output_file, text)
    else:
        print(text, end="")


def _totals(prof: Profile, mode: str) -> tuple[int, int, int | None]:
    """``(flops, macs, params)``; with ``mode="backward"`` forward and backward together.
    ``params`` is None only for a profile that does not know its counts (one read from a
    trace without the model; never one measured here, with the model at hand)."""
    phases = [stats for name, stats in prof.root.phases() if name == "forward" or mode == "backward"]
    return (
        sum(stats.flops or 0 for stats in phases),
        sum(stats.macs or 0 for stats in phases),
        prof.root.params_total,
    )


def get_model_profile(
    model: nn.Module,
    input_shape: tuple[int, ...] | None = None,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    print_profile: bool = True,
    detailed: bool = True,
    module_depth: int = -1,
    top_modules: int = 1,
    warm_up: int = 1,
    as_string: bool = True,
    output_file: str | os.PathLike[str] | None = None,
    ignore_modules: Sequence[type[nn.Module]] | None = None,
    mode: str = "forward",
    *,
    clock: Clock | None = None,
    **legacy: Any,
) -> tuple[Any, ...]:
    """The model's FLOPs, MACs and parameters as ``(flops, macs, params)``, strings when
    ``as_string`` (``"1.43 G"``, ``"714.19 MMACs"``, ``"61.1 M"``).

    The input is a tensor of ``input_shape`` (batch dimension included), or ``args`` and
    ``kwargs`` (``None`` for either means none, as in DeepSpeed's own examples). ``print_profile`` prints DeepSpeed's report (summary, top
    ``top_modules`` module types per depth up to ``module_depth``, and with ``detailed``
    the annotated model) after ``warm_up`` passes and one timed pass, to stdout or
    ``output_file``; without it the model runs once, counted, not timed. Modules of the
    ``ignore_modules`` classes show only their params. ``mode`` is ``"forward"``,
    ``"generate"`` (``model.generate(...)``) or ``"backward"`` (forward, the sum of the
    output as the loss, and backward, all measured; the totals returned cover both).
    ``clock`` replaces the timer (tests use a fake one).

    The model runs in ``eval()``, as DeepSpeed runs it (train for ``"backward"``), and
    every module's flag is put back afterwards.
    """
    unknown = sorted(set(legacy) - LEGACY_NAMES)
    if unknown:
        raise TypeError(f"get_model_profile() got an unexpected keyword argument {unknown[0]!r}")
    require_module(model)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    old_api = bool(legacy)
    call_args, call_kwargs = tuple(args or ()), dict(kwargs or {})
    aggregated = True
    if old_api:
        module_depth = legacy.get("depth", module_depth)
        top_modules = legacy.get("top_num", top_modules)
        as_string = legacy.get("as_strings", as_string)
        aggregated = bool(legacy.get("print_aggregated_profile", True))
        input_res = legacy.get("input_res", input_shape)
        constructor: Callable[[Any], Any] | None = legacy.get("input_constructor")
        input_shape = None
        if constructor is not None:
            call_args, call_kwargs = _as_inputs(constructor(input_res))
        elif input_res is not None:
            input_shape = (1, *input_res)  # the old API's shape had no batch dimension
    if input_shape is not None:
        call_args, call_kwargs = (_example(model, input_shape),), {}
    if not call_args and not call_kwargs:
        raise ValueError("give input_shape, or args and/or kwargs, for the model's input")
    with modes_restored(model):
        model.train(mode == "backward")
        prof = _measure(
            model, call_args, call_kwargs, mode=mode, warm_up=warm_up, timed=print_profile, clock=clock
        )
    if print_profile:
        text = prof.render(
            "deepspeed",
            profile_step=warm_up,
            module_depth=module_depth,
            top_modules=top_modules,
            detailed=detailed,
            aggregated=aggregated,
            ignore_types=_type_names(ignore_modules),
        )
        _emit(text, output_file)
    flops, macs, params = _totals(prof, mode)
    if old_api:
        return (macs_to_string(macs), _params_text(params)) if as_string else (macs, params)
    if as_string:
        return number_to_string(flops), macs_to_string(macs), _params_text(params)
    return flops, macs, params


def _params_text(params: int | None) -> str:
    """DeepSpeed's string of a count; ``?`` for one not known, never ``0``."""
    return fmt.params(None) if params is None else params_to_string(params)


# -- FlopsProfiler ----------------------------------------------------------------------


class FlopsProfiler:
    """DeepSpeed's ``FlopsProfiler`` for a training loop: ``start_profile()``, run the
    steps to measure, read the totals or print the report, ``end_profile()``.

    The window is a ``layerscope.Profiler`` block: everything between
    ``start_profile()`` and the first read (or ``stop_profile()``) is measured,
    forward, backward and the optimizer step alike; the first read ends the window.
    Totals (``get_total_flops`` and the others) are the forward's, as in DeepSpeed; the
    report adds the measured backward when the window ran one. The window is one step,
    so its latency comes from the step that also recorded the ops (the report says so).
    ``prof.profile`` is the layerscope Profile behind it.

    ``recompute_fwd_factor`` is accepted and not needed: recompute under activation
    checkpointing is measured (the ``recompute`` phase), not estimated.
    """

    def __init__(
        self,
        model: nn.Module,
        ds_engine: Any = None,
        recompute_fwd_factor: float = 0.0,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.model = require_module(model)
        self.ds_engine = ds_engine
        self.recompute_fwd_factor = recompute_fwd_factor
        self.started = False
        self._clock = clock
        self._ignore: tuple[str, ...] = ()
        self._running: Profiler | None = None
        self._profile: Profile | None = None
        self._ended = False  # end_profile() dropped a window's figures

    def start_profile(self, ignore_list: Sequence[type[nn.Module]] | None = None) -> None:
        """Start measuring; modules of the ``ignore_list`` classes will show only params."""
        self.end_profile()
        self._ended = False
        self._ignore = _type_names(ignore_list)
        running = Profiler(self.model, memory=False, clock=self._clock)
        running.__enter__()
        self._running = running
        self.started = True

    def stop_profile(self) -> None:
        """Stop measuring; the figures stay readable until ``end_profile()``."""
        running, self._running = self._running, None
        if running is not None:
            running.__exit__(None, None, None)
            self._profile = running.profile

    def reset_profile(self) -> None:
        """Drop what was measured; a running window starts again from now."""
        was_running = self._running is not None
        self.stop_profile()
        self._profile = None
        if was_running:
            self.start_profile(self._ignore)

    def end_profile(self) -> None:
        """Stop measuring and drop the figures. Afterwards, as in DeepSpeed, the print
        methods print nothing; the getters, which in DeepSpeed fail on the module
        attributes ``end_profile()`` deleted, raise ``ProfilerStateError`` saying so."""
        self._ended = self._ended or self.started
        self.stop_profile()
        self._profile = None
        self.started = False

    @property
    def profile(self) -> Profile:
        """The window's layerscope Profile (reading it ends the window)."""
        self.stop_profile()
        if self._profile is None and self._ended:
            raise ProfilerStateError(
                "the figures were dropped by end_profile(): read them before end_profile(), "
                "or call start_profile() and run the model again"
            )
        if self._profile is None:
            raise ProfilerStateError("nothing measured yet: call start_profile() and run the model first")
        return self._profile

    def get_total_flops(self, as_string: bool = False) -> int | str:
        flops = self.profile.root.forward.flops or 0
        return number_to_string(flops) if as_string else flops

    def get_total_macs(self, as_string: bool = False) -> int | str:
        macs = self.profile.root.forward.macs or 0
        return macs_to_string(macs) if as_string else macs

    def get_total_duration(self, as_string: bool = False) -> float | str:
        """The forward's latency in seconds."""
        seconds = (self.profile.root.forward.busy_time_ns or 0) / 1e9
        return duration_to_string(seconds) if as_string else seconds

    def get_total_params(self, as_string: bool = False) -> int | str | None:
        """The model's parameter count (None, ``?`` as a string, when not known)."""
        params = self.profile.root.params_total
        return _params_text(params) if as_string else params

    def print_model_profile(
        self,
        profile_step: int = 1,
        module_depth: int = -1,
        top_modules: int = 1,
        detailed: bool = True,
        output_file: str | os.PathLike[str] | None = None,
    ) -> None:
        """Print the report (summary, top modules per depth, with ``detailed`` the model)."""
        if not self.started:
            return  # as DeepSpeed: nothing to print outside start_profile/end_profile
        text = self.profile.render(
            "deepspeed",
            profile_step=profile_step,
            module_depth=module_depth,
            top_modules=top_modules,
            detailed=detailed,
            ignore_types=self._ignore,
            engine=_engine_sizes(self.ds_engine),
        )
        _emit(text, output_file)

    def print_model_aggregated_profile(self, module_depth: int = -1, top_modules: int = 1) -> None:
        """Print only the top module types per depth."""
        if not self.started:
            return
        text = self.profile.render(
            "deepspeed", summary=False, module_depth=module_depth, top_modules=top_modules, ignore_types=self._ignore
        )
        _emit(text, None)
