"""The whole GPU check in one command: every CUDA path of layerscope, on a lent GPU.

Runs on a bare GPU machine with the torch already installed there and no network: it
puts this checkout's ``src`` on the path (nothing is installed), and says which parts it
skipped where an optional dependency (transformers, pytest) is missing. It writes
``report.md`` and ``report.json`` into OUT (atomically), and the HTML report of the
training step. On an H100 (2026-11-27) the CUDA tests take 38 s, the record part 26-33 s,
BERT-base fp32 13-15 s, GPT-2 fp32 62-73 s, the exit parts 28 s and each bf16 part 19-66 s:
the whole check about 4.5 minutes (see docs/benchmarks.md). ``--budget-s`` stops starting
parts after a time and ``--only`` picks parts. ``--device cpu --quick`` is the smoke mode CI
runs between GPUs (small models, the CUDA-only parts skipped with the reason).

Parts, each timed and reported ok / failed (with the error) / skipped (with the reason):

1. the CUDA-marked tests (``pytest -m cuda``);
2. ``record``: recorded captures for the suite to replay without a GPU
   (``layerscope.capture.replay``; ``--record DIR``, copied into ``tests/data/captures``):
   a BERT-base forward, a GPT-2 AdamW step, GPT-2 with activation checkpointing, a bf16
   Llama, DDP over NCCL and the zoo MLP compiled in an AdamW block
   (``compiled_mlp_train``, with its graphs; ``compiled_mlp_train_cpu`` with ``--device cpu``), each block's windows as torch's profiler handed them over,
   with torch's own trace of the same session read back as the oracle (every module's
   device time), the kernels' union and the allocator's peak;
3. for a BERT-base forward and a GPT-2 (small config) AdamW training step, in fp32 and
   bf16: ``profile()``, a 5-step ``Profiler`` block and a one-step block, with
   - attribution: the same step recorded by torch.profiler and read back as a trace:
     every kernel in exactly one module or part, the nodes' device time against the
     union of the kernels (target: within 1%);
   - overhead: a step under layerscope and under torch.profiler against a plain step,
     7 rounds interleaved, medians, and each variant's exit;
   - memory: the step's peak against ``torch.cuda.max_memory_allocated``, and the
     top-level modules' forward allocations against ``memory_allocated`` deltas;
   - MFU per module, with the peak FLOP/s assumed;
4. ``exit_scaling``: a GPT-2 block's exit for 2, 5 and 11 steps beside torch.profiler's
   stop (and each first read), and ``exit_profile``: where an 11-step exit and first read go (cProfile);
5. a ``torch.compile``d model: its kernels matched to modules, and a compiled AdamW loop in
   a block, each module's device time against torch.profiler's trace of the same step
   (run right after ``record``: the compiled path has run on no GPU yet);
6. DDP on one device (NCCL on a GPU, gloo on the CPU): collective bytes and waiting;
7. the HTML report of the training step, saved into OUT.

Usage::

    python benchmarks/gpu.py --out gpu-report                 # on the GPU machine
    python benchmarks/gpu.py --out smoke --device cpu --quick # the CPU smoke mode
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import layerscope  # noqa: E402
from layerscope.base.io import write_atomic  # noqa: E402

#: Whether torch's own traces of recorded sessions are kept in OUT (--keep-traces).
KEEP_TRACES = False
#: A part's verdict: "ok", "failed" or "skipped", with its figures or the reason.
Result = dict[str, Any]


# -- the models --------------------------------------------------------------------------


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        return None
    return transformers


def bert(quick: bool, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """BERT-base (12 layers, 768 wide), batch 8 x 128; quick: 2 layers, 128 wide, 2 x 32."""
    tf = _transformers()
    size = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512) if quick else {}
    config = tf.BertConfig(**size)
    batch, seq = (2, 32) if quick else (8, 128)
    model = tf.BertModel(config).to(device=device, dtype=dtype).eval()
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0)).to(device)
    return model, {"input_ids": ids}


def gpt2(quick: bool, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """GPT-2 small config (12 layers, 768 wide), batch 4 x 256; quick: 2 layers, 128 wide."""
    tf = _transformers()
    size = dict(n_layer=2, n_embd=128, n_head=2) if quick else {}
    config = tf.GPT2Config(**size)
    batch, seq = (2, 32) if quick else (4, 256)
    model = tf.GPT2LMHeadModel(config).to(device=device, dtype=dtype).train()
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0)).to(device)
    return model, {"input_ids": ids, "labels": ids}


def gpt2_ckpt(quick: bool, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """GPT-2 (6 layers, 768 wide) with non-reentrant activation checkpointing, batch 4 x 256."""
    tf = _transformers()
    size = dict(n_layer=2, n_embd=128, n_head=2) if quick else dict(n_layer=6)
    config = tf.GPT2Config(**size)
    batch, seq = (2, 32) if quick else (4, 256)
    model = tf.GPT2LMHeadModel(config).to(device=device, dtype=dtype).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0)).to(device)
    return model, {"input_ids": ids, "labels": ids}


def llama(quick: bool, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Llama (4 layers, 1024 wide, 16 heads / 4 KV heads, MLP 2816, SDPA), batch 4 x 512."""
    tf = _transformers()
    size = (dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=256, vocab_size=1000) if quick else
            dict(num_hidden_layers=4, hidden_size=1024, num_attention_heads=16, num_key_value_heads=4,
                 intermediate_size=2816, vocab_size=32000))
    config = tf.LlamaConfig(**size, attn_implementation="sdpa")
    batch, seq = (2, 32) if quick else (4, 512)
    model = tf.LlamaForCausalLM(config).to(device=device, dtype=dtype).train()
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0)).to(device)
    return model, {"input_ids": ids, "labels": ids}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- one model's checks ----------------------------------------------------------------------


