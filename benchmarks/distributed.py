"""A DDP training step under torchrun: plain, under torch.profiler, and profiled by layerscope.

    python -m benchmarks.distributed [--ranks 2] [--rounds 15] [--steps 6] [--model mlp|gpt2]

Starts ``torchrun --standalone --nproc_per_node=RANKS`` on this file (gloo, one thread
per rank). Every rank trains the same DDP model; each round runs ``--steps`` steps of
each variant, the order rotated round by round, all ranks meeting at a barrier before
each block of steps:

- **plain**: the step alone;
- **torch.profiler**: inside ``torch.profiler.profile()`` (CPU activity, no shapes),
  recording every step;
- **layerscope**: inside a ``layerscope.Profiler`` block, recording every step (times,
  shapes, FLOPs and memory from one run of torch's profiler). Each variant's first step
  is left out, so each is timed on steps 2 to ``--steps``.

Each step's wall time is taken on every rank; rank 0 prints the medians over rounds of
the per-block median step time, and the ratios to plain and to torch.profiler.
Collective waits are in every variant alike: the ranks run in lockstep.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

VARIANTS = ("plain", "torch.profiler", "layerscope")


def _build(kind: str) -> tuple[Any, Any, Any, Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=2, n_embd=256, n_head=4, n_positions=128, vocab_size=1000)
        net = GPT2LMHeadModel(config)
        x = torch.randint(0, 1000, (4, 64))
        return net, x, x, "gpt2"
    net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return net, torch.randn(64, 256), torch.randint(0, 10, (64,)), "mlp"


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        _measure(args)
    finally:
        gc.collect()  # DDP's reducer before its process group (see layerscope.examples.ddp_train)
        dist.destroy_process_group()


def _measure(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import layerscope

    rank = dist.get_rank()
    net, x, y, kind = _build(args.model)
    ddp = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

    def step() -> None:
        if kind == "gpt2":
            loss = ddp(input_ids=x, labels=y).loss
        else:
            loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    def block(variant: str) -> list[float]:
        context: AbstractContextManager[Any] = nullcontext()
        if variant == "torch.profiler":
            context = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        elif variant == "layerscope":
            context = layerscope.Profiler(ddp)
        times = []
        dist.barrier()
        with context as prof:
            for _ in range(args.steps):
                start = time.perf_counter()
                step()
                times.append(time.perf_counter() - start)
                if variant == "layerscope":
                    prof.step()
        return times[1:]

    for _ in range(2):
        for variant in VARIANTS:
            block(variant)  # warm-up: allocator, DDP's bucket rebuild, first dispatch-mode steps
    medians: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for round_ in range(args.rounds):
        order = VARIANTS[round_ % 3 :] + VARIANTS[: round_ % 3]
        for variant in order:
            medians[variant].append(statistics.median(block(variant)))
    if rank == 0:
        _report(args, kind, dist.get_world_size(), medians)


def _report(args: argparse.Namespace, kind: str, world: int, medians: dict[str, list[float]]) -> None:
    import torch

    plain = statistics.median(medians["plain"])
    torch_p = statistics.median(medians["torch.profiler"])
    print(f"torch {torch.__version__}, python {platform.python_version()}, {os.cpu_count()} CPUs, {world} ranks (gloo), 1 thread each")
    print(f"DDP {kind}: median over {args.rounds} rounds of each block's median step ({args.steps - 1} steps timed per block)")
    for variant in VARIANTS:
        value = statistics.median(medians[variant])
        line = f"  {variant:15s} {value * 1e3:8.3f} ms   x{value / plain:.3f} of plain"
        if variant == "layerscope":
            line += f"   x{value / torch_p:.3f} of torch.profiler"
        print(line)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--model", choices=["mlp", "gpt2"], default="mlp")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    command: list[str] = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}",
        os.path.abspath(__file__), "--worker", "--rounds", str(args.rounds), "--steps", str(args.steps),
        "--model", args.model,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.path.join(root, "src") + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    print(result.stdout, end="")
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-4000:])
        raise SystemExit(result.returncode)


if __name__ == "__main__":
    main()
