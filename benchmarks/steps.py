"""Training steps: what a profiled step costs, and whether long runs grow memory.

Two measurements, both in one run:

- *overhead*: one training step (forward, loss, backward, optimizer step, zero_grad)
  plain, inside a running ``layerscope.Profiler`` (every step recorded, with ops and
  FLOPs), inside an idle step of a schedule, and under ``torch.profiler.profile`` with a
  schedule recording every step. Variants are interleaved round by round; medians and
  ratios to the plain step are reported.
- *memory*: RSS of this process while a small model trains for ``--steps`` steps with
  every step recorded by one ``Profiler`` block (no schedule), sampled every 1,000 steps,
  against the same loop with torch.profiler recording every step (fewer steps: it keeps
  every event).

Usage: python -m benchmarks.steps [--rounds 30] [--steps 10000]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

import layerscope


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def small_model() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters())
    return model, opt, torch.randn(32, 64), torch.randint(0, 10, (32,))


def make_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step


@contextmanager
def _layerscope_every_step(model: nn.Module) -> Iterator[Callable[[], None]]:
    with layerscope.Profiler(model) as prof:
        yield prof.step


@contextmanager
def _layerscope_idle(model: nn.Module) -> Iterator[Callable[[], None]]:
    # wait=10**9: every step measured here is an idle one.
    with layerscope.Profiler(model, schedule=layerscope.schedule(wait=10**9, active=1)) as prof:
        yield prof.step


@contextmanager
def _torch_profiler(model: nn.Module) -> Iterator[Callable[[], None]]:
    from torch.profiler import ProfilerActivity, profile, schedule

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=1)) as prof:
        yield prof.step


def overhead(rounds: int, per_round: int) -> None:
    model, opt, x, y = small_model()
    step = make_step(model, opt, x, y)
    contexts = {
        "layerscope (every step)": _layerscope_every_step,
        "layerscope (idle step)": _layerscope_idle,
        "torch.profiler (every step)": _torch_profiler,
    }
    for _ in range(20):
        step()
    times: dict[str, list[float]] = {"plain": [], **{name: [] for name in contexts}}
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(per_round):
            step()
        times["plain"].append((time.perf_counter() - t0) / per_round)
        for name, ctx in contexts.items():
            with ctx(model) as mark:
                for _ in range(3):  # warm the variant inside its block
                    step()
                    mark()
                t0 = time.perf_counter()
                for _ in range(per_round):
                    step()
                    mark()
                times[name].append((time.perf_counter() - t0) / per_round)
    base = statistics.median(times["plain"])
    print(f"training step, small MLP + AdamW, {rounds} rounds x {per_round} steps")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:30s} {median * 1e6:9.1f} us   x{median / base:.2f}")


def memory(steps: int, torch_steps: int) -> None:
    model, opt, x, y = small_model()
    step = make_step(model, opt, x, y)
    for _ in range(50):
        step()
    gc.collect()
    print(f"RSS while every step is recorded ({platform.machine()}, torch {torch.__version__})")
    start = _rss_bytes()
    with layerscope.Profiler(model) as prof:
        for n in range(1, steps + 1):
            step()
            prof.step()
            if n % 1000 == 0:
                print(f"  layerscope     step {n:6d}: +{(_rss_bytes() - start) / 2**20:7.1f} MiB")
    print(f"  layerscope     after building the profile: +{(_rss_bytes() - start) / 2**20:7.1f} MiB")
    del prof
    gc.collect()
    from torch.profiler import ProfilerActivity, profile

    start = _rss_bytes()
    with profile(activities=[ProfilerActivity.CPU]) as tprof:
        for n in range(1, torch_steps + 1):
            step()
            tprof.step()
            if n % 500 == 0:
                print(f"  torch.profiler step {n:6d}: +{(_rss_bytes() - start) / 2**20:7.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--torch-steps", type=int, default=2_000)
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    overhead(args.rounds, args.per_round)
    memory(args.steps, args.torch_steps)


if __name__ == "__main__":
    main()
