"""A compiled model's profile against its plain run, side by side.

For each model, ``torch.compile(model)`` (Inductor, default options) is compiled first,
and layerscope's own compile of it once. Then rounds alternate two variants:

- *plain*: one call of the compiled model, timed with ``time.perf_counter_ns``;
- *layerscope*: ``layerscope.profile(compiled, x, warmup=0, repeat=1)``, whose root time
  is the profiled call (kernel ranges and torch's profiler on).

The report gives each variant's median and their ratio (the issue's bar: within 10%).
It also checks, once per model, that per-module FLOPs equal the eager count's.

Usage: python -m benchmarks.compiled [--rounds 15] [--models mlp,gpt,bert] [--threads 1]
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


MODELS: dict[str, Callable[[], tuple[nn.Module, object]]] = {"mlp": _zoo("mlp"), "gpt": _zoo("gpt"), "bert": bert_small}


def _call(model: nn.Module, inputs: object) -> None:
    if isinstance(inputs, dict):
        model(**inputs)
    elif isinstance(inputs, tuple):
        model(*inputs)
    else:
        model(inputs)


def measure(name: str, rounds: int) -> dict[str, float]:
    model, inputs = MODELS[name]()
    compiled = torch.compile(model)
    with torch.no_grad():
        start = time.perf_counter()
        _call(compiled, inputs)
        compile_s = time.perf_counter() - start
        first = layerscope.profile(compiled, inputs, warmup=1, repeat=1)  # layerscope's compile, once
        eager = layerscope.count_flops(model, inputs)
        same = all(a.forward.flops == b.forward.flops for a, b in zip(first.root.walk(), eager.root.walk(), strict=True))
        plain, profiled = [], []
        for _ in range(rounds):
            start = time.perf_counter_ns()
            _call(compiled, inputs)
            plain.append(time.perf_counter_ns() - start)
            prof = layerscope.profile(compiled, inputs, warmup=0, repeat=1)
            profiled.append(prof.root.forward.cpu_time_ns)
    info = first.meta["compile"]
    return {
        "plain_ns": statistics.median(plain),
        "profiled_ns": statistics.median(profiled),
        "compile_s": compile_s,
        "kernels": len(info["kernels"]),
        "shared": sum(1 for k in info["kernels"] if len(k["modules"]) > 1),
        "flops_equal": same,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {platform.machine()}, {args.threads} thread(s), {args.rounds} rounds")
    print("| model | kernel calls (shared) | plain | layerscope root | ratio | FLOPs = eager |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        r = measure(name, args.rounds)
        print(
            f"| {name} | {r['kernels']} ({r['shared']}) | {r['plain_ns'] / 1e3:.1f} us | "
            f"{r['profiled_ns'] / 1e3:.1f} us | x{r['profiled_ns'] / r['plain_ns']:.3f} | {r['flops_equal']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
