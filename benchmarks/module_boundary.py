"""What a module boundary costs under torch's profiler, by mechanism, in one run.

    python -m benchmarks.module_boundary [--rounds 9] [--layers 1000]

A ``Profiler`` step marks each module call with a ``_RecordFunctionFast`` range, opened
and closed by two global module hooks. On a model of many small modules that is most of
what a detailed step adds to torch.profiler's own (shapes and memory). This measures the
candidates apart, on ``Sequential`` of ``--layers`` x ``Linear(16, 16)``, batch 16, one
torch thread, no_grad, 5 forwards per sample, rounds interleaved (order rotated), medians:

- *plain*: the forwards alone;
- *tp*: under ``torch.profiler.profile(record_shapes=True, profile_memory=True)``;
- *tp + 2 global hooks + range*: what a ``Profiler`` step does per call;
- *tp + per-module hooks + range*: the same hooks registered on each module;
- *tp + forward wrapper + range*: no hook at all: each module's ``forward`` replaced, for
  the run, by a wrapper that opens the range around the original (so calls keep torch's
  hook-free fast path);
- *tp + 2 empty global hooks*: hooks that do nothing, the floor of any hook-based
  mechanism (torch's hooked call path alone);
- *tp + 2 global hooks + range, always_call*: the post hook registered as a step
  registers it (``always_call=True``, so it runs when ``forward`` raises);
- *tp + 2 global hooks + one range object per module*: each module's range made once
  and entered on every call, instead of one made per call;
- *torch's profiler alone*, *shapes only*, *memory only*: what recording shapes and
  memory each cost (a light step records neither);
- *tp + with_stack, with_modules*: torch's own module events (its Python tracer), a
  mechanism with no hook at all;
- *layerscope light step*: a ``Profiler(detail="first")`` block's light steps, and
  with ``hooks="first"`` (no module hooks: the ops aligned to the detailed step's
  calls when the window is read), each also against torch's profiler alone;
- *2 empty global hooks, no profiler* and *2 global hooks + clock, no profiler*: per
  module timing without torch's profiler, the floor of any hook and what the
  hooks-only reference (``profile(record_ops=False)``'s forward) does;
- *layerscope step*: a ``layerscope.Profiler`` block's steady steps (its own torch
  profiler with shapes and memory, its hooks and ranges), each step ``--layers``
  forwards as above, the first step of the block (which also reads module shapes) left
  out.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module
from torch.profiler import ProfilerActivity, profile

_Fast = torch._C._profiler._RecordFunctionFast


def _remove(handles: list[Any]) -> None:
    for handle in handles:
        handle.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--layers", type=int, default=1000)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(args.layers)]).eval()
    x = torch.randn(16, 16)
    names = {id(m): f"nn.Module: {n}" for n, m in model.named_modules()}

    def forwards() -> float:
        t = time.perf_counter_ns()
        with torch.no_grad():
            for _ in range(5):
                model(x)
        return (time.perf_counter_ns() - t) / 5

    detail = {"record_shapes": True, "profile_memory": True}

    def under(setup: Callable[[], Callable[[], None]] | None = None, **config: bool) -> Callable[[], float]:
        def run() -> float:
            undo = setup() if setup else None
            try:
                with profile(activities=[ProfilerActivity.CPU], **(config or detail)):
                    return forwards()
            finally:
                if undo:
                    undo()
        return run

    def ranges() -> tuple[Callable[..., None], Callable[..., None]]:
        opened: list[Any] = []

        def pre(module: nn.Module, inputs: Any) -> None:
            rf = _Fast(names[id(module)])
            rf.__enter__()
            opened.append(rf)

        def post(module: nn.Module, inputs: Any, output: Any) -> None:
            opened.pop().__exit__(None, None, None)

        return pre, post

    def global_hooks() -> Callable[[], None]:
        pre, post = ranges()
        handles = [nn_module.register_module_forward_pre_hook(pre), nn_module.register_module_forward_hook(post)]
        return lambda: _remove(handles)

    def module_hooks() -> Callable[[], None]:
        pre, post = ranges()
        handles = [h for m in model.modules() for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
        return lambda: _remove(handles)

    def wrappers() -> Callable[[], None]:
        for m in model.modules():
            original, name = m.forward, names[id(m)]

            def forward(*a: Any, _original: Any = original, _name: str = name, **k: Any) -> Any:
                with _Fast(_name):
                    return _original(*a, **k)

            m.forward = forward  # type: ignore[method-assign]

        def undo() -> None:
            for m in model.modules():
                del m.forward
        return undo

    def empty_hooks() -> Callable[[], None]:
        def pre(module: nn.Module, inputs: Any) -> None:
            pass

        def post(module: nn.Module, inputs: Any, output: Any) -> None:
            pass

        handles = [nn_module.register_module_forward_pre_hook(pre), nn_module.register_module_forward_hook(post)]
        return lambda: _remove(handles)

    def always_call() -> Callable[[], None]:
        pre, post = ranges()
        handles = [
            nn_module.register_module_forward_pre_hook(pre), nn_module.register_module_forward_hook(post, always_call=True),
        ]
        return lambda: _remove(handles)

    def kept_ranges() -> Callable[[], None]:
        made = {key: _Fast(name) for key, name in names.items()}
        opened: list[Any] = []

        def pre(module: nn.Module, inputs: Any) -> None:
            rf = made[id(module)]
            rf.__enter__()
            opened.append(rf)

        def post(module: nn.Module, inputs: Any, output: Any) -> None:
            opened.pop().__exit__(None, None, None)

        handles = [nn_module.register_module_forward_pre_hook(pre), nn_module.register_module_forward_hook(post)]
        return lambda: _remove(handles)

    def layerscope_steps(**options: str) -> Callable[[], float]:
        def run() -> float:
            import layerscope

            times = []
            with layerscope.Profiler(model, **options) as prof:
                for _ in range(4):
                    times.append(forwards())
                    prof.step()
            _ = prof.profile  # read, as a user's first look at it would
            return statistics.median(times[1:])
        return run

    def bare(setup: Callable[[], Callable[[], None]]) -> Callable[[], float]:
        """The forwards with ``setup``'s hooks and no profiler at all."""
        def run() -> float:
            undo = setup()
            try:
                return forwards()
            finally:
                undo()
        return run

    def clock_hooks() -> Callable[[], None]:
        # Module times on a Python clock, as profile(record_ops=False) times a forward.
        stamps: list[tuple[int, int]] = []
        clock = time.perf_counter_ns

        def pre(module: nn.Module, inputs: Any) -> None:
            stamps.append((id(module), clock()))

        def post(module: nn.Module, inputs: Any, output: Any) -> None:
            stamps.append((id(module), clock()))
        handles = [nn_module.register_module_forward_pre_hook(pre), nn_module.register_module_forward_hook(post)]
        return lambda: _remove(handles)

    variants: dict[str, Callable[[], float]] = {
        "plain": forwards,
        # Per-module timing without torch's profiler: the floor of any hook (nothing in
        # them), and hooks reading a clock (what the hooks-only reference does).
        "2 empty global hooks, no profiler": bare(empty_hooks),
        "2 global hooks + clock, no profiler": bare(clock_hooks),
        "tp": under(),
        "tp + 2 global hooks + range": under(global_hooks),
        "tp + per-module hooks + range": under(module_hooks),
        "tp + forward wrapper + range": under(wrappers),
        "tp + 2 empty global hooks": under(empty_hooks),
        "tp + 2 global hooks + range, always_call": under(always_call),
        "tp + 2 global hooks + one range per module": under(kept_ranges),
        "layerscope step": layerscope_steps(),
        # What a light step leaves out, and its own cost.
        "torch's profiler alone (no shapes, memory)": under(record_shapes=False),
        "torch's profiler, shapes only": under(record_shapes=True),
        "torch's profiler, memory only": under(profile_memory=True),
        "tp + with_stack, with_modules (torch's own module events)": under(
            record_shapes=True, profile_memory=True, with_stack=True, with_modules=True,
        ),
        "layerscope light step (detail='first')": layerscope_steps(detail="first"),
        "layerscope light step, no hooks (hooks='first')": layerscope_steps(detail="first", hooks="first"),
    }
    seen: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(2):  # warm
        for run in variants.values():
            run()
    for n in range(args.rounds):
        order = list(variants)
        for name in order[n % len(order):] + order[: n % len(order)]:
            seen[name].append(variants[name]())
    plain = statistics.median(seen["plain"])
    tp = statistics.median(seen["tp"])
    print(f"torch {torch.__version__}, python {platform.python_version()}, {args.layers} x Linear(16, 16), {args.rounds} rounds")
    alone = statistics.median(seen["torch's profiler alone (no shapes, memory)"])
    for name, values in seen.items():
        median = statistics.median(values)
        extra = f"   x{median / tp:.3f} tp   +{(median - tp) / args.layers / 1e3:.2f} us per module call over tp" if name != "plain" and name != "tp" else ""
        if name.startswith("layerscope light step"):
            # A light step records what torch's profiler alone does: that is its baseline.
            extra += f"   x{median / alone:.3f} torch's profiler alone"
        print(f"  {name:44s} {median / 1e3:9.0f} us   x{median / plain:.2f} plain{extra}")


if __name__ == "__main__":
    main()
