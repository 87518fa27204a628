"""The annotated model print: the ``nn.Module`` repr with each module's figures.

Each module line carries params, MACs, FLOPs, time and FLOP/s, with percentages of the
whole model, followed by the module's own ``extra_repr``. A summary and the top module
types per depth come first.
"""

from __future__ import annotations

from collections.abc import Callable

from layerscope.base import fmt
from layerscope.base.formats import Option, register_renderer
from layerscope.model.transforms import max_depth, top_by_depth
from layerscope.model.tree import ModuleNode, Profile
from layerscope.render.options import DEPTH, count


def _params(node: ModuleNode, root: ModuleNode) -> str:
    if node.params_total is None:
        return f"{fmt.params(None)} Params"  # unknown (no model when it was recorded): no share either
    return f"{fmt.param_count(node.params_total)} = {fmt.percent(node.params_total, root.params_total) or '0.0%'} Params"


def _figures(node: ModuleNode, root: ModuleNode, timed: bool, peak: float | None) -> str:
    parts = [_params(node, root)]
    fwd = node.forward
    if fwd.macs is not None:
        parts.append(f"{fmt.count(fwd.macs)} = {fmt.percent(fwd.macs, root.forward.macs) or '0.0%'} MACs")
        parts.append(f"{fmt.count(fwd.flops)} FLOPs")
    if node.profiled and timed:
        busy, root_busy = node.forward.busy_time_ns, root.forward.busy_time_ns
        parts.append(f"{fmt.time_ns(busy)} = {fmt.percent(busy, root_busy) or '0.0%'} time")
        rate = fmt.rate(fwd.flops, busy)
        if rate:
            parts.append(rate)
        mfu = fmt.mfu(fwd.flops, busy, peak)
        if mfu:
            parts.append(f"{mfu} of peak")
    if fwd.flops and fwd.bytes:
        parts.append(fmt.intensity(fwd.flops, fwd.bytes))
    return ", ".join(parts)


def _lines(node: ModuleNode, root: ModuleNode, depth: int | None, timed: bool, peak: float | None) -> list[str]:
    indent = "  " * node.depth
    label = node.type if node.path == "" else f"({node.name}): {node.type}"
    body = _figures(node, root, timed, peak) + (f", {node.extra_repr}" if node.extra_repr else "")
    children = node.children if depth is None or node.depth < depth else []
    if not children:
        return [f"{indent}{label}({body})"]
    lines = [f"{indent}{label}(", f"{indent}  {body}"]
    for child in children:
        lines.extend(_lines(child, root, depth, timed, peak))
    lines.append(f"{indent})")
    return lines


def _summary(profile: Profile, top_k: int) -> list[str]:
    root = profile.root
    fwd = root.forward
    lines = [
        f"Model: {profile.meta.model or root.type}   device: {profile.meta.device or 'cpu'}",
        f"Params: {fmt.params(root.params_total, profile.param_bytes)}",
    ]
    if fwd.macs is not None:
        lines.append(f"Forward MACs: {fmt.count(fwd.macs)}   FLOPs: {fmt.count(fwd.flops)}")
    timed = profile.timed
    if timed:
        lines.append(f"Forward time: {fmt.time_ns(root.forward.busy_time_ns)}   FLOP/s: {fmt.rate(fwd.flops, root.forward.busy_time_ns) or '-'}")
    lines.append("")
    metrics: list[tuple[str, Callable[[int | None], str]]] = [("params", fmt.param_count)]
    if fwd.macs is not None:
        metrics.insert(0, ("macs", fmt.count))
    if timed:
        metrics.append(("cpu_time_ns", fmt.time_ns))
    for depth in range(1, max_depth(profile) + 1):
        for metric, show in metrics:
            top = top_by_depth(profile, metric, depth, top_k)
            if not top:
                continue
            label = {"macs": "MACs", "params": "params", "cpu_time_ns": "CPU time"}[metric]
            listed = ", ".join(f"{kind}: {show(value)}" for kind, value in top)
            lines.append(f"Top {len(top)} module types by {label} at depth {depth}: {listed}")
    return lines


TOP_K = Option("top_k", "list the N largest module types per depth and metric (default 3)", parse=count, metavar="N")


@register_renderer(
    "model", description="the nn.Module repr annotated with params, MACs, time and FLOP/s", options=(DEPTH, TOP_K)
)
def render_model(profile: Profile, *, depth: int | None = None, top_k: int = 3) -> str:
    out = _summary(profile, top_k)
    out.append("")
    timed = profile.timed
    out.extend(_lines(profile.root, profile.root, depth, timed, profile.meta.peak_flops_per_s))
    unsupported = profile.unsupported_ops()
    if unsupported:
        out.append("")
        out.append("Ops not counted in FLOPs (no formula, or their shapes not recorded): " + ", ".join(f"{n} x{c}" for n, c in unsupported.items()))
    return "\n".join(out) + "\n"
