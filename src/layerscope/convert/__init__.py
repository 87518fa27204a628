"""The conversion from what torch's profiler recorded (host ranges and device work, as
:mod:`layerscope.convert.ranges` records written by the live adapter or the trace
import) to the typed per-step streams of :mod:`layerscope.model.raw` the walker attributes.
Pure: no torch; torch's knowledge of ops is asked through an
:class:`~layerscope.convert.streams.OpCatalog`.
"""
