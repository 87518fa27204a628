"""Cost of counting FLOPs, against the plain forward and the other ways to get them.

Interleaved rounds, medians, ratios to the plain forward measured in the same run:

- layerscope: one ``Profiler`` block with ops (module time + op time, shapes, FLOPs,
  MACs and bytes in one pass), its Profile built;
- ``torch.utils.flop_counter.FlopCounterMode`` (FLOPs per module only);
- ``torch.profiler`` with shapes, memory and stacks, ``key_averages()`` included.

Also times ``layerscope.count_flops`` on a 7B Llama built on the meta device.

Usage: python benchmarks/flops.py [--rounds 15] [--models mlp,bert] [--no-llama]
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

import layerscope
from benchmarks.overhead import _call, _quiet_stderr, measure


def variants(model: torch.nn.Module, inputs: object) -> dict[str, Callable[[], None]]:
    def plain() -> None:
        _call(model, inputs)

    def layerscope_one_pass() -> None:
        with layerscope.Profiler(model) as prof:
            _call(model, inputs)
        prof.profile  # noqa: B018 - built in __exit__

    def flop_counter_mode() -> None:
        with FlopCounterMode(display=False):
            _call(model, inputs)

    def torch_profiler_full() -> None:
        with _quiet_stderr(), torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True
        ) as prof:
            _call(model, inputs)
        with _quiet_stderr():
            prof.key_averages()

    return {
        "plain": plain,
        "layerscope (time+FLOPs)": layerscope_one_pass,
        "FlopCounterMode": flop_counter_mode,
        "torch.profiler full": torch_profiler_full,
    }


def llama_7b_on_meta() -> float:
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.perf_counter()
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig())
    ids = torch.zeros((1, 128), dtype=torch.long, device="meta")
    prof = layerscope.count_flops(model, {"input_ids": ids})
    elapsed = time.perf_counter() - t0
    print(f"\n7B Llama on meta, seq 128: {elapsed:.2f} s (build + count), "
          f"MACs {prof.root.forward.macs:,}, unsupported {prof.unsupported_ops() or 'none'}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--models", default="mlp,bert")
    parser.add_argument("--no-llama", action="store_true")
    args = parser.parse_args()
    print(f"# {platform.machine()} · {torch.get_num_threads()} threads · torch {torch.__version__}")
    print(f"# {args.rounds} interleaved rounds; medians; ratio = variant / plain")
    for name in args.models.split(","):
        medians = measure(name, args.rounds, variants)
        base = medians["plain"]
        print(f"\n{name}")
        for key, value in medians.items():
            print(f"  {key:<26} {value / 1e6:9.3f} ms   x{value / base:6.2f}")
    if not args.no_llama:
        llama_7b_on_meta()


if __name__ == "__main__":
    main()
