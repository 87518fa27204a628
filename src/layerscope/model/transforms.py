"""Pure functions over a Profile: aggregations the renderers and users share."""

from __future__ import annotations

from collections.abc import Callable, Collection

from layerscope.model.tree import ModuleNode, Profile

#: Metrics ``top_by_depth`` can rank by: name -> value of a node (None: not measured).
METRICS: dict[str, Callable[[ModuleNode], int | None]] = {
    "flops": lambda n: n.forward.flops,
    "macs": lambda n: n.forward.macs,
    "params": lambda n: n.params_total,
    "cpu_time_ns": lambda n: n.forward.cpu_time_ns if n.profiled else None,
    "device_time_ns": lambda n: n.forward.device_time_ns if n.profiled else None,
}


def top_by_depth(
    profile: Profile, metric: str, depth: int, k: int = 3, *, skip_types: Collection[str] = ()
) -> list[tuple[str, int]]:
    """The ``k`` module types with the largest summed ``metric`` among modules at
    ``depth``, largest first (ties by type name): ``[("Conv2d", 1234), ...]``. Only the
    model's modules count (not labels or step parts), minus those of ``skip_types``."""
    try:
        value_of = METRICS[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r}; expected one of: {', '.join(METRICS)}") from None
    sums: dict[str, int] = {}
    for node in profile.modules():
        if node.depth != depth or node.kind != "module" or node.type in skip_types:
            continue
        value = value_of(node)
        if value is None:
            continue
        sums[node.type] = sums.get(node.type, 0) + value
    ranked = sorted(sums.items(), key=lambda item: (-item[1], item[0]))
    return ranked[:k]


def max_depth(profile: Profile) -> int:
    return max(node.depth for node in profile.nodes())