class Case:
    """A model, its inputs and its step (a forward, or an AdamW training step)."""

    def __init__(self, name: str, model: nn.Module, inputs: dict[str, torch.Tensor], train: bool, device: torch.device) -> None:
        self.name, self.model, self.inputs, self.train, self.device = name, model, inputs, train, device
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4) if train else None

    def step(self) -> None:
        if self.optimizer is None:
            with torch.no_grad():
                self.model(**self.inputs)
            return
        self.optimizer.zero_grad(set_to_none=True)
        self.model(**self.inputs).loss.backward()
        self.optimizer.step()


def _median_step_ms(run: Callable[[], None], steps: int, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        run()
    _sync(device)
    return (time.perf_counter() - start) * 1e3 / steps


_READS: dict[str, Callable[[], object]] = {}


def _first_read(kind: str) -> float:
    """Seconds of the first read after a variant's exit: layerscope's ``prof.profile``,
    torch.profiler's ``key_averages()`` (both process their events on first use)."""
    read = _READS.pop(kind, None)
    started = time.perf_counter()
    if read is not None:
        read()
    return time.perf_counter() - started


@contextlib.contextmanager
def _variant(kind: str, case: Case) -> Iterator[Callable[[], None]]:
    """A step as the user runs it: plain, under layerscope's Profiler, under torch.profiler;
    the variant's first read after its exit is :func:`_first_read`'s."""
    if kind == "plain":
        yield case.step
    elif kind == "layerscope":
        with layerscope.Profiler(case.model) as prof:
            def step() -> None:
                case.step()
                prof.step()
            _READS[kind] = lambda: prof.profile
            yield step
    else:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if case.device.type == "cuda" else [])
        with profile(activities=activities, record_shapes=True, profile_memory=True) as prof:
            def step() -> None:
                case.step()
                prof.step()
            _READS[kind] = prof.key_averages
            yield step


def overhead(case: Case, rounds: int, steps: int) -> Result:
    """Median ms per step of each variant, interleaved over rounds, and ratios to plain."""
    times: dict[str, list[float]] = {"plain": [], "layerscope": [], "torch.profiler": []}
    finalize: dict[str, list[float]] = {kind: [] for kind in times}
    reads: dict[str, list[float]] = {kind: [] for kind in times}
    for round_ in range(rounds):
        for kind in times:
            with _variant(kind, case) as step:
                step()  # a variant's first step (the profiler starting) is not the steady state
                times[kind].append(_median_step_ms(step, steps, case.device))
                leaving = time.perf_counter()
            finalize[kind].append(time.perf_counter() - leaving)  # the exit: the profiler stopped
            reads[kind].append(_first_read(kind))  # the events read back
            print(f"  {case.name}: round {round_ + 1}, {kind}: {times[kind][-1]:.2f} ms per step, "
                  f"exit {finalize[kind][-1]:.2f} s, first read {reads[kind][-1]:.2f} s", flush=True)
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    return {
        "exit_s": {kind: statistics.median(values) for kind, values in finalize.items()},
        "first_read_s": {kind: statistics.median(values) for kind, values in reads.items()},
        "ms_per_step": medians,
        "x_plain": {kind: medians[kind] / medians["plain"] for kind in medians},
        "layerscope_x_torch_profiler": medians["layerscope"] / medians["torch.profiler"],
    }


