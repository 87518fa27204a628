"""A compiled model's profile against its plain run, side by side, in the steady state.

For each model, ``torch.compile(model)`` (Inductor, default options) is compiled first,
and layerscope's own compile of it once. Then rounds alternate two variants, their
order swapped every round, each measured as a user's loop sees it (warm, many calls):

- *plain*: ``--warm`` calls of the compiled model, then ``--calls`` calls each timed
  with ``time.perf_counter_ns``: their median;
- *torch.profiler*: the same as *plain* inside one ``torch.profiler.profile()`` session
  (CPU activity): what a call costs while torch's own profiler records it;
- *layerscope*: ``layerscope.profile(compiled, x, warmup=--warm, repeat=--calls)``, whose
  root time is the sum of its nodes' median self times over the profiled calls
  (kernel ranges and torch's profiler on), as for any profile.

With ``--train`` each call is a training step's forward, loss (the sum of the first
float output, layerscope's default) and backward, from gradients cleared outside the
timing: *plain* and *torch.profiler* time ``loss(compiled(x)).backward()``, and
layerscope's figure is ``layerscope.profile(compiled, x, backward=True, ...)``'s step
(forward + ``<loss>`` + backward, the sum of the nodes' median self times).

With ``--block`` each variant is a compiled training loop with AdamW (zero_grad, forward,
loss, backward, ``opt.step()``), ``--warm`` steps then ``--calls`` steps each timed with
``time.perf_counter_ns`` as the user's loop sees it: *plain*; *torch.profiler* (one
session per round, CPU activity, ``prof.step()`` each step); and *layerscope*, the loop
in a ``layerscope.Profiler`` block of the compiled model (``prof.step()`` each step). The
block's exit is timed against torch's own stop for the same steps, and its first read
(the profile built) against torch's first ``key_averages()``. A block is run first,
untimed, so layerscope's own compile is not in the rounds, and its FLOPs are checked
against the eager count.

The report gives each variant's median over the rounds and the ratios of layerscope's
root to the plain call and to the call under torch.profiler (the bar: no heavier than
torch.profiler's own). It also checks, once per model, that per-module FLOPs equal the eager
count's.

Usage: python -m benchmarks.compiled [--rounds 15] [--calls 20] [--warm 3] [--models mlp,gpt,bert,gpt2] [--threads 1] [--train | --block]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import layerscope
from layerscope import zoo
from layerscope.capture.training import loss_of


def _zoo(name: str) -> Callable[[], tuple[nn.Module, object]]:
    def build() -> tuple[nn.Module, object]:
        torch.manual_seed(0)
        entry = zoo.get(name)
        return entry.build().eval(), entry.example_inputs(1)

    return build


def bert_small() -> tuple[nn.Module, object]:
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    torch.manual_seed(0)
    model = BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids}


def gpt2_small() -> tuple[nn.Module, object]:
    """GPT-2, 2 layers x 256 (4 heads), 2 x 64 tokens: the shape of ``benchmarks/steps.py``'s."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_layer=2, n_embd=256, n_head=4)
    torch.manual_seed(0)
    model = GPT2Model(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids}


MODELS: dict[str, Callable[[], tuple[nn.Module, object]]] = {
    "mlp": _zoo("mlp"), "gpt": _zoo("gpt"), "bert": bert_small, "gpt2": gpt2_small,
}


def _call(model: nn.Module, inputs: object) -> object:
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


def _step(model: nn.Module, inputs: object) -> None:
    """A training step's forward, loss and backward (layerscope's default loss)."""
    loss_of(_call(model, inputs), None).backward()


def _clear(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


def _plain(compiled: nn.Module, inputs: object, warm: int, calls: int, train: bool = False) -> float:
    run = _step if train else _call
    for _ in range(warm):
        _clear(compiled)
        run(compiled, inputs)
    times = []
    for _ in range(calls):
        _clear(compiled)  # outside the timing, as layerscope clears them outside its step's range
        start = time.perf_counter_ns()
        run(compiled, inputs)
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times)


def _same_flops(a: layerscope.Profile, b: layerscope.Profile) -> bool:
    """Per module and phase, the compiled profile's FLOPs are the eager count's."""
    def flops(node: object) -> tuple[object, ...]:
        backward = getattr(node, "backward", None)
        return (node.forward.flops, None if backward is None else backward.flops)  # type: ignore[attr-defined]

    return all(flops(x) == flops(y) for x, y in zip(a.root.walk(), b.root.walk(), strict=True))


def measure(name: str, rounds: int, calls: int = 20, warm: int = 3, train: bool = False) -> dict[str, float]:
    model, inputs = MODELS[name]()
    if train:
        model.train()
    compiled = torch.compile(model)
    with torch.enable_grad() if train else torch.no_grad():
        start = time.perf_counter()
        (_step if train else _call)(compiled, inputs)
        compile_s = time.perf_counter() - start
        # layerscope's compile, once
        first = layerscope.profile(compiled, inputs, warmup=1, repeat=1, backward=train)
        eager = layerscope.count_flops(model, inputs, backward=train)
        same = _same_flops(first, eager)
        plain: list[float] = []
        under_torch: list[float] = []
        profiled: list[float] = []

        def run_plain() -> None:
            plain.append(_plain(compiled, inputs, warm, calls, train))

        def run_torch() -> None:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]):
                under_torch.append(_plain(compiled, inputs, warm, calls, train))

        def run_profiled() -> None:
            prof = layerscope.profile(compiled, inputs, warmup=warm, repeat=calls, backward=train)
            info = prof.compiled
            assert info is not None
            profiled.append(info.step_time_ns if train else prof.root.forward.cpu_time_ns)

        variants = [run_plain, run_torch, run_profiled]
        for round_ in range(rounds):  # the order rotates each round: none always runs warmed by another
            for run in variants[round_ % 3 :] + variants[: round_ % 3]:
                run()
    info = first.compiled
    assert info is not None
    return {
        "plain_ns": statistics.median(plain),
        "torch_ns": statistics.median(under_torch),
        "profiled_ns": statistics.median(profiled),
        "compile_s": compile_s,
        "kernels": len(info.kernels),
        "shared": sum(1 for k in info.kernels if k.shared),
        "flops_equal": same,
    }


