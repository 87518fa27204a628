"""torch's private API, in one place: every private attribute, class, function and
format layerscope relies on, one entry each, named for what layerscope needs it for.

torch promises nothing about these names: a release may rename or drop any of them.
So each is looked up here once (at import, or on first use for the few that live in
modules costly to import: Dynamo, Inductor), and the rest of layerscope uses what this
module exports, never ``torch._...`` itself (``tests/test_torch_seam.py`` scans for it).

A name this torch lacks becomes a :class:`Missing` stand-in: calling it, or reading
anything from it, raises :class:`MissingTorchAPI` with one line naming the torch API,
the first torch release that has it and the layerscope feature that needs it. Only that
feature fails, and only when it is used: nothing degrades silently. The few names whose
absence layerscope tolerates by design say what is lost instead (``Entry.tolerated``,
:func:`missing_meta`, which a profile's ``meta.torch_api_missing`` carries).

Each entry records the first torch release that has the name (``since``) and how that
was established (``evidence``: the pull request that added it, dated against the
release branch cuts). Where no first release could be established, ``since`` is None
and ``evidence`` says so. ``PRIVATE`` lists them all; ``pyproject.toml``'s torch floor
is the newest ``since`` of the entries that are not tolerated (``floor()``).
"""

from __future__ import annotations

import importlib
import importlib.util
import operator
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from layerscope.base.errors import LayerscopeError


class MissingTorchAPI(LayerscopeError):
    """A layerscope feature needs a private torch API that this torch does not have.

    Not a RuntimeError or AttributeError: code that tolerates those from torch (a
    released storage, a TorchScript-only overload) must not swallow this one."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One private torch name layerscope uses.

    ``name``: where it lives in torch (dotted; ``Class.attr`` for an attribute; a format
    is named by the module that writes it). ``need``: the layerscope feature that uses it.
    ``since``: the first torch release that has it, or None when that is not established.
    ``evidence``: how ``since`` was found (or why it could not be).
    ``without``: what happens on a torch that lacks it. ``tolerated``: absence is allowed
    by design (``without`` says what is lost). ``lazy``: looked up on first use (its
    module is costly to import)."""

    name: str
    need: str
    since: str | None
    evidence: str
    without: str
    tolerated: bool = False
    lazy: bool = False


#: Every private torch name layerscope uses, by name.
PRIVATE: dict[str, Entry] = {}
_FINDERS: dict[str, Callable[[], Any]] = {}
_FOUND: dict[str, Any] = {}