def attribution(case: Case, out: Path, keep_trace: bool) -> Result:
    """The step recorded by torch.profiler, read back as a trace with the model: each
    kernel in one node, and the nodes' device time against the kernels' union."""
    from torch.profiler import ProfilerActivity, profile

    if case.device.type != "cuda":
        return {"status": "skipped", "reason": "no kernels on the CPU"}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 profile_memory=True, with_stack=True) as prof:
        case.step()
        _sync(case.device)
    path = out / f"{case.name}.pt.trace.json"
    prof.export_chrome_trace(str(path))
    try:
        traced = layerscope.load(path, model=case.model)
    finally:
        if not keep_trace:
            path.unlink()
    events = traced.meta.device_events
    device = {} if events is None else events.to_dict()
    in_nodes = sum(
        stats.self_device_time_ns or 0 for node in traced.nodes() for _, stats in node.phases()
    )
    kernels = 0 if events is None else events.time_ns - events.orphans_time_ns - events.outside_steps_time_ns
    how = traced.meta.modules_from
    unmatched = [] if how is None else list(how.unmatched)
    ratio = in_nodes / kernels if kernels else None
    return {
        "kernels_union_ms": kernels / 1e6,
        "nodes_device_ms": in_nodes / 1e6,
        "nodes_over_kernels": ratio,
        "within_1pct": ratio is not None and abs(ratio - 1) <= 0.01,
        "device_events": device,
        "unmatched_modules": unmatched,
        "trace": path.name if keep_trace else None,
    }


def memory(case: Case, prof: layerscope.Profile) -> Result:
    """The profile's peak against the allocator's, and the top-level modules' forward
    allocations against memory_allocated deltas around them."""
    if case.device.type != "cuda":
        return {"status": "skipped", "reason": "torch.cuda memory counters need a GPU"}
    deltas: dict[str, int] = {}
    handles = []
    for name, module in case.model.named_children():
        def pre(_m: nn.Module, _a: Any, name: str = name) -> None:
            deltas[name] = deltas.get(name, 0) - torch.cuda.memory_allocated(case.device)

        def post(_m: nn.Module, _a: Any, _o: Any, name: str = name) -> None:
            deltas[name] = deltas.get(name, 0) + torch.cuda.memory_allocated(case.device)

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    torch.cuda.reset_peak_memory_stats(case.device)
    try:
        case.step()
        _sync(case.device)
    finally:
        for handle in handles:
            handle.remove()
    peak = torch.cuda.max_memory_allocated(case.device)
    device_memory = prof.memory.device.to_dict() if prof.memory is not None and prof.memory.device else {}
    rows = {
        name: {"memory_allocated_delta": delta, "layerscope_alloc_minus_freed":
               (prof[name].forward.alloc_bytes or 0) - (prof[name].forward.freed_bytes or 0) if name in prof else None}
        for name, delta in deltas.items()
    }
    return {"max_memory_allocated": peak, "layerscope_device_peak": device_memory, "modules": rows}


def mfu(prof: layerscope.Profile) -> Result:
    peak = prof.meta.peak_flops_per_s
    rows = []
    for node in prof.modules():
        flops, busy = node.forward.flops, node.forward.busy_time_ns
        if flops and busy and node.depth <= 2:
            rows.append({"path": node.path or "(model)", "flops": flops, "busy_ns": busy,
                         "mfu": flops / (busy / 1e9) / peak if peak else None})
    return {"peak_flops_per_s_assumed": peak, "modules": rows[:20]}


