"""A ``torch.compile``d model's run, as its profile keeps it (``Profile.compiled``):
the kernel calls with their times and modules, the graph breaks, the compile time.

Pure data, no torch. Saved under ``meta["compile"]`` in a ``layerscope/1`` document;
:meth:`CompileInfo.to_dict` and :meth:`CompileInfo.from_dict` are the one conversion.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from layerscope.model.raw import GraphBreak


@dataclass
class KernelTime:
    """One kernel call of one graph: its median time over the passes, how it is split
    over modules (shares adding up to 1; empty: the model as a whole, unattributed), and
    its phase (``forward``, or ``backward`` for a kernel of a backward graph)."""

    graph: str
    call: str
    time_ns: int
    modules: dict[str, float]
    phase: str = "forward"
    #: Its median device time: the kernels it launched (None: no device work recorded).
    device_ns: int | None = None

    @property
    def shared(self) -> bool:
        return len(self.modules) > 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph": self.graph, "call": self.call, "time_ns": self.time_ns,
            "modules": {path: round(share, 6) for path, share in self.modules.items()},
            # Written only for a backward kernel: a forward profile's file is as before.
            **({"phase": self.phase} if self.phase != "forward" else {}),
            **({"device_ns": self.device_ns} if self.device_ns is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelTime:
        return cls(
            data["graph"], data["call"], data["time_ns"], dict(data["modules"]), data.get("phase", "forward"),
            data.get("device_ns"),
        )


@dataclass
class StepCompile:
    """A ``Profiler`` block's step in which torch.compile compiled (the first, or a
    recompile when a guard failed): its number, the time compiling (Dynamo and
    Inductor, none of it in the profile's times), the Dynamo frames compiled and the
    graph breaks met."""

    step: int
    time_ns: int
    frames: int
    #: The graph breaks Dynamo met compiling in this step (``CompileInfo.graph_breaks``
    #: says where and why).
    graph_breaks: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step, "time_ns": self.time_ns, "frames": self.frames,
            **({"graph_breaks": self.graph_breaks} if self.graph_breaks else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepCompile:
        return cls(data["step"], data["time_ns"], data["frames"], data.get("graph_breaks", 0))


def steps_in_medians(step_numbers: Sequence[int], compiled: Collection[int], other_inputs: Collection[int]) -> list[int]:
    """The steps a compiled block's medians are over: those that neither compiled nor
    made other calls than the eager count's step (other input shapes, or another number
    of calls); failing any, those with the count's calls; failing any (the count's step was a warm-up), those that did not compile;
    failing any, all of them."""
    for leave in ({*compiled, *other_inputs}, set(other_inputs), set(compiled)):
        kept = [n for n in step_numbers if n not in leave]
        if kept:
            return kept
    return list(step_numbers)


@dataclass
class CompileInfo:
    """How the compiled model ran: the compiler (``backend``), the rule that split
    kernel times over modules, the compile time (not in the profile's times), the
    Dynamo frames and Inductor graphs, the graph breaks, the step (the sum of the
    nodes' median self times: the root's total), the median time in kernel calls (the
    rest is wrapper, guards and eager modules), and the kernel calls in call order."""

    backend: str
    rule: str
    compile_time_ns: int
    frames: int
    graphs: int
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    step_time_ns: int = 0
    kernel_time_ns: int = 0
    kernels: list[KernelTime] = field(default_factory=list)
    #: In a ``Profiler`` block: the steps that compiled, with their compile time (those
    #: steps' figures are left out of the medians when other steps ran).
    step_compiles: list[StepCompile] = field(default_factory=list)
    #: Per phase, the median device time the graphs launched outside their kernel calls
    #: (a CUDA graph's replay, whose kernels have no launch of their own): in the root's
    #: device time, named as unattributed.
    replay_device_ns: dict[str, int] = field(default_factory=dict)
    #: In a ``Profiler`` block: the steps whose calls of the model differ from those of
    #: the step the eager count replayed (the calls the FLOPs, shapes and memory are of):
    #: other input shapes, or another number of calls. They are left out of the medians
    #: while a step with the count's calls ran: a node's FLOPs and its time are then of
    #: the same calls.
    other_input_steps: list[int] = field(default_factory=list)

    def median_steps(self, step_numbers: Sequence[int]) -> list[int]:
        """Of a block's recorded ``step_numbers``, those each node's median is over."""
        return steps_in_medians(step_numbers, [c.step for c in self.step_compiles], self.other_input_steps)

    def left_out(self, step_numbers: Sequence[int]) -> tuple[int, int]:
        """How many of a block's ``step_numbers`` its medians leave out: those that
        compiled, and those (not compiling) with other calls than the count's step."""
        kept = set(self.median_steps(step_numbers))
        compiled = {c.step for c in self.step_compiles}
        out = [n for n in step_numbers if n not in kept]
        return sum(1 for n in out if n in compiled), sum(1 for n in out if n not in compiled)

    def unattributed_time_ns(self, phase: str = "backward") -> int:
        """The time of ``phase``'s kernels that no module's node is in (the sum of their
        median times): it stays with the root's time in that phase."""
        return sum(k.time_ns for k in self.kernels if k.phase == phase and not k.modules)

    def unattributed_device_ns(self, phase: str = "backward") -> int | None:
        """The same kernels' device time and the graphs' replays in ``phase`` (None: no
        device work was recorded)."""
        if not any(k.device_ns is not None for k in self.kernels) and not self.replay_device_ns:
            return None
        kernels = sum(k.device_ns or 0 for k in self.kernels if k.phase == phase and not k.modules)
        return kernels + self.replay_device_ns.get(phase, 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "rule": self.rule, "compile_time_ns": self.compile_time_ns,
            "frames": self.frames, "graphs": self.graphs,
            "graph_breaks": [b.to_dict() for b in self.graph_breaks], "step_time_ns": self.step_time_ns,
            "kernel_time_ns": self.kernel_time_ns, "kernels": [k.to_dict() for k in self.kernels],
            # Written only for a block: a profile()'s file is as before.
            **({"step_compiles": [c.to_dict() for c in self.step_compiles]} if self.step_compiles else {}),
            **({"replay_device_ns": dict(self.replay_device_ns)} if self.replay_device_ns else {}),
            **({"other_input_steps": list(self.other_input_steps)} if self.other_input_steps else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompileInfo:
        return cls(
            backend=data["backend"], rule=data["rule"], compile_time_ns=data["compile_time_ns"],
            frames=data["frames"], graphs=data["graphs"],
            graph_breaks=[GraphBreak(b["where"], b["reason"]) for b in data["graph_breaks"]],
            step_time_ns=data["step_time_ns"], kernel_time_ns=data["kernel_time_ns"],
            kernels=[KernelTime.from_dict(k) for k in data["kernels"]],
            step_compiles=[StepCompile.from_dict(c) for c in data.get("step_compiles", ())],
            replay_device_ns=dict(data.get("replay_device_ns", {})),
            other_input_steps=list(data.get("other_input_steps", ())),
        )
