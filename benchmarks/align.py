"""Reading traces without module events: how fast the aligner is, what an aligned read
costs against a with-stack read, and what ``with_stack`` costs the run it records.

A torch.profiler trace recorded without ``with_stack=True`` has no ``nn.Module`` events;
given the model (and its inputs), layerscope learns the model's call template from one
run of a meta copy (``capture/template.py``) and aligns each step's ops to it
(``convert/align.py``). Three measurements, in one run:

1. **The aligner** (``layerscope.convert.align.align``) on op-name streams of about
   ``--sizes`` ops: the call template of ``--template`` (a model of
   ``tests/trace_models.py``, learned with ``call_template``) repeated a whole number of
   times (the nearest to the size, at least once), then seeded mismatches, op by op: 2%
   deleted, 1% replaced by, and 1% followed by, a library version's drift op
   (``aten::contiguous`` or ``aten::reshape``). And the exact fast path: the template
   repeated to about 20,000 ops, unchanged. Each stream's alignment is timed once per
   round, the streams interleaved, the order rotated each round; medians, and ms per
   1,000 ops against the smallest stream's (1.00 everywhere is linear). One more,
   untimed, call per stream counts the time spent in ``rapidfuzz``'s
   ``Indel.distance``: the search for the step's number of model calls. Targets: a
   20k-op step with mismatches in under 50 ms; never quadratic (the growth exponent
   between two sizes, log(time ratio) / log(size ratio): 1 is linear, 2 quadratic;
   taken as met at 1.5 or less).
2. **Reading a trace without module events** against reading it with them, for the real
   H100 traces of ``--traces`` (``../shared/traces/``): each trace is written to a
   temporary file without its ``python_function`` events (what ``with_stack=False``
   would have recorded), then, interleaved: ``layerscope.load(original, model=model)``
   (the with-stack read), ``layerscope.load(stripped, model=model, inputs=inputs)`` (the
   aligned read, learning the template included) and ``call_template`` alone (autograd
   on for the training step, as the read asks for it). Medians, and the aligned read's
   ratio to the with-stack read.
3. **What the recording flags cost the run they record**, on this machine's CPU: one
   forward under ``no_grad`` of each of ``--models`` (the zoo ``gpt``, batch 1; BERT-base
   from transformers' default config, random weights, batch 1 x 128), plain and under
   ``torch.profiler.profile(activities=[CPU])`` with default flags,
   ``+record_shapes``, ``+with_stack``, and both. Each round runs every variant once, the
   order rotated: a profiler session (none for plain), ``--warm`` steps, then the timed
   steps (``prof.step()`` after each; at least ``--steps``, more for a model whose step
   is short, so that a session times about ``--session-ms``), then the session's exit, timed
   apart (the profiler's stop: collecting what it recorded). Median step time, and its
   ratio to plain.

Medians over ``--rounds`` rounds; ratios are to a baseline measured in the same run. A
target missed is printed as NOT met.

Usage: python benchmarks/align.py [--rounds 5] [--sizes 1000,5000,20000,80000]
       [--template h100_owlv2_inference] [--traces STEM,...] [--models gpt,bert]
       [--warm 2] [--steps 5] [--session-ms 200] [--quick]
       [--no-aligner] [--no-reads] [--no-recording]
"""

from __future__ import annotations

import argparse
import gc
import gzip
import itertools
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

import layerscope
from layerscope.capture.kineto import quiet_fd2
from layerscope.capture.template import call_template
from layerscope.convert.align import ALIGNED, CallTemplate, align

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from benchmarks.traces import steps_ms  # noqa: E402
from trace_models import TRACE_MODELS  # noqa: E402

#: The traces of part 2; OWLv2 (132,152 events, five model calls) is left out by --quick.
READS = ["h100_bert_base_fwd", "h100_gpt2_adamw_train", "h100_owlv2_inference"]
#: The traces whose step ran backward: their read learns the template with autograd on.
TRAINING = {"h100_gpt2_adamw_train", "h100_gpt2_ckpt_train", "h100_llama_bf16_train",
            "mi300x_norm_layers_fwd_bwd", "h100_ddp_nccl_train", "a100_alexnet_no_modules",
            "mi300x_resnet_ddp_actckpt_train_rank0"}