class Missing:
    """Stands in for a torch API this torch lacks: calling it, or reading an attribute
    of it, raises :class:`MissingTorchAPI`; it is falsy, so ``if api:`` asks for it."""

    __slots__ = ("entry", "reason")

    def __init__(self, entry: Entry, reason: str) -> None:
        self.entry = entry
        self.reason = reason

    def error(self) -> MissingTorchAPI:
        entry = self.entry
        since = f"torch >= {entry.since}" if entry.since else "first torch release not established"
        return MissingTorchAPI(
            f"{entry.need} needs {entry.name} ({since}), which torch {torch.__version__} lacks ({self.reason})"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # Python's own probes (copy, inspect) get their usual answer
            raise AttributeError(name)
        raise self.error()

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<missing torch API {self.entry.name}>"


def _resolve(dotted: str) -> Any:
    """The object at ``dotted`` (``torch.a.b.c``), importing modules on the way."""
    parts = dotted.split(".")
    found: Any = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            found = getattr(found, part)
        except AttributeError:
            found = importlib.import_module(".".join(parts[: i + 1]))
    return found


def _has(owner: Callable[[], Any], attribute: str) -> Callable[[], Any]:
    """A finder for an attribute layerscope reads on torch's objects: ``owner()`` gives
    their class (or a probe instance); the finder gives the attribute's accessor once
    the owner is seen to have it."""

    def find() -> Any:
        if not hasattr(owner(), attribute):
            raise AttributeError(f"no attribute {attribute!r}")
        return operator.attrgetter(attribute)

    return find


def _fields(owner: str, names: tuple[str, ...]) -> Callable[[], Any]:
    """A finder for a class of torch's whose fields layerscope reads: the class, once it
    is seen to have them all."""

    def find() -> Any:
        found = _resolve(owner)
        absent = [name for name in names if not hasattr(found, name)]
        if absent:
            raise AttributeError(f"no field {', '.join(absent)}")
        return found

    return find


def _set_in_init(owner: str, attribute: str) -> Any:
    """An accessor for an attribute a class of torch's sets on its instances in
    ``__init__`` (seen in its code: no instance is built to look)."""
    code = _resolve(owner).__init__.__code__
    if attribute not in code.co_names + code.co_consts:
        raise AttributeError(f"{owner}.__init__ no longer sets {attribute!r}")
    return operator.attrgetter(attribute)


def _declare(
    name: str, need: str, since: str | None, evidence: str, without: str, *,
    find: Callable[[], Any] | None = None, tolerated: bool = False, lazy: bool = False,
) -> None:
    if name in PRIVATE:
        raise ValueError(f"torch API {name} is declared twice")
    entry = Entry(name, need, since, evidence, without, tolerated, lazy)
    PRIVATE[name] = entry
    _FINDERS[name] = find or (lambda: _resolve(name))
    if not lazy:
        _look_up(name)


def _look_up(name: str) -> Any:
    try:
        found = _FINDERS[name]()
    except (AttributeError, ImportError, TypeError, RuntimeError) as exc:
        found = Missing(PRIVATE[name], f"{type(exc).__name__}: {exc}")
    _FOUND[name] = found
    return found


def get(name: str) -> Any:
    """What entry ``name`` found: the torch object (or accessor), or a :class:`Missing`."""
    found = _FOUND.get(name)
    if found is None:
        found = _look_up(name)
    return found


def require(name: str) -> Any:
    """Entry ``name``'s object; :class:`MissingTorchAPI` if this torch lacks it."""
    found = get(name)
    if isinstance(found, Missing):
        raise found.error()
    return found


def missing(*, include_lazy: bool = False) -> list[Entry]:
    """The entries this torch lacks (lazy ones only if looked up, or with ``include_lazy``)."""
    names = PRIVATE if include_lazy else [n for n in PRIVATE if n in _FOUND]
    return [PRIVATE[n] for n in names if isinstance(get(n), Missing)]


def missing_meta() -> dict[str, Any]:
    """``{"torch_api_missing": {name: what is lost}}`` for the tolerated entries this
    torch lacks (a profile's meta says what it could not have); empty when none is."""
    lost = {e.name: e.without for e in missing() if e.tolerated}
    return {"torch_api_missing": lost} if lost else {}


def floor() -> str:
    """The oldest torch release that has every entry that is not tolerated, as far as
    established: the newest of their ``since`` releases (entries whose first release is
    not established do not count; each says so)."""
    versions = [e.since for e in PRIVATE.values() if e.since and not e.tolerated]
    return max(versions, key=lambda v: tuple(int(p) for p in v.split(".")))


# -- autograd: backward attribution, recompute, activations ----------------------------

_BACKWARD = "backward attribution (which module's forward created each autograd node)"

_declare(
    "torch._C._autograd._get_sequence_nr", _BACKWARD + ", activation and gradient flows", "2.1",
    "bound for aot_autograd's seq_nr mapping, pytorch#103129 (June 2023, before 2.1's branch cut); inferred from the PR",
    "backward work cannot be traced to modules",
)
_declare(
    "torch._C._current_graph_task_id", "telling backward and checkpoint recompute from forward at module boundaries",
    "2.1", "came with the non-reentrant checkpoint's rewrite, pytorch#90105 / #96866 (March 2023, after 2.0's branch "
    "cut); inferred from the PRs' dates",
    "module calls cannot be told forward from recompute",
)
_declare(
    "torch._C._current_autograd_node", _BACKWARD + " under the dispatch mode", "2.0",
    "pytorch#90867 'Bind autograd current Node for debugging purposes' (Dec 2022, before 2.0's branch cut)",
    "the dispatch mode cannot tag backward ops with their node",
)
_declare(
    "torch.autograd.graph.Node._sequence_nr", _BACKWARD + " and reading activations", None,
    "not established: long-standing on C++ nodes; declared on torch.autograd.graph.Node since that class "
    "was added, pytorch#91475 (Jan 2023)", "backward ops and saved activations cannot be traced to modules",
    find=_has(lambda: torch._C._functions.AccumulateGrad, "_sequence_nr"),
)
_declare(
    "torch.autograd.graph.Node._raw_saved_*", "activations: what each autograd node saved, read without unpacking",
    None, "not established: generated for every node with saved tensors",
    "activations cannot be read from the autograd graph",
    find=_has(lambda: torch._C._functions.MulBackward0, "_raw_saved_self"),
)
_declare(
    "torch.utils.checkpoint._StopRecomputationError", "telling a checkpoint that stopped recomputing from a failed forward",
    "2.1", "the non-reentrant checkpoint's early stop, pytorch#96866 (March 2023, after 2.0's branch cut); inferred "
    "from the PR's date",
    "a stopped recompute's last op would be counted as run",
)
_declare(
    "torch.Tensor._version", "putting back only the state tensors a profile changed", None,
    "not established: autograd's version counter, long-standing", "state cannot be compared by version",
    find=_has(lambda: torch.Tensor, "_version"),
)
_declare(
    "torch.UntypedStorage._cdata", "memory: one identity per storage, however many views share it", None,
    "not established: long-standing", "storages cannot be told apart",
    find=_has(lambda: torch.UntypedStorage, "_cdata"),
)

# -- the dispatcher: op names, schemas, composites, fake tensors -----------------------

_declare(
    "torch.utils._python_dispatch.TorchDispatchMode", "the op-recording dispatch mode (count_flops, the fallback)",
    None, "not established: the base of torch's own FlopCounterMode",
    "no op can be recorded by a dispatch mode",
)
_declare(
    "torch.utils._python_dispatch.TorchDispatchMode._should_skip_dynamo",
    "a dispatch mode without the per-call dynamo-disable wrapper", None,
    "not established: the wrapper this hook turns off is recent", "nothing: a torch without the hook adds no wrapper",
    tolerated=True,
)
_declare(
    "torch._ops.OpOverload._schema", "op names and argument schemas", "1.11",
    "per-overload torch.ops API, pytorch#67254 (Jan 2022)", "ops cannot be named or their arguments read",
    find=_has(lambda: torch.ops.aten.mm.default, "_schema"),
)
_declare(
    "torch._ops.OpOverloadPacket._qualified_op_name", "naming ops given as torch.ops packets (register_flops, torch's formulas)",
    "1.11", "per-overload torch.ops API, pytorch#67254 (Jan 2022)", "ops given as packets cannot be named",
    find=_has(lambda: torch.ops.aten.mm, "_qualified_op_name"),
)
_declare(
    "torch._C._dispatch_has_kernel_for_dispatch_key", "FLOPs of composite ops (CompositeImplicitAutograd), counted by their parts",
    None, "not established: used by torch's own OpOverload.decompose", "composites cannot be told from their parts",
)
for _name in ("torch._C._dispatch_tls_local_include_set", "torch._C._dispatch_tls_local_exclude_set", "torch._C._ForceDispatchKeyGuard"):
    _declare(
        _name, "FLOPs of composites run on fake tensors with the default dispatch keys", None, "not established",
        "composites cannot be decomposed from inside a dispatch mode",
    )
_declare(
    "torch._dynamo.reset", "torch.compile's caches cleared after a higher-order op failed under the dispatch mode "
    "(flex_attention's eager path compiles its call, and a failed compile leaves it refusing every later call)",
    None, "not established: torch.compiler.reset calls it", "a failed higher-order op stays broken for the process",
    find=lambda: torch._dynamo.reset, tolerated=True, lazy=True,
)
_declare(
    "torch._subclasses.fake_tensor.FakeTensorMode", "output shapes and composite FLOPs from fake tensors", None,
    "not established: the fake tensors torch.compile traces with", "outputs of recorded ops cannot be derived",
)
_declare(
    "torch.utils._pytree.tree_leaves", "finding tensors in nested inputs", None, "not established",
    "meta-device inputs and host batches cannot be found",
)
_declare(
    "torch.utils._pytree.tree_map", "moving nested benchmark batches", None, "not established",
    "nested benchmark batches cannot be moved",
)

# -- modules -----------------------------------------------------------------------------

_declare(
    "torch.nn.modules.module._global_forward_hooks_with_kwargs",
    "module input shapes by keyword (global forward hooks with_kwargs), left behind by handle.remove()", "2.6",
    "pytorch#137403 'Make global module hook to pass kwargs' (Oct-Nov 2024, before 2.6's branch cut); "
    "register_module_forward_hook(with_kwargs=) came in the same PR",
    "the detail passes cannot take their with_kwargs flag out of torch's global table",
)
_declare(
    "torch.nn.Module._parameters", "a module's own parameters, read per module at set-up", None,
    "not established: long-standing", "module tables cannot be built", find=_has(lambda: torch.nn.Module(), "_parameters"),
)
_declare(
    "torch.nn.Module._compiled_call_impl", "refusing per-module profiles of modules compiled in place (module.compile())",
    None, "not established: set by nn.Module.compile()", "nothing: a torch without "
    "Module.compile() has no module compiled in place", tolerated=True, find=_has(lambda: torch.nn.Module, "_compiled_call_impl"),
)
_declare(
    "torch._dynamo.eval_frame.OptimizedModule", "recognising torch.compile(model)", "2.0",
    "torch.compile's wrapper, released with torch.compile in 2.0", "compiled models cannot be recognised", lazy=True,
)
_declare(
    "torch._dynamo.eval_frame.OptimizedModule._orig_mod", "profiling torch.compile(model) through its eager module",
    "2.0", "torch.compile's wrapper, released with torch.compile in 2.0", "a compiled model's eager module cannot be found",
    find=lambda: _set_in_init("torch._dynamo.eval_frame.OptimizedModule", "_orig_mod"), lazy=True,
)

# -- torch's profiler (Kineto): ranges, config, the event tree ---------------------------

_KINETO = "timing through torch's profiler (Kineto)"

_declare(
    "torch._C._profiler._RecordFunctionFast", _KINETO + ": a range per module call", "2.1",
    "pytorch#107195 '_RecordFunctionFast' (Aug 2023, before 2.1's branch cut)", "modules cannot be ranges on the profiler's clock",
)
# (name, need, why no first release is known, without it)
for _name, _need, _unknown, _without in (
    ("torch.autograd._profiler_enabled", "whether another profiler already runs", "long-standing",
     "layerscope cannot tell whether torch's profiler is free"),
    ("torch._C._autograd.DeviceType", "telling device kernels from host events", "long-standing",
     "kernels cannot be told from host events"),
    ("torch._C._profiler.RecordScope", "telling record_function labels (USER_SCOPE) from ops", "came with the event tree",
     "labels cannot be told from ops"),
    ("torch._C._profiler._EventType", "telling ops and Python frames (with_stack) apart", "came with the event tree",
     "the event tree cannot be read"),
):
    _declare(_name, f"{_KINETO}: {_need}", None, f"not established: {_unknown}", _without)
for _name in (
    "torch._C._profiler.ProfilerConfig", "torch._C._profiler.ProfilerState", "torch._C._profiler._ExperimentalConfig",
    "torch.autograd.profiler._prepare_profiler", "torch.autograd.profiler._enable_profiler",
    "torch.autograd.profiler._disable_profiler",
):
    _declare(_name, _KINETO + ": configuring, starting and stopping it", None, "not established", "torch's profiler cannot run")
_declare(
    "torch._C._profiler._ExperimentalConfig(capture_overload_names=)", "op rows: each op's overload, for its schema",
    "2.7", "pytorch#143114 'Add overload names to profiler trace' (reviewed March 2025); inferred from the PR",
    "op rows assume each op's default overload (its schema decides keyword-only inputs)", tolerated=True,
    find=lambda: torch._C._profiler._ExperimentalConfig(capture_overload_names=True) is not None,
)
_EVENT_FIELDS = ("children", "correlation_id", "end_time_ns", "extra_fields", "name", "parent", "start_tid", "start_time_ns", "tag")
_declare(
    "torch._C._profiler._ProfilerEvent", _KINETO + ": the event tree (experimental_event_tree) and its fields", None,
    "not established: the event tree is experimental; its fields read here are " + ", ".join(_EVENT_FIELDS),
    "the profiler's events cannot be read",
    find=_fields("torch._C._profiler._ProfilerEvent", _EVENT_FIELDS),
)
_declare(
    "torch._C._profiler._ProfilerEvent.overload_name", "op rows: each op's overload, for its schema", "2.7",
    "pytorch#143114, with capture_overload_names", "op rows assume each op's default overload", tolerated=True,
    find=_has(lambda: torch._C._profiler._ProfilerEvent, "overload_name"),
)
_declare(
    "torch._C._profiler._ExtraFields_TorchOp", _KINETO + ": an op's sequence number, scope and recorded inputs", None,
    "not established: came with the event tree", "ops' inputs and autograd numbers cannot be read",
    find=_fields("torch._C._profiler._ExtraFields_TorchOp", ("sequence_number", "scope", "inputs")),
)
_declare(
    "torch._C._profiler._ExtraFields_Allocation", "memory from torch's allocation events", None,
    "not established: came with the event tree", "allocations cannot be read",
    find=_fields(
        "torch._C._profiler._ExtraFields_Allocation",
        ("ptr", "alloc_size", "allocation_id", "total_allocated", "total_reserved", "device"),
    ),
)
_declare(
    "torch._C._autograd._KinetoEvent.is_user_annotation", "device time: a record_function range shown on the device "
    "(an optimizer's step) told from device work", None, "not established: present in 2.11 and 2.13, the releases "
    "layerscope has run on", "device time cannot be read",
    find=_has(lambda: torch._C._autograd._KinetoEvent, "is_user_annotation"),
)
_declare(
    "torch._C._autograd._KinetoEvent.device_resource_id", "device time: each kernel's stream", None,
    "not established: present in 2.11 and 2.13", "device time cannot be read",
    find=_has(lambda: torch._C._autograd._KinetoEvent, "device_resource_id"),
)
_declare(
    "torch._C._profiler._TensorMetadata.allocation_id",
    "activations saved by ops outside the model (a loss): the allocations a backward node's ops read", None,
    "not established: read by torch's own memory profiler (torch/profiler/_memory_profiler.py)",
    "a tensor saved for backward only by ops outside the model is not an activation in torch's events",
    tolerated=True, find=_fields("torch._C._profiler._TensorMetadata", ("allocation_id",)),
)
_declare(
    "torch._C._autograd._KinetoEvent.concrete_inputs", "FLOPs of ops with int-list arguments (a convolution's stride)",
    None, "not established: int lists are recorded since pytorch#100593 (May 2023, 2.1); the binding's first release "
    "is not", "int-list arguments are unknown: formulas that read them count the op as unsupported", tolerated=True,
    find=_has(lambda: torch._C._autograd._KinetoEvent, "concrete_inputs"),
)
_declare(
    "torch.ops.profiler._record_function_enter_new", "ranges around eager modules of a compiled model", None,
    "not established: record_function's own op", "eager modules of a compiled model cannot be ranges",
    find=lambda: torch.ops.profiler._record_function_enter_new,
)
_declare(
    "torch.ops.profiler._record_function_exit._RecordFunction", "ranges around eager modules of a compiled model", "2.0",
    "record_function on custom classes, pytorch#76420 (Nov 2022)", "eager modules of a compiled model cannot be ranges",
    find=lambda: torch.ops.profiler._record_function_exit._RecordFunction,
)
def _schedule_names(fn: Callable[[int], Any]) -> Callable[[Callable[[int], Any]], dict[str, Any] | None]:
    import inspect

    names = ("wait", "warmup", "active", "repeat", "skip_first")
    if not all(name in inspect.getclosurevars(fn).nonlocals for name in names):
        raise AttributeError(f"torch.profiler.schedule's closure no longer holds {', '.join(names)}")

    def settings(value: Callable[[int], Any]) -> dict[str, Any] | None:
        try:
            found = inspect.getclosurevars(value).nonlocals
        except (TypeError, ValueError):
            return None
        if found.get("skip_first_wait", 0) or not all(name in found for name in names):
            return None  # a variant layerscope's schedule cannot express
        return {name: found[name] for name in names}

    return settings


_declare(
    "torch.profiler.schedule closure (wait, warmup, active, repeat, skip_first)",
    "reading a torch.profiler.schedule as layerscope's Schedule (meta['schedule'])", None,
    "not established: the closure's variable names, unchanged through 2.13", "nothing lost in the steps: "
    "the schedule is asked step by step, and meta['schedule'] is not written", tolerated=True,
    find=lambda: _schedule_names(torch.profiler.schedule(wait=1, warmup=1, active=1)),
)

# -- torch.compile: layerscope's own compile, Inductor's provenance, the structured trace --

_COMPILED = "profiling torch.compile(model) per module"

_declare(
    "torch._guards.CompileContext", _COMPILED + ": which Dynamo frame a graph is", None, "not established",
    "graphs cannot be matched to their frames", lazy=True,
)
_declare(
    "torch._inductor.compile_fx.compile_fx", _COMPILED + ": compiling layerscope's backend's graphs with Inductor",
    None, "not established", "graphs cannot be compiled", lazy=True,
)
_declare(
    "torch._inductor.compile_fx.compile_fx_inner",
    _COMPILED + ": each forward and backward graph Inductor compiles (its is_backward keyword), with its nodes' meta",
    None, "not established", "backward kernels cannot be traced to modules", lazy=True,
)
_declare(
    "torch._functorch.config.force_non_lazy_backward_lowering",
    _COMPILED + ": the backward compiled with its forward, inside Inductor's provenance tracking (a lazily "
    "compiled backward's provenance map is empty)", None, "not established",
    "backward kernels cannot be traced to modules", lazy=True,
)
_declare(
    "torch._functorch.config.enable_autograd_cache",
    _COMPILED + ": AOTAutograd's cache off, so every compile shows Inductor the graphs (a hit skips inner_compile)",
    None, "not established", "backward kernels cannot be traced to modules", lazy=True,
)
_declare(
    "torch._inductor.config.trace.provenance_tracking_level", _COMPILED + ": which FX nodes each kernel holds", "2.9",
    "pytorch#160383 'Separate provenance tracking to different levels' (Aug 2025, before 2.9's branch cut); "
    "inferred from the PR", "kernels cannot be traced to modules", lazy=True,
)
_declare(
    "torch._inductor.config.cpp.enable_kernel_profile", _COMPILED + ": a profiler range per generated kernel", None,
    "not established", "kernels cannot be timed one by one", lazy=True,
)
_declare(
    "torch._dynamo.utils.get_compilation_metrics", _COMPILED + ": compile time (entire_frame_compile_time_s)", None,
    "not established", "compile time cannot be read", lazy=True,
)
_declare(
    "torch.autograd.profiler._run_on_profiler_start",
    _COMPILED + ": Python's flag that torch's profiler runs, which Inductor reads before recording its graph "
    "and kernel ranges (set as torch.profiler sets it)", None, "not established",
    "a compiled model's graph calls cannot be seen", lazy=True,
)
_declare(
    "torch.autograd.profiler._run_on_profiler_stop", _COMPILED + ": the same flag cleared", None, "not established",
    "a compiled model's graph calls cannot be seen", lazy=True,
)
_declare(
    "torch._dynamo.eval_frame.innermost_backend",
    _COMPILED + " in a Profiler block: the backend and Inductor settings (mode, options) the user compiled with",
    None, "not established", "a compiled model cannot be profiled in a block", lazy=True,
)
def _context_in_closure(fn: Any) -> Any:
    context_type = _resolve("torch._dynamo.eval_frame._TorchDynamoContext")
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, context_type):
            return value
    raise AttributeError("torch.compile(fn)'s wrapper no longer holds its Dynamo context in its closure")