def _loop(compiled: nn.Module, opt: torch.optim.Optimizer, inputs: object, warm: int, calls: int,
          step: Callable[[], None] = lambda: None) -> float:
    """The median of ``calls`` training steps (after ``warm``), each with ``step()`` after it."""
    def one() -> None:
        opt.zero_grad()
        _step(compiled, inputs)
        opt.step()
        step()

    for _ in range(warm):
        one()
    times = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        one()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times)


def measure_block(name: str, rounds: int, calls: int = 20, warm: int = 3) -> dict[str, float]:
    """A compiled training loop: plain, under torch.profiler, in a layerscope block."""
    from torch.profiler import ProfilerActivity, profile

    model, inputs = MODELS[name]()
    model.train()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    start = time.perf_counter()
    _loop(compiled, opt, inputs, 0, 1)  # the user's compile
    compile_s = time.perf_counter() - start
    with layerscope.Profiler(compiled) as first:  # layerscope's compile, untimed
        _loop(compiled, opt, inputs, 0, 2, first.step)
    eager = layerscope.count_flops(model, inputs, backward=True)
    same = _same_flops(first.profile, eager)
    found: dict[str, list[float]] = {key: [] for key in ("plain", "torch", "block", "torch_stop", "block_exit",
                                                         "torch_read", "block_read")}

    def run_plain() -> None:
        found["plain"].append(_loop(compiled, opt, inputs, warm, calls))

    def run_torch() -> None:
        prof = profile(activities=[ProfilerActivity.CPU])
        prof.start()
        found["torch"].append(_loop(compiled, opt, inputs, warm, calls, prof.step))
        start = time.perf_counter_ns()
        prof.stop()
        found["torch_stop"].append(time.perf_counter_ns() - start)
        start = time.perf_counter_ns()
        prof.key_averages()
        found["torch_read"].append(time.perf_counter_ns() - start)

    def run_block() -> None:
        prof = layerscope.Profiler(compiled)
        prof.__enter__()
        found["block"].append(_loop(compiled, opt, inputs, warm, calls, prof.step))
        start = time.perf_counter_ns()
        prof.__exit__(None, None, None)
        found["block_exit"].append(time.perf_counter_ns() - start)
        start = time.perf_counter_ns()
        _ = prof.profile
        found["block_read"].append(time.perf_counter_ns() - start)

    variants = [run_plain, run_torch, run_block]
    for round_ in range(rounds):  # the order rotates each round: none always runs warmed by another
        for run in variants[round_ % 3 :] + variants[: round_ % 3]:
            run()
    info = first.profile.compiled
    assert info is not None
    out: dict[str, float] = {key: statistics.median(values) for key, values in found.items()}
    out.update(compile_s=compile_s, kernels=len(info.kernels), shared=sum(1 for k in info.kernels if k.shared),
               flops_equal=same)
    return out


def _block_report(args: argparse.Namespace) -> None:
    print("| model | kernel calls (shared) | plain step | under torch.profiler | in a layerscope block | x plain "
          "| x torch.profiler | exit vs torch's stop | first read vs key_averages() | FLOPs = eager |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        r = measure_block(name, args.rounds, args.calls, args.warm)
        print(
            f"| {name} | {r['kernels']:.0f} ({r['shared']:.0f}) | {r['plain'] / 1e3:.1f} us | {r['torch'] / 1e3:.1f} us | "
            f"{r['block'] / 1e3:.1f} us | x{r['block'] / r['plain']:.3f} | x{r['block'] / r['torch']:.3f} | "
            f"{r['block_exit'] / 1e6:.1f} vs {r['torch_stop'] / 1e6:.1f} ms (x{r['block_exit'] / r['torch_stop']:.2f}) | "
            f"{r['block_read'] / 1e6:.1f} vs {r['torch_read'] / 1e6:.1f} ms (x{r['block_read'] / r['torch_read']:.2f}) | "
            f"{bool(r['flops_equal'])} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=20, help="timed calls per variant and round (their median)")
    parser.add_argument("--warm", type=int, default=3, help="untimed calls first, per variant and round")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--train", action="store_true", help="each call a training step: forward, loss, backward")
    mode.add_argument("--block", action="store_true",
                      help="a compiled training loop with AdamW in a layerscope.Profiler block, against plain and torch.profiler")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {platform.machine()}, {args.threads} thread(s), {args.rounds} rounds "
          f"of {args.warm} warm + {args.calls} timed {'training steps' if args.train or args.block else 'calls'}")
    if args.block:
        _block_report(args)
        return
    print("| model | kernel calls (shared) | plain | under torch.profiler | layerscope root | x plain | x torch.profiler | FLOPs = eager |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        r = measure(name, args.rounds, args.calls, args.warm, args.train)
        print(
            f"| {name} | {r['kernels']} ({r['shared']}) | {r['plain_ns'] / 1e3:.1f} us | {r['torch_ns'] / 1e3:.1f} us | "
            f"{r['profiled_ns'] / 1e3:.1f} us | x{r['profiled_ns'] / r['plain_ns']:.3f} | "
            f"x{r['profiled_ns'] / r['torch_ns']:.3f} | {r['flops_equal']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
