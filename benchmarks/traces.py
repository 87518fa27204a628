"""Reading torch.profiler traces: load time and peak memory against the standard
library's parse alone, the HTML report of a large trace in a real browser, and what
recording a trace that layerscope can read costs the run being recorded.

Four measurements, in one run:

1. **Loading the OWLv2 trace** (``../shared/traces/h100_owlv2_inference.json.gz``, 132,152
   events recorded on an H100) with ``layerscope.traces.load.load_trace``, each load in a
   fresh Python process, interleaved with the baseline: ``json.load(gzip.open(path))`` in
   a fresh process of its own (the whole document as dicts, and nothing else). Each child
   reports its wall time, its RSS right after its imports (``import layerscope, torch``
   for a load, ``import json, gzip`` for the baseline) and its peak RSS at the end
   (``ru_maxrss``), so the table shows what the load itself adds. A load's time is split
   into *read* (the file to events: decompressing, decoding, the range trees) and *build*
   (``profile_of_ranges``: the live capture's conversion, the attribution walk and the
   tree); *peak after read* is the child's peak RSS when the build begins. A third
   variant reads the file without its shapes (``load_trace(path, shapes=False)``, what
   ``show --no-shapes`` does): no FLOPs, and no torch imported (checked in the child).
   Targets: at most 3 s and 400 MB peak RSS.
2. **A 1,000,000-event trace**, the OWLv2 trace tiled by ``benchmarks/trace_tile.py`` into
   a temporary folder: the same measurements and baseline. Targets: at most 15 s and 1 GB.
3. **The OWLv2 trace's HTML report in Chromium**: ``profile.render("html")`` written to a
   file once, then opened ``--loads`` times (a fresh browser context each) in Debian's
   chromium (``/usr/bin/chromium``, or ``LAYERSCOPE_CHROMIUM``) driven headless by
   playwright. *Ready* is the report's own mark: ``window.layerscopeReport.readyMs``, the
   page's ``performance.now()`` when its script has drawn the tree, the icicle, the op
   table and the memory chart and set ``body[data-ready]`` (the attribute the browser
   tests wait for); ``performance.now()`` counts from the navigation's start, so reading
   the file and parsing the embedded data are in. Target: under 1 s.
4. **What recording costs the run**, on this machine: the zoo ``resnet18``, batch 2, one
   training step (forward, ``.sum().backward()``) plain and under
   ``torch.profiler.profile()`` (default: CPU activity), ``+record_shapes``,
   ``+profile_memory``, ``+with_stack``, and all three. Each round runs every variant once,
   the order rotated each round: a profiler session (none for plain), ``--warm`` steps,
   then ``--steps`` timed steps (steady state, ``prof.step()`` after each), then the
   session's exit (not timed). Median step time over rounds, and its ratio to plain. Then,
   per variant, one step recorded in a session of its own, written with
   ``export_chrome_trace`` (gzipped), and read back with ``load_trace``: the file's size
   and what layerscope finds in it (module nodes: the trace has ``nn.Module`` events only
   with ``with_stack``; the step's FLOPs: counted only from recorded shapes).

With ``--tile EVENTS``, **2b.** the OWLv2 trace tiled to that many events (4,050,000 make
about 1 GB of JSON), loaded ``--tile-rounds`` times without the baseline (``json.load``
would need several GB). Target: 1.5 GB peak RSS. With ``--against OTHER/src``, each load
is also run by another checkout's layerscope, in the same rounds (before and after a
change, side by side).

Medians over ``--rounds`` rounds; ratios are to the baseline measured in the same run.
A target missed is printed as NOT met. MB and GB in targets are 10^6 and 10^9 bytes;
tables are in MiB.

Usage: python benchmarks/traces.py [--rounds 5] [--loads 7] [--quick]
       [--no-million] [--no-browser] [--no-recording] [--against OTHER/src]
       [--tile EVENTS] [--tile-rounds 1]
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OWLV2 = ROOT.parent / "shared" / "traces" / "h100_owlv2_inference.json.gz"
#: Debian's chromium; playwright's own browser download is never used (as in tests/conftest.py).
CHROMIUM = os.environ.get("LAYERSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]
MIB = 2**20
#: The spawning process's largest peak RSS that cannot distort a child's (see ``loads``).
PARENT_LIMIT_MIB = 100

#: One load (or parse) in a fresh process; prints its figures as one JSON line.
_CHILD = r"""
import json, resource, sys, time