def _find_context_in_closure() -> Callable[[Any], Any]:
    probe = torch.compile(lambda x: x, backend="eager")
    _context_in_closure(probe)  # this torch's wrapper still holds it
    return _context_in_closure


_declare(
    "torch.compile(fn)'s Dynamo context, in its wrapper's closure",
    _COMPILED + " for a model compiled in place (model.compile()): the backend and settings it was compiled with",
    None, "not established: torch.compile(fn) returns a wrapper closing over its _TorchDynamoContext",
    "a model compiled in place cannot be profiled per module (torch.compile(model) can)", lazy=True,
    find=_find_context_in_closure,
)
_declare(
    "torch._TorchCompileInductorWrapper",
    _COMPILED + " in a Profiler block: the Inductor settings of the user's mode and options (its config)", None,
    "not established", "a compiled model cannot be profiled in a block", lazy=True,
)
_declare(
    "torch._dynamo.eval_frame._TorchDynamoContext.fullgraph",
    _COMPILED + " in a Profiler block: whether the user compiled with fullgraph=True", None, "not established",
    "a compiled model cannot be profiled in a block", lazy=True, find=lambda: operator.attrgetter("fullgraph"),
)
_declare(
    "torch._logging._internal.trace_log", _COMPILED + ": torch's structured trace (the torch.__trace logger)", None,
    "not established: tlparse's structured trace", "graphs' code and provenance cannot be read",
)
_FORMATS = {
    "[Provenance debug handles]": ("torch._inductor.codegen.wrapper", "kernel calls in order, in Inductor's wrapper code"),
    "cppCodeToPost": ("torch._inductor.debug", "kernel -> post-grad node provenance map"),
    "inductor_provenance_tracking_node_mappings": ("torch._inductor.compile_fx", "the provenance map's trace artifact"),
    "inductor_output_code": ("torch._inductor.graph", "a graph's wrapper code in the trace"),
    "Call CompiledFxGraph": ("torch._inductor.output_code", "the profiler range around each graph call"),
    "## Call CompiledFxGraph {self._fx_graph_cache_key} ##": (
        "torch._inductor.output_code", "the graph call's range is named by the attribute layerscope sets (name_graph_calls)",
    ),
    "fx_graph_remote_cache": ("torch._inductor.config", "Inductor's graph caches, turned off for layerscope's compile"),
    "dynamo_graph_break_reason": ("torch._dynamo.symbolic_convert", "graph breaks, where and why"),
    "Torch-Compiled Region": ("torch._dynamo.convert_frame", "the profiler range around each compiled region"),
    "(dynamo_timed)": ("torch._dynamo.utils", "Dynamo's compile-time profiler ranges (a block's steps that compiled)"),
    "fwd_nn_module_stack": (
        "torch._functorch._aot_autograd.utils", "a backward node's forward module (AOTAutograd copies it by seq_nr)",
    ),
}


