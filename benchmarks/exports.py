"""Exports at scale: a Chrome trace of 1,000,000 op events, and operator tables.

    python -m benchmarks.exports [--events 1000000] [--quick]

1. **Chrome trace.** A real profile (a GPT-2 training step from a small config) has its
   trace repeated, shifted in time, until it holds ``--events`` op spans; the profile is
   saved as JSON once, then a fresh process loads it and writes the Chrome trace to disk,
   reporting the export's wall time and the process's peak RSS. The target: under 10 s
   and under 1 GB.
2. **Operator tables.** BERT-base (``BertConfig()``, random weights), one forward of batch
   1 x 128 tokens: torch.profiler with ``record_shapes``, ``profile_memory`` and
   ``with_stack``, then ``key_averages(group_by_input_shape=True)``; and layerscope's
   op pass, then ``profile.ops(group_by="shape")``. The two table builds are timed
   interleaved, medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

import layerscope

_EXPORT = r"""
import json, resource, sys, time
import layerscope
profile = layerscope.load(sys.argv[1])
t = time.perf_counter()
profile.save(sys.argv[2], fmt="chrome")
seconds = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def _gpt2_step() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500, n_positions=64)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 500, (2, 32))
    opt = torch.optim.AdamW(model.parameters())
    with layerscope.Profiler(model, memory=False) as prof:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return prof.profile


def _grown(profile: Any, events: int) -> dict[str, Any]:
    """The profile's JSON with its trace repeated until it holds ``events`` op spans."""
    doc = profile.to_dict()
    spans = doc["trace"]["spans"]
    ops = sum(1 for s in spans if s[4] >= 0)
    length = max(s[0] + s[1] for s in spans) + 1000
    copies = -(-events // ops)
    grown = []
    for n in range(copies):
        shift = n * length
        grown.extend([s[0] + shift, s[1], s[2], s[3], s[4]] for s in spans)
    doc["trace"]["spans"] = grown
    doc["meta"]["steps"] = copies  # not one step: no memory counter track
    return {"doc": doc, "op_spans": ops * copies, "spans": len(grown)}


def chrome_export(events: int) -> None:
    grown = _grown(_gpt2_step(), events)
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "big.json")
        with open(source, "w", encoding="utf-8") as handle:
            json.dump(grown["doc"], handle)
        target = os.path.join(folder, "big.trace.json")
        done = subprocess.run(
            [sys.executable, "-c", _EXPORT, source, target], capture_output=True, text=True, check=True
        )
        result = json.loads(done.stdout)
        size = os.path.getsize(target)
        with open(target, encoding="utf-8") as handle:
            loaded = json.load(handle)
    written = sum(1 for e in loaded["traceEvents"] if e["ph"] == "X" and e["cat"].startswith("op,"))
    assert written == grown["op_spans"], (written, grown["op_spans"])
    print(
        f"chrome export: {grown['op_spans']:,} op events ({grown['spans']:,} spans) -> {size / 2**20:.0f} MiB in "
        f"{result['seconds']:.2f} s, peak RSS of the exporting process {result['max_rss_kib'] / 1024:.0f} MiB "
        "(load included)"
    )


def op_tables(rounds: int) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig()).eval()
    ids = torch.randint(0, 30522, (1, 128))
    with torch.no_grad():
        model(input_ids=ids)
        with torch_profile(
            activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True
        ) as tprof:
            model(input_ids=ids)
    ours = layerscope.profile(model, {"input_ids": ids}, warmup=1, repeat=1)
    timings: dict[str, list[float]] = {"parse+group": [], "group": [], "ours": []}
    inner = tprof.profiler
    assert inner is not None
    for n in range(rounds):
        order = list(timings)
        for name in order[n % 3 :] + order[: n % 3]:
            if name == "parse+group":
                inner._function_events = None  # the first key_averages() parses the events
            t = time.perf_counter()
            if name == "ours":
                ours.ops(group_by="shape")
            else:
                tprof.key_averages(group_by_input_shape=True)
            timings[name].append((time.perf_counter() - t) * 1e3)
    n_ops = sum(op.calls for node in ours.nodes() for op in node.ops)
    med = {name: statistics.median(values) for name, values in timings.items()}
    print(
        f"op tables, BERT-base forward 1 x 128 ({n_ops:,} op calls), medians of {rounds}:\n"
        f"  torch.profiler key_averages(group_by_input_shape=True), first call (parses events): {med['parse+group']:.1f} ms\n"
        f"  torch.profiler key_averages(group_by_input_shape=True), events already parsed:     {med['group']:.1f} ms\n"
        f"  layerscope profile.ops(group_by='shape'):                                          {med['ours']:.2f} ms"
        f"  (x{med['ours'] / med['group']:.3f} of the parsed call, x{med['ours'] / med['parse+group']:.3f} of the first)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="op events in the big trace")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds of the table builds")
    parser.add_argument("--quick", action="store_true", help="100,000 events and 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.events, args.rounds = 100_000, 3
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print(f"# {os.uname().nodename} · torch {torch.__version__} · python {sys.version.split()[0]}")
    chrome_export(args.events)
    op_tables(args.rounds)


if __name__ == "__main__":
    main()
