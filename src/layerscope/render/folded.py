"""Folded stacks, the input of flamegraph.pl and its ports (inferno, speedscope's import).

One line per distinct stack, ``frame;frame;...;leaf VALUE``, for example
``backward;GPT;blocks;0;attn;qkv;aten::mm 812``. Frames and their order are those of
``render/stacks.py``: the model's class name at the root, each node's path relative to
its parent's, ops as leaves, a phase frame first when the model has more than its
forward phase, step parts (``<optimizer:Adam>``) as roots of their own.

VALUE is a whole number: microseconds of self time (``metric="time"``, the default for a
timed profile), of device time (``metric="device_time"``, on a GPU) or FLOPs
(``metric="flops"``). Times are rounded cumulatively, in line
order (each value is the difference of consecutive rounded running sums), so the values
add up exactly to the profile's total rounded to a microsecond: ``step_time_ns`` for a
step, the root's forward time otherwise. Where a module's ops add up to more than its
self time (files an older layerscope wrote), its ops are scaled down to fit; see
``render/stacks.py``. Lines that round to zero are left out.

Every line matches ``^[^\\n]+ \\d+$``: frame names have no ``;``, line breaks or
trailing spaces (flamegraph.pl takes the value after the last space).
"""

from __future__ import annotations

from layerscope.base.formats import register_renderer
from layerscope.model.tree import Profile
from layerscope.render.options import METRIC
from layerscope.render.stacks import build_stacks, metric_for, rescale

#: Folded time values are whole microseconds: flame graph tools read integer counts.
NS_PER_VALUE = {"time": 1000, "device_time": 1000, "flops": 1}


@register_renderer(
    "folded", extensions=(".folded",),
    description="folded stacks for flamegraph.pl, inferno and speedscope (µs or FLOPs)", options=(METRIC,),
)
def render_folded(profile: Profile, *, metric: str | None = None) -> str:
    """Folded stacks; ``metric`` is ``"time"`` (µs, default), ``"device_time"`` or ``"flops"``."""
    chosen = metric_for(profile, metric)
    stacks = build_stacks(profile, chosen)
    values = rescale([weight for _, weight in stacks], 1, NS_PER_VALUE[chosen.name])
    lines = [
        ";".join(frame.name for frame in stack) + f" {value}"
        for (stack, _), value in zip(stacks, values)
        if value
    ]
    return "".join(line + "\n" for line in lines)
