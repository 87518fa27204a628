"""Callbacks that profile chosen steps of a framework's training loop.

- :mod:`layerscope.integrations.lightning`: ``LayerscopeCallback`` for
  ``lightning.pytorch.Trainer`` (``pip install layerscope[lightning]``).
- :mod:`layerscope.integrations.transformers`: ``LayerscopeTrainerCallback`` for the
  Hugging Face ``transformers.Trainer`` (``pip install layerscope[transformers]``).

Each wraps the training run in a scheduled :class:`layerscope.Profiler` and writes one
``layerscope/1`` JSON file per recorded cycle (``layerscope_steps{a}-{b}_rank{r}.json``),
so the ranks of a distributed job share one folder without overwriting each other.

Nothing is imported here: ``import layerscope`` never loads lightning or transformers;
importing one of the submodules does.
"""