def _format_finder(marker: str, module: str) -> Callable[[], Any]:
    def find() -> Any:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise ImportError(f"no module {module}")
        with open(spec.origin, encoding="utf-8") as source:
            if marker not in source.read():
                raise AttributeError(f"{module} no longer writes {marker!r}")
        return marker

    return find


#: When a format's first release is known: (release, evidence).
_FORMAT_SINCE = {
    "fwd_nn_module_stack": (
        "2.4", "pytorch#126573 'aot_autograd: copy metadata from fw to bw nodes' (May 2024, before 2.4's branch cut); "
        "inferred from the PR's date",
    ),
    "[Provenance debug handles]": (
        "2.9", "pytorch#161110 'Add debug handle to inductor provenance tracking' (Aug 2025, before 2.9's branch cut); "
        "inferred from the PR's date",
    ),
}

for _marker, (_module, _what) in _FORMATS.items():
    _since, _evidence = _FORMAT_SINCE.get(_marker, (None, "not established: a format torch writes, checked in its source"))
    _declare(
        f"{_module}: {_marker!r}", f"{_COMPILED}: {_what}", _since, _evidence,
        "kernels cannot be traced to modules", find=_format_finder(_marker, _module), lazy=True,
    )

# -- distributed, and the zoo ---------------------------------------------------------------

