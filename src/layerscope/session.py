"""The ways in that run the passes themselves: ``profile(model, inputs)`` (measured
passes, the median one shown) and ``count_flops`` (one untimed pass). ``Profiler(model)``, which
wraps the user's own code, is ``block.py``'s. All end in a :class:`~layerscope.model.tree.Profile`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from layerscope.attribute import build_profile
from layerscope.attribute.compiled import build_compiled, with_ops
from layerscope.attribute.profile import op_walk
from layerscope.base.errors import ModelError
from layerscope.capture.assembly import Assembly, CapturePlan
from layerscope.capture.compiled import time_compiled
from layerscope.capture.counting import count_capture, grad_mode, grad_retried, run_step
from layerscope.capture.inputs import split_inputs
from layerscope.capture.modules import (
    autocast_dtype,
    eager_calls,
    eager_module,
    model_device,
    model_dtype,
    peak_flops_per_s,
    refuse_meta_timing,
    require_module,
)
from layerscope.capture.recorder import Clock, exclusive
from layerscope.capture.training import grads_restored, loss_of, state_restored
from layerscope.model.tree import Profile

#: ``progress(stage, done, total)``: stage is "warmup" or "measure".
Progress = Callable[[str, int, int], None]


def profile(
    model: nn.Module,
    inputs: Any = None,
    *,
    warmup: int = 2,
    repeat: int = 5,
    paths: Sequence[str] | None = None,
    record_ops: bool = True,
    memory: bool = True,
    with_stack: bool = False,
    no_grad: bool | None = None,
    backward: bool = False,
    loss_fn: Callable[[Any], Any] | None = None,
    progress: Progress | None = None,
    clock: Clock | None = None,
    peak_tflops: float | None = None,
) -> Profile:
    """Profile ``model``'s forward pass (and with ``backward=True`` its backward) on
    ``inputs``, layer by layer.

    ``inputs`` is a Tensor, a tuple/list of positional arguments, or a dict of keyword
    arguments. ``warmup`` unmeasured passes run first, then ``repeat`` measured passes.
    With ``record_ops`` (the default) each measured pass is recorded by torch's profiler
    with shapes (and memory): its module times, op rows, FLOPs, memory and trace come from
    that one run, and the profile shows the median pass whole (``figures.shown_pass``; every
    pass's time is in ``figures.pass_cpu_time_ns``), so every view agrees with every other.
    Without it the passes are timed by module hooks alone, the leanest, and each module's
    time is its median over them. ``paths`` limits profiling to those ``named_modules()``
    subtrees. ``no_grad`` runs the passes under ``torch.no_grad()`` as inference does
    (the default without ``backward``). ``memory`` tracks memory with the ops
    (allocations, peaks and activations per module, the step's peak and its culprit;
    see ``Profile.memory``). ``with_stack`` keeps the user's Python frames that called
    each op (``OpStats.stack``), so op tables can be grouped by call site.

    ``backward=True`` makes each pass a training step without the optimizer: forward,
    the loss (``loss_fn(output)``, or the sum of the first floating-point tensor in the
    output), then backward. Each module gets a ``backward`` phase, and the work outside
    the model appears as the step's parts (``<loss>``, ``<other>``). Parameters'
    ``.grad`` are restored afterwards.
    ``clock`` replaces ``time.perf_counter_ns`` (tests use a fake one). ``peak_tflops``
    is the hardware's peak for MFU (% of peak per module); on common GPUs it is known.

    torch's profiler runs one session per process: calls in several threads take
    turns, and one made while another thread's ``Profiler`` block holds it records
    under a dispatch mode (``meta.times_from``), as inside a user's own torch.profiler.

    A model compiled whole (``torch.compile(model)``) is profiled from its kernels:
    layerscope compiles its module once more with Inductor's provenance tracking, and
    each module's time comes from the kernel calls holding its FX nodes; FLOPs, memory
    and op rows from one eager pass (``record_ops`` has no effect; the op rows have no
    times). With ``backward=True`` the backward graphs' kernels are each module's
    backward time (a kernel with no module's node stays with the model's backward time:
    ``Profile.compiled.unattributed_time_ns()``). ``Profile.compiled`` holds the
    kernels, graph breaks and compile time.

    The model is left as it was: hooks are removed and modes exited even if it raises,
    parameter and buffer values (a train-mode BatchNorm's statistics) and torch's random
    state are put back, and its exception reaches the caller unchanged.
    """
    return grad_retried(
        lambda no_grad: _profile(
            model, inputs, warmup=warmup, repeat=repeat, paths=paths, record_ops=record_ops, memory=memory,
            with_stack=with_stack, no_grad=no_grad, backward=backward, loss_fn=loss_fn, progress=progress,
            clock=clock, peak_tflops=peak_tflops,
        ),
        no_grad, backward,
    )


def _profile(
    model: nn.Module,
    inputs: Any = None,
    *,
    warmup: int = 2,
    repeat: int = 5,
    paths: Sequence[str] | None = None,
    record_ops: bool = True,
    memory: bool = True,
    with_stack: bool = False,
    no_grad: bool | None = None,
    backward: bool = False,
    loss_fn: Callable[[Any], Any] | None = None,
    progress: Progress | None = None,
    clock: Clock | None = None,
    peak_tflops: float | None = None,
) -> Profile:
    """:func:`profile`, with ``no_grad`` as given."""
    require_module(model)
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be an int >= 1, got {repeat!r}")
    eager = eager_module(model)
    if eager is not None:
        if paths is not None or clock is not None:
            given = [n for n, v in (("paths", paths), ("clock", clock)) if v is not None]
            raise ModelError(
                f"{', '.join(given)}: not for a torch.compile'd model, which is profiled whole from its kernels; "
                "profile model._orig_mod for the eager model"
            )
        return _profile_compiled(
            eager, inputs, warmup=warmup, repeat=repeat, memory=memory, no_grad=no_grad,
            progress=progress, peak_tflops=peak_tflops, backward=backward, loss_fn=loss_fn,
        )
    no_grad, grad = grad_mode(no_grad, backward)
    args, kwargs = split_inputs(inputs)
    # With op rows, the passes shown are detailed ones: torch's profiler recording shapes
    # and memory (the dispatch mode only where it cannot run), each pass giving its module
    # times, op rows, FLOPs, memory and trace at once, so every view is one run's. Without,
    # forward alone is timed by module hooks on a Python clock (the leanest); a step with
    # backward through torch's profiler, which sees autograd's engine without Python per
    # op. The passes hold torch's profiler (another thread's profile() waits; a Profiler
    # block's, maybe a training loop long, makes this one record without it).
    assembly = Assembly(CapturePlan(
        model, inputs=(args, kwargs), paths=paths, steps=backward, detail=record_ops, memory=memory,
        with_stack=with_stack, clock=clock, torch_profiler=record_ops or backward,
    ))
    # The matrix units run at autocast's dtype when it is on (the datasheet's peak for it).
    peak = peak_flops_per_s(peak_tflops, assembly.device, autocast_dtype(assembly.device) or model_dtype(model))
    report = progress or (lambda stage, done, total: None)

    def step() -> None:
        run_step(model, args, kwargs, assembly, backward=backward, loss_fn=loss_fn)

    with assembly, grad, grads_restored(model, clear=backward) as clear_grads, state_restored(model):
        for n in range(warmup):
            clear_grads()
            if n == warmup - 1:
                with assembly.warm_pass():
                    step()
            else:
                step()
            report("warmup", n + 1, warmup)
        dropped = assembly.dropped_passes
        try:
            for n in range(dropped + repeat):
                clear_grads()
                assembly.begin_step()
                try:
                    step()
                finally:
                    assembly.end_step()
                if n >= dropped:
                    report("measure", n + 1 - dropped, repeat)
        finally:
            timing_passes = assembly.measured()

    raw = assembly.capture(
        timing_passes=timing_passes, detailed_passes=record_ops, mode="profile", warmup=warmup, repeat=repeat,
        no_grad=no_grad, backward=backward, peak_flops_per_s=peak,
    )
    return build_profile(raw)


def _profile_compiled(
    eager: nn.Module, inputs: Any, *, warmup: int, repeat: int, memory: bool,
    no_grad: bool | None, progress: Progress | None, peak_tflops: float | None,
    backward: bool = False, loss_fn: Callable[[Any], Any] | None = None,
) -> Profile:
    """A compiled model's profile: the tree, FLOPs, MACs, shapes and memory of one eager
    pass of its module (the same parameters; with ``backward``, a training step's), and
    each module's time from the kernels of layerscope's own compile of it
    (``capture/compiled.py``, ``attribute/compiled.py``)."""
    refuse_meta_timing(eager, inputs)
    report = progress or (lambda stage, done, total: None)
    # The eager pass records ops whatever record_ops says: FLOPs come from them. Its op
    # times and trace are the eager run's, not the compiled one's: the profile has neither.
    raw = count_capture(eager, inputs, None, no_grad, backward, loss_fn, memory)
    ops = op_walk(raw)
    assert ops is not None  # a count always has its op pass
    no_grad, grad = grad_mode(no_grad, backward)
    args, kwargs = split_inputs(inputs)

    def loss(output: Any) -> torch.Tensor:
        return loss_of(output, loss_fn)

    with exclusive(eager), grad, grads_restored(eager, clear=backward) as clear_grads, state_restored(eager), \
            eager_calls(eager):  # compiled in place: layerscope's compile runs its eager forward
        run = time_compiled(
            eager, args, kwargs, warmup=warmup, repeat=repeat, working=with_ops(raw, ops), progress=report,
            loss=loss if backward else None, clear_grads=clear_grads,
        )
    device = model_device(eager)
    meta = dataclasses.replace(
        raw.meta, timed=None, mode="profile", warmup=warmup, repeat=repeat,
        peak_flops_per_s=peak_flops_per_s(peak_tflops, device, autocast_dtype(device) or model_dtype(eager)),
    )
    return build_compiled(dataclasses.replace(raw, meta=meta), ops, run)


def count_flops(
    model: nn.Module,
    inputs: Any = None,
    *,
    paths: Sequence[str] | None = None,
    no_grad: bool | None = None,
    backward: bool = False,
    loss_fn: Callable[[Any], Any] | None = None,
    memory: bool = True,
) -> Profile:
    """FLOPs, MACs, bytes, params and shapes from one pass, without timing; with
    ``backward=True`` the pass is forward, loss and backward, as in ``profile``.
    ``memory`` also tracks memory in that pass, as ``profile`` does.

    ``no_grad`` is as in :func:`profile`.

    Works on the meta device: build the model under ``with torch.device("meta"):`` and
    pass meta inputs to count a model too large to run (nothing is allocated).
    Parameter and buffer values and torch's random state are left as they were.
    """
    return grad_retried(
        lambda no_grad: build_profile(count_capture(model, inputs, paths, no_grad, backward, loss_fn, memory)),
        no_grad, backward,
    )


#: ``profile_training``'s optimizers by name, each built over the model's parameters.
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD,
}
#: ``profile_training``'s named losses of the model's output (its first floating-point
#: tensor): ``auto`` is the model's own loss where it computes one from labels.
LOSSES = ("auto", "sum", "mean", "cross_entropy")


def profile_training(
    model: nn.Module,
    inputs: Any = None,
    *,
    optimizer: str = "adamw",
    lr: float = 1e-4,
    loss: str = "auto",
    warmup: int = 2,
    steps: int = 3,
    record_ops: bool = True,
    memory: bool = True,
    peak_tflops: float | None = None,
    progress: Progress | None = None,
) -> Profile:
    """Whole training steps of ``model`` on ``inputs``, as a training loop runs them: the
    model in ``train()`` mode (dropout on, BatchNorm updating its statistics), each step
    ``zero_grad``, forward, loss, backward and the optimizer's step (``optimizer``:
    ``adamw``, ``adam`` or ``sgd``, at learning rate ``lr``). ``warmup`` steps run first,
    unrecorded (the optimizer makes its state in the first), then ``steps`` steps are
    recorded in a :class:`~layerscope.Profiler` block, summed as a block sums them, the
    optimizer's step a part of its own (``<optimizer:AdamW>``).

    ``loss``: ``auto`` is the model's own loss where it computes one from labels (a
    transformers model with a language-model or classification head, given labels made
    from its inputs: :func:`~layerscope.zoo.specs.training_labels`), else the sum of the
    first floating-point tensor of the output; ``sum`` and ``mean`` reduce that tensor;
    ``cross_entropy`` takes its last dimension as classes, against targets drawn once
    (seeded). The model is trained: its parameters and optimizer state
    change, as in any training step (the command line builds its own model for this).
    ValueError names the choices for an unknown ``optimizer`` or ``loss``."""
    from layerscope.block import Profiler
    from layerscope.capture.training import first_float_tensor
    from layerscope.zoo.specs import training_labels

    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of: {', '.join(OPTIMIZERS)}")
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; expected one of: {', '.join(LOSSES)}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    require_module(model)
    args, kwargs = split_inputs(inputs)
    labels = training_labels(model, kwargs) if loss == "auto" else None
    if labels:
        kwargs = {**kwargs, **labels}
    model.train()
    opt = OPTIMIZERS[optimizer](model.parameters(), lr=lr)
    targets: list[torch.Tensor] = []

    def loss_of_output(output: Any) -> torch.Tensor:
        if labels:
            own = getattr(output, "loss", None)
            if isinstance(own, torch.Tensor):
                return own
        if loss not in ("mean", "cross_entropy"):
            return loss_of(output, None)  # the sum of the first float tensor, as backward=True takes it
        tensor = first_float_tensor(output)
        if tensor is None:
            raise ValueError("the model's output holds no floating-point tensor to take a loss of")
        if loss == "mean":
            return tensor.mean()
        scores = tensor.reshape(-1, tensor.shape[-1])  # cross_entropy: the last dimension's classes
        if not targets:
            generator = torch.Generator().manual_seed(0)
            drawn = torch.randint(0, scores.shape[-1], (scores.shape[0],), generator=generator)
            targets.append(drawn.to(scores.device))
        return torch.nn.functional.cross_entropy(scores, targets[0])

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_of_output(model(*args, **kwargs)).backward()
        opt.step()

    report = progress or (lambda stage, done, total: None)
    for n in range(warmup):
        step()
        report("warmup", n + 1, warmup)
    with Profiler(model, record_ops=record_ops, memory=memory, peak_tflops=peak_tflops) as prof:
        for n in range(steps):
            step()
            prof.step()
            report("measure", n + 1, steps)
    return prof.profile