def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

def rss_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20

kind, path = sys.argv[1], sys.argv[2]
out = {}
if kind.startswith("layerscope"):
    shapes = kind == "layerscope"
    import layerscope
    if shapes:
        import torch  # what counting FLOPs imports; a read without shapes does not
    from layerscope.traces import load as trace_load
    out["imports_mib"] = rss_mib()
    # The step's name in this checkout (an --against checkout may predate the rename).
    build_name = "profile_of_ranges" if hasattr(trace_load, "profile_of_ranges") else "profile_of_events"
    real_build = getattr(trace_load, build_name)
    build_s = []

    # load_trace reads the file into events, then hands them to profile_of_ranges:
    # timing that call (looked up in the module at each load) splits the load in two.
    def timed_build(*args, **kwargs):
        out["read_peak_mib"] = peak_mib()
        start = time.perf_counter()
        try:
            return real_build(*args, **kwargs)
        finally:
            build_s.append(time.perf_counter() - start)

    setattr(trace_load, build_name, timed_build)
    start = time.perf_counter()
    profile = trace_load.load_trace(path) if shapes else trace_load.load_trace(path, shapes=False)
    out["seconds"] = time.perf_counter() - start
    out["torch"] = "torch" in sys.modules
    if len(build_s) != 1:
        sys.exit(f"load_trace called profile_of_ranges {len(build_s)} times, not once: update the split")
    out["build_seconds"] = build_s[0]
    out["count"] = sum(1 for _ in profile.nodes())
else:
    import gzip
    out["imports_mib"] = rss_mib()
    start = time.perf_counter()
    doc = json.load(gzip.open(path))
    out["seconds"] = time.perf_counter() - start
    out["count"] = len(doc["traceEvents"])