def check_model(name: str, build: Callable[..., Any], train: bool, dtype: torch.dtype, args: argparse.Namespace,
                out: Path) -> Result:
    device = torch.device(args.device)
    model, inputs = build(args.quick, device, dtype)
    case = Case(f"{name}_{str(dtype).removeprefix('torch.')}", model, inputs, train, device)
    for _ in range(2):
        case.step()  # warm: kernels chosen, AdamW's state made
    result: Result = {}
    started = time.perf_counter()
    loss = (lambda out: out.loss) if train else None
    profiled = layerscope.profile(model, inputs, backward=train, loss_fn=loss, repeat=3 if args.quick else 5)
    result["profile"] = {"root_forward_ms": profiled.root.forward.cpu_time_ns / 1e6, "problems": _problems(profiled),
                         "seconds": time.perf_counter() - started}
    _progress(case.name, "profile()", started)
    with layerscope.Profiler(model) as prof:
        for _ in range(5):
            case.step()
            prof.step()
    block = prof.profile
    result["block_5_steps"] = {"steps": block.figures.steps, "problems": _problems(block)}
    _progress(case.name, "5-step block", started)
    with layerscope.Profiler(model) as one:
        case.step()
    result["block_1_step"] = {"problems": _problems(one.profile)}
    _progress(case.name, "1-step block", started)
    result["attribution"] = _part(lambda: attribution(case, out, args.keep_traces))
    result["overhead"] = _part(lambda: overhead(case, rounds=3 if args.quick else 7, steps=3 if args.quick else 10))
    _progress(case.name, "attribution and overhead", started)
    result["memory"] = _part(lambda: memory(case, block))
    result["mfu"] = _part(lambda: mfu(block))
    if train:
        html = out / f"{case.name}.html"
        block.save(html)
        result["html"] = html.name
    result["seconds"] = time.perf_counter() - started
    return result


def _progress(case: str, stage: str, started: float) -> None:
    print(f"  {case}: {stage} done at {time.perf_counter() - started:.1f} s", flush=True)


def _problems(prof: layerscope.Profile) -> list[str]:
    from layerscope.model.check import tree_problems

    return [str(p) for p in tree_problems(prof)][:5]


# -- the other parts ----------------------------------------------------------------------------


def cuda_tests(args: argparse.Namespace) -> Result:
    if args.device != "cuda":
        return {"status": "skipped", "reason": "the CUDA tests need a GPU"}
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"status": "skipped", "reason": "pytest is not installed here"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:logging", "--tb=short", "-m", "cuda", "tests"],
        cwd=ROOT, capture_output=True, text=True, timeout=args.tests_timeout_s,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])},
    )
    write_atomic(args.out / "cuda_tests.log", done.stdout + done.stderr)
    tail = done.stdout.strip().splitlines()[-1:] or [""]
    return {"status": "ok" if done.returncode == 0 else "failed", "summary": tail[0], "output_tail": done.stdout[-4000:]}


def compiled(args: argparse.Namespace) -> Result:
    device = torch.device(args.device)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256), nn.LayerNorm(256)).to(device)
    x = torch.randn(16, 256, device=device)
    prof = layerscope.profile(torch.compile(model), x)
    run = prof.compiled
    assert run is not None
    total = sum(k.time_ns for k in run.kernels)
    matched = [k for k in run.kernels if k.modules]
    return {
        "kernels": len(run.kernels), "matched_to_modules": len(matched),
        "apportioned_over_several": sum(k.shared for k in matched),
        "matched_time_share": sum(k.time_ns for k in matched) / total if total else None,
        "graph_breaks": len(run.graph_breaks), "problems": _problems(prof),
        "kernels_with_device_time": sum(1 for k in run.kernels if k.device_ns is not None),
        "block": _compiled_block(model, x, device),
    }


