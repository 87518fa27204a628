"""The module table of a model: one entry per unique module, parameters counted once."""

from __future__ import annotations

import contextlib
import gc
import itertools
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from layerscope.base.errors import LayerscopeWarning, ModelError
from layerscope.base.peaks import datasheet_tflops, given_peak_flops_per_s
from layerscope.capture import _torch
from layerscope.capture.inputs import dtype_name
from layerscope.capture.memory import packed_weights
from layerscope.model.raw import ModuleInfo

if TYPE_CHECKING:
    from layerscope.traces.modules import ModelTable


def require_module(model: object) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise ModelError(
            f"expected a torch.nn.Module to profile, got {type(model).__module__}."
            f"{type(model).__qualname__}; pass the model object (e.g. MyNet()), not its "
            "class or its output"
        )
    return model


@contextlib.contextmanager
def modes_restored(model: nn.Module) -> Iterator[None]:
    """Put every submodule's train/eval flag back as it was, even if the run raises."""
    modes = [(module, module.training) for module in model.modules()]
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def refuse_meta_timing(model: nn.Module, inputs: Any = None) -> None:
    """Raise :class:`ModelError` if ``model`` (or a tensor in ``inputs``) is on the meta
    device: meta tensors carry shapes but run no kernels, so timing them measures only
    the dispatcher and reports absurd FLOP/s. Counting works there:
    ``layerscope.count_flops``."""
    on_meta = next((t for t in itertools.chain(model.parameters(), model.buffers()) if t.is_meta), None)
    if on_meta is None:
        on_meta = next((t for t in _torch.tree_leaves(inputs) if isinstance(t, torch.Tensor) and t.is_meta), None)
    if on_meta is not None:
        raise ModelError(
            f"{type(model).__name__} runs on the meta device, which runs no kernels: there is no time "
            "to measure. Count its FLOPs, MACs, params and memory without running it: "
            "layerscope.count_flops(model, inputs) (on the command line: layerscope flops SPEC --device meta)"
        )


def _parent_path(path: str) -> str | None:
    if path == "":
        return None
    return path.rsplit(".", 1)[0] if "." in path else ""


def traced_model(model: nn.Module) -> ModelTable:
    """What a trace's modules are matched against, read from ``model`` (never run): its
    modules, each one's own parameters by name and shape, and each parameter once (tied
    ones at their first module) with its size and dtype."""
    from layerscope.traces.modules import ModelTable

    modules, infos, _ = module_table(model)
    params = [[(name, tuple(p.shape)) for name, p in m.named_parameters(recurse=False)] for m in modules]
    seen: set[int] = set()
    tensors: list[list[tuple[tuple[int, ...], int, Any]]] = []
    for module in modules:
        mine = []
        for p in _torch.own_parameters(module):
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            mine.append((tuple(p.shape), p.numel(), p.dtype))
        tensors.append(mine)
    return ModelTable(type(model).__name__, infos, params, tensors)


def module_table(
    model: nn.Module, paths: Sequence[str] | None = None, *, with_repr: bool = True
) -> tuple[list[nn.Module], list[ModuleInfo], int]:
    """The unique modules of ``model`` and their :class:`ModuleInfo`, and the parameter bytes.

    ``named_modules()`` already visits a module reachable under two names once, at its
    first path. A parameter shared by several modules (tied embeddings) is credited to
    the first of them, so every parameter counts once in the tree. ``with_repr`` keeps
    each module's ``extra_repr()`` (for the annotated model view; ~1 µs a module).
    """
    named = list(model.named_modules())
    _refuse_lazy(named)
    all_paths = {path for path, _ in named}
    selected_roots = _check_paths(paths, all_paths)

    seen_params: set[int] = set()
    param_bytes = 0
    modules: list[nn.Module] = []
    infos: list[ModuleInfo] = []
    scripted: set[str] = set()  # paths of TorchScript modules seen so far
    for path, module in named:
        own = 0
        # Not parameters(recurse=False): it builds a generator chain per module, which
        # dominates set-up on models with thousands of modules.
        for param in _torch.own_parameters(module):
            if param is None or id(param) in seen_params:
                continue
            seen_params.add(id(param))
            own += param.numel()
            param_bytes += param.numel() * param.element_size()
        for packed in packed_weights(module):
            own += packed.numel()
            param_bytes += packed.numel() * packed.element_size()
        selected = (selected_roots is None or any(
            root == "" or path == root or path.startswith(root + ".") for root in selected_roots
        )) and not _inside_script(path, scripted)
        if isinstance(module, torch.jit.ScriptModule):
            scripted.add(path)
        modules.append(module)
        infos.append(
            ModuleInfo(
                path=path,
                type=type(module).__name__,
                parent=_parent_path(path),
                depth=0 if path == "" else path.count(".") + 1,
                params=own,
                selected=selected,
                extra_repr=_extra_repr(module) if with_repr else "",
            )
        )
    return modules, infos, param_bytes


