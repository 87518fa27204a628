"""A block's exit on a GPU's events, measured without a GPU: the GPT-2 AdamW capture
recorded on an H100 (``tests/data/captures``) tiled to 6, 10 and 20 steps (each copy
shifted in time, its correlation, allocation and note ids renumbered), then read back
as a block's exit reads a window: the adapter, the conversion and the walker. The exit
must grow linearly with the steps: the time per step is reported for each size, and
the largest size's per-step time against the smallest's.

Usage::

    python benchmarks/replay_exit.py                 # 6, 10, 20 steps, 3 rounds each
    python benchmarks/replay_exit.py --steps 2 --rounds 1   # the smallest run
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from layerscope.attribute import parent_indices  # noqa: E402
from layerscope.attribute.cycle import Cycle  # noqa: E402
from layerscope.capture import replay  # noqa: E402
from layerscope.capture.kineto import paused_gc, streams_of  # noqa: E402
from layerscope.capture.torch_events import ReplayedResult  # noqa: E402
from layerscope.convert.ranges import NOTE_PREFIX, STEP_NAME  # noqa: E402
from layerscope.model.raw import ModuleInfo  # noqa: E402

CAPTURE = ROOT / "tests" / "data" / "captures" / "gpt2_adamw_train.json.gz"


def _shift_node(node: list[Any], dt: int, dcorr: int, dalloc: int, dnote: int) -> list[Any]:
    tag, name, t0, t1, tid, corr, overload, fields, children = node
    if name.startswith(NOTE_PREFIX):
        name = f"{NOTE_PREFIX}{int(name[len(NOTE_PREFIX):]) + dnote}"
    if tag == "Allocation":
        fields = [fields[0], fields[1], fields[2] + dalloc, *fields[3:]]
    elif fields is not None:
        fields = [fields[0], fields[1], _shift_inputs(fields[2], dalloc)]
    return [tag, name, t0 + dt, t1 + dt, tid, corr + dcorr if corr else 0, overload, fields,
            [_shift_node(c, dt, dcorr, dalloc, dnote) for c in children]]


def _shift_inputs(values: list[Any], dalloc: int) -> list[Any]:
    out = []
    for v in values:
        if isinstance(v, dict) and v.get("a") is not None:
            v = {**v, "a": v["a"] + dalloc}
        elif isinstance(v, list):
            v = _shift_inputs(v, dalloc)
        out.append(v)
    return out


def tiled(window: dict[str, Any], copies: int) -> dict[str, Any]:
    """``window`` with its recorded steps repeated ``copies`` times, one after another."""
    result = window["result"]
    steps = [n for n in result["tree"] if n[1] == STEP_NAME and any(n[8])]
    start, end = min(n[2] for n in steps), max(n[3] for n in result["tree"])
    period = end - start + 1_000_000
    corrs = [n[5] for n in _all(result["tree"])] + [e[3] for e in result["events"]] + [e[7] for e in result["events"]]
    dcorr = max(corrs) + 1
    dalloc = max((n[7][2] for n in _all(result["tree"]) if n[0] == "Allocation"), default=0) + 1
    notes = window["notes"]
    tree: list[Any] = []
    events: list[Any] = []
    for k in range(copies):
        tree += [_shift_node(n, k * period, k * dcorr, k * dalloc, k * len(notes)) for n in result["tree"]]
        for e in result["events"]:
            kind, ann, name, linked, t0, t1, stream, corr, concrete = e
            events.append([kind, ann, name, linked + k * dcorr if linked else 0, t0 + k * period, t1 + k * period,
                           stream, corr + k * dcorr if corr else 0, concrete])
    out = copy.copy(window)
    out["notes"] = [note for _ in range(copies) for note in notes]
    out["result"] = {"format": result["format"], "tree": tree, "events": events}
    return out


def _all(nodes: list[Any]) -> Any:
    for n in nodes:
        yield n
        yield from _all(n[8])


def exit_once(data: dict[str, Any], window: dict[str, Any]) -> tuple[float, int]:
    """Seconds to read one window back as a block's exit does, and its steps."""
    infos = [ModuleInfo(**m) for m in data["modules"]]
    result = ReplayedResult(window["result"])  # torch's result, already in memory at a real exit
    gc.collect()
    started = time.perf_counter()
    with paused_gc():  # as a block reads a window
        streams = streams_of(result, has_device=True, detail=True,
                             notes=[[tuple(e) for e in note] for note in window["notes"]], with_stack=False)
        cycle = Cycle(infos, parent_indices(infos), collect_ops=True)
        for number, events in enumerate(streams):
            cycle.add(events, number, warmup=False, keep_empty=False, has_device=True)
    return time.perf_counter() - started, cycle.steps.steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, action="append", default=None,
                        help="steps to tile to (even numbers; repeatable; default 6, 10, 20)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per size, sizes interleaved (default 3)")
    args = parser.parse_args(argv)
    data = replay.load(CAPTURE)
    (window,) = data["windows"]
    sizes = args.steps or [6, 10, 20]
    windows = {n: tiled(window, max(1, n // 2)) for n in sizes}
    exit_once(data, windows[sizes[0]])  # caches (op schemas, FLOP formulas) filled: the steady state
    times: dict[int, list[float]] = {n: [] for n in sizes}
    found: dict[int, int] = {}
    for _ in range(args.rounds):
        for n in sizes:
            seconds, found[n] = exit_once(data, windows[n])
            times[n].append(seconds)
    print(f"GPT-2 AdamW capture ({data['truth'].get('device_name')}), tiled; median of {args.rounds} rounds")
    print("| steps | exit (s) | per step (ms) |")
    print("| --- | --- | --- |")
    per_step = {}
    for n in sizes:
        median = statistics.median(times[n])
        per_step[n] = median / found[n]
        print(f"| {found[n]} | {median:.3f} | {per_step[n] * 1e3:.1f} |")
    if len(sizes) > 1:
        print(f"per step, {found[sizes[-1]]} steps against {found[sizes[0]]}: x{per_step[sizes[-1]] / per_step[sizes[0]]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