#: What a library version adds or puts in place of an op (part 1's mismatches).
DRIFT = ("aten::contiguous", "aten::reshape")
DELETED, REPLACED, INSERTED = 0.02, 0.01, 0.01
TARGET_MS, TARGET_OPS, MAX_EXPONENT = 50.0, 20_000, 1.5
EXACT = f"~{TARGET_OPS:,} ops, exact"


def _rotated(items: list[Any], round_index: int) -> list[Any]:
    shift = round_index % len(items)
    return items[shift:] + items[:shift]


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _verdict(met: bool) -> str:
    return "met" if met else "**NOT met**"


@contextmanager
def _quiet() -> Iterator[None]:
    """torch's profiler backend's lines off stderr (a template is learned under the
    profiler), and layerscope's warnings about the traces' wrappers and losses off."""
    with quiet_fd2(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# -- 1. the aligner ------------------------------------------------------------------------


def drifted(template: CallTemplate, size: int, seed: int) -> tuple[list[str], int]:
    """The template repeated the whole number of times nearest ``size`` ops (at least
    once), with seeded mismatches; and the number of repetitions."""
    passes = max(1, round(size / len(template.ops)))
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(passes):
        for name in template.ops:
            draw = rng.random()
            if draw < DELETED:
                continue
            if draw < DELETED + REPLACED:
                out.append(rng.choice(DRIFT))
                continue
            out.append(name)
            if draw < DELETED + REPLACED + INSERTED:
                out.append(rng.choice(DRIFT))
    return out, passes


@contextmanager
def _distance_clock(spent: list[int]) -> Iterator[None]:
    """``rapidfuzz.distance.Indel.distance`` timed while the block runs: each call's ns
    appended to ``spent`` (``align`` looks it up at each call)."""
    from rapidfuzz.distance import Indel

    real = Indel.distance

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return real(*args, **kwargs)
        finally:
            spent.append(time.perf_counter_ns() - start)

    Indel.distance = timed
    try:
        yield
    finally:
        Indel.distance = real


def aligner(stem: str, sizes: list[int], rounds: int) -> list[str]:
    model, inputs = TRACE_MODELS[stem]()
    with _quiet():
        start = time.perf_counter()
        template = call_template(model, inputs, grad=stem in TRAINING)
        learned_s = time.perf_counter() - start
    n = len(template.ops)
    streams: dict[str, tuple[list[str], int]] = {}
    for size in sizes:
        streams[f"~{size:,} ops, mismatches"] = drifted(template, size, seed=size)
    exact_passes = max(1, round(TARGET_OPS / n))
    streams[EXACT] = (list(template.ops) * exact_passes, exact_passes)

    results = {label: align(names, template) for label, (names, _) in streams.items()}  # warm-up, and checked
    times: dict[str, list[int]] = {label: [] for label in streams}
    for index in range(rounds):
        for label in _rotated(list(streams), index):
            names = streams[label][0]
            gc.collect()
            start = time.perf_counter_ns()
            align(names, template)
            times[label].append(time.perf_counter_ns() - start)
    searched: dict[str, list[int]] = {}
    for label, (names, _) in streams.items():
        searched[label] = []
        with _distance_clock(searched[label]):
            align(names, template)

    medians_ms = {label: statistics.median(values) / 1e6 for label, values in times.items()}
    mismatched = [label for label in streams if label != EXACT]
    base_label = mismatched[0]
    base_per_k = medians_ms[base_label] / len(streams[base_label][0]) * 1000
    lines = [
        f"## 1. The aligner: `align(names, template)`, the {stem} template",
        "",
        f"The template: {n:,} ops in {len(template.call_module):,} module calls (learned in {learned_s:.2f} s). "
        f"Mismatches: {DELETED:.0%} of ops deleted, {REPLACED:.0%} replaced by and {INSERTED:.0%} followed by "
        f"`{'` or `'.join(DRIFT)}`, seeded. {_n(rounds, 'round')}, streams interleaved, medians.",
        "",
        "| stream | ops | passes built / found | ops aligned | median ms | ms per 1k ops | per 1k x smallest "
        "| in `Indel.distance` (pass count) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, (names, passes) in streams.items():
        got = results[label]
        share = sum(1 for how in got.how if how == ALIGNED) / len(names)
        ms = medians_ms[label]
        per_k = ms / len(names) * 1000
        spent = searched[label]
        search = f"{sum(spent) / 1e6:.1f} ms ({_n(len(spent), 'call')})" if spent else "none"
        fast = " (fast path)" if got.exact else ""
        lines.append(
            f"| {label}{fast} | {len(names):,} | {passes} / {got.passes} | {share:.1%} | {ms:.1f} | {per_k:.2f} "
            f"| {per_k / base_per_k:.2f} | {search} |"
        )
    lines.append("")
    # The target: the mismatched stream nearest 20k ops.
    near = min(mismatched, key=lambda label: abs(len(streams[label][0]) - TARGET_OPS))
    near_ms = medians_ms[near]
    near_enough = abs(len(streams[near][0]) - TARGET_OPS) <= TARGET_OPS / 4
    exponents = []
    for a, b in itertools.pairwise(mismatched):
        size_a, size_b = len(streams[a][0]), len(streams[b][0])
        if size_b > size_a and medians_ms[a] > 0:
            exponents.append((size_a, size_b, math.log(medians_ms[b] / medians_ms[a]) / math.log(size_b / size_a)))
    target = f"Target: a {TARGET_OPS // 1000}k-op step with mismatches in under {TARGET_MS:.0f} ms: "
    if near_enough:
        lines.append(f"{target}{_verdict(near_ms < TARGET_MS)} ({len(streams[near][0]):,} ops: {near_ms:.1f} ms).")
    else:
        lines.append(f"{target}not measured (no stream within 25% of {TARGET_OPS:,} ops).")
    if exponents:
        worst = max(e for _, _, e in exponents)
        growth = ", ".join(f"{a:,} to {b:,} ops: {e:.2f}" for a, b, e in exponents)
        lines.append(
            f"Never quadratic (growth exponent at most {MAX_EXPONENT}): {_verdict(worst <= MAX_EXPONENT)} ({growth})."
        )
    return [*lines, ""]


# -- 2. an aligned read against a with-stack read -------------------------------------------


def without_python_events(source: Path, target: Path) -> tuple[int, int]:
    """``source`` written to ``target`` (gzipped) without its ``python_function`` events;
    the events before and after."""
    with gzip.open(source, "rt") as handle:
        doc = json.load(handle)
    before = len(doc["traceEvents"])
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "python_function"]
    with gzip.open(target, "wt", compresslevel=6) as handle:
        json.dump(doc, handle)
    return before, len(doc["traceEvents"])


def reads(stems: list[str], rounds: int, folder: Path) -> list[str]:
    lines = [
        "## 2. Reading a trace without module events: `layerscope.load`, aligned against with-stack",
        "",
        f"{_n(rounds, 'round')}, the three variants of a trace interleaved, the order rotated each round; medians. "
        "The aligned read includes learning the template.",
        "",
        "| trace | events (without `python_function`) | with-stack read s | aligned read s | x with-stack "
        "| `call_template` alone s | aligned read less template s | ops: aligned / by neighbours / unplaced |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for stem in stems:
        source = SHARED_TRACES / f"{stem}.json.gz"
        stripped = folder / f"{stem}.json.gz"
        before, after = without_python_events(source, stripped)
        model, inputs = TRACE_MODELS[stem]()
        grad = stem in TRAINING
        placement: list[Any] = []

        def with_stack(source: Path = source, model: nn.Module = model) -> None:
            layerscope.load(source, model=model)

        def aligned(
            stripped: Path = stripped, model: nn.Module = model, inputs: Any = inputs, placement: list[Any] = placement,
        ) -> None:
            profile = layerscope.load(stripped, model=model, inputs=inputs)
            found = getattr(profile.meta, "modules_from", None)  # a trace's read is a Profile
            placement[:] = [getattr(found, "placement", None)]

        def template(model: nn.Module = model, inputs: Any = inputs, grad: bool = grad) -> None:
            call_template(model, inputs, grad=grad)

        variants: dict[str, Callable[[], None]] = {"with-stack": with_stack, "aligned": aligned, "template": template}
        times: dict[str, list[float]] = {name: [] for name in variants}
        with _quiet():
            for fn in variants.values():  # warm every path once
                fn()
            for index in range(rounds):
                for name in _rotated(list(variants), index):
                    gc.collect()
                    start = time.perf_counter()
                    variants[name]()
                    times[name].append(time.perf_counter() - start)
        med = {name: statistics.median(values) for name, values in times.items()}
        placed = placement[0]
        counts = "no placement counted" if placed is None else (
            f"{placed.aligned:,} / {placed.by_neighbours:,} / {placed.unplaced:,} of {placed.ops:,} "
            f"({placed.passes} pass{'es' if placed.passes != 1 else ''}"
            f"{', ' + str(len(placed.unaligned)) + ' not aligned' if placed.unaligned else ''})"
        )
        lines.append(
            f"| `{stem}` | {before:,} ({after:,}) | {med['with-stack']:.3f} | {med['aligned']:.3f} "
            f"| {med['aligned'] / med['with-stack']:.2f} | {med['template']:.3f} "
            f"| {med['aligned'] - med['template']:.3f} | {counts} |"
        )
        print(f"  ({stem} done)", file=sys.stderr, flush=True)
        del model, inputs, variants
        gc.collect()
    return [*lines, ""]


# -- 3. what the recording flags cost ------------------------------------------------------

#: The profiler's keyword arguments per variant; None: no profiler.
RECORDING: dict[str, dict[str, bool] | None] = {
    "plain (no profiler)": None,
    "`profile(activities=[CPU])`": {},
    "+ `record_shapes=True`": {"record_shapes": True},
    "+ `with_stack=True`": {"with_stack": True},
    "+ both": {"record_shapes": True, "with_stack": True},
}
PLAIN = "plain (no profiler)"


def gpt() -> tuple[str, nn.Module, Any]:
    from layerscope import zoo

    entry = zoo.get("gpt")
    torch.manual_seed(0)
    return "zoo `gpt`, batch 1", entry.build().eval(), entry.example_inputs(1)


def bert() -> tuple[str, nn.Module, Any]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig()).eval()  # BERT-base sizes, random weights
    ids = torch.randint(0, 30522, (1, 128), generator=torch.Generator().manual_seed(0))
    return "BERT-base encoder, batch 1 x 128", model, {"input_ids": ids}


MODELS: dict[str, Callable[[], tuple[str, nn.Module, Any]]] = {"gpt": gpt, "bert": bert}


def _session(kwargs: dict[str, bool] | None) -> AbstractContextManager[Any]:
    if kwargs is None:
        return nullcontext()
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], **kwargs)