def _inside_script(path: str, scripted: set[str]) -> bool:
    """Whether module ``path`` is called from TorchScript: its parent (or an ancestor) is a
    ``ScriptModule``, whose code calls its submodules without Python, so no hook sees them."""
    parent = _parent_path(path)
    while parent is not None:
        if parent in scripted:
            return True
        parent = _parent_path(parent)
    return False


def unseen_modules(infos: list[ModuleInfo], modules: list[nn.Module]) -> list[str]:
    """The paths of modules called from TorchScript (:func:`_inside_script`)."""
    scripted = {info.path for info, module in zip(infos, modules) if isinstance(module, torch.jit.ScriptModule)}
    return [info.path for info in infos if _inside_script(info.path, scripted)]


def _refuse_lazy(named: list[tuple[str, nn.Module]]) -> None:
    """A lazy module whose parameters its first forward has not made yet (``LazyLinear``,
    ``LazyConv2d``) has no sizes to count: one line saying so, and what to do, not torch's
    error from inside layerscope."""
    from torch.nn.modules.lazy import LazyModuleMixin

    for path, module in named:
        if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
            raise ModelError(
                f"{type(module).__name__} at {path or 'the root'!r} is a lazy module whose parameters are not made "
                "yet (its first forward makes them): run the model once on an input, then profile it"
            )


def _extra_repr(module: nn.Module) -> str:
    try:
        return str(module.extra_repr())
    except Exception:  # a user's extra_repr that fails must not fail profiling
        return ""


def _check_paths(paths: Sequence[str] | None, known: set[str]) -> list[str] | None:
    if paths is None:
        return None
    if isinstance(paths, str):
        paths = [paths]
    unknown = [p for p in paths if p not in known]
    if unknown:
        import difflib

        hints = []
        for p in unknown:
            close = difflib.get_close_matches(p, sorted(known), n=3)
            hints.append(f"{p!r}" + (f" (did you mean {', '.join(map(repr, close))}?)" if close else ""))
        raise ModelError(
            f"paths= names no module of this model: {', '.join(hints)}; paths are "
            "named_modules() names such as 'features.3' ('' is the whole model)"
        )
    return list(paths)


def model_device(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def model_dtype(model: nn.Module) -> str | None:
    for tensor in model.parameters():
        return dtype_name(tensor.dtype)
    return None


def autocast_dtype(device: torch.device) -> str | None:
    """The dtype ``torch.autocast`` runs ops in on ``device``'s type now, or None when it
    is off there (the model's own dtype then says what runs)."""
    try:
        enabled = torch.is_autocast_enabled(device.type)
    except RuntimeError:  # a device type with no autocast (meta)
        return None
    return dtype_name(torch.get_autocast_dtype(device.type)) if enabled else None


def compiled_modules(model: nn.Module) -> list[str]:
    """``named_modules()`` paths of the parts of ``model`` compiled with ``torch.compile``
    (an ``OptimizedModule`` wrapper, or a module whose ``.compile()`` was called)."""
    wrapper = _torch.optimized_module_type()
    if wrapper is None:
        return []  # nothing can have been compiled in this process
    return [
        path
        for path, module in model.named_modules()
        if isinstance(module, wrapper) or _torch.compiled_in_place(module)
    ]


def eager_module(model: nn.Module) -> nn.Module | None:
    """The eager module behind a model compiled as a whole: ``torch.compile(model)``'s
    (its ``_orig_mod``), or the model itself when ``model.compile()`` compiled it in
    place (run it eagerly inside :func:`eager_calls`); else None."""
    wrapper = _torch.optimized_module_type()
    if wrapper is None:
        return None  # nothing can have been compiled in this process
    if isinstance(model, wrapper):
        return _torch.eager_of(model)
    return model if _torch.compiled_in_place(model) else None


def compiled_wrapper_of(model: nn.Module) -> nn.Module | None:
    """The ``torch.compile(model)`` wrapper that holds ``model``, found among the
    process's objects: the one a framework made and calls (a Hugging Face Trainer with
    ``torch_compile=True`` hands its callbacks the eager model); None when there is
    none, or more than one."""
    wrapper = _torch.optimized_module_type()
    if wrapper is None:
        return None
    found = []
    with warnings.catch_warnings():
        # Some objects warn when their class is asked (a deprecated alias of torch's).
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, wrapper) and _torch.eager_of(obj) is model:
                    found.append(obj)
            except Exception:  # an object that cannot say its class (a dead weak proxy) is no wrapper
                continue
    return found[0] if len(found) == 1 else None


