"""Fidelity: do the module times of a ``layerscope.Profiler`` block match the modules'
times when nothing but two clock reads per call is added?

For each model, in one process, rounds interleave four variants of the same work
(a no_grad forward, or a training step with AdamW):

- *plain*: the work alone;
- *reference*: the work under two global forward hooks that read ``perf_counter_ns``
  (the lightest possible per-module measurement), plus, for training steps, full
  backward hooks on leaf modules for their backward spans; written here, independent
  of layerscope;
- *layerscope*: a ``layerscope.Profiler`` block running ``steps`` steps with
  ``prof.step()`` after each; every step is timed and detailed (ops, shapes, FLOPs,
  memory) by one run of torch's profiler;
- *light block*: the same block with ``detail="first"``: its first step recorded in
  detail (ops, shapes, FLOPs, memory), the others timed lightly (torch's profiler without
  shapes or memory), each module's time its mean over those;
- *aligned block*: ``detail="first", hooks="first"``: the light steps run no module
  hook (torch's profiler alone); their ops are aligned to the detailed step's calls;
- *tp alone*: ``torch.profiler.profile(activities=[CPU])`` with no shapes or memory,
  what a light step records;
- *one-step block*: ``steps`` blocks of one step each (``with Profiler(model): work()``),
  each after two unprofiled steps, as one step profiled in a running loop;
- *torchprof* and *deepspeed* (forward only): the drop-ins, one step per block or
  ``start_profile``/``stop_profile`` window, as people arriving from those tools run them;
- *torch.profiler*: ``torch.profiler.profile(record_shapes=True, profile_memory=True)``
  around the same steps: the same detail, torch's own way.

Then ``layerscope.profile`` (forward, and ``backward=True``), interleaved with the
reference: with ops (every pass recorded with shapes and memory, the median pass shown
whole) and with ``record_ops=False`` (module hooks alone; torch's profiler without
shapes for a step), each module's time against the reference's.

Reported per model: the median per-step wall time of each variant and its ratio to
plain; the root's forward time per step against plain (the time a user is shown); for
every module whose reference time is at least ``--min-us``, the ratio of each
layerscope variant's time to the reference's (forward totals; backward totals of leaf
modules in training steps), how many are within 15%, and the worst ones. Also the
1000 x ``Linear(16, 16)`` forward, where instrumentation per module dominates.

Usage: python -m benchmarks.fidelity [--rounds 15] [--steps 10] [--models bert,gpt2,gpt,tiny] [--profile-only | --blocks-only]
(``bert_base``: BERT-base, batch 1 x 128, is in ``--models`` only when named.)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module

import layerscope
from layerscope.capture.inputs import split_inputs
from layerscope.capture.training import first_float_tensor

TOLERANCE = 0.15


# -- models --------------------------------------------------------------------------


def bert() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from transformers import BertConfig, BertModel

    config = BertConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
    ids = torch.randint(0, config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    return BertModel(config), {"input_ids": ids}


def gpt2() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_layer=2, n_embd=256, n_head=4)
    ids = torch.randint(0, config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    return GPT2Model(config), {"input_ids": ids}


def zoo_gpt() -> tuple[nn.Module, Any]:
    from layerscope import zoo

    entry = zoo.get("gpt")
    return entry.build(), entry.example_inputs(2)


def tiny() -> tuple[nn.Module, torch.Tensor]:
    return nn.Sequential(*[nn.Linear(16, 16) for _ in range(1000)]), torch.randn(4, 16)


def bert_base() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from transformers import BertConfig, BertModel

    config = BertConfig()  # BERT-base sizes, random weights
    ids = torch.randint(0, config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(0))
    return BertModel(config), {"input_ids": ids}


MODELS: dict[str, Callable[[], tuple[nn.Module, Any]]] = {
    "bert": bert, "bert_base": bert_base, "gpt2": gpt2, "gpt": zoo_gpt, "tiny": tiny,
}


def call(model: nn.Module, inputs: Any) -> Any:
    args, kwargs = split_inputs(inputs)
    return model(*args, **kwargs)


def first_float(output: Any) -> torch.Tensor:
    found = first_float_tensor(output)
    assert found is not None
    return found


# -- the work ------------------------------------------------------------------------


class Work:
    """A forward (no_grad) or a training step of one model."""

    def __init__(self, model: nn.Module, inputs: Any, train: bool) -> None:
        self.model, self.inputs, self.train = model, inputs, train
        # lr=0: AdamW does all its work but the weights stay put, so every variant and
        # round runs the same model (drifting weights can reach denormal values).
        self.opt = torch.optim.AdamW(model.parameters(), lr=0.0) if train else None

    def __call__(self) -> None:
        if not self.train:
            with torch.no_grad():
                call(self.model, self.inputs)
            return
        assert self.opt is not None
        loss = first_float(call(self.model, self.inputs)).float().pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()


class Reference:
    """Per-module totals from two clock reads per call (and leaf backward spans)."""

    def __init__(self, model: nn.Module, backward: bool, forward: bool = True) -> None:
        self._forward = forward
        self.paths = {id(m): p for p, m in model.named_modules()}
        self.forward: dict[str, int] = {}
        self.backward: dict[str, int] = {}
        self._open: list[tuple[str, int]] = []
        self._bwd_open: dict[str, int] = {}
        self._handles: list[Any] = []
        self._leaves = [(p, m) for p, m in model.named_modules() if backward and not list(m.children()) and any(True for _ in m.parameters(recurse=False))]

    def __enter__(self) -> Reference:
        clock = time.perf_counter_ns
        paths = self.paths
        opened = self._open
        forward = self.forward

        def pre(module: nn.Module, args: Any) -> None:
            path = paths.get(id(module))
            if path is not None:
                opened.append((path, clock()))

        def post(module: nn.Module, args: Any, output: Any) -> None:
            if paths.get(id(module)) is not None:
                path, t0 = opened.pop()
                forward[path] = forward.get(path, 0) + clock() - t0

        self._handles = []
        if self._forward:
            self._handles += [
                nn_module.register_module_forward_pre_hook(pre),
                nn_module.register_module_forward_hook(post, always_call=True),
            ]
        for path, module in self._leaves:

            def bpre(module: nn.Module, grad_output: Any, path: str = path) -> None:
                self._bwd_open[path] = clock()

            def bpost(module: nn.Module, grad_input: Any, grad_output: Any, path: str = path) -> None:
                t0 = self._bwd_open.pop(path, None)
                if t0 is not None:
                    self.backward[path] = self.backward.get(path, 0) + clock() - t0

            self._handles.append(module.register_full_backward_pre_hook(bpre))
            self._handles.append(module.register_full_backward_hook(bpost))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()


def timed_steps(work: Work, steps: int, mark: Callable[[], None] = lambda: None) -> float:
    """Median wall time per step of ``steps`` steps, ``mark()`` after each (untimed)."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        work()
        times.append(time.perf_counter_ns() - t0)
        mark()
    return statistics.median(times)


