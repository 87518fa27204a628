"""A speedscope file (https://www.speedscope.app): the profile as sampled stacks.

The dataclasses below mirror the published file format, of which only the parts used
here are typed: https://www.speedscope.app/file-format-schema.json (source:
https://github.com/jlfwong/speedscope/blob/main/src/lib/file-format-spec.ts).

There is one ``sampled`` profile per metric the profile has (CPU time in nanoseconds,
device time on a GPU,
then FLOPs), or only the one asked for with ``metric``. Its samples are the stacks of
``render/stacks.py`` (the same as the folded format's), weighted exactly: time in whole
nanoseconds, so ``endValue - startValue == sum(weights)`` is the profile's total.
Samples come in the order they ran when the profile has a trace (speedscope's "Time
Order" view then shows backward from the last layer back, the loss between forward
and backward), else in tree order; the weights are the same either way.
Frames are shared between profiles; a module or label frame carries its full path in
``file``, so that two modules both shown as ``0`` can be told apart in speedscope.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from layerscope.base.formats import register_renderer
from layerscope.model.tree import Profile
from layerscope.render.options import METRIC
from layerscope.render.stacks import Frame, Metric, available_metrics, build_stacks, metric_for

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"


@dataclass
class SpeedscopeFrame:
    """``FileFormat.Frame``; ``file`` is left out of the JSON when None."""

    name: str
    file: str | None = None


@dataclass
class SampledProfile:
    """``FileFormat.SampledProfile``: ``samples[i]`` is a stack of frame indices, root
    first, of weight ``weights[i]``. Field names are the schema's."""

    name: str
    unit: str
    startValue: int
    endValue: int
    samples: list[list[int]] = field(default_factory=list)
    weights: list[int] = field(default_factory=list)
    type: str = "sampled"


@dataclass
class Shared:
    frames: list[SpeedscopeFrame] = field(default_factory=list)


@dataclass
class SpeedscopeFile:
    """``FileFormat.File``."""

    shared: Shared
    profiles: list[SampledProfile]
    name: str
    exporter: str
    activeProfileIndex: int = 0

    def to_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = {"$schema": SCHEMA_URL, **asdict(self)}
        # Optional fields are absent, not null, in the schema.
        document["shared"]["frames"] = [
            {k: v for k, v in frame.items() if v is not None} for frame in document["shared"]["frames"]
        ]
        return document


_PROFILE_NAMES = {"time": "CPU time", "device_time": "device time", "flops": "FLOPs"}


def speedscope_file(profile: Profile, metrics: list[Metric]) -> SpeedscopeFile:
    from layerscope.base.version import __version__

    index: dict[Frame, int] = {}
    frames: list[SpeedscopeFrame] = []

    def frame_index(frame: Frame) -> int:
        if frame not in index:
            index[frame] = len(frames)
            frames.append(SpeedscopeFrame(frame.name, frame.path or None))
        return index[frame]

    model = str(profile.meta.model or profile.root.type)
    profiles = []
    for metric in metrics:
        stacks = build_stacks(profile, metric, run_order=True)
        weights = [weight for _, weight in stacks]
        profiles.append(
            SampledProfile(
                name=f"{model} · {_PROFILE_NAMES.get(metric.name, metric.name)}",
                unit=metric.unit,
                startValue=0,
                endValue=sum(weights),
                samples=[[frame_index(frame) for frame in stack] for stack, _ in stacks],
                weights=weights,
            )
        )
    return SpeedscopeFile(Shared(frames), profiles, name=model, exporter=f"layerscope {__version__}")


@register_renderer(
    "speedscope", extensions=(".speedscope.json",),
    description="a speedscope file: sampled stacks of CPU time and FLOPs", options=(METRIC,),
)
def render_speedscope(profile: Profile, *, metric: str | None = None) -> str:
    """The speedscope JSON; every metric the profile has, or only ``metric``."""
    metrics = [metric_for(profile, metric)] if metric is not None else available_metrics(profile)
    if not metrics:
        metrics = [metric_for(profile, None)]  # raises, naming what is missing
    document = speedscope_file(profile, metrics).to_dict()
    return json.dumps(document, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"