_declare(
    "torch.distributed.distributed_c10d._get_default_store", "a run id agreed by every rank through the rendezvous store",
    None, "not established: long-standing", "ranks agree on a run id by broadcast_object_list instead", tolerated=True,
)
_declare(
    "torch._assert", "the zoo's ViT: an input check that torch.fx and torch.compile trace", None,
    "not established: torchvision's models use it", "the zoo's ViT cannot check its input size",
)


# ================================ what layerscope uses ==================================
# Hot paths take the torch objects themselves (no wrapper: a builtin call costs what it
# did before the seam); everything else goes through a function named for its use.

#: Autograd's thread-local sequence counter: the number the next node created will take.
next_sequence_nr: Callable[[], int] = get("torch._C._autograd._get_sequence_nr")
#: The graph task (backward) running on this thread; -1 outside backward.
graph_task_id: Callable[[], int] = get("torch._C._current_graph_task_id")
#: The autograd node being executed (None outside backward).
current_autograd_node: Callable[[], Any] = get("torch._C._current_autograd_node")

_node_seq = get("torch.autograd.graph.Node._sequence_nr")
_saved = get("torch.autograd.graph.Node._raw_saved_*")


#: An autograd node's number (``NO_SEQ`` for gradient accumulation).
node_sequence_nr: Callable[[Any], int] = operator.methodcaller("_sequence_nr") if _node_seq else _node_seq


_SAVED_NAMES: dict[type, tuple[str, ...]] = {}


def saved_attributes(node: Any) -> tuple[str, ...]:
    """The names under which an autograd node exposes what it saved for backward
    (``_raw_saved_*``: read without unpacking, so no hook runs and nothing recomputes)."""
    if not _saved:
        raise _saved.error()
    kind = type(node)
    names = _SAVED_NAMES.get(kind)
    if names is None:
        names = _SAVED_NAMES[kind] = tuple(a for a in dir(node) if a.startswith("_raw_saved_"))
    return names