def compile_mark() -> Any:
    """A mark of the frames Dynamo has compiled so far (asking imports nothing)."""
    return _torch.compile_mark()


def warn_if_compiled_traced_hooks(model: nn.Module, mark: Any) -> None:
    """Warn when Dynamo compiled while hooks were on the eager ``model`` (since ``mark``:
    :func:`compile_mark`) and a ``torch.compile`` wrapper of it exists: if the wrapper
    was called, its graphs traced the hooks."""
    if not _torch.compiled_since(mark) or compiled_wrapper_of(model) is None:
        return
    warnings.warn(
        "layerscope: torch.compile compiled while the block ran, and a torch.compile(model) wrapper of the profiled "
        "model exists: if the block called the wrapper, Dynamo traced layerscope's module hooks into its graphs "
        "(breaking them), and this profile is of that run, not of your compiled model; profile the compiled model "
        "itself: layerscope.Profiler(compiled)",
        LayerscopeWarning, stacklevel=3,
    )


def eager_hint(model: nn.Module) -> str:
    """How a user reaches the eager model behind ``model`` (said in refusals)."""
    wrapper = _torch.optimized_module_type()
    if wrapper is not None and isinstance(model, wrapper):
        return "model._orig_mod"
    return "the model before model.compile()" if eager_module(model) is model else "the model before torch.compile"


def eager_calls(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """While it runs, calls of ``model`` run its eager ``forward`` (with its hooks) if
    ``model.compile()`` compiled it in place; its compiled call is put back after."""
    if _torch.optimized_module_type() is None or not _torch.compiled_in_place(model):
        return contextlib.nullcontext()
    return _torch.compiled_call_swapped(model, None)


def refuse_compiled(model: nn.Module) -> None:
    """Refuse per-module profiling of a compiled model: module hooks are traced into
    the compiled graph and replayed, so their times (and the ops seen) say nothing
    about the modules. Whole-model figures stay true, and the eager model profiles."""
    found = compiled_modules(model)
    if not found:
        return
    where = "the model" if found[0] == "" else f"module{'s' if len(found) > 1 else ''} {', '.join(repr(p) for p in found[:3])}"
    eager = eager_hint(model)
    raise ModelError(
        f"{where} is compiled with torch.compile, whose graphs replay module hooks, so per-module "
        f"figures from hooks would be wrong: layerscope.profile(torch.compile(model), inputs) profiles a "
        f"model compiled as a whole from its kernels, its forward or (backward=True) a training step's forward, "
        f"loss and backward (`layerscope profile SPEC --compile`), and a Profiler block records the steps of a model "
        f"compiled as a whole from its kernels; or profile {eager}, "
        "or time the compiled model whole with layerscope.benchmark / `layerscope bench --compile`"
    )


#: The note layerscope adds to an exception raised in a model's forward or backward.
RAISED_NOTE = "layerscope: raised in module {path!r} ({type})"


def note_raising_module(exc: BaseException, model: nn.Module) -> None:
    """Add a note naming the module of ``model`` whose ``forward`` raised ``exc`` (the
    innermost one on the traceback), by path and class: "mat1 and mat2 shapes cannot be
    multiplied" then says where. Read from the traceback only when something raised, so
    it costs nothing per call; the exception's type and message are left as they were.
    Once per exception (an outer profiler seeing it again adds nothing)."""
    if any(str(note).startswith("layerscope: raised in module") for note in getattr(exc, "__notes__", ())):
        return
    paths = {id(module): path for path, module in model.named_modules()}
    found: tuple[str, nn.Module] | None = None
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        path = paths.get(id(owner)) if owner is not None else None
        if path is not None:
            found = (path, owner)  # the innermost one wins: the last found going down
        tb = tb.tb_next
    if found is not None:
        exc.add_note(RAISED_NOTE.format(path=found[0] or "(the model)", type=type(found[1]).__name__))


def known_peak_flops_per_s(device: torch.device, dtype: str | None) -> int | None:
    """The datasheet peak for ``device`` at ``dtype`` in FLOP/s, or None if unknown."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    table = datasheet_tflops(torch.cuda.get_device_name(device)) or {}
    tflops = table.get(dtype or "float32")
    return int(tflops * 1e12) if tflops else None


def peak_flops_per_s(peak_tflops: float | None, device: torch.device, dtype: str | None) -> int | None:
    """The peak for MFU in FLOP/s: the user's ``peak_tflops`` (checked: a positive
    number), else the datasheet's for ``device`` at ``dtype``, else None (unknown)."""
    if peak_tflops is not None:
        return given_peak_flops_per_s(peak_tflops)
    return known_peak_flops_per_s(device, dtype)