def _block(step: Callable[[], None], kwargs: dict[str, bool] | None, warm: int, steps: int) -> tuple[float, float]:
    """One session: ``warm`` steps, then the mean of ``steps`` timed ones (ms), and the
    session's exit (ms)."""
    session = _session(kwargs)
    prof = session.__enter__()
    try:
        ms = steps_ms(step, prof.step if prof is not None else (lambda: None), warm, steps)
    except BaseException:
        session.__exit__(*sys.exc_info())
        raise
    start = time.perf_counter_ns()
    session.__exit__(None, None, None)
    return ms, (time.perf_counter_ns() - start) / 1e6


def recording(names: list[str], rounds: int, warm: int, min_steps: int, session_ms: float) -> list[str]:
    lines = [
        "## 3. What the recording flags cost the run they record (CPU, forward under `no_grad`)",
        "",
        f"{torch.get_num_threads()} torch threads; {_n(warm, 'warm step')} per session, then the timed steps; "
        f"{_n(rounds, 'round')}, the variants interleaved, the order rotated each round; medians.",
        "",
        "| model | variant | median step ms | x plain | x `profile()` | session exit ms |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for key in names:
        title, model, inputs = MODELS[key]()

        def step(model: nn.Module = model, inputs: Any = inputs) -> None:
            if isinstance(inputs, dict):
                model(**inputs)
            else:
                model(inputs)

        with torch.no_grad(), _quiet():
            for _ in range(warm + 2):  # the process's first steps of this model
                step()
            probe = []
            for _ in range(3):
                start = time.perf_counter_ns()
                step()
                probe.append((time.perf_counter_ns() - start) / 1e6)
            steps = max(min_steps, min(500, math.ceil(session_ms / max(statistics.median(probe), 1e-3))))
            times: dict[str, list[float]] = {name: [] for name in RECORDING}
            exits: dict[str, list[float]] = {name: [] for name in RECORDING}
            for index in range(rounds):
                for name in _rotated(list(RECORDING), index):
                    gc.collect()
                    ms, exit_ms = _block(step, RECORDING[name], warm, steps)
                    times[name].append(ms)
                    exits[name].append(exit_ms)
        med = {name: statistics.median(values) for name, values in times.items()}
        plain, profiled = med[PLAIN], med["`profile(activities=[CPU])`"]
        for at, name in enumerate(RECORDING):
            label = f"{title} ({steps} timed steps a session)" if at == 0 else ""
            exit_text = "" if RECORDING[name] is None else f"{statistics.median(exits[name]):.1f}"
            lines.append(
                f"| {label} | {name} | {med[name]:.3f} | {med[name] / plain:.3f} | {med[name] / profiled:.3f} | {exit_text} |"
            )
        print(f"  ({key} done)", file=sys.stderr, flush=True)
        del model, inputs
        gc.collect()
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks/align.py", description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved rounds of every variant of every part, the order rotated each round (default 5)")
    parser.add_argument("--sizes", default="1000,5000,20000,80000",
                        help="the aligner's stream sizes in ops, comma-separated (default 1000,5000,20000,80000)")
    parser.add_argument("--template", default="h100_owlv2_inference", choices=sorted(TRACE_MODELS),
                        help="the model of tests/trace_models.py whose call template the aligner's streams repeat "
                             "(default h100_owlv2_inference)")
    parser.add_argument("--traces", help=f"the traces of part 2, comma-separated (default {','.join(READS)}; "
                                         f"without OWLv2 under --quick)")
    parser.add_argument("--models", default="gpt,bert", help="the models of part 3: gpt, bert (default gpt,bert)")
    parser.add_argument("--warm", type=int, default=2, help="untimed steps at the start of each recording session (default 2)")
    parser.add_argument("--steps", type=int, default=5,
                        help="timed steps per recording session, at least; more where --session-ms need more (default 5)")
    parser.add_argument("--session-ms", type=float, default=200.0,
                        help="a recording session's timed steps last about this long, at least (default 200)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 1 round, streams of 1,000 and 5,000 ops, no OWLv2 trace, "
                             "the zoo gpt only, 1 warm step and 20 ms of timed steps a session")
    parser.add_argument("--no-aligner", action="store_true", help="skip the aligner (1.)")
    parser.add_argument("--no-reads", action="store_true", help="skip the reads (2.)")
    parser.add_argument("--no-recording", action="store_true", help="skip the recording flags (3.)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.sizes, args.models, args.warm, args.steps, args.session_ms = 1, "1000,5000", "gpt", 1, 1, 20.0
    stems = args.traces.split(",") if args.traces else [s for s in READS if not (args.quick and "owlv2" in s)]
    unknown = [s for s in stems if s not in TRACE_MODELS]
    if unknown:
        parser.error(f"no model in tests/trace_models.py for {unknown}")
    models = args.models.split(",")
    if any(m not in MODELS for m in models):
        parser.error(f"--models: choose among {', '.join(MODELS)}")
    sizes = sorted(int(s) for s in args.sizes.split(","))

    print(f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"{_n(args.rounds, 'round')}, medians\n", flush=True)
    if not args.no_aligner:
        print("\n".join(aligner(args.template, sizes, args.rounds)), flush=True)
    if not args.no_reads:
        missing = [s for s in stems if not (SHARED_TRACES / f"{s}.json.gz").exists()]
        if missing:
            print(f"## 2. skipped: the real traces are not here (expected {', '.join(missing)} in {SHARED_TRACES}; "
                  "see its README.md)\n", flush=True)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                print("\n".join(reads(stems, args.rounds, Path(tmp))), flush=True)
    if not args.no_recording:
        print("\n".join(recording(models, args.rounds, args.warm, args.steps, args.session_ms)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