def _compiled_block(model: nn.Module, x: torch.Tensor, device: torch.device) -> Result:
    """A compiled AdamW loop in a 4-step block, and torch.profiler's own trace of one
    more step of the user's compiled model: each kernel call of the trace is paired with
    the block's by its place in its graph call (the same kernel names in the same order),
    and each module's device time from the trace (split by the block's shares) is set
    against the block's median (issue 36's check of a compiled step on a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    from layerscope.attribute.compiled import event_name

    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        compiled(x).pow(2).mean().backward()
        opt.step()

    step()
    _sync(device)
    with layerscope.Profiler(compiled) as prof:
        for _ in range(4):
            step()
            prof.step()
    _sync(device)
    profile_ = prof.profile
    run = profile_.compiled
    assert run is not None
    found: Result = {
        "steps": profile_.figures.steps, "step_compiles": [c.to_dict() for c in run.step_compiles],
        "kernels": len(run.kernels), "kernels_with_device_time": sum(1 for k in run.kernels if k.device_ns is not None),
        "problems": _problems(profile_),
    }
    if device.type != "cuda":
        found["against_torch_trace"] = "skipped: no device time on the CPU"
        return found
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as traced:
        step()
        _sync(device)
    calls = [e for e in traced.events() if e.name.startswith("## Call CompiledFxGraph")]
    ours: dict[str, list[Any]] = {}
    for kernel in run.kernels:
        ours.setdefault(kernel.graph, []).append(kernel)
    from_trace: dict[tuple[str, str], float] = {}
    paired = 0
    for call in calls:
        children = sorted(call.cpu_children, key=lambda c: c.time_range.start)
        names = [c.name for c in children]
        for kernels in ours.values():
            expected = [event_name(k.call) or k.call.rsplit(":", 1)[0] for k in kernels]
            if expected != names:
                continue
            for kernel, child in zip(kernels, children, strict=True):
                paired += 1
                for path, share in kernel.modules.items():
                    site = (path, kernel.phase)
                    from_trace[site] = from_trace.get(site, 0.0) + child.device_time_total * 1000 * share
            break
    worst = None
    for (path, phase), ns in from_trace.items():
        node = profile_.node(path) if path else profile_.root
        stats = node.backward if phase == "backward" else node.forward
        mine = None if stats is None else stats.self_device_time_ns
        if mine is None or ns < 50_000:  # modules of 50 us or more
            continue
        off = abs(mine - ns) / ns
        if worst is None or off > worst[0]:
            worst = (off, path, phase, mine, round(ns))
    found.update(
        against_torch_trace={"graph_calls": len(calls), "kernel_calls_paired": paired, "modules_compared": len(from_trace)},
        worst_module_off=None if worst is None else {
            "off": round(worst[0], 4), "module": worst[1], "phase": worst[2], "block_ns": worst[3], "trace_ns": worst[4],
        },
    )
    return found


def ddp(args: argparse.Namespace, out: Path) -> Result:
    import torch.distributed as dist

    backend = "nccl" if args.device == "cuda" else "gloo"
    if backend == "nccl" and not dist.is_nccl_available():
        return {"status": "skipped", "reason": "this torch has no NCCL"}
    store = tempfile.NamedTemporaryFile(dir=out, delete=False)
    store.close()
    dist.init_process_group(backend, init_method=f"file://{store.name}", rank=0, world_size=1)
    try:
        device = torch.device(args.device)
        model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
        wrapped = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.01)
        x = torch.randn(32, 512, device=device)
        with layerscope.Profiler(wrapped) as prof:
            for _ in range(3):
                opt.zero_grad()
                wrapped(x).sum().backward()
                opt.step()
                prof.step()
        profile = prof.profile
        moved = sum(stats.comm_bytes or 0 for node in profile.nodes() for _, stats in node.phases())
        waiting = sum(p.forward.cpu_time_ns for p in profile.parts if p.kind == "communication")
        return {"backend": backend, "comm_bytes": moved, "waiting_ns": waiting, "problems": _problems(profile)}
    finally:
        dist.destroy_process_group()
        os.unlink(store.name)


def _kernels_per_step(window: dict[str, Any]) -> list[int]:
    """The union of the device work (kernels, memcpys, memsets) inside each recorded
    ``layerscope.step`` range of the owner thread: the step's device busy time, read
    straight from the recorded events (not through layerscope's conversion)."""
    from layerscope.base.intervals import union_ns
    from layerscope.convert.ranges import STEP_NAME

    result = window["result"]
    steps = sorted((n[2], n[3]) for n in result["tree"] if n[1] == STEP_NAME)
    work = [(e[4], e[5]) for e in result["events"] if e[0] != "CPU" and not e[1] and e[2] != "[memory]" and e[3] > 0]
    return [union_ns((a, b) for a, b in work if t0 <= a < t1) for t0, t1 in steps]


def record(args: argparse.Namespace, out: Path) -> Result:
    """Recorded captures for the suite to replay (``layerscope.capture.replay``): each
    workload's block windows as torch's profiler handed them over, with torch's own
    trace of the same session read back by ``layerscope.load`` as the oracle."""
    from layerscope.capture import replay

    target = args.record or out / "captures"
    target.mkdir(parents=True, exist_ok=True)
    results: Result = {}
    workloads = (
        ("bert_base_fwd", bert, False, torch.float32, 2),
        ("gpt2_adamw_train", gpt2, True, torch.float32, 2),
        ("gpt2_ckpt_train", gpt2_ckpt, True, torch.float32, 1),
        ("llama_bf16_train", llama, True, torch.bfloat16, 1),
    )
    for name, build, train, dtype, steps in workloads:
        results[name] = _part(
            lambda name=name, build=build, train=train, dtype=dtype, steps=steps: _record_one(  # type: ignore[misc]
                name, build, train, dtype, steps, args, out, target, replay
            )
        )
        print(f"  record {name}: {results[name].get('status')} {results[name].get('error', '')}", flush=True)
    results["ddp_nccl_train"] = _part(lambda: _record_ddp(args, out, target, replay))
    results["compiled_mlp_train"] = _part(lambda: _record_compiled(args, target, replay))
    failed = [name for name, part in results.items() if part.get("status") == "failed"]
    if failed:
        results["status"] = "failed"
        results["error"] = f"recording failed for {', '.join(failed)}"
    return results


def _record_compiled(args: argparse.Namespace, target: Path, replay: Any) -> Result:
    """The zoo MLP compiled, 3 AdamW steps in a block (batch 8): its windows and graphs,
    replayed here at once (it must give the live profile again)."""
    from layerscope import zoo

    device = torch.device(args.device)
    entry = zoo.get("mlp")
    torch.manual_seed(0)
    model = entry.build().to(device)
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = entry.example_inputs(8).to(device)
    with replay.CompiledRecorder() as recorder, layerscope.Profiler(compiled) as prof:
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            compiled(x).pow(2).mean().backward()
            opt.step()
            prof.step()
    live = prof.profile
    # A capture recorded on the CPU (the suite's own, made by --device cpu) is named apart.
    name = "compiled_mlp_train" if device.type != "cpu" else "compiled_mlp_train_cpu"
    data = replay.compiled_recording(recorder, live, about=f"{name}: zoo mlp, batch 8, 3 steps on {args.device}")
    replayed = replay.replay_compiled(data, entry.build(), entry.example_inputs(8))
    same = replay.node_figures(replayed) == data["live"]
    path = target / f"{name}.json.gz"
    replay.save_json(data, path)
    return {
        "path": str(path), "bytes": path.stat().st_size, "replays_the_same": same,
        "kernels_with_device_time": sum(1 for k in data["kernels"] if k.get("device_ns") is not None),
        "problems": _problems(live) + _problems(replayed),
    }


def _record_one(name: str, build: Callable[..., Any], train: bool, dtype: torch.dtype, steps: int,
                args: argparse.Namespace, out: Path, target: Path, replay: Any) -> Result:
    device = torch.device(args.device)
    model, inputs = build(args.quick, device, dtype)
    case = Case(name, model, inputs, train, device)
    for _ in range(3):
        case.step()  # kernels chosen, AdamW's state made
    _sync(device)
    return _record_block(name, model, case.step, steps, out, target, replay, device)


def _record_block(name: str, model: nn.Module, step: Callable[[], None], steps: int, out: Path, target: Path,
                  replay: Any, device: torch.device) -> Result:
    # torch's own traces of the session are large: read here, kept only with --keep-traces.
    trace_dir = out / f"trace_{name}" if KEEP_TRACES else Path(tempfile.mkdtemp(prefix=f"layerscope-{name}-"))
    trace_dir.mkdir(exist_ok=True)
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
    with replay.WindowRecorder(trace_dir) as recorder:
        with layerscope.Profiler(model) as prof:
            for _ in range(steps):
                step()
                prof.step()
            _sync(device)
            leaving = time.perf_counter()
        exit_s = time.perf_counter() - leaving
    peak = torch.cuda.max_memory_allocated(device) if on_gpu else None
    live = prof.profile
    traced = [layerscope.load(path, model=model) for path in recorder.traces]
    truth = {
        "trace_nodes": [replay.node_figures(t) for t in traced],
        "kernels_per_step_ns": [ns for w in recorder.windows for ns in _kernels_per_step(w)],
        "max_memory_allocated": peak,
        "device_peak": live.memory.device.to_dict() if live.memory is not None and live.memory.device else None,
        "device_name": torch.cuda.get_device_name(device) if on_gpu else "CPU",
    }
    data = replay.recording(recorder, model, live, truth=truth, about=f"{name}: {steps} step(s) on {truth['device_name']}")
    path = target / f"{name}.json.gz"
    replay.save(data, path)
    # The figures the tests check, seen here first.
    figures = replay.node_figures(live)
    traced_figures = truth["trace_nodes"][0] if truth["trace_nodes"] else {}
    worst = _worst_disagreement(figures, traced_figures, steps)
    replayed = replay.replay(replay.load(path))
    again = replay.node_figures(replayed)
    same = replayed.to_dict() == live.to_dict()
    return {
        "file_bytes": path.stat().st_size, "exit_s": exit_s, "problems": _problems(live),
        "root_fwd_device_ms_per_step": (live.root.forward.device_time_ns or 0) / 1e6 / steps,
        "root_bwd_device_ms_per_step": ((live.root.backward.device_time_ns or 0) / 1e6 / steps) if live.root.backward else None,
        "kernels_per_step_ms": [ns / 1e6 for ns in truth["kernels_per_step_ns"]],
        "worst_node_vs_trace": worst, "replay_equals_live": again == figures, "replay_same_document": same,
        "max_memory_allocated": peak, "device_peak": truth["device_peak"],
    }


def _worst_disagreement(live: dict[str, Any], traced: dict[str, Any], steps: int) -> Any:
    """The node whose device total differs most between the live profile and torch's own
    trace of the same session (relative, among nodes over 1% of the root's)."""
    root = max((v[1] or 0) + (v[3] or 0) for v in live.values()) if live else 0
    worst: Any = None
    for key, values in live.items():
        other = traced.get(key)
        if other is None:
            continue
        for i in (1, 3):
            a, b = values[i], other[i]
            if a is None or b is None or max(a, b) < 0.01 * root:
                continue
            rel = abs(a - b) / max(a, b)
            if worst is None or rel > worst[1]:
                worst = [f"{key}[{i}]", rel, a, b]
    return worst


def _record_ddp(args: argparse.Namespace, out: Path, target: Path, replay: Any) -> Result:
    import torch.distributed as dist

    store = tempfile.NamedTemporaryFile(dir=out, delete=False)
    store.close()
    device = torch.device(args.device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{store.name}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        width = 64 if args.quick else 2048
        model = nn.Sequential(
            nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
            nn.Linear(width, 10),
        ).to(device)
        wrapped = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.01)
        x = torch.randn(64, width, device=device)

        def step() -> None:
            opt.zero_grad()
            wrapped(x).sum().backward()
            opt.step()

        for _ in range(3):
            step()
        _sync(device)
        return _record_block("ddp_nccl_train", wrapped, step, 2, out, target, replay, device)
    finally:
        dist.destroy_process_group()
        os.unlink(store.name)


def exit_scaling(args: argparse.Namespace) -> Result:
    """A GPT-2 AdamW block's exit for 2, 5 and 11 steps, beside torch.profiler's own
    stop (shapes and memory) for the same steps: both should grow linearly."""
    device = torch.device(args.device)
    model, inputs = gpt2(args.quick, device, torch.float32)
    case = Case("gpt2", model, inputs, True, device)
    for _ in range(2):
        case.step()
    rows = []
    for steps in (2, 5, 11):
        row: Result = {"steps": steps}
        for kind, key in (("layerscope", "layerscope_exit_s"), ("torch.profiler", "torch_profiler_stop_s")):
            with _variant(kind, case) as step:
                for _ in range(steps):
                    step()
                _sync(device)
                leaving = time.perf_counter()
            row[key] = time.perf_counter() - leaving
            row[key.replace("exit", "read").replace("stop", "read")] = _first_read(kind)
        row["ratio"] = row["layerscope_exit_s"] / row["torch_profiler_stop_s"]
        print(f"  exit, {steps} steps: layerscope {row['layerscope_exit_s']:.2f} s, torch.profiler "
              f"{row['torch_profiler_stop_s']:.2f} s; first read {row['layerscope_read_s']:.2f} s, "
              f"{row['torch_profiler_read_s']:.2f} s", flush=True)
        rows.append(row)
    return {"rows": rows}


def exit_profile(args: argparse.Namespace) -> Result:
    """Where a GPT-2 AdamW block's exit goes: cProfile of one 11-step block's exit, the
    functions with the most cumulative time."""
    import cProfile
    import io
    import pstats

    device = torch.device(args.device)
    model, inputs = gpt2(args.quick, device, torch.float32)
    case = Case("gpt2", model, inputs, True, device)
    for _ in range(2):
        case.step()
    block = layerscope.Profiler(model)
    block.__enter__()
    for _ in range(11):
        case.step()
        block.step()
    _sync(device)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    block.__exit__(None, None, None)
    _ = block.profile  # the last window is read on first use
    profiler.disable()
    seconds = time.perf_counter() - started
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
    lines = [line for line in text.getvalue().splitlines() if line.strip()]
    return {"exit_s": seconds, "top": lines[-32:]}


def _part(run: Callable[[], Result]) -> Result:
    started = time.perf_counter()
    try:
        result = run()
    except Exception as exc:  # a failed part is reported, and the check goes on
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:],
                "seconds": time.perf_counter() - started}
    result.setdefault("status", "ok")
    result["seconds"] = time.perf_counter() - started
    return result


