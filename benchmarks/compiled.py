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

The report gives each variant's median over the rounds and the ratios of layerscope's
root to the plain call and to the call under torch.profiler (the bar: no heavier than
torch.profiler's own). It also checks, once per model, that per-module FLOPs equal the eager
count's.

Usage: python -m benchmarks.compiled [--rounds 15] [--calls 20] [--warm 3] [--models mlp,gpt,bert,gpt2] [--threads 1] [--train]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=20, help="timed calls per variant and round (their median)")
    parser.add_argument("--warm", type=int, default=3, help="untimed calls first, per variant and round")
    parser.add_argument("--train", action="store_true", help="each call a training step: forward, loss, backward")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {platform.machine()}, {args.threads} thread(s), {args.rounds} rounds "
          f"of {args.warm} warm + {args.calls} timed {'training steps' if args.train else 'calls'}")
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