def run_model(
    name: str, train: bool, rounds: int, steps: int, min_us: float, blocks_only: bool = False,
) -> dict[str, Any]:
    from layerscope.compat import deepspeed, torchprof

    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model.train(train)
    work = Work(model, inputs, train)
    for _ in range(5):
        work()
    ours = ["layerscope", "light block", "aligned block"] + (
        [] if blocks_only else ["one-step block"] + ([] if train else ["torchprof", "deepspeed"])
    )
    walls: dict[str, list[float]] = {v: [] for v in ["plain", "reference", *ours, "torch.profiler", "tp alone"]}
    ref_fwd: dict[str, list[float]] = {}
    ref_bwd: dict[str, list[float]] = {}
    # Per variant and phase: each module's time per step, one value per round.
    found: dict[str, dict[str, dict[str, list[float]]]] = {v: {"forward": {}, "backward": {}} for v in ours}

    def keep(variant: str, profiles: list[Any]) -> None:
        """Each module's time per step, from one or more profiles of one round."""
        # A light block's nodes hold their means per step already; other profiles sum.
        total_steps = sum(1 if p.figures.detailed_steps else p.figures.steps for p in profiles)
        for phase in ("forward", "backward"):
            sums: dict[str, int] = {}
            for profile in profiles:
                for node in profile.modules():
                    stats = getattr(node, phase)
                    if stats is not None and node.profiled:
                        sums[node.path] = sums.get(node.path, 0) + stats.cpu_time_ns
            for path, ns in sums.items():
                found[variant][phase].setdefault(path, []).append(ns / total_steps)

    def plain_variant() -> None:
        walls["plain"].append(timed_steps(work, steps))

    def reference_variant() -> None:
        # Forward hooks only: the forward reference. Backward spans come from a variant
        # of their own, since full backward hooks add autograd nodes to the forward too.
        with Reference(model, backward=False) as ref:
            walls["reference"].append(timed_steps(work, steps))
        for path, ns in ref.forward.items():
            ref_fwd.setdefault(path, []).append(ns / steps)

    def backward_reference_variant() -> None:
        with Reference(model, backward=True, forward=False) as ref:
            timed_steps(work, steps)
        for path, ns in ref.backward.items():
            ref_bwd.setdefault(path, []).append(ns / steps)

    def layerscope_variant() -> None:
        with layerscope.Profiler(model) as prof:
            walls["layerscope"].append(timed_steps(work, steps, prof.step))
        keep("layerscope", [prof.profile])

    def light_variant() -> None:
        with layerscope.Profiler(model, detail="first") as prof:
            walls["light block"].append(timed_steps(work, steps, prof.step))
        keep("light block", [prof.profile])

    def aligned_variant() -> None:
        with layerscope.Profiler(model, detail="first", hooks="first") as prof:
            walls["aligned block"].append(timed_steps(work, steps, prof.step))
        keep("aligned block", [prof.profile])

    def torch_alone_variant() -> None:
        # What a light step of hooks="first" records: torch's profiler, no shapes or memory.
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            walls["tp alone"].append(timed_steps(work, steps))

    def blocks(variant: str, block: Callable[[], Any]) -> None:
        """``steps`` blocks of one step each; the step's own wall time, inside the block.
        Two unprofiled steps run before each block, as in a loop where one step is
        profiled: the step is not cooled by the previous block's finalizing."""
        times, profiles = [], []
        for _ in range(steps):
            work()
            work()
            ns, profile = block()
            times.append(ns)
            profiles.append(profile)
        walls[variant].append(statistics.median(times))
        keep(variant, profiles)

    def step_in(make_block: Callable[[nn.Module], Any]) -> Callable[[], tuple[int, Any]]:
        """One step in a with-block of ``make_block(model)``: its wall time and profile."""

        def run() -> tuple[int, Any]:
            with make_block(model) as prof:
                t0 = time.perf_counter_ns()
                work()
                ns = time.perf_counter_ns() - t0
            return ns, prof.profile

        return run

    def deepspeed_step() -> tuple[int, Any]:
        flops = deepspeed.FlopsProfiler(model)
        flops.start_profile()
        t0 = time.perf_counter_ns()
        work()
        ns = time.perf_counter_ns() - t0
        flops.stop_profile()
        profile = flops.profile
        flops.end_profile()
        return ns, profile

    def torch_variant() -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities, record_shapes=True, profile_memory=True):
            walls["torch.profiler"].append(timed_steps(work, steps))

    variants = [
        plain_variant, reference_variant, layerscope_variant, light_variant, aligned_variant, torch_variant,
        torch_alone_variant,
    ]
    if not blocks_only:
        variants.append(lambda: blocks("one-step block", step_in(layerscope.Profiler)))
    if train:
        variants.append(backward_reference_variant)
    elif not blocks_only:
        variants += [lambda: blocks("torchprof", step_in(torchprof.Profile)), lambda: blocks("deepspeed", deepspeed_step)]
    # One unmeasured round first: a variant's first run can change the process for every
    # later one (glibc raising its mmap threshold past an optimizer's temporaries made
    # every later step of BERT's 20 ms faster), so each variant runs once before any is
    # measured.
    for variant in variants:
        variant()
    for values in (*walls.values(), *(table for phases in found.values() for table in phases.values())):
        values.clear()
    ref_fwd.clear()
    ref_bwd.clear()
    for n in range(rounds):
        # The order rotates round by round, so no variant always follows the same one.
        for variant in variants[n % len(variants) :] + variants[: n % len(variants)]:
            variant()
    plain = statistics.median(walls["plain"])
    print(f"\n{name} ({'training step, AdamW' if train else 'forward, no_grad'}), {rounds} rounds x {steps} steps")
    for variant, values in walls.items():
        median = statistics.median(values)
        print(f"  {variant:16s} {median / 1e3:10.1f} us/step   x{median / plain:.3f}")
    alone = statistics.median(walls["tp alone"])
    for variant in ("light block", "aligned block"):
        # Each step of these blocks but the first records what torch's profiler alone does.
        print(f"  {variant}: x{statistics.median(walls[variant]) / alone:.3f} torch's profiler alone (tp alone)")
    result: dict[str, Any] = {"ratio": statistics.median(walls["layerscope"]) / plain}
    for variant in ours:
        if not train:
            root = statistics.median(found[variant]["forward"][""])
            print(f"  {variant}: root forward {root / 1e3:.1f} us/step, x{root / plain:.3f} plain")
            result[f"{variant} root"] = root / plain
        for phase, ref in (("forward", ref_fwd), ("backward", ref_bwd)):
            mine = found[variant][phase]
            rows = []
            for path, values in ref.items():
                ref_ns = statistics.median(values)
                if ref_ns < min_us * 1e3 or path not in mine:
                    continue
                rows.append((statistics.median(mine[path]) / ref_ns, path, ref_ns))
            if not rows:
                continue
            within = sum(1 for r, _, _ in rows if abs(r - 1) <= TOLERANCE)
            print(f"  {variant} {phase}: {within}/{len(rows)} modules of >= {min_us:g} us within {TOLERANCE:.0%} of the reference")
            for ratio, path, ref_ns in sorted(rows, key=lambda r: -abs(r[0] - 1))[:3]:
                print(f"    {path or '(root)':45s} ref {ref_ns / 1e3:9.1f} us   x{ratio:.3f}")
            result[f"{variant} {phase}"] = (within, len(rows))
    return result


