"""Derive the module tree from a raw capture. Pure: no torch, no clock.

The files read as the pipeline:

- ``walk.py``: one pass's event stream (``layerscope.model.raw``) in, self times per node and
  phase, calls, op tables and spans out (:class:`PassResult`); it drives ``chain.py``
  (the modules whose backward is running) and ``memory.py`` (live bytes, peaks,
  categories, the memory timeline);
- ``combine.py``: passes into one, as per-node medians (``profile()``) or running sums
  over training steps (:class:`Accumulator`, a ``Profiler``);
- ``profile.py``: the :class:`~layerscope.model.tree.Profile`, totals derived bottom-up over
  the static tree, so the invariants hold exactly (see docs/design.md).
"""

from layerscope.attribute.combine import Accumulator
from layerscope.attribute.profile import assemble, build_from_steps, build_profile
from layerscope.attribute.walk import PassResult, PassWalker, parent_indices, walk_pass

__all__ = [
    "Accumulator",
    "PassResult",
    "PassWalker",
    "assemble",
    "build_from_steps",
    "build_profile",
    "parent_indices",
    "walk_pass",
]
