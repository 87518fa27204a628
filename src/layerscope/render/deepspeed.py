"""The DeepSpeed flops profiler's printout, drawn from a layerscope profile.

Three sections, in DeepSpeed's order and with its field names and units (``fwd MACs per
GPU``, ``714.19 MMACs``, ``fwd latency``, ``GFLOPS``), so habits and greps carry over:

- the summary: params, MACs, flops, latency and FLOPS of the forward; where the profile
  has a backward (``get_model_profile(mode="backward")``, or a training step run inside a
  ``FlopsProfiler`` window) the backward's *measured* MACs, flops and latency, where
  DeepSpeed assumes the backward costs twice the forward; the optimizer step and the
  whole iteration when the profile has them;
- the aggregated profile: per depth, the module types with the most params, MACs and
  forward latency;
- the detailed profile: the ``nn.Module`` repr with each module's figures.

Every figure is the tree's own: a module's figures cover everything it ran (its own
code and its submodules'), FLOPs count every aten op with a formula (elementwise,
attention, norms), and a tied weight is counted once. The ``model`` renderer is
layerscope's own take on the same view.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from layerscope.base import fmt
from layerscope.base.formats import Option, register_renderer
from layerscope.model.transforms import top_by_depth
from layerscope.model.tree import ModuleNode, PhaseStats, Profile
from layerscope.render.options import count
from layerscope.render.table import SPACES, Column, measure

_RULE = "-" * 78
#: The summary's lines: the label padded to 70 characters, two spaces, the value as it is.
_SUMMARY = measure([Column("", "<", width=70), Column("", "<", width=0)], [], SPACES)


def _seconds(ns: int | None) -> float:
    return (ns or 0) / 1e9


def _latency_ns(stats: PhaseStats | None) -> int:
    return (stats.busy_time_ns or 0) if stats is not None else 0


def _rate(flops: int | None, ns: int) -> str:
    # FLOPs not counted (a trace read without its shapes): the rate is unknown too.
    if flops is None:
        return "? FLOPS"
    return fmt.ds_rate(flops / _seconds(ns)) if ns else fmt.ds_rate(0)


def _flops(value: int | None) -> str:
    # Unknown, never zero, as MACs.
    return "?" if value is None else fmt.si_number(value)


def _sum(values: list[int | None]) -> int | None:
    """The sum, unknown where any part is."""
    return None if any(value is None for value in values) else sum(value or 0 for value in values)


def _macs(value: int | None) -> str:
    # An op pass that recorded nothing has no count: unknown, never zero.
    return "? MACs" if value is None else fmt.ds_macs(value)


def _params(value: int | None) -> str:
    # A profile from a trace recorded without the model has no counts: unknown, never zero.
    return fmt.params(None) if value is None else fmt.ds_params(value)


def _summary(profile: Profile, profile_step: int, engine: Mapping[str, Any]) -> list[str]:
    root = profile.root
    mp_size = int(engine.get("mp_world_size", 1) or 1)
    fwd = root.forward
    lines = [
        "-------------------------- DeepSpeed Flops Profiler --------------------------",
        f"Profile Summary at step {profile_step}:",
        "Notations:",
        "data parallel size (dp_size), model parallel size (mp_size),",
        "number of parameters (params), multiply-accumulate operations (MACs),",
        "floating-point operations (flops: 2 per MAC plus every other arithmetic op),",
        "floating-point operations per second (FLOPS), fwd / bwd latency (forward / backward time),",
        "step latency (the optimizer step), iter latency (the whole step)",
        "",
    ]
    rows: list[tuple[str, Any]] = []
    for key, label in (
        ("world_size", "world size: "),
        ("dp_world_size", "data parallel size: "),
        ("mp_world_size", "model parallel size: "),
        ("batch_size", "batch size per GPU: "),
    ):
        if engine.get(key) is not None:
            rows.append((label, engine[key]))
    rows += [
        ("params per GPU: ", _params(root.params_total)),
        ("params of model = params per GPU * mp_size: ", _params(None if root.params_total is None else root.params_total * mp_size)),
        ("fwd MACs per GPU: ", _macs(fwd.macs)),
        ("fwd flops per GPU: ", _flops(fwd.flops)),
        ("fwd flops of model = fwd flops per GPU * mp_size: ", _flops(None if fwd.flops is None else fwd.flops * mp_size)),
    ]
    timed = profile.timed
    fwd_ns = _latency_ns(fwd)
    if timed:
        rows += [
            ("fwd latency: ", fmt.ds_seconds(_seconds(fwd_ns))),
            ("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ", _rate(fwd.flops, fwd_ns)),
        ]
    bwd = root.backward
    if bwd is not None:
        # Measured, op by op: DeepSpeed would print 2 * fwd flops here.
        rows += [
            ("bwd MACs per GPU (measured): ", _macs(bwd.macs)),
            ("bwd flops per GPU (measured): ", _flops(bwd.flops)),
        ]
        if timed:
            bwd_ns = _latency_ns(bwd)
            both = _sum([fwd.flops, bwd.flops])
            rows += [
                ("bwd latency: ", fmt.ds_seconds(_seconds(bwd_ns))),
                ("bwd FLOPS per GPU = bwd flops per GPU / bwd latency: ", _rate(bwd.flops, bwd_ns)),
                ("fwd+bwd FLOPS per GPU = (fwd+bwd flops per GPU) / (fwd+bwd latency): ", _rate(both, fwd_ns + bwd_ns)),
            ]
    step_ns = profile.step_time_ns
    if timed and step_ns:
        optimizer_ns = sum(_latency_ns(part.forward) for part in profile.parts if part.kind == "optimizer")
        if optimizer_ns:
            rows.append(("step latency: ", fmt.ds_seconds(_seconds(optimizer_ns))))
        total_flops = _sum([stats.flops for _, stats in root.phases()])
        rows += [
            ("iter latency: ", fmt.ds_seconds(_seconds(step_ns))),
            ("FLOPS per GPU = (fwd+bwd flops per GPU) / iter latency: ", _rate(total_flops, step_ns)),
        ]
        samples = engine.get("batch_size")
        if samples is not None:
            samples *= int(engine.get("world_size", 1) or 1)
            rows.append(("samples/second: ", round(samples / _seconds(step_ns), 2)))
    lines += [line for label, value in rows for line in _SUMMARY.lines([label, str(value)])]
    if profile.meta.times_from in ("detail step", "dispatch mode"):
        lines.append(
            "(latency from a step recorded under a dispatch mode, which inflates small modules: "
            "torch's profiler was already running)"
        )
    return lines


def _depths(profile: Profile, module_depth: int) -> range:
    deepest = max(node.depth for node in profile.modules() if node.kind == "module")
    return range(deepest + 1 if module_depth < 0 else min(module_depth, deepest) + 1)


def _aggregated(profile: Profile, module_depth: int, top_modules: int, ignore: Collection[str]) -> list[str]:
    lines = [f"Top {top_modules} modules in terms of params, MACs or fwd latency at different model depths:"]
    metrics: list[tuple[str, str, Callable[[int], str]]] = [
        ("params", "params     ", fmt.ds_params), ("macs", "MACs       ", fmt.ds_macs),
    ]
    if profile.timed:
        latency = "device_time_ns" if profile.root.forward.device_time_ns is not None else "cpu_time_ns"
        metrics.append((latency, "fwd latency", lambda ns: fmt.ds_seconds(_seconds(ns))))
    for depth in _depths(profile, module_depth):
        lines.append(f"depth {depth}:")
        for metric, label, show in metrics:
            top = top_by_depth(profile, metric, depth, top_modules, skip_types=ignore)
            listed = ", ".join(f"{kind!r}: {show(value)!r}" for kind, value in top)
            lines.append(f"    {label} - {{{listed}}}")
    return lines


def _figures(node: ModuleNode, root: ModuleNode, timed: bool, ignore: Collection[str]) -> str:
    if node.params_total is None:
        items = [f"{_params(None)} Params"]  # no share of an unknown whole either
    else:
        items = [f"{fmt.ds_params(node.params_total)} = {fmt.ds_share(node.params_total, root.params_total)} Params"]
    if node.type in ignore:
        return ", ".join([*items, "ignored"])
    fwd = node.forward
    items.append(f"{_macs(fwd.macs)} = {fmt.ds_share(fwd.macs, root.forward.macs)} MACs")
    if timed:
        ns = _latency_ns(fwd)
        items.append(f"{fmt.ds_seconds(_seconds(ns))} = {fmt.ds_share(ns, _latency_ns(root.forward))} latency")
        items.append(_rate(fwd.flops, ns))
    if node.backward is not None:
        items.append(f"bwd {_macs(node.backward.macs)}")
        if timed:
            items.append(f"{fmt.ds_seconds(_seconds(_latency_ns(node.backward)))} bwd latency")
    return ", ".join(items)


def _module_lines(node: ModuleNode, root: ModuleNode, timed: bool, ignore: Collection[str]) -> list[str]:
    """``node`` as ``nn.Module.__repr__`` draws it, its figures before its extra_repr."""
    body = _figures(node, root, timed, ignore) + (f", {node.extra_repr}" if node.extra_repr else "")
    children = [child for child in node.children if child.kind == "module"]
    if not children:
        return [f"{node.type}({body})"]
    lines = [f"{node.type}(", f"  {body}"]
    for child in children:
        inner = _module_lines(child, root, timed, ignore)
        lines.append(f"  ({child.name}): {inner[0]}")
        lines.extend(f"  {line}" for line in inner[1:])
    lines.append(")")
    return lines


def _detailed(profile: Profile, ignore: Collection[str]) -> list[str]:
    order = "params, percentage of total params, MACs, percentage of total MACs"
    if profile.timed:
        order += ", fwd latency, percentage of total fwd latency, fwd FLOPS"
    if profile.root.backward is not None:
        order += ", bwd MACs" + (", bwd latency" if profile.timed else "")
    return [
        "",
        "------------------------------ Detailed Profile per GPU ------------------------------",
        f"After each module's name, in this order: {order}",
        "",
        "Note: each module's figures cover all it ran, its own code (functional calls, tensor",
        "methods) as well as its submodules', counted op by op at the aten level by layerscope.",
        "A module reachable under two names is shown once, at its first name.",
        "",
        *_module_lines(profile.root, profile.root, profile.timed, ignore),
    ]


def _depth_or_all(text: str) -> int:
    """``--module-depth``: a depth >= 0, or -1 for every depth."""
    value = int(text) if text.strip() == "-1" else count(text)
    return value


MODULE_DEPTH = Option(
    "module_depth", "the depths of the aggregated profile (-1: all, the default)", parse=_depth_or_all,
    metavar="N",
)
TOP_MODULES = Option("top_modules", "modules listed per depth (default 1)", parse=count, metavar="N")
#: DeepSpeed's other keywords, for the Python API.
_API = tuple(
    Option(name, f"as print_model_profile's {name}", flag=False)
    for name in ("profile_step", "detailed", "aggregated", "summary", "ignore_types", "engine")
)


@register_renderer(
    "deepspeed", description="the DeepSpeed flops profiler's printout: summary, top modules per depth, annotated model",
    options=(MODULE_DEPTH, TOP_MODULES, *_API),
)
def render_deepspeed(
    profile: Profile,
    *,
    profile_step: int = 1,
    module_depth: int = -1,
    top_modules: int = 1,
    detailed: bool = True,
    aggregated: bool = True,
    summary: bool = True,
    ignore_types: Collection[str] = (),
    engine: Mapping[str, Any] | None = None,
) -> str:
    """DeepSpeed's ``print_model_profile``: ``module_depth`` (-1: all) and ``top_modules``
    shape the aggregated section, ``detailed`` adds the annotated model, ``aggregated``
    the top modules; ``summary=False`` gives the top modules alone
    (``print_model_aggregated_profile``). Modules of
    ``ignore_types`` (class names) show only their params. ``engine`` holds the sizes a
    DeepSpeed engine would report (``world_size``, ``dp_world_size``,
    ``mp_world_size``, ``batch_size``)."""
    ignore = frozenset(ignore_types)
    if not summary:
        # print_model_aggregated_profile: the top modules alone.
        return "\n".join(_aggregated(profile, module_depth, top_modules, ignore)) + "\n"
    lines = _summary(profile, profile_step, engine or {})
    if aggregated:
        lines += ["", "----------------------------- Aggregated Profile per GPU -----------------------------"]
        lines += _aggregated(profile, module_depth, top_modules, ignore)
    if detailed:
        lines += _detailed(profile, ignore)
    unsupported = profile.unsupported_ops()
    if unsupported:
        lines += ["", "Ops not counted (no FLOP formula, or their shapes not recorded): " + ", ".join(f"{n} x{c}" for n, c in unsupported.items())]
    lines.append(_RULE)
    return "\n".join(lines) + "\n"