def run_profile(name: str, backward: bool, rounds: int, steps: int, min_us: float) -> None:
    """``layerscope.profile``: its module times (the median pass, whole) against the
    reference's for the same work: forward totals for a no_grad forward; backward spans
    of leaf modules for ``backward=True`` (forward, the sum of the output as the loss,
    backward). Both ways it runs: with ops (every pass recorded by torch's profiler with
    shapes and memory, the default) and ``record_ops=False`` (module hooks alone for a
    forward, torch's profiler without shapes for a step). Rounds interleave the three."""
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model.train(backward)

    def step() -> None:
        if backward:
            first_float(call(model, inputs)).sum().backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                call(model, inputs)

    for _ in range(3):
        step()
    phase = "backward" if backward else "forward"
    ref: dict[str, list[float]] = {}
    ours: dict[bool, dict[str, list[float]]] = {True: {}, False: {}}

    def reference() -> None:
        with Reference(model, backward=backward, forward=not backward) as seen:
            for _ in range(steps):
                step()
        for path, ns in (seen.backward if backward else seen.forward).items():
            ref.setdefault(path, []).append(ns / steps)

    def ours_with(ops: bool) -> Callable[[], None]:
        def run() -> None:
            prof = layerscope.profile(model, inputs, backward=backward, warmup=1, repeat=steps, record_ops=ops)
            for node in prof.modules():
                stats = getattr(node, phase)
                if stats is not None:
                    ours[ops].setdefault(node.path, []).append(stats.cpu_time_ns)
        return run

    variants = [reference, ours_with(True), ours_with(False)]
    for n in range(rounds):
        for variant in variants[n % len(variants) :] + variants[: n % len(variants)]:
            variant()
    print(f"\n{name}: profile({'backward=True' if backward else 'forward'}), {rounds} rounds x {steps} passes")
    for ops in (True, False):
        rows = []
        for path, values in ref.items():
            ref_ns = statistics.median(values)
            if ref_ns >= min_us * 1e3 and path in ours[ops]:
                rows.append((statistics.median(ours[ops][path]) / ref_ns, path, ref_ns))
        within = sum(1 for r, _, _ in rows if abs(r - 1) <= TOLERANCE)
        how = "with ops (the default)" if ops else "record_ops=False"
        print(f"  {how}: {phase} {within}/{len(rows)} modules of >= {min_us:g} us within {TOLERANCE:.0%} of the reference")
        for ratio, path, ref_ns in sorted(rows, key=lambda r: -abs(r[0] - 1))[:3]:
            print(f"    {path or '(root)':45s} ref {ref_ns / 1e3:9.1f} us   layerscope x{ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min-us", type=float, default=50.0)
    parser.add_argument("--models", default="bert,gpt2,gpt,tiny")
    parser.add_argument("--no-train", action="store_true", help="forward only")
    parser.add_argument("--profile-only", action="store_true", help="only layerscope.profile's rows")
    parser.add_argument(
        "--blocks-only", action="store_true",
        help="only the multi-step blocks (every step detailed, and detail='first') against plain, the reference "
        "and torch.profiler",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    # Full backward hooks on a model's first layer warn that its inputs need no grad.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    print(f"torch {torch.__version__}, python {platform.python_version()}, {platform.machine()}, {args.threads} thread(s)")
    for name in args.models.split(","):
        if not args.profile_only:
            run_model(name, False, args.rounds, args.steps, args.min_us, args.blocks_only)
        if not args.blocks_only:
            run_profile(name, False, args.rounds, args.steps, args.min_us)
        if not args.no_train and name != "tiny":
            if not args.profile_only:
                run_model(name, True, args.rounds, args.steps, args.min_us, args.blocks_only)
            if not args.blocks_only:
                run_profile(name, True, args.rounds, args.steps, args.min_us)


if __name__ == "__main__":
    main()