out["peak_mib"] = peak_mib()
print(json.dumps(out))
"""

BASELINE = "json.load"
LOAD = "load_trace"
#: The same file read without its shapes (``--no-shapes``): no FLOPs, no torch.
NO_SHAPES = "load_trace, shapes=False"
#: The same load by another checkout's layerscope (``--against``).
AGAINST = "load_trace, --against"


def _env(src: Path = ROOT / "src") -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src)}


def _child(kind: str, path: Path, src: Path = ROOT / "src") -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", _CHILD, kind, str(path)], capture_output=True, text=True,
                          timeout=1800, check=False, env=_env(src))
    if done.returncode != 0:
        raise RuntimeError(f"{kind} on {path.name} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rotated(items: list[Any], round_index: int) -> list[Any]:
    shift = round_index % len(items)
    return items[shift:] + items[:shift]


def loads(path: Path, rounds: int, against: Path | None = None, *, baseline: bool = True) -> dict[str, dict[str, float]]:
    """Each variant's medians over rounds (every figure its own median), interleaved,
    the order rotated each round: ``json.load`` (unless not ``baseline``), this
    checkout's load, and another's (``against``: its ``src`` folder)."""
    # Linux carries the spawning process's peak RSS into the child's ru_maxrss (execve
    # keeps the old address space's high-water mark), so the spawner must stay small.
    parent_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if parent_mib > PARENT_LIMIT_MIB:
        raise RuntimeError(f"this process's peak RSS is {parent_mib:.0f} MiB: it would count in every child's peak; "
                           "measure the loads before importing torch here")
    kinds = {
        BASELINE: ("json", ROOT / "src"), LOAD: ("layerscope", ROOT / "src"),
        NO_SHAPES: ("layerscope-noshapes", ROOT / "src"),
    }
    if not baseline:
        del kinds[BASELINE]
    if against is not None:
        kinds[AGAINST] = ("layerscope", against)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in kinds}
    for index in range(rounds):
        for name in _rotated(list(kinds), index):
            kind, src = kinds[name]
            runs[name].append(_child(kind, path, src))
    if any(r["torch"] for r in runs[NO_SHAPES]):
        raise RuntimeError("the read without shapes imported torch: it must not (tests/test_no_torch.py)")
    medians = {}
    for name, results in runs.items():
        medians[name] = {key: statistics.median(r[key] for r in results) for key in results[0]}
        medians[name]["count"] = results[0]["count"]
    return medians


def _verdict(met: bool) -> str:
    return "met" if met else "**NOT met**"


def load_table(title: str, results: dict[str, dict[str, float]], target_s: float | None, target_bytes: float) -> list[str]:
    """The loads' table (``json.load``'s row and ratios where it was measured), and the
    verdict on this checkout's load (no time target: ``target_s`` None)."""
    base, mine = results.get(BASELINE), results[LOAD]
    met = (target_s is None or mine["seconds"] <= target_s) and mine["peak_mib"] * MIB <= target_bytes
    events = f"{base['count']:,} events; " if base else ""
    rows = [
        f"**{title}**: {events}the load's tree has {mine['count']:,} nodes.",
        "",
        "| variant | median s | x json.load | read s | build s | RSS after imports MiB | peak after read MiB "
        "| peak RSS MiB | added by the load MiB | peak x json.load |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    if base:
        rows.append(
            f"| `json.load(gzip.open(path))` (parse only) | {base['seconds']:.2f} | 1.00 | | | {base['imports_mib']:.0f} "
            f"| | {base['peak_mib']:,.0f} | {base['peak_mib'] - base['imports_mib']:,.0f} | 1.00 |"
        )
    for name, label in (
        (LOAD, "`load_trace(path)` (to a `Profile`)"),
        (NO_SHAPES, "`load_trace(path, shapes=False)` (no FLOPs; torch not imported)"),
        (AGAINST, "the same, `--against` checkout"),
    ):
        load = results.get(name)
        if load is None:
            continue
        rows.append(
            f"| {label} | {load['seconds']:.2f} | {_ratio(load['seconds'], base, 'seconds')} "
            f"| {load['seconds'] - load['build_seconds']:.2f} | {load['build_seconds']:.2f} | {load['imports_mib']:.0f} "
            f"| {load['read_peak_mib']:,.0f} | {load['peak_mib']:,.0f} | {load['peak_mib'] - load['imports_mib']:,.0f} "
            f"| {_ratio(load['peak_mib'], base, 'peak_mib')} |"
        )
    time_target = "" if target_s is None else f"at most {target_s:g} s and "
    rows += [
        "",
        f"Target: {time_target}{target_bytes / 1e6:,.0f} MB ({target_bytes / MIB:,.0f} MiB) peak RSS: "
        f"{_verdict(met)} ({mine['seconds']:.2f} s, {mine['peak_mib']:,.0f} MiB).",
        "",
    ]
    return rows


def _ratio(value: float, base: dict[str, float] | None, key: str) -> str:
    return f"{value / base[key]:.2f}" if base else ""


def _uncompressed_bytes(path: Path) -> int:
    import gzip

    total = 0
    with gzip.open(path, "rb") as stream:
        while chunk := stream.read(1 << 24):
            total += len(chunk)
    return total


def browser_ready(html: Path, loads_n: int) -> tuple[str, list[float], list[float]] | str:
    """The browser's version, and per load the report's ready mark and its script's own
    time, in ms from the navigation's start; or why it could not run."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "skipped: no playwright (pip install playwright)"
    if not os.path.exists(CHROMIUM):
        return f"skipped: no chromium at {CHROMIUM} (apt-get install chromium, or set LAYERSCOPE_CHROMIUM)"
    ready, script = [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            for _ in range(loads_n):
                page = browser.new_page(viewport={"width": 1400, "height": 1000})  # a fresh context each
                errors: list[str] = []
                page.on("console", lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                page.goto(html.as_uri())
                page.wait_for_selector("body[data-ready='1']", timeout=120_000)
                if errors:
                    raise RuntimeError(f"the report logged errors: {errors}")
                ready_ms, script_ms = page.evaluate("() => [window.layerscopeReport.readyMs, window.layerscopeReport.scriptMs]")
                ready.append(ready_ms)
                script.append(script_ms)
                page.close()
            version = browser.version
        finally:
            browser.close()
    return version, ready, script


# -- 4. what recording costs ------------------------------------------------------------

#: The profiler's keyword arguments per variant; None: no profiler.
RECORDING: dict[str, dict[str, bool] | None] = {
    "plain (no profiler)": None,
    "`profile()` (CPU activity)": {},
    "+ `record_shapes=True`": {"record_shapes": True},
    "+ `profile_memory=True`": {"profile_memory": True},
    "+ `with_stack=True`": {"with_stack": True},
    "all three": {"record_shapes": True, "profile_memory": True, "with_stack": True},
}


def _session(kwargs: dict[str, bool] | None) -> AbstractContextManager[Any]:
    import torch

    return nullcontext() if kwargs is None else torch.profiler.profile(**kwargs)


def steps_ms(step: Callable[[], None], mark: Callable[[], Any], warm: int, steps: int) -> float:
    """``warm`` steps, then the mean of ``steps`` timed ones (ms), ``mark()`` (a
    profiler's ``step``) after each."""
    for _ in range(warm):
        step()
        mark()
    start = time.perf_counter_ns()
    for _ in range(steps):
        step()
        mark()
    return (time.perf_counter_ns() - start) / steps / 1e6


def _block_ms(step: Callable[[], None], kwargs: dict[str, bool] | None, warm: int, steps: int) -> float:
    """One session: :func:`steps_ms` in it; the session's exit is outside the clock."""
    with _session(kwargs) as prof:
        return steps_ms(step, prof.step if prof is not None else (lambda: None), warm, steps)


def recording(rounds: int, warm: int, steps: int, folder: Path) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Median step time (ms) per variant; and per variant the one-step trace's size and
    what ``load_trace`` finds in it."""
    import torch

    from layerscope import zoo
    from layerscope.traces.load import load_trace

    torch.manual_seed(0)
    entry = zoo.get("resnet18")
    model = entry.build()
    x = entry.example_inputs(2)

    def step() -> None:
        model(x).sum().backward()

    for _ in range(warm):  # the process's first steps (allocator, kernels' first calls)
        step()
    times: dict[str, list[float]] = {name: [] for name in RECORDING}
    for index in range(rounds):
        for name in _rotated(list(RECORDING), index):
            gc.collect()
            times[name].append(_block_ms(step, RECORDING[name], warm, steps))
    medians = {name: statistics.median(values) for name, values in times.items()}

    files: dict[str, dict[str, Any]] = {}
    for name, kwargs in RECORDING.items():
        if kwargs is None:
            continue
        path = folder / f"step_{len(files)}.json.gz"  # torch's exporter gzips a .gz path
        with torch.profiler.profile(**kwargs) as prof:
            step()
        prof.export_chrome_trace(str(path))
        with open(path, "rb") as handle:
            gzipped = handle.read(2) == b"\x1f\x8b"
        if not gzipped:
            raise RuntimeError(f"{path} was not gzipped by export_chrome_trace")
        profile = load_trace(path)
        files[name] = {
            "bytes": path.stat().st_size,
            "modules": sum(1 for node in profile.modules() if node.kind == "module" and node.path != ""),
            "flops": _step_flops(profile),
        }
        del profile, prof
        gc.collect()
    return medians, files


def _step_flops(profile: Any) -> int | None:
    """The step's FLOPs (the model's phases and the step's parts, where a trace without
    modules puts its ops); None where the trace cannot tell (no shapes)."""
    tops = [profile.root, *profile.parts]
    phases = [stats for node in tops for stats in (node.forward, node.backward, node.recompute) if stats]
    if any(stats.flops is None for stats in phases):
        return None
    return sum(stats.flops for stats in phases)


def recording_table(medians: dict[str, float], files: dict[str, dict[str, Any]]) -> list[str]:
    plain = medians["plain (no profiler)"]
    from layerscope.base import fmt

    rows = [
        "| variant | median step ms | x plain | one step's trace, gzipped | `load_trace`: modules | `load_trace`: step FLOPs |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, ms in medians.items():
        found = files.get(name)
        trace = "| |"
        if found:
            flops = "unknown (no shapes)" if found["flops"] is None else fmt.count(found["flops"])
            trace = f"{found['bytes'] / 1024:,.0f} KiB | {found['modules']} | {flops}"
        rows.append(f"| {name} | {ms:.1f} | {ms / plain:.3f} | {trace} |")
    return [*rows, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks/traces.py", description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of every load variant (each a fresh process) and of every recording variant; "
                             "interleaved, the order rotated each round (default 5)")
    parser.add_argument("--loads", type=int, default=7, help="fresh loads of the HTML report in Chromium (default 7)")
    parser.add_argument("--warm", type=int, default=2, help="untimed steps at the start of each recording session (default 2)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per recording session (default 5)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 1 round, no 1,000,000-event trace, 2 browser loads, 1 warm and 2 timed steps")
    parser.add_argument("--no-million", action="store_true", help="skip the 1,000,000-event trace (2.)")
    parser.add_argument("--no-browser", action="store_true", help="skip the HTML report in Chromium (3.)")
    parser.add_argument("--no-recording", action="store_true", help="skip the cost of recording (4.)")
    parser.add_argument("--against", type=Path,
                        help="another checkout's src folder: its load_trace runs in the same rounds, side by side")
    parser.add_argument("--tile", type=int, metavar="EVENTS",
                        help="also load the OWLv2 trace tiled to EVENTS events (4,050,000: about 1 GB of JSON), "
                             "--tile-rounds times, without json.load (it would need several GB); target 1.5 GB peak RSS")
    parser.add_argument("--tile-rounds", type=int, default=1, help="rounds of the --tile loads (default 1)")
    args = parser.parse_args(argv)
    if not OWLV2.exists():
        parser.error(f"the real traces are not here (expected {OWLV2}; see ../shared/traces/README.md)")
    if args.quick:
        args.rounds, args.loads, args.warm, args.steps, args.no_million = 1, 2, 1, 2, True

    # No torch in this process until the loads are measured (see ``loads``).
    print(f"python {platform.python_version()}, torch {importlib.metadata.version('torch')}, {os.cpu_count()} CPUs, "
          f"{args.rounds} rounds, medians\n")
    lines = ["## 1. Loading the OWLv2 trace", ""]
    against = args.against.resolve() if args.against else None
    lines += load_table(f"`{OWLV2.name}`", loads(OWLV2, args.rounds, against), 3, 400e6)
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if not args.no_million:
            big = folder / "million.json.gz"
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trace_tile.py"), str(OWLV2), str(big),
                            "--events", "1000000"], check=True, capture_output=True, env=_env())
            lines = ["## 2. A 1,000,000-event trace (the OWLv2 trace tiled)", ""]
            lines += load_table(f"{big.stat().st_size / MIB:.0f} MiB gzipped", loads(big, args.rounds, against), 15, 1e9)
            print("\n".join(lines), flush=True)
        if args.tile:
            tiled = folder / "tiled.json.gz"
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trace_tile.py"), str(OWLV2), str(tiled),
                            "--events", str(args.tile)], check=True, capture_output=True, env=_env())
            lines = [f"## 2b. A {args.tile:,}-event trace (the OWLv2 trace tiled)", ""]
            title = (f"{tiled.stat().st_size / MIB:.0f} MiB gzipped, {_uncompressed_bytes(tiled) / 1e9:.2f} GB of JSON, "
                     f"{args.tile:,} events")
            lines += load_table(title, loads(tiled, args.tile_rounds, against, baseline=False), None, 1.5e9)
            print("\n".join(lines), flush=True)
        if not args.no_browser:
            from layerscope.traces.load import load_trace

            html = folder / "owlv2.html"
            profile = load_trace(OWLV2)
            html.write_text(profile.render("html"), encoding="utf-8")
            modules = sum(1 for _ in profile.modules())
            del profile
            gc.collect()
            measured = browser_ready(html, args.loads)
            lines = ["## 3. The OWLv2 trace's HTML report in Chromium", ""]
            if isinstance(measured, str):
                lines.append(measured)
            else:
                version, ready, script = measured
                median = statistics.median(ready)
                lines += [
                    f"Chromium {version}, headless, {len(ready)} loads; {modules} module nodes, "
                    f"{html.stat().st_size / MIB:.2f} MiB page.",
                    "",
                    "| | median ms | max ms |",
                    "| --- | ---: | ---: |",
                    f"| ready (from the navigation's start) | {median:.0f} | {max(ready):.0f} |",
                    f"| the report's script alone | {statistics.median(script):.0f} | {max(script):.0f} |",
                    "",
                    f"Target: ready under 1 s: {_verdict(median < 1000)} (median {median:.0f} ms, max {max(ready):.0f} ms).",
                ]
            print("\n".join([*lines, ""]), flush=True)
        if not args.no_recording:
            import torch

            medians, files = recording(args.rounds, args.warm, args.steps, folder)
            lines = [
                "## 4. What recording a trace costs: zoo resnet18, batch 2, forward + `.sum().backward()`",
                "",
                f"{torch.get_num_threads()} torch threads; {args.warm} warm and {args.steps} timed steps per session, "
                f"{args.rounds} rounds.",
                "",
                *recording_table(medians, files),
            ]
            print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