# -- the report ------------------------------------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# layerscope GPU check, {report['date']}", "", f"- device: {report['device_name']}",
             f"- torch {report['torch']}, CUDA {report['cuda']}, Python {report['python']}",
             f"- mode: {'quick' if report['quick'] else 'full'}, {report['seconds']:.0f} s", "",
             "| part | status | seconds | figures |", "| --- | --- | --- | --- |"]
    for name, part in report["parts"].items():
        figures = {k: v for k, v in part.items() if k not in ("status", "seconds", "traceback", "output_tail")}
        text = json.dumps(figures, default=str)
        lines.append(f"| {name} | {part.get('status')} | {part.get('seconds', 0):.1f} | `{text[:400]}` |")
    skipped = [f"- {name}: {part['reason']}" for name, part in report["parts"].items() if part.get("status") == "skipped"]
    if skipped:
        lines += ["", "Skipped:", *skipped]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The whole GPU check of layerscope in one command (see the module docstring).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python benchmarks/gpu.py --out gpu-report\n"
        "  python benchmarks/gpu.py --out gpu-report --budget-s 400   # stop starting parts after 400 s\n"
        "  python benchmarks/gpu.py --out smoke --device cpu --quick   # CI's smoke mode\n",
    )
    parser.add_argument("--out", required=True, type=Path, help="folder for report.md, report.json and the HTML reports")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="small models and few rounds (the CPU smoke mode)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no part after this many seconds (those left are reported skipped); "
                        "the report is rewritten after every part, so a run cut off keeps what finished")
    parser.add_argument("--tests-timeout-s", type=float, default=300, help="limit for the CUDA tests (default 300)")
    parser.add_argument("--only", action="append", default=None, metavar="PART", help="run only this part (repeatable)")
    parser.add_argument("--keep-traces", action="store_true", help="keep the torch.profiler traces in OUT")
    parser.add_argument("--record", type=Path, default=None, metavar="DIR",
                        help="where the record part writes its captures for the suite to replay "
                        "(default OUT/captures; the suite reads tests/data/captures)")
    args = parser.parse_args(argv)
    global KEEP_TRACES
    KEEP_TRACES = args.keep_traces
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; use --device cpu for the smoke mode")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "CPU",
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "quick": args.quick, "seconds": 0.0, "parts": {},
    }
    parts: dict[str, Result] = report["parts"]
    for key, run in _plan(args):
        if args.only and key not in args.only:
            continue
        if args.budget_s is not None and time.perf_counter() - started > args.budget_s:
            parts[key] = {"status": "skipped", "reason": f"past the time budget of {args.budget_s:.0f} s"}
        else:
            parts[key] = _part(run)
        report["seconds"] = time.perf_counter() - started
        print(f"[{report['seconds']:6.0f} s] {key}: {parts[key].get('status')}", flush=True)
        write_atomic(args.out / "report.json", json.dumps(report, indent=1, default=str))
        write_atomic(args.out / "report.md", markdown(report))
    print(markdown(report))
    failed = [name for name, part in parts.items() if part.get("status") == "failed"]
    if failed:
        print(f"failed: {', '.join(failed)} (see report.json for the errors)", file=sys.stderr)
    return 1 if failed else 0


