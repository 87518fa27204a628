"""The capture layer: the only code that touches torch while a model runs."""

#: Keep torch's profiler backend's own log lines (``USDT: ... profiler_start``, written
#: on file descriptor 2 as it starts and stops) off stderr. While torch's profiler starts
#: or stops, descriptor 2 points at a temporary file; whatever else was written there
#: meanwhile (another thread of the user's) is written back, in order, when the call
#: returns. False leaves descriptor 2 alone. (Here, not in ``kineto.py``, so that setting
#: it does not import torch.)
QUIET_PROFILER = True
