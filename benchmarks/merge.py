"""Merging the rank files of a distributed run: 64 ranks of a BERT-base training step.

    python -m benchmarks.merge [--ranks 64] [--rounds 3]

One real profile is taken: a ``Profiler`` block around a BERT-base (``BertConfig()``,
random weights) training step of 1 x 16 tokens with SGD, op rows and trace included. It
is written out once per rank with its times varied: every node's self time (each phase)
is scaled by a per-rank factor (0.95 to 1.05) and one leaf on one rank is made slower;
totals and the step time are derived again bottom-up, and each rank gets a
``<communication>`` part holding its wait for the slowest rank, so every file passes
``layerscope.load``'s checks. Then, in a fresh process each round:

- **load**: ``layerscope.load`` of every file, one at a time (the baseline: reading);
- **merge**: ``layerscope merge DIR/*.json -o merged.json``, the command itself.

Reported: medians over rounds of each process's wall time and its peak RSS (the
process's own ``ru_maxrss``, interpreter start and imports included), and merge / load.
The targets: merge under 10 s and under 1 GB.

With ``--traces N`` it measures instead the merge of N torch.profiler trace files, one per
rank (copies of a real trace from ``../shared/traces`` with their ``distributedInfo`` set,
``--trace NAME``): ``layerscope merge --jobs 1`` (one trace after another) against the
default (the traces read in processes of their own, one per core), interleaved, each in
a fresh process.

    python -m benchmarks.merge --traces 4 [--trace h100_owlv2_inference] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

TARGET_S = 10.0
TARGET_RSS_MIB = 1024

_LOAD = r"""
import json, resource, sys, time
t = time.perf_counter()
import layerscope
for path in sys.argv[1:]:
    layerscope.load(path)
