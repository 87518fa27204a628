"""Timing a ``torch.compile``d model (Inductor) and reading where its kernels came from.

Module hooks cannot time a compiled model: Dynamo traces them into the graph. So the
eager module is compiled once more, by layerscope, with two Inductor settings that cost
nothing at run time: provenance tracking (which FX nodes each kernel holds) and a
``record_function`` range per generated kernel. Its passes then run under torch's
profiler, with no hook on any module.

What is read, all in the process, nothing written to disk:

- each Dynamo graph's nodes and the module each came from (``nn_module_stack``), in
  layerscope's backend, which then hands the graph to Inductor's ``compile_fx``;
- from torch's structured trace (a handler on the ``torch.__trace`` logger): each
  Inductor graph's wrapper code (whose ``# [Provenance debug handles]`` lines give the
  kernel calls in order) and its provenance map (kernel call -> post-grad nodes ->
  Dynamo nodes), closed by layerscope's own record of the graph with the key it gives
  it (Inductor's graph cache is off: a hit would replay another graph's provenance),
  and the graph breaks with where they happened;
- each pass's profiler events: under every ``## Call CompiledFxGraph <key> ##`` range,
  its kernels' ranges in call order.

All of it is handed on as ``layerscope.model.raw``'s typed records (:class:`CompiledCapture`).

These are torch's private formats and functions, reached through ``capture/_torch.py``:
a torch that lacks one (before 2.9, or a later release that changed it) refuses the
compiled profile with ``MissingTorchAPI`` naming it. A kernel whose provenance is
missing from a torch that has them all has no module (``attribute/compiled.py`` then
leaves its time with the model as a whole).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from layerscope.base.errors import ModelError, ProfilerStateError
from layerscope.capture import _torch
from layerscope.capture.inputs import shapes_of
from layerscope.capture.kineto import (
    PendingRead,
    profiler_activities,
    profiler_held,
    profiler_session,
    quiet_profiler,
    read_before_next_session,
)
from layerscope.capture.modules import autocast_dtype, eager_hint, eager_module, model_device
from layerscope.capture.torch_events import read_window
from layerscope.convert.compiled import FORWARD_RANGE, LOSS_RANGE, MODULE_RANGE, STEP_RANGE, compiled_passes
from layerscope.model.raw import (
    CompiledCapture,
    CompiledGraph,
    CompiledPass,
    GraphBreak,
    GraphNode,
)

_HANDLE = re.compile(r"# \[Provenance debug handles\] (\S+):(\d+)")


def module_path(stack_key: str) -> str:
    """``L['self'].blocks[0].fc1`` (Dynamo's name of a module) -> ``blocks.0.fc1``. The
    frame's first local is named as its code names it: ``L['self']`` in a ``forward``,
    ``L['fn']`` for a module compiled whole (``torch.compile(nn.Sequential(...))``)."""
    path = re.sub(r"^L\['[^']*'\]", "", stack_key)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\[['\"]([^'\"]+)['\"]\]", r".\1", path)
    path = path.replace("._modules.", ".")
    return path.lstrip(".")


class _Collector(logging.Handler):
    """Torch's structured-trace records, kept in memory."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[tuple[dict[str, Any], Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((getattr(record, "metadata", {}) or {}, getattr(record, "payload", None)))


#: The collectors reading the structured trace now (``_structured_trace``).
_ACTIVE: list[_Collector] = []
#: The record that closes a graph's records in the trace: layerscope's own, added when
#: Inductor hands the graph back, with the key its calls' ranges carry.
GRAPH_RECORD = "layerscope_graph"


@contextlib.contextmanager
def _structured_trace() -> Iterator[_Collector]:
    logger = _torch.structured_trace_logger()
    collector = _Collector()
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # the records are layerscope's, not the application's logs
    logger.addHandler(collector)
    _ACTIVE.append(collector)
    try:
        yield collector
    finally:
        _ACTIVE.remove(collector)
        logger.removeHandler(collector)
        logger.setLevel(level)
        logger.propagate = propagate


def _frame(metadata: dict[str, Any]) -> str:
    return f"{metadata.get('frame_id')}/{metadata.get('frame_compile_id')}"


class _Compiler:
    """layerscope's Dynamo backend (the callable ``torch.compile`` is given), one for the process: Dynamo keeps a compiled frame
    per backend callable, so a second profile of a model reuses the first's graphs (a
    new backend per profile would compile again, and after 8 Dynamo gives up on the
    code). It notes each graph node's module, then compiles with Inductor, provenance
    tracking and per-kernel ranges on."""

    def __init__(self) -> None:
        #: frame -> Dynamo node name -> named_modules() path, for the compiles of a run
        self.node_modules: dict[str, dict[str, str]] = {}
        #: frame -> each graph Inductor compiled for it, in order: its phase, and for a
        #: backward graph each post-grad node's module (its forward's)
        self.inductor_graphs: dict[str, list[tuple[str, dict[str, str]]]] = {}
        self.compiles = 0
        #: Graphs Inductor compiled for layerscope in this process: each one's key.
        self.graphs_made = 0
        #: The Inductor settings compiles meanwhile use (the user's mode and options).
        self.settings: dict[str, Any] = {}
        self._tensors: dict[int, str] = {}
        self._types: dict[type, list[str]] = {}

    @contextlib.contextmanager
    def model(self, eager: nn.Module, settings: dict[str, Any] | None = None) -> Iterator[None]:
        """Compiles meanwhile are of ``eager``, with Inductor's ``settings``: name their
        nodes' modules by its paths."""
        self.node_modules = {}
        self.inductor_graphs = {}
        self.settings = dict(settings or {})
        self._tensors = {id(t): name for name, t in (*eager.named_parameters(), *eager.named_buffers())}
        self._types = {}
        for path, module in eager.named_modules():
            self._types.setdefault(type(module), []).append(path)
        try:
            yield
        finally:
            self._tensors, self._types, self.settings = {}, {}, {}

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        self.compiles += 1
        frame = _torch.current_compile_frame()
        prefix, residue = self._prefix(gm, example_inputs)

        def path_of(stack: dict[str, Any]) -> str:
            assert prefix is not None
            return _joined(prefix, _within(module_path(list(stack.values())[-1][0]), residue))

        names: dict[str, str] = {}
        if prefix is not None:
            for node in gm.graph.nodes:
                stack = node.meta.get("nn_module_stack") or {}
                # A node of the frame's own code (no module call around it) is its self's.
                names[node.name] = path_of(stack) if stack else prefix
        self.node_modules[frame] = names
        graphs = self.inductor_graphs.setdefault(frame, [])

        def on_graph(graph: torch.fx.GraphModule, is_backward: bool, compiled: Any) -> None:
            # Each post-grad node's module: a backward node's forward's; a forward node's
            # own, for the nodes the provenance map leaves without a Dynamo node (a
            # checkpointed region's, traced whole).
            modules: dict[str, str] = {}
            if prefix is not None:
                for node in graph.graph.nodes:
                    stack = _torch.forward_module_stack(node)
                    if stack:
                        modules[node.name] = path_of(stack)
            graphs.append(("backward" if is_backward else "forward", modules))
            # The graph's code and provenance are in the trace by now: this record closes
            # them, under the key its calls' ranges will carry.
            self.graphs_made += 1
            key = f"layerscope-{self.graphs_made}"
            _torch.name_graph_calls(compiled, key)
            frame_id, _, compile_id = frame.partition("/")
            for collector in _ACTIVE:
                collector.records.append(
                    ({GRAPH_RECORD: {"key": key}, "frame_id": frame_id, "frame_compile_id": compile_id}, None)
                )

        return _torch.compile_with_provenance(gm, example_inputs, on_graph, self.settings)

    def _prefix(self, gm: torch.fx.GraphModule, example_inputs: Any) -> tuple[str | None, str]:
        """Where this frame's ``self`` sits in the model, and how Dynamo's names of its
        modules begin (``_within``). Dynamo names modules from the compiled frame's
        ``self``, which is a submodule when a graph break restarted tracing inside it,
        and is reached through the frame's arguments when the frame is a decorator's
        wrapper (``L['args'][0].model.layers[0]``: the names begin with ``0``). Found
        from a parameter the graph takes (its path in the model against its path from
        ``self``), else from a model type only one module has, else (the model's own
        frame) from every module the graph names being at that path in the model; a
        prefix of None when none tells."""
        placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
        for node, value in zip(placeholders, example_inputs):
            name = self._tensors.get(id(value))
            stack = node.meta.get("nn_module_stack") or {}
            if name is None or not stack:
                continue
            owner = name.rpartition(".")[0]
            relative = module_path(list(stack.values())[-1][0])
            if relative == owner or owner.endswith("." + relative) or not relative:
                return owner[: len(owner) - len(relative)].rstrip("."), ""
            if relative.endswith("." + owner) or not owner:
                # The names begin with how the frame reaches the model (a wrapper's args).
                return "", relative[: len(relative) - len(owner)].rstrip(".")
        named: set[str] = set()
        for node in gm.graph.nodes:
            for key, kind in (node.meta.get("nn_module_stack") or {}).values():
                if module_path(key) == "":
                    paths = self._types.get(kind, [])
                    return (paths[0] if len(paths) == 1 else None), ""
                named.add(module_path(key))
        # The model's own frame, whose stacks name its submodules but never itself (no
        # parameter placeholder carries a stack): every module the graph names is where
        # the model has it.
        known = {path for paths in self._types.values() for path in paths}
        if named and named <= known:
            return "", ""
        return None, ""


def _within(path: str, residue: str) -> str:
    """``path`` (a module's name as Dynamo built it) from the frame's ``self`` on: without
    ``residue``, how the frame reached ``self`` (``0`` for ``L['args'][0]``)."""
    if not residue:
        return path
    if path == residue:
        return ""
    return path[len(residue) + 1 :] if path.startswith(residue + ".") else path


def _joined(prefix: str, path: str) -> str:
    return ".".join(part for part in (prefix, path) if part)


def _graphs(
    records: list[tuple[dict[str, Any], Any]], node_modules: dict[str, dict[str, str]],
    inductor_graphs: dict[str, list[tuple[str, dict[str, str]]]] | None = None,
) -> dict[str, CompiledGraph]:
    """Each Inductor graph, from its structured-trace records: a graph's code and
    provenance arrive before layerscope's record of it (``GRAPH_RECORD``), which names
    its key. A frame's graphs arrive in the order Inductor compiled them
    (``inductor_graphs``: the forward, then its backward): a backward graph's kernels
    hold backward nodes, whose modules are their forward's, not the Dynamo nodes the
    provenance map's ``postToPre`` names (that map is the forward's)."""
    graphs: dict[str, CompiledGraph] = {}
    pending: dict[str, dict[str, Any]] = {}
    seen: dict[str, int] = {}
    for metadata, payload in records:
        if not metadata:
            continue
        kind = next(iter(metadata))
        frame = _frame(metadata)
        info = metadata[kind] if isinstance(metadata[kind], dict) else {}
        name = info.get("name", kind)
        current = pending.setdefault(frame, {})
        if kind == "inductor_output_code":
            current["code"] = payload or ""
        elif name == "inductor_provenance_tracking_node_mappings":
            current["provenance"] = json.loads(payload or "{}")
        elif kind == GRAPH_RECORD:
            key = info.get("key")
            order = (inductor_graphs or {}).get(frame, [])
            n = seen[frame] = seen.get(frame, -1) + 1
            phase, post_modules = order[n] if n < len(order) else ("forward", {})
            if key and phase == "backward":
                graphs[key] = _backward_graph(key, frame, current, post_modules)
            elif key:
                graphs[key] = _graph(key, frame, current, node_modules.get(frame, {}), post_modules)
            pending[frame] = {}
    return graphs


def _graph(
    key: str, frame: str, found: dict[str, Any], node_modules: dict[str, str], post_modules: dict[str, str] | None = None,
) -> CompiledGraph:
    """A forward graph: each kernel call's post-grad nodes, each with the module of the
    Dynamo node the provenance map's ``postToPre`` names, else its own
    (``post_modules``: the post-grad node's ``nn_module_stack``)."""
    code = found.get("code", "")
    body = code[code.find("def call(") :]
    calls = [f"{name}:{handle}" for name, handle in _HANDLE.findall(body)]
    provenance = found.get("provenance") or {}
    to_post = provenance.get("cppCodeToPost") or {}
    post_to_pre = provenance.get("postToPre") or {}
    nodes = {}
    for call in calls:
        posts = to_post.get(call, ())
        nodes[call] = [GraphNode(post, _module_of(post, post_to_pre, node_modules, post_modules or {})) for post in posts]
    return CompiledGraph(key, frame, calls, nodes, set(node_modules.values()))


def _module_of(
    post: str, post_to_pre: dict[str, Any], node_modules: dict[str, str], post_modules: dict[str, str],
) -> str | None:
    """A forward post-grad node's module: its Dynamo node's (``""``: the frame's own
    code, the model's), else its own, else None."""
    found = next((node_modules.get(pre) for pre in post_to_pre.get(post, ())), None)
    return found if found is not None else post_modules.get(post)


def _backward_graph(key: str, frame: str, found: dict[str, Any], node_modules: dict[str, str]) -> CompiledGraph:
    """A backward graph: each kernel call's post-grad nodes (the provenance map's
    ``cppCodeToPost``), each with its forward's module (``node_modules``)."""
    code = found.get("code", "")
    calls = [f"{name}:{handle}" for name, handle in _HANDLE.findall(code[code.find("def call(") :])]
    to_post = (found.get("provenance") or {}).get("cppCodeToPost") or {}
    nodes = {call: [GraphNode(post, node_modules.get(post)) for post in to_post.get(call, ())] for call in calls}
    return CompiledGraph(key, frame, calls, nodes, set(node_modules.values()), phase="backward")


def _graph_breaks(records: list[tuple[dict[str, Any], Any]]) -> list[GraphBreak]:
    breaks = []
    for metadata, payload in records:
        if not metadata:
            continue
        kind = next(iter(metadata))
        info = metadata[kind] if isinstance(metadata[kind], dict) else {}
        if info.get("name") == "dynamo_graph_break_reason":
            text = str(payload or "")
            where = re.search(r"Graph break in user code at (\S+:\d+)", text)
            reason = re.search(r"Graph Break Reason: (.+)", text)
            breaks.append(GraphBreak(
                where.group(1) if where else "",
                (reason.group(1) if reason else text.splitlines()[0] if text else "").strip(),
            ))
    return breaks


@contextlib.contextmanager
def _eager_ranges(eager: nn.Module, paths: list[str]) -> Iterator[None]:
    """A profiler range around each call of the modules at ``paths`` (ones that ran
    eagerly, outside every compiled graph); removed on exit."""
    modules = dict(eager.named_modules())
    stack = contextlib.ExitStack()
    with stack:
        for path in paths:
            name = MODULE_RANGE + path
            handles: list[Any] = []

            def enter(module: nn.Module, inputs: Any, name: str = name, handles: list[Any] = handles) -> None:
                handles.append(_torch.open_profiler_range(name))

            def leave(module: nn.Module, inputs: Any, output: Any, handles: list[Any] = handles) -> None:
                if handles:
                    _torch.close_profiler_range(handles.pop())

            stack.callback(modules[path].register_forward_pre_hook(enter).remove)
            stack.callback(modules[path].register_forward_hook(leave, always_call=True).remove)
        yield


_COMPILER = _Compiler()
#: Distinct input shapes a block tells apart (more are only "not the counted ones").
_MAX_SHAPES = 1024
#: The graphs layerscope compiled, by key (a later profile of the same model meets them
#: again with no compile, so nothing new is traced): the newest few hundred.
_GRAPHS: OrderedDict[str, CompiledGraph] = OrderedDict()
_MAX_GRAPHS = 512
#: Per model, what its compile said: graph breaks and compile time.
_COMPILES: weakref.WeakKeyDictionary[nn.Module, tuple[list[GraphBreak], int]] = weakref.WeakKeyDictionary()


def _keep_graphs(records: list[tuple[dict[str, Any], Any]]) -> None:
    """The graphs the structured trace's ``records`` describe, kept in ``_GRAPHS``."""
    for key, graph in _graphs(records, _COMPILER.node_modules, _COMPILER.inductor_graphs).items():
        _GRAPHS[key] = graph
        _GRAPHS.move_to_end(key)
    while len(_GRAPHS) > _MAX_GRAPHS:
        _GRAPHS.popitem(last=False)


class _Session:
    """torch's profiler as the eager windows run it (its C++ entry points), recording
    ranges and, on a GPU, device work: no shapes, memory or stacks. Its result is read
    by the capture's adapter (``torch_events.read_window``) and converted by
    ``convert/compiled.py``, the way every window is."""

    def __init__(self, *, has_device: bool) -> None:
        self.has_device = has_device

    def start(self) -> None:
        config = _torch.profiler_config(False, False, False)
        activities = profiler_activities(self.has_device)
        with quiet_profiler():
            _torch.prepare_profiler(config, activities)
            _torch.python_profiler_flag(True)
            try:
                _torch.enable_profiler(config, activities)
            except BaseException:
                _torch.python_profiler_flag(False)
                raise

    def stop(self) -> Any:
        try:
            with quiet_profiler():
                return _torch.disable_profiler()
        finally:
            _torch.python_profiler_flag(False)

    def passes(self, result: Any) -> list[CompiledPass]:
        window = read_window(result, has_device=self.has_device, detail=False)
        return compiled_passes(window.roots, window.kernels, has_device=self.has_device)


def _profiled(
    call: Callable[[], Any], passes: int = 1, progress: Callable[[int], None] | None = None,
    prepare: Callable[[], None] = lambda: None, has_device: bool = False,
) -> list[CompiledPass]:
    """``passes`` calls, each in a ``STEP_RANGE`` range (``prepare``d outside it), in one
    session of torch's profiler; the session's first call, which pays for the profiler's
    start (a few hundred µs on a small model), is made first and not measured."""
    session = _Session(has_device=has_device)
    # One session of torch's profiler per process: held until its events are read.
    with profiler_held():
        session.start()
        try:
            prepare()
            call()
            for n in range(passes):
                prepare()
                # torch's C++ range, not record_function's op: the range is the call's time,
                # and a Python op around it would add its own tens of µs to every call.
                with _torch.FastRange(STEP_RANGE):
                    call()
                if progress is not None:
                    progress(n + 1)
        finally:
            result = session.stop()
        return session.passes(result)


def time_compiled(
    eager: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, warmup: int, repeat: int,
    working: set[str], progress: Callable[[str, int, int], None],
    loss: Callable[[Any], torch.Tensor] | None = None, clear_grads: Callable[[], None] = lambda: None,
) -> CompiledCapture:
    """Compile ``eager`` with layerscope's backend, call it ``warmup`` times (the first
    compiles, unless an earlier profile did), then ``repeat`` times under torch's
    profiler. With ``loss`` each call is a training step: the forward, ``loss(output)``
    in a ``LOSS_RANGE`` range, and its backward (the compiled backward graphs), each
    step from gradients cleared by ``clear_grads`` (outside its range).

    The modules of ``working`` (those with ops of their own in the eager pass) that no
    graph holds ran eagerly, between graphs: they get a profiler range each, as an
    eager profile's modules do. If that made Dynamo compile again (a hook on a module it
    traces), the ranges are dropped and those modules' time stays with the root."""
    _torch.require_compiled_profiling()
    compiled = torch.compile(eager, backend=_COMPILER)

    def call() -> None:
        output = compiled(*args, **kwargs)
        if loss is not None:
            with _torch.FastRange(LOSS_RANGE):
                value = loss(output)
            del output
            value.backward()

    def step() -> None:
        clear_grads()
        call()

    with _COMPILER.model(eager):
        before = _torch.compile_mark()
        compiles = _COMPILER.compiles
        with _structured_trace() as collector:
            start = time.perf_counter_ns()
            step()
            first_ns = time.perf_counter_ns() - start
        if _COMPILER.compiles != compiles:
            metrics = _torch.compiled_since(before)
            compile_s = sum(m.entire_frame_compile_time_s or 0.0 for m in metrics)
            _COMPILES[eager] = (_graph_breaks(collector.records), round(compile_s * 1e9) if compile_s else first_ns)
            _keep_graphs(collector.records)
        progress("warmup", 1, warmup + 1)
        for n in range(warmup):
            step()
            progress("warmup", n + 2, warmup + 1)
        on_device = model_device(eager).type == "cuda"
        keys = {graph_call.graph for graph_call in _profiled(call, prepare=clear_grads)[0].graph_calls}
        graphs = {key: _GRAPHS[key] for key in keys if key in _GRAPHS}
        if not graphs:
            raise ModelError(
                "torch.compile made no Inductor graph of this model that layerscope can read (nothing to time "
                "per module); time it whole with layerscope.benchmark(..., compile=True)"
            )
        if loss is not None and not any(graph.phase == "backward" for graph in graphs.values()):
            raise ModelError(
                "torch.compile made no backward graph of this model that layerscope can read (its backward cannot "
                "be timed per module); profile model._orig_mod for the eager training step"
            )
        traced = {path for graph in graphs.values() if graph.phase == "forward" for path in graph.modules}
        outside = sorted(working - traced)
        with contextlib.ExitStack() as ranges:
            if outside:
                compiles = _COMPILER.compiles
                ranges.enter_context(_eager_ranges(eager, outside))
                step()
                if _COMPILER.compiles != compiles:  # the hooks were traced: drop them
                    ranges.close()
                    outside = []
            passes = _profiled(
                call, repeat, lambda done: progress("measure", done, repeat), prepare=clear_grads, has_device=on_device,
            )
    breaks, compile_ns = _COMPILES.get(eager, ([], 0))
    return CompiledCapture(graphs, passes, breaks, compile_ns, len({g.frame for g in graphs.values()}))


def known_graphs() -> dict[str, CompiledGraph]:
    """The graphs layerscope's compiles made in this process (the newest few hundred), by key."""
    return dict(_GRAPHS)


#: Called with each stopped window of a compiled model's block, as it is read: the
#: step numbers, torch's result and whether device work was recorded
#: (``capture/replay.py``'s ``CompiledRecorder``).
RESULT_OBSERVERS: list[Callable[[list[int], Any, bool], None]] = []


class CompiledSteps:
    """A ``Profiler`` block's steps around a model compiled whole
    (``torch.compile(model)``), recorded from its kernels.

    While the block runs, calls of the compiled model go through layerscope's compile
    of the same eager module (its backend: Inductor with the user's mode and options,
    plus provenance tracking and a range per kernel), each call in a ``FORWARD_RANGE``
    range; the wrapper's ``forward`` is put back when the block ends, and the user's own
    compiled code is left as it was (Dynamo keeps a compiled frame per backend). So the
    block's first step compiles, unless an earlier block or profile of the model did:
    that step, and any step that recompiles, is noted with its compile time
    (:class:`~layerscope.model.compile_info.StepCompile`), which is never in a step's
    figures.

    Each recorded step (:meth:`begin_step` to :meth:`end_step`) runs in a ``STEP_RANGE``
    range under torch's profiler, started at the first recorded step after a read; steps
    not recorded (a schedule's idle ones) run with nothing installed but the model's
    swapped ``forward``. :meth:`read_window` stops the profiler and gives the window's
    steps as :class:`CompiledPass`es with their parts' ranges (forward calls, the
    autograd engine's nodes, optimizer steps, compiles); the last window is read on
    first use (:meth:`stop`). The inputs of the first call are kept for the eager count
    of the model's FLOPs and shapes."""

    def __init__(self, model: nn.Module) -> None:
        _torch.require_compiled_profiling()
        backend, settings, fullgraph = _torch.compile_request(model)
        if backend != "inductor":
            raise ModelError(
                f"the model is compiled with backend {backend!r}: layerscope times a compiled model per module from "
                "Inductor's kernels, so a Profiler block takes a model compiled with the default backend "
                f"(torch.compile(model) or model.compile(), any mode); profile {eager_hint(model)} for the eager steps"
            )
        self.model = model
        eager = eager_module(model)
        assert eager is not None, "CompiledSteps takes a model compiled as a whole"
        self.eager: nn.Module = eager
        self._settings = settings
        self._fullgraph = fullgraph
        #: The calls of the first recorded step whose every call returned (each call's
        #: positional and keyword arguments): what the eager count runs, as the step ran
        #: them; and whether grad was on.
        self.inputs: list[tuple[tuple[Any, ...], dict[str, Any]]] | None = None
        self.grad_enabled = False
        #: Whether such a step ended (the inputs are let go once counted).
        self.returned = False
        #: Each recorded step's calls, as the numbers of their inputs' shapes among those
        #: met (``_shapes_number``), in call order; the counted step's, and the steps
        #: whose calls differ from it (once it is known, only those are kept: a long run
        #: keeps nothing per step).
        self.counted_inputs: tuple[int, ...] | None = None
        self.step_inputs: dict[int, tuple[int, ...]] = {}
        self._shapes: dict[str, int] = {}
        self._step_calls: list[int] = []
        self._step_kept: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self._step_grad = False
        #: The autocast dtype the counted step's calls ran under on the model's device
        #: (None: no autocast), which the count runs under too.
        self.autocast: str | None = None
        self._step_autocast: str | None = None
        #: Steps that compiled: (step number, compile time in ns, frames compiled, graph breaks).
        self.compiles: list[tuple[int, int, int, int]] = []
        self._stack: contextlib.ExitStack | None = None
        self._collector: _Collector | None = None
        self._session = _Session(has_device=model_device(self.eager).type == "cuda")
        self._running = False
        self._step_range: Any = None
        self._window_steps: list[int] = []
        self._step: int | None = None
        self._compiles = 0
        self._metrics: Any = None
        self._records = 0
        self._parsed = 0
        #: The ranges around modules run eagerly (between graphs), while they are kept,
        #: and the step that tells whether they were traced (a compile in it drops them).
        self._eager_ranges: contextlib.ExitStack | None = None
        self._eager_check = False

    def __enter__(self) -> CompiledSteps:
        stack = contextlib.ExitStack()
        with stack:
            held = stack.enter_context(profiler_session(bounded=False))
            if not held or not _torch.profiler_free():
                raise ProfilerStateError(
                    "torch's profiler is already running (a torch.profiler, or a layerscope block in another thread), "
                    "and a compiled model's block records its kernels with it: profile the compiled model outside it"
                )
            stack.enter_context(_COMPILER.model(self.eager, self._settings))
            self._collector = stack.enter_context(_structured_trace())
            stack.enter_context(self._forward_swapped())
            stack.callback(self._stop_profiler)
            self._stack = stack.pop_all()
        return self

    @contextlib.contextmanager
    def _forward_swapped(self) -> Iterator[None]:
        """The compiled model's calls through layerscope's compile while the block runs:
        its ``forward`` (an attribute torch.compile's wrapper sets) or, for a model
        compiled in place, the call ``model.compile()`` set; put back as they were."""
        in_place = self.eager is self.model
        if in_place:
            # Compiled as model.compile() does, from the module's own call: a compile of
            # the module would call its compiled call, which is this block's.
            compiled_forward = torch.compile(self.eager._call_impl, backend=_COMPILER, fullgraph=self._fullgraph)
        else:
            compiled_forward = torch.compile(self.eager, backend=_COMPILER, fullgraph=self._fullgraph).forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            recording = self._step_range is not None
            if recording:
                self._step_calls.append(self._shapes_number(args, kwargs))
            with _torch.FastRange(FORWARD_RANGE):
                output = compiled_forward(*args, **kwargs)
            if recording and self.counted_inputs is None:  # kept until a step is counted
                if not self._step_kept:
                    self._step_grad = torch.is_grad_enabled()
                    self._step_autocast = autocast_dtype(model_device(self.eager))
                self._step_kept.append((args, dict(kwargs)))
            return output

        swapped = _torch.compiled_call_swapped(self.model, forward) if in_place else \
            _torch.swapped_attribute(self.model, "forward", forward)
        with swapped:
            yield

    def _shapes_number(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        """The number of these inputs' shapes among those met in the block (-1 past
        ``_MAX_SHAPES`` of them: told apart from the counted ones only)."""
        key = repr(shapes_of([list(args), kwargs]))
        found = self._shapes.get(key)
        if found is None:
            if len(self._shapes) >= _MAX_SHAPES:
                return -1
            found = self._shapes[key] = len(self._shapes)
        return found

    def _step_inputs_ended(self, number: int) -> None:
        """The ended step's calls: the counted ones if none are yet and every call of the
        step returned, else kept where they differ from those."""
        calls, self._step_calls = tuple(self._step_calls), []
        kept, self._step_kept = self._step_kept, []
        if self.counted_inputs is None and calls and len(kept) == len(calls):
            self.inputs, self.counted_inputs, self.grad_enabled, self.returned = kept, calls, self._step_grad, True
            self.autocast = self._step_autocast
            self.step_inputs = {n: other for n, other in self.step_inputs.items() if not self._same_calls(other)}
        elif not self._same_calls(calls):
            self.step_inputs[number] = calls

    def _same_calls(self, calls: tuple[int, ...]) -> bool:
        return calls == self.counted_inputs and -1 not in calls

    def other_input_steps(self) -> list[int]:
        """The recorded steps whose calls differ from the counted step's: in number, or
        in their inputs' shapes."""
        return sorted(n for n, calls in self.step_inputs.items() if not self._same_calls(calls))

    def _start(self) -> None:
        self._session.start()
        self._running = True

    def _stop_profiler(self) -> Any:
        """Stop torch's profiler if it runs: its result, else None."""
        if not self._running:
            return None
        self._running = False
        return self._session.stop()

    def begin_step(self, number: int) -> None:
        """Record step ``number`` (torch's profiler started if it is not running)."""
        if not self._running:
            self._start()
        self._step = number
        self._compiles = _COMPILER.compiles
        self._metrics = _torch.compile_mark()
        self._records = len(self._collector.records) if self._collector is not None else 0
        self._step_range = _torch.FastRange(STEP_RANGE)
        self._step_range.__enter__()

    def end_step(self) -> None:
        """End the recorded step (nothing when none is)."""
        step_range, self._step_range = self._step_range, None
        if step_range is None or self._step is None:
            return
        step_range.__exit__(None, None, None)
        self._step_inputs_ended(self._step)
        if _COMPILER.compiles != self._compiles:
            metrics = _torch.compiled_since(self._metrics)
            seconds = sum(m.entire_frame_compile_time_s or 0.0 for m in metrics)
            records = self._collector.records[self._records :] if self._collector is not None else []
            self.compiles.append((self._step, round(seconds * 1e9), len(metrics), len(_graph_breaks(records))))
            if self._eager_check and self._eager_ranges is not None:
                # Dynamo compiled again with the ranges' hooks on: it traced them, so they go
                # (those modules' time stays with the root, as before).
                self._eager_ranges.close()
                self._eager_ranges = None
        self._eager_check = False
        self._window_steps.append(self._step)

    def time_eager_modules(self, paths: list[str]) -> None:
        """From the next recorded step on, a range around each call of the modules at
        ``paths`` (ones with ops that no graph holds: they run eagerly, between graphs),
        as ``profile()`` times them; dropped if Dynamo compiles in that step (it traced
        the hooks), and at the block's end."""
        if self._stack is None or not paths or self._eager_ranges is not None:
            return
        ranges = contextlib.ExitStack()
        ranges.enter_context(_eager_ranges(self.eager, paths))
        self._eager_ranges = ranges
        self._eager_check = True
        self._stack.callback(self._drop_eager_ranges)

    def _drop_eager_ranges(self) -> None:
        ranges, self._eager_ranges = self._eager_ranges, None
        if ranges is not None:
            ranges.close()

    @property
    def eager_modules_timed(self) -> bool:
        """Whether modules run eagerly are timed by ranges of their own now."""
        return self._eager_ranges is not None

    @property
    def window_steps(self) -> int:
        """Steps recorded since the last read."""
        return len(self._window_steps)

    def read_window(self) -> list[tuple[int, CompiledPass]]:
        """Stop torch's profiler and read the steps recorded since the last read (their
        numbers and passes); it starts again at the next recorded step."""
        result = self._stop_profiler()
        steps, self._window_steps = self._window_steps, []
        self._note_graphs()
        if result is None:
            return []
        return self._read(steps, result)

    def _read(self, steps: list[int], result: Any) -> list[tuple[int, CompiledPass]]:
        for observer in RESULT_OBSERVERS:
            observer(steps, result, self._session.has_device)
        return list(zip(steps, self._session.passes(result), strict=False))

    def _note_graphs(self) -> None:
        """The graphs compiled since the last look, kept (``_GRAPHS``) with their breaks."""
        if self._collector is None or _COMPILER.compiles == self._parsed:
            return
        self._parsed = _COMPILER.compiles
        _keep_graphs(self._collector.records)

    def graphs(self) -> dict[str, CompiledGraph]:
        """The graphs layerscope's compiles of this model made (all it knows of)."""
        return known_graphs()

    def graph_breaks(self) -> list[GraphBreak]:
        return _graph_breaks(self._collector.records) if self._collector is not None else []

    def stop(self) -> PendingRead[list[tuple[int, CompiledPass]]]:
        """End the block: its last step ended, torch's profiler stopped and the
        wrapper's ``forward`` put back; the last window's steps are read when first
        asked for (before torch's profiler is next prepared, at the latest)."""

        stack, self._stack = self._stack, None
        try:
            self.end_step()
            self._note_graphs()
        finally:
            result = self._stop_profiler()
            if stack is not None:
                stack.close()
        steps, self._window_steps = self._window_steps, []

        def read() -> list[tuple[int, CompiledPass]]:
            return self._read(steps, result) if result is not None else []

        pending = PendingRead(read)
        if RESULT_OBSERVERS:
            pending.streams()  # an observer sees the window while it is installed
        else:
            read_before_next_session(pending)
        return pending