_stop_recompute = get("torch.utils.checkpoint._StopRecomputationError")


def is_stopped_recompute(kind: type | None) -> bool:
    """Whether an exception type is a non-reentrant checkpoint ending its recompute early."""
    if not _stop_recompute:
        raise _stop_recompute.error()
    return kind is not None and issubclass(kind, _stop_recompute)


#: A tensor's version counter (moves on every in-place change).
tensor_version: Callable[[torch.Tensor], int] = get("torch.Tensor._version")
#: One key per storage, shared by every view of it (hot: per op under the dispatch mode).
storage_key: Callable[[Any], int] = get("torch.UntypedStorage._cdata")

_dispatch_mode = get("torch.utils._python_dispatch.TorchDispatchMode")
if _dispatch_mode:
    DispatchMode: Any = _dispatch_mode
else:

    class DispatchMode:  # type: ignore[no-redef]
        """Stands in for torch's TorchDispatchMode (a class to subclass at import): making
        a mode raises, naming what this torch lacks."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise _dispatch_mode.error()


class UnwrappedDispatchMode(DispatchMode):  # type: ignore[misc]
    """A dispatch mode without torch's per-call dynamo-disable wrapper around
    ``__torch_dispatch__``, which costs as much as a small op: for modes that are never
    compiled (they read a clock and append to a list)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


_HIGHER_ORDER = re.compile(r"(?:HigherOrderOperator |torch\.ops\.higher_order\.)(\w+)")


def refused_higher_order(exc: BaseException) -> str | None:
    """The higher-order op (``flex_attention``) whose eager run a dispatch mode broke,
    named in ``exc`` or the exceptions it chains; None when ``exc`` is no such failure.
    A higher-order op needs a rule for each Python dispatch mode, and some run through
    torch.compile even eagerly (``flex_attention``, which torch's own FlopCounterMode
    cannot run either)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        found = _HIGHER_ORDER.search(str(seen))
        if found:
            return found.group(1)
        seen = seen.__cause__ or seen.__context__
    return None


def reset_compile_caches() -> None:
    """torch.compile's caches cleared (``torch._dynamo.reset``), where this torch has it."""
    reset = get("torch._dynamo.reset")
    if reset:
        reset()


#: An OpOverload's schema (a dispatch mode's ``func``): its name and arguments.
op_schema: Callable[[Any], Any] = get("torch._ops.OpOverload._schema")
_packet_name = get("torch._ops.OpOverloadPacket._qualified_op_name")


def op_name(func: Any) -> str:
    """``"aten::mm"`` of an OpOverload."""
    return op_schema(func).name  # type: ignore[no-any-return]


def packet_name(packet: Any) -> str | None:
    """``"aten::mm"`` of an OpOverloadPacket (``torch.ops.aten.mm``); None for anything else."""
    if not _packet_name:
        raise _packet_name.error()
    return getattr(packet, "_qualified_op_name", None)


_has_kernel = get("torch._C._dispatch_has_kernel_for_dispatch_key")


def has_composite_kernel(qualified: str) -> bool:
    """Whether the overload ``namespace::name[.overload]`` is a ``CompositeImplicitAutograd``
    op (its work is done by the ops it calls); RuntimeError for TorchScript-only ones."""
    return bool(_has_kernel(qualified, "CompositeImplicitAutograd"))


def default_dispatch_keys() -> tuple[Any, Any]:
    """The dispatcher's thread-local (include, exclude) key sets outside any mode, read on
    a new thread (inside a dispatch mode's handler every key above it is excluded)."""
    include = require("torch._C._dispatch_tls_local_include_set")
    exclude = require("torch._C._dispatch_tls_local_exclude_set")
    keys: list[Any] = []
    reader = threading.Thread(target=lambda: keys.extend([include(), exclude()]))
    reader.start()
    reader.join()
    return keys[0], keys[1]


#: Runs its block with the given (include, exclude) dispatch key sets.
force_dispatch_keys: Callable[[Any, Any], Any] = get("torch._C._ForceDispatchKeyGuard")
FakeTensorMode: Any = get("torch._subclasses.fake_tensor.FakeTensorMode")
#: The logger the fake mode reports ops it cannot run on (its module's).
FAKE_TENSOR_LOGGER: str = getattr(FakeTensorMode, "__module__", "torch._subclasses.fake_tensor")
tree_leaves: Callable[..., list[Any]] = get("torch.utils._pytree.tree_leaves")
tree_map: Callable[..., Any] = get("torch.utils._pytree.tree_map")

_own_parameters = get("torch.nn.Module._parameters")


def own_parameters(module: torch.nn.Module) -> Iterator[torch.nn.Parameter | None]:
    """A module's own parameters (None where one is unset), without the generator chain
    ``parameters(recurse=False)`` builds (set-up reads every module of the model)."""
    return iter(_own_parameters(module).values())


def forget_hook_kwargs_flag(stack: ExitStack, handle: Any) -> None:
    """On ``stack``'s close, take a global forward hook's ``with_kwargs`` flag out of
    torch's table: ``handle.remove()`` leaves it behind."""
    flags = require("torch.nn.modules.module._global_forward_hooks_with_kwargs")
    stack.callback(flags.pop, handle.id, None)


def optimized_module_type() -> type | None:
    """torch.compile's wrapper class; None while Dynamo was never imported (nothing in
    this process can have been compiled, and importing it costs most of a second)."""
    if "torch._dynamo" not in sys.modules:
        return None
    return require("torch._dynamo.eval_frame.OptimizedModule")  # type: ignore[no-any-return]


def eager_of(model: Any) -> Any:
    """The eager module a torch.compile wrapper holds (``_orig_mod``)."""
    return require("torch._dynamo.eval_frame.OptimizedModule._orig_mod")(model)


_compiled_impl = get("torch.nn.Module._compiled_call_impl")


