"""Memory tracking: what it adds to a profiled training step, against torch.profiler's.

One training step = forward, loss, backward, ``Adam.step()``, ``zero_grad()``. Variants,
interleaved round-robin in one process (every variant once per round, the order rotated
each round), medians over rounds, ratios to the plain step of the same run:

- ``plain``: the step alone;
- ``layerscope time-only``: inside ``layerscope.Profiler(model, memory=False)`` (module
  and op times, shapes, FLOPs), ``prof.step()`` after each step;
- ``layerscope time+memory``: inside ``layerscope.Profiler(model)`` (the same, plus
  memory per module: allocations, frees, peaks, activations saved for backward);
- ``torch.profiler memory``: inside one ``torch.profiler.profile(activities=[CPU],
  profile_memory=True, record_shapes=True)`` session (no schedule), ``p.step()`` after
  each step.

What is timed, per round and variant: one block of ``--per-round`` steps.

- *per step*: the steps inside the block only (each followed by its ``step()`` mark),
  divided by the number of steps. layerscope folds each step's events into running
  totals inside ``prof.step()``, so its per-step work is in this figure; torch.profiler
  keeps every event and defers its processing to the end.
- *finalize*: leaving the block until a result can be read: layerscope's ``__exit__``
  and first ``prof.profile`` (the ``Profile``, memory included, is built there);
  torch.profiler's ``__exit__`` plus ``key_averages()`` (its per-op table, with memory).
  Timed separately.
- *per step, whole block*: entering + the steps + finalize, divided by the number of
  steps: what a block of that length costs per step, all included.

Each variant runs twice as a whole before the rounds (warm-up); ``gc.collect()`` runs
before every block, outside the timing (what is alive after the warm-up is frozen
first). After every block the memory figures are checked, so the benchmark cannot time
a no-op: layerscope time+memory must report ``profile.memory.peak_bytes > 0``,
time-only must have no memory, and torch.profiler must have recorded allocations.

Usage: python -m benchmarks.memory [--rounds 15] [--per-round 10] [--models mlp,bert,gpt2] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial

import torch
from torch import nn

import layerscope
import layerscope.zoo
from benchmarks.overhead import _quiet_stderr

Mark = Callable[[], None]
# A variant: (model, where to record the block's memory figure) -> a block yielding the
# per-step mark.
Variant = Callable[[nn.Module, list[int]], AbstractContextManager[Mark]]


def _train_step(loss: Callable[[], torch.Tensor], opt: torch.optim.Optimizer) -> None:
    loss().backward()
    opt.step()
    opt.zero_grad()


def zoo_mlp() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    torch.manual_seed(0)
    entry = layerscope.zoo.get("mlp")
    model = entry.build().train()
    x = entry.example_inputs(32)
    y = torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(0))
    return model, lambda: nn.functional.cross_entropy(model(x), y)


def _input_ids() -> torch.Tensor:
    return torch.randint(0, 1000, (8, 64), generator=torch.Generator().manual_seed(0))


def small_bert() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, vocab_size=1000
    )
    model = BertModel(config).train()
    ids = _input_ids()
    return model, lambda: model(input_ids=ids).last_hidden_state.mean()


def tiny_gpt2() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_embd=128, n_layer=2, n_head=2, n_inner=256, n_positions=128, vocab_size=1000, bos_token_id=999, eos_token_id=999
    )
    model = GPT2LMHeadModel(config).train()
    model.loss_type = "ForCausalLM"  # the default, named, so transformers does not warn
    ids = _input_ids()
    return model, lambda: model(input_ids=ids, labels=ids).loss


MODELS: dict[str, tuple[str, Callable[[], tuple[nn.Module, Callable[[], torch.Tensor]]]]] = {
    "mlp": ("zoo MLP 64-256-256-10, batch 32, cross-entropy", zoo_mlp),
    "bert": ("BERT 2 x 128 (BertModel), input_ids 8 x 64, mean of last_hidden_state", small_bert),
    "gpt2": ("GPT-2 2 x 128 (GPT2LMHeadModel), input_ids 8 x 64, LM loss", tiny_gpt2),
}


@contextmanager
def _plain(model: nn.Module, seen: list[int]) -> Iterator[Mark]:
    yield lambda: None


@contextmanager
def _layerscope(model: nn.Module, seen: list[int], *, memory: bool) -> Iterator[Mark]:
    with layerscope.Profiler(model, memory=memory) as prof:
        yield prof.step
    memory_data = prof.profile.memory  # read and built on first use: inside the finalize timing
    seen.append(-1 if memory_data is None else memory_data.peak_bytes)


@contextmanager
def _torch_profiler_memory(model: nn.Module, seen: list[int]) -> Iterator[Mark]:
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
            yield prof.step
        table = prof.key_averages()
    seen.append(sum(max(event.self_cpu_memory_usage, 0) for event in table))


VARIANTS: dict[str, Variant] = {
    "plain": _plain,
    "layerscope time-only": partial(_layerscope, memory=False),
    "layerscope time+memory": partial(_layerscope, memory=True),
    "torch.profiler memory": _torch_profiler_memory,
}


def _block(variant: Variant, model: nn.Module, step: Mark, steps: int, seen: list[int]) -> tuple[int, int, int]:
    """One block of ``steps`` steps: (enter ns, steps ns, finalize ns)."""
    gc.collect()
    t0 = time.perf_counter_ns()
    with variant(model, seen) as mark:
        t1 = time.perf_counter_ns()
        for _ in range(steps):
            step()
            mark()
        t2 = time.perf_counter_ns()
    t3 = time.perf_counter_ns()
    return t1 - t0, t2 - t1, t3 - t2


def _check(seen: dict[str, list[int]]) -> str:
    """The memory figures every block reported; raises if a variant timed a no-op."""
    peaks, none, allocated = seen["layerscope time+memory"], seen["layerscope time-only"], seen["torch.profiler memory"]
    if min(peaks) <= 0:
        raise SystemExit(f"layerscope time+memory recorded no memory: peak_bytes {peaks}")
    if any(value != -1 for value in none):
        raise SystemExit(f"layerscope time-only recorded memory: {none}")
    if min(allocated) <= 0:
        raise SystemExit(f"torch.profiler recorded no allocations: {allocated}")
    return (
        f"memory data, every block: layerscope peak_bytes {statistics.median(peaks) / 2**20:.2f} MiB "
        f"(time-only: no memory); torch.profiler recorded {statistics.median(allocated) / 2**20:.1f} MiB "
        f"allocated per block"
    )


def measure(name: str, rounds: int, per_round: int) -> tuple[dict[str, dict[str, float]], str]:
    """Medians per variant: ns per step, finalize ns, ns per step of the whole block."""
    model, loss = MODELS[name][1]()
    step = partial(_train_step, loss, torch.optim.Adam(model.parameters()))
    samples: dict[str, dict[str, list[float]]] = {k: {"step": [], "finalize": [], "block": []} for k in VARIANTS}
    seen: dict[str, list[int]] = {k: [] for k in VARIANTS}
    order = list(VARIANTS)
    for key in order:  # warm every path twice
        for _ in range(2):
            _block(VARIANTS[key], model, step, 2, [])
    # torch, transformers and the model are long-lived: out of the collector's way, so
    # the collection before each block stays cheap.
    gc.collect()
    gc.freeze()
    for r in range(rounds):
        # rotate the order each round so no variant always follows the same one
        for key in order[r % len(order):] + order[: r % len(order)]:
            enter, steps, finalize = _block(VARIANTS[key], model, step, per_round, seen[key])
            samples[key]["step"].append(steps / per_round)
            samples[key]["finalize"].append(finalize)
            samples[key]["block"].append((enter + steps + finalize) / per_round)
    medians = {k: {part: statistics.median(v) for part, v in parts.items()} for k, parts in samples.items()}
    return medians, _check(seen)


def report(name: str, medians: dict[str, dict[str, float]], checked: str) -> None:
    base = medians["plain"]
    print(f"\n{name}: {MODELS[name][0]}, Adam")
    print(f"  {'variant':<24} {'per step':>12} {'ratio':>7} {'finalize':>12} {'whole block':>14} {'ratio':>7}")
    for key, m in medians.items():
        print(f"  {key:<24} {m['step'] / 1e6:9.3f} ms  x{m['step'] / base['step']:5.2f} "
              f"{m['finalize'] / 1e6:9.3f} ms {m['block'] / 1e6:11.3f} ms  x{m['block'] / base['block']:5.2f}")
    mem, time_only, tp = (medians[k] for k in ("layerscope time+memory", "layerscope time-only", "torch.profiler memory"))
    print(f"  time+memory / time-only:      x{mem['step'] / time_only['step']:.2f} per step, "
          f"x{mem['block'] / time_only['block']:.2f} whole block")
    print(f"  time+memory / torch.profiler: x{mem['step'] / tp['step']:.2f} per step, "
          f"x{mem['block'] / tp['block']:.2f} whole block")
    print(f"  {checked}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--models", default="mlp,bert,gpt2")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 rounds x 3 steps")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.per_round = 3, 3
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    print(f"# {platform.node()} · {platform.processor() or platform.machine()} · "
          f"{torch.get_num_threads()} threads · torch {torch.__version__} · python {platform.python_version()}")
    print(f"# training step (forward, loss, backward, Adam step, zero_grad); {args.rounds} interleaved rounds "
          f"x {args.per_round} steps per block; medians; ratio = variant / plain")
    print("# per step: the steps inside the block; finalize: __exit__ (+ key_averages() for torch.profiler); "
          "whole block: (enter + steps + finalize) / steps")
    for name in args.models.split(","):
        medians, checked = measure(name, args.rounds, args.per_round)
        report(name, medians, checked)


if __name__ == "__main__":
    main()
