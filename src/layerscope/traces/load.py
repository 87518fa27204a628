"""A torch.profiler trace file as a :class:`~layerscope.model.tree.Profile`, through the live
capture's own conversion and attribution.

The file's events become the range trees torch's profiler hands the live capture
(``ranges.py``): ``ProfilerStep#N`` ranges are steps, ``nn.Module: ClassName_k`` calls
module ranges (``modules.py`` gives each instance its place), other ``user_annotation``
ranges labels, ``cpu_op`` events ops with their recorded inputs. From there it is the
live path: ``convert.streams.convert`` makes one typed stream per step, and the walker
(``attribute.cycle``) sums the steps into the tree. Nothing here attributes anything.
"""

from __future__ import annotations

import ast
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from layerscope.attribute.cycle import Cycle
from layerscope.attribute.walk import parent_indices
from layerscope.base.errors import LayerscopeWarning, SchemaError, TraceModelError
from layerscope.base.intervals import union_ns
from layerscope.base.kineto_json import TraceReader, open_trace
from layerscope.base.peaks import datasheet_tflops
from layerscope.base.version import __version__
from layerscope.convert.align import CallTemplate, place
from layerscope.convert.ranges import MODULE_PREFIX, STEP_NAME, Detail, Range
from layerscope.convert.streams import OpCatalog, OutermostOps, convert
from layerscope.model.raw import RawCapture
from layerscope.model.runfacts import DeviceEvents, ModulesFrom, RunFacts, TraceSource
from layerscope.model.tree import Profile
from layerscope.traces.modules import (
    Instance,
    ModelTable,
    aligned_misfits,
    instances,
    map_to_model,
    misfit_evidence,
    misfits,
    table_without_model,
    uncalled,
)
from layerscope.traces.ranges import _NO_FIELDS, DamagedEvent, TraceRanges, read_ranges

_EVALUATE = "autograd::engine::evaluate_function: "



def _catalog() -> OpCatalog:
    """torch's op catalog, imported only for a trace with recorded shapes: the ops it
    counts are torch's (a trace without shapes is read without importing torch)."""
    from layerscope.flops.recorded import CATALOG

    return CATALOG

#: The stages a load reports to ``progress``: the file read (KiB of it as stored), then
#: the tree built (steps walked).
READ_STAGE = "reading the trace (KiB)"
BUILD_STAGE = "building the tree (steps)"
#: Events read between two reports of the read's progress.
REPORT_EVERY = 8192


#: What gives a trace without module events its model's call template, when asked:
#: called with whether the trace ran autograd (a training step's forward); None where
#: there is none to learn (no inputs to run the model with).
TemplateSource = Callable[[bool], CallTemplate | None]


def load_trace(
    path: str | os.PathLike[str], *, model: ModelTable | None = None, shapes: bool = True,
    progress: Callable[[str, int, int], None] | None = None, template: TemplateSource | None = None,
) -> Profile:
    """The profile of a torch.profiler (Kineto) trace file, ``.json`` or ``.json.gz``.

    Without ``model`` the modules are the trace's instances (``BertModel_0``), their
    parameters unknown; with it (the model's table, read from it by the caller:
    ``capture.modules.traced_model``), each instance is matched to its path in the model
    (``meta.modules_from`` says how).

    With ``shapes=False`` the trace is read as if it had recorded no shapes: the same
    times, no FLOPs, each op a row where a module called it (``OutermostOps``); torch is
    not imported to read it (the ops' inputs are read only to check ``model``'s
    parameter shapes). ``progress(stage, done, total)`` hears how far the read
    (:data:`READ_STAGE`) and the build (:data:`BUILD_STAGE`) are.

    A trace without ``nn.Module`` events (recorded without ``with_stack``), read with
    ``model`` and ``template``, gets its module calls by aligning its ops to the model's
    call template (``convert/align.py``; ``meta.modules_from.placement`` counts how each op
    was placed); ``template`` is asked for it only then.
    """
    name = os.fspath(path)
    try:
        with open_trace(name) as reader:
            events = reader.events() if progress is None else _reported(reader, progress)
            ranges = read_ranges(events, inputs=shapes or model is not None)
            file_meta = dict(reader.meta)
        return profile_of_ranges(
            ranges, file_meta, model=model, source=os.path.basename(name), shapes=shapes, progress=progress,
            template=template,
        )
    except DamagedEvent as exc:
        raise SchemaError(f"{name!r} is a damaged torch.profiler trace: {exc}") from None
    except MemoryError:
        raise SchemaError(
            f"{name!r} is too large a trace for this machine's memory; record fewer steps "
            "(torch.profiler's schedule: active=1) or read it on a machine with more"
        ) from None