def compiled_in_place(module: torch.nn.Module) -> bool:
    """Whether ``module.compile()`` was called on it."""
    if not _compiled_impl:
        if hasattr(torch.nn.Module, "compile"):  # it compiles in place somewhere else now
            raise _compiled_impl.error()
        return False  # tolerated: a torch without Module.compile() compiles nothing in place
    return getattr(module, "_compiled_call_impl", None) is not None


@contextmanager
def swapped_attribute(owner: Any, name: str, value: Any) -> Iterator[None]:
    """While it runs, ``owner``'s own attribute ``name`` is ``value``; put back as it was
    after (set, or absent), whatever happens meanwhile."""
    state = owner.__dict__
    missing = object()
    saved = state.get(name, missing)
    state[name] = value
    try:
        yield
    finally:
        if saved is missing:
            state.pop(name, None)
        else:
            state[name] = saved


def compiled_call_swapped(module: torch.nn.Module, call: Callable[..., Any] | None) -> Any:
    """While it runs, ``module`` (compiled in place by ``module.compile()``) calls
    ``call`` instead of its compiled call (None: its eager ``forward``, with its hooks)."""
    return swapped_attribute(module, "_compiled_call_impl", call)


# -- torch's profiler -----------------------------------------------------------------------

#: A cheap ``record_function`` range (a context manager) on the profiler's clock.
FastRange: Any = get("torch._C._profiler._RecordFunctionFast")
profiler_enabled: Callable[[], bool] = get("torch.autograd._profiler_enabled")


def profiler_free() -> bool:
    """Whether torch's profiler can be started here (none runs: only one can)."""
    if not FastRange:
        raise FastRange.error()
    return not profiler_enabled()


def _member(name: str, member: str) -> Any:
    found = get(name)
    return getattr(found, member) if found else None


#: ``record_function`` ranges' scope: labels, not ops.
USER_SCOPE: Any = _member("torch._C._profiler.RecordScope", "USER_SCOPE")
EVENT_TORCH_OP: Any = _member("torch._C._profiler._EventType", "TorchOp")
EVENT_PY_CALL: Any = _member("torch._C._profiler._EventType", "PyCall")
EVENT_ALLOCATION: Any = _member("torch._C._profiler._EventType", "Allocation")
PYTHON_EVENTS: tuple[Any, ...] = (EVENT_PY_CALL, _member("torch._C._profiler._EventType", "PyCCall")) if EVENT_PY_CALL else ()
CPU_DEVICE: Any = _member("torch._C._autograd.DeviceType", "CPU")


def profiler_config(record_shapes: bool, profile_memory: bool, with_stack: bool) -> Any:
    """torch's profiler's configuration: Kineto, with these options, and overload names
    when recording shapes (tolerated: without them op rows take default overloads)."""
    for name in ("torch._C._profiler.ProfilerConfig", "torch._C._profiler.ProfilerState", "torch._C._profiler._ExperimentalConfig"):
        require(name)
    experimental = torch._C._profiler._ExperimentalConfig
    if record_shapes and get("torch._C._profiler._ExperimentalConfig(capture_overload_names=)"):
        options = experimental(capture_overload_names=True)
    else:
        options = experimental()
    return torch._C._profiler.ProfilerConfig(
        torch._C._profiler.ProfilerState.KINETO, record_shapes, profile_memory, with_stack, False, False, options
    )


def prepare_profiler(config: Any, activities: set[Any]) -> None:
    require("torch.autograd.profiler._prepare_profiler")(config, activities)


def enable_profiler(config: Any, activities: set[Any]) -> None:
    require("torch.autograd.profiler._enable_profiler")(config, activities)


def disable_profiler() -> Any:
    """Stop torch's profiler; its result (``events()``, ``experimental_event_tree()``)."""
    return require("torch.autograd.profiler._disable_profiler")()


def event_tree(result: Any) -> list[Any]:
    """The roots of a profiler result's event tree (``_ProfilerEvent``s)."""
    require("torch._C._profiler._ProfilerEvent")
    require("torch._C._profiler._ExtraFields_TorchOp")
    return result.experimental_event_tree()  # type: ignore[no-any-return]


_concrete = get("torch._C._autograd._KinetoEvent.concrete_inputs")


def concrete_inputs(event: Any) -> list[Any] | None:
    """An event's concrete inputs (int lists), or None where this torch records none."""
    if not _concrete:
        return None  # tolerated: missing_meta() says so
    return event.concrete_inputs()  # type: ignore[no-any-return]


def open_profiler_range(name: str) -> Any:
    """Open a ``record_function`` range (its handle, for :func:`close_profiler_range`)."""
    return require("torch.ops.profiler._record_function_enter_new")(name, None)


def close_profiler_range(handle: Any) -> None:
    require("torch.ops.profiler._record_function_exit._RecordFunction")(handle)


def schedule_settings(value: Callable[[int], Any]) -> dict[str, Any] | None:
    """``torch.profiler.schedule(...)``'s settings (wait, warmup, active, repeat,
    skip_first), read from its closure; None for one that cannot be read that way
    (then it is asked step by step)."""
    settings = get("torch.profiler.schedule closure (wait, warmup, active, repeat, skip_first)")
    return settings(value) if settings else None


# -- torch.compile ------------------------------------------------------------------------


def current_compile_frame() -> str:
    """``"frame_id/frame_compile_id"`` of the Dynamo frame compiling now, ``"?"`` if none."""
    compile_id = require("torch._guards.CompileContext").current_compile_id()
    return f"{compile_id.frame_id}/{compile_id.frame_compile_id}" if compile_id is not None else "?"


def require_compiled_profiling() -> None:
    """Raise :class:`MissingTorchAPI` unless this torch has everything profiling a
    compiled model needs (checked before compiling: a backend's error reaches the user
    wrapped in Dynamo's)."""
    for name, entry in PRIVATE.items():
        if entry.need.startswith(_COMPILED):
            require(name)


