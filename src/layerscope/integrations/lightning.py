"""``LayerscopeCallback``: profile chosen steps of a ``lightning.pytorch.Trainer.fit``.

::

    import lightning.pytorch as pl
    from layerscope.integrations.lightning import LayerscopeCallback

    trainer = pl.Trainer(max_steps=1000, callbacks=[LayerscopeCallback()])
    trainer.fit(model, loader)
    # <log_dir>/layerscope/layerscope_steps2-4_rank0.json; read it with layerscope.load

Importing this module imports lightning (``pip install layerscope[lightning]``);
``import layerscope`` does not.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from lightning.pytorch.callbacks import Callback

from layerscope.integrations._run import Schedule, TrainingRun, default_schedule

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["LayerscopeCallback"]


class LayerscopeCallback(Callback):
    """Profile steps of ``trainer.fit`` with a scheduled :class:`layerscope.Profiler`.

    The profiler wraps the ``LightningModule`` from ``on_train_start`` to
    ``on_train_end``; each ``on_train_batch_end`` ends a step. A *step* is one training
    batch: with ``accumulate_grad_batches=k`` the optimizer steps every k-th one. Steps
    are numbered from 0 at the start of each ``fit`` (a resumed run starts again at 0).
    Everything between two batch ends is in the later step: fetching the batch,
    ``training_step``, the loss, backward, the optimizer, and whatever Lightning runs
    after a batch (logging, checkpointing, a validation run).

    ``schedule`` (default ``layerscope.schedule(wait=1, warmup=1, active=3, repeat=1)``:
    step 0 idle, step 1 warm-up, steps 2-4 recorded) picks the steps; each finished
    cycle is written as JSON into ``dirpath``, by default ``<trainer.log_dir>/layerscope``
    (``default_root_dir`` without a logger). The files' paths collect in :attr:`paths`.
    Every rank writes its own files (``..._rank{r}.json``) into the same folder.
    ``record_ops=False`` records module forward times only; ``detail="first"`` details
    each cycle's first active step and times the others lightly (``layerscope.Profiler``).

    In automatic optimization Lightning runs ``training_step`` and backward inside the
    closure it passes to ``optimizer.step``; layerscope still attributes the model's
    forward and backward to its modules, but work done in ``training_step`` outside any
    submodule (the loss, Lightning's closure) lands in the ``<optimizer:NAME>`` part.

    If training raises, the profiler is closed in ``on_exception``: the model is left
    without hooks, and a cycle cut short is written as ``..._incomplete.json``.
    """

    def __init__(
        self,
        schedule: Schedule | None = None,
        dirpath: str | os.PathLike[str] | None = None,
        record_ops: bool = True,
        detail: str = "every",
    ) -> None:
        super().__init__()
        if schedule is not None and not callable(schedule):
            raise TypeError(f"schedule must be a layerscope.schedule(...), got {schedule!r}")
        from layerscope.block import check_detail

        check_detail(detail, record_ops)
        self.detail = detail
        self.schedule = schedule if schedule is not None else default_schedule()
        self.dirpath = dirpath
        self.record_ops = record_ops
        #: Paths of the profiles written so far, in the order they were delivered.
        self.paths: list[str] = []
        self._run: TrainingRun | None = None

    def folder(self, trainer: pl.Trainer) -> str:
        """Where the profiles go. ``trainer.log_dir`` is a collective call (rank 0's
        folder is broadcast), so every rank must ask, and all get the same folder."""
        if self.dirpath is not None:
            return os.fspath(self.dirpath)
        return os.path.join(trainer.log_dir or trainer.default_root_dir, "layerscope")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A run left open (a fit that raised without reaching on_exception) is closed first.
        self._close(RuntimeError("a new fit started before the previous one ended"))
        self._run = TrainingRun(
            pl_module,
            schedule=self.schedule,
            record_ops=self.record_ops,
            detail=self.detail,
            folder=self.folder(trainer),
            rank=trainer.global_rank,
            delivered=self.paths,
        )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._run is not None:
            self._run.step()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close(None)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._close(exception)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Fit ended without on_train_end or on_exception (a tuner's early exit): close
        # here, so nothing stays on the model.
        self._close(RuntimeError("fit ended without on_train_end"))

    def _close(self, exception: BaseException | None) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.close(exception)
