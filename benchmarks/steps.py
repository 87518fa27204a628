"""Training steps: what a profiled step costs, and whether long runs grow memory.

Three measurements, all in one run:

- *per step*: one training step (forward, loss, backward, AdamW step, zero_grad) plain,
  inside a running ``layerscope.Profiler`` (every step timed and detailed: ops, shapes,
  FLOPs, memory), inside an idle step of a schedule, and under
  ``torch.profiler.profile`` with ``record_shapes=True, profile_memory=True`` (the same
  detail, torch's own way) recording every step. Variants are interleaved round by round;
  medians and ratios are reported, for a small MLP, BERT and GPT-2 (2 layers x 256) and
  BERT-base.
- *whole block*: entering, ``--block-steps`` steps and finalizing (layerscope until its
  ``Profile`` exists; torch.profiler until ``key_averages()`` returns), and layerscope's
  finalize alone against one recorded step.
- *memory*: RSS of this process while a small model trains for ``--steps`` steps with
  every step recorded by one ``Profiler`` block (no schedule), sampled every 1,000 steps,
  against the same loop with torch.profiler recording every step (fewer steps: it keeps
  every event).

Usage: python -m benchmarks.steps [--rounds 20] [--steps 10000] [--models mlp,bert,gpt2,bert-base]
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
from typing import Any

import torch
from torch import nn

import layerscope
from layerscope.capture.training import first_float_tensor


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


def _transformer_step(build: Callable[[], tuple[nn.Module, dict[str, torch.Tensor]]]) -> Callable[[], tuple[nn.Module, Callable[[], None]]]:
    def make() -> tuple[nn.Module, Callable[[], None]]:
        torch.manual_seed(0)
        model, inputs = build()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step() -> None:
            out = first_float_tensor(model(**inputs))
            assert out is not None
            out.float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad()

        return model, step

    return make


def _bert(layers: int, hidden: int, heads: int, intermediate: int, batch: int, seq: int) -> Callable[[], Any]:
    def build() -> tuple[nn.Module, dict[str, torch.Tensor]]:
        from transformers import BertConfig, BertModel

        config = BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=intermediate)
        ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
        return BertModel(config), {"input_ids": ids}

    return build


def _gpt2() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_layer=2, n_embd=256, n_head=4)
    ids = torch.randint(0, config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    return GPT2Model(config), {"input_ids": ids}


def _mlp() -> tuple[nn.Module, Callable[[], None]]:
    model, opt, x, y = small_model()
    return model, make_step(model, opt, x, y)


MODELS: dict[str, Callable[[], tuple[nn.Module, Callable[[], None]]]] = {
    "mlp": _mlp,
    "bert": _transformer_step(_bert(2, 256, 4, 1024, 2, 64)),
    "gpt2": _transformer_step(_gpt2),
    "bert-base": _transformer_step(_bert(12, 768, 12, 3072, 2, 128)),
}


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
    from torch.profiler import ProfilerActivity, profile

    # No schedule: every step is recorded and nothing is processed until the block ends,
    # so a step costs the recording alone.
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
        yield prof.step


def overhead(name: str, rounds: int, per_round: int) -> None:
    model, step = MODELS[name]()
    contexts = {
        "layerscope (timed step)": _layerscope_every_step,
        "layerscope (idle step)": _layerscope_idle,
        "torch.profiler (shapes, memory)": _torch_profiler,
    }
    for _ in range(5):
        step()
    times: dict[str, list[float]] = {"plain": [], **{n: [] for n in contexts}}
    def plain() -> None:
        t0 = time.perf_counter()
        for _ in range(per_round):
            step()
        times["plain"].append((time.perf_counter() - t0) / per_round)

    order: list[str | None] = [None, *contexts]  # None: the plain step
    for n in range(rounds):
        # The order rotates round by round, so no variant always follows the same one.
        for variant in order[n % len(order) :] + order[: n % len(order)]:
            if variant is None:
                plain()
                continue
            ctx = contexts[variant]
            with ctx(model) as mark:
                for _ in range(2):  # warm steps, as a block's steady state
                    step()
                    mark()
                t0 = time.perf_counter()
                for _ in range(per_round):
                    step()
                    mark()
                times[variant].append((time.perf_counter() - t0) / per_round)
    base = statistics.median(times["plain"])
    torch_median = statistics.median(times["torch.profiler (shapes, memory)"])
    print(f"\n{name}: training step + AdamW, {rounds} rounds x {per_round} steps")
    for variant, values in times.items():
        median = statistics.median(values)
        print(f"  {variant:26s} {median * 1e6:10.1f} us   x{median / base:.3f} plain   x{median / torch_median:.3f} torch.profiler")


def whole_block(name: str, rounds: int, block_steps: int) -> None:
    """Enter + steps + exit + first read, layerscope against torch.profiler; the exit
    alone against torch's own stop, and the first read (``prof.profile``) against torch's
    (``key_averages()``, which processes its events on first use)."""
    from torch.profiler import ProfilerActivity, profile

    model, step = MODELS[name]()
    for _ in range(5):
        step()
    ours: list[float] = []
    theirs: list[float] = []
    exits: list[float] = []
    reads: list[float] = []
    stops: list[float] = []
    their_reads: list[float] = []
    one_step: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        prof = layerscope.Profiler(model)
        prof.__enter__()
        for _ in range(block_steps):
            t_step = time.perf_counter()
            step()
            one_step.append(time.perf_counter() - t_step)
            prof.step()
        t_exit = time.perf_counter()
        prof.__exit__(None, None, None)
        t_read = time.perf_counter()
        _ = prof.profile
        t1 = time.perf_counter()
        ours.append(t1 - t0)
        exits.append(t_read - t_exit)
        reads.append(t1 - t_read)
        t0 = time.perf_counter()
        tprof = profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True)
        tprof.__enter__()
        for _ in range(block_steps):
            step()
            tprof.step()
        t_stop = time.perf_counter()
        tprof.__exit__(None, None, None)
        t_read = time.perf_counter()
        tprof.key_averages()
        t1 = time.perf_counter()
        stops.append(t_read - t_stop)
        their_reads.append(t1 - t_read)
        theirs.append(t1 - t0)
    a, b = statistics.median(ours), statistics.median(theirs)
    e, r, s = statistics.median(exits), statistics.median(reads), statistics.median(one_step[1:] or one_step)
    stop, their_read = statistics.median(stops), statistics.median(their_reads)
    print(f"  whole block of {block_steps} steps: layerscope {a * 1e3:.1f} ms, torch.profiler {b * 1e3:.1f} ms   x{a / b:.2f}")
    print(
        f"  exit: layerscope's {e * 1e3:.2f} ms against torch.profiler's own stop (its __exit__, shapes and "
        f"memory, the same {block_steps} steps) {stop * 1e3:.2f} ms   x{e / stop:.2f}"
    )
    print(
        f"  first read: layerscope's profile {r * 1e3:.2f} ms against torch.profiler's key_averages() "
        f"{their_read * 1e3:.2f} ms   x{r / their_read:.2f}"
    )
    print(
        f"  exit + first read {(e + r) * 1e3:.2f} ms against a recorded step's {s * 1e3:.2f} ms   x{(e + r) / s:.2f}; "
        f"against torch.profiler's stop + key_averages() {(stop + their_read) * 1e3:.2f} ms   x{(e + r) / (stop + their_read):.2f}"
    )


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
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--block-steps", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--torch-steps", type=int, default=2_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default="mlp,bert,gpt2,bert-base")
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # training drifts weights; denormals would skew rounds
    print(f"torch {torch.__version__}, python {platform.python_version()}, {platform.machine()}, {args.threads} thread(s)")
    for name in args.models.split(","):
        overhead(name, args.rounds, args.per_round)
        whole_block(name, max(3, args.rounds // 4), args.block_steps)
    if not args.no_memory:
        memory(args.steps, args.torch_steps)


if __name__ == "__main__":
    main()
