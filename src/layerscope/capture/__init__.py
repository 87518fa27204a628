"""The capture layer: the only code that touches torch while a model runs."""

#: Hide what torch's profiler backend prints on file descriptor 2 when it starts and
#: stops (``USDT: ... profiler_start``). Off in the library, where another thread of the
#: user's could be writing to stderr meanwhile; the CLI turns it on. (Here, not in
#: ``kineto.py``, so that setting it does not import torch.)
QUIET_PROFILER = False
