"""Overhead of layerscope against a plain forward and torch.profiler, in one run.

Every variant runs once per round, rounds interleave the variants (ABAB...), and the
report gives each variant's median and its ratio to the plain forward's median.

Two figures per model:

- *pass*: the forward inside an already-installed layerscope hooks-only pass (what the
  measured passes of ``layerscope.profile(record_ops=False)`` cost; with ops, each pass
  is recorded as a ``Profiler`` step is: ``benchmarks/fidelity.py``), vs. a forward under
  ``torch.profiler.profile(activities=[CPU])``.
- *total*: set-up + forward + tear-down + building the result (``layerscope.Profiler``
  with ``record_ops=False`` until its ``Profile`` exists; torch.profiler until
  ``key_averages()`` returns).

Usage: python benchmarks/overhead.py [--rounds 30] [--models bert,mlp]
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
from layerscope.capture.kineto import quiet_fd2 as _quiet_stderr
from layerscope.capture.modules import module_table
from layerscope.capture.recorder import Recorder


def bert_base() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig()).eval()  # BERT-base sizes, random weights
    ids = torch.randint(0, 30522, (1, 128), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids}


def mlp_1000() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(1000)]).eval()
    return model, torch.randn(16, 16)


MODELS: dict[str, Callable[[], tuple[nn.Module, object]]] = {"bert": bert_base, "mlp": mlp_1000}


def _call(model: nn.Module, inputs: object) -> None:
    if isinstance(inputs, dict):
        model(**inputs)
    else:
        model(inputs)


def variants(model: nn.Module, inputs: object) -> dict[str, Callable[[], None]]:
    modules, _, _ = module_table(model)
    recorder = Recorder(modules, [True] * len(modules), device=torch.device("cpu"))
    activities = [torch.profiler.ProfilerActivity.CPU]

    def plain() -> None:
        _call(model, inputs)

    def noop_hooks() -> None:
        # The floor for any hook-based timer: torch's hooked module-call path with
        # global hooks that do nothing.
        pre = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: None)
        post = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None, always_call=True)
        try:
            _call(model, inputs)
        finally:
            pre.remove()
            post.remove()

    def layerscope_pass() -> None:
        with recorder.step_pass(detailed=False, steps=False):
            _call(model, inputs)

    def torch_profiler_pass() -> None:
        with _quiet_stderr(), torch.profiler.profile(activities=activities):
            _call(model, inputs)

    def layerscope_total() -> None:
        with layerscope.Profiler(model, record_ops=False) as prof:
            _call(model, inputs)
        prof.profile  # noqa: B018 - the Profile is built in __exit__; reading proves it exists

    def torch_profiler_total() -> None:
        with _quiet_stderr(), torch.profiler.profile(activities=activities) as prof:
            _call(model, inputs)
        with _quiet_stderr():
            prof.key_averages()

    return {
        "plain": plain,
        "no-op hooks (floor)": noop_hooks,
        "layerscope pass": layerscope_pass,
        "torch.profiler pass": torch_profiler_pass,
        "layerscope total": layerscope_total,
        "torch.profiler total": torch_profiler_total,
    }


def measure(
    name: str, rounds: int, make_variants: Callable[..., dict[str, Callable[[], None]]] | None = None
) -> dict[str, float]:
    """Median ns of each variant over ``rounds`` interleaved rounds (the order rotates)."""
    model, inputs = MODELS[name]()
    runs = (make_variants or variants)(model, inputs)
    samples: dict[str, list[int]] = {k: [] for k in runs}
    order = list(runs)
    with torch.no_grad():
        for fn in runs.values():  # warm every path once
            fn()
            fn()
        for r in range(rounds):
            # rotate the order each round so no variant always follows the same one
            rotated = order[r % len(order):] + order[: r % len(order)]
            for key in rotated:
                t0 = time.perf_counter_ns()
                runs[key]()
                samples[key].append(time.perf_counter_ns() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--models", default="bert,mlp")
    args = parser.parse_args()
    print(f"# {platform.node()} · {platform.processor() or platform.machine()} · "
          f"{torch.get_num_threads()} threads · torch {torch.__version__} · python {platform.python_version()}")
    print(f"# {args.rounds} interleaved rounds; medians; ratio = variant / plain")
    for name in args.models.split(","):
        medians = measure(name, args.rounds)
        base = medians["plain"]
        print(f"\n{name}")
        for key, value in medians.items():
            print(f"  {key:<22} {value / 1e6:9.3f} ms   x{value / base:5.2f}")


if __name__ == "__main__":
    main()