def _plan(args: argparse.Namespace) -> Iterator[tuple[str, Callable[[], Result]]]:
    """The parts, most telling first, so that a time budget drops the least."""
    yield "cuda_tests", lambda: cuda_tests(args)

    def model_part(name: str, build: Callable[..., Any], train: bool, dtype: torch.dtype) -> Callable[[], Result]:
        if _transformers() is None:
            return lambda: {"status": "skipped", "reason": "transformers is not installed here"}
        return lambda: check_model(name, build, train, dtype, args, args.out)

    yield "record", lambda: record(args, args.out)
    # The compiled path has run on no GPU yet (its device time, each module against torch's trace): early.
    yield "compiled", lambda: compiled(args)
    models = (("bert_base_forward", bert, False), ("gpt2_adamw_step", gpt2, True))
    for name, build, train in models:
        yield f"{name}_float32", model_part(name, build, train, torch.float32)
    yield "exit_scaling", lambda: exit_scaling(args)
    yield "exit_profile", lambda: exit_profile(args)
    yield "ddp_one_device", lambda: ddp(args, args.out)
    if args.device == "cuda":
        for name, build, train in models:
            yield f"{name}_bfloat16", model_part(name, build, train, torch.bfloat16)


if __name__ == "__main__":
    sys.exit(main())