def compile_with_provenance(
    gm: Any, example_inputs: Any, on_graph: Callable[[Any, bool], None], settings: dict[str, Any] | None = None,
) -> Any:
    """Inductor's compile of a Dynamo graph with provenance tracking (kernel -> FX nodes)
    and a profiler range per generated kernel; ``on_graph(graph, is_backward, compiled)``
    sees each forward and backward graph Inductor compiled, after its post-grad passes,
    and what Inductor made of it (``name_graph_calls`` names its calls' ranges).

    The settings reach the backward too: they are ``compile_fx``'s ``config_patches``
    (which it re-enters around the inner compile), and the backward is compiled with the
    forward, not lazily at the first ``backward()``: a lazy compile runs outside
    Inductor's provenance tracking and dumps an empty map. Both caches are off.
    AOTAutograd's, so ``on_graph`` sees every graph (a hit would skip the inner
    compile). Inductor's graph cache, because a hit replays the provenance map of the
    graph first compiled under its key: the key is the same for a structurally identical
    graph of another model (another process's, from the cache on disk), whose Dynamo
    node names the map holds, and every kernel would lose its module."""
    compile_fx = require("torch._inductor.compile_fx.compile_fx")
    compile_fx_inner = require("torch._inductor.compile_fx.compile_fx_inner")
    require("torch._functorch.config.force_non_lazy_backward_lowering")
    require("torch._functorch.config.enable_autograd_cache")
    functorch_config = _resolve("torch._functorch.config")

    def inner_compile(graph: Any, inputs: Any, **kwargs: Any) -> Any:
        compiled = compile_fx_inner(graph, inputs, **kwargs)
        on_graph(graph, bool(kwargs.get("is_backward", False)), compiled)
        return compiled

    # The user's own Inductor settings (``settings``: a mode's and ``options=``), and layerscope's.
    patches = {
        **(settings or {}), "trace.provenance_tracking_level": 1, "cpp.enable_kernel_profile": True,
        "fx_graph_cache": False, "fx_graph_remote_cache": False,
    }
    with functorch_config.patch(force_non_lazy_backward_lowering=True, enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=patches)


def name_graph_calls(compiled: Any, key: str) -> None:
    """Name the profiler range around each call of a graph Inductor compiled for
    layerscope (``## Call CompiledFxGraph <key> ##``): its cache key names it, which is
    None with Inductor's graph cache off."""
    require("torch._inductor.output_code: '## Call CompiledFxGraph {self._fx_graph_cache_key} ##'")
    compiled._fx_graph_cache_key = key


def python_profiler_flag(running: bool) -> None:
    """Set Python's flag that torch's profiler runs (``_is_profiler_enabled``), as
    torch.profiler does around its session: Inductor records its graph calls' and
    Triton kernels' ranges only while it is set."""
    require(f"torch.autograd.profiler._run_on_profiler_{'start' if running else 'stop'}")()


def _compile_context(model: Any) -> Any:
    """The Dynamo context ``torch.compile`` made for ``model``: its wrapper's
    (``torch.compile(model)``), or the one held by the call ``model.compile()`` set."""
    if isinstance(model, require("torch._dynamo.eval_frame.OptimizedModule")):
        return model.dynamo_ctx
    return require("torch.compile(fn)'s Dynamo context, in its wrapper's closure")(model._compiled_call_impl)


def compile_request(model: Any) -> tuple[str, dict[str, Any], bool]:
    """How ``torch.compile(model, ...)`` or ``model.compile(...)`` was asked: the
    backend's name (``inductor`` for the default), its Inductor settings (the mode's and
    ``options=``'s) and ``fullgraph``."""
    context = _compile_context(model)
    backend = require("torch._dynamo.eval_frame.innermost_backend")(context.callback)
    fullgraph = bool(require("torch._dynamo.eval_frame._TorchDynamoContext.fullgraph")(context))
    if isinstance(backend, require("torch._TorchCompileInductorWrapper")):
        return "inductor", dict(backend.config or {}), fullgraph
    name = getattr(backend, "compiler_name", None) or getattr(backend, "__name__", None) or type(backend).__name__
    return str(name), {}, fullgraph


def forward_module_stack(node: Any) -> Any:
    """A backward graph node's forward module stack (``nn_module_stack``'s form), which
    AOTAutograd copies from the forward node of the same ``seq_nr``; for a forward node
    recomputed in the backward, its own; None when neither is known (gradient
    accumulation, the graph's inputs and outputs)."""
    require("torch._functorch._aot_autograd.utils: 'fwd_nn_module_stack'")
    return node.meta.get("fwd_nn_module_stack") or node.meta.get("nn_module_stack")


def compilation_metrics() -> list[Any]:
    """Dynamo's compilation metrics so far (``entire_frame_compile_time_s`` each)."""
    return list(require("torch._dynamo.utils.get_compilation_metrics")())


def compile_mark() -> Any:
    """A mark of the frames Dynamo has compiled so far, for :func:`compiled_since` (None
    before any; asking does not import Dynamo, which compiles nothing before it is)."""
    if "torch._dynamo" not in sys.modules:
        return None
    metrics = compilation_metrics()
    return metrics[-1] if metrics else None


def compiled_since(mark: Any) -> list[Any]:
    """The compilation metrics of the frames Dynamo compiled since ``mark``. torch keeps
    the last 64: a mark older than those gives them all. (A count of them is no mark:
    past 64 compiles in a process it stops changing.)"""
    if "torch._dynamo" not in sys.modules:
        return []
    metrics = compilation_metrics()
    for at in range(len(metrics) - 1, -1, -1):
        if metrics[at] is mark:
            return metrics[at + 1 :]
    return metrics


def structured_trace_logger() -> Any:
    """The logger torch's structured trace (tlparse's input) goes to."""
    return require("torch._logging._internal.trace_log")


# -- distributed, zoo --------------------------------------------------------------------------


def default_store() -> Any:
    """The default process group's key-value store; None where torch has no way to get it
    (tolerated: the run id then goes out by broadcast)."""
    getter = get("torch.distributed.distributed_c10d._get_default_store")
    return getter() if getter else None


#: An assertion torch.fx and torch.compile trace (``torch._assert``).
symbolic_assert: Callable[[Any, str], None] = get("torch._assert")