print(json.dumps({"seconds": time.perf_counter() - t, "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""

_MERGE = r"""
import json, resource, sys, time
t = time.perf_counter()
from layerscope.cli import main
status = main(["merge", *sys.argv[2:], "-o", sys.argv[1]])
assert status == 0, status
print(json.dumps({"seconds": time.perf_counter() - t, "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def bert_step() -> dict[str, Any]:
    """A BERT-base training step's profile, as its ``layerscope/1`` document."""
    import torch
    from transformers import BertConfig, BertModel

    import layerscope

    torch.manual_seed(0)
    model = BertModel(BertConfig())
    ids = torch.randint(0, 30522, (1, 16))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with layerscope.Profiler(model) as prof:
        model(input_ids=ids).last_hidden_state.sum().backward()
        opt.step()
        opt.zero_grad()
    return prof.profile.to_dict()


def _rederive(entries: list[dict[str, Any]]) -> int:
    """Totals = self + children's totals, bottom-up; returns the sum of every self time."""
    by_path = {entry["path"]: entry for entry in entries}
    all_self = 0
    for entry in reversed(entries):  # pre-order reversed: children before parents
        for phase in ("forward", "backward", "recompute"):
            stats = entry.get(phase)
            if stats is None:
                continue
            all_self += stats["self_cpu_time_ns"]
            stats["cpu_time_ns"] = stats["self_cpu_time_ns"] + stats.pop("_children", 0)
            parent = entry["parent"]
            if parent is not None:
                parent_stats = by_path[parent][phase]
                parent_stats["_children"] = parent_stats.get("_children", 0) + stats["cpu_time_ns"]
    return all_self


def rank_documents(base: dict[str, Any], ranks: int, slow_rank: int, slow_path: str) -> list[dict[str, Any]]:
    """``base`` once per rank, its times varied (see the module docstring)."""
    rng = random.Random(0)
    docs = []
    for rank in range(ranks):
        doc = json.loads(json.dumps(base))
        factor = rng.uniform(0.95, 1.05)
        entries = doc["modules"] + doc["parts"]
        for entry in entries:
            for phase in ("forward", "backward", "recompute"):
                stats = entry.get(phase)
                if stats is not None:
                    stats["self_cpu_time_ns"] = int(stats["self_cpu_time_ns"] * factor)
                    if rank == slow_rank and entry["path"] == slow_path and phase == "forward":
                        stats["self_cpu_time_ns"] += 20_000_000  # a planted 20 ms
        doc["meta"]["step_time_ns"] = _rederive(doc["modules"]) + _rederive(doc["parts"])
        doc["meta"].update(rank=rank, world_size=ranks, local_rank=rank % 8, host=f"node{rank // 8}", run_id="bench")
        docs.append(doc)
    slowest = max(doc["meta"]["step_time_ns"] for doc in docs)
    for doc in docs:
        wait = slowest - doc["meta"]["step_time_ns"] + 100_000
        stats = {"cpu_time_ns": wait, "self_cpu_time_ns": wait, "comm_time_ns": wait, "self_comm_time_ns": wait}
        doc["parts"].append({
            "path": "<communication>", "type": "communication", "parent": None, "depth": 0, "calls": 1, "params": 0,
            "params_total": 0, "kind": "communication", "forward": stats, "backward": None, "recompute": None,
        })
        doc["meta"]["step_time_ns"] += wait
    return docs


def _run(script: str, *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def generate(folder: str, ranks: int) -> None:
    """Write the rank files into ``folder``; print what was planted, as JSON."""
    import torch

    base = bert_step()
    leaves = [m["path"] for m in base["modules"] if m["type"] == "Linear"]
    slow_rank, slow_path = ranks // 3, leaves[len(leaves) // 2]
    for doc in rank_documents(base, ranks, slow_rank, slow_path):
        path = os.path.join(folder, f"layerscope_steps0-0_rank{doc['meta']['rank']}.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(doc, handle)
    nodes = len(base["modules"]) + len(base["parts"])
    print(json.dumps({"slow_rank": slow_rank, "slow_path": slow_path, "nodes": nodes, "torch": torch.__version__}))


_MERGE_JOBS = r"""
import json, sys, time
t = time.perf_counter()
from layerscope.cli import main
status = main(["merge", *sys.argv[3:], "-o", sys.argv[1], *(["--jobs", sys.argv[2]] if sys.argv[2] != "0" else [])])
assert status == 0, status
print(json.dumps({"seconds": time.perf_counter() - t}))
"""


def trace_ranks(folder: str, name: str, ranks: int) -> list[str]:
    """``ranks`` copies of the shared trace ``name``, each a rank of one run."""
    import gzip

    shared = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "traces")
    with gzip.open(os.path.join(shared, f"{name}.json.gz"), "rt", encoding="utf-8") as handle:
        doc = json.load(handle)
    paths = []
    for rank in range(ranks):
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": ranks}
        path = os.path.join(folder, f"rank{rank}.json.gz")
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            json.dump(doc, handle)
        paths.append(path)
    return paths


def traces_part(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as folder:
        paths = trace_ranks(folder, args.trace, args.traces)
        merged = os.path.join(folder, "merged.json")
        seconds: dict[str, list[float]] = {"--jobs 1": [], "default": []}
        for n in range(args.rounds):  # interleaved, the order rotated
            order = [("--jobs 1", "1"), ("default", "0")]
            for label, jobs in order[n % 2 :] + order[: n % 2]:
                seconds[label].append(_run(_MERGE_JOBS, merged, jobs, *paths)["seconds"])
    one, default = statistics.median(seconds["--jobs 1"]), statistics.median(seconds["default"])
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs")
    print(f"{args.traces} rank traces ({args.trace}), medians of {args.rounds} rounds, each in a fresh process:")
    print(f"  layerscope merge --jobs 1   {one:6.2f} s")
    print(f"  layerscope merge (default)  {default:6.2f} s   x{default / one:.2f} of --jobs 1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--traces", type=int, default=0, help="merge this many rank traces instead (see above)")
    parser.add_argument("--trace", default="h100_owlv2_inference", help="the shared trace copied as each rank")
    parser.add_argument("--generate", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        generate(args.generate, args.ranks)
        return
    if args.traces:
        traces_part(args)
        return
    # NB: the files are made in a child process. This process stays small (no torch, no
    # model), because Linux carries ru_maxrss across fork and exec: a child forked from
    # a big parent would report the parent's size as its own peak.
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.merge", "--ranks", str(args.ranks), "--generate", folder],
            capture_output=True, text=True, check=True,
        )
        made = json.loads(done.stdout.strip().splitlines()[-1])
        slow_rank, slow_path, nodes = made["slow_rank"], made["slow_path"], made["nodes"]
        paths = [os.path.join(folder, f"layerscope_steps0-0_rank{rank}.json") for rank in range(args.ranks)]
        size = sum(os.path.getsize(p) for p in paths)
        merged = os.path.join(folder, "merged.json")
        results: dict[str, list[dict[str, Any]]] = {"load": [], "merge": []}
        for _ in range(args.rounds):  # interleaved: load, merge, load, merge, ...
            results["load"].append(_run(_LOAD, *paths))
            t = time.perf_counter()
            results["merge"].append(_run(_MERGE, merged, *paths))
            results["merge"][-1]["wall"] = time.perf_counter() - t
        merged_size = os.path.getsize(merged)
        import layerscope

        run = layerscope.load(merged)
    first = run.stragglers()[0]
    assert (first.path, first.rank) == (slow_path, slow_rank), first
    seconds = {name: statistics.median(r["seconds"] for r in rows) for name, rows in results.items()}
    rss = {name: max(r["max_rss_kib"] for r in rows) / 1024 for name, rows in results.items()}
    wall = statistics.median(r["wall"] for r in results["merge"])
    print(f"torch {made['torch']}, python {platform.python_version()}, {os.cpu_count()} CPUs")
    print(
        f"{args.ranks} rank files of a BERT-base training step ({nodes} nodes, op rows and trace each), "
        f"{size / 2**20:.0f} MiB in all; medians of {args.rounds} rounds, each in a fresh process:"
    )
    print(f"  load every file, one at a time   {seconds['load']:6.2f} s   peak RSS {rss['load']:5.0f} MiB")
    print(
        f"  layerscope merge -o merged.json  {seconds['merge']:6.2f} s   peak RSS {rss['merge']:5.0f} MiB   "
        f"(x{seconds['merge'] / seconds['load']:.2f} of loading; {wall:.2f} s with the interpreter's start)"
    )
    print(f"  merged document {merged_size / 2**20:.1f} MiB; first straggler {first.path} on rank {first.rank} (planted)")
    verdict = "met" if wall < TARGET_S and rss["merge"] < TARGET_RSS_MIB else "NOT met"
    print(f"  targets (under {TARGET_S:.0f} s, under {TARGET_RSS_MIB} MiB): {verdict}")


if __name__ == "__main__":
    main()
