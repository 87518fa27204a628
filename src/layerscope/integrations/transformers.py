"""``LayerscopeTrainerCallback``: profile chosen steps of a Hugging Face ``Trainer``.

::

    from transformers import Trainer
    from layerscope.integrations.transformers import LayerscopeTrainerCallback

    with LayerscopeTrainerCallback() as callback:
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
        trainer.train()
    # <args.output_dir>/layerscope/layerscope_steps2-4_rank0.json

Importing this module imports transformers (``pip install layerscope[transformers]``);
``import layerscope`` does not.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from layerscope.base.errors import LayerscopeWarning
from layerscope.capture.modules import compiled_wrapper_of
from layerscope.integrations._run import Schedule, TrainingRun, default_schedule

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

__all__ = ["LayerscopeTrainerCallback"]


class LayerscopeTrainerCallback(TrainerCallback):
    """Profile steps of ``Trainer.train`` with a scheduled :class:`layerscope.Profiler`.

    The profiler wraps the model from ``on_train_begin`` to ``on_train_end``; each
    ``on_step_end`` ends a step. A *step* is one optimizer step: with
    ``gradient_accumulation_steps=k`` it holds k forward/backward passes, then the
    optimizer step, the learning-rate scheduler and ``model.zero_grad()``. Steps are
    numbered from 0 at the start of each ``train()`` call (a resumed run starts again at
    0, whatever ``state.global_step`` is). Everything between two step ends is in the
    later step, including the batches' loading and any logging, saving or evaluation
    the Trainer runs after a step.

    ``schedule`` (default ``layerscope.schedule(wait=1, warmup=1, active=3, repeat=1)``)
    picks the steps; each finished cycle is written as JSON into ``output_dir``, by
    default ``<args.output_dir>/layerscope``. The files' paths collect in :attr:`paths`.
    Every process writes its own files (``..._rank{r}.json``, ``r = args.process_index``)
    into the same folder. ``record_ops=False`` records module forward times only;
    ``detail="first"`` details each cycle's first active step and times the others lightly.

    The Trainer has no callback for a run that raises. So that a failed ``train()``
    does not leave the profiler's hooks on the model, use the callback as a context
    manager around ``train()`` (or call :meth:`close` in a ``finally``): a cycle cut
    short is then written as ``..._incomplete.json``.

    With ``torch_compile=True`` the steps are those of the model the Trainer compiled,
    recorded from its kernels as a ``Profiler`` block records ``torch.compile(model)``
    (``record_ops=False`` is refused there).
    """

    def __init__(
        self,
        schedule: Schedule | None = None,
        output_dir: str | os.PathLike[str] | None = None,
        record_ops: bool = True,
        detail: str = "every",
    ) -> None:
        if schedule is not None and not callable(schedule):
            raise TypeError(f"schedule must be a layerscope.schedule(...), got {schedule!r}")
        from layerscope.block import check_detail

        check_detail(detail, record_ops)
        self.detail = detail
        self.schedule = schedule if schedule is not None else default_schedule()
        self.output_dir = output_dir
        self.record_ops = record_ops
        #: Paths of the profiles written so far, in the order they were delivered.
        self.paths: list[str] = []
        self._run: TrainingRun | None = None

    def folder(self, args: TrainingArguments) -> str:
        """Where the profiles go."""
        if self.output_dir is not None:
            return os.fspath(self.output_dir)
        return os.path.join(args.output_dir, "layerscope")

    # -- Trainer events -------------------------------------------------------------------
    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        **kwargs: Any,
    ) -> None:
        if model is None:
            raise ValueError("LayerscopeTrainerCallback needs the model: the Trainer passes it to on_train_begin")
        # A run left open by a train() that raised (without close()) is closed first.
        self.close(RuntimeError("a new train() started before the previous one ended"))
        if getattr(args, "torch_compile", False):
            # The Trainer calls torch.compile(model), and hands callbacks the eager model:
            # hooks on that one would be traced into the compiled graphs (and break them).
            # Its block is the compiled wrapper's, recorded from the kernels.
            wrapper = compiled_wrapper_of(model)
            if wrapper is None:
                warnings.warn(
                    "LayerscopeTrainerCallback: torch_compile=True, and the Trainer's torch.compile(model) wrapper was "
                    "not found (a regional compile, or another wrapper): nothing is profiled in this train(); profile "
                    "without torch_compile, or wrap the compiled model in layerscope.Profiler yourself",
                    LayerscopeWarning, stacklevel=2,
                )
                return
            model = wrapper
        self._run = TrainingRun(
            model,
            schedule=self.schedule,
            record_ops=self.record_ops,
            detail=self.detail,
            folder=self.folder(args),
            rank=getattr(args, "process_index", None),
            delivered=self.paths,
        )

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._run is not None:
            self._run.step()

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.close()

    # -- closing on failure ---------------------------------------------------------------
    def close(self, exception: BaseException | None = None) -> None:
        """Exit the profiler if it is still running (``exception``: what stopped the run)."""
        run, self._run = self._run, None
        if run is not None:
            run.close(exception)

    def __enter__(self) -> LayerscopeTrainerCallback:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> bool:
        if exc is None and exc_type is not None:
            exc = exc_type()
        self.close(exc)
        return False
