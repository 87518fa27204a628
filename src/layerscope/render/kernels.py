"""A compiled model's kernels: which modules each kernel call holds, and for each
module, the kernels its work went into and how much of its eager op list was fused.

The kernel table lists every kernel call of every graph in call order with its median
time (on a device, its host time and the device time of the kernels it launched) and the modules it is split over (``*`` marks a call shared by several modules).
The module table says, per module whose work is in some kernel: the kernel calls, how
many of them are shared, its eager op calls (from the eager pass), and how many of
those did not survive as an op of their own (fused into a generated kernel, or folded
away as a view): eager calls minus extern calls that are wholly the module's.
"""

from __future__ import annotations

from layerscope.base import fmt
from layerscope.base.errors import RenderError
from layerscope.base.formats import register_renderer
from layerscope.model.compile_info import KernelTime
from layerscope.model.tree import Profile
from layerscope.render.table import Column, draw, from_headers


def _label(path: str) -> str:
    return path or "(root)"


def _extern(call: str) -> bool:
    return not call.split(":", 1)[0].startswith("cpp_")


@register_renderer("kernels", description="a compiled model's kernel calls and the modules they hold")
def render_kernels(profile: Profile) -> str:
    info = profile.compiled
    if info is None:
        raise RenderError("the kernels format is for a torch.compile'd model's profile; this model ran eagerly")
    kernels = info.kernels
    # A training step's kernels say which phase each is of (a forward's table is as before).
    phased = any(kernel.phase != "forward" for kernel in kernels)
    # On a device, each call's device time: the kernels it launched (a table without one is as before).
    on_device = any(kernel.device_ns is not None for kernel in kernels)
    rows = []
    for kernel in kernels:
        ranked = sorted(kernel.modules.items(), key=lambda m: -m[1])
        split = ", ".join(f"{_label(path)} {fmt.percent(round(share * 1000), 1000)}" for path, share in ranked)
        mark = "*" if kernel.shared else ""
        no_module = "(root: no module, unattributed)" if kernel.phase == "backward" else "(root: no module)"
        row = [kernel.call + mark, fmt.time_ns(kernel.time_ns)]
        if on_device:
            row.append(fmt.time_ns(kernel.device_ns) if kernel.device_ns is not None else "-")
        row.append(split or no_module)
        rows.append([row[0], kernel.phase, *row[1:]] if phased else row)
    out = [f"Kernel calls of {profile.meta.model or profile.root.type}, compiled ({info.backend}), in call order:"]
    columns = [Column("Kernel call", "<"), Column("Host time" if on_device else "Time")]
    if on_device:
        columns.append(Column("Device time"))
    columns.append(Column("Modules", "<"))
    if phased:
        columns.insert(1, Column("Phase", "<"))
    out += draw(columns, rows)
    out += ["* shared by several modules: its time is split by the rule: " + info.rule, ""]
    out += _module_table(profile, kernels)
    return "\n".join(out) + "\n"


def _module_table(profile: Profile, kernels: list[KernelTime]) -> list[str]:
    calls: dict[str, list[KernelTime]] = {}
    for kernel in kernels:
        for path in kernel.modules:
            calls.setdefault(path, []).append(kernel)
    rows = []
    for node in profile.root.walk():
        mine = calls.get(node.path)
        if not mine:
            continue
        eager = sum(op.calls for op in node.ops if op.phase == "forward")
        whole_extern = sum(1 for k in mine if _extern(k.call) and len(k.modules) == 1)
        fused = max(eager - whole_extern, 0)
        rows.append([
            _label(node.path), str(len(mine)), str(sum(1 for k in mine if k.shared)), str(eager),
            f"{fused} ({fmt.percent(fused, eager)})" if eager else "0",
        ])
    headers = ["Module", "Kernel calls", "Shared", "Eager op calls", "Fused or folded"]
    return ["Per module (eager op calls from the eager pass):", *draw(from_headers(headers, left=1), rows)]
