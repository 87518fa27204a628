"""Drop-ins for the tools layerscope grew out of: change the import, keep the code.

- :mod:`layerscope.compat.deepspeed`: DeepSpeed's flops profiler (``get_model_profile``,
  ``FlopsProfiler``) and its printout.
- :mod:`layerscope.compat.torchprof`: torchprof's ``Profile`` context manager, its tree
  table and ``raw()``.
- :mod:`layerscope.compat.torch_profiler`: the ``torch.profiler`` recipe's calls
  (``key_averages().table()``, ``export_chrome_trace``, ``export_stacks``, ``step_num``,
  ``on_trace_ready``): its ``Profiler`` is ``layerscope.Profiler``, the block with
  torch.profiler's names.

Each prints what its users know, from layerscope's own measurements, and hands over the
layerscope :class:`~layerscope.model.tree.Profile` behind it for everything else (backward,
JSON, diff). Like the rest of layerscope, none of them adds anything to the model,
replaces ``forward`` or patches ``torch.nn.functional``. See docs/migrating.md.
"""
