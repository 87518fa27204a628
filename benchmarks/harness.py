"""Overhead of ``layerscope.benchmark``'s timing loop per timed run, against a bare loop.

Both variants run the same model on the same batch in the same process, under
``torch.inference_mode()``; rounds interleave them (bare, harness, bare, ...), and the
report gives the median per-run time of each and the difference: what the harness
(two clock reads, a list append, the loop test and the step call) adds to every timed
run. A tiny model (``nn.Linear(8, 8)`` on a batch of 1) makes that overhead visible.

Usage: python benchmarks/harness.py [--rounds 30] [--runs 2000]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from torch import nn

from layerscope.bench.measure import _Runner, time_runs

TARGET_NS = 20_000


def bare(model: nn.Module, x: torch.Tensor, runs: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(runs):
        model(x)
    return (time.perf_counter_ns() - start) / runs


def harness(runner: _Runner, x: torch.Tensor, runs: int) -> float:
    step = runner.step
    start = time.perf_counter_ns()
    time_runs(lambda: step(x), min_runs=runs, min_time_ns=0)
    return (time.perf_counter_ns() - start) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--runs", type=int, default=2000, help="timed runs per round and variant")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Linear(8, 8).eval()
    x = torch.randn(1, 8)
    runner = _Runner(model, mode="inference", device=torch.device("cpu"), autocast=None, loss_fn=None, optimizer=None, lr=0.0)
    results: dict[str, list[float]] = {"bare": [], "harness": []}
    with torch.inference_mode():
        for _ in range(3):  # warm-up
            bare(model, x, args.runs)
            harness(runner, x, args.runs)
        for _ in range(args.rounds):
            results["bare"].append(bare(model, x, args.runs))
            results["harness"].append(harness(runner, x, args.runs))
    plain = statistics.median(results["bare"])
    timed = statistics.median(results["harness"])
    print(f"torch {torch.__version__}, python {platform.python_version()}, {torch.get_num_threads()} threads")
    print(f"nn.Linear(8, 8), batch 1, {args.rounds} rounds x {args.runs} runs, medians per run:")
    print(f"  bare loop        {plain / 1e3:8.3f} us")
    print(f"  benchmark loop   {timed / 1e3:8.3f} us   (x{timed / plain:.2f})")
    overhead = timed - plain
    verdict = "met" if overhead < TARGET_NS else "NOT met"
    print(f"  overhead         {overhead / 1e3:8.3f} us per timed run (target < {TARGET_NS / 1e3:.0f} us: {verdict})")
    spread = sorted(h - b for h, b in zip(results["harness"], results["bare"]))
    print(f"  per-round overhead: min {spread[0] / 1e3:.3f} us, max {spread[-1] / 1e3:.3f} us")


if __name__ == "__main__":
    main()