def _reported(reader: TraceReader, progress: Callable[[str, int, int], None]) -> Iterator[dict[str, Any]]:
    """``reader``'s events, with the share of the file read told to ``progress`` every
    :data:`REPORT_EVERY` events and at the end."""
    total = max(1, reader.file_bytes // 1024)
    progress(READ_STAGE, 0, total)
    for count, event in enumerate(reader.events(), 1):
        yield event
        if count % REPORT_EVERY == 0:
            progress(READ_STAGE, min(total, reader.file_bytes_read // 1024), total)
    progress(READ_STAGE, total, total)


def profile_of_ranges(
    ranges: TraceRanges, file_meta: dict[str, Any], *, model: ModelTable | None = None, source: str = "trace",
    shapes: bool = True, progress: Callable[[str, int, int], None] | None = None,
    template: TemplateSource | None = None,
) -> Profile:
    """The profile of a trace's ranges (``read_ranges``) and its top-level keys. The
    ranges are spent: ``ranges.roots``, ``modules``, ``steps`` and ``kernels`` are
    emptied once converted."""
    found = instances(ranges.modules, ranges.python_parent)
    param_bytes: int | None
    if model is not None:
        infos = model.infos
        index, how = _mapped(found, infos, model.params, ranges.has_shapes, source, model.name)
        param_bytes = _traced_param_bytes(model, found, index)
    else:
        infos, index = table_without_model(found)
        param_bytes = None
        how = ModulesFrom(
            method="the trace's module instances, nested as called (no model given: parameters unknown)",
            instances=len(found),
            matched=len(found),
        )
    dropped: set[int] = set()
    for call in ranges.modules:
        at = index.get(call.instance)
        if at is None:
            dropped.add(id(call.range))
        else:
            call.range.name = f"{MODULE_PREFIX}{at}"
    roots: list[Range] = []
    for tid_roots in ranges.roots.values():
        roots.extend(_spliced(tid_roots, dropped))
    numbers = _steps(ranges, roots)
    learned = None
    if model is not None and template is not None and not found:
        learned = template(any(r.name.startswith(_EVALUATE) for rs in ranges.roots.values() for r in _tops(rs)))
    if learned is not None:
        assert model is not None
        steps = [r for r in roots if r.name == STEP_NAME]
        placement = place(list(zip(steps, numbers)), learned, roots)
        how = ModulesFrom(method=ALIGNED_METHOD, instances=0, matched=0, placement=placement)
        if ranges.has_shapes:
            how = replace(how, shapes=_check_aligned(steps, model, source))
        _warn_unaligned(how, source)
    elif model is not None and template is not None and not found:
        warnings.warn(
            f"layerscope: {source}: the trace has no nn.Module events, and no inputs were given to learn the "
            f"{model.name}'s calls from (inputs=, --input SHAPE or --inputs SPEC): its modules are not placed",
            LayerscopeWarning, stacklevel=3,
        )
    has_device = bool(ranges.device_events)
    counted = ranges.has_shapes and shapes
    detail = Detail(stacks=None)
    windows = [(r.start_time_ns, r.end_time_ns) for r in roots if r.name == STEP_NAME]
    # Without shapes each op is a row where a module called it, uncounted, read without
    # torch; memory and op rows are read either way.
    streams = convert(roots, ranges.kernels, has_device=has_device, detail=detail, ops=_catalog() if counted else OutermostOps())
    # The ranges are spent once converted: released before the walk, as each step's
    # stream is once summed (most of a large trace's memory).
    roots.clear()
    for kept in (ranges.roots, ranges.modules, ranges.steps, ranges.kernels):
        kept.clear()

    cycle = Cycle(infos, parent_indices(infos), collect_ops=True)
    # A step that ran nothing is kept when it is the trace's only one (a block's last
    # step mark, opened after its last step() and closed at its exit, is not).
    keep_empty = len(streams) == 1
    streams.reverse()
    report = progress or (lambda stage, done, total: None)
    walked = numbers[: len(streams)]
    report(BUILD_STAGE, 0, len(walked))
    for done, number in enumerate(walked, 1):
        cycle.add(streams.pop(), number, warmup=False, keep_empty=keep_empty, has_device=has_device)
        report(BUILD_STAGE, done, len(walked))
    meta = _meta(file_meta, ranges, source, how, model, windows, infos[0].type)
    if ranges.has_shapes and not shapes:
        meta.flops_unknown = "the trace was read without its recorded shapes (shapes=False / --no-shapes)"
    if numbers:
        meta.step_range = [min(numbers), max(numbers)]
    raw = RawCapture(
        modules=infos, has_device_time=has_device, param_bytes=param_bytes, meta=meta, memory_notes=False,
        counts_known=counted,
    )
    if cycle.empty:
        raise SchemaError(
            f"{source!r} is a torch.profiler trace with nothing to profile: no op, range or module "
            "on any thread (expected the cpu_op events of a recorded run)"
        )
    profile = cycle.build(raw)
    if not any(node.calls for node in profile.modules()):
        # No module call was seen (no nn.Module events, and none placed): every module's
        # figures are unknown, shown blank as unprofiled modules are, never 0 calls and 0 ns.
        for node in profile.modules():
            node.profiled = False
    return profile


#: ``meta.modules_from.method`` of a trace whose module calls were aligned.
ALIGNED_METHOD = "aligned to the model's call template (the trace has no nn.Module events)"


def _tops(roots: list[Range]) -> Iterator[Range]:
    """A thread's roots and the ranges directly in its labels and steps (a CPU run's
    backward nodes sit in its step)."""
    for rng in roots:
        yield rng
        if not rng.name.startswith(_EVALUATE):
            yield from rng.children


def _refuse_misfits(bad: list[Any], checked: int, infos: list[Any], model_name: str, source: str) -> None:
    """A :class:`TraceModelError` with the first misfit's evidence, when there is one:
    the trace was not recorded with this model."""
    if not bad:
        return
    first = bad[0]
    more = f" (and {len(bad) - 1} more of the {checked} modules checked)" if len(bad) > 1 else ""
    raise TraceModelError(
        f"{source!r} was not recorded with this {model_name}: "
        f"{misfit_evidence(first, infos[first.at].path, infos[first.at].type)}{more}; "
        "load it with the model that was traced (on the command line: --model SPEC, with "
        "--config KEY=VALUE,... for a transformers: model's size)"
    )


def _check_aligned(steps: list[Range], model: ModelTable, source: str) -> str | None:
    """The model's parameter shapes checked against the ops the alignment put in each
    module (as a with-stack read checks its instances): a module none of whose
    parameters' shapes its ops were given is not the one that ran, refused with the
    evidence; what was checked, for ``modules_from.shapes``."""
    bad, checked = aligned_misfits(steps, model.infos, model.params)
    _refuse_misfits(bad, checked, model.infos, model.name, source)
    return f"parameter shapes checked against the ops aligned to each module: {checked} modules, all fit" if checked else None


def _warn_unaligned(how: ModulesFrom, source: str) -> None:
    """A warning naming the passes whose ops did not align with the model's template,
    and the data-dependent reads its template guessed."""
    placed = how.placement
    if placed is not None and placed.guesses and not placed.unaligned:
        warnings.warn(
            f"layerscope: {source}: the model's call template answered {len(placed.guesses)} data-dependent "
            f"read{'s' if len(placed.guesses) != 1 else ''} with a guess ({placed.guesses[0]}): where the traced run "
            "took another branch between modules that run the same ops, those ops may sit on the other module",
            LayerscopeWarning, stacklevel=4,
        )
    if placed is None or not placed.unaligned:
        return
    warnings.warn(
        f"layerscope: {source}: {len(placed.unaligned)} of {placed.passes} passes of the model did not align "
        f"with its call template ({_some(list(placed.unaligned), 2)}): the ops of their steps stay with the "
        "enclosing labels and steps; was the trace recorded with this model and inputs like these?",
        LayerscopeWarning, stacklevel=4,
    )


def _traced_param_bytes(model: ModelTable, found: dict[str, Instance], index: dict[str, int]) -> int:
    """The parameters' bytes in the dtype the trace's ops were given them in (a model
    built from its config is float32; the traced one may have run in bf16): the dtype
    its own module's ops first gave its shape, else any module's ops' (a parameter one
    module owns and a child uses, as a tied bias), else its own. Tied parameters count
    once."""
    own = {at: found[name].dtypes for name, at in index.items()}
    anywhere: dict[tuple[int, ...], Any] = {}
    for instance in found.values():
        for shape, dtype in instance.dtypes.items():
            anywhere.setdefault(shape, dtype)
    total = 0
    for at, tensors in enumerate(model.tensors):
        for shape, numel, own_dtype in tensors:
            dtype = own.get(at, {}).get(shape) or anywhere.get(shape) or own_dtype
            total += numel * dtype.itemsize
    return total


def _mapped(
    found: dict[str, Instance], infos: list[Any], params: list[list[tuple[str, tuple[int, ...]]]],
    has_shapes: bool, source: str, model_name: str,
) -> tuple[dict[str, int], ModulesFrom]:
    """The trace's instances mapped to the model's modules (each instance's index, and
    how, for ``meta.modules_from``), checked by the model's parameters' shapes among the shapes
    the ops of each module were given: a module that fits none is an error naming it; a
    model that fits in part (instances matched to no module, or modules with parameters
    that ran in no instance) is a warning naming them."""
    shapes = [{shape for _, shape in own} for own in params]
    index, out = map_to_model(found, infos, shapes)
    if not found:
        return index, out
    if not has_shapes:
        out = replace(out, shapes="parameter shapes not checked: the trace recorded no input shapes (record_shapes=False)")
        warnings.warn(
            f"layerscope: {source}: the model's parameter shapes cannot be checked against this trace: it "
            "recorded no input shapes (record_shapes=False); modules are matched by class and call order alone",
            LayerscopeWarning, stacklevel=3,
        )
    else:
        bad, checked = misfits(found, index, params)
        _refuse_misfits(bad, checked, infos, model_name, source)
        out = replace(out, shapes=f"parameter shapes checked against the ops' recorded inputs: {checked} modules, all fit")
    not_run = uncalled(found, index, infos, shapes)
    if not_run:
        out = replace(out, uncalled=tuple(not_run))
    unmatched = out.unmatched
    if unmatched or not_run:
        said = []
        if unmatched:
            said.append(
                f"{len(unmatched)} of {len(found)} module instances matched no module of the {model_name} "
                f"({_some(unmatched)}: their work stays with their caller)"
            )
        if not_run:
            said.append(f"{len(not_run)} of its modules with parameters ran in no instance ({_some(not_run)})")
        warnings.warn(
            f"layerscope: {source}: the {model_name} fits the trace only in part: {'; '.join(said)}; "
            "is it the model that was traced?",
            LayerscopeWarning, stacklevel=3,
        )
    return index, out


def _some(names: list[str], shown: int = 4) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _spliced(ranges: list[Range], dropped: set[int]) -> list[Range]:
    """``ranges`` with each dropped range (a module call matched to no module) replaced
    by the ranges nested in it, at every depth."""
    if not dropped:
        return ranges
    out: list[Range] = []
    for rng in ranges:
        if not rng.children:  # an allocation's are its class's, and read-only
            if id(rng) not in dropped:
                out.append(rng)
            continue
        kids = _spliced(rng.children, dropped)
        if id(rng) in dropped:
            out.extend(kids)
        else:
            rng.children = kids
            out.append(rng)
    return out


def _steps(ranges: TraceRanges, roots: list[Range]) -> list[int]:
    """Put the owner thread's roots into steps, in ``roots``; the step numbers, in order.

    ``ProfilerStep#N`` ranges mark where steps begin. A range that runs past its step's
    end (Lightning steps the profiler in the middle of its optimizer's closure) extends
    that step, and the next begins where it ends: each root is in the step it began in,
    whole. A trace without them is one step (numbered 0) around everything the busiest
    thread did."""
    if ranges.steps:
        marks = sorted(ranges.steps, key=lambda s: s[0].start_time_ns)
        owner = marks[0][0].start_tid
        marks = [(rng, n) for rng, n in marks if rng.start_tid == owner]
    else:
        # The thread that did most outside backward nodes: a module call weighs most; a
        # trace without them is weighed by its ranges (autograd's thread also runs a
        # wrapper's own ops, DDP's bucket copies, at its top level).
        weight: dict[int, int] = {}
        for rng in roots:
            if not rng.name.startswith(_EVALUATE):
                mine = 1 + 100 * rng.name.startswith(MODULE_PREFIX) + _size(rng)
                weight[rng.start_tid] = weight.get(rng.start_tid, 0) + mine
        if not weight:
            return []
        owner = max(weight, key=lambda tid: weight[tid])
        mine = [r for r in roots if r.start_tid == owner]
        whole = Range(STEP_NAME, min(r.start_time_ns for r in mine), max(r.end_time_ns for r in mine), owner, 0)
        marks = [(whole, 0)]
    mine = sorted((r for r in roots if r.start_tid == owner), key=lambda r: r.start_time_ns)
    steps: list[Range] = []
    numbers: list[int] = []
    at = 0
    for i, (mark, number) in enumerate(marks):
        start = max(mark.start_time_ns, steps[-1].end_time_ns if steps else mark.start_time_ns)
        end = mark.end_time_ns
        next_start = marks[i + 1][0].start_time_ns if i + 1 < len(marks) else None
        while at < len(mine) and mine[at].start_time_ns < start:
            at += 1  # before the first step, or in a gap between steps: no step's work
        taken: list[Range] = []
        while at < len(mine) and mine[at].start_time_ns < end:
            taken.append(mine[at])
            end = max(end, mine[at].end_time_ns)
            at += 1
        if next_start is not None and end <= next_start:
            end = max(end, mark.end_time_ns)
        if not taken and steps and end <= steps[-1].end_time_ns:
            continue  # a step that lies whole inside the one before
        steps.append(Range(STEP_NAME, start, max(start, end), owner, 0, taken, _NO_FIELDS))
        numbers.append(number)
    roots[:] = [r for r in roots if r.start_tid != owner] + steps
    return numbers


def _size(rng: Range) -> int:
    """The ranges nested in ``rng``, at every depth."""
    count = 0
    todo = list(rng.children)
    while todo:
        item = todo.pop()
        count += 1
        if item.children:
            todo.extend(item.children)
    return count


def _meta(
    file_meta: dict[str, Any], ranges: TraceRanges, source: str, how: ModulesFrom, model: ModelTable | None,
    windows: list[tuple[int, int]], model_type: str,
) -> RunFacts:
    devices = file_meta.get("deviceProperties") or []
    names = sorted({str(d.get("name")) for d in devices if isinstance(d, dict) and d.get("name")})
    distributed = _distributed(file_meta.get("distributedInfo"))
    all_device = union_ns([(e.start_ns, e.end_ns) for e in ranges.device_events])
    orphans = [e for e in ranges.device_events if e.correlation not in ranges.launched_in]

    def in_a_step(correlation: int) -> bool:
        at = ranges.launched_at[correlation]
        return bool(ranges.launched_in[correlation]) and any(s <= at <= e for s, e in windows)

    outside = [e for e in ranges.device_events if e.correlation in ranges.launched_in and not in_a_step(e.correlation)]
    meta = RunFacts(
        model=model.name if model is not None else model_type,
        layerscope_version=__version__,
        device="cuda" if ranges.device_events else "cpu",
        mode="trace",
        source=TraceSource(
            kind="torch.profiler trace",
            file=source,
            device_names=tuple(names),
            schema_version=_whole(file_meta.get("schemaVersion")),
            record_shapes=_flag(file_meta.get("record_shapes"), ranges.has_shapes),
            profile_memory=_flag(file_meta.get("profile_memory"), ranges.has_memory),
            with_stack=_flag(file_meta.get("with_stack"), ranges.has_stack),
        ),
        modules_from=how,
        # Times and op rows are the file's, one run's: one fact, under one name.
        times_from="trace",
    )
    if not ranges.has_shapes:
        meta.flops_unknown = "the trace recorded no input shapes (record_shapes=False)"
    meta.peak_flops_per_s, meta.peak_from = _peak(names, ranges.matrix_dtypes, ranges.has_shapes)
    unread = ranges.unread_device
    if ranges.device_events or unread:
        meta.device_events = DeviceEvents(
            events=len(ranges.device_events),
            time_ns=all_device,
            outside_steps=len(outside),
            outside_steps_time_ns=union_ns([(e.start_ns, e.end_ns) for e in outside]),
            orphans=len(orphans),
            orphans_time_ns=union_ns([(e.start_ns, e.end_ns) for e in orphans]),
            unread={category: count for category, (count, _) in sorted(unread.items())} if unread else None,
            unread_time_ns=union_ns([span for _, spans in unread.values() for span in spans]) if unread else None,
        )
    if unread:
        said = ", ".join(f"{count} {category}" for category, (count, _) in sorted(unread.items()))
        warnings.warn(
            f"layerscope: {source}: {sum(c for c, _ in unread.values())} device events of categories layerscope does "
            f"not read ({said}) are in no node: the device ledger counts them as unread",
            LayerscopeWarning, stacklevel=4,
        )
    if distributed:
        meta.rank = _whole(distributed.get("rank"))
        meta.world_size = _whole(distributed.get("world_size"))
        backend = distributed.get("backend")
        meta.backend = None if backend is None else str(backend)
    return meta


def _peak(device_names: list[str], matrix_dtypes: dict[str, int], has_shapes: bool) -> tuple[int | None, str]:
    """The peak FLOP/s MFU divides by, and where it came from: the datasheet's dense
    figure (``peaks``, as a live profile's) for the GPU the trace names, at the
    dtype most of its matrix ops ran in (a trace names no parameters to take it from).
    None, and why, where either is not known."""
    if not device_names:
        return None, "the trace names no GPU (no deviceProperties)"
    if len(device_names) > 1:
        return None, f"the trace names {len(device_names)} kinds of GPU ({', '.join(device_names)}), not which ran"
    gpu = device_names[0]
    table = datasheet_tflops(gpu)
    if table is None:
        return None, f"the {gpu} is not in layerscope's datasheet table"
    if not matrix_dtypes:
        why = "the trace recorded no input types (record_shapes=False)" if not has_shapes else "no matrix op (matrix product, convolution, attention) was recorded with its inputs"
        return None, f"the dtype of the {gpu}'s peak is unknown: {why}"
    dtype, calls = max(sorted(matrix_dtypes.items()), key=lambda item: item[1])
    ran = f"{dtype} in {calls} of {sum(matrix_dtypes.values())} matrix-op calls"
    tflops = table.get(dtype)
    if tflops is None:
        return None, f"layerscope's datasheet table has no {dtype} figure for the {gpu} ({ran})"
    return int(tflops * 1e12), f"the {gpu}'s dense {dtype} figure in layerscope's datasheet table ({ran})"


def _whole(value: Any) -> int | None:
    """A whole number from a trace's ``distributedInfo`` (an int, or its text); None else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _flag(value: Any, seen: bool) -> bool:
    if value is None:
        return seen
    return str(value) not in ("0", "false", "False", "")


def _distributed(value: Any) -> dict[str, Any]:
    """``distributedInfo``: a dict, or the Python repr of one (as torch writes it)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            found = ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return {}
        return found if isinstance(found, dict) else {}
    return {}
