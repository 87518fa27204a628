"""Reading a torch.profiler (Kineto) trace: the standard library's json.load against
layerscope's streaming reader, in time and peak memory.

    python -m benchmarks.trace_parse [TRACE ...] [--million] [--rounds 5] [--chunk-kib 1024]

Each variant reads the whole trace (TRACE, .json or .json.gz; by default the real OWLv2
trace, ../shared/traces/h100_owlv2_inference.json.gz, 132,152 events) in a fresh Python
process, so that the peak RSS it reports (``ru_maxrss`` at its end) is that load's alone;
rounds interleave the variants, their order rotated each round, and the table gives
medians over rounds and ratios to ``json.load``:

- ``json.load``: ``json.load(gzip.open(path))``, the whole document in memory;
- ``json.load, FloatText``: the same with ``parse_float=FloatText`` (floats kept as their
  text, as the reader does): what that hook costs by itself;
- ``reader``: ``open_trace(path).events()`` iterated to the end, each event dropped at
  once (its caller keeps what it needs), at ``--chunk-kib`` KiB per read (several
  sizes, comma-separated, give a variant each).

Every process first imports the same modules (json, gzip, layerscope.traces.reader);
``(imports only)`` is a process that stops there: the floor under every RSS. With
``--million``, a trace of ``--events`` events (default 1,000,000, about 250 MB of JSON) is
tiled from the OWLv2 trace by benchmarks/trace_tile.py into a temporary folder and
measured too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
DEFAULT_TRACE = SHARED_TRACES / "h100_owlv2_inference.json.gz"
IMPORTS_ONLY = "(imports only)"

_CHILD = r"""
import gzip, json, resource, sys, time
from layerscope.base.kineto_json import FloatText, open_trace

variant, path, chunk_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
start = time.perf_counter()
events = 0
if variant.startswith("json.load"):
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    with (gzip.open if gzipped else open)(path, "rb") as handle:
        if variant == "json.load":
            doc = json.load(handle)
        else:
            doc = json.load(handle, parse_float=FloatText)
    events = len(doc["traceEvents"])
elif variant == "reader":
    with open_trace(path, chunk_bytes=chunk_bytes) as trace:
        for _ in trace.events():
            events += 1
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "events": events, "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def run_child(variant: str, path: Path, chunk_bytes: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, variant, str(path), str(chunk_bytes)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{variant} on {path} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def measure(path: Path, rounds: int, chunk_kib: list[int]) -> None:
    variants: list[tuple[str, str, int]] = [
        ("json.load", "json.load", 0),
        ("json.load, FloatText", "json.load+FloatText", 0),
    ]
    variants += [(f"reader, {kib} KiB reads", "reader", kib * 1024) for kib in chunk_kib]
    variants.append((IMPORTS_ONLY, "imports", 0))
    results: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in variants}
    for n in range(rounds):
        order = variants[n % len(variants) :] + variants[: n % len(variants)]
        for label, variant, chunk_bytes in order:
            results[label].append(run_child(variant, path, chunk_bytes))
    counts = {r["events"] for label, runs in results.items() if label != IMPORTS_ONLY for r in runs}
    if len(counts) != 1:
        raise SystemExit(f"the variants read different numbers of events from {path}: {sorted(counts)}")
    events = counts.pop()
    size_mib = path.stat().st_size / 2**20
    print(f"\n{path.name}: {events:,} events, {size_mib:.1f} MiB on disk; medians of {rounds} rounds\n")
    print("| variant | seconds | × json.load | peak RSS MiB | × json.load |")
    print("|---|---:|---:|---:|---:|")
    base_s = statistics.median(r["seconds"] for r in results["json.load"])
    base_rss = statistics.median(r["max_rss_kib"] for r in results["json.load"]) / 1024
    for label, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        rss = statistics.median(r["max_rss_kib"] for r in runs) / 1024
        if label == IMPORTS_ONLY:
            print(f"| {label} | | | {rss:,.0f} | {rss / base_rss:.2f} |")
        else:
            print(f"| {label} | {seconds:.3f} | {seconds / base_s:.2f} | {rss:,.0f} | {rss / base_rss:.2f} |")


def tiled(folder: str, events: int) -> Path:
    out = Path(folder) / f"owlv2_x{events}.json.gz"
    tiler = Path(__file__).with_name("trace_tile.py")
    subprocess.run(
        [sys.executable, str(tiler), str(DEFAULT_TRACE), str(out), "--events", str(events)], check=True
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="*", type=Path, metavar="TRACE", help=f"traces to read (default: {DEFAULT_TRACE})")
    parser.add_argument("--million", action="store_true", help="also a trace tiled to --events events")
    parser.add_argument("--events", type=int, default=1_000_000, help="events of the --million trace")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (fresh processes each)")
    parser.add_argument("--chunk-kib", default="1024", help="the reader's read sizes in KiB, comma-separated")
    args = parser.parse_args()
    chunk_kib = [int(part) for part in args.chunk_kib.split(",")]
    traces = args.traces or [DEFAULT_TRACE]
    for trace in traces:
        if not trace.exists():
            parser.error(f"no trace at {trace}")
    print(f"# {os.uname().nodename} · python {platform.python_version()} · {os.cpu_count()} CPUs")
    for trace in traces:
        measure(trace, args.rounds, chunk_kib)
    if args.million:
        with tempfile.TemporaryDirectory() as folder:
            measure(tiled(folder, args.events), args.rounds, chunk_kib)


if __name__ == "__main__":
    main()
